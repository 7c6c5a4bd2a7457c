"""feature_names_in_: recorded from a data frame's string columns, checked at prediction,
saved and loaded."""
import warnings

import numpy as np
import pytest

import fastep
from fastep.kernels import RBF
from support import ESTIMATORS as REGISTRY, configured

pd = pytest.importorskip("pandas")


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y_class = np.where(X[:, 0] - X[:, 1] > 0, "a", "b")
    y_real = X[:, 0] - 0.5 * X[:, 2] + 0.1 * rng.normal(size=n)
    return X, y_class, y_real


# every registered estimator at fixed hyperparameters (the names are the point, not the fit)
ESTIMATORS = configured({
    "GaussianProcessClassifier": {"optimizer": None},
    "GaussianProcessRegressor": {"optimizer": None},
    "SparseGPClassifier": {"optimizer": None},
    "SparseGPRegressor": {"optimizer": None},
    "IVMClassifier": {"kernel": RBF(1.0, 0.5), "n_iterations": 0},
    "IVMRegressor": {"n_iterations": 0},
    "IVMOrdinalRegressor": {"n_iterations": 0},
    "HorseshoeRegression": {"max_optimizer_iter": 2},
}, exclude={"MultiTaskHorseshoeRegression": "fits a list of per-task arrays, not one table of named columns",
            "LinearEPRankK": "fits X of shape (n, k, d), not a table of named columns"})
COLUMNS = ["height", "weight", "age"]


def _fit(name, X, seed=0):
    _, y_class, y_real = _data(seed=seed)
    y = {"binary": y_class, "regression": y_real, "ordinal": np.digitize(y_real, [-0.5, 0.5])}[REGISTRY[name].task]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastep.ConvergenceWarning)
        return ESTIMATORS[name]().fit(X, y)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_names_are_recorded_checked_and_saved(name, tmp_path):
    X = _data()[0]
    frame = pd.DataFrame(X, columns=COLUMNS)
    model = _fit(name, frame)
    assert isinstance(model.feature_names_in_, np.ndarray) and model.feature_names_in_.dtype == object
    assert list(model.feature_names_in_) == COLUMNS
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        expected = model.predict(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # the fit's own names: no warning
        np.testing.assert_array_equal(model.predict(frame), expected)

    with pytest.raises(ValueError, match="same order"):
        model.predict(frame[["weight", "height", "age"]])
    with pytest.raises(ValueError, match="unseen at fit time: mass"):
        model.predict(frame.rename(columns={"weight": "mass"}))

    fastep.save(model, tmp_path / "model.npz")
    loaded = fastep.load(tmp_path / "model.npz")
    assert list(loaded.feature_names_in_) == COLUMNS and loaded.feature_names_in_.dtype == object
    with pytest.raises(ValueError, match="same order"):
        loaded.predict(frame[["age", "weight", "height"]])


@pytest.mark.parametrize("name", ["GaussianProcessClassifier", "LinearEPRegressor"])
def test_arrays_and_integer_columns_record_no_names(name):
    X = _data()[0]
    assert not hasattr(_fit(name, X), "feature_names_in_")
    assert not hasattr(_fit(name, pd.DataFrame(X)), "feature_names_in_")     # columns 0, 1, 2
    model = _fit(name, pd.DataFrame(X, columns=COLUMNS))
    refit = model.fit(X, _fit(name, X).predict(X))                            # refit on an array
    assert refit is model and not hasattr(model, "feature_names_in_")
    with pytest.warns(UserWarning, match="fitted without feature names"):
        model.predict(pd.DataFrame(X, columns=COLUMNS))


def test_mixed_column_types_are_refused_and_a_failed_fit_keeps_the_names():
    X, y, _ = _data()
    model = fastep.LinearEPClassifier().fit(pd.DataFrame(X, columns=COLUMNS), y)
    with pytest.raises(TypeError, match="column names must be all strings"):
        model.fit(pd.DataFrame(X, columns=["a", 1, "c"]), y)
    bad = pd.DataFrame(X, columns=["x", "y", "z"])
    bad.iloc[0, 0] = np.nan
    with pytest.raises(ValueError):
        model.fit(bad, y)
    assert list(model.feature_names_in_) == COLUMNS
