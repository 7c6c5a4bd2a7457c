"""Input validation shared by every estimator: shapes, finiteness, dtypes, labels.

Every check raises ``ValueError`` (bad value or shape) or ``TypeError`` (wrong
kind of object) whose message names the argument and what was expected.
Validation never modifies its inputs.
"""
from __future__ import annotations

import numbers
import warnings
from typing import TYPE_CHECKING

import numpy as np

from ._linalg import cholesky_lower
from .exceptions import data_conversion_warning

if TYPE_CHECKING:
    from collections.abc import Collection
    from typing import Any, TypeVar

    from numpy.typing import NDArray

    _S = TypeVar("_S", bound=str)

__all__ = [
    "as_float_matrix", "as_float_vector", "check_X_y", "check_n_features",
    "encode_binary_labels", "encode_one_vs_rest_labels", "check_class_labels", "check_choice", "check_positive",
    "check_in_range", "check_int", "check_prior", "check_bool", "check_seed", "feature_names",
    "check_feature_names",
]


class ComplexDataError(TypeError, ValueError):
    """Complex numbers where real ones are needed: the wrong kind of data (``TypeError``) and,
    as scikit-learn reports it, a bad value (``ValueError``)."""


def _as_float_array(value: Any, name: str) -> NDArray[np.float64]:
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"{name} must be an array of numbers, got {type(value).__name__}")
    if hasattr(value, "tocsr") or hasattr(value, "todense"):       # scipy.sparse, without importing it
        raise TypeError(f"{name} is a sparse matrix; sparse input is not supported: pass a dense array "
                        f"({name}.toarray())")
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"{name} could not be converted to an array: {exc}") from None
    if np.iscomplexobj(arr):
        raise ComplexDataError(f"Complex data not supported: {name} must hold real numbers, got complex values")
    if arr.dtype == object:                  # e.g. a DataFrame of mixed dtypes: numbers only
        try:
            return arr.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must hold real numbers: {exc}") from None
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return arr.astype(np.float64, copy=False)


def _check_finite(arr: NDArray[Any], name: str) -> None:
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        where = tuple(int(i) for i in bad)
        raise ValueError(f"{name} must be finite (no NaN or inf); found {arr[tuple(bad)]} at index "
                         f"{where if len(where) > 1 else where[0]}")


def as_float_matrix(value: Any, name: str, *, min_rows: int = 1, min_cols: int = 1) -> NDArray[np.float64]:
    """Return a C-contiguous float64 copy-if-needed 2-D array, checked finite and non-empty."""
    arr = _as_float_array(value, name)
    if arr.ndim != 2:
        hint = (" Reshape your data either using X.reshape(-1, 1) if it has a single feature or "
                "X.reshape(1, -1) if it is a single sample.") if arr.ndim == 1 else ""
        raise ValueError(f"{name} must be a 2-D array (n_samples, n_features), got shape {arr.shape}.{hint}")
    if arr.shape[0] < min_rows or arr.shape[1] < min_cols:
        raise ValueError(
            f"{name} must have at least {min_rows} row(s) and {min_cols} column(s), got shape {arr.shape}: "
            f"found {arr.shape[0]} sample(s) and {arr.shape[1]} feature(s) (shape={arr.shape}) while a "
            f"minimum of {min_rows if arr.shape[0] < min_rows else min_cols} is required.")
    _check_finite(arr, name)
    return np.ascontiguousarray(arr)


def as_float_vector(value: Any, name: str, *, length: int | None = None) -> NDArray[np.float64]:
    """Return a C-contiguous float64 1-D array, checked finite (and of ``length`` if given)."""
    arr = _as_float_array(value, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"{name} must have length {length}, got {arr.shape[0]}")
    _check_finite(arr, name)
    return np.ascontiguousarray(arr)


def check_X_y(X: Any, y: Any, *, y_numeric: bool = False) -> tuple[NDArray[np.float64], NDArray[Any]]:
    """Validate a design matrix and a target vector of matching length.

    Returns ``(X, y)`` with ``X`` float64 C-contiguous and ``y`` a 1-D array
    (float64 if ``y_numeric``, otherwise as given, for label encoding).
    """
    X = as_float_matrix(X, "X")
    return X, check_y(y, X.shape[0], y_numeric=y_numeric)


def check_y(y: Any, n_samples: int, *, y_numeric: bool = False) -> NDArray[Any]:
    """Validate a target vector of ``n_samples`` entries (the y half of :func:`check_X_y`)."""
    if y is None:
        raise ValueError("this estimator requires y to be passed, but the target y is None")
    y_arr = np.asarray(y)
    if y_arr.ndim == 2 and y_arr.shape[1] == 1:
        warnings.warn("A column-vector y was passed when a 1d array was expected; it is used as "
                      "y.ravel()", data_conversion_warning(), stacklevel=3)
        y_arr = y_arr[:, 0]
    if y_arr.ndim != 1:
        raise ValueError(f"y must be a 1-D array of length n_samples, got shape {y_arr.shape}")
    if y_arr.shape[0] != n_samples:
        raise ValueError(
            f"X and y have inconsistent numbers of samples: X has {n_samples} rows, y has {y_arr.shape[0]} entries")
    if y_numeric:
        y_arr = as_float_vector(y_arr, "y")
    elif y_arr.dtype.kind == "f":
        _check_finite(y_arr, "y")
    elif y_arr.dtype == object:
        if any(v is None or (isinstance(v, float) and not np.isfinite(v)) for v in y_arr):
            raise ValueError("y must not contain None or non-finite labels")
    return y_arr


def feature_names(X: Any, name: str = "X") -> NDArray[np.object_] | None:
    """The column names of a data frame ``X`` when they are all strings, else None.

    As scikit-learn records them: an object array of the names of ``X.columns`` (pandas and
    any frame with a ``columns`` attribute). Names of mixed types (some strings, some not) are
    a ``TypeError``; names that are all non-strings (a frame's default integer columns) are
    not feature names.
    """
    columns = getattr(X, "columns", None)
    if columns is None or isinstance(X, np.ndarray):
        return None
    names = list(columns)
    kinds = [isinstance(column, str) for column in names]
    if not names or not any(kinds):
        return None
    if not all(kinds):
        types = sorted({type(column).__name__ for column in names})
        raise TypeError(f"{name}'s column names must be all strings (feature names) or none; got "
                        f"{', '.join(types)}. Convert them with {name}.columns = {name}.columns.astype(str)")
    return np.asarray(names, dtype=object)


def check_feature_names(estimator: object, X: Any, name: str = "X") -> None:
    """Compare the column names of a prediction-time ``X`` with ``estimator.feature_names_in_``.

    Names that differ from those seen in ``fit``, or come in another order, are a
    ``ValueError`` (the columns would be used by position, wrongly). A frame without names
    for an estimator fitted with them, or the reverse, is a ``UserWarning``.
    """
    fitted = getattr(estimator, "feature_names_in_", None)
    given = feature_names(X, name)
    who = type(estimator).__name__
    if fitted is None and given is None:
        return
    if fitted is None:
        warnings.warn(f"{name} has feature names, but {who} was fitted without feature names",
                      UserWarning, stacklevel=4)
        return
    if given is None:
        warnings.warn(f"{name} does not have valid feature names, but {who} was fitted with feature "
                      f"names", UserWarning, stacklevel=4)
        return
    if len(given) == len(fitted) and all(a == b for a, b in zip(given, fitted)):
        return
    unseen = [str(n) for n in given if n not in set(fitted)]
    missing = [str(n) for n in fitted if n not in set(given)]
    parts = []
    if unseen:
        parts.append(f"feature names unseen at fit time: {', '.join(unseen[:10])}")
    if missing:
        parts.append(f"feature names seen at fit time, yet now missing: {', '.join(missing[:10])}")
    if not parts:
        parts.append("the feature names must be in the same order as in fit")
    raise ValueError(f"The feature names of {name} should match those that were passed during fit "
                     f"({who}.feature_names_in_); " + "; ".join(parts))


def check_n_features(X: Any, n_features: int, name: str = "X", *, estimator: object = None) -> NDArray[np.float64]:
    """Validate a prediction-time matrix against the number of features seen in ``fit``
    (and, with ``estimator``, its column names against ``estimator.feature_names_in_``)."""
    if estimator is not None:
        check_feature_names(estimator, X, name)
    X = as_float_matrix(X, name)
    if X.shape[1] != n_features:
        who = "the estimator" if estimator is None else type(estimator).__name__
        raise ValueError(f"{name} has {X.shape[1]} features, but {who} is expecting {n_features} features "
                         f"as input (the number it was fitted with)")
    return X


def check_class_labels(y: Any) -> None:
    """Class labels, not a continuous target (float labels must be integral)."""
    y = np.asarray(y)
    if y.dtype.kind == "f" and np.any(y != np.round(y)):
        raise ValueError("Unknown label type: continuous. y holds non-integer floats; a classifier needs "
                         "class labels (use a regressor for a continuous target)")


def _sorted_classes(y: Any) -> tuple[NDArray[Any], NDArray[np.intp]]:
    """The sorted distinct class labels of ``y`` and each entry's index among them (1-D)."""
    check_class_labels(y)
    try:
        classes, inverse = np.unique(y, return_inverse=True)
    except TypeError as exc:
        raise TypeError(f"y labels must be mutually comparable: {exc}") from None
    return classes, inverse.reshape(-1)


def encode_binary_labels(y: Any) -> tuple[NDArray[Any], NDArray[np.float64]]:
    """Map two arbitrary class labels to -1/+1 (sorted order: classes_[1] is the positive class).

    Returns ``(classes, y_pm)``. Raises ``ValueError`` for one class or more than two.
    """
    classes, inverse = _sorted_classes(y)
    if classes.shape[0] < 2:
        raise ValueError(
            f"y must contain two classes for a binary classifier; got only one class: {classes.tolist()}")
    if classes.shape[0] > 2:
        raise ValueError(
            f"Only binary classification is supported. y must contain exactly two classes for a binary "
            f"classifier; got {classes.shape[0]}: "
            f"{classes.tolist()[:10]}")
    return classes, np.where(inverse == 1, 1.0, -1.0)


def encode_class_indices(y: Any) -> tuple[NDArray[Any], NDArray[np.int32]]:
    """Sorted classes and every label's index among them (int32), for a joint multiclass model.

    Raises ``ValueError`` for a single class.
    """
    classes, inverse = _sorted_classes(y)
    if classes.shape[0] < 2:
        raise ValueError(f"y must contain at least two classes; got only one class: {classes.tolist()}")
    return classes, np.ascontiguousarray(inverse, dtype=np.int32)


def encode_one_vs_rest_labels(y: Any) -> tuple[NDArray[Any], list[NDArray[np.float64]]]:
    """Sorted classes and ±1 targets: one vector for two classes, one per class (one-vs-rest) above.

    Returns ``(classes, targets)`` with ``targets`` a list of float64 vectors; for two
    classes ``classes[1]`` is the positive class. Raises ``ValueError`` for a single class.
    """
    classes, inverse = _sorted_classes(y)
    if classes.shape[0] < 2:
        raise ValueError(f"y must contain at least two classes; got only one class: {classes.tolist()}")
    if classes.shape[0] == 2:
        return classes, [np.where(inverse == 1, 1.0, -1.0)]
    return classes, [np.where(inverse == c, 1.0, -1.0) for c in range(classes.shape[0])]


def check_choice(value: _S, name: str, choices: Collection[str]) -> _S:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def _check_real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if np.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    return value


def check_positive(value: Any, name: str, *, allow_inf: bool = False) -> float:
    """Raise unless ``value`` is a real number > 0 (finite unless ``allow_inf``)."""
    value = _check_real(value, name)
    if not value > 0 or (not allow_inf and not np.isfinite(value)):
        raise ValueError(f"{name} must be {'> 0' if allow_inf else 'finite and > 0'}, got {value!r}")
    return value


def check_in_range(value: Any, name: str, low: float, high: float, *, low_inclusive: bool = True,
                   high_inclusive: bool = True) -> float:
    """Raise unless ``low <= value <= high`` (strictness per flag)."""
    value = _check_real(value, name)
    ok_low = value >= low if low_inclusive else value > low
    ok_high = value <= high if high_inclusive else value < high
    if not (ok_low and ok_high):
        lb = "[" if low_inclusive else "("
        hb = "]" if high_inclusive else ")"
        raise ValueError(f"{name} must be in {lb}{low}, {high}{hb}, got {value!r}")
    return value


def check_int(value: Any, name: str, *, minimum: int | None = None) -> int:
    """Raise unless ``value`` is an integer (not bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_prior(prior_mean: Any, prior_cov: Any, n_features: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Validate a Gaussian prior N(prior_mean, prior_cov) on R^n_features.

    ``prior_mean``: None (zeros), a scalar, or a vector of length n_features.
    ``prior_cov``: a positive scalar (isotropic), a vector of positive variances
    (diagonal), or a symmetric positive-definite matrix.
    Returns ``(mean, cov)`` as a float64 vector and a C-contiguous matrix.
    """
    d = n_features
    if prior_mean is None:
        mean = np.zeros(d)
    elif np.ndim(prior_mean) == 0:
        mean = np.full(d, _check_real(prior_mean, "prior_mean"))
        _check_finite(mean, "prior_mean")
    else:
        mean = as_float_vector(prior_mean, "prior_mean", length=d)
    if prior_cov is None:
        raise TypeError("prior_cov must be a positive scalar, a vector of variances or a matrix, got None")
    if np.ndim(prior_cov) == 0:
        cov = np.eye(d) * check_positive(prior_cov, "prior_cov")
    elif np.ndim(prior_cov) == 1:
        var = as_float_vector(prior_cov, "prior_cov", length=d)
        if np.any(var <= 0):
            raise ValueError("prior_cov given as a vector of variances must be > 0 everywhere")
        cov = np.diag(var)
    else:
        cov = as_float_matrix(prior_cov, "prior_cov")
        if cov.shape != (d, d):
            raise ValueError(f"prior_cov must have shape ({d}, {d}), got {cov.shape}")
        scale = max(np.max(np.abs(cov)), np.finfo(float).tiny)
        if np.max(np.abs(cov - cov.T)) > 1e-10 * scale:
            raise ValueError("prior_cov must be symmetric")
        cov = np.ascontiguousarray(0.5 * (cov + cov.T))
        try:
            cholesky_lower(cov)
        except np.linalg.LinAlgError:
            raise ValueError("prior_cov must be positive definite (its Cholesky factorisation failed)") from None
    return mean, np.ascontiguousarray(cov)


def check_bool(value: Any, name: str) -> bool:
    """Return ``bool(value)``; raise ``TypeError`` unless ``value`` is a bool (Python or numpy)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def check_seed(random_state: Any, name: str = "random_state") -> int:
    """Integer seed from ``random_state``: None means 0 (fits are reproducible by default).

    Raises ``ValueError`` unless ``random_state`` is None or a non-negative integer (not a bool).
    """
    rs = random_state
    if rs is None:
        return 0
    if isinstance(rs, (int, np.integer)) and not isinstance(rs, (bool, np.bool_)) and rs >= 0:
        return int(rs)
    raise ValueError(f"{name} must be None or a non-negative integer, got {rs!r}")
