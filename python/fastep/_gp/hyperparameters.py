"""θ = (kernel θ, likelihood θ, an extra block such as inducing inputs): the packing the
hyperparameter search moves and ``log_marginal_likelihood(theta)`` takes."""
from __future__ import annotations


import numpy as np

from .. import _validation as v
from .._search.space import search_space_of

__all__ = ["Hyperparameters"]


class Hyperparameters:
    """θ = (kernel θ, likelihood θ if learnt, an extra block if learnt), with its bounds.

    Parameters
    ----------
    kernel : Kernel
        Its unconstrained ``theta`` and ``bounds`` come first.
    likelihood : Likelihood
        Its learnable parameters (:attr:`fastep.likelihoods.Likelihood.theta`)
        follow when ``learn_likelihood``.
    learn_likelihood : bool
    extra : ndarray or None
        A further block learnt without bounds (the sparse model's inducing inputs, raveled
        into θ and reshaped back to ``extra.shape``); None for none.
    hyperprior : LogNormal or None
        The hyperprior of the search (:mod:`fastep.hyperpriors`), centred at this θ.

    Attributes
    ----------
    space : fastep._search.space.SearchSpace
        The coordinates the search moves (logs of the positive parameters).
    """

    def __init__(self, kernel, likelihood, learn_likelihood, extra=None, hyperprior=None):
        self.kernel = kernel
        self.likelihood = likelihood
        self.learn_likelihood = bool(learn_likelihood)
        self.extra = extra
        self.hyperprior = hyperprior
        self.n_kernel = kernel.n_theta
        if self.learn_likelihood:
            lik_theta, lik_bounds = likelihood.theta, likelihood.theta_bounds
        else:
            lik_theta, lik_bounds = np.zeros(0), np.zeros((0, 2))
        self.n_likelihood = lik_theta.size
        extra_theta = np.zeros(0) if extra is None else extra.ravel()
        self.theta0 = np.concatenate([kernel.theta, lik_theta, extra_theta])
        self.bounds = np.vstack([kernel.bounds.reshape(-1, 2), lik_bounds,
                                 np.tile([-np.inf, np.inf], (extra_theta.size, 1))])
        self.space = search_space_of(kernel, likelihood, self.learn_likelihood, extra_theta.size, self.theta0,
                                     self.bounds)

    @property
    def size(self):
        return self.theta0.size

    def unpack(self, theta):
        """``(kernel, likelihood, extra)`` at ``theta`` (the fixed parts unchanged)."""
        n_kernel, n_lik = self.n_kernel, self.n_likelihood
        kernel = self.kernel.clone_with_theta(theta[:n_kernel])
        likelihood = (self.likelihood.with_theta(theta[n_kernel:n_kernel + n_lik])
                      if self.learn_likelihood else self.likelihood)
        extra = (None if self.extra is None
                 else np.ascontiguousarray(theta[n_kernel + n_lik:].reshape(self.extra.shape)))
        return kernel, likelihood, extra

    def pack(self, kernel, likelihood, extra=None):
        """θ of ``kernel``, ``likelihood`` (if learnt) and ``extra`` (if learnt): :meth:`unpack`'s inverse."""
        parts = [kernel.theta]
        if self.learn_likelihood:
            parts.append(likelihood.theta)
        if self.extra is not None:
            parts.append(np.ravel(extra))
        return np.concatenate(parts)

    def check(self, theta):
        """``theta`` as a float64 vector of the right length (for ``log_marginal_likelihood``)."""
        return v.as_float_vector(theta, "theta", length=self.size)

    def log_prior(self, theta, eval_gradient=False):
        """The hyperprior's log density at ``theta`` (0 without one), and its gradient in θ."""
        space = self.space
        u = space.to_search(theta)
        value, grad_u = space.log_prior(self.hyperprior, u)
        if not eval_gradient:
            return value
        # ∂u/∂θ is 1, or σ(θ)/softplus(θ) for the softplus entries
        return value, grad_u / space.gradient_to_search(theta, np.ones_like(grad_u))
