"""The hyperparameter search of the GP estimators: its coordinates, its objective and when it stops.

:class:`SearchSpace` maps the hyperparameters θ (the kernel's unconstrained ``theta``, then the
likelihood's, then an extra block such as inducing inputs) to the coordinates the optimiser
moves, ``u``: the log of every positive parameter (``'softplus'``- and ``'log'``-transformed
kernel parameters, the likelihood's log-scale parameters), the others as they are. On the log
scale a variance that grows from 1 to 1000 moves by 7, not by 1000 as in softplus
coordinates, and the gradient of the evidence is of a size L-BFGS-B steps well with.

:class:`Search` is the objective L-BFGS-B maximises, ``log Z(θ(u)) + log p(u)`` with the
hyperprior of :mod:`fastep.hyperpriors` (or ``log Z`` alone), evaluated once per point (a
point the optimiser asks for again is answered from a cache), with the sites of the best point
kept for the final EP run, and with a stopping rule in terms of the evidence per data point:
the search ends at an accepted L-BFGS-B iterate when

* the objective rose by less than ``GAIN_TOL`` per training point since the previous accepted
  iterate, and
* a Newton step along the gradient would gain less than that again, at the curvature the
  objective showed along that last step but at most the curvature it has in every direction
  (the hyperprior's ``1/scale²`` per log-parameter, or 1 without one): a short step where the
  objective still climbs, as a poor line search takes, does not count,

or when the objective rose by less than ``GAIN_TOL`` per point along a step that moved no
coordinate by more than ``STEP_TOL`` (1e-3: a relative change of 0.1 % of every positive
hyperparameter; near the optimum the gradient is of the size of the EP run's own error, and
the measured curvature of such short steps is noise); or, at any evaluation, when it is the
``PATIENCE``-th since the last accepted iterate, and in a row, that did not raise the best
objective of the run by ``GAIN_TOL`` per point (line searches that fail on an evidence whose
gradient carries the EP run's own error), ending at that best point (where the gradient there
is far from zero, the optimiser continues in trust regions,
:func:`~fastep._search.optimize.maximize_log_likelihood`); or when L-BFGS-B converges on its
own. A search that continues one on a subset of the points (``refining``, for problems that
report their training class probabilities) also ends at an accepted iterate where, since the
start or the previous accepted iterate, no training class probability moved by more than
``PREDICTION_TOL`` (0.02) and the objective rose by less than ``REFINE_GAIN_TOL`` (1e-3) per
point: the subset's search found the model, and the steps on all points no longer change it.
A gain of 1e-5 nats per point moves no prediction that matters; L-BFGS-B's own
relative-reduction test (about 2e-9 of the objective) keeps buying such fractions of a nat
along flat directions, each at the price of a full EP run.
"""
import warnings

import numpy as np
from .._special import expit

from .._linalg import inner
from ..progress import StopRequested
from .optimize import SearchStop
from ..exceptions import ConvergenceWarning

__all__ = ["SearchSpace", "Search", "GAIN_TOL", "STEP_TOL", "PATIENCE", "PREDICTION_TOL", "REFINE_GAIN_TOL"]

#: Largest rise of the objective per training point between accepted iterates at which it may stop.
GAIN_TOL = 1e-5
#: Largest change of any search coordinate (a relative change of the positive hyperparameters)
#: between accepted iterates at which the search stops when the objective gained < ``GAIN_TOL``
#: per point too: steps that small are L-BFGS-B chasing the EP run's own error in the gradient.
STEP_TOL = 1e-3
#: Evaluations in a row, since the last accepted iterate, that did not raise the run's best
#: objective by ``GAIN_TOL`` per point, at which the search ends at that best point.
PATIENCE = 5
#: Largest change of any training class probability along an accepted step at which a refining
#: search (one that starts where a search on a subset ended) stops.
PREDICTION_TOL = 0.02
#: Largest rise of the objective per training point along that step at which it stops.
REFINE_GAIN_TOL = 1e-3
#: Bound of the kernel's log coordinates (e^±700 is a normal float).
_LOG_BOUND = 700.0


class SearchSpace:
    """Search coordinates ``u`` of the hyperparameters θ and the prior's centre (module docstring).

    Parameters
    ----------
    kernel : Kernel
    likelihood_parameters : list of LikelihoodParameter
        The learnt likelihood parameters (:meth:`fastep.likelihoods.Likelihood.parameters`); the
        hyperprior acts on those whose coordinate is a log scale.
    n_extra : int
        Size of the trailing block without log scale (inducing inputs).
    theta0 : ndarray (p,)
    bounds : ndarray (p, 2)
    """

    def __init__(self, kernel, likelihood_parameters, n_extra, theta0, bounds):
        kernel_kinds = list(kernel.theta_transforms)
        kinds = kernel_kinds + [
            "log" if parameter.log_scale else "identity" for parameter in likelihood_parameters] + ["identity"] * n_extra
        self.softplus = np.array([k == "softplus" for k in kinds], dtype=bool)
        #: the kernel's log coordinates, searched without bounds (below)
        self.unbounded = np.array([k in ("softplus", "log") for k in kernel_kinds]
                                  + [False] * (len(kinds) - len(kernel_kinds)), dtype=bool)
        #: entries that are logs of positive parameters in ``u`` (where the hyperprior acts)
        self.log_scale = np.array([k in ("softplus", "log") for k in kinds], dtype=bool)
        self.theta0 = np.asarray(theta0, dtype=float)
        self.u0 = self.to_search(self.theta0)
        #: where the search starts: the prior's centre ``u0`` unless moved (:meth:`start_at`)
        self.u_start = self.u0
        # The kernel's log coordinates are left unbounded: with every variable bounded, L-BFGS-B's
        # first trial point is the start plus the whole gradient (O(n) in size, e^17 times the
        # variance on a 600-point problem), with any unbounded one a step of length 1. Points beyond
        # e^±700 are not evaluated (:meth:`in_range`).
        self.bounds = np.asarray(bounds, dtype=float).copy()
        self.bounds[self.unbounded] = (-np.inf, np.inf)

    def start_at(self, theta):
        """Start the search at ``theta`` (e.g. a previous fit's optimum), the prior's centre kept."""
        self.u_start = self.to_search(np.asarray(theta, dtype=float))

    def in_range(self, u):
        """Whether every log coordinate of ``u`` maps to a finite, normal parameter value."""
        return bool(np.all(np.abs(np.asarray(u, dtype=float)[self.unbounded]) <= _LOG_BOUND))

    def to_search(self, theta):
        u = np.array(theta, dtype=float)
        if np.any(self.softplus):
            u[self.softplus] = np.log(np.logaddexp(0.0, u[self.softplus]))
        return u

    def from_search(self, u):
        theta = np.array(u, dtype=float)
        if np.any(self.softplus):
            x = np.exp(theta[self.softplus])
            theta[self.softplus] = x + np.log(-np.expm1(-x))
        return theta

    def gradient_to_search(self, theta, gradient):
        """``∂/∂u`` from ``∂/∂θ`` at ``theta`` (softplus entries: ``x / σ(θ)`` per unit of θ)."""
        g = np.array(gradient, dtype=float)
        if np.any(self.softplus):
            t = np.asarray(theta, dtype=float)[self.softplus]
            g[self.softplus] *= np.logaddexp(0.0, t) / expit(t)
        return g

    def log_prior(self, hyperprior, u):
        """``(log p(u), ∂ log p/∂u)`` of the hyperprior (0 and zeros without one)."""
        grad = np.zeros_like(u)
        if hyperprior is None or not np.any(self.log_scale):
            return 0.0, grad
        value, grad[self.log_scale] = hyperprior.log_density(u[self.log_scale], self.u0[self.log_scale])
        return value, grad


def search_space_of(kernel, likelihood, learn_likelihood, n_extra, theta0, bounds):
    parameters = likelihood.parameters() if learn_likelihood else []
    return SearchSpace(kernel, parameters, n_extra, theta0, bounds)


class Search:
    """The objective of one problem's hyperparameter search, in the coordinates ``u``.

    Parameters
    ----------
    problem : SiteProblem
    hyper : Hyperparameters
        θ's packing, its search coordinates and the hyperprior (None: type-II ML).
    warm : bool
        Warm-start each evaluation's EP from the sites of the previous one.
    progress : reporter
    prior_weight : float, default 1.0
        Factor on the hyperprior's log density: a search on a subset of m of the n training
        points weighs it by m / n, so that its objective estimates m / n times the full one.
    """

    def __init__(self, problem, hyper, warm, progress, prior_weight=1.0):
        self.problem = problem
        self.hyper = hyper
        self.space = hyper.space
        self.hyperprior = hyperprior = hyper.hyperprior
        self.warm = warm
        self.progress = progress
        self.cache = {}                  # u bytes -> (objective, gradient in u)
        self.best_value = -np.inf
        self.best_u = None
        self.best_sites = None
        self.count = 0
        self.accepted = None             # (u, objective, gradient) at the last accepted iterate
        self.run_best = (-np.inf, None)  # the best (objective, u) of this run (start)
        self.stale = 0                   # evaluations since this run's best rose by GAIN_TOL per point
        self.n_points = max(int(problem.n_points), 1)
        self.prior_weight = float(prior_weight)
        self.reference_curvature = 1.0 if hyperprior is None else self.prior_weight * hyperprior.curvature()
        #: Whether the refinement stop acts (set by the caller for a search that continues one on
        #: a subset of the points).
        self.refining = False
        self.probabilities = {}          # u bytes -> training class probabilities (refining only)
        self.refine_base = None          # (objective, probabilities) at the start or last accepted iterate

    def __call__(self, u):
        key = np.asarray(u, dtype=float).tobytes()
        if key in self.cache:
            value, grad = self.cache[key]
            return value, grad.copy()
        problem = self.problem
        theta = np.zeros_like(u)
        log_z, grad_theta = -np.inf, np.zeros_like(theta)
        if self.space.in_range(u):
            theta = self.space.from_search(u)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ConvergenceWarning)
                    log_z, grad_theta, _ = problem.evaluate(self.hyper.unpack(theta), gradient=True,
                                                            warm=self.warm)
            except np.linalg.LinAlgError:
                pass
        if self.progress.stopped:                  # asked during this evaluation's sweeps
            raise StopRequested
        self.count += 1
        if np.isfinite(log_z):
            prior, prior_grad = self.space.log_prior(self.hyperprior, np.asarray(u, dtype=float))
            value = log_z + self.prior_weight * prior
            grad = self.space.gradient_to_search(theta, grad_theta) + self.prior_weight * prior_grad
        else:
            value, grad = -np.inf, np.zeros_like(theta)
        gain = value - self.best_value if np.isfinite(self.best_value) else np.nan
        if value > self.best_value:
            self.best_value, self.best_u = value, np.array(u, dtype=float)
            self.best_sites = problem.sites()
        self.cache[key] = (value, grad)
        if self.refining and np.isfinite(value):
            probabilities = problem.training_probabilities()
            if probabilities is not None:
                self.probabilities[key] = probabilities
                if self.refine_base is None:
                    self.refine_base = (value, probabilities)
        if not self.progress.report("type-II ML", self.count, value, gain):
            raise StopRequested
        u = np.asarray(u, dtype=float)
        if value > self.run_best[0] + GAIN_TOL * self.n_points or not np.isfinite(self.run_best[0]):
            self.stale = 0
        else:
            self.stale += 1
        if value > self.run_best[0]:
            self.run_best = (value, u.copy())
        if self.stale >= PATIENCE and np.isfinite(self.run_best[0]):
            raise SearchStop(self.run_best[1].copy(), self.run_best[0])
        return value, grad.copy()

    def accept(self, u):
        """At an accepted L-BFGS-B iterate ``u``: whether the stopping rule holds (module docstring)."""
        u = np.asarray(u, dtype=float)
        entry = self.cache.get(u.tobytes())
        if entry is None or not np.isfinite(entry[0]):
            return False
        value, grad = entry
        previous, self.accepted = self.accepted, (u.copy(), value, grad)
        self.stale = 0                   # PATIENCE counts the evaluations between accepted iterates
        if self.refining and self._refined(u, value):
            return True
        if previous is None:
            return False
        tolerance = GAIN_TOL * self.n_points
        if value - previous[1] >= tolerance:
            return False
        # a short step taken where the objective still climbs steeply (a poor line search) is no
        # sign of convergence: the gain a Newton step along the gradient would still make must be
        # small too, at the curvature the objective showed along the last step, but no more than
        # the curvature known in every direction (the hyperprior's 1/scale², else 1 per log-unit)
        step, change = u - previous[0], grad - previous[2]
        if 0.0 < np.max(np.abs(step)) < STEP_TOL:      # (no step at all: a failed line search, not a stop)
            return True
        curvature = min(-inner(step, change) / max(inner(step, step), 1e-300), self.reference_curvature)
        return curvature > 0.0 and inner(grad, grad) / (2.0 * curvature) < tolerance

    def _refined(self, u, value):
        """The refinement stop at the accepted iterate ``u`` (module docstring)."""
        probabilities = self.probabilities.get(u.tobytes())
        base, self.refine_base = self.refine_base, (value, probabilities)
        if base is None or base[1] is None or probabilities is None:
            return False
        return (value - base[0] < REFINE_GAIN_TOL * self.n_points
                and float(np.max(np.abs(probabilities - base[1]))) < PREDICTION_TOL)

    def resume(self):
        """The optimiser continues this run another way (a fallback search): ``PATIENCE`` counts
        afresh from here."""
        self.stale = 0

    def restart(self):
        """A new start of the search: the stopping rule compares iterates of one run only."""
        self.accepted = None
        self.stale = 0
        self.run_best = (-np.inf, None)
        self.refine_base = None
