"""The double-loop (convergent) fallback of fractional EP with Student-t sites.

Heskes & Zoeter (2002) as used by Jylänki, Vanhatalo & Vehtari (2011, §4.2). Checks: its inner
solution is the minimum of the inner objective written out plainly
(fastep.reference.student_t_ep.double_loop_inner_objective: explicit inverses, quadrature), its
result is a fractional EP fixed point by the reference's test, its energy never decreases, a
fixed point of parallel EP is one of the double loop, the Gaussian limit is exact GP regression,
and the estimator falls back to it where parallel fractional EP stalls.
"""
import warnings

import numpy as np
import pytest
from scipy.integrate import IntegrationWarning
from scipy.stats import multivariate_normal

from engine_helpers import run_double_loop_ep, run_student_t_dense
from fastep import ConvergenceWarning, GaussianProcessRegressor, StudentT
from fastep._student_t import double_loop as double_loop
from fastep.kernels import RBF
from fastep.reference import student_t_ep as ref_student_t


def _outlier_data(seed, n=60):
    """sin(2x) with noise 0.05 and 20 % gross outliers (±2 to ±6)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, n)
    y = np.sin(2 * x) + 0.05 * rng.standard_normal(n)
    outlier = rng.random(n) < 0.2
    y[outlier] += rng.choice([-1, 1], outlier.sum()) * rng.uniform(2, 6, outlier.sum())
    return x, y


def _rbf(x, length_scale=0.3):
    return np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / length_scale ** 2) + 1e-8 * np.eye(x.size)


def _outputs(n):
    return [np.empty(n) for _ in range(4)]


def _parallel(K, y, dof, scale, power=0.5):
    n = y.size
    tau, nu = np.zeros(n), np.zeros(n)
    info = run_student_t_dense(K, y, dof, scale, power, tau, nu, *_outputs(n), damping=0.5, tol=1e-6,
                                      max_sweeps=500)
    return tau, nu, info


# Settings (data seed, ν, σ) where damped parallel fractional EP (η = 0.5) stalls: a likelihood
# five times narrower than the noise, so that the tilted distributions of the outliers are bimodal.
STALLING = [(0, 10.0, 0.01), (2, 1.5, 0.01)]


@pytest.mark.parametrize("seed, dof, scale", [STALLING[0], pytest.param(*STALLING[1], marks=pytest.mark.slow)])
def test_converges_to_a_fixed_point_where_parallel_ep_stalls(seed, dof, scale):
    x, y = _outlier_data(seed)
    K = _rbf(x)
    tau, nu, parallel = _parallel(K, y, dof, scale)
    assert parallel.stuck and not parallel.converged
    out = _outputs(y.size)
    cov = np.empty((y.size, y.size))
    info = run_double_loop_ep(K, y, dof, scale, 0.5, tau, nu, *out, tol=1e-6, max_outer=500,
                              post_cov=cov)
    assert info.converged and info.n_failed == 0 and info.diagnostics["n_limited"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IntegrationWarning)
        residual = ref_student_t.fixed_point_residual(K, y, tau, nu, dof, scale, 0.5)
        energy = ref_student_t.log_marginal_likelihood(K, y, tau, nu, dof, scale, 0.5)
    assert residual < 1e-4
    assert info.log_z == pytest.approx(energy, rel=1e-9)
    assert info.log_z == pytest.approx(info.diagnostics["energy"][-1], rel=1e-6)
    # the energy of every outer iteration is at least the last one's (the CCCP bound)
    steps = np.diff(info.diagnostics["energy"])
    assert np.all(steps > -1e-8 * abs(info.log_z)), steps.min()
    # the returned state is the posterior of the returned sites
    ref_cov, ref_mean = ref_student_t.posterior(K, tau, nu)
    np.testing.assert_allclose(cov, ref_cov, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(out[0], ref_mean, rtol=1e-6, atol=1e-8)
    assert np.all(out[3] > 0)                              # proper fractional cavities
    assert np.any(tau < 0)                                 # the outliers' sites


@pytest.mark.slow
def test_inner_solution_is_the_minimum_of_the_reference_objective():
    x, y = _outlier_data(2, n=40)
    K = _rbf(x)
    dof, scale, power = 4.0, 0.01, 0.5
    tau, nu, parallel = _parallel(K, y, dof, scale)
    assert parallel.stuck
    cov, mean = ref_student_t.posterior(K, tau, nu)
    theta_tau, theta_nu = 1 / np.diag(cov), mean / np.diag(cov)
    start_tau, start_nu = tau.copy(), nu.copy()
    info = run_double_loop_ep(K, y, dof, scale, power, tau, nu, *_outputs(y.size), tol=1e-12,
                              max_outer=1)
    assert info.n_sweeps == 1 and info.diagnostics["inner_failures"] == 0
    cavities = np.concatenate([theta_tau - power * tau, theta_nu - power * nu])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IntegrationWarning)
        value, grad = ref_student_t.double_loop_inner_objective(K, y, theta_tau, theta_nu, cavities, dof, scale,
                                                             power)
        start = np.concatenate([theta_tau - power * start_tau, theta_nu - power * start_nu])
        start_value, start_grad = ref_student_t.double_loop_inner_objective(K, y, theta_tau, theta_nu, start, dof,
                                                                         scale, power)
        rng = np.random.default_rng(0)
        nearby = []
        for _ in range(4):
            trial = ref_student_t.double_loop_inner_objective(
                K, y, theta_tau, theta_nu, cavities * (1 + 1e-4 * rng.standard_normal(cavities.size)), dof,
                scale, power)
            nearby.append(trial[0])
    # the engine's J is the reference's (same point), it fell from the start, and it is stationary
    engine = double_loop._Inner(double_loop._DenseGaussian(K), double_loop._Tilted(y, dof, scale, power), power,
                                theta_tau, theta_nu, np.zeros(y.size))
    assert engine.evaluate(cavities[:y.size], cavities[y.size:], False)["value"] == pytest.approx(value, rel=1e-10)
    assert value < start_value
    # stationary: the gradient is the tilted-minus-marginal moments, ~0 next to where it started
    assert np.max(np.abs(grad)) < 1e-6 * np.max(np.abs(start_grad))
    assert min(nearby) >= value - 1e-9 * abs(value)


def test_a_fixed_point_of_parallel_ep_is_one_of_the_double_loop():
    x, y = _outlier_data(1)
    K = _rbf(x)
    tau, nu, parallel = _parallel(K, y, 3.0, 0.2)
    assert parallel.converged
    out = _outputs(y.size)
    dl_tau, dl_nu = tau.copy(), nu.copy()
    info = run_double_loop_ep(K, y, 3.0, 0.2, 0.5, dl_tau, dl_nu, *out, tol=1e-6)
    assert info.converged and info.n_sweeps <= 2
    assert info.log_z == pytest.approx(parallel.log_z, rel=1e-9)
    np.testing.assert_allclose(dl_tau, tau, rtol=1e-4, atol=1e-4)


def test_gaussian_limit_is_exact_gp_regression():
    x, y = _outlier_data(3, n=30)
    K = _rbf(x, 0.8)
    sigma = 0.3
    tau, nu = np.zeros(30), np.zeros(30)
    out = _outputs(30)
    cov = np.empty((30, 30))
    info = run_double_loop_ep(K, y, 1e13, sigma, 0.5, tau, nu, *out, tol=1e-10, max_outer=500,
                              post_cov=cov)
    assert info.converged
    exact = multivariate_normal(np.zeros(30), K + sigma ** 2 * np.eye(30)).logpdf(y)
    assert info.log_z == pytest.approx(exact, rel=1e-7)
    np.testing.assert_allclose(cov, np.linalg.inv(np.linalg.inv(K) + np.eye(30) / sigma ** 2), rtol=1e-6,
                               atol=1e-9)
    np.testing.assert_allclose(tau, 1 / sigma ** 2, rtol=1e-6)


def test_callback_stops_and_bad_arguments_are_rejected():
    x, y = _outlier_data(0, n=20)
    K = _rbf(x)
    seen = []
    tau, nu = np.zeros(20), np.zeros(20)
    info = run_double_loop_ep(K, y, 4.0, 0.1, 0.5, tau, nu, *_outputs(20),
                              sweep_callback=lambda k, change, log_z: seen.append(k) or False)
    assert info.stopped and seen == [1] and not info.converged
    for kwargs in ({"tol": 0.0}, {"max_outer": 0}, {"cavity_variance_limit": 1.0}):
        with pytest.raises(ValueError):
            run_double_loop_ep(K, y, 4.0, 0.1, 0.5, np.zeros(20), np.zeros(20), *_outputs(20),
                               **kwargs)
    with pytest.raises(ValueError, match="power"):
        run_double_loop_ep(K, y, 4.0, 0.1, 1.5, np.zeros(20), np.zeros(20), *_outputs(20))
    with pytest.raises(np.linalg.LinAlgError, match="improper"):
        run_double_loop_ep(K, y, 4.0, 0.1, 0.5, np.full(20, -1e6), np.zeros(20), *_outputs(20))


@pytest.mark.slow
@pytest.mark.parametrize("seed, dof, scale", STALLING[:1])
def test_estimator_falls_back_to_the_double_loop(seed, dof, scale):
    x, y = _outlier_data(seed)
    X = x[:, None]
    kernel = RBF(1.0, 1 / 0.3 ** 2)                 # k = exp(-d²/(2 · 0.3²)), as _rbf
    est = GaussianProcessRegressor(kernel, likelihood=StudentT(dof=dof, scale=scale), optimizer=None, jitter=1e-8,
                                   tol=1e-6, max_sweeps=500)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est.fit(X, y)
    assert est.converged_
    problem = est._problems[0]
    assert "double-loop" in problem.algorithm
    K = _rbf(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IntegrationWarning)
        residual = ref_student_t.fixed_point_residual(K, y, est.site_precision_, est.site_natural_mean_, dof, scale,
                                                   0.5)
    assert residual < 1e-3
    # the fit follows the clean signal through the outliers
    grid = np.linspace(-2.8, 2.8, 50)[:, None]
    assert np.sqrt(np.mean((est.predict(grid) - np.sin(2 * grid[:, 0])) ** 2)) < 0.1


def test_estimator_keeps_parallel_ep_when_the_double_loop_ends_improper(monkeypatch):
    """Policy: a double loop that ends with an improper cavity (no energy) is not used; the fit
    keeps the stalled parallel run and says so with a ConvergenceWarning."""
    import fastep._student_t.problem as student_t_gp

    calls = []

    class Improper(double_loop.DenseDoubleLoopEP):
        def run(self, site_precision, *args, **kwargs):
            info = super().run(site_precision, *args, **kwargs)
            calls.append(info)
            site_precision[:] = np.nan                       # would poison the sites if kept
            return info.replace(log_z=float("nan"), converged=False, n_failed=3)

    monkeypatch.setattr(student_t_gp, "DenseDoubleLoopEP", Improper)
    x, y = _outlier_data(0)
    est = GaussianProcessRegressor(RBF(1.0, 1 / 0.3 ** 2), likelihood=StudentT(dof=10.0, scale=0.01),
                                   optimizer=None, jitter=1e-8, tol=1e-6, max_sweeps=500)
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        est.fit(x[:, None], y)
    assert len(calls) == 1 and not est.converged_
    assert est._problems[0].algorithm == "fractional EP"
    assert np.all(np.isfinite(est.site_precision_)) and np.all(np.isfinite(est.predict(x[:5, None])))
