"""Sparse robust regression: fractional EP with Student-t sites on the sparse representation.

The engine (``student_t_ep.SparseStudentTEP``) against the dense robust engine (whose own twin
is :mod:`fastep.reference.student_t_ep`) where the two models coincide, the signed natural sums,
the Gaussian limit, the evidence gradient, outliers, and the estimator's argument checks.
"""
import numpy as np
import pytest

from engine_helpers import run_student_t_dense, run_student_t_sparse
from fastep import SparseGPRegressor, StudentT, load, save
from fastep._epcore import sparse_ep
from fastep.kernels import RBF, Bias


def _outlier_data(n=40, seed=0, shift=4.0):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(-3, 3, n))
    y = np.sin(x) + 0.1 * rng.standard_normal(n)
    y[::7] += shift
    return x, y


def _sparse_run(Vt, d, y, likelihood, power, **kw):
    n, m = Vt.shape
    tau, nu = np.zeros(n), np.zeros(n)
    R, w, g_mean, g_var = np.empty((m, m)), np.empty(m), np.empty(n), np.empty(n)
    info = run_student_t_sparse(Vt, d, y, likelihood.site_spec(), tau, nu, R, w, g_mean, g_var,
                                          power=power, **kw)
    return info, tau, nu, g_mean, g_var


def _dense_run(K, y, likelihood, power, **kw):
    n = K.shape[0]
    tau, nu = np.zeros(n), np.zeros(n)
    post_mean, post_var, cav_mean, cav_var = (np.empty(n) for _ in range(4))
    info = run_student_t_dense(K, y, likelihood.dof, likelihood.scale, power, tau, nu, post_mean, post_var,
                                      cav_mean, cav_var, **kw)
    return info, tau, nu, post_mean, post_var


@pytest.mark.parametrize("power", [0.5, 1.0])
def test_full_rank_projection_equals_the_dense_robust_engine(power):
    # Vt = chol(K), d = 0: the sparse prior is K itself, so both engines run the same EP
    x, y = _outlier_data()
    K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2) + 1e-6 * np.eye(x.size)
    Vt = np.ascontiguousarray(np.linalg.cholesky(K))
    likelihood = StudentT(dof=4.0, scale=0.2)
    kw = dict(tol=1e-10, max_sweeps=1000)
    info_s, tau_s, nu_s, mean_s, var_s = _sparse_run(Vt, np.zeros(x.size), y, likelihood, power, **kw)
    info_d, tau_d, nu_d, mean_d, var_d = _dense_run(K, y, likelihood, power, **kw)
    assert info_s.converged and info_d.converged
    assert np.sum(tau_s < 0) >= 3                        # the outliers' sites are negative
    np.testing.assert_allclose(tau_s, tau_d, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(nu_s, nu_d, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(mean_s, mean_d, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(var_s, var_d, rtol=1e-8)
    assert info_s.log_z == pytest.approx(info_d.log_z, rel=1e-10)


def test_fitc_at_power_one_equals_dense_ep_on_the_fitc_prior():
    # sites on g with the likelihood convolved with N(0, d_i) = dense EP on f with prior Q + diag(d)
    x, y = _outlier_data(n=30, seed=1)
    z = np.linspace(-3, 3, 4)
    Kmm = np.exp(-0.5 * (z[:, None] - z[None, :]) ** 2) + 1e-8 * np.eye(z.size)
    Knm = np.exp(-0.5 * (x[:, None] - z[None, :]) ** 2)
    L = np.linalg.cholesky(Kmm)
    Vt = np.ascontiguousarray(np.linalg.solve(L, Knm.T).T)
    d = 1.0 - np.sum(Vt ** 2, axis=1)
    assert d.mean() > 1e-2 and d.min() >= 0              # a real FITC diagonal
    likelihood = StudentT(dof=3.0, scale=0.2)
    info_s, *_ = _sparse_run(Vt, d, y, likelihood, 1.0, tol=1e-10, max_sweeps=2000)
    info_d, *_ = _dense_run(Vt @ Vt.T + np.diag(d), y, likelihood, 1.0, tol=1e-10, max_sweeps=2000)
    assert info_s.converged and info_d.converged
    assert info_s.log_z == pytest.approx(info_d.log_z, rel=1e-8)


def test_signed_natural_sums_subtract_negative_sites():
    rng = np.random.default_rng(2)
    Vt = rng.standard_normal((50, 7))
    tau = rng.standard_normal(50)
    nu = rng.standard_normal(50)
    precision_sum, natural_sum = sparse_ep._natural_sums(Vt, tau, nu)
    expected = Vt.T @ (tau[:, None] * Vt)
    np.testing.assert_allclose(np.triu(precision_sum), np.triu(expected), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(natural_sum, Vt.T @ nu, rtol=1e-12, atol=1e-12)


def test_engine_halves_steps_and_reports_an_improper_start():
    x, y = _outlier_data(n=30)
    K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2) + 1e-6 * np.eye(x.size)
    Vt = np.ascontiguousarray(np.linalg.cholesky(K))
    n, m = Vt.shape
    likelihood = StudentT(dof=4.0, scale=0.2)
    tau = np.full(n, -5.0)                             # K⁻¹ - 5 I is not positive definite
    nu = np.zeros(n)
    with pytest.raises(np.linalg.LinAlgError, match="improper"):
        run_student_t_sparse(Vt, np.zeros(n), y, likelihood.site_spec(), tau, nu, np.empty((m, m)),
                                       np.empty(m), np.empty(n), np.empty(n))
    with pytest.raises(ValueError, match="damping"):
        run_student_t_sparse(Vt, np.zeros(n), y, likelihood.site_spec(), np.zeros(n), nu,
                                       np.empty((m, m)), np.empty(m), np.empty(n), np.empty(n), damping=0.0)
    # a full (undamped) step from zero sites overshoots: the engine must halve it
    info, tau, *_ = _sparse_run(Vt, np.zeros(n), y, likelihood, 1.0, damping=1.0, tol=1e-8, max_sweeps=500)
    assert np.all(np.isfinite(tau)) and np.isfinite(info.log_z)
    assert info.converged or info.n_halvings > 0


def _estimator_data(n=120, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 1))
    f = np.sin(2 * X[:, 0])
    y = f + 0.1 * rng.standard_normal(n)
    bad = y.copy()
    out = rng.random(n) < 0.1
    bad[out] += rng.choice([-1, 1], out.sum()) * rng.uniform(2, 5, out.sum())
    X_test = np.linspace(-3, 3, 200)[:, None]
    return X, y, bad, X_test, np.sin(2 * X_test[:, 0])


@pytest.mark.parametrize("power", [0.5, 1.0])
def test_gaussian_limit_matches_the_sparse_gaussian_regressor(power):
    X, y, _, X_test, _ = _estimator_data(n=60)
    kernel = RBF(1.0, 1.0) + Bias(0.1)
    common = dict(optimizer=None, n_inducing=12, random_state=0, power=power, tol=1e-10, max_sweeps=500)
    gaussian = SparseGPRegressor(kernel, noise_variance=0.04, **common).fit(X, y)
    robust = SparseGPRegressor(kernel, likelihood=StudentT(dof=1e13, scale=0.2), **common).fit(X, y)
    m1, s1 = gaussian.predict(X_test, return_std=True)
    m2, s2 = robust.predict(X_test, return_std=True)
    np.testing.assert_allclose(m2, m1, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(s2, s1, rtol=1e-6)
    assert robust.log_marginal_likelihood_value_ == pytest.approx(gaussian.log_marginal_likelihood_value_,
                                                                   rel=1e-6)


@pytest.mark.parametrize("approximation", ["fitc", "dtc"])
def test_evidence_gradient_matches_finite_differences(approximation):
    X, _, bad, _, _ = _estimator_data(n=50)
    est = SparseGPRegressor(RBF(1.0, 1.0) + Bias(0.1), likelihood=StudentT(3.0, 0.2), n_inducing=8,
                            approximation=approximation, random_state=0, tol=1e-11, max_sweeps=2000,
                            optimizer=None).fit(X, bad)
    theta = np.array([0.1, -0.2, -1.0, np.log(2.5), np.log(0.15)])
    value, grad = est.log_marginal_likelihood(theta, eval_gradient=True)
    h = 1e-5
    fd = np.array([(est.log_marginal_likelihood(theta + h * e) - est.log_marginal_likelihood(theta - h * e)) / (2 * h)
                   for e in np.eye(theta.size)])
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(grad) > 1e-3)


def test_robust_sparse_fit_on_outliers_is_close_to_the_clean_fit():
    X, y, bad, X_test, f_test = _estimator_data()

    def rmse(est, targets):
        return np.sqrt(np.mean((est.fit(X, targets).predict(X_test) - f_test) ** 2))

    clean = rmse(SparseGPRegressor(n_inducing=15, random_state=0), y)
    gaussian_on_outliers = rmse(SparseGPRegressor(n_inducing=15, random_state=0), bad)
    robust = SparseGPRegressor(likelihood="student_t", n_inducing=15, random_state=0)
    robust_on_outliers = rmse(robust, bad)
    assert robust_on_outliers < 1.5 * clean
    assert gaussian_on_outliers > 3.0 * clean
    assert isinstance(robust.likelihood_, StudentT) and robust.converged_
    assert robust.noise_variance_ == robust.likelihood_.noise_variance
    assert np.sum(robust.site_precision_ < 0) >= 3


def test_estimator_rejects_bad_noise_settings_without_changing_state():
    X, y, _, _, _ = _estimator_data(n=40)
    est = SparseGPRegressor(likelihood="student_t", n_inducing=6, random_state=0).fit(X, y)
    before = est.predict(X)
    for params, error in [({"likelihood": "cauchy"}, ValueError), ({"likelihood": 3}, TypeError),
                          ({"likelihood": StudentT(), "noise_variance": 0.1}, ValueError),
                          ({"likelihood": "student_t", "power": 0.0}, ValueError),
                          ({"likelihood": "student_t", "power": 1.5}, ValueError)]:
        with pytest.raises(error):
            SparseGPRegressor(n_inducing=6, **params).fit(X, y)
    with pytest.raises(ValueError, match="dask"):
        SparseGPRegressor(likelihood="student_t", n_inducing=6).fit(X, y, client=object())
    bad = y.copy()
    bad[2] = np.nan
    with pytest.raises(ValueError, match="y"):
        est.fit(X, bad)
    np.testing.assert_array_equal(est.predict(X), before)


def test_sparse_student_t_model_round_trips_through_save_and_load(tmp_path):
    X, _, bad, X_test, _ = _estimator_data(n=50)
    est = SparseGPRegressor(likelihood="student_t", n_inducing=6, random_state=0).fit(X, bad)
    path = tmp_path / "robust_sparse.npz"
    save(est, path)
    loaded = load(path)
    np.testing.assert_array_equal(loaded.predict(X_test), est.predict(X_test))
    assert loaded.likelihood_ == est.likelihood_


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")    # the reference's quad, at roundoff
@pytest.mark.parametrize("power", [pytest.param(0.5, marks=pytest.mark.slow), 1.0])
def test_engine_matches_the_reference_sweep_by_sweep_on_a_fitc_prior(power):
    from fastep.reference import sparse_ep as ref
    x, y = _outlier_data(n=16, seed=3)
    z = np.linspace(-3, 3, 5)
    Kmm = np.exp(-0.5 * (z[:, None] - z[None, :]) ** 2)
    Kmn = np.exp(-0.5 * (z[:, None] - x[None, :]) ** 2)
    V, d, _ = ref.sparse_prior(Kmm, Kmn, np.ones(x.size), jitter=1e-8)
    Vt = np.ascontiguousarray(V.T)
    likelihood = StudentT(dof=3.0, scale=0.2)
    pm = ref.student_t_power_moments(3.0, 0.2)
    for n_sweeps in (1, 3, 8):
        info, tau, nu, _, _ = _sparse_run(Vt, d, y, likelihood, power, tol=1e-14, max_sweeps=n_sweeps)
        assert info.n_sweeps == n_sweeps
        tau_ref, nu_ref = ref.run_robust_sparse_ep(V, d, y, pm, power=power, n_sweeps=n_sweeps)
        np.testing.assert_allclose(tau, tau_ref, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(nu, nu_ref, rtol=1e-6, atol=1e-8)
        assert info.log_z == pytest.approx(ref.log_marginal_likelihood(V, d, y, pm, tau, nu, power=power),
                                              rel=1e-8)
    assert np.any(tau < 0)
