"""Gaussian-process classification and regression by dense kernel-space EP (Minka §2, eqs 77-88).

The compiled engine :mod:`fastep._epcore.gp_ep` runs the EP sweeps on the n×n
kernel matrix; this module validates input, builds the kernel matrix, computes
the evidence gradient at the EP fixed point, learns hyperparameters with
L-BFGS-B and predicts.

Prediction (R&W Alg. 3.6): with ``s = sqrt(site_precision)``,
``B = I + S^½ K S^½ = L Lᵀ`` and ``b = (K + S⁻¹)⁻¹ S⁻¹ ν = ν − s ⊙ B⁻¹(s ⊙ K ν)``,
the latent predictive at ``x*`` is ``N(k*ᵀ b, k** − |L⁻¹(s ⊙ k*)|²)``; class
probabilities integrate the likelihood against it (probit: ``Φ(μ*/sqrt(1 + σ*²))``
for unit slope).

Evidence gradient (at the fixed point only the explicit dependence on K counts):
``∂ log Z/∂θ_j = ½ bᵀ (∂K/∂θ_j) b − ½ tr(R ∂K/∂θ_j)`` with ``R = S^½ B⁻¹ S^½``;
likelihood parameters: ``Σ_i ∂ log Z_i/∂φ`` at the final cavities
(:mod:`fastep._likelihood_params`).

Jitter policy: ``jitter`` (default 0) is added to the diagonal of K. If the
kernel matrix is numerically indefinite, B's Cholesky factorisation fails and
``fit`` raises ``numpy.linalg.LinAlgError`` asking for a larger ``jitter`` (or a
``White`` term in the kernel); nothing is fitted.

Memory: during EP, K, the posterior covariance and one engine work array
(three n×n float64 arrays); the gradient reuses the posterior-covariance buffer
for B's factor and R, plus one ∂K/∂θ_j at a time. A fitted binary model keeps
the n×n Cholesky factor of B for predictive variances.
"""
import warnings

import numpy as np
from scipy.linalg import lapack, solve_triangular

from . import _validation as v
from ._base import BaseEstimator, ClassifierMixin, RegressorMixin, check_is_fitted, one_vs_rest_proba
from ._epcore import gp_ep as _engine
from ._likelihood_params import likelihood_theta, likelihood_theta_gradient, likelihood_with_theta
from ._optimize import maximize_log_likelihood
from ._threading import _get_controller
from .exceptions import ConvergenceWarning
from .kernels import RBF, Kernel
from .likelihoods import Gaussian, Logistic, Probit, Step

__all__ = ["GaussianProcessClassifier", "GaussianProcessRegressor"]

_SCHEDULES = {"sequential": 0, "parallel": 1, "blocked": 2}
_ORDERS = {"fixed": 0, "random": 1, "entropy": 2}
_POLICIES = {"clip": 0, "skip": 1}
_PREDICT_BATCH = 1024
# Sweeps between full refactorisations (the final answer is always refactorised):
# after every sweep for the plain rank-1 path (the cross-check), every 10 sweeps for the
# blocked path, where the O(n³) refactorisation costs about twice a sweep
# (benchmarks/compare_gpc_peers.py; issue 3 closing note).
_DEFAULT_REFACTOR_EVERY = {"sequential": 1, "blocked": 10, "parallel": 1}


def _one_blas_thread():
    """EP sweeps run with one BLAS thread.

    Measured on the 2-core machines (benchmarks/compare_gpc_peers.py, issue 3 note): a
    blocked fit at n = 2000 took 3.3 s with one OpenBLAS thread and 12.8 s with two, and the
    refactorisation alone was also slower threaded whenever anything else ran.
    """
    return _get_controller().limit(limits=1, user_api="blas")


def _cholesky_lower_inplace(A):
    """Cholesky factor of the symmetric C-ordered ``A``, computed in A's memory.

    Returns an F-ordered view ``L`` of the same buffer (lower triangle valid, upper zeroed).
    """
    c, info = lapack.dpotrf(A.T, lower=1, overwrite_a=1, clean=1)
    if info != 0:
        raise np.linalg.LinAlgError(
            "B = I + S^1/2 K S^1/2 is not positive definite: the kernel matrix is not positive "
            "semi-definite (numerically); increase jitter or add a White kernel term")
    return c


def _symmetrize_from_lower(A, block=256):
    """Copy the lower triangle of square ``A`` onto its upper triangle, blockwise (no n×n temporary)."""
    n = A.shape[0]
    for j0 in range(0, n, block):
        j1 = min(j0 + block, n)
        # upper part of columns j0:j1 = rows 0:j1 of the transposed lower part
        blk = A[j0:j1, :j1].T.copy()           # (j1, j1 - j0): A[r, c] for r in j0:j1, c < j1
        mask = np.arange(j1)[:, None] < np.arange(j0, j1)[None, :]
        A[:j1, j0:j1] = np.where(mask, blk, A[:j1, j0:j1])


class _BinaryGPEP:
    """One binary (or regression) GP EP problem: EP runs, evidence, gradient, prediction state."""

    def __init__(self, kernel, likelihood, X, y, options):
        self.kernel = kernel
        self.likelihood = likelihood
        self.X = X
        self.y = y
        self.options = options
        n = X.shape[0]
        self.site_precision = np.zeros(n)
        self.site_natural_mean = np.zeros(n)

    # -- EP --------------------------------------------------------------------------------
    def _kernel_matrix(self, kernel):
        K = np.ascontiguousarray(kernel(self.X), dtype=np.float64)
        if self.options["jitter"]:
            K.flat[:: K.shape[0] + 1] += self.options["jitter"]
        if not np.all(np.isfinite(K)):
            raise ValueError(f"the kernel {kernel!r} produced non-finite values on X")
        if not np.all(K.diagonal() > 0):
            raise np.linalg.LinAlgError(
                "the kernel matrix has a non-positive diagonal entry, so it is not positive "
                "semi-definite; increase jitter or add a White kernel term")
        return K

    def _run(self, K, likelihood, buffer, warm):
        """EP on K; a warm start that fails (improper cavities after a large hyperparameter
        step, or a failed factorisation) is retried once from a cold start."""
        if warm and np.any(self.site_precision):
            try:
                result = self._run_once(K, likelihood, buffer, warm=True)
            except (np.linalg.LinAlgError, FloatingPointError):
                result = None
            if result is not None and result[3]["n_failed"] == 0:
                return result
        return self._run_once(K, likelihood, buffer, warm=False)

    def _run_once(self, K, likelihood, buffer, warm):
        opts = self.options
        n = K.shape[0]
        tau = self.site_precision.copy() if warm else np.zeros(n)
        nu = self.site_natural_mean.copy() if warm else np.zeros(n)
        post_mean = np.empty(n)
        post_var = np.empty(n)
        cavity_mean = np.empty(n)
        cavity_var = np.empty(n)
        with _one_blas_thread():
            # OUTPUT_FACTOR: the buffer comes back holding L = chol(I + S^½ K S^½), which is
            # all the evidence gradient and prediction need (Σ itself is never formed at the end)
            info = _engine.run_gp_ep(
                K, self.y, likelihood.site_spec(), tau, nu, buffer, post_mean,
                schedule=opts["schedule"], order=opts["order"], seed=opts["seed"],
                damping=opts["damping"], tol=opts["tol"], max_sweeps=opts["max_sweeps"],
                negative_precision=opts["negative_precision"], block_size=opts["block_size"],
                refactor_every=opts["refactor_every"], output=_engine.OUTPUT_FACTOR,
                post_var=post_var, cavity_mean=cavity_mean, cavity_var=cavity_var)
        info["post_var"] = post_var
        info["cavity"] = (cavity_mean, cavity_var)
        if not np.isfinite(info["log_z"]):
            if info["n_failed"]:
                raise np.linalg.LinAlgError(
                    f"EP could not form a proper cavity at {info['n_failed']} site(s) and the log marginal "
                    "likelihood is not finite: the kernel matrix is probably not positive semi-definite; "
                    "increase jitter or add a White kernel term")
            raise FloatingPointError("EP produced a non-finite log marginal likelihood; this is a bug")
        return tau, nu, post_mean, info

    @staticmethod
    def _weights(K, L, tau, nu, s):
        """``b = (K + S⁻¹)⁻¹ S⁻¹ ν`` (= ``ν - R K ν``, R&W Alg. 3.5/3.6), without cancellation.

        With P the sites with ``τ_i > 0``, ``r = S^-½ ν`` on P (0 elsewhere) and ``t = K ν``
        over the other sites, ``S^½ K ν = (B - I) r + S^½ t`` gives
        ``b = ν - S^½ B⁻¹ S^½ K ν = ν_Z + S^½ w`` with ``w = B⁻¹ (r - S^½ t)``
        (gp_ep.gp_log_z_stable).  The textbook ``ν - s ⊙ B⁻¹ (s ⊙ K ν)`` subtracts two
        vectors of size ``τ_i |m̃_i|`` whose difference is O(1): at site precisions of 1e13
        it kept about three digits of the evidence gradient.
        """
        pos = tau > 0
        nu_zero = np.where(pos, 0.0, nu)
        t = K @ nu_zero if np.any(nu_zero) else np.zeros_like(nu)
        rhs = np.zeros_like(nu)
        rhs[pos] = nu[pos] / s[pos] - s[pos] * t[pos]
        w = solve_triangular(L, solve_triangular(L, rhs, lower=True), lower=True, trans="T")
        return nu_zero + s * w

    def evaluate(self, kernel, likelihood, *, gradient, learn_likelihood, warm, keep=False):
        """Run EP for the given hyperparameters; returns (log_z, grad or None, info).

        With ``keep`` the sites and the prediction state (Cholesky factor, weights) are stored.
        All BLAS work runs with one thread (see ``_one_blas_thread``).
        """
        with _one_blas_thread():
            return self._evaluate(kernel, likelihood, gradient=gradient,
                                  learn_likelihood=learn_likelihood, warm=warm, keep=keep)

    def _evaluate(self, kernel, likelihood, *, gradient, learn_likelihood, warm, keep):
        K = self._kernel_matrix(kernel)
        n = K.shape[0]
        buffer = np.empty((n, n))
        tau, nu, post_mean, info = self._run(K, likelihood, buffer, warm)
        self.site_precision, self.site_natural_mean = tau, nu
        grad = None
        info.pop("post_var")
        cavity_mean, cavity_var = info.pop("cavity")
        s = np.sqrt(tau)
        L = buffer                      # chol(B), B = I + S^½ K S^½, from the engine
        weights = self._weights(K, L, tau, nu, s)
        if gradient:
            grads = []
            if kernel.n_theta:
                # R = S^½ B⁻¹ S^½ in the same buffer (dpotri on the factor).  The C-ordered
                # lower triangle L is, read in Fortran order, the upper factor U = Lᵀ.
                inv, info_inv = lapack.dpotri(L.T, lower=0, overwrite_c=1)
                if info_inv != 0:
                    raise np.linalg.LinAlgError("inverting B failed")
                R = inv.T                          # C-ordered view of the buffer; lower triangle valid
                _symmetrize_from_lower(R)
                R *= s[:, None]
                R *= s[None, :]
                for dK in kernel.gradient_iter(self.X):
                    grads.append(0.5 * (weights @ dK @ weights) - 0.5 * np.vdot(R, dK))
                del R, inv
            if learn_likelihood:
                # the engine's cavities (from B's factor; 1/Σ_ii - τ_i cancels at huge τ_i)
                grads.extend(likelihood_theta_gradient(likelihood, self.y, cavity_mean, cavity_var))
            grad = np.array(grads, dtype=float)
            if keep:  # the factor was overwritten by R: refactorise for prediction
                np.multiply(K, s[:, None], out=buffer)
                buffer *= s[None, :]
                buffer.flat[:: n + 1] += 1.0
                L = _cholesky_lower_inplace(buffer)
        if keep:
            self.kernel, self.likelihood = kernel, likelihood
            self.chol, self.weights, self.sqrt_precision = L, weights, s
            self.log_ml, self.info = float(info["log_z"]), info
        return float(info["log_z"]), grad, info

    # -- prediction --------------------------------------------------------------------------
    def latent(self, X):
        n_test = X.shape[0]
        mean = np.empty(n_test)
        var = np.empty(n_test)
        for a in range(0, n_test, _PREDICT_BATCH):
            z = slice(a, min(a + _PREDICT_BATCH, n_test))
            Ks = self.kernel(X[z], self.X)                          # (m, n)
            mean[z] = Ks @ self.weights
            Vt = solve_triangular(self.chol, (self.sqrt_precision[:, None] * Ks.T), lower=True)
            var[z] = self.kernel.diag(X[z]) - np.einsum("ij,ij->j", Vt, Vt)
        return mean, np.maximum(var, 0.0)


class _GPEPBase(BaseEstimator):
    """Options, the hyperparameter search and fitted-state handling shared by the GP estimators."""

    def _engine_options(self):
        v.check_choice(self.schedule, "schedule", _SCHEDULES)
        v.check_choice(self.order, "order", _ORDERS)
        v.check_choice(self.negative_precision, "negative_precision", _POLICIES)
        damping = self.damping
        if damping is None:
            damping = 0.5 if self.schedule == "parallel" else 1.0
        damping = v.check_in_range(damping, "damping", 0.0, 1.0, low_inclusive=False)
        tol = v.check_positive(self.tol, "tol")
        max_sweeps = v.check_int(self.max_sweeps, "max_sweeps", minimum=1)
        block_size = 0 if self.block_size is None else v.check_int(self.block_size, "block_size", minimum=1)
        jitter = v.check_in_range(self.jitter, "jitter", 0.0, np.inf)
        if self.refactor_every is None:
            refactor_every = _DEFAULT_REFACTOR_EVERY[self.schedule]
        else:
            refactor_every = v.check_int(self.refactor_every, "refactor_every", minimum=1)
        if self.optimizer not in (None, "L-BFGS-B"):
            raise ValueError(f"optimizer must be 'L-BFGS-B' or None, got {self.optimizer!r}")
        v.check_int(self.n_restarts_optimizer, "n_restarts_optimizer", minimum=0)
        if not isinstance(self.warm_start, (bool, np.bool_)):
            raise TypeError(f"warm_start must be a bool, got {type(self.warm_start).__name__}")
        rs = self.random_state
        if rs is None:
            seed = 0
        elif isinstance(rs, (int, np.integer)) and not isinstance(rs, bool) and rs >= 0:
            seed = int(rs)
        else:
            raise ValueError(f"random_state must be None or a non-negative integer, got {rs!r}")
        return {"schedule": _SCHEDULES[self.schedule], "order": _ORDERS[self.order], "seed": seed,
                "damping": float(damping), "tol": tol, "max_sweeps": max_sweeps,
                "negative_precision": _POLICIES[self.negative_precision], "block_size": block_size,
                "jitter": jitter, "refactor_every": refactor_every}

    def _kernel(self):
        kernel = RBF() if self.kernel is None else self.kernel
        if not isinstance(kernel, Kernel):
            raise TypeError(f"kernel must be a fastep.kernels.Kernel, got {type(kernel).__name__}")
        return kernel

    def _fit_binary(self, X, y, kernel, likelihood, options, learn_likelihood):
        """Fit one binary/regression problem, learning hyperparameters if asked."""
        problem = _BinaryGPEP(kernel, likelihood, X, y, options)
        n_kernel = kernel.n_theta
        if learn_likelihood:
            _, lik_theta0, lik_bounds = likelihood_theta(likelihood)
        else:
            lik_theta0, lik_bounds = np.zeros(0), np.zeros((0, 2))
        theta0 = np.concatenate([kernel.theta, lik_theta0])
        if self.optimizer is not None and theta0.size:
            bounds = np.vstack([kernel.bounds.reshape(-1, 2), lik_bounds])

            def objective(theta):
                k = kernel.clone_with_theta(theta[:n_kernel])
                lik = likelihood_with_theta(likelihood, theta[n_kernel:]) if learn_likelihood else likelihood
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", ConvergenceWarning)
                        value, grad, _ = problem.evaluate(k, lik, gradient=True,
                                                          learn_likelihood=learn_likelihood,
                                                          warm=self.warm_start)
                except np.linalg.LinAlgError:
                    return -np.inf, np.zeros_like(theta)
                return value, grad

            rng = np.random.default_rng(options["seed"])
            theta, _, _ = maximize_log_likelihood(objective, theta0, bounds,
                                                  n_restarts=self.n_restarts_optimizer, rng=rng)
            kernel = kernel.clone_with_theta(theta[:n_kernel])
            if learn_likelihood:
                likelihood = likelihood_with_theta(likelihood, theta[n_kernel:])
        else:
            import copy
            kernel = copy.deepcopy(kernel)
        problem.evaluate(kernel, likelihood, gradient=False, learn_likelihood=False,
                         warm=self.optimizer is not None and self.warm_start, keep=True)
        info = problem.info
        if not info["converged"]:
            warnings.warn(
                f"EP did not converge in {info['n_sweeps']} sweeps (max_sweeps={self.max_sweeps}); "
                f"the largest site-parameter change in the last sweep was {info['max_change']:.3g} "
                f"and the last change of log Z {info['log_z_change']:.3g} (tol={self.tol:g}). "
                "Increase max_sweeps, use damping < 1, or check the model.",
                ConvergenceWarning, stacklevel=4)
        return problem

    @staticmethod
    def _problem_log_ml(problem, theta, eval_gradient, learn_likelihood):
        n_kernel = problem.kernel.n_theta
        theta = np.asarray(theta, dtype=float)
        expected = n_kernel + (len(likelihood_theta(problem.likelihood)[1]) if learn_likelihood else 0)
        theta = v.as_float_vector(theta, "theta", length=expected)
        k = problem.kernel.clone_with_theta(theta[:n_kernel])
        lik = likelihood_with_theta(problem.likelihood, theta[n_kernel:]) if learn_likelihood else problem.likelihood
        saved = problem.site_precision, problem.site_natural_mean
        try:
            value, grad, _ = problem.evaluate(k, lik, gradient=eval_gradient,
                                              learn_likelihood=learn_likelihood, warm=False)
        finally:
            problem.site_precision, problem.site_natural_mean = saved
        return (value, grad) if eval_gradient else value


class GaussianProcessClassifier(ClassifierMixin, _GPEPBase):
    """Gaussian-process classifier fitted by dense expectation propagation.

    Model: latent ``f ~ GP(0, k)``, ``p(y_i | f_i) = t(y_i f_i)`` for a binary
    likelihood ``t`` (probit by default). EP in kernel space (Minka §2,
    eqs 77-88) gives a Gaussian posterior over ``f`` at the training inputs and
    the EP estimate of the log marginal likelihood; hyperparameters are learnt by
    maximising it with L-BFGS-B using its exact gradient at the EP fixed point.
    More than two classes are handled one-vs-rest (one binary GP per class,
    probabilities normalised to sum to one).

    Parameters
    ----------
    kernel : fastep.kernels.Kernel, default RBF()
        Prior covariance; its ``theta`` is the starting point of the optimiser.
    likelihood : Probit, Step or Logistic, default Probit()
    schedule : {'blocked', 'sequential', 'parallel'}, default 'blocked'
        Sequential EP with BLAS-3 blocked updates, the plain rank-1 sequential
        path, or parallel (damped) EP. All reach the same fixed point.
    order : {'fixed', 'random', 'entropy'}, default 'fixed'
        Site order of the sequential schedules: 0..n-1, a seeded permutation per
        sweep, or Seeger's differential-entropy score (Minka eq 86).
    damping : float in (0, 1] or None, default None
        Fraction of each site change applied (natural parameters); None means 1
        for the sequential schedules and 0.5 for 'parallel'.
    tol : float, default 1e-4
        Convergence threshold on the largest relative site-parameter change of a
        sweep and on the relative change of log Z.  Sequential EP converges linearly
        (each sweep shrinks the site error about 8-fold on the issue-3 benchmark), so the
        site error at stop is several times below ``tol``; log Z is stationary at the
        fixed point, so its error is quadratic in the site error.  Measured on the
        issue-3 benchmark at n = 2000 (blocked, cold start): tol 1e-4 stops after 7
        sweeps with site error 3e-6, posterior-mean error 3e-6 and log Z error 3e-11;
        tol 1e-6 after 9 sweeps with 4e-8, 5e-8 and 1e-13.  For comparison, GPML's
        ``infEP`` stops on an absolute log-Z change of 1e-4.  Gradients and predictions
        are accurate to about the site error; lower ``tol`` for tighter answers.
    max_sweeps : int, default 200
    block_size : int or None
        Sites per BLAS-3 block of the 'blocked' schedule (None: the engine's measured default).
    refactor_every : int or None
        Sweeps between full refactorisations of the posterior from the Cholesky of
        B = I + S^½ K S^½ (the returned posterior and log Z always come from a fresh one;
        between them log Z uses the incremental marginals and the determinant lemma).
        None: 1 for 'sequential' and 'parallel', 10 for 'blocked'.
    negative_precision : {'clip', 'skip'}, default 'clip'
        Policy for negative site precisions (possible for the step likelihood with
        flip noise): clip to 0 keeping the tilted mean matched, or skip the update.
    optimizer : 'L-BFGS-B' or None, default 'L-BFGS-B'
        None keeps the hyperparameters fixed.
    n_restarts_optimizer : int, default 0
        Extra optimiser starts at ``theta0 + N(0, I)`` (seeded by ``random_state``).
    learn_likelihood : bool, default False
        Also learn the likelihood's parameters (probit bias and slope, step flip
        noise; see :mod:`fastep._likelihood_params`).
    jitter : float, default 0.0
        Added to the diagonal of the kernel matrix.
    random_state : int or None
        Seed of the random site order and of the optimiser restarts.
    warm_start : bool, default True
        Start each EP run of the optimiser from the previous evaluation's sites.

    Attributes
    ----------
    classes_ : ndarray
    kernel_ : Kernel (binary) or list of Kernel (one per class, one-vs-rest)
    likelihood_ : the likelihood (or list, one-vs-rest)
    log_marginal_likelihood_value_ : float
        EP log marginal likelihood at the fitted hyperparameters (sum over the
        one-vs-rest problems for more than two classes).
    site_precision_, site_natural_mean_ : ndarray (n_samples,) or (n_classes, n_samples)
    n_sweeps_ : int or ndarray
    converged_ : bool
    X_train_ : ndarray
    """

    def __init__(self, kernel=None, likelihood=None, *, schedule="blocked", order="fixed", damping=None,
                 tol=1e-4, max_sweeps=200, block_size=None, refactor_every=None,
                 negative_precision="clip", optimizer="L-BFGS-B", n_restarts_optimizer=0, learn_likelihood=False, jitter=0.0,
                 random_state=None, warm_start=True):
        self.kernel = kernel
        self.likelihood = likelihood
        self.schedule = schedule
        self.order = order
        self.damping = damping
        self.tol = tol
        self.max_sweeps = max_sweeps
        self.block_size = block_size
        self.refactor_every = refactor_every
        self.negative_precision = negative_precision
        self.optimizer = optimizer
        self.n_restarts_optimizer = n_restarts_optimizer
        self.learn_likelihood = learn_likelihood
        self.jitter = jitter
        self.random_state = random_state
        self.warm_start = warm_start

    def _likelihood(self):
        lik = Probit() if self.likelihood is None else self.likelihood
        if not isinstance(lik, (Probit, Step, Logistic)):
            raise TypeError("likelihood must be a binary likelihood (fastep.likelihoods.Probit, Step or "
                            f"Logistic), got {lik!r}")
        return lik

    def fit(self, X, y):
        """Fit the EP posterior (and the hyperparameters unless ``optimizer=None``); returns self."""
        options = self._engine_options()
        kernel = self._kernel()
        likelihood = self._likelihood()
        if not isinstance(self.learn_likelihood, (bool, np.bool_)):
            raise TypeError(f"learn_likelihood must be a bool, got {type(self.learn_likelihood).__name__}")
        if self.learn_likelihood:
            likelihood_theta(likelihood)        # raises for parameters that cannot be learnt
        X, y = v.check_X_y(X, y)
        kernel._validate_X(X, "X")
        classes, targets = v.encode_one_vs_rest_labels(y)
        problems = [self._fit_binary(X, t, kernel, likelihood, options, bool(self.learn_likelihood))
                    for t in targets]
        # Everything computed: set the fitted attributes.
        self.classes_ = classes
        self.X_train_ = X
        self.n_features_in_ = X.shape[1]
        self._problems = problems
        binary = len(problems) == 1
        self.kernel_ = problems[0].kernel if binary else [p.kernel for p in problems]
        self.likelihood_ = problems[0].likelihood if binary else [p.likelihood for p in problems]
        self.log_marginal_likelihood_value_ = float(sum(p.log_ml for p in problems))
        stack = (lambda a: a[0]) if binary else np.vstack
        self.site_precision_ = stack([p.site_precision for p in problems])
        self.site_natural_mean_ = stack([p.site_natural_mean for p in problems])
        self.n_sweeps_ = problems[0].info["n_sweeps"] if binary else np.array([p.info["n_sweeps"] for p in problems])
        self.converged_ = all(bool(p.info["converged"]) for p in problems)
        return self

    def log_marginal_likelihood(self, theta=None, eval_gradient=False):
        """EP log marginal likelihood (and its gradient) at ``theta``.

        Parameters
        ----------
        theta : array-like or None
            Unconstrained hyperparameters (``kernel_.theta``, followed by the
            likelihood's when ``learn_likelihood``); None returns the fitted value.
            For one-vs-rest problems the same ``theta`` is applied to every class
            and the sum is returned.
        eval_gradient : bool

        Returns
        -------
        float, or (float, ndarray) with ``eval_gradient``
        """
        check_is_fitted(self, "classes_")
        if theta is None:
            if eval_gradient:
                raise ValueError("eval_gradient=True requires theta")
            return self.log_marginal_likelihood_value_
        values = [self._problem_log_ml(p, theta, eval_gradient, bool(self.learn_likelihood))
                  for p in self._problems]
        if eval_gradient:
            return float(sum(val for val, _ in values)), np.sum([g for _, g in values], axis=0)
        return float(sum(values))

    def predict_latent(self, X):
        """Latent predictive mean and variance at the rows of ``X`` (R&W Alg. 3.6).

        Returns ``(mean, var)`` of shape (n_samples,), or (n_samples, n_classes) one-vs-rest.
        """
        check_is_fitted(self, "classes_")
        X = v.check_n_features(X, self.n_features_in_)
        out = [p.latent(X) for p in self._problems]
        if len(out) == 1:
            return out[0]
        return np.column_stack([m for m, _ in out]), np.column_stack([s for _, s in out])

    def predict_proba(self, X):
        """Class probabilities, columns ordered as ``classes_``.

        Binary: ``p(y=+1|x) = ∫ t(f) N(f; μ*, σ*²) df`` (probit with unit slope:
        ``Φ(μ*/sqrt(1 + σ*²))``). One-vs-rest: each class's binary predictive,
        normalised to sum to one.
        """
        check_is_fitted(self, "classes_")
        return one_vs_rest_proba(self._problems, v.check_n_features(X, self.n_features_in_))

    def decision_function(self, X):
        """Predictive log-odds of each binary problem (shape (n,), or (n, n_classes) one-vs-rest)."""
        check_is_fitted(self, "classes_")
        X = v.check_n_features(X, self.n_features_in_)
        cols = []
        for p in self._problems:
            mean, var = p.latent(X)
            ones = np.ones_like(mean)
            cols.append(p.likelihood.moments(ones, mean, var)[0] - p.likelihood.moments(-ones, mean, var)[0])
        return cols[0] if len(cols) == 1 else np.column_stack(cols)

    def predict(self, X):
        """Most probable class for each row of ``X``."""
        check_is_fitted(self, "classes_")
        if len(self._problems) == 1:
            return self.classes_[(self.decision_function(X) > 0).astype(int)]
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]


class GaussianProcessRegressor(RegressorMixin, _GPEPBase):
    """GP regression with a Gaussian likelihood, through the same EP engine (exact in one sweep).

    With ``p(y_i | f_i) = N(y_i; f_i, noise_variance)`` EP's fixed point is the
    exact posterior and its log marginal likelihood ``log N(y; 0, K + σ² I)``;
    this estimator exists so the engine's answer can be used, and checked, as
    ordinary GP regression. Parameters as :class:`GaussianProcessClassifier`,
    with ``noise_variance`` (float > 0, default 1.0) and ``learn_noise``
    (default True: σ² is learnt with the kernel when ``optimizer`` is set).

    Attributes
    ----------
    kernel_, noise_variance_, log_marginal_likelihood_value_, site_precision_,
    site_natural_mean_, n_sweeps_, converged_, X_train_
    """

    def __init__(self, kernel=None, noise_variance=1.0, *, learn_noise=True, schedule="blocked",
                 order="fixed", damping=None, tol=1e-4, max_sweeps=200, block_size=None,
                 refactor_every=None, negative_precision="clip", optimizer="L-BFGS-B",
                 n_restarts_optimizer=0, jitter=0.0, random_state=None, warm_start=True):
        self.kernel = kernel
        self.noise_variance = noise_variance
        self.learn_noise = learn_noise
        self.schedule = schedule
        self.order = order
        self.damping = damping
        self.tol = tol
        self.max_sweeps = max_sweeps
        self.block_size = block_size
        self.refactor_every = refactor_every
        self.negative_precision = negative_precision
        self.optimizer = optimizer
        self.n_restarts_optimizer = n_restarts_optimizer
        self.jitter = jitter
        self.random_state = random_state
        self.warm_start = warm_start

    def fit(self, X, y):
        """Fit the posterior (and hyperparameters unless ``optimizer=None``); returns self."""
        options = self._engine_options()
        kernel = self._kernel()
        likelihood = Gaussian(noise_variance=v.check_positive(self.noise_variance, "noise_variance"))
        if not isinstance(self.learn_noise, (bool, np.bool_)):
            raise TypeError(f"learn_noise must be a bool, got {type(self.learn_noise).__name__}")
        X, y = v.check_X_y(X, y, y_numeric=True)
        kernel._validate_X(X, "X")
        problem = self._fit_binary(X, y, kernel, likelihood, options, bool(self.learn_noise))
        self.X_train_ = X
        self.n_features_in_ = X.shape[1]
        self._problems = [problem]
        self.kernel_ = problem.kernel
        self.noise_variance_ = float(problem.likelihood.noise_variance)
        self.log_marginal_likelihood_value_ = problem.log_ml
        self.site_precision_ = problem.site_precision
        self.site_natural_mean_ = problem.site_natural_mean
        self.n_sweeps_ = problem.info["n_sweeps"]
        self.converged_ = bool(problem.info["converged"])
        return self

    def log_marginal_likelihood(self, theta=None, eval_gradient=False):
        """Log marginal likelihood (and gradient) at ``theta`` (kernel theta, then log σ² if ``learn_noise``)."""
        check_is_fitted(self, "X_train_")
        if theta is None:
            if eval_gradient:
                raise ValueError("eval_gradient=True requires theta")
            return self.log_marginal_likelihood_value_
        return self._problem_log_ml(self._problems[0], theta, eval_gradient, bool(self.learn_noise))

    def predict_latent(self, X):
        """Posterior mean and variance of the latent function at the rows of ``X``."""
        check_is_fitted(self, "X_train_")
        X = v.check_n_features(X, self.n_features_in_)
        return self._problems[0].latent(X)

    def predict(self, X, return_std=False):
        """Predictive mean (and standard deviation of y, including the noise, if ``return_std``)."""
        mean, var = self.predict_latent(X)
        if return_std:
            return mean, np.sqrt(var + self.noise_variance_)
        return mean
