# cython: language_level=3
"""Fractional EP with Student-t sites (negative site precisions allowed), dense and sparse.

The nogil blocks of the dense posterior, the step-halving driver both engines share and the
two engine classes (see student_t_ep.pyx).
"""
from fastep._epcore._common cimport SweepDriver, EngineOptions, SweepResult, SweepSettings
from fastep._epcore.sites cimport SiteModel, SiteSpec
from fastep._epcore.power_ep cimport PowerRule, PowerQuadrature

cdef int robust_factor(const double* K_chol, int n, const double* site_precision,
                       const double* site_natural_mean, double* a_work, double* x_work, double* tmp,
                       double* post_mean, double* post_var, double* log_det, double* quad) noexcept nogil

cdef int robust_targets(const double* y, int n, double dof, double scale, double power,
                        const double* site_precision, const double* site_natural_mean,
                        const double* post_mean, const double* post_var,
                        double* cavity_mean, double* cavity_var, double* site_log_z,
                        double* target_precision, double* target_natural_mean,
                        double* sum_terms) noexcept nogil


# --- the step-halving driver ------------------------------------------------------------
# An engine hands the driver four nogil callbacks on its own state (``ctx``):
ctypedef bint (*TrialFn)(void* ctx, const double* tau, const double* nu) noexcept nogil
ctypedef void (*AdoptFn)(void* ctx) noexcept nogil
ctypedef double (*TargetsFn)(void* ctx, int* n_failed) noexcept nogil
ctypedef int (*CurrentFn)(void* ctx) noexcept nogil


cdef struct FractionalStep:
    int n
    double damping
    int max_halvings
    double* site_precision          # current sites (in/out)
    double* site_natural_mean
    double* target_precision        # fractional-EP targets of the current sites
    double* target_natural_mean
    double* trial_precision         # the damped trial step
    double* trial_natural_mean
    TrialFn trial                   # factorise at the trial sites: True if posterior and cavities are proper
    AdoptFn adopt                   # make the (accepted) trial posterior the current one
    TargetsFn targets               # targets of the current sites from the current posterior; returns log Z
    CurrentFn current               # factorise at the current sites; returns 0 or the failing potrf's info
    void* ctx


cdef int fractional_ep_sweeps(SweepDriver driver, FractionalStep* s, long* n_halvings,
                              bint* stuck) except -1


# --- the engines --------------------------------------------------------------------------
cdef struct DenseStudentTState:
    const double* chol
    const double* y
    int n
    double dof, scale, power
    double* a_work
    double* x_work
    double* tmp
    double* post_mean
    double* post_var
    double* cavity_mean
    double* cavity_var
    double* site_log_z
    double* site_precision
    double* site_natural_mean
    double* target_precision
    double* target_natural_mean
    double* trial_mean
    double* trial_var
    double log_det, quad


cdef struct SparseStudentTState:
    const SiteModel* model
    const PowerRule* rule
    const double* Vt
    const double* d
    const double* y
    int n, m, rows
    double power
    double* scratch
    double* post_factor
    double* post_w_mean
    double* g_mean
    double* g_var
    double* trial_factor
    double* trial_w
    double* trial_g_mean
    double* trial_g_var
    double* site_precision
    double* site_natural_mean
    double* target_precision
    double* target_natural_mean
    double half_log_det, quad_b


cdef class StudentTEPOptions(EngineOptions):
    cdef readonly double power
    cdef readonly int n_quadrature
    cdef readonly int max_halvings


cdef class StudentTEPResult(SweepResult):
    cdef readonly long n_halvings
    cdef readonly bint stuck


cdef class FractionalEP:
    cdef SweepSettings sweep            # copied from the options
    cdef readonly StudentTEPOptions options
    cdef readonly int n
    cdef readonly double power
    cdef readonly int max_halvings
    cdef readonly bint validate
    cdef double site_cost
    cdef object buffers
    cdef FractionalStep step

    cdef _configure(self, int n, StudentTEPOptions options, bint validate, double site_cost)
    cdef _sweeps(self, double[::1] site_precision, double[::1] site_natural_mean,
                 object sweep_callback, str improper)


cdef class DenseStudentTEP(FractionalEP):
    cdef readonly object K_chol
    cdef readonly object y
    cdef readonly double dof
    cdef readonly double scale
    cdef DenseStudentTState state


cdef class SparseStudentTEP(FractionalEP):
    cdef readonly object Vt
    cdef readonly object d
    cdef readonly object y
    cdef readonly SiteSpec spec
    cdef readonly int m
    cdef readonly int n_quadrature
    cdef PowerQuadrature quadrature
    cdef SparseStudentTState state
