"""Horseshoe EP engine (fastep._epcore.horseshoe_ep.HorseshoeEP) against dense linear algebra, its reference
twin, exact evidences by numerical integration and finite differences (supplement eqs 2-50); the engine contract
(options, result, callback, restore, cimport)."""
import _thread
import pickle
import queue
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import fastep
from fastep._epcore._common import SweepResult
from fastep._epcore.horseshoe_ep import HorseshoeDamping, HorseshoeEP, HorseshoeOptions, HorseshoePrior, HorseshoeResult
from fastep._horseshoe import parallel_ep as eng

from fastep.reference import horseshoe as ref

from engine_helpers import horseshoe_options, horseshoe_state, run_horseshoe_ep


# the engines and twins make many small sequential BLAS calls (conftest.one_blas_thread)
pytestmark = pytest.mark.usefixtures("one_blas_thread")


def problem(n, d, m, seed, noise=0.4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = np.zeros(d)
    w[: min(3, d)] = [2.0, -1.5, 1.0][: min(3, d)]
    y = X @ w + noise * rng.normal(size=n)
    P = 0.4 * rng.normal(size=(d, m))
    D = rng.uniform(0.5, 1.5, d)
    return X, y, P, D


def run(X, y, s2, r2, g2, P, D, **options):
    return run_horseshoe_ep(X, y, s2, r2, g2, P, D, **options)


# ------------------------------------------------------------------------------ marginals
@pytest.mark.parametrize("n,d", [(6, 15), (20, 7)])
def test_w_marginals_match_dense(n, d):
    """Split Woodbury (n < d) and dense (d <= n) forms against (Π + XᵀX/σ²)⁻¹, with site
    precisions that are huge, moderate, tiny, zero and negative."""
    rng = np.random.default_rng(n + d)
    X = rng.normal(size=(n, d))
    y = rng.normal(size=n)
    s2 = 0.3
    pi = rng.uniform(0.5, 3.0, d)
    pi[:4] = [1e9, 1e-7, 0.0, -0.05]
    h = rng.normal(size=d)
    flat = dict(P=np.zeros((d, 0)), D=np.ones(d))
    out = horseshoe_state(X, y, s2, 1.0, 1.0, **flat, pi_w=pi, h_w=h)
    assert out.factors[0] == ("split" if d > n else "dense")
    prec = np.diag(pi) + X.T @ X / s2
    V = np.linalg.inv(prec)
    b = h + X.T @ y / s2
    mu = V @ b
    np.testing.assert_allclose(out.var, np.diag(V), rtol=1e-9)
    np.testing.assert_allclose(out.mean, mu, rtol=1e-9, atol=1e-12)
    log_z = (-0.5 * n * np.log(2 * np.pi * s2) - y @ y / (2 * s2) + 0.5 * d * np.log(2 * np.pi)
             - 0.5 * np.linalg.slogdet(prec)[1] + 0.5 * b @ mu)
    assert abs(out.log_z_w - log_z) < 1e-9 * max(1.0, abs(log_z))
    # cavities (eq 14) computed without the cancellation of 1/V_jj - π_j
    np.testing.assert_allclose(1.0 / out.cavity_var, 1.0 / np.diag(V) - pi, rtol=1e-6)
    cav_mean = (mu / np.diag(V) - h) / (1.0 / np.diag(V) - pi)
    np.testing.assert_allclose(out.cavity_mean, cav_mean, rtol=1e-6, atol=1e-9)
    # predictive variances x*ᵀ V x*
    Xs = rng.normal(size=(4, d))
    np.testing.assert_allclose(eng.predictive_variance(eng.Task(X, y), out.factors, Xs),
                               np.einsum("ij,jk,ik->i", Xs, V, Xs), rtol=1e-8)
    # σ² gradient against a central difference with the sites fixed
    f = lambda s: horseshoe_state(X, y, s, 1.0, 1.0, **flat, pi_w=pi, h_w=h).log_z_w
    fd = (f(s2 * (1 + 1e-5)) - f(s2 * (1 - 1e-5))) / (2e-5 * s2)
    assert abs(out.grad_sigma2 - fd) < 1e-5 * max(1.0, abs(fd))
    # an indefinite precision is reported as improper
    with pytest.raises(ValueError, match="improper"):
        horseshoe_state(X, y, s2, 1.0, 1.0, **flat, pi_w=np.full(d, -100.0), h_w=h)


def test_split_set_is_capped_at_n_and_stays_exact():
    """More than n features with small site precisions (an EP transient at large d): S keeps
    those below HARD_SPLIT and the smallest ratios up to n, the rest go to B; the marginals
    still match the dense inverse (ratios >= 1e-7 cost a few digits at most). More than n
    non-positive precisions make Π + XᵀX/σ² indefinite: reported as improper."""
    rng = np.random.default_rng(3)
    n, d, s2 = 6, 40, 0.3
    X = rng.normal(size=(n, d))
    y = rng.normal(size=n)
    flat = dict(P=np.zeros((d, 0)), D=np.ones(d))
    data_prec = eng.Task(X, y).col_sq / s2
    pi = rng.uniform(0.5, 3.0, d)
    pi[:14] = data_prec[:14] * np.geomspace(1e-7, 5e-5, 14)     # 14 > n qualify for S
    pi[3] = 1e-12 * data_prec[3]                                 # below HARD_SPLIT
    h = rng.normal(size=d)
    out = horseshoe_state(X, y, s2, 1.0, 1.0, **flat, pi_w=pi, h_w=h)
    kind, in_s = out.factors[:2]
    assert kind == "split" and in_s.sum() == n and in_s[3] and np.all(in_s[:n]) and not np.any(in_s[14:])
    V = np.linalg.inv(np.diag(pi) + X.T @ X / s2)
    mu = V @ (h + X.T @ y / s2)
    np.testing.assert_allclose(out.var, np.diag(V), rtol=1e-7)
    np.testing.assert_allclose(out.mean, mu, rtol=1e-7, atol=1e-9 * np.abs(mu).max())
    np.testing.assert_allclose(1.0 / out.cavity_var, 1.0 / np.diag(V) - pi, rtol=1e-5)
    Xs = rng.normal(size=(3, d))
    np.testing.assert_allclose(eng.predictive_variance(eng.Task(X, y), out.factors, Xs),
                               np.einsum("ij,jk,ik->i", Xs, V, Xs), rtol=1e-7)
    pi_bad = pi.copy()
    pi_bad[: n + 1] = -1e-3
    with pytest.raises(ValueError, match="improper"):
        horseshoe_state(X, y, s2, 1.0, 1.0, **flat, pi_w=pi_bad, h_w=h)


def test_latent_marginals_match_dense_and_reference():
    rng = np.random.default_rng(11)
    d, m = 9, 3
    X, y = rng.normal(size=(20, d)), rng.normal(size=20)
    P = rng.normal(size=(d, m))
    D = rng.uniform(0.3, 2.0, d)
    C = ref.correlation_matrix(P, D)
    np.testing.assert_allclose(np.diag(C), 1.0, rtol=1e-14)
    pi = 0.4 * rng.normal(size=d)
    for scale2 in (0.2, 1.3):
        Vinv = np.diag(pi) + np.linalg.inv(scale2 * C)
        if np.linalg.eigvalsh(Vinv).min() <= 0:
            with pytest.raises(ValueError, match="improper"):
                horseshoe_state(X, y, 0.5, scale2, 1.0, P, D, pi_u=pi)
            continue
        lm = horseshoe_state(X, y, 0.5, scale2, 1.0, P, D, pi_u=pi)
        V = np.linalg.inv(Vinv)
        np.testing.assert_allclose(lm.var_u, np.diag(V), rtol=1e-11)
        np.testing.assert_allclose(lm.cavity_var_u, 1.0 / (1.0 / np.diag(V) - pi), rtol=1e-9)
        expected = 0.5 * np.linalg.slogdet(V)[1] - 0.5 * np.linalg.slogdet(scale2 * C)[1]
        assert abs(lm.log_z_u - expected) < 1e-11
        twin = ref.latent_marginals(P, D, scale2, pi)
        assert abs(twin["log_z"] - expected) < 1e-11
        np.testing.assert_allclose(lm.grad_P_u, twin["grad_P"], rtol=1e-10, atol=1e-14)
        # the same sites on v (scale γ²) give the same marginals
        lv = horseshoe_state(X, y, 0.5, 1.0, scale2, P, D, pi_v=pi, pi_w=np.full(d, 1.0 / scale2))
        np.testing.assert_allclose(lv.var_v, lm.var_u, rtol=1e-13)
        np.testing.assert_allclose(lv.grad_P_v, lm.grad_P_u, rtol=1e-12, atol=1e-15)
        # eqs 36-50 against central differences (sites fixed)
        f = lambda s, PP: horseshoe_state(X, y, 0.5, s, 1.0, PP, D, pi_u=pi,
                                          pi_w=np.full(d, 1.0 / scale2)).log_z_u
        e = 1e-6
        assert abs(lm.grad_rho2 - (f(scale2 + e, P) - f(scale2 - e, P)) / (2 * e)) < 1e-7
        for i, k in [(0, 0), (4, 2), (8, 1)]:
            Pp, Pm = P.copy(), P.copy()
            Pp[i, k] += e
            Pm[i, k] -= e
            assert abs(lm.grad_P_u[i, k] - (f(scale2, Pp) - f(scale2, Pm)) / (2 * e)) < 1e-7
    with pytest.raises(ValueError, match="improper"):
        horseshoe_state(X, y, 0.5, 1.0, 1.0, P, D, pi_u=np.full(d, -50.0))


# ------------------------------------------------------------------------------ EP vs twin
@pytest.mark.parametrize("n,d,m", [(8, 12, 2), (15, 6, 1)])
def test_engine_matches_reference_twin(n, d, m):
    X, y, P, D = problem(n, d, m, seed=n)
    s2, r2, g2 = 0.2, 0.3, 1.2
    res, sites = run(X, y, s2, r2, g2, P, D, tol=1e-10)
    twin = ref.run_ep(X, y, s2, r2, g2, P, D, tol=1e-10)
    assert res.converged and twin["converged"] and isinstance(res, SweepResult)
    assert abs(res.n_sweeps - twin["n_iter"]) <= 2      # same path; the last steps see rounding
    for key in sites:
        np.testing.assert_allclose(sites[key], twin["sites"][key], rtol=1e-8,
                                   atol=1e-9 * np.max(np.abs(twin["sites"][key])))
    assert abs(res.log_z - ref.log_evidence(X, y, s2, r2, g2, P, D, twin["sites"])) < 1e-8
    assert res.log_z == float(np.sum(res.site_log_z) + res.log_z_w + res.log_z_u + res.log_z_v)
    grads = ref.evidence_gradients(X, y, s2, r2, g2, P, D, twin["sites"])
    assert abs(res.grad_sigma2 - grads["sigma2"]) < 1e-7 * max(1, abs(grads["sigma2"]))
    assert abs(res.grad_rho2 - grads["rho2"]) < 1e-7 * max(1, abs(grads["rho2"]))
    assert abs(res.grad_gamma2 - grads["gamma2"]) < 1e-7 * max(1, abs(grads["gamma2"]))
    np.testing.assert_allclose(res.grad_P_u + res.grad_P_v, grads["P"], atol=1e-7)


def test_negative_site_policies_keep_cavities_proper():
    X, y, P, D = problem(10, 20, 2, seed=5)
    res, sites = run(X, y, 0.1, 0.05, 1.0, P, D, tol=1e-9)
    assert res.converged
    # u/v sites: one of the two is negative for (almost) every feature (E[u²] = 2ν(1-t), E[v²] = 2ξt)
    assert np.any(sites["pi_u"] < 0) and np.any(sites["pi_v"] < 0)
    assert np.all(sites["pi_w"] * res.cavity_var >= -0.1 - 1e-12)          # policy 'clip'
    for cav in (res.cavity_var, res.cavity_var_u, res.cavity_var_v):
        assert np.all(cav > 0) and np.all(np.isfinite(cav))
    # where no w-site is clipped, 'clip' and 'allow' are the same EP
    X, y, P, D = problem(8, 5, 1, seed=1)
    a, sa = run(X, y, 0.3, 0.5, 1.0, P, D, tol=1e-10, negative_precision="allow")
    c, sc = run(X, y, 0.3, 0.5, 1.0, P, D, tol=1e-10, negative_precision="clip")
    assert c.n_clipped == 0 and a.converged and c.converged
    np.testing.assert_allclose(sa["pi_w"], sc["pi_w"], rtol=1e-12)
    with pytest.raises(ValueError, match="negative_precision"):
        run(X, y, 0.3, 0.5, 1.0, P, D, negative_precision="skip")


def test_damping_schedule_and_non_convergence_report():
    X, y, P, D = problem(8, 12, 2, seed=1)
    res, _ = run(X, y, 0.2, 0.3, 1.0, P, D, tol=1e-14, max_sweeps=3)
    assert not res.converged and res.status == "max_sweeps" and res.n_sweeps == 3
    assert np.isfinite(res.log_z) and res.residual > 1e-14
    # the floor keeps EP moving: a schedule 0.5·0.5^k sums to 1 and cannot get there alone
    fast_decay = dict(damping=0.5, damping_decay=0.5, tol=1e-8, max_sweeps=200)
    res, _ = run(X, y, 0.2, 0.3, 1.0, P, D, min_damping=0.0, **fast_decay)
    assert res.status == "max_sweeps" and res.residual > 1e-4
    res, _ = run(X, y, 0.2, 0.3, 1.0, P, D, min_damping=0.3, **fast_decay)
    assert res.converged and res.damping_floor == 0.3     # no stall: the floor stays


def assert_valid_state(res, sites):
    """Everything finite, the posterior marginals and every cavity proper."""
    for var in (res.var, res.var_u, res.var_v):
        assert np.all(var > 0) and np.all(np.isfinite(var))
    for cav in (res.cavity_var, res.cavity_var_u, res.cavity_var_v):
        assert np.all(cav > 0) and np.all(np.isfinite(cav))
    assert np.all(np.isfinite(res.mean)) and np.isfinite(res.log_z)
    assert all(np.all(np.isfinite(a)) for a in sites.values())


def test_stall_watch_halves_the_damping_floor():
    """With strong correlations in C a floor of 0.3 leaves a slowly contracting oscillation;
    halving the floor when 50 iterations lower the residual by less than half converges."""
    X, y, P, D = problem(10, 20, 2, seed=28)
    P = P / 0.4                                     # |C_ij| up to ~0.9
    off, _ = run(X, y, 0.05, 0.3, 1.0, P, D, tol=1e-9, max_sweeps=600, stall_window=10 ** 9)
    assert off.status == "max_sweeps" and off.damping_floor == 0.3
    on, sites = run(X, y, 0.05, 0.3, 1.0, P, D, tol=1e-9, max_sweeps=600)
    assert on.converged and on.damping_floor < 0.3 and on.n_sweeps < 600
    assert_valid_state(on, sites)


def test_held_decreases_and_stuck_policy():
    """When no halved step keeps every cavity proper, the site-precision decreases are held
    back for that iteration (EP still converges here); with C correlating features so strongly
    that the targets lie outside the proper region, EP stops as 'stuck' after max_held such
    iterations in a row, with the last valid state (finite, proper, never NaN)."""
    X, y, P, D = problem(10, 20, 2, seed=0)
    res, sites = run(X, y, 0.1, 0.05, 1.0, P / 0.4, D, tol=1e-9)
    assert res.converged and res.n_held_iter > 0
    assert_valid_state(res, sites)
    X, y, P, D = problem(10, 20, 2, seed=16)
    res, sites = run(X, y, 0.1, 0.05, 1.0, 3 * P / 0.4, D, tol=1e-9, max_held=25)
    assert res.status == "stuck" and res.stuck and not res.converged and res.residual > 1e-3
    assert res.n_held_iter > 25 and res.n_held > 0
    assert_valid_state(res, sites)


# ------------------------------------------------------------------------------ evidence
def _exact_log_evidence(X, y, s2, tau2, h=0.05):
    """log ∫ N(y | Xw, s2 I) Π_j HS(w_j | τ) dw, by a tensor trapezoidal rule over log λ_j
    (given λ, y ~ N(0, s2 I + τ² X diag(λ²) Xᵀ); λ_j ~ C⁺(0, 1))."""
    n, d = X.shape
    s = np.arange(-18.0, 12.0, h)
    log_hc = np.log(2 / np.pi) + s - np.logaddexp(0, 2 * s)   # C⁺(λ) λ in ds
    grids = np.meshgrid(*([s] * d), indexing="ij")
    lam2 = [np.exp(2 * g).ravel() for g in grids]
    G = X.T @ X / s2
    b = X.T @ y / s2
    if d == 1:
        A = 1.0 / (tau2 * lam2[0]) + G[0, 0]                  # s2⁻¹(s2 D⁻¹ + XᵀX)
        logdet = np.log(A) + np.log(tau2 * lam2[0])
        quad = b[0] ** 2 / A
    else:
        a11 = 1.0 / (tau2 * lam2[0]) + G[0, 0]
        a22 = 1.0 / (tau2 * lam2[1]) + G[1, 1]
        a12 = G[0, 1]
        det = a11 * a22 - a12 ** 2
        logdet = np.log(det) + np.log(tau2 * lam2[0]) + np.log(tau2 * lam2[1])
        quad = (a22 * b[0] ** 2 - 2 * a12 * b[0] * b[1] + a11 * b[1] ** 2) / det
    # log N(y | 0, s2 I + X D Xᵀ) by the determinant lemma and Woodbury
    log_lik = -0.5 * (n * np.log(2 * np.pi * s2) + logdet + y @ y / s2 - quad)
    log_prior = sum(np.ravel(lh) for lh in np.meshgrid(*([log_hc] * d), indexing="ij"))
    g = log_lik + log_prior
    top = g.max()
    return float(np.log(np.sum(np.exp(g - top)) * h ** d) + top)


def test_one_feature_evidence_is_exact():
    """With one feature there is one non-Gaussian factor, whose cavity is exact: EP's eq (27)
    must equal the exact evidence."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(3, 1))
    y = 1.5 * X[:, 0] + 0.5 * rng.normal(size=3)
    for s2, r2, g2 in [(0.3, 0.5, 1.0), (0.05, 2.0, 0.5)]:
        res, _ = run(X, y, s2, r2, g2, np.zeros((1, 0)), np.ones(1), tol=1e-12, max_sweeps=3000)
        assert res.converged
        assert abs(res.log_z - _exact_log_evidence(X, y, s2, r2 / g2)) < 1e-8


def test_two_feature_evidence_is_close_to_exact():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3, 2))
    y = X @ np.array([1.5, 0.0]) + 0.5 * rng.normal(size=3)
    res, _ = run(X, y, 0.3, 0.5, 1.0, np.zeros((2, 0)), np.ones(2), tol=1e-12, max_sweeps=3000)
    exact = _exact_log_evidence(X, y, 0.3, 0.5)
    assert res.converged
    assert abs(res.log_z - exact) < 1e-2       # EP is approximate here (observed 1.4e-3)


def test_evidence_gradients_match_finite_differences():
    """eqs 33-50 against central differences of eq (27), EP converged to 1e-12 from a cold
    start at every point, negative w-sites allowed (an exact EP fixed point)."""
    X, y, P, D = problem(8, 10, 2, seed=3)
    s2, r2, g2 = 0.2, 0.3, 1.2

    def log_z(s2_=s2, r2_=r2, g2_=g2, P_=P):
        res, _ = run(X, y, s2_, r2_, g2_, P_, D, tol=1e-12, max_sweeps=5000, negative_precision="allow")
        assert res.converged
        return res

    base = log_z()
    e = 1e-4
    grad_s2 = (log_z(s2_=s2 * (1 + e)).log_z - log_z(s2_=s2 * (1 - e)).log_z) / (2 * e * s2)
    grad_r2 = (log_z(r2_=r2 * (1 + e)).log_z - log_z(r2_=r2 * (1 - e)).log_z) / (2 * e * r2)
    grad_g2 = (log_z(g2_=g2 * (1 + e)).log_z - log_z(g2_=g2 * (1 - e)).log_z) / (2 * e * g2)
    assert abs(base.grad_sigma2 - grad_s2) < 1e-6 * max(1, abs(grad_s2))
    assert abs(base.grad_rho2 - grad_r2) < 1e-6 * max(1, abs(grad_r2))
    assert abs(base.grad_gamma2 - grad_g2) < 1e-6 * max(1, abs(grad_g2))
    # the evidence depends on ρ² and γ² only through ρ²/γ²
    assert abs(r2 * base.grad_rho2 + g2 * base.grad_gamma2) < 1e-10
    grad_P = base.grad_P_u + base.grad_P_v
    for i, k in [(0, 0), (6, 1)]:
        Pp, Pm = P.copy(), P.copy()
        Pp[i, k] += e
        Pm[i, k] -= e
        fd = (log_z(P_=Pp).log_z - log_z(P_=Pm).log_z) / (2 * e)
        assert abs(grad_P[i, k] - fd) < 1e-6 * max(1, abs(fd))


# ------------------------------------------------------------------------------ the engine contract
def _engine(seed=1, n=8, d=12, m=2, **options):
    X, y, P, D = problem(n, d, m, seed=seed)
    return HorseshoeEP(X, y, 0.2, HorseshoePrior(0.3, 1.0, P, D), horseshoe_options(**options))


def test_options_are_frozen_validated_and_picklable():
    opts = HorseshoeOptions(tol=1e-6, n_threads=None)
    assert opts.n_threads == 0 and opts.tol == 1e-6 and opts.negative_precision == "clip"
    with pytest.raises(AttributeError):
        opts.tol = 1.0
    changed = opts.replace(max_sweeps=5)
    assert changed.max_sweeps == 5 and opts.max_sweeps == 1000 and changed.tol == opts.tol
    assert pickle.loads(pickle.dumps(opts)) == opts and opts != changed
    with pytest.raises(TypeError, match="unknown"):
        opts.replace(tolerance=1.0)
    for bad in (dict(tol=-1.0), dict(max_sweeps=-1), dict(negative_precision="skip"), dict(n_threads=-1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            HorseshoeOptions(**bad)
    for bad in (dict(damping=0.0), dict(min_damping=1.5), dict(stall_window=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            HorseshoeDamping(**bad)
    schedule = HorseshoeDamping(damping=0.25, stall_window=7)
    slow = opts.replace(damping_schedule=schedule)
    assert (slow.damping, slow.stall_window, slow.min_damping) == (0.25, 7, 0.3) and slow.damping_schedule == schedule
    assert pickle.loads(pickle.dumps(slow)) == slow and len(HorseshoeOptions._FIELDS) <= 8


def test_result_is_a_typed_read_only_sweep_result():
    engine = _engine(tol=1e-9)
    res = engine.run()
    assert isinstance(res, HorseshoeResult) and isinstance(res, SweepResult)
    assert res.converged and res.status == "converged" and res.residual == res.max_change < 1e-9
    assert set(res.as_dict()) == set(SweepResult._FIELDS) | set(HorseshoeResult.__slots__)
    with pytest.raises(AttributeError):
        res.log_z = 0.0
    assert pickle.loads(pickle.dumps(res)) == res
    other = res.replace(status="max_sweeps")
    assert other.status == "max_sweeps" and res.status == "converged" and other != res
    np.testing.assert_array_equal(res.sites["pi_w"], res.pi_w)
    # the engine holds the sites it ended at; a second run starts there and stops at once
    np.testing.assert_array_equal(engine.pi_w, res.pi_w)
    again = engine.run()
    assert again.n_sweeps == 0 and again.converged and again.log_z == res.log_z
    # a fresh engine on the same problem repeats the run bit for bit
    assert _engine(tol=1e-9).run() == res


def test_starting_sites_are_copied_and_validated():
    X, y, P, D = problem(8, 12, 2, seed=1)
    prior = HorseshoePrior(0.3, 1.0, P, D)
    start = {k: v.copy() for k, v in run(X, y, 0.2, 0.3, 1.0, P, D, max_sweeps=5)[1].items()}
    kept = {k: v.copy() for k, v in start.items()}
    HorseshoeEP(X, y, 0.2, prior, sites=start).run()
    for key in start:
        np.testing.assert_array_equal(start[key], kept[key])
    with pytest.raises(ValueError, match="sites"):
        HorseshoeEP(X, y, 0.2, prior, sites={**start, "h_w": np.zeros(3)})
    with pytest.raises(ValueError, match="improper"):
        HorseshoeEP(X, y, 0.2, prior, sites={**start, "pi_w": np.full(12, -1e3)}).run()
    with pytest.raises(ValueError, match="features"):
        HorseshoeEP(X[:, :5], y, 0.2, prior)


def test_callback_stops_the_run_and_an_exception_restores_the_sites():
    seen = []

    def stop_at_three(iteration, residual, log_z):
        seen.append((iteration, residual))
        return iteration < 3

    res = _engine(tol=1e-12).run(sweep_callback=stop_at_three)
    assert res.status == "stopped" and res.stopped and not res.converged and res.n_sweeps == 3
    assert [i for i, _ in seen] == [1, 2, 3] and seen[-1][1] == res.residual
    engine = _engine(tol=1e-12)
    start = engine.pi_w.copy()

    def fail(iteration, residual, log_z):
        if iteration == 4:
            raise RuntimeError("from the callback")

    with pytest.raises(RuntimeError, match="from the callback"):
        engine.run(sweep_callback=fail)
    np.testing.assert_array_equal(engine.pi_w, start)


def test_ctrl_c_stops_the_run_and_restores_the_sites():
    """A SIGINT seen by Python while the engine iterates (the engine polls the signal handlers
    between iterations) ends the run with KeyboardInterrupt and the engine's sites as they were."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        engine = _engine(tol=0.0, max_sweeps=10 ** 6)
        start = engine.pi_w.copy()
        marks = queue.SimpleQueue()            # put() runs no Python frame: only the engine's polling sees the signal

        def interrupt_after_the_first_iteration():
            marks.get(timeout=300)
            _thread.interrupt_main()

        thread = threading.Thread(target=interrupt_after_the_first_iteration, daemon=True)
        thread.start()
        with pytest.raises(KeyboardInterrupt):
            engine.run(sweep_callback=marks.put)
        thread.join(timeout=300)
        np.testing.assert_array_equal(engine.pi_w, start)
        assert _engine(tol=1e-9).run().converged              # and EP still works afterwards
    finally:
        signal.signal(signal.SIGINT, previous)


def test_threads_do_not_change_the_result():
    X, y, P, D = problem(20, 700, 0, seed=2)
    prior = HorseshoePrior(1e-3, 1.0, P, D)
    one = HorseshoeEP(X, y, 0.2, prior, HorseshoeOptions(n_threads=1, max_sweeps=20)).run()
    two = HorseshoeEP(X, y, 0.2, prior, HorseshoeOptions(n_threads=2, max_sweeps=20)).run()
    assert one == two


@pytest.mark.downstream
def test_downstream_cython_can_cimport_the_horseshoe_engine(tmp_path):
    src = tmp_path / "downstream_horseshoe.pyx"
    src.write_text(textwrap.dedent("""
        # cython: language_level=3
        from fastep._epcore.horseshoe_ep cimport HorseshoeEP, HorseshoeOptions, HorseshoePrior
        from fastep._epcore.horseshoe cimport SiteState, SiteTargets, site_targets, tilted_moments_one
        from fastep._epcore.horseshoe_marginals cimport Sites, Marginals, MarginalsWork, marginals

        def describe(HorseshoeEP engine):
            cdef HorseshoeOptions opts = engine.options
            cdef HorseshoePrior prior = engine.prior
            return engine.n, engine.d, opts.tol, opts.max_sweeps, prior.m
    """))
    res = subprocess.run(
        [sys.executable, "-m", "cython", "-3", "-I", fastep.get_include(), str(src), "-o", str(tmp_path / "out.c")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "out.c").stat().st_size > 0
