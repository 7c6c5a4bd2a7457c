"""Hyperpriors for the GP estimators' learning: a finite optimum on (nearly) separable data.

Type-II maximum likelihood maximises the EP log marginal likelihood ``log Z(θ)``. On data a
kernel separates, ``log Z`` keeps rising along a ridge of growing latent scale (the kernel
variance): the latent function can grow without bound while the training labels stay
explained, and the likelihood's sigmoid saturates. The search then walks the ridge for
hundreds of evaluations, buying fractions of a nat while the predictions no longer change,
and ends wherever its tolerance happens to stop it.

The GP estimators therefore maximise, by default, the log posterior of the hyperparameters
(MAP-II, as GPstuff does by default):

    log Z(θ) + Σ_k log N(u_k; u_k⁰, s²)

where ``u_k = log x_k`` is the log of each positive hyperparameter ``x_k`` that is learnt
(the kernel's variances, inverse widths and other positive parameters with a ``'softplus'`` or
``'log'`` transform; the likelihood's noise variance, Student-t degrees of freedom and scale,
slope and ordinal widths), ``u_k⁰`` the log of its starting value, and ``s`` the prior's scale
in nats of log-parameter. Each factor is a log-normal prior on ``x_k`` with median at the
start: weakly informative, since the starts are chosen from the data (a unit latent scale for
the probit and logistic links, ``var(y)`` for regression, the median-distance inverse width)
and ``s = 2.5`` leaves each parameter free to move by a factor e^2.5 ≈ 12 at one standard
deviation. The prior's pull grows with the distance from the start (its gradient in ``u_k``
is ``-(u_k - u_k⁰)/s²``), while the evidence's gain along a separable ridge shrinks, so the
objective has a finite maximum. Parameters without a log scale (the probit bias, the step
likelihood's flip-noise logit, the ARD input scales in (0, 1), inducing inputs) get no prior.

The objective depends on the parameters' values only, not on their transforms: it is the
same function of (variance, inverse width, ...) whether the kernel uses ``'softplus'`` or
``'log'`` coordinates. ``hyperprior=None`` in an estimator gives plain type-II maximum
likelihood.

References
----------
Vanhatalo, J. et al. *GPstuff: Bayesian modeling with Gaussian processes*, JMLR 14 (2013),
§3 (priors for the hyperparameters; MAP estimate of the hyperparameters by default).
Rasmussen, C. E. and Williams, C. K. I. *Gaussian Processes for Machine Learning* (MIT
Press, 2006), §5.2 (the hierarchical view: hyperpriors on θ).
"""
from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from typing import Any

    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

__all__ = ["LogNormal", "DEFAULT_SCALE"]

#: The default prior scale ``s`` on each log-parameter (nats).
DEFAULT_SCALE = 2.5


class LogNormal:
    """Independent log-normal hyperpriors with medians at the starting values.

    Each positive hyperparameter ``x_k`` that is learnt gets ``log x_k ~ N(log x_k⁰, scale²)``,
    ``x_k⁰`` its starting value (module docstring).

    Parameters
    ----------
    scale : float > 0, default 2.5
        Standard deviation of each log-parameter.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep.hyperpriors import LogNormal
    >>> prior = LogNormal(scale=2.0)
    >>> value, gradient = prior.log_density(np.array([0.0, 1.0]), np.array([0.0, 0.0]))
    >>> round(float(value), 6), gradient.tolist()
    (-3.349171, [-0.0, -0.25])
    """

    def __init__(self, scale: float = DEFAULT_SCALE) -> None:
        self.scale = scale

    def _checked_scale(self) -> float:
        scale = self.scale
        if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
            raise TypeError(f"LogNormal scale must be a real number, got {type(scale).__name__}")
        scale = float(scale)
        if not (math.isfinite(scale) and scale > 0.0):
            raise ValueError(f"LogNormal scale must be positive and finite, got {scale!r}")
        return scale

    def log_density(self, log_values: ArrayLike, log_centres: ArrayLike) -> tuple[float, NDArray[np.float64]]:
        """``(log p, ∂ log p/∂u)`` of the log-parameters ``u`` = ``log_values``.

        Parameters
        ----------
        log_values, log_centres : ndarray (k,)
            The log-parameters and the logs of the prior's medians.

        Returns
        -------
        float, ndarray (k,)
        """
        scale = self._checked_scale()
        z = (np.asarray(log_values, dtype=float) - np.asarray(log_centres, dtype=float)) / scale
        value = float(-0.5 * np.sum(z * z) - z.size * (math.log(scale) + 0.5 * math.log(2.0 * math.pi)))
        return value, -z / scale

    def curvature(self) -> float:
        """``-∂² log p/∂u²`` of each log-parameter, ``1/scale²``."""
        return 1.0 / self._checked_scale() ** 2

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.scale == self.scale

    def __hash__(self) -> int:
        return hash((type(self), self.scale))

    def __repr__(self) -> str:
        return f"LogNormal(scale={self.scale!r})"

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """``{'scale': scale}`` (scikit-learn's parameter protocol)."""
        return {"scale": self.scale}

    def set_params(self, **params: Any) -> Self:
        """Set ``scale`` (scikit-learn's parameter protocol); returns self."""
        for key, value in params.items():
            if key != "scale":
                raise ValueError(f"LogNormal has no parameter {key!r}; it has 'scale'")
            self.scale = value
        return self


def check_hyperprior(hyperprior: str | LogNormal | None) -> LogNormal | None:
    """The estimators' ``hyperprior`` argument: ``'auto'`` (``LogNormal()``), None, or a LogNormal.

    Returns
    -------
    LogNormal or None
    """
    if isinstance(hyperprior, str):
        if hyperprior == "auto":
            return LogNormal()
        raise ValueError(f"hyperprior must be 'auto', None or a fastep.hyperpriors.LogNormal; got {hyperprior!r}")
    if hyperprior is None:
        return None
    if not isinstance(hyperprior, LogNormal):
        raise TypeError(f"hyperprior must be 'auto', None or a fastep.hyperpriors.LogNormal; "
                        f"got {type(hyperprior).__name__}")
    hyperprior._checked_scale()
    return hyperprior
