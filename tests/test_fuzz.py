"""Fuzzed inputs across every estimator, kernel and likelihood.

Each generated case either fits, with finite predictions, or raises ``ValueError`` /
``TypeError`` whose message names the argument at fault; a failed ``fit`` leaves a previously
fitted estimator exactly as it was; no input array is modified. Classes of input:

- X: scale 1e-12 ... 1e12; random, duplicated rows, a constant column, collinear columns, all
  rows identical; n = 1, 2, 3, 4, 7, 15 rows; 1-3 features; dtypes float64, float32, int64,
  bool, object; C order, Fortran order, strided (non-contiguous) views, read-only arrays; NaN
  or inf in X or y;
- y (classifiers): int, str, bool, float-valued integers, object arrays of ints, numpy
  strings, imbalanced labels (one of the classes a single point); y (regressors): scale
  1e-12 ... 1e12, constant;
- fixed kernels with variances and inverse widths 1e-12 ... 1e12; likelihoods with extreme
  slopes, biases and flip rates; site kernels at extreme cavities.
"""
import re
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastep
from fastep import ConvergenceWarning
from fastep.exceptions import DataConversionWarning
from fastep.kernels import RBF
from support import ESTIMATORS as REGISTRY, configured

# large fuzz budgets: their own tier (conftest.TIERS)
pytestmark = pytest.mark.fuzz

# every registered estimator that fits a table X with targets y, at small sizes, plus the
# variants that take another engine (multinomial, Student-t)
ALL = configured({
    "GaussianProcessClassifier": {},
    "SparseGPClassifier": {"n_inducing": 5},
    "IVMClassifier": {"active_set_size": 5, "max_optimizer_iter": 10},
    "LinearEPClassifier": {"fit_intercept": True},
    "SparseGPRegressor": {"n_inducing": 5},
    "IVMRegressor": {"active_set_size": 5, "max_optimizer_iter": 10},
    "LinearEPRegressor": {"fit_intercept": True},
    "HorseshoeRegression": {"max_optimizer_iter": 3, "max_sweeps": 200},
    "IVMOrdinalRegressor": {"active_set_size": 5, "max_optimizer_iter": 10},
}, variants={
    "GaussianProcessClassifier-multinomial": ("GaussianProcessClassifier", {"multi_class": "multinomial"}),
    "GaussianProcessRegressor-student_t": ("GaussianProcessRegressor", {"likelihood": "student_t"}),
    "SparseGPRegressor-student_t": ("SparseGPRegressor", {"n_inducing": 5, "likelihood": "student_t"}),
}, exclude={"MultiTaskHorseshoeRegression": "fits lists of per-task arrays: test_multi_task_horseshoe_bad_inputs",
            "LinearEPRankK": "fits X of shape (n, k, d): test_rank_k_ep_bad_inputs"})


def _task(case):
    return REGISTRY[case.split("-")[0]].task


CLASSIFIERS = {case: make for case, make in ALL.items() if _task(case) == "binary"}
REGRESSORS = {case: make for case, make in ALL.items() if _task(case) == "regression"}
ORDINAL = {case: make for case, make in ALL.items() if _task(case) == "ordinal"}

# what a clear error names: the argument (X, y, a parameter) or what was wrong with it
NAMES = re.compile(r"\b(X|y|Xs|ys|kernel|likelihood|jitter|classes?|labels?|samples?|features?|column|"
                   r"noise_variance|n_samples|active_set_size|n_inducing|slope|bias|theta)\b")


def _settings(n):
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _design(seed, n, p, scale, structure, dtype, layout):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p)) * scale
    if structure == "duplicated" and n > 1:
        X[n // 2:] = X[: n - n // 2]
    elif structure == "constant_column":
        X[:, 0] = 3.0 * scale
    elif structure == "collinear" and p > 1:
        X[:, 1] = 2.0 * X[:, 0]
    elif structure == "identical":
        X[:] = X[0]
    if dtype == "float32":
        X = X.astype(np.float32)
    elif dtype == "int64":
        X = np.round(X / max(scale, 1e-300) * 3).astype(np.int64)
    elif dtype == "bool":
        X = X > 0
    elif dtype == "object":
        X = X.astype(object)
    if layout == "F":
        X = np.asfortranarray(X)
    elif layout == "strided":
        wide = np.zeros((X.shape[0], 2 * X.shape[1]), dtype=X.dtype)
        wide[:, ::2] = X
        X = wide[:, ::2]
    elif layout == "readonly":
        X = X.copy()
        X.setflags(write=False)
    return X


def _labels(seed, n, kind, imbalanced):
    rng = np.random.default_rng(seed + 1)
    codes = rng.integers(0, 2, size=n)
    if imbalanced and n > 1:
        codes[:] = 0
        codes[rng.integers(n)] = 1
    if kind == "int":
        return np.where(codes == 1, 7, -3)
    if kind == "str":
        return np.where(codes == 1, "yes", "no")
    if kind == "bool":
        return codes == 1
    if kind == "float_int":
        return codes.astype(float) * 2.0
    if kind == "object_int":
        return np.array([int(c) + 10 for c in codes], dtype=object)
    return np.array([["cat", "dog"][c] for c in codes])          # numpy unicode


def _corrupt(X, y, how, seed):
    if how is None:
        return X, y
    rng = np.random.default_rng(seed + 2)
    value = np.nan if how.startswith("nan") else np.inf
    if how.endswith("X"):
        X = np.array(X, dtype=float) if X.dtype.kind in "biu" or X.dtype == object else X.copy()
        X[rng.integers(X.shape[0]), rng.integers(X.shape[1])] = value
    else:
        y = np.array(y, dtype=float) if y.dtype.kind != "f" else y.copy()
        y[rng.integers(y.shape[0])] = value
    return X, y


def _snapshot(model, X):
    out = []
    for method in ("predict", "predict_proba", "predict_latent", "decision_function"):
        if hasattr(model, method):
            value = getattr(model, method)(X)
            out.extend(value if isinstance(value, tuple) else [value])
    return out


def _check_outputs(model, X, classifier):
    Xf = np.asarray(X, dtype=float)
    for value in _snapshot(model, Xf):
        value = np.asarray(value)
        if value.dtype.kind == "f":
            assert np.all(np.isfinite(value)), f"non-finite predictions from {type(model).__name__}"
    if classifier and hasattr(model, "predict_proba"):
        proba = model.predict_proba(Xf)
        assert np.all((proba >= 0) & (proba <= 1)) and np.allclose(proba.sum(axis=1), 1.0)
        assert set(model.predict(Xf).tolist()) <= set(np.asarray(model.classes_).tolist())


def _reference_fit(name):
    """The estimator fitted on a well-posed problem, and a probe set with its outputs."""
    rng = np.random.default_rng(99)
    X = rng.normal(size=(20, 2))
    if name in CLASSIFIERS:
        y = np.where(X[:, 0] > 0, "b", "a")
    elif name in ORDINAL:
        y = np.digitize(X[:, 0], [-0.5, 0.5])
    else:
        y = X[:, 0] + 0.1 * rng.normal(size=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = ALL[name]().fit(X, y)
    probe = rng.normal(size=(5, 2))
    return model, probe, [np.array(v, copy=True) for v in _snapshot(model, probe)]


def _run_case(name, X, y, classifier):
    model, probe, before = _reference_fit(name)
    X_saved = X.copy() if isinstance(X, np.ndarray) else X
    y_saved = y.copy()
    flags = X.flags.writeable if isinstance(X, np.ndarray) else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", DataConversionWarning)
        try:
            model.fit(X, y)
        except (ValueError, TypeError) as error:
            message = str(error)
            assert NAMES.search(message), f"{name}: the error does not name the argument: {message!r}"
            after = _snapshot(model, probe)
            for a, b in zip(before, after):                 # the earlier fit is intact
                assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), f"{name}: a failed fit changed the model"
            outcome = "error"
        else:
            _check_outputs(model, np.asarray(X)[:, : model.n_features_in_] if hasattr(model, "n_features_in_")
                           else X, classifier)
            outcome = "fit"
    # inputs untouched (values, dtype, write flag)
    assert X.dtype == X_saved.dtype and np.array_equal(X, X_saved, equal_nan=X.dtype.kind == "f")
    assert y.dtype == y_saved.dtype and np.array_equal(y, y_saved, equal_nan=y.dtype.kind == "f")
    if flags is not None:
        assert X.flags.writeable == flags
    return outcome


CASE = dict(seed=st.integers(0, 2**16), n=st.sampled_from([1, 2, 3, 4, 7, 15]), p=st.sampled_from([1, 2, 3]),
            scale=st.sampled_from([1e-12, 1e-6, 1.0, 1e6, 1e12]),
            structure=st.sampled_from(["random", "duplicated", "constant_column", "collinear", "identical"]),
            dtype=st.sampled_from(["float64", "float32", "int64", "bool", "object"]),
            layout=st.sampled_from(["C", "F", "strided", "readonly"]),
            corruption=st.sampled_from([None, None, None, "nan_X", "inf_X", "nan_y"]))


@pytest.mark.parametrize("name", list(CLASSIFIERS))
@_settings(60)
@given(labels=st.sampled_from(["int", "str", "bool", "float_int", "object_int", "np_str"]),
       imbalanced=st.booleans(), **CASE)
def test_fuzzed_classifier_inputs(name, seed, n, p, scale, structure, dtype, layout, corruption, labels,
                                  imbalanced):
    X = _design(seed, n, p, scale, structure, dtype, layout)
    y = _labels(seed, n, labels, imbalanced)
    if corruption == "nan_y" and labels not in ("float_int",):
        corruption = None                 # a NaN among string or integer labels is not representable
    X, y = _corrupt(X, y, corruption, seed)
    outcome = _run_case(name, X, y, classifier=True)
    if corruption is not None or n == 1:
        assert outcome == "error"


@pytest.mark.parametrize("name", list(REGRESSORS) + list(ORDINAL))
@_settings(60)
@given(y_scale=st.sampled_from([1e-12, 1e-3, 1.0, 1e3, 1e12]), constant_y=st.booleans(), **CASE)
def test_fuzzed_regressor_inputs(name, seed, n, p, scale, structure, dtype, layout, corruption, y_scale,
                                 constant_y):
    X = _design(seed, n, p, scale, structure, dtype, layout)
    rng = np.random.default_rng(seed + 5)
    if name in ORDINAL:
        y = rng.integers(0, 3, size=n)
    else:
        y = (np.full(n, 2.0) if constant_y else rng.normal(size=n)) * y_scale
    X, y = _corrupt(X, y, corruption, seed)
    outcome = _run_case(name, X, y, classifier=False)
    if corruption is not None:
        assert outcome == "error"


@pytest.mark.parametrize("make", [
    lambda k: fastep.GaussianProcessClassifier(k, optimizer=None),
    lambda k: fastep.SparseGPClassifier(k, optimizer=None, n_inducing=6, random_state=0),
    lambda k: fastep.IVMClassifier(k, optimizer=None, active_set_size=8),
    lambda k: fastep.GaussianProcessRegressor(k, optimizer=None, noise_variance=0.1),
], ids=["gpc", "sparse-gpc", "ivm", "gpr"])
@_settings(25)
@given(log_variance=st.sampled_from([-12, -6, 0, 6, 12]), log_width=st.sampled_from([-12, -6, 0, 6, 12]),
       seed=st.integers(0, 1000))
def test_fixed_kernels_with_extreme_parameters(make, log_variance, log_width, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(25, 2))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=25) > 0, 1, 0)
    model = make(RBF(10.0 ** log_variance, 10.0 ** log_width))
    if isinstance(model, fastep.GaussianProcessRegressor):
        y = X[:, 0] + 0.1 * rng.normal(size=25)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        try:
            model.fit(X, y)
        except (ValueError, TypeError) as error:        # refused: the message names the cause
            assert NAMES.search(str(error)) or "jitter" in str(error), str(error)
        else:                                           # fitted: the outputs are sound
            _check_outputs(model, X, classifier=hasattr(model, "predict_proba"))


@pytest.mark.parametrize("likelihood", [
    fastep.Probit(slope=1e-12), fastep.Probit(slope=1e12), fastep.Probit(slope=np.inf),
    fastep.Probit(bias=1e6), fastep.Probit(bias=-1e6), fastep.Step(), fastep.Step(0.49),
    fastep.Logistic(), fastep.Logistic(method="gauss-hermite"),
], ids=repr)
@pytest.mark.parametrize("make", [
    lambda lik: fastep.GaussianProcessClassifier(RBF(4.0, 1.0), lik, optimizer=None),
    lambda lik: fastep.LinearEPClassifier(lik),
    lambda lik: fastep.IVMClassifier(RBF(4.0, 1.0), lik, optimizer=None, active_set_size=10),
], ids=["gpc", "linear", "ivm"])
def test_likelihoods_with_extreme_parameters(likelihood, make):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 2))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=40) > 0, 1, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        try:
            model = make(likelihood).fit(X, y)
        except (ValueError, TypeError) as error:        # refused: the message names the cause
            assert NAMES.search(str(error)), str(error)
        else:                                           # fitted: the outputs are sound
            _check_outputs(model, X, classifier=True)


@pytest.mark.parametrize("likelihood", [fastep.Probit(), fastep.Probit(slope=np.inf), fastep.Step(0.1),
                                        fastep.Logistic(), fastep.Gaussian(1e-6), fastep.Gaussian(1e6)], ids=repr)
@_settings(40)
@given(mean=st.sampled_from([-1e12, -40.0, -1.0, 0.0, 1.0, 40.0, 1e12]),
       log_var=st.sampled_from([-300, -12, 0, 12, 300]), label=st.sampled_from([-1.0, 1.0]))
def test_site_kernels_at_extreme_cavities(likelihood, mean, log_var, label):
    y = np.array([label * (3.0 if isinstance(likelihood, fastep.Gaussian) else 1.0)])
    try:
        log_z, alpha, beta = likelihood.moments(y, np.array([mean]), np.array([10.0 ** log_var]))
    except ValueError as error:                         # refused: the message names the cause
        assert NAMES.search(str(error)) or "cavity" in str(error), str(error)
    else:
        assert np.isfinite(alpha[0]) and np.isfinite(beta[0]) and not np.isnan(log_z[0])


@pytest.mark.parametrize("make", [
    lambda: fastep.GaussianProcessClassifier(RBF(1.0, 0.5), optimizer=None),
    lambda: fastep.SparseGPClassifier(n_inducing=10, random_state=0),
    lambda: fastep.IVMClassifier(active_set_size=30),
    lambda: fastep.LinearEPClassifier(fit_intercept=True),
], ids=["gpc", "sparse-gpc", "ivm", "linear"])
def test_labels_imbalanced_one_to_a_thousand(make):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(1001, 2))
    y = np.zeros(1001, dtype=int)
    y[np.argmax(X[:, 0])] = 1                       # one positive among a thousand negatives
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = make().fit(X, y)
    _check_outputs(model, X, classifier=True)
    assert model.predict_proba(X)[:, 1].mean() < 0.1


@pytest.mark.parametrize("bad, message", [
    ("nan", "X"), ("shape", "X"), ("y_shape", "Y"), ("object", "X"),
])
def test_rank_k_ep_bad_inputs(bad, message):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 2, 3))
    Y = rng.normal(size=(20, 2))
    if bad == "nan":
        X[3, 1, 2] = np.nan
    elif bad == "shape":
        X = X[:, :, 0]
    elif bad == "y_shape":
        Y = Y[:, :1]
    else:
        X = np.array([["a"] * 3] * 2 * 20, dtype=object).reshape(20, 2, 3)
    saved = X.copy()
    with pytest.raises((ValueError, TypeError), match=message):
        fastep.LinearEPRankK().fit(X, Y)
    assert np.array_equal(X, saved, equal_nan=X.dtype.kind == "f")


@pytest.mark.parametrize("bad, message", [
    ("nan", "Xs"), ("rows", "ys"), ("features", "Xs"), ("one_row", "Xs"), ("not_list", "Xs"),
])
def test_multi_task_horseshoe_bad_inputs(bad, message):
    rng = np.random.default_rng(1)
    Xs = [rng.normal(size=(15, 4)), rng.normal(size=(12, 4))]
    ys = [rng.normal(size=15), rng.normal(size=12)]
    if bad == "nan":
        Xs[1][2, 3] = np.inf
    elif bad == "rows":
        ys[0] = ys[0][:10]
    elif bad == "features":
        Xs[1] = Xs[1][:, :3]
    elif bad == "one_row":
        Xs[0], ys[0] = Xs[0][:1], ys[0][:1]
    else:
        Xs = Xs[0]
    model = fastep.MultiTaskHorseshoeRegression(learn_hyperparameters=False).fit(
        [rng.normal(size=(15, 4))] * 2, [rng.normal(size=15)] * 2)
    before = model.coef_.copy()
    with pytest.raises((ValueError, TypeError), match=message):
        model.fit(Xs, ys)
    assert np.array_equal(model.coef_, before)
