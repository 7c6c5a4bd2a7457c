# cython: language_level=3
"""Scalar site kernels of the closed-form likelihoods (probit, step, logistic, Gaussian, ordinal), inline.

For a site with likelihood ``t(f)`` and Gaussian cavity ``N(f; mu, s2)`` every
kernel returns (Minka eqs 6, 17-19; Lawrence-Seeger-Herbrich IVM eqs 14-16 with
``g = alpha`` and ``nu = beta``)::

    log_z = log Z,   Z = ∫ t(f) N(f; mu, s2) df
    alpha = d log Z / d mu
    beta  = -d² log Z / d mu²

so that the tilted mean is ``mu + s2*alpha`` and the tilted variance
``s2 - s2**2 * beta``.

Each ``_<likelihood>_core`` assumes a valid cavity (finite mean, finite variance
>= 0, checked by ``check_site``) and constants prepared from valid parameters;
``sites.site_moments`` and the array loops of ``sites`` both call them, then
``finish_site``. Probit, step, MacKay-logistic and Gaussian kernels are also
split into stages (``_probit_z``, ``_cdf_terms_g``, ``_probit_out``, ...) that the
array loops run over blocks of sites; both paths call the same stages in the
same order of operations, so their results are bitwise the same.

Numerical policy
----------------
* Everything that can underflow is handled in log space; the Gaussian hazard
  ``r(z) = N(z)/Phi(z)`` and the difference ``r(z) + z`` (which cancels for
  ``z -> -inf``) come from ``G(x) = N(x)/Phi(-x) - x`` (x >= 0), evaluated by
  piecewise polynomials for ``x < 8`` (table generated and checked against
  mpmath by ``tools/gen_gauss_tail_table.py``, error < 1 ulp) and by the
  Laplace continued fraction of the Mills ratio for ``x >= 8``
  (``_mills_tail``); see ``_cdf_terms``. The results are accurate to a few ulp
  for every ``|z|`` up to ~1e154, beyond which ``log Phi(z) = -z²/2`` itself
  overflows float64.
* Probit and ordinal sites share the interval formulas of ``_interval_moments``
  (probit inlines the one-sided case); they never subtract two tail
  probabilities directly (see its docstring).
* A kernel never returns NaN/inf with ``SITE_OK``: non-finite results are
  reported as ``SITE_ZERO_MASS`` (log Z = -inf) or ``SITE_OVERFLOW``.
* ``beta`` is clamped into its theoretical range only where that range is known
  exactly and only as a guard against rounding (probit/ordinal: ``[0, c²]``;
  noiseless step: ``[0, 1/s2]``; noisy step: ``<= 1/s2``). Away from ulp-level
  rounding the clamp is inactive (tests check the unclamped formulas against
  mpmath).

Used by ``sites.pyx`` only and not installed (it includes ``_probit_terms.pxi``,
which ``ivm.pyx`` includes as well).
"""
from libc.math cimport log, exp, sqrt, log1p, expm1, erf, erfc, fabs, floor, isfinite, isinf, INFINITY
from fastep._epcore.site_model cimport SITE_OK, SITE_BAD_CAVITY, SITE_BAD_LABEL, GH_MAX_NODES

# G(x) table, N(z), the hazard and probit alpha/beta (shared with ivm.pyx; defines _LOG_SQRT_2PI)
include "_probit_terms.pxi"

# Constants as C macros, so that the compiler folds them (module-level cdef
# doubles would be reloaded after every store through a double*).
cdef extern from *:
    """
    #define FASTEP_SQRT1_2 0.70710678118654752440
    #define FASTEP_LOG_2PI 1.83787706640934548356
    #define FASTEP_PI_OVER_8 0.39269908169872415481
    #define FASTEP_TINY 1e-280
    """
    const double _SQRT1_2 "FASTEP_SQRT1_2"             # 1/sqrt(2)
    const double _LOG_2PI "FASTEP_LOG_2PI"
    const double _PI_OVER_8 "FASTEP_PI_OVER_8"
    # Below this, products of hazards and scales are formed in log space so that a
    # representable alpha (e.g. c N(40) with c = 1e150) does not underflow to 0.
    const double _TINY "FASTEP_TINY"

# 10-point Gauss-Legendre rule on [-1, 1], for truncated-normal moments over narrow
# intervals in the ordinal kernel (the caller owns it: ``sites`` fills it at import).
cdef enum:
    N_LEGENDRE = 10

cdef struct LegendreRule:
    double nodes[N_LEGENDRE]
    double weights[N_LEGENDRE]


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
    2e-16 for every x >= 5 (checked against mpmath in the tests). The kernels
    call it only for x >= 8 (20 terms); below that ``_gauss_tail`` uses the table.
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


cdef inline double _gauss_tail(double x) noexcept nogil:
    """G(x) = N(x)/Phi(-x) - x for x >= 0, to ~1 ulp (G(0) = sqrt(2/pi), G(x) ~ 1/x).

    Piecewise degree-9 polynomials (``_gauss_tail_table.pxi``) for x < 8, the
    continued fraction ``_mills_tail`` beyond. One table row lookup and a Horner
    evaluation (``_gauss_tail_poly``): no division, no branch on the interval.
    """
    if x >= _GT_X_MAX:
        return _mills_tail(x)
    return _gauss_tail_poly(x)


cdef inline double _log1p_g(double x) noexcept nogil:
    """log(1 + x) for -1/2 <= x <= 1 with one ``log`` (cheaper than ``log1p``), to a few ulp.

    Goldberg's form of log1p: with u = fl(1 + x), whose difference u - 1 is
    exact there (u in [1/2, 2]), log(1 + x) = log(u) * x / (u - 1); the factor
    x / (u - 1) corrects for the rounding of u, and ln(1 + t)/t varies slowly
    enough on the interval (|d log(ln(1+t)/t)/dt| < 0.9) that the error stays
    within a few ulp (D. Goldberg, "What every computer scientist should know
    about floating-point arithmetic", 1991, Theorem 4, proved there for
    0 <= x < 3/4; the same argument covers -1/2 <= x <= 1).
    """
    cdef double u = 1.0 + x
    if u == 1.0:
        return x
    return log(u) * (x / (u - 1.0))


cdef inline double _gauss_tail_at(double z) noexcept nogil:
    """The G value ``_cdf_terms_g`` needs for z: G(|z|) for z < 8, else 0 (unused there)."""
    if z >= _GT_X_MAX:
        return 0.0
    return _gauss_tail(fabs(z))


cdef inline void _cdf_terms_g(double z, double g, double* log_cdf, double* hazard, double* hazard_plus_z,
                              double* cdf, double* upper_cdf, bint want_log, bint want_mass) noexcept nogil:
    """log Phi(z), the hazard r = N(z)/Phi(z), and r + z, all to full precision.

    ``g = _gauss_tail_at(z)``, i.e. G(|z|) with G(x) = N(x)/Phi(-x) - x (passed in
    so that the array loops can evaluate G for a block of sites in one pass):

    * z <= 0 (x = -z): r = x + G(x), a sum of positive terms, r + z = G(x)
      exactly as computed (no cancellation), and log Phi(z) = log N(z) - log r
      (no exp at all).
    * 0 < z < 8: with n = N(z), the upper mass is Phi(-z) = n / (z + G(z)) (a
      positive sum again), Phi(z) = 1 - Phi(-z) >= 1/2, log Phi(z) = log(1 - Phi(-z))
      by ``_log1p_g`` (so log Phi ≈ 0 keeps its relative precision; one log, no
      branch), r = n/Phi(z) and r + z a sum of positive terms.
    * z >= 8: Phi(-z) = erfc(z/√2)/2 (< 7e-16), as above.

    ``want_log`` and ``want_mass`` are constants at every call site (the
    branches fold away): without ``want_log``, log Phi(z) is not computed; with
    ``want_mass``, also Phi(z) and Phi(-z) (for z <= 0, Phi(z) = N(z)/r, which
    keeps full relative precision while N(z) is a normal float, z > -37.5).
    """
    cdef double x, r, n, upper, phi
    if z <= 0.0:
        x = -z
        _hazard_terms(z, g, 0.0, 1.0, hazard, hazard_plus_z)
        r = hazard[0]
        if want_log:
            log_cdf[0] = -0.5 * x * x - _LOG_SQRT_2PI - log(r)
        if want_mass:
            cdf[0] = _normal_pdf(x) / r
            upper_cdf[0] = 1.0 - cdf[0]
    else:
        n = _normal_pdf(z)
        if z < _GT_X_MAX:
            upper = _upper_tail_poly(z, g, n)
        else:
            upper = 0.5 * erfc(z * _SQRT1_2)
        phi = 1.0 - upper
        if want_log:
            log_cdf[0] = _log1p_g(-upper)
        _hazard_terms(z, g, n, phi, hazard, hazard_plus_z)
        if want_mass:
            cdf[0] = phi
            upper_cdf[0] = upper


cdef inline void _cdf_terms(double z, double* log_cdf, double* hazard,
                            double* hazard_plus_z) noexcept nogil:
    """log Phi(z), r = N(z)/Phi(z) and r + z (see ``_cdf_terms_g``)."""
    _cdf_terms_g(z, _gauss_tail_at(z), log_cdf, hazard, hazard_plus_z, NULL, NULL, True, False)


cdef inline double _log_hazard(double z, double log_cdf, double hazard) noexcept nogil:
    """log(N(z)/Phi(z)) given the outputs of _cdf_terms, also where the hazard underflows (z >~ 37)."""
    if hazard > _TINY:
        return log(hazard)
    return _log_npdf(z) - log_cdf


# ----------------------------------------------------------------------------
# Interval kernel shared by probit and ordinal sites
# ----------------------------------------------------------------------------

cdef inline void _narrow_interval(const LegendreRule* rule, double lo, double width, double* log_z,
                                  double* d_over_z, double* beta_over_c2) noexcept nogil:
    """Truncated-normal moments on [lo, lo + width] by the 10-point Gauss-Legendre ``rule`` (narrow intervals).

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
    cdef double weights[N_LEGENDRE]
    for k in range(N_LEGENDRE):
        offset = half * rule.nodes[k]
        weights[k] = rule.weights[k] * exp(-offset * (mid + 0.5 * offset))
        total += weights[k]
        first += weights[k] * offset
    mean = first / total
    for k in range(N_LEGENDRE):
        offset = half * rule.nodes[k] - mean
        second += weights[k] * offset * offset
    log_z[0] = _log_npdf(mid) + log(half * total)
    d_over_z[0] = -(mid + mean)
    beta_over_c2[0] = 1.0 - second / total


cdef inline void _interval_moments(const LegendreRule* rule, double c, double lo, double hi, double width,
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
      ``log q = log Phi(lo) - log Phi(hi) = e1 + log(r(hi)/r(lo))``
      (``e1 = log N(lo) - log N(hi) = width (lo + hi)/2``, and
      ``|log q| >~ 0.2`` outside the narrow case; ``1 - e^t`` is formed directly
      when ``e^t < 1/2`` and by expm1 otherwise); then ``D/Z = r(hi)(1 - e^e1)/(1 - q)``,
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
    cdef double z_mass, n_hi, n_lo, n_diff, beta_over_c2, log_hazard_hi, exp_e1, one_minus_exp_e1
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
        _narrow_interval(rule, lo, width, log_z, &d_over_z, &beta_over_c2)
    elif hi <= 0.0:
        # Both ends in the lower tail.
        # (log Phi(lo) itself is not needed; r(lo) is G(-lo) - lo, no libm call.)
        _cdf_terms_g(hi, _gauss_tail_at(hi), &log_cdf_hi, &hazard_hi, &g_hi, NULL, NULL, True, False)
        _cdf_terms_g(lo, _gauss_tail_at(lo), &log_cdf_lo, &hazard_lo, &g_lo, NULL, NULL, False, False)
        e1 = 0.5 * width * (lo + hi)
        log_q = e1 + log(hazard_hi / hazard_lo)
        q = exp(log_q)
        # 1 - e^t directly where e^t < 1/2 (no cancellation), by expm1 above.
        one_minus_q = 1.0 - q if q < 0.5 else -expm1(log_q)
        exp_e1 = exp(e1)
        one_minus_exp_e1 = 1.0 - exp_e1 if exp_e1 < 0.5 else -expm1(e1)
        log_z[0] = log_cdf_hi + log(one_minus_q)
        d_over_z = hazard_hi * one_minus_exp_e1 / one_minus_q
        n_lo_over_z = hazard_hi * exp_e1 / one_minus_q
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
# Per-likelihood kernels
# ----------------------------------------------------------------------------

cdef inline bint _valid_cavity(double mu, double s2) noexcept nogil:
    """``check_site`` passes on the cavity (branch-free, for the array loops)."""
    return isfinite(mu) & isfinite(s2) & (s2 >= 0.0)


cdef inline bint _valid_binary(double y, double mu, double s2) noexcept nogil:
    """Valid cavity and y in {-1, +1} (branch-free)."""
    return _valid_cavity(mu, s2) & ((y == 1.0) | (y == -1.0))


cdef inline double _inv_slope2(double slope) noexcept nogil:
    """1/slope² (0 for an infinite slope), precomputed once per likelihood."""
    if isinf(slope):
        return 0.0
    return 1.0 / (slope * slope)


cdef inline double _probit_scale(double inv_slope2, double cavity_var) noexcept nogil:
    """c = 1/sqrt(slope⁻² + s2) (IVM eq 19); +inf when that is not representable."""
    cdef double total = cavity_var + inv_slope2
    if total <= 0.0:
        return INFINITY
    return 1.0 / sqrt(total)


cdef inline int _probit_z(double inv_slope2, double bias, double y, double mu, double s2,
                          double* c, double* z) noexcept nogil:
    """Probit stage 1: label check, c = 1/sqrt(slope⁻² + s2) and z = y c (mu + bias)."""
    if y != 1.0 and y != -1.0:
        return SITE_BAD_LABEL
    c[0] = _probit_scale(inv_slope2, s2)
    if isinf(c[0]):
        return SITE_BAD_CAVITY
    z[0] = y * (c[0] * (mu + bias))
    return SITE_OK


cdef inline void _probit_out(double y, double c, double z, double log_cdf, double hazard,
                             double hazard_plus_z, double* log_z, double* alpha,
                             double* beta) noexcept nogil:
    """Probit stage 3: log Z, alpha, beta from the ``_cdf_terms`` of z."""
    cdef double log_hazard
    log_z[0] = log_cdf
    if hazard < _TINY:
        # z >~ 37: Z ≈ 1 and alpha, beta are tiny; keep them representable.
        log_hazard = _log_hazard(z, log_cdf, hazard)
        alpha[0] = y * exp(log(c) + log_hazard)
        beta[0] = exp(2.0 * log(c) + log_hazard + log(hazard_plus_z))
        return
    _probit_alpha_beta(y, c, hazard, hazard_plus_z, alpha, beta)


cdef inline int _probit_core(double inv_slope2, double bias, double y, double mu, double s2,
                             double* log_z, double* alpha, double* beta) noexcept nogil:
    """t(f) = Phi(slope * y * (f + bias)) (IVM eqs 19-21, Minka eqs 57-60).

    With c = 1/sqrt(slope⁻² + s2) and z = y c (mu + bias): Z = Phi(z),
    alpha = y c r and beta = c² r (r + z), r = N(z)/Phi(z) -- the one-sided
    case of ``_interval_moments`` (interval (-bias, inf) for y = +1, (-inf, -bias)
    for y = -1), inlined. Stages ``_probit_z``, ``_cdf_terms``, ``_probit_out``
    (the array loop runs each stage over a block of sites).
    """
    cdef double c, z, log_cdf, hazard, hazard_plus_z
    cdef int status = _probit_z(inv_slope2, bias, y, mu, s2, &c, &z)
    if status != SITE_OK:
        return status
    _cdf_terms(z, &log_cdf, &hazard, &hazard_plus_z)
    _probit_out(y, c, z, log_cdf, hazard, hazard_plus_z, log_z, alpha, beta)
    return SITE_OK


cdef inline int _ordinal_core(const LegendreRule* rule, double inv_slope2, const double* params,
                              int n_categories, const double* thresholds, double y, double mu, double s2,
                              double* log_z, double* alpha, double* beta) noexcept nogil:
    """p(y=k|f) = Phi(slope(theta_k - f)) - Phi(slope(theta_{k-1} - f)), theta_k = bias + sum_{i<=k} w_i.

    IVM §2.4 eqs 24-25 in the consistent threshold model (theta_{-1} = -inf,
    theta_{C-1} = +inf). The paper's y = 0 case reads Phi(lambda (b + f)), a sign
    typo for Phi(lambda (b - f)), and its nu formula has N(u) where N(u') is
    meant; both are as here once written for a general interval.
    ``params`` = [slope, bias, w_1, ..., w_{C-2}]; ``thresholds`` (may be NULL)
    holds theta_0..theta_{C-2} summed left to right as below; ``rule`` is the 10-point
    Gauss-Legendre rule of ``_narrow_interval``.
    """
    cdef double theta_lo, width, c
    cdef int k, i
    if not (y >= 0.0 and y <= n_categories - 1 and floor(y) == y):
        return SITE_BAD_LABEL
    k = <int>y
    c = _probit_scale(inv_slope2, s2)
    if isinf(c):
        return SITE_BAD_CAVITY
    if k == 0:
        # (-inf, theta_0], theta_0 = bias.
        _interval_moments(rule, c, -INFINITY, c * (params[1] - mu), INFINITY, log_z, alpha, beta)
        return SITE_OK
    # theta_{k-1} = bias + w_1 + ... + w_{k-1}, with w_i = params[1 + i].
    if thresholds != NULL:
        theta_lo = thresholds[k - 1]
    else:
        theta_lo = params[1]
        for i in range(1, k):
            theta_lo = theta_lo + params[1 + i]
    if k == n_categories - 1:
        _interval_moments(rule, c, c * (theta_lo - mu), INFINITY, INFINITY, log_z, alpha, beta)
    else:
        width = params[1 + k]
        _interval_moments(rule, c, c * (theta_lo - mu), c * (theta_lo + width - mu), c * width,
                          log_z, alpha, beta)
    return SITE_OK


cdef inline int _step_z(double y, double mu, double s2, double* sd, double* z) noexcept nogil:
    """Step stage 1: label and variance checks, sd = sqrt(s2), z = y mu / sd."""
    if y != 1.0 and y != -1.0:
        return SITE_BAD_LABEL
    if not (s2 > 0.0):
        return SITE_BAD_CAVITY
    sd[0] = sqrt(s2)
    z[0] = y * mu / sd[0]
    return SITE_OK


cdef inline double _log_add_exp(double a, double b) noexcept nogil:
    cdef double hi = a if a > b else b
    cdef double lo = b if a > b else a
    if isinf(hi) and hi < 0:
        return hi
    return hi + log1p(exp(lo - hi))


cdef inline void _step_out(double eps, double y, double sd, double z, double g, double* log_z,
                           double* alpha, double* beta) noexcept nogil:
    """Step stages 2-3: log Z, alpha, beta from z and g = ``_gauss_tail_at(z)``."""
    cdef double log_cdf, hazard, hazard_plus_z, cdf, upper, one_m2eps, mass, rest
    cdef double signal_frac, noise_frac, log_signal, log_noise, log_signal_frac, alpha_abs
    cdef bint have_log_cdf = True
    if eps == 0.0:
        _cdf_terms_g(z, g, &log_cdf, &hazard, &hazard_plus_z, NULL, NULL, True, False)
        log_z[0] = log_cdf
        signal_frac = 1.0
        noise_frac = 0.0
    elif z > -37.0:
        # Z = eps + (1 - 2eps) Phi(z) formed directly (Phi(z) > 1e-300 is a normal float).
        _cdf_terms_g(z, g, &log_cdf, &hazard, &hazard_plus_z, &cdf, &upper, False, True)
        have_log_cdf = False
        one_m2eps = 1.0 - 2.0 * eps
        mass = eps + one_m2eps * cdf
        rest = eps + one_m2eps * upper        # 1 - Z
        if rest <= 0.5:
            log_z[0] = _log1p_g(-rest)
        else:
            log_z[0] = log(mass)
        signal_frac = one_m2eps * cdf / mass
        noise_frac = eps / mass
    else:
        # Far lower tail: Phi(z) < 1e-300 may not be representable; mix in log space.
        _cdf_terms_g(z, g, &log_cdf, &hazard, &hazard_plus_z, NULL, NULL, True, False)
        log_signal = log1p(-2.0 * eps) + log_cdf
        log_noise = log(eps)
        log_z[0] = _log_add_exp(log_signal, log_noise)
        signal_frac = exp(log_signal - log_z[0])
        noise_frac = exp(log_noise - log_z[0])
    if signal_frac * hazard > _TINY:
        alpha_abs = signal_frac * hazard / sd
    else:
        # w r underflows (z >~ 37, or eps > 0 and z << 0); alpha may still be representable.
        if not have_log_cdf:
            _cdf_terms_g(z, g, &log_cdf, &hazard, &hazard_plus_z, NULL, NULL, True, False)
        log_signal_frac = 0.0 if eps == 0.0 else log1p(-2.0 * eps) + log_cdf - log_z[0]
        alpha_abs = exp(log_signal_frac + _log_hazard(z, log_cdf, hazard) - log(sd))
    alpha[0] = y * alpha_abs
    # beta = alpha (alpha + mu/s2) = (alpha_abs / sd) ((r + z) - (1 - w) r); s2 beta <= 1.
    beta[0] = (alpha_abs / sd) * (hazard_plus_z - noise_frac * hazard)
    if eps == 0.0 and beta[0] < 0.0:
        beta[0] = 0.0
    if beta[0] * sd * sd > 1.0:
        beta[0] = (1.0 / sd) / sd


cdef inline int _step_core(double eps, double y, double mu, double s2,
                           double* log_z, double* alpha, double* beta) noexcept nogil:
    """t(f) = eps + (1 - 2 eps) Theta(y f) (Minka eqs 50-55).

    z = y mu / sqrt(s2), Z = eps + (1 - 2eps) Phi(z). With w = (1-2eps)Phi(z)/Z
    and hazard r = N(z)/Phi(z): alpha = y w r / sqrt(s2) (eq 54) and
    beta = alpha (alpha + mu/s2) (eq 55) = (w r / s2) ((r + z) - (1 - w) r),
    with r + z = G(-z) for z <= 0 (no cancellation for z -> -inf).

    For eps > 0 and z > -37, Z is a sum of two positive terms formed directly;
    log Z is ``log(1 - (eps + (1-2eps) Phi(-z)))`` (``_log1p_g``) when Z >= 1/2 so that
    log Z ≈ 0 keeps its relative precision. Below, and wherever w r underflows,
    the terms are combined in log space. Stages ``_step_z``, ``_gauss_tail_at``,
    ``_step_out``.
    """
    cdef double sd, z
    cdef int status = _step_z(y, mu, s2, &sd, &z)
    if status != SITE_OK:
        return status
    _step_out(eps, y, sd, z, _gauss_tail_at(z), log_z, alpha, beta)
    return SITE_OK


cdef inline int _mackay_z(double y, double mu, double s2, double* kappa, double* z) noexcept nogil:
    """MacKay stage 1: label check, kappa = (1 + pi s2/8)^(-1/2), z = y kappa mu."""
    if y != 1.0 and y != -1.0:
        return SITE_BAD_LABEL
    kappa[0] = 1.0 / sqrt(1.0 + _PI_OVER_8 * s2)
    z[0] = y * kappa[0] * mu
    return SITE_OK


cdef inline void _mackay_out(double y, double kappa, double z, double e, double* log_z,
                             double* alpha, double* beta) noexcept nogil:
    """MacKay stage 3 from e = exp(-|z|) (stage 2)."""
    cdef double big = 1.0 / (1.0 + e)        # sigma(|z|)
    cdef double small = e / (1.0 + e)        # sigma(-|z|)
    cdef double log1p_e = _log1p_g(e)
    cdef double sig_pos, sig_neg
    # (no call inside the branches, so the compiler can use selects)
    if z >= 0.0:
        log_z[0] = -log1p_e
        sig_pos = big                 # sigma(z)
        sig_neg = small               # sigma(-z)
    else:
        log_z[0] = z - log1p_e
        sig_pos = small
        sig_neg = big
    alpha[0] = y * kappa * sig_neg
    beta[0] = kappa * kappa * sig_pos * sig_neg


cdef inline int _logistic_mackay_core(double y, double mu, double s2,
                                      double* log_z, double* alpha, double* beta) noexcept nogil:
    """MacKay's approximation Z ≈ sigma(y kappa mu), kappa = (1 + pi s2/8)^(-1/2) (Minka eqs 62-64).

    alpha = y kappa sigma(-z) (eq 64). beta is the exact second derivative of
    this log Z, kappa² sigma(z) sigma(-z); Minka's eq 65 instead uses
    alpha² - 2 d log Z/d s2, which equals -d² log Z/d mu² only for exact Z and
    can be negative here. Ours lies in (0, kappa²/4], so the tilted variance
    s2 - s2² beta stays positive. One exp serves all three: with
    e = exp(-|z|), sigma(|z|) = 1/(1 + e), sigma(-|z|) = e/(1 + e) and
    log sigma(z) = min(z, 0) - log1p(e) (``_log1p_g``). Stages ``_mackay_z``, exp, ``_mackay_out``.
    """
    cdef double kappa, z
    cdef int status = _mackay_z(y, mu, s2, &kappa, &z)
    if status != SITE_OK:
        return status
    _mackay_out(y, kappa, z, exp(-fabs(z)), log_z, alpha, beta)
    return SITE_OK


cdef inline int _logistic_gh_log_space(const double* nodes, const double* log_weights, int n,
                                double y, double mu, double s2,
                                double* log_z, double* alpha, double* beta) noexcept nogil:
    """``_logistic_gh_core`` in log space, for sites whose Z underflows in linear space."""
    cdef int k
    cdef double scale, f, e, log_max, total, mean_s, mean_curv, var_s, dev
    cdef double log_terms[GH_MAX_NODES]   # log terms, then scaled terms, then weights p_k
    cdef double tail[GH_MAX_NODES]
    scale = sqrt(2.0 * s2)
    log_max = -INFINITY
    for k in range(n):
        f = y * (mu + scale * nodes[k])
        # One exp per node: with e = exp(-|f|), log sigma(f) and sigma(-f) follow.
        e = exp(-fabs(f))
        if f >= 0.0:
            log_terms[k] = log_weights[k] - log1p(e)
            tail[k] = e / (1.0 + e)
        else:
            log_terms[k] = log_weights[k] + f - log1p(e)
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


cdef inline int _logistic_gh_core(const double* nodes, const double* log_weights,
                                  const double* weights, int n, double y, double mu, double s2,
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

    Evaluated in linear space with the weights w_k = exp(log_weights[k]) (one
    exp and one division per node); log Z = log1p(-sum_k w_k s_k) when that sum
    is below 1/4 (the rule's weights sum to 1), so log Z ≈ 0 keeps its relative
    precision. Sites with Z < 1e-280 (y mu <~ -640) go to the log-space version.
    """
    cdef int k
    cdef double scale, f, e, q, sig, s, total, tail_mass, mean_s, mean_curv, var_s, dev
    cdef double tail[GH_MAX_NODES]     # s_k
    cdef double head[GH_MAX_NODES]     # sigma(y f_k) = 1 - s_k
    cdef double term[GH_MAX_NODES]     # w_k sigma(y f_k)
    if y != 1.0 and y != -1.0:
        return SITE_BAD_LABEL
    scale = sqrt(2.0 * s2)
    total = 0.0
    tail_mass = 0.0
    for k in range(n):
        f = y * (mu + scale * nodes[k])
        e = exp(-fabs(f))
        q = 1.0 / (1.0 + e)
        if f >= 0.0:
            sig = q
            s = e * q
        else:
            sig = e * q
            s = q
        head[k] = sig
        tail[k] = s
        term[k] = weights[k] * sig
        total += term[k]
        tail_mass += weights[k] * s
    if not (total > _TINY):
        return _logistic_gh_log_space(nodes, log_weights, n, y, mu, s2, log_z, alpha, beta)
    if tail_mass < 0.25:
        log_z[0] = log1p(-tail_mass)
    else:
        log_z[0] = log(total)
    mean_s = 0.0
    mean_curv = 0.0
    for k in range(n):
        mean_s += term[k] * tail[k]
        mean_curv += term[k] * tail[k] * head[k]
    mean_s = mean_s / total
    mean_curv = mean_curv / total
    var_s = 0.0
    for k in range(n):
        dev = tail[k] - mean_s
        var_s += term[k] * dev * dev
    alpha[0] = y * mean_s
    beta[0] = mean_curv - var_s / total
    return SITE_OK


cdef inline int _gaussian_pre(double noise_var, double y, double mu, double s2, double* v,
                              double* alpha, double* beta) noexcept nogil:
    """Gaussian stage 1: label check, v = s2 + noise_var, alpha and beta."""
    if not isfinite(y):
        return SITE_BAD_LABEL
    v[0] = s2 + noise_var
    alpha[0] = (y - mu) / v[0]
    beta[0] = 1.0 / v[0]
    return SITE_OK


cdef inline double _gaussian_log_z(double y, double mu, double v, double alpha) noexcept nogil:
    """Gaussian stage 2: log Z = log N(y; mu, v)."""
    return -0.5 * (_LOG_2PI + log(v)) - 0.5 * (y - mu) * alpha


cdef inline int _gaussian_core(double noise_var, double y, double mu, double s2,
                               double* log_z, double* alpha, double* beta) noexcept nogil:
    """Z = N(y; mu, s2 + noise_var) (IVM eqs 17-18): alpha = (y-mu)/v, beta = 1/v."""
    cdef double v
    cdef int status = _gaussian_pre(noise_var, y, mu, s2, &v, alpha, beta)
    if status != SITE_OK:
        return status
    log_z[0] = _gaussian_log_z(y, mu, v, alpha[0])
    return SITE_OK
