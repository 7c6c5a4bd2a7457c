"""Likelihood objects: validated parameters and a handle to the compiled site kernels.

Every likelihood turns user targets into float64 site targets
(``encode_targets``), hands the compiled core a :class:`SiteSpec`
(``site_spec``) and exposes the site moments ``(log_z, alpha, beta)``
(``moments``; Minka eqs 17-19, IVM eqs 14-16) and the predictive distribution
(``predictive``).

Classes
-------
Probit(slope=1.0, bias=0.0)
    ``p(y | f) = Phi(slope * y * (f + bias))``, ``y in {-1, +1}`` (IVM §2.3).
Step(flip_noise=0.0)
    ``p(y | f) = eps + (1 - 2 eps) Theta(y f)`` (Minka §1.2).
Logistic(method='mackay' | 'gauss-hermite', n_nodes=32)
    ``p(y | f) = sigma(y f)`` (Minka §1.4).
Gaussian(noise_variance=1.0)
    ``p(y | f) = N(y; f, noise_variance)`` (IVM §2.2).
OrderedCategorical(n_categories, slope=1.0, bias=0.0, widths=None)
    Ordinal regression with thresholds (IVM §2.4).
StudentT(dof=4.0, scale=1.0)
    Robust regression, ``p(y | f) = t_ν(y; f, σ)`` (Jylänki, Vanhatalo & Vehtari 2011).
"""
from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING

import numpy as np
from ._special import expit, logit

from fastep._epcore import sites as _sites
from fastep._epcore import student_t_sites as _student_t_sites

if TYPE_CHECKING:
    from typing import Any, ClassVar, Literal

    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

    _Moments = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]

__all__ = [
    "Gaussian",
    "Likelihood",
    "Logistic",
    "OrderedCategorical",
    "Probit",
    "Step",
    "StudentT",
]


def _as_float(name: str, value: Any) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {value!r}") from None
    return value


def _as_1d(name: str, values: Any) -> NDArray[np.float64]:
    arr = np.asarray(values)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    return arr


#: Default optimiser boxes of the unconstrained learnable parameters.
_THETA_BOXES = {"bias": (-1e3, 1e3), "log_slope": (-20.0, 20.0), "logit_flip": (-30.0, 30.0),
                "log_noise": (-30.0, 20.0), "log_width": (-30.0, 20.0), "log_dof": (math.log(0.2), math.log(1e5)),
                "log_scale": (-15.0, 10.0)}


class Likelihood:
    """Base class: parameter handling, SiteSpec caching and the vectorised moments.

    Subclasses define ``_param_names``, ``_validate(params) -> dict``,
    ``_make_spec() -> SiteSpec``, ``encode_targets`` and ``predictive``.

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

    def theta_names(self) -> list[str]:
        """Names of the learnable parameters, in the order of :attr:`theta`."""
        raise TypeError(f"learning the parameters of {type(self).__name__} is not supported")

    def _theta_values(self):
        return []

    def _set_theta(self, params, name, t):
        raise TypeError(f"learning the parameters of {type(self).__name__} is not supported")

    @property
    def theta(self) -> NDArray[np.float64]:
        """The learnable parameters in unconstrained coordinates (ndarray)."""
        return np.array(self._theta_values(), dtype=float)

    @property
    def theta_bounds(self) -> NDArray[np.float64]:
        """``(k, 2)`` box of :attr:`theta` for the optimiser."""
        bounds = []
        for name, value in zip(self.theta_names(), self._theta_values()):
            low, high = _THETA_BOXES["log_width" if name.startswith("log_width_") else name]
            if name == "log_noise":
                # a noise variance starts from the targets' scale: targets of scale 1e±12 need the box
                # around that start, not the fixed one for ordinary scales
                low, high = min(low, value - 30.0), max(high, value + 20.0)
            elif name == "log_dof":
                low, high = min(low, value), max(high, value)
            elif name == "log_scale":
                low, high = value + low, value + high           # around the start, as the noise variance
            bounds.append((low, high))
        return np.array(bounds, dtype=float).reshape(-1, 2)

    def with_theta(self, theta: ArrayLike) -> Self:
        """A new likelihood of the same type with the learnable parameters set from ``theta``."""
        params = self.get_params()
        for name, t in zip(self.theta_names(), np.asarray(theta, dtype=float)):
            self._set_theta(params, name, t)
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


def _fmt(value):
    if isinstance(value, np.ndarray):
        return repr(value.tolist())
    return repr(value)


class _Binary(Likelihood):
    """Binary likelihoods: targets in {-1, +1}."""

    is_classification = True

    def encode_targets(self, y: ArrayLike) -> NDArray[np.float64]:
        """Validate binary targets; they must be exactly -1 or +1. Returns float64."""
        arr = _as_1d("y", y)
        bad = ~((arr == 1.0) | (arr == -1.0))
        if np.any(bad):
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"binary targets must be -1 or +1; y[{i}] = {float(arr[i])!r}")
        return arr

    def predictive(self, mean: ArrayLike, var: ArrayLike) -> NDArray[np.float64]:
        """p(y = +1) under a latent ``N(mean, var)``: ``exp(log Z(y=+1))``."""
        mean, var = self._check_latent(mean, var)
        log_z, _, _ = _sites.site_moments_array(self.site_spec(), np.ones_like(mean), mean, var)
        return np.exp(log_z)


class Probit(_Binary):
    """Probit likelihood ``p(y | f) = Phi(slope * y * (f + bias))`` (IVM eqs 19-21, Minka eqs 56-60).

    Parameters
    ----------
    slope : float, default 1.0
        ``lambda > 0``; ``inf`` gives a noiseless step at ``-bias`` (then the
        cavity variance must be > 0).
    bias : float, default 0.0

    Examples
    --------
    >>> import numpy as np
    >>> from fastep.likelihoods import Probit
    >>> likelihood = Probit()
    >>> log_z, alpha, beta = likelihood.moments(np.array([1.0, -1.0]), np.zeros(2), np.ones(2))
    >>> np.round(np.exp(log_z), 6)
    array([0.5, 0.5])
    >>> np.round(likelihood.predictive(np.array([0.0, 2.0]), np.array([1.0, 1.0])), 4)
    array([0.5   , 0.9214])
    """

    _param_names = ("slope", "bias")
    slope: float
    bias: float

    def __init__(self, slope: float = 1.0, bias: float = 0.0) -> None:
        super().__init__(slope=slope, bias=bias)

    @staticmethod
    def _validate(params):
        slope = _as_float("slope", params["slope"])
        bias = _as_float("bias", params["bias"])
        if not slope > 0:
            raise ValueError(f"slope must be > 0 (may be inf), got {slope!r}")
        if not math.isfinite(bias):
            raise ValueError(f"bias must be finite, got {bias!r}")
        return {"slope": slope, "bias": bias}

    def _make_spec(self):
        return _sites.SiteSpec(_sites.LIKELIHOOD_CODES["probit"],
                               [self._params["slope"], self._params["bias"]])

    def theta_names(self) -> list[str]:
        """``bias`` (t = b) and, for a finite slope, ``log_slope`` (t = log λ)."""
        return ["bias"] + (["log_slope"] if math.isfinite(self.slope) else [])

    def _theta_values(self):
        return [self.bias] + ([math.log(self.slope)] if math.isfinite(self.slope) else [])

    def _set_theta(self, params, name, t):
        if name == "bias":
            params["bias"] = float(t)
        else:
            params["slope"] = math.exp(t)

    def _theta_terms(self, name, log_z, alpha, beta, cavity_mean, cavity_var):
        if name == "bias":
            return alpha                                     # Z depends on m + b only
        lam = self.slope
        return alpha * (cavity_mean + self.bias) / (1.0 + lam * lam * cavity_var)

    def predictive(self, mean: ArrayLike, var: ArrayLike) -> NDArray[np.float64]:
        mean, var = self._check_latent(mean, var)
        if math.isinf(self._params["slope"]):
            # Noiseless step: p = Theta(mean + bias) where var = 0.
            out = np.empty_like(mean)
            point = var == 0
            out[point] = np.where(mean[point] + self._params["bias"] > 0, 1.0, 0.0)
            if np.any(~point):
                out[~point] = super().predictive(mean[~point], var[~point])
            return out
        return super().predictive(mean, var)


class Step(_Binary):
    """Step likelihood with label noise ``p(y | f) = eps + (1 - 2 eps) Theta(y f)`` (Minka eqs 50-55).

    Parameters
    ----------
    flip_noise : float in [0, 0.5), default 0.0
        Probability ``eps`` that a label is flipped. Site moments need a cavity
        variance > 0.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep.likelihoods import Step
    >>> likelihood = Step(flip_noise=0.1)
    >>> log_z, alpha, beta = likelihood.moments(np.array([1.0]), np.array([0.0]), np.array([1.0]))
    >>> round(float(np.exp(log_z[0])), 6)
    0.5
    """

    _param_names = ("flip_noise",)
    flip_noise: float

    def __init__(self, flip_noise: float = 0.0) -> None:
        super().__init__(flip_noise=flip_noise)

    @staticmethod
    def _validate(params):
        eps = _as_float("flip_noise", params["flip_noise"])
        if not 0.0 <= eps < 0.5:
            raise ValueError(f"flip_noise must be in [0, 0.5), got {eps!r}")
        return {"flip_noise": eps}

    def _make_spec(self):
        return _sites.SiteSpec(_sites.LIKELIHOOD_CODES["step"], [self._params["flip_noise"]])

    def theta_names(self) -> list[str]:
        """``logit_flip`` (t = logit 2ε; ε must start above 0)."""
        return ["logit_flip"]

    def _theta_values(self):
        eps = self.flip_noise
        if not eps > 0:
            raise ValueError("Step.flip_noise must be > 0 to be learnt (its logit parametrisation "
                             "cannot start at 0); start from e.g. 0.05")
        return [float(logit(2.0 * eps))]

    def _set_theta(self, params, name, t):
        params["flip_noise"] = min(0.5 * float(expit(t)), 0.5 - 1e-16)

    def _theta_terms(self, name, log_z, alpha, beta, cavity_mean, cavity_var):
        return self.flip_noise * (np.exp(-log_z) - 2.0)     # dZ/dε = 1 - 2Φ, Φ = (Z - ε)/(1 - 2ε)

    def predictive(self, mean: ArrayLike, var: ArrayLike) -> NDArray[np.float64]:
        mean, var = self._check_latent(mean, var)
        eps = self._params["flip_noise"]
        out = np.empty_like(mean)
        point = var == 0
        out[point] = eps + (1.0 - 2.0 * eps) * (mean[point] > 0)
        if np.any(~point):
            out[~point] = super().predictive(mean[~point], var[~point])
        return out


class Logistic(_Binary):
    """Logistic likelihood ``p(y | f) = sigma(y f)`` (Minka eqs 61-66).

    Parameters
    ----------
    method : {'mackay', 'gauss-hermite'}, default 'mackay'
        ``'mackay'``: MacKay's approximation ``Z ≈ sigma(kappa mu)``,
        ``kappa = (1 + pi s2/8)^(-1/2)`` (eqs 62-64; beta is the exact second
        derivative of that log Z). ``'gauss-hermite'``: ``n_nodes``-point
        Gauss-Hermite quadrature against the cavity (eq 66) with alpha, beta the
        exact mu-derivatives of the quadrature estimate.
    n_nodes : int, default 32
        Quadrature nodes for ``'gauss-hermite'`` (2..256).

    Examples
    --------
    >>> import numpy as np
    >>> from fastep.likelihoods import Logistic
    >>> mackay = Logistic().moments(np.array([1.0]), np.array([1.0]), np.array([2.0]))[0]
    >>> quadrature = Logistic(method="gauss-hermite").moments(np.array([1.0]), np.array([1.0]), np.array([2.0]))[0]
    >>> bool(abs(mackay[0] - quadrature[0]) < 0.01)
    True
    """

    _param_names = ("method", "n_nodes")
    _methods = ("mackay", "gauss-hermite")
    method: Literal["mackay", "gauss-hermite"]
    n_nodes: int

    def __init__(self, method: Literal["mackay", "gauss-hermite"] = "mackay", n_nodes: int = 32) -> None:
        super().__init__(method=method, n_nodes=n_nodes)

    @classmethod
    def _validate(cls, params):
        method = params["method"]
        if method not in cls._methods:
            raise ValueError(f"method must be one of {list(cls._methods)}, got {method!r}")
        n_nodes = params["n_nodes"]
        if isinstance(n_nodes, bool) or not isinstance(n_nodes, (int, np.integer)):
            raise TypeError(f"n_nodes must be an integer, got {n_nodes!r}")
        n_nodes = int(n_nodes)
        if not 2 <= n_nodes <= _sites.MAX_GH_NODES:
            raise ValueError(f"n_nodes must be in [2, {_sites.MAX_GH_NODES}], got {n_nodes}")
        return {"method": method, "n_nodes": n_nodes}

    def theta_names(self) -> list[str]:
        """None: the logistic likelihood has no learnable parameters."""
        return []

    def _make_spec(self):
        if self._params["method"] == "mackay":
            return _sites.SiteSpec(_sites.LIKELIHOOD_CODES["logistic_mackay"], [])
        nodes, weights = np.polynomial.hermite.hermgauss(self._params["n_nodes"])
        return _sites.SiteSpec(_sites.LIKELIHOOD_CODES["logistic_gh"], [], nodes,
                               np.log(weights) - 0.5 * np.log(np.pi))


class Gaussian(Likelihood):
    """Gaussian likelihood ``p(y | f) = N(y; f, noise_variance)`` (IVM eqs 17-18); exact EP.

    Parameters
    ----------
    noise_variance : float > 0, default 1.0

    Examples
    --------
    >>> import numpy as np
    >>> from fastep.likelihoods import Gaussian
    >>> log_z, alpha, beta = Gaussian(noise_variance=0.5).moments(np.array([1.0]), np.array([0.0]), np.array([1.5]))
    >>> round(float(beta[0]), 6)
    0.5
    """

    _param_names = ("noise_variance",)
    is_classification = False
    noise_variance: float

    def __init__(self, noise_variance: float = 1.0) -> None:
        super().__init__(noise_variance=noise_variance)

    @staticmethod
    def _validate(params):
        noise_variance = _as_float("noise_variance", params["noise_variance"])
        if not (noise_variance > 0 and math.isfinite(noise_variance)):
            raise ValueError(f"noise_variance must be finite and > 0, got {noise_variance!r}")
        return {"noise_variance": noise_variance}

    def _make_spec(self):
        return _sites.SiteSpec(_sites.LIKELIHOOD_CODES["gaussian"], [self._params["noise_variance"]])

    def encode_targets(self, y: ArrayLike) -> NDArray[np.float64]:
        """Validate real targets (finite). Returns float64."""
        arr = _as_1d("y", y)
        bad = ~np.isfinite(arr)
        if np.any(bad):
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"targets must be finite; y[{i}] = {float(arr[i])!r}")
        return arr

    def theta_names(self) -> list[str]:
        """``log_noise`` (t = log σ²)."""
        return ["log_noise"]

    def _theta_values(self):
        return [math.log(self.noise_variance)]

    def _set_theta(self, params, name, t):
        params["noise_variance"] = math.exp(t)

    def _theta_terms(self, name, log_z, alpha, beta, cavity_mean, cavity_var):
        return 0.5 * self.noise_variance * (alpha * alpha - beta)   # ∂Z/∂σ² = ½ ∂²Z/∂m²

    def predictive(self, mean: ArrayLike, var: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Predictive ``(mean, var + noise_variance)`` of y under a latent ``N(mean, var)``."""
        mean, var = self._check_latent(mean, var)
        return mean.copy(), var + self._params["noise_variance"]


class OrderedCategorical(Likelihood):
    """Ordered categorical (ordinal) likelihood with C categories (IVM §2.4, eqs 24-25).

    Thresholds ``theta_0 = bias``, ``theta_k = bias + w_1 + ... + w_k``
    (``k = 0..C-2``), ``theta_{-1} = -inf``, ``theta_{C-1} = +inf``, and
    ``p(y = k | f) = Phi(slope (theta_k - f)) - Phi(slope (theta_{k-1} - f))``.

    This is the consistent threshold model; the paper's ``y = 0`` case has a sign
    typo (``Phi(lambda (b + f))`` should read ``Phi(lambda (b - f))``) and its nu
    formula writes ``N(u)`` where ``N(u')`` is meant.

    Parameters
    ----------
    n_categories : int >= 2
    slope : float > 0, default 1.0
        May be ``inf`` (hard thresholds; then the cavity variance must be > 0).
    bias : float, default 0.0
    widths : array_like of C-2 positive floats, optional
        Gaps between consecutive thresholds; default all ones.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep.likelihoods import OrderedCategorical
    >>> likelihood = OrderedCategorical(3, slope=2.0, bias=-0.5, widths=[1.0])
    >>> proba = likelihood.predictive(np.array([-2.0, 0.0, 2.0]), np.full(3, 0.1))
    >>> proba.shape, np.round(proba.sum(axis=1), 12)
    ((3, 3), array([1., 1., 1.]))
    >>> proba.argmax(axis=1)
    array([0, 1, 2])
    """

    _param_names = ("n_categories", "slope", "bias", "widths")
    is_classification = True
    n_categories: int
    slope: float
    bias: float
    widths: NDArray[np.float64]

    def __init__(self, n_categories: int, slope: float = 1.0, bias: float = 0.0, widths: ArrayLike | None = None
                 ) -> None:
        super().__init__(n_categories=n_categories, slope=slope, bias=bias, widths=widths)

    @staticmethod
    def _validate(params):
        n_categories = params["n_categories"]
        if isinstance(n_categories, bool) or not isinstance(n_categories, (int, np.integer)):
            raise TypeError(f"n_categories must be an integer, got {n_categories!r}")
        n_categories = int(n_categories)
        if n_categories < 2:
            raise ValueError(f"n_categories must be >= 2, got {n_categories}")
        slope = _as_float("slope", params["slope"])
        if not slope > 0:
            raise ValueError(f"slope must be > 0 (may be inf), got {slope!r}")
        bias = _as_float("bias", params["bias"])
        if not math.isfinite(bias):
            raise ValueError(f"bias must be finite, got {bias!r}")
        widths = params["widths"]
        if widths is None:
            widths = np.ones(n_categories - 2)
        widths = np.array(widths, dtype=np.float64).reshape(-1)
        if widths.shape[0] != n_categories - 2:
            raise ValueError(f"widths must have n_categories - 2 = {n_categories - 2} entries, "
                             f"got {widths.shape[0]}")
        if not np.all(np.isfinite(widths) & (widths > 0)):
            raise ValueError(f"widths must be finite and > 0, got {widths.tolist()}")
        widths.setflags(write=False)
        return {"n_categories": n_categories, "slope": slope, "bias": bias, "widths": widths}

    @property
    def thresholds(self) -> NDArray[np.float64]:
        """``theta_0 .. theta_{C-2}``."""
        return self._params["bias"] + np.concatenate([[0.0], np.cumsum(self._params["widths"])])

    def _make_spec(self):
        p = self._params
        return _sites.SiteSpec(_sites.LIKELIHOOD_CODES["ordinal"],
                               np.concatenate([[p["slope"], p["bias"]], p["widths"]]))

    def encode_targets(self, y: ArrayLike) -> NDArray[np.float64]:
        """Validate integer class labels 0..C-1. Returns float64."""
        arr = _as_1d("y", y)
        n_categories = self._params["n_categories"]
        bad = ~((arr >= 0) & (arr <= n_categories - 1) & (np.floor(arr) == arr))
        if np.any(bad):
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"ordinal targets must be integers in 0..{n_categories - 1}; "
                             f"y[{i}] = {float(arr[i])!r}")
        return arr

    def theta_names(self) -> list[str]:
        """``bias`` (t = b) and ``log_width_i`` (t = log w_i); the slope is not learnt."""
        return ["bias"] + [f"log_width_{i + 1}" for i in range(self.n_categories - 2)]

    def _theta_values(self):
        return [self.bias] + [math.log(w) for w in self.widths]

    def _set_theta(self, params, name, t):
        if name == "bias":
            params["bias"] = float(t)
        else:
            params["widths"] = np.array(params["widths"], dtype=float)
            params["widths"][int(name[10:]) - 1] = math.exp(t)

    def theta_gradient(self, y: ArrayLike, cavity_mean: ArrayLike, cavity_var: ArrayLike, power: float = 1.0
                       ) -> NDArray[np.float64]:
        """Bias and log-width gradients of ``sum_i log Z_i`` at fixed cavities.

        A site with label k has ``Z = Φ(c (θ_k - m)) - Φ(c (θ_{k-1} - m))``,
        ``c = 1/sqrt(λ⁻² + s)``, ``θ_j = b + w_1 + ... + w_j``; with the threshold derivatives
        ``∂_hi = c N(c (θ_k - m))/Z`` (0 for k = C-1) and ``∂_lo = -c N(c (θ_{k-1} - m))/Z``
        (0 for k = 0), formed as ``± c exp(log N(u) - log Z)``: ``∂/∂b = ∂_hi + ∂_lo`` and
        ``∂/∂ log w_i = w_i (∂_hi [i <= k] + ∂_lo [i <= k - 1])``.
        """
        log_z, _, _ = self.moments(y, cavity_mean, cavity_var)
        y = np.asarray(y, dtype=float)
        k = y.astype(int)
        n_categories = self.n_categories
        theta = self.thresholds                                      # θ_0 .. θ_{C-2}
        inv_slope2 = 0.0 if math.isinf(self.slope) else self.slope ** -2
        c = 1.0 / np.sqrt(inv_slope2 + np.asarray(cavity_var, dtype=float))
        mean = np.asarray(cavity_mean, dtype=float)
        log_norm = 0.5 * math.log(2.0 * math.pi)
        d_hi = np.zeros_like(mean)
        d_lo = np.zeros_like(mean)
        has_hi = k < n_categories - 1
        u = c[has_hi] * (theta[k[has_hi]] - mean[has_hi])
        d_hi[has_hi] = c[has_hi] * np.exp(-0.5 * u * u - log_norm - log_z[has_hi])
        has_lo = k > 0
        u = c[has_lo] * (theta[k[has_lo] - 1] - mean[has_lo])
        d_lo[has_lo] = -c[has_lo] * np.exp(-0.5 * u * u - log_norm - log_z[has_lo])
        widths = self.widths
        grads = []
        for name in self.theta_names():
            if name == "bias":
                grads.append(float(np.sum(d_hi) + np.sum(d_lo)))
            else:
                i = int(name[10:])                                   # w_i enters θ_j for j >= i
                g = np.sum(d_hi[k >= i]) + np.sum(d_lo[k - 1 >= i])
                grads.append(float(widths[i - 1] * g))
        return np.array(grads)

    def predictive(self, mean: ArrayLike, var: ArrayLike) -> NDArray[np.float64]:
        """Class probabilities, shape (n, C), under a latent ``N(mean, var)``."""
        mean, var = self._check_latent(mean, var)
        n_categories = self._params["n_categories"]
        if math.isinf(self._params["slope"]) and np.any(var == 0):
            raise ValueError("with an infinite slope the latent variance must be > 0")
        spec = self.site_spec()
        probs = np.empty((mean.shape[0], n_categories))
        log_z = np.empty(mean.shape[0])
        alpha = np.empty_like(log_z)
        beta = np.empty_like(log_z)
        for k in range(n_categories):
            _sites.site_moments_array(spec, np.full(mean.shape[0], float(k)), mean, var,
                                      log_z, alpha, beta)
            probs[:, k] = np.exp(log_z)
        return probs


class StudentT(Likelihood):
    """Student-t likelihood for robust regression (Jylänki, Vanhatalo & Vehtari 2011, eq 2).

    ``p(y | f) = Γ((ν+1)/2) / (Γ(ν/2) sqrt(νπ) σ) · (1 + (y - f)²/(ν σ²))^(-(ν+1)/2)``: heavy
    tails, so that a few gross outliers do not drag the fit. The likelihood is not log-concave;
    EP on it (fractional EP, :class:`fastep.GaussianProcessRegressor`) allows negative site
    precisions. Site moments are computed by quadrature
    (:mod:`fastep._epcore.student_t_sites`); as ``dof → ∞`` this is the Gaussian likelihood
    with ``noise_variance = scale²``.

    Parameters
    ----------
    dof : float > 0, default 4.0
        Degrees of freedom ν (small: heavy tails; 4 is the paper's usual start).
    scale : float > 0, default 1.0
        Scale σ of the noise.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep.likelihoods import StudentT
    >>> likelihood = StudentT(dof=4.0, scale=0.5)
    >>> log_z, alpha, beta = likelihood.moments(np.array([0.0, 5.0]), np.zeros(2), np.full(2, 0.1))
    >>> bool(beta[0] > 0), bool(beta[1] < 0)       # the outlier's site has negative curvature
    (True, True)
    >>> likelihood.noise_variance                  # ν σ² / (ν - 2)
    0.5
    """

    _param_names = ("dof", "scale")
    is_classification = False
    dof: float
    scale: float

    def __init__(self, dof: float = 4.0, scale: float = 1.0) -> None:
        super().__init__(dof=dof, scale=scale)

    @staticmethod
    def _validate(params):
        dof = _as_float("dof", params["dof"])
        scale = _as_float("scale", params["scale"])
        if not (dof > 0 and math.isfinite(dof)):
            raise ValueError(f"dof must be finite and > 0, got {dof!r}")
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"scale must be finite and > 0, got {scale!r}")
        if not (math.isfinite(dof * scale * scale) and dof * scale * scale > 0):
            raise ValueError(f"dof * scale**2 must be finite and > 0, got dof={dof!r}, scale={scale!r}")
        return {"dof": dof, "scale": scale}

    def _make_spec(self):
        return _sites.SiteSpec(_sites.LIKELIHOOD_CODES["student_t"], [self._params["dof"], self._params["scale"]])

    @property
    def noise_variance(self) -> float:
        """Variance of the noise, ``ν σ² / (ν - 2)``; ``inf`` for ν <= 2."""
        dof, scale = self._params["dof"], self._params["scale"]
        return dof * scale * scale / (dof - 2.0) if dof > 2.0 else math.inf

    def powered_moments(self, y: ArrayLike, cavity_mean: ArrayLike, cavity_var: ArrayLike, power: float = 1.0
                        ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64],
                                   NDArray[np.float64], NDArray[np.float64]]:
        """Moments of ``p(y | f)^power N(f; mu, s2)`` (fractional EP's tilted distribution).

        Returns
        -------
        log_z, alpha, beta, d_log_dof, d_log_scale : ndarray (n,)
            ``log Z``, its first and minus second derivatives in the cavity mean, and its
            derivatives in ``log dof`` and ``log scale`` at the fixed cavity.
        """
        return _student_t_sites.student_t_moments_array(
            self._params["dof"], self._params["scale"], float(power), _as_1d("y", y),
            _as_1d("cavity_mean", cavity_mean), _as_1d("cavity_var", cavity_var))

    encode_targets = Gaussian.encode_targets

    def theta_names(self) -> list[str]:
        """``log_dof`` (t = log ν) and ``log_scale`` (t = log σ)."""
        return ["log_dof", "log_scale"]

    def _theta_values(self):
        return [math.log(self.dof), math.log(self.scale)]

    def _set_theta(self, params, name, t):
        params["dof" if name == "log_dof" else "scale"] = math.exp(t)

    def theta_gradient(self, y: ArrayLike, cavity_mean: ArrayLike, cavity_var: ArrayLike, power: float = 1.0
                       ) -> NDArray[np.float64]:
        """``(1/η) Σ_i ∂ log Z_i^(η) / ∂(log ν, log σ)`` by quadrature of the tilted density."""
        _, _, _, d_log_dof, d_log_scale = self.powered_moments(y, cavity_mean, cavity_var, power)
        return np.array([float(np.sum(d_log_dof)), float(np.sum(d_log_scale))]) / power

    def predictive(self, mean: ArrayLike, var: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Predictive ``(mean, variance)`` of y under a latent ``N(mean, var)`` (variance inf for ν <= 2)."""
        mean, var = self._check_latent(mean, var)
        return mean.copy(), var + self.noise_variance
