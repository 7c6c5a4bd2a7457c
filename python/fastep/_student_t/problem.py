"""GP regression with Student-t noise by fractional EP: one problem's runs, evidence and gradient.

Jylänki, Vanhatalo & Vehtari, "Robust Gaussian process regression with a Student-t
likelihood" (JMLR 2011). The compiled engine :mod:`fastep._epcore.student_t_ep` runs damped
parallel fractional EP (sites of any sign; the posterior kept as ``L_K A⁻¹ L_Kᵀ``); this module
builds K, learns the kernel and the likelihood's ν and σ by L-BFGS-B on the EP evidence and
predicts.

Evidence gradient at the fixed point (the fractional EP energy is stationary in the sites and
cavities, so only the explicit dependence counts; the paper's §4.3):

* kernel: ``∂ log Z/∂θ_j = ½ bᵀ ∂K_j b - ½ tr(M ∂K_j)`` with ``b = ν - T μ`` and
  ``M = (K + T⁻¹)⁻¹ = T - T Σ T`` (defined for τ of any sign, including 0);
* ν and σ: ``(1/η) Σ_i ∂ log Ẑ_i/∂φ`` at the final cavities (tilted expectations by quadrature,
  :meth:`fastep.likelihoods.StudentT.powered_moments`).

Prediction: ``E[f*] = k*ᵀ b``, ``Var[f*] = k** - k*ᵀ M k*`` (R&W eqs 3.60-3.61 with the sites
in place of the noise).
"""
import contextlib
from typing import NamedTuple

import numpy as np
from scipy.linalg import cho_factor

from .._student_t.double_loop import DenseDoubleLoopEP
from .._epcore import student_t_ep as _engine
from .._gp.fit_options import DenseFitOptions
from .._gp.hyperparameters import Hyperparameters
from .._gp.problem import WARM_START_FAILURES, SiteProblem
from .._prediction import BatchedPredictor
from .._linalg import inner, matmul
from ..progress import sweep_callback_of

__all__ = ["StudentTGPProblem", "StudentTEPState"]


#: Outer iterations of the double-loop fallback per ``max_sweeps``: it converges linearly, and a
#: few hundred outer iterations are common where parallel EP stalls.
DOUBLE_LOOP_SWEEPS = 5

#: Relative jitters tried, in turn, when the kernel matrix is numerically singular.
JITTER_LADDER = (0.0, 1e-10, 1e-8, 1e-6)


def dense_kernel_matrix(kernel, X, jitter):
    """``K(X, X) + jitter I``, positive definite, as a C-contiguous float64 array.

    The Student-t engine factorises K itself (sites of either sign need ``K⁻¹`` to exist). A
    kernel matrix whose Cholesky factorisation fails gets the first sufficient extra jitter
    from :data:`JITTER_LADDER` (times the mean of its diagonal) before giving up with
    ``numpy.linalg.LinAlgError``.
    """
    K = np.ascontiguousarray(kernel._K(X, None), dtype=np.float64)
    if jitter:
        K.flat[:: K.shape[0] + 1] += jitter
    if not np.all(np.isfinite(K)):
        raise ValueError(f"the kernel {kernel!r} produced non-finite values on X")
    level = float(np.mean(K.diagonal())) if K.size else 1.0
    for extra in JITTER_LADDER:
        trial = K if extra == 0.0 else K + (extra * level) * np.eye(K.shape[0])
        try:
            cho_factor(trial, lower=True, check_finite=False)
        except np.linalg.LinAlgError:
            continue
        return np.ascontiguousarray(trial)
    raise np.linalg.LinAlgError(
        "the kernel matrix is not positive definite even with a relative jitter of "
        f"{JITTER_LADDER[-1]:g}; increase jitter or add a White kernel term")


class StudentTPredictor(BatchedPredictor):
    """Latent predictive of a GP posterior whose sites may have negative precisions.

    Parameters
    ----------
    kernel : Kernel
    X_basis : ndarray (n, n_features)
    weights : ndarray (n,)
        ``b = (K + T⁻¹)⁻¹ μ̃ = ν - T μ``.
    inverse : ndarray (n, n)
        ``M = (K + T⁻¹)⁻¹ = T - T Σ T``.
    """

    def __init__(self, kernel, X_basis, weights, inverse):
        self.kernel = kernel
        self.X_basis = X_basis
        self.weights = weights
        self.inverse = inverse

    def _latent_batch(self, X):
        Ks = self.kernel._K(X, self.X_basis)
        return (matmul(Ks, self.weights),
                self.kernel._diag(X) - np.einsum("ij,ij->i", matmul(Ks, self.inverse), Ks))


class StudentTEPState(NamedTuple):
    """One dense fractional EP run's result: the sites it ended at, the posterior mean and
    covariance, the final cavities and the summary of the run that produced them."""

    site_precision: np.ndarray
    site_natural_mean: np.ndarray
    post_mean: np.ndarray
    post_cov: np.ndarray
    cavity_mean: np.ndarray
    cavity_var: np.ndarray
    info: _engine.StudentTEPResult


class RejectStuckDuringSearch:
    """Policy of the fractional-EP problems: during the type-II ML search (evaluations with a
    gradient) a run that found no proper step is a failed evaluation (``LinAlgError``, which the
    search counts as ``-inf``): its energy is not at a fixed point and can be far above the
    evidence. The final run at the learnt point keeps its result and warns instead."""

    def _fractional_result(self, info, arrays, search, run_double_loop):
        """``(info, arrays)`` of the run to keep after parallel fractional EP.

        A run of the search (``search``) that found no proper step raises ``LinAlgError``.
        Otherwise, if the parallel run stalled or did not converge (and was not stopped, outside
        the search), ``run_double_loop(copies of arrays)`` continues from its state; its result
        is kept unless it ended with an improper cavity (a non-finite energy), in which case the
        parallel run stands. Sets ``self.algorithm`` to what produced the kept result.
        """
        if info.stuck and search:
            raise np.linalg.LinAlgError(f"{self.algorithm} found no step that keeps the posterior proper")
        self.algorithm = type(self).algorithm
        if not (info.stuck or not info.converged) or info.stopped or search:
            return info, arrays
        trial = [a.copy() for a in arrays]
        fallback = run_double_loop(trial)
        if not np.isfinite(fallback.log_z):
            return info, arrays
        self.algorithm = f"{type(self).algorithm} (double-loop fallback)"
        return fallback.replace(n_sweeps=fallback.n_sweeps + info.n_sweeps, n_halvings=info.n_halvings), trial


class StudentTGPProblem(RejectStuckDuringSearch, SiteProblem):
    """One robust regression problem: fractional EP runs, evidence, gradient, prediction state.

    Its :class:`~fastep._gp.fit_options.DenseFitOptions` set ``power`` (η) and ``max_halvings``. A run of
    parallel fractional EP that stalls or does not converge continues with the double-loop
    algorithm (:mod:`fastep._student_t.double_loop`) from its last sites, except during the type-II
    ML search, where a stalled run is a failed evaluation (:class:`RejectStuckDuringSearch`).
    """

    options_class = DenseFitOptions

    algorithm = "fractional EP"
    search_tol = 1e-2

    def __init__(self, kernel, likelihood, X, y, options, learn_likelihood):
        super().__init__(kernel, likelihood, X, y, options,
                         Hyperparameters(kernel, likelihood, learn_likelihood, hyperprior=options.hyperprior))
        self.learn_likelihood = learn_likelihood

    @staticmethod
    def _new_engine_options(opts):
        return _engine.StudentTEPOptions(power=opts.power, damping=opts.damping, tol=opts.tol,
                                         max_sweeps=opts.max_sweeps, max_halvings=opts.max_halvings)

    def _ep(self, K, likelihood, warm, search):
        """One fractional EP run on ``K`` from the stored sites (``warm``) or zero sites
        (``search``: a run of the type-II ML search)."""
        opts = self.options
        n = K.shape[0]
        tau, nu = self._start_sites(warm)
        post_mean, post_var = np.empty(n), np.empty(n)
        cavity_mean, cavity_var = np.empty(n), np.empty(n)
        post_cov = np.empty((n, n))
        engine = _engine.DenseStudentTEP(K, self.y, likelihood.dof, likelihood.scale, self.engine_options(),
                                         validate=False)
        info = engine.run(tau, nu, post_mean, post_var, cavity_mean=cavity_mean, cavity_var=cavity_var,
                          post_cov=post_cov, sweep_callback=sweep_callback_of(opts))
        info, arrays = self._fractional_result(
            info, [tau, nu, post_mean, post_var, cavity_mean, cavity_var, post_cov], search,
            lambda a: DenseDoubleLoopEP(
                K, self.y, likelihood.dof, likelihood.scale, power=opts.power, tol=opts.tol,
                max_outer=DOUBLE_LOOP_SWEEPS * opts.max_sweeps).run(
                *a[:4], cavity_mean=a[4], cavity_var=a[5], post_cov=a[6], sweep_callback=sweep_callback_of(opts)))
        tau, nu, post_mean, post_var, cavity_mean, cavity_var, post_cov = arrays
        if not np.isfinite(info.log_z):
            raise np.linalg.LinAlgError(
                f"fractional EP's log marginal likelihood is not finite at {likelihood!r} with this kernel; "
                "increase jitter or add a White kernel term")
        return StudentTEPState(tau, nu, post_mean, post_cov, cavity_mean, cavity_var, info)

    def evaluate(self, params, *, gradient, warm, keep=False):
        """Fractional EP at ``params`` = ``(kernel, likelihood, None)``, its evidence gradient
        (``gradient``: a run of the search, which rejects a stuck run) and, with ``keep``, the
        prediction state; ``(log_z, grad or None, info)``."""
        kernel, likelihood, _ = params
        K = dense_kernel_matrix(kernel, self.X, self.options.jitter)
        state = None
        if warm and self._has_sites():
            with contextlib.suppress(*WARM_START_FAILURES):
                state = self._ep(K, likelihood, True, gradient)
        if state is None or state.info.n_failed:
            state = self._ep(K, likelihood, False, gradient)
        del K                           # what the gradient no longer needs is freed before it runs
        tau, nu, info = state.site_precision, state.site_natural_mean, state.info
        self.site_precision, self.site_natural_mean = tau, nu
        weights = nu - tau * state.post_mean                    # b = ν - T μ
        inverse = state.post_cov                                # M = T - T Σ T, in Σ's memory
        inverse *= -tau[:, None]
        inverse *= tau[None, :]
        inverse.flat[:: tau.shape[0] + 1] += tau
        grad = None
        if gradient:
            grads = [0.5 * inner(matmul(weights, dK), weights) - 0.5 * inner(inverse, dK)
                     for dK in kernel._grads(self.X, list(range(kernel.n_theta)))]
            if self.learn_likelihood:
                proper = state.cavity_var > 0
                grads.extend(likelihood.theta_gradient(self.y[proper], state.cavity_mean[proper],
                                                       state.cavity_var[proper], power=self.options.power))
            grad = np.array(grads, dtype=float)
        if keep:
            self.kernel, self.likelihood = kernel, likelihood
            self.predictor = StudentTPredictor(kernel, self.X, weights, inverse)
            self.log_ml, self.info = float(info.log_z), info
        return float(info.log_z), grad, info
