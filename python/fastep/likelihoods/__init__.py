"""Likelihood objects: validated parameters, their learnable parameters' space, and a handle to
the compiled site kernels.

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

Modules: ``base`` (:class:`Likelihood`, :class:`LikelihoodParameter`), ``binary``,
``regression``, ``ordinal``, and ``checks`` (the estimators' ``likelihood`` arguments).
A new likelihood is one subclass of :class:`Likelihood` (see its docstring).
"""
from .base import Likelihood, LikelihoodParameter
from .binary import BinaryLikelihood, Logistic, Probit, Step
from .ordinal import OrderedCategorical
from .regression import Gaussian, StudentT

__all__ = [
    "BinaryLikelihood",
    "Gaussian",
    "Likelihood",
    "LikelihoodParameter",
    "Logistic",
    "OrderedCategorical",
    "Probit",
    "Step",
    "StudentT",
]

# The public classes are documented, pickled and shown as ``fastep.likelihoods.<name>``.
for _cls in (Likelihood, LikelihoodParameter, BinaryLikelihood, Logistic, Probit, Step, OrderedCategorical, Gaussian, StudentT):
    _cls.__module__ = __name__
del _cls
