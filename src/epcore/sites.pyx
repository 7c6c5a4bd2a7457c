# cython: language_level=3
"""Likelihood site kernels: log Z, alpha, beta of one EP site, without the GIL.

For a site with likelihood ``t(f)`` and Gaussian cavity ``N(f; mu, s2)`` every
kernel returns (Minka eqs 6, 17-19; Lawrence-Seeger-Herbrich IVM eqs 14-16 with
``g = alpha`` and ``nu = beta``)::

    log_z = log Z,   Z = ∫ t(f) N(f; mu, s2) df
    alpha = d log Z / d mu
    beta  = -d² log Z / d mu²

so that the tilted mean is ``mu + s2*alpha`` and the tilted variance
``s2 - s2**2 * beta``.

Numerical policy
----------------
* Everything that can underflow is handled in log space; the Gaussian hazard
  ``r(z) = N(z)/Phi(z)`` and the difference ``r(z) + z`` (which cancels for
  ``z -> -inf``) come from the Laplace continued fraction of the Mills ratio for
  ``z <= -5`` (``_mills_tail``) and from the scaled complementary error function
  ``erfcx`` for ``-5 < z <= -1`` (see ``_cdf_terms``), accurate to a few ulp
  for every ``|z|`` up to ~1e154, beyond which ``log Phi(z) = -z²/2`` itself
  overflows float64.
* Probit and ordinal sites share one routine for ``Phi(hi) - Phi(lo)`` over an
  interval (``_interval_moments``); it never subtracts two tail probabilities
  directly (see its docstring).
* A kernel never returns NaN/inf with ``SITE_OK``: non-finite results are
  reported as ``SITE_ZERO_MASS`` (log Z = -inf) or ``SITE_OVERFLOW``.
* ``beta`` is clamped into its theoretical range only where that range is known
  exactly and only as a guard against rounding (probit/ordinal: ``[0, c²]``;
  noiseless step: ``[0, 1/s2]``; noisy step: ``<= 1/s2``). Away from ulp-level
  rounding the clamp is inactive (tests check the unclamped formulas against
  mpmath).
"""
import numpy as np

from libc.math cimport (log, exp, sqrt, log1p, expm1, erf, erfc, fabs, floor, isfinite, isinf,
                        isnan, INFINITY)
from scipy.special.cython_special cimport erfcx


cdef double _LOG_SQRT_2PI = 0.91893853320467274178   # log(sqrt(2*pi))
cdef double _SQRT1_2 = 0.70710678118654752440        # 1/sqrt(2)
cdef double _SQRT_2PI = 2.50662827463100050242
cdef double _SQRT_2_OVER_PI = 0.79788456080286535588   # sqrt(2/pi)
cdef double _LOG_2PI = 1.83787706640934548356
cdef double _PI_OVER_8 = 0.39269908169872415481
# Below this, products of hazards and scales are formed in log space so that a
# representable alpha (e.g. c N(40) with c = 1e150) does not underflow to 0.
cdef double _TINY = 1e-280

# 10-point Gauss-Legendre rule on [-1, 1] (filled at import from numpy), used for
# truncated-normal moments over narrow intervals in the ordinal kernel.
cdef enum:
    _N_LEGENDRE = 10
cdef double _legendre_nodes[_N_LEGENDRE]
cdef double _legendre_weights[_N_LEGENDRE]


def _init_legendre():
    nodes, weights = np.polynomial.legendre.leggauss(_N_LEGENDRE)
    for k in range(_N_LEGENDRE):
        _legendre_nodes[k] = nodes[k]
        _legendre_weights[k] = weights[k]


_init_legendre()


# ----------------------------------------------------------------------------
# Scalar special functions
# ----------------------------------------------------------------------------

cdef inline double _log_npdf(double z) noexcept nogil:
    """log N(z; 0, 1)."""
    return -0.5 * z * z - _LOG_SQRT_2PI


cdef inline double _mills_tail(double x) noexcept nogil:
    """g(x) = N(x)/Phi(-x) - x for x >= 5 by the Laplace continued fraction.

    The Mills ratio R(x) = Phi(-x)/N(x) = 1/(x + 1/(x + 2/(x + 3/(x + ...)))),
    so N(x)/Phi(-x) = x + g(x) with g(x) = 1/(x + 2/(x + 3/(x + ...))). The
    fraction is evaluated backward; the term counts give relative error below
    2e-16 for every x >= 5 (checked against mpmath in the tests).
    """
    cdef int k, n_terms
    cdef double t = x
    if x < 8.0:
        n_terms = 40
    else:
        n_terms = 20
    for k in range(n_terms, 1, -1):
        t = x + k / t
    return 1.0 / t


cdef inline void _cdf_terms(double z, double* log_cdf, double* hazard,
                            double* hazard_plus_z) noexcept nogil:
    """log Phi(z), the hazard r = N(z)/Phi(z), and r + z, all to full precision.

    * z <= -5 (x = -z): r = x + g(x) with g from the continued fraction, so
      r + z = g(x) has no cancellation, and log Phi(z) = log N(z) - log r.
    * -5 < z <= -1: Phi(z) = erfcx(x/√2) exp(-x²/2)/2, so r = √(2/π)/erfcx(x/√2)
      to ~1 ulp and log Phi(z) = log(erfcx(x/√2)/2) - x²/2; r + z cancels by at
      most a factor x²+1 <= 26 there (error <~ 30 eps).
    * z > -1: Phi(z) = erfc(-z/√2)/2 (one erfc), log Phi from it (log1p of the
      complementary mass for z > 1 so log Phi ≈ 0 keeps its relative precision),
      r = N(z)/Phi(z); r + z is a sum of positive terms for z > 0 and cancels
      by at most a factor ~2 for -1 < z <= 0.
    """
    cdef double x, g, r, t, phi, upper
    if z <= -5.0:
        x = -z
        g = _mills_tail(x)
        r = x + g
        hazard[0] = r
        hazard_plus_z[0] = g
        log_cdf[0] = -0.5 * x * x - _LOG_SQRT_2PI - log(r)
    elif z <= -1.0:
        x = -z
        t = erfcx(x * _SQRT1_2)
        r = _SQRT_2_OVER_PI / t
        hazard[0] = r
        hazard_plus_z[0] = r + z
        log_cdf[0] = log(0.5 * t) - 0.5 * x * x
    else:
        if z > 1.0:
            upper = 0.5 * erfc(z * _SQRT1_2)
            phi = 1.0 - upper
            log_cdf[0] = log1p(-upper)
        else:
            phi = 0.5 * erfc(-z * _SQRT1_2)
            log_cdf[0] = log(phi)
        r = exp(-0.5 * z * z - _LOG_SQRT_2PI) / phi
        hazard[0] = r
        hazard_plus_z[0] = r + z


cdef inline double _log_hazard(double z, double log_cdf, double hazard) noexcept nogil:
    """log(N(z)/Phi(z)) given the outputs of _cdf_terms, also where the hazard underflows (z >~ 37)."""
    if hazard > _TINY:
        return log(hazard)
    return _log_npdf(z) - log_cdf


cdef inline double _log_sigmoid(double x) noexcept nogil:
    """log(1/(1 + exp(-x))) without overflow or cancellation."""
    if x >= 0.0:
        return -log1p(exp(-x))
    return x - log1p(exp(x))


cdef inline double _sigmoid(double x) noexcept nogil:
    cdef double e
    if x >= 0.0:
        return 1.0 / (1.0 + exp(-x))
    e = exp(x)
    return e / (1.0 + e)


cdef inline double _log_add_exp(double a, double b) noexcept nogil:
    cdef double hi = a if a > b else b
    cdef double lo = b if a > b else a
    if isinf(hi) and hi < 0:
        return hi
    return hi + log1p(exp(lo - hi))


cdef inline double _clamp(double v, double lower, double upper) noexcept nogil:
    if v < lower:
        return lower
    if v > upper:
        return upper
    return v


# ----------------------------------------------------------------------------
# Interval kernel shared by probit and ordinal sites
# ----------------------------------------------------------------------------

cdef void _narrow_interval(double lo, double width, double* log_z, double* d_over_z,
                           double* beta_over_c2) noexcept nogil:
    """Truncated-normal moments on [lo, lo + width] by 10-point Gauss-Legendre (narrow intervals).

    With mid = lo + width/2 and t = mid + s, N(t) = N(mid) exp(-s (mid + s/2)), so
    Z = N(mid) ∫ exp(-s(mid + s/2)) ds, the truncated mean is mid + E[s] and the
    truncated variance is Var[s]. Used when width (1 + |mid|) < 1/2: the exponent
    then varies by less than ~1/2 over the interval and the rule is exact to
    rounding. Returns log Z, D/Z = -(truncated mean) and beta/c² = 1 - Var[s].
    """
    cdef int k
    cdef double half = 0.5 * width
    cdef double mid = lo + half
    cdef double offset, total = 0.0, first = 0.0, second = 0.0, mean
    cdef double weights[_N_LEGENDRE]
    for k in range(_N_LEGENDRE):
        offset = half * _legendre_nodes[k]
        weights[k] = _legendre_weights[k] * exp(-offset * (mid + 0.5 * offset))
        total += weights[k]
        first += weights[k] * offset
    mean = first / total
    for k in range(_N_LEGENDRE):
        offset = half * _legendre_nodes[k] - mean
        second += weights[k] * offset * offset
    log_z[0] = _log_npdf(mid) + log(half * total)
    d_over_z[0] = -(mid + mean)
    beta_over_c2[0] = 1.0 - second / total


cdef void _interval_moments(double c, double lo, double hi, double width,
                            double* log_z, double* alpha, double* beta) noexcept nogil:
    """Moments for Z(mu) = Phi(hi) - Phi(lo), hi = c(theta_hi - mu), lo = c(theta_lo - mu).

    ``lo < hi``; at most one of them is infinite (``lo = -inf`` or ``hi = +inf``);
    ``width = hi - lo`` is passed separately (computed as ``c * w`` from the
    threshold widths, so it keeps full relative precision even for narrow
    intervals). The formulas (IVM eqs 24-25, written for a general interval) are

        alpha = -c (N(hi) - N(lo)) / Z
        beta  = alpha² + c² (hi N(hi) - lo N(lo)) / Z,

    with terms of an infinite end vanishing. ``beta / c²`` is one minus the
    variance of a standard normal truncated to ``[lo, hi]``, hence in ``[0, 1]``;
    it is clamped there against rounding.

    Evaluation (never subtracting two tail masses directly):

    * the interval is mirrored (``Phi(hi) - Phi(lo) = Phi(-lo) - Phi(-hi)``,
      alpha changes sign) so it never lies wholly in the upper tail;
    * one-sided (``lo = -inf``): probit formulas with the hazard ``r`` and
      ``r + hi`` from ``_cdf_terms`` (IVM eqs 19-21, Minka eqs 57-60);
    * narrow finite intervals (``width (1 + |mid|) < 1/2``): truncated-normal
      moments by Gauss-Legendre relative to the midpoint (``_narrow_interval``),
      which keeps ``beta/c² = 1 - Var`` accurate where the endpoint formulas
      below would cancel;
    * ``lo < hi <= 0``: ``Z = Phi(hi) (1 - q)`` with
      ``log q = log Phi(lo) - log Phi(hi) = e1 + log r(hi) - log r(lo)``
      (``e1 = log N(lo) - log N(hi) = width (lo + hi)/2``, and
      ``|log q| >~ 0.2`` outside the narrow case); then ``D/Z = r(hi)(1 - e^e1)/(1 - q)``,
      ``N(lo)/Z = r(hi) e^e1/(1 - q)`` and
      ``D/Z + hi = (g(hi) - q (width + g(lo)))/(1 - q)`` where ``g = r + t``,
      so ``beta/c² = (D/Z)(D/Z + hi) + width N(lo)/Z``;
    * ``lo < 0 < hi``: ``Z = (erf(hi/√2) + erf(-lo/√2))/2``, a sum of two
      positive terms (``log Z = log1p(-Phi(lo) - Phi(-hi))`` when ``Z > 1/2``
      so that ``log Z ≈ 0`` keeps its relative precision), and direct formulas
      (no cancellation in beta).
    """
    cdef double sign = 1.0, swap
    cdef double log_cdf_hi, hazard_hi, g_hi, log_cdf_lo, hazard_lo, g_lo
    cdef double e1, log_q, q, one_minus_q, d_over_z, d_over_z_plus_hi, n_lo_over_z
    cdef double z_mass, n_hi, n_lo, n_diff, beta_over_c2, log_hazard_hi
    if isinf(hi) or (not isinf(lo) and lo >= 0.0):
        swap = hi
        hi = -lo
        lo = -swap
        sign = -1.0

    if isinf(lo):
        # One-sided interval: Z = Phi(hi).
        _cdf_terms(hi, &log_cdf_hi, &hazard_hi, &g_hi)
        log_z[0] = log_cdf_hi
        if hazard_hi < _TINY:
            # hi >~ 37: Z ≈ 1 and alpha, beta are tiny; keep them representable.
            log_hazard_hi = _log_hazard(hi, log_cdf_hi, hazard_hi)
            alpha[0] = -sign * exp(log(c) + log_hazard_hi)
            beta[0] = exp(2.0 * log(c) + log_hazard_hi + log(g_hi))
            return
        d_over_z = hazard_hi
        beta_over_c2 = hazard_hi * g_hi
    elif width * (1.0 + fabs(0.5 * (lo + hi))) < 0.5:
        _narrow_interval(lo, width, log_z, &d_over_z, &beta_over_c2)
    elif hi <= 0.0:
        # Both ends in the lower tail.
        _cdf_terms(hi, &log_cdf_hi, &hazard_hi, &g_hi)
        _cdf_terms(lo, &log_cdf_lo, &hazard_lo, &g_lo)
        e1 = 0.5 * width * (lo + hi)
        log_q = e1 + log(hazard_hi) - log(hazard_lo)
        q = exp(log_q)
        one_minus_q = -expm1(log_q)
        log_z[0] = log_cdf_hi + log(one_minus_q)
        d_over_z = hazard_hi * (-expm1(e1)) / one_minus_q
        n_lo_over_z = hazard_hi * exp(e1) / one_minus_q
        d_over_z_plus_hi = (g_hi - q * (width + g_lo)) / one_minus_q
        beta_over_c2 = d_over_z * d_over_z_plus_hi + width * n_lo_over_z
    else:
        # lo < 0 < hi, both finite.
        z_mass = 0.5 * (erf(hi * _SQRT1_2) + erf(-lo * _SQRT1_2))
        if z_mass > 0.5:
            log_z[0] = log1p(-0.5 * (erfc(-lo * _SQRT1_2) + erfc(hi * _SQRT1_2)))
        else:
            log_z[0] = log(z_mass)
        n_hi = exp(_log_npdf(hi))
        n_lo = exp(_log_npdf(lo))
        e1 = 0.5 * width * (lo + hi)
        if e1 <= 0.0:
            n_diff = -n_hi * expm1(e1)
        else:
            n_diff = n_lo * expm1(-e1)
        d_over_z = n_diff / z_mass
        beta_over_c2 = d_over_z * d_over_z + (hi * n_hi - lo * n_lo) / z_mass

    alpha[0] = -sign * c * d_over_z
    beta[0] = c * c * _clamp(beta_over_c2, 0.0, 1.0)


# ----------------------------------------------------------------------------
# Per-likelihood kernels (inputs already validated by site_moments)
# ----------------------------------------------------------------------------

cdef inline double _probit_scale(double slope, double cavity_var) noexcept nogil:
    """c = 1/sqrt(slope⁻² + s2) (IVM eq 19); +inf when that is not representable."""
    cdef double total = cavity_var
    if not isinf(slope):
        total = total + 1.0 / (slope * slope)
    if total <= 0.0:
        return INFINITY
    return 1.0 / sqrt(total)


cdef int _probit(const SiteModel* model, double y, double mu, double s2,
                 double* log_z, double* alpha, double* beta) noexcept nogil:
    """t(f) = Phi(slope * y * (f + bias)) as the interval (-bias, inf) (y=+1) or (-inf, -bias) (y=-1)."""
    cdef double slope = model.params[0]
    cdef double bias = model.params[1]
    cdef double c
    if y != 1.0 and y != -1.0:
        return SITE_BAD_LABEL
    c = _probit_scale(slope, s2)
    if isinf(c):
        return SITE_BAD_CAVITY
    if y > 0:
        _interval_moments(c, c * (-bias - mu), INFINITY, INFINITY, log_z, alpha, beta)
    else:
        _interval_moments(c, -INFINITY, c * (-bias - mu), INFINITY, log_z, alpha, beta)
    return SITE_OK


cdef int _ordinal(const SiteModel* model, double y, double mu, double s2,
                  double* log_z, double* alpha, double* beta) noexcept nogil:
    """p(y=k|f) = Phi(slope(theta_k - f)) - Phi(slope(theta_{k-1} - f)), theta_k = bias + sum_{i<=k} w_i.

    IVM §2.4 eqs 24-25 in the consistent threshold model (theta_{-1} = -inf,
    theta_{C-1} = +inf). The paper's y = 0 case reads Phi(lambda (b + f)), a sign
    typo for Phi(lambda (b - f)), and its nu formula has N(u) where N(u') is
    meant; both are as here once written for a general interval.
    """
    cdef int n_categories = model.n_params
    cdef double slope = model.params[0]
    cdef double theta_lo, width, c
    cdef int k, i
    if not (y >= 0.0 and y <= n_categories - 1 and floor(y) == y):
        return SITE_BAD_LABEL
    k = <int>y
    c = _probit_scale(slope, s2)
    if isinf(c):
        return SITE_BAD_CAVITY
    if k == 0:
        # (-inf, theta_0], theta_0 = bias.
        _interval_moments(c, -INFINITY, c * (model.params[1] - mu), INFINITY, log_z, alpha, beta)
        return SITE_OK
    # theta_{k-1} = bias + w_1 + ... + w_{k-1}, with w_i = params[1 + i].
    theta_lo = model.params[1]
    for i in range(1, k):
        theta_lo = theta_lo + model.params[1 + i]
    if k == n_categories - 1:
        _interval_moments(c, c * (theta_lo - mu), INFINITY, INFINITY, log_z, alpha, beta)
    else:
        width = model.params[1 + k]
        _interval_moments(c, c * (theta_lo - mu), c * (theta_lo + width - mu), c * width,
                          log_z, alpha, beta)
    return SITE_OK


cdef int _step(const SiteModel* model, double y, double mu, double s2,
               double* log_z, double* alpha, double* beta) noexcept nogil:
    """t(f) = eps + (1 - 2 eps) Theta(y f) (Minka eqs 50-55).

    z = y mu / sqrt(s2), Z = eps + (1 - 2eps) Phi(z). With w = (1-2eps)Phi(z)/Z
    and hazard r = N(z)/Phi(z): alpha = y w r / sqrt(s2) (eq 54) and
    beta = alpha (alpha + mu/s2) (eq 55) = (w r / s2) ((r + z) - (1 - w) r),
    with r + z from the continued fraction (no cancellation for z -> -inf).
    """
    cdef double eps = model.params[0]
    cdef double sd, z, log_cdf, hazard, hazard_plus_z, log_signal, log_noise
    cdef double signal_frac, noise_frac, log_signal_frac, alpha_abs
    if y != 1.0 and y != -1.0:
        return SITE_BAD_LABEL
    if not (s2 > 0.0):
        return SITE_BAD_CAVITY
    sd = sqrt(s2)
    z = y * mu / sd
    _cdf_terms(z, &log_cdf, &hazard, &hazard_plus_z)
    if eps == 0.0:
        log_z[0] = log_cdf
        log_signal_frac = 0.0
        signal_frac = 1.0
        noise_frac = 0.0
    else:
        log_signal = log1p(-2.0 * eps) + log_cdf
        log_noise = log(eps)
        log_z[0] = _log_add_exp(log_signal, log_noise)
        log_signal_frac = log_signal - log_z[0]
        signal_frac = exp(log_signal_frac)
        noise_frac = exp(log_noise - log_z[0])
    if signal_frac * hazard > _TINY:
        alpha_abs = signal_frac * hazard / sd
    else:
        # w r underflows (z >~ 37, or eps > 0 and z << 0); alpha may still be representable.
        alpha_abs = exp(log_signal_frac + _log_hazard(z, log_cdf, hazard) - log(sd))
    alpha[0] = y * alpha_abs
    # beta = alpha (alpha + mu/s2) = (alpha_abs / sd) ((r + z) - (1 - w) r); s2 beta <= 1.
    beta[0] = (alpha_abs / sd) * (hazard_plus_z - noise_frac * hazard)
    if eps == 0.0 and beta[0] < 0.0:
        beta[0] = 0.0
    if beta[0] * sd * sd > 1.0:
        beta[0] = (1.0 / sd) / sd
    return SITE_OK


cdef int _logistic_mackay(const SiteModel* model, double y, double mu, double s2,
                          double* log_z, double* alpha, double* beta) noexcept nogil:
    """MacKay's approximation Z ≈ sigma(y kappa mu), kappa = (1 + pi s2/8)^(-1/2) (Minka eqs 62-64).

    alpha = y kappa sigma(-z) (eq 64). beta is the exact second derivative of
    this log Z, kappa² sigma(z) sigma(-z); Minka's eq 65 instead uses
    alpha² - 2 d log Z/d s2, which equals -d² log Z/d mu² only for exact Z and
    can be negative here. Ours lies in (0, kappa²/4], so the tilted variance
    s2 - s2² beta stays positive.
    """
    cdef double kappa, z
    if y != 1.0 and y != -1.0:
        return SITE_BAD_LABEL
    kappa = 1.0 / sqrt(1.0 + _PI_OVER_8 * s2)
    z = y * kappa * mu
    log_z[0] = _log_sigmoid(z)
    alpha[0] = y * kappa * _sigmoid(-z)
    beta[0] = kappa * kappa * _sigmoid(z) * _sigmoid(-z)
    return SITE_OK


cdef int _logistic_gh(const SiteModel* model, double y, double mu, double s2,
                      double* log_z, double* alpha, double* beta) noexcept nogil:
    """Gauss-Hermite estimate Z ≈ sum_k w_k sigma(y f_k), f_k = mu + sqrt(2 s2) t_k.

    This is Minka's eq 66 with the cavity as the quadrature measure. Instead of
    eqs 67-70 (tilted moments Z1/Z, Z2/Z, then alpha and beta by dividing by s2
    and s2², which cancels catastrophically as s2 -> 0) we differentiate the
    quadrature estimate in mu exactly (the nodes move with mu): with tilted
    weights p_k = w_k sigma(y f_k) / Z and s_k = sigma(-y f_k),

        alpha = y sum_k p_k s_k,
        beta  = sum_k p_k s_k (1 - s_k) - Var_p(s),

    which for exact quadrature coincide with eqs 69-70 (Stein's lemma) and stay
    well conditioned for every s2 >= 0.
    """
    cdef int n = model.n_nodes
    cdef int k
    cdef double scale, f, e, log_max, total, mean_s, mean_curv, var_s, dev
    cdef double log_terms[GH_MAX_NODES]   # log terms, then scaled terms, then weights p_k
    cdef double tail[GH_MAX_NODES]
    if y != 1.0 and y != -1.0:
        return SITE_BAD_LABEL
    scale = sqrt(2.0 * s2)
    log_max = -INFINITY
    for k in range(n):
        f = y * (mu + scale * model.gh_nodes[k])
        # One exp per node: with e = exp(-|f|), log sigma(f) and sigma(-f) follow.
        e = exp(-fabs(f))
        if f >= 0.0:
            log_terms[k] = model.gh_log_weights[k] - log1p(e)
            tail[k] = e / (1.0 + e)
        else:
            log_terms[k] = model.gh_log_weights[k] + f - log1p(e)
            tail[k] = 1.0 / (1.0 + e)
        if log_terms[k] > log_max:
            log_max = log_terms[k]
    total = 0.0
    for k in range(n):
        log_terms[k] = exp(log_terms[k] - log_max)       # now w_k sigma(y f_k) / max
        total += log_terms[k]
    log_z[0] = log_max + log(total)
    mean_s = 0.0
    mean_curv = 0.0
    for k in range(n):
        log_terms[k] = log_terms[k] / total              # now the tilted weight p_k
        mean_s += log_terms[k] * tail[k]
        mean_curv += log_terms[k] * tail[k] * (1.0 - tail[k])
    var_s = 0.0
    for k in range(n):
        dev = tail[k] - mean_s
        var_s += log_terms[k] * dev * dev
    alpha[0] = y * mean_s
    beta[0] = mean_curv - var_s
    return SITE_OK


cdef int _gaussian(const SiteModel* model, double y, double mu, double s2,
                   double* log_z, double* alpha, double* beta) noexcept nogil:
    """Z = N(y; mu, s2 + noise_var) (IVM eqs 17-18): alpha = (y-mu)/v, beta = 1/v."""
    cdef double v
    if not isfinite(y):
        return SITE_BAD_LABEL
    v = s2 + model.params[0]
    alpha[0] = (y - mu) / v
    beta[0] = 1.0 / v
    log_z[0] = -0.5 * (_LOG_2PI + log(v)) - 0.5 * (y - mu) * alpha[0]
    return SITE_OK


cdef int site_moments(const SiteModel* model, double y, double cavity_mean, double cavity_var,
                      double* log_z, double* alpha, double* beta) noexcept nogil:
    """log Z, alpha = d log Z/d mu, beta = -d² log Z/d mu² for one site (see module docstring).

    Returns SITE_OK or an error status; on error the outputs are unspecified.
    The cavity must have finite mean and finite variance >= 0 (> 0 for the
    step likelihood and for probit/ordinal with infinite slope). On SITE_OK all
    three outputs are finite.
    """
    cdef int status
    if not isfinite(cavity_mean) or not isfinite(cavity_var) or not (cavity_var >= 0.0):
        return SITE_BAD_CAVITY
    if isnan(y):
        return SITE_BAD_LABEL
    if model.code == LIK_PROBIT:
        if model.n_params != 2:
            return SITE_BAD_PARAMS
        status = _probit(model, y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_STEP:
        if model.n_params != 1:
            return SITE_BAD_PARAMS
        status = _step(model, y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_LOGISTIC_MACKAY:
        status = _logistic_mackay(model, y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_LOGISTIC_GH:
        if model.n_nodes < 1 or model.n_nodes > GH_MAX_NODES or model.gh_nodes == NULL \
                or model.gh_log_weights == NULL:
            return SITE_BAD_PARAMS
        status = _logistic_gh(model, y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_GAUSSIAN:
        if model.n_params != 1:
            return SITE_BAD_PARAMS
        status = _gaussian(model, y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_ORDINAL:
        if model.n_params < 2:
            return SITE_BAD_PARAMS
        status = _ordinal(model, y, cavity_mean, cavity_var, log_z, alpha, beta)
    else:
        return SITE_BAD_PARAMS
    if status != SITE_OK:
        return status
    if not isfinite(log_z[0]):
        return SITE_ZERO_MASS if log_z[0] < 0 else SITE_OVERFLOW
    if not isfinite(alpha[0]) or not isfinite(beta[0]):
        return SITE_OVERFLOW
    return SITE_OK


# ----------------------------------------------------------------------------
# Python-level API
# ----------------------------------------------------------------------------

LIKELIHOOD_CODES = {
    'probit': LIK_PROBIT,
    'step': LIK_STEP,
    'logistic_mackay': LIK_LOGISTIC_MACKAY,
    'logistic_gh': LIK_LOGISTIC_GH,
    'gaussian': LIK_GAUSSIAN,
    'ordinal': LIK_ORDINAL,
}
LIKELIHOOD_NAMES = {code: name for name, code in LIKELIHOOD_CODES.items()}

STATUS_MESSAGES = {
    SITE_OK: "ok",
    SITE_BAD_CAVITY: ("cavity mean must be finite and cavity variance finite and >= 0 "
                      "(> 0 for the step likelihood and for an infinite probit slope)"),
    SITE_BAD_LABEL: "target outside the likelihood's support",
    SITE_ZERO_MASS: "site mass Z underflows even in log space (cavity mean too far in the tail)",
    SITE_BAD_PARAMS: "inconsistent likelihood parameters",
    SITE_OVERFLOW: "alpha or beta overflows float64 (cavity variance too small)",
}

# Site status codes, exported for Python callers.
OK = SITE_OK
BAD_CAVITY = SITE_BAD_CAVITY
BAD_LABEL = SITE_BAD_LABEL
ZERO_MASS = SITE_ZERO_MASS
BAD_PARAMS = SITE_BAD_PARAMS
OVERFLOW = SITE_OVERFLOW
MAX_GH_NODES = GH_MAX_NODES


def status_message(int status):
    """Human-readable explanation of a site status code."""
    return STATUS_MESSAGES.get(status, f"unknown site status {status}")


def _check_params(int code, params, gh_nodes, gh_log_weights):
    """Validate parameter arrays for a likelihood code; raise ValueError naming the problem."""
    n = params.shape[0]
    if code == LIK_PROBIT:
        if n != 2:
            raise ValueError(f"probit likelihood needs params [slope, bias], got {n} values")
        if not params[0] > 0:
            raise ValueError(f"probit slope must be > 0 (may be +inf), got {params[0]!r}")
        if not np.isfinite(params[1]):
            raise ValueError(f"probit bias must be finite, got {params[1]!r}")
    elif code == LIK_STEP:
        if n != 1:
            raise ValueError(f"step likelihood needs params [flip_noise], got {n} values")
        if not (0.0 <= params[0] < 0.5):
            raise ValueError(f"step flip_noise must be in [0, 0.5), got {params[0]!r}")
    elif code == LIK_LOGISTIC_MACKAY:
        if n != 0:
            raise ValueError(f"MacKay logistic likelihood takes no params, got {n} values")
    elif code == LIK_LOGISTIC_GH:
        if n != 0:
            raise ValueError(f"Gauss-Hermite logistic likelihood takes no params, got {n} values")
        m = gh_nodes.shape[0]
        if not 1 <= m <= GH_MAX_NODES:
            raise ValueError(
                f"Gauss-Hermite logistic likelihood needs 1..{GH_MAX_NODES} gh_nodes, got {m}")
        if not (np.all(np.isfinite(gh_nodes)) and np.all(np.isfinite(gh_log_weights))):
            raise ValueError("gh_nodes and gh_log_weights must be finite")
    elif code == LIK_GAUSSIAN:
        if n != 1:
            raise ValueError(f"Gaussian likelihood needs params [noise_variance], got {n} values")
        if not (params[0] > 0 and np.isfinite(params[0])):
            raise ValueError(f"Gaussian noise_variance must be finite and > 0, got {params[0]!r}")
    elif code == LIK_ORDINAL:
        if n < 2:
            raise ValueError(
                f"ordinal likelihood needs params [slope, bias, width_1..width_(C-2)] with C >= 2, "
                f"got {n} values")
        if not params[0] > 0:
            raise ValueError(f"ordinal slope must be > 0 (may be +inf), got {params[0]!r}")
        if not np.isfinite(params[1]):
            raise ValueError(f"ordinal bias must be finite, got {params[1]!r}")
        widths = params[2:]
        if not np.all((widths > 0) & np.isfinite(widths)):
            raise ValueError(f"ordinal widths must be finite and > 0, got {widths!r}")
    else:
        raise ValueError(f"unknown likelihood code {code!r}; expected one of "
                         f"{sorted(LIKELIHOOD_NAMES)}")
    if code != LIK_LOGISTIC_GH and gh_nodes.shape[0] != 0:
        raise ValueError("gh_nodes are only used by the Gauss-Hermite logistic likelihood")


cdef class SiteSpec:
    """A likelihood as the compiled core sees it: a code and parameter arrays it owns.

    Parameters
    ----------
    code : int
        One of the ``LIK_*`` codes (see ``LIKELIHOOD_CODES``).
    params : array_like of float
        Likelihood parameters in the layout documented in ``sites.pxd``.
    gh_nodes, gh_log_weights : array_like of float, optional
        Gauss-Hermite nodes ``t_k`` (physicists' convention) and
        ``log(w_k / sqrt(pi))``; only for ``LIK_LOGISTIC_GH``.

    The parameters are validated (ValueError naming the offending value) and
    copied into read-only arrays; ``spec.model`` points into them and stays valid
    as long as the SiteSpec lives.
    """
    def __cinit__(self, int code, params, gh_nodes=None, gh_log_weights=None):
        self.code = code
        self.params = np.array(params, dtype=np.float64, order='C', copy=True).reshape(-1)
        self.gh_nodes = np.array(
            gh_nodes if gh_nodes is not None else (), dtype=np.float64, order='C', copy=True).reshape(-1)
        self.gh_log_weights = np.array(
            gh_log_weights if gh_log_weights is not None else (), dtype=np.float64, order='C',
            copy=True).reshape(-1)
        if self.gh_nodes.shape[0] != self.gh_log_weights.shape[0]:
            raise ValueError("gh_nodes and gh_log_weights must have the same length")
        _check_params(code, self.params, self.gh_nodes, self.gh_log_weights)
        # Keep private copies read-only so the pointers below stay valid and unchanged.
        self.params.setflags(write=False)
        self.gh_nodes.setflags(write=False)
        self.gh_log_weights.setflags(write=False)
        self.model.code = code
        self.model.n_params = self.params.shape[0]
        self.model.n_nodes = self.gh_nodes.shape[0]
        self.model.params = _ptr(self.params)
        self.model.gh_nodes = _ptr(self.gh_nodes)
        self.model.gh_log_weights = _ptr(self.gh_log_weights)

    def __reduce__(self):
        return (SiteSpec, (self.code, self.params, self.gh_nodes, self.gh_log_weights))

    def __repr__(self):
        name = LIKELIHOOD_NAMES.get(self.code, str(self.code))
        extra = f", n_nodes={self.gh_nodes.shape[0]}" if self.code == LIK_LOGISTIC_GH else ""
        return f"SiteSpec({name}, params={self.params.tolist()}{extra})"


cdef const double* _ptr(arr):
    """Data pointer of a float64 C-contiguous array (NULL when empty)."""
    cdef const double[::1] view
    if arr.shape[0] == 0:
        return NULL
    view = arr
    return &view[0]


def _as_input(name, values):
    arr = np.asarray(values)
    if arr.dtype.kind not in 'biuf':
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    return arr


def _as_output(name, out, n):
    if out is None:
        return np.empty(n, dtype=np.float64)
    if not isinstance(out, np.ndarray) or out.dtype != np.float64 or out.ndim != 1 \
            or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"{name} must be a writeable C-contiguous 1-D float64 array")
    if out.shape[0] != n:
        raise ValueError(f"{name} has length {out.shape[0]}, expected {n}")
    return out


def site_moments_array(SiteSpec spec not None, y, cavity_mean, cavity_var, log_z=None, alpha=None, beta=None):
    """Site moments for many sites at once (GIL released over the loop).

    Parameters
    ----------
    spec : SiteSpec
        The likelihood.
    y, cavity_mean, cavity_var : array_like, shape (n,)
        Site targets (encoded as in ``sites.pxd``: ±1 for binary likelihoods,
        0..C-1 for ordinal, reals for Gaussian), cavity means and variances.
        No broadcasting: all three must be 1-D of the same length.
    log_z, alpha, beta : ndarray, shape (n,), optional
        Output arrays (float64, C-contiguous, writeable) to fill in place.

    Returns
    -------
    log_z, alpha, beta : ndarray, shape (n,)
        ``log Z``, ``d log Z/d mu`` and ``-d² log Z/d mu²`` per site.

    Raises
    ------
    ValueError
        If the lengths differ, or if any site fails; the message names the
        first failing site, its inputs and the reason. Outputs are then only
        partially filled.
    """
    y_arr = _as_input("y", y)
    mean_arr = _as_input("cavity_mean", cavity_mean)
    var_arr = _as_input("cavity_var", cavity_var)
    cdef Py_ssize_t n = y_arr.shape[0]
    if mean_arr.shape[0] != n or var_arr.shape[0] != n:
        raise ValueError(f"y, cavity_mean and cavity_var must have the same length, got "
                         f"{n}, {mean_arr.shape[0]} and {var_arr.shape[0]}")
    log_z = _as_output("log_z", log_z, n)
    alpha = _as_output("alpha", alpha, n)
    beta = _as_output("beta", beta, n)
    cdef const double[::1] y_view = y_arr
    cdef const double[::1] mean_view = mean_arr
    cdef const double[::1] var_view = var_arr
    cdef double[::1] log_z_view = log_z
    cdef double[::1] alpha_view = alpha
    cdef double[::1] beta_view = beta
    cdef const SiteModel* model = &spec.model
    cdef Py_ssize_t i, failed = -1
    cdef int status = SITE_OK
    with nogil:
        for i in range(n):
            status = site_moments(model, y_view[i], mean_view[i], var_view[i],
                                  &log_z_view[i], &alpha_view[i], &beta_view[i])
            if status != SITE_OK:
                failed = i
                break
    if failed >= 0:
        raise ValueError(
            f"site {failed} failed ({LIKELIHOOD_NAMES.get(spec.code, spec.code)} likelihood, "
            f"y={float(y_arr[failed])!r}, cavity_mean={float(mean_arr[failed])!r}, "
            f"cavity_var={float(var_arr[failed])!r}): {status_message(status)}")
    return log_z, alpha, beta
