"""Compiled sparse GP EP engine (fastep._epcore.sparse_ep): twin, dense EP, closed forms, invariants, errors.

Oracles: the reference twin fastep.reference.sparse_ep, the dense GP EP engine on the explicit
n x n prior, the closed-form FITC / DTC / power-EP / VFE regression evidence, scipy quadrature,
and numpy recomputations of the rank-1 Cholesky updates.
"""
import tracemalloc

import numpy as np
import pytest

import fastep
from engine_helpers import run_gp_ep, run_sparse_ep, sparse_incremental_sweep
from fastep._epcore import gp_ep as dense_engine
from fastep._epcore import power_ep
from fastep._epcore import sparse_ep as engine
from fastep.kernels import RBF
from fastep.reference import sites as ref_sites
from fastep.reference import sparse_ep as ref

SEQ, PAR = engine.SPARSE_SEQUENTIAL, engine.SPARSE_PARALLEL


# the engines and twins make many small sequential BLAS calls (conftest.one_blas_thread)
pytestmark = pytest.mark.usefixtures("one_blas_thread")


def problem(n, m, seed, inducing="random", variance=1.3, inverse_width=0.8):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 2))
    Z = X.copy() if inducing == "training" else rng.uniform(-2, 2, size=(m, 2))
    k = RBF(variance=variance, inverse_width=inverse_width)
    f = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1]
    y_class = np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    y_reg = f + 0.3 * rng.standard_normal(n)
    return k(Z), np.ascontiguousarray(k(X, Z)), k.diag(X), k(X), y_class, y_reg


def run(Vt, d, y, spec, tau0=None, nu0=None, **options):
    n, m = Vt.shape
    tau = np.zeros(n) if tau0 is None else np.array(tau0, dtype=float)
    nu = np.zeros(n) if nu0 is None else np.array(nu0, dtype=float)
    R, wm, gm, gv = np.empty((m, m)), np.empty(m), np.empty(n), np.empty(n)
    info = run_sparse_ep(Vt, d, y, spec, tau, nu, R, wm, g_mean=gm, g_var=gv, **options)
    return _Run(tau=tau, nu=nu, R=R, w_mean=wm, g_mean=gm, g_var=gv, **info.as_dict())


class _Run(dict):
    """The arrays of a run and the fields of its SweepResult, by key or by attribute."""
    __getattr__ = dict.__getitem__


def probit_pm():
    return ref.power_moments(lambda y, m, v: ref_sites.probit_moments(y, m, v))


def dense(K, y, spec=None):
    n = len(y)
    tau, nu = np.zeros(n), np.zeros(n)
    cov, mean = np.empty((n, n)), np.empty(n)
    info = run_gp_ep(np.ascontiguousarray(K), y, spec or fastep.Probit().site_spec(), tau,
                     nu, cov, mean, schedule=dense_engine.SCHEDULE_SEQUENTIAL, tol=1e-12,
                     max_sweeps=300)
    return info.log_z, mean, np.diag(cov)


def test_module_constants():
    assert (SEQ, PAR) == (0, 1)
    assert (engine.NEGATIVE_CLIP, engine.NEGATIVE_SKIP, engine.NEGATIVE_ALLOW) == (0, 1, 2)
    assert (engine.ORDER_FIXED, engine.ORDER_RANDOM) == (0, 1)


def test_projection_matches_reference():
    Kmm, Knm, kdiag, _, _, _ = problem(50, 7, 0)
    for approximation in ("fitc", "dtc"):
        L, Vt, d = engine.sparse_projection(Kmm, Knm, kdiag, approximation=approximation, jitter=1e-8)
        V, d_ref, L_ref = ref.sparse_prior(Kmm, Knm.T, kdiag, approximation, jitter=1e-8)
        np.testing.assert_allclose(L, L_ref, atol=1e-14)
        np.testing.assert_allclose(Vt, V.T, atol=1e-13)
        np.testing.assert_allclose(d, d_ref, atol=1e-13)
    # overwrite_knm: Vt is the Knm buffer
    buf = Knm.copy()
    _, Vt, _ = engine.sparse_projection(Kmm, buf, kdiag, overwrite_knm=True)
    assert np.shares_memory(Vt, buf)


# --------------------------------------------------------------------------------------------
# the twin, dense EP and closed forms
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("approximation", ["fitc", "dtc"])
@pytest.mark.parametrize("schedule, damping", [(SEQ, 1.0), (SEQ, 0.6), (PAR, 0.7)])
def test_matches_reference_twin(approximation, schedule, damping):
    Kmm, Knm, kdiag, _, y, _ = problem(60, 8, 1)
    _, Vt, d = engine.sparse_projection(Kmm, Knm, kdiag, approximation=approximation, jitter=1e-8)
    out = run(Vt, d, y, fastep.Probit().site_spec(), schedule=schedule, damping=damping, tol=1e-12,
              max_sweeps=300)
    r = ref.run_sparse_ep(Vt.T, d, y, probit_pm(), schedule=["sequential", "parallel"][schedule],
                          damping=damping, tol=1e-12, max_sweeps=300)
    assert out.converged and r["converged"]
    assert out.n_sweeps == r["n_sweeps"]
    assert abs(out.log_z - r["log_z"]) < 1e-10
    for key, ref_key in (("tau", "site_precision"), ("nu", "site_natural_mean"), ("w_mean", "w_mean"),
                         ("g_mean", "g_mean"), ("g_var", "g_var")):
        np.testing.assert_allclose(out[key], r[ref_key], atol=1e-10)
    np.testing.assert_allclose(out["R"].T @ out["R"], np.linalg.inv(r["w_cov"]), atol=1e-9)


def test_trajectory_matches_reference_sweep_by_sweep():
    Kmm, Knm, kdiag, _, y, _ = problem(40, 6, 2)
    _, Vt, d = engine.sparse_projection(Kmm, Knm, kdiag, jitter=1e-8)
    spec = fastep.Probit().site_spec()
    for sweeps in (1, 2, 3):
        out = run(Vt, d, y, spec, max_sweeps=sweeps, tol=1e-300)
        r = ref.run_sparse_ep(Vt.T, d, y, probit_pm(), max_sweeps=sweeps, tol=1e-300)
        np.testing.assert_allclose(out["tau"], r["site_precision"], atol=1e-12)
        np.testing.assert_allclose(out["nu"], r["site_natural_mean"], atol=1e-12)
        assert not out.converged


def test_inducing_inputs_at_training_inputs_equal_dense_ep():
    Kmm, Knm, kdiag, K, y, _ = problem(40, None, 3, inducing="training")
    _, Vt, d = engine.sparse_projection(Kmm, Knm, kdiag, jitter=1e-10)
    out = run(Vt, d, y, fastep.Probit().site_spec(), tol=1e-12)
    mean, var = ref.latent_marginals(out["g_mean"], out["g_var"], d, out["tau"], out["nu"])
    log_z, dense_mean, dense_var = dense(K, y)
    assert abs(out.log_z - log_z) < 1e-8
    np.testing.assert_allclose(mean, dense_mean, atol=1e-8)
    np.testing.assert_allclose(var, dense_var, atol=1e-8)


@pytest.mark.parametrize("approximation", ["fitc", "dtc"])
@pytest.mark.parametrize("likelihood", [fastep.Probit(), fastep.Logistic()])
def test_equals_dense_ep_on_the_explicit_prior(approximation, likelihood):
    Kmm, Knm, kdiag, _, y, _ = problem(50, 6, 4)
    _, Vt, d = engine.sparse_projection(Kmm, Knm, kdiag, approximation=approximation, jitter=1e-8)
    out = run(Vt, d, y, likelihood.site_spec(), tol=1e-12)
    K = Vt @ Vt.T + np.diag(d)
    if approximation == "dtc":
        K += 1e-10 * np.eye(len(y))
    log_z, dense_mean, dense_var = dense(K, y, likelihood.site_spec())
    mean, var = ref.latent_marginals(out["g_mean"], out["g_var"], d, out["tau"], out["nu"])
    assert abs(out.log_z - log_z) < 1e-8
    np.testing.assert_allclose(mean, dense_mean, atol=1e-8)
    np.testing.assert_allclose(var, dense_var, atol=1e-8)


@pytest.mark.parametrize("approximation", ["fitc", "dtc"])
@pytest.mark.parametrize("schedule", [SEQ, PAR])
def test_gaussian_likelihood_equals_closed_form(approximation, schedule):
    Kmm, Knm, kdiag, _, _, y = problem(45, 6, 5)
    s2 = 0.2
    _, Vt, d = engine.sparse_projection(Kmm, Knm, kdiag, approximation=approximation, jitter=1e-10)
    out = run(Vt, d, y, fastep.Gaussian(noise_variance=s2).site_spec(), schedule=schedule, tol=1e-12)
    expected = ref.regression_log_evidence(Kmm, Knm.T, kdiag, y, s2, approximation=approximation,
                                           jitter=1e-10)
    assert abs(out.log_z - expected) < 1e-9
    # one sweep (sequential) or one iteration (undamped parallel) reaches the fixed point
    assert out.n_sweeps == 2


def test_power_ep_gaussian_closed_form_alpha_one_is_fitc_and_small_alpha_approaches_vfe():
    Kmm, Knm, kdiag, _, _, y = problem(45, 6, 6)
    s2 = 0.2
    spec = fastep.Gaussian(noise_variance=s2).site_spec()
    _, Vt, d = engine.sparse_projection(Kmm, Knm, kdiag, jitter=1e-10)
    values = {}
    for power in (1.0, 0.7, 0.3, 1e-2, 1e-4):
        values[power] = run(Vt, d, y, spec, power=power, tol=1e-12)["log_z"]
        expected = ref.regression_log_evidence(Kmm, Knm.T, kdiag, y, s2, power=power, jitter=1e-10)
        assert abs(values[power] - expected) < 1e-8 * max(1.0, abs(expected))
    fitc = ref.regression_log_evidence(Kmm, Knm.T, kdiag, y, s2, jitter=1e-10)
    assert abs(values[1.0] - fitc) < 1e-9
    vfe = ref.regression_log_evidence(Kmm, Knm.T, kdiag, y, s2, approximation="vfe", jitter=1e-10)
    gaps = [values[p] - vfe for p in (0.3, 1e-2, 1e-4)]
    assert gaps[0] > gaps[1] > gaps[2] > 0          # power EP sits above the bound here
    assert gaps[2] < 0.02 * gaps[1]                  # and approaches it at rate O(α)


def test_power_ep_classification_matches_twin():
    rng = np.random.default_rng(7)
    X = rng.uniform(-2, 2, size=(16, 2))
    Z = rng.uniform(-2, 2, size=(4, 2))
    y = np.where(np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] > 0, 1.0, -1.0)
    k = RBF(variance=1.5, inverse_width=0.8)
    _, Vt, d = engine.sparse_projection(k(Z), np.ascontiguousarray(k(X, Z)), k.diag(X), jitter=1e-8)
    out = run(Vt, d, y, fastep.Probit().site_spec(), power=0.5, tol=1e-11, n_quadrature=64)
    pm = ref.power_moments(lambda a, b, c: ref_sites.probit_moments(a, b, c),
                           ref.quadrature_power_moments(ref.probit_log_lik))
    r = ref.run_sparse_ep(Vt.T, d, y, pm, power=0.5, tol=1e-11)
    assert out.converged and r["converged"]
    assert abs(out.log_z - r["log_z"]) < 1e-8
    np.testing.assert_allclose(out["tau"], r["site_precision"], atol=1e-7)
    np.testing.assert_allclose(out["nu"], r["site_natural_mean"], atol=1e-7)


# --------------------------------------------------------------------------------------------
# powered moments
# --------------------------------------------------------------------------------------------

def test_power_moments_at_power_one_are_the_site_kernel():
    spec = fastep.Probit(bias=0.3).site_spec()
    y = np.array([1.0, -1.0, 1.0, -1.0])
    m, v = np.array([0.2, 3.0, -7.0, 0.0]), np.array([0.5, 10.0, 2.0, 1e-3])
    got = power_ep.power_moments_array(spec, y, m, v, power=1.0)
    expected = fastep.Probit(bias=0.3).moments(y, m, v)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_power_moments_gaussian_closed_form():
    y, m, v = np.array([0.3, -2.0, 4.0]), np.array([0.0, 1.0, -1.0]), np.array([0.5, 2.0, 0.01])
    for power in (0.9, 0.4, 1e-3):
        got = power_ep.power_moments_array(fastep.Gaussian(noise_variance=0.7).site_spec(), y, m, v, power=power)
        expected = ref.gaussian_power_moments(0.7)(y, m, v, power)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-13, atol=1e-14)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("power", [0.9, 0.5, 0.1])
def test_power_moments_quadrature_against_scipy(power):
    # moderate cavities (variance <= 8): relative error < 1e-5 at 64 nodes (module docstring)
    y = np.array([1.0, 1.0, -1.0, 1.0, -1.0])
    m = np.array([0.3, -2.0, 1.0, 0.0, -1.5])
    v = np.array([0.5, 4.0, 2.0, 1e-3, 8.0])
    expected = ref.quadrature_power_moments(ref.probit_log_lik)(y, m, v, power)
    got = power_ep.power_moments_array(fastep.Probit().site_spec(), y, m, v, power=power, n_quadrature=64)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-9)
    # logistic: pointwise log density through the MacKay kernel at zero variance (exact there)
    log_lik = lambda yy, f: -np.logaddexp(0.0, -yy * f)    # noqa: E731
    expected = ref.quadrature_power_moments(log_lik)(y, m, v, power)
    got = power_ep.power_moments_array(fastep.Logistic().site_spec(), y, m, v, power=power, n_quadrature=64)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-9)


# --------------------------------------------------------------------------------------------
# representation: rank-1 updates and rebuilds
# --------------------------------------------------------------------------------------------

def test_cholesky_rank1_update_and_downdate_against_recomputation():
    rng = np.random.default_rng(8)
    rtol = 10.0 ** -(np.finfo(float).precision - 2)
    for m in (1, 2, 5, 40):
        B = rng.standard_normal((m, m))
        A = B @ B.T + m * np.eye(m)
        R = np.linalg.cholesky(A).T.copy()
        x = rng.standard_normal(m)
        R_up = R.copy()
        assert engine.cholesky_rank1_update(R_up, x) == 0
        np.testing.assert_allclose(R_up, np.linalg.cholesky(A + np.outer(x, x)).T, rtol=rtol, atol=rtol)
        R_down = R_up.copy()
        assert engine.cholesky_rank1_update(R_down, x, downdate=True) == 0
        np.testing.assert_allclose(R_down, R, rtol=rtol, atol=rtol * 10)
    # the carried vector: R_newᵀ beta_new = R_oldᵀ beta_old for updates and downdates
    m = 30
    B = rng.standard_normal((m, m))
    R = np.linalg.cholesky(B @ B.T + m * np.eye(m)).T.copy()
    beta = rng.standard_normal(m)
    b = R.T @ beta
    x = rng.standard_normal(m)
    for downdate in (False, True):
        assert engine.cholesky_rank1_update(R, x, downdate=downdate, beta=beta) == 0
        np.testing.assert_allclose(R.T @ beta, b, rtol=rtol, atol=rtol * 10)
    # a downdate that destroys positive definiteness is reported
    R = np.eye(3)
    assert engine.cholesky_rank1_update(R, np.array([0.0, 2.0, 0.0]), downdate=True) == 2


def test_rebuild_after_a_sweep_changes_nothing_beyond_rounding():
    Kmm, Knm, kdiag, _, y, _ = problem(300, 20, 9)
    _, Vt, d = engine.sparse_projection(Kmm, Knm, kdiag, jitter=1e-8)
    spec = fastep.Probit().site_spec()
    start = run(Vt, d, y, spec, max_sweeps=2, tol=1e-300)
    tau, nu, R, wm = start["tau"], start["nu"], start["R"], start["w_mean"]
    for _ in range(2):                                   # two sweeps of rank-1 updates only
        sparse_incremental_sweep(Vt, d, y, spec, tau, nu, R, wm)
    R_new, wm_new = np.empty_like(R), np.empty_like(wm)
    engine.rebuild(Vt, tau, nu, R_new, wm_new)
    assert np.max(np.abs(R - R_new)) < 1e-10 * np.max(np.abs(R_new))
    assert np.max(np.abs(wm - wm_new)) < 1e-10 * max(1.0, np.max(np.abs(wm_new)))


def test_random_order_reaches_the_same_fixed_point_and_is_reproducible():
    Kmm, Knm, kdiag, _, y, _ = problem(60, 8, 10)
    _, Vt, d = engine.sparse_projection(Kmm, Knm, kdiag, jitter=1e-8)
    spec = fastep.Probit().site_spec()
    fixed = run(Vt, d, y, spec, tol=1e-12)
    a = run(Vt, d, y, spec, tol=1e-12, order=engine.ORDER_RANDOM, seed=5)
    b = run(Vt, d, y, spec, tol=1e-12, order=engine.ORDER_RANDOM, seed=5)
    np.testing.assert_array_equal(a["tau"], b["tau"])
    assert abs(a.log_z - fixed.log_z) < 1e-9
    np.testing.assert_allclose(a["tau"], fixed["tau"], atol=1e-8)


def test_warm_start_at_the_fixed_point_stops_after_one_sweep():
    Kmm, Knm, kdiag, _, y, _ = problem(60, 8, 11)
    _, Vt, d = engine.sparse_projection(Kmm, Knm, kdiag, jitter=1e-8)
    spec = fastep.Probit().site_spec()
    first = run(Vt, d, y, spec, tol=1e-12)
    again = run(Vt, d, y, spec, first["tau"], first["nu"], tol=1e-10)
    assert again.n_sweeps == 1 and again.converged
    assert abs(again.log_z - first.log_z) < 1e-11
    assert abs(engine.log_marginal_likelihood(Vt, d, y, spec, first["tau"], first["nu"]) - first.log_z) < 1e-11


@pytest.mark.parametrize("policy", [engine.NEGATIVE_CLIP, engine.NEGATIVE_SKIP])
@pytest.mark.parametrize("schedule, damping", [(SEQ, 1.0), (PAR, 0.5)])
def test_negative_precision_policy_on_the_step_likelihood(policy, schedule, damping):
    # flip noise makes the step likelihood non-log-concave: negative target precisions occur
    Kmm, Knm, kdiag, _, y, _ = problem(50, 6, 12, variance=4.0)
    _, Vt, d = engine.sparse_projection(Kmm, Knm, kdiag, jitter=1e-8)
    lik = fastep.Step(flip_noise=0.2)
    out = run(Vt, d, y, lik.site_spec(), negative_precision=policy, schedule=schedule, damping=damping,
              tol=1e-10, max_sweeps=300)
    name = ["clip", "skip"][policy]
    r = ref.run_sparse_ep(Vt.T, d, y, ref.power_moments(lambda a, b, c: ref_sites.step_moments(a, b, c, 0.2)),
                          negative_precision=name, schedule=["sequential", "parallel"][schedule],
                          damping=damping, tol=1e-10, max_sweeps=300)
    assert np.all(out["tau"] >= 0)
    assert out["n_clipped" if policy == engine.NEGATIVE_CLIP else "n_skipped"] > 0
    # every cavity of the returned state is proper
    assert np.all(1.0 - out["tau"] * out["g_var"] > 0)
    assert out.n_sweeps == r["n_sweeps"]
    np.testing.assert_allclose(out["tau"], r["site_precision"], atol=1e-9)
    assert abs(out.log_z - r["log_z"]) < 1e-8


def test_max_sweeps_one_reports_not_converged():
    Kmm, Knm, kdiag, _, y, _ = problem(30, 5, 13)
    _, Vt, d = engine.sparse_projection(Kmm, Knm, kdiag, jitter=1e-8)
    out = run(Vt, d, y, fastep.Probit().site_spec(), max_sweeps=1)
    assert out.n_sweeps == 1 and not out.converged and np.isfinite(out.log_z)


def test_memory_is_o_nm():
    n, m = 20000, 40
    rng = np.random.default_rng(14)
    X = rng.uniform(-3, 3, size=(n, 2))
    Z = rng.uniform(-3, 3, size=(m, 2))
    k = RBF()
    y = np.where(np.sin(X[:, 0]) > 0, 1.0, -1.0)
    _, Vt, d = engine.sparse_projection(k(Z), np.ascontiguousarray(k(X, Z)), k.diag(X), jitter=1e-8)
    tau, nu, R, wm = np.zeros(n), np.zeros(n), np.empty((m, m)), np.empty(m)
    tracemalloc.start()
    run_sparse_ep(Vt, d, y, fastep.Probit().site_spec(), tau, nu, R, wm, max_sweeps=2)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # the engine's own arrays: a few n-vectors, O(m²), one block of 2**17 doubles (no n x m copy)
    assert peak < 8 * (6 * n + 2 * m * m + 131072) + 65536
    assert peak < 0.5 * Vt.nbytes


# --------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------

def _base():
    Kmm, Knm, kdiag, _, y, _ = problem(12, 3, 15)
    _, Vt, d = engine.sparse_projection(Kmm, Knm, kdiag, jitter=1e-8)
    return Vt, d, y


@pytest.mark.parametrize("message, change, options", [
    ("d must have length", lambda a: a.update(d=a["d"][:-1]), {}),
    ("d must be >= 0", lambda a: a["d"].__setitem__(0, -1.0), {}),
    ("Vt must be finite", lambda a: a["Vt"].__setitem__((1, 1), np.nan), {}),
    ("y\\[0\\]", lambda a: a["y"].__setitem__(0, 0.5), {}),
    ("site_precision must be >= 0", lambda a: a["tau"].__setitem__(2, -0.1), {}),
    ("site_natural_mean must be finite", lambda a: a["nu"].__setitem__(2, np.inf), {}),
    ("post_factor must have shape", lambda a: a.update(R=np.empty((2, 2))), {}),
    ("post_w_mean must have length", lambda a: a.update(wm=np.empty(2)), {}),
    ("power must be in", None, {"power": 0.0}),
    ("power must be in", None, {"power": 1.5}),
    ("damping must be in", None, {"damping": 0.0}),
    ("NEGATIVE_ALLOW", None, {"negative_precision": 2}),
    ("schedule must be", None, {"schedule": 5}),
    ("order must be", None, {"order": 2}),
    ("tol must be", None, {"tol": 0.0}),
    ("max_sweeps must be", None, {"max_sweeps": 0}),
    ("n_quadrature must be", None, {"n_quadrature": 0}),
])
def test_bad_input_raises_and_changes_nothing(message, change, options):
    Vt, d, y = _base()
    n, m = Vt.shape
    a = dict(Vt=Vt.copy(), d=d.copy(), y=y.copy(), tau=np.full(n, 0.1), nu=np.full(n, 0.2),
             R=np.full((m, m), 7.0), wm=np.full(m, 7.0))
    if change is not None:
        change(a)
    tau_before, nu_before = a["tau"].copy(), a["nu"].copy()
    with pytest.raises(ValueError, match=message):
        run_sparse_ep(a["Vt"], a["d"], a["y"], fastep.Probit().site_spec(), a["tau"], a["nu"],
                      a["R"], a["wm"], **options)
    np.testing.assert_array_equal(a["tau"], tau_before)
    np.testing.assert_array_equal(a["nu"], nu_before)
    if a["R"].shape == (m, m):
        assert np.all(a["R"] == 7.0)


def test_power_below_one_rejected_for_the_step_likelihood():
    Vt, d, y = _base()
    n, m = Vt.shape
    with pytest.raises(ValueError, match="pointwise log density"):
        run_sparse_ep(Vt, d, y, fastep.Step().site_spec(), np.zeros(n), np.zeros(n),
                      np.empty((m, m)), np.empty(m), power=0.5)
    with pytest.raises(ValueError, match="pointwise log density"):
        power_ep.power_moments_array(fastep.Probit(slope=np.inf).site_spec(), y, y, y + 1, power=0.5)


def test_aliasing_outputs_rejected():
    Vt, d, y = _base()
    n, m = Vt.shape
    tau = np.zeros(n)
    with pytest.raises(ValueError, match="must not share memory"):
        run_sparse_ep(Vt, d, y, fastep.Probit().site_spec(), tau, tau, np.empty((m, m)), np.empty(m))


def test_projection_bad_input():
    Kmm, Knm, kdiag, _, _, _ = problem(12, 3, 16)
    with pytest.raises(ValueError, match="Knm must have m = 3 columns"):
        engine.sparse_projection(Kmm, np.ascontiguousarray(Knm[:, :2]), kdiag)
    with pytest.raises(ValueError, match="kdiag must have length"):
        engine.sparse_projection(Kmm, Knm, kdiag[:-1])
    with pytest.raises(ValueError, match="approximation must be"):
        engine.sparse_projection(Kmm, Knm, kdiag, approximation="vfe")
    with pytest.raises(ValueError, match="jitter must be"):
        engine.sparse_projection(Kmm, Knm, kdiag, jitter=-1.0)
    bad = Knm.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="Knm must be finite"):
        engine.sparse_projection(Kmm, bad, kdiag)
    # duplicated inducing inputs: K_mm singular without jitter
    Kdup = np.ones((3, 3))
    with pytest.raises(np.linalg.LinAlgError, match="increase jitter"):
        engine.sparse_projection(Kdup, Knm, kdiag)
    engine.sparse_projection(Kdup, Knm, kdiag, jitter=1e-6)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["Kmm", "Knm", "kdiag"])
def test_projection_rejects_every_non_finite_entry_before_writing(name, value):
    # the checks scan the bit patterns a row at a time: any entry, any row, nothing overwritten
    Kmm, Knm, kdiag, _, _, _ = problem(12, 5, 16)
    arrays = {"Kmm": Kmm, "Knm": np.ascontiguousarray(Knm), "kdiag": kdiag}
    for index in [(0, 0), (-1, -1), (3, 2)] if name != "kdiag" else [(0,), (-1,), (6,)]:
        bad = {k: v.copy() for k, v in arrays.items()}
        bad[name][index] = value
        before = bad["Knm"].copy()
        with pytest.raises(ValueError, match=f"{name} must be finite"):
            engine.sparse_projection(bad["Kmm"], bad["Knm"], bad["kdiag"], overwrite_knm=True)
        np.testing.assert_array_equal(bad["Knm"], before)
    extreme = {k: v.copy() for k, v in arrays.items()}
    extreme["kdiag"][0] = np.finfo(float).max          # finite extremes pass
    extreme["Knm"][0, 0] = np.finfo(float).tiny / 4
    engine.sparse_projection(extreme["Kmm"], extreme["Knm"], extreme["kdiag"])


def test_empty_problem():
    m = 3
    R, wm = np.empty((m, m)), np.empty(m)
    info = run_sparse_ep(np.empty((0, m)), np.empty(0), np.empty(0), fastep.Probit().site_spec(),
                         np.empty(0), np.empty(0), R, wm)
    assert info.converged and info.log_z == 0.0
    np.testing.assert_array_equal(R, np.eye(m))
