"""Dense GP EP engine (fastep._epcore.gp_ep): closed forms, schedule/order agreement, invariants, errors.

Oracles: numpy/scipy written here (Gaussian-likelihood posterior and evidence, the EP invariant,
a Python splitmix64 for the random order) and the reference twin fastep.reference.gp_ep.
"""
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import integrate, stats

import fastep
from engine_helpers import dense_incremental_sweep, run_gp_ep
from fastep._epcore import gp_ep as engine
from fastep.kernels import RBF
from fastep.reference import gp_ep as ref
from fastep.reference import sites as ref_sites

SEQ, PAR, BLK = engine.SCHEDULE_SEQUENTIAL, engine.SCHEDULE_PARALLEL, engine.SCHEDULE_BLOCKED
FIXED, RANDOM, ENTROPY = engine.ORDER_FIXED, engine.ORDER_RANDOM, engine.ORDER_ENTROPY


# the engines and twins make many small sequential BLAS calls (conftest.one_blas_thread)
pytestmark = pytest.mark.usefixtures("one_blas_thread")


# --------------------------------------------------------------------------------------------
# problems and helpers
# --------------------------------------------------------------------------------------------

def rbf_problem(n, seed, variance=1.5, inverse_width=1.0, jitter=1e-8):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 2))
    K = np.ascontiguousarray(RBF(variance=variance, inverse_width=inverse_width)(X))
    K.flat[:: n + 1] += jitter
    y = np.where(np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.4 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return K, y


def benchmark_problem(n):
    """The dense-GP toy of the benchmarks (2-D inputs, sine boundary, label noise): deterministic."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, size=(n, 2))
    f = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1]
    y = np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    K = np.ascontiguousarray(RBF(variance=1.0, inverse_width=1.0)(X))
    return K, y


def run(K, y, spec, tau0=None, nu0=None, **options):
    n = len(y)
    tau = np.zeros(n) if tau0 is None else np.array(tau0, dtype=float)
    nu = np.zeros(n) if nu0 is None else np.array(nu0, dtype=float)
    post_cov, post_mean = np.empty((n, n)), np.empty(n)
    info = run_gp_ep(K, y, spec, tau, nu, post_cov, post_mean, **options)
    return tau, nu, post_cov, post_mean, info


def refactored(K, tau, nu):
    n = len(tau)
    S, m = np.empty((n, n)), np.empty(n)
    engine.refactor_posterior(K, tau, nu, S, m)
    return S, m


def close(a, b):
    """Max abs difference relative to max(1, max |b|)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return np.max(np.abs(a - b)) / max(1.0, np.max(np.abs(b))) if a.size else 0.0


def probit_moments(y, mu, s2):
    return ref_sites.probit_moments(y, mu, s2)


def logistic_moments(y, mu, s2):
    return ref_sites.logistic_mackay_moments(y, mu, s2)


LIKELIHOODS = {"probit": (fastep.Probit(), probit_moments),
               "logistic": (fastep.Logistic(), logistic_moments)}


def gaussian_posterior(K, y, s2):
    """Exact GP regression posterior and evidence (numpy/scipy oracle)."""
    n = len(y)
    C = K + s2 * np.eye(n)
    Sigma = K - K @ np.linalg.solve(C, K)
    mu = K @ np.linalg.solve(C, y)
    log_z = stats.multivariate_normal(np.zeros(n), C).logpdf(y)
    return Sigma, mu, log_z


_MASK = (1 << 64) - 1


def splitmix64_permutations(n, seed, sweeps):
    """Python twin of the engine's ORDER_RANDOM: splitmix64 + Fisher-Yates, one permutation per sweep."""
    state = seed & _MASK
    perms = []
    for _ in range(sweeps):
        perm = list(range(n))
        for i in range(n - 1, 0, -1):
            state = (state + 0x9E3779B97F4A7C15) & _MASK
            z = state
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
            z ^= z >> 31
            j = z % (i + 1)
            perm[i], perm[j] = perm[j], perm[i]
        perms.append(perm)
    return perms


def test_module_constants():
    assert (SEQ, PAR, BLK) == (0, 1, 2)
    assert (FIXED, RANDOM, ENTROPY) == (0, 1, 2)
    assert (engine.NEGATIVE_CLIP, engine.NEGATIVE_SKIP, engine.NEGATIVE_ALLOW) == (0, 1, 2)
    assert all(type(v) is int for v in (SEQ, PAR, BLK, FIXED, RANDOM, ENTROPY, engine.NEGATIVE_ALLOW))


# --------------------------------------------------------------------------------------------
# (a) Gaussian likelihood: one sweep is exact
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule, block_size", [(SEQ, 0), (BLK, 0), (BLK, 7), (PAR, 0)])
@pytest.mark.parametrize("n", [1, 13, 60])
def test_gaussian_likelihood_one_sweep_is_exact(n, schedule, block_size):
    rng = np.random.default_rng(n)
    K, _ = rbf_problem(n, seed=n)
    y = rng.standard_normal(n)
    s2 = 0.3
    spec = fastep.Gaussian(noise_variance=s2).site_spec()
    tau, nu, S, m, info = run(K, y, spec, schedule=schedule, block_size=block_size, max_sweeps=1)
    Sigma, mu, log_z = gaussian_posterior(K, y, s2)
    assert info.n_sweeps == 1 and info.n_failed == 0 and info.n_clipped == 0
    np.testing.assert_allclose(tau, 1.0 / s2, rtol=1e-13)
    np.testing.assert_allclose(nu, y / s2, rtol=1e-13)
    assert close(S, Sigma) < 1e-10
    assert close(m, mu) < 1e-10
    assert abs(info.log_z - log_z) < 1e-10 * max(1.0, abs(log_z))
    assert np.array_equal(S, S.T)


def test_gaussian_likelihood_converges_in_two_sweeps():
    K, _ = rbf_problem(30, seed=1)
    y = np.random.default_rng(2).standard_normal(30)
    spec = fastep.Gaussian(noise_variance=0.5).site_spec()
    *_, info = run(K, y, spec)
    assert info.converged and info.n_sweeps == 2 and info.max_change < 1e-12
    log_z = gaussian_posterior(K, y, 0.5)[2]
    assert abs(engine.log_marginal_likelihood(K, y, spec, np.full(30, 2.0), 2.0 * y) - log_z) < 1e-10 * abs(log_z)


# --------------------------------------------------------------------------------------------
# (b) all schedules reach the same fixed point
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("likelihood", LIKELIHOODS)
def test_schedules_reach_the_same_fixed_point(likelihood):
    n = 45
    K, y = rbf_problem(n, seed=11)
    lik, moments = LIKELIHOODS[likelihood]
    spec = lik.site_spec()
    base = run(K, y, spec, schedule=SEQ, tol=1e-11, max_sweeps=300)
    assert base[4].converged
    variants = [dict(schedule=BLK, block_size=k) for k in (0, 1, 3, 16, n, n + 10)]
    variants += [dict(schedule=PAR, damping=0.5), dict(schedule=PAR, damping=1.0)]
    for options in variants:
        tau, nu, S, m, info = run(K, y, spec, tol=1e-11, max_sweeps=300, **options)
        assert info.converged, options
        assert info.n_failed == 0
        assert close(tau, base[0]) < 1e-8, options
        assert close(nu, base[1]) < 1e-8, options
        assert close(S, base[2]) < 1e-8, options
        assert close(m, base[3]) < 1e-8, options
        assert abs(info.log_z - base[4].log_z) < 1e-8 * abs(base[4].log_z), options
    # the reference twin's fixed point
    r = ref.run_gp_ep(K, y, moments, tol=1e-11, max_sweeps=300)
    assert r["converged"]
    assert close(base[0], r["site_precision"]) < 1e-8 and close(base[1], r["site_natural_mean"]) < 1e-8
    assert abs(base[4].log_z - r["log_z"]) < 1e-8 * abs(r["log_z"])


def test_block_sizes_reported():
    K, y = rbf_problem(20, seed=3)
    spec = fastep.Probit().site_spec()
    assert run(K, y, spec, schedule=BLK, block_size=5, max_sweeps=1)[4].block_size == 5
    assert run(K, y, spec, schedule=BLK, block_size=500, max_sweeps=1)[4].block_size == 20
    assert run(K, y, spec, schedule=BLK, max_sweeps=1)[4].block_size == engine.auto_block_size(20)
    assert run(K, y, spec, schedule=SEQ, max_sweeps=1)[4].block_size == 1
    assert run(K, y, spec, schedule=PAR, max_sweeps=1)[4].block_size == 0
    assert engine.auto_block_size(2000) >= 16


# --------------------------------------------------------------------------------------------
# trajectories against the reference twin
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, ref_options", [
    (dict(schedule=SEQ), dict(schedule="sequential")),
    (dict(schedule=BLK, block_size=4), dict(schedule="sequential")),
    (dict(schedule=SEQ, damping=0.6), dict(schedule="sequential", damping=0.6)),
    (dict(schedule=BLK, order=ENTROPY, block_size=5), dict(schedule="sequential", order="entropy")),
    (dict(schedule=SEQ, order=ENTROPY), dict(schedule="sequential", order="entropy")),
    (dict(schedule=PAR, damping=0.5), dict(schedule="parallel", damping=0.5)),
    (dict(schedule=PAR, damping=1.0), dict(schedule="parallel")),
])
@pytest.mark.parametrize("sweeps", [1, 3])
def test_trajectory_matches_reference(options, ref_options, sweeps):
    K, y = rbf_problem(30, seed=5)
    tau, nu, S, m, info = run(K, y, fastep.Probit().site_spec(), max_sweeps=sweeps, tol=1e-300, **options)
    r = ref.run_gp_ep(K, y, probit_moments, max_sweeps=sweeps, tol=1e-300, **ref_options)
    assert info.n_sweeps == r["n_sweeps"] == sweeps
    assert close(tau, r["site_precision"]) < 1e-10
    assert close(nu, r["site_natural_mean"]) < 1e-10
    assert close(S, r["post_cov"]) < 1e-10
    assert close(m, r["post_mean"]) < 1e-10
    assert abs(info.log_z - r["log_z"]) < 1e-10 * max(1.0, abs(r["log_z"]))
    assert abs(info.max_change - r["max_change"]) < 1e-9 * max(1.0, r["max_change"])


@pytest.mark.parametrize("schedule", [SEQ, BLK])
def test_random_order_matches_reference_with_python_splitmix64(schedule):
    K, y = rbf_problem(25, seed=8)
    seed = 12345678901234567
    tau, nu, S, m, info = run(K, y, fastep.Probit().site_spec(), schedule=schedule, order=RANDOM,
                              seed=seed, max_sweeps=3, tol=1e-300, block_size=6)
    perms = splitmix64_permutations(25, seed, 3)
    assert all(sorted(p) == list(range(25)) for p in perms) and perms[0] != perms[1]
    r = ref.run_gp_ep(K, y, probit_moments, order=perms, max_sweeps=3, tol=1e-300)
    assert close(tau, r["site_precision"]) < 1e-10 and close(nu, r["site_natural_mean"]) < 1e-10
    assert close(m, r["post_mean"]) < 1e-10


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), seed=st.integers(0, 2**16), block_size=st.integers(1, 14),
       likelihood=st.sampled_from(sorted(LIKELIHOODS)), damping=st.sampled_from([1.0, 0.7]))
def test_random_problems_two_sweeps_match_reference(n, seed, block_size, likelihood, damping):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, n + 2))
    K = np.ascontiguousarray(A @ A.T / (n + 2) + 0.05 * np.eye(n))
    K = 0.5 * (K + K.T)
    y = np.where(rng.standard_normal(n) > 0, 1.0, -1.0)
    lik, moments = LIKELIHOODS[likelihood]
    r = ref.run_gp_ep(K, y, moments, max_sweeps=2, tol=1e-300, damping=damping)
    for options in (dict(schedule=SEQ), dict(schedule=BLK, block_size=block_size)):
        tau, nu, S, m, info = run(K, y, lik.site_spec(), max_sweeps=2, tol=1e-300, damping=damping,
                                  **options)
        assert close(tau, r["site_precision"]) < 1e-9
        assert close(nu, r["site_natural_mean"]) < 1e-9
        assert close(S, r["post_cov"]) < 1e-9
        assert abs(info.log_z - r["log_z"]) < 1e-9 * max(1.0, abs(r["log_z"]))


# --------------------------------------------------------------------------------------------
# (c) incremental vs refactorised posterior; blocked = sequential arithmetic
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("options", [
    dict(schedule=SEQ), dict(schedule=BLK, block_size=1), dict(schedule=BLK, block_size=7),
    dict(schedule=BLK, block_size=200), dict(schedule=BLK, damping=0.6, order=RANDOM, seed=3),
    dict(schedule=BLK, order=ENTROPY, block_size=9), dict(schedule=SEQ, order=ENTROPY),
])
@pytest.mark.parametrize("start_sweeps", [0, 2])
def test_refactorisation_matches_incremental_updates(options, start_sweeps):
    n = 70
    K, y = rbf_problem(n, seed=21)
    spec = fastep.Probit().site_spec()
    if start_sweeps:
        tau, nu, S, m, _ = run(K, y, spec, max_sweeps=start_sweeps)
    else:
        tau, nu = np.zeros(n), np.zeros(n)
        S, m = refactored(K, tau, nu)
    np.testing.assert_array_equal(S, S.T)
    out = dense_incremental_sweep(K, y, spec, tau, nu, S, m, **options)
    assert out["n_failed"] == 0 and out["max_change"] > 0
    S_ref, m_ref = refactored(K, tau, nu)
    assert np.max(np.abs(S - S_ref)) < 1e-10 * np.max(np.abs(K))
    assert np.max(np.abs(m - m_ref)) < 1e-10 * max(1.0, np.max(np.abs(m_ref)))


@pytest.mark.parametrize("order", [FIXED, RANDOM, ENTROPY])
def test_blocked_sweep_is_the_sequential_sweep(order):
    n = 50
    K, y = rbf_problem(n, seed=4)
    spec = fastep.Logistic().site_spec()
    tau0, nu0, S0, m0, _ = run(K, y, spec, max_sweeps=1)
    results = []
    for options in (dict(schedule=SEQ), dict(schedule=BLK, block_size=1), dict(schedule=BLK, block_size=6),
                    dict(schedule=BLK, block_size=n)):
        tau, nu, S, m = tau0.copy(), nu0.copy(), S0.copy(), m0.copy()
        dense_incremental_sweep(K, y, spec, tau, nu, S, m, order=order, seed=99, **options)
        results.append((tau, nu, S, m))
    for tau, nu, S, m in results[1:]:
        assert close(tau, results[0][0]) < 1e-12 and close(nu, results[0][1]) < 1e-12
        assert close(S, results[0][2]) < 1e-12 and close(m, results[0][3]) < 1e-12


@pytest.mark.parametrize("schedule", [SEQ, BLK])
@pytest.mark.parametrize("refresh_every", [2, 5, 1000])
def test_refresh_every_changes_results_by_rounding_only(schedule, refresh_every):
    """Refactorising every sweep or only every few (log Z between them from the incremental
    diag Σ, μ and the determinant-lemma log|B|) gives the same sweeps and the same answer."""
    K, y = benchmark_problem(150)
    spec = fastep.Probit().site_spec()
    base = run(K, y, spec, schedule=schedule, tol=1e-10, refresh_every=1)
    other = run(K, y, spec, schedule=schedule, tol=1e-10, refresh_every=refresh_every)
    assert other[4].n_sweeps == base[4].n_sweeps and other[4].converged
    for a, b in zip(other[:4], base[:4]):
        assert close(a, b) < 1e-10
    assert abs(other[4].log_z - base[4].log_z) < 1e-10 * abs(base[4].log_z)
    # the returned posterior is a fresh factorisation of the returned sites
    S_ref, m_ref = refactored(K, other[0], other[1])
    np.testing.assert_array_equal(other[2], S_ref)
    np.testing.assert_array_equal(other[3], m_ref)


def test_incremental_log_det_tracks_the_factorisation():
    """Between refactorisations log Z uses the incremental diag Σ, μ and ½ log|B| accumulated by
    the determinant lemma: the log-Z change reported after sweep k (refactorised, as the last
    sweep) against the incremental value of sweep k-1 equals the exact change."""
    K, y = benchmark_problem(120)
    spec = fastep.Logistic().site_spec()
    exact = []
    for sweeps in (1, 2, 3, 4):
        tau, nu, S, m, info = run(K, y, spec, max_sweeps=sweeps, refresh_every=1000, tol=1e-14)
        lz = engine.log_marginal_likelihood(K, y, spec, tau, nu)
        assert abs(info.log_z - lz) < 1e-12 * abs(lz)
        exact.append(lz)
        if sweeps >= 3:   # sweep k-1 >= 2 was evaluated incrementally
            assert abs(info.log_z_change - abs(exact[-1] - exact[-2])) < 1e-10 * abs(lz)


def test_refresh_every_must_be_positive():
    K, y = benchmark_problem(10)
    with pytest.raises(ValueError, match="refresh_every"):
        run(K, y, fastep.Probit().site_spec(), refresh_every=0)


# --------------------------------------------------------------------------------------------
# output=OUTPUT_FACTOR: L = chol(B) instead of Σ, and the diag-Σ-only refactorisation
# --------------------------------------------------------------------------------------------

def _chol_b(K, tau):
    s = np.sqrt(tau)
    return np.linalg.cholesky(np.eye(len(tau)) + s[:, None] * K * s[None, :])


@pytest.mark.parametrize("options", [dict(schedule=SEQ), dict(schedule=BLK),
                                     dict(schedule=BLK, refresh_every=1000),
                                     dict(schedule=BLK, refresh_every=3, order=ENTROPY),
                                     dict(schedule=PAR, damping=0.5),
                                     dict(schedule=BLK, max_sweeps=2), dict(schedule=PAR, max_sweeps=2)])
def test_output_factor_gives_the_same_run_and_the_cholesky_of_b(options):
    """The factor output changes what post_cov holds at return, nothing else: same sweeps, sites,
    μ and log Z as the covariance output; post_cov = chol(I + S^½ K S^½) (upper triangle zero);
    post_var = diag Σ of the covariance output."""
    n = 120
    K, y = benchmark_problem(n)
    spec = fastep.Probit().site_spec()
    var_cov, var_fac = np.empty(n), np.empty(n)
    base = run(K, y, spec, tol=1e-10, post_var=var_cov, **options)
    fac = run(K, y, spec, tol=1e-10, post_var=var_fac, output=engine.OUTPUT_FACTOR, **options)
    assert fac[4].n_sweeps == base[4].n_sweeps and fac[4].converged == base[4].converged
    assert close(fac[0], base[0]) < 1e-12 and close(fac[1], base[1]) < 1e-12
    assert close(fac[3], base[3]) < 1e-10
    assert abs(fac[4].log_z - base[4].log_z) < 1e-10 * abs(base[4].log_z)
    L = fac[2]
    assert np.all(np.triu(L, 1) == 0.0)
    assert close(L, _chol_b(K, fac[0])) < 1e-12
    assert np.max(np.abs(var_cov - np.diag(base[2])) / var_cov) < 1e-12
    assert np.max(np.abs(var_fac - var_cov) / var_cov) < 1e-10
    mu_ref, Sigma_ref = ref.posterior_from_sites(K, fac[0], fac[1])
    assert np.max(np.abs(var_fac - np.diag(Sigma_ref)) / np.diag(Sigma_ref)) < 1e-10
    assert close(fac[3], mu_ref) < 1e-10


@pytest.mark.parametrize("case", ["mixed", "all_tiny", "all_zero", "huge"])
def test_diag_only_refactorisation_on_adversarial_sites(case):
    """The parallel schedule's refactorisation forms diag Σ from diag(B⁻¹) where that is
    accurate and from V = L⁻¹ S^½ K elsewhere (τ_i = 0, τ_i Σ_ii tiny); μ by triangular solves.
    One damped-to-nothing iteration (damping 1e-300 keeps the sites) checks it against the
    reference posterior on sites mixing zero, tiny and huge precisions."""
    n = 80
    K, y = rbf_problem(n, seed=31)
    rng = np.random.default_rng(5)
    tau = {"mixed": rng.choice([0.0, 1e-12, 1e-6, 1e-3, 0.3, 5.0, 1e6], size=n),
           "all_tiny": np.full(n, 1e-10), "all_zero": np.zeros(n),
           "huge": 10.0 ** rng.uniform(3, 8, size=n)}[case]
    nu = rng.standard_normal(n) * np.sqrt(tau + 1e-3)
    spec = fastep.Gaussian(noise_variance=1.0).site_spec()
    for output in (engine.OUTPUT_COVARIANCE, engine.OUTPUT_FACTOR):
        var = np.empty(n)
        t, v, S, m, info = run(K, y, spec, tau0=tau, nu0=nu, schedule=PAR, damping=1e-300, max_sweeps=1,
                               output=output, post_var=var)
        assert np.max(np.abs(t - tau)) < 1e-299          # zero sites become ~1e-300, the rest stay
        mu_ref, Sigma_ref = ref.posterior_from_sites(K, t, v)
        d_ref = np.diag(Sigma_ref)
        # the reference loses ~eps K_ii absolutely where Σ_ii << K_ii (τ = 1e6: Σ_ii ≈ 1e-6)
        assert np.all(np.abs(var - d_ref) <= 1e-9 * d_ref + 1e-14 * np.diag(K))
        assert close(m, mu_ref) < 1e-9
        if output == engine.OUTPUT_COVARIANCE:
            assert close(S, Sigma_ref) < 1e-9
        else:
            assert close(S, _chol_b(K, t)) < 1e-10     # B has entries up to ~1e8 here


def test_output_option_checked():
    K, y = benchmark_problem(10)
    spec = fastep.Probit().site_spec()
    with pytest.raises(ValueError, match="output"):
        run(K, y, spec, output=2)
    with pytest.raises(ValueError, match="post_var"):
        run(K, y, spec, post_var=np.empty(9))


# --------------------------------------------------------------------------------------------
# (d) the EP invariant at return
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("options", [dict(schedule=SEQ), dict(schedule=BLK), dict(schedule=PAR, damping=0.5),
                                     dict(schedule=BLK, max_sweeps=2), dict(schedule=PAR, max_sweeps=2)])
def test_invariant_at_return(options):
    n = 40
    K, y = rbf_problem(n, seed=9)
    tau, nu, S, m, info = run(K, y, fastep.Probit().site_spec(), **options)
    assert np.array_equal(S, S.T)
    # Σ = (K⁻¹ + S̃)⁻¹  <=>  Σ + K S̃ Σ = K (no inverse of K needed);  μ = Σ ν̃
    assert np.max(np.abs(S + K @ (tau[:, None] * S) - K)) < 1e-10
    assert close(m, S @ nu) < 1e-10
    mu_ref, Sigma_ref = ref.posterior_from_sites(K, tau, nu)
    assert close(S, Sigma_ref) < 1e-10 and close(m, mu_ref) < 1e-10
    # log Z of the returned sites
    lz = engine.log_marginal_likelihood(K, y, fastep.Probit().site_spec(), tau, nu)
    assert abs(info.log_z - lz) < 1e-10 * abs(lz)
    assert abs(lz - ref.log_marginal_likelihood(K, y, probit_moments, tau, nu)) < 1e-9 * abs(lz)


def test_warm_start_resumes_at_the_fixed_point():
    K, y = rbf_problem(40, seed=12)
    spec = fastep.Probit().site_spec()
    tau, nu, S, m, info = run(K, y, spec, tol=1e-10)
    tau2, nu2, S2, m2, info2 = run(K, y, spec, tau, nu, tol=1e-10)
    assert info2.converged and info2.n_sweeps <= 2
    assert close(tau2, tau) < 1e-9 and close(S2, S) < 1e-9 and abs(info2.log_z - info.log_z) < 1e-9


# --------------------------------------------------------------------------------------------
# (e) published evidence on the benchmark problem
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, expected, atol", [(200, -63.81317, 1e-5), (1000, -237.4227, 1e-4)])
def test_benchmark_log_marginal_likelihood(n, expected, atol):
    K, y = benchmark_problem(n)
    spec = fastep.Probit().site_spec()
    tau, nu, S, m, info = run(K, y, spec)
    assert info.converged
    assert abs(info.log_z - expected) < atol
    if n == 200:
        for options in (dict(schedule=SEQ), dict(schedule=PAR, damping=0.5), dict(order=ENTROPY)):
            *_, info2 = run(K, y, spec, **options)
            assert info2.converged and abs(info2.log_z - expected) < atol
        assert abs(ref.log_marginal_likelihood(K, y, probit_moments, tau, nu) - expected) < atol


# --------------------------------------------------------------------------------------------
# (f) orders
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", [SEQ, BLK])
def test_orders_reach_the_same_fixed_point(schedule):
    K, y = rbf_problem(50, seed=13)
    spec = fastep.Probit().site_spec()
    base = run(K, y, spec, schedule=schedule, tol=1e-11)
    for options in (dict(order=ENTROPY), dict(order=RANDOM, seed=1), dict(order=RANDOM, seed=2**63 + 5)):
        tau, nu, S, m, info = run(K, y, spec, schedule=schedule, tol=1e-11, **options)
        assert info.converged
        assert close(tau, base[0]) < 1e-8 and close(nu, base[1]) < 1e-8 and close(m, base[3]) < 1e-8
        assert abs(info.log_z - base[4].log_z) < 1e-8 * abs(base[4].log_z)


def test_random_order_is_reproducible():
    K, y = rbf_problem(40, seed=14)
    spec = fastep.Logistic().site_spec()
    a = run(K, y, spec, order=RANDOM, seed=7, max_sweeps=2, tol=1e-300)
    b = run(K, y, spec, order=RANDOM, seed=7, max_sweeps=2, tol=1e-300)
    c = run(K, y, spec, order=RANDOM, seed=8, max_sweeps=2, tol=1e-300)
    for x, z in zip(a[:4], b[:4]):
        np.testing.assert_array_equal(x, z)
    assert a[4] == b[4]
    assert not np.array_equal(a[0], c[0])   # a different seed is a different trajectory


# --------------------------------------------------------------------------------------------
# (g) bad input: ValueError naming the argument, nothing modified
# --------------------------------------------------------------------------------------------

def _bad_cases():
    n = 6
    K, y = rbf_problem(n, seed=16)
    ok = dict(K=K, y=y, tau=np.full(n, 0.5), nu=np.full(n, 0.25), S=np.full((n, n), 7.0), m=np.full(n, 3.0))
    K_nan = K.copy()
    K_nan[2, 3] = np.nan
    K_asym = K.copy()
    K_asym[4, 1] += 0.1
    K_negdiag = K.copy()
    K_negdiag[1, 1] = -1.0
    y_nan = y.copy()
    y_nan[0] = np.nan
    y_label = y.copy()
    y_label[3] = 0.5
    tau_neg = ok["tau"].copy()
    tau_neg[2] = -0.1
    tau_inf = ok["tau"].copy()
    tau_inf[1] = np.inf
    nu_nan = ok["nu"].copy()
    nu_nan[5] = np.nan
    return ok, [
        ("K must be square", dict(K=np.ascontiguousarray(K[:, :5])), {}),
        ("y must have length", dict(y=y[:5]), {}),
        ("site_precision must have length", dict(tau=np.zeros(5)), {}),
        ("site_natural_mean must have length", dict(nu=np.zeros(7)), {}),
        ("post_cov must have shape", dict(S=np.zeros((6, 5))), {}),
        ("post_mean must have length", dict(m=np.zeros(5)), {}),
        ("K must be finite", dict(K=K_nan), {}),
        ("K must be symmetric", dict(K=K_asym), {}),
        ("K must have a nonnegative diagonal", dict(K=K_negdiag), {}),
        ("y must be finite", dict(y=y_nan), {}),
        (r"y\[3\] = 0.5 is not a valid target", dict(y=y_label), {}),
        ("site_precision must be >= 0", dict(tau=tau_neg), {}),
        ("site_precision must be finite", dict(tau=tau_inf), {}),
        ("site_natural_mean must be finite", dict(nu=nu_nan), {}),
        ("damping must be in", {}, dict(damping=0.0)),
        ("damping must be in", {}, dict(damping=1.5)),
        ("damping must be in", {}, dict(damping=np.nan)),
        ("NEGATIVE_ALLOW", {}, dict(negative_precision=engine.NEGATIVE_ALLOW)),
        ("negative_precision must be", {}, dict(negative_precision=7)),
        ("schedule must be", {}, dict(schedule=3)),
        ("schedule must be", {}, dict(schedule=-1)),
        ("order must be", {}, dict(order=3)),
        ("tol must be > 0", {}, dict(tol=0.0)),
        ("tol must be > 0", {}, dict(tol=np.nan)),
        ("max_sweeps must be >= 1", {}, dict(max_sweeps=0)),
        ("block_size must be >= 0", {}, dict(block_size=-1)),
    ]


_OK, _CASES = _bad_cases()


@pytest.mark.parametrize("message, arrays, options", _CASES, ids=[c[0] + str(c[2]) for c in _CASES])
def test_bad_input_raises_and_changes_nothing(message, arrays, options):
    args = {k: np.array(v, copy=True) for k, v in _OK.items()}
    args.update({k: np.array(v, copy=True) for k, v in arrays.items()})
    before = {k: v.copy() for k, v in args.items()}
    with pytest.raises(ValueError, match=message):
        run_gp_ep(args["K"], args["y"], fastep.Probit().site_spec(), args["tau"], args["nu"],
                  args["S"], args["m"], **options)
    for k in args:
        np.testing.assert_array_equal(args[k], before[k], err_msg=k)


def test_aliasing_outputs_rejected():
    n = 5
    K, y = rbf_problem(n, seed=17)
    tau = np.zeros(n)
    S, m = np.zeros((n, n)), np.zeros(n)
    with pytest.raises(ValueError, match="must not share memory"):
        run_gp_ep(K, y, fastep.Probit().site_spec(), tau, tau, S, m)
    with pytest.raises(ValueError, match="post_cov must not share memory with K"):
        run_gp_ep(K, y, fastep.Probit().site_spec(), tau, np.zeros(n), K, m)


def test_log_marginal_likelihood_bad_input():
    K, y = rbf_problem(5, seed=18)
    spec = fastep.Probit().site_spec()
    with pytest.raises(ValueError, match="site_precision must be >= 0"):
        engine.log_marginal_likelihood(K, y, spec, -np.ones(5), np.zeros(5))
    with pytest.raises(ValueError, match="y must have length"):
        engine.log_marginal_likelihood(K, y[:4], spec, np.ones(5), np.zeros(5))


def test_not_psd_kernel_raises_linalg_error_and_restores_sites():
    K = np.array([[1.0, 3.0], [3.0, 1.0]])
    y = np.array([1.0, -1.0])
    tau0, nu0 = np.array([0.1, 0.0]), np.array([0.05, 0.0])
    for schedule in (SEQ, BLK, PAR):
        tau, nu = tau0.copy(), nu0.copy()
        with pytest.raises(np.linalg.LinAlgError, match="not positive semi-definite"):
            run_gp_ep(K, y, fastep.Probit().site_spec(), tau, nu, np.empty((2, 2)), np.empty(2),
                      schedule=schedule, damping=0.5)
        np.testing.assert_array_equal(tau, tau0)
        np.testing.assert_array_equal(nu, nu0)
    with pytest.raises(np.linalg.LinAlgError):
        engine.log_marginal_likelihood(K, y, fastep.Probit().site_spec(), np.array([2.0, 2.0]), np.zeros(2))


# --------------------------------------------------------------------------------------------
# (h) noisy step likelihood, negative precisions; (i) non-convergence is reported
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule, damping", [(SEQ, 1.0), (BLK, 1.0), (PAR, 0.5)])
@pytest.mark.parametrize("policy", [engine.NEGATIVE_CLIP, engine.NEGATIVE_SKIP])
def test_step_likelihood_with_flip_noise(schedule, damping, policy):
    K, y = rbf_problem(60, seed=3, variance=2.0)
    y[::7] *= -1                     # label noise: some sites want negative precision
    tau, nu, S, m, info = run(K, y, fastep.Step(flip_noise=0.1).site_spec(), schedule=schedule,
                              damping=damping, negative_precision=policy, max_sweeps=60)
    assert np.all(np.isfinite(tau)) and np.all(np.isfinite(nu))
    assert np.all(np.isfinite(S)) and np.all(np.isfinite(m)) and np.isfinite(info.log_z)
    assert np.all(tau >= 0)
    assert info.n_failed == 0
    if policy == engine.NEGATIVE_CLIP:
        assert info.n_clipped > 0
        assert np.min(tau) < 1e-12      # clipped sites (damping halves their precision each sweep)
    else:
        assert info.n_skipped > 0 and info.n_clipped == 0
    assert close(S, ref.posterior_from_sites(K, tau, nu)[1]) < 1e-10


def test_max_sweeps_one_reports_not_converged():
    K, y = rbf_problem(30, seed=19)
    *_, info = run(K, y, fastep.Probit().site_spec(), max_sweeps=1, tol=1e-12)
    assert info.n_sweeps == 1 and info.converged is False
    assert info.max_change > 1e-12 and info.log_z_change > 0


def test_empty_problem():
    spec = fastep.Probit().site_spec()
    tau, nu, S, m, info = run(np.zeros((0, 0)), np.zeros(0), spec)
    assert info.converged and info.log_z == 0.0 and info.n_sweeps == 0


def test_single_site_matches_one_dimensional_quadrature():
    # n = 1: EP is exact moment matching of Phi(y f) N(f; 0, k): posterior moments and Z by quadrature.
    k = 1.7
    weight = lambda f: stats.norm.cdf(f) * stats.norm.pdf(f, scale=np.sqrt(k))  # noqa: E731
    Z = integrate.quad(weight, -np.inf, np.inf, epsabs=1e-14, epsrel=1e-13)[0]
    mean = integrate.quad(lambda f: f * weight(f), -np.inf, np.inf, epsabs=1e-14, epsrel=1e-13)[0] / Z
    second = integrate.quad(lambda f: f * f * weight(f), -np.inf, np.inf, epsabs=1e-14, epsrel=1e-13)[0] / Z
    tau, nu, S, m, info = run(np.array([[k]]), np.array([1.0]), fastep.Probit().site_spec())
    assert abs(m[0] - mean) < 1e-9 and abs(S[0, 0] - (second - mean**2)) < 1e-9
    assert abs(info.log_z - np.log(Z)) < 1e-9


# --------------------------------------------------------------------------------------------
# memory: one n x n work array
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", [SEQ, BLK, PAR])
def test_engine_allocates_one_work_matrix(schedule):
    n = 300
    K, y = rbf_problem(n, seed=20)
    spec = fastep.Probit().site_spec()
    tau, nu, S, m = np.zeros(n), np.zeros(n), np.empty((n, n)), np.empty(n)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        run_gp_ep(K, y, spec, tau, nu, S, m, schedule=schedule, damping=0.5 if schedule == PAR else 1.0,
                  max_sweeps=3)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert n * n * 8 <= peak < 1.25 * n * n * 8


# --------------------------------------------------------------------------------------------
# the nogil building blocks are cimportable
# --------------------------------------------------------------------------------------------

def _pxd_include_dir():
    import os
    here = os.path.dirname(engine.__file__)
    for candidate in (os.path.join(here, "include"), os.path.dirname(os.path.dirname(here))):
        if os.path.exists(os.path.join(candidate, "fastep", "_epcore", "gp_ep.pxd")):
            return candidate
    pytest.skip("gp_ep.pxd not found next to the compiled module")


@pytest.mark.downstream
def test_downstream_cython_can_cimport_gp_ep(tmp_path):
    import subprocess
    import sys
    import textwrap
    pytest.importorskip("Cython")
    src = tmp_path / "downstream_gp.pyx"
    src.write_text(textwrap.dedent("""
        # cython: language_level=3
        from fastep._epcore.sites cimport SiteSpec
        from fastep._epcore.linear_ep cimport SiteUpdateOptions, SweepStats
        from fastep._epcore.gp_ep cimport (gp_refactor, gp_log_z, gp_sweep_blocked, gp_sweep_sequential,
                                           gp_parallel_update, gp_form_covariance, entropy_pick,
                                           random_permutation, SCHEDULE_BLOCKED, ORDER_ENTROPY)

        def refactor(double[:, ::1] K, double[::1] tau, double[::1] nu, double[:, ::1] S, double[::1] m,
                     double[::1] d, double[:, ::1] work, double[::1] scratch):
            cdef double log_chol = 0.0
            cdef int info
            with nogil:
                info = gp_refactor(&K[0, 0], K.shape[0], &tau[0], &nu[0], &S[0, 0], &m[0], &d[0],
                                   &work[0, 0], &scratch[0], &log_chol, True)
            return info, log_chol
    """))
    res = subprocess.run([sys.executable, "-m", "cython", "-3", "-I", _pxd_include_dir(), str(src),
                          "-o", str(tmp_path / "out.c")], capture_output=True, text=True, cwd=tmp_path,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_incremental_sweep_bad_input():
    K, y = rbf_problem(6, seed=22)
    spec = fastep.Probit().site_spec()
    tau, nu = np.zeros(6), np.zeros(6)
    S, m = refactored(K, tau, nu)
    S_bad = S.copy()
    S_bad[4, 2] = np.nan
    with pytest.raises(ValueError, match=r"post_cov must be finite; post_cov\[4, 2\]"):
        engine.DenseEP(K, y, spec).incremental_sweep(tau, nu, S_bad, m)
    with pytest.raises(ValueError, match="SCHEDULE_SEQUENTIAL"):
        engine.DenseEP(K, y, spec, engine.DenseEPOptions(schedule=PAR)).incremental_sweep(tau, nu, S, m)
    np.testing.assert_array_equal(tau, 0.0)
