"""Type-II maximum likelihood for the horseshoe models: a coarse start over ``(σ², ρ²)`` and
L-BFGS-B rounds in trust boxes, over memoised EP evaluations of the evidence.

The evidence is eq (27) of the supplement of Hernández-Lobato & Hernández-Lobato, *Learning
Feature Selection Dependencies in Multi-task Learning* (NIPS 2013), its gradients eqs (33)-(50).
Three properties of the horseshoe evidence shape the search:

- It has several regions of attraction in ``(σ², ρ²)``. At a large ``σ²`` the data are
  explained as noise and the best ``ρ²`` is moderate; at a small ``σ²`` with a small ``ρ²``
  a few features explain them. Gradient ascent started in the first region stays there, so
  the start is chosen by a coarse search over both (:meth:`EvidenceSearch.coarse_start`).
- EP can have several fixed points at one ``(σ², ρ²)``: from the cold start at a strong
  shrinkage (small ``ρ²``) it can end with every coefficient shrunk to zero, while the
  same EP continued from a weaker shrinkage keeps the relevant features. The coarse search
  therefore walks ``ρ²`` downwards from a weak shrinkage, each EP warm-started from the
  previous point, and every later evaluation starts from the sites of the nearest point
  evaluated so far (:meth:`EvidenceSearch.evaluate`).
- An EP run costs hundreds of BLAS-3 iterations; no point is evaluated twice (L-BFGS-B and
  the trust-box rounds revisit their start points).
"""
import warnings

import numpy as np

from .._epcore.horseshoe_ep import HorseshoeEP, HorseshoePrior
from .._search.optimize import GRADIENT_WARN_RTOL, _LBFGSB_FTOL, _projected_gradient_size, maximize_log_likelihood
from ..exceptions import ConvergenceWarning
from ..progress import StopRequested, quiet

__all__ = ["EvidenceSearch", "maximize_in_trust_boxes"]

#: Features per task below which the compiled site step runs on one OpenMP thread.
SINGLE_OMP_THREAD_BELOW = 4096
#: Type-II ML moves log σ² and log ρ² by at most this much per L-BFGS-B round, rounds of ROUND_ITER.
TRUST_LOG = 2.0
#: Trust box (±) of the P coordinates in the rounds after an EP failure, before halving.
TRUST_P = 1.0
ROUND_ITER = 15
#: An EP run stopped by max_sweeps is still used during type-II ML if its residual is below this.
ACCEPT_RESIDUAL = 1e-5
#: EP tolerance in the coarse start (it ranks points decades apart; L-BFGS-B refines at ``tol``).
START_TOL = 1e-5
#: ... and at most this many EP iterations per point (a point where EP is slower counts as failed).
START_MAX_SWEEPS = 500
#: The coarse start stops walking ρ² after this many decades in a row without a new best.
START_PATIENCE = 2
#: ... or after a decade that lowers the evidence by more than this (nats) below the walk's best.
START_DROP = 10.0
#: L-BFGS-B stops when an iteration gains less than about this many nats of evidence.
EVIDENCE_ATOL = 1e-4
#: Evaluated points whose sites are kept for warm starts (the best point's are always kept).
KEEP_SITES = 32


def _accepted(result):
    return result.converged or (result.status == "max_sweeps" and result.residual < ACCEPT_RESIDUAL)


class EvidenceSearch:
    """Type-II maximum likelihood of ``θ = (log σ_1², ..., log σ_T², log ρ², vec P)``.

    Parameters
    ----------
    tasks : list of fastep._horseshoe.parallel_ep.Task
    gamma2 : float
    D : ndarray (d,)
    P : ndarray (d, m)
        ``P`` at the start (and throughout when ``learn_P`` is False).
    learn_P : bool
    ep_options : fastep._epcore.horseshoe_ep.HorseshoeOptions
        The options of every EP run (``tol`` and ``max_sweeps`` those of the full evaluations).
    max_optimizer_iter : int
        L-BFGS-B iterations over all rounds.
    progress : fastep.progress.Progress, optional
        Told of every evaluation (a line at ``verbose >= 1``; the callback's record). A stop
        request raises :class:`fastep.progress.StopRequested` after the evaluation is stored.

    Attributes
    ----------
    n_evaluations : int
        EP evaluations of the evidence (memoised repeats not counted).
    ep_iterations : ndarray (T,)
        EP iterations run per task (by :meth:`run_ep`).
    best : dict or None
        The point of largest evidence evaluated at the full EP tolerance: ``theta``,
        ``value``, ``grad``, ``sites``.
    """

    def __init__(self, tasks, gamma2, D, P, learn_P, ep_options, max_optimizer_iter, progress=None):
        self.tasks = tasks
        self.T = len(tasks)
        self.gamma2 = float(gamma2)
        self.D = D
        self.P = P
        self.learn_P = bool(learn_P)
        self.ep_options = ep_options
        self.max_optimizer_iter = int(max_optimizer_iter)
        self.progress = progress if progress is not None else quiet()
        self.points = []
        self.n_evaluations = 0
        self.ep_iterations = np.zeros(self.T, dtype=int)
        self.best = None

    # ---------------------------------------------------------------- parameters
    def pack(self, sigma2, rho2, P=None):
        parts = [np.log(np.asarray(sigma2, dtype=float)), [np.log(rho2)]]
        if self.learn_P:
            parts.append((self.P if P is None else P).ravel())
        return np.concatenate(parts)

    def unpack(self, theta):
        sigma2 = np.exp(theta[:self.T])
        rho2 = float(np.exp(theta[self.T]))
        P = theta[self.T + 1:].reshape(self.P.shape) if self.learn_P else self.P
        return sigma2, rho2, P

    # ---------------------------------------------------------------- evaluations
    def _nearest_sites(self, theta):
        best, best_dist = None, np.inf
        for p in self.points:
            if p["sites"] is not None:
                dist = float(np.sum((p["theta"] - theta) ** 2))
                if dist < best_dist:
                    best, best_dist = p, dist
        return None if best is None else best["sites"]

    def run_ep(self, sigma2, rho2, P, starts, *, tol=None, max_sweeps=None):
        """EP for every task at ``(σ_t², ρ², P)``: ``(results, sites)``, a
        :class:`~fastep._epcore.horseshoe_ep.HorseshoeResult` and the returned sites per task,
        or ``None`` where EP cannot be used.

        ``starts[t]`` holds the sites to start task ``t`` from (never modified) or ``None`` for
        the cold start (:func:`fastep._epcore.horseshoe_ep.initial_sites`). A warm start that
        is invalid here, or whose EP gets 'stuck', is retried from the cold start; one whose EP
        runs into ``max_sweeps`` with a residual above ``ACCEPT_RESIDUAL`` returns ``None`` (a cold
        start would cost as much again and rarely converges where a nearby fixed point does
        not), as does a cold start that is improper. ``tol`` and ``max_sweeps`` override the
        options; the EP iterations run are added to :attr:`ep_iterations`.
        """
        changes = {}
        if tol is not None:
            changes["tol"] = float(tol)
        if max_sweeps is not None:
            changes["max_sweeps"] = int(max_sweeps)
        try:
            prior = HorseshoePrior(rho2, self.gamma2, P, self.D)
        except ValueError:                      # ρ² over- or underflowed: no EP there
            return None
        results, sites_out = [], []
        for t, task in enumerate(self.tasks):
            options = self.ep_options.replace(n_threads=1 if task.d < SINGLE_OMP_THREAD_BELOW else 0, **changes)
            res = None
            if starts[t] is not None:
                try:
                    res = HorseshoeEP(task.X, task.y, sigma2[t], prior, options, sites=starts[t]).run()
                except ValueError:              # the start gives an improper posterior here
                    res = None
                if res is not None:
                    self.ep_iterations[t] += res.n_sweeps
                if res is not None and not _accepted(res):
                    if res.status == "max_sweeps":
                        return None     # EP is too slow here from a nearby fixed point; a cold start is no better
                    res = None
            if res is None:
                try:
                    res = HorseshoeEP(task.X, task.y, sigma2[t], prior, options).run()
                except ValueError:              # hyperparameters so extreme that even the cold start is improper
                    return None
                self.ep_iterations[t] += res.n_sweeps
            results.append(res)
            sites_out.append(res.sites)
        return results, sites_out

    def evaluate(self, theta, *, tol=None, start="nearest"):
        """The evidence at ``theta`` (a dict: ``theta``, ``tol``, ``value``, ``grad``, ``sites``).

        ``value`` is ``-inf`` (``grad`` zero) where EP fails. A point already evaluated at
        the same ``tol`` is returned from memory. ``start``: ``'nearest'`` (the sites of the
        nearest evaluated point, in ``θ``), ``'cold'``, or a list of site dicts per task.
        """
        theta = np.array(theta, dtype=float)
        tol = float(self.ep_options.tol if tol is None else tol)
        for p in self.points:
            if p["tol"] == tol and np.array_equal(p["theta"], theta):
                return p
        if isinstance(start, str):
            start = self._nearest_sites(theta) if start == "nearest" else None
        starts = start if start is not None else [None] * self.T
        sigma2, rho2, P = self.unpack(theta)
        self.n_evaluations += 1
        max_sweeps = None if tol == self.ep_options.tol else min(START_MAX_SWEEPS, self.ep_options.max_sweeps)
        out = self.run_ep(sigma2, rho2, P, starts, tol=tol, max_sweeps=max_sweeps)
        point = {"theta": theta, "tol": tol, "value": -np.inf, "grad": np.zeros_like(theta), "sites": None,
                 "keep": False}
        if out is not None and all(_accepted(r) for r in out[0]):
            results, sites = out
            value = sum(r.log_z for r in results)
            grad = np.empty_like(theta)
            grad[:self.T] = [r.grad_sigma2 * s for r, s in zip(results, sigma2)]
            grad[self.T] = rho2 * sum(r.grad_rho2 for r in results)
            if self.learn_P:
                grad[self.T + 1:] = sum(r.grad_P_u + r.grad_P_v for r in results).ravel()
            if np.isfinite(value) and np.all(np.isfinite(grad)):
                point.update(value=float(value), grad=grad, sites=sites)
        if np.isfinite(point["value"]):
            self.progress.message(f"type-II ML {self.n_evaluations}: log evidence {point['value']:.6f}, "
                                  f"sigma2 {np.round(sigma2, 5)}, rho2 {rho2:.5g}, EP tol {tol:g}")
        else:
            self.progress.message(f"type-II ML {self.n_evaluations}: EP failed at sigma2 {np.round(sigma2, 5)}, "
                                  f"rho2 {rho2:.5g}")
        self.points.append(point)
        if (point["sites"] is not None and tol == self.ep_options.tol
                and (self.best is None or point["value"] > self.best["value"])):
            self.best = point
        kept = [p for p in self.points if p["sites"] is not None and p is not self.best and not p["keep"]]
        for p in kept[:max(0, len(kept) - KEEP_SITES)]:
            p["sites"] = None
        if not self.progress.report("type-II ML", self.n_evaluations, point["value"], level=3):
            raise StopRequested
        return point

    def best_so_far(self):
        """After a stop: the best point at the full tolerance, else the best evaluated point that
        kept its sites (None if there is none)."""
        if self.best is not None:
            return self.best
        with_sites = [p for p in self.points if p["sites"] is not None and np.isfinite(p["value"])]
        return max(with_sites, key=lambda p: p["value"]) if with_sites else None

    # ---------------------------------------------------------------- the coarse start
    def _walk(self, sigma2, rho2_of, k0, k_range, start):
        """Evaluate ``ρ² = rho2_of(k)`` for ``k = k0, k0+1, ...`` (weaker to stronger shrinkage),
        each EP warm-started from the previous point, until ``START_PATIENCE`` decades in a
        row bring no new best, one decade falls ``START_DROP`` nats below the best, or EP
        fails; then upwards from ``k0`` if ``k0`` was the best.
        Returns ``{k: point}`` of the accepted points."""
        walked = {}
        self._walk_one_way(sigma2, rho2_of, k0, 1, k_range, start, -np.inf, walked)
        first = walked.get(k0)
        if first is not None and first["sites"] is not None and max(walked.values(), key=lambda p: p["value"]) is first:
            self._walk_one_way(sigma2, rho2_of, k0 - 1, -1, k_range, first["sites"], first["value"], walked)
        return walked

    def _walk_one_way(self, sigma2, rho2_of, k, step, k_range, prev, best_value, walked):
        """One direction of :meth:`_walk` from decade ``k`` (``step`` ±1); adds to ``walked``."""
        misses = 0
        while k_range[0] <= k <= k_range[1]:
            point = self.evaluate(self.pack(sigma2, rho2_of(k)), tol=START_TOL,
                                  start=prev if prev is not None else "cold")
            if point["sites"] is None:
                return
            walked[k] = point
            prev = point["sites"]
            if point["value"] > best_value:
                best_value, misses = point["value"], 0
            else:
                misses += 1
                if misses >= START_PATIENCE or point["value"] < best_value - START_DROP:
                    return
            k += step

    def coarse_start(self, sigma2_candidates, rho2_top=None, rho2_fixed=None):
        """The best point of a coarse search over ``(σ², ρ²)`` (a dict as from :meth:`evaluate`,
        or ``None`` if EP failed everywhere).

        ``sigma2_candidates`` (arrays of per-task ``σ²``, largest first) are tried in turn;
        at each, ``ρ² = rho2_top · 10^-k`` is walked from weak to strong shrinkage
        (:meth:`_walk`; the first candidate from ``k = 0`` and a cold start, each later one
        from one decade above the previous candidate's best ``ρ²``, warm-started from that
        candidate's point at the same ``ρ²``). Every candidate is walked: the evidence can
        have a peak at a large and another at a small ``σ²``, with lower values between.
        With ``rho2_fixed`` only that ``ρ²`` is evaluated at each ``σ²``.
        """
        if rho2_fixed is not None:
            rho2_of, k_range = (lambda k: rho2_fixed), (0, 0)
        else:
            rho2_of, k_range = (lambda k: rho2_top * 10.0 ** (-k)), (-3, 10)
        previous, best = {}, None
        for sigma2 in sigma2_candidates:
            if previous:
                k_best = max(previous, key=lambda j: previous[j]["value"])
                k0 = max(k_best - 1, k_range[0])
                start = previous[k0]["sites"] if k0 in previous else "cold"
            else:
                k0, start = 0, "cold"
            walked = self._walk(np.asarray(sigma2, dtype=float), rho2_of, k0, k_range, start)
            if not walked:
                continue
            previous = walked
            walk_best = max(walked.values(), key=lambda p: p["value"])
            if best is None or walk_best["value"] > best["value"]:
                best = walk_best
        if best is None:
            return None
        start = best
        start["keep"] = True
        return start

    # ---------------------------------------------------------------- L-BFGS-B rounds
    def maximize(self, theta0, bounds, *, scale=1.0):
        """:func:`maximize_in_trust_boxes` from ``theta0`` on the memoised evidence; returns the
        best point evaluated by the whole search (the coarse start included), a dict as from
        :meth:`evaluate`. ``scale`` multiplies the objective seen by L-BFGS-B (its tolerances
        are absolute)."""
        def objective(theta):
            point = self.evaluate(theta)
            return point["value"] * scale, point["grad"] * scale

        # EP evaluates the evidence to about 1e-6 nats (tol 1e-8); L-BFGS-B's default
        # relative-reduction test asks for ~1e-6 nats per iteration at |log Z| ~ 350 and zigzags
        # along flat ridges for tens of evaluations: stop at EVIDENCE_ATOL nats instead
        start_value = self.evaluate(theta0)["value"]
        reference = max(abs(start_value), 1.0) if np.isfinite(start_value) else 1.0
        # stationary enough: a gradient below 1 nat per unit of log σ², log ρ² (or of P), or the
        # library's relative rule when that is larger
        maximize_in_trust_boxes(objective, theta0, bounds, self.T + 1, self.max_optimizer_iter, stacklevel=6,
                                ftol=EVIDENCE_ATOL / reference,
                                gradient_tol=scale * max(1.0, GRADIENT_WARN_RTOL * reference))
        return self.best


def maximize_in_trust_boxes(objective, theta0, bounds, n_log, max_optimizer_iter, *, stacklevel=2, ftol=None,
                            gradient_tol=None):
    """Maximise ``objective(θ) -> (value, grad)`` by L-BFGS-B in rounds, each confined to a
    trust box around the round's start; returns the best ``θ`` evaluated.

    The box is ±TRUST_LOG in the first ``n_log`` coordinates (the log variances); the others
    (``P``) are free until an evaluation fails. Unconstrained, L-BFGS-B can step by several
    units of log σ² at once (from σ² = 1.3 to 0.02, say), into regions where EP needs more
    than 1000 iterations. A failed evaluation (EP
    not accepted: the objective is ``-inf``) makes L-BFGS-B's line search shrink the step to
    almost nothing and then stop on its relative-reduction test, far from a stationary point,
    and it can even return the failed point. So every round continues from the best point
    evaluated so far, and a round with a failed evaluation never ends the search: the next
    round has its box halved in every coordinate (``P`` included, from ±TRUST_P); a round
    without failures doubles it again (up to the initial size). The search ends when a
    round's solution is inside its box without failures or optimiser warnings; when a round
    without failures gains nothing (at most ``ftol`` relative: L-BFGS-B's line search found no
    ascent from the best point, e.g. where clipped EP sites make the evidence gradient
    approximate), warning if the projected gradient there exceeds ``gradient_tol`` (default
    ``GRADIENT_WARN_RTOL · max(|value|, 1)``); when the budget of ``max_optimizer_iter`` iterations
    is spent (warns); or when the box has been halved below 1/64 of its size (warns that EP
    does not converge around the point reached). ``ftol`` is passed to L-BFGS-B
    (:func:`fastep._search.optimize.maximize_log_likelihood`).
    """
    theta = np.asarray(theta0, dtype=float)
    budget = int(max_optimizer_iter)
    shrink = 1.0
    n_failed_rounds = 0
    failures = [0]
    best = {"value": -np.inf, "theta": theta.copy()}

    def counted(th):
        value, grad = objective(th)
        if not np.isfinite(value):
            failures[0] += 1
        elif value > best["value"]:
            best["value"], best["theta"], best["grad"] = value, np.array(th, dtype=float), np.array(grad)
        return value, grad

    while budget > 0:
        radius = np.full(theta.size, TRUST_LOG * shrink)
        radius[n_log:] = np.inf if shrink == 1.0 else TRUST_P * shrink
        box = bounds.copy()
        box[:, 0] = np.maximum(bounds[:, 0], theta - radius)
        box[:, 1] = np.minimum(bounds[:, 1], theta + radius)
        rounds = min(budget, ROUND_ITER)
        failures[0] = 0
        value_before = best["value"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            # no trust-region fallback inside a round: the rounds are trust boxes already, and a
            # round without progress is handled below
            new, value, evals = maximize_log_likelihood(counted, theta, box, maxiter=rounds,
                                                         stall_fallback=False, check_gradient=False,
                                                         ftol=ftol)
        budget -= min(rounds, max(evals, 1))         # iterations <= evaluations
        if not np.isfinite(value) or value < best["value"]:
            # L-BFGS-B can end on a failed line-search point: continue from the best one seen
            new = best["theta"].copy()
        at_edge = np.any((np.abs(new - box[:, 0]) < 1e-8) & (box[:, 0] > bounds[:, 0])
                         | (np.abs(new - box[:, 1]) < 1e-8) & (box[:, 1] < bounds[:, 1]))
        theta = new
        if failures[0]:
            n_failed_rounds += 1
            shrink *= 0.5
            if shrink < 1.0 / 64:
                warnings.warn(
                    f"type-II ML stopped: EP did not converge near the point reached ({n_failed_rounds} "
                    "optimiser rounds had evaluations where EP failed; the hyperparameters are the best "
                    "point found)", ConvergenceWarning, stacklevel=stacklevel)
                return theta
            continue
        shrink = min(1.0, 2.0 * shrink)
        if not at_edge and not caught:
            return theta
        gain_tol = (_LBFGSB_FTOL if ftol is None else ftol) * max(abs(value_before), 1.0)
        if np.isfinite(value_before) and best["value"] <= value_before + gain_tol:
            size = _projected_gradient_size(best["theta"], best["grad"], bounds)
            limit = GRADIENT_WARN_RTOL * max(abs(best["value"]), 1.0) if gradient_tol is None else gradient_tol
            if size > limit:
                warnings.warn(
                    f"type-II ML ended at a point that is not stationary: the projected gradient of the log "
                    f"evidence is {size:.3g} in some parameter, but no step along it raises the evidence "
                    "(its gradient is approximate where w-site precisions are clipped; see "
                    "negative_precision)", ConvergenceWarning, stacklevel=stacklevel)
            return theta
    warnings.warn(f"L-BFGS-B used its budget of max_optimizer_iter={max_optimizer_iter} iterations before converging",
                  ConvergenceWarning, stacklevel=stacklevel)
    return theta
