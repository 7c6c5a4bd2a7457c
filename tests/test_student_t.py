"""Robust GP regression with a Student-t likelihood: the site kernel, fractional EP, the estimator.

Jylänki, Vanhatalo & Vehtari (2011). Compiled kernels against their reference twins
(fastep.reference.sites.student_t_moments: adaptive quadrature; fastep.reference.student_t_ep:
explicit inverses), analytic limits (ν → ∞ is the Gaussian GP), one-site EP against 1-D
quadrature, evidence gradients against finite differences, and robustness to outliers.
"""
import warnings

import numpy as np
import pytest
from scipy.integrate import IntegrationWarning
from scipy.integrate import quad
from scipy.stats import multivariate_normal, t as student_t_dist

from engine_helpers import run_student_t_dense
from fastep import GaussianProcessRegressor, StudentT, load, save
from fastep._epcore import student_t_sites, sites
from fastep.kernels import RBF, Bias
from fastep.reference import student_t_ep as ref_student_t
from fastep.reference import sites as ref_sites

# (residual d = mu - y, cavity variance) on the scales of the cavity and of the likelihood:
# centred, moderate, outliers far in the tail, wide and narrow cavities, a wide cavity on a
# narrow likelihood, and point cavities.
SITE_CASES = [(0.0, 1.0), (3.0, 0.1), (10.0, 1.0), (50.0, 0.01), (0.1, 100.0), (-7.0, 2.0),
              (1e-3, 1e-6), (5.0, 1e-8), (-0.4, 3.0), (2.0, 25.0)]


@pytest.mark.parametrize("dof", [0.5, 1.0, 4.0, 30.0, 1e6])
@pytest.mark.parametrize("scale", [0.01, 0.3, 1.0, 5.0])
@pytest.mark.parametrize("power", [1.0, 0.5, 0.2])
def test_site_kernel_matches_adaptive_quadrature(dof, scale, power):
    y = 0.3
    d = np.array([c[0] for c in SITE_CASES])
    s2 = np.array([c[1] for c in SITE_CASES])
    got = student_t_sites.student_t_moments_array(dof, scale, power, np.full(d.size, y), y + d, s2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # QUADPACK's round-off notes on the narrowest peaks
        want = ref_sites.student_t_moments(y, y + d, s2, dof, scale, power)
    # alpha and beta relative to their natural scales 1/sd and 1/s2 (they pass through 0)
    floors = [1e-300 * np.ones_like(s2), 1e-3 / np.sqrt(s2), 1e-3 / s2, 1e-3 * np.ones_like(s2),
              1e-3 * np.ones_like(s2)]
    for k, name in enumerate(["log_z", "alpha", "beta", "d_log_dof", "d_log_scale"]):
        err = np.abs(got[k] - want[k]) / np.maximum(np.abs(want[k]), floors[k])
        assert np.all(err < 1e-6), (name, err.max(), got[k], want[k])


def test_site_kernel_point_cavity_is_the_log_density_and_its_derivatives():
    dof, scale, y = 3.0, 0.7, 0.2
    f = np.array([-3.0, 0.0, 0.2, 1.0, 40.0])
    log_z, alpha, beta, _, _ = student_t_sites.student_t_moments_array(dof, scale, 1.0, np.full(5, y), f, np.zeros(5))
    np.testing.assert_allclose(log_z, student_t_dist.logpdf(y, dof, loc=f, scale=scale), rtol=1e-13)
    h = 1e-5
    up = student_t_dist.logpdf(y, dof, loc=f + h, scale=scale)
    down = student_t_dist.logpdf(y, dof, loc=f - h, scale=scale)
    np.testing.assert_allclose(alpha, (up - down) / (2 * h), rtol=1e-7, atol=1e-9)
    r2, c = (y - f) ** 2, dof * scale ** 2          # -d²/df² log t = (ν+1)(νσ² - r²)/(νσ² + r²)²
    np.testing.assert_allclose(beta, (dof + 1) * (c - r2) / (c + r2) ** 2, rtol=1e-13)


def test_site_kernel_derivatives_match_finite_differences_of_log_z():
    rng = np.random.default_rng(3)
    n = 40
    y = rng.normal(size=n)
    mu = y + rng.normal(scale=3.0, size=n)
    s2 = np.exp(rng.uniform(-4, 3, size=n))
    dof, scale, power = 3.5, 0.4, 0.5
    log_z, alpha, beta, d_dof, d_scale = student_t_sites.student_t_moments_array(dof, scale, power, y, mu, s2)

    def lz(dof=dof, scale=scale, mu=mu):
        return student_t_sites.student_t_moments_array(dof, scale, power, y, mu, s2)[0]

    h = 1e-4
    np.testing.assert_allclose(alpha, (lz(mu=mu + h) - lz(mu=mu - h)) / (2 * h), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(beta, -(lz(mu=mu + h) - 2 * log_z + lz(mu=mu - h)) / h ** 2, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(d_dof, (lz(dof=dof * np.exp(h)) - lz(dof=dof * np.exp(-h))) / (2 * h),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(d_scale, (lz(scale=scale * np.exp(h)) - lz(scale=scale * np.exp(-h))) / (2 * h),
                               rtol=1e-6, atol=1e-8)
    assert np.any(beta < 0)                 # outliers: the non-log-concave case is exercised


def test_site_kernel_is_finite_for_extreme_inputs_and_rejects_bad_ones():
    d = np.array([1e6, -1e6, 1e-12, 40.0, 1e3])
    s2 = np.array([1e-12, 1e12, 1e12, 1e-300 * 1e290, 1e-3])
    out = student_t_sites.student_t_moments_array(2.0, 1e-3, 0.5, np.zeros(5), d, s2)
    assert all(np.all(np.isfinite(o)) for o in out)
    with pytest.raises(ValueError, match="site 1 failed"):
        student_t_sites.student_t_moments_array(2.0, 1.0, 1.0, [0.0, 0.0], [0.0, np.nan], [1.0, 1.0])
    with pytest.raises(ValueError, match="power"):
        student_t_sites.student_t_moments_array(2.0, 1.0, 0.0, [0.0], [0.0], [1.0])
    with pytest.raises(ValueError, match="dof"):
        sites.SiteSpec(sites.LIKELIHOOD_CODES["student_t"], [-1.0, 1.0])
    for bad in ({"dof": 0.0}, {"scale": -1.0}, {"dof": np.inf}, {"scale": np.nan}):
        with pytest.raises(ValueError):
            StudentT(**bad)
    with pytest.raises(TypeError):
        StudentT(dof="four")


def test_likelihood_object_moments_are_the_power_one_kernel():
    likelihood = StudentT(dof=5.0, scale=0.5)
    y, mu, s2 = np.array([0.0, 1.0, -2.0]), np.array([0.5, 4.0, -2.0]), np.array([0.2, 1.0, 3.0])
    log_z, alpha, beta = likelihood.moments(y, mu, s2)
    want = likelihood.powered_moments(y, mu, s2, 1.0)
    np.testing.assert_array_equal(log_z, want[0])
    np.testing.assert_array_equal(alpha, want[1])
    np.testing.assert_array_equal(beta, want[2])
    assert StudentT(dof=2.0).noise_variance == np.inf
    assert StudentT(dof=6.0, scale=2.0).noise_variance == pytest.approx(6.0)


# -- the fractional EP engine --------------------------------------------------------------------

def _problem(n=40, seed=0, outliers=4):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(-3, 3, n))
    y = np.sin(x) + 0.1 * rng.normal(size=n)
    y[rng.choice(n, outliers, replace=False)] += 4.0
    K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2) + 1e-6 * np.eye(n)
    return x, y, K


def _run(K, y, dof, scale, power, **kwargs):
    n = K.shape[0]
    tau, nu = np.zeros(n), np.zeros(n)
    if "tau" in kwargs:
        tau[:], nu[:] = kwargs.pop("tau"), kwargs.pop("nu")
    out = {k: np.empty(n) for k in ("post_mean", "post_var", "cavity_mean", "cavity_var")}
    cov = np.empty((n, n))
    info = run_student_t_dense(K, y, dof, scale, power, tau, nu, out["post_mean"], out["post_var"],
                                      out["cavity_mean"], out["cavity_var"], post_cov=cov, **kwargs)
    return info, tau, nu, out, cov


@pytest.mark.parametrize("power", [1.0, pytest.param(0.5, marks=pytest.mark.slow)])
def test_engine_matches_reference_sweep_by_sweep(power):
    _, y, K = _problem()
    for n_sweeps in (1, 3, 8):
        info, tau, nu, out, cov = _run(K, y, 3.0, 0.2, power, damping=0.7, tol=1e-300, max_sweeps=n_sweeps)
        assert info.n_sweeps == n_sweeps
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", IntegrationWarning)   # QUADPACK's round-off notes
            ref_tau, ref_nu = ref_student_t.run_fractional_ep(K, y, 3.0, 0.2, power, damping=0.7, n_sweeps=n_sweeps)
            want = ref_student_t.log_marginal_likelihood(K, y, tau, nu, 3.0, 0.2, power)
        np.testing.assert_allclose(tau, ref_tau, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(nu, ref_nu, rtol=1e-7, atol=1e-9)
        ref_cov, ref_mean = ref_student_t.posterior(K, tau, nu)
        np.testing.assert_allclose(cov, ref_cov, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(out["post_mean"], ref_mean, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(out["post_var"], np.diag(ref_cov), rtol=1e-8, atol=1e-12)
        assert info.log_z == pytest.approx(want, rel=1e-8)
    assert np.any(tau < 0)                     # the outliers' sites are negative


def test_engine_converges_with_negative_sites_and_invariant_holds():
    _, y, K = _problem(n=60, outliers=8)
    info, tau, nu, out, cov = _run(K, y, 2.0, 0.1, 0.5, tol=1e-9, max_sweeps=500)
    assert info.converged and info.n_failed == 0
    assert np.sum(tau < 0) >= 4
    # Σ = (K⁻¹ + diag τ)⁻¹, i.e. (I + K diag τ) Σ = K, and μ = Σ ν at the returned state
    np.testing.assert_allclose((np.eye(60) + K * tau[None, :]) @ cov, K, rtol=0, atol=1e-8)
    np.testing.assert_allclose(cov @ nu, out["post_mean"], rtol=1e-9, atol=1e-9)
    # at the fixed point every site is its own target: one more sweep changes nothing
    info2, tau2, nu2, _, _ = _run(K, y, 2.0, 0.1, 0.5, tol=1e-300, max_sweeps=1, tau=tau, nu=nu)
    np.testing.assert_allclose(tau2, tau, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("power", [1.0, 0.5, 0.3])
def test_gaussian_limit_is_exact_gp_regression(power):
    _, y, K = _problem(n=30)
    sigma = 0.3
    info, tau, nu, out, cov = _run(K, y, 1e13, sigma, power, tol=1e-12, max_sweeps=500)
    exact_cov = np.linalg.inv(np.linalg.inv(K) + np.eye(30) / sigma ** 2)
    assert info.log_z == pytest.approx(multivariate_normal(np.zeros(30), K + sigma ** 2 * np.eye(30)).logpdf(y),
                                          rel=1e-8)
    np.testing.assert_allclose(cov, exact_cov, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(tau, 1 / sigma ** 2, rtol=1e-7)


@pytest.mark.parametrize("y_value", [0.0, 2.5, 8.0])
def test_one_site_ep_equals_the_exact_posterior_moments_by_quadrature(y_value):
    prior_var, dof, scale = 2.0, 3.0, 0.5
    K = np.array([[prior_var]])
    info, tau, nu, out, cov = _run(K, np.array([y_value]), dof, scale, 1.0, damping=1.0, tol=1e-12)
    density = lambda f: np.exp(-0.5 * f * f / prior_var) / np.sqrt(2 * np.pi * prior_var) * \
        student_t_dist.pdf(y_value, dof, loc=f, scale=scale)
    kw = dict(points=[0.0, y_value], limit=200, epsabs=0, epsrel=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IntegrationWarning)
        z = quad(density, -60, 60, **kw)[0]
        mean = quad(lambda f: f * density(f), -60, 60, **kw)[0] / z
        var = quad(lambda f: (f - mean) ** 2 * density(f), -60, 60, **kw)[0] / z
    assert info.converged
    assert out["post_mean"][0] == pytest.approx(mean, rel=1e-9, abs=1e-12)
    assert out["post_var"][0] == pytest.approx(var, rel=1e-9)
    assert info.log_z == pytest.approx(np.log(z), rel=1e-9)


def test_engine_rejects_bad_inputs():
    _, y, K = _problem(n=10)
    with pytest.raises(np.linalg.LinAlgError, match="positive definite"):
        _run(np.zeros((10, 10)), y, 3.0, 0.2, 0.5)
    with pytest.raises(ValueError, match="power"):
        _run(K, y, 3.0, 0.2, 1.5)
    with pytest.raises(ValueError, match="damping"):
        _run(K, y, 3.0, 0.2, 0.5, damping=0.0)
    bad = y.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match="y must be finite"):
        _run(K, bad, 3.0, 0.2, 0.5)


# -- the estimator -------------------------------------------------------------------------------

def _data(n=120, seed=1, fraction=0.1):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (n, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=n)
    bad = y.copy()
    out = rng.random(n) < fraction
    bad[out] += rng.choice([-1, 1], out.sum()) * rng.uniform(2, 5, out.sum())
    X_test = np.linspace(-3, 3, 200)[:, None]
    return X, y, bad, X_test, np.sin(2 * X_test[:, 0])


@pytest.mark.slow
def test_robust_fit_on_outliers_is_close_to_the_clean_fit():
    X, y, y_bad, X_test, f_test = _data()

    def rmse(est, targets):
        return np.sqrt(np.mean((est.fit(X, targets).predict(X_test) - f_test) ** 2))

    clean = rmse(GaussianProcessRegressor(), y)
    gaussian_on_outliers = rmse(GaussianProcessRegressor(), y_bad)
    robust_on_outliers = rmse(GaussianProcessRegressor(likelihood="student_t"), y_bad)
    assert robust_on_outliers < 1.5 * clean
    assert gaussian_on_outliers > 3.0 * clean


def test_estimator_gaussian_limit_matches_the_gaussian_regressor():
    X, y, _, X_test, _ = _data(n=50)
    kernel = RBF(1.0, 1.0) + Bias(0.1)
    gaussian = GaussianProcessRegressor(kernel, noise_variance=0.04, optimizer=None, tol=1e-10).fit(X, y)
    robust = GaussianProcessRegressor(kernel, likelihood=StudentT(dof=1e13, scale=0.2), optimizer=None,
                                      tol=1e-10, jitter=1e-10).fit(X, y)
    m1, s1 = gaussian.predict(X_test, return_std=True)
    m2, s2 = robust.predict(X_test, return_std=True)
    np.testing.assert_allclose(m2, m1, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(s2, s1, rtol=1e-6)
    assert robust.log_marginal_likelihood_value_ == pytest.approx(gaussian.log_marginal_likelihood_value_, rel=1e-6)


def test_evidence_gradient_matches_finite_differences():
    X, _, y_bad, _, _ = _data(n=40)
    est = GaussianProcessRegressor(RBF(1.0, 1.0) + Bias(0.1), likelihood=StudentT(3.0, 0.2), tol=1e-11,
                                   max_sweeps=1000).fit(X, y_bad)
    theta = np.array([0.1, -0.2, -1.0, np.log(2.5), np.log(0.15)])
    value, grad = est.log_marginal_likelihood(theta, eval_gradient=True)
    h = 1e-5
    fd = np.array([(est.log_marginal_likelihood(theta + h * e) - est.log_marginal_likelihood(theta - h * e)) / (2 * h)
                   for e in np.eye(theta.size)])
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(grad) > 1e-3)           # every coordinate is exercised


def test_learns_dof_and_scale_and_reports_noise_variance():
    X, y, y_bad, _, _ = _data(n=100)
    est = GaussianProcessRegressor(likelihood="student_t").fit(X, y_bad)
    assert isinstance(est.likelihood_, StudentT)
    assert 0.03 < est.likelihood_.scale < 0.3          # the clean noise is 0.1
    assert est.likelihood_.dof < 10                    # heavy tails for 10 % outliers
    assert est.noise_variance_ == est.likelihood_.noise_variance
    assert np.sum(est.site_precision_ < 0) >= 3
    assert est.converged_


def test_estimator_rejects_bad_noise_settings_without_changing_state():
    X, y, _, _, _ = _data(n=30)
    est = GaussianProcessRegressor(likelihood="student_t").fit(X, y)
    before = est.predict(X)
    for params, error in [({"likelihood": "cauchy"}, ValueError), ({"likelihood": 3}, TypeError),
                          ({"likelihood": StudentT(), "noise_variance": 0.1}, ValueError),
                          ({"likelihood": None, "power": 0.5}, ValueError),
                          ({"likelihood": "student_t", "power": 0.0}, ValueError),
                          ({"likelihood": "student_t", "power": 1.5}, ValueError)]:
        with pytest.raises(error):
            GaussianProcessRegressor(**params).fit(X, y)
    bad = y.copy()
    bad[2] = np.inf
    with pytest.raises(ValueError, match="y"):
        est.set_params(likelihood="student_t").fit(X, bad)
    np.testing.assert_array_equal(est.predict(X), before)


def test_student_t_model_round_trips_through_save_and_load(tmp_path):
    X, _, y_bad, X_test, _ = _data(n=40)
    est = GaussianProcessRegressor(likelihood=StudentT(4.0, 0.2), power=0.5).fit(X, y_bad)
    path = tmp_path / "robust.npz"
    save(est, path)
    loaded = load(path)
    for a, b in zip(est.predict(X_test, return_std=True), loaded.predict(X_test, return_std=True)):
        np.testing.assert_array_equal(a, b)
    assert loaded.likelihood_ == est.likelihood_
