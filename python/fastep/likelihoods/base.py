"""The :class:`Likelihood` base class: validated parameters, the learnable parameters' space
(:class:`LikelihoodParameter`), the compiled site kernels' handle and what EP variant the
likelihood needs.

A likelihood is one class.  It declares

* its constructor parameters (``_param_names``, ``_validate``) and its compiled site kernel
  (``_make_spec``, a :class:`fastep._epcore.sites.SiteSpec`);
* its learnable parameters (:meth:`Likelihood.parameters`): each one's coordinate in θ, the
  :class:`fastep.kernels.Transform` from that coordinate to the parameter, the optimiser's box
  and whether the hyperprior acts on it;
* the derivatives of its site normaliser in those coordinates (``_theta_terms`` or
  :meth:`Likelihood.theta_gradient`, and :meth:`Likelihood.power_ep_theta_gradient` for power
  EP);
* which EP it needs (:attr:`Likelihood.ep_variant`) and, for regression noise, how it starts
  from the targets' scale (:meth:`Likelihood.from_noise_variance`).

The models read these instead of asking for the likelihood's type.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fastep._epcore import sites as _sites
from fastep._epcore.sites import _as_input as _as_1d
from ..kernels.transforms import Transform

if TYPE_CHECKING:
    from typing import Any, ClassVar

    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

    _Moments = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]

__all__ = ["Likelihood", "LikelihoodParameter"]


def _as_float(name: str, value: Any) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {value!r}") from None
    return value


def _positive_finite(name: str, value: Any, *, may_be_inf: bool = False) -> float:
    """``value`` as a float, or ``ValueError`` naming ``name`` unless it is > 0 and finite (or
    ``inf`` where ``may_be_inf``)."""
    value = _as_float(name, value)
    if may_be_inf and not value > 0:
        raise ValueError(f"{name} must be > 0 (may be inf), got {value!r}")
    if not may_be_inf and not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return value


def _finite(name: str, value: Any) -> float:
    """``value`` as a float, or ``ValueError`` naming ``name`` unless it is finite."""
    value = _as_float(name, value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _fmt(value):
    if isinstance(value, np.ndarray):
        return repr(value.tolist())
    return repr(value)



@dataclass(frozen=True)
class LikelihoodParameter:
    """One learnable parameter of a likelihood, as type-II maximum likelihood moves it.

    Parameters
    ----------
    theta_name : str
        Its coordinate's name in θ (e.g. ``'log_noise'``).
    name : str
        The constructor parameter it sets (e.g. ``'noise_variance'``).
    transform : fastep.kernels.Transform
        ``value = transform.forward(t)`` for the coordinate ``t``.
    box : (float, float)
        The optimiser's box for ``t``.
    start_margin : (float, float) or None
        If given, the box widens to hold ``[t0 + start_margin[0], t0 + start_margin[1]]``
        around the coordinate ``t0`` the search starts from (a parameter whose scale comes from
        the data, such as a noise variance); with an infinite ``box`` the box is that interval.
    index : int or None
        The entry of an array parameter this coordinate sets (None: a scalar parameter).

    Examples
    --------
    >>> from fastep.likelihoods import Gaussian
    >>> parameter, = Gaussian(noise_variance=1e-8).parameters()
    >>> parameter.theta_name, parameter.transform.name
    ('log_noise', 'log')
    >>> [round(float(b), 2) for b in parameter.bounds_at(parameter.transform.inverse(1e-8))]
    [-48.42, 20.0]
    """

    theta_name: str
    name: str
    transform: Transform
    box: tuple[float, float] = (-math.inf, math.inf)
    start_margin: tuple[float, float] | None = None
    index: int | None = None

    @property
    def log_scale(self) -> bool:
        """Whether ``t`` is the log of a positive scale (where fastep's log-normal hyperprior
        acts, :mod:`fastep.hyperpriors`)."""
        return self.transform.name == "log"

    def bounds_at(self, t0: float) -> tuple[float, float]:
        """The optimiser's box for a search that starts at ``t0``."""
        low, high = self.box
        if self.start_margin is None:
            return low, high
        below, above = self.start_margin
        if math.isinf(low) and math.isinf(high):
            return t0 + below, t0 + above
        return min(low, t0 + below), max(high, t0 + above)


class Likelihood:
    """Base class: parameter handling, the learnable parameters' space, SiteSpec caching, the
    vectorised moments and what EP the likelihood needs.

    A subclass defines ``_param_names``, ``_validate(params) -> dict``,
    ``_make_spec() -> SiteSpec``, ``encode_targets`` and ``predictive``; to be learnt,
    :meth:`parameters` and the derivative of a site's ``log Z`` in each coordinate at fixed
    cavity (``_theta_terms(name, log_z, alpha, beta, cavity_mean, cavity_var)``, or
    :meth:`theta_gradient` itself).  The class attributes :attr:`is_classification`,
    :attr:`ep_variant`, :attr:`default_power` and :attr:`learnable_with_power` tell the
    models how to run EP on it; nothing else is needed for the dense and sparse GP models to
    use it.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep.likelihoods import Likelihood, Probit
    >>> likelihood = Probit(slope=2.0)
    >>> isinstance(likelihood, Likelihood), likelihood.get_params()
    (True, {'slope': 2.0, 'bias': 0.0})
    >>> log_z, alpha, beta = likelihood.moments(np.array([1.0]), np.array([0.0]), np.array([1.0]))
    >>> round(float(np.exp(log_z[0])), 6)
    0.5
    """

    _param_names: ClassVar[tuple[str, ...]] = ()
    #: Whether the targets are class labels (binary, ordinal) rather than real values.
    is_classification: ClassVar[bool] = True
    #: The EP the likelihood needs.  ``'standard'``: sites from the tilted moments at power 1
    #: (Minka, "A family of algorithms for approximate Bayesian inference", eqs 17-19), or at a
    #: power below 1 where the model asks for power EP; site precisions of a log-concave
    #: likelihood stay positive.  ``'fractional'``: fractional EP at a power below 1, whose site
    #: precisions may be negative (a likelihood that is not log-concave, such as the Student-t;
    #: Jylänki, Vanhatalo & Vehtari, "Robust Gaussian process regression with a Student-t
    #: likelihood", section 3.3).
    ep_variant: ClassVar[str] = "standard"
    #: The fractional power η a ``'fractional'`` likelihood runs at when none is given.
    default_power: ClassVar[float | None] = None
    #: Whether :meth:`power_ep_theta_gradient` knows the learnable parameters' derivatives of a
    #: site raised to a power below 1.
    learnable_with_power: ClassVar[bool] = False


    def __init__(self, **params: Any) -> None:
        self._params = self._validate(params)
        self._spec = None

    if TYPE_CHECKING:
        # What every subclass defines (see the class docstring).
        def _validate(self, params: dict[str, Any]) -> dict[str, Any]: ...

        def _make_spec(self) -> Any: ...

        def encode_targets(self, y: ArrayLike) -> NDArray[np.float64]:
            """Validated site targets (float64) from user targets."""

        def predictive(self, mean: ArrayLike, var: ArrayLike) -> Any:
            """The predictive distribution of y under a latent ``N(mean, var)``."""

    # -- parameters -----------------------------------------------------------------
    def __sklearn_clone__(self) -> Self:
        """scikit-learn's ``clone``: an independent deep copy."""
        return copy.deepcopy(self)

    def get_params(self) -> dict[str, Any]:
        """Parameters as a dict (copies of any arrays)."""
        return {name: (np.array(v) if isinstance(v, np.ndarray) else v)
                for name, v in self._params.items()}

    def set_params(self, **params: Any) -> Self:
        """Update parameters (validated together); invalidates the cached SiteSpec. Returns self."""
        unknown = set(params) - set(self._param_names)
        if unknown:
            raise ValueError(f"unknown parameter(s) {sorted(unknown)} for {type(self).__name__}; "
                             f"valid: {list(self._param_names)}")
        merged = dict(self._params)
        merged.update(params)
        self._params = self._validate(merged)
        self._spec = None
        return self

    def __getattr__(self, name: str) -> Any:
        params = self.__dict__.get("_params")
        if params is not None and name in params:
            value = params[name]
            return np.array(value) if isinstance(value, np.ndarray) else value
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={_fmt(v)}" for k, v in self._params.items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(np.array_equal(np.asarray(self._params[k]), np.asarray(other._params[k]))
                   for k in self._param_names)

    __hash__ = None  # type: ignore[assignment]  # equal by value, mutable: not hashable

    def __getstate__(self) -> dict[str, Any]:
        # The SiteSpec is a cache; rebuild it after unpickling.
        return {"_params": self._params, "_spec": None}

    # -- compiled core ------------------------------------------------------------------
    def site_spec(self) -> Any:
        """The :class:`fastep._epcore.sites.SiteSpec` for these parameters (cached)."""
        if self._spec is None:
            self._spec = self._make_spec()
        return self._spec

    def moments(self, y: ArrayLike, cavity_mean: ArrayLike, cavity_var: ArrayLike) -> _Moments:
        """Site moments for encoded targets ``y`` and cavities ``N(cavity_mean, cavity_var)``.

        Parameters
        ----------
        y : array_like, shape (n,)
            Site targets as returned by :meth:`encode_targets`.
        cavity_mean, cavity_var : array_like, shape (n,)

        Returns
        -------
        log_z, alpha, beta : ndarray, shape (n,)
            ``log Z``, ``d log Z/d mu`` and ``-d² log Z/d mu²`` (Minka eqs 17-19);
            the tilted mean is ``mu + s2 alpha`` and the tilted variance
            ``s2 - s2² beta``.

        Raises
        ------
        ValueError
            Naming the first site whose target or cavity is invalid.
        """
        return _sites.site_moments_array(self.site_spec(), _as_1d("y", y),
                                         _as_1d("cavity_mean", cavity_mean),
                                         _as_1d("cavity_var", cavity_var))

    # -- learnable parameters -----------------------------------------------------------
    # Type-II maximum likelihood moves them in unconstrained coordinates t (the class
    # docstrings give each parameter's transform). At an EP fixed point the gradient of
    # log Z_EP with respect to t is ``sum_i ∂ log Z_i / ∂t`` at fixed cavities (the sites are
    # stationary: Seeger, "Expectation propagation for exponential families", 2005).

    def parameters(self) -> list[LikelihoodParameter]:
        """The learnable parameters, in the order of :attr:`theta`.

        Raises
        ------
        TypeError
            If the likelihood has no learnable parameters to offer.
        """
        raise TypeError(f"learning the parameters of {type(self).__name__} is not supported")

    def theta_names(self) -> list[str]:
        """Names of the learnable parameters' coordinates, in the order of :attr:`theta`."""
        return [parameter.theta_name for parameter in self.parameters()]

    def _theta_values(self):
        values = []
        for parameter in self.parameters():
            value = self._params[parameter.name]
            if parameter.index is not None:
                value = value[parameter.index]
            values.append(parameter.transform.inverse_scalar(value))
        return values

    @property
    def theta(self) -> NDArray[np.float64]:
        """The learnable parameters in unconstrained coordinates (ndarray)."""
        return np.array(self._theta_values(), dtype=float)

    @property
    def theta_bounds(self) -> NDArray[np.float64]:
        """``(k, 2)`` box of :attr:`theta` for the optimiser (:meth:`LikelihoodParameter.bounds_at`
        at the current value)."""
        bounds = [parameter.bounds_at(t0) for parameter, t0 in zip(self.parameters(), self._theta_values())]
        return np.array(bounds, dtype=float).reshape(-1, 2)

    def with_theta(self, theta: ArrayLike) -> Self:
        """A new likelihood of the same type with the learnable parameters set from ``theta``."""
        params = self.get_params()
        for parameter, t in zip(self.parameters(), np.asarray(theta, dtype=float)):
            value = parameter.transform.forward_scalar(t)
            if parameter.index is None:
                params[parameter.name] = value
            else:
                params[parameter.name] = np.array(params[parameter.name], dtype=float)
                params[parameter.name][parameter.index] = value
        return type(self)(**params)

    def theta_gradient(self, y: ArrayLike, cavity_mean: ArrayLike, cavity_var: ArrayLike, power: float = 1.0
                       ) -> NDArray[np.float64]:
        """``sum_i ∂ log Z_i / ∂t_j`` for every learnable parameter ``t_j``, at fixed cavities.

        Parameters
        ----------
        y : ndarray (n,)
            Encoded targets.
        cavity_mean, cavity_var : ndarray (n,)
            The sites' cavities.
        power : float in (0, 1]
            Fractional EP (Student-t): ``(1/η) Σ_i ∂ log Z_i^(η) / ∂t_j`` with ``Z_i^(η)``
            the normaliser of the powered site.
        """
        names = self.theta_names()
        if not names:
            return np.zeros(0)
        log_z, alpha, beta = self.moments(y, cavity_mean, cavity_var)
        return np.array([float(np.sum(self._theta_terms(name, log_z, alpha, beta, cavity_mean, cavity_var)))
                         for name in names])

    def _check_latent(self, mean: ArrayLike, var: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        mean = _as_1d("mean", mean)
        var = _as_1d("var", var)
        if mean.shape != var.shape:
            raise ValueError(f"mean and var must have the same length, got {mean.shape[0]} "
                             f"and {var.shape[0]}")
        if not np.all(np.isfinite(mean)):
            raise ValueError("mean must be finite")
        if not np.all(np.isfinite(var) & (var >= 0)):
            raise ValueError("var must be finite and >= 0")
        return mean, var


    def power_ep_theta_gradient(self, y: ArrayLike, cavity_mean: ArrayLike, cavity_var: ArrayLike,
                                alpha: ArrayLike, beta: ArrayLike, power: float) -> NDArray[np.float64]:
        """``Σ_i (1/η) ∂ log Z_i^(η) / ∂t_j`` of sites raised to the power ``η``, at fixed cavities.

        ``Z_i^(η) = ∫ p(y_i | f)^η N(f; m_i, v_i) df`` is power EP's site normaliser (Minka,
        "Power EP", 2004, eq 12).  At ``power = 1`` this is :meth:`theta_gradient`.

        Parameters
        ----------
        y, cavity_mean, cavity_var : ndarray (n,)
            Encoded targets and the cavities ``N(m_i, v_i)``.
        alpha, beta : ndarray (n,)
            ``∂ log Z_i^(η)/∂m`` and ``-∂² log Z_i^(η)/∂m²`` at those cavities (from the power
            moments the model computed anyway).
        power : float in (0, 1]

        Raises
        ------
        ValueError
            When ``power < 1`` and the likelihood does not know these derivatives
            (:attr:`learnable_with_power` is False).
        """
        if power == 1.0:
            return self.theta_gradient(y, cavity_mean, cavity_var)
        raise ValueError(f"learning the likelihood parameters {self.theta_names()} is not supported with "
                         "power < 1")

    def selection_likelihood(self) -> Likelihood:
        """The likelihood whose sites the IVM's selection scores when it chooses inducing
        inputs for this one (itself; a likelihood whose sites may be negative offers a Gaussian
        of its scale)."""
        return self

    @classmethod
    def from_noise_variance(cls, noise_variance: float) -> Likelihood:
        """A regression noise model of the given variance's scale, where a fit starts when the
        likelihood is named rather than given (``likelihood='gaussian'`` or ``'student_t'``).

        Raises
        ------
        TypeError
            For a likelihood that is not a regression noise model.
        """
        raise TypeError(f"{cls.__name__} is not a regression noise model")
