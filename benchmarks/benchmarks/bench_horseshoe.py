"""asv: horseshoe EP — the compiled tilted-moment quadratures, one parallel EP iteration, a small fit."""
import warnings

import numpy as np

from fastep import MultiTaskHorseshoeRegression
from fastep._epcore import horseshoe as core
from fastep._epcore.horseshoe_ep import HorseshoeEP, HorseshoeOptions, HorseshoePrior


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
    return X - X.mean(axis=0), y - y.mean()


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
    """One parallel EP iteration (marginals eqs 2-13 + site step eqs 14-25, then the evidence and
    gradients at the new sites) at n = 100, from the converged sites (made once per class,
    ``setup_cache``); and the evaluation of the converged sites alone (marginals, site targets,
    evidence and gradients: ``max_sweeps=0``)."""
    params = [[1000, 10_000], [0, 10]]
    param_names = ["d", "m"]
    timeout = 600

    def setup_cache(self):
        sites = {}
        for d in self.params[0]:
            for m in self.params[1]:
                X, y, prior = self._problem(d, m)
                sites[d, m] = HorseshoeEP(X, y, 0.25, prior, HorseshoeOptions(tol=1e-6, max_sweeps=300)).run().sites
        return sites

    setup_cache.timeout = 900

    @staticmethod
    def _problem(d, m):
        prior = HorseshoePrior(1e-3, 1.0, 0.1 * np.random.default_rng(1).normal(size=(d, m)), np.ones(d))
        return (*_task(100, d), prior)

    def setup(self, sites, d, m):
        self.X, self.y, self.prior = self._problem(d, m)
        self.sites = sites[d, m]

    def time_evaluation(self, sites, d, m):
        HorseshoeEP(self.X, self.y, 0.25, self.prior, HorseshoeOptions(max_sweeps=0), self.sites).run()

    def time_iteration(self, sites, d, m):
        HorseshoeEP(self.X, self.y, 0.25, self.prior, HorseshoeOptions(tol=0.0, max_sweeps=1), self.sites).run()


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
            MultiTaskHorseshoeRegression(n_components=2, random_state=0, max_optimizer_iter=10).fit(self.Xs, self.ys)
