"""Estimator plumbing shared by every fastep model (scikit-learn conventions, no dependency on it)."""
from __future__ import annotations

import functools
import inspect
import re
from typing import TYPE_CHECKING, Literal, overload

import numpy as np

from . import _validation as v
from .exceptions import not_fitted_error
from .progress import Progress, check_callback, check_verbose

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar, TypeVar

    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

    from ._typing import Callback, MeanStd

    _Fit = TypeVar("_Fit", bound=Callable[..., Any])

__all__ = ["BaseEstimator", "ClassifierMixin", "RegressorMixin", "check_is_fitted", "one_vs_rest_proba",
           "records_feature_names", "fill_doc", "deprecated_alias", "renamed_parameter", "EXAMPLES_DOC",
           "KERNEL_EXAMPLES_DOC"]


def records_feature_names(fit: _Fit) -> _Fit:
    """Decorate an estimator's ``fit(X, ...)`` to record ``feature_names_in_`` as scikit-learn does.

    After a successful fit on a data frame whose column names are all strings,
    ``feature_names_in_`` holds them (an object array); after a fit on anything else the
    attribute is absent. A fit that raises leaves the attribute as it was. Prediction methods
    compare the names of their ``X`` with it (:func:`fastep._validation.check_feature_names`).
    """
    @functools.wraps(fit)
    def fit_recording_names(self, X, *args, **kwargs):
        names = v.feature_names(X)
        fitted = fit(self, X, *args, **kwargs)
        if names is None:
            self.__dict__.pop("feature_names_in_", None)
        else:
            self.feature_names_in_ = names
        return fitted
    return fit_recording_names  # type: ignore[return-value]  # same signature as ``fit``


#: A ``%NAME%`` placeholder: alone on its line (but for spaces) it stands for a block of lines,
#: inside a line for one line of text. The pattern starts with its literal ``%``, which the regex
#: engine finds quickly (the docstrings are templated when fastep is imported).
_PLACEHOLDER = re.compile(r"%([A-Z][A-Z0-9_]*)%")
_BODY_INDENT = "    "


def fill_doc(template: str, **sections: str) -> str:
    """A docstring from ``template`` with its ``%NAME%`` placeholders replaced by shared sections.

    The one way fastep templates docstrings: text that several docstrings share (a parameter
    entry, a block of attributes, the references) is written once and named, and each
    docstring marks where it goes.

    Parameters
    ----------
    template : str
        The docstring. A placeholder alone on its line stands for a block of lines; one inside
        a line stands for a single line of text.
    **sections : str
        The text of each placeholder, written as it stands in a class docstring: the first line
        starts at the quotes, the others carry their indentation there (four spaces for the
        docstring's body). A block keeps that layout relative to its placeholder's indentation.
        Sections may hold placeholders of their own, filled from the same ``sections``.

    Returns
    -------
    str

    Raises
    ------
    ValueError
        A placeholder has no section, a section of several lines is placed inside a line, a
        line of a section is indented less than the docstring's body, or a section is not used.

    Examples
    --------
    >>> from fastep._base import fill_doc
    >>> print(fill_doc('''Fit to tolerance %TOL%.
    ...
    ...     Parameters
    ...     ----------
    ...     %PARAMETERS%
    ...     ''', TOL="1e-6", PARAMETERS='''tol : float
    ...         Stopping threshold.'''))
    Fit to tolerance 1e-6.
    <BLANKLINE>
        Parameters
        ----------
        tol : float
            Stopping threshold.
    <BLANKLINE>
    """
    unused = set(sections)

    def lines(name):
        if name not in sections:
            raise ValueError(f"docstring placeholder %{name}% has no section")
        unused.discard(name)
        first, *rest = sections[name].strip("\n").rstrip().splitlines()
        out = [first.lstrip()]
        for line in rest:
            if line.strip() and not line.startswith(_BODY_INDENT):
                raise ValueError(f"docstring section {name}: {line!r} is indented less than the docstring's body")
            out.append(line[len(_BODY_INDENT):])
        return out

    def fill(doc):
        out, done = [], 0
        for match in _PLACEHOLDER.finditer(doc):
            name, (start, end) = match[1], match.span()
            line_start = doc.rfind("\n", 0, start) + 1
            line_end = doc.find("\n", end)
            line_end = len(doc) if line_end < 0 else line_end
            indent = doc[line_start:start]
            if line_start >= done and not indent.strip(" ") and not doc[end:line_end].strip(" "):
                # alone on its line: the line (with its trailing spaces) becomes the block
                out.append(doc[done:line_start])
                out.append("\n".join(indent + line if line.strip() else "" for line in lines(name)))
                done = line_end
            else:
                found = lines(name)
                if len(found) > 1:
                    raise ValueError(f"docstring section {name} has several lines: its placeholder must "
                                     "stand alone on its line")
                out.append(doc[done:start])
                out.append(found[0])
                done = end
        out.append(doc[done:])
        return "".join(out)

    doc = template
    for _ in range(len(sections) + 1):                  # each round fills one level of nesting
        if not _PLACEHOLDER.search(doc):
            break
        doc = fill(doc)
    if _PLACEHOLDER.search(doc):
        raise ValueError("docstring sections hold each other's placeholders in a cycle")
    if unused:
        raise ValueError(f"docstring sections not used: {sorted(unused)}")
    return doc


#: The opening of an estimator's Examples section; the ESTIMATOR section is the estimator's name.
EXAMPLES_DOC = """Examples
    --------
    >>> import numpy as np
    >>> from fastep import %ESTIMATOR%
    >>> rng = np.random.default_rng(0)"""

#: The opening of a kernel's Examples section: numpy and three inputs of two features.
KERNEL_EXAMPLES_DOC = """Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0]])"""


def deprecated_alias(old: str, new: str) -> property:
    """A read-only attribute ``old`` that returns ``new`` with a ``FutureWarning``: a public name
    renamed to the glossary's (``docs/glossary.rst``) keeps working, with a warning, for one
    release.  Also list the pair in the class's ``_renamed_attributes`` so that a model file
    written before the rename loads under the new name (:mod:`fastep.persistence`).
    """
    def getter(self: Any) -> Any:
        import warnings
        warnings.warn(f"{old} is deprecated and will be removed in the next release; use {new}", FutureWarning,
                      stacklevel=2)
        return getattr(self, new)
    return property(getter, doc=f"Deprecated alias of ``{new}`` (removed in the next release).")


def renamed_parameter(estimator: Any, old: str, new: str, *, stacklevel: int = 2) -> tuple[Any, str]:
    """The value of constructor parameter ``new`` and the name it was given under: ``new``, or
    ``old`` when the deprecated name ``old`` was set (it defaults to ``"deprecated"``).

    An ``old`` that is set warns with a ``FutureWarning`` (``stacklevel`` counted from the
    caller, as :func:`warnings.warn` counts it) and raises ``ValueError`` if ``new`` was also moved from its default.  List the pair in the
    class's ``_renamed_parameters`` so that a model file written before the rename loads.
    """
    import warnings
    value = getattr(estimator, new)
    old_value = getattr(estimator, old)
    if isinstance(old_value, str) and old_value == "deprecated":
        return value, new
    warnings.warn(f"{old} is deprecated and will be removed in the next release; use {new}", FutureWarning,
                  stacklevel=stacklevel + 1)
    default = inspect.signature(type(estimator).__init__).parameters[new].default
    if not (value is default or (np.ndim(value) == 0 and np.ndim(default) == 0 and value == default)):
        raise ValueError(f"give {new} only ({old}={old_value!r} is its deprecated name; {new}={value!r})")
    return old_value, old


class BaseEstimator:
    """Minimal scikit-learn-compatible base: ``get_params``, ``set_params``, ``repr``.

    Constructor arguments are stored unchanged as attributes of the same name
    and validated in ``fit`` (as scikit-learn requires); fitted attributes end
    in an underscore.
    """

    # Every fastep estimator takes ``verbose`` and ``callback`` (:mod:`fastep.progress`).
    verbose: int
    callback: Callback
    #: Set by ``fit`` when ``X`` is a data frame whose column names are all strings.
    feature_names_in_: NDArray[np.object_]
    #: Fitted attributes renamed since earlier releases: ``{old name: new name}`` (each old name
    #: is a :func:`deprecated_alias`); a model file that holds the old name loads under the new one.
    _renamed_attributes: ClassVar[dict[str, str]] = {}

    @classmethod
    def _param_names(cls):
        sig = inspect.signature(cls.__init__)
        return sorted(
            name for name, p in sig.parameters.items()
            if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        )

    def _set_init_params(self, arguments):
        """Store the constructor's arguments (``locals()`` of ``__init__``) as attributes of the same
        names, unchanged: validation waits for ``fit``, as scikit-learn requires."""
        for name in self._param_names():
            setattr(self, name, arguments[name])

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Return the constructor parameters as a dict (nested ones as ``name__sub`` when ``deep``)."""
        out = {}
        for name in self._param_names():
            value = getattr(self, name)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                for sub_name, sub_value in value.get_params().items():
                    out[f"{name}__{sub_name}"] = sub_value
            out[name] = value
        return out

    def set_params(self, **params: Any) -> Self:
        """Set constructor parameters; returns ``self``. Unknown names raise ``ValueError``."""
        valid = set(self._param_names())
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in valid:
                raise ValueError(
                    f"invalid parameter {name!r} for {type(self).__name__}; "
                    f"valid parameters are {sorted(valid)}")
            if sub:
                getattr(self, name).set_params(**{sub: value})
            else:
                setattr(self, name, value)
        return self

    def _new_progress(self):
        """The fit's progress reporter from ``verbose`` and ``callback`` (validated here)."""
        return Progress(type(self).__name__, check_verbose(getattr(self, "verbose", 0)),
                        check_callback(getattr(self, "callback", None)))

    @staticmethod
    def _warn_if_stopped(progress, stacklevel=3):
        """The ``ConvergenceWarning`` of a fit its callback stopped."""
        if progress.stopped:
            import warnings
            from .exceptions import ConvergenceWarning
            warnings.warn(f"{progress.stop_message()}; the model is fitted with the best state reached so far "
                          "(hyperparameters: the best evaluated; EP: the current sites)",
                          ConvergenceWarning, stacklevel=stacklevel)

    def __sklearn_tags__(self):
        """scikit-learn's estimator tags (scikit-learn >= 1.6 asks for them; imported lazily, so
        fastep itself never needs scikit-learn)."""
        from sklearn.utils import InputTags, Tags, TargetTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=True),
                    input_tags=InputTags(allow_nan=False, sparse=False))

    def __sklearn_is_fitted__(self):
        """Whether ``fit`` has run (the fitted attributes end in an underscore)."""
        return any(name.endswith("_") and not name.startswith("__") for name in vars(self))

    def __repr__(self) -> str:
        defaults = {
            name: p.default for name, p in inspect.signature(type(self).__init__).parameters.items()
        }
        parts = []
        for name in self._param_names():
            value = getattr(self, name)
            default = defaults.get(name, inspect.Parameter.empty)
            try:
                same = value is default or (type(value) is type(default) and value == default)
            except Exception:  # arrays and other objects without a scalar ==
                same = False
            if not same:
                parts.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"



def _score_targets(y: Any, sample_weight: Any, n_predicted: int, *, numeric: bool
                   ) -> tuple[NDArray[Any], NDArray[np.float64] | None]:
    """Validated ``y`` (1-D, one entry per predicted row) and weights (None or finite, >= 0, not all 0)."""
    if y is None:
        raise TypeError("y must be an array of targets, got None")
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or y.shape[0] != n_predicted:
        raise ValueError(f"y must be a 1-D array with one entry per row of X ({n_predicted}), "
                         f"got shape {y.shape}")
    if numeric:
        y = v.as_float_vector(y, "y")
    if sample_weight is None:
        return y, None
    w = v.as_float_vector(sample_weight, "sample_weight", length=n_predicted)
    if np.any(w < 0) or not np.any(w > 0):
        raise ValueError("sample_weight must be non-negative with at least one positive entry")
    return y, w


class _TaskTagsMixin:
    """scikit-learn's tags of a classifier or a regressor: ``estimator_type`` from
    ``_estimator_type``, and the tags of the task (``_task_tags``: the field of sklearn's
    ``Tags`` and the name of its class in ``sklearn.utils``)."""

    def __sklearn_tags__(self):
        import sklearn.utils

        field, tags_class = self._task_tags
        tags = super().__sklearn_tags__()
        tags.estimator_type = self._estimator_type
        setattr(tags, field, getattr(sklearn.utils, tags_class)())
        return tags


class ClassifierMixin(_TaskTagsMixin):
    """``score``: the (weighted) mean accuracy of ``predict``, as scikit-learn's classifiers."""

    _estimator_type = "classifier"
    _task_tags = ("classifier_tags", "ClassifierTags")

    if TYPE_CHECKING:
        def predict(self, X: ArrayLike) -> NDArray[Any]: ...

    def score(self, X: ArrayLike, y: ArrayLike, sample_weight: ArrayLike | None = None) -> float:
        """Mean accuracy of ``predict(X)`` against ``y`` (weighted by ``sample_weight`` if given).

        Parameters
        ----------
        X : array-like (n, n_features)
        y : array-like (n,)
            True labels.
        sample_weight : array-like (n,) or None
            Non-negative weights, not all zero.

        Returns
        -------
        float
        """
        predicted = self.predict(X)
        y, w = _score_targets(y, sample_weight, predicted.shape[0], numeric=False)
        return float(np.average(predicted == y, weights=w))


class RegressorMixin(_TaskTagsMixin):
    """``predict`` with an optional predictive standard deviation, and ``score``: the coefficient
    of determination R² of ``predict``, as scikit-learn's regressors.

    A regressor implements ``_predict_mean_std(X, return_std)``.
    """

    _estimator_type = "regressor"
    _task_tags = ("regressor_tags", "RegressorTags")

    @overload
    def predict(self, X: ArrayLike, return_std: Literal[False] = False) -> NDArray[np.float64]: ...
    @overload
    def predict(self, X: ArrayLike, return_std: Literal[True]) -> MeanStd: ...
    @overload
    def predict(self, X: ArrayLike, return_std: bool = False) -> NDArray[np.float64] | MeanStd: ...
    def predict(self, X: ArrayLike, return_std: bool = False) -> NDArray[np.float64] | MeanStd:
        """Predictive mean of y (and its standard deviation, noise included, with ``return_std``).

        Parameters
        ----------
        X : array-like (n_samples, n_features)
        return_std : bool, default False

        Returns
        -------
        mean : ndarray (n_samples,)
        std : ndarray (n_samples,), only with ``return_std``
            The standard deviation of a new observation ``y`` at each row: the latent
            function's (or the weights') uncertainty and the noise together.
        """
        return self._predict_mean_std(X, return_std)

    def _predict_mean_std(self, X: ArrayLike, return_std: bool) -> NDArray[np.float64] | MeanStd:
        raise NotImplementedError

    def score(self, X: ArrayLike, y: ArrayLike, sample_weight: ArrayLike | None = None) -> float:
        """Coefficient of determination ``R² = 1 - Σ w (y - ŷ)² / Σ w (y - ȳ)²`` of ``predict(X)``.

        ȳ is the (weighted) mean of ``y``. When ``y`` is constant the ratio is undefined; the
        score is then 1.0 for a perfect prediction and 0.0 otherwise (scikit-learn's
        ``force_finite`` convention), never NaN or infinity.

        Parameters
        ----------
        X : array-like (n, n_features)
        y : array-like (n,)
            True targets (finite).
        sample_weight : array-like (n,) or None
            Non-negative weights, not all zero.

        Returns
        -------
        float
        """
        predicted = np.asarray(self.predict(X), dtype=float)
        y, w = _score_targets(y, sample_weight, predicted.shape[0], numeric=True)
        residual = np.average((y - predicted) ** 2, weights=w)
        counted = y if w is None else y[w > 0]
        if np.all(counted == counted[0]):       # constant targets: Σ w (y - ȳ)² is zero
            return 1.0 if residual == 0.0 else 0.0
        spread = np.average((y - np.average(y, weights=w)) ** 2, weights=w)
        return float(1.0 - residual / spread)


def check_is_fitted(estimator: object, attribute: str) -> None:
    """Raise :class:`NotFittedError` unless ``estimator`` has the fitted ``attribute``."""
    if not hasattr(estimator, attribute):
        raise not_fitted_error(
            f"this {type(estimator).__name__} instance is not fitted yet; call 'fit' first")


def one_vs_rest_proba(problems, X):
    """Class probabilities from fitted binary problems (each with ``latent(X)`` and ``likelihood``).

    One problem: columns ``(1 - p, p)`` with ``p = ∫ t(f) N(f; μ*, σ*²) df`` from the
    likelihood's ``predictive``. Several (one-vs-rest): each class's binary predictive,
    normalised to sum to one.
    """
    p = np.column_stack([prob.likelihood.predictive(*prob.latent(X)) for prob in problems])
    if p.shape[1] == 1:
        return np.column_stack([1.0 - p[:, 0], p[:, 0]])
    total = p.sum(axis=1, keepdims=True)
    return p / np.where(total > 0, total, 1.0)
