# Inline building blocks shared by the IVM's selection (ivm.pyx) and its refinement
# (ivm_refine.pyx): g and ν of one point at a cavity, log(1 - x) and the tolerance of the
# PSD check.
#
# Included (textually) by both modules, so that the exchange scoring runs the very code of
# the fused scoring pass (bitwise the site kernel's alpha and beta, tested in
# tests/test_ivm_scoring.py).  Not installed: no shipped .pxd includes it.

from libc.math cimport sqrt, log, log1p, fabs, isfinite, isinf
from fastep._epcore.sites cimport SiteModel, site_moments, SITE_OK, LIK_GAUSSIAN, LIK_PROBIT

# G(x) table, N(z) and the probit g, ν: the very code of the site kernel (sites.pyx includes it too)
include "_probit_terms.pxi"

# A posterior variance below -this * K_ii after an update means K is not PSD.
cdef double _NEGATIVE_VARIANCE_RTOL = 1e-8


cdef struct _Lik:
    int code             # LIK_PROBIT or LIK_GAUSSIAN: inline kernel; -1: site by site
    double inv_slope2    # probit: 1/slope² (0 for an infinite slope), as sites._inv_slope2
    double bias          # probit
    double noise         # Gaussian noise variance


cdef inline void _prepare(const SiteModel* model, _Lik* lik) noexcept nogil:
    """The parameters of the inline kernels for ``model`` (``code`` -1 if none applies)."""
    cdef double slope
    lik.code = -1
    lik.inv_slope2 = 0.0
    lik.bias = 0.0
    lik.noise = 0.0
    if model.code == LIK_PROBIT and model.n_params == 2:
        slope = model.params[0]
        lik.code = LIK_PROBIT
        lik.inv_slope2 = 0.0 if isinf(slope) else 1.0 / (slope * slope)
        lik.bias = model.params[1]
    elif model.code == LIK_GAUSSIAN and model.n_params == 1:
        lik.code = LIK_GAUSSIAN
        lik.noise = model.params[0]


cdef inline bint _site_at(const SiteModel* model, double y, double mean, double var, double sigma2,
                          double* g, double* nu) noexcept nogil:
    """g, ν from the site kernel at the cavity N(mean, var + sigma2); False if it fails."""
    cdef double log_z = 0.0
    return site_moments(model, y, mean, var + sigma2, &log_z, g, nu) == SITE_OK


cdef inline double _log1m(double x) noexcept nogil:
    """log(1 - x) for x < 1."""
    if x < 0.5:
        return log1p(-x)
    return log(1.0 - x)


cdef inline bint _gaussian_moments(double noise, double y, double var, double mu, double sigma2,
                                   double* g, double* nu) noexcept nogil:
    """Gaussian g = (y - μ)/v, ν = 1/v, v = ς + sigma2 + σ² (``sites._gaussian_pre``); False
    where the site kernel would fail (ς <= 0 is left to it, as are non-finite values)."""
    cdef double v
    if not (var > 0.0 and isfinite(mu)):
        return False
    v = (var + sigma2) + noise
    g[0] = (y - mu) / v
    nu[0] = 1.0 / v
    return isfinite(g[0]) and isfinite(nu[0]) and isfinite(0.5 * (y - mu) * g[0])


cdef inline bint _point_moments(const SiteModel* model, const _Lik* lik, double y, double var,
                                double mu, double sigma2, double* g, double* nu) noexcept nogil:
    """g, ν of one point at N(mu, var + sigma2): the inline kernels where they apply, else
    ``site_moments``; False if the site kernel fails.  Bitwise the blocked pass's values."""
    cdef double c, z, x
    if lik.code == LIK_PROBIT:
        c = 1.0 / sqrt((var + sigma2) + lik.inv_slope2)
        z = y * (c * (mu + lik.bias))
        x = fabs(z)
        if var > 0.0 and x < _GT_X_MAX:
            if _probit_g_nu(y, c, z, _gauss_tail_poly(x), _normal_pdf(z) if z > 0.0 else 0.0, g, nu):
                return True
    elif lik.code == LIK_GAUSSIAN:
        if _gaussian_moments(lik.noise, y, var, mu, sigma2, g, nu):
            return True
    return _site_at(model, y, mu, var, sigma2, g, nu)
