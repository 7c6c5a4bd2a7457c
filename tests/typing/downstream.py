"""A downstream project's use of fastep, type-checked by ``mypy --strict`` (tests/test_typing.py).

It exercises the public API as a user's code would: every estimator (construct, fit, predict,
fitted attributes), kernels composed with ``+`` and ``*``, likelihoods, hyperpriors, the progress
callback, ``fastep.save`` / ``fastep.load`` and ``fastep.batch.fit_many``. The annotations below
are what the types of fastep must satisfy; it also runs (``python tests/typing/downstream.py``) on
tiny data (about half a minute).
"""
from __future__ import annotations

import io
import warnings

import numpy as np
from numpy.typing import NDArray

import fastep
from fastep.batch import BatchProgress, fit_many
from fastep.datasets import make_ivm_toy_classification
from fastep.hyperpriors import LogNormal
from fastep.kernels import RBF, RBFARD, Bias, Kernel, Linear, White
from fastep.likelihoods import Gaussian, Logistic, OrderedCategorical, Probit, StudentT
from fastep.progress import ProgressBar

Floats = NDArray[np.float64]


def classification(n: int, seed: int) -> tuple[Floats, NDArray[np.int_]]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(np.int_)
    return X, y


def regression(n: int, seed: int) -> tuple[Floats, Floats]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    return X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)


def kernels() -> Kernel:
    composite: Kernel = RBF(variance=1.0, inverse_width=0.5) + Linear(0.1) * Bias(1.0) + White(1e-3)
    names: list[str] = composite.hyperparameter_names
    theta: Floats = composite.theta
    assert len(names) == theta.shape[0] == composite.n_theta
    X = np.linspace(-1.0, 1.0, 6).reshape(3, 2)
    K: Floats = composite(X)
    K2, dK = composite(X, eval_gradient=True)
    diagonal: Floats = composite.diag(X)
    assert K.shape == K2.shape == (3, 3) and dK.shape == (3, 3, composite.n_theta) and diagonal.shape == (3,)
    ard = RBFARD(scales=[0.5, 0.5], transforms={"variance": "log"})
    assert ard.n_features == 2
    return composite.clone_with_theta(theta)


def linear_models() -> None:
    X, y = classification(60, 0)
    clf = fastep.LinearEPClassifier(Probit(), fit_intercept=True).fit(X, y)
    proba: Floats = clf.predict_proba(X)
    labels = clf.predict(X)
    evidence: float = clf.log_marginal_likelihood_value_
    coef: Floats = clf.coef_
    accuracy: float = clf.score(X, y)
    assert proba.shape == (60, 2) and labels.shape == (60,) and np.isfinite(evidence) and coef.shape == (2,)
    assert clf.classes_.tolist() == [0, 1] and accuracy > 0.8

    Xr, yr = regression(40, 1)
    reg = fastep.LinearEPRegressor(noise_variance=0.1).fit(Xr, yr)
    mean: Floats = reg.predict(Xr)
    mean2, std = reg.predict(Xr, return_std=True)
    assert mean.shape == mean2.shape == std.shape == (40,)
    latent_mean, latent_var = reg.predict_latent(Xr)
    assert latent_mean.shape == latent_var.shape


def rank_k() -> None:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(50, 2, 3))
    Y = np.einsum("ikd,d->ik", X, np.array([1.0, -1.0, 0.5])) + 0.1 * rng.normal(size=(50, 2))
    model = fastep.LinearEPRankK(noise_cov=0.01 * np.eye(2)).fit(X, Y)
    posterior: Floats = model.posterior_mean_
    converged: bool = model.converged_
    assert posterior.shape == (3,) and converged


def gaussian_processes() -> None:
    records: list[fastep.ProgressRecord] = []
    X, y = classification(40, 3)
    gpc = fastep.GaussianProcessClassifier(RBF(1.0, 1.0) + White(1e-4), Logistic(), optimizer=None,
                                           callback=records.append).fit(X, y)
    proba: Floats = gpc.predict_proba(X)
    scores: Floats = gpc.decision_function(X)
    evidence: float = gpc.log_marginal_likelihood_value_
    kernel = gpc.kernel_                     # a list of kernels one-vs-rest: narrow it
    assert isinstance(kernel, Kernel)
    value, gradient = gpc.log_marginal_likelihood(kernel.theta, eval_gradient=True)
    stage: str = records[-1].stage
    assert proba.shape == (40, 2) and scores.shape == (40,) and np.isfinite(evidence)
    assert np.isfinite(value) and gradient.shape == (3,) and stage == "done"

    Xr, yr = regression(40, 4)
    gpr = fastep.GaussianProcessRegressor(noise_variance=0.05, hyperprior=LogNormal(scale=2.0),
                                          optimizer=None).fit(Xr, yr)
    mean, std = gpr.predict(Xr, return_std=True)
    noise: float = gpr.noise_variance_
    assert mean.shape == std.shape == (40,) and noise == 0.05
    robust = fastep.GaussianProcessRegressor(likelihood=StudentT(dof=4.0, scale=0.3), optimizer=None).fit(Xr, yr)
    learnt: Kernel = robust.kernel_
    assert isinstance(robust.likelihood_, StudentT) and learnt.n_theta >= 1


def sparse_models() -> None:
    X, y = classification(80, 5)
    clf = fastep.SparseGPClassifier(n_inducing=8, optimizer=None, random_state=0).fit(X, y)
    Z = clf.inducing_inputs_
    proba: Floats = clf.predict_proba(X)
    assert proba.shape == (80, 2) and np.shape(Z) == (8, 2)

    Xr, yr = regression(80, 6)
    reg = fastep.SparseGPRegressor(n_inducing=8, likelihood=Gaussian(0.05), optimizer=None).fit(Xr, yr)
    mean: Floats = reg.predict(Xr)
    assert mean.shape == (80,) and reg.n_inducing_ == 8


def ivm_models() -> None:
    X, y, _ = make_ivm_toy_classification(120, random_state=0)
    clf = fastep.IVMClassifier(active_set_size=20, optimizer=None).fit(X, y)
    active: NDArray[np.intp] = clf.active_set_
    proba: Floats = clf.predict_proba(X)
    assert active.shape == (20,) and proba.shape == (120, 2)

    Xr, yr = regression(100, 7)
    reg = fastep.IVMRegressor(active_set_size=20, optimizer=None).fit(Xr, yr)
    bias: float = reg.bias_
    mean, std = reg.predict(Xr, return_std=True)
    assert np.isfinite(bias) and mean.shape == std.shape == (100,)

    levels = np.digitize(yr, [-0.5, 0.5])
    ordinal = fastep.IVMOrdinalRegressor(likelihood=OrderedCategorical(3), active_set_size=20,
                                         optimizer=None).fit(Xr, levels)
    thresholds: Floats = ordinal.likelihood_.thresholds
    assert ordinal.predict_proba(Xr).shape == (100, 3) and thresholds.shape == (2,)


def horseshoe_models() -> None:
    rng = np.random.default_rng(8)
    w = np.zeros(10)
    w[:2] = (2.0, -1.0)
    X = rng.normal(size=(30, 10))
    y = X @ w + 0.1 * rng.normal(size=30)
    single = fastep.HorseshoeRegression(max_optimizer_iter=5).fit(X, y)
    inclusion: Floats = single.inclusion_
    intercept: float = single.intercept_
    assert inclusion.shape == (10,) and np.isfinite(intercept)

    Xs = [X, rng.normal(size=(30, 10))]
    ys = [y, Xs[1] @ w + 0.1 * rng.normal(size=30)]
    multi = fastep.MultiTaskHorseshoeRegression(n_components=1, max_optimizer_iter=3, random_state=0).fit(Xs, ys)
    per_task: list[Floats] = multi.predict(Xs)
    first: Floats = multi.predict(Xs[0], task=0)
    mean, std = multi.predict(Xs[1], task=1, return_std=True)
    assert len(per_task) == 2 and first.shape == mean.shape == std.shape == (30,)


def persistence() -> None:
    X, y = classification(30, 9)
    model = fastep.GaussianProcessClassifier(optimizer=None).fit(X, y)
    buffer = io.BytesIO()
    fastep.save(model, buffer, metadata={"source": "downstream"})
    buffer.seek(0)
    loaded = fastep.load(buffer)
    assert isinstance(loaded, fastep.GaussianProcessClassifier)
    assert np.array_equal(loaded.predict_proba(X), model.predict_proba(X))


def batch() -> None:
    datasets = [regression(30, seed) for seed in range(3)]
    seen: list[BatchProgress] = []
    models = fit_many(fastep.GaussianProcessRegressor(optimizer=None), datasets, n_jobs=2, progress=seen.append)
    means: list[Floats] = [m.predict(X) for m, (X, _) in zip(models, datasets)]
    grid = fit_many([fastep.LinearEPRegressor(noise_variance=s) for s in (0.1, 1.0)], datasets[:1])
    evidences: list[float] = [m.log_marginal_likelihood_value_ for m in grid]
    outcomes = fit_many(fastep.LinearEPRegressor(), datasets, on_error="collect")
    failed = [r for r in outcomes if isinstance(r, BaseException)]
    assert len(means) == 3 and len(evidences) == 2 and not failed and len(seen) == 3


def progress_bar() -> None:
    X, y = classification(30, 10)
    stream = io.StringIO()
    bar = ProgressBar(stream, backend="plain")
    fastep.GaussianProcessClassifier(optimizer=None, callback=bar).fit(X, y)
    bar.close()
    assert "done" in stream.getvalue()


def main() -> None:
    version: str = fastep.__version__
    assert version
    kernels()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastep.ConvergenceWarning)
        linear_models()
        rank_k()
        gaussian_processes()
        sparse_models()
        ivm_models()
        horseshoe_models()
        persistence()
        batch()
        progress_bar()


if __name__ == "__main__":
    main()
