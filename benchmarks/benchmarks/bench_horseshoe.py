"""asv: horseshoe EP — the compiled tilted-moment quadratures, one parallel EP iteration, a small fit."""
import warnings

import numpy as np

from fastep import MultiTaskHorseshoeRegression
from fastep._horseshoe import parallel_ep as eng
from fastep._epcore import horseshoe as core


def _cavities(d, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.normal(size=d) * 10.0 ** rng.uniform(-2, 0.5, d)
    eta = 10.0 ** rng.uniform(-3, 0, d)
    nu = 10.0 ** rng.uniform(-4, -1, d)
    xi = 10.0 ** rng.uniform(-0.5, 0.5, d)
    return m, eta, nu, xi


def _task(n, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = np.zeros(d)
    w[:10] = rng.uniform(1, 3, 10)
    y = X @ w + 0.5 * rng.normal(size=n)
    return eng.Task(X - X.mean(axis=0), y - y.mean())


class TiltedMoments:
    """Eqs 15-21 for d features in one GIL-free call (1 thread and the OpenMP default)."""
    params = [[10_000, 100_000], ["1", "default"]]
    param_names = ["d", "threads"]

    def setup(self, d, threads):
        self.cav = _cavities(d)
        self.threads = 1 if threads == "1" else None

    def time_tilted_moments(self, d, threads):
        core.tilted_moments(*self.cav, n_threads=self.threads)


class EPIteration:
    """One parallel EP iteration (marginals eqs 2-13 + site step eqs 14-25) at n = 100, from the
    converged sites (made once per class, ``setup_cache``)."""
    params = [[1000, 10_000], [0, 10]]
    param_names = ["d", "m"]
    timeout = 600

    def setup_cache(self):
        sites = {}
        for d in self.params[0]:
            for m in self.params[1]:
                task, cf, hyper, site = self._problem(d, m)
                eng.run_task_ep(task, *hyper, cf, site, tol=1e-6, max_iter=300)
                sites[d, m] = site
        return sites

    setup_cache.timeout = 900

    @staticmethod
    def _problem(d, m):
        cf = eng.CorrelationFactors(0.1 * np.random.default_rng(1).normal(size=(d, m)), np.ones(d))
        return _task(100, d), cf, (0.25, 1e-3, 1.0), eng.initial_sites(d, 1e-3, 1.0)

    def setup(self, sites, d, m):
        self.task, self.cf, self.hyper, _ = self._problem(d, m)
        self.sites = sites[d, m]

    def time_marginals(self, sites, d, m):
        eng._marginals(self.task, *self.hyper, self.cf, self.sites)

    def time_iteration(self, sites, d, m):
        eng.run_task_ep(self.task, *self.hyper, self.cf, {k: v.copy() for k, v in self.sites.items()},
                        tol=0.0, max_iter=1)


class SmallFit:
    """Type-II ML fit: 3 tasks, d = 48, n = 30, rank-2 P, 10 L-BFGS-B iterations."""
    timeout = 600

    def setup(self):
        rng = np.random.default_rng(0)
        group = np.arange(48) % 8
        self.Xs, self.ys = [], []
        for t in range(3):
            w = np.where(np.isin(group, [t % 8, (t + 3) % 8]), rng.normal(size=48), 0.0)
            X = rng.normal(size=(30, 48))
            self.Xs.append(X)
            self.ys.append(X @ w + 0.3 * rng.normal(size=30))

    def time_fit(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            MultiTaskHorseshoeRegression(n_components=2, random_state=0, max_opt_iter=10).fit(self.Xs, self.ys)
