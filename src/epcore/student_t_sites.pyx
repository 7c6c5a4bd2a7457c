# cython: language_level=3
"""Student-t sites (robust GP regression; Jylänki, Vanhatalo & Vehtari 2011): moments by quadrature.

``student_t_moments`` gives log Z, alpha = d log Z/d mu and beta = -d² log Z/d mu² of the
powered site ``t(y | f)^η N(f; mu, s2)`` (fractional EP) by adaptive panel quadrature (see
its docstring); ``sites.site_moments`` (η = 1), ``power_ep`` and ``student_t_ep`` call it
per site. ``student_t_moments_array`` is its array form for Python, with the gradients of
log Z in ν and σ.
"""
import numpy as np

from libc.math cimport log, exp, sqrt, log1p, fabs, isfinite, lgamma, cbrt, acos, cos
from libc.stdlib cimport qsort
from fastep._epcore.site_model cimport SITE_OK, SITE_BAD_PARAMS, SITE_ZERO_MASS, check_site, finish_site

cdef extern from *:
    """
    #define FASTEP_LOG_2PI 1.83787706640934548356
    """
    const double _LOG_2PI "FASTEP_LOG_2PI"

# 16-point Gauss-Legendre rule per panel (filled at import from numpy).
cdef enum:
    _N_PANEL_NODES = 16
    _MAX_BREAKS = 640
cdef double _panel_nodes[_N_PANEL_NODES]
cdef double _panel_weights[_N_PANEL_NODES]


def _init_panel_rule():
    nodes, weights = np.polynomial.legendre.leggauss(_N_PANEL_NODES)
    for k in range(_N_PANEL_NODES):
        _panel_nodes[k] = nodes[k]
        _panel_weights[k] = weights[k]


_init_panel_rule()


cdef double _lgamma_half_step(double x) noexcept nogil:
    """log Γ(x + ½) - log Γ(x) for x > 0; the asymptotic series beyond x = 1e4, where the
    difference of two lgamma values of size ~x log x would lose digits."""
    cdef double r
    if x < 1e4:
        return lgamma(x + 0.5) - lgamma(x)
    r = 1.0 / x
    return 0.5 * log(x) + log1p(r * (-0.125 + r * (1.0 / 128.0 + r * (5.0 / 1024.0 - r * 21.0 / 32768.0))))


cdef double student_t_log_norm(double dof, double scale) noexcept nogil:
    """log of the Student-t normaliser Γ((ν+1)/2) / (Γ(ν/2) sqrt(νπ) σ)."""
    return _lgamma_half_step(0.5 * dof) - 0.5 * log(dof * 3.14159265358979323846) - log(scale)


cdef int _compare_doubles(const void* a, const void* b) noexcept nogil:
    cdef double x = (<const double*>a)[0]
    cdef double y = (<const double*>b)[0]
    return (x > y) - (x < y)


cdef inline double _t_log_integrand(double x, double d, double s2, double a, double c) noexcept nogil:
    """h(x) = -(x - d)²/(2 s2) - a log(1 + x²/c): the tilted log density in the residual x = f - y."""
    return -0.5 * (x - d) * (x - d) / s2 - a * log1p(x * x / c)


cdef int _t_stationary_points(double d, double s2, double a, double c, double* roots) noexcept nogil:
    """Real roots of h'(x) = 0, i.e. x³ - d x² + (c + 2 a s2) x - d c = 0, clamped into [0, d].

    Every stationary point of h lies between 0 and d (h' has one sign outside), so the cubic has
    one or three roots there. Cardano / the trigonometric form, then two Newton steps each.
    Returns the number of roots written (0 when the coefficients are too large to form).
    """
    cdef double b1 = c + 2.0 * a * s2
    cdef double p, q, disc, sq, r, phi, t, g, dg, lo, hi, x
    cdef int count = 0, k, it
    if not (fabs(d) < 1e80 and b1 < 1e160 and c < 1e160):
        return 0
    p = b1 - d * d / 3.0
    q = -2.0 * d * d * d / 27.0 + d * b1 / 3.0 - d * c
    disc = 0.25 * q * q + p * p * p / 27.0
    if disc >= 0.0:
        sq = sqrt(disc)
        roots[0] = cbrt(-0.5 * q + sq) + cbrt(-0.5 * q - sq) + d / 3.0
        count = 1
    else:
        r = sqrt(-p / 3.0)
        t = 1.5 * q / p * sqrt(-3.0 / p)
        t = -1.0 if t < -1.0 else (1.0 if t > 1.0 else t)
        phi = acos(t)
        for k in range(3):
            roots[k] = 2.0 * r * cos(phi / 3.0 - 2.0943951023931954923 * k) + d / 3.0
        count = 3
    lo = d if d < 0.0 else 0.0
    hi = d if d > 0.0 else 0.0
    for k in range(count):
        x = roots[k]
        for it in range(2):
            g = ((x - d) * x + b1) * x - d * c
            dg = (3.0 * x - 2.0 * d) * x + b1
            if dg != 0.0 and isfinite(g / dg):
                x -= g / dg
        roots[k] = lo if x < lo else (hi if x > hi else x)
    return count


cdef int _push_grid(double centre, double width, double lo, double hi, double* breaks, int n) noexcept nogil:
    """Append panel edges centre ± width (2^k - 1), k = 1, 2, ..., inside (lo, hi)."""
    cdef double offset = width
    cdef double step = width
    if lo < centre < hi and n < _MAX_BREAKS:
        breaks[n] = centre
        n += 1
    while n < _MAX_BREAKS - 2 and (centre - offset > lo or centre + offset < hi):
        if centre - offset > lo:
            breaks[n] = centre - offset
            n += 1
        if centre + offset < hi:
            breaks[n] = centre + offset
            n += 1
        step *= 2.0
        offset += step
    return n


cdef int student_t_moments(double dof, double scale, double power, double log_norm, double y,
                           double mu, double s2, double* log_z, double* alpha, double* beta,
                           double* mean_log1p_u, double* mean_u_ratio) noexcept nogil:
    """Moments of the powered Student-t site ``t(y | f)^η N(f; mu, s2)`` (η = ``power``).

    ``t(y | f) = C (1 + u)^(-(ν+1)/2)``, ``u = (f - y)²/(ν σ²)``, ``log C = log_norm``
    (:func:`student_t_log_norm`). Returns ``log Z``, ``alpha = d log Z/d mu``,
    ``beta = -d² log Z/d mu²`` (beta < 0 where the site is not log-concave at this cavity)
    and the tilted means of ``log(1 + u)`` and ``u/(1 + u)`` (for the gradients in ν and σ).

    Quadrature: in the residual
    ``x = f - y`` the tilted log density is ``h(x) = -(x - d)²/(2 s2) - a log(1 + x²/c)``,
    ``d = mu - y``, ``a = η(ν+1)/2``, ``c = νσ²``; it may be bimodal. Panel edges grow
    geometrically (widths w, 2w, 4w, ...) around each feature — x = 0 (the likelihood's peak,
    width ``(1/s2 + 2a/c)^-½``), x = d (the cavity's, width sqrt(s2)) and every maximum of h
    (width from h'') — over ``|x - d| <= R``, beyond which h is below its maximum by more than
    50; a 16-point Gauss-Legendre rule per panel. ``alpha`` and ``beta`` come from the score
    identities ``d log Z/dmu = E[l']`` and ``d² log Z/dmu² = E[l''] + Var[l']`` (``l = η log t``,
    expectations under the tilted density; ``l'`` accumulated about its value at the largest
    maximum), which stay accurate for cavities much narrower than the likelihood. ``s2 = 0``
    (or ``s2`` below ``1e-17 c/(1 + 2a)``) gives the pointwise log density and its derivatives.
    """
    cdef double c = dof * scale * scale
    cdef double a = 0.5 * power * (dof + 1.0)
    cdef double d = mu - y
    cdef double r, q, rq, u, s, h_best, hv, width, lo, hi, reach, p0, p1, mid, half, x, wgt, dx
    cdef double s0 = 0.0, s1 = 0.0, s2_acc = 0.0, l1 = 0.0, l2 = 0.0, ratio, curv, mean_off, var
    cdef double curv_acc = 0.0, score_ref
    cdef double roots[3]
    cdef double breaks[_MAX_BREAKS]
    cdef int n_roots, k, j, n_breaks = 0
    if not (c > 0.0 and isfinite(c) and a > 0.0):
        return SITE_BAD_PARAMS
    if s2 * (1.0 + 2.0 * a) <= 1e-17 * c:
        # the cavity is narrower than double precision resolves against the likelihood's
        # width: the pointwise log density and its derivatives
        r = d / sqrt(c)
        q = 1.0 / (1.0 + r * r)
        rq = r * q if fabs(r) < 1e150 else 1.0 / r
        u = r * r
        log_z[0] = power * log_norm - a * log1p(u)
        alpha[0] = -2.0 * a * rq / sqrt(c)
        beta[0] = 2.0 * a / c * q * (2.0 * q - 1.0)
        mean_log1p_u[0] = log1p(u)
        mean_u_ratio[0] = 1.0 - q
        return SITE_OK
    s = sqrt(s2)
    # the largest of h at 0, at d and at its maxima
    h_best = _t_log_integrand(0.0, d, s2, a, c)
    x = 0.0
    hv = _t_log_integrand(d, d, s2, a, c)
    if hv > h_best:
        h_best, x = hv, d
    n_roots = _t_stationary_points(d, s2, a, c, roots)
    for k in range(n_roots):
        hv = _t_log_integrand(roots[k], d, s2, a, c)
        if hv > h_best:
            h_best, x = hv, roots[k]
    reach = s * sqrt(2.0 * (50.0 - h_best))
    lo = d - reach
    hi = d + reach
    breaks[0] = lo
    breaks[1] = hi
    n_breaks = 2
    width = 1.0 / sqrt(1.0 / s2 + 2.0 * a / c)
    n_breaks = _push_grid(0.0, width, lo, hi, breaks, n_breaks)
    n_breaks = _push_grid(d, s, lo, hi, breaks, n_breaks)
    for k in range(n_roots):
        ratio = roots[k] * roots[k] / c
        curv = 1.0 / s2 + 2.0 * a / c * (1.0 - ratio) / ((1.0 + ratio) * (1.0 + ratio))
        if curv > 0.0:
            width = 1.0 / sqrt(curv)
            n_breaks = _push_grid(roots[k], width if width < s else s, lo, hi, breaks, n_breaks)
    qsort(breaks, n_breaks, sizeof(double), _compare_doubles)
    score_ref = -2.0 * a * x / (c + x * x)
    for j in range(n_breaks - 1):
        p0 = breaks[j]
        p1 = breaks[j + 1]
        if not p1 > p0:
            continue
        mid = 0.5 * (p0 + p1)
        half = 0.5 * (p1 - p0)
        for k in range(_N_PANEL_NODES):
            dx = half * _panel_nodes[k]
            u = mid + dx
            ratio = u * u / c
            hv = -0.5 * (u - d) * (u - d) / s2 - a * log1p(ratio)
            wgt = half * _panel_weights[k] * exp(hv - h_best)
            dx = -2.0 * a * u / (c + u * u) - score_ref       # ℓ'(u) about its value at x
            s0 += wgt
            s1 += wgt * dx
            s2_acc += wgt * dx * dx
            curv_acc += wgt * (1.0 - ratio) / ((1.0 + ratio) * (1.0 + ratio))
            l1 += wgt * log1p(ratio)
            l2 += wgt * (ratio / (1.0 + ratio))
    if not (s0 > 0.0 and isfinite(s0)):
        return SITE_ZERO_MASS
    mean_off = s1 / s0
    var = s2_acc / s0 - mean_off * mean_off
    if var < 0.0:
        var = 0.0
    log_z[0] = power * log_norm - 0.5 * (_LOG_2PI + log(s2)) + h_best + log(s0)
    # the score identities d log Z/dμ = E[ℓ'], d² log Z/dμ² = E[ℓ''] + Var[ℓ'] (ℓ = η log t, the
    # expectations under the tilted density): no cancellation against 1/s2 for narrow cavities
    alpha[0] = score_ref + mean_off
    beta[0] = 2.0 * a / c * (curv_acc / s0) - var
    mean_log1p_u[0] = l1 / s0
    mean_u_ratio[0] = l2 / s0
    return SITE_OK


def student_t_moments_array(double dof, double scale, double power, y, cavity_mean, cavity_var):
    """Moments of the powered Student-t site ``t(y | f)^power N(f; mu, s2)`` over arrays.

    Parameters
    ----------
    dof, scale : float > 0
        ν and σ of ``t(y | f) = Γ((ν+1)/2) / (Γ(ν/2) sqrt(νπ) σ) (1 + (y - f)²/(νσ²))^(-(ν+1)/2)``.
    power : float in (0, 1]
        The fractional (power) EP exponent η.
    y, cavity_mean, cavity_var : array_like, shape (n,)

    Returns
    -------
    log_z, alpha, beta, d_log_dof, d_log_scale : ndarray, shape (n,)
        ``log Z``, ``d log Z/d mu``, ``-d² log Z/d mu²`` and ``∂ log Z/∂ log ν``,
        ``∂ log Z/∂ log σ`` at the fixed cavity (tilted expectations of the log-likelihood's
        derivatives, times η).

    Raises
    ------
    ValueError
        Bad parameters, lengths, or a failing site (named).
    """
    from scipy.special import digamma
    # sites imports this module when it loads, so its helpers are imported here, at call time
    from fastep._epcore.sites import _as_input, status_message
    if not (dof > 0 and np.isfinite(dof) and scale > 0 and np.isfinite(scale)):
        raise ValueError(f"dof and scale must be finite and > 0, got {dof!r} and {scale!r}")
    if not (0.0 < power <= 1.0):
        raise ValueError(f"power must be in (0, 1], got {power!r}")
    if not (np.isfinite(dof * scale * scale) and dof * scale * scale > 0):
        raise ValueError(f"dof * scale**2 must be finite and > 0, got {dof!r} and {scale!r}")
    y_arr = _as_input("y", y)
    mean_arr = _as_input("cavity_mean", cavity_mean)
    var_arr = _as_input("cavity_var", cavity_var)
    cdef Py_ssize_t n = y_arr.shape[0], i, failed = -1
    if mean_arr.shape[0] != n or var_arr.shape[0] != n:
        raise ValueError(f"y, cavity_mean and cavity_var must have the same length, got "
                         f"{n}, {mean_arr.shape[0]} and {var_arr.shape[0]}")
    out = np.empty((5, n))
    cdef double[:, ::1] o = out
    cdef const double[::1] yv = y_arr
    cdef const double[::1] mv = mean_arr
    cdef const double[::1] vv = var_arr
    cdef double log_norm = student_t_log_norm(dof, scale)
    cdef int status = SITE_OK
    with nogil:
        for i in range(n):
            status = check_site(yv[i], mv[i], vv[i])
            if status == SITE_OK:
                status = student_t_moments(dof, scale, power, log_norm, yv[i], mv[i], vv[i],
                                           &o[0, i], &o[1, i], &o[2, i], &o[3, i], &o[4, i])
                status = finish_site(status, &o[0, i], &o[1, i], &o[2, i])
            if status != SITE_OK:
                failed = i
                break
    if failed >= 0:
        raise ValueError(
            f"site {failed} failed (Student-t likelihood, y={float(y_arr[failed])!r}, "
            f"cavity_mean={float(mean_arr[failed])!r}, cavity_var={float(var_arr[failed])!r}): "
            f"{status_message(status)}")
    mean_log1p_u, mean_u_ratio = out[3].copy(), out[4].copy()
    d_log_dof = power * dof * (0.5 * (digamma(0.5 * (dof + 1.0)) - digamma(0.5 * dof)) - 0.5 / dof
                               - 0.5 * mean_log1p_u + 0.5 * (dof + 1.0) / dof * mean_u_ratio)
    d_log_scale = power * (-1.0 + (dof + 1.0) * mean_u_ratio)
    return out[0].copy(), out[1].copy(), out[2].copy(), d_log_dof, d_log_scale
