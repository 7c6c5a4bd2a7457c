"""``score`` of every estimator: accuracy for classifiers, R² for regressors (fastep._base mixins).

Each fitted estimator's score is checked against the definition computed here from its own
``predict``, with and without ``sample_weight``; constant targets give a finite R²; bad
``y`` / ``sample_weight`` raise errors naming the argument.
"""
import numpy as np
import pytest

from fastep import IVMOrdinalRegressor
from fastep.kernels import RBF
from support import ESTIMATORS as REGISTRY, configured


def _data(seed=0, n=60):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    f = X[:, 0] - 0.5 * X[:, 1] + 0.3 * rng.normal(size=n)
    return X, f


# every registered estimator at fixed hyperparameters, split by what its score is
_CASES = configured({
    "GaussianProcessClassifier": {"kernel": RBF(), "optimizer": None},
    "IVMClassifier": {"kernel": RBF(), "active_set_size": 15, "optimizer": None},
    "SparseGPClassifier": {"kernel": RBF(), "optimizer": None},
    "GaussianProcessRegressor": {"kernel": RBF(), "noise_variance": 0.1, "optimizer": None},
    "IVMRegressor": {"kernel": RBF(), "noise_variance": 0.1, "active_set_size": 20, "optimizer": None},
    "LinearEPRegressor": {"noise_variance": 0.1},
    "SparseGPRegressor": {"kernel": RBF(), "noise_variance": 0.1, "optimizer": None},
    "HorseshoeRegression": {"learn_hyperparameters": False, "noise_variance": 0.1, "rho2": 1.0},
}, exclude={"IVMOrdinalRegressor": "its score is accuracy over ordered levels: test_ordinal_score_is_accuracy",
            "MultiTaskHorseshoeRegression": "no score (predictions are per task)",
            "LinearEPRankK": "no score (a posterior over weights, no predict)"})
CLASSIFIERS = {name: make for name, make in _CASES.items() if REGISTRY[name].task == "binary"}
REGRESSORS = {name: make for name, make in _CASES.items() if REGISTRY[name].task == "regression"}


@pytest.fixture(scope="module")
def fitted_classifiers():
    X, f = _data(1)
    flip = np.random.default_rng(5).random(len(f)) < 0.2            # label noise: no classifier is perfect
    y = np.where((f > 0) != flip, "pos", "neg")
    return X, y, {name: make().fit(X[:40], y[:40]) for name, make in CLASSIFIERS.items()}


@pytest.fixture(scope="module")
def fitted_regressors():
    X, f = _data(2)
    return X, f, {name: make().fit(X[:40], f[:40]) for name, make in REGRESSORS.items()}


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_classifier_score_is_weighted_accuracy(fitted_classifiers, name):
    X, y, models = fitted_classifiers
    model = models[name]
    Xt, yt = X[40:], y[40:]
    correct = model.predict(Xt) == yt
    assert 0 < correct.sum() < len(yt)     # some right, some wrong: the weights matter
    assert model.score(Xt, yt) == pytest.approx(correct.mean(), abs=1e-15)
    w = np.linspace(0.1, 2.0, len(yt))
    assert model.score(Xt, yt, sample_weight=w) == pytest.approx(np.sum(w * correct) / w.sum(), abs=1e-15)
    only_wrong = (~correct).astype(float)
    if only_wrong.any():
        assert model.score(Xt, yt, sample_weight=only_wrong) == 0.0
    assert model._estimator_type == "classifier"


@pytest.mark.parametrize("name", sorted(REGRESSORS))
def test_regressor_score_is_weighted_r2(fitted_regressors, name):
    X, f, models = fitted_regressors
    model = models[name]
    Xt, yt = X[40:], f[40:]
    pred = model.predict(Xt)
    r2 = 1.0 - np.sum((yt - pred) ** 2) / np.sum((yt - yt.mean()) ** 2)
    assert model.score(Xt, yt) == pytest.approx(r2, rel=1e-12)
    w = np.linspace(0.1, 2.0, len(yt))
    mean_w = np.sum(w * yt) / w.sum()
    r2_w = 1.0 - np.sum(w * (yt - pred) ** 2) / np.sum(w * (yt - mean_w) ** 2)
    assert model.score(Xt, yt, sample_weight=w) == pytest.approx(r2_w, rel=1e-12)
    assert model.score(Xt, yt, sample_weight=w) != pytest.approx(model.score(Xt, yt), rel=1e-9)
    assert model._estimator_type == "regressor"


@pytest.mark.parametrize("name", sorted(REGRESSORS))
def test_regressor_score_constant_targets_is_finite(fitted_regressors, name):
    X, _, models = fitted_regressors
    model = models[name]
    Xt = X[40:]
    constant = np.full(len(Xt), 0.7)
    assert model.score(Xt, constant) == 0.0            # imperfect prediction of a constant: 0, not -inf
    model_pred = model.predict(Xt)
    assert model.score(Xt, model_pred) == 1.0           # perfect prediction
    assert model.score(Xt[:1], model.predict(Xt[:1])) == 1.0   # one point: the spread is zero
    assert model.score(Xt[:1], model.predict(Xt[:1]) + 1.0) == 0.0


def test_ordinal_score_is_accuracy():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, size=90)
    X = rng.normal(size=(90, 2))
    X[:, 1] += 3.0 * labels
    model = IVMOrdinalRegressor(RBF(), active_set_size=20, optimizer=None).fit(X[:60], labels[:60])
    correct = model.predict(X[60:]) == labels[60:]
    assert model.score(X[60:], labels[60:]) == pytest.approx(correct.mean(), abs=1e-15)


@pytest.mark.parametrize("kind", ["classifier", "regressor"])
@pytest.mark.parametrize("bad, error, message", [
    ({"y": "short"}, ValueError, "y must be a 1-D array with one entry per row of X"),
    ({"y": "2d"}, ValueError, "y must be a 1-D array with one entry per row of X"),
    ({"y": None}, TypeError, "y must be an array of targets"),
    ({"sample_weight": "short"}, ValueError, "sample_weight must have length"),
    ({"sample_weight": "negative"}, ValueError, "sample_weight must be non-negative"),
    ({"sample_weight": "zeros"}, ValueError, "at least one positive entry"),
    ({"sample_weight": "nan"}, ValueError, "sample_weight must be finite"),
])
def test_score_rejects_bad_targets_and_weights(fitted_classifiers, fitted_regressors, kind, bad, error,
                                               message):
    if kind == "classifier":
        X, y, models = fitted_classifiers
        model = models[f"LinearEP{kind.capitalize()}"]
    else:
        X, y, models = fitted_regressors
        model = models[f"LinearEP{kind.capitalize()}"]
    Xt, yt = X[40:], y[40:]
    w = np.ones(len(yt))
    if "y" in bad:
        yt = {"short": yt[:-1], "2d": np.stack([yt, yt], axis=1), None: None}[bad["y"]]
    else:
        w = {"short": w[:-1], "negative": np.r_[-1.0, w[1:]], "zeros": np.zeros_like(w),
             "nan": np.r_[np.nan, w[1:]]}[bad["sample_weight"]]
    with pytest.raises(error, match=message):
        model.score(Xt, yt, sample_weight=w)


def test_regressor_score_rejects_non_finite_targets(fitted_regressors):
    X, f, models = fitted_regressors
    yt = f[40:].copy()
    yt[3] = np.inf
    with pytest.raises(ValueError, match="y must be finite"):
        models["GaussianProcessRegressor"].score(X[40:], yt)
