"""Soak: a few hundred small fits of every estimator in one process leave no
memory growth, file descriptors or threads behind (the 10 000-fit run is
``benchmarks/soak.py``)."""
import gc
import os
import threading
import warnings

import numpy as np
import pytest

import fastep
from fastep.batch import fit_many
from fastep.kernels import RBF
from support import ESTIMATORS as REGISTRY, configured

# a long soak: its own tier (conftest.TIERS)
pytestmark = pytest.mark.soak

FITS = 150
RSS_LIMIT_MB = 20.0


def _rss_mb():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _problem(seed, kind):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(30, 3))
    if kind == "classifier":
        return X, np.where(X[:, 0] + 0.3 * rng.normal(size=30) > 0, 1, 0)
    if kind == "ordinal":
        return X, np.digitize(X[:, 0], [-0.5, 0.5])
    return X, X[:, 0] - X[:, 1] + 0.1 * rng.normal(size=30)


# every registered estimator, at its registry configuration with the learning kept short
ESTIMATORS = configured({
    "IVMClassifier": {"active_set_size": 10, "n_iterations": 1},
    "HorseshoeRegression": {"learn_hyperparameters": False},
    "MultiTaskHorseshoeRegression": {"learn_hyperparameters": False},
})


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_repeated_fits_leak_nothing(name):
    make, spec = ESTIMATORS[name], REGISTRY[name]
    kind = {"binary": "classifier", "ordinal": "ordinal", "regression": "regressor"}.get(spec.task)
    data = [_problem(seed, kind) if kind else spec.data(seed=seed, n=30) for seed in range(10)]

    def fits(count):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fastep.ConvergenceWarning)
            for i in range(count):
                X, y = data[i % len(data)]
                model = make().fit(X, y)
                if spec.fit_shape == "Xy":
                    model.predict(X)
                elif spec.fit_shape == "tasks":
                    model.predict(X[0], task=0)
                del model

    fits(20)                                   # warm-up: caches, allocator pools, lazy imports
    gc.collect()
    rss, fds, threads = _rss_mb(), _fds(), threading.active_count()
    fits(FITS)
    gc.collect()
    assert _rss_mb() - rss < RSS_LIMIT_MB
    assert _fds() == fds and threading.active_count() == threads


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_repeated_batches_and_saves_leak_nothing(tmp_path):
    data = [_problem(seed, "classifier") for seed in range(8)]
    path = tmp_path / "m.npz"

    def rounds(count):
        for _ in range(count):
            models = fit_many(fastep.GaussianProcessClassifier(RBF(), optimizer=None), data, n_jobs=2)
            fastep.save(models[0], path)
            fastep.load(path).predict(data[0][0])

    rounds(5)
    gc.collect()
    rss, fds, threads = _rss_mb(), _fds(), threading.active_count()
    rounds(30)
    gc.collect()
    assert _rss_mb() - rss < RSS_LIMIT_MB
    assert _fds() == fds and threading.active_count() == threads
