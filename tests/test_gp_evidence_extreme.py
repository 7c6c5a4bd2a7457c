"""GP EP evidence at huge site precisions (steep probit slopes up to a step).

Oracles: the exact one-site evidence ``log Φ(y b / sqrt(k + 1/λ²))`` (the cavity of a single
site is its prior, so the EP evidence is exact for any sites), an mpmath (60-digit)
evaluation of the same EP evidence (Minka eq 88 in the textbook form) from the same K and
sites, and central finite differences of the evidence.
"""
import warnings

import mpmath
import numpy as np
import pytest
from scipy.special import log_ndtr

from engine_helpers import run_gp_ep
from fastep import ConvergenceWarning, GaussianProcessClassifier
from fastep._epcore import gp_ep as engine
from fastep.kernels import RBF
from fastep.likelihoods import Probit

SLOPES = [1.0, 1e3, 1e6, 1e9, 1e12, np.inf]


def exact_one_site(k, y, slope, bias):
    return float(log_ndtr(y * bias / np.sqrt(k + (0.0 if np.isinf(slope) else slope ** -2))))


@pytest.mark.parametrize("slope", SLOPES)
@pytest.mark.parametrize("k, bias", [(1.0, 0.0), (1.0, -8.0), (1e-4, 0.05), (1.0, 30.0), (1e-4, -1e-3)])
def test_one_site_evidence_is_exact(slope, k, bias):
    K = np.array([[k]])
    y = np.array([1.0])
    spec = Probit(slope=slope, bias=bias).site_spec()
    expected = exact_one_site(k, 1.0, slope, bias)
    tau, nu = np.zeros(1), np.zeros(1)
    info = run_gp_ep(K, y, spec, tau, nu, np.empty((1, 1)), np.empty(1), tol=1e-12,
                     max_sweeps=50)
    assert info.log_z <= 0.0
    assert info.log_z == pytest.approx(expected, rel=1e-10, abs=1e-12)
    assert engine.log_marginal_likelihood(K, y, spec, tau, nu) == pytest.approx(expected, rel=1e-10, abs=1e-12)
    # any proper sites give the same (exact) value; huge precisions are where the textbook
    # form's cavity 1/Σ - τ and its ½νᵀΣν - ½ν²/(τ + τ₋) cancel to nothing
    for t, m in [(1e8, 0.3), (1e14, -2.0), (1e18, 0.01)]:
        site = engine.log_marginal_likelihood(K, y, spec, np.array([t]), np.array([t * m]))
        assert site == pytest.approx(expected, rel=1e-10, abs=1e-12)


def _mp_log_z(K, y, tau, nu, slope, dps=60):
    """Textbook EP evidence (Minka eq 88 / R&W eq 3.65 with the cavities of eqs 78-79) in mpmath."""
    with mpmath.workdps(dps):
        n = len(y)
        Km = mpmath.matrix(K.tolist())
        S = mpmath.diag([mpmath.mpf(float(t)) for t in tau])
        v = mpmath.matrix([float(x) for x in nu])
        A = mpmath.eye(n) + Km * S
        Sigma = mpmath.inverse(A) * Km                 # (I + K S)⁻¹ K = (K⁻¹ + S)⁻¹
        mu = Sigma * v
        total = -mpmath.log(mpmath.det(A)) / 2 + (v.T * mu)[0] / 2
        lam2 = 0 if np.isinf(slope) else mpmath.mpf(float(slope)) ** -2
        for i in range(n):
            t, vi = S[i, i], v[i]
            var = 1 / (1 / Sigma[i, i] - t)
            m = (mu[i] / Sigma[i, i] - vi) * var
            total += mpmath.log(mpmath.ncdf(float(y[i]) * m / mpmath.sqrt(var + lam2)))
            total += mpmath.log(1 + var * t) / 2 - (vi + m / var) ** 2 / (t + 1 / var) / 2 + m ** 2 / (2 * var)
        return float(total)


def _problem(n=50, seed=0, jitter=1e-6):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, size=(n, 2))
    K = np.ascontiguousarray(RBF(1.0, 1.0)(X))
    K.flat[:: n + 1] += jitter
    y = np.where(X[:, 0] - X[:, 1] + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, K, y


@pytest.mark.slow
def test_n50_evidence_matches_high_precision_at_huge_precisions():
    X, K, y = _problem()
    n = len(y)
    # EP at a steep slope and at a step: evidence <= 0 and equal to the 60-digit value
    for slope in (1e10, np.inf):
        spec = Probit(slope=slope).site_spec()
        tau, nu = np.zeros(n), np.zeros(n)
        info = run_gp_ep(K, y, spec, tau, nu, np.empty((n, n)), np.empty(n), tol=1e-6)
        assert tau.max() > 1e6
        value = engine.log_marginal_likelihood(K, y, spec, tau, nu)
        assert info.log_z == pytest.approx(value, rel=1e-12)
        assert value < 0.0
        assert value == pytest.approx(_mp_log_z(K, y, tau, nu, slope), rel=1e-9)
    # the same sites pushed to precisions of 1e12-1e15 (site means kept): still exact
    rng = np.random.default_rng(1)
    big = 10.0 ** rng.uniform(12, 15, size=n)
    pos = tau > 1e3
    tau2 = np.where(pos, big, tau)
    nu2 = np.where(pos, nu / np.maximum(tau, 1e-300) * big, nu)
    spec = Probit(slope=1e10).site_spec()
    value = engine.log_marginal_likelihood(K, y, spec, tau2, nu2)
    assert value == pytest.approx(_mp_log_z(K, y, tau2, nu2, 1e10), rel=1e-9)


def test_gradient_matches_finite_differences_at_slope_1e6():
    X, K, y = _problem(n=40, seed=2, jitter=0.0)
    kernel = RBF(1.0, 1.0)
    clf = GaussianProcessClassifier(kernel, Probit(slope=1e6, bias=0.02), optimizer=None, tol=1e-12,
                                    max_sweeps=60, learn_likelihood=True, jitter=1e-6)
    with warnings.catch_warnings():
        # the sweeps' own cavities (1/Σ_ii - τ_i) jitter at τ ~ 1e6: Δ log Z stalls near 1e-7
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y)
    assert clf.site_precision_.max() > 1e5
    theta = np.concatenate([kernel.theta, [0.02, np.log(1e6)]])
    value, grad = clf.log_marginal_likelihood(theta, eval_gradient=True)
    assert value < 0.0
    # each evaluation re-runs EP, which stops ~1e-9 from its fixed point in log Z; a step of
    # 1e-3 keeps that noise (~1e-9 / 2e-3) below the tolerance and the truncation error too
    h = 1e-3
    fd = np.empty_like(theta)
    for j in range(theta.size):
        e = np.zeros_like(theta)
        e[j] = h
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            fd[j] = (clf.log_marginal_likelihood(theta + e) - clf.log_marginal_likelihood(theta - e)) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-5)


def _probit(slope):
    from fastep.reference.sites import probit_moments
    return lambda y, mu, s2: probit_moments(y, mu, s2, slope=slope)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_twin_of_the_stable_evidence(seed):
    """fastep.reference.gp_ep.log_marginal_likelihood_stable against the compiled evidence on
    random and adversarial sites: moderate precisions (where the textbook twin agrees too),
    precisions of 1e8-1e15, zeros mixed in, and all zero."""
    from fastep.reference import gp_ep as ref
    _, K, y = _problem(n=30, seed=seed)
    n = len(y)
    rng = np.random.default_rng(seed)
    slope = 1e6
    spec = Probit(slope=slope).site_spec()
    moderate = (rng.uniform(0.1, 3.0, n), rng.normal(size=n))
    value = engine.log_marginal_likelihood(K, y, spec, *moderate)
    assert ref.log_marginal_likelihood_stable(K, y, _probit(slope), *moderate) == pytest.approx(value, rel=1e-11)
    assert ref.log_marginal_likelihood(K, y, _probit(slope), *moderate) == pytest.approx(value, rel=1e-9)
    huge = 10.0 ** rng.uniform(8, 15, n)
    mixed = np.where(rng.random(n) < 0.3, 0.0, huge)
    for tau in (huge, mixed, np.zeros(n)):
        nu = tau * 0.01 * y * rng.uniform(0.5, 2.0, n) + np.where(tau == 0, 0.1 * rng.normal(size=n), 0.0)
        value = engine.log_marginal_likelihood(K, y, spec, tau, nu)
        twin = ref.log_marginal_likelihood_stable(K, y, _probit(slope), tau, nu)
        # both within ~1e-9 of the 60-digit value here (K + 1e-6 I is nearly singular)
        assert twin == pytest.approx(value, rel=5e-9, abs=1e-9)
        assert twin == pytest.approx(_mp_log_z(K, y, tau, nu, slope), rel=5e-9, abs=1e-9)
