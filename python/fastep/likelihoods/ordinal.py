"""The ordered categorical (ordinal regression) likelihood."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fastep._epcore import sites as _sites
from ..kernels.transforms import IDENTITY, TRANSFORMS
from .base import Likelihood, LikelihoodParameter, _as_1d, _as_float

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray

__all__ = ["OrderedCategorical"]


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

    def parameters(self) -> list[LikelihoodParameter]:
        """``bias`` (t = b) and ``log_width_i`` (t = log w_i); the slope is not learnt."""
        return ([LikelihoodParameter("bias", "bias", IDENTITY, box=(-1e3, 1e3))]
                + [LikelihoodParameter(f"log_width_{i + 1}", "widths", TRANSFORMS["log"], box=(-30.0, 20.0), index=i)
                   for i in range(self.n_categories - 2)])

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

