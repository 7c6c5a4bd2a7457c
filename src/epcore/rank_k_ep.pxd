# cython: language_level=3
"""Weight-space Gaussian EP with rank-k factors (Minka §3, eqs 95-116): cdef interface.

The likelihoods and their moments live in rank_k_sites.pxd and are re-exported here."""
from fastep._epcore.rank_k_sites cimport (
    RankKKind, RANKK_MVGAUSSIAN, RANKK_PRODUCT,
    RankKStatus, RANKK_OK, RANKK_BAD_CAVITY, RANKK_BAD_LABEL, RANKK_FAILED, RANKK_NOT_PD, RANKK_NO_QUADRATURE,
    RankKModel, rank_k_moments, RankKLikelihood, sym_average, all_finite, cholesky_lower,
)


cdef struct RankKProblem:
    int n                        # factors
    int k                        # outputs per factor
    int d                        # weights
    const double* x              # (n, k, d) row-major, x[i] = X_i^T
    const double* y              # (n, k)
    const double* v0_inv         # (d, d) prior precision V0^{-1}
    const double* v0_inv_m0      # (d,) V0^{-1} m0

from fastep._epcore._common cimport EngineOptions, SweepSettings


cdef class RankKEPOptions(EngineOptions):
    cdef readonly int refresh_every


cdef class RankKEP:
    cdef SweepSettings sweep            # copied from the options
    cdef readonly RankKEPOptions options
    cdef readonly object X
    cdef readonly object y
    cdef readonly object prior_mean
    cdef readonly object prior_cov
    cdef readonly RankKLikelihood likelihood
    cdef readonly object site_precision      # (n, k, k), updated in place by run()
    cdef readonly object site_natural_mean   # (n, k), updated in place by run()
    cdef readonly object post_mean           # (d,), written by run()
    cdef readonly object post_cov            # (d, d), written by run()
    cdef readonly int n
    cdef readonly int k
    cdef readonly int d
    cdef readonly int refresh_every
    cdef readonly bint validate
    cdef readonly object prior_precision     # V0^{-1}
    cdef object prior_precision_mean         # V0^{-1} m0
    cdef double log_det_prior_cov            # log |V0|
    cdef RankKProblem problem                # pointers into X, y and the two above
