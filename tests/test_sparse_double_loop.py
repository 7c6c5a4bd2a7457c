"""The double-loop fallback of sparse fractional EP with Student-t sites (FITC / DTC).

fastep._student_t.double_loop.SparseDoubleLoopEP solves its inner problem by Newton-CG on the
low-rank representation. Checks: the compiled posterior of sites of any sign against the
reference; where sparse parallel fractional EP stalls, the double loop reaches a fixed point by
the reference's quadrature test with the reference's energy, never lowering the energy; its
inner solution is the minimum of the inner objective written out plainly
(fastep.reference.sparse_ep.robust_double_loop_inner_objective); with a full-rank projection
it is the dense double loop; its Gaussian limit is the closed-form power-EP FITC evidence; and
SparseGPRegressor falls back to it.
"""
import warnings

import numpy as np
import pytest
from scipy.integrate import IntegrationWarning

from engine_helpers import run_double_loop_ep, run_sparse_double_loop_ep, run_student_t_sparse
from fastep import ConvergenceWarning, SparseGPRegressor, StudentT
from fastep._student_t import double_loop as double_loop
from fastep._epcore import sparse_ep
from fastep.kernels import RBF
from fastep.reference import sparse_ep as ref_sparse


def _outlier_data(seed, n=60):
    """sin(2x) on sorted inputs with noise 0.05 and 20 % gross outliers (±2 to ±6)."""
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(-3, 3, n))
    y = np.sin(2 * x) + 0.05 * rng.standard_normal(n)
    outlier = rng.random(n) < 0.2
    y[outlier] += rng.choice([-1, 1], outlier.sum()) * rng.uniform(2, 6, outlier.sum())
    return x, y


def _rbf(a, b, length_scale=0.3):
    return np.exp(-0.5 * (a[:, None] - b[None, :]) ** 2 / length_scale ** 2)


def _projection(x, m, approximation):
    z = np.linspace(-3, 3, m)
    _, Vt, d = sparse_ep.sparse_projection(_rbf(z, z), np.ascontiguousarray(_rbf(x, z)), np.ones(x.size),
                                           approximation=approximation, jitter=1e-8)
    return np.ascontiguousarray(Vt), np.ascontiguousarray(d)


def _outputs(n, m):
    return [np.empty((m, m)), np.empty(m), np.empty(n), np.empty(n)]


def _parallel(Vt, d, y, dof, scale):
    n, m = Vt.shape
    tau, nu = np.zeros(n), np.zeros(n)
    info = run_student_t_sparse(Vt, d, y, StudentT(dof=dof, scale=scale).site_spec(), tau, nu,
                                          *_outputs(n, m), power=0.5, tol=1e-6, max_sweeps=500)
    return tau, nu, info


# (approximation, m, data seed, ν, σ) where sparse parallel fractional EP (η = 0.5) stalls
STALLING = [("fitc", 30, 0, 4.0, 0.01), ("dtc", 30, 2, 4.0, 0.01)]


def test_site_posterior_of_signed_sites_is_the_reference_posterior():
    rng = np.random.default_rng(0)
    n, m = 25, 6
    Vt = rng.standard_normal((n, m))
    tau, nu = rng.uniform(0.0, 1.0, n), rng.standard_normal(n)
    tau[:3] = -0.02
    R, w_mean, g_mean, g_var = _outputs(n, m)
    half_log_det, quad = sparse_ep.site_posterior(Vt, tau, nu, R, w_mean, g_mean, g_var)
    mu_w, Sigma_w, ref_mean, ref_var = ref_sparse.posterior_from_sites(Vt.T, tau, nu)
    A = np.eye(m) + Vt.T @ (tau[:, None] * Vt)
    assert np.any(tau < 0)
    assert half_log_det == pytest.approx(0.5 * np.linalg.slogdet(A)[1], rel=1e-12)
    assert quad == pytest.approx(nu @ Vt @ mu_w, rel=1e-12)
    np.testing.assert_allclose(R.T @ R, A, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.tril(R, -1), 0.0)
    np.testing.assert_allclose(w_mean, mu_w, rtol=1e-10)
    np.testing.assert_allclose(g_mean, ref_mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g_var, ref_var, rtol=1e-10)
    assert sparse_ep.site_posterior(Vt, tau - 10.0, nu, R, w_mean, g_mean, g_var) is None   # improper
    with pytest.raises(ValueError, match="g_var"):
        sparse_ep.site_posterior(Vt, tau, nu, R, w_mean, g_mean, np.empty(n + 1))


@pytest.mark.parametrize("approximation, m, seed, dof, scale", STALLING)
def test_converges_to_a_fixed_point_where_sparse_parallel_ep_stalls(approximation, m, seed, dof, scale):
    x, y = _outlier_data(seed)
    Vt, d = _projection(x, m, approximation)
    tau, nu, parallel = _parallel(Vt, d, y, dof, scale)
    assert parallel.stuck and not parallel.converged
    R, w_mean, g_mean, g_var = _outputs(y.size, m)
    info = run_sparse_double_loop_ep(Vt, d, y, dof, scale, 0.5, tau, nu, R, w_mean, g_mean, g_var,
                                     tol=1e-6, max_outer=2000)
    assert info.converged and not info.stuck and info.diagnostics["n_limited"] == 0
    assert np.any(tau < 0)                                   # outliers' sites are negative
    energy = np.array(info.diagnostics["energy"])
    assert np.all(np.diff(energy) >= -1e-8 * np.abs(energy[1:]))
    pm = ref_sparse.student_t_power_moments(dof, scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IntegrationWarning)
        residual = ref_sparse.robust_fixed_point_residual(Vt.T, d, y, pm, tau, nu, power=0.5)
        reference_log_z = ref_sparse.log_marginal_likelihood(Vt.T, d, y, pm, tau, nu, power=0.5)
    assert residual < 1e-4
    assert info.log_z == pytest.approx(reference_log_z, rel=1e-9)
    mu_w, _, ref_mean, ref_var = ref_sparse.posterior_from_sites(Vt.T, tau, nu)
    np.testing.assert_allclose(g_mean, ref_mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(g_var, ref_var, rtol=1e-8)
    np.testing.assert_allclose(w_mean, mu_w, rtol=1e-8, atol=1e-10)
    A = np.eye(m) + Vt.T @ (tau[:, None] * Vt)
    np.testing.assert_allclose(R.T @ R, A, rtol=1e-10, atol=1e-10)


def test_inner_solution_is_the_minimum_of_the_reference_objective():
    approximation, m, seed, dof, scale = STALLING[0]
    x, y = _outlier_data(seed)
    Vt, d = _projection(x, m, approximation)
    tau, nu, _ = _parallel(Vt, d, y, dof, scale)
    _, _, g_mean, g_var = ref_sparse.posterior_from_sites(Vt.T, tau, nu)
    theta_tau, theta_nu = 1 / g_var, g_mean / g_var
    start = np.concatenate([theta_tau - 0.5 * tau, theta_nu - 0.5 * nu])
    info = run_sparse_double_loop_ep(Vt, d, y, dof, scale, 0.5, tau, nu, *_outputs(y.size, m),
                                     tol=1e-12, max_outer=1)
    assert info.n_sweeps == 1 and info.diagnostics["inner_failures"] == 0
    cavities = np.concatenate([theta_tau - 0.5 * tau, theta_nu - 0.5 * nu])
    pm = ref_sparse.student_t_power_moments(dof, scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IntegrationWarning)
        value, grad = ref_sparse.robust_double_loop_inner_objective(Vt.T, d, y, pm, theta_tau, theta_nu, cavities,
                                                                    0.5)
        start_value, start_grad = ref_sparse.robust_double_loop_inner_objective(Vt.T, d, y, pm, theta_tau, theta_nu,
                                                                                start, 0.5)
    engine = double_loop._Inner(double_loop._SparseGaussian(Vt), double_loop._Tilted(y, dof, scale, 0.5, d), 0.5,
                                theta_tau, theta_nu, np.zeros(y.size))
    n = y.size
    assert engine.evaluate(cavities[:n], cavities[n:], False)["value"] == pytest.approx(value, rel=1e-10)
    assert value < start_value
    assert np.max(np.abs(grad)) < 1e-6 * np.max(np.abs(start_grad))


def test_full_rank_projection_equals_the_dense_double_loop():
    # Vt = chol(K), d = 0: the sparse prior is K, so the CG inner loop must reach the dense one's fixed point
    x, y = _outlier_data(0, n=40)
    K = _rbf(x, x) + 1e-8 * np.eye(40)
    Vt = np.ascontiguousarray(np.linalg.cholesky(K))
    dof, scale = 4.0, 0.01
    tau, nu, parallel = _parallel(Vt, np.zeros(40), y, dof, scale)
    assert not parallel.converged
    dense_tau, dense_nu = tau.copy(), nu.copy()
    dense_out = [np.empty(40) for _ in range(4)]
    dense = run_double_loop_ep(K, y, dof, scale, 0.5, dense_tau, dense_nu, *dense_out, tol=1e-6,
                               max_outer=1000)
    R, w_mean, g_mean, g_var = _outputs(40, 40)
    sparse = run_sparse_double_loop_ep(Vt, np.zeros(40), y, dof, scale, 0.5, tau, nu, R, w_mean,
                                       g_mean, g_var, tol=1e-6, max_outer=1000)
    assert dense.converged and sparse.converged
    assert sparse.log_z == pytest.approx(dense.log_z, rel=1e-10)
    np.testing.assert_allclose(g_mean, dense_out[0], atol=1e-5 * np.sqrt(np.max(g_var)))
    np.testing.assert_allclose(g_var, dense_out[1], rtol=1e-5)


def test_gaussian_limit_is_the_power_ep_fitc_evidence():
    x, y = _outlier_data(3, n=30)
    z = np.linspace(-3, 3, 8)
    Kmm, Kmn, kdiag = _rbf(z, z, 0.8), _rbf(z, x, 0.8), np.ones(30)
    _, Vt, d = sparse_ep.sparse_projection(Kmm, np.ascontiguousarray(Kmn.T), kdiag, jitter=1e-8)
    sigma = 0.3
    tau, nu = np.zeros(30), np.zeros(30)
    info = run_sparse_double_loop_ep(Vt, d, y, 1e13, sigma, 0.5, tau, nu, *_outputs(30, 8), tol=1e-7,
                                     max_outer=1000)
    assert info.converged
    exact = ref_sparse.regression_log_evidence(Kmm, Kmn, kdiag, y, sigma ** 2, power=0.5, jitter=1e-8)
    assert info.log_z == pytest.approx(exact, rel=1e-7)


def test_callback_stops_and_bad_arguments_are_rejected():
    x, y = _outlier_data(0, n=20)
    Vt, d = _projection(x, 6, "fitc")
    seen = []
    info = run_sparse_double_loop_ep(Vt, d, y, 4.0, 0.1, 0.5, np.zeros(20), np.zeros(20),
                                     *_outputs(20, 6),
                                     sweep_callback=lambda k, change, log_z: seen.append(k) or False)
    assert info.stopped and seen == [1] and not info.converged
    for kwargs in ({"tol": 0.0}, {"max_outer": 0}, {"cavity_variance_limit": 1.0}):
        with pytest.raises(ValueError):
            run_sparse_double_loop_ep(Vt, d, y, 4.0, 0.1, 0.5, np.zeros(20), np.zeros(20),
                                      *_outputs(20, 6), **kwargs)
    with pytest.raises(ValueError, match="d must be"):
        run_sparse_double_loop_ep(Vt, -d - 1.0, y, 4.0, 0.1, 0.5, np.zeros(20), np.zeros(20),
                                  *_outputs(20, 6))
    with pytest.raises(ValueError, match="post_factor"):
        run_sparse_double_loop_ep(Vt, d, y, 4.0, 0.1, 0.5, np.zeros(20), np.zeros(20),
                                  *_outputs(20, 5))
    with pytest.raises(np.linalg.LinAlgError, match="improper"):
        run_sparse_double_loop_ep(Vt, d, y, 4.0, 0.1, 0.5, np.full(20, -1e6), np.zeros(20),
                                  *_outputs(20, 6))


def _estimator(approximation, m, dof, scale):
    return SparseGPRegressor(RBF(1.0, 1 / 0.3 ** 2), likelihood=StudentT(dof=dof, scale=scale), optimizer=None,
                             inducing_init=np.linspace(-3, 3, m)[:, None], approximation=approximation,
                             learn_inducing=False, jitter=1e-8, tol=1e-6, max_sweeps=500)


@pytest.mark.slow
@pytest.mark.parametrize("approximation, m, seed, dof, scale", STALLING[:1])
def test_estimator_falls_back_to_the_double_loop(approximation, m, seed, dof, scale):
    x, y = _outlier_data(seed)
    est = _estimator(approximation, m, dof, scale)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est.fit(x[:, None], y)
    assert est.converged_
    assert "double-loop" in est._problems[0].algorithm
    Vt, d = _projection(x, m, approximation)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IntegrationWarning)
        residual = ref_sparse.robust_fixed_point_residual(Vt.T, d, y, ref_sparse.student_t_power_moments(dof, scale),
                                                          est.site_precision_, est.site_natural_mean_, power=0.5)
    assert residual < 1e-3
    grid = np.linspace(-2.8, 2.8, 50)[:, None]
    assert np.sqrt(np.mean((est.predict(grid) - np.sin(2 * grid[:, 0])) ** 2)) < 0.1


def test_estimator_keeps_parallel_ep_when_the_double_loop_ends_improper(monkeypatch):
    """Policy, as for the dense regressor: a double loop that ends with an improper cavity is
    not used; the fit keeps the stalled parallel run and warns."""
    import fastep._sparse.problem as sparse_module

    calls = []

    class Improper(double_loop.SparseDoubleLoopEP):
        def run(self, site_precision, *args, **kwargs):
            info = super().run(site_precision, *args, **kwargs)
            calls.append(info)
            site_precision[:] = np.nan                       # would poison the sites if kept
            return info.replace(log_z=float("nan"), converged=False, n_failed=3)

    monkeypatch.setattr(sparse_module, "SparseDoubleLoopEP", Improper)
    approximation, m, seed, dof, scale = STALLING[0]
    x, y = _outlier_data(seed)
    est = _estimator(approximation, m, dof, scale)
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        est.fit(x[:, None], y)
    assert len(calls) == 1 and not est.converged_
    assert est._problems[0].algorithm == "sparse fractional EP"
    assert np.all(np.isfinite(est.site_precision_)) and np.all(np.isfinite(est.predict(x[:5, None])))


@pytest.mark.slow
def test_memory_is_linear_in_n():
    # O(nm): no n x n array (n = 2000: one would be 32 MB); peak traced memory stays within a
    # small multiple of the size of Vt
    import tracemalloc

    n, m = 2000, 10
    x, y = _outlier_data(5, n=n)
    Vt, d = _projection(x, m, "fitc")
    tracemalloc.start()
    try:
        info = run_sparse_double_loop_ep(Vt, d, y, 4.0, 0.1, 0.5, np.zeros(n), np.zeros(n),
                                         *_outputs(n, m), max_outer=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.diagnostics["n_newton"] > 0
    assert peak < 40 * Vt.nbytes and peak < 8 * n * n / 5
