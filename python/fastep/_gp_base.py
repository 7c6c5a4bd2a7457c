"""The skeleton shared by the Gaussian-process estimators: dense EP, sparse EP and the IVM.

Each estimator fits one *problem* per binary task (one for a binary classifier or a
regressor, one per class one-vs-rest) and keeps them in ``_problems``. This module holds
what every GP model does the same way:

* defaults and checks of the constructor arguments they share (``kernel``, the binary
  likelihood, ``optimizer``, ``random_state``);
* :class:`Hyperparameters`, the packing of θ = (kernel θ, likelihood θ, an extra block
  such as the inducing inputs) that the optimiser moves and
  ``log_marginal_likelihood(theta)`` takes;
* :class:`SiteProblem`, EP on one problem with the warm-start retry, the type-II
  maximum-likelihood search and the evidence at a given θ;
* :class:`DensePredictor`, the latent predictive of a GP whose posterior is represented
  by sites on a set of training inputs (dense EP and the IVM);
* the fitted-attribute stacking (one-vs-rest) and the predict methods
  (:class:`GPClassifierMixin`, :class:`GPRegressorMixin`).

The model modules (:mod:`fastep.gp`, :mod:`fastep.sparse`, :mod:`fastep.ivm`) keep only
what is their own: how EP (or the IVM's selection) runs, the evidence gradient, and the
model's predictive state.
"""
from __future__ import annotations

import contextlib
import copy
import warnings
from typing import TYPE_CHECKING, overload

import numpy as np
from scipy.linalg import solve_triangular

from . import _validation as v
from ._constraints import Boolean, Choice, Custom, Integer, Interval, Positive, Seed
from ._base import BaseEstimator, ClassifierMixin, RegressorMixin, check_is_fitted, one_vs_rest_proba
from ._search.start import default_kernel, default_noise_variance
from ._search.checks import warn_if_kernel_stuck
from ._prediction import BatchedPredictor
from .progress import StopRequested, quiet
from ._linalg import matmul
from ._search.space import Search, search_space_of
from ._search.optimize import maximize_log_likelihood
from .exceptions import ConvergenceWarning
from .kernels import Kernel
from .kernels._distances import reuse_training_distances
from .likelihoods import Gaussian
from .likelihoods.checks import check_binary_likelihood

if TYPE_CHECKING:
    from typing import Any, Literal

    from numpy.typing import ArrayLike, NDArray

    from ._typing import MeanStd

__all__ = ["GPEstimator", "LogMarginalLikelihoodMixin", "EPEvidenceMixin", "GPClassifierMixin", "GPRegressorMixin", "Hyperparameters",
           "SiteProblem", "DensePredictor"]



class Hyperparameters:
    """θ = (kernel θ, likelihood θ if learnt, an extra block if learnt), with its bounds.

    Parameters
    ----------
    kernel : Kernel
        Its unconstrained ``theta`` and ``bounds`` come first.
    likelihood : Likelihood
        Its learnable parameters (:attr:`fastep.likelihoods.Likelihood.theta`)
        follow when ``learn_likelihood``.
    learn_likelihood : bool
    extra : ndarray or None
        A further block learnt without bounds (the sparse model's inducing inputs, raveled
        into θ and reshaped back to ``extra.shape``); None for none.
    hyperprior : LogNormal or None
        The hyperprior of the search (:mod:`fastep.hyperpriors`), centred at this θ.

    Attributes
    ----------
    space : fastep._search.space.SearchSpace
        The coordinates the search moves (logs of the positive parameters).
    """

    def __init__(self, kernel, likelihood, learn_likelihood, extra=None, hyperprior=None):
        self.kernel = kernel
        self.likelihood = likelihood
        self.learn_likelihood = bool(learn_likelihood)
        self.extra = extra
        self.hyperprior = hyperprior
        self.n_kernel = kernel.n_theta
        if self.learn_likelihood:
            lik_theta, lik_bounds = likelihood.theta, likelihood.theta_bounds
        else:
            lik_theta, lik_bounds = np.zeros(0), np.zeros((0, 2))
        self.n_likelihood = lik_theta.size
        extra_theta = np.zeros(0) if extra is None else extra.ravel()
        self.theta0 = np.concatenate([kernel.theta, lik_theta, extra_theta])
        self.bounds = np.vstack([kernel.bounds.reshape(-1, 2), lik_bounds,
                                 np.tile([-np.inf, np.inf], (extra_theta.size, 1))])
        self.space = search_space_of(kernel, likelihood, self.learn_likelihood, extra_theta.size, self.theta0,
                                     self.bounds)

    @property
    def size(self):
        return self.theta0.size

    def unpack(self, theta):
        """``(kernel, likelihood, extra)`` at ``theta`` (the fixed parts unchanged)."""
        n_kernel, n_lik = self.n_kernel, self.n_likelihood
        kernel = self.kernel.clone_with_theta(theta[:n_kernel])
        likelihood = (self.likelihood.with_theta(theta[n_kernel:n_kernel + n_lik])
                      if self.learn_likelihood else self.likelihood)
        extra = (None if self.extra is None
                 else np.ascontiguousarray(theta[n_kernel + n_lik:].reshape(self.extra.shape)))
        return kernel, likelihood, extra

    def pack(self, kernel, likelihood, extra=None):
        """θ of ``kernel``, ``likelihood`` (if learnt) and ``extra`` (if learnt): :meth:`unpack`'s inverse."""
        parts = [kernel.theta]
        if self.learn_likelihood:
            parts.append(likelihood.theta)
        if self.extra is not None:
            parts.append(np.ravel(extra))
        return np.concatenate(parts)

    def check(self, theta):
        """``theta`` as a float64 vector of the right length (for ``log_marginal_likelihood``)."""
        return v.as_float_vector(theta, "theta", length=self.size)

    def log_prior(self, theta, eval_gradient=False):
        """The hyperprior's log density at ``theta`` (0 without one), and its gradient in θ."""
        space = self.space
        u = space.to_search(theta)
        value, grad_u = space.log_prior(self.hyperprior, u)
        if not eval_gradient:
            return value
        # ∂u/∂θ is 1, or σ(θ)/softplus(θ) for the softplus entries
        return value, grad_u / space.gradient_to_search(theta, np.ones_like(grad_u))


class SiteProblem:
    """One binary (or regression) EP problem: its data, its sites and type-II maximum likelihood.

    :meth:`evaluate` runs EP at ``params`` = ``(kernel, likelihood, extra)`` (as
    :meth:`Hyperparameters.unpack` gives it) in three steps that subclasses implement:
    ``_ep_input(params)`` returns ``(prior, context)``, the engine's input and what the last step
    needs; :meth:`run` calls ``_run_once(prior, likelihood, warm)`` (one EP run from the
    stored sites when ``warm``, else from zero sites; returns a dict with at least
    ``'info'``); ``_finish(params, context, state, *, gradient, keep)`` stores the sites,
    computes the evidence gradient and, with ``keep``, the prediction state (attributes
    ``kernel``, ``likelihood``, ``log_ml`` and ``info``), returning
    ``(log_z, grad or None, info)``.

    Attributes
    ----------
    site_precision, site_natural_mean : ndarray (n,)
        The current sites (zero before the first run).
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
    #: The θ packing of the search (set by the estimator).
    hyperparameters: Hyperparameters

    def __init__(self, kernel, likelihood, X, y, options):
        self.kernel = kernel
        self.likelihood = likelihood
        self.X = X
        self.y = y
        self.options = options
        n = X.shape[0]
        self.site_precision = np.zeros(n)
        self.site_natural_mean = np.zeros(n)

    def evaluate(self, params, *, gradient, warm, keep=False):
        """Run EP at ``params`` = ``(kernel, likelihood, extra)``; ``(log_z, grad or None, info)``.

        The gradient (with ``gradient``) is the evidence gradient in the order of
        :meth:`Hyperparameters.unpack`; with ``keep`` the prediction state is stored.
        """
        prior, context = self._ep_input(params)
        state = self.run(prior, params[1], warm)
        del prior                       # what the gradient no longer needs is freed before it runs
        return self._finish(params, context, state, gradient=gradient, keep=keep)

    def run(self, prior, likelihood, warm):
        """EP from the stored sites (``warm``) or from zero sites.

        A warm start that fails (improper cavities after a large hyperparameter step, or a
        failed factorisation) is retried once from a cold start.
        """
        if warm and self._has_sites():
            try:
                state = self._run_once(prior, likelihood, warm=True)
            except (np.linalg.LinAlgError, FloatingPointError):
                state = None
            if state is not None and state["info"].n_failed == 0:
                return state
        return self._run_once(prior, likelihood, warm=False)

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

    def fit(self, hyper, *, optimizer, n_restarts, seed, warm_start, max_sweeps, tol):
        """Learn θ (unless ``optimizer`` is None) and keep the EP state at the result.

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
        progress = self.options.get("progress") or quiet()
        self.n_coarse_evaluations = 0
        if optimizer is not None and hyper.size and not progress.stopped:
            search = Search(self, hyper, warm_start, progress)
            rng = np.random.default_rng(seed)
            final_options = self.options
            if self.search_tol is not None and self.search_tol > final_options["tol"]:
                self.options = dict(final_options, tol=self.search_tol)
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


class DensePredictor(BatchedPredictor):
    """Latent predictive of a GP posterior given by Gaussian sites on a set of inputs.

    With sites of precision ``B = diag(β)`` on the inputs ``X_basis``,
    ``A = I + B^½ K B^½ = L Lᵀ`` and weights ``w = (K + B⁻¹)⁻¹ B⁻¹ ν``, the latent
    predictive at ``x*`` is ``N(k*ᵀ w, k(x*, x*) - |L⁻¹ B^½ k*|²)`` (Rasmussen & Williams,
    *Gaussian Processes for Machine Learning*, Algorithm 3.6; the IVM's prediction,
    Seeger's notes §2.2, is the same formula on the active set).

    Parameters
    ----------
    kernel : Kernel
    X_basis : ndarray (n, n_features)
    weights : ndarray (n,)
    chol : ndarray (n, n)
        Lower Cholesky factor L of A.
    sqrt_precision : ndarray (n,)
        ``sqrt(β)``.
    """

    def __init__(self, kernel, X_basis, weights, chol, sqrt_precision):
        self.kernel = kernel
        self.X_basis = X_basis
        self.weights = weights
        self.chol = chol
        self.sqrt_precision = sqrt_precision

    def _latent_batch(self, X):
        Ks = self.kernel._unchecked_call(X, self.X_basis)                           # (batch, n)
        V = solve_triangular(self.chol, self.sqrt_precision[:, None] * Ks.T, lower=True)
        return matmul(Ks, self.weights), self.kernel._unchecked_diag(X) - np.einsum("ij,ij->j", V, V)


#: The ``n_jobs`` parameter of the one-vs-rest classifiers, as their docstrings give it.
N_JOBS_DOC = """n_jobs : int or None, default None
        One-vs-rest problems fitted at once in a thread pool (``-1``: one per core). None
        fits them one after the other with the process's BLAS threads; with an integer,
        including 1, each problem's BLAS calls run on one thread, so the results are
        bitwise identical for every integer ``n_jobs`` (see :func:`fastep.batch.fit_many`)."""


#: The ``hyperprior`` parameter of the GP estimators, as their docstrings give it.
HYPERPRIOR_DOC = """hyperprior : 'auto', None or fastep.hyperpriors.LogNormal, default 'auto'
        What the hyperparameter search maximises. 'auto' (``LogNormal(scale=2.5)``): the log
        posterior of the hyperparameters (MAP-II), ``log Z(θ) + Σ_k log N(log x_k; log x_k⁰, s²)``
        over the learnt positive hyperparameters ``x_k`` (kernel variances and widths, noise
        parameters), with medians ``x_k⁰`` at their starting values. It has a finite maximum on
        separable data, where ``log Z`` alone keeps rising along a growing latent scale
        (:mod:`fastep.hyperpriors`). None: type-II maximum likelihood (``log Z`` alone). The
        search moves the logarithms of the positive parameters and ends at an accepted L-BFGS-B
        step that raised the objective by less than 1e-5 per training point where a further
        Newton step would gain less than that too, or that moved no log-parameter by more than
        1e-3; after five evaluations in a row within one L-BFGS-B iteration that did not raise
        its best value by 1e-5 per point, at that best point; or where L-BFGS-B converges
        (:mod:`fastep._search.space`)."""

#: The fitted attributes of the search, as the GP estimators' docstrings give them.
LEARNING_ATTRIBUTES = """log_hyperposterior_value_ : float
        The objective the search maximised, at the fitted hyperparameters:
        ``log_marginal_likelihood_value_`` plus the hyperprior's log density (equal to it with
        ``hyperprior=None`` or ``optimizer=None``; summed over one-vs-rest problems).
    n_evaluations_ : int or ndarray (n_classes,)
        Evidence evaluations of the search on all training points (0 with ``optimizer=None``;
        the multinomial model's search on a subset first is not counted)."""

#: The final EP runs' attributes (:meth:`GPEstimator._set_ep_summary`), as the docstrings give them.
EP_RUN_ATTRIBUTES = """n_sweeps_ : int or ndarray (n_classes,)
        EP sweeps of the final run.
    converged_ : bool
        Whether every final EP run met ``tol``."""

#: The close of the GP estimators' ``kernel`` entry: the data-aware start on inputs in mixed units.
MIXED_UNITS_DOC = """When the ranges of the input columns differ by more than a factor of 100 (mixed units),
    the RBF of that start becomes ``RBFARD`` with fixed scales 1/range² per column and γ
    from the range-scaled inputs, so that raw and standardised columns give the same model."""

#: The attributes of the one-vs-rest GP classifiers' kernel and likelihood, as their docstrings give them.
CLASSIFIER_ATTRIBUTES = """classes_ : ndarray (n_classes,)
        Sorted class labels; ``classes_[1]`` is the positive class of a binary problem.
    kernel_, likelihood_ : Kernel, Likelihood (lists, one per class, one-vs-rest)
        The fitted kernel and likelihood."""

#: The fitted noise model of the GP regressors with Gaussian or Student-t noise.
REGRESSOR_ATTRIBUTES = """kernel_ : Kernel
        The fitted kernel.
    likelihood_ : Gaussian or StudentT
        The fitted noise model.
    noise_variance_ : float
        The variance of the fitted noise (Student-t: ``ν σ²/(ν - 2)``, ``inf`` for ν <= 2)."""


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
    """Set the engine ``options`` of fractional EP for a likelihood that needs it
    (:attr:`fastep.likelihoods.Likelihood.ep_variant` ``'fractional'``): the power η
    (``power``, or the likelihood's :attr:`~fastep.likelihoods.Likelihood.default_power`), up to
    10 halvings of a step that would make a cavity improper, and damping 0.5 unless ``damping``
    was given."""
    options["power"] = float(noise_class.default_power if power is None else power)
    options["max_halvings"] = 10
    if damping is None:
        options["damping"] = 0.5


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
    from .hyperpriors import check_hyperprior
    return {
        "schedule": Choice(schedules), "order": Choice(orders), "negative_precision": Choice(policies),
        "damping": Interval(0.0, 1.0, low_inclusive=False, allow_none=True),
        "tol": Positive(), "max_sweeps": Integer(1),
        "jitter": Interval(0.0, np.inf, finite=True),
        "optimizer": Custom(check_optimizer), "n_restarts_optimizer": Integer(0), "warm_start": Boolean(),
        "random_state": Seed(), "hyperprior": Custom(check_hyperprior),
    }


def stack_problems(arrays):
    """One problem: its array; several (one-vs-rest): stacked along a new first axis."""
    return arrays[0] if len(arrays) == 1 else np.stack(arrays)


class GPEstimator(BaseEstimator):
    """Fitted-state handling and the latent predictive shared by the GP estimators.

    Subclasses fit a list of problems (each with ``latent(X)``, ``kernel`` and
    ``likelihood``) and call :meth:`_set_problems`.
    """

    kernel: Kernel | None
    _problems: list[Any]
    n_features_in_: int

    def _set_problems(self, X, problems):
        """Store the problems and the fitted attributes every GP estimator has."""
        self._problems = problems
        self.n_features_in_ = X.shape[1]
        binary = len(problems) == 1
        self.kernel_ = problems[0].kernel if binary else [p.kernel for p in problems]
        self.likelihood_ = problems[0].likelihood if binary else [p.likelihood for p in problems]

    def _set_ep_summary(self, problems):
        """Sites, sweep counts, convergence and log marginal likelihood of EP problems."""
        self.log_marginal_likelihood_value_ = float(sum(p.log_ml for p in problems))
        self.log_hyperposterior_value_ = float(sum(getattr(p, "log_objective", p.log_ml) for p in problems))
        self.n_evaluations_ = (getattr(problems[0], "n_evaluations", 0) if len(problems) == 1
                               else np.array([getattr(p, "n_evaluations", 0) for p in problems]))
        tied = any(p.site_precision is None for p in problems)     # minibatch EP with tied sites
        self.site_precision_ = None if tied else stack_problems([p.site_precision for p in problems])
        self.site_natural_mean_ = None if tied else stack_problems([p.site_natural_mean for p in problems])
        self.n_sweeps_ = (problems[0].info.n_sweeps if len(problems) == 1
                          else np.array([p.info.n_sweeps for p in problems]))
        self.converged_ = all(bool(p.info.converged) for p in problems)
        progress = None
        for p in problems:                      # the fit's reporter is not part of the fitted state
            progress = p.options.pop("progress", None) or progress
        if progress is not None:
            self._warn_if_stopped(progress, stacklevel=4)

    def _search_options(self, problem, hyperparameters, seed):
        """Name ``problem`` (a :class:`SiteProblem`) after the estimator for its warnings, give it
        ``hyperparameters``, and return the keyword arguments of its :meth:`SiteProblem.fit` from
        the estimator's parameters (``optimizer``, ``n_restarts_optimizer``, ``warm_start``,
        ``max_sweeps``, ``tol``) and ``seed``."""
        problem.estimator_name = type(self).__name__
        problem.latent_scale = 1.0 if isinstance(self, GPClassifierMixin) else None
        problem.hyperparameters = hyperparameters
        return {"optimizer": self.optimizer, "n_restarts": self.n_restarts_optimizer, "seed": seed,
                "warm_start": self.warm_start, "max_sweeps": self.max_sweeps, "tol": self.tol}

    def _check_X(self, X: ArrayLike) -> NDArray[np.float64]:
        """Prediction-time X, validated against the training features (raises if not fitted)."""
        check_is_fitted(self, "_problems")
        return v.check_n_features(X, self.n_features_in_, estimator=self)

    def predict_latent(self, X: ArrayLike) -> MeanStd:
        """Latent predictive mean and variance at the rows of ``X``.

        Parameters
        ----------
        X : array-like (n_samples, n_features)

        Returns
        -------
        mean, var : ndarray (n_samples,), or (n_samples, n_classes) one-vs-rest
        """
        X = self._check_X(X)
        out = [p.latent(X) for p in self._problems]
        if len(out) == 1:
            return out[0]
        return np.column_stack([m for m, _ in out]), np.column_stack([s for _, s in out])


class LogMarginalLikelihoodMixin:
    """``log_marginal_likelihood(theta, eval_gradient)`` of the GP estimators, summed over their
    problems (one per class one-vs-rest).

    An estimator supplies the evidence of one problem at ``theta``
    (``_problem_log_marginal_likelihood``) and, optionally, the check of its fitted value
    (``_fitted_log_marginal_likelihood``).
    """

    _problems: list[Any]
    log_marginal_likelihood_value_: float | None

    @overload
    def log_marginal_likelihood(self, theta: ArrayLike | None = None, eval_gradient: Literal[False] = False
                                ) -> float: ...
    @overload
    def log_marginal_likelihood(self, theta: ArrayLike | None, eval_gradient: Literal[True]
                                ) -> tuple[float, NDArray[np.float64]]: ...
    @overload
    def log_marginal_likelihood(self, theta: ArrayLike | None = None, *, eval_gradient: Literal[True]
                                ) -> tuple[float, NDArray[np.float64]]: ...
    @overload
    def log_marginal_likelihood(self, theta: ArrayLike | None = None, eval_gradient: bool = False
                                ) -> float | tuple[float, NDArray[np.float64]]: ...
    def log_marginal_likelihood(self, theta: ArrayLike | None = None, eval_gradient: bool = False
                                ) -> float | tuple[float, NDArray[np.float64]]:
        """EP log marginal likelihood (and its gradient) at ``theta``.

        The evidence of the model the estimator fits: for the dense and sparse GP estimators,
        of their EP approximation on the training data; for the IVM estimators, the full-data
        objective: the sparse model on all training points with the fitted active inputs as
        inducing inputs (EP-FITC), ``K_mm``'s jitter at its fitted value.

        Parameters
        ----------
        theta : array-like or None, default None
            Unconstrained hyperparameters, in the order ``kernel_.theta``; then the
            likelihood's learnt parameters (``learn_likelihood``, or log σ² with
            ``learn_noise``; :meth:`fastep.likelihoods.Likelihood.theta_names` gives their
            coordinates); then, for the sparse models whose fit learnt the inducing inputs
            (``learn_inducing=True``, or a minibatch fit's second stage),
            ``inducing_inputs_.ravel()``. None returns the fitted value
            (``log_marginal_likelihood_value_``). One-vs-rest: the same ``theta`` for every
            class, and the sum over the classes is returned.
        eval_gradient : bool, default False
            Also return the gradient with respect to ``theta`` (exact at the EP fixed point).

        Returns
        -------
        float, or (float, ndarray) with ``eval_gradient``
            EP runs from zero sites at ``theta``; the fitted state is left unchanged.
        """
        check_is_fitted(self, "_problems")
        if theta is None:
            if eval_gradient:
                raise ValueError("eval_gradient=True requires theta")
            return self._fitted_log_marginal_likelihood()
        values = [self._problem_log_marginal_likelihood(p, theta, eval_gradient) for p in self._problems]
        if eval_gradient:
            return float(sum(val for val, _ in values)), np.sum([g for _, g in values], axis=0)
        return float(sum(values))

    def _fitted_log_marginal_likelihood(self) -> float:
        return self.log_marginal_likelihood_value_  # type: ignore[return-value]

    def _problem_log_marginal_likelihood(self, problem, theta, eval_gradient):
        return problem.log_ml_at(problem.hyperparameters, theta, eval_gradient)


class EPEvidenceMixin(LogMarginalLikelihoodMixin):
    """``log_marginal_likelihood`` and ``log_hyperposterior`` of the estimators whose problems
    are :class:`SiteProblem`, and the fitted attributes of their EP runs."""

    log_marginal_likelihood_value_: float
    log_hyperposterior_value_: float
    n_evaluations_: int | NDArray[np.int_]
    site_precision_: NDArray[np.float64]
    site_natural_mean_: NDArray[np.float64]
    n_sweeps_: int | NDArray[np.int_]
    converged_: bool

    @overload
    def log_hyperposterior(self, theta: ArrayLike | None = None, eval_gradient: Literal[False] = False
                           ) -> float: ...
    @overload
    def log_hyperposterior(self, theta: ArrayLike | None, eval_gradient: Literal[True]
                           ) -> tuple[float, NDArray[np.float64]]: ...
    @overload
    def log_hyperposterior(self, theta: ArrayLike | None = None, *, eval_gradient: Literal[True]
                           ) -> tuple[float, NDArray[np.float64]]: ...
    @overload
    def log_hyperposterior(self, theta: ArrayLike | None = None, eval_gradient: bool = False
                           ) -> float | tuple[float, NDArray[np.float64]]: ...
    def log_hyperposterior(self, theta: ArrayLike | None = None, eval_gradient: bool = False
                           ) -> float | tuple[float, NDArray[np.float64]]:
        """The objective of the hyperparameter search at ``theta``: the EP log marginal likelihood
        plus the log density of the hyperprior (``hyperprior``; none: the evidence alone).

        Parameters
        ----------
        theta : array-like or None, default None
            As for :meth:`log_marginal_likelihood`; None returns the fitted value
            (``log_hyperposterior_value_``).
        eval_gradient : bool, default False
            Also return the gradient with respect to ``theta``.

        Returns
        -------
        float, or (float, ndarray) with ``eval_gradient``
        """
        check_is_fitted(self, "_problems")
        if theta is None:
            if eval_gradient:
                raise ValueError("eval_gradient=True requires theta")
            return self.log_hyperposterior_value_
        evidence: Any = self.log_marginal_likelihood(theta, eval_gradient)
        hyper = self._problems[0].hyperparameters
        theta = hyper.check(theta)
        prior = [p.hyperparameters.log_prior(theta, eval_gradient) for p in self._problems]
        if eval_gradient:
            return (evidence[0] + float(sum(val for val, _ in prior)),
                    evidence[1] + np.sum([g for _, g in prior], axis=0))
        return evidence + float(sum(prior))


class GPClassifierMixin(ClassifierMixin):
    """Class probabilities, decision values and labels from binary latent predictives."""

    _problems: list[Any]
    classes_: NDArray[Any]

    if TYPE_CHECKING:
        def _check_X(self, X: ArrayLike) -> NDArray[np.float64]: ...

    def predict_proba(self, X: ArrayLike) -> NDArray[np.float64]:
        """Class probabilities, columns ordered as ``classes_``.

        Binary: ``p(y = classes_[1] | x) = ∫ t(f) N(f; μ*, σ*²) df`` with the likelihood
        ``t`` (probit with unit slope: ``Φ(μ*/sqrt(1 + σ*²))``). One-vs-rest: each class's
        binary predictive, normalised to sum to one.

        Parameters
        ----------
        X : array-like (n_samples, n_features)

        Returns
        -------
        ndarray (n_samples, n_classes)
        """
        X = self._check_X(X)
        return one_vs_rest_proba(self._problems, X)

    def decision_function(self, X: ArrayLike) -> NDArray[np.float64]:
        """Predictive log-odds ``log p(+1 | x) - log p(-1 | x)`` of each binary problem.

        Parameters
        ----------
        X : array-like (n_samples, n_features)

        Returns
        -------
        ndarray (n_samples,), or (n_samples, n_classes) one-vs-rest
        """
        X = self._check_X(X)
        cols = []
        for p in self._problems:
            mean, var = p.latent(X)
            ones = np.ones_like(mean)
            cols.append(p.likelihood.moments(ones, mean, var)[0] - p.likelihood.moments(-ones, mean, var)[0])
        return cols[0] if len(cols) == 1 else np.column_stack(cols)

    def _multiclass_scores(self, X):
        """Scores whose row-wise argmax is the one-vs-rest prediction."""
        return self.predict_proba(X)

    def predict(self, X: ArrayLike) -> NDArray[Any]:
        """Most probable class for each row of ``X``.

        Parameters
        ----------
        X : array-like (n_samples, n_features)

        Returns
        -------
        ndarray (n_samples,) of labels from ``classes_``
        """
        check_is_fitted(self, "_problems")
        if len(self._problems) == 1:
            return self.classes_[(self.decision_function(X) > 0).astype(int)]
        return self.classes_[np.argmax(self._multiclass_scores(X), axis=1)]


class GPRegressorMixin(RegressorMixin):
    """Predictive mean and standard deviation of a GP regressor with Gaussian noise."""

    noise_variance: float | None
    learn_noise: bool
    noise_variance_: float

    if TYPE_CHECKING:
        def predict_latent(self, X: ArrayLike) -> MeanStd: ...

    #: Added to the latent mean (the IVM regressor's bias); 0 for a zero-mean GP.
    def _output_offset(self) -> float:
        return 0.0

    def _check_regression_inputs(self, X: ArrayLike, y: ArrayLike, kernel: Kernel | None, bias: bool = True
                                 ) -> tuple[Gaussian, bool, NDArray[np.float64], NDArray[np.float64], Kernel]:
        """``(likelihood, learn_noise, X, y, kernel)``: the Gaussian noise model from
        ``noise_variance`` (data-aware when None), ``learn_noise`` as a bool, X (validated
        once, also against the kernel), real y, and the starting kernel (:func:`start_kernel`;
        ``bias`` False for an estimator that subtracts the targets' offset itself)."""
        noise_variance = check_noise_variance(self.noise_variance)
        learn_noise = v.check_bool(self.learn_noise, "learn_noise")
        X, y = v.check_X_y(X, y, y_numeric=True)
        if noise_variance is None:
            noise_variance = default_noise_variance(y)
        kernel = start_kernel(kernel, X, y, regression=True, bias=bias)
        kernel._validate_X(X, "X")
        return Gaussian(noise_variance=noise_variance), learn_noise, X, y, kernel

    def _predict_mean_std(self, X: ArrayLike, return_std: bool) -> NDArray[np.float64] | MeanStd:
        # std = sqrt(σ*² + noise_variance_)
        mean, var = self.predict_latent(X)
        offset = self._output_offset()
        if offset:
            mean = mean + offset
        if return_std:
            return mean, np.sqrt(var + self.noise_variance_)
        return mean
