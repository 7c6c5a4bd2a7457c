"""Type aliases shared by the annotations of fastep's public API.

The package imports this module under ``typing.TYPE_CHECKING`` only (its annotations are never
evaluated at run time), so ``import fastep`` does not load it; type checkers read it through
the ``py.typed`` marker.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeAlias, Union

import numpy as np
from numpy.typing import NDArray

from .hyperpriors import LogNormal
from .progress import ProgressRecord

__all__ = ["FloatArray", "MeanStd", "Callback", "Hyperprior"]

#: A float64 array: what the estimators return for means, variances and probabilities.
FloatArray: TypeAlias = NDArray[np.float64]

#: ``(mean, std)`` or ``(mean, var)``: two float64 arrays of the same shape.
MeanStd: TypeAlias = tuple[FloatArray, FloatArray]

#: An estimator's ``callback``: called with each :class:`~fastep.ProgressRecord`; ``False`` stops the fit.
Callback: TypeAlias = Union[Callable[[ProgressRecord], object], None]

#: The GP estimators' ``hyperprior``: ``'auto'`` (``LogNormal()``), None or a :class:`~fastep.hyperpriors.LogNormal`.
Hyperprior: TypeAlias = Union[Literal["auto"], LogNormal, None]
