# cython: language_level=3
"""Likelihood codes, site statuses and ``SiteModel``: a likelihood as the site kernels see it.

Shared by the kernels (``_site_kernels.pxd``, ``student_t_sites``), their dispatch
``sites.site_moments`` and the engines; ``sites.pxd`` re-exports every name declared here.
Declarations and inline functions only: cimporting this file imports no module.
"""
from libc.math cimport isfinite, isnan

cdef enum LikelihoodCode:
    LIK_PROBIT = 0           # params: [slope (may be +inf), bias]; y in {-1, +1}
    LIK_STEP = 1             # params: [flip noise eps in [0, 1/2)]; y in {-1, +1}
    LIK_LOGISTIC_MACKAY = 2  # params: []; y in {-1, +1}
    LIK_LOGISTIC_GH = 3      # params: []; quadrature nodes in SiteModel; y in {-1, +1}
    LIK_GAUSSIAN = 4         # params: [noise variance > 0]; y real
    LIK_ORDINAL = 5          # params: [slope, bias, width_1, ..., width_{C-2}]; y in {0, ..., C-1}
    LIK_STUDENT_T = 6        # params: [dof ν > 0, scale σ > 0]; y real

cdef enum SiteStatus:
    SITE_OK = 0
    SITE_BAD_CAVITY = 1      # cavity variance not > 0 (or not finite) where the likelihood needs it
    SITE_BAD_LABEL = 2       # label outside the likelihood's support
    SITE_ZERO_MASS = 3       # Z underflowed to 0 even in log space (only when |standardised z| > ~1e154)
    SITE_BAD_PARAMS = 4      # SiteModel inconsistent (unknown code, wrong n_params, missing nodes, ...)
    SITE_OVERFLOW = 5        # alpha or beta not representable in float64 (e.g. cavity variance ~1e-320)

# Largest Gauss-Hermite rule the LIK_LOGISTIC_GH kernel accepts (it keeps per-node work on the stack).
cdef enum:
    GH_MAX_NODES = 256

cdef struct SiteModel:
    int code
    const double* params
    int n_params
    const double* gh_nodes         # LIK_LOGISTIC_GH: nodes t_k for ∫ g(t) exp(-t²) dt (physicists' Hermite)
    const double* gh_log_weights   # log(w_k / sqrt(pi)), so that sum_k exp(lw_k) = 1
    int n_nodes


cdef inline int check_site(double y, double mu, double s2) noexcept nogil:
    """SITE_BAD_CAVITY / SITE_BAD_LABEL checks shared by every likelihood (in that order)."""
    if not isfinite(mu) or not isfinite(s2) or not (s2 >= 0.0):
        return SITE_BAD_CAVITY
    if isnan(y):
        return SITE_BAD_LABEL
    return SITE_OK


cdef inline int finish_site(int status, double* log_z, double* alpha, double* beta) noexcept nogil:
    """Turn non-finite results into SITE_ZERO_MASS / SITE_OVERFLOW: a kernel never returns
    NaN or inf with SITE_OK."""
    if status != SITE_OK:
        return status
    if not isfinite(log_z[0]):
        return SITE_ZERO_MASS if log_z[0] < 0 else SITE_OVERFLOW
    if not isfinite(alpha[0]) or not isfinite(beta[0]):
        return SITE_OVERFLOW
    return SITE_OK
