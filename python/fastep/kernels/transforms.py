"""Transforms between a kernel hyperparameter's constrained value and the unconstrained
value an optimiser moves (softplus, log, sigmoid); see :mod:`fastep.kernels`."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, overload

import numpy as np
from .._special import expit

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray

__all__ = ["Transform", "TRANSFORMS", "FIXED", "IDENTITY"]

#: Marks a hyperparameter that keeps its value (left out of ``theta`` and the gradients).
FIXED = "fixed"


class Transform:
    """A bijection x = g(t) from the real line onto the domain of a hyperparameter.

    Attributes
    ----------
    name : str
    bounds : (float, float)
        Unconstrained interval on which g(t) is a finite, positive, normal float;
        ``Kernel.bounds`` reports it per parameter (usable by L-BFGS-B).

    Examples
    --------
    >>> from fastep.kernels import TRANSFORMS
    >>> softplus = TRANSFORMS["softplus"]
    >>> round(float(softplus.forward(0.0)), 6)
    0.693147
    >>> round(float(softplus.inverse(softplus.forward(1.5))), 12)
    1.5
    """

    name: str | None = None
    bounds: tuple[float, float] = (-np.inf, np.inf)
    upper: float = np.inf          # open upper limit of the constrained domain (0, upper)

    @overload
    def forward(self, t: float) -> float: ...
    @overload
    def forward(self, t: ArrayLike) -> NDArray[np.float64]: ...
    def forward(self, t: ArrayLike) -> float | NDArray[np.float64]:
        """Constrained value x = g(t)."""
        raise NotImplementedError

    @overload
    def inverse(self, x: float) -> float: ...
    @overload
    def inverse(self, x: ArrayLike) -> NDArray[np.float64]: ...
    def inverse(self, x: ArrayLike) -> float | NDArray[np.float64]:
        """Unconstrained value t = g⁻¹(x); x must lie in the domain."""
        raise NotImplementedError

    @overload
    def derivative(self, t: float) -> float: ...
    @overload
    def derivative(self, t: ArrayLike) -> NDArray[np.float64]: ...
    def derivative(self, t: ArrayLike) -> float | NDArray[np.float64]:
        """dx/dt at t."""
        raise NotImplementedError

    def forward_scalar(self, t: float) -> float:
        """``forward`` of one value, as a Python float (a likelihood's parameter)."""
        return float(self.forward(t))

    def inverse_scalar(self, x: float) -> float:
        """``inverse`` of one value, as a Python float."""
        return float(self.inverse(x))

    def check(self, x: ArrayLike, name: str) -> None:
        """Raise ``ValueError`` naming ``name`` unless every x is in (0, upper)."""
        x = np.asarray(x, dtype=float)
        bad = ~((x > 0) & (x < self.upper))
        if np.any(bad):
            value = x.reshape(-1)[np.flatnonzero(bad.reshape(-1))[0]]
            dom = "(0, 1)" if np.isfinite(self.upper) else "> 0 and finite"
            raise ValueError(f"{name} must be {dom} for the {self.name!r} transform, got {value!r}")

    def __repr__(self) -> str:
        return f"Transform({self.name!r})"


class _Softplus(Transform):
    name = "softplus"
    bounds = (-700.0, np.inf)

    def forward(self, t):
        return np.logaddexp(0.0, t)

    def inverse(self, x):
        x = np.asarray(x, dtype=float)
        return x + np.log(-np.expm1(-x))

    def derivative(self, t):
        return expit(t)


class _Log(Transform):
    name = "log"
    bounds = (-700.0, 700.0)

    def forward(self, t):
        with np.errstate(over="ignore"):
            return np.exp(t)

    def inverse(self, x):
        return np.log(x)

    def derivative(self, t):
        with np.errstate(over="ignore"):
            return np.exp(t)

    def forward_scalar(self, t):
        return math.exp(t)

    def inverse_scalar(self, x):
        return math.log(x)


class _Sigmoid(Transform):
    name = "sigmoid"
    bounds = (-700.0, np.inf)
    upper = 1.0

    def forward(self, t):
        return expit(t)

    def inverse(self, x):
        x = np.asarray(x, dtype=float)
        return np.log(x) - np.log1p(-x)

    def derivative(self, t):
        return expit(t) * expit(-np.asarray(t, dtype=float))


class _Identity(Transform):
    """x = t: a parameter that takes any real value (a likelihood's bias).  Not offered to
    kernels, whose parameters are positive."""
    name = "identity"

    def forward(self, t):
        return t

    def inverse(self, x):
        return x

    def forward_scalar(self, t):
        return float(t)

    def inverse_scalar(self, x):
        return float(x)

    def derivative(self, t):
        return np.ones_like(np.asarray(t, dtype=float))

    def check(self, x, name):
        if not np.all(np.isfinite(np.asarray(x, dtype=float))):
            raise ValueError(f"{name} must be finite")


#: The unconstrained transform, for parameters on the whole real line.
IDENTITY = _Identity()

#: The available transforms by name (``'fixed'`` is accepted in ``transforms=`` too).
TRANSFORMS: dict[str, Transform] = {t.name: t for t in (_Softplus(), _Log(), _Sigmoid())}
