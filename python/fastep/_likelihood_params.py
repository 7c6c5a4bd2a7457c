"""Learnable likelihood hyperparameters: unconstrained parametrisation and exact gradients of log Z.

At an EP fixed point the gradient of the EP log marginal likelihood with
respect to a likelihood hyperparameter φ is ``sum_i ∂ log Z_i / ∂φ`` at fixed
cavities (the sites are stationary, Seeger 2005; GPML's ``infEP``). This module
gives that derivative for the likelihoods with free parameters, in an
unconstrained space an optimiser can move freely:

==========================  =========================  =======================================================
parameter                   unconstrained t            ∂ log Z / ∂t  (cavity N(m, s), α, β from the site kernel)
==========================  =========================  =======================================================
``Probit.bias`` b           t = b                      α                      (Z depends on m + b only)
``Probit.slope`` λ (finite) t = log λ                  α (m + b) / (1 + λ² s)
``Step.flip_noise`` ε > 0   t = logit(2ε)              ε (1/Z − 2)            (dZ/dε = 1 − 2Φ, Φ = (Z − ε)/(1 − 2ε))
``Gaussian.noise_variance`` t = log σ²                 σ² (α² − β) / 2        (∂Z/∂σ² = ½ ∂²Z/∂m²)
``OrderedCategorical.bias`` t = b                      ∂_hi + ∂_lo            (every threshold moves with b)
``OrderedCategorical`` w_i  t = log w_i                w_i (∂_hi [i <= k] + ∂_lo [i <= k - 1])
``StudentT.dof`` ν          t = log ν                  ν E[∂ log p/∂ν]        (tilted expectation, by quadrature)
``StudentT.scale`` σ        t = log σ                  E[(ν+1) u/(1+u)] - 1   (u = (y-f)²/(νσ²))
==========================  =========================  =======================================================

``Logistic`` has no parameters. For the ordinal likelihood (IVM §2.4, used by the
IVM's noise-parameter updates, eq 34) a site with label k has
``Z = Φ(c (θ_k - m)) - Φ(c (θ_{k-1} - m))``, ``c = 1/sqrt(λ⁻² + s)``,
``θ_j = b + w_1 + ... + w_j``, and the threshold derivatives
``∂_hi = ∂ log Z/∂θ_k = c N(c (θ_k - m))/Z`` (0 for k = C-1) and
``∂_lo = ∂ log Z/∂θ_{k-1} = -c N(c (θ_{k-1} - m))/Z`` (0 for k = 0), each formed as
``± c exp(log N(u) - log Z)`` from the site kernel's log Z (so ``∂_hi + ∂_lo = -α``).
Its slope is not learnt.
"""
import math

import numpy as np
from scipy.special import expit, logit

from .likelihoods import Gaussian, Logistic, OrderedCategorical, Probit, Step, StudentT

__all__ = ["likelihood_theta", "likelihood_with_theta", "likelihood_theta_gradient"]

_BOUNDS = {"bias": (-1e3, 1e3), "log_slope": (-20.0, 20.0), "logit_flip": (-30.0, 30.0),
           "log_noise": (-30.0, 20.0), "log_width": (-30.0, 20.0), "log_dof": (math.log(0.2), math.log(1e5)),
           "log_scale": (-15.0, 10.0)}


def _names(likelihood):
    if isinstance(likelihood, Probit):
        return ["bias"] + (["log_slope"] if math.isfinite(likelihood.slope) else [])
    if isinstance(likelihood, Step):
        return ["logit_flip"]
    if isinstance(likelihood, Gaussian):
        return ["log_noise"]
    if isinstance(likelihood, Logistic):
        return []
    if isinstance(likelihood, StudentT):
        return ["log_dof", "log_scale"]
    if isinstance(likelihood, OrderedCategorical):
        return ["bias"] + [f"log_width_{i + 1}" for i in range(likelihood.n_categories - 2)]
    raise TypeError(f"learning the parameters of {type(likelihood).__name__} is not supported")


def likelihood_theta(likelihood):
    """``(names, theta, bounds)`` of the learnable parameters of ``likelihood`` (unconstrained)."""
    names = _names(likelihood)
    values = []
    for name in names:
        if name == "bias":
            values.append(likelihood.bias)
        elif name == "log_slope":
            values.append(math.log(likelihood.slope))
        elif name == "logit_flip":
            eps = likelihood.flip_noise
            if not eps > 0:
                raise ValueError("Step.flip_noise must be > 0 to be learnt (its logit parametrisation "
                                 "cannot start at 0); start from e.g. 0.05")
            values.append(float(logit(2.0 * eps)))
        elif name == "log_noise":
            values.append(math.log(likelihood.noise_variance))
        elif name.startswith("log_width_"):
            values.append(math.log(likelihood.widths[int(name[10:]) - 1]))
        elif name == "log_dof":
            values.append(math.log(likelihood.dof))
        elif name == "log_scale":
            values.append(math.log(likelihood.scale))
    bounds = []
    for name, value in zip(names, values):
        low, high = _BOUNDS["log_width" if name.startswith("log_width_") else name]
        if name == "log_noise":
            # a noise variance starts from the targets' scale: targets of scale 1e±12 need the box
            # around that start, not the fixed one for ordinary scales
            low, high = min(low, value - 30.0), max(high, value + 20.0)
        elif name == "log_dof":
            low, high = min(low, value), max(high, value)
        elif name == "log_scale":
            low, high = value + low, value + high           # around the start, as the noise variance
        bounds.append((low, high))
    return names, np.array(values, dtype=float), np.array(bounds, dtype=float).reshape(-1, 2)


def likelihood_with_theta(likelihood, theta):
    """A new likelihood object of the same type with the unconstrained parameters ``theta``."""
    names = _names(likelihood)
    params = likelihood.get_params()
    for name, t in zip(names, np.asarray(theta, dtype=float)):
        if name == "bias":
            params["bias"] = float(t)
        elif name == "log_slope":
            params["slope"] = math.exp(t)
        elif name == "logit_flip":
            params["flip_noise"] = min(0.5 * float(expit(t)), 0.5 - 1e-16)
        elif name == "log_noise":
            params["noise_variance"] = math.exp(t)
        elif name.startswith("log_width_"):
            params["widths"] = np.array(params["widths"], dtype=float)
            params["widths"][int(name[10:]) - 1] = math.exp(t)
        elif name == "log_dof":
            params["dof"] = math.exp(t)
        elif name == "log_scale":
            params["scale"] = math.exp(t)
    return type(likelihood)(**params)


def likelihood_theta_gradient(likelihood, y, cavity_mean, cavity_var, power=1.0):
    """``sum_i ∂ log Z_i / ∂t_j`` for every learnable parameter ``t_j`` (module table), at fixed cavities.

    ``power`` (Student-t only): the sites of fractional EP, ``(1/η) Σ_i ∂ log Z_i^(η) / ∂t_j``
    with ``Z_i^(η)`` the normaliser of the powered site.
    """
    names = _names(likelihood)
    if not names:
        return np.zeros(0)
    if isinstance(likelihood, StudentT):
        _, _, _, d_log_dof, d_log_scale = likelihood.powered_moments(y, cavity_mean, cavity_var, power)
        return np.array([float(np.sum(d_log_dof)), float(np.sum(d_log_scale))]) / power
    log_z, alpha, beta = likelihood.moments(y, cavity_mean, cavity_var)
    if isinstance(likelihood, OrderedCategorical):
        return _ordinal_gradient(likelihood, names, y, cavity_mean, cavity_var, log_z)
    grads = []
    for name in names:
        if name == "bias":
            g = alpha
        elif name == "log_slope":
            lam = likelihood.slope
            g = alpha * (cavity_mean + likelihood.bias) / (1.0 + lam * lam * cavity_var)
        elif name == "logit_flip":
            g = likelihood.flip_noise * (np.exp(-log_z) - 2.0)
        elif name == "log_noise":
            g = 0.5 * likelihood.noise_variance * (alpha * alpha - beta)
        grads.append(float(np.sum(g)))
    return np.array(grads)


def _ordinal_gradient(likelihood, names, y, cavity_mean, cavity_var, log_z):
    """Bias and log-width gradients of ``sum_i log Z_i`` for the ordinal likelihood (module table)."""
    y = np.asarray(y, dtype=float)
    k = y.astype(int)
    n_categories = likelihood.n_categories
    theta = likelihood.thresholds                                # θ_0 .. θ_{C-2}
    inv_slope2 = 0.0 if math.isinf(likelihood.slope) else likelihood.slope ** -2
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
    widths = likelihood.widths
    grads = []
    for name in names:
        if name == "bias":
            grads.append(float(np.sum(d_hi) + np.sum(d_lo)))
        else:
            i = int(name[10:])                                   # w_i enters θ_j for j >= i
            g = np.sum(d_hi[k >= i]) + np.sum(d_lo[k - 1 >= i])
            grads.append(float(widths[i - 1] * g))
    return np.array(grads)
