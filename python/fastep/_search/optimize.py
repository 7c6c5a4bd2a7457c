"""Shared type-II maximum-likelihood plumbing: L-BFGS-B with seeded restarts, L-BFGS-B in growing trust
regions, scaled conjugate gradients. ``scipy.optimize`` is imported on the first search, not with
fastep."""
import warnings

import numpy as np

from .._linalg import inner
from ..exceptions import ConvergenceWarning

__all__ = ["SearchStop", "maximize_log_likelihood", "maximize_log_likelihood_trust_region", "maximize_log_likelihood_scg"]


def maximize_log_likelihood(objective, theta0, bounds, *, n_restarts=0, rng=None, restart_scale=1.0,
                            maxiter=200, stall_fallback=True, check_gradient=True, stacklevel=3, ftol=None,
                            stop_rule=None, scale=1.0):
    """Maximise ``objective(theta) -> (value, gradient)`` with L-BFGS-B from ``theta0`` and restarts.

    Each start runs L-BFGS-B. A run *stalls* when the value at its result is not above the
    value at its start by more than L-BFGS-B's own relative-reduction tolerance
    (``factr * eps`` ≈ 2.2e-9, relative to ``max(|value|, 1)``) although the start is not
    stationary (its projected gradient exceeds L-BFGS-B's ``pgtol``, 1e-5, in some
    coordinate). With ``stall_fallback`` such a start is searched again by
    :func:`maximize_log_likelihood_trust_region` (initial half-width 1, the same
    ``maxiter``) and the better of the two results is kept; a run that improved on its
    start is never repeated from its start. A run that instead stops on relative
    reduction at a point that is far from stationary (projected gradient above
    ``sqrt(pgtol)`` ≈ 3.2e-3; see ``_stopped_short``) is continued from that point in
    trust regions with the iterations it had left, and again the better result is kept.
    Runs that converge on the projected gradient or spend their budget are unchanged.

    The stall comes from L-BFGS-B's first step. When every variable has two finite bounds
    (for example kernels with only ``'log'`` transforms, bounds ±700, together with the
    likelihood parameters (:attr:`fastep.likelihoods.Likelihood.theta`), or either alone), its first
    trial point is ``theta0`` minus the whole projected gradient (with any unbounded
    variable the step is scaled to length 1 instead). The gradient of an evidence summed
    over N points is O(N): the trial lands on or near the bounds, where the model fails
    (``-inf``, e.g. GP regression at log σ² = -30 with a log-RBF kernel) or is
    astronomically worse, and the line search then shrinks the step to nothing and
    L-BFGS-B reports convergence at ``theta0``.

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
    restart_scale : float, default 1.0
    maxiter : int, default 200
        L-BFGS-B iterations per start (and per trust-region fallback).
    stall_fallback : bool, default True
        Search a stalled start again in trust regions (see above). Callers that confine
        L-BFGS-B to their own trust boxes and handle rounds without progress themselves
        (the horseshoe's type-II ML) switch it off.
    check_gradient : bool, default True
        Warn when the returned point's projected gradient is not small (see Warns).
    stacklevel : int, default 3
        Passed to :func:`warnings.warn` (the caller of the caller by default).
    ftol : float, optional
        L-BFGS-B's relative-reduction tolerance (default scipy's, ``factr * eps`` ≈ 2.2e-9).
        Callers whose objective is only accurate to a known absolute error raise it to that
        error relative to the objective's size.
    stop_rule : object, optional
        A stopping rule of the caller's: ``stop_rule.restart()`` is called before each start
        and ``stop_rule.accept(theta)`` at each accepted L-BFGS-B iterate (``theta`` was
        evaluated); when it returns True the start ends there, its result is that iterate
        (no fallback search follows and no gradient check is made: the caller's rule says
        the model has stopped changing).
    scale : float, default 1.0
        L-BFGS-B moves ``theta / scale``: its first trial step (length 1 when a variable is
        unbounded) has length ``scale`` in ``theta``. Later steps follow its curvature pairs,
        which the scaling does not change. Callers that start near the optimum (e.g. where a
        search on a subset of the data ended) pass the distance they expect to it.

    Returns
    -------
    theta, value, n_evaluations : the best point found, its log likelihood, and the evaluation count.

    Warns
    -----
    ConvergenceWarning
        If the L-BFGS-B run that gave the result stopped before converging (not raised
        for a trust-region result); otherwise, with ``check_gradient``, if the projected
        gradient at the returned point exceeds ``GRADIENT_WARN_RTOL * max(|value|, 1)`` in
        some coordinate (the result is not a stationary point of the evidence).
    """
    from scipy.optimize import minimize
    theta0 = np.asarray(theta0, dtype=float)
    bounds = np.asarray(bounds, dtype=float).reshape(-1, 2)
    scipy_bounds = [(None if not np.isfinite(lo) else lo, None if not np.isfinite(hi) else hi)
                    for lo, hi in bounds]
    scale = float(scale)
    scaled_bounds = scipy_bounds if scale == 1.0 else [
        (None if lo is None else lo / scale, None if hi is None else hi / scale) for lo, hi in scipy_bounds]
    n_evals = [0]
    first = []                      # (value, gradient) of the first evaluation of each run
    seen = {}                       # theta bytes -> gradient, for the check of the result
    values = {}                     # theta bytes -> objective value

    def negated(x):
        theta = x * scale if scale != 1.0 else x
        n_evals[0] += 1
        value, grad = objective(theta)
        if not first:
            first.append((float(value), np.asarray(grad, dtype=float)))
        if not np.isfinite(value):
            return 1e300, np.zeros_like(theta)
        key = np.asarray(theta, dtype=float).tobytes()
        seen[key] = np.array(grad, dtype=float)
        values[key] = float(value)
        return -value, -scale * np.asarray(grad, dtype=float)

    callback = None
    if stop_rule is not None:
        def callback(xk):
            xk = np.asarray(xk, dtype=float)
            if scale != 1.0:
                xk = xk * scale
            if xk.tobytes() in values and stop_rule.accept(xk):
                raise _RuleStop(xk)

    starts = [theta0]
    if n_restarts:
        rng = np.random.default_rng() if rng is None else rng
        for _ in range(n_restarts):
            starts.append(np.clip(theta0 + restart_scale * rng.standard_normal(theta0.shape),
                                  bounds[:, 0], bounds[:, 1]))
    best = None                     # (negated value, theta, L-BFGS-B result or None)
    stopped_by_rule = set()
    for start in starts:
        first.clear()
        if stop_rule is not None:
            stop_rule.restart()
        try:
            res = minimize(negated, start / scale if scale != 1.0 else start, jac=True, method="L-BFGS-B",
                           bounds=scaled_bounds, callback=callback,
                           options={"maxiter": maxiter} if ftol is None else {"maxiter": maxiter, "ftol": ftol})
            if scale != 1.0:
                res.x, res.jac = res.x * scale, res.jac / scale
        except _RuleStop as stop:
            value = stop.value if stop.value is not None else values[stop.theta.tobytes()]
            found = (-float(value), stop.theta.copy(), None)
            stopped_by_rule.add(stop.theta.tobytes())
            gradient = seen.get(stop.theta.tobytes())
            if not (isinstance(stop, SearchStop) and stall_fallback and gradient is not None
                    and _projected_gradient_size(stop.theta, gradient, bounds) > _LATE_STALL_PGTOL):
                if best is None or found[0] < best[0]:
                    best = found
                continue
            # the objective ended a run whose line searches made no progress at a point far from
            # stationary: as for an L-BFGS-B stop there, continue in trust regions (with the
            # objective's rule given a new window)
            res = None
        if res is None:
            fallback = (found[1], maxiter)
        else:
            found = (float(res.fun), np.asarray(res.x, dtype=float), res)
            fallback = None
            if stall_fallback and first and _stalled(first[0], float(-res.fun), start, bounds):
                fallback = (start, maxiter)
            elif stall_fallback and _stopped_short(res, bounds) and maxiter - int(res.nit) > 0:
                fallback = (found[1], maxiter - int(res.nit))
        if fallback is not None:
            if hasattr(stop_rule, "resume"):      # the fallback is a new window for the rule
                stop_rule.resume()
            try:
                theta, value, evals = maximize_log_likelihood_trust_region(
                    objective, fallback[0], bounds, maxiter=fallback[1],
                    on_recentre=getattr(stop_rule, "resume", None))
            except _RuleStop as stop:       # the objective's own rule ended the fallback
                theta, value, evals = stop.theta.copy(), float(stop.value), 0
                stopped_by_rule.add(theta.tobytes())
            n_evals[0] += evals
            if value > -found[0]:
                found = (-value, theta, None)
        if best is None or found[0] < best[0]:
            best = found
    if best[2] is not None and not best[2].success:
        warnings.warn(f"L-BFGS-B stopped before convergence: {best[2].message}", ConvergenceWarning,
                      stacklevel=stacklevel)
    elif check_gradient and best[1].tobytes() in seen and best[1].tobytes() not in stopped_by_rule:
        size = _projected_gradient_size(best[1], seen[best[1].tobytes()], bounds)
        value = float(-best[0])
        if np.isfinite(size) and size > GRADIENT_WARN_RTOL * max(abs(value), 1.0):
            warnings.warn(
                f"type-II ML ended at a point that is not stationary: the projected gradient of the log "
                f"evidence ({value:.6g}) is {size:.3g} in some parameter. The optimiser stopped short "
                "(a step it could not take); try n_restarts_optimizer > 0, other starting values, or "
                "rescaled inputs.", ConvergenceWarning, stacklevel=stacklevel)
    return best[1].copy(), float(-best[0]), n_evals[0]


class _RuleStop(Exception):
    """Raised from L-BFGS-B's callback when the caller's stopping rule holds, or by the objective
    itself (:class:`SearchStop`)."""

    def __init__(self, theta, value=None):
        super().__init__("stopping rule")
        self.theta = theta
        self.value = value


class SearchStop(_RuleStop):
    """``SearchStop(theta, value)``, raised by an objective to end the L-BFGS-B run at ``theta``, a
    point it evaluated to ``value`` (the caller's stopping rule holds inside a line search): the
    run's result is that point, as when ``stop_rule.accept`` returns True."""


#: Relative size of the projected gradient (per unit of the log evidence's magnitude) above which
#: a returned point is reported as not stationary.
GRADIENT_WARN_RTOL = 1e-3


#: L-BFGS-B's defaults in scipy: relative reduction ``factr * eps`` and projected-gradient tolerance.
_LBFGSB_FTOL = 1e7 * np.finfo(float).eps
_LBFGSB_PGTOL = 1e-5


def _projected_gradient_size(x, gradient, bounds):
    """Largest coordinate of the projected ascent step ``clip(x + gradient) - x`` (x clipped first),
    the quantity L-BFGS-B compares with ``pgtol``."""
    x = np.clip(np.asarray(x, dtype=float), bounds[:, 0], bounds[:, 1])
    step = np.clip(x + gradient, bounds[:, 0], bounds[:, 1]) - x
    return float(np.max(np.abs(step), initial=0.0))


def _stalled(start_eval, value, start, bounds):
    """Whether an L-BFGS-B run ending at ``value`` failed to improve on a non-stationary start.

    Parameters
    ----------
    start_eval : (float, ndarray)
        Objective value and gradient at the start.
    value : float
        Objective value at the point L-BFGS-B returned.
    start : ndarray (p,)
    bounds : ndarray (p, 2)

    Returns
    -------
    bool
        True if the start has a finite value, ``value`` exceeds it by no more than
        ``_LBFGSB_FTOL * max(|start value|, 1)``, and the projected gradient at the start
        (the move ``clip(start + gradient) - start`` of a projected ascent step) exceeds
        ``_LBFGSB_PGTOL`` in some coordinate.
    """
    value0, grad0 = start_eval
    if not (np.isfinite(value0) and np.all(np.isfinite(grad0))):
        return False
    if value > value0 + _LBFGSB_FTOL * max(abs(value0), 1.0):
        return False
    return _projected_gradient_size(start, grad0, bounds) > _LBFGSB_PGTOL


#: Projected-gradient size above which an L-BFGS-B stop on relative reduction counts as short of a
#: stationary point (``sqrt(pgtol)``, 300x L-BFGS-B's own projected-gradient tolerance).
_LATE_STALL_PGTOL = np.sqrt(_LBFGSB_PGTOL)


def _stopped_short(res, bounds):
    """Whether L-BFGS-B reported convergence on relative reduction far from a stationary point.

    L-BFGS-B also stops when one iteration lowers the objective by less than
    ``_LBFGSB_FTOL`` relative to its size. After a wild early trial (see
    :func:`maximize_log_likelihood`) its curvature pairs can be so poor that its line
    searches only take negligible steps, and it stops there with a large gradient: e.g.
    :class:`fastep.SparseGPClassifier` with fixed inducing inputs and a log-RBF kernel on
    a 200-point toy stopped after 8-12 iterations with gradient components of 1.6-3.8,
    where a step of 0.1 along the gradient gains about 0.3.

    Parameters
    ----------
    res : scipy.optimize.OptimizeResult
        The L-BFGS-B result for the *negated* objective.
    bounds : ndarray (p, 2)

    Returns
    -------
    bool
        True if the run converged (``status`` 0) on relative reduction rather than on the
        projected gradient, at a finite point whose projected gradient exceeds
        ``_LATE_STALL_PGTOL`` in some coordinate. Runs that spent their budget are not
        counted (they are reported by the ``ConvergenceWarning`` instead).
    """
    if res.status != 0 or "REL" not in str(res.message).upper():
        return False
    grad = -np.asarray(res.jac, dtype=float)
    if not (np.isfinite(res.fun) and abs(res.fun) < 1e299 and np.all(np.isfinite(grad))):
        return False
    return _projected_gradient_size(res.x, grad, bounds) > _LATE_STALL_PGTOL


def maximize_log_likelihood_trust_region(objective, theta0, bounds, *, radius=1.0, maxiter=200, min_radius=1e-3,
                                         on_recentre=None):
    """Maximise ``objective(theta) -> (value, gradient)`` by L-BFGS-B in box trust regions of growing size.

    Meant for parameters that all have finite bounds. When every variable is bounded, L-BFGS-B
    tries as its first step the whole projected gradient (step length 1; with any
    unbounded variable it scales the first step to length 1 instead). The gradient of a
    sum over N data points, such as the IVM's noise objective (eq 34 of Lawrence, Seeger &
    Herbrich 2005, ``Σ_n log Z_n``), is O(N) in size, so that first trial lands far away,
    often on the bounds: for the ordinal likelihood at its default start on the paper's
    ordinal toy (N = 200) it moved two log widths by 15 and 20 (widths of e^15 and e^20),
    where eq 34 is about -5e18 with gradients of 1e17-1e31. The line search then
    interpolates from these numbers: sometimes to a usable step, but often to a step of
    about 1e-17 that leaves theta unchanged, after which L-BFGS-B reports convergence at the
    start (relative reduction 0) and the parameters are never learnt. Which of the two
    happens changed with perturbations of the inputs of 1e-12.

    Here each L-BFGS-B run is confined to the box ``[c - radius, c + radius]`` (intersected
    with ``bounds``) around the current centre ``c``, so no trial point moves a coordinate
    by more than ``radius`` from it. The box is moved and changed like a trust region:

    * the run improved the objective and its best point lies on a face of the box that is
      not a face of ``bounds`` (the maximiser may lie beyond it): recentre there, double
      ``radius`` and continue;
    * it improved the objective and its best point is inside the box: stop there (L-BFGS-B
      converged, or spent the budget, inside the trust region);
    * it did not improve the objective although L-BFGS-B took at least one iteration (the
      line search failed): shrink ``radius`` fourfold and try again, until it falls below
      ``min_radius``;
    * it stopped before its first iteration (projected gradient below L-BFGS-B's ``pgtol``):
      stop, the centre is stationary.

    An objective may end a run itself by raising :class:`SearchStop` (its own stopping
    rule, e.g. evaluations in a row without progress). That ends the current box's run
    only: its best point is treated as above, so a run that stalled on a face of the box
    (L-BFGS-B re-evaluating the face point while its projected step is zero) moves on to
    the next, larger box, and a run that stalled without improving ends the search.

    The point returned is the best one evaluated, so its value is never below the value at
    ``theta0``. A direction in which the objective increases without bound is followed by
    steps that double with every trust region, until the bound or the iteration budget
    stops it.

    Parameters
    ----------
    objective : callable
        Returns the log likelihood and its gradient (``-inf`` or another non-finite value
        marks a point where the model cannot be evaluated; such a point is never accepted).
    theta0 : ndarray (p,)
        Starting point (clipped into ``bounds``). The objective must be finite there.
    bounds : ndarray (p, 2)
        Box constraints in the unconstrained space (infinite entries allowed).
    radius : float > 0, default 1.0
        Initial half-width of the trust box in the coordinates of ``theta``.
    maxiter : int, default 200
        L-BFGS-B iterations in all, summed over the trust regions (a run that stops without
        an iteration counts as one).
    min_radius : float > 0, default 1e-3
        Smallest half-width tried after failed runs.
    on_recentre : callable, optional
        Called without arguments each time the box moves to a better point, before the next
        run starts: a caller whose objective counts evaluations without progress (the
        ``PATIENCE`` rule of :class:`fastep._search.space.Search`) counts afresh from each
        new centre, as it does from each accepted L-BFGS-B iterate.

    Returns
    -------
    theta, value, n_evaluations : the best point evaluated, its objective value, and the evaluation count.

    Raises
    ------
    ValueError
        If the objective is not finite at ``theta0``.
    """
    from scipy.optimize import minimize
    bounds = np.asarray(bounds, dtype=float).reshape(-1, 2)
    lo_bound, hi_bound = bounds[:, 0], bounds[:, 1]
    center = np.clip(np.asarray(theta0, dtype=float), lo_bound, hi_bound)
    n_evals = [0]
    best = {"value": -np.inf, "theta": center.copy()}

    def negated(theta):
        n_evals[0] += 1
        value, grad = objective(theta)
        if not np.isfinite(value):
            return 1e300, np.zeros_like(theta)
        if value > best["value"]:
            best["value"], best["theta"] = float(value), np.array(theta, dtype=float)
        return -float(value), -np.asarray(grad, dtype=float)

    negated(center)
    if not np.isfinite(best["value"]):
        raise ValueError("the objective is not finite at the starting point")
    value = best["value"]
    radius = float(radius)
    left = int(maxiter)
    while left > 0:
        lo = np.maximum(lo_bound, center - radius)
        hi = np.minimum(hi_bound, center + radius)
        try:
            res = minimize(negated, center, jac=True, method="L-BFGS-B", bounds=list(zip(lo, hi)),
                           options={"maxiter": left})
            iterations, ruled = int(res.nit), False
        except SearchStop as stop:  # the objective's own rule ended this box's run at its best point
            iterations, ruled = 1, True
            if stop.value is not None and np.isfinite(stop.value) and stop.value > best["value"]:
                best["value"], best["theta"] = float(stop.value), np.array(stop.theta, dtype=float)
        left -= max(iterations, 1)
        if best["value"] > value:
            x = best["theta"]
            tol = 1e-8 * radius
            on_face = np.any(((x <= lo + tol) & (lo > lo_bound)) | ((x >= hi - tol) & (hi < hi_bound)))
            center, value = x, best["value"]
            if not on_face:
                break
            radius *= 2.0
            if on_recentre is not None:
                on_recentre()
        elif ruled or iterations == 0 or radius / 4.0 < min_radius:
            break
        else:
            radius /= 4.0
    return center.copy(), value, n_evals[0]


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
            mu = inner(d, g_new)
            if mu >= 0:
                d = -g_new
                mu = inner(d, g_new)
            kappa = inner(d, d)
            if kappa < np.finfo(float).eps:
                break
            sigma = sigma0 / np.sqrt(kappa)
            _, g_plus = neg(x + sigma * d)
            gamma = inner(d, g_plus - g_new) / sigma
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
            d = (inner(g_old - g_new, g_new) / mu) * d - g_new
    return np.clip(x, lo, hi), -float(f_now), n_evals[0]
