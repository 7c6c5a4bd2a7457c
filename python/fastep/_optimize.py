"""Shared type-II maximum-likelihood plumbing: L-BFGS-B with seeded restarts."""
import warnings

import numpy as np
from scipy.optimize import minimize

from .exceptions import ConvergenceWarning

__all__ = ["maximize_log_likelihood"]


def maximize_log_likelihood(objective, theta0, bounds, *, n_restarts=0, rng=None, restart_scale=1.0,
                            maxiter=200):
    """Maximise ``objective(theta) -> (value, gradient)`` with L-BFGS-B from ``theta0`` and restarts.

    Parameters
    ----------
    objective : callable
        Returns the log likelihood and its gradient (finite floats; ``-inf`` marks a
        point where the model cannot be evaluated).
    theta0 : ndarray (p,)
    bounds : ndarray (p, 2)
        Box constraints in the unconstrained space (infinite entries allowed).
    n_restarts : int
        Extra starts drawn as ``theta0 + restart_scale * N(0, I)`` from ``rng``,
        clipped into the bounds.
    rng : numpy.random.Generator

    Returns
    -------
    theta, value, n_evaluations : the best point found, its log likelihood, and the evaluation count.
    """
    theta0 = np.asarray(theta0, dtype=float)
    bounds = np.asarray(bounds, dtype=float).reshape(-1, 2)
    scipy_bounds = [(None if not np.isfinite(lo) else lo, None if not np.isfinite(hi) else hi)
                    for lo, hi in bounds]
    n_evals = [0]

    def negated(theta):
        n_evals[0] += 1
        value, grad = objective(theta)
        if not np.isfinite(value):
            return 1e300, np.zeros_like(theta)
        return -value, -np.asarray(grad, dtype=float)

    starts = [theta0]
    if n_restarts:
        rng = np.random.default_rng() if rng is None else rng
        for _ in range(n_restarts):
            starts.append(np.clip(theta0 + restart_scale * rng.standard_normal(theta0.shape),
                                  bounds[:, 0], bounds[:, 1]))
    best = None
    for start in starts:
        res = minimize(negated, start, jac=True, method="L-BFGS-B", bounds=scipy_bounds,
                       options={"maxiter": maxiter})
        if best is None or res.fun < best.fun:
            best = res
    if not best.success:
        warnings.warn(f"L-BFGS-B stopped before convergence: {best.message}", ConvergenceWarning,
                      stacklevel=3)
    return np.asarray(best.x, dtype=float), float(-best.fun), n_evals[0]
