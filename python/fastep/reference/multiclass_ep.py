"""Deprecated: the former name of :mod:`fastep.reference.multinomial_ep`, removed in the next release.

Importing it warns with a ``FutureWarning``; its names are those of the new module.
"""
import warnings

from . import multinomial_ep as _multinomial_ep

__all__ = list(_multinomial_ep.__all__)

warnings.warn("fastep.reference.multiclass_ep is deprecated and will be removed in the next release; use "
              "fastep.reference.multinomial_ep", FutureWarning, stacklevel=2)


def __getattr__(name):
    return getattr(_multinomial_ep, name)
