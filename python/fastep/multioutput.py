"""Deprecated: the former home of :class:`fastep.LinearEPRankK`, now in :mod:`fastep.linear`.

Importing it warns with a ``FutureWarning``; its names are those of :mod:`fastep.linear`. It is
removed in the next release.
"""
import warnings

from . import linear as _linear
from .exceptions import ConvergenceWarning
from .linear import LinearEPRankK

__all__ = ["LinearEPRankK", "ConvergenceWarning"]

warnings.warn("fastep.multioutput is deprecated and will be removed in the next release; import "
              "LinearEPRankK from fastep (or fastep.linear)", FutureWarning, stacklevel=2)


def __getattr__(name):
    return getattr(_linear, name)
