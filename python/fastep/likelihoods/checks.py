"""The estimators' ``likelihood`` arguments, validated: which likelihoods each model accepts,
what a name or None stands for, and the error that names the argument otherwise."""
from __future__ import annotations

import numpy as np

from fastep._epcore.rank_k_ep import RankKLikelihood
from fastep._epcore.sites import SiteSpec
from .base import Likelihood
from .binary import BinaryLikelihood, Probit
from .ordinal import OrderedCategorical
from .regression import Gaussian, StudentT

__all__ = ["is_likelihood", "check_binary_likelihood", "resolve_noise_model", "check_ordinal_likelihood",
           "rank_k_likelihood", "NOISE_MODELS"]

#: The regression noise models an estimator's ``likelihood`` may name.
NOISE_MODELS = {"gaussian": Gaussian, "student_t": StudentT}


def is_likelihood(value):
    """Whether ``value`` is a :class:`Likelihood` (one of fastep's likelihood objects)."""
    return isinstance(value, Likelihood)


def check_binary_likelihood(likelihood):
    """The estimator's binary likelihood: ``Probit()`` for None, else a binary likelihood
    (:class:`Probit`, :class:`Step` or :class:`Logistic`).

    Raises
    ------
    TypeError
        For anything else.
    """
    lik = Probit() if likelihood is None else likelihood
    if not isinstance(lik, BinaryLikelihood):
        raise TypeError("likelihood must be a binary classification likelihood (fastep.likelihoods.Probit, Step "
                        f"or Logistic), got {lik!r}")
    return lik


def resolve_noise_model(likelihood, noise_variance):
    """A regressor's ``likelihood`` argument against its ``noise_variance``.

    Parameters
    ----------
    likelihood : None, str or Likelihood
        None or ``'gaussian'``: Gaussian noise; ``'student_t'``: Student-t noise; or a
        :class:`Gaussian` or :class:`StudentT` object (then ``noise_variance`` must be None).
    noise_variance : float or None

    Returns
    -------
    noise_class : type
        The noise model's class.
    given : Likelihood or None
        The object given, or None when the noise model was named (its parameters then start
        from the targets' scale, :meth:`Likelihood.from_noise_variance`).

    Raises
    ------
    ValueError, TypeError
        Naming ``likelihood`` (or both arguments when both give the noise).
    """
    expected = "None, 'gaussian', 'student_t', a Gaussian or a StudentT"
    if likelihood is None:
        return Gaussian, None
    if isinstance(likelihood, str):
        if likelihood in NOISE_MODELS:
            return NOISE_MODELS[likelihood], None
        raise ValueError(f"likelihood must be {expected}; got {likelihood!r}")
    if not isinstance(likelihood, tuple(NOISE_MODELS.values())):
        raise TypeError(f"likelihood must be {expected}; got {type(likelihood).__name__}")
    if noise_variance is not None:
        raise ValueError("give the noise either as noise_variance or as a likelihood object, not both "
                         f"(noise_variance={noise_variance!r}, likelihood={likelihood!r})")
    return type(likelihood), likelihood


def check_ordinal_likelihood(likelihood, n_categories):
    """The ordinal likelihood for ``n_categories`` ordered classes: the default thresholds
    centred on zero for None, else the :class:`OrderedCategorical` given, which must have that
    many categories."""
    if likelihood is None:
        return OrderedCategorical(n_categories, slope=1.0, bias=-(n_categories - 2) / 2.0)
    if not isinstance(likelihood, OrderedCategorical):
        raise TypeError(f"likelihood must be a fastep.likelihoods.OrderedCategorical, got {likelihood!r}")
    if likelihood.n_categories != n_categories:
        raise ValueError(f"likelihood has n_categories = {likelihood.n_categories} but y has {n_categories} "
                         "distinct labels")
    return likelihood


def rank_k_likelihood(likelihood, k, n_nodes, gaussian_noise_cov):
    """The compiled rank-k likelihood of a multi-output model with ``k`` outputs.

    Parameters
    ----------
    likelihood : 'gaussian', Likelihood, SiteSpec or RankKLikelihood
        A :class:`RankKLikelihood` is used as given; a scalar likelihood (or its
        ``SiteSpec``) acts on each output independently, its moments by an ``n_nodes``-point
        product rule; ``'gaussian'`` is a k-variate Gaussian.
    k : int
    n_nodes : int
    gaussian_noise_cov : callable
        Returns the (k, k) noise covariance of ``'gaussian'`` (validated by the caller).
    """
    if isinstance(likelihood, RankKLikelihood):
        if likelihood.kind == 0 and likelihood.k != k:
            raise ValueError(f"likelihood has k = {likelihood.k} outputs but Y has {k} columns")
        return likelihood
    if isinstance(likelihood, (SiteSpec, Likelihood)):
        spec = likelihood.site_spec() if isinstance(likelihood, Likelihood) else likelihood
        if isinstance(n_nodes, bool) or not isinstance(n_nodes, (int, np.integer)) or n_nodes < 1:
            raise ValueError(f"n_nodes must be a positive integer, got {n_nodes!r}")
        return RankKLikelihood.product(spec, int(n_nodes))
    if isinstance(likelihood, str):
        if likelihood != 'gaussian':
            raise ValueError(f"likelihood must be 'gaussian', a Likelihood, a SiteSpec or a RankKLikelihood, "
                             f"got {likelihood!r}")
        return RankKLikelihood.mvgaussian(gaussian_noise_cov())
    raise TypeError("likelihood must be 'gaussian', a Likelihood, a SiteSpec or a RankKLikelihood, "
                    f"got {type(likelihood).__name__}")
