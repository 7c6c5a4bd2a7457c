"""Binary classification likelihoods: targets in {-1, +1}."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fastep._epcore import sites as _sites
from .._special import expit, logit
from ..kernels.transforms import IDENTITY, TRANSFORMS, Transform
from .base import Likelihood, LikelihoodParameter, _as_1d, _as_float, _finite, _positive_finite

if TYPE_CHECKING:
    from typing import Literal

    from numpy.typing import ArrayLike, NDArray

__all__ = ["BinaryLikelihood", "Probit", "Step", "Logistic"]

_LOG = TRANSFORMS["log"]


class _HalfSigmoid(Transform):
    """ε = ½ σ(t) on (0, ½), kept below ½ by one rounding (t = logit 2ε): a label-flip rate."""

    name = "half_sigmoid"
    bounds = (-700.0, np.inf)
    upper = 0.5

    def forward(self, t):
        return np.minimum(0.5 * expit(t), 0.5 - 1e-16)

    def inverse(self, x):
        return logit(2.0 * np.asarray(x, dtype=float))

    def forward_scalar(self, t):
        return min(0.5 * float(expit(t)), 0.5 - 1e-16)

    def inverse_scalar(self, x):
        if not x > 0:
            raise ValueError("Step.flip_noise must be > 0 to be learnt (its logit parametrisation "
                             "cannot start at 0); start from e.g. 0.05")
        return float(logit(2.0 * x))

    def derivative(self, t):
        return 0.5 * expit(t) * expit(-np.asarray(t, dtype=float))


class BinaryLikelihood(Likelihood):
    """Base class of the binary classification likelihoods: targets in {-1, +1}.

    A new binary likelihood subclasses it and defines what :class:`Likelihood` asks of a
    subclass; the classifiers (:class:`fastep.GaussianProcessClassifier`,
    :class:`fastep.SparseGPClassifier`, :class:`fastep.IVMClassifier`,
    :class:`fastep.LinearEPClassifier`) accept it as their ``likelihood``.  The predictive
    ``p(y = +1)`` is the site normaliser at ``y = +1``.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep._epcore.sites import LIKELIHOOD_CODES, SiteSpec
    >>> from fastep.likelihoods import BinaryLikelihood
    >>> class SharpProbit(BinaryLikelihood):
    ...     # Φ(3 y f): a probit of fixed slope 3, nothing to learn
    ...     def _validate(self, params):
    ...         return {}
    ...     def _make_spec(self):
    ...         return SiteSpec(LIKELIHOOD_CODES["probit"], [3.0, 0.0])
    ...     def parameters(self):
    ...         return []
    >>> np.round(SharpProbit().predictive(np.array([2.0]), np.array([1.0])), 4)
    array([0.9711])
    """

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


_HALF_SIGMOID = _HalfSigmoid()


class Probit(BinaryLikelihood):
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
        return {"slope": _positive_finite("slope", params["slope"], may_be_inf=True),
                "bias": _finite("bias", params["bias"])}

    def _make_spec(self):
        return _sites.SiteSpec(_sites.LIKELIHOOD_CODES["probit"],
                               [self._params["slope"], self._params["bias"]])

    def parameters(self) -> list[LikelihoodParameter]:
        """``bias`` (t = b) and, for a finite slope, ``log_slope`` (t = log λ)."""
        bias = LikelihoodParameter("bias", "bias", IDENTITY, box=(-1e3, 1e3))
        if not math.isfinite(self.slope):
            return [bias]
        return [bias, LikelihoodParameter("log_slope", "slope", _LOG, box=(-20.0, 20.0))]

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


class Step(BinaryLikelihood):
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

    def parameters(self) -> list[LikelihoodParameter]:
        """``logit_flip`` (t = logit 2ε; ε must start above 0)."""
        return [LikelihoodParameter("logit_flip", "flip_noise", _HALF_SIGMOID, box=(-30.0, 30.0))]

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


class Logistic(BinaryLikelihood):
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

    def parameters(self) -> list[LikelihoodParameter]:
        """None: the logistic likelihood has no learnable parameters."""
        return []

    def _make_spec(self):
        if self._params["method"] == "mackay":
            return _sites.SiteSpec(_sites.LIKELIHOOD_CODES["logistic_mackay"], [])
        nodes, weights = np.polynomial.hermite.hermgauss(self._params["n_nodes"])
        return _sites.SiteSpec(_sites.LIKELIHOOD_CODES["logistic_gh"], [], nodes,
                               np.log(weights) - 0.5 * np.log(np.pi))

