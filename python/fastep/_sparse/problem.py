"""One sparse GP EP problem (EP-FITC, EP-DTC, power EP): EP runs, the evidence, its exact
gradient and the prediction state, for :mod:`fastep.sparse`.

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
``Logistic(method='mackay')`` at power 1 the gradient is approximate (a few per cent off
central differences, as for the dense :class:`fastep.GaussianProcessClassifier`); use
``method='gauss-hermite'`` for exact gradients.  The n-dimension is processed in blocks of columns, so the
extra memory is O(m · block).  Likelihood parameters: ``Σ_i (1/α) ∂ log Z_i/∂φ`` at the final
cavities (:meth:`fastep.likelihoods.Likelihood.theta_gradient` for α = 1; for α < 1 only the Gaussian noise
variance, in closed form).
"""
import contextlib
from typing import NamedTuple

import numpy as np

from .._epcore import sparse_ep as _engine
from .._epcore import student_t_ep as _student_t_engine
from .._gp.fit_options import SparseFitOptions
from .._gp.hyperparameters import Hyperparameters
from .._gp.problem import WARM_START_FAILURES, SiteProblem
from ..progress import sweep_callback_of
from .._sparse.blocks import (SparsePredictor, block_rows, gradient_first_sums, gradient_from_sums,
                             gradient_second_sums, project_rows, times_inverse_a)
from .._student_t.double_loop import SparseDoubleLoopEP
from .._student_t.problem import DOUBLE_LOOP_SWEEPS, RejectStuckDuringSearch


class SparseEPState(NamedTuple):
    """One sparse EP run's result: the sites it ended at, the Cholesky factor R of
    ``A = I + V T Vᵀ``, the posterior mean μ_w of the weights, the posterior mean and variance of
    the projections g, and the engine's summary (a Student-t problem's: its engine's)."""

    site_precision: np.ndarray
    site_natural_mean: np.ndarray
    R: np.ndarray
    w_mean: np.ndarray
    g_mean: np.ndarray
    g_var: np.ndarray
    info: _engine.SparseEPResult | _student_t_engine.StudentTEPResult


class _BinarySparseEP(SiteProblem):
    """One binary (or regression) sparse EP problem: EP runs, evidence, gradient, prediction state."""

    options_class = SparseFitOptions

    algorithm = "sparse EP"

    def __init__(self, kernel, likelihood, Z, X, y, options, learn_likelihood, learn_inducing):
        super().__init__(kernel, likelihood, X, y, options,
                         Hyperparameters(kernel, likelihood, learn_likelihood, extra=Z if learn_inducing else None,
                                         hyperprior=options.hyperprior))
        self.Z = Z
        self.learn_likelihood = learn_likelihood
        self.learn_inducing = learn_inducing

    # -- EP --------------------------------------------------------------------------------
    def _run_arrays(self, Vt, warm):
        """What one EP run on the projections ``Vt`` (n x m) updates (the fields of
        :class:`SparseEPState` but ``info``): the sites it starts from
        (:meth:`SiteProblem._start_sites`), and R, μ_w, E[g] and Var[g]."""
        n, m = Vt.shape
        tau, nu = self._start_sites(warm)
        return [tau, nu, np.empty((m, m)), np.empty(m), np.empty(n), np.empty(n)]

    @staticmethod
    def _finished(arrays, info, failure):
        """The state of a finished run (``arrays`` as :meth:`_run_arrays` orders them, and ``info``);
        ``LinAlgError(failure)`` when its log marginal likelihood is not finite."""
        if not np.isfinite(info.log_z):
            raise np.linalg.LinAlgError(failure)
        return SparseEPState(*arrays, info)

    @staticmethod
    def _new_engine_options(opts):
        return _engine.SparseEPOptions(
            power=opts.power, n_quadrature=opts.n_quadrature, schedule=opts.schedule,
            order=opts.order, damping=opts.damping, tol=opts.tol, max_sweeps=opts.max_sweeps,
            negative_precision=opts.negative_precision)

    def _ep(self, Vt, d, likelihood, warm, search):
        """One EP run on the projections from the stored sites (``warm``) or zero sites (``search``:
        a run of the type-II ML search)."""
        opts = self.options
        arrays = self._run_arrays(Vt, warm)
        tau, nu, R, w_mean, g_mean, g_var = arrays
        engine = _engine.SparseEP(Vt, d, self.y, likelihood.site_spec(), self.engine_options(), seed=opts.seed,
                                  validate=False)
        info = engine.run(tau, nu, R, w_mean, g_mean=g_mean, g_var=g_var,
                          sweep_callback=sweep_callback_of(opts))
        return self._finished(arrays, info, f"sparse EP could not form a proper cavity at {info.n_failed} site(s) "
                              "and the log marginal likelihood is not finite; increase jitter or check the kernel")

    def evaluate(self, params, *, gradient, warm, keep=False):
        """EP at ``params`` = ``(kernel, likelihood, Z)`` (Z None: the stored inducing inputs);
        ``(log_z, grad or None, info)``. The gradient is ordered as kernel theta, likelihood theta
        (if ``learn_likelihood``), ``Z.ravel()`` (if ``learn_inducing``). With ``keep`` the
        prediction state is stored."""
        kernel, likelihood, Z = params
        if Z is None:
            Z = self.Z
        Kmm = np.ascontiguousarray(kernel._K(Z, None), dtype=np.float64)
        L, Vt, d = project_rows(kernel, self.X, Z, Kmm, self.options)
        state = None
        if warm and self._has_sites():
            with contextlib.suppress(*WARM_START_FAILURES):
                state = self._ep(Vt, d, likelihood, True, gradient)
        if state is None or state.info.n_failed:
            state = self._ep(Vt, d, likelihood, False, gradient)
        self.site_precision, self.site_natural_mean = state.site_precision, state.site_natural_mean
        grad = None
        if gradient:
            grad = self._gradient(kernel, likelihood, Z, L, Vt, d, state, self.learn_likelihood,
                                  self.learn_inducing)
        info = state.info
        if keep:
            self.kernel, self.likelihood, self.Z = kernel, likelihood, Z
            self.predictor = SparsePredictor(kernel, likelihood, Z, L, state.R, state.w_mean)
            self.log_ml, self.info = float(info.log_z), info
        return float(info.log_z), grad, info

    def _gradient(self, kernel, likelihood, Z, L, Vt, d, state, learn_likelihood, learn_inducing):
        opts = self.options
        X, y = self.X, self.y
        n, m = Vt.shape
        tau, nu, g_mean, g_var = state.site_precision, state.site_natural_mean, state.g_mean, state.g_var
        block = min(n, block_rows(m))
        blocks = [slice(s, min(s + block, n)) for s in range(0, n, block)]
        P, Ua, lik_grad, ac = 0.0, 0.0, 0.0, []
        for sl in blocks:
            P_b, Ua_b, lik_b, a, c = gradient_first_sums(L, Vt[sl], d[sl], y[sl], tau[sl], nu[sl],
                                                         g_mean[sl], g_var[sl], likelihood, opts,
                                                         learn_likelihood)
            P, Ua, lik_grad = P + P_b, Ua + Ua_b, lik_grad + lik_b
            ac.append((a, c))
        PA = times_inverse_a(P, state.R)
        g_kernel, Gmm, g_z = 0.0, 0.0, 0.0
        for sl, (a, c) in zip(blocks, ac):
            gk_b, Gmm_b, gz_b = gradient_second_sums(kernel, Z, X[sl], L, Vt[sl], tau[sl], a, c, Ua, PA,
                                                     learn_inducing)
            g_kernel, Gmm = g_kernel + gk_b, Gmm + Gmm_b
            g_z = g_z + gz_b if learn_inducing else None
        return gradient_from_sums(kernel, Z, g_kernel, Gmm, g_z, lik_grad, learn_likelihood,
                                  learn_inducing)



class _StudentTSparseEP(RejectStuckDuringSearch, _BinarySparseEP):
    """Robust sparse regression: fractional EP with Student-t sites that may be negative
    (:class:`fastep._epcore.student_t_ep.SparseStudentTEP`); the evidence gradient is the
    sparse one (its formulas hold for sites of any sign). A run that stalls or does not
    converge continues with the sparse double loop
    (:class:`fastep._student_t.double_loop.SparseDoubleLoopEP`) from its last sites, except
    during the type-II ML search (:class:`RejectStuckDuringSearch`)."""

    algorithm = "sparse fractional EP"
    search_tol = 1e-2

    @staticmethod
    def _new_engine_options(opts):
        return _student_t_engine.StudentTEPOptions(
            power=opts.power, n_quadrature=opts.n_quadrature, damping=opts.damping, tol=opts.tol,
            max_sweeps=opts.max_sweeps, max_halvings=opts.max_halvings)

    def _ep(self, Vt, d, likelihood, warm, search):
        opts = self.options
        arrays = self._run_arrays(Vt, warm)
        engine = _student_t_engine.SparseStudentTEP(Vt, d, self.y, likelihood.site_spec(), self.engine_options(),
                                                    validate=False)
        info = engine.run(*arrays[:4], g_mean=arrays[4], g_var=arrays[5], sweep_callback=sweep_callback_of(opts))
        info, arrays = self._fractional_result(
            info, arrays, search,
            lambda a: SparseDoubleLoopEP(
                Vt, d, self.y, likelihood.dof, likelihood.scale, power=opts.power, tol=opts.tol,
                max_outer=DOUBLE_LOOP_SWEEPS * opts.max_sweeps).run(
                *a[:4], g_mean=a[4], g_var=a[5], sweep_callback=sweep_callback_of(opts)))
        return self._finished(arrays, info, f"sparse fractional EP's log marginal likelihood is not finite at "
                              f"{likelihood!r}; increase jitter or check the kernel")
