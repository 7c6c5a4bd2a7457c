"""What the test modules share: the real data sets, the registry of public estimators and
their small problems.

``conftest.py`` turns these into fixtures and checks; test modules import what they need
from here (``from support import ESTIMATORS, shared_data``).

Real data
    The data sets live beside the repository (``../shared/data``, or the folder named by
    ``FASTEP_DATA_DIR``). Without them a test that needs one is skipped, unless
    ``FASTEP_REQUIRE_DATA=1`` (set by CI), where a missing file fails the test instead: a
    skip there would pass a check that did not run.

The estimator registry
    One entry per estimator class that ``fastep.__all__`` exports (``tests/test_registry.py``
    checks the two are equal), each with a small valid configuration and the kind of problem
    it fits. Every test that loops over estimators builds its cases from the registry
    (:func:`estimator_params`), so a new estimator reaches the persistence, soak, fuzz,
    progress and scikit-learn checks as soon as it is registered; a module that leaves one
    out names it with the reason.
"""
from __future__ import annotations

import inspect
import os
import pathlib
from dataclasses import dataclass, field

import numpy as np
import pytest

import fastep

# ---------------------------------------------------------------------------------------------
# real data
# ---------------------------------------------------------------------------------------------

DATA_DIR = pathlib.Path(os.environ.get("FASTEP_DATA_DIR")
                        or pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data")


def data_required() -> bool:
    """Whether a missing data file fails the test (``FASTEP_REQUIRE_DATA=1``) instead of skipping it."""
    return os.environ.get("FASTEP_REQUIRE_DATA", "") not in ("", "0")


def shared_data(name: str) -> pathlib.Path:
    """The path of data file ``name`` (relative to the data folder); skip, or fail when required,
    if it is absent."""
    path = DATA_DIR / name
    if not path.exists():
        message = f"data file {path} is not available (FASTEP_DATA_DIR or ../shared/data)"
        if data_required():
            pytest.fail(message + "; FASTEP_REQUIRE_DATA is set", pytrace=False)
        pytest.skip(message)
    return path


# ---------------------------------------------------------------------------------------------
# small problems, one per kind of estimator
# ---------------------------------------------------------------------------------------------

def task_data(task: str, seed: int = 0, n: int = 60):
    """``(X, y)`` of a small problem of kind ``task``.

    ``binary``: three inputs, labels 0/1 from a noisy linear rule; ``multiclass``: three labels;
    ``regression``: a noisy linear target; ``ordinal``: three ordered levels; ``multitask``:
    two tasks of n/2 rows each (lists of arrays); ``rank_k``: X of shape (n, 2, 3) and two
    outputs per row.
    """
    rng = np.random.default_rng(seed)
    if task == "rank_k":
        X = rng.normal(size=(n, 2, 3))
        return X, X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=(n, 2))
    X = rng.normal(size=(n, 3))
    f = X[:, 0] - 0.5 * X[:, 1] + 0.3 * rng.normal(size=n)
    if task == "binary":
        return X, (f > 0).astype(int)
    if task == "multiclass":
        return X, np.digitize(f, [-0.5, 0.5])
    if task == "ordinal":
        return X, np.digitize(f, [-0.5, 0.5])
    if task == "regression":
        return X, f
    if task == "multitask":
        half = n // 2
        return [X[:half], X[half:]], [f[:half], f[half:]]
    raise ValueError(f"unknown task {task!r}")


# ---------------------------------------------------------------------------------------------
# the registry
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EstimatorSpec:
    """A public estimator with a small valid configuration and the kind of problem it fits."""

    cls: type
    task: str
    params: dict = field(default_factory=dict)
    #: what ``fit`` takes: ``"Xy"`` (scikit-learn's ``fit(X, y)`` on 2-D X), or another shape
    fit_shape: str = "Xy"

    @property
    def name(self) -> str:
        return self.cls.__name__

    def make(self, **overrides):
        """A new estimator with the registry's configuration updated by ``overrides``."""
        return self.cls(**{**self.params, **overrides})

    def data(self, seed: int = 0, n: int = 60):
        return task_data(self.task, seed=seed, n=n)


_SPECS = [
    EstimatorSpec(fastep.GaussianProcessClassifier, "binary"),
    EstimatorSpec(fastep.GaussianProcessRegressor, "regression"),
    EstimatorSpec(fastep.SparseGPClassifier, "binary", {"n_inducing": 8, "random_state": 0}),
    EstimatorSpec(fastep.SparseGPRegressor, "regression", {"n_inducing": 8, "random_state": 0}),
    EstimatorSpec(fastep.IVMClassifier, "binary", {"active_set_size": 10, "n_iterations": 1}),
    EstimatorSpec(fastep.IVMRegressor, "regression", {"active_set_size": 10, "n_iterations": 1}),
    EstimatorSpec(fastep.IVMOrdinalRegressor, "ordinal", {"active_set_size": 10, "n_iterations": 1}),
    EstimatorSpec(fastep.LinearEPClassifier, "binary"),
    EstimatorSpec(fastep.LinearEPRegressor, "regression"),
    EstimatorSpec(fastep.HorseshoeRegression, "regression", {"max_optimizer_iter": 3}),
    EstimatorSpec(fastep.MultiTaskHorseshoeRegression, "multitask", {"max_optimizer_iter": 3}, fit_shape="tasks"),
    EstimatorSpec(fastep.LinearEPRankK, "rank_k", {"noise_cov": 0.01 * np.eye(2)}, fit_shape="rank_k"),
]

#: every public estimator by class name
ESTIMATORS: dict[str, EstimatorSpec] = {spec.name: spec for spec in _SPECS}


def public_estimator_classes() -> dict[str, type]:
    """The classes in ``fastep.__all__`` that have ``fit``."""
    return {name: getattr(fastep, name) for name in fastep.__all__
            if inspect.isclass(getattr(fastep, name)) and hasattr(getattr(fastep, name), "fit")}


def estimator_names(*, exclude: dict[str, str] | None = None) -> list[str]:
    """The registered names minus ``exclude`` (name -> why that module leaves it out)."""
    exclude = dict(exclude or {})
    unknown = set(exclude) - set(ESTIMATORS)
    if unknown:
        raise KeyError(f"exclude names estimators that are not registered: {sorted(unknown)}")
    if not all(isinstance(reason, str) and reason for reason in exclude.values()):
        raise ValueError("every excluded estimator needs its reason")
    return [name for name in ESTIMATORS if name not in exclude]


def configured(overrides: dict[str, dict] | None = None, *, exclude: dict[str, str] | None = None,
               variants: dict[str, tuple[str, dict]] | None = None) -> dict:
    """``{case name: zero-argument factory}`` over the registry.

    ``overrides`` maps a registered name to parameters that replace the registry's for this
    module; ``variants`` adds further cases, ``{case name: (registered name, parameters)}``;
    ``exclude`` leaves registered names out, each with its reason.
    """
    overrides = dict(overrides or {})
    unknown = set(overrides) - set(ESTIMATORS)
    if unknown:
        raise KeyError(f"overrides name estimators that are not registered: {sorted(unknown)}")
    cases = {}
    for name in estimator_names(exclude=exclude):
        cases[name] = _factory(ESTIMATORS[name], overrides.get(name, {}))
    for case, (name, params) in (variants or {}).items():
        cases[case] = _factory(ESTIMATORS[name], params)
    return cases


def _factory(spec, params):
    return lambda: spec.make(**params)


# ---------------------------------------------------------------------------------------------
# engines built from arrays (the compiled engines take validated arrays and a run's in/out sites)
# ---------------------------------------------------------------------------------------------

def dense_nested_ep(K, labels, n_classes, inner_precision=None, inner_natural_mean=None, **options):
    """The dense multinomial model's nested EP on kernel matrix ``K`` in one call: ``(engine, result,
    inner_precision, inner_natural_mean)``, the inner sites as the run left them (zeros to start
    when not given; given arrays are updated in place). ``options`` go to
    :class:`fastep._epcore.multiclass_ep.MultinomialEP` (``damping``, ``adaptive_damping``, ``tol``,
    ``max_sweeps``, ``validate``); ``sweep_callback`` to its ``run``."""
    from fastep._dense.multiclass import dense_posterior_of
    from fastep._epcore.multiclass_ep import MultinomialEP

    callback = options.pop("sweep_callback", None)
    n = K.shape[0]
    alpha = np.zeros((n, n_classes)) if inner_precision is None else inner_precision
    beta = np.zeros((n, n_classes)) if inner_natural_mean is None else inner_natural_mean
    engine = MultinomialEP(dense_posterior_of(K, validate=options.get("validate", True)), labels, n_classes, **options)
    result = engine.run(alpha, beta, sweep_callback=callback)
    return engine, result, alpha, beta
