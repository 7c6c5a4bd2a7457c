"""The IVM's selection of an active set (Algorithm 1) at fixed hyperparameters, for the
estimators and for the sparse models that choose inducing inputs with it."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._epcore import ivm as _engine
from .problem import _IVMProblem

if TYPE_CHECKING:
    from typing import Literal

    from numpy.typing import NDArray

    from ..kernels import Kernel
    from ..likelihoods import Likelihood

__all__ = ["select_active_set"]


def select_active_set(X: NDArray[np.float64], y: NDArray[np.float64], kernel: Kernel, likelihood: Likelihood, d: int, *,
                      criterion: Literal["entropy", "info_gain", "random"] = "entropy", seed: int = 0
                      ) -> NDArray[np.intp]:
    """Active set of Algorithm 1 of the IVM at fixed kernel and likelihood.

    The d points are included greedily, each maximising the score ``criterion`` (the
    entropy reduction of the ADF posterior, eq 26, by default) under sites from
    ``likelihood`` (Lawrence, Seeger & Herbrich 2005, *Fast sparse Gaussian process methods:
    the informative vector machine*, §2, Algorithm 1). O(d² n) time, O(d n) memory.

    Parameters
    ----------
    X : ndarray (n, n_features)
        Validated inputs (float64, finite).
    y : ndarray (n,)
        Targets as the likelihood's site kernel takes them (±1 for binary likelihoods).
    kernel : Kernel
        Must have a positive diagonal on X.
    likelihood : Likelihood
    d : int
        Size of the active set, ``1 <= d <= n``.
    criterion : {'entropy', 'info_gain', 'random'}, default 'entropy'
    seed : int, default 0
        Seed of the random criterion.

    Returns
    -------
    ndarray (d,) of int
        Row indices of X in inclusion order.
    """
    problem = _IVMProblem(X, y, kernel, likelihood, d, _engine.CRITERIA[criterion], seed)
    problem.select()
    return problem.active
