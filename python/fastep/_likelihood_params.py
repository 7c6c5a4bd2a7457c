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
==========================  =========================  =======================================================

``Logistic`` has no parameters; ``OrderedCategorical`` is not used by the GP estimators.
"""
import math

import numpy as np
from scipy.special import expit, logit

from .likelihoods import Gaussian, Logistic, Probit, Step

__all__ = ["likelihood_theta", "likelihood_with_theta", "likelihood_theta_gradient"]

_BOUNDS = {"bias": (-1e3, 1e3), "log_slope": (-20.0, 20.0), "logit_flip": (-30.0, 30.0),
           "log_noise": (-30.0, 20.0)}


def _names(likelihood):
    if isinstance(likelihood, Probit):
        return ["bias"] + (["log_slope"] if math.isfinite(likelihood.slope) else [])
    if isinstance(likelihood, Step):
        return ["logit_flip"]
    if isinstance(likelihood, Gaussian):
        return ["log_noise"]
    if isinstance(likelihood, Logistic):
        return []
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
    return names, np.array(values, dtype=float), np.array([_BOUNDS[n] for n in names], dtype=float).reshape(-1, 2)


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
    return type(likelihood)(**params)


def likelihood_theta_gradient(likelihood, y, cavity_mean, cavity_var):
    """``sum_i ∂ log Z_i / ∂t_j`` for every learnable parameter ``t_j`` (module table), at fixed cavities."""
    names = _names(likelihood)
    if not names:
        return np.zeros(0)
    log_z, alpha, beta = likelihood.moments(y, cavity_mean, cavity_var)
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
