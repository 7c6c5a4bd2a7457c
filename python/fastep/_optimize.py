"""Shared type-II maximum-likelihood plumbing: L-BFGS-B with seeded restarts; scaled conjugate gradients."""
import warnings

import numpy as np
from scipy.optimize import minimize

from .exceptions import ConvergenceWarning

__all__ = ["maximize_log_likelihood", "maximize_log_likelihood_scg"]


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


def maximize_log_likelihood_scg(objective, theta0, bounds, *, maxiter=100, xtol=1e-4, ftol=1e-4):
    """Maximise ``objective(theta) -> (value, gradient)`` by scaled conjugate gradients.

    Møller's (1993) algorithm as in Netlab's ``scg.m`` (Nabney 2001), the optimiser the IVM
    paper names for Algorithm 2 (Lawrence's toolbox runs it with the tolerances used here:
    stop when a successful step moves no coordinate by more than ``xtol`` and changes the
    objective by less than ``ftol``). Each iteration costs two evaluations (the objective and
    gradient at the trial point, and a gradient a tiny step ``1e-4/|d|`` along the search
    direction for the curvature); Polak-Ribière directions, restarted every ``len(theta)``
    successful steps. ``bounds`` are not part of the algorithm (the toolbox has none): points
    are clipped into them before every evaluation and the result is clipped. A point where the
    objective is not finite counts as a failed step (the trust scale grows and the step shrinks).

    Returns ``(theta, value, n_evaluations)`` like :func:`maximize_log_likelihood`.
    """
    x = np.asarray(theta0, dtype=float).copy()
    bounds = np.asarray(bounds, dtype=float).reshape(-1, 2)
    lo, hi = bounds[:, 0], bounds[:, 1]
    x = np.clip(x, lo, hi)
    n_evals = [0]

    def neg(theta):
        n_evals[0] += 1
        value, grad = objective(np.clip(theta, lo, hi))
        if not np.isfinite(value):
            return np.inf, np.zeros_like(theta)
        return -float(value), -np.asarray(grad, dtype=float)

    sigma0, beta, beta_min, beta_max = 1e-4, 1.0, 1e-15, 1e100
    f_old, g_new = neg(x)
    if not np.isfinite(f_old):
        raise ValueError("the objective is not finite at the starting point")
    f_now, g_old = f_old, g_new
    d = -g_new
    success, n_success, n_params = True, 0, x.shape[0]
    mu = kappa = gamma = 0.0
    for _ in range(maxiter):
        if success:                       # first and second directional derivatives
            mu = float(d @ g_new)
            if mu >= 0:
                d = -g_new
                mu = float(d @ g_new)
            kappa = float(d @ d)
            if kappa < np.finfo(float).eps:
                break
            sigma = sigma0 / np.sqrt(kappa)
            _, g_plus = neg(x + sigma * d)
            gamma = float(d @ (g_plus - g_new)) / sigma
        delta = gamma + beta * kappa      # scaled curvature, made positive
        if delta <= 0:
            delta = beta * kappa
            beta = beta - gamma / kappa
        alpha = -mu / delta
        x_new = x + alpha * d
        f_new, g_trial = neg(x_new)
        ratio = 2.0 * (f_new - f_old) / (alpha * mu) if np.isfinite(f_new) else -1.0
        success = ratio >= 0
        if success:
            x, f_now = x_new, f_new
            n_success += 1
            if np.max(np.abs(alpha * d)) < xtol and abs(f_new - f_old) < ftol:
                break
            f_old, g_old, g_new = f_new, g_new, g_trial
            if not np.any(g_new):
                break
        else:
            f_now = f_old
        if ratio < 0.25:
            beta = min(4.0 * beta, beta_max)
        if ratio > 0.75:
            beta = max(0.5 * beta, beta_min)
        if n_success == n_params:
            d = -g_new
            n_success = 0
        elif success:
            d = (float((g_old - g_new) @ g_new) / mu) * d - g_new
    return np.clip(x, lo, hi), -float(f_now), n_evals[0]
