"""Warnings and errors raised by fastep."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TypeVar

    _T = TypeVar("_T")

__all__ = ["ConvergenceWarning", "NotFittedError", "DataConversionWarning", "MemoryLimitError"]


class ConvergenceWarning(UserWarning):
    """EP (or an optimiser) stopped before its convergence criterion was met.

    The message names the number of sweeps run and the last change in the
    site parameters, so the result can be judged rather than trusted blindly.
    """


class NotFittedError(ValueError, AttributeError):
    """An estimator was used for prediction before ``fit`` was called."""


class DataConversionWarning(UserWarning):
    """An input was converted to the form the estimator needs (e.g. a column-vector ``y``)."""


# scikit-learn's estimator checks and meta-estimators recognise its own NotFittedError and
# DataConversionWarning. When scikit-learn is installed, fastep raises subclasses of both
# fastep's class and scikit-learn's; scikit-learn is imported only then (on the error or
# warning path), never to import or fit.
_SKLEARN_COMPATIBLE: dict[str, type] = {}


def _sklearn_compatible(cls: type[_T]) -> type[_T]:
    """``cls``, or a subclass of ``cls`` and scikit-learn's class of the same name if available."""
    if cls.__name__ not in _SKLEARN_COMPATIBLE:
        try:
            from sklearn import exceptions as sklearn_exceptions
        except ImportError:
            return cls
        name = f"_SklearnCompatible{cls.__name__}"
        combined = type(name, (cls, getattr(sklearn_exceptions, cls.__name__)),
                        {"__module__": __name__, "__doc__": cls.__doc__})
        globals()[name] = combined           # picklable by its qualified name
        _SKLEARN_COMPATIBLE[cls.__name__] = combined
    return _SKLEARN_COMPATIBLE[cls.__name__]


def not_fitted_error(message: str) -> NotFittedError:
    """A :class:`NotFittedError` (also scikit-learn's, when scikit-learn is installed)."""
    return _sklearn_compatible(NotFittedError)(message)


def data_conversion_warning() -> type[DataConversionWarning]:
    """The :class:`DataConversionWarning` class to warn with (also scikit-learn's when installed)."""
    return _sklearn_compatible(DataConversionWarning)


class MemoryLimitError(MemoryError):
    """A fit would need more memory than is available; raised before any large allocation.

    Attributes
    ----------
    estimate : int
        The fit's estimated peak working memory, in bytes.
    limit : int
        The memory available to it, in bytes.
    source : str
        Where the limit comes from (physical memory, the process's address-space limit, a
        control group's limit, or ``FASTEP_MAX_MEMORY``).
    """

    estimate: int
    limit: int
    source: str

    def __init__(self, message: str, *, estimate: float, limit: float, source: str) -> None:
        super().__init__(message)
        self.estimate = int(estimate)
        self.limit = int(limit)
        self.source = source
