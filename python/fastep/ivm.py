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
   stopping rule are those of the dense and sparse GP estimators (:mod:`fastep._learning`),
   and each round's EP starts from the previous round's sites (they live on the n training
   points, not on Z). This is the EP approximation of the marginal likelihood that Seeger's
   notes point to for model selection: every training point, not only the active ones,
   judges the kernel. With d = n it is the dense EP evidence (up to K_mm's jitter, 1e-6 of
   the mean prior variance of the active points). The regressor's bias stays at its start
   (the mean of y, or ``bias``).

   ``'active_set'``: the paper's objective, the approximate likelihood of the active set,

       log N(m_I; 0, K_I + B_I⁻¹)                                            (eq 32)

   over the kernel parameters with L-BFGS-B, I, m and β held fixed. With
   ``C = K_I + B_I⁻¹``, ``w = C⁻¹ m_I`` its gradient is
   ``½ wᵀ (∂K_I/∂θ) w - ½ tr(C⁻¹ ∂K_I/∂θ)`` (exact, from
   ``kernel.gradient_iter``); ``C⁻¹ = B^½ A⁻¹ B^½`` with
   ``A = I + B^½ K_I B^½ = L Lᵀ`` (eigenvalues >= 1, so no jitter is needed).
   If the noise parameters are learnt (classifier, ordinal regressor) it then
   selects again and maximises ``Σ_n log Z_n`` (eq 34), ``Z_n = ∫ p(y_n | f_n) q(f_n) df_n``,
   over the likelihood parameters (:mod:`fastep._likelihood_params`) with the
   marginals q held fixed: the posterior marginal ``N(μ_n, ς_n)`` of each inactive
   point and the *cavity* marginal of each active point (its own site removed).
   The paper writes the posterior marginal ``q_d(f_n)`` for every point; for an
   active point that counts its site twice. The regressor's noise variance and
   bias are learnt with the kernel instead (``IVMRegressor``): its spherical sites
   depend on them directly, and eq 32 is then the exact evidence of the active set.
   With L-BFGS-B, eq 34 is maximised in box trust regions
   (:func:`fastep._optimize.maximize_log_likelihood_trust_region`, initial half-width 1
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
(scaled conjugate gradients as in Netlab, :func:`fastep._optimize.maximize_log_likelihood_scg`).
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
import copy
import time
import warnings

import numpy as np
from scipy.linalg import lapack

from . import _validation as v
from ._base import ClassifierMixin, check_is_fitted
from ._epcore import ivm as _engine
from ._epcore import sparse_ep as _sparse_engine
from ._gp_base import (HYPERPRIOR_DOC, N_JOBS_DOC, DensePredictor, GPClassifierMixin, GPEstimator,
                       GPRegressorMixin, Hyperparameters, check_classifier_likelihood, check_kernel,
                       check_optimizer, stack_problems, start_kernel)
from ._learning_checks import kernel_structure, warn_if_kernel_stuck
from .progress import CALLBACK_DOC, StopRequested
from ._linalg import cholesky_lower, matmul
from .batch import map_in_order
from ._likelihood_params import likelihood_theta, likelihood_theta_gradient, likelihood_with_theta
from ._optimize import (maximize_log_likelihood, maximize_log_likelihood_scg,
                        maximize_log_likelihood_trust_region)
from .exceptions import ConvergenceWarning
from .hyperpriors import check_hyperprior
from .kernels import ColumnProductCache
from .likelihoods import Gaussian, Logistic, OrderedCategorical, Probit, Step

__all__ = ["IVMClassifier", "IVMRegressor", "IVMOrdinalRegressor", "select_active_set"]

_LOG_2PI = np.log(2.0 * np.pi)
_KERNEL_OBJECTIVES = ("full_data", "active_set")
#: d when ``active_set_size=None``, at most n_samples (the size of the paper's experiments on real data).
_DEFAULT_ACTIVE_SET_SIZE = 200
#: EP of the full-data objective: the sparse engine's FITC evidence (power 1), every site updated
#: from the same posterior (one n x d product per iteration instead of n rank-1 factor updates),
#: damped by 0.5 (the sparse estimators' parallel default), to the sparse estimators' default tolerance.
_FULL_DATA_EP = {"schedule": _sparse_engine.SPARSE_PARALLEL, "order": _sparse_engine.ORDER_FIXED, "damping": 0.5,
                 "tol": 1e-6, "max_sweeps": 200, "negative_precision": _sparse_engine.NEGATIVE_CLIP,
                 "approximation": "fitc", "power": 1.0, "n_quadrature": 32}
#: EP tolerance of the full-data objective during a round's search (the run at its result uses 1e-6).
_FULL_DATA_SEARCH_TOL = 1e-4
#: Algorithm 2 (full data) stops early after a round that moved no parameter by more than this in the
#: search's coordinates (logs of the positive parameters): the next round would reselect the same
#: active set (the selection depends on the parameters alone) and repeat it.
_ROUND_TOL = 1e-2
#: K_mm's jitter in the full-data objective, relative to the mean prior variance of the active points.
_FULL_DATA_JITTER = 1e-6
# Initial half-width of the L-BFGS-B trust box for the noise parameters (eq 34), in their
# unconstrained coordinates: a bias moves by at most one latent unit and a width, slope or
# noise variance by at most a factor e per trial until the box grows (it doubles whenever
# the optimum lies on its face). Without it L-BFGS-B's first trial was the whole gradient
# of Σ_n log Z_n, O(N) in size (see maximize_log_likelihood_trust_region).
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


class _IVMProblem:
    """One binary, regression or ordinal IVM problem: selection, objectives, prediction state.

    ``offset`` is subtracted from the targets before they reach the site kernel (the
    regressor's bias; 0 otherwise). After ``select`` the attributes ``state`` (the
    engine's :class:`~fastep._epcore.ivm.IVMState`), ``active``, ``site_mean`` and
    ``site_precision`` (active order) describe the selection; ``finalize`` keeps
    only what prediction needs and drops the O(d n) state.
    """

    def __init__(self, X, y, kernel, likelihood, d, criterion, seed, offset=0.0, joint_noise=False,
                 refine=None):
        self.X = X
        self.refine = refine
        self.refinement = None
        self.joint_noise = joint_noise
        self.y = y
        self.kernel = kernel
        self.likelihood = likelihood
        self.d = d
        self.criterion = criterion
        self.seed = seed
        self.offset = float(offset)
        self.state = None
        self.product_cache = None
        self.full_data_sites = None
        self.prior_centre = (kernel, likelihood)
        self.hyperparameters = None
        self.log_evidence = None

    def _columns(self):
        """Kernel column oracle; the parameter-free products ``Xc x̃_j`` of the non-ARD
        Linear/RBF/MLP terms are kept between the selections of Algorithm 2 (which mostly
        reselect the same points under new parameters), at most 2d of them (O(d n) memory,
        like M), dropped by ``finalize``. A problem selected once keeps none
        (``product_cache`` None), so that its memory stays M alone."""
        return self.kernel._unchecked_columns(self.X, self.product_cache)

    # -- Algorithm 1 ---------------------------------------------------------------------
    def select(self):
        cols = self._columns()
        bad = np.flatnonzero(~(cols.diag > 0))
        if bad.size:
            raise ValueError(f"kernel must have a positive diagonal on X; {self.kernel!r} gives "
                             f"k(x_{bad[0]}, x_{bad[0]}) = {cols.diag[bad[0]]!r}")
        self.state = None                       # release the previous M (d x n) before allocating the next
        state = _engine.IVMState(self.y - self.offset, self.likelihood.site_spec(), cols.diag, self.d,
                                 criterion=self.criterion, seed=self.seed)
        state.select(self.d, cols)
        self.refinement = self._refine(state, cols)
        self.state = state
        self.active = state.active
        self.site_mean = np.array(state.site_mean)[self.active]
        self.site_precision = np.array(state.site_precision)[self.active]
        self.marginals = None
        return state

    def _refine(self, state, cols):
        """Refinement on the fixed-size active set after Algorithm 1 (Seeger's notes §2.1, §2.3).

        ``refine_sweeps`` EP deletion-inclusion sweeps (``IVMState.refine``), then exchange
        moves (``IVMState.exchange``), then, if any exchange was made, the EP sweeps again
        (the entering points carry ADF sites). Returns the engine's reports, or None.
        """
        opts = self.refine
        if not opts or (not opts["sweeps"] and opts["exchange"] is None):
            return None
        info = {}
        if opts["sweeps"]:
            info["ep"] = state.refine(cols, opts["sweeps"])
        if opts["exchange"] is not None:
            info["exchange"] = state.exchange(cols, opts["exchange"], tol=opts["exchange_tol"],
                                              max_moves=opts["max_exchanges"], seed=self.seed)
            if opts["sweeps"] and info["exchange"]["n_moves"]:
                info["ep_after_exchange"] = state.refine(cols, opts["sweeps"])
        return info

    def refinement_warnings(self):
        """Messages for a refinement that stopped before convergence (final selection only)."""
        out = []
        info = self.refinement or {}
        for key in ("ep", "ep_after_exchange"):
            ep = info.get(key)
            if ep is not None and not ep["converged"]:
                out.append(f"EP refinement of the active set did not converge in {ep['n_sweeps']} sweep(s) "
                           f"(largest site change {ep['max_change']:.3g}, {ep['n_rejected']} improper "
                           "update(s) rejected); increase refine_sweeps")
        ex = info.get("exchange")
        if ex is not None and not ex["converged"]:
            out.append(f"exchange moves stopped after {ex['n_moves']} move(s) with an exchange still gaining "
                       f"{ex['best_gain']:.3g} nats; increase max_exchanges")
        return out

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
            K_I, dK = kernel._unchecked_value_and_gradient(X_I)         # shared intermediates (one gram per leaf)
        else:
            K_I, dK = kernel._unchecked_call(X_I), np.zeros((d, d, 0))
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
            noise_bounds = likelihood_theta(self.likelihood)[2].copy()
            # eq 32 tends to zero noise when the data are (nearly) noise-free and every point is
            # active; below 1e-6 of the prior variance the Gaussian sites of the next selection
            # are numerically improper (ν ς >= 1), so the noise variance is kept above that
            prior_scale = float(np.max(self.kernel._unchecked_diag(self.X)))
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
        from .sparse import _BinarySparseEP                 # sparse imports the IVM's selection
        X = self.X if X is None else X
        Z = np.ascontiguousarray(X[self.active])
        diag = self.kernel._unchecked_diag(Z)
        options = dict(options, jitter=_FULL_DATA_JITTER * float(np.mean(diag)))
        sparse = _BinarySparseEP(self.kernel, self.likelihood, Z, X, self.y - self.offset, options,
                                 learn_likelihood, False)
        if warm and self.full_data_sites is not None:
            sparse.restore_sites(self.full_data_sites)
        return sparse

    def learn_full_data(self, options, learn_likelihood, hyperprior):
        """Maximise the full-data objective (plus the log hyperprior) over the kernel and, with
        ``learn_likelihood``, the likelihood parameters, Z fixed at the active inputs; returns
        the sparse problem at the result (its ``log_ml`` the evidence there)."""
        sparse = self.full_data_problem(options, learn_likelihood)
        sparse.estimator_name = options["estimator_name"]
        sparse.latent_scale = options["latent_scale"]
        # the hyperprior stays centred at the start of Algorithm 2; each round's search starts
        # where the previous one ended
        start_kernel, start_likelihood = self.prior_centre
        self.hyperparameters = Hyperparameters(start_kernel, start_likelihood, learn_likelihood,
                                               hyperprior=hyperprior)
        hyper, space = self.hyperparameters, self.hyperparameters.space
        space.start_at(hyper.pack(self.kernel, self.likelihood))
        sparse.search_tol = _FULL_DATA_SEARCH_TOL
        sparse.fit(hyper, optimizer="L-BFGS-B", n_restarts=0, seed=self.seed,
                   warm_start=True, max_sweeps=options["max_sweeps"], tol=options["tol"])
        #: the largest move of this round in the search's (log) coordinates
        end = space.to_search(hyper.pack(sparse.kernel, sparse.likelihood))
        self.last_step = float(np.max(np.abs(end - space.u_start), initial=0.0))
        self.kernel, self.likelihood = sparse.kernel, sparse.likelihood
        self.full_data_sites = sparse.sites()
        return sparse

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
        K_I = self.kernel._unchecked_call(self.X[self.active])
        return _active_log_likelihood(K_I, self.site_mean, self.site_precision)[0]

    def noise_objective(self, theta, learn_offset):
        """eq 34, ``Σ_n log Z_n`` with the current marginals held fixed, and its gradient.

        ``theta`` = the likelihood's unconstrained parameters, then (if ``learn_offset``) the
        offset. The marginal of an inactive point is its posterior ``N(μ_n, ς_n)``; that of
        an active point its cavity (its own site removed, ``1/ς\\n = 1/ς_n - β_n``,
        ``μ\\n = ς\\n (μ_n/ς_n - β_n m_n)``), see ``cavity_marginals``.
        """
        n_lik = theta.shape[0] - (1 if learn_offset else 0)
        lik = likelihood_with_theta(self.likelihood, theta[:n_lik])
        offset = float(theta[n_lik]) if learn_offset else self.offset
        if self.marginals is None:
            self.marginals = self.cavity_marginals()
        mean, var = self.marginals
        targets = self.y - offset
        log_z, alpha, _ = lik.moments(targets, mean, var)
        grad = list(likelihood_theta_gradient(lik, targets, mean, var))
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
        K_I = self.kernel._unchecked_call(X_active)
        self.log_lik, _, chol, weights = _active_log_likelihood(K_I, self.site_mean, self.site_precision)
        self.predictor = DensePredictor(self.kernel, X_active, weights, chol, np.sqrt(self.site_precision))
        self.state = None
        self.product_cache = None
        self.X = None

    def latent(self, X):
        return self.predictor.latent(X)


def select_active_set(X, y, kernel, likelihood, d, *, criterion="entropy", seed=0):
    """Active set of Algorithm 1 of the IVM at fixed kernel and likelihood.

    The d points are included greedily, each maximising the score ``criterion`` (the
    entropy reduction of the ADF posterior, eq 26, by default) under sites from
    ``likelihood`` (Lawrence, Seeger & Herbrich 2005, *Fast sparse Gaussian process methods:
    the informative vector machine*, §2, Algorithm 1). O(d² n) time, O(d n) memory.

    Parameters
    ----------
    X : ndarray (n, n_features)
        Validated inputs (float64, finite).
    y : ndarray (n,)
        Targets as the likelihood's site kernel takes them (±1 for binary likelihoods).
    kernel : Kernel
        Must have a positive diagonal on X.
    likelihood : Likelihood
    d : int
        Size of the active set, ``1 <= d <= n``.
    criterion : {'entropy', 'info_gain', 'random'}, default 'entropy'
    seed : int, default 0
        Seed of the random criterion.

    Returns
    -------
    ndarray (d,) of int
        Row indices of X in inclusion order.
    """
    problem = _IVMProblem(X, y, kernel, likelihood, d, _engine.CRITERIA[criterion], seed)
    problem.select()
    return problem.active


class _IVMBase(GPEstimator):
    """Options, Algorithm 2 and fitted-state handling shared by the IVM estimators."""

    def _options(self, n_samples):
        kernel = check_kernel(self.kernel)
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
        max_iter = v.check_int(self.max_optimizer_iter, "max_optimizer_iter", minimum=1)
        progress = self._new_progress()
        seed = v.check_seed(self.random_state)
        refine_sweeps = v.check_int(self.refine_sweeps, "refine_sweeps", minimum=0)
        if self.exchange is not None and (not isinstance(self.exchange, str)
                                          or self.exchange not in ("greedy", "random")):
            raise ValueError(f"exchange must be None, 'greedy' or 'random', got {self.exchange!r}")
        exchange_tol = v.check_in_range(self.exchange_tol, "exchange_tol", 0.0, np.inf, high_inclusive=False)
        max_exchanges = None if self.max_exchanges is None else v.check_int(self.max_exchanges, "max_exchanges",
                                                                            minimum=0)
        refine = {"sweeps": refine_sweeps, "exchange": self.exchange, "exchange_tol": exchange_tol,
                  "max_exchanges": max_exchanges}
        objective = v.check_choice(self.kernel_objective, "kernel_objective", _KERNEL_OBJECTIVES)
        if objective == "full_data" and self.optimizer == "SCG":
            raise ValueError("optimizer='SCG' maximises the active set's eq 32: use it with "
                             "kernel_objective='active_set' (the full-data objective is learnt with 'L-BFGS-B')")
        full_data = dict(_FULL_DATA_EP, seed=seed, progress=progress, estimator_name=type(self).__name__,
                         latent_scale=1.0 if isinstance(self, GPClassifierMixin) else None)
        return {"kernel": kernel, "d": d, "criterion": _engine.CRITERIA[self.criterion], "refine": refine,
                "n_iterations": n_iterations if self.optimizer is not None else 0,
                "max_iter": max_iter, "seed": seed, "progress": progress, "optimizer": self.optimizer,
                "kernel_objective": objective, "full_data": full_data,
                "hyperprior": check_hyperprior(self.hyperprior)}

    def _fit_problem(self, problem, options, learn_noise, learn_offset, label=""):
        """Algorithm 2 on one problem; returns the finalized problem and its history."""
        history = []
        t0 = time.perf_counter()
        prefix = f"[{label}] " if label else ""
        kernel_at_start = copy.deepcopy(problem.kernel)
        last_good = (0, kernel_at_start, problem.likelihood, problem.offset)
        if problem.product_cache is None and options["n_iterations"] > 0:    # Algorithm 2 reselects
            problem.product_cache = ColumnProductCache(problem.X, max_columns=2 * problem.d)

        progress = options["progress"]

        def report(iteration, stage):
            """Record a stage of Algorithm 2; False if the callback asks to stop."""
            ll = problem.log_likelihood()
            entry = {"iteration": iteration, "stage": stage, "log_likelihood": ll,
                     "n_active": int(problem.active.shape[0]), "elapsed": time.perf_counter() - t0}
            if stage == "full data":
                entry["log_evidence"] = problem.log_evidence
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
                return self._maximize(reported, theta0, bounds, options, trust_radius=trust_radius)[0]
            except StopRequested:
                return best["theta"]

        full_data = options["kernel_objective"] == "full_data"
        for iteration in range(1, options["n_iterations"] + 1):
            if progress.stopped:
                break
            problem.select()
            if full_data:
                problem.state = None                # the O(d n) selection state is rebuilt by the next selection
                sparse = problem.learn_full_data(options["full_data"], learn_noise or problem.joint_noise,
                                                 options["hyperprior"])
                problem.log_evidence = sparse.log_ml
                if not report(iteration, "full data"):
                    break
                if not self._ignores_inputs(problem.kernel, problem.X):
                    last_good = (iteration, problem.kernel, problem.likelihood, problem.offset)
                if problem.last_step < _ROUND_TOL:
                    break                           # the next selection and search would repeat this round
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
                problem.select()
                _, lik_theta, lik_bounds = likelihood_theta(problem.likelihood)
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
                    problem.likelihood = likelihood_with_theta(problem.likelihood, theta[:n_lik])
                    if learn_offset:
                        problem.offset = float(theta[n_lik])
                if not report(iteration, "noise"):
                    break
            if not self._ignores_inputs(problem.kernel, problem.X):
                last_good = (iteration, problem.kernel, problem.likelihood, problem.offset)
        if (options["n_iterations"] > 0 and self._ignores_inputs(problem.kernel, problem.X)
                and not self._ignores_inputs(kernel_at_start, problem.X)):
            learnt = problem.kernel
            rounds, problem.kernel, problem.likelihood, problem.offset = last_good
            warnings.warn(
                f"{type(self).__name__}{' ' + prefix.strip() if prefix else ''}: Algorithm 2 (eq 32) ended on "
                f"{learnt!r}, under which the latent function is ≈ constant across the training inputs (the active "
                f"set's approximate evidence can favour a model that ignores the inputs); kept {problem.kernel!r}, the "
                f"kernel after round {rounds} of {options['n_iterations']} (0: the start). A larger "
                "active_set_size, or the dense GaussianProcessClassifier, learns the kernel from more of the data.",
                ConvergenceWarning, stacklevel=4)
        problem.select()
        problem.log_evidence = None
        if full_data and options["n_iterations"] > 0:
            problem.full_data_evidence(options["full_data"])
        elif problem.hyperparameters is None:
            problem.hyperparameters = Hyperparameters(problem.kernel, problem.likelihood, False)
        for message in problem.refinement_warnings():
            warnings.warn(f"{prefix}{message}", ConvergenceWarning, stacklevel=4)
        if options["n_iterations"] > 0:
            warn_if_kernel_stuck(kernel_at_start, problem.kernel, problem.X,
                                 latent_scale=1.0 if isinstance(self, GPClassifierMixin) else None,
                                 what=f"{type(self).__name__}{' ' + prefix.strip() if prefix else ''}", stacklevel=3)
        problem.finalize()
        progress.report(f"{prefix}done", problem.active.shape[0], problem.log_lik)
        return problem, history

    def _ignores_inputs(self, kernel, X):
        """Whether, for a classifier, the latent function under ``kernel`` is ≈ constant on the
        likelihood's scale (``'vanishing'`` in :func:`fastep._learning_checks.kernel_structure`).
        A short length-scale (``'diagonal'`` there) is not counted: near neighbours still interact."""
        return (isinstance(self, GPClassifierMixin)
                and kernel_structure(kernel, X, latent_scale=1.0) == "vanishing")

    @staticmethod
    def _maximize(objective, theta0, bounds, options, trust_radius=None):
        """Maximise eq 32 or eq 34 with the chosen optimiser and budget.

        ``trust_radius`` (used for eq 34) confines L-BFGS-B to box trust regions of that
        initial half-width (:func:`fastep._optimize.maximize_log_likelihood_trust_region`);
        SCG ignores it (its steps are scaled by a curvature estimate and shrink after
        failures already).
        """
        if options.get("optimizer") == "SCG":
            return maximize_log_likelihood_scg(objective, theta0, bounds, maxiter=options["max_iter"])
        if trust_radius is not None:
            return maximize_log_likelihood_trust_region(objective, theta0, bounds, radius=trust_radius,
                                                        maxiter=options["max_iter"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return maximize_log_likelihood(objective, theta0, bounds, maxiter=options["max_iter"])

    def log_marginal_likelihood(self, theta=None, eval_gradient=False):
        """The full-data objective: the EP evidence of the sparse model on all training points
        with the fitted active inputs as inducing inputs (EP-FITC), at ``theta``.

        Parameters
        ----------
        theta : array-like or None, default None
            The kernel's unconstrained parameters (``kernel_.theta``), followed by those of the
            likelihood when they were learnt with it (``learn_likelihood``, or log σ² for the
            regressor with ``learn_noise``). None returns ``log_marginal_likelihood_value_``.
            One-vs-rest: the same ``theta`` for every class, summed over the classes.
        eval_gradient : bool, default False
            Also return the gradient with respect to ``theta`` (exact at the EP fixed point).

        Returns
        -------
        float, or (float, ndarray) with ``eval_gradient``
            EP runs from zero sites at ``theta``, with the fitted active set as Z and K_mm's
            jitter at its fitted value; the fitted state is left unchanged.
        """
        check_is_fitted(self, "_problems")
        if theta is None:
            if eval_gradient:
                raise ValueError("eval_gradient=True requires theta")
            if self.log_marginal_likelihood_value_ is None:
                raise ValueError("no full-data objective was computed in fit (kernel_objective='active_set' "
                                 "or no learning); pass theta, e.g. kernel_.theta")
            return self.log_marginal_likelihood_value_
        options = dict(_FULL_DATA_EP, seed=0, progress=None)
        values = [p.full_data_evidence_at(self.X_train_, theta, eval_gradient, options) for p in self._problems]
        if eval_gradient:
            return float(sum(val for val, _ in values)), np.sum([g for _, g in values], axis=0)
        return float(sum(values))

    def _set_common(self, X, problems, histories):
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
        self.refinement_ = problems[0].refinement if binary else [p.refinement for p in problems]


_COMMON_DOC = f"""
    active_set_size : int or None, default None
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
    kernel_objective : {{'full_data', 'active_set'}}, default 'full_data'
        What Algorithm 2 maximises after each selection. ``'full_data'``: the EP evidence of
        the sparse GP on all training points with the active inputs as inducing inputs
        (EP-FITC, O(n d²) per EP sweep), plus the log hyperprior, over the kernel parameters
        and the learnt likelihood parameters together (module notes). ``'active_set'``: the
        paper's eq 32, the approximate likelihood of the d active points alone, then eq 34
        for the likelihood parameters (the paper's protocol; also the only objective
        ``optimizer='SCG'`` maximises).
    {HYPERPRIOR_DOC}
        Used by ``kernel_objective='full_data'``.
    max_optimizer_iter : int, default 100
        L-BFGS-B (or SCG) iterations per optimisation of eq 32 or eq 34
        (``kernel_objective='active_set'``).
    random_state : int or None
        Seed of the random criterion and of the random exchange search.
    {CALLBACK_DOC}
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
        selection warns with ``ConvergenceWarning``.
"""

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
        objective log_evidence (its evidence at the end of that round).
    refinement_ : dict or None (a list one-vs-rest)
        Reports of the refinement after the final selection (keys 'ep', 'exchange',
        'ep_after_exchange' as run); None without refinement.
    X_train_ : ndarray (n_samples, n_features)
        The training inputs.
    n_features_in_ : int
        Number of features seen in ``fit``."""

_REFERENCES = """Lawrence, N. D., Seeger, M. and Herbrich, R. *The Informative Vector Machine: a
    practical probabilistic alternative to the support vector machine*: Algorithm 1
    (eqs 14-30), Algorithm 2 (eqs 32, 34), the ordered categorical noise model (§2.4).
    Seeger, M. *Notes on Minka's Expectation Propagation for Gaussian process
    classification*: refinement and exchange moves (§2.1-2.3), prediction (§2.2)."""


class IVMClassifier(GPClassifierMixin, _IVMBase):
    __doc__ = f"""Informative Vector Machine classifier: a sparse GP classifier by greedy active-set selection.

    d training points are included greedily, each the one whose inclusion most reduces the
    entropy of the ADF posterior (Algorithm 1, O(d² n) time, O(d n) memory, the n×n kernel
    matrix is never formed), and the kernel (and optionally likelihood) parameters are
    learnt by Algorithm 2. More than two classes are handled one-vs-rest (one binary IVM
    per class, each with its own kernel and active set); ``predict`` takes the class with
    the largest latent mean plus probit bias (the paper's rule, §4.2) and ``predict_proba``
    normalises the binary probabilities. Prediction costs d kernel evaluations per point.

    Parameters
    ----------
    kernel : fastep.kernels.Kernel or None, default None
        Prior covariance; its parameters are the starting point of Algorithm 2. None starts from
        ``RBF(1, γ)``, γ = 1 / (median squared distance between the training inputs, over a seeded
        sample of at most 1000 rows), so that inputs of any scale give a kernel whose evidence can
        be learnt; a kernel given here is the start as it is.
        When the ranges of the input columns differ by more than a factor of 100 (mixed units),
        the RBF of that start becomes ``RBFARD`` with fixed scales 1/range² per column and γ
        from the range-scaled inputs, so that raw and standardised columns give the same model. If Algorithm 2 ends on a kernel
        under which the latent function is ≈ constant across the training inputs (the active
        set's eq 32 can prefer such a model), the kernel of its last round that was not is kept,
        with a ``ConvergenceWarning``.
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
    {N_JOBS_DOC}
    {_COMMON_DOC.strip()}

    Attributes
    ----------
    classes_ : ndarray (n_classes,)
        Sorted class labels; ``classes_[1]`` is the positive class of a binary problem.
    kernel_, likelihood_ : Kernel, Likelihood (lists, one per class, one-vs-rest)
        The fitted kernel and likelihood.
    {_COMMON_ATTRIBUTES}

    See Also
    --------
    SparseGPClassifier : EP with learnt inducing inputs.
    GaussianProcessClassifier : dense EP on all the data.

    References
    ----------
    {_REFERENCES}

    Examples
    --------
    >>> import numpy as np
    >>> from fastep import IVMClassifier
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 2))
    >>> y = np.where(X[:, 0] - X[:, 1] > 0, "a", "b")
    >>> clf = IVMClassifier(active_set_size=30, n_iterations=2).fit(X, y)
    >>> clf.active_set_.shape
    (30,)
    >>> clf.predict([[2.0, -2.0], [-2.0, 2.0]]).tolist()
    ['a', 'b']
    """

    def __init__(self, kernel=None, likelihood=None, *, active_set_size=None, criterion="entropy",
                 optimizer="L-BFGS-B", n_iterations=4, learn_likelihood=False, max_optimizer_iter=100,
                 random_state=None, verbose=0, refine_sweeps=0, exchange=None, exchange_tol=1e-6,
                 max_exchanges=None, n_jobs=None, kernel_objective="full_data", hyperprior="auto", callback=None):
        self.kernel_objective = kernel_objective
        self.hyperprior = hyperprior
        self.callback = callback
        self.n_jobs = n_jobs
        self.refine_sweeps = refine_sweeps
        self.exchange = exchange
        self.exchange_tol = exchange_tol
        self.max_exchanges = max_exchanges
        self.kernel = kernel
        self.likelihood = likelihood
        self.active_set_size = active_set_size
        self.criterion = criterion
        self.optimizer = optimizer
        self.n_iterations = n_iterations
        self.learn_likelihood = learn_likelihood
        self.max_optimizer_iter = max_optimizer_iter
        self.random_state = random_state
        self.verbose = verbose

    def fit(self, X, y):
        """Select the active set(s) and learn the parameters (Algorithm 2); returns self."""
        X, y = v.check_X_y(X, y)
        options = self._options(X.shape[0])
        kernel = options["kernel"] = start_kernel(options["kernel"], X)
        kernel._validate_X(X, "X")
        lik, learn_likelihood = check_classifier_likelihood(self.likelihood, self.learn_likelihood,
                                                            (Probit, Logistic, Step))
        classes, targets = v.encode_one_vs_rest_labels(y)

        def fit_class(c):
            problem = _IVMProblem(X, targets[c], copy.deepcopy(kernel), lik, options["d"], options["criterion"],
                                  options["seed"], refine=options["refine"])
            label = "" if len(targets) == 1 else f"class {classes[c]!r}"
            return self._fit_problem(problem, options, learn_likelihood, False, label)

        fitted = map_in_order(fit_class, range(len(targets)), self.n_jobs)
        problems, histories = [p for p, _ in fitted], [h for _, h in fitted]
        self.classes_ = classes
        self._warn_if_stopped(options['progress'])
        self._set_common(X, problems, histories)
        return self

    def decision_function(self, X):
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

    def _multiclass_scores(self, X):
        # The class with the largest μ* + b wins, as in the authors' USPS experiment (their
        # toolbox adds noise.bias to the posterior mean before taking the maximum). b is each
        # binary problem's probit bias: the latent mean shifted by it is the value each binary
        # classifier thresholds at 0.
        return self.decision_function(X)


class IVMRegressor(GPRegressorMixin, _IVMBase):
    __doc__ = f"""Informative Vector Machine regression: Gaussian noise as the spherical site model.

    ``y = f(x) + bias + ε`` with ``ε ~ N(0, noise_variance)``; every active point carries the
    site ``m = y - bias``, ``β = 1/noise_variance`` (§2.2), so the selection is exact GP
    regression on the active set, chosen greedily by Algorithm 1.

    Parameters
    ----------
    kernel : fastep.kernels.Kernel or None, default None
        Prior covariance; its parameters are the starting point of Algorithm 2. None starts from
        ``RBF(var(y), γ)``, γ = 1 / (median squared distance between the training inputs, over a
        seeded sample of at most 1000 rows); a kernel given here is the start as it is.
        When the ranges of the input columns differ by more than a factor of 100 (mixed units),
        the RBF of that start becomes ``RBFARD`` with fixed scales 1/range² per column and γ
        from the range-scaled inputs, so that raw and standardised columns give the same model.
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
    {_COMMON_DOC.strip()}

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
    {_COMMON_ATTRIBUTES}

    References
    ----------
    {_REFERENCES}

    Examples
    --------
    >>> import numpy as np
    >>> from fastep import IVMRegressor
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(-3, 3, size=(400, 1))
    >>> y = 2.0 + np.sin(X[:, 0]) + 0.1 * rng.normal(size=400)
    >>> reg = IVMRegressor(active_set_size=40).fit(X, y)
    >>> bool(abs(reg.predict([[0.5]])[0] - (2.0 + np.sin(0.5))) < 0.2)
    True
    """

    def __init__(self, kernel=None, noise_variance=None, *, bias=None, learn_noise=True, active_set_size=None,
                 criterion="entropy", optimizer="L-BFGS-B", n_iterations=4, max_optimizer_iter=100,
                 random_state=None, verbose=0, refine_sweeps=0, exchange=None, exchange_tol=1e-6,
                 max_exchanges=None, kernel_objective="full_data", hyperprior="auto", callback=None):
        self.kernel_objective = kernel_objective
        self.hyperprior = hyperprior
        self.callback = callback
        self.refine_sweeps = refine_sweeps
        self.exchange = exchange
        self.exchange_tol = exchange_tol
        self.max_exchanges = max_exchanges
        self.kernel = kernel
        self.noise_variance = noise_variance
        self.bias = bias
        self.learn_noise = learn_noise
        self.active_set_size = active_set_size
        self.criterion = criterion
        self.optimizer = optimizer
        self.n_iterations = n_iterations
        self.max_optimizer_iter = max_optimizer_iter
        self.random_state = random_state
        self.verbose = verbose

    def fit(self, X, y):
        """Select the active set and learn the parameters (Algorithm 2); returns self."""
        lik, learn_noise, X, y, kernel = self._check_regression_inputs(X, y, check_kernel(self.kernel), bias=False)
        options = self._options(X.shape[0])
        options["kernel"] = kernel
        bias = float(np.mean(y)) if self.bias is None else v.check_in_range(self.bias, "bias", -np.inf, np.inf,
                                                                             low_inclusive=False,
                                                                             high_inclusive=False)
        problem = _IVMProblem(X, y, copy.deepcopy(options["kernel"]), lik, options["d"], options["criterion"],
                              options["seed"], offset=bias, joint_noise=learn_noise,
                              refine=options["refine"])
        problem, history = self._fit_problem(problem, options, False, False)
        self._warn_if_stopped(options['progress'])
        self._set_common(X, [problem], [history])
        self.noise_variance_ = float(problem.likelihood.noise_variance)
        self.bias_ = problem.offset
        return self

    def _output_offset(self):
        return self.bias_


class IVMOrdinalRegressor(ClassifierMixin, _IVMBase):
    __doc__ = f"""Informative Vector Machine for ordered categories (§2.4, eqs 24-25).

    The sorted distinct labels are the categories 0..C-1; the likelihood is
    ``OrderedCategorical(C)`` with thresholds ``b, b + w_1, b + w_1 + w_2, ...``: a label is
    the interval of the thresholds in which the noisy latent value falls.

    Parameters
    ----------
    kernel : fastep.kernels.Kernel or None, default None
        Prior covariance; its parameters are the starting point of Algorithm 2. None starts from
        ``RBF(1, γ)``, γ = 1 / (median squared distance between the training inputs, over a seeded
        sample of at most 1000 rows), so that inputs of any scale give a kernel whose evidence can
        be learnt; a kernel given here is the start as it is.
        When the ranges of the input columns differ by more than a factor of 100 (mixed units),
        the RBF of that start becomes ``RBFARD`` with fixed scales 1/range² per column and γ
        from the range-scaled inputs, so that raw and standardised columns give the same model.
    likelihood : OrderedCategorical or None, default None
        Starting likelihood (its ``n_categories`` must equal the number of distinct labels);
        None: slope 1, with the thresholds spread over C categories of unit width centred at 0.
    learn_likelihood : bool, default True
        Optimise the bias and widths by eq 34 (the slope stays fixed), in the coordinates
        ``(b, log w_1, ..., log w_(C-2))``. With the marginals held fixed eq 34 is concave in
        ``(b, w)`` and, because every category has a training point, has a finite maximiser.
    {_COMMON_DOC.strip()}

    Attributes
    ----------
    classes_ : ndarray (C,)
        The ordered categories (sorted distinct labels).
    kernel_ : Kernel
        The fitted kernel.
    likelihood_ : OrderedCategorical
        The fitted likelihood (thresholds).
    {_COMMON_ATTRIBUTES}

    References
    ----------
    {_REFERENCES}

    Examples
    --------
    >>> import numpy as np
    >>> from fastep import IVMOrdinalRegressor
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(-3, 3, size=(300, 1))
    >>> y = np.digitize(X[:, 0] + 0.2 * rng.normal(size=300), [-1.0, 1.0])   # 0, 1, 2
    >>> model = IVMOrdinalRegressor(active_set_size=30, n_iterations=2).fit(X, y)
    >>> model.predict([[-2.5], [0.0], [2.5]]).tolist()
    [0, 1, 2]
    >>> model.predict_proba([[0.0]]).shape
    (1, 3)
    """

    def __init__(self, kernel=None, likelihood=None, *, learn_likelihood=True, active_set_size=None,
                 criterion="entropy", optimizer="L-BFGS-B", n_iterations=4, max_optimizer_iter=100,
                 random_state=None, verbose=0, refine_sweeps=0, exchange=None, exchange_tol=1e-6,
                 max_exchanges=None, kernel_objective="full_data", hyperprior="auto", callback=None):
        self.kernel_objective = kernel_objective
        self.hyperprior = hyperprior
        self.callback = callback
        self.refine_sweeps = refine_sweeps
        self.exchange = exchange
        self.exchange_tol = exchange_tol
        self.max_exchanges = max_exchanges
        self.kernel = kernel
        self.likelihood = likelihood
        self.learn_likelihood = learn_likelihood
        self.active_set_size = active_set_size
        self.criterion = criterion
        self.optimizer = optimizer
        self.n_iterations = n_iterations
        self.max_optimizer_iter = max_optimizer_iter
        self.random_state = random_state
        self.verbose = verbose

    def fit(self, X, y):
        """Select the active set and learn the parameters (Algorithm 2); returns self."""
        X, y = v.check_X_y(X, y)
        options = self._options(X.shape[0])
        options["kernel"] = start_kernel(options["kernel"], X)
        options["kernel"]._validate_X(X, "X")
        v.check_class_labels(y)
        try:
            classes, inverse = np.unique(y, return_inverse=True)
        except TypeError as exc:
            raise TypeError(f"y labels must be mutually comparable: {exc}") from None
        n_categories = classes.shape[0]
        if n_categories < 2:
            raise ValueError(f"y must contain at least two ordered categories (classes); got only one class: "
                             f"{classes.tolist()}")
        if self.likelihood is None:
            lik = OrderedCategorical(n_categories, slope=1.0, bias=-(n_categories - 2) / 2.0)
        else:
            lik = self.likelihood
            if not isinstance(lik, OrderedCategorical):
                raise TypeError(f"likelihood must be a fastep.likelihoods.OrderedCategorical, got {lik!r}")
            if lik.n_categories != n_categories:
                raise ValueError(f"likelihood has n_categories = {lik.n_categories} but y has {n_categories} "
                                 "distinct labels")
        learn_likelihood = v.check_bool(self.learn_likelihood, "learn_likelihood")
        targets = inverse.reshape(-1).astype(float)
        problem = _IVMProblem(X, targets, copy.deepcopy(options["kernel"]), lik, options["d"],
                              options["criterion"], options["seed"], refine=options["refine"])
        problem, history = self._fit_problem(problem, options, learn_likelihood, False)
        self.classes_ = classes
        self._warn_if_stopped(options['progress'])
        self._set_common(X, [problem], [history])
        return self

    def predict_proba(self, X):
        """Category probabilities ``∫ p(y=k | f) N(f; μ*, σ*²) df``, shape (n_samples, C)."""
        mean, var = self.predict_latent(X)
        return self._problems[0].likelihood.predictive(mean, var)

    def predict(self, X):
        """The most probable category."""
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]
