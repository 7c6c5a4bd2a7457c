# cython: language_level=3
"""Dense GP EP (Minka §2, eqs 77-88; R&W Alg. 3.5 Σ form): nogil building blocks (see gp_ep.pyx).

State (all row-major, n = number of sites = size of the kernel matrix K):

* ``post_cov`` (n x n): the posterior covariance Σ = (K⁻¹ + S̃)⁻¹; during sweeps only its
  LOWER triangle is kept current (as in linear_ep).  During a refactorisation it holds the
  Cholesky factor L of B = I + S̃^½ K S̃^½ until Σ is formed.
* ``post_mean`` (n): μ = Σ ν̃.
* ``post_diag`` (n): diag Σ where a routine says so (parallel iterations and entropy order).
* sites ``site_precision[i] = τ̃_i >= 0`` and ``site_natural_mean[i] = ν̃_i``.
* ``work`` (n x n): the one scratch matrix: V = L⁻¹ S̃^½ K after a refactorisation, the
  stored (scaled) columns of a block during a blocked sweep.

Every routine here is ``noexcept nogil`` and does no allocation.
"""
from fastep._epcore.sites cimport SiteModel, SiteSpec
from fastep._epcore._common cimport (EngineOptions, SweepResult, SweepSettings, SiteUpdateOptions, SweepStats, splitmix64_next,
                                    random_permutation)


cpdef enum GPSchedule:
    SCHEDULE_SEQUENTIAL = 0  # one dsyr per site (plain rank-1 path, the cross-check)
    SCHEDULE_PARALLEL = 1    # all sites from one posterior, then refactorise (damping advised)
    SCHEDULE_BLOCKED = 2     # delayed rank-1 updates folded in with syrk every block_size sites

cpdef enum GPOrder:
    ORDER_FIXED = 0          # 0, 1, ..., n-1
    ORDER_RANDOM = 1         # a fresh seeded permutation each sweep (splitmix64 + Fisher-Yates)
    ORDER_ENTROPY = 2        # greedy: most negative entropy change first (Minka eq 86)

cpdef enum GPOutput:
    OUTPUT_COVARIANCE = 0    # DenseEP.run returns Σ in post_cov
    OUTPUT_FACTOR = 1        # DenseEP.run returns L = chol(I + S^½ K S^½) in post_cov


# --- order ------------------------------------------------------------------------------
cdef double entropy_score(const SiteModel* model, double y, double post_var, double post_mean,
                          double site_precision_i, double site_natural_mean_i) noexcept nogil

cdef int entropy_pick(const SiteModel* model, const double* y, int n,
                      const double* site_precision, const double* site_natural_mean,
                      const double* post_diag, const double* post_mean,
                      const unsigned char* done) noexcept nogil

# --- sweeps -----------------------------------------------------------------------------
cdef void gp_sweep_sequential(const SiteModel* model, const double* y, int n,
                              double* site_precision, double* site_natural_mean,
                              double* post_cov, double* post_mean,
                              const int* perm, bint entropy, double* post_diag, unsigned char* done,
                              double* col, const SiteUpdateOptions* opts,
                              SweepStats* stats, double* half_log_det_b) noexcept nogil

cdef void gp_sweep_blocked(const SiteModel* model, const double* y, int n,
                           double* site_precision, double* site_natural_mean,
                           double* post_cov, double* post_mean,
                           const int* perm, bint entropy, double* post_diag, unsigned char* done,
                           int block_size, double* rows, double* small, double* col,
                           const SiteUpdateOptions* opts, SweepStats* stats,
                           double* half_log_det_b) noexcept nogil

cdef void gp_parallel_update(const SiteModel* model, const double* y, int n,
                             double* site_precision, double* site_natural_mean,
                             const double* post_diag, const double* post_mean,
                             const SiteUpdateOptions* opts, SweepStats* stats) noexcept nogil

# --- refactorisation and evidence (gp_factor.pxd, re-exported here) ----------------------
from fastep._epcore.gp_factor cimport (
    gp_refactor, gp_refactor_marginals, gp_covariance_from_factor, gp_factor_only, gp_form_covariance,
    gp_log_z, gp_needs_stable_log_z, gp_log_z_stable, gp_log_z_stable_factored,
)


# --- the options and the engine (gp_ep.pyx) ---------------------------------------------
cdef class DenseEPOptions(EngineOptions):
    cdef readonly int block_size
    cdef readonly int refresh_every


cdef class DenseEPResult(SweepResult):
    cdef readonly int block_size


cdef class DenseEP:
    cdef SweepSettings sweep            # copied from the options
    cdef readonly DenseEPOptions options
    cdef readonly object K
    cdef readonly object y
    cdef readonly SiteSpec spec
    cdef readonly int n
    cdef readonly int block_size
    cdef readonly int refactor_every
    cdef readonly int output
    cdef readonly unsigned long seed
    cdef readonly bint validate
