"""The Informative Vector Machine (Lawrence, Seeger & Herbrich 2005): sparse GP models by greedy ADF.

Estimators
----------
IVMClassifier
    Binary probit (or other binary likelihood) classification; more classes one-vs-rest,
    combined by the largest latent mean plus probit bias, as in the paper's USPS experiment (§4.2).
IVMRegressor
    Gaussian noise with a bias (the "spherical" model: sites ``m = y - bias``,
    ``β = 1/σ²``).
IVMOrdinalRegressor
    Ordered categories (§2.4) with a learnable bias and widths.

Fitting (Algorithm 2)
---------------------
Each of ``n_iterations`` outer rounds

1. selects ``active_set_size`` = d points with Algorithm 1 (the compiled engine
   :mod:`fastep._epcore.ivm`: eqs 14-30, O(d² n) time, O(d n) memory, one kernel
   column per inclusion from :meth:`fastep.kernels.Kernel.columns`; the n×n
   kernel matrix is never formed);
2. learns the parameters by one of two objectives (``kernel_objective``).

   ``'full_data'`` (default): the EP evidence of the sparse GP on *all* n training points
   with the d active inputs as inducing inputs, EP-FITC (:mod:`fastep.sparse`; the
   tutorial slides *Expectation Propagation for Gaussian processes*, "Sparse EP" and
   "EP-FITC"), plus the log density of the hyperprior (``hyperprior``,
   :mod:`fastep.hyperpriors`), maximised over the kernel parameters and, when they are
   learnt, the likelihood's (the classifier's with ``learn_likelihood``, the regressor's
   noise variance with ``learn_noise``, the ordinal thresholds), with Z held at the active
   inputs. EP updates every site from the same posterior (damping 0.5), to a tolerance of 1e-4
   during a round's search and 1e-6 at its result. Algorithm 2 stops before ``n_iterations``
   rounds after a round that moved no parameter by more than 0.01 on the search's log scale: the
   selection depends on the parameters alone, so the next round would repeat it.
   Exact gradients, O(n d²) time per EP sweep and O(n d) memory; the search and its
   stopping rule are those of the dense and sparse GP estimators (:mod:`fastep._search.space`),
   and each round's EP starts from the previous round's sites (they live on the n training
   points, not on Z). This is the EP approximation of the marginal likelihood that Seeger's
   notes point to for model selection: every training point, not only the active ones,
   judges the kernel. With d = n it is the dense EP evidence (up to K_mm's jitter, 1e-6 of
   the mean prior variance of the active points). The regressor's bias stays at its start
   (the mean of y, or ``bias``). From 50 000 training rows on (``learning``) each round learns
   this objective from minibatches instead: stochastic EP with one tied site over the active
   inputs and Adam steps on a minibatch estimate of its gradient
   (:mod:`fastep._sparse.stochastic`), O(d²) memory beyond the selection's; the fitted
   evidence is then the stochastic-EP estimate.

   ``'active_set'``: the paper's objective, the approximate likelihood of the active set,

       log N(m_I; 0, K_I + B_I⁻¹)                                            (eq 32)

   over the kernel parameters with L-BFGS-B, I, m and β held fixed. With
   ``C = K_I + B_I⁻¹``, ``w = C⁻¹ m_I`` its gradient is
   ``½ wᵀ (∂K_I/∂θ) w - ½ tr(C⁻¹ ∂K_I/∂θ)`` (exact, from
   ``kernel.gradient_iter``); ``C⁻¹ = B^½ A⁻¹ B^½`` with
   ``A = I + B^½ K_I B^½ = L Lᵀ`` (eigenvalues >= 1, so no jitter is needed).
   If the noise parameters are learnt (classifier, ordinal regressor) it then
   selects again and maximises ``Σ_n log Z_n`` (eq 34), ``Z_n = ∫ p(y_n | f_n) q(f_n) df_n``,
   over the likelihood parameters (:meth:`fastep.likelihoods.Likelihood.theta_gradient`) with the
   marginals q held fixed: the posterior marginal ``N(μ_n, ς_n)`` of each inactive
   point and the *cavity* marginal of each active point (its own site removed).
   The paper writes the posterior marginal ``q_d(f_n)`` for every point; for an
   active point that counts its site twice. The regressor's noise variance and
   bias are learnt with the kernel instead (``IVMRegressor``): its spherical sites
   depend on them directly, and eq 32 is then the exact evidence of the active set.
   With L-BFGS-B, eq 34 is maximised in box trust regions
   (:func:`fastep._search.optimize.maximize_log_likelihood_trust_region`, initial half-width 1
   in the unconstrained parameters, doubled while the optimum lies on the box's face):
   the likelihood parameters all have finite bounds, and L-BFGS-B would otherwise try the
   whole gradient of the N-term sum as its first step and stall at its start. The active
   set is a sample biased towards the decision boundary, so eq 32 can rank kernels against
   their test error; it is kept for the paper's protocol.

Every selection can be followed by refinement on the fixed-size active set
(``refine_sweeps``, ``exchange``; Seeger's notes §2.1 and §2.3): EP deletion-inclusion
sweeps over the active points (eq 7), exchange moves scored by eqs (8)-(9) and the
entropy criterion, and the sweeps again after any exchange. Off by default.

With ``'active_set'``, each optimisation runs at most ``max_optimizer_iter`` L-BFGS-B
iterations (a fixed budget per round, like the toolbox's fixed number of scaled-conjugate-
gradient iterations); stopping at that budget is expected and not reported as a
convergence failure. ``optimizer='SCG'`` uses the paper's optimiser instead
(scaled conjugate gradients as in Netlab, :func:`fastep._search.optimize.maximize_log_likelihood_scg`).
A final selection at the learnt parameters gives the fitted model. With
``optimizer=None`` (or ``n_iterations=0``) only that selection is made.

Prediction
----------
O(d) kernel evaluations per test point: with ``k* = k(x*, x_I)`` and the factor
``L`` of ``A``, ``μ* = k*ᵀ w`` and ``σ*² = k(x*, x*) - |L⁻¹ B^½ k*|²`` (Seeger's
notes §2.2); probit class probabilities ``Φ((μ* + b)/sqrt(λ⁻² + σ*²))``
(the likelihood's predictive).

Memory: the selection holds M (d×n floats); a fitted model keeps, per binary problem,
the active inputs, the sites, L and w.
"""
from __future__ import annotations

import copy
import warnings
from typing import TYPE_CHECKING

import numpy as np

from . import _validation as v
from ._base import EXAMPLES_DOC, ClassifierMixin, fill_doc, records_feature_names
from ._epcore import ivm as _engine
from ._gp.docs import CLASSIFIER_ATTRIBUTES, HYPERPRIOR_DOC, MIXED_UNITS_DOC, N_JOBS_DOC
from ._gp.estimator import (GPClassifierMixin, GPEstimator, GPRegressorMixin, LogMarginalLikelihoodMixin,
                            stack_problems)
from ._gp.fit_options import IVMFitOptions, RefineOptions
from ._gp.options import check_classifier_likelihood, check_optimizer, start_kernel
from ._ivm.problem import _FULL_DATA_EP, _IVMProblem, fit_problem, typed_history, typed_refinement
from ._ivm.selection import select_active_set
from ._sparse.stochastic import (MINIBATCH_ARD_MAX_FEATURES, MINIBATCH_BATCH_SIZE, MINIBATCH_LEARNING_RATE,
                                 MINIBATCH_MAX_EPOCHS, MINIBATCH_MIN_ROWS)
from ._search.start import default_ard_kernel, sample_rows
from .progress import CALLBACK_DOC
from .batch import map_in_order
from .kernels.base import check_kernel
from ._search.optimize import (maximize_log_likelihood, maximize_log_likelihood_scg,
                        maximize_log_likelihood_trust_region)
from .exceptions import ConvergenceWarning
from ._memory import check_memory, concurrent_problems, format_bytes, ivm_bytes
from .hyperpriors import check_hyperprior
from .likelihoods import Logistic, OrderedCategorical, Probit, Step
from .likelihoods.checks import check_ordinal_likelihood

if TYPE_CHECKING:
    from typing import Any, Literal

    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

    from ._typing import Callback, Hyperprior
    from .kernels import Kernel
    from .likelihoods import Gaussian, Likelihood

__all__ = ["IVMClassifier", "IVMRegressor", "IVMOrdinalRegressor", "select_active_set"]

_KERNEL_OBJECTIVES = ("full_data", "active_set")
_LEARNING_MODES = ("auto", "full-batch", "minibatch")
#: d when ``active_set_size=None``, at most n_samples (the size of the paper's experiments on real data).
_DEFAULT_ACTIVE_SET_SIZE = 200


class _IVMBase(LogMarginalLikelihoodMixin, GPEstimator):
    """Options, problems and fitted-state handling shared by the IVM estimators."""

    active_set_size: int | None
    criterion: Literal["entropy", "info_gain", "random"]
    optimizer: Literal["L-BFGS-B", "SCG"] | None
    n_iterations: int
    max_optimizer_iter: int
    random_state: int | None
    refine_sweeps: int
    exchange: Literal["greedy", "random"] | None
    exchange_tol: float
    max_exchanges: int | None
    kernel_objective: Literal["full_data", "active_set"]
    learning: Literal["auto", "full-batch", "minibatch"]
    hyperprior: Hyperprior
    X_train_: NDArray[np.float64]
    active_set_: NDArray[np.intp]
    site_mean_: NDArray[np.float64]
    site_precision_: NDArray[np.float64]
    log_likelihood_: float
    log_marginal_likelihood_value_: float | None
    history_: list[dict[str, Any]] | list[list[dict[str, Any]]]
    refinement_: dict[str, Any] | list[dict[str, Any] | None] | None

    def _new_problem(self, X, targets, kernel, likelihood, options, **kwargs):
        """An :class:`~fastep._ivm.problem._IVMProblem` on ``targets`` from a copy of ``kernel``."""
        return _IVMProblem(X, targets, copy.deepcopy(kernel), likelihood, options.d, options.criterion,
                           options.seed, refine=options.refine, **kwargs)

    def _check_memory(self, n, options, n_problems=1):
        """Raise :class:`~fastep.exceptions.MemoryLimitError` before a fit that cannot fit in memory."""
        learning = (options.n_iterations > 0 and options.kernel_objective == "full_data"
                    and not options.minibatch)       # minibatch learning holds no n x d projection
        d = options.d
        check_memory(ivm_bytes(n, d, learning=learning, n_problems=n_problems,
                               n_concurrent=concurrent_problems(getattr(self, "n_jobs", None))),
                     f"{type(self).__name__}.fit on n = {n} rows with active sets of d = {d} points (O(n d) "
                     f"memory: {format_bytes(8 * n * d)} per d×n array)",
                     "Use a smaller active_set_size, fewer concurrent problems (n_jobs), "
                     "kernel_objective='active_set', or a subsample")

    def _options(self, X, kernel=None):
        """The validated :class:`~fastep._gp.fit_options.IVMFitOptions` of a fit on the inputs
        ``X``; ``kernel``: the starting kernel
        when the estimator has made it (the regressor), else ``self.kernel`` or the data-aware
        start (:func:`~fastep._gp.options.start_kernel`), validated on X."""
        n_samples = X.shape[0]
        given = check_kernel(self.kernel)
        d = self.active_set_size
        if d is None:
            d = min(_DEFAULT_ACTIVE_SET_SIZE, n_samples)
        else:
            d = v.check_int(d, "active_set_size", minimum=1)
            if d > n_samples:
                raise ValueError(f"active_set_size must be <= n_samples = {n_samples}; got {d}")
        v.check_choice(self.criterion, "criterion", _engine.CRITERIA)
        check_optimizer(self.optimizer, ("L-BFGS-B", "SCG"))
        n_iterations = v.check_int(self.n_iterations, "n_iterations", minimum=0)
        max_optimizer_iter = v.check_int(self.max_optimizer_iter, "max_optimizer_iter", minimum=1)
        progress = self._new_progress()
        seed = v.check_seed(self.random_state)
        refine_sweeps = v.check_int(self.refine_sweeps, "refine_sweeps", minimum=0)
        if self.exchange is not None and (not isinstance(self.exchange, str)
                                          or self.exchange not in ("greedy", "random")):
            raise ValueError(f"exchange must be None, 'greedy' or 'random', got {self.exchange!r}")
        exchange_tol = v.check_in_range(self.exchange_tol, "exchange_tol", 0.0, np.inf, high_inclusive=False)
        max_exchanges = None if self.max_exchanges is None else v.check_int(self.max_exchanges, "max_exchanges",
                                                                            minimum=0)
        refine = RefineOptions(sweeps=refine_sweeps, exchange=self.exchange, exchange_tol=exchange_tol,
                               max_exchanges=max_exchanges)
        objective = v.check_choice(self.kernel_objective, "kernel_objective", _KERNEL_OBJECTIVES)
        if objective == "full_data" and self.optimizer == "SCG":
            raise ValueError("optimizer='SCG' maximises the active set's eq 32: use it with "
                             "kernel_objective='active_set' (the full-data objective is learnt with 'L-BFGS-B')")
        learning = v.check_choice(self.learning, "learning", _LEARNING_MODES)
        if learning == "minibatch" and objective != "full_data":
            raise ValueError("learning='minibatch' learns the full-data objective: use it with "
                             "kernel_objective='full_data'")
        minibatch = objective == "full_data" and (
            learning == "minibatch" or (learning == "auto" and n_samples >= MINIBATCH_MIN_ROWS))
        full_data = _FULL_DATA_EP.replace(seed=seed, progress=progress, batch_size=MINIBATCH_BATCH_SIZE,
                                          learning_rate=MINIBATCH_LEARNING_RATE, max_epochs=MINIBATCH_MAX_EPOCHS)
        if kernel is None:
            if minibatch and given is None and X.shape[1] <= MINIBATCH_ARD_MAX_FEATURES:
                # as the sparse GP's minibatch default: one learnt relevance per input
                kernel = default_ard_kernel(X[sample_rows(n_samples)], None)
            else:
                kernel = start_kernel(given, X)
            kernel._validate_X(X, "X")
        return IVMFitOptions(kernel=kernel, d=d, criterion=_engine.CRITERIA[self.criterion], refine=refine,
                             n_iterations=n_iterations if self.optimizer is not None else 0,
                             max_optimizer_iter=max_optimizer_iter, seed=seed, progress=progress, optimizer=self.optimizer,
                             kernel_objective=objective, full_data=full_data, minibatch=minibatch,
                             hyperprior=check_hyperprior(self.hyperprior), estimator_name=type(self).__name__,
                             latent_scale=1.0 if isinstance(self, GPClassifierMixin) else None)

    @staticmethod
    def _maximize(objective, theta0, bounds, options, trust_radius=None):
        """Maximise eq 32 or eq 34 with the chosen optimiser and budget.

        ``trust_radius`` (used for eq 34) confines L-BFGS-B to box trust regions of that
        initial half-width (:func:`fastep._search.optimize.maximize_log_likelihood_trust_region`);
        SCG ignores it (its steps are scaled by a curvature estimate and shrink after
        failures already).
        """
        if options.optimizer == "SCG":
            return maximize_log_likelihood_scg(objective, theta0, bounds, maxiter=options.max_optimizer_iter)
        if trust_radius is not None:
            return maximize_log_likelihood_trust_region(objective, theta0, bounds, radius=trust_radius,
                                                        maxiter=options.max_optimizer_iter)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return maximize_log_likelihood(objective, theta0, bounds, maxiter=options.max_optimizer_iter)

    def _fitted_log_marginal_likelihood(self) -> float:
        if self.log_marginal_likelihood_value_ is None:
            raise ValueError("no full-data objective was computed in fit (kernel_objective='active_set' "
                             "or no learning); pass theta, e.g. kernel_.theta")
        return self.log_marginal_likelihood_value_

    def _problem_log_marginal_likelihood(self, problem, theta, eval_gradient):
        # EP from zero sites on all training points, Z = the fitted active inputs
        return problem.full_data_evidence_at(self.X_train_, theta, eval_gradient, _FULL_DATA_EP)  # seed 0, quiet

    def _set_common(self, X, problems, histories, options):
        """The fitted attributes shared by the estimators (after the stop warning of ``fit``)."""
        self._warn_if_stopped(options.progress, stacklevel=4)
        binary = len(problems) == 1
        self.X_train_ = X
        self._set_problems(X, problems)
        self.active_set_ = stack_problems([p.active for p in problems])
        self.site_mean_ = stack_problems([p.site_mean for p in problems])
        self.site_precision_ = stack_problems([p.site_precision for p in problems])
        self.log_likelihood_ = float(sum(p.log_lik for p in problems))
        evidence = [p.log_evidence for p in problems]
        self.log_marginal_likelihood_value_ = None if None in evidence else float(sum(evidence))
        self.history_ = histories[0] if binary else histories
        self.learning_ = ("minibatch" if options.minibatch else "full-batch") if (
            options.n_iterations > 0 and options.kernel_objective == "full_data") else None
        self.refinement_ = problems[0].refinement if binary else [p.refinement for p in problems]

    def __setstate__(self, state):
        """Restore a saved or copied estimator (a refinement report saved as plain dicts, as older
        versions wrote it, becomes typed results; history records saved under former keys take
        the new ones)."""
        self.__dict__.update(state)
        if "history_" in state:
            self.history_ = typed_history(state["history_"])
        report = state.get("refinement_")
        if report is not None:
            self.refinement_ = ([typed_refinement(r) for r in report] if isinstance(report, list)
                                else typed_refinement(report))


_COMMON_DOC = """active_set_size : int or None, default None
        d, the number of active points (1 <= d <= n_samples); None means min(200, n_samples).
    criterion : {'entropy', 'info_gain', 'random'}, default 'entropy'
        Selection score: entropy reduction (eq 26), information gain
        KL(q_new ‖ q_old), or a seeded random choice.
    optimizer : 'L-BFGS-B', 'SCG' or None, default 'L-BFGS-B'
        None keeps every parameter fixed (one selection). 'SCG': scaled conjugate
        gradients (Møller 1993, as Netlab's ``scg``), the optimiser the paper names for
        Algorithm 2.
    n_iterations : int >= 0, default 4
        Outer rounds of Algorithm 2 (with the full-data objective at most that many: it stops
        after a round that moved no parameter by more than 0.01 on the search's log scale).
    kernel_objective : {'full_data', 'active_set'}, default 'full_data'
        What Algorithm 2 maximises after each selection. ``'full_data'``: the EP evidence of
        the sparse GP on all training points with the active inputs as inducing inputs
        (EP-FITC, O(n d²) per EP sweep), plus the log hyperprior, over the kernel parameters
        and the learnt likelihood parameters together (module notes). ``'active_set'``: the
        paper's eq 32, the approximate likelihood of the d active points alone, then eq 34
        for the likelihood parameters (the paper's protocol; also the only objective
        ``optimizer='SCG'`` maximises).
    learning : {'auto', 'full-batch', 'minibatch'}, default 'auto'
        How each round learns the full-data objective. ``'full-batch'``: L-BFGS-B on its
        exact evidence and gradient, every evaluation EP over all n points (O(n d) memory).
        ``'minibatch'``: stochastic EP with one tied site and Adam steps on a minibatch
        estimate of the evidence gradient, as :class:`~fastep.SparseGPClassifier` learns from
        minibatches (batches of 512, step 0.03, at most 20 passes, stopped when the running
        leave-one-out log loss stops improving; O(d²) memory beyond the selection's); the
        fitted evidence is then an estimate from a sample of rows, and Algorithm 2 stops after
        a round that moved no parameter by more than 0.1 on the log scale or did not lower the
        running log loss of the round before by more than its standard error (the better of
        the two rounds' parameters is kept). ``'auto'``:
        minibatch from 50 000 training rows on. Needs ``kernel_objective='full_data'``.
    %HYPERPRIOR%
        Used by ``kernel_objective='full_data'``.
    max_optimizer_iter : int, default 100
        L-BFGS-B (or SCG) iterations per optimisation of eq 32 or eq 34
        (``kernel_objective='active_set'``).
    random_state : int or None
        Seed of the random criterion and of the random exchange search.
    %CALLBACK%
    refine_sweeps : int >= 0, default 0
        EP deletion-inclusion sweeps over the active set after every selection (Seeger's
        notes §2.1: cavity from the marginal, moment matching (eq 5), eq (7) and the h
        update), stopping early once no site changes by more than 1e-9 (relative precision
        change; mean change in site standard deviations); L, M, ς and μ are then rebuilt
        from the site parameters. 0 keeps the ADF sites of Algorithm 1 (eqs 22-23).
    exchange : {None, 'greedy', 'random'}, default None
        Exchange moves on the fixed-size active set after the sweeps (Seeger's notes §2.3):
        swap an active point j for an inactive point i, scored by eqs (8)-(9) and the
        entropy criterion (eq 4), applied by the 2x2 Woodbury update of A and h. 'greedy'
        takes the best of all pairs at each move; 'random' visits the active points in a
        seeded random order (``random_state``) and swaps the first one that has an
        improving partner. With ``refine_sweeps`` > 0 the sweeps are repeated after the
        exchanges.
    exchange_tol : float >= 0, default 1e-6
        Exchanges stop when no move reduces the posterior entropy by more than this (nats).
    max_exchanges : int >= 0 or None, default None
        Maximum number of exchange moves per selection; None means the active set size.
        Stopping there (or after ``refine_sweeps`` sweeps without convergence) at the final
        selection warns with ``ConvergenceWarning``."""

#: The ``kernel`` parameter's entry; the START_VARIANCE section is the variance v of the default start RBF(v, γ).
_KERNEL_DOC = """kernel : fastep.kernels.Kernel or None, default None
        Prior covariance; its parameters are the starting point of Algorithm 2. None starts from
        ``RBF(%START_VARIANCE%, γ)``, γ = 1 / (median squared distance between the training inputs, over a
        seeded sample of at most 1000 rows), so that inputs of any scale give a kernel whose
        evidence can be learnt; a kernel given here is the start as it is.
        %MIXED_UNITS%"""


_COMMON_ATTRIBUTES = """active_set_ : ndarray (d,) or (n_classes, d)
        Training indices of the active points in inclusion order.
    site_mean_, site_precision_ : ndarray (d,) or (n_classes, d)
        Site parameters m, β of the active points (eqs 22-23), in ``active_set_`` order.
    log_likelihood_ : float
        eq 32 at the fitted parameters (summed over one-vs-rest problems).
    log_marginal_likelihood_value_ : float or None
        The full-data objective's evidence at the fitted parameters and the final active set
        (summed over one-vs-rest problems); None when it was not computed
        (``kernel_objective='active_set'``, or no learning). :meth:`log_marginal_likelihood`
        evaluates it at any parameters.
    history_ : list of dict (a list of them per class one-vs-rest)
        Algorithm 2 progress: iteration, stage ('full data'; or 'kernel' and 'noise' for eq 32
        and eq 34), log_likelihood (eq 32), n_active, elapsed (seconds), and for the full-data
        objective log_marginal_likelihood (its evidence at the end of that round; its former
        key ``'log_evidence'`` reads it with a ``FutureWarning`` until the next release).
    learning_ : {'full-batch', 'minibatch'} or None
        How the full-data objective was learnt (``learning``); None without it
        (``kernel_objective='active_set'``, or no learning).
    refinement_ : dict or None (a list one-vs-rest)
        Reports of the refinement after the final selection, by stage as run: 'ep' and
        'ep_after_exchange' (the EP sweeps, :class:`~fastep._epcore.ivm_refine.RefineResult`:
        the ``SweepResult`` fields ``n_sweeps``, ``converged``, ``max_change``, ``log_z``
        (eq 32 after the sweeps), ``n_skipped``, ``n_failed``, ``stopped``, and ``n_updates``,
        ``n_rejected``), 'exchange' (:class:`~fastep._epcore.ivm_refine.ExchangeResult`); None
        without refinement. The sweeps are reported to ``callback`` as ``'EP sweep'`` records;
        a callback that stops them ends the refinement there.
    X_train_ : ndarray (n_samples, n_features)
        The training inputs.
    n_features_in_ : int
        Number of features seen in ``fit``."""

_REFERENCES = """References
    ----------
    Lawrence, N. D., Seeger, M. and Herbrich, R. *The Informative Vector Machine: a
    practical probabilistic alternative to the support vector machine*: Algorithm 1
    (eqs 14-30), Algorithm 2 (eqs 32, 34), the ordered categorical noise model (§2.4).
    Seeger, M. *Notes on Minka's Expectation Propagation for Gaussian process
    classification*: refinement and exchange moves (§2.1-2.3), prediction (§2.2)."""

#: The sections every IVM estimator's docstring takes.
_SHARED_SECTIONS = {"COMMON": _COMMON_DOC, "HYPERPRIOR": HYPERPRIOR_DOC, "CALLBACK": CALLBACK_DOC,
                    "MIXED_UNITS": MIXED_UNITS_DOC, "COMMON_ATTRIBUTES": _COMMON_ATTRIBUTES,
                    "REFERENCES": _REFERENCES}


class IVMClassifier(GPClassifierMixin, _IVMBase):
    __doc__ = fill_doc("""Informative Vector Machine classifier: a sparse GP classifier by greedy active-set selection.

    d training points are included greedily, each the one whose inclusion most reduces the
    entropy of the ADF posterior (Algorithm 1, O(d² n) time, O(d n) memory, the n×n kernel
    matrix is never formed), and the kernel (and optionally likelihood) parameters are
    learnt by Algorithm 2. More than two classes are handled one-vs-rest (one binary IVM
    per class, each with its own kernel and active set); ``predict`` takes the class with
    the largest latent mean plus probit bias (the paper's rule, §4.2) and ``predict_proba``
    normalises the binary probabilities. Prediction costs d kernel evaluations per point.

    Parameters
    ----------
    %KERNEL%
        If Algorithm 2 ends on a kernel under which the latent function is ≈ constant across the
        training inputs (the active set's eq 32 can prefer such a model), the kernel of its last
        round that was not is kept, with a ``ConvergenceWarning``.
    likelihood : Probit, Logistic or Step, default Probit()
        The binary site model.
    learn_likelihood : bool, default False
        Optimise the likelihood parameters (probit bias and finite slope) by eq 34. The paper
        learns only the bias, with the slope fixed at λ = ∞ and the noise in a ``White``
        kernel term (§2.3): pass ``Probit(slope=np.inf)`` for that. A finite slope is learnt
        too, but on separable data eq 34 has no finite maximiser in λ (every ``log Z_n``
        then increases with λ); the trust regions of Algorithm 2 (module notes) let it grow
        only until the gradient, which decays like λ⁻², falls below the optimiser's
        tolerance. The decision ``μ* + b > 0`` hardly depends on it.
    %N_JOBS%
    multi_class : {'one_vs_rest', 'shared_budget'}, default 'one_vs_rest'
        More than two classes: one binary IVM per class with an active set of
        ``active_set_size`` points each (the paper's USPS setting, §4.2), or the same binary
        IVMs sharing one budget of ``active_set_size`` points, ``ceil(active_set_size / c)``
        per class: the selection then costs O(d² n / c) in all instead of O(c d² n), and
        prediction d kernel evaluations per point instead of c d. A joint model of the classes
        with one set of inducing inputs is :class:`SparseGPClassifier` ``(multi_class='multinomial')``.
    %COMMON%

    Attributes
    ----------
    %CLASSIFIER_ATTRIBUTES%
    %COMMON_ATTRIBUTES%

    See Also
    --------
    SparseGPClassifier : EP with learnt inducing inputs.
    GaussianProcessClassifier : dense EP on all the data.

    %REFERENCES%

    %EXAMPLES%
    >>> X = rng.normal(size=(300, 2))
    >>> y = np.where(X[:, 0] - X[:, 1] > 0, "a", "b")
    >>> clf = IVMClassifier(active_set_size=30, n_iterations=2).fit(X, y)
    >>> clf.active_set_.shape
    (30,)
    >>> clf.predict([[2.0, -2.0], [-2.0, 2.0]]).tolist()
    ['a', 'b']
    """, EXAMPLES=EXAMPLES_DOC, ESTIMATOR="IVMClassifier", KERNEL=_KERNEL_DOC, START_VARIANCE="1",
        N_JOBS=N_JOBS_DOC, CLASSIFIER_ATTRIBUTES=CLASSIFIER_ATTRIBUTES, **_SHARED_SECTIONS)

    likelihood: Probit | Logistic | Step | None
    learn_likelihood: bool
    n_jobs: int | None
    multi_class: Literal["one_vs_rest", "shared_budget"]
    kernel_: Kernel | list[Kernel]
    likelihood_: Likelihood | list[Likelihood]

    def __init__(self, kernel: Kernel | None = None, likelihood: Probit | Logistic | Step | None = None, *,
                 active_set_size: int | None = None,
                 criterion: Literal["entropy", "info_gain", "random"] = "entropy",
                 optimizer: Literal["L-BFGS-B", "SCG"] | None = "L-BFGS-B", n_iterations: int = 4,
                 learn_likelihood: bool = False, max_optimizer_iter: int = 100, random_state: int | None = None,
                 verbose: int = 0, refine_sweeps: int = 0, exchange: Literal["greedy", "random"] | None = None,
                 exchange_tol: float = 1e-6, max_exchanges: int | None = None, n_jobs: int | None = None,
                 kernel_objective: Literal["full_data", "active_set"] = "full_data",
                 learning: Literal["auto", "full-batch", "minibatch"] = "auto",
                 hyperprior: Hyperprior = "auto",
                 multi_class: Literal["one_vs_rest", "shared_budget"] = "one_vs_rest",
                 callback: Callback = None) -> None:
        self._set_init_params(locals())

    @records_feature_names
    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Select the active set(s) and learn the parameters (Algorithm 2); returns self."""
        v.check_choice(self.multi_class, "multi_class", ("one_vs_rest", "shared_budget"))
        X, y = v.check_X_y(X, y)
        options = self._options(X)
        kernel = options.kernel
        lik, learn_likelihood = check_classifier_likelihood(self.likelihood, self.learn_likelihood)
        classes, targets = v.encode_one_vs_rest_labels(y)
        if self.multi_class == "shared_budget" and len(targets) > 1:
            options = options.replace(d=max(1, -(-options.d // len(targets))))
        self._check_memory(X.shape[0], options, len(targets))

        def fit_class(c):
            problem = self._new_problem(X, targets[c], kernel, lik, options)
            label = "" if len(targets) == 1 else f"class {classes[c]!r}"
            return fit_problem(self, problem, options, learn_likelihood, False, label)

        fitted = map_in_order(fit_class, range(len(targets)), self.n_jobs)
        problems, histories = [p for p, _ in fitted], [h for _, h in fitted]
        self.classes_ = classes
        self._set_common(X, problems, histories, options)
        return self

    def decision_function(self, X: ArrayLike) -> NDArray[np.float64]:
        """Binary: the predictive log-odds ``log p(classes_[1] | x) - log p(classes_[0] | x)``
        (> 0 means ``classes_[1]``; it ranks points as ``predict_proba`` does). One-vs-rest: one
        column per class, the latent mean plus that problem's likelihood bias, ``μ* + b``; the
        largest wins (the paper's USPS rule, §4.2).

        Parameters
        ----------
        X : array-like (n_samples, n_features)

        Returns
        -------
        ndarray (n_samples,) or (n_samples, n_classes)
        """
        if len(getattr(self, "_problems", ())) == 1:
            return super().decision_function(X)
        mean, _ = self.predict_latent(X)
        return mean + np.array([p.likelihood.get_params().get("bias", 0.0) for p in self._problems])

    def _multiclass_scores(self, X: ArrayLike) -> NDArray[np.float64]:
        # The class with the largest μ* + b wins, as in the authors' USPS experiment (their
        # toolbox adds noise.bias to the posterior mean before taking the maximum). b is each
        # binary problem's probit bias: the latent mean shifted by it is the value each binary
        # classifier thresholds at 0.
        return self.decision_function(X)


class IVMRegressor(GPRegressorMixin, _IVMBase):
    __doc__ = fill_doc("""Informative Vector Machine regression: Gaussian noise as the spherical site model.

    ``y = f(x) + bias + ε`` with ``ε ~ N(0, noise_variance)``; every active point carries the
    site ``m = y - bias``, ``β = 1/noise_variance`` (§2.2), so the selection is exact GP
    regression on the active set, chosen greedily by Algorithm 1.

    Parameters
    ----------
    %KERNEL%
    noise_variance : float > 0 or None, default None
        Variance σ² of the noise (the starting point when learnt); None starts from var(y) / 10.
    bias : float or None, default None
        Output offset; None uses the mean of y.
    learn_noise : bool, default True
        Optimise ``noise_variance`` and ``bias`` with the kernel in eq 32, which for the
        spherical sites is the exact GP evidence of the active points,
        ``log N(y_I - bias; 0, K_I + σ² I)``. (eq 34 is not used for this model: with the
        marginals held fixed it prefers σ² → 0 whenever the posterior variance at the
        inactive points exceeds their residuals.)
    %COMMON%

    Attributes
    ----------
    kernel_ : Kernel
        The fitted kernel.
    likelihood_ : Gaussian
        The fitted noise model.
    noise_variance_ : float
        The fitted noise variance σ².
    bias_ : float
        The fitted output offset.
    %COMMON_ATTRIBUTES%

    %REFERENCES%

    %EXAMPLES%
    >>> X = rng.uniform(-3, 3, size=(400, 1))
    >>> y = 2.0 + np.sin(X[:, 0]) + 0.1 * rng.normal(size=400)
    >>> reg = IVMRegressor(active_set_size=40).fit(X, y)
    >>> bool(abs(reg.predict([[0.5]])[0] - (2.0 + np.sin(0.5))) < 0.2)
    True
    """, EXAMPLES=EXAMPLES_DOC, ESTIMATOR="IVMRegressor", KERNEL=_KERNEL_DOC, START_VARIANCE="var(y)",
        **_SHARED_SECTIONS)

    bias: float | None
    kernel_: Kernel
    likelihood_: Gaussian
    bias_: float

    def __init__(self, kernel: Kernel | None = None, noise_variance: float | None = None, *,
                 bias: float | None = None, learn_noise: bool = True, active_set_size: int | None = None,
                 criterion: Literal["entropy", "info_gain", "random"] = "entropy",
                 optimizer: Literal["L-BFGS-B", "SCG"] | None = "L-BFGS-B", n_iterations: int = 4,
                 max_optimizer_iter: int = 100, random_state: int | None = None, verbose: int = 0,
                 refine_sweeps: int = 0, exchange: Literal["greedy", "random"] | None = None,
                 exchange_tol: float = 1e-6, max_exchanges: int | None = None,
                 kernel_objective: Literal["full_data", "active_set"] = "full_data",
                 learning: Literal["auto", "full-batch", "minibatch"] = "auto",
                 hyperprior: Hyperprior = "auto",
                 callback: Callback = None) -> None:
        self._set_init_params(locals())

    @records_feature_names
    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Select the active set and learn the parameters (Algorithm 2); returns self."""
        lik, learn_noise, X, y, kernel = self._check_regression_inputs(X, y, check_kernel(self.kernel), bias=False)
        options = self._options(X, kernel)
        self._check_memory(X.shape[0], options)
        bias = float(np.mean(y)) if self.bias is None else v.check_in_range(self.bias, "bias", -np.inf, np.inf,
                                                                             low_inclusive=False,
                                                                             high_inclusive=False)
        problem = self._new_problem(X, y, kernel, lik, options, offset=bias, joint_noise=learn_noise)
        problem, history = fit_problem(self, problem, options, False, False)
        self._set_common(X, [problem], [history], options)
        self.noise_variance_ = float(problem.likelihood.noise_variance)
        self.bias_ = problem.offset
        return self

    def _output_offset(self) -> float:
        return self.bias_


class IVMOrdinalRegressor(ClassifierMixin, _IVMBase):
    __doc__ = fill_doc("""Informative Vector Machine for ordered categories (§2.4, eqs 24-25).

    The sorted distinct labels are the categories 0..C-1; the likelihood is
    ``OrderedCategorical(C)`` with thresholds ``b, b + w_1, b + w_1 + w_2, ...``: a label is
    the interval of the thresholds in which the noisy latent value falls.

    Parameters
    ----------
    %KERNEL%
    likelihood : OrderedCategorical or None, default None
        Starting likelihood (its ``n_categories`` must equal the number of distinct labels);
        None: slope 1, with the thresholds spread over C categories of unit width centred at 0.
    learn_likelihood : bool, default True
        Optimise the bias and widths by eq 34 (the slope stays fixed), in the coordinates
        ``(b, log w_1, ..., log w_(C-2))``. With the marginals held fixed eq 34 is concave in
        ``(b, w)`` and, because every category has a training point, has a finite maximiser.
    %COMMON%

    Attributes
    ----------
    classes_ : ndarray (C,)
        The ordered categories (sorted distinct labels).
    kernel_ : Kernel
        The fitted kernel.
    likelihood_ : OrderedCategorical
        The fitted likelihood (thresholds).
    %COMMON_ATTRIBUTES%

    %REFERENCES%

    %EXAMPLES%
    >>> X = rng.uniform(-3, 3, size=(300, 1))
    >>> y = np.digitize(X[:, 0] + 0.2 * rng.normal(size=300), [-1.0, 1.0])   # 0, 1, 2
    >>> model = IVMOrdinalRegressor(active_set_size=30, n_iterations=2).fit(X, y)
    >>> model.predict([[-2.5], [0.0], [2.5]]).tolist()
    [0, 1, 2]
    >>> model.predict_proba([[0.0]]).shape
    (1, 3)
    """, EXAMPLES=EXAMPLES_DOC, ESTIMATOR="IVMOrdinalRegressor", KERNEL=_KERNEL_DOC, START_VARIANCE="1",
        **_SHARED_SECTIONS)

    likelihood: OrderedCategorical | None
    learn_likelihood: bool
    classes_: NDArray[Any]
    kernel_: Kernel
    likelihood_: OrderedCategorical

    def __init__(self, kernel: Kernel | None = None, likelihood: OrderedCategorical | None = None, *,
                 learn_likelihood: bool = True, active_set_size: int | None = None,
                 criterion: Literal["entropy", "info_gain", "random"] = "entropy",
                 optimizer: Literal["L-BFGS-B", "SCG"] | None = "L-BFGS-B", n_iterations: int = 4,
                 max_optimizer_iter: int = 100, random_state: int | None = None, verbose: int = 0,
                 refine_sweeps: int = 0, exchange: Literal["greedy", "random"] | None = None,
                 exchange_tol: float = 1e-6, max_exchanges: int | None = None,
                 kernel_objective: Literal["full_data", "active_set"] = "full_data",
                 learning: Literal["auto", "full-batch", "minibatch"] = "auto",
                 hyperprior: Hyperprior = "auto",
                 callback: Callback = None) -> None:
        self._set_init_params(locals())

    @records_feature_names
    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Select the active set and learn the parameters (Algorithm 2); returns self."""
        X, y = v.check_X_y(X, y)
        options = self._options(X)
        v.check_class_labels(y)
        try:
            classes, inverse = np.unique(y, return_inverse=True)
        except TypeError as exc:
            raise TypeError(f"y labels must be mutually comparable: {exc}") from None
        n_categories = classes.shape[0]
        if n_categories < 2:
            raise ValueError(f"y must contain at least two ordered categories (classes); got only one class: "
                             f"{classes.tolist()}")
        lik = check_ordinal_likelihood(self.likelihood, n_categories)
        learn_likelihood = v.check_bool(self.learn_likelihood, "learn_likelihood")
        targets = inverse.reshape(-1).astype(float)
        self._check_memory(X.shape[0], options)
        problem = self._new_problem(X, targets, options.kernel, lik, options)
        problem, history = fit_problem(self, problem, options, learn_likelihood, False)
        self.classes_ = classes
        self._set_common(X, [problem], [history], options)
        return self

    def predict_proba(self, X: ArrayLike) -> NDArray[np.float64]:
        """Category probabilities ``∫ p(y=k | f) N(f; μ*, σ*²) df``, shape (n_samples, C)."""
        mean, var = self.predict_latent(X)
        return self._problems[0].likelihood.predictive(mean, var)

    def predict(self, X: ArrayLike) -> NDArray[Any]:
        """The most probable category."""
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]
