"""Reference sparse GP EP (fastep.reference.sparse_ep) against dense EP and closed forms.

Oracles: the compiled dense GP EP engine and the dense reference twin run on the explicit
n x n prior covariance, and the closed-form FITC / DTC / power-EP / VFE regression evidence.
"""
import numpy as np
import pytest

import fastep
from engine_helpers import run_gp_ep
from fastep._epcore import gp_ep as dense_engine
from fastep.kernels import RBF
from fastep.reference import gp_ep as dense_ref
from fastep.reference import sites as ref_sites
from fastep.reference import sparse_ep as ref


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
    return k(Z), k(Z, X), k.diag(X), k(X), y_class, y_reg


def probit_pm():
    return ref.power_moments(lambda y, m, v: ref_sites.probit_moments(y, m, v))


def dense_compiled(K, y):
    n = len(y)
    tau, nu = np.zeros(n), np.zeros(n)
    cov, mean = np.empty((n, n)), np.empty(n)
    info = run_gp_ep(np.ascontiguousarray(K), y, fastep.Probit().site_spec(), tau, nu,
                     cov, mean, schedule=dense_engine.SCHEDULE_SEQUENTIAL, tol=1e-12,
                     max_sweeps=200)
    return info.log_z, mean, np.diag(cov)


def test_inducing_inputs_at_training_inputs_equal_dense_ep():
    Kmm, Kmn, kdiag, K, y, _ = problem(30, None, 0, inducing="training")
    V, d, _ = ref.sparse_prior(Kmm, Kmn, kdiag, "fitc", jitter=1e-10)
    assert np.max(d) < 1e-8
    r = ref.run_sparse_ep(V, d, y, probit_pm(), tol=1e-12)
    assert r["converged"]
    mean, var = ref.latent_marginals(r["g_mean"], r["g_var"], d, r["site_precision"], r["site_natural_mean"])
    log_z, dense_mean, dense_var = dense_compiled(K, y)
    assert abs(r["log_z"] - log_z) < 1e-8
    np.testing.assert_allclose(mean, dense_mean, atol=1e-8)
    np.testing.assert_allclose(var, dense_var, atol=1e-8)


@pytest.mark.parametrize("approximation", ["fitc", "dtc"])
@pytest.mark.parametrize("schedule", ["sequential", "parallel"])
def test_equals_dense_ep_on_the_explicit_prior(approximation, schedule):
    Kmm, Kmn, kdiag, _, y, _ = problem(40, 6, 1)
    jitter = 1e-8
    V, d, _ = ref.sparse_prior(Kmm, Kmn, kdiag, approximation, jitter=jitter)
    r = ref.run_sparse_ep(V, d, y, probit_pm(), tol=1e-12, schedule=schedule,
                          damping=0.7 if schedule == "parallel" else 1.0, max_sweeps=400)
    assert r["converged"]
    K_explicit = ref.prior_covariance(V, d)
    if approximation == "dtc":
        K_explicit += 1e-10 * np.eye(len(y))       # Q has rank m; the dense engine needs B only
    log_z, dense_mean, dense_var = dense_compiled(K_explicit, y)
    mean, var = ref.latent_marginals(r["g_mean"], r["g_var"], d, r["site_precision"], r["site_natural_mean"])
    assert abs(r["log_z"] - log_z) < 1e-8
    np.testing.assert_allclose(mean, dense_mean, atol=1e-8)
    np.testing.assert_allclose(var, dense_var, atol=1e-8)
    # and the dense reference twin agrees too (same model, independent code)
    rd = dense_ref.run_gp_ep(K_explicit, y, lambda a, b, c: ref_sites.probit_moments(a, b, c), tol=1e-12)
    assert abs(rd["log_z"] - log_z) < 1e-8


@pytest.mark.parametrize("approximation", ["fitc", "dtc"])
def test_gaussian_likelihood_equals_closed_form(approximation):
    Kmm, Kmn, kdiag, _, _, y = problem(35, 5, 2)
    s2 = 0.2
    pm = ref.power_moments(lambda a, b, c: ref_sites.gaussian_moments(a, b, c, s2), ref.gaussian_power_moments(s2))
    V, d, _ = ref.sparse_prior(Kmm, Kmn, kdiag, approximation, jitter=1e-10)
    r = ref.run_sparse_ep(V, d, y, pm, tol=1e-12)
    expected = ref.regression_log_evidence(Kmm, Kmn, kdiag, y, s2, approximation=approximation, jitter=1e-10)
    assert abs(r["log_z"] - expected) < 1e-9


def test_power_ep_gaussian_closed_form_and_limits():
    Kmm, Kmn, kdiag, _, _, y = problem(35, 5, 3)
    s2 = 0.2
    pm = ref.power_moments(lambda a, b, c: ref_sites.gaussian_moments(a, b, c, s2), ref.gaussian_power_moments(s2))
    V, d, _ = ref.sparse_prior(Kmm, Kmn, kdiag, "fitc", jitter=1e-10)
    fitc = ref.run_sparse_ep(V, d, y, pm, tol=1e-12)["log_z"]
    values = {}
    for power in (1.0, 0.5, 0.1, 1e-2, 1e-4):
        values[power] = ref.run_sparse_ep(V, d, y, pm, power=power, tol=1e-12)["log_z"]
        expected = ref.regression_log_evidence(Kmm, Kmn, kdiag, y, s2, power=power, jitter=1e-10)
        assert abs(values[power] - expected) < 1e-8 * max(1, abs(expected))
    assert values[1.0] == pytest.approx(fitc, abs=1e-12)
    vfe = ref.regression_log_evidence(Kmm, Kmn, kdiag, y, s2, approximation="vfe", jitter=1e-10)
    gaps = [abs(values[p] - vfe) for p in (0.1, 1e-2, 1e-4)]
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[2] < 0.02 * gaps[1]                   # O(α) approach to the bound


@pytest.mark.parametrize("likelihood, power", [("probit", 1.0), ("gaussian", 0.5), ("probit_dtc", 1.0)])
def test_gradient_formula_matches_finite_differences(likelihood, power):
    # the dense-for-clarity gradient (stationarity at the fixed point) against central differences
    # of the converged evidence; power EP with probit sites is checked on the compiled engine
    rng = np.random.default_rng(4)
    X = rng.uniform(-2, 2, size=(25, 2))
    Z = rng.uniform(-2, 2, size=(5, 2))
    f = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1]
    approximation = "dtc" if likelihood.endswith("dtc") else "fitc"
    if likelihood == "gaussian":
        y = f + 0.3 * rng.standard_normal(25)
        pm = ref.power_moments(lambda a, b, c: ref_sites.gaussian_moments(a, b, c, 0.3),
                               ref.gaussian_power_moments(0.3))
    else:
        y = np.where(f > 0, 1.0, -1.0)
        pm = probit_pm()

    def evidence(theta):
        k = RBF()
        k.theta = theta
        V, d, _ = ref.sparse_prior(k(Z), k(Z, X), k.diag(X), approximation, 1e-8)
        return ref.run_sparse_ep(V, d, y, pm, power=power, tol=1e-13, max_sweeps=500), k

    theta = np.array([0.3, -0.2])
    r, k = evidence(theta)
    dmm = list(k.gradient_iter(Z))
    dmn = list(k.cross_gradient_iter(Z, X))
    dnn = list(k.diag_gradient(X).T)
    grad = ref.log_marginal_likelihood_gradient(k(Z), k(Z, X), k.diag(X), dmm, dmn, dnn, y, pm,
                                                r["site_precision"], r["site_natural_mean"],
                                                approximation=approximation, power=power, jitter=1e-8)
    step = 1e-5
    fd = [(evidence(theta + step * e)[0]["log_z"] - evidence(theta - step * e)[0]["log_z"]) / (2 * step)
          for e in np.eye(2)]
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)
