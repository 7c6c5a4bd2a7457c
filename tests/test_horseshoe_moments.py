"""Horseshoe EP tilted moments (supplement eqs 15-21): compiled kernel, reference twin, brute force.

The brute force integrates the tilted distribution g_j(w, u, v) q^{\\j}(w, u, v) in the
original variables: w exactly (given u, v it is a product of two Gaussians) and (u, v) on a
fine tensor trapezoidal grid in (log u + log v, log u - log v); it uses neither the
half-Cauchy reduction of eq (15) nor the one-quadrature formulas for E[u²], E[v²] (eqs 18-21).
"""
import numpy as np
import pytest

from fastep._epcore import horseshoe as core
from fastep.reference import horseshoe as ref

OUTPUTS = ("log_s", "mean", "var", "Eu2", "Ev2")


def brute_force(m, eta, nu, xi, h=0.04):
    """(log s, E[w], Var[w], E[u²], E[v²]) of N(w|0, u²/v²) N(w|m, η) N(u|0, ν) N(v|0, ξ)."""
    half_log_a, half_log_eta = 0.5 * np.log(nu / xi), 0.5 * np.log(eta)
    top = max(half_log_a, half_log_eta, np.log(abs(m)) if m else -np.inf)
    z = np.arange(min(half_log_a, half_log_eta) - 40, top + 22, h)[:, None]     # log|u/v|
    t = np.arange(0.5 * np.log(nu * xi) - 40, 0.5 * np.log(nu * xi) + 6, h)[None, :]  # log|u v|
    u2, v2 = np.exp(t + z), np.exp(t - z)
    q = np.exp(2 * z) + eta                       # variance of m given u, v: u²/v² + η
    # ∫ N(w|0,u²/v²) N(w|m,η) dw = N(m|0, q); du dv = (uv/2) dt dz; 4 sign quadrants
    log_dens = (-0.5 * m * m / q - 0.5 * np.log(2 * np.pi * q) - 0.5 * u2 / nu - 0.5 * v2 / xi
                - 0.5 * np.log(4 * np.pi ** 2 * nu * xi) + t + np.log(2.0))
    top_value = log_dens.max()
    weight = np.exp(log_dens - top_value)
    total = weight.sum()
    r = np.exp(2 * z) / q                         # w | u, v ~ N(r m, r η)
    mean = m * (weight * r).sum() / total
    var = (weight * ((r * m - mean) ** 2 + r * eta)).sum() / total   # law of total variance
    return (np.log(total * h * h) + top_value, mean, var,
            (weight * u2).sum() / total, (weight * v2).sum() / total)


CAVITIES = [
    (0.7, 0.3, 0.5, 1.7),          # moderate
    (2.5, 0.01, 1e-3, 1.0),        # relevant feature, small prior scale: slab mode
    (-0.05, 1e-4, 10.0, 0.1),      # well-determined zero under a wide prior: spike
    (8.0, 1e-3, 1e-5, 1.0),        # large |m|/√η, tiny scale: sharp slab
    (0.0, 1.0, 1.0, 1.0),          # m = 0
    (30.0, 1e-6, 1e-8, 1e2),       # extreme
]


@pytest.mark.parametrize("cavity", CAVITIES)
def test_reference_moments_equal_brute_force(cavity):
    expected = brute_force(*cavity)
    got = [float(v) for v in ref.tilted_moments(*cavity)[:5]]
    for name, g, e in zip(OUTPUTS, got, expected):
        if name == "log_s":
            assert abs(g - e) < 1e-11, name
        else:
            assert abs(g - e) <= 1e-10 * abs(e) + 1e-300, (name, g, e)


def test_compiled_moments_equal_brute_force():
    cav = np.array(CAVITIES).T
    got = np.array(core.tilted_moments(*cav))[:5]
    for k, cavity in enumerate(CAVITIES):
        expected = brute_force(*cavity)
        assert abs(got[0, k] - expected[0]) < 1e-11
        np.testing.assert_allclose(got[1:, k], expected[1:], rtol=1e-10, atol=0)


def random_cavities(rng, n):
    m = rng.normal(size=n) * 10.0 ** rng.uniform(-4, 3, n)
    m[:5] = 0.0
    eta = 10.0 ** rng.uniform(-10, 3, n)
    nu = 10.0 ** rng.uniform(-6, 6, n)
    xi = 10.0 ** rng.uniform(-6, 6, n)
    return m, eta, nu, xi


ADVERSARIAL = np.array([
    (3.0, 0.01, 0.01, 1), (1e3, 1e-6, 1e-6, 1e6), (30, 1e-4, 1e-4, 1.0), (1e-8, 1e-8, 1e4, 1),
    (1e4, 1e-12, 1e-10, 1e5), (1e-12, 1e3, 1e-8, 1e8), (-50, 1e-8, 1e6, 1e-6), (5, 1e-300, 1, 1),
    (1e100, 1.0, 1.0, 1.0), (1.0, 1e200, 1e-100, 1e100), (-1e-3, 1e-120, 1e120, 1e-120),
    (1e150, 1e290, 1e250, 1e-30),
]).T


@pytest.mark.parametrize("kind", ["random", "adversarial"])
def test_compiled_moments_match_reference(kind):
    rng = np.random.default_rng(7)
    cav = random_cavities(rng, 300) if kind == "random" else ADVERSARIAL
    got = np.array(core.tilted_moments(*cav))
    expected = np.array(ref.tilted_moments(*cav))
    assert np.all(np.isfinite(got))
    assert np.max(np.abs(got[0] - expected[0])) < 1e-12 * max(1.0, np.max(np.abs(expected[0])))
    diff = np.abs(got[1:] - expected[1:])
    scale = np.abs(expected[1:])
    assert np.all(diff <= 1e-11 * scale), np.max(diff[scale > 0] / scale[scale > 0])
    # t = E[a/(a + λ²)] and the u, v moments are consistent: E[u²] = 2ν(1 - t), E[v²] = 2ξt
    np.testing.assert_allclose(got[4], 2 * cav[3] * got[5], rtol=1e-14)
    # the tilted variance is positive and E[w] lies between 0 and m (shrinkage)
    assert np.all(got[2] > 0)
    assert np.all(np.abs(got[1]) <= np.abs(cav[0]) * (1 + 1e-14))


def test_moments_independent_of_threads_and_reject_bad_cavities():
    rng = np.random.default_rng(3)
    cav = random_cavities(rng, 2000)
    one = np.array(core.tilted_moments(*cav, n_threads=1))
    two = np.array(core.tilted_moments(*cav, n_threads=2))
    assert np.array_equal(one, two)
    for bad, name in [((0.1, -1.0, 1.0, 1.0), "eta"), ((0.1, 1.0, 0.0, 1.0), "nu"),
                      ((np.nan, 1.0, 1.0, 1.0), "m"), ((0.1, 1.0, 1.0, np.inf), "xi"),
                      ((1e-3, 1e-250, 1e250, 1e-250), "scales spanning more than e^250")]:
        m, eta, nu, xi = (np.array([0.2, v]) for v in bad)
        with pytest.raises(ValueError, match="feature 1"):
            core.tilted_moments(m, eta, nu, xi)


def test_prior_is_horseshoe_with_scale_rho_over_gamma():
    """P = 0, D = I: C = I, u_j ~ N(0, ρ²), v_j ~ N(0, γ²), and the marginal prior of w_j,
    ∫∫ N(w | 0, u²/v²) N(u | 0, ρ²) N(v | 0, γ²) du dv (brute force over (u, v)), is the
    horseshoe density ∫ N(w | 0, (ρ/γ)² λ²) C⁺(λ | 0, 1) dλ; the EP normaliser s_j of eq (15)
    with a point-mass cavity for w and the prior as cavity for u, v is that density."""
    d = 5
    for D in (np.ones(d), np.array([0.5, 1.0, 2.0, 3.0, 7.0])):
        np.testing.assert_allclose(ref.correlation_matrix(np.zeros((d, 0)), D), np.eye(d), atol=1e-15)
    rho2, gamma2 = 0.3, 2.0
    w = np.array([-3.0, -0.2, 0.01, 0.5, 4.0, 40.0])
    # a point-mass cavity: η = 1e-16 w² changes the density by a relative O(1e-16)
    brute = np.array([np.exp(brute_force(wi, 1e-16 * wi * wi, rho2, gamma2)[0]) for wi in w])
    np.testing.assert_allclose(ref.horseshoe_density(w, np.sqrt(rho2 / gamma2)), brute, rtol=1e-10)
    log_s = core.tilted_moments(w, 1e-16 * w * w, np.full(w.size, rho2), np.full(w.size, gamma2))[0]
    np.testing.assert_allclose(np.exp(log_s), brute, rtol=1e-9)
    # the horseshoe density integrates to one (in log w; p(w) ≈ √(2/π)/(π w²) beyond w = 50)
    s = np.linspace(np.log(1e-10), np.log(50.0), 801)
    trapezoid = getattr(np, "trapezoid", None) or np.trapz     # numpy < 2 has trapz only
    mass = 2 * trapezoid(ref.horseshoe_density(np.exp(s), 1.0) * np.exp(s), s)
    tail = 2 * np.sqrt(2 / np.pi) / np.pi / 50.0
    assert abs(mass + tail - 1.0) < 1e-4
