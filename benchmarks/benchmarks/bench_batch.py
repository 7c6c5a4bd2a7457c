"""asv: batch fitting (fastep.batch) -- many small fits with n_jobs 1 and 2, and the n_jobs of a
one-vs-rest classifier. Dask is measured by benchmarks/batch_fitting.py (asv does not host a
cluster across its timing repeats)."""
import warnings

import numpy as np

import fastep
from fastep.batch import fit_many
from fastep.kernels import RBF


def _datasets(count, n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        X = rng.normal(size=(n, 3))
        y = np.where(X[:, 0] + 0.5 * np.sin(2 * X[:, 1]) + 0.3 * rng.normal(size=n) > 0, 1, 0)
        out.append((X, y))
    return out


class FitMany:
    """20 dense GP classifier fits (n = 150, type-II ML)."""
    params = ([1, 2],)
    param_names = ["n_jobs"]
    timeout = 300

    def setup(self, n_jobs):
        warnings.simplefilter("ignore", fastep.ConvergenceWarning)
        self.datasets = _datasets(20, 150)
        self.estimator = fastep.GaussianProcessClassifier(RBF())

    def time_fit_many(self, n_jobs):
        fit_many(self.estimator, self.datasets, n_jobs=n_jobs)


class OneVsRestNJobs:
    """A 4-class dense GP classifier (n = 400): its one-vs-rest problems with n_jobs 1 and 2."""
    params = ([1, 2],)
    param_names = ["n_jobs"]
    timeout = 300

    def setup(self, n_jobs):
        warnings.simplefilter("ignore", fastep.ConvergenceWarning)
        rng = np.random.default_rng(1)
        centres = np.array([[0.0, 0.0], [2.5, 0.0], [0.0, 2.5], [2.5, 2.5]])
        labels = rng.integers(0, 4, size=400)
        self.X = centres[labels] + rng.normal(size=(400, 2))
        self.y = labels

    def time_fit(self, n_jobs):
        fastep.GaussianProcessClassifier(RBF(), n_jobs=n_jobs).fit(self.X, self.y)
