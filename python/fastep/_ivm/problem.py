"""The learning problem behind the IVM estimators of :mod:`fastep.ivm`.

``_IVMProblem`` is one binary, regression or ordinal problem: its selection (Algorithm 1,
the compiled engine :mod:`fastep._epcore.ivm`) and the refinement of its active set, the
objectives of Algorithm 2 with their gradients (the approximate likelihood of the active
set, eq 32; ``Σ_n log Z_n``, eq 34; the full-data EP-FITC evidence of :mod:`fastep.sparse`)
and, after ``finalize``, the prediction state. ``fit_problem`` runs Algorithm 2 on it for an
estimator. :mod:`fastep.ivm` describes both objectives and the rounds.

References: Lawrence, N. D., Seeger, M. and Herbrich, R. *Fast sparse Gaussian process
methods: the informative vector machine* (Algorithms 1 and 2, eqs 14-34); Seeger, M.
*Notes on Minka's Expectation Propagation for Gaussian process classification* (§2.1-2.3).
"""
import copy
import time
import warnings

import numpy as np
from scipy.linalg import lapack

from .._epcore import ivm as _engine
from .._epcore import sparse_ep as _sparse_engine
from .._epcore.ivm_refine import ExchangeResult, RefineResult
from .._gp.estimator import GPClassifierMixin
from .._gp.hyperparameters import Hyperparameters
from .._gp.predictor import DensePredictor
from .._search.checks import kernel_structure, warn_if_kernel_stuck
from .._linalg import cholesky_lower, matmul
from ..progress import StopRequested
from ..exceptions import ConvergenceWarning
from ..kernels import ColumnProductCache, KernelColumns
from ..likelihoods import Gaussian
from .._sparse.stochastic import MINIBATCH_PATIENCE, minibatch_windows
from .._gp.fit_options import RefineOptions, SparseFitOptions

#: EP of the full-data objective: the sparse engine's FITC evidence (power 1), every site updated
#: from the same posterior (one n x d product per iteration instead of n rank-1 factor updates),
#: damped by 0.5 (the sparse estimators' parallel default), to the sparse estimators' default tolerance.
_FULL_DATA_EP = SparseFitOptions(schedule=_sparse_engine.SPARSE_PARALLEL, order=_sparse_engine.ORDER_FIXED,
                                 damping=0.5, tol=1e-6, max_sweeps=200, negative_precision=_sparse_engine.NEGATIVE_CLIP,
                                 approximation="fitc", power=1.0, n_quadrature=32)
#: EP tolerance of the full-data objective during a round's search (the run at its result uses 1e-6).
_FULL_DATA_SEARCH_TOL = 1e-4
#: Algorithm 2 (full data) stops early after a round that moved no parameter by more than this in the
#: search's coordinates (logs of the positive parameters): the next round would reselect the same
#: active set (the selection depends on the parameters alone) and repeat it.
_ROUND_TOL = 1e-2
#: The same rule when each round learns from minibatches: the stochastic steps leave every
#: round some movement, so a round that moved no parameter by more than 10 % ends Algorithm 2.
_MINIBATCH_ROUND_TOL = 1e-1
#: K_mm's jitter in the full-data objective, relative to the mean prior variance of the active points.
_FULL_DATA_JITTER = 1e-6
# Initial half-width of the L-BFGS-B trust box for the noise parameters (eq 34), in their
# unconstrained coordinates: a bias moves by at most one latent unit and a width, slope or
# noise variance by at most a factor e per trial until the box grows (it doubles whenever
# the optimum lies on its face). Without the box, L-BFGS-B's first trial step is the whole
# gradient of Σ_n log Z_n, O(N) in size (see maximize_log_likelihood_trust_region).
_NOISE_TRUST_RADIUS = 1.0
#: The learnt Gaussian noise variance stays above this fraction of the largest prior variance.
_NOISE_FLOOR = 1e-6


def _active_log_likelihood(K_I, site_mean, site_precision, dK=None):
    """eq 32, ``log N(m; 0, K_I + B⁻¹)``, and optionally its gradient over ``dK`` (d, d, p).

    Returns ``(value, grad or None, L, w)`` with ``L`` the Cholesky factor of
    ``A = I + B^½ K_I B^½`` and ``w = (K_I + B⁻¹)⁻¹ m``. Raises LinAlgError when A is
    not positive definite (K_I not PSD).
    """
    d = site_mean.shape[0]
    sb = np.sqrt(site_precision)
    A = sb[:, None] * K_I * sb[None, :]
    A.flat[:: d + 1] += 1.0
    L = cholesky_lower(A, what="A = I + B^1/2 K_I B^1/2")
    value, w = _engine.active_set_evidence(L, site_mean, site_precision)
    grad = None
    if dK is not None:
        # C⁻¹ = B^½ A⁻¹ B^½ from the factor (dpotri: one triangle, about d³/3 flops).
        inv, info = lapack.dpotri(L.T, lower=0)          # L.T: Fortran view of U = Lᵀ, A = UᵀU
        if info != 0:
            raise np.linalg.LinAlgError("inverting A = I + B^1/2 K_I B^1/2 failed")
        R = np.triu(inv)
        R += np.triu(inv, 1).T
        R *= sb[:, None]
        R *= sb[None, :]
        # ½ wᵀ dK_j w - ½ tr(C⁻¹ dK_j) for every j at once
        p = dK.shape[2]
        quad = matmul(w, matmul(w, dK.reshape(d, d * p)).reshape(d, p))       # wᵀ dK_j w for every j
        grad = 0.5 * quad - 0.5 * np.einsum("ij,ijp->p", R, dK)
    return value, grad, L, w


class HistoryRecord(dict):
    """One record of an IVM estimator's ``history_``: a plain ``dict`` of the round's figures.

    ``record['log_evidence']``, the former name of ``record['log_marginal_likelihood']``, still
    reads it, with a ``FutureWarning``, until the next release.
    """

    __slots__ = ()
    #: Former keys: ``{old: new}``.
    _RENAMED_KEYS = {"log_evidence": "log_marginal_likelihood"}

    def __missing__(self, key):
        new = self._RENAMED_KEYS.get(key)
        if new is None or new not in self:
            raise KeyError(key)
        warnings.warn(f"the history_ key {key!r} is deprecated and will be removed in the next release; use "
                      f"{new!r}", FutureWarning, stacklevel=2)
        return self[new]

    def __reduce__(self):
        return type(self), (dict(self),)


def typed_history(history):
    """An IVM ``history_`` (a list of records, or a list of them per one-vs-rest problem) whose
    records are :class:`HistoryRecord`; a record saved as a plain dict under a former key (model
    files and pickles written before the rename) takes the new key."""
    if history is None:
        return None
    if history and isinstance(history[0], list):
        return [typed_history(per_problem) for per_problem in history]
    return [HistoryRecord({HistoryRecord._RENAMED_KEYS.get(key, key): value for key, value in record.items()})
            for record in history]


def typed_refinement(report):
    """A refinement report (:attr:`~fastep._epcore.ivm_refine.IVMResult.refinement`) whose
    stages hold the engine's typed results: a stage saved as a plain dict (model files written
    before the results were typed) becomes a :class:`~fastep._epcore.ivm_refine.RefineResult`
    or :class:`~fastep._epcore.ivm_refine.ExchangeResult`; None stays None."""
    if report is None:
        return None
    typed = {}
    for stage, result in report.items():
        if isinstance(result, dict) and stage == "exchange":
            result = ExchangeResult(result["moves"], result["converged"], result["best_gain"])
        elif isinstance(result, dict):          # the constructor's fields (n_failed is n_rejected)
            result = RefineResult(**{name: value for name, value in result.items() if name in RefineResult._ARGS})
        typed[stage] = result
    return typed


class _IVMProblem:
    """One binary, regression or ordinal IVM problem: selection, objectives, prediction state.

    ``offset`` is subtracted from the targets before they reach the site kernel (the
    regressor's bias; 0 otherwise). After ``select`` the attributes ``state`` (the
    engine's :class:`~fastep._epcore.ivm.IVMEP`), ``active``, ``site_mean`` and
    ``site_precision`` (active order) describe the selection; ``finalize`` keeps
    only what prediction needs and drops the O(d n) state.
    """

    def __init__(self, X, y, kernel, likelihood, d, criterion, seed, offset=0.0, joint_noise=False,
                 refine=None):
        self.X, self.y, self.kernel, self.likelihood = X, y, kernel, likelihood
        self.d, self.criterion, self.seed, self.offset = d, criterion, seed, float(offset)
        self.refine = RefineOptions() if refine is None else refine
        self.joint_noise = joint_noise
        self.refinement = self.state = self.product_cache = self.full_data_sites = None
        self.prior_centre = (kernel, likelihood)
        self.hyperparameters = self.log_evidence = None

    def _columns(self):
        """Kernel column oracle; the parameter-free products ``Xc x̃_j`` of the non-ARD
        Linear/RBF/MLP terms are kept between the selections of Algorithm 2 (which mostly
        reselect the same points under new parameters), at most 2d of them (O(d n) memory,
        like M), dropped by ``finalize``. A problem selected once keeps none
        (``product_cache`` None), so that its memory stays M alone."""
        cache = None if self.product_cache is None else self.product_cache._for(self.X)
        return KernelColumns(self.kernel, self.X, cache)

    # -- Algorithm 1 ---------------------------------------------------------------------
    def engine_options(self):
        """The engine's :class:`~fastep._epcore.ivm_refine.IVMOptions` for this problem."""
        refine = self.refine
        return _engine.IVMOptions(self.d, criterion=self.criterion, seed=self.seed,
                                  refine_sweeps=refine.sweeps, exchange=refine.exchange,
                                  exchange_tol=refine.exchange_tol, max_exchanges=refine.max_exchanges)

    def select(self, sweep_callback=None):
        """Algorithm 1 and the refinement of the active set (one :meth:`IVMEP.run
        <fastep._epcore.ivm.IVMEP.run>`); ``sweep_callback`` receives its EP sweeps.
        Sets ``state``, ``active``, ``site_mean``, ``site_precision`` and ``refinement``."""
        cols = self._columns()
        bad = np.flatnonzero(~(cols.diag > 0))
        if bad.size:
            raise ValueError(f"kernel must have a positive diagonal on X; {self.kernel!r} gives "
                             f"k(x_{bad[0]}, x_{bad[0]}) = {cols.diag[bad[0]]!r}")
        self.state = None                       # release the previous M (d x n) before allocating the next
        state = _engine.IVMEP(self.y - self.offset, self.likelihood.site_spec(), cols.diag,
                                 self.engine_options())
        self.refinement = state.run(cols, sweep_callback).refinement
        self.state = state
        self.active = state.active
        self.site_mean = np.array(state.site_mean)[self.active]
        self.site_precision = np.array(state.site_precision)[self.active]
        self.marginals = None
        return state

    def refinement_warnings(self):
        """Messages for a refinement that stopped before convergence (final selection only)."""
        out = []
        info = self.refinement or {}
        for key in ("ep", "ep_after_exchange"):
            ep = info.get(key)
            if ep is not None and not ep.converged and not ep.stopped:
                out.append(f"EP refinement of the active set did not converge in {ep.n_sweeps} sweep(s) "
                           f"(largest site change {ep.max_change:.3g}, {ep.n_rejected} improper "
                           "update(s) rejected); increase refine_sweeps")
        ex = info.get("exchange")
        if ex is not None and not ex.converged:
            out.append(f"exchange moves stopped after {ex.n_moves} move(s) with an exchange still gaining "
                       f"{ex.best_gain:.3g} nats; increase max_exchanges")
        return out

    def __setstate__(self, state):
        """Restore a saved or copied problem (a refinement report, and the refinement's settings,
        saved as plain dicts, as older versions wrote them, become typed)."""
        self.__dict__.update(state)
        self.refinement = typed_refinement(state.get("refinement"))
        if not isinstance(self.__dict__.get("refine"), RefineOptions):
            self.refine = RefineOptions.from_dict(self.__dict__.get("refine"))

    # -- Algorithm 2 objectives --------------------------------------------------------------
    def kernel_objective(self, theta):
        """eq 32 and its gradient at ``theta`` (active set fixed).

        ``theta`` = the kernel's unconstrained parameters; with ``joint_noise`` (the
        spherical Gaussian model) followed by log σ² and the offset b, on which the
        sites ``m_I = y_I - b``, ``β = 1/σ²`` depend directly: eq 32 is then the exact
        GP evidence of the active points, ``log N(y_I - b; 0, K_I + σ² I)``, with
        ``∂/∂ log σ² = σ² (½ wᵀw - ½ tr C⁻¹)`` and ``∂/∂b = Σ w``. Otherwise the sites
        are held fixed.
        """
        n_kernel = self.kernel.n_theta
        kernel = self.kernel.clone_with_theta(theta[:n_kernel])
        X_I = self.X[self.active]
        d = self.active.shape[0]
        if n_kernel:
            dK = np.empty((d, d, n_kernel))
            K_I = kernel._value_and_gradient(X_I, dK)         # shared intermediates (one gram per leaf)
        else:
            K_I, dK = kernel._K(X_I, None), np.zeros((d, d, 0))
        if not self.joint_noise:
            value, grad, _, _ = _active_log_likelihood(K_I, self.site_mean, self.site_precision, dK)
            return value, grad
        noise = float(np.exp(theta[n_kernel]))
        site_mean = self.y[self.active] - float(theta[n_kernel + 1])
        dK = np.concatenate([dK, (noise * np.eye(d))[:, :, None]], axis=2)
        value, grad, _, w = _active_log_likelihood(K_I, site_mean, np.full(d, 1.0 / noise), dK)
        return value, np.append(grad, np.sum(w))

    def kernel_theta(self):
        """Starting point and bounds of ``kernel_objective``."""
        theta, bounds = self.kernel.theta, self.kernel.bounds
        if self.joint_noise:
            noise_bounds = self.likelihood.theta_bounds.copy()
            # eq 32 tends to zero noise when the data are (nearly) noise-free and every point is
            # active; below 1e-6 of the prior variance the Gaussian sites of the next selection
            # are numerically improper (ν ς >= 1), so the noise variance is kept above that
            prior_scale = float(np.max(self.kernel._diag(self.X)))
            floor = np.log(_NOISE_FLOOR * prior_scale)
            noise_bounds[0, 0] = max(noise_bounds[0, 0], floor)
            # the fixed upper bound (e^20) is below the prior variance of targets on a large scale
            noise_bounds[0, 1] = max(noise_bounds[0, 1], np.log(100.0 * prior_scale))
            log_noise = min(max(np.log(self.likelihood.noise_variance), noise_bounds[0, 0]), noise_bounds[0, 1])
            theta = np.append(theta, [log_noise, self.offset])
            bounds = np.vstack([bounds, noise_bounds, [[-np.inf, np.inf]]])
        return theta, bounds

    def set_kernel_theta(self, theta):
        n_kernel = self.kernel.n_theta
        self.kernel = self.kernel.clone_with_theta(theta[:n_kernel])
        if self.joint_noise:
            self.likelihood = Gaussian(noise_variance=float(np.exp(theta[n_kernel])))
            self.offset = float(theta[n_kernel + 1])

    # -- the full-data objective ------------------------------------------------------------
    def full_data_problem(self, options, learn_likelihood, X=None, warm=True):
        """The sparse EP problem on all n training points with the active inputs as inducing inputs.

        Its evidence (EP-FITC, :mod:`fastep.sparse`) is the full-data objective of Algorithm 2;
        its sites live on the n training points, so those of the previous round (Z = the
        previous active inputs) are its warm start (``warm``). ``options`` are the sparse
        engine's; ``X``: the training inputs when the problem no longer holds them.
        """
        from .._sparse.problem import _BinarySparseEP
        X = self.X if X is None else X
        Z = np.ascontiguousarray(X[self.active])
        diag = self.kernel._diag(Z)
        options = options.replace(jitter=_FULL_DATA_JITTER * float(np.mean(diag)))
        sparse = _BinarySparseEP(self.kernel, self.likelihood, Z, X, self.y - self.offset, options,
                                 learn_likelihood, False)
        if warm and self.full_data_sites is not None:
            sparse.restore_sites(self.full_data_sites)
        return sparse

    def learn_full_data(self, ivm_options, learn_likelihood):
        """Maximise the full-data objective (plus the log hyperprior) over the kernel and, with
        ``learn_likelihood``, the likelihood parameters, Z fixed at the active inputs; returns
        the sparse problem at the result (its ``log_ml`` the evidence there). ``ivm_options``:
        the fit's :class:`~fastep._gp.fit_options.IVMFitOptions`."""
        options, hyperprior = ivm_options.full_data, ivm_options.hyperprior
        sparse = self.full_data_problem(options, learn_likelihood)
        sparse.estimator_name = ivm_options.estimator_name
        sparse.latent_scale = ivm_options.latent_scale
        # the hyperprior stays centred at the start of Algorithm 2; each round's search starts
        # where the previous one ended
        start_kernel, start_likelihood = self.prior_centre
        self.hyperparameters = Hyperparameters(start_kernel, start_likelihood, learn_likelihood,
                                               hyperprior=hyperprior)
        hyper, space = self.hyperparameters, self.hyperparameters.space
        space.start_at(hyper.pack(self.kernel, self.likelihood))
        sparse.search_tol = _FULL_DATA_SEARCH_TOL
        sparse.hyperparameters = hyper
        sparse.fit(optimizer="L-BFGS-B", n_restarts=0, seed=self.seed,
                   warm_start=True, max_sweeps=options.max_sweeps, tol=options.tol)
        #: the largest move of this round in the search's (log) coordinates
        end = space.to_search(hyper.pack(sparse.kernel, sparse.likelihood))
        self.last_step = float(np.max(np.abs(end - space.u_start), initial=0.0))
        self.kernel, self.likelihood = sparse.kernel, sparse.likelihood
        self.full_data_sites = sparse.sites()
        return sparse

    def minibatch_options(self, options):
        """The options of minibatch learning of the full-data objective at the current active set
        (the sparse estimators' minibatch defaults, :mod:`fastep._sparse.stochastic`)."""
        Z = np.ascontiguousarray(self.X[self.active])
        jitter = _FULL_DATA_JITTER * float(np.mean(self.kernel._diag(Z)))
        window, site_window = minibatch_windows(self.X.shape[0], Z.shape[0])
        return Z, options.replace(jitter=jitter, sites="tied", window=window, site_window=site_window,
                                  patience=MINIBATCH_PATIENCE)

    def learn_minibatch(self, ivm_options, learn_likelihood, learn=True):
        """The full-data objective learnt from minibatches (stochastic EP with Adam steps on the
        evidence gradient, :func:`fastep._sparse.stochastic.fit_minibatch`), Z fixed at the
        active inputs; ``learn=False``: the sites only, at the current parameters. Returns the
        :class:`~fastep._sparse.stochastic.MinibatchSparseFit` (its ``log_ml`` the estimated
        evidence). ``ivm_options``: the fit's :class:`~fastep._gp.fit_options.IVMFitOptions`."""
        from .._sparse import stochastic
        options, hyperprior = ivm_options.full_data, ivm_options.hyperprior
        start_kernel, start_likelihood = self.prior_centre
        self.hyperparameters = Hyperparameters(start_kernel, start_likelihood, learn_likelihood,
                                               hyperprior=hyperprior)
        hyper, space = self.hyperparameters, self.hyperparameters.space
        u_start = space.to_search(hyper.pack(self.kernel, self.likelihood))
        Z, mb_options = self.minibatch_options(options)
        # learn=False: the sites at fixed parameters, for the evidence: a few site windows of plain
        # updates from zero sites, then the polish pass, without the stopping rule's windows
        fitted = stochastic.fit_minibatch(self.kernel, self.likelihood, Z,
                                          stochastic.RowSource(self.X, self.y - self.offset), mb_options, hyper,
                                          learn=learn, settle=not learn)
        end = space.to_search(hyper.pack(fitted.kernel, fitted.likelihood))
        self.last_step = float(np.max(np.abs(end - u_start), initial=0.0))
        self.kernel, self.likelihood = fitted.kernel, fitted.likelihood
        self.full_data_sites = None
        if learn:
            self.round_loss = _settled_loss(fitted.history, mb_options.patience)
        return fitted

    def full_data_evidence(self, options):
        """The full-data objective at the current kernel, likelihood and active set (one EP run,
        warm from the last round's sites); sets ``log_evidence``."""
        sparse = self.full_data_problem(options, False)
        self.log_evidence = sparse.evaluate((self.kernel, self.likelihood, None), gradient=False, warm=True)[0]
        self.full_data_sites = sparse.sites()
        return self.log_evidence

    def full_data_evidence_at(self, X, theta, eval_gradient, options):
        """The full-data objective (and its gradient) at ``theta`` in the coordinates of
        ``hyperparameters``, the fitted active set fixed, EP from zero sites; K_mm's jitter is
        that of the fitted kernel. ``X``: the training inputs (a finalized problem drops them)."""
        hyper = self.hyperparameters
        theta = hyper.check(theta)
        sparse = self.full_data_problem(options, hyper.learn_likelihood, X=X, warm=False)
        value, grad, _ = sparse.evaluate(hyper.unpack(theta), gradient=eval_gradient, warm=False)
        return (value, grad) if eval_gradient else value

    def log_likelihood(self):
        K_I = self.kernel._K(self.X[self.active], None)
        return _active_log_likelihood(K_I, self.site_mean, self.site_precision)[0]

    def noise_objective(self, theta, learn_offset):
        """eq 34, ``Σ_n log Z_n`` with the current marginals held fixed, and its gradient.

        ``theta`` = the likelihood's unconstrained parameters, then (if ``learn_offset``) the
        offset. The marginal of an inactive point is its posterior ``N(μ_n, ς_n)``; that of
        an active point its cavity (its own site removed, ``1/ς\\n = 1/ς_n - β_n``,
        ``μ\\n = ς\\n (μ_n/ς_n - β_n m_n)``), see ``cavity_marginals``.
        """
        n_lik = theta.shape[0] - (1 if learn_offset else 0)
        lik = self.likelihood.with_theta(theta[:n_lik])
        offset = float(theta[n_lik]) if learn_offset else self.offset
        if self.marginals is None:
            self.marginals = self.cavity_marginals()
        mean, var = self.marginals
        targets = self.y - offset
        log_z, alpha, _ = lik.moments(targets, mean, var)
        grad = list(lik.theta_gradient(targets, mean, var))
        if learn_offset:
            grad.append(float(np.sum(alpha)))
        return float(np.sum(log_z)), np.array(grad)

    def cavity_marginals(self):
        """Posterior marginals of the inactive points, cavity marginals of the active ones (eq 34)."""
        mean = np.array(self.state.post_mean)
        var = np.array(self.state.post_var)
        idx = self.active
        v, b = var[idx], self.site_precision
        cav_var = v / (1.0 - v * b)                     # = 1/(1/ς - β), without forming 1/ς
        mean[idx] = cav_var * (mean[idx] / v - b * self.site_mean)
        var[idx] = cav_var
        return mean, var

    # -- prediction -----------------------------------------------------------------------------
    def finalize(self):
        """Keep the prediction state (active inputs, L, w, eq 32) and drop the engine state."""
        X_active = self.X[self.active]
        K_I = self.kernel._K(X_active, None)
        self.log_lik, _, chol, weights = _active_log_likelihood(K_I, self.site_mean, self.site_precision)
        self.predictor = DensePredictor(self.kernel, X_active, weights, chol, np.sqrt(self.site_precision))
        self.state = None
        self.product_cache = None
        self.X = None

    def latent(self, X):
        return self.predictor.latent(X)


def fit_problem(estimator, problem, options, learn_noise, learn_offset, label=""):
    """Algorithm 2 on one problem for ``estimator``; returns the finalized problem and its history.

    ``options`` are the estimator's (``_IVMBase._options``); each objective is maximised by
    ``estimator._maximize``. ``learn_noise``: learn the likelihood parameters too (with the
    kernel for the full-data objective, by eq 34 for the active-set one), ``learn_offset``:
    the offset as well (eq 34). ``label`` names the problem in progress reports and warnings.
    """
    classifier = isinstance(estimator, GPClassifierMixin)
    history = []
    t0 = time.perf_counter()
    prefix = f"[{label}] " if label else ""
    kernel_at_start = copy.deepcopy(problem.kernel)
    last_good = (0, kernel_at_start, problem.likelihood, problem.offset)
    if problem.product_cache is None and options.n_iterations > 0:    # Algorithm 2 reselects
        problem.product_cache = ColumnProductCache(problem.X, max_columns=2 * problem.d)

    progress = options.progress
    sweeps = progress.sweep_callback()          # the refinement's EP sweeps (None: nobody listens)

    def report(iteration, stage):
        """Record a stage of Algorithm 2; False if the callback asks to stop."""
        ll = problem.log_likelihood()
        entry = HistoryRecord(iteration=iteration, stage=stage, log_likelihood=ll,
                              n_active=int(problem.active.shape[0]), elapsed=time.perf_counter() - t0)
        if stage == "full data":
            entry["log_marginal_likelihood"] = problem.log_evidence
        history.append(entry)
        return progress.report(f"{prefix}Algorithm 2 {stage}", iteration, ll)

    def search(objective, theta0, bounds, name, trust_radius=None):
        """Maximise one Algorithm 2 objective; each evaluation is reported (level 2), and a
        stop request ends the search at its best point so far."""
        best = {"value": -np.inf, "theta": np.array(theta0, dtype=float), "count": 0}

        def reported(theta):
            value, grad = objective(theta)
            best["count"] += 1
            if value > best["value"]:
                best["value"], best["theta"] = value, np.array(theta, copy=True)
            if not progress.report(f"{prefix}{name}", best["count"], value, level=2):
                raise StopRequested
            return value, grad
        if progress.stopped:
            return best["theta"]
        try:
            return estimator._maximize(reported, theta0, bounds, options, trust_radius=trust_radius)[0]
        except StopRequested:
            return best["theta"]

    full_data = options.kernel_objective == "full_data"
    minibatch = full_data and options.minibatch
    previous_round = None          # minibatch rounds: (settled loss and SE, kernel, likelihood, last_good)
    for iteration in range(1, options.n_iterations + 1):
        if progress.stopped:
            break
        problem.select(sweeps)
        if full_data:
            problem.state = None                # the O(d n) selection state is rebuilt by the next selection
            if minibatch:
                sparse = problem.learn_minibatch(options, learn_noise or problem.joint_noise)
            else:
                sparse = problem.learn_full_data(options, learn_noise or problem.joint_noise)
            problem.log_evidence = sparse.log_ml
            if not report(iteration, "full data"):
                break
            if not _ignores_inputs(classifier, problem.kernel, problem.X):
                last_good = (iteration, problem.kernel, problem.likelihood, problem.offset)
            if problem.last_step < (_MINIBATCH_ROUND_TOL if minibatch else _ROUND_TOL):
                break                           # the next selection and search would repeat this round
            if minibatch:
                if previous_round is not None and not _round_improved(previous_round[0], problem.round_loss):
                    if problem.round_loss[0] > previous_round[0][0]:
                        # the better round's model (and the last good one, if that round's was)
                        problem.kernel, problem.likelihood = previous_round[1:3]
                        last_good = previous_round[3] if previous_round[3] is not None else last_good
                    break
                previous_round = (problem.round_loss, problem.kernel, problem.likelihood,
                                  last_good if last_good[0] == iteration else None)
            continue
        theta0, bounds = problem.kernel_theta()
        if theta0.size:
            def kernel_obj(theta):
                try:
                    return problem.kernel_objective(theta)
                except (np.linalg.LinAlgError, ValueError):
                    return -np.inf, np.zeros_like(theta)
            theta = search(kernel_obj, theta0, bounds, "eq 32")
            problem.set_kernel_theta(theta)
        if not report(iteration, "kernel"):
            break
        if learn_noise:
            problem.select(sweeps)
            lik_theta, lik_bounds = problem.likelihood.theta, problem.likelihood.theta_bounds
            theta0, bounds = lik_theta, lik_bounds
            if learn_offset:
                theta0 = np.append(theta0, problem.offset)
                bounds = np.vstack([bounds, [[-np.inf, np.inf]]])
            if theta0.size:
                def noise_obj(theta):
                    try:
                        return problem.noise_objective(theta, learn_offset)
                    except ValueError:
                        return -np.inf, np.zeros_like(theta)
                theta = search(noise_obj, theta0, bounds, "eq 34", trust_radius=_NOISE_TRUST_RADIUS)
                n_lik = lik_theta.shape[0]
                problem.likelihood = problem.likelihood.with_theta(theta[:n_lik])
                if learn_offset:
                    problem.offset = float(theta[n_lik])
            if not report(iteration, "noise"):
                break
        if not _ignores_inputs(classifier, problem.kernel, problem.X):
            last_good = (iteration, problem.kernel, problem.likelihood, problem.offset)
    if (options.n_iterations > 0 and _ignores_inputs(classifier, problem.kernel, problem.X)
            and not _ignores_inputs(classifier, kernel_at_start, problem.X)):
        learnt = problem.kernel
        rounds, problem.kernel, problem.likelihood, problem.offset = last_good
        warnings.warn(
            f"{type(estimator).__name__}{' ' + prefix.strip() if prefix else ''}: Algorithm 2 (eq 32) ended on "
            f"{learnt!r}, under which the latent function is ≈ constant across the training inputs (the active "
            f"set's approximate evidence can favour a model that ignores the inputs); kept {problem.kernel!r}, the "
            f"kernel after round {rounds} of {options.n_iterations} (0: the start). A larger "
            "active_set_size, or the dense GaussianProcessClassifier, learns the kernel from more of the data.",
            ConvergenceWarning, stacklevel=4)
    problem.select(sweeps)
    problem.log_evidence = None
    if full_data and options.n_iterations > 0:
        if minibatch:
            # the sites at the final active set and parameters, from minibatches, and their evidence
            problem.log_evidence = problem.learn_minibatch(options, learn_noise or problem.joint_noise,
                                                           learn=False).log_ml
        else:
            problem.full_data_evidence(options.full_data)
    elif problem.hyperparameters is None:
        problem.hyperparameters = Hyperparameters(problem.kernel, problem.likelihood, False)
    for message in problem.refinement_warnings():
        warnings.warn(f"{prefix}{message}", ConvergenceWarning, stacklevel=4)
    if options.n_iterations > 0:
        warn_if_kernel_stuck(kernel_at_start, problem.kernel, problem.X,
                             latent_scale=1.0 if classifier else None,
                             what=f"{type(estimator).__name__}{' ' + prefix.strip() if prefix else ''}", stacklevel=3)
    problem.finalize()
    progress.report(f"{prefix}done", problem.active.shape[0], problem.log_lik)
    return problem, history

def _settled_loss(history, patience):
    """``(mean, standard error)`` of the running leave-one-out log loss over the last ``patience``
    windows of a minibatch round (the level the round's stopping rule settled at)."""
    last = history[-patience:]
    if not last:
        return np.inf, 0.0
    return (float(np.mean([h[1] for h in last])),
            float(np.sqrt(sum(h[2] ** 2 for h in last)) / len(last)))


def _round_improved(before, after):
    """Whether a minibatch round of Algorithm 2 lowered the settled running log loss of the round
    before it (``(mean, SE)`` pairs of :func:`_settled_loss`) by more than the standard error of the
    difference: if not, the next selection and round are not expected to gain either."""
    return before[0] - after[0] > np.hypot(before[1], after[1])


def _ignores_inputs(classifier, kernel, X):
    """Whether, for a classifier, the latent function under ``kernel`` is ≈ constant on the
    likelihood's scale (``'vanishing'`` in :func:`fastep._search.checks.kernel_structure`).
    A short length-scale (``'diagonal'`` there) is not counted: near neighbours still interact."""
    return classifier and kernel_structure(kernel, X, latent_scale=1.0) == "vanishing"
