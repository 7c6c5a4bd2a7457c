# cython: language_level=3
"""Weight-space Gaussian EP with rank-1 sites: nogil building blocks (see linear_ep.pyx).

State: posterior covariance V (d x d, row-major, only the LOWER triangle is kept
current during sweeps), posterior mean m (d), and per-site natural parameters
site_precision[i] = 1/v_i and site_natural_mean[i] = m_i/v_i (Minka eqs 20-22).
"""
from fastep._epcore.sites cimport SiteModel, SiteSpec


from fastep._epcore._common cimport (EngineOptions, SweepSettings,
    UpdateForm, UPDATE_MOMENT, UPDATE_NATURAL,
    NegativePrecisionPolicy, NEGATIVE_CLIP, NEGATIVE_SKIP, NEGATIVE_ALLOW,
    SiteStepResult, STEP_APPLIED, STEP_CLIPPED, STEP_SKIPPED, STEP_FAILED,
    SiteUpdateOptions, SweepStats, sweep_stats_reset, sweep_stats_record, site_step,
)


cpdef enum SweepAlgorithm:
    ALGORITHM_AUTO = 0       # RANK1 for small d, BLOCKED otherwise
    ALGORITHM_RANK1 = 1      # symv + syr per site (plain BLAS-2 path, the cross-check)
    ALGORITHM_BLOCKED = 2    # delayed rank-1 updates flushed every block_size sites as BLAS-3

cdef int site_update(const SiteModel* model, double y, const double* x, int d,
                     double* post_cov, double* post_mean, double* work,
                     double* site_precision_i, double* site_natural_mean_i,
                     const SiteUpdateOptions* opts) noexcept nogil

cdef void sweep_rank1(const SiteModel* model, const double* X, const double* y, int n, int d,
                      double* site_precision, double* site_natural_mean,
                      double* post_cov, double* post_mean, double* work,
                      const SiteUpdateOptions* opts, SweepStats* stats) noexcept nogil

cdef void sweep_blocked(const SiteModel* model, const double* X, const double* y, int n, int d,
                        double* site_precision, double* site_natural_mean,
                        double* post_cov, double* post_mean, int block_size,
                        double* cross, double* scaled, double* small,
                        const SiteUpdateOptions* opts, SweepStats* stats) noexcept nogil

cdef int posterior_precision_cholesky(const double* X, int n, int d, const double* site_precision,
                                      const double* prior_precision, double* chol,
                                      double* scratch, int scratch_rows) noexcept nogil

cdef int refresh_lower(const double* X, int n, int d, const double* site_precision,
                       const double* site_natural_mean, const double* prior_precision,
                       const double* prior_precision_mean, double* post_cov, double* post_mean,
                       double* scratch, int scratch_rows) noexcept nogil


# --- the engine state (linear_ep.pyx: __init__, run, log_evidence) -------------------
cdef class LinearEPOptions(EngineOptions):
    cdef readonly int update_form
    cdef readonly int refresh_every
    cdef readonly int algorithm
    cdef readonly int block_size


cdef class LinearEP:
    cdef SweepSettings sweep            # copied from the options
    cdef readonly LinearEPOptions options
    cdef readonly object X
    cdef readonly object y
    cdef readonly object prior_mean
    cdef readonly object prior_cov
    cdef readonly SiteSpec spec
    cdef readonly int update_form
    cdef readonly int refresh_every
    cdef readonly int algorithm
    cdef readonly int block_size
    cdef readonly bint validate
