"""The dense GP EP problem: one binary (or regression) problem's EP runs on the n×n kernel
matrix, its evidence gradient and its prediction state (Minka §2, eqs 77-88).

The compiled engine :class:`fastep._epcore.gp_ep.DenseEP` runs the EP sweeps; the search
(:meth:`fastep._gp.problem.SiteProblem.fit`) evaluates the problem at each point.

Prediction (R&W Alg. 3.6): with ``s = sqrt(site_precision)``,
``B = I + S^½ K S^½ = L Lᵀ`` and ``b = (K + S⁻¹)⁻¹ S⁻¹ ν = ν − s ⊙ B⁻¹(s ⊙ K ν)``,
the latent predictive at ``x*`` is ``N(k*ᵀ b, k** − |L⁻¹(s ⊙ k*)|²)``.

Evidence gradient (at the fixed point only the explicit dependence on K counts):
``∂ log Z/∂θ_j = ½ bᵀ (∂K/∂θ_j) b − ½ tr(R ∂K/∂θ_j)`` with ``R = S^½ B⁻¹ S^½``;
likelihood parameters: ``Σ_i ∂ log Z_i/∂φ`` at the final cavities
(:meth:`fastep.likelihoods.Likelihood.theta_gradient`).

Memory: during EP, K, the posterior covariance and one engine work array (three n×n
float64 arrays); the gradient reuses the posterior-covariance buffer for B's factor and R,
plus one ∂K/∂θ_j at a time. A fitted binary model keeps the n×n Cholesky factor of B for
predictive variances.
"""
import contextlib
from typing import NamedTuple

import numpy as np
from scipy.linalg import lapack, solve_triangular

from .._epcore import gp_ep as _engine
from .._gp.fit_options import DenseFitOptions
from .._gp.hyperparameters import Hyperparameters
from .._gp.predictor import DensePredictor
from .._gp.problem import WARM_START_FAILURES, SiteProblem
from .._linalg import inner, matmul, symmetrize_from_lower
from ..progress import sweep_callback_of

__all__ = ["DenseGPProblem", "DenseEPState"]


class DenseEPState(NamedTuple):
    """One dense EP run's result: the sites it ended at, the posterior mean, the final cavities
    and the engine's summary (the Cholesky factor of B is left in the run's buffer)."""

    site_precision: np.ndarray
    site_natural_mean: np.ndarray
    post_mean: np.ndarray
    cavity_mean: np.ndarray
    cavity_var: np.ndarray
    info: _engine.DenseEPResult


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


class DenseGPProblem(SiteProblem):
    """One binary (or regression) GP EP problem: EP runs, evidence, gradient, prediction state."""

    options_class = DenseFitOptions

    #: The search runs EP to the estimator's ``tol``: a sweep warm-started from the previous
    #: evaluation's sites costs a fraction of the evaluation's kernel and factorisation work, and
    #: looser EP gave gradients inconsistent enough to stall L-BFGS-B's line searches.
    search_tol = None

    def __init__(self, kernel, likelihood, X, y, options, learn_likelihood):
        super().__init__(kernel, likelihood, X, y, options,
                         Hyperparameters(kernel, likelihood, learn_likelihood, hyperprior=options.hyperprior))
        self.learn_likelihood = learn_likelihood

    # -- EP --------------------------------------------------------------------------------
    def _kernel_matrix(self, kernel):
        K = np.ascontiguousarray(kernel._K(self.X, None), dtype=np.float64)
        if self.options.jitter:
            K.flat[:: K.shape[0] + 1] += self.options.jitter
        if not np.all(np.isfinite(K)):
            raise ValueError(f"the kernel {kernel!r} produced non-finite values on X")
        if not np.all(K.diagonal() > 0):
            raise np.linalg.LinAlgError(
                "the kernel matrix has a non-positive diagonal entry, so it is not positive "
                "semi-definite; increase jitter or add a White kernel term")
        return K

    @staticmethod
    def _new_engine_options(opts):
        return _engine.DenseEPOptions(
            schedule=opts.schedule, order=opts.order, damping=opts.damping, tol=opts.tol,
            max_sweeps=opts.max_sweeps, negative_precision=opts.negative_precision,
            block_size=opts.block_size, refresh_every=opts.refresh_every)

    def _ep(self, K, buffer, likelihood, warm):
        """One EP run on ``K`` from the stored sites (``warm``) or zero sites; B's factor is left
        in ``buffer``."""
        opts = self.options
        n = K.shape[0]
        tau, nu = self._start_sites(warm)
        post_mean = np.empty(n)
        post_var = np.empty(n)
        cavity_mean = np.empty(n)
        cavity_var = np.empty(n)
        # OUTPUT_FACTOR: the buffer comes back holding L = chol(I + S^½ K S^½), which is
        # all the evidence gradient and prediction need (Σ itself is never formed at the end)
        engine = _engine.DenseEP(K, self.y, likelihood.site_spec(), self.engine_options(), output=_engine.OUTPUT_FACTOR,
                                 seed=opts.seed, validate=False)
        info = engine.run(tau, nu, buffer, post_mean, post_var=post_var,
                          cavity_mean=cavity_mean, cavity_var=cavity_var,
                          sweep_callback=sweep_callback_of(opts))
        if not np.isfinite(info.log_z):
            if info.n_failed:
                raise np.linalg.LinAlgError(
                    f"EP could not form a proper cavity at {info.n_failed} site(s) and the log marginal "
                    "likelihood is not finite: the kernel matrix is probably not positive semi-definite; "
                    "increase jitter or add a White kernel term")
            # every cavity proper, yet log Z overflowed: site precisions so large against the kernel
            # (a noise variance near its lower bound, say) that B = I + S^½ K S^½ is numerically singular
            raise np.linalg.LinAlgError(
                f"EP's log marginal likelihood is not finite at {likelihood!r} with this kernel: the site "
                f"precisions (up to {float(np.max(tau)):.3g}) make the kernel matrix numerically singular; "
                "increase jitter, add a White kernel term or bound the noise_variance")
        return DenseEPState(tau, nu, post_mean, cavity_mean, cavity_var, info)

    @staticmethod
    def _weights(K, L, tau, nu, s):
        """``b = (K + S⁻¹)⁻¹ S⁻¹ ν`` (= ``ν - R K ν``, R&W Alg. 3.5/3.6), without cancellation.

        With P the sites with ``τ_i > 0``, ``r = S^-½ ν`` on P (0 elsewhere) and ``t = K ν``
        over the other sites, ``S^½ K ν = (B - I) r + S^½ t`` gives
        ``b = ν - S^½ B⁻¹ S^½ K ν = ν_Z + S^½ w`` with ``w = B⁻¹ (r - S^½ t)``
        (as ``gp_ep.gp_log_z_stable``). The textbook ``ν - s ⊙ B⁻¹ (s ⊙ K ν)`` subtracts two
        vectors of size ``τ_i |m̃_i|`` whose difference is O(1), losing digits at large site
        precisions.
        """
        pos = tau > 0
        nu_zero = np.where(pos, 0.0, nu)
        t = matmul(K, nu_zero) if np.any(nu_zero) else np.zeros_like(nu)
        rhs = np.zeros_like(nu)
        rhs[pos] = nu[pos] / s[pos] - s[pos] * t[pos]
        w = solve_triangular(L, solve_triangular(L, rhs, lower=True), lower=True, trans="T")
        return nu_zero + s * w

    def evaluate(self, params, *, gradient, warm, keep=False):
        """EP at ``params`` = ``(kernel, likelihood, None)``, its evidence gradient (``gradient``)
        and, with ``keep``, the prediction state (Cholesky factor, weights); ``(log_z, grad or None,
        info)``."""
        kernel, likelihood, _ = params
        K = self._kernel_matrix(kernel)
        buffer = np.empty(K.shape)
        state = None
        if warm and self._has_sites():
            with contextlib.suppress(*WARM_START_FAILURES):
                state = self._ep(K, buffer, likelihood, warm=True)
        if state is None or state.info.n_failed:
            state = self._ep(K, buffer, likelihood, warm=False)
        n = K.shape[0]
        tau, nu, info = state.site_precision, state.site_natural_mean, state.info
        self.site_precision, self.site_natural_mean = tau, nu
        grad = None
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
                symmetrize_from_lower(R)
                R *= s[:, None]
                R *= s[None, :]
                for dK in kernel._grads(self.X, list(range(kernel.n_theta))):
                    grads.append(0.5 * inner(matmul(weights, dK), weights) - 0.5 * inner(R, dK))
                del R, inv
            if self.learn_likelihood:
                # the engine's cavities (from B's factor; 1/Σ_ii - τ_i cancels at huge τ_i)
                grads.extend(likelihood.theta_gradient(self.y, state.cavity_mean, state.cavity_var))
            grad = np.array(grads, dtype=float)
            if keep:  # the factor was overwritten by R: refactorise for prediction
                np.multiply(K, s[:, None], out=buffer)
                buffer *= s[None, :]
                buffer.flat[:: n + 1] += 1.0
                L = _cholesky_lower_inplace(buffer)
        if keep:
            self.kernel, self.likelihood = kernel, likelihood
            self.predictor = DensePredictor(kernel, self.X, weights, L, s)
            self.log_ml, self.info = float(info.log_z), info
        return float(info.log_z), grad, info
