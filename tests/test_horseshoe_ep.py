"""Horseshoe EP engine (fastep._horseshoe.parallel_ep) against dense linear algebra, its reference twin,
exact evidences by numerical integration and finite differences (supplement eqs 2-50)."""
import numpy as np
import pytest

from fastep._horseshoe import parallel_ep as eng

from fastep.reference import horseshoe as ref


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
    task = eng.Task(X, y)
    sites = eng.initial_sites(X.shape[1], r2, g2)
    res = eng.run_task_ep(task, s2, r2, g2, eng.CorrelationFactors(P, D), sites, **options)
    return res, sites


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
    out = eng.w_marginals(eng.Task(X, y), s2, pi, h, keep_factors=True)
    prec = np.diag(pi) + X.T @ X / s2
    V = np.linalg.inv(prec)
    b = h + X.T @ y / s2
    mu = V @ b
    np.testing.assert_allclose(out["var"], np.diag(V), rtol=1e-9)
    np.testing.assert_allclose(out["mean"], mu, rtol=1e-9, atol=1e-12)
    log_z = (-0.5 * n * np.log(2 * np.pi * s2) - y @ y / (2 * s2) + 0.5 * d * np.log(2 * np.pi)
             - 0.5 * np.linalg.slogdet(prec)[1] + 0.5 * b @ mu)
    assert abs(out["log_z"] - log_z) < 1e-9 * max(1.0, abs(log_z))
    # cavities (eq 14) computed without the cancellation of 1/V_jj - π_j
    np.testing.assert_allclose(out["cav_prec"], 1.0 / np.diag(V) - pi, rtol=1e-6)
    cav_mean = (mu / np.diag(V) - h) / (1.0 / np.diag(V) - pi)
    np.testing.assert_allclose(out["cav_mean"], cav_mean, rtol=1e-6, atol=1e-9)
    # predictive variances x*ᵀ V x*
    Xs = rng.normal(size=(4, d))
    np.testing.assert_allclose(eng.predictive_variance(eng.Task(X, y), out["factors"], Xs),
                               np.einsum("ij,jk,ik->i", Xs, V, Xs), rtol=1e-8)
    # σ² gradient against a central difference with the sites fixed
    f = lambda s: eng.w_marginals(eng.Task(X, y), s, pi, h)["log_z"]
    fd = (f(s2 * (1 + 1e-5)) - f(s2 * (1 - 1e-5))) / (2e-5 * s2)
    assert abs(out["grad_sigma2"] - fd) < 1e-5 * max(1.0, abs(fd))
    # an indefinite precision is reported as invalid
    assert eng.w_marginals(eng.Task(X, y), s2, np.full(d, -100.0), h) is None


def test_split_set_is_capped_at_n_and_stays_exact():
    """More than n features with small site precisions (an EP transient at large d): S keeps
    those below HARD_SPLIT and the smallest ratios up to n, the rest go to B; the marginals
    still match the dense inverse (ratios >= 1e-7 cost a few digits at most). More than n
    non-positive precisions make Π + XᵀX/σ² indefinite: reported as invalid."""
    rng = np.random.default_rng(3)
    n, d, s2 = 6, 40, 0.3
    X = rng.normal(size=(n, d))
    y = rng.normal(size=n)
    task = eng.Task(X, y)
    data_prec = task.col_sq / s2
    pi = rng.uniform(0.5, 3.0, d)
    pi[:14] = data_prec[:14] * np.geomspace(1e-7, 5e-5, 14)     # 14 > n qualify for S
    pi[3] = 1e-12 * data_prec[3]                                 # below HARD_SPLIT
    h = rng.normal(size=d)
    in_s = eng.split_set(task, s2, pi)
    assert in_s.sum() == n and in_s[3] and np.all(in_s[:n]) and not np.any(in_s[14:])
    out = eng.w_marginals(task, s2, pi, h, keep_factors=True)
    V = np.linalg.inv(np.diag(pi) + X.T @ X / s2)
    mu = V @ (h + X.T @ y / s2)
    np.testing.assert_allclose(out["var"], np.diag(V), rtol=1e-7)
    np.testing.assert_allclose(out["mean"], mu, rtol=1e-7, atol=1e-9 * np.abs(mu).max())
    np.testing.assert_allclose(out["cav_prec"], 1.0 / np.diag(V) - pi, rtol=1e-5)
    Xs = rng.normal(size=(3, d))
    np.testing.assert_allclose(eng.predictive_variance(task, out["factors"], Xs),
                               np.einsum("ij,jk,ik->i", Xs, V, Xs), rtol=1e-7)
    pi_bad = pi.copy()
    pi_bad[: n + 1] = -1e-3
    assert eng.split_set(task, s2, pi_bad) is None and eng.w_marginals(task, s2, pi_bad, h) is None


def test_latent_marginals_match_dense_and_reference():
    rng = np.random.default_rng(11)
    d, m = 9, 3
    P = rng.normal(size=(d, m))
    D = rng.uniform(0.3, 2.0, d)
    C = ref.correlation_matrix(P, D)
    np.testing.assert_allclose(np.diag(C), 1.0, rtol=1e-14)
    pi = 0.4 * rng.normal(size=d)
    for scale2 in (0.2, 1.3):
        lm = eng.latent_marginals(eng.CorrelationFactors(P, D), scale2, pi, gradients=True)
        Vinv = np.diag(pi) + np.linalg.inv(scale2 * C)
        if np.linalg.eigvalsh(Vinv).min() <= 0:
            assert lm is None
            continue
        V = np.linalg.inv(Vinv)
        np.testing.assert_allclose(lm["var"], np.diag(V), rtol=1e-11)
        np.testing.assert_allclose(lm["cav_var"], 1.0 / (1.0 / np.diag(V) - pi), rtol=1e-9)
        expected = 0.5 * np.linalg.slogdet(V)[1] - 0.5 * np.linalg.slogdet(scale2 * C)[1]
        assert abs(lm["log_z"] - expected) < 1e-11
        twin = ref.latent_marginals(P, D, scale2, pi)
        assert abs(twin["log_z"] - expected) < 1e-11
        np.testing.assert_allclose(lm["grad_P"], twin["grad_P"], rtol=1e-10, atol=1e-14)
        # eqs 36-50 against central differences (sites fixed)
        f = lambda s, PP: eng.latent_marginals(eng.CorrelationFactors(PP, D), s, pi)["log_z"]
        e = 1e-6
        assert abs(lm["grad_scale2"] - (f(scale2 + e, P) - f(scale2 - e, P)) / (2 * e)) < 1e-7
        for i, k in [(0, 0), (4, 2), (8, 1)]:
            Pp, Pm = P.copy(), P.copy()
            Pp[i, k] += e
            Pm[i, k] -= e
            assert abs(lm["grad_P"][i, k] - (f(scale2, Pp) - f(scale2, Pm)) / (2 * e)) < 1e-7
    assert eng.latent_marginals(eng.CorrelationFactors(P, D), 1.0, np.full(d, -50.0)) is None


# ------------------------------------------------------------------------------ EP vs twin
@pytest.mark.parametrize("n,d,m", [(8, 12, 2), (15, 6, 1)])
def test_engine_matches_reference_twin(n, d, m):
    X, y, P, D = problem(n, d, m, seed=n)
    s2, r2, g2 = 0.2, 0.3, 1.2
    res, sites = run(X, y, s2, r2, g2, P, D, tol=1e-10)
    twin = ref.run_ep(X, y, s2, r2, g2, P, D, tol=1e-10)
    assert res["converged"] and twin["converged"]
    assert abs(res["n_iter"] - twin["n_iter"]) <= 2      # same path; the last steps see rounding
    for key in sites:
        np.testing.assert_allclose(sites[key], twin["sites"][key], rtol=1e-8,
                                   atol=1e-9 * np.max(np.abs(twin["sites"][key])))
    assert abs(res["log_z"] - ref.log_evidence(X, y, s2, r2, g2, P, D, twin["sites"])) < 1e-8
    grads = ref.evidence_gradients(X, y, s2, r2, g2, P, D, twin["sites"])
    st = res["state"]
    assert abs(st["w"]["grad_sigma2"] - grads["sigma2"]) < 1e-7 * max(1, abs(grads["sigma2"]))
    assert abs(st["u"]["grad_scale2"] - grads["rho2"]) < 1e-7 * max(1, abs(grads["rho2"]))
    assert abs(st["v"]["grad_scale2"] - grads["gamma2"]) < 1e-7 * max(1, abs(grads["gamma2"]))
    np.testing.assert_allclose(st["u"]["grad_P"] + st["v"]["grad_P"], grads["P"], atol=1e-7)


def st_cav(res):
    return res["state"]["cav_var"]


def test_negative_site_policies_keep_cavities_proper():
    X, y, P, D = problem(10, 20, 2, seed=5)
    res, sites = run(X, y, 0.1, 0.05, 1.0, P, D, tol=1e-9)
    assert res["converged"]
    # u/v sites: one of the two is negative for (almost) every feature (E[u²] = 2ν(1-t), E[v²] = 2ξt)
    assert np.any(sites["pi_u"] < 0) and np.any(sites["pi_v"] < 0)
    assert np.all(sites["pi_w"] * st_cav(res) >= -0.1 - 1e-12)          # policy 'clip'
    st = res["state"]
    for cav in (st["cav_var"], st["u"]["cav_var"], st["v"]["cav_var"]):
        assert np.all(cav > 0) and np.all(np.isfinite(cav))
    # where no w-site is clipped, 'clip' and 'allow' are the same EP
    X, y, P, D = problem(8, 5, 1, seed=1)
    a, sa = run(X, y, 0.3, 0.5, 1.0, P, D, tol=1e-10, negative_precision="allow")
    c, sc = run(X, y, 0.3, 0.5, 1.0, P, D, tol=1e-10, negative_precision="clip")
    assert c["n_clipped"] == 0 and a["converged"] and c["converged"]
    np.testing.assert_allclose(sa["pi_w"], sc["pi_w"], rtol=1e-12)
    with pytest.raises(ValueError, match="negative_precision"):
        run(X, y, 0.3, 0.5, 1.0, P, D, negative_precision="skip")


def test_damping_schedule_and_non_convergence_report():
    X, y, P, D = problem(8, 12, 2, seed=1)
    res, _ = run(X, y, 0.2, 0.3, 1.0, P, D, tol=1e-14, max_iter=3)
    assert not res["converged"] and res["status"] == "max_iter" and res["n_iter"] == 3
    assert np.isfinite(res["log_z"]) and res["residual"] > 1e-14
    # the floor keeps EP moving: a schedule 0.5·0.5^k sums to 1 and cannot get there alone
    fast_decay = dict(damping=0.5, damping_decay=0.5, tol=1e-8, max_iter=200)
    res, _ = run(X, y, 0.2, 0.3, 1.0, P, D, min_damping=0.0, **fast_decay)
    assert res["status"] == "max_iter" and res["residual"] > 1e-4
    res, _ = run(X, y, 0.2, 0.3, 1.0, P, D, min_damping=0.3, **fast_decay)
    assert res["converged"] and res["min_damping"] == 0.3     # no stall: the floor stays


def assert_valid_state(res, sites):
    """Everything finite, the posterior marginals and every cavity proper."""
    st = res["state"]
    for part in ("w", "u", "v"):
        assert np.all(st[part]["var"] > 0) and np.all(np.isfinite(st[part]["var"]))
    for cav in (st["cav_var"], st["u"]["cav_var"], st["v"]["cav_var"]):
        assert np.all(cav > 0) and np.all(np.isfinite(cav))
    assert np.all(np.isfinite(st["w"]["mean"])) and np.isfinite(res["log_z"])
    assert all(np.all(np.isfinite(a)) for a in sites.values())


def test_stall_watch_halves_the_damping_floor():
    """With strong correlations in C a floor of 0.3 leaves a slowly contracting oscillation;
    halving the floor when 50 iterations lower the residual by less than half converges."""
    X, y, P, D = problem(10, 20, 2, seed=28)
    P = P / 0.4                                     # |C_ij| up to ~0.9
    off, _ = run(X, y, 0.05, 0.3, 1.0, P, D, tol=1e-9, max_iter=600, stall_window=10 ** 9)
    assert off["status"] == "max_iter" and off["min_damping"] == 0.3
    on, sites = run(X, y, 0.05, 0.3, 1.0, P, D, tol=1e-9, max_iter=600)
    assert on["converged"] and on["min_damping"] < 0.3 and on["n_iter"] < 600
    assert_valid_state(on, sites)


def test_held_decreases_and_stuck_policy():
    """When no halved step keeps every cavity proper, the site-precision decreases are held
    back for that iteration (EP still converges here); with C correlating features so strongly
    that the targets lie outside the proper region, EP stops as 'stuck' after max_held such
    iterations in a row, with the last valid state (finite, proper, never NaN)."""
    X, y, P, D = problem(10, 20, 2, seed=0)
    res, sites = run(X, y, 0.1, 0.05, 1.0, P / 0.4, D, tol=1e-9)
    assert res["converged"] and res["n_held_iter"] > 0
    assert_valid_state(res, sites)
    X, y, P, D = problem(10, 20, 2, seed=16)
    res, sites = run(X, y, 0.1, 0.05, 1.0, 3 * P / 0.4, D, tol=1e-9, max_held=25)
    assert res["status"] == "stuck" and not res["converged"] and res["residual"] > 1e-3
    assert res["n_held_iter"] > 25 and res["n_held"] > 0
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
        res, _ = run(X, y, s2, r2, g2, np.zeros((1, 0)), np.ones(1), tol=1e-12, max_iter=3000)
        assert res["converged"]
        assert abs(res["log_z"] - _exact_log_evidence(X, y, s2, r2 / g2)) < 1e-8


def test_two_feature_evidence_is_close_to_exact():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3, 2))
    y = X @ np.array([1.5, 0.0]) + 0.5 * rng.normal(size=3)
    res, _ = run(X, y, 0.3, 0.5, 1.0, np.zeros((2, 0)), np.ones(2), tol=1e-12, max_iter=3000)
    exact = _exact_log_evidence(X, y, 0.3, 0.5)
    assert res["converged"]
    assert abs(res["log_z"] - exact) < 1e-2       # EP is approximate here (observed 1.4e-3)


def test_evidence_gradients_match_finite_differences():
    """eqs 33-50 against central differences of eq (27), EP converged to 1e-12 from a cold
    start at every point, negative w-sites allowed (an exact EP fixed point)."""
    X, y, P, D = problem(8, 10, 2, seed=3)
    s2, r2, g2 = 0.2, 0.3, 1.2

    def log_z(s2_=s2, r2_=r2, g2_=g2, P_=P):
        res, _ = run(X, y, s2_, r2_, g2_, P_, D, tol=1e-12, max_iter=5000, negative_precision="allow")
        assert res["converged"]
        return res

    base = log_z()["state"]
    e = 1e-4
    grad_s2 = (log_z(s2_=s2 * (1 + e))["log_z"] - log_z(s2_=s2 * (1 - e))["log_z"]) / (2 * e * s2)
    grad_r2 = (log_z(r2_=r2 * (1 + e))["log_z"] - log_z(r2_=r2 * (1 - e))["log_z"]) / (2 * e * r2)
    grad_g2 = (log_z(g2_=g2 * (1 + e))["log_z"] - log_z(g2_=g2 * (1 - e))["log_z"]) / (2 * e * g2)
    assert abs(base["w"]["grad_sigma2"] - grad_s2) < 1e-6 * max(1, abs(grad_s2))
    assert abs(base["u"]["grad_scale2"] - grad_r2) < 1e-6 * max(1, abs(grad_r2))
    assert abs(base["v"]["grad_scale2"] - grad_g2) < 1e-6 * max(1, abs(grad_g2))
    # the evidence depends on ρ² and γ² only through ρ²/γ²
    assert abs(r2 * base["u"]["grad_scale2"] + g2 * base["v"]["grad_scale2"]) < 1e-10
    grad_P = base["u"]["grad_P"] + base["v"]["grad_P"]
    for i, k in [(0, 0), (6, 1)]:
        Pp, Pm = P.copy(), P.copy()
        Pp[i, k] += e
        Pm[i, k] -= e
        fd = (log_z(P_=Pp)["log_z"] - log_z(P_=Pm)["log_z"]) / (2 * e)
        assert abs(grad_P[i, k] - fd) < 1e-6 * max(1, abs(fd))
