"""asv: fractional EP with Student-t sites (dense and sparse) and multinomial nested EP, to convergence."""
import warnings

import numpy as np

from fastep import ConvergenceWarning, GaussianProcessClassifier, StudentT
from fastep._student_t import double_loop
from fastep._epcore import student_t_ep, sparse_ep
from fastep.kernels import RBF

from . import build_engine


def _dense_double_loop(K, y, dof, scale, power, tau, nu, post_mean, post_var, cavity_mean, cavity_var, **options):
    if not hasattr(double_loop, "DenseDoubleLoopEP"):     # asv times older commits with this suite
        return double_loop.run_double_loop_ep(K, y, dof, scale, power, tau, nu, post_mean, post_var, cavity_mean,
                                              cavity_var, **options)
    return double_loop.DenseDoubleLoopEP(K, y, dof, scale, power=power, **options).run(
        tau, nu, post_mean, post_var, cavity_mean=cavity_mean, cavity_var=cavity_var)


def _sparse_double_loop(Vt, d, y, dof, scale, power, tau, nu, post_factor, post_w_mean, g_mean, g_var, **options):
    if not hasattr(double_loop, "SparseDoubleLoopEP"):    # asv times older commits with this suite
        return double_loop.run_sparse_double_loop_ep(Vt, d, y, dof, scale, power, tau, nu, post_factor,
                                                     post_w_mean, g_mean, g_var, **options)
    return double_loop.SparseDoubleLoopEP(Vt, d, y, dof, scale, power=power, **options).run(
        tau, nu, post_factor, post_w_mean, g_mean=g_mean, g_var=g_var)


def _outlier_problem(n, seed=0):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(-3, 3, n))
    y = np.sin(2 * x) + 0.1 * rng.standard_normal(n)
    out = rng.random(n) < 0.1
    y[out] += rng.choice([-1, 1], out.sum()) * rng.uniform(2, 5, out.sum())
    return x, y


class RobustDenseEP:
    params = [[200, 400]]
    param_names = ["n"]

    def setup(self, n):
        x, self.y = _outlier_problem(n)
        self.K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / 0.5 ** 2) + 1e-6 * np.eye(n)

    def time_to_convergence(self, n):
        tau, nu = np.zeros(n), np.zeros(n)
        post_mean, post_var, cavity_mean, cavity_var = (np.empty(n) for _ in range(4))
        build_engine(student_t_ep, "DenseStudentTEP", self.K, self.y, 4.0, 0.1, power=0.5, tol=1e-6).run(
            tau, nu, post_mean, post_var, cavity_mean=cavity_mean, cavity_var=cavity_var)


def _stalling_toy(n):
    """sin(2x) with noise 0.05 and 20 % gross outliers: with σ far below the noise, parallel
    fractional EP stalls (``benchmarks/double_loop_fallback.py``, seed 2)."""
    rng = np.random.default_rng(2)
    x = rng.uniform(-3, 3, n)
    y = np.sin(2 * x) + 0.05 * rng.standard_normal(n)
    out = rng.random(n) < 0.2
    y[out] += rng.choice([-1, 1], out.sum()) * rng.uniform(2, 6, out.sum())
    return x, y


class DoubleLoopFallback:
    """The double loop from the sites where parallel fractional EP stalled (σ far below the noise)."""
    params = [[60, 120]]
    param_names = ["n"]

    def setup(self, n):
        x, self.y = _stalling_toy(n)
        self.K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / 0.3 ** 2) + 1e-8 * np.eye(n)
        self.tau, self.nu = np.zeros(n), np.zeros(n)
        post_mean, post_var, cavity_mean, cavity_var = (np.empty(n) for _ in range(4))
        info = build_engine(student_t_ep, "DenseStudentTEP", self.K, self.y, 1.5, 0.01, power=0.5, tol=1e-6,
                            max_sweeps=500).run(
            self.tau, self.nu, post_mean, post_var, cavity_mean=cavity_mean, cavity_var=cavity_var)
        if info.converged:
            raise NotImplementedError("parallel EP converged: no fallback to time")   # asv skips

    def time_to_convergence(self, n):
        out = [np.empty(n) for _ in range(4)]
        _dense_double_loop(self.K, self.y, 1.5, 0.01, 0.5, self.tau.copy(), self.nu.copy(), *out, tol=1e-4,
                           max_outer=1000)


class SparseDoubleLoopFallback:
    """The sparse double loop (FITC, m = 30) from the sites where sparse parallel fractional EP
    stalled (the data of ``benchmarks/double_loop_fallback.py``, seed 2, ν = 4, σ = 0.01)."""
    params = [[200]]
    param_names = ["n"]
    timeout = 300

    def setup(self, n):
        x, self.y = _stalling_toy(n)
        z = np.linspace(-3, 3, 30)
        _, self.Vt, self.d = sparse_ep.sparse_projection(
            np.exp(-0.5 * (z[:, None] - z[None, :]) ** 2 / 0.3 ** 2),
            np.exp(-0.5 * (x[:, None] - z[None, :]) ** 2 / 0.3 ** 2), np.ones(n), jitter=1e-8)
        self.tau, self.nu = np.zeros(n), np.zeros(n)
        R, w, g_mean, g_var = self._outputs(n)
        engine = build_engine(student_t_ep, "SparseStudentTEP", self.Vt, self.d, self.y,
                              StudentT(dof=4.0, scale=0.01).site_spec(), power=0.5, tol=1e-6, max_sweeps=500)
        info = engine.run(self.tau, self.nu, R, w, g_mean=g_mean, g_var=g_var)
        if info.converged:
            raise NotImplementedError("parallel EP converged: no fallback to time")   # asv skips

    @staticmethod
    def _outputs(n):
        return [np.empty((30, 30)), np.empty(30), np.empty(n), np.empty(n)]

    def time_to_convergence(self, n):
        _sparse_double_loop(self.Vt, self.d, self.y, 4.0, 0.01, 0.5, self.tau.copy(), self.nu.copy(),
                            *self._outputs(n), tol=1e-4, max_outer=1000)


class RobustSparseEP:
    params = [[5_000, 20_000]]
    param_names = ["n"]

    def setup(self, n):
        x, self.y = _outlier_problem(n)
        z = np.linspace(-3, 3, 50)
        Kmm = np.exp(-0.5 * (z[:, None] - z[None, :]) ** 2 / 0.5 ** 2) + 1e-6 * np.eye(50)
        Knm = np.exp(-0.5 * (x[:, None] - z[None, :]) ** 2 / 0.5 ** 2)
        L = np.linalg.cholesky(Kmm)
        self.Vt = np.ascontiguousarray(np.linalg.solve(L, Knm.T).T)
        self.d = np.maximum(1.0 - np.sum(self.Vt ** 2, axis=1), 0.0)
        self.spec = StudentT(dof=4.0, scale=0.1).site_spec()

    def time_to_convergence(self, n):
        tau, nu = np.zeros(n), np.zeros(n)
        build_engine(student_t_ep, "SparseStudentTEP", self.Vt, self.d, self.y, self.spec, power=0.5, tol=1e-6).run(
            tau, nu, np.empty((50, 50)), np.empty(50), g_mean=np.empty(n), g_var=np.empty(n))

    def peakmem_to_convergence(self, n):
        self.time_to_convergence(n)


class MultinomialNestedEP:
    """Nested EP at fixed hyperparameters (3 classes)."""
    params = [[150]]
    param_names = ["n"]

    def setup(self, n):
        rng = np.random.default_rng(0)
        self.X = rng.normal(size=(n, 2))
        self.y = np.argmax(self.X @ rng.normal(size=(2, 3)) + 0.3 * rng.normal(size=(n, 3)), axis=1)

    def time_fit_fixed_hyperparameters(self, n):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            GaussianProcessClassifier(RBF(1.0, 1.0), multi_class="multinomial", optimizer=None).fit(self.X, self.y)
