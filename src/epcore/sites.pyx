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

Speed
-----
``site_moments`` (one site, for the engines) dispatches on the likelihood code;
``site_moments_array`` validates the likelihood once, precomputes its constants
(``_Prepared``) and picks one loop per likelihood; the array is split into
chunks of ``_CHUNK`` sites spread over OpenMP threads when the module is built
with OpenMP. Probit, step, MacKay-logistic and Gaussian sites run in blocks of
``_BLOCK`` sites, one stage at a time (checks and standardised arguments,
the Gaussian tail G, the libm calls and outputs), which lets independent sites
overlap in the CPU. Both entry points call the same per-likelihood stages in
the same order of operations, so a site's results are bitwise the same
whichever entry point, blocking, chunking or thread count computed them.
"""
import os

import numpy as np

from cython.parallel cimport prange
from libc.math cimport (log, exp, sqrt, log1p, expm1, erf, erfc, fabs, floor, isfinite, isinf,
                        isnan, INFINITY, lgamma, cbrt, acos, cos)
from libc.stdlib cimport qsort

# G(x) table, N(z), the hazard and probit alpha/beta (shared with ivm.pyx; defines _LOG_SQRT_2PI)
include "_probit_terms.pxi"

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    static int fastep_sites_max_threads(void) { return omp_get_max_threads(); }
    static int fastep_sites_openmp(void) { return 1; }
    #else
    static int fastep_sites_max_threads(void) { return 1; }
    static int fastep_sites_openmp(void) { return 0; }
    #endif
    """
    int fastep_sites_max_threads() noexcept nogil
    int fastep_sites_openmp() noexcept nogil


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

# 10-point Gauss-Legendre rule on [-1, 1] (filled at import from numpy), used for
# truncated-normal moments over narrow intervals in the ordinal kernel.
cdef enum:
    _N_LEGENDRE = 10
cdef double _legendre_nodes[_N_LEGENDRE]
cdef double _legendre_weights[_N_LEGENDRE]
# 16-point Gauss-Legendre rule per panel of the Student-t quadrature.
cdef enum:
    _N_PANEL_NODES = 16
    _MAX_BREAKS = 640
cdef double _panel_nodes[_N_PANEL_NODES]
cdef double _panel_weights[_N_PANEL_NODES]


def _init_legendre():
    nodes, weights = np.polynomial.legendre.leggauss(_N_LEGENDRE)
    for k in range(_N_LEGENDRE):
        _legendre_nodes[k] = nodes[k]
        _legendre_weights[k] = weights[k]
    nodes, weights = np.polynomial.legendre.leggauss(_N_PANEL_NODES)
    for k in range(_N_PANEL_NODES):
        _panel_nodes[k] = nodes[k]
        _panel_weights[k] = weights[k]


_init_legendre()


# ----------------------------------------------------------------------------
# Scalar special functions
# ----------------------------------------------------------------------------

cdef inline double _log_npdf(double z) noexcept nogil:
    """log N(z; 0, 1)."""
    return -0.5 * z * z - _LOG_SQRT_2PI


cdef double _mills_tail(double x) noexcept nogil:
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
        _narrow_interval(lo, width, log_z, &d_over_z, &beta_over_c2)
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
# Per-likelihood kernels. Each ``_<likelihood>_core`` assumes a valid cavity
# (finite mean, finite variance >= 0, checked by ``_check_site``) and constants
# prepared from valid parameters; ``site_moments`` and the array loops both call
# them, then ``_finish_site``.
# ----------------------------------------------------------------------------

cdef inline int _check_site(double y, double mu, double s2) noexcept nogil:
    """SITE_BAD_CAVITY / SITE_BAD_LABEL checks shared by every likelihood (in that order)."""
    if not isfinite(mu) or not isfinite(s2) or not (s2 >= 0.0):
        return SITE_BAD_CAVITY
    if isnan(y):
        return SITE_BAD_LABEL
    return SITE_OK


cdef inline bint _valid_cavity(double mu, double s2) noexcept nogil:
    """``_check_site`` passes on the cavity (branch-free, for the array loops)."""
    return isfinite(mu) & isfinite(s2) & (s2 >= 0.0)


cdef inline bint _valid_binary(double y, double mu, double s2) noexcept nogil:
    """Valid cavity and y in {-1, +1} (branch-free)."""
    return _valid_cavity(mu, s2) & ((y == 1.0) | (y == -1.0))


cdef inline int _finish_site(int status, double* log_z, double* alpha, double* beta) noexcept nogil:
    """Turn non-finite results into SITE_ZERO_MASS / SITE_OVERFLOW."""
    if status != SITE_OK:
        return status
    if not isfinite(log_z[0]):
        return SITE_ZERO_MASS if log_z[0] < 0 else SITE_OVERFLOW
    if not isfinite(alpha[0]) or not isfinite(beta[0]):
        return SITE_OVERFLOW
    return SITE_OK


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


cdef inline int _ordinal_core(double inv_slope2, const double* params, int n_categories,
                              const double* thresholds, double y, double mu, double s2,
                              double* log_z, double* alpha, double* beta) noexcept nogil:
    """p(y=k|f) = Phi(slope(theta_k - f)) - Phi(slope(theta_{k-1} - f)), theta_k = bias + sum_{i<=k} w_i.

    IVM §2.4 eqs 24-25 in the consistent threshold model (theta_{-1} = -inf,
    theta_{C-1} = +inf). The paper's y = 0 case reads Phi(lambda (b + f)), a sign
    typo for Phi(lambda (b - f)), and its nu formula has N(u) where N(u') is
    meant; both are as here once written for a general interval.
    ``params`` = [slope, bias, w_1, ..., w_{C-2}]; ``thresholds`` (may be NULL)
    holds theta_0..theta_{C-2} summed left to right as below.
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
        _interval_moments(c, -INFINITY, c * (params[1] - mu), INFINITY, log_z, alpha, beta)
        return SITE_OK
    # theta_{k-1} = bias + w_1 + ... + w_{k-1}, with w_i = params[1 + i].
    if thresholds != NULL:
        theta_lo = thresholds[k - 1]
    else:
        theta_lo = params[1]
        for i in range(1, k):
            theta_lo = theta_lo + params[1 + i]
    if k == n_categories - 1:
        _interval_moments(c, c * (theta_lo - mu), INFINITY, INFINITY, log_z, alpha, beta)
    else:
        width = params[1 + k]
        _interval_moments(c, c * (theta_lo - mu), c * (theta_lo + width - mu), c * width,
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


cdef int _logistic_gh_log_space(const double* nodes, const double* log_weights, int n,
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


# ----------------------------------------------------------------------------
# Student-t sites (robust regression): the powered site by panel quadrature
# ----------------------------------------------------------------------------

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

    Quadrature (module docstring of :mod:`fastep._epcore.sites`): in the residual
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


cdef inline int _student_t_core(const double* params, double y, double mu, double s2,
                                double* log_z, double* alpha, double* beta) noexcept nogil:
    cdef double e1, e2
    return student_t_moments(params[0], params[1], 1.0, student_t_log_norm(params[0], params[1]),
                             y, mu, s2, log_z, alpha, beta, &e1, &e2)



cdef inline void _fill_gh_weights(const double* log_weights, int n, double* weights) noexcept nogil:
    cdef int k
    for k in range(n):
        weights[k] = exp(log_weights[k])


cdef int site_moments(const SiteModel* model, double y, double cavity_mean, double cavity_var,
                      double* log_z, double* alpha, double* beta) noexcept nogil:
    """log Z, alpha = d log Z/d mu, beta = -d² log Z/d mu² for one site (see module docstring).

    Returns SITE_OK or an error status; on error the outputs are unspecified.
    The cavity must have finite mean and finite variance >= 0 (> 0 for the
    step likelihood and for probit/ordinal with infinite slope). On SITE_OK all
    three outputs are finite.
    """
    cdef int status
    cdef double weights[GH_MAX_NODES]
    status = _check_site(y, cavity_mean, cavity_var)
    if status != SITE_OK:
        return status
    if model.code == LIK_PROBIT:
        if model.n_params != 2:
            return SITE_BAD_PARAMS
        status = _probit_core(_inv_slope2(model.params[0]), model.params[1], y, cavity_mean,
                              cavity_var, log_z, alpha, beta)
    elif model.code == LIK_STEP:
        if model.n_params != 1:
            return SITE_BAD_PARAMS
        status = _step_core(model.params[0], y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_LOGISTIC_MACKAY:
        status = _logistic_mackay_core(y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_LOGISTIC_GH:
        if model.n_nodes < 1 or model.n_nodes > GH_MAX_NODES or model.gh_nodes == NULL \
                or model.gh_log_weights == NULL:
            return SITE_BAD_PARAMS
        _fill_gh_weights(model.gh_log_weights, model.n_nodes, weights)
        status = _logistic_gh_core(model.gh_nodes, model.gh_log_weights, weights, model.n_nodes,
                                   y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_GAUSSIAN:
        if model.n_params != 1:
            return SITE_BAD_PARAMS
        status = _gaussian_core(model.params[0], y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_ORDINAL:
        if model.n_params < 2:
            return SITE_BAD_PARAMS
        status = _ordinal_core(_inv_slope2(model.params[0]), model.params, model.n_params, NULL,
                               y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_STUDENT_T:
        if model.n_params != 2:
            return SITE_BAD_PARAMS
        status = _student_t_core(model.params, y, cavity_mean, cavity_var, log_z, alpha, beta)
    else:
        return SITE_BAD_PARAMS
    return _finish_site(status, log_z, alpha, beta)


# ----------------------------------------------------------------------------
# Array loops: constants prepared once per call, one tight loop per likelihood
# ----------------------------------------------------------------------------

cdef enum:
    # Sites per work item of the parallel loop (also the minimum per thread).
    _CHUNK = 8192
    # Sites per block of the staged loops: each stage runs over the block before
    # the next starts, so independent sites overlap in the CPU instead of one
    # site's long dependency chain (scale -> G -> log/exp -> outputs) stalling it.
    _BLOCK = 64

cdef struct _Prepared:
    int code
    const double* params
    int n_params
    double inv_slope2               # probit, ordinal
    const double* thresholds        # ordinal: theta_0 .. theta_{C-2}
    const double* gh_nodes
    const double* gh_log_weights
    const double* gh_weights        # exp(gh_log_weights)
    int n_nodes


cdef inline int _site_one(const _Prepared* p, double y, double mu, double s2,
                          double* log_z, double* alpha, double* beta) noexcept nogil:
    """One site with prepared constants; the same kernels as ``site_moments``."""
    cdef int status = _check_site(y, mu, s2)
    if status != SITE_OK:
        return status
    if p.code == LIK_PROBIT:
        status = _probit_core(p.inv_slope2, p.params[1], y, mu, s2, log_z, alpha, beta)
    elif p.code == LIK_STEP:
        status = _step_core(p.params[0], y, mu, s2, log_z, alpha, beta)
    elif p.code == LIK_LOGISTIC_MACKAY:
        status = _logistic_mackay_core(y, mu, s2, log_z, alpha, beta)
    elif p.code == LIK_LOGISTIC_GH:
        status = _logistic_gh_core(p.gh_nodes, p.gh_log_weights, p.gh_weights, p.n_nodes,
                                   y, mu, s2, log_z, alpha, beta)
    elif p.code == LIK_GAUSSIAN:
        status = _gaussian_core(p.params[0], y, mu, s2, log_z, alpha, beta)
    elif p.code == LIK_ORDINAL:
        status = _ordinal_core(p.inv_slope2, p.params, p.n_params, p.thresholds,
                               y, mu, s2, log_z, alpha, beta)
    elif p.code == LIK_STUDENT_T:
        status = _student_t_core(p.params, y, mu, s2, log_z, alpha, beta)
    else:
        return SITE_BAD_PARAMS
    return _finish_site(status, log_z, alpha, beta)


cdef Py_ssize_t _run_sites(const _Prepared* p, const double* y, const double* mu, const double* s2,
                           double* log_z, double* alpha, double* beta,
                           Py_ssize_t start, Py_ssize_t end, int* status) noexcept nogil:
    """Site by site (ordinal, Gauss-Hermite, and blocks that contain an invalid site)."""
    cdef Py_ssize_t i
    cdef int st
    for i in range(start, end):
        st = _site_one(p, y[i], mu[i], s2[i], &log_z[i], &alpha[i], &beta[i])
        if st != SITE_OK:
            status[0] = st
            return i
    return -1


cdef Py_ssize_t _run_staged(const _Prepared* p, const double* y, const double* mu, const double* s2,
                            double* log_z, double* alpha, double* beta,
                            Py_ssize_t start, Py_ssize_t end, int* status) noexcept nogil:
    """Probit, step, MacKay logistic and Gaussian sites in blocks of ``_BLOCK``, stage by stage.

    Stage 1 checks every site of the block and computes its standardised
    argument; if any site of the block is invalid, the block is redone by
    ``_run_sites`` (which reports the first failure in order). The stages are
    the same inline functions the single-site kernels call, in the same order
    of operations, so results are bitwise those of ``site_moments``.
    """
    cdef Py_ssize_t b0, i, j, k, m
    cdef int st = SITE_OK
    cdef bint ok
    cdef Py_ssize_t order[_BLOCK + 1]   # stage-3 visiting order (see below)
    cdef int code = p.code
    cdef double inv_slope2 = p.inv_slope2
    cdef double param0 = p.params[0] if p.n_params > 0 else 0.0
    cdef double param1 = p.params[1] if p.n_params > 1 else 0.0
    cdef double scale[_BLOCK]      # probit c, step sd, MacKay kappa, Gaussian v
    cdef double arg[_BLOCK]        # probit/step/MacKay z
    cdef double aux[_BLOCK]        # G(|z|), or MacKay exp(-|z|)
    cdef double log_cdf[_BLOCK]
    cdef double hazard[_BLOCK]
    cdef double hazard_plus_z[_BLOCK]
    b0 = start
    while b0 < end:
        m = end - b0
        if m > _BLOCK:
            m = _BLOCK
        # Stage 1: check the whole block (no early exit), then the standardised
        # arguments in a branch-free loop the compiler can vectorise. The
        # expressions are those of _probit_z, _step_z, _mackay_z, _gaussian_pre
        # for valid sites.
        ok = True
        if code == LIK_PROBIT:
            for j in range(m):
                i = b0 + j
                ok = ok & _valid_binary(y[i], mu[i], s2[i]) & (s2[i] + inv_slope2 > 0.0)
            if ok:
                for j in range(m):
                    i = b0 + j
                    scale[j] = 1.0 / sqrt(s2[i] + inv_slope2)
                    arg[j] = y[i] * (scale[j] * (mu[i] + param1))
        elif code == LIK_STEP:
            for j in range(m):
                i = b0 + j
                ok = ok & _valid_binary(y[i], mu[i], s2[i]) & (s2[i] > 0.0)
            if ok:
                for j in range(m):
                    i = b0 + j
                    scale[j] = sqrt(s2[i])
                    arg[j] = y[i] * mu[i] / scale[j]
        elif code == LIK_LOGISTIC_MACKAY:
            for j in range(m):
                i = b0 + j
                ok = ok & _valid_binary(y[i], mu[i], s2[i])
            if ok:
                for j in range(m):
                    i = b0 + j
                    scale[j] = 1.0 / sqrt(1.0 + _PI_OVER_8 * s2[i])
                    arg[j] = y[i] * scale[j] * mu[i]
        else:
            for j in range(m):
                i = b0 + j
                ok = ok & _valid_cavity(mu[i], s2[i]) & isfinite(y[i])
            if ok:
                for j in range(m):
                    i = b0 + j
                    scale[j] = s2[i] + param0
                    arg[j] = (y[i] - mu[i]) / scale[j]
                    aux[j] = 1.0 / scale[j]
                for j in range(m):
                    i = b0 + j
                    alpha[i] = arg[j]
                    beta[i] = aux[j]
        if not ok:
            # Some site of the block is invalid: redo it site by site to report the first failure.
            i = _run_sites(p, y, mu, s2, log_z, alpha, beta, b0, b0 + m, status)
            if i >= 0:
                return i
            b0 += m
            continue
        # Stages 2-3: special functions, then the outputs. Stage 3 visits the
        # sites with z <= 0 first, then those with z > 0 (``order``, built
        # without branches), so that the kernels' branch on the sign of z is
        # predictable instead of a coin toss per site.
        if code != LIK_GAUSSIAN:
            k = 0
            for j in range(m):
                order[k] = j
                k += arg[j] <= 0.0
            for j in range(m):
                order[k] = j
                k += arg[j] > 0.0
        if code == LIK_PROBIT:
            for j in range(m):
                aux[j] = _gauss_tail_at(arg[j])
            for k in range(m):
                j = order[k]
                _cdf_terms_g(arg[j], aux[j], &log_cdf[j], &hazard[j], &hazard_plus_z[j],
                             NULL, NULL, True, False)
            for j in range(m):
                i = b0 + j
                _probit_out(y[i], scale[j], arg[j], log_cdf[j], hazard[j], hazard_plus_z[j],
                            &log_z[i], &alpha[i], &beta[i])
        elif code == LIK_STEP:
            for j in range(m):
                aux[j] = _gauss_tail_at(arg[j])
            for k in range(m):
                j = order[k]
                i = b0 + j
                _step_out(param0, y[i], scale[j], arg[j], aux[j], &log_z[i], &alpha[i], &beta[i])
        elif code == LIK_LOGISTIC_MACKAY:
            for j in range(m):
                aux[j] = exp(-fabs(arg[j]))
            for k in range(m):
                j = order[k]
                i = b0 + j
                _mackay_out(y[i], scale[j], arg[j], aux[j], &log_z[i], &alpha[i], &beta[i])
        else:
            for j in range(m):
                i = b0 + j
                log_z[i] = _gaussian_log_z(y[i], mu[i], scale[j], arg[j])
        for j in range(m):
            i = b0 + j
            st = _finish_site(SITE_OK, &log_z[i], &alpha[i], &beta[i])
            if st != SITE_OK:
                status[0] = st
                return i
        b0 += m
    return -1


cdef Py_ssize_t _run_range(const _Prepared* p, const double* y, const double* mu, const double* s2,
                           double* log_z, double* alpha, double* beta,
                           Py_ssize_t start, Py_ssize_t end, int* status) noexcept nogil:
    """Sites start..end-1; returns the first failing index (its status in ``status``) or -1."""
    if p.code == LIK_PROBIT or p.code == LIK_STEP or p.code == LIK_LOGISTIC_MACKAY \
            or p.code == LIK_GAUSSIAN:
        return _run_staged(p, y, mu, s2, log_z, alpha, beta, start, end, status)
    return _run_sites(p, y, mu, s2, log_z, alpha, beta, start, end, status)


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
    'student_t': LIK_STUDENT_T,
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
    elif code == LIK_STUDENT_T:
        if n != 2:
            raise ValueError(f"Student-t likelihood needs params [dof, scale], got {n} values")
        if not (params[0] > 0 and np.isfinite(params[0])):
            raise ValueError(f"Student-t dof must be finite and > 0, got {params[0]!r}")
        if not (params[1] > 0 and np.isfinite(params[1])):
            raise ValueError(f"Student-t scale must be finite and > 0, got {params[1]!r}")
        if not np.isfinite(params[0] * params[1] * params[1]) or not params[0] * params[1] * params[1] > 0:
            raise ValueError(f"Student-t dof * scale**2 must be finite and > 0, got {params[0]!r} and {params[1]!r}")
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
    if type(values) is np.ndarray and values.dtype == np.float64 and values.ndim == 1 \
            and values.flags.c_contiguous:
        return values     # the common case: nothing to convert
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


cdef bint _model_ok(const SiteModel* model) noexcept nogil:
    """The structural checks ``site_moments`` makes per site (SiteSpec guarantees them)."""
    if model.code == LIK_PROBIT:
        return model.n_params == 2
    if model.code == LIK_STEP or model.code == LIK_GAUSSIAN:
        return model.n_params == 1
    if model.code == LIK_LOGISTIC_MACKAY:
        return True
    if model.code == LIK_LOGISTIC_GH:
        return 1 <= model.n_nodes <= GH_MAX_NODES and model.gh_nodes != NULL \
            and model.gh_log_weights != NULL
    if model.code == LIK_ORDINAL:
        return model.n_params >= 2
    if model.code == LIK_STUDENT_T:
        return model.n_params == 2
    return False


OPENMP = bool(fastep_sites_openmp())

# GNU libgomp does not survive fork(): a child forked after the parent ran a
# parallel region deadlocks in its next one. Forked children therefore run the
# array loops on one thread (they never enter a parallel region).
cdef bint _parallel_allowed = True


def _disable_parallel_after_fork():
    global _parallel_allowed
    _parallel_allowed = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disable_parallel_after_fork)


def max_threads():
    """Threads ``site_moments_array`` may use: the OpenMP maximum (``OMP_NUM_THREADS``,
    ``threadpoolctl.threadpool_limits(n, "openmp")``); 1 when built without OpenMP
    and in a process forked from one that imported this module."""
    return fastep_sites_max_threads() if _parallel_allowed else 1


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

    Notes
    -----
    Arrays of more than 8192 sites are split into chunks of 8192 that
    run on up to ``max_threads()`` OpenMP threads (when built with OpenMP).
    Every site is computed by the same code whatever the chunking, so results
    are bitwise identical for any thread count, and identical to
    ``site_moments`` called site by site. Processes forked after import run on
    one thread (GNU libgomp deadlocks in a forked child otherwise).
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
    if n == 0:
        return log_z, alpha, beta
    cdef const double[::1] y_view = y_arr
    cdef const double[::1] mean_view = mean_arr
    cdef const double[::1] var_view = var_arr
    cdef double[::1] log_z_view = log_z
    cdef double[::1] alpha_view = alpha
    cdef double[::1] beta_view = beta
    cdef const double* y_ptr = &y_view[0]
    cdef const double* mean_ptr = &mean_view[0]
    cdef const double* var_ptr = &var_view[0]
    cdef double* log_z_ptr = &log_z_view[0]
    cdef double* alpha_ptr = &alpha_view[0]
    cdef double* beta_ptr = &beta_view[0]

    # Constants of the likelihood, once per call.
    cdef const SiteModel* model = &spec.model
    cdef _Prepared prep
    cdef double[::1] thresholds_view, weights_view
    cdef Py_ssize_t k
    prep.code = model.code if _model_ok(model) else -1
    prep.params = model.params
    prep.n_params = model.n_params
    prep.inv_slope2 = 0.0
    prep.thresholds = NULL
    prep.gh_nodes = model.gh_nodes
    prep.gh_log_weights = model.gh_log_weights
    prep.gh_weights = NULL
    prep.n_nodes = model.n_nodes
    if prep.code == LIK_PROBIT or prep.code == LIK_ORDINAL:
        prep.inv_slope2 = _inv_slope2(model.params[0])
    if prep.code == LIK_ORDINAL:
        thresholds = np.empty(model.n_params - 1)
        thresholds_view = thresholds
        thresholds_view[0] = model.params[1]
        for k in range(1, model.n_params - 1):      # summed left to right, as _ordinal_core does
            thresholds_view[k] = thresholds_view[k - 1] + model.params[1 + k]
        prep.thresholds = &thresholds_view[0]
    if prep.code == LIK_LOGISTIC_GH:
        weights = np.empty(model.n_nodes)
        weights_view = weights
        _fill_gh_weights(model.gh_log_weights, model.n_nodes, &weights_view[0])
        prep.gh_weights = &weights_view[0]

    cdef Py_ssize_t failed = -1, n_chunks = (n + _CHUNK - 1) // _CHUNK, j, start, end
    cdef int status = SITE_OK
    cdef int n_threads = fastep_sites_max_threads() if _parallel_allowed else 1
    cdef Py_ssize_t[::1] chunk_failed
    cdef int[::1] chunk_status
    cdef Py_ssize_t* chunk_failed_ptr
    cdef int* chunk_status_ptr
    if n_chunks < 2 or n_threads < 2:
        with nogil:
            failed = _run_range(&prep, y_ptr, mean_ptr, var_ptr, log_z_ptr, alpha_ptr, beta_ptr,
                                0, n, &status)
    else:
        if n_threads > n_chunks:
            n_threads = <int>n_chunks
        chunk_failed = np.empty(n_chunks, dtype=np.intp)
        chunk_status = np.zeros(n_chunks, dtype=np.intc)
        chunk_failed_ptr = &chunk_failed[0]
        chunk_status_ptr = &chunk_status[0]
        with nogil:
            for j in prange(n_chunks, schedule='dynamic', num_threads=n_threads):
                start = j * _CHUNK
                end = start + _CHUNK
                if end > n:
                    end = n
                chunk_failed_ptr[j] = _run_range(&prep, y_ptr, mean_ptr, var_ptr, log_z_ptr,
                                                 alpha_ptr, beta_ptr, start, end, &chunk_status_ptr[j])
        # Chunks are in site order: the first chunk that failed holds the first failing site.
        for j in range(n_chunks):
            if chunk_failed[j] >= 0:
                failed = chunk_failed[j]
                status = chunk_status[j]
                break
    if failed >= 0:
        raise ValueError(
            f"site {failed} failed ({LIKELIHOOD_NAMES.get(spec.code, spec.code)} likelihood, "
            f"y={float(y_arr[failed])!r}, cavity_mean={float(mean_arr[failed])!r}, "
            f"cavity_var={float(var_arr[failed])!r}): {status_message(status)}")
    return log_z, alpha, beta


def _site_moments_per_site(SiteSpec spec not None, y, cavity_mean, cavity_var):
    """``site_moments`` (the engines' one-site entry point) called site by site, for tests.

    Returns ``(status, log_z, alpha, beta)`` with one int status per site; the
    outputs of failed sites are unspecified. Unlike ``site_moments_array`` it
    does not stop at the first failure.
    """
    y_arr = _as_input("y", y)
    mean_arr = _as_input("cavity_mean", cavity_mean)
    var_arr = _as_input("cavity_var", cavity_var)
    cdef Py_ssize_t n = y_arr.shape[0], i
    if mean_arr.shape[0] != n or var_arr.shape[0] != n:
        raise ValueError("y, cavity_mean and cavity_var must have the same length")
    status = np.zeros(n, dtype=np.intc)
    log_z = np.full(n, np.nan)
    alpha = np.full(n, np.nan)
    beta = np.full(n, np.nan)
    cdef const double[::1] y_view = y_arr
    cdef const double[::1] mean_view = mean_arr
    cdef const double[::1] var_view = var_arr
    cdef int[::1] status_view = status
    cdef double[::1] log_z_view = log_z
    cdef double[::1] alpha_view = alpha
    cdef double[::1] beta_view = beta
    with nogil:
        for i in range(n):
            status_view[i] = site_moments(&spec.model, y_view[i], mean_view[i], var_view[i],
                                          &log_z_view[i], &alpha_view[i], &beta_view[i])
    return status, log_z, alpha, beta


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
            status = _check_site(yv[i], mv[i], vv[i])
            if status == SITE_OK:
                status = student_t_moments(dof, scale, power, log_norm, yv[i], mv[i], vv[i],
                                           &o[0, i], &o[1, i], &o[2, i], &o[3, i], &o[4, i])
                status = _finish_site(status, &o[0, i], &o[1, i], &o[2, i])
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
