# cython: language_level=3
"""Likelihood site kernels: log Z, alpha, beta for one site, callable without the GIL.

For a site with likelihood t(f) and a Gaussian cavity N(f; mu, s2) the kernel
returns

    log_z = log ∫ t(f) N(f; mu, s2) df
    alpha = d log Z / d mu                      (Minka eq 17)
    beta  = alpha**2 - (d²Z/dmu²) / Z = -d² log Z / dmu²   (Minka eqs 18-19)

so that the tilted mean is mu + s2*alpha and the tilted variance s2 - s2**2 * beta.
"""

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

# Student-t site raised to ``power`` (fractional EP), with the tilted means of log(1 + u) and
# u/(1 + u), u = (f - y)²/(ν σ²), for the gradients in ν and σ; log_norm from student_t_log_norm.
cdef double student_t_log_norm(double dof, double scale) noexcept nogil
cdef int student_t_moments(double dof, double scale, double power, double log_norm, double y,
                           double mu, double s2, double* log_z, double* alpha, double* beta,
                           double* mean_log1p_u, double* mean_u_ratio) noexcept nogil

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
