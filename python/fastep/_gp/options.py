"""Defaults and checks of the constructor arguments the GP estimators share (``kernel``
start, the binary likelihood, the noise variance, ``optimizer``, the EP options)."""
from __future__ import annotations


import numpy as np

from .. import _validation as v
from .._constraints import Boolean, Choice, Custom, Integer, Interval, Positive, Seed
from .._search.start import default_kernel
from ..likelihoods.checks import check_binary_likelihood

__all__ = ["check_noise_variance", "start_kernel", "use_fractional_ep", "check_classifier_likelihood", "check_optimizer", "ep_option_constraints"]


def check_noise_variance(noise_variance):
    """``noise_variance``: None (var(y) / 10, :func:`fastep._search.start.default_noise_variance`)
    or a positive float."""
    return None if noise_variance is None else v.check_positive(noise_variance, "noise_variance")


def start_kernel(kernel, X, y=None, *, regression=False, bias=True):
    """The kernel type-II ML starts from: ``kernel`` when given, else the data-aware default
    of :func:`fastep._search.start.default_kernel` on X (validated) and real targets y."""
    if kernel is not None:
        return kernel
    return default_kernel(X, y, regression=regression, bias=bias)


def use_fractional_ep(options, noise_class, power, damping):
    """The fit ``options`` (:class:`~fastep._gp.fit_options.FitOptions`) of fractional EP for a
    likelihood that needs it (:attr:`fastep.likelihoods.Likelihood.ep_variant` ``'fractional'``):
    the power η (``power``, or the likelihood's
    :attr:`~fastep.likelihoods.Likelihood.default_power`), up to 10 halvings of a step that
    would make a cavity improper, and damping 0.5 unless ``damping`` was given."""
    changes = {"power": float(noise_class.default_power if power is None else power), "max_halvings": 10}
    if damping is None:
        changes["damping"] = 0.5
    return options.replace(**changes)


def check_classifier_likelihood(likelihood, learn_likelihood):
    """``(likelihood, learn)``: the binary likelihood
    (:func:`fastep.likelihoods.checks.check_binary_likelihood`) and ``learn_likelihood`` as a
    bool; raises if learning was asked for parameters that cannot be learnt."""
    likelihood = check_binary_likelihood(likelihood)
    learn = v.check_bool(learn_likelihood, "learn_likelihood")
    if learn:
        likelihood.theta                        # raises for parameters that cannot be learnt
    return likelihood, learn


def check_optimizer(optimizer, allowed=("L-BFGS-B",)):
    """Raise ``ValueError`` unless ``optimizer`` is None or one of ``allowed``."""
    if not (optimizer is None or (isinstance(optimizer, str) and optimizer in allowed)):
        names = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"optimizer must be {names} or None, got {optimizer!r}")
    return optimizer


def ep_option_constraints(schedules, orders, policies):
    """The options every EP GP estimator checks (:func:`fastep._constraints.validate_params`)."""
    from ..hyperpriors import check_hyperprior
    return {
        "schedule": Choice(schedules), "order": Choice(orders), "negative_precision": Choice(policies),
        "damping": Interval(0.0, 1.0, low_inclusive=False, allow_none=True),
        "tol": Positive(), "max_sweeps": Integer(1),
        "jitter": Interval(0.0, np.inf, finite=True),
        "optimizer": Custom(check_optimizer), "n_restarts_optimizer": Integer(0), "warm_start": Boolean(),
        "random_state": Seed(), "hyperprior": Custom(check_hyperprior),
    }
