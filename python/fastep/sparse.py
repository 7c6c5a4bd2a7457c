"""Sparse Gaussian-process classification and regression by EP with inducing inputs (EP-FITC, EP-DTC, power EP).

The compiled engine :mod:`fastep._epcore.sparse_ep` runs the EP sweeps in O(nm²) time and
O(nm) memory; this module validates input, initialises the inducing inputs, evaluates the
kernel blocks, computes the exact evidence gradient with respect to the kernel and
likelihood hyperparameters and the inducing inputs Z, learns them with L-BFGS-B and predicts
through q(u | y).  Equations: ``../shared/papers/ep_for_gps_slides.md`` ("Sparse EP",
"EP-FITC", "EP-DTC", "EP variants"); derivations in :mod:`fastep.reference.sparse_ep`.

Model
-----
``u = f(Z) ~ N(0, K_mm)``, ``L = chol(K_mm + jitter I)``, ``v_i = L⁻¹ k_m(x_i)``; the prior of
the training latents is ``Q + diag(K - Q)`` (``approximation='fitc'``) or ``Q``
(``'dtc'``), ``Q = K_nm K_mm⁻¹ K_mn`` (slide "Sparse EP").  Sites act on u (slide "EP-FITC");
``power`` α < 1 runs power EP (α = 1: EP-FITC / EP-DTC; α → 0 approaches the variational
bound, slide "EP variants").

Evidence gradient (O(nm²), at the EP fixed point only the explicit dependence counts)
-------------------------------------------------------------------------------------
With the sites (τ, ν) on the projections g = Q-part of f, ``a = ν - τ ∘ E[g]``,
``M = (T⁻¹ + Q)⁻¹ = T - T V A⁻¹ Vᵀ T`` (V = Vtᵀ, A = I + V T Vᵀ) and, for FITC,
``c_i = (1/α) ∂ log Z_i/∂v_i = (a_i² - b_i)/(2α)`` at the final cavity ``N(m_i, v_i)`` of f
(a, b: the powered site kernel's alpha and beta; ∂Z/∂v = ½ ∂²Z/∂m² for a Gaussian
convolution; c = 0 for DTC), the derivative of log Z is

    ½ aᵀ ∂Q a - ½ tr(M ∂Q) - Σ_i c_i ∂Q_ii + Σ_i c_i ∂K_ii
        = 2 ⟨G, ∂K_mn⟩ - ⟨G Uᵀ, ∂K_mm⟩ + ⟨c, ∂ diag K⟩,

``U = K_mm⁻¹ K_mn = L⁻ᵀ V`` and ``G = U W`` with ``W = ½ a aᵀ - ½ M - diag(c)``, i.e.

    G = ½ (U a) aᵀ - U diag(½ τ + c) + ½ (U T Vᵀ) A⁻¹ V T          (m x n).

``∂K_mn`` comes from ``kernel.cross_gradient_iter(Z, X)``, ``∂K_mm`` from
``kernel.gradient_iter(Z)``, ``∂ diag K`` from ``kernel.diag_gradient(X)``, and the
inducing-input gradient is ``kernel.input_gradient(Z, X, 2G) - kernel.input_gradient(Z, Z, 2GUᵀ)``
(diag K does not depend on Z).

Exactness: the shortcut "only the explicit dependence counts" needs the EP fixed point to be a
stationary point of the evidence, which holds when the site kernel is an exact Gaussian
convolution ``Z = ∫ t(f) N(f; m, v) df`` (probit, step, Gaussian; Gauss-Hermite logistic to its
quadrature accuracy; every likelihood at power < 1, whose moments integrate the pointwise
likelihood).  MacKay's logistic approximation ``σ(κ(v) m)`` is not one, so with
``Logistic(method='mackay')`` at power 1 the gradient is approximate (measured ~1-3 % off
central differences, as for the dense :class:`fastep.GaussianProcessClassifier`); use
``method='gauss-hermite'`` for exact gradients.  The n-dimension is processed in blocks of columns, so the
extra memory is O(m · block).  Likelihood parameters: ``Σ_i (1/α) ∂ log Z_i/∂φ`` at the final
cavities (:mod:`fastep._likelihood_params` for α = 1; for α < 1 only the Gaussian noise
variance, in closed form).

Prediction (O(m) for the mean, O(m²) for the variance per test point)
--------------------------------------------------------------------
``q(f* | y) = ∫ p(f* | u) q(u | y) du`` (slide "EP-FITC"): with ``p = L⁻¹ k_m(x*)``,
``E f* = pᵀ μ_w = k_m(x*)ᵀ (L⁻ᵀ μ_w)`` and ``Var f* = k(x*, x*) - |p|² + |R⁻ᵀ p|²``.

Jitter policy: ``jitter`` (absolute, default 1e-6) is added to the diagonal of K_mm before
its Cholesky factorisation; a failure raises ``numpy.linalg.LinAlgError`` asking for more.
"""
import copy
import warnings

import numpy as np
from scipy.linalg import solve_triangular

from . import _validation as v
from ._base import BaseEstimator, ClassifierMixin, RegressorMixin, check_is_fitted, one_vs_rest_proba
from ._epcore import sparse_ep as _engine
from ._likelihood_params import likelihood_theta, likelihood_theta_gradient, likelihood_with_theta
from ._optimize import maximize_log_likelihood
from ._threading import _get_controller
from .exceptions import ConvergenceWarning
from .ivm import IVMClassifier, IVMRegressor
from .kernels import RBF, Kernel
from .likelihoods import Gaussian, Logistic, Probit, Step

__all__ = ["SparseGPClassifier", "SparseGPRegressor", "kmeans_plus_plus"]

_SCHEDULES = {"sequential": _engine.SPARSE_SEQUENTIAL, "parallel": _engine.SPARSE_PARALLEL}
_ORDERS = {"fixed": _engine.ORDER_FIXED, "random": _engine.ORDER_RANDOM}
_POLICIES = {"clip": _engine.NEGATIVE_CLIP, "skip": _engine.NEGATIVE_SKIP}
_APPROXIMATIONS = ("fitc", "dtc")
_INDUCING_INITS = ("kmeans++", "random", "ivm")
_PREDICT_BATCH = 4096
#: Columns (training points) per block of the gradient computation.
_GRADIENT_BLOCK_ELEMENTS = 1 << 21


def _one_blas_thread():
    """EP sweeps and the gradient run with one BLAS thread (as the dense GP estimators; the
    per-site BLAS-2 calls on m x m matrices are slower threaded on the 2-core machines)."""
    return _get_controller().limit(limits=1, user_api="blas")


def kmeans_plus_plus(X, n_clusters, rng, n_iter=10):
    """Seeded k-means++ centres (Arthur & Vassilvitskii seeding, then ``n_iter`` Lloyd steps).

    The seeding picks data points with probability proportional to the squared distance to
    the nearest centre chosen so far (uniformly among the remaining points when every
    distance is 0, i.e. duplicated data); Lloyd steps move each centre to the mean of its
    points (empty clusters keep their centre).  O(n m d) per step.
    """
    n = X.shape[0]
    centres = np.empty((n_clusters, X.shape[1]))
    first = int(rng.integers(n))
    centres[0] = X[first]
    d2 = np.sum((X - centres[0]) ** 2, axis=1)
    chosen = np.zeros(n, dtype=bool)
    chosen[first] = True
    for k in range(1, n_clusters):
        total = d2.sum()
        if total > 0:
            idx = int(rng.choice(n, p=d2 / total))
        else:
            idx = int(rng.choice(np.flatnonzero(~chosen)))
        chosen[idx] = True
        centres[k] = X[idx]
        np.minimum(d2, np.sum((X - centres[k]) ** 2, axis=1), out=d2)
    x2 = np.einsum("ij,ij->i", X, X)
    for _ in range(n_iter):
        dist = x2[:, None] - 2.0 * X @ centres.T + np.einsum("ij,ij->i", centres, centres)[None, :]
        label = np.argmin(dist, axis=1)
        counts = np.bincount(label, minlength=n_clusters)
        sums = np.zeros_like(centres)
        np.add.at(sums, label, X)
        nonempty = counts > 0
        new = centres.copy()
        new[nonempty] = sums[nonempty] / counts[nonempty, None]
        if np.array_equal(new, centres):
            break
        centres = new
    return centres


class _BinarySparseEP:
    """One binary (or regression) sparse EP problem: EP runs, evidence, gradient, prediction state."""

    def __init__(self, kernel, likelihood, Z, X, y, options):
        self.kernel = kernel
        self.likelihood = likelihood
        self.Z = Z
        self.X = X
        self.y = y
        self.options = options
        n = X.shape[0]
        self.site_precision = np.zeros(n)
        self.site_natural_mean = np.zeros(n)

    # -- EP --------------------------------------------------------------------------------
    def _prior(self, kernel, Z):
        opts = self.options
        Kmm = np.ascontiguousarray(kernel(Z), dtype=np.float64)
        # K(X, Z) by blocks of rows into one n x m buffer (the kernel's temporaries stay
        # O(block x m)); the engine then turns it into Vt in place
        n, m = self.X.shape[0], Z.shape[0]
        Knm = np.empty((n, m))
        rows = max(1, _GRADIENT_BLOCK_ELEMENTS // max(m, 1))
        for s in range(0, n, rows):
            Knm[s:s + rows] = kernel(self.X[s:s + rows], Z)
        kdiag = np.ascontiguousarray(kernel.diag(self.X), dtype=np.float64)
        for name, arr in (("K(Z, Z)", Kmm), ("K(X, Z)", Knm), ("diag K(X, X)", kdiag)):
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"the kernel {kernel!r} produced non-finite values in {name}")
        L, Vt, d = _engine.sparse_projection(Kmm, Knm, kdiag, approximation=opts["approximation"],
                                             jitter=opts["jitter"], overwrite_knm=True)
        return L, Vt, d

    def _run_once(self, Vt, d, likelihood, warm):
        opts = self.options
        n, m = Vt.shape
        tau = self.site_precision.copy() if warm else np.zeros(n)
        nu = self.site_natural_mean.copy() if warm else np.zeros(n)
        R, w_mean, g_mean, g_var = np.empty((m, m)), np.empty(m), np.empty(n), np.empty(n)
        info = _engine.run_sparse_ep(
            Vt, d, self.y, likelihood.site_spec(), tau, nu, R, w_mean, power=opts["power"],
            n_quadrature=opts["n_quadrature"], schedule=opts["schedule"], order=opts["order"],
            seed=opts["seed"], damping=opts["damping"], tol=opts["tol"], max_sweeps=opts["max_sweeps"],
            negative_precision=opts["negative_precision"], g_mean=g_mean, g_var=g_var)
        if not np.isfinite(info["log_z"]):
            raise np.linalg.LinAlgError(
                f"sparse EP could not form a proper cavity at {info['n_failed']} site(s) and the log "
                "marginal likelihood is not finite; increase jitter or check the kernel")
        return dict(tau=tau, nu=nu, R=R, w_mean=w_mean, g_mean=g_mean, g_var=g_var, info=info)

    def _run(self, Vt, d, likelihood, warm):
        """EP; a warm start that fails is retried once from a cold start (as the dense estimator)."""
        if warm and np.any(self.site_precision):
            try:
                state = self._run_once(Vt, d, likelihood, warm=True)
            except (np.linalg.LinAlgError, FloatingPointError):
                state = None
            if state is not None and state["info"]["n_failed"] == 0:
                return state
        return self._run_once(Vt, d, likelihood, warm=False)

    def evaluate(self, kernel, likelihood, Z, *, gradient, learn_likelihood, learn_inducing, warm,
                 keep=False):
        """Run EP for the given hyperparameters; returns (log_z, grad or None, info).

        The gradient is ordered as kernel theta, likelihood theta (if ``learn_likelihood``),
        ``Z.ravel()`` (if ``learn_inducing``).  With ``keep`` the sites and the prediction
        state are stored.
        """
        with _one_blas_thread():
            L, Vt, d = self._prior(kernel, Z)
            state = self._run(Vt, d, likelihood, warm)
            self.site_precision, self.site_natural_mean = state["tau"], state["nu"]
            grad = None
            if gradient:
                grad = self._gradient(kernel, likelihood, Z, L, Vt, d, state, learn_likelihood,
                                      learn_inducing)
        info = state["info"]
        if keep:
            self.kernel, self.likelihood, self.Z = kernel, likelihood, Z
            self.chol_mm = L
            self.factor = state["R"]
            self.w_mean = state["w_mean"]
            self.weights = solve_triangular(L, state["w_mean"], lower=True, trans="T")   # K_mm⁻¹ E[u]
            self.log_ml, self.info = float(info["log_z"]), info
        return float(info["log_z"]), grad, info

    def _cavity_moments(self, likelihood, d, state):
        """Final cavities of f and the powered site kernel there (for gradients)."""
        opts = self.options
        power = opts["power"]
        tau, nu, g_mean, g_var = state["tau"], state["nu"], state["g_mean"], state["g_var"]
        v_c = g_var / (1.0 - power * tau * g_var)
        m_c = g_mean + v_c * power * (tau * g_mean - nu)
        var_f = v_c + d
        _, a, b = _engine.power_moments_array(likelihood.site_spec(), self.y, m_c, var_f, power=power,
                                              n_quadrature=opts["n_quadrature"])
        return m_c, var_f, a, b

    def _gradient(self, kernel, likelihood, Z, L, Vt, d, state, learn_likelihood, learn_inducing):
        opts = self.options
        power = opts["power"]
        X = self.X
        n, m = Vt.shape
        tau, nu, R = state["tau"], state["nu"], state["R"]
        m_c, var_f, az, bz = self._cavity_moments(likelihood, d, state)
        a = nu - tau * state["g_mean"]
        # (1/α) ∂ log Z_i/∂v_i = (a² - b)/(2α): ∂Z/∂v = ½ ∂²Z/∂m² for a Gaussian convolution
        c = (az * az - bz) / (2.0 * power) if opts["approximation"] == "fitc" else np.zeros(n)
        block = max(1, min(n, _GRADIENT_BLOCK_ELEMENTS // max(m, 1)))
        blocks = [slice(s, min(s + block, n)) for s in range(0, n, block)]

        def U_block(sl):                                      # K_mm⁻¹ K_m,block = L⁻ᵀ V_block
            return solve_triangular(L, Vt[sl].T, lower=True, trans="T")

        # pass 1: U T Vᵀ and U a
        P = np.zeros((m, m))
        Ua = np.zeros(m)
        for sl in blocks:
            U = U_block(sl)
            P += (U * tau[sl]) @ Vt[sl]
            Ua += U @ a[sl]
        # (U T Vᵀ) A⁻¹ with A = Rᵀ R
        PA = solve_triangular(R, solve_triangular(R, P.T, trans="T")).T
        n_kernel = kernel.n_theta
        g_kernel = np.zeros(n_kernel)
        Gmm = np.zeros((m, m))
        g_z = np.zeros_like(Z) if learn_inducing else None
        dkdiag = kernel.diag_gradient(X) if n_kernel else None
        for sl in blocks:
            U = U_block(sl)
            G = 0.5 * np.outer(Ua, a[sl])
            G -= U * (0.5 * tau[sl] + c[sl])
            G += 0.5 * (PA @ Vt[sl].T) * tau[sl]
            Gmm += G @ U.T
            if n_kernel:
                for j, dK in enumerate(kernel.cross_gradient_iter(Z, X[sl])):
                    g_kernel[j] += 2.0 * np.vdot(G, dK)
            if learn_inducing:
                g_z += kernel.input_gradient(Z, X[sl], 2.0 * G)
        Gmm = 0.5 * (Gmm + Gmm.T)
        if n_kernel:
            for j, dK in enumerate(kernel.gradient_iter(Z)):
                g_kernel[j] -= np.vdot(Gmm, dK)
            g_kernel += c @ dkdiag
        grads = [g_kernel]
        if learn_likelihood:
            grads.append(_likelihood_gradient(likelihood, self.y, m_c, var_f, az, bz, power))
        if learn_inducing:
            g_z -= kernel.input_gradient(Z, Z, 2.0 * Gmm)
            grads.append(g_z.ravel())
        return np.concatenate(grads)

    # -- prediction --------------------------------------------------------------------------
    def latent(self, Xs):
        n_test = Xs.shape[0]
        mean = np.empty(n_test)
        var = np.empty(n_test)
        for s in range(0, n_test, _PREDICT_BATCH):
            sl = slice(s, min(s + _PREDICT_BATCH, n_test))
            Kms = self.kernel(self.Z, Xs[sl])                       # (m, batch)
            mean[sl] = self.weights @ Kms
            Pm = solve_triangular(self.chol_mm, Kms, lower=True)    # L⁻¹ k_m(x*)
            Pq = solve_triangular(self.factor, Pm, trans="T")       # R⁻ᵀ L⁻¹ k_m(x*)
            var[sl] = (self.kernel.diag(Xs[sl]) - np.einsum("ij,ij->j", Pm, Pm)
                       + np.einsum("ij,ij->j", Pq, Pq))
        return mean, np.maximum(var, 0.0)


def _likelihood_gradient(likelihood, y, cavity_mean, cavity_var, a, b, power):
    """``Σ_i (1/α) ∂ log Z_i/∂t`` for the learnable likelihood parameters (module docstring)."""
    if power == 1.0:
        return likelihood_theta_gradient(likelihood, y, cavity_mean, cavity_var)
    names, _, _ = likelihood_theta(likelihood)
    if names != ["log_noise"]:
        raise ValueError(f"learning the likelihood parameters {names} is not supported with power < 1")
    # Z = (2πσ²)^((1-α)/2) α^(-1/2) N(y; m, v + σ²/α):  ∂ log Z/∂σ² = (1-α)/(2σ²) + (a² - b)/(2α)
    s2 = likelihood.noise_variance
    return np.array([float(np.sum(0.5 * (1.0 - power) + s2 * (a * a - b) / (2.0 * power))) / power])


def _check_likelihood_learnable_with_power(likelihood, power):
    if power == 1.0:
        return
    names, _, _ = likelihood_theta(likelihood)
    if names != ["log_noise"]:
        raise ValueError("learn_likelihood with power < 1 is supported for the Gaussian noise variance only "
                         f"({type(likelihood).__name__} has {names}); use power=1 or learn_likelihood=False")


class _SparseGPBase(BaseEstimator):
    """Options, inducing inputs, the hyperparameter search and fitted state shared by the estimators."""

    def _engine_options(self):
        v.check_choice(self.schedule, "schedule", _SCHEDULES)
        v.check_choice(self.order, "order", _ORDERS)
        v.check_choice(self.negative_precision, "negative_precision", _POLICIES)
        v.check_choice(self.approximation, "approximation", _APPROXIMATIONS)
        power = v.check_in_range(self.power, "power", 0.0, 1.0, low_inclusive=False)
        damping = self.damping
        if damping is None:
            damping = 0.5 if self.schedule == "parallel" else 1.0
        damping = v.check_in_range(damping, "damping", 0.0, 1.0, low_inclusive=False)
        tol = v.check_positive(self.tol, "tol")
        max_sweeps = v.check_int(self.max_sweeps, "max_sweeps", minimum=1)
        n_quadrature = v.check_int(self.n_quadrature, "n_quadrature", minimum=1)
        if n_quadrature > 256:
            raise ValueError(f"n_quadrature must be <= 256, got {n_quadrature}")
        jitter = v.check_in_range(self.jitter, "jitter", 0.0, np.inf)
        if not np.isfinite(jitter):
            raise ValueError(f"jitter must be finite, got {jitter!r}")
        if self.optimizer not in (None, "L-BFGS-B"):
            raise ValueError(f"optimizer must be 'L-BFGS-B' or None, got {self.optimizer!r}")
        v.check_int(self.n_restarts_optimizer, "n_restarts_optimizer", minimum=0)
        for name in ("warm_start", "learn_inducing"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        rs = self.random_state
        if rs is None:
            seed = 0
        elif isinstance(rs, (int, np.integer)) and not isinstance(rs, bool) and rs >= 0:
            seed = int(rs)
        else:
            raise ValueError(f"random_state must be None or a non-negative integer, got {rs!r}")
        return {"schedule": _SCHEDULES[self.schedule], "order": _ORDERS[self.order], "seed": seed,
                "damping": float(damping), "tol": tol, "max_sweeps": max_sweeps,
                "negative_precision": _POLICIES[self.negative_precision], "jitter": jitter,
                "approximation": self.approximation, "power": float(power),
                "n_quadrature": n_quadrature}

    def _kernel(self):
        kernel = RBF() if self.kernel is None else self.kernel
        if not isinstance(kernel, Kernel):
            raise TypeError(f"kernel must be a fastep.kernels.Kernel, got {type(kernel).__name__}")
        return kernel

    def _check_kernel_gradients(self, kernel, X, learn_inducing):
        """The kernel must provide the sparse derivatives the optimiser will need (tried on one row of X)."""
        if self.optimizer is None:
            return
        x = X[:1]
        try:
            list(kernel.cross_gradient_iter(x, x))
            kernel.diag_gradient(x)
            if learn_inducing:
                kernel.input_gradient(x, x, np.ones((1, 1)))
        except NotImplementedError as exc:
            raise TypeError(f"kernel {kernel!r} cannot be used to learn a sparse GP: {exc} (use "
                            "optimizer=None, or learn_inducing=False if only input gradients are missing)"
                            ) from None

    def _inducing_inputs(self, X, options, kernel, likelihood, targets):
        """Initial inducing inputs from ``inducing_init`` / ``n_inducing`` (validated), one array per
        problem of ``targets`` (the same array except for ``'ivm'``, which selects per problem)."""
        n, dim = X.shape
        init = self.inducing_init
        if isinstance(init, str):
            v.check_choice(init, "inducing_init", _INDUCING_INITS)
            m = v.check_int(self.n_inducing, "n_inducing", minimum=1)
            if m > n:
                raise ValueError(f"n_inducing must be <= n_samples = {n}, got {m}")
            if init == "ivm":
                seed = options["seed"]
                return [np.ascontiguousarray(X[self._ivm_active_set(X, t, kernel, likelihood, m, seed)])
                        for t in targets]
            rng = np.random.default_rng(options["seed"])
            if init == "random":
                Z = np.ascontiguousarray(X[np.sort(rng.choice(n, size=m, replace=False))])
            else:
                Z = np.ascontiguousarray(kmeans_plus_plus(X, m, rng))
            return [Z] * len(targets)
        Z = v.as_float_matrix(init, "inducing_init")
        if Z.shape[1] != dim:
            raise ValueError(f"inducing_init must have {dim} columns (the number of features of X), got "
                             f"{Z.shape[1]}")
        if Z.shape[0] > n:
            raise ValueError(f"inducing_init must have at most n_samples = {n} rows, got {Z.shape[0]}")
        return [Z.copy()] * len(targets)

    def _fit_binary(self, X, y, Z, kernel, likelihood, options, learn_likelihood):
        """Fit one binary/regression problem, learning hyperparameters (and Z) if asked."""
        problem = _BinarySparseEP(kernel, likelihood, Z, X, y, options)
        n_kernel = kernel.n_theta
        learn_inducing = bool(self.learn_inducing)
        if learn_likelihood:
            _, lik_theta0, lik_bounds = likelihood_theta(likelihood)
        else:
            lik_theta0, lik_bounds = np.zeros(0), np.zeros((0, 2))
        n_lik = lik_theta0.size
        z0 = Z.ravel() if learn_inducing else np.zeros(0)
        theta0 = np.concatenate([kernel.theta, lik_theta0, z0])
        if self.optimizer is not None and theta0.size:
            z_bounds = np.tile([-np.inf, np.inf], (z0.size, 1))
            bounds = np.vstack([kernel.bounds.reshape(-1, 2), lik_bounds, z_bounds])

            def objective(theta):
                k, lik, Zt = self._unpack(theta, kernel, likelihood, Z, n_kernel, n_lik, learn_likelihood,
                                          learn_inducing)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", ConvergenceWarning)
                        value, grad, _ = problem.evaluate(k, lik, Zt, gradient=True,
                                                          learn_likelihood=learn_likelihood,
                                                          learn_inducing=learn_inducing,
                                                          warm=self.warm_start)
                except np.linalg.LinAlgError:
                    return -np.inf, np.zeros_like(theta)
                return value, grad

            rng = np.random.default_rng(options["seed"])
            # one BLAS thread for the optimiser too: L-BFGS-B's own small BLAS calls were ~6 ms
            # each with two OpenBLAS threads on the 2-core machine (n = 80, m = 10: 2.4 s -> 0.9 s)
            with _one_blas_thread():
                theta, _, _ = maximize_log_likelihood(objective, theta0, bounds,
                                                      n_restarts=self.n_restarts_optimizer, rng=rng)
            kernel, likelihood, Z = self._unpack(theta, kernel, likelihood, Z, n_kernel, n_lik,
                                                 learn_likelihood, learn_inducing)
        else:
            kernel = copy.deepcopy(kernel)
        problem.evaluate(kernel, likelihood, Z, gradient=False, learn_likelihood=False,
                         learn_inducing=False, warm=self.optimizer is not None and self.warm_start,
                         keep=True)
        info = problem.info
        if not info["converged"]:
            warnings.warn(
                f"sparse EP did not converge in {info['n_sweeps']} sweeps (max_sweeps={self.max_sweeps}); "
                f"the largest site-parameter change in the last sweep was {info['max_change']:.3g} and "
                f"the last change of log Z {info['log_z_change']:.3g} (tol={self.tol:g}). Increase "
                "max_sweeps, use damping < 1, or check the model.", ConvergenceWarning, stacklevel=4)
        return problem

    @staticmethod
    def _unpack(theta, kernel, likelihood, Z, n_kernel, n_lik, learn_likelihood, learn_inducing):
        k = kernel.clone_with_theta(theta[:n_kernel])
        lik = likelihood_with_theta(likelihood, theta[n_kernel:n_kernel + n_lik]) if learn_likelihood \
            else likelihood
        Zt = np.ascontiguousarray(theta[n_kernel + n_lik:].reshape(Z.shape)) if learn_inducing else Z
        return k, lik, Zt

    def _problem_log_ml(self, problem, theta, eval_gradient, learn_likelihood):
        learn_inducing = bool(self.learn_inducing)
        n_kernel = problem.kernel.n_theta
        n_lik = len(likelihood_theta(problem.likelihood)[1]) if learn_likelihood else 0
        expected = n_kernel + n_lik + (problem.Z.size if learn_inducing else 0)
        theta = v.as_float_vector(theta, "theta", length=expected)
        k, lik, Zt = self._unpack(theta, problem.kernel, problem.likelihood, problem.Z, n_kernel, n_lik,
                                  learn_likelihood, learn_inducing)
        saved = problem.site_precision, problem.site_natural_mean
        try:
            value, grad, _ = problem.evaluate(k, lik, Zt, gradient=eval_gradient,
                                              learn_likelihood=learn_likelihood,
                                              learn_inducing=learn_inducing, warm=False)
        finally:
            problem.site_precision, problem.site_natural_mean = saved
        return (value, grad) if eval_gradient else value

    def _set_fitted(self, X, problems):
        binary = len(problems) == 1
        stack = (lambda a: a[0]) if binary else np.stack
        self.n_features_in_ = X.shape[1]
        self._problems = problems
        self.kernel_ = problems[0].kernel if binary else [p.kernel for p in problems]
        self.likelihood_ = problems[0].likelihood if binary else [p.likelihood for p in problems]
        self.inducing_inputs_ = stack([p.Z for p in problems])
        self.log_marginal_likelihood_value_ = float(sum(p.log_ml for p in problems))
        self.site_precision_ = stack([p.site_precision for p in problems])
        self.site_natural_mean_ = stack([p.site_natural_mean for p in problems])
        self.n_sweeps_ = problems[0].info["n_sweeps"] if binary else np.array([p.info["n_sweeps"] for p in problems])
        self.converged_ = all(bool(p.info["converged"]) for p in problems)


_COMMON_PARAMS = """
    n_inducing : int, default 50
        Number m of inducing inputs (1 <= m <= n_samples) when ``inducing_init`` is a string.
    approximation : {'fitc', 'dtc'}, default 'fitc'
        Prior of the training latents: ``Q + diag(K - Q)`` (EP-FITC, the "generalized FITC"
        of Naish-Guzman & Holden) or ``Q`` (EP-DTC); slides "Sparse EP", "EP-FITC", "EP-DTC".
    power : float in (0, 1], default 1.0
        Power-EP α (slide "EP variants"): 1 is plain EP; α -> 0 approaches the variational
        (Titsias) bound. For α < 1 the likelihood needs a pointwise log density (probit with a
        finite slope, logistic, Gaussian); non-Gaussian sites then use Gauss-Hermite quadrature
        with ``n_quadrature`` nodes.
    inducing_init : {'kmeans++', 'random', 'ivm'} or array-like (m, n_features), default 'kmeans++'
        Seeded k-means++ (seeding plus 10 Lloyd steps), a seeded random subset of the training
        inputs, the active set of an IVM selection, or explicit inducing inputs (then
        ``n_inducing`` is ignored). ``'ivm'`` takes the m training inputs that the Informative
        Vector Machine includes greedily (Lawrence, Seeger & Herbrich 2005, §2, Algorithm 1),
        each maximising the entropy reduction of the ADF posterior (eq 26), under the
        estimator's initial kernel and likelihood held fixed: :class:`fastep.IVMClassifier` /
        :class:`fastep.IVMRegressor` with ``active_set_size=n_inducing``, ``optimizer=None``
        (no hyperparameter learning) and, for regression, the initial ``noise_variance`` and
        bias 0. Rows are in inclusion order. One-vs-rest, each binary problem starts from its
        own selection. Cost O(m² n) time, O(m n) memory per problem; the kernel must have a
        positive diagonal on X.
    learn_inducing : bool, default True
        Learn the inducing inputs with the hyperparameters (exact gradient).
    schedule : {'sequential', 'parallel'}, default 'sequential'
        One site at a time (O(m²) per site, rank-1 Cholesky updates) or every site from the
        same posterior (damped; O(nm²) per iteration).
    order : {'fixed', 'random'}, default 'fixed'
        Site order of the sequential schedule (random: a seeded permutation per sweep).
    damping : float in (0, 1] or None, default None
        None means 1 for 'sequential' and 0.5 for 'parallel'.
    tol : float, default 1e-6
        Convergence threshold on the relative site change and the relative change of log Z.
    max_sweeps : int, default 200
    negative_precision : {'clip', 'skip'}, default 'clip'
    n_quadrature : int in [1, 256], default 32
        Gauss-Hermite nodes of the powered site moments (power < 1, non-Gaussian likelihoods).
    optimizer : 'L-BFGS-B' or None, default 'L-BFGS-B'
        None keeps the hyperparameters and the inducing inputs fixed.
    n_restarts_optimizer : int, default 0
    jitter : float >= 0, default 1e-6
        Added to the diagonal of K_mm (absolute).
    random_state : int or None
        Seed of the inducing-input initialisation, the random site order and the restarts.
    warm_start : bool, default True
        Start each EP run of the optimiser from the previous evaluation's sites.
"""


class SparseGPClassifier(ClassifierMixin, _SparseGPBase):
    __doc__ = """Gaussian-process classifier fitted by sparse EP with inducing inputs (EP-FITC / EP-DTC / power EP).

    Same API as :class:`fastep.GaussianProcessClassifier` (``fit``, ``predict_proba``,
    ``predict_latent``, ``log_marginal_likelihood``, one-vs-rest for more than two classes),
    at O(nm²) time and O(nm) memory per EP sweep and per evidence gradient, with the inducing
    inputs learnt with the kernel hyperparameters by L-BFGS-B (exact gradients, module
    docstring of :mod:`fastep.sparse`). Predictions go through q(u | y): O(m) per test point
    for the mean, O(m²) for the variance.

    Parameters
    ----------
    kernel : fastep.kernels.Kernel, default RBF()
        Must provide ``cross_gradient_iter``/``diag_gradient`` (and ``input_gradient`` to learn
        Z) when an optimiser is used: every kernel of :mod:`fastep.kernels` (Linear, RBF, MLP
        and their ARD variants, White, Bias, sums and products) does.
    likelihood : Probit, Step or Logistic, default Probit()
    """ + _COMMON_PARAMS + """    learn_likelihood : bool, default False
        Also learn the likelihood's parameters (as the dense classifier; power = 1 only).

    Attributes
    ----------
    classes_ : ndarray
    kernel_, likelihood_ : fitted kernel and likelihood (lists, one-vs-rest)
    inducing_inputs_ : ndarray (m, n_features), or (n_classes, m, n_features) one-vs-rest
    log_marginal_likelihood_value_ : float (summed over one-vs-rest problems)
    site_precision_, site_natural_mean_ : ndarray (n,) or (n_classes, n)
        Sites on the projections of u (:mod:`fastep._epcore.sparse_ep`).
    n_sweeps_ : int or ndarray
    converged_ : bool
    """

    def __init__(self, kernel=None, likelihood=None, *, n_inducing=50, approximation="fitc", power=1.0,
                 inducing_init="kmeans++", learn_inducing=True, schedule="sequential", order="fixed",
                 damping=None, tol=1e-6, max_sweeps=200, negative_precision="clip", n_quadrature=32,
                 optimizer="L-BFGS-B", n_restarts_optimizer=0, learn_likelihood=False, jitter=1e-6,
                 random_state=None, warm_start=True):
        self.kernel = kernel
        self.likelihood = likelihood
        self.n_inducing = n_inducing
        self.approximation = approximation
        self.power = power
        self.inducing_init = inducing_init
        self.learn_inducing = learn_inducing
        self.schedule = schedule
        self.order = order
        self.damping = damping
        self.tol = tol
        self.max_sweeps = max_sweeps
        self.negative_precision = negative_precision
        self.n_quadrature = n_quadrature
        self.optimizer = optimizer
        self.n_restarts_optimizer = n_restarts_optimizer
        self.learn_likelihood = learn_likelihood
        self.jitter = jitter
        self.random_state = random_state
        self.warm_start = warm_start

    @staticmethod
    def _ivm_active_set(X, target, kernel, likelihood, m, seed):
        """Active set of a binary IVM selection at fixed kernel and likelihood (``inducing_init='ivm'``)."""
        ivm = IVMClassifier(kernel, likelihood, active_set_size=m, criterion="entropy", optimizer=None,
                            n_iterations=0, random_state=seed).fit(X, target)
        return ivm.active_set_

    def _likelihood(self):
        lik = Probit() if self.likelihood is None else self.likelihood
        if not isinstance(lik, (Probit, Step, Logistic)):
            raise TypeError("likelihood must be a binary likelihood (fastep.likelihoods.Probit, Step or "
                            f"Logistic), got {lik!r}")
        return lik

    def fit(self, X, y):
        """Fit the sparse EP posterior (and hyperparameters and Z unless ``optimizer=None``); returns self."""
        options = self._engine_options()
        kernel = self._kernel()
        likelihood = self._likelihood()
        if not isinstance(self.learn_likelihood, (bool, np.bool_)):
            raise TypeError(f"learn_likelihood must be a bool, got {type(self.learn_likelihood).__name__}")
        if self.learn_likelihood:
            likelihood_theta(likelihood)        # raises for parameters that cannot be learnt
            _check_likelihood_learnable_with_power(likelihood, options["power"])
        X, y = v.check_X_y(X, y)
        kernel._validate_X(X, "X")
        classes, targets = v.encode_one_vs_rest_labels(y)
        self._check_kernel_gradients(kernel, X, bool(self.learn_inducing))
        if options["power"] < 1.0:
            # the same check as the engine, before any work: a pointwise log density is needed
            _engine.power_moments_array(likelihood.site_spec(), np.ones(1), np.zeros(1), np.ones(1),
                                        power=options["power"], n_quadrature=options["n_quadrature"])
        Zs = self._inducing_inputs(X, options, kernel, likelihood, targets)
        problems = [self._fit_binary(X, t, Z, kernel, likelihood, options, bool(self.learn_likelihood))
                    for t, Z in zip(targets, Zs)]
        self.classes_ = classes
        self._set_fitted(X, problems)
        return self

    def log_marginal_likelihood(self, theta=None, eval_gradient=False):
        """EP log marginal likelihood (and its gradient) at ``theta``.

        ``theta`` concatenates ``kernel_.theta``, the likelihood's unconstrained parameters
        (if ``learn_likelihood``) and ``inducing_inputs_.ravel()`` (if ``learn_inducing``);
        None returns the fitted value.  One-vs-rest: the same ``theta`` for every class, the sum
        is returned.
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
        """Latent predictive mean and variance through q(u | y) (module docstring).

        Returns ``(mean, var)`` of shape (n_samples,), or (n_samples, n_classes) one-vs-rest.
        """
        check_is_fitted(self, "classes_")
        X = v.check_n_features(X, self.n_features_in_)
        out = [p.latent(X) for p in self._problems]
        if len(out) == 1:
            return out[0]
        return np.column_stack([m for m, _ in out]), np.column_stack([s for _, s in out])

    def predict_proba(self, X):
        """Class probabilities, columns ordered as ``classes_`` (as the dense classifier)."""
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


class SparseGPRegressor(RegressorMixin, _SparseGPBase):
    __doc__ = """Sparse GP regression (FITC, DTC or power EP with a Gaussian likelihood) through the same engine.

    At the fixed point (one sweep) the evidence is the closed-form FITC ``log N(y; 0, Q +
    diag(K - Q) + σ²I)``, DTC ``log N(y; 0, Q + σ²I)`` or, for power α, ``log N(y; 0, Q +
    α diag(K - Q) + σ²I) - (1-α)/(2α) Σ log(1 + α d_i/σ²)`` (α -> 0: the variational bound).

    Parameters
    ----------
    kernel : fastep.kernels.Kernel, default RBF()
    noise_variance : float > 0, default 1.0
    learn_noise : bool, default True
    """ + _COMMON_PARAMS + """
    Attributes
    ----------
    kernel_, noise_variance_, inducing_inputs_, log_marginal_likelihood_value_, site_precision_,
    site_natural_mean_, n_sweeps_, converged_
    """

    def __init__(self, kernel=None, noise_variance=1.0, *, learn_noise=True, n_inducing=50,
                 approximation="fitc", power=1.0, inducing_init="kmeans++", learn_inducing=True,
                 schedule="sequential", order="fixed", damping=None, tol=1e-6, max_sweeps=200,
                 negative_precision="clip", n_quadrature=32, optimizer="L-BFGS-B", n_restarts_optimizer=0,
                 jitter=1e-6, random_state=None, warm_start=True):
        self.kernel = kernel
        self.noise_variance = noise_variance
        self.learn_noise = learn_noise
        self.n_inducing = n_inducing
        self.approximation = approximation
        self.power = power
        self.inducing_init = inducing_init
        self.learn_inducing = learn_inducing
        self.schedule = schedule
        self.order = order
        self.damping = damping
        self.tol = tol
        self.max_sweeps = max_sweeps
        self.negative_precision = negative_precision
        self.n_quadrature = n_quadrature
        self.optimizer = optimizer
        self.n_restarts_optimizer = n_restarts_optimizer
        self.jitter = jitter
        self.random_state = random_state
        self.warm_start = warm_start

    @staticmethod
    def _ivm_active_set(X, y, kernel, likelihood, m, seed):
        """Active set of an IVM regression selection at fixed kernel and noise (``inducing_init='ivm'``).

        The bias is 0, the sparse model's prior mean (the entropy score of Gaussian sites does not
        depend on y anyway)."""
        ivm = IVMRegressor(kernel, noise_variance=likelihood.noise_variance, bias=0.0, learn_noise=False,
                           active_set_size=m, criterion="entropy", optimizer=None, n_iterations=0,
                           random_state=seed).fit(X, y)
        return ivm.active_set_

    def fit(self, X, y):
        """Fit the posterior (and hyperparameters and Z unless ``optimizer=None``); returns self."""
        options = self._engine_options()
        kernel = self._kernel()
        likelihood = Gaussian(noise_variance=v.check_positive(self.noise_variance, "noise_variance"))
        if not isinstance(self.learn_noise, (bool, np.bool_)):
            raise TypeError(f"learn_noise must be a bool, got {type(self.learn_noise).__name__}")
        X, y = v.check_X_y(X, y, y_numeric=True)
        kernel._validate_X(X, "X")
        self._check_kernel_gradients(kernel, X, bool(self.learn_inducing))
        if self.learn_noise:
            _check_likelihood_learnable_with_power(likelihood, options["power"])
        (Z,) = self._inducing_inputs(X, options, kernel, likelihood, [y])
        problem = self._fit_binary(X, y, Z, kernel, likelihood, options, bool(self.learn_noise))
        self._set_fitted(X, [problem])
        self.noise_variance_ = float(problem.likelihood.noise_variance)
        return self

    def log_marginal_likelihood(self, theta=None, eval_gradient=False):
        """Log marginal likelihood (and gradient) at ``theta`` (kernel theta, log σ² if ``learn_noise``,
        ``inducing_inputs_.ravel()`` if ``learn_inducing``)."""
        check_is_fitted(self, "inducing_inputs_")
        if theta is None:
            if eval_gradient:
                raise ValueError("eval_gradient=True requires theta")
            return self.log_marginal_likelihood_value_
        return self._problem_log_ml(self._problems[0], theta, eval_gradient, bool(self.learn_noise))

    def predict_latent(self, X):
        """Posterior mean and variance of the latent function through q(u | y)."""
        check_is_fitted(self, "inducing_inputs_")
        X = v.check_n_features(X, self.n_features_in_)
        return self._problems[0].latent(X)

    def predict(self, X, return_std=False):
        """Predictive mean (and standard deviation of y, including the noise, if ``return_std``)."""
        mean, var = self.predict_latent(X)
        if return_std:
            return mean, np.sqrt(var + self.noise_variance_)
        return mean
