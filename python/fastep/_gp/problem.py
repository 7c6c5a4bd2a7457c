"""EP on one GP problem (one binary task or one regression), shared by the dense, sparse and
IVM models: the warm-start retry, the type-II maximum-likelihood search and the evidence at
a given θ."""
from __future__ import annotations

import contextlib
import copy
import warnings

import numpy as np

from .._search.checks import warn_if_kernel_stuck
from ..progress import StopRequested, quiet
from .._search.space import Search
from .._search.optimize import maximize_log_likelihood
from ..exceptions import ConvergenceWarning
from ..kernels._distances import reuse_training_distances

from .fit_options import KeepsFitOptions
from .hyperparameters import Hyperparameters

__all__ = ["SiteProblem", "WARM_START_FAILURES"]

#: What a warm-started EP run may raise when the stored sites do not suit the new θ (improper
#: cavities after a large hyperparameter step, a failed factorisation): the evaluation then runs
#: EP again from zero sites, as it does after a warm run that ends with a failed site.
WARM_START_FAILURES = (np.linalg.LinAlgError, FloatingPointError)


class SiteProblem(KeepsFitOptions):
    """One binary (or regression) EP problem: its data, its sites and type-II maximum likelihood.

    Each family's subclass defines ``evaluate(params, *, gradient, warm, keep=False)``: EP at
    ``params`` = ``(kernel, likelihood, extra)`` (as :meth:`Hyperparameters.unpack` gives it),
    from the stored sites when ``warm`` (a warm start that fails, :data:`WARM_START_FAILURES`
    or a failed site, is retried from zero sites), storing the sites it ends at and
    returning ``(log_z, grad or None, info)``: the gradient (with ``gradient``) in the order
    of :meth:`Hyperparameters.unpack`, and with ``keep`` the prediction state (attributes
    ``kernel``, ``likelihood``, ``log_ml``, ``info`` and ``predictor``). This class holds the
    search around it.

    Attributes
    ----------
    site_precision, site_natural_mean : ndarray (n,)
        The current sites (zero before the first run).
    hyperparameters : Hyperparameters
        The θ packing of the search (None: set by the estimator before :meth:`fit`).
    """

    #: Name of the algorithm in the non-convergence warning.
    algorithm = "EP"
    #: Name of the estimator in the learning warnings (set by the estimator).
    estimator_name = "type-II ML"
    #: The latent scale of the likelihood for the learning checks (1 for classifiers; set by the estimator).
    latent_scale: float | None = None
    #: EP tolerance during the type-II ML search when looser than the estimator's ``tol``
    #: (None: the estimator's); the final EP run at the learnt point always uses ``tol``.
    search_tol: float | None = None
    #: L-BFGS-B's relative-reduction tolerance of the search (None: scipy's default)
    search_ftol: float | None = None
    #: The θ packing of the search.
    hyperparameters: Hyperparameters | None

    def __init__(self, kernel, likelihood, X, y, options, hyperparameters=None):
        self.kernel, self.likelihood = kernel, likelihood
        self.X, self.y = X, y
        self.options, self.hyperparameters = options, hyperparameters
        n = X.shape[0]
        self.site_precision = np.zeros(n)
        self.site_natural_mean = np.zeros(n)

    def _new_engine_options(self, options):
        """The family engine's frozen options object from the fit ``options``."""
        raise NotImplementedError

    def engine_options(self):
        """The family engine's options for the current ``options``: built, and so checked, once
        per options object (the search's and the final run's; the objects are frozen, so one
        object always gives the same engine options), then shared by every EP run."""
        cached = self.__dict__.get("_engine_options_for")
        if cached is None or cached[0] is not self.options:
            cached = (self.options, self._new_engine_options(self.options))
            self._engine_options_for = cached
        return cached[1]

    def __getstate__(self):
        """A saved, pickled or copied problem leaves out the engine options built from
        ``options`` (the next run builds them again)."""
        state = dict(self.__dict__)
        state.pop("_engine_options_for", None)
        return state

    def _start_sites(self, warm):
        """The sites one EP run starts from and updates: copies of the stored sites (``warm``),
        else zero sites."""
        if warm:
            return self.site_precision.copy(), self.site_natural_mean.copy()
        n = self.site_precision.shape[0]
        return np.zeros(n), np.zeros(n)

    def _has_sites(self):
        """Whether there are sites to start warm from (any nonzero precision)."""
        return bool(np.any(self.site_precision))

    def fit(self, *, optimizer, n_restarts, seed, warm_start, max_sweeps, tol):
        """Learn θ in the coordinates of ``hyperparameters`` (unless ``optimizer`` is None) and keep
        the EP state at the result.

        Maximises ``log Z(θ) + log p(θ)`` (the EP log marginal likelihood and the log density of
        ``hyper.hyperprior``; ``log Z`` alone without one) with L-BFGS-B in the coordinates of
        :class:`fastep._search.space.SearchSpace` (:func:`fastep._search.optimize.maximize_log_likelihood`,
        ``n_restarts`` extra starts seeded by ``seed``), stopping where the model stops
        changing (:mod:`fastep._search.space`); a point where EP or a factorisation fails counts
        as ``-inf``. During the search EP runs to ``search_tol`` when that is looser than
        ``tol``; the final run at the best point, warm from that point's sites, runs to ``tol``.
        Sets ``log_objective`` (the maximised objective at the result). Warns with
        :class:`~fastep.ConvergenceWarning` if the final EP run did not converge.
        """
        hyper = self.hyperparameters
        progress = self.options.progress or quiet()
        self.n_coarse_evaluations = 0
        if optimizer is not None and hyper.size and not progress.stopped:
            search = Search(self, hyper, warm_start, progress)
            rng = np.random.default_rng(seed)
            final_options = self.options
            if self.search_tol is not None and self.search_tol > final_options.tol:
                self.options = final_options.replace(tol=self.search_tol)
            X = getattr(self, "X", None)
            start, scale = hyper.space.u_start, 1.0
            try:
                start, scale = self._coarse_search_start(hyper, warm_start, progress)
                search.refining = self.n_coarse_evaluations > 0
                with reuse_training_distances(X) if isinstance(X, np.ndarray) else contextlib.nullcontext():
                    u, _, _ = maximize_log_likelihood(search, start, hyper.space.bounds,
                                                      n_restarts=n_restarts, rng=rng, stacklevel=5,
                                                      ftol=self.search_ftol, stop_rule=search, scale=scale)
            except StopRequested:
                u = search.best_u if search.best_u is not None else start
            finally:
                self.options = final_options
            if search.best_u is not None and np.array_equal(u, search.best_u):
                self.restore_sites(search.best_sites)
            params = hyper.unpack(hyper.space.from_search(u))
            self.n_evaluations = search.count
            if not progress.stopped:
                warn_if_kernel_stuck(hyper.kernel, params[0], getattr(self, "X", None), what=self.estimator_name,
                                     latent_scale=self.latent_scale,
                                     stacklevel=4)
        else:
            u = None
            params = (copy.deepcopy(hyper.kernel), hyper.likelihood, hyper.extra)
            self.n_evaluations = 0
        self.evaluate(params, gradient=False, warm=optimizer is not None and warm_start, keep=True)
        self.log_objective = self.log_ml + (hyper.space.log_prior(hyper.hyperprior, u)[0] if u is not None
                                            else 0.0)
        info = self.info
        progress.report("done", info.n_sweeps, self.log_ml, info.max_change)
        if info.stopped:
            pass                                        # the estimator warns once for the whole fit
        elif not info.converged:
            warnings.warn(
                f"{self.algorithm} did not converge in {info.n_sweeps} sweeps (max_sweeps={max_sweeps}); "
                f"the largest site-parameter change in the last sweep was {info.max_change:.3g} "
                f"and the last change of log Z {info.log_z_change:.3g} (tol={tol:g}). "
                "Increase max_sweeps, use damping < 1, or check the model.",
                ConvergenceWarning, stacklevel=5)
        return self

    #: Length of the full search's first step after a coarse stage (:meth:`_coarse_search_start`)
    coarse_step = 0.25

    def _coarse_subset(self):
        """Indices of the subset of :meth:`_coarse_search_start` (None: no coarse stage)."""
        return None

    def _subproblem(self, index):
        """The same problem on the training points ``index`` (for :meth:`_coarse_search_start`)."""
        raise NotImplementedError

    def _coarse_search_start(self, hyper, warm_start, progress):
        """Where the full search starts: the end of the same search on a subset of the points.

        When :meth:`_coarse_subset` names m of the n points, the search runs first on them, its
        objective ``log Z_m(θ) + (m/n) log p(θ)`` an estimate of ``m/n`` times the full one, with
        the same start, hyperprior centre and stopping rule; the full search starts at its result
        (its own objective, its own stopping rules, and the refinement stop of
        :class:`~fastep._search.space.Search`), with a first step of length ``coarse_step`` instead of 1 and, with
        ``warm_start``, its first EP run from the subset's sites on those points
        (:meth:`_seed_sites`). Returns the start and the scale of the first step
        (:func:`~fastep._search.optimize.maximize_log_likelihood`): the start of ``hyper`` and 1
        without a coarse stage.
        """
        index = self._coarse_subset()
        if index is None:
            return hyper.space.u_start, 1.0
        sub = self._subproblem(index)
        search = Search(sub, hyper, warm_start, progress, prior_weight=index.size / self.n_points)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                with reuse_training_distances(sub.X):
                    u, _, _ = maximize_log_likelihood(search, hyper.space.u_start, hyper.space.bounds,
                                                      check_gradient=False, ftol=sub.search_ftol,
                                                      stop_rule=search)
        finally:
            self.n_coarse_evaluations = search.count
        if warm_start and search.best_sites is not None:
            self._seed_sites(index, search.best_sites)
        return u, self.coarse_step

    def training_probabilities(self):
        """Predictive class probabilities of the training points under the last EP run, for the
        refinement stop of :class:`~fastep._search.space.Search` (None: the problem has none and
        that rule does not act)."""
        return None

    def _seed_sites(self, index, sites):
        """Start the full search's first EP run from the subset's ``sites`` (from :meth:`sites` of
        the subproblem) on the points ``index`` (the others as they are); by default not at all."""

    # -- what the search needs from a problem ------------------------------------------------
    @property
    def n_points(self):
        """Number of training points (the search's gain tolerance is per point)."""
        return self.X.shape[0]

    def sites(self):
        """The current sites (a snapshot the next evaluation does not overwrite)."""
        return self.site_precision, self.site_natural_mean

    def restore_sites(self, sites):
        """Make ``sites`` (from :meth:`sites`) the warm start of the next run."""
        self.site_precision, self.site_natural_mean = sites

    def latent(self, X):
        """Latent predictive mean and variance at the rows of ``X`` (after a run with ``keep``)."""
        return self.predictor.latent(X)

    def log_ml_at(self, hyper, theta, eval_gradient):
        """EP log marginal likelihood (and gradient) at ``theta``, from a cold start.

        The fitted sites (all that :meth:`sites` returns) and prediction state are left as they
        were.
        """
        theta = hyper.check(theta)
        saved = self.sites()
        try:
            value, grad, _ = self.evaluate(hyper.unpack(theta), gradient=eval_gradient, warm=False)
        finally:
            self.restore_sites(saved)
        return (value, grad) if eval_gradient else value
