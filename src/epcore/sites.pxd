# cython: language_level=3
"""Likelihood site kernels: log Z, alpha, beta for one site, callable without the GIL.

For a site with likelihood t(f) and a Gaussian cavity N(f; mu, s2) the kernel
returns

    log_z = log ∫ t(f) N(f; mu, s2) df
    alpha = d log Z / d mu                      (Minka eq 17)
    beta  = alpha**2 - (d²Z/dmu²) / Z = -d² log Z / dmu²   (Minka eqs 18-19)

so that the tilted mean is mu + s2*alpha and the tilted variance s2 - s2**2 * beta.

The likelihood codes (LIK_*, with each likelihood's parameter layout), the statuses
(SITE_*), GH_MAX_NODES and SiteModel are declared in site_model.pxd and re-exported here.
"""
from fastep._epcore.site_model cimport (
    LikelihoodCode, LIK_PROBIT, LIK_STEP, LIK_LOGISTIC_MACKAY, LIK_LOGISTIC_GH, LIK_GAUSSIAN, LIK_ORDINAL,
    LIK_STUDENT_T,
    SiteStatus, SITE_OK, SITE_BAD_CAVITY, SITE_BAD_LABEL, SITE_ZERO_MASS, SITE_BAD_PARAMS, SITE_OVERFLOW,
    GH_MAX_NODES, SiteModel,
)

cdef int site_moments(const SiteModel* model, double y, double cavity_mean, double cavity_var,
                      double* log_z, double* alpha, double* beta) noexcept nogil


cdef class SiteSpec:
    """A likelihood as the compiled core sees it: a code and parameter arrays it owns.

    Engines read ``spec.model`` inside ``nogil`` blocks; the arrays stay alive as
    long as the SiteSpec does.
    """
    cdef readonly int code
    cdef readonly object params           # float64 C-contiguous ndarray
    cdef readonly object gh_nodes         # float64 ndarray (empty unless LIK_LOGISTIC_GH)
    cdef readonly object gh_log_weights   # float64 ndarray (empty unless LIK_LOGISTIC_GH)
    cdef SiteModel model
