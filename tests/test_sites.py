"""Compiled site kernels (fastep._epcore.sites) against independent references.

* compiled vs the plain-numpy twins in ``fastep.reference.sites`` (hypothesis,
  moderate regime where the naive formulas are valid);
* one-site EP against exact tilted moments by adaptive 1-D quadrature;
* alpha/beta against finite differences of log Z (consistency of the derivatives);
* tails (|z| up to 1e8), eps = 0, tiny/huge cavity variances against mpmath;
* errors for bad input, SiteSpec validation, a 10⁶-site call.

Tolerances: float64 eps = 2.2e-16. Compiled-vs-reference comparisons use
``RTOL = 1e4 * eps`` (~2e-12): the naive reference loses up to ~|u|² eps through
``exp(log N - log Phi)`` and the ``r + u`` cancellation for |u| <= 6, and the
compiled kernels are accurate to a few eps (checked against mpmath below with
``MP_RTOL = 64 * eps``). Derivative terms that pass through zero get an
absolute tolerance scaled by their natural size (c for alpha, c² for beta).
"""
import math

import mpmath
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import integrate

from fastep._epcore import sites as S
from fastep.reference import sites as R

EPS = np.finfo(np.float64).eps
RTOL = 1e4 * EPS
MP_RTOL = 64 * EPS

PROBIT = S.LIKELIHOOD_CODES["probit"]
STEP = S.LIKELIHOOD_CODES["step"]
MACKAY = S.LIKELIHOOD_CODES["logistic_mackay"]
GH = S.LIKELIHOOD_CODES["logistic_gh"]
GAUSSIAN = S.LIKELIHOOD_CODES["gaussian"]
ORDINAL = S.LIKELIHOOD_CODES["ordinal"]


def gh_spec(n_nodes=32):
    nodes, log_weights = R.gauss_hermite_rule(n_nodes)
    return S.SiteSpec(GH, [], nodes, log_weights)


def compiled(spec, y, mu, s2):
    y, mu, s2 = (np.atleast_1d(np.asarray(v, dtype=float)) for v in (y, mu, s2))
    y, mu, s2 = np.broadcast_arrays(y, mu, s2)
    return S.site_moments_array(spec, y.copy(), mu.copy(), s2.copy())


def assert_moments_close(got, want, scale_alpha, scale_beta, rtol=RTOL):
    log_z, alpha, beta = got
    np.testing.assert_allclose(log_z, want[0], rtol=rtol, atol=rtol)
    np.testing.assert_allclose(alpha, want[1], rtol=rtol, atol=rtol * scale_alpha)
    np.testing.assert_allclose(beta, want[2], rtol=rtol, atol=rtol * scale_beta)


# ---------------------------------------------------------------------------
# compiled vs reference (moderate regime)
# ---------------------------------------------------------------------------

sign = st.sampled_from([-1.0, 1.0])
mean = st.floats(-5.0, 5.0)
var = st.floats(0.0, 10.0)
pos_var = st.floats(1e-3, 10.0)
slope = st.floats(0.2, 20.0)
bias = st.floats(-2.0, 2.0)


@settings(max_examples=200, deadline=None)
@given(y=sign, mu=mean, s2=var, slope=slope, bias=bias)
def test_probit_matches_reference(y, mu, s2, slope, bias):
    c = 1.0 / math.sqrt(slope**-2 + s2)
    if abs(c * (mu + bias)) > 6:  # reference cancels beyond this
        mu = math.copysign(6 / c, mu + bias) - bias
    spec = S.SiteSpec(PROBIT, [slope, bias])
    want = R.probit_moments(y, mu, s2, slope, bias)
    assert_moments_close(compiled(spec, y, mu, s2), want, c, c * c)


@settings(max_examples=200, deadline=None)
@given(y=sign, mu=mean, s2=pos_var, eps=st.floats(0.0, 0.49))
def test_step_matches_reference(y, mu, s2, eps):
    if abs(mu) / math.sqrt(s2) > 6:  # reference cancels beyond this
        mu = math.copysign(6 * math.sqrt(s2), mu)
    spec = S.SiteSpec(STEP, [eps])
    want = R.step_moments(y, mu, s2, eps)
    assert_moments_close(compiled(spec, y, mu, s2), want, s2**-0.5, 1 / s2)


@settings(max_examples=200, deadline=None)
@given(y=sign, mu=mean, s2=var)
def test_logistic_mackay_matches_reference(y, mu, s2):
    spec = S.SiteSpec(MACKAY, [])
    assert_moments_close(compiled(spec, y, mu, s2), R.logistic_mackay_moments(y, mu, s2), 1, 1)


@settings(max_examples=100, deadline=None)
@given(y=sign, mu=mean, s2=var, n_nodes=st.integers(2, 64))
def test_logistic_gh_matches_reference(y, mu, s2, n_nodes):
    spec = gh_spec(n_nodes)
    want = R.logistic_gh_moments(y, mu, s2, n_nodes)
    assert_moments_close(compiled(spec, y, mu, s2), want, 1, 1)


@settings(max_examples=200, deadline=None)
@given(y=st.floats(-10, 10), mu=mean, s2=var, noise=st.floats(1e-3, 10))
def test_gaussian_matches_reference(y, mu, s2, noise):
    spec = S.SiteSpec(GAUSSIAN, [noise])
    want = R.gaussian_moments(y, mu, s2, noise)
    v = s2 + noise
    assert_moments_close(compiled(spec, y, mu, s2), want, v**-0.5, 1 / v)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n_categories=st.integers(2, 6), offset=st.floats(-4, 4), s2=var,
       slope=slope, bias=bias)
def test_ordinal_matches_reference(data, n_categories, offset, s2, slope, bias):
    widths = data.draw(st.lists(st.floats(0.05, 3.0), min_size=n_categories - 2,
                                max_size=n_categories - 2))
    k = data.draw(st.integers(0, n_categories - 1))
    c = 1.0 / math.sqrt(slope**-2 + s2)
    theta = R.ordinal_thresholds(bias, widths)
    mu = float(np.mean(theta)) + offset / c
    # Stay where the naive reference is accurate.
    assume(np.all(np.abs(c * (theta - mu)) <= 6))
    spec = S.SiteSpec(ORDINAL, [slope, bias, *widths])
    want = R.ordinal_moments(k, mu, s2, slope, bias, widths)
    assert_moments_close(compiled(spec, k, mu, s2), want, c, c * c)


# ---------------------------------------------------------------------------
# one-site EP = exact tilted moments by quadrature
# ---------------------------------------------------------------------------

def _norm_pdf(f, mu, s2):
    return math.exp(-0.5 * (f - mu) ** 2 / s2) / math.sqrt(2 * math.pi * s2)


def tilted_by_quadrature(lik, mu, s2, breaks=()):
    """log Z, tilted mean and variance of t(f) N(f; mu, s2) by scipy.integrate.quad."""
    sd = math.sqrt(s2)
    lo, hi = mu - 14 * sd, mu + 14 * sd
    points = sorted({p for p in breaks if lo < p < hi})
    grid = [lo, *points, hi]

    def integral(g):
        total = 0.0
        for a, b in zip(grid[:-1], grid[1:]):
            total += integrate.quad(g, a, b, epsabs=0, epsrel=1e-13, limit=200)[0]
        return total

    z_mass = integral(lambda f: lik(f) * _norm_pdf(f, mu, s2))
    m = integral(lambda f: f * lik(f) * _norm_pdf(f, mu, s2)) / z_mass
    v = integral(lambda f: (f - m) ** 2 * lik(f) * _norm_pdf(f, mu, s2)) / z_mass
    return math.log(z_mass), m, v


def check_tilted(spec, y, mu, s2, lik, breaks=(), rtol=1e-9):
    log_z, alpha, beta = (v[0] for v in compiled(spec, y, mu, s2))
    q_log_z, q_mean, q_var = tilted_by_quadrature(lik, mu, s2, breaks)
    assert log_z == pytest.approx(q_log_z, rel=rtol, abs=rtol)
    assert mu + s2 * alpha == pytest.approx(q_mean, rel=rtol, abs=rtol * math.sqrt(s2))
    assert s2 - s2 * s2 * beta == pytest.approx(q_var, rel=rtol * 10, abs=rtol * s2)


CAVITIES = [(0.0, 1.0), (1.3, 0.5), (-2.0, 2.5), (0.4, 0.04), (-0.7, 7.0)]


def _phi(x):
    return 0.5 * math.erfc(-x / math.sqrt(2))


@pytest.mark.parametrize("mu,s2", CAVITIES)
@pytest.mark.parametrize("y", [-1.0, 1.0])
def test_probit_tilted_moments(y, mu, s2):
    slope, bias = 1.7, 0.3
    check_tilted(S.SiteSpec(PROBIT, [slope, bias]), y, mu, s2,
                 lambda f: _phi(slope * y * (f + bias)))


@pytest.mark.parametrize("mu,s2", CAVITIES)
@pytest.mark.parametrize("y", [-1.0, 1.0])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_step_tilted_moments(y, mu, s2, eps):
    check_tilted(S.SiteSpec(STEP, [eps]), y, mu, s2,
                 lambda f: eps + (1 - 2 * eps) * (y * f > 0), breaks=[0.0])


@pytest.mark.parametrize("mu,s2", CAVITIES)
@pytest.mark.parametrize("y", [-1.0, 1.0])
def test_gaussian_tilted_moments(y, mu, s2):
    noise = 0.3
    target = 0.8 * y

    def lik(f):
        return math.exp(-0.5 * (target - f) ** 2 / noise) / math.sqrt(2 * math.pi * noise)

    # Split at the tilted mean so quad sees the peak of the product.
    peak = (mu / s2 + target / noise) / (1 / s2 + 1 / noise)
    check_tilted(S.SiteSpec(GAUSSIAN, [noise]), target, mu, s2, lik, breaks=[peak])


@pytest.mark.parametrize("mu,s2", CAVITIES)
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_ordinal_tilted_moments(k, mu, s2):
    slope, bias, widths = 2.0, -0.5, [0.7, 1.1]
    theta = [-math.inf, *R.ordinal_thresholds(bias, widths), math.inf]

    def lik(f):
        upper = 1.0 if theta[k + 1] == math.inf else _phi(slope * (theta[k + 1] - f))
        lower = 0.0 if theta[k] == -math.inf else _phi(slope * (theta[k] - f))
        return upper - lower

    check_tilted(S.SiteSpec(ORDINAL, [slope, bias, *widths]), float(k), mu, s2, lik)


def _sigmoid(x):
    return 0.5 * (1.0 + math.tanh(0.5 * x))


@pytest.mark.parametrize("mu,s2", CAVITIES)
@pytest.mark.parametrize("y", [-1.0, 1.0])
def test_logistic_gh_tilted_moments_converge(y, mu, s2):
    # Gauss-Hermite error for the logistic decays geometrically in the node
    # count, at a rate set by sqrt(2 s2) against the distance pi of sigma's
    # poles from the real axis: measured max errors at s2 = 7 are 3e-2 (16
    # nodes), 6e-4 (32), 7e-6 (64), 5e-9 (128); at s2 <= 1 already 2e-12 at 32.
    exact = tilted_by_quadrature(lambda f: _sigmoid(y * f), mu, s2)
    errors = []
    for n_nodes in (16, 32, 64, 128):
        log_z, alpha, beta = (v[0] for v in compiled(gh_spec(n_nodes), y, mu, s2))
        errors.append(max(abs(log_z - exact[0]),
                          abs(mu + s2 * alpha - exact[1]) / math.sqrt(s2),
                          abs(s2 - s2 * s2 * beta - exact[2]) / s2))
    floor = 1e-12
    assert all(b <= max(a, floor) for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-8, errors
    if s2 <= 1.0:
        assert errors[1] < 1e-11, errors


@pytest.mark.parametrize("mu,s2", CAVITIES)
@pytest.mark.parametrize("y", [-1.0, 1.0])
def test_logistic_mackay_close_to_exact(y, mu, s2):
    # MacKay's approximation is rough (worst where the cavity mass sits on the
    # wrong side, e.g. tilted variance 16% of s2 off at mu=-2, s2=2.5); this
    # only guards against gross errors. Its exact formulas are checked against
    # the reference and by finite differences.
    log_z, alpha, beta = (v[0] for v in compiled(S.SiteSpec(MACKAY, []), y, mu, s2))
    q_log_z, q_mean, q_var = tilted_by_quadrature(lambda f: _sigmoid(y * f), mu, s2)
    assert abs(log_z - q_log_z) < 0.02
    assert abs(mu + s2 * alpha - q_mean) < 0.05 * math.sqrt(s2)
    assert abs(s2 - s2 * s2 * beta - q_var) < 0.2 * s2


def test_gaussian_exact_site_is_exact_in_closed_form():
    # Gaussian EP: tilted moments are the Gaussian posterior moments.
    y, mu, s2, noise = 0.4, -0.3, 2.0, 0.5
    log_z, alpha, beta = (v[0] for v in compiled(S.SiteSpec(GAUSSIAN, [noise]), y, mu, s2))
    post_var = 1 / (1 / s2 + 1 / noise)
    assert s2 - s2**2 * beta == pytest.approx(post_var, rel=1e-14)
    assert mu + s2 * alpha == pytest.approx(post_var * (mu / s2 + y / noise), rel=1e-14)


# ---------------------------------------------------------------------------
# alpha, beta are the derivatives of log Z (finite differences)
# ---------------------------------------------------------------------------

SPECS = {
    "probit": (lambda: S.SiteSpec(PROBIT, [1.5, 0.2]), 1.0),
    "step": (lambda: S.SiteSpec(STEP, [0.05]), -1.0),
    "mackay": (lambda: S.SiteSpec(MACKAY, []), 1.0),
    "gh": (lambda: gh_spec(20), -1.0),
    "gaussian": (lambda: S.SiteSpec(GAUSSIAN, [0.7]), 0.3),
    "ordinal": (lambda: S.SiteSpec(ORDINAL, [1.2, -0.4, 0.9]), 1.0),
}


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("mu,s2", [(0.3, 0.8), (-1.5, 3.0), (2.0, 0.1)])
def test_alpha_beta_are_derivatives(name, mu, s2):
    make, y = SPECS[name]
    spec = make()
    h = 1e-4
    mus = mu + h * np.array([-2, -1, 0, 1, 2], dtype=float)
    log_z, alpha, beta = compiled(spec, y, mus, s2)
    d1 = (log_z[0] - 8 * log_z[1] + 8 * log_z[3] - log_z[4]) / (12 * h)
    d2 = (-log_z[0] + 16 * log_z[1] - 30 * log_z[2] + 16 * log_z[3] - log_z[4]) / (12 * h * h)
    assert alpha[2] == pytest.approx(d1, rel=1e-8, abs=1e-9)
    assert beta[2] == pytest.approx(-d2, rel=1e-5, abs=1e-6)


# ---------------------------------------------------------------------------
# tails and extreme cavities against mpmath
# ---------------------------------------------------------------------------

mpmath.mp.dps = 50


def _mp_interval(c, lo, hi):
    """log(Phi(hi) - Phi(lo)), alpha, beta in high precision (±inf ends allowed)."""
    c = mpmath.mpf(c)
    lo = mpmath.mpf(lo)
    hi = mpmath.mpf(hi)
    if lo >= 0:
        z_mass = mpmath.ncdf(-lo) - mpmath.ncdf(-hi)
    else:
        z_mass = mpmath.ncdf(hi) - mpmath.ncdf(lo)
    if lo < 0 < hi:
        log_z = mpmath.log1p(-(mpmath.ncdf(lo) + mpmath.ncdf(-hi)))
    else:
        log_z = mpmath.log(z_mass)
    pdf_hi = mpmath.npdf(hi) if mpmath.isfinite(hi) else 0
    pdf_lo = mpmath.npdf(lo) if mpmath.isfinite(lo) else 0
    term_hi = hi * pdf_hi if mpmath.isfinite(hi) else 0
    term_lo = lo * pdf_lo if mpmath.isfinite(lo) else 0
    alpha = -c * (pdf_hi - pdf_lo) / z_mass
    beta = alpha**2 + c * c * (term_hi - term_lo) / z_mass
    return log_z, alpha, beta


def assert_close_mp(value, exact, rtol=MP_RTOL, what=""):
    exact = mpmath.mpf(exact)
    err = abs(mpmath.mpf(float(value)) - exact)
    assert math.isfinite(value), what
    assert err <= rtol * abs(exact) + mpmath.mpf(1e-300), (what, value, exact)


TAIL_Z = [-1e8, -1e3, -40.0, -38.5, -10.0, -5.0, -3.0, -2.5, -2.0, -1.99, -1.0, 0.0, 1.0, 2.0, 5.0,
          40.0, 1e3, 1e8]


@pytest.mark.parametrize("z", TAIL_Z)
@pytest.mark.parametrize("y", [-1.0, 1.0])
@pytest.mark.parametrize("slope,s2", [(math.inf, 1.0), (2.0, 0.75), (1.0, 1e-300), (1.0, 1e300),
                                     (math.inf, 1e-300)])
def test_probit_tails_against_mpmath(z, y, slope, s2):
    bias = 0.25
    c = 1.0 / math.sqrt((0.0 if math.isinf(slope) else slope**-2) + s2)
    mu = z / c - bias          # so that u = y z up to rounding
    u_lo = c * (-bias - mu)    # the interval the kernel sees: (u_lo, inf) or (-inf, u_lo)
    lo, hi = (u_lo, mpmath.inf) if y > 0 else (-mpmath.inf, u_lo)
    log_z, alpha, beta = (v[0] for v in compiled(S.SiteSpec(PROBIT, [slope, bias]), y, mu, s2))
    want = _mp_interval(c, lo, hi)
    assert_close_mp(log_z, want[0], what="log_z")
    assert_close_mp(alpha, want[1], what="alpha")
    assert_close_mp(beta, want[2], what="beta")


def _mp_step(y, mu, s2, eps):
    mu, s2, eps = mpmath.mpf(mu), mpmath.mpf(s2), mpmath.mpf(eps)
    sd = mpmath.sqrt(s2)
    z = y * mu / sd
    z_mass = eps + (1 - 2 * eps) * mpmath.ncdf(z)
    alpha = y * (1 - 2 * eps) * mpmath.npdf(z) / (z_mass * sd)
    beta = alpha * (alpha + mu / s2)
    return mpmath.log(z_mass), alpha, beta


@pytest.mark.parametrize("z", TAIL_Z)
@pytest.mark.parametrize("y", [-1.0, 1.0])
@pytest.mark.parametrize("eps", [0.0, 1e-12, 0.2])
@pytest.mark.parametrize("s2", [1.0, 1e-300, 1e300])
def test_step_tails_against_mpmath(z, y, eps, s2):
    mu = z * math.sqrt(s2)
    log_z, alpha, beta = (v[0] for v in compiled(S.SiteSpec(STEP, [eps]), y, mu, s2))
    want = _mp_step(y, mu, s2, eps)
    assert_close_mp(log_z, want[0], what="log_z")
    # Where alpha is exponentially small (alpha sqrt(s2) ~ N(z)/Z) its relative
    # condition number in z is ~z², and z = y mu / sqrt(s2) is itself rounded.
    small = abs(want[1]) * math.sqrt(s2) < 1e-3
    rtol = MP_RTOL * (1 + z * z if small else 1)
    assert_close_mp(alpha, want[1], rtol=rtol, what="alpha")
    if eps == 0.0:
        assert_close_mp(beta, want[2], rtol=rtol, what="beta")
    else:
        # beta changes sign for eps > 0 (log Z is not concave); near the zero
        # crossing judge it against the scale of its terms, alpha² and alpha mu/s2.
        err = abs(mpmath.mpf(beta) - want[2])
        scale = abs(want[2]) + abs(want[1]) * (abs(want[1]) + abs(mpmath.mpf(mu) / s2))
        assert err <= rtol * scale + 1e-300, (beta, want[2])


ORDINAL_LO = [-1e8, -1e3, -40.0, -10.0, -2.5, -1.0, -1e-9, 0.0, 0.5, 3.0, 40.0, 1e3]
ORDINAL_WIDTH = [1e-12, 1e-6, 1e-2, 0.3, 1.0, 3.0, 50.0]


@pytest.mark.parametrize("lo", ORDINAL_LO)
@pytest.mark.parametrize("width", ORDINAL_WIDTH)
def test_ordinal_interval_against_mpmath(lo, width):
    # Category 1 of 3 with slope inf and s2 = 1: interval (lo, lo + width) in z units.
    mu = -lo
    spec = S.SiteSpec(ORDINAL, [math.inf, 0.0, width])
    log_z, alpha, beta = (v[0] for v in compiled(spec, 1.0, mu, 1.0))
    lo_exact = mpmath.mpf(0.0) - mpmath.mpf(mu)
    want = _mp_interval(1.0, lo_exact, lo_exact + mpmath.mpf(width))
    assert_close_mp(log_z, want[0], rtol=1e3 * EPS, what="log_z")
    assert_close_mp(alpha, want[1], rtol=1e3 * EPS, what="alpha")
    assert_close_mp(beta, want[2], rtol=1e3 * EPS, what="beta")


@pytest.mark.parametrize("k", [0, 2])
@pytest.mark.parametrize("z", TAIL_Z)
def test_ordinal_end_categories_against_mpmath(k, z):
    slope, bias, s2 = 3.0, 0.1, 0.5
    widths = [1.0]
    c = 1.0 / math.sqrt(slope**-2 + s2)
    theta = R.ordinal_thresholds(bias, widths)
    edge = theta[0] if k == 0 else theta[-1]
    mu = edge - z / c
    spec = S.SiteSpec(ORDINAL, [slope, bias, *widths])
    log_z, alpha, beta = (v[0] for v in compiled(spec, float(k), mu, s2))
    u = c * (edge - mu)
    want = _mp_interval(c, -mpmath.inf, u) if k == 0 else _mp_interval(c, u, mpmath.inf)
    assert_close_mp(log_z, want[0], what="log_z")
    assert_close_mp(alpha, want[1], what="alpha")
    assert_close_mp(beta, want[2], what="beta")


EXTREME_MU = [-1e8, -1e3, -40.0, -1.0, 0.0, 1.0, 40.0, 1e3, 1e8]
EXTREME_S2 = [0.0, 1e-300, 1e-8, 1.0, 1e8, 1e300]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_extreme_cavities_are_finite(name):
    make, y = SPECS[name]
    spec = make()
    mu, s2 = np.meshgrid(EXTREME_MU, EXTREME_S2)
    mu, s2 = mu.ravel(), s2.ravel()
    if name == "step":
        keep = s2 > 0
        mu, s2 = mu[keep], s2[keep]
    for sign in (-1.0, 1.0):
        yy = np.full(mu.shape, y if name in ("gaussian", "ordinal") else sign * y)
        log_z, alpha, beta = S.site_moments_array(spec, yy, mu, s2)
        assert np.all(np.isfinite(log_z) & np.isfinite(alpha) & np.isfinite(beta))
        if name != "gaussian":  # t(f) <= 1, so log Z <= 0 up to rounding
            assert np.all(log_z <= 1e-14)
        # Tilted variance s2 - s2² beta within [0, s2] (beta in [0, 1/s2]) except
        # noisy-step sites, whose beta may be negative.
        with np.errstate(over="ignore"):
            scaled = s2 * beta
        if name not in ("step", "gh"):
            assert np.all(beta >= 0)
        assert np.all(scaled <= 1 + 1e-12)


def test_logistic_gh_derivatives_well_conditioned_as_variance_vanishes():
    spec = gh_spec(32)
    mu = np.array([0.3, 0.3, 0.3])
    s2 = np.array([0.0, 1e-300, 1e-12])
    log_z, alpha, beta = S.site_moments_array(spec, np.ones(3), mu, s2)
    sig = 1 / (1 + math.exp(-0.3))
    np.testing.assert_allclose(log_z, math.log(sig), rtol=1e-12)
    np.testing.assert_allclose(alpha, 1 - sig, rtol=1e-10)
    np.testing.assert_allclose(beta, sig * (1 - sig), rtol=1e-10)


def test_underflowing_mass_is_reported_not_returned():
    # z = -1e160: log Phi(z) = -5e319 is not a float64.
    with pytest.raises(ValueError, match="site 0 failed.*underflows"):
        S.site_moments_array(S.SiteSpec(STEP, [0.0]), np.array([1.0]), np.array([-1.0]),
                             np.array([1e-320]))


def test_overflowing_derivatives_are_reported():
    with pytest.raises(ValueError, match="overflows"):
        S.site_moments_array(S.SiteSpec(PROBIT, [math.inf, 0.0]), np.array([1.0]),
                             np.array([-1e-150]), np.array([1e-320]))


# ---------------------------------------------------------------------------
# errors and validation
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("spec,y,mu,s2,message", [
    (S.SiteSpec(PROBIT, [1.0, 0.0]), 0.0, 0.0, 1.0, "target outside"),
    (S.SiteSpec(PROBIT, [1.0, 0.0]), 1.0, np.nan, 1.0, "cavity"),
    (S.SiteSpec(PROBIT, [1.0, 0.0]), 1.0, 0.0, -1.0, "cavity"),
    (S.SiteSpec(PROBIT, [1.0, 0.0]), 1.0, 0.0, np.inf, "cavity"),
    (S.SiteSpec(PROBIT, [math.inf, 0.0]), 1.0, 0.0, 0.0, "cavity"),
    (S.SiteSpec(STEP, [0.1]), -1.0, 0.0, 0.0, "cavity"),
    (S.SiteSpec(STEP, [0.1]), 2.0, 0.0, 1.0, "target outside"),
    (S.SiteSpec(MACKAY, []), 0.5, 0.0, 1.0, "target outside"),
    (S.SiteSpec(GAUSSIAN, [1.0]), np.inf, 0.0, 1.0, "target outside"),
    (S.SiteSpec(GAUSSIAN, [1.0]), np.nan, 0.0, 1.0, "target outside"),
    (S.SiteSpec(ORDINAL, [1.0, 0.0, 1.0]), 3.0, 0.0, 1.0, "target outside"),
    (S.SiteSpec(ORDINAL, [1.0, 0.0, 1.0]), -1.0, 0.0, 1.0, "target outside"),
    (S.SiteSpec(ORDINAL, [1.0, 0.0, 1.0]), 0.5, 0.0, 1.0, "target outside"),
    (S.SiteSpec(ORDINAL, [math.inf, 0.0]), 0.0, 0.0, 0.0, "cavity"),
])
def test_bad_site_inputs_name_the_site(spec, y, mu, s2, message):
    # Two valid sites, then the bad one.
    valid_y = 0.0 if spec.code in (GAUSSIAN, ORDINAL) else 1.0
    ys = np.array([valid_y, valid_y, y])
    mus = np.array([0.0, 0.0, mu])
    s2s = np.array([1.0, 1.0, s2])
    with pytest.raises(ValueError, match=rf"site 2 failed.*{message}"):
        S.site_moments_array(spec, ys, mus, s2s)


def test_array_argument_errors():
    spec = S.SiteSpec(PROBIT, [1.0, 0.0])
    ones = np.ones(4)
    with pytest.raises(ValueError, match="same length"):
        S.site_moments_array(spec, ones, ones, np.ones(3))
    with pytest.raises(ValueError, match="1-D"):
        S.site_moments_array(spec, np.ones((2, 2)), ones, ones)
    with pytest.raises(TypeError, match="y must be a real numeric array"):
        S.site_moments_array(spec, np.array(["a"] * 4), ones, ones)
    with pytest.raises(ValueError, match="alpha has length 3"):
        S.site_moments_array(spec, ones, ones, ones, alpha=np.empty(3))
    with pytest.raises(ValueError, match="log_z must be a writeable"):
        S.site_moments_array(spec, ones, ones, ones, log_z=np.empty(4, dtype=np.float32))
    with pytest.raises(ValueError, match="beta must be a writeable"):
        S.site_moments_array(spec, ones, ones, ones, beta=np.empty(8)[::2])
    with pytest.raises(TypeError):
        S.site_moments_array(None, ones, ones, ones)


def test_outputs_filled_in_place_and_inputs_coerced():
    spec = S.SiteSpec(PROBIT, [1.0, 0.0])
    out = [np.full(3, np.nan) for _ in range(3)]
    got = S.site_moments_array(spec, [1, -1, 1], [0, 1, 2], [1, 1, 0], *out)
    for g, o in zip(got, out):
        assert g is o
        assert np.all(np.isfinite(o))
    empty = S.site_moments_array(spec, [], [], [])
    assert all(e.shape == (0,) for e in empty)


@pytest.mark.parametrize("code,params,message", [
    (PROBIT, [1.0], "probit likelihood needs"),
    (PROBIT, [0.0, 0.0], "probit slope"),
    (PROBIT, [np.nan, 0.0], "probit slope"),
    (PROBIT, [1.0, np.inf], "probit bias"),
    (STEP, [0.5], "flip_noise"),
    (STEP, [-0.1], "flip_noise"),
    (STEP, [np.nan], "flip_noise"),
    (STEP, [], "step likelihood needs"),
    (MACKAY, [1.0], "takes no params"),
    (GAUSSIAN, [0.0], "noise_variance"),
    (GAUSSIAN, [np.inf], "noise_variance"),
    (GAUSSIAN, [], "Gaussian likelihood needs"),
    (ORDINAL, [1.0], "C >= 2"),
    (ORDINAL, [-1.0, 0.0], "ordinal slope"),
    (ORDINAL, [1.0, np.nan], "ordinal bias"),
    (ORDINAL, [1.0, 0.0, 1.0, 0.0], "widths"),
    (ORDINAL, [1.0, 0.0, -1.0], "widths"),
    (99, [], "unknown likelihood code"),
    (GH, [], "gh_nodes"),
])
def test_site_spec_validation(code, params, message):
    with pytest.raises(ValueError, match=message):
        S.SiteSpec(code, params)


def test_site_spec_gh_validation_and_ownership():
    nodes, log_weights = R.gauss_hermite_rule(4)
    with pytest.raises(ValueError, match="same length"):
        S.SiteSpec(GH, [], nodes, log_weights[:3])
    with pytest.raises(ValueError, match="finite"):
        S.SiteSpec(GH, [], nodes, np.r_[log_weights[:3], -np.inf])
    with pytest.raises(ValueError, match="1..256"):
        S.SiteSpec(GH, [], np.zeros(257), np.zeros(257))
    with pytest.raises(ValueError, match="only used by"):
        S.SiteSpec(PROBIT, [1.0, 0.0], nodes, log_weights)
    spec = S.SiteSpec(GH, [], nodes, log_weights)
    nodes[:] = 0  # the spec owns a copy
    assert not np.array_equal(spec.gh_nodes, nodes)
    with pytest.raises(ValueError, match="read-only"):
        spec.gh_nodes[0] = 1.0
    # C = 2 ordinal has params [slope, bias] only.
    two = S.SiteSpec(ORDINAL, [1.0, 0.0])
    log_z, _, _ = S.site_moments_array(two, np.array([0.0, 1.0]), np.zeros(2), np.ones(2))
    np.testing.assert_allclose(np.exp(log_z), [0.5, 0.5], rtol=1e-15)


def test_site_spec_pickles_and_reprs():
    import pickle

    spec = gh_spec(5)
    again = pickle.loads(pickle.dumps(spec))
    assert again.code == spec.code
    np.testing.assert_array_equal(again.gh_nodes, spec.gh_nodes)
    assert "logistic_gh" in repr(spec)


def test_status_codes_are_exported():
    assert S.OK == 0 and S.BAD_CAVITY == 1 and S.BAD_LABEL == 2 and S.ZERO_MASS == 3
    assert "cavity" in S.status_message(S.BAD_CAVITY)
    assert "unknown" in S.status_message(1234)


def test_million_sites_in_one_call():
    rng = np.random.default_rng(1)
    n = 1_000_000
    y = rng.choice([-1.0, 1.0], n)
    mu = rng.normal(0, 3, n)
    s2 = rng.uniform(0, 4, n)
    spec = S.SiteSpec(PROBIT, [1.0, 0.0])
    log_z, alpha, beta = S.site_moments_array(spec, y, mu, s2)
    assert np.all(np.isfinite(log_z) & np.isfinite(alpha) & np.isfinite(beta))
    idx = rng.choice(n, 1000, replace=False)
    idx = idx[np.abs(mu[idx]) / np.sqrt(1 + s2[idx]) <= 6]  # where the reference is accurate
    want = R.probit_moments(y[idx], mu[idx], s2[idx])
    np.testing.assert_allclose(log_z[idx], want[0], rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose(alpha[idx], want[1], rtol=RTOL, atol=0)
    np.testing.assert_allclose(beta[idx], want[2], rtol=RTOL, atol=0)
