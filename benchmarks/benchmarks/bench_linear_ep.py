"""asv: one EP sweep of the weight-space engine, and the bare-BLAS yardstick."""
import numpy as np

from fastep import Probit
from fastep._epcore import _bench, linear_ep

from . import build_engine

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    threadpool_limits = None


def _problem(n, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) / np.sqrt(d)
    y = np.where(X @ rng.normal(size=d) > 0, 1.0, -1.0)
    return X, y


class LinearEPSweep:
    params = [[(10_000, 10), (10_000, 100), (2_000, 1000)], ["1", "default"]]
    param_names = ["(n, d)", "blas_threads"]
    timeout = 300

    def setup(self, shape, threads):
        n, d = shape
        self.X, self.y = _problem(n, d)
        self.spec = Probit().site_spec()
        self.prior_mean = np.zeros(d)
        self.prior_cov = np.eye(d)
        self.limits = None
        if threads == "1":
            if threadpool_limits is None:
                raise NotImplementedError("threadpoolctl is needed for single-threaded runs")
            self.limits = threadpool_limits(1, "blas")

    def teardown(self, shape, threads):
        if self.limits is not None:
            self.limits.unregister()

    def time_one_sweep(self, shape, threads):
        n, d = shape
        tau, nu = np.zeros(n), np.zeros(n)
        m, V = np.empty(d), np.empty((d, d))
        engine = build_engine(linear_ep, "LinearEP", self.X, self.y, self.prior_mean, self.prior_cov, self.spec,
                              max_sweeps=1, refresh_every=1)
        engine.run(tau, nu, m, V)

    def time_bare_rank1_updates(self, shape, threads):
        n, d = shape
        V = np.eye(d)
        _bench.bare_rank1_updates(V, self.X, -1e-6)
