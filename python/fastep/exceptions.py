"""Warnings and errors raised by fastep."""

__all__ = ["ConvergenceWarning", "NotFittedError"]


class ConvergenceWarning(UserWarning):
    """EP (or an optimiser) stopped before its convergence criterion was met.

    The message names the number of sweeps run and the last change in the
    site parameters, so the result can be judged rather than trusted blindly.
    """


class NotFittedError(ValueError, AttributeError):
    """An estimator was used for prediction before ``fit`` was called."""
