"""Plain numpy/scipy reference implementations of the compiled kernels.

Written for clarity, not speed or extreme-range robustness; the test suite uses
them as an independent check of ``fastep._epcore``. Modules here must never
import the compiled core.
"""
from . import (gp_ep, horseshoe, ivm, linear_ep, multinomial_ep, rank_k_ep, sites, sparse_ep, sparse_multinomial,
               stochastic_sparse_ep, student_t_ep)

__all__ = ["sites", "linear_ep", "rank_k_ep", "gp_ep", "ivm", "sparse_ep", "horseshoe", "student_t_ep", "multinomial_ep",
           "stochastic_sparse_ep", "sparse_multinomial"]


def __getattr__(name):
    # The former name of a module here: importing it warns (FutureWarning) and gives the new one's names.
    if name == "multiclass_ep":
        from importlib import import_module
        return import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
