"""Multiclass GP classification by nested EP (multinomial probit): one problem's EP, evidence, gradient.

Riihimäki, Jylänki & Vehtari, "Nested expectation propagation for Gaussian process
classification with a multinomial probit likelihood" (JMLR 14, 2013). c latent functions
``f_j ~ GP(0, k)`` (one shared kernel), ``p(y_i = k | f_i) = ∫ N(u) Π_{j≠k} Φ(u + f_ik - f_ij) du``.
The site kernel (inner EP, :mod:`fastep._epcore.multiclass_ep`) gives every outer site the
structured precision ``T̃_i = D_i - D_i 1 1ᵀ D_i / S_i`` (``D_i = diag(π_i)``, ``S_i = 1ᵀπ_i``,
π >= 0) and the linear term ``ν̃_i``; the compiled engine
:class:`~fastep._epcore.multiclass_ep.MultinomialEP` runs damped parallel outer EP on the O(c n³)
posterior algebra of the paper's §4 (eqs 16-20) that this module does (:class:`MultinomialPosterior`,
handed to the engine by :func:`dense_posterior_of`):

* per class, ``B_j = I + D_j^½ K D_j^½ = L_j L_jᵀ`` and ``M_j = (K + D_j⁻¹)⁻¹ = D_j^½ B_j⁻¹ D_j^½``;
* ``C = Σ_j M_j`` (n×n; ``= S - Rᵀ D Σ₀ D R``), ``C = L_C L_Cᵀ``, ``E_j = L_C⁻¹ M_j``;
* the posterior ``Σ = (K⁻¹ ⊗ I + Π)⁻¹ = Σ₀ + Σ₀ D R C⁻¹ Rᵀ D Σ₀`` with
  ``Σ₀ = blkdiag(K - K M_j K)`` and ``Σ₀ D R = [K M_j]_j``, so the c×c block of input i is
  ``Σ_i[j, l] = δ_jl (K - K M_j K)_ii + (E_j K)[:, i] · (E_l K)[:, i]`` and the mean is
  ``μ_j = a_j + K M_j x`` with ``a_j = K ν̃_j - K M_j K ν̃_j``, ``C x = Σ_j D_j a_j``;
* ``log|I + KΠ| = Σ_j log|B_j| + log|C| - Σ_i log S_i``.

Evidence (outer EP energy) ``log Z = -½ log|I + KΠ| + ½ ν̃ᵀμ + Σ_i [log Ẑ_i + Ψ(cavity_i) -
Ψ(marginal_i)]``, ``Ψ(Λ, η) = (c/2) log 2π - ½ log|Λ| + ½ ηᵀΛ⁻¹η``. Its gradient in the shared
kernel's θ at the fixed point: ``Σ_j ½ b_jᵀ ∂K b_j - ½ tr((C - Σ_j E_jᵀE_j) ∂K)`` with
``b = ν̃ - Π μ`` (the diagonal blocks of ``(K + Π⁻¹)⁻¹`` are ``M_j - M_j C⁻¹ M_j``).

Prediction: ``E[f*_j] = k*ᵀ b_j``, ``Cov[f*]_jl = δ_jl (k** - k*ᵀ M_j k*) + (E_j k*)·(E_l k*)``;
class probabilities by inner EP on the predictive (normalised over the classes).
"""
import contextlib
from functools import partial
from typing import NamedTuple

import numpy as np
from scipy.linalg import lapack, solve_triangular

from .._epcore import multiclass_ep as _nested
from .._epcore._common import SweepResult
from .._epcore.gp_ep import _check_kernel_matrix
from .._gp.fit_options import DenseFitOptions
from .._gp.hyperparameters import Hyperparameters
from .._gp.problem import WARM_START_FAILURES, SiteProblem
from .._prediction import PREDICT_BATCH
from .._linalg import (batched_cholesky, batched_cholesky_solve, batched_inverse_spd, batched_log_det_from_cholesky,
                      gram, inner, matmul, symmetrize_from_lower)
from ..progress import sweep_callback_of
from .._student_t.problem import dense_kernel_matrix

__all__ = ["MultinomialGPProblem", "MultinomialEPState", "NestedSites", "MultinomialPosterior", "class_probabilities",
           "dense_posterior_of"]

_LOG_2PI = float(np.log(2.0 * np.pi))
#: First damping of the estimators' outer iterations (``damping=None``), with adaptive damping.
ADAPTIVE_DAMPING_START = 0.9
#: Factor on the damping after an outer iteration whose largest site change grew (adaptive damping).
DAMPING_SHRINK = _nested.DAMPING_SHRINK
#: Smallest damping of adaptive damping.
MIN_DAMPING = _nested.MIN_DAMPING
#: ``(π, ν̃)``, each (n, c), of the outer sites from the inner ones (module docstring).
_outer_sites = _nested.outer_sites


class MultinomialPosterior:
    """The outer posterior of sites ``(π, ν̃)`` on kernel matrix ``K`` (module docstring), with
    the cavities and the evidence that :class:`~fastep._epcore.multiclass_ep.MultinomialEP` asks of it.

    Per class j, with ``B_j = L_j L_jᵀ``: ``W_j = L_j⁻¹ D_j^½ K`` gives ``diag(K - K M_j K)``
    as ``diag(K) - colsum(W_j²)``, ``M_j K = D_j^½ L_j⁻ᵀ W_j`` and ``E_j K = L_C⁻¹ (M_j K)``:
    four n³ flops per class and outer iteration (two triangular solves, the factor and its
    inverse for ``C``, one solve for ``E_j K``), every product on scipy's BLAS. ``E_j`` itself
    (the gradient and the predictor need it) is formed by the :attr:`E` property, on first use.

    The algebra is numpy and scipy around BLAS and LAPACK: its sums are numpy's reductions
    (pairwise ``sum``, ``einsum``) and its logarithms numpy's, whose rounding a compiled loop
    does not reproduce bit for bit, so it stays here and the engine calls it once per outer
    iteration.

    Parameters
    ----------
    K : ndarray (n, n)
        Kernel matrix shared by the c latent functions.
    pi, nu : ndarray (n, c)
        The outer sites (:func:`~fastep._epcore.multiclass_ep.outer_sites`).

    Attributes
    ----------
    mean : ndarray (n, c)
        Posterior means ``μ``.
    cov : ndarray (n, c, c)
        The c×c posterior covariance of every input.
    log_det : float
        ``log|I + K Π|``.
    quad : float
        ``ν̃ᵀ μ``.
    weights : ndarray (c, n)
        ``b = ν̃ - Π μ``.
    cavity_precision : ndarray (n, c, c)
        Cavity precisions ``Λ_i``.
    cavity_natural_mean : ndarray (n, c)
        Cavity linear terms ``η_i``.

    Raises
    ------
    numpy.linalg.LinAlgError
        A factorisation fails, or a c×c marginal covariance is not positive definite.
    """

    def __init__(self, K, pi, nu):
        n, c = pi.shape
        self.K = K
        M = np.empty((c, n, n))
        MK = np.empty((c, n, n))                                           # M_j K = (K M_j)ᵀ
        var0 = np.empty((c, n))                                            # diag(K - K M_j K)
        diag_K = K.diagonal().copy()
        log_det = 0.0
        for j in range(c):
            s = np.sqrt(pi[:, j])
            B = K * s[:, None]
            B *= s[None, :]
            B.flat[:: n + 1] += 1.0
            factor, info = lapack.dpotrf(B.T, lower=1, clean=1, overwrite_a=1)      # B symmetric: its F view
            if info != 0:
                raise np.linalg.LinAlgError("I + D^1/2 K D^1/2 is not positive definite: the kernel matrix is "
                                            "not positive semi-definite; increase jitter or add a White term")
            log_det += 2.0 * np.sum(np.log(np.diag(factor)))
            W = solve_triangular(factor, K * s[:, None], lower=True, check_finite=False, overwrite_b=True)
            var0[j] = diag_K - np.einsum("ij,ij->j", W, W)
            MK[j] = solve_triangular(factor, W, lower=True, trans="T", check_finite=False, overwrite_b=True)
            MK[j] *= s[:, None]
            inv, info = lapack.dpotri(factor, lower=1, overwrite_c=1)
            symmetrize_from_lower(inv)
            inv *= s[:, None]
            inv *= s[None, :]
            M[j] = inv
        C = M.sum(axis=0)
        chol_C, info = lapack.dpotrf(C.T, lower=1, clean=1, overwrite_a=1)
        if info != 0:
            raise np.linalg.LinAlgError("the multinomial posterior's coupling matrix is not positive definite")
        log_det += 2.0 * np.sum(np.log(np.diag(chol_C))) - np.sum(np.log(pi.sum(axis=1)))
        cov = np.empty((n, c, c))
        H = [solve_triangular(chol_C, MK[j], lower=True, check_finite=False) for j in range(c)]   # E_j K
        for j in range(c):
            for l in range(j, c):
                cov[:, j, l] = cov[:, l, j] = np.einsum("mi,mi->i", H[j], H[l])
            cov[:, j, j] += var0[j]
        del H
        t = matmul(K, nu)                                                  # K ν̃_j as columns, (n, c)
        a = np.stack([t[:, j] - matmul(MK[j].T, t[:, j]) for j in range(c)])   # Σ₀_j ν̃_j, (c, n)
        rhs = np.sum(pi.T * a, axis=0)
        x = solve_triangular(chol_C, solve_triangular(chol_C, rhs, lower=True, check_finite=False),
                             lower=True, trans="T", check_finite=False)
        mean = a + np.stack([matmul(MK[j].T, x) for j in range(c)])        # (c, n)
        self.M, self.chol_C = M, chol_C
        self._E = None
        self.mean = mean.T.copy()                                          # (n, c)
        self.cov = cov                                                     # (n, c, c)
        self.log_det = log_det                                             # log|I + K Π|
        self.quad = float(np.sum(nu * self.mean))                          # ν̃ᵀ μ
        Pi_mu = pi * self.mean - pi * (np.sum(pi * self.mean, axis=1) / pi.sum(axis=1))[:, None]
        self.weights = (nu - Pi_mu).T.copy()                               # b = ν̃ - Π μ, (c, n)
        self.cavity_precision, self.cavity_natural_mean, self._marginal_precision, _ = self.cavities(pi, nu)

    @property
    def E(self):
        """``E_j = L_C⁻¹ M_j``, shape (c, n, n) (formed on first use)."""
        if self._E is None:
            self._E = np.stack([solve_triangular(self.chol_C, M_j, lower=True, check_finite=False)
                                for M_j in self.M])
        return self._E

    def diagonal_blocks_of_inverse(self):
        """``Σ_j [(K + Π⁻¹)⁻¹]_jj = Σ_j (M_j - E_jᵀ E_j)`` (n, n), for the evidence gradient."""
        E = self.E
        c, n, _ = E.shape
        R = gram(E.reshape(c * n, n).T)                                    # Σ_j E_jᵀ E_j by one syrk
        R *= -1.0
        R += self.M.sum(axis=0)
        return R

    def cavities(self, pi, nu):
        """Cavity natural parameters ``(Λ, η)``, shapes (n, c, c) and (n, c), and the marginals' ``(Λ_i, η_i)``."""
        prec = batched_inverse_spd(self.cov, what="the posterior's c x c marginal covariances")
        lin = np.einsum("iab,ib->ia", prec, self.mean)
        site_prec = -pi[:, :, None] * pi[:, None, :] / pi.sum(axis=1)[:, None, None]
        n, c = pi.shape
        site_prec[:, np.arange(c), np.arange(c)] += pi
        return np.ascontiguousarray(prec - site_prec), np.ascontiguousarray(lin - nu), prec, lin

    def log_evidence(self, log_tilted):
        """The outer EP energy ``log Z`` (module docstring) given the sites' tilted normalisers.

        Parameters
        ----------
        log_tilted : ndarray (n,)
            ``log Ẑ_i`` at the cavities (NaN where the inner EP failed).

        Returns
        -------
        log_z : float
            ``-½ log|I + KΠ| + ½ ν̃ᵀμ + Σ_i [log Ẑ_i + Ψ(cavity_i) - Ψ(marginal_i)]`` over the
            sites whose term is finite.
        n_failed : int
            The sites left out (improper cavity or failed inner EP).
        """
        terms = log_tilted + _log_normaliser_difference(self.cavity_precision, self.cavity_natural_mean,
                                                        self._marginal_precision, self.mean)
        ok = np.isfinite(terms)
        return -0.5 * self.log_det + 0.5 * self.quad + float(np.sum(terms[ok])), int(np.sum(~ok))


def _log_normaliser_difference(cav_prec, cav_lin, marg_prec, marg_mean):
    """``Ψ(cavity) - Ψ(marginal)`` per site (batched); NaN where the cavity is not positive definite."""
    cav_chol, proper = batched_cholesky(cav_prec)
    marg_chol, _ = batched_cholesky(marg_prec)
    out = np.full(cav_prec.shape[0], np.nan)
    if np.any(proper):
        cav_mean = batched_cholesky_solve(cav_chol[proper], cav_lin[proper])
        log_det_c = batched_log_det_from_cholesky(cav_chol[proper])
        log_det_m = batched_log_det_from_cholesky(marg_chol[proper])
        marg_lin = np.einsum("iab,ib->ia", marg_prec[proper], marg_mean[proper])
        out[proper] = (-0.5 * log_det_c + 0.5 * log_det_m
                       + 0.5 * np.sum(cav_lin[proper] * cav_mean, axis=1)
                       - 0.5 * np.sum(marg_lin * marg_mean[proper], axis=1))
    return out


class MultinomialPredictor:
    """Latent predictive (means and c×c covariances) and class probabilities of a fitted posterior."""

    def __init__(self, kernel, X_basis, weights, M, E):
        self.kernel = kernel
        self.X_basis = X_basis
        self.weights = weights          # (c, n)
        self.M = M                      # (c, n, n)
        self.E = E                      # (c, n, n)

    def latent_full(self, X):
        """``(mean (m, c), cov (m, c, c))`` of the latent functions at the rows of X."""
        c = self.weights.shape[0]
        n_test = X.shape[0]
        mean = np.empty((n_test, c))
        cov = np.empty((n_test, c, c))
        for a in range(0, n_test, PREDICT_BATCH):
            z = slice(a, min(a + PREDICT_BATCH, n_test))
            Ks = self.kernel._K(X[z], self.X_basis)            # (b, n)
            mean[z] = matmul(Ks, self.weights.T.copy())
            diag = self.kernel._diag(X[z])
            P = np.stack([matmul(Ks, self.E[j].T.copy()) for j in range(c)])   # rows (E_j k*)ᵀ
            block = np.einsum("jbm,lbm->bjl", P, P)
            for j in range(c):
                block[:, j, j] += np.maximum(diag - np.einsum("bm,bm->b", matmul(Ks, self.M[j]), Ks), 0.0)
            cov[z] = block
        return mean, cov

    def latent(self, X):
        mean, cov = self.latent_full(X)
        return mean, np.diagonal(cov, axis1=1, axis2=2).copy()

    def predict_proba(self, X):
        return class_probabilities(*self.latent_full(X))


def class_probabilities(mean, cov):
    """Class probabilities (m, c) of latent marginals ``mean`` (m, c) and ``cov`` (m, c, c): the
    multinomial probit integral by inner EP, normalised over the classes."""
    c = mean.shape[1]
    cov = cov + 1e-12 * np.maximum(1.0, np.abs(cov).max()) * np.eye(c)
    log_p = _nested.nested_log_probabilities(np.ascontiguousarray(mean), np.ascontiguousarray(cov))
    if not np.all(np.isfinite(log_p)):
        raise FloatingPointError("the class probabilities could not be computed (inner EP failed)")
    p = np.exp(log_p - log_p.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def dense_posterior_of(K, *, validate=True):
    """The dense model's outer posterior for :class:`~fastep._epcore.multiclass_ep.MultinomialEP`:
    ``(π, ν̃) ↦ MultinomialPosterior(K, π, ν̃)``.

    Parameters
    ----------
    K : ndarray (n, n), float64, C-contiguous
        Kernel matrix shared by the c latent functions (symmetric PSD, jitter included).
    validate : bool, default True
        Check K here (TypeError or ValueError naming it); ``False`` for callers that built it.

    Returns
    -------
    callable
        ``posterior_of(pi, nu)``.
    """
    if validate:
        if not (isinstance(K, np.ndarray) and K.dtype == np.float64 and K.ndim == 2 and K.flags.c_contiguous):
            raise TypeError("K must be a C-contiguous float64 ndarray of shape (n, n)")
        _check_kernel_matrix(K)
    return partial(MultinomialPosterior, K)


class MultinomialEPState(NamedTuple):
    """One nested EP run's result: the inner sites it ended at (n, c), the outer posterior and
    the engine's summary (with the outer sites)."""

    inner_precision: np.ndarray
    inner_natural_mean: np.ndarray
    posterior: MultinomialPosterior
    info: SweepResult


class NestedSites:
    """The sites of a nested EP problem: the inner sites ``inner_precision``,
    ``inner_natural_mean`` (n, c) that a warm start resumes, and the outer sites π and ν̃ as
    ``site_precision``, ``site_natural_mean`` (c, n)."""

    def _zero_nested_sites(self, n, n_classes):
        self.inner_precision = np.zeros((n, n_classes))
        self.inner_natural_mean = np.zeros((n, n_classes))
        self.site_precision = np.zeros((n_classes, n))
        self.site_natural_mean = np.zeros((n_classes, n))

    def _has_sites(self):
        return bool(np.any(self.inner_precision))

    def sites(self):
        return self.inner_precision, self.inner_natural_mean, self.site_precision, self.site_natural_mean

    def restore_sites(self, sites):
        self.inner_precision, self.inner_natural_mean, self.site_precision, self.site_natural_mean = sites


class MultinomialGPProblem(NestedSites, SiteProblem):
    """One multinomial-probit GP EP problem: nested EP runs, evidence, gradient, prediction state.

    ``y`` holds the class indices 0..c-1 (int32); the sites are stored as the inner sites
    ``inner_precision``, ``inner_natural_mean`` (n, c) and exposed as ``site_precision`` = π and
    ``site_natural_mean`` = ν̃, both transposed to (c, n).
    """

    options_class = DenseFitOptions

    algorithm = "nested EP"
    #: The search runs nested EP to the estimator's ``tol``: at a looser tolerance the warm-started
    #: runs stop after one damped sweep whose evidence still creeps by ~1e-3 from call to call, and
    #: L-BFGS-B's line searches stall on the inconsistent values.
    search_tol = None
    #: L-BFGS-B's relative-reduction tolerance of the search (the evidence-per-point rule of
    #: :mod:`fastep._search.space` usually stops it first).
    search_ftol = 1e-5

    def __init__(self, kernel, X, labels, n_classes, options):
        super().__init__(kernel, None, X, labels, options,
                         Hyperparameters(kernel, None, False, hyperprior=options.hyperprior))
        n = X.shape[0]
        self.n_classes = n_classes
        self._zero_nested_sites(n, n_classes)
        self.learn_likelihood = False
        self._training_marginals = None

    #: The search first runs on this fraction of the training points (stratified by class; every
    #: outer iteration there costs this fraction cubed) when there are more than
    #: ``coarse_search_above`` of them.
    coarse_fraction = 1.0 / 3.0
    coarse_search_above = 300

    def _coarse_subset(self):
        n = self.X.shape[0]
        if n <= self.coarse_search_above:
            return None
        rng = np.random.default_rng(0)
        parts = []
        for j in range(self.n_classes):
            members = np.flatnonzero(self.y == j)
            take = max(1, int(np.ceil(self.coarse_fraction * members.size)))
            parts.append(rng.choice(members, take, replace=False))
        return np.sort(np.concatenate(parts))

    def _subproblem(self, index):
        sub = MultinomialGPProblem(self.kernel, self.X[index], self.y[index], self.n_classes, self.options)
        sub.estimator_name, sub.latent_scale = self.estimator_name, self.latent_scale
        return sub

    def _seed_sites(self, index, sites):
        self.inner_precision[index] = sites[0]
        self.inner_natural_mean[index] = sites[1]

    def _ep(self, K, warm):
        """One nested EP run on ``K`` from the stored inner sites (``warm``) or zero sites."""
        opts = self.options
        n, c = self.X.shape[0], self.n_classes
        alpha = self.inner_precision.copy() if warm else np.zeros((n, c))
        beta = self.inner_natural_mean.copy() if warm else np.zeros((n, c))
        engine = _nested.MultinomialEP(dense_posterior_of(K, validate=False), self.y, c, damping=opts.damping,
                                  adaptive_damping=opts.adaptive_damping, tol=opts.tol,
                                  max_sweeps=opts.max_sweeps, validate=False)
        info = engine.run(alpha, beta, sweep_callback=sweep_callback_of(opts))
        return MultinomialEPState(alpha, beta, engine.posterior, info)

    def evaluate(self, params, *, gradient, warm, keep=False):
        """Nested EP at ``params`` = ``(kernel, None, None)`` on the kernel matrix the classes share,
        its evidence gradient (``gradient``) and, with ``keep``, the prediction state;
        ``(log_z, grad or None, info)``."""
        kernel = params[0]
        K = dense_kernel_matrix(kernel, self.X, self.options.jitter)
        state = None
        if warm and self._has_sites():
            with contextlib.suppress(*WARM_START_FAILURES):
                state = self._ep(K, warm=True)
        if state is None or state.info.n_failed:
            state = self._ep(K, warm=False)
        del K                           # what the gradient no longer needs is freed before it runs
        self.inner_precision, self.inner_natural_mean = state.inner_precision, state.inner_natural_mean
        post, info = state.posterior, state.info
        self.site_precision = info.outer_precision.T.copy()
        self.site_natural_mean = info.outer_natural_mean.T.copy()
        self._training_marginals = None if keep else (post.mean, post.cov)   # for the search only
        grad = None
        if gradient:
            R = post.diagonal_blocks_of_inverse()
            grad = np.array([sum(0.5 * inner(matmul(b, dK), b) for b in post.weights) - 0.5 * inner(R, dK)
                             for dK in kernel._grads(self.X, list(range(kernel.n_theta)))], dtype=float)
        if keep:
            self.kernel = kernel
            self.predictor = MultinomialPredictor(kernel, self.X, post.weights, post.M, post.E)
            # the outer sites are kept once, as site_precision and site_natural_mean
            self.log_ml, self.info = float(info.log_z), info.replace(outer_precision=None, outer_natural_mean=None)
        return float(info.log_z), grad, info

    def training_probabilities(self):
        """Class probabilities (n, c) of the training points under the last EP run's posterior
        (None where inner EP fails on a marginal: the refinement stop then waits for another step)."""
        try:
            return class_probabilities(*self._training_marginals)
        except FloatingPointError:
            return None
