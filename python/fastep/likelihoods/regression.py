"""Regression noise models: real targets, a latent f observed with noise."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fastep._epcore import sites as _sites
from fastep._epcore import student_t_sites as _student_t_sites
from ..kernels.transforms import TRANSFORMS
from .base import Likelihood, LikelihoodParameter, _as_1d, _positive_finite

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray

__all__ = ["Gaussian", "StudentT"]

_LOG = TRANSFORMS["log"]


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
    learnable_with_power = True
    noise_variance: float

    def __init__(self, noise_variance: float = 1.0) -> None:
        super().__init__(noise_variance=noise_variance)

    @staticmethod
    def _validate(params):
        return {"noise_variance": _positive_finite("noise_variance", params["noise_variance"])}

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

    def parameters(self) -> list[LikelihoodParameter]:
        """``log_noise`` (t = log σ²).  Its box holds [-30, 20] and 30 below to 20 above its start:
        a noise variance starts from the targets' scale, and targets of scale 1e±12 need the box
        around that start."""
        return [LikelihoodParameter("log_noise", "noise_variance", _LOG, box=(-30.0, 20.0),
                                    start_margin=(-30.0, 20.0))]

    def _theta_terms(self, name, log_z, alpha, beta, cavity_mean, cavity_var):
        return 0.5 * self.noise_variance * (alpha * alpha - beta)   # ∂Z/∂σ² = ½ ∂²Z/∂m²

    def predictive(self, mean: ArrayLike, var: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Predictive ``(mean, var + noise_variance)`` of y under a latent ``N(mean, var)``."""
        mean, var = self._check_latent(mean, var)
        return mean.copy(), var + self._params["noise_variance"]


    def power_ep_theta_gradient(self, y: ArrayLike, cavity_mean: ArrayLike, cavity_var: ArrayLike,
                                alpha: ArrayLike, beta: ArrayLike, power: float) -> NDArray[np.float64]:
        """``(1/η) Σ_i ∂ log Z_i^(η)/∂ log σ²``: ``Z^(η) = (2πσ²)^((1-η)/2) η^(-1/2) N(y; m, v + σ²/η)``
        gives ``∂ log Z^(η)/∂σ² = (1-η)/(2σ²) + (α² - β)/(2η)``."""
        if power == 1.0:
            return self.theta_gradient(y, cavity_mean, cavity_var)
        s2 = self.noise_variance
        return np.array([float(np.sum(0.5 * (1.0 - power) + s2 * (alpha * alpha - beta) / (2.0 * power))) / power])

    @classmethod
    def from_noise_variance(cls, noise_variance: float) -> Gaussian:
        """Gaussian noise of variance ``noise_variance``."""
        return cls(noise_variance=noise_variance)



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
    ep_variant = "fractional"
    default_power = 0.5
    learnable_with_power = True
    dof: float
    scale: float

    @staticmethod
    def _validate(params):
        dof = _positive_finite("dof", params["dof"])
        scale = _positive_finite("scale", params["scale"])
        if not (math.isfinite(dof * scale * scale) and dof * scale * scale > 0):
            raise ValueError(f"dof * scale**2 must be finite and > 0, got dof={dof!r}, scale={scale!r}")
        return {"dof": dof, "scale": scale}

    def __init__(self, dof: float = 4.0, scale: float = 1.0) -> None:
        super().__init__(dof=dof, scale=scale)

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

    def parameters(self) -> list[LikelihoodParameter]:
        """``log_dof`` (t = log ν, box [log 0.2, log 1e5] widened to hold its start) and
        ``log_scale`` (t = log σ, from 15 below to 10 above its start, as the noise variance)."""
        return [LikelihoodParameter("log_dof", "dof", _LOG, box=(math.log(0.2), math.log(1e5)),
                                    start_margin=(0.0, 0.0)),
                LikelihoodParameter("log_scale", "scale", _LOG, start_margin=(-15.0, 10.0))]

    def theta_gradient(self, y: ArrayLike, cavity_mean: ArrayLike, cavity_var: ArrayLike, power: float = 1.0
                       ) -> NDArray[np.float64]:
        """``(1/η) Σ_i ∂ log Z_i^(η) / ∂(log ν, log σ)`` by quadrature of the tilted density."""
        _, _, _, d_log_dof, d_log_scale = self.powered_moments(y, cavity_mean, cavity_var, power)
        return np.array([float(np.sum(d_log_dof)), float(np.sum(d_log_scale))]) / power

    def predictive(self, mean: ArrayLike, var: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Predictive ``(mean, variance)`` of y under a latent ``N(mean, var)`` (variance inf for ν <= 2)."""
        mean, var = self._check_latent(mean, var)
        return mean.copy(), var + self.noise_variance

    def power_ep_theta_gradient(self, y: ArrayLike, cavity_mean: ArrayLike, cavity_var: ArrayLike,
                                alpha: ArrayLike, beta: ArrayLike, power: float) -> NDArray[np.float64]:
        """``(1/η) Σ_i ∂ log Z_i^(η) / ∂(log ν, log σ)`` (:meth:`theta_gradient` at the power)."""
        return self.theta_gradient(y, cavity_mean, cavity_var, power=power)

    def selection_likelihood(self) -> Gaussian:
        """Gaussian noise of variance σ²: the IVM's selection scores Gaussian sites of the
        Student-t's scale (its own sites may be negative)."""
        return Gaussian(noise_variance=self.scale ** 2)

    @classmethod
    def from_noise_variance(cls, noise_variance: float) -> StudentT:
        """ν = 4 (the paper's usual start) and σ² = ``noise_variance``."""
        return cls(dof=4.0, scale=float(np.sqrt(noise_variance)))
