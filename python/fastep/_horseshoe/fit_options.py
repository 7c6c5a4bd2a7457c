"""The fit options of the horseshoe estimators: one frozen, typed object, checked once."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["HorseshoeFitOptions"]


@dataclass(frozen=True, eq=False)
class HorseshoeFitOptions:
    """What a horseshoe fit (:class:`~fastep.HorseshoeRegression`,
    :class:`~fastep.MultiTaskHorseshoeRegression`) makes of its parameters, for T tasks on d
    features.

    Parameters
    ----------
    m : int >= 0
        Components of the dependency factor P (0: no dependencies learnt).
    noise_variance : ndarray (T,) or None
        Each task's noise variance (its start when learnt); None: a tenth of each task's target
        variance.
    rho2 : float > 0 or None
        The global shrinkage ρ² (its start when learnt); None: 0.1.
    gamma2 : float > 0
        The slab variance γ².
    D : ndarray (d,)
        The diagonal of the prior's feature covariance.
    P0 : ndarray (d, m)
        The start of the dependency factor P (read, never written).
    noise_variance_floor : float in (0, 1]
        The smallest learnt noise variance, as a fraction of each task's target variance.
    max_sweeps : int >= 1
        Most EP iterations of one evaluation.
    max_optimizer_iter : int >= 1
        Most optimiser iterations of the search.

    Notes
    -----
    Instances are frozen: :meth:`replace` returns a checked copy with some fields changed.
    """

    m: int
    noise_variance: np.ndarray | None
    rho2: float | None
    gamma2: float
    D: np.ndarray
    P0: np.ndarray
    noise_variance_floor: float
    max_sweeps: int
    max_optimizer_iter: int

    def __post_init__(self):
        d = self.D.shape[0]
        if self.m < 0 or self.P0.shape != (d, self.m):
            raise ValueError(f"P0 must have shape (d, m) = ({d}, {self.m}), got {self.P0.shape}")
        if self.max_sweeps < 1 or self.max_optimizer_iter < 1:
            raise ValueError(f"max_sweeps and max_optimizer_iter must be >= 1, got {self.max_sweeps} and "
                             f"{self.max_optimizer_iter}")

    def replace(self, **changes: Any) -> HorseshoeFitOptions:
        """A checked copy of these options with the fields named in ``changes`` replaced."""
        return dataclasses.replace(self, **changes)
