# cython: language_level=3
"""Informative Vector Machine selection engine: state and nogil building blocks (see ivm.pyx).

State after k inclusions (Lawrence, Seeger & Herbrich 2005, §3.2; Seeger's notes §2.1),
n = number of training points, d_max = capacity of the active set:

* ``M`` (d_max x n, row-major): rows 0..k-1 hold the low-rank part of the posterior
  covariance, Σ = K - MᵀM (IVM eq 29); row i is sqrt(ν_i) s_{i-1,n_i}ᵀ.  Equivalently
  M = L⁻¹ B_I^½ K[I, :] with B_I = diag(site precisions of the active points).
* ``L`` (d_max x d_max, row-major, lower triangular): rows/columns 0..k-1 hold the
  Cholesky factor of I + B_I^½ K_I B_I^½ (Seeger §2.1), one row appended per inclusion.
* ``post_var`` (n): ς = diag Σ (eq 27);  ``post_mean`` (n): μ (eq 28).
* ``g``, ``nu``, ``score`` (n): g_n = ∂log Z_n/∂μ_n, ν_n = -∂²log Z_n/∂μ_n² and the
  selection score of every inactive point at the current posterior (eqs 14-26); stale for
  active points.
* ``site_mean`` / ``site_precision`` (n): m_n, β_n of the included points (eqs 22-23), 0
  for inactive points.
* ``active`` (d_max): the included indices in inclusion order; ``is_active`` (n): 0/1 flags;
  ``chosen`` (d_max): the criterion value of each active point when it entered.

``IVMTargets`` holds the likelihood side (site kernel, targets, the extra cavity variance
``sigma2``).  Everything here is ``noexcept nogil`` and allocation free; the arrays are owned by
``IVMEP`` (ivm.pyx).  The refinement of a fixed-size active set (ivm_refine.pxd) works on
the same arrays.
"""
from fastep._epcore.sites cimport SiteModel, SiteSpec


cpdef enum IVMCriterion:
    CRITERION_ENTROPY = 0      # ΔH = -½ log(1 - ν ς) (IVM eq 26)
    CRITERION_INFO_GAIN = 1    # KL(q_new ‖ q_old) = ½ (g² ς - ν ς - log(1 - ν ς))
    CRITERION_RANDOM = 2       # uniform over eligible points (seeded splitmix64)

cpdef enum IVMStatus:
    IVM_OK = 0
    IVM_NO_CANDIDATE = 1       # no inactive point has a finite score (all failed or ν <= 0)
    IVM_BAD_POINT = 2          # the point to include is active, out of range or not eligible
    IVM_FULL = 3               # k == d_max
    IVM_NEGATIVE_VARIANCE = 4  # some ς_i < -1e-8 K_ii after an update: K is not PSD
    IVM_BAD_COLUMN = 5         # the supplied kernel column is not finite


cdef struct IVMArrays:
    int n
    int d_max
    int k                      # number of included points
    double* M
    double* L
    double* post_var
    double* post_mean
    double* g
    double* nu
    double* score
    double* site_mean
    double* site_precision
    const double* diag_k       # diag K (for the PSD check)
    int* active
    unsigned char* is_active
    double* chosen             # (d_max) the criterion value of each active slot at its entry


cdef struct IVMTargets:        # the likelihood side: site kernel, targets, extra cavity variance
    const SiteModel* model
    const double* y
    double sigma2


cdef int ivm_score(const SiteModel* model, const double* y, IVMArrays* s, double sigma2,
                   int criterion, unsigned long long* rng_state, int* best) noexcept nogil

cdef int ivm_pick(IVMArrays* s, const double* g_all, const double* nu_all, int criterion,
                  unsigned long long* rng_state, int* best) noexcept nogil

cdef int ivm_include(const SiteModel* model, const double* y, IVMArrays* s, double sigma2,
                     int point, const double* column, double* work) noexcept nogil


# --- the engine state (ivm.pyx) ------------------------------------------------------------
# ivm_refine.pxd cimports IVMArrays and IVMTargets from this file, so its classes are cimported
# only here, after those are declared.
from fastep._epcore.ivm_refine cimport KernelRows, IVMOptions


cdef class IVMEP:
    cdef IVMArrays a
    cdef IVMTargets t
    cdef SiteSpec spec
    cdef readonly IVMOptions options           # validated once, at construction
    cdef readonly double sigma2
    cdef readonly int criterion
    cdef unsigned long long rng_state
    cdef const double* y_ptr
    cdef double* work_ptr
    cdef object _y, _diag, _M, _L, _var, _mean, _g, _nu, _score, _site_mean, _site_prec
    cdef object _active, _is_active, _work, _chosen, _prod, _bound, _pending, _snap_var, _snap_mean
    cdef bint _lazy_scores                     # score of inactive points held as ν ς in _prod
    cdef bint _lazy_moments                    # g, ν, ν ς of the _pending points not computed yet
    cdef readonly int n_deferred               # points whose g, ν the last pass deferred
    cdef readonly object post_var, post_mean, site_mean, site_precision, is_active, diag_k, y
    cdef KernelRows _rows                      # refinement: cached K[I, :] (slot order)

    cdef int _score_all(self) except -2
    cdef void _fill_moments(self)
    cdef void _fill_scores(self)
    cdef _include(self, int point, col, bint record_score)
