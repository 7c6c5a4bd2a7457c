# cython: language_level=3
"""Nested EP of the multinomial probit likelihood (see multiclass_ep.pyx): the per-site inner EP
with its constants, the site kernel's typed object, and the outer iteration's engine and result."""
from fastep._epcore._common cimport SweepResult


cdef struct NestedSiteOptions:
    int n_classes            # c
    int n_inner_sweeps       # inner sweeps per site (at most, with tol > 0); 0 only evaluates log Ẑ
    double damping           # fraction of every inner site change applied, in (0, 1]
    double tol               # a site's inner sweeps stop once the largest relative change is below it


cdef inline int nested_work_size(int c) noexcept nogil:
    """Doubles of scratch that :func:`nested_site` needs for c classes."""
    return 3 * (c + 1) * (c + 1) + 4 * (c + 1) + c * c


# Inner EP at one outer site (multiclass_ep.pyx): updates its inner sites in place, writes the
# tilted normaliser; returns a NESTED_* status (0 = ok).
cdef int nested_site(const NestedSiteOptions* opts, int label, const double* cav_prec,
                     const double* cav_lin, double* alpha_s, double* beta_s, double* log_z,
                     double* work) noexcept nogil


# The site kernel over a set of sites, with its constants (InnerEP.update).
cdef class InnerEP:
    cdef NestedSiteOptions options


# The result of MultinomialEP.run.
cdef class MultinomialResult(SweepResult):
    cdef readonly object outer_precision
    cdef readonly object outer_natural_mean
    cdef readonly double final_damping


# The outer iteration (MultinomialEP.__init__, run).
cdef class MultinomialEP:
    cdef readonly object posterior_of
    cdef readonly object labels
    cdef readonly int n
    cdef readonly int n_classes
    cdef readonly double damping
    cdef readonly bint adaptive_damping
    cdef readonly double tol
    cdef readonly int max_sweeps
    cdef readonly bint validate
    cdef readonly object posterior

    cdef _cavities(self, post)
    cdef tuple _evidence(self, post, double[:, ::1] alpha, double[:, ::1] beta, double[:, ::1] scratch_alpha,
                         double[:, ::1] scratch_beta, int[::1] status, double* work)
