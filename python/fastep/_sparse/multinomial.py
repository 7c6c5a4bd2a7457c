"""Joint multiclass sparse GP EP: c latent GPs that share inducing inputs, under the multinomial
probit likelihood, by nested EP.

Model
-----
c latent functions ``f_j ~ GP(0, k)`` (one kernel, shared by the classes) with inducing values
``u_j = f_j(Z)`` at one set of m inducing inputs Z, whitened as ``v_j = L⁻¹ u_j ~ N(0, I)``
(``L Lᵀ = K_mm``).  The sparse prior of the c latent values at input i is
``f_i = V_i v + ε_i``: ``g_ij = b_iᵀ v_j`` with ``b_i = L⁻¹ k_m(x_i)`` and, for FITC,
``ε_i ~ N(0, δ_i I)``, ``δ_i = k(x_i, x_i) - |b_i|²`` (DTC: δ = 0).  The likelihood is the
multinomial probit ``p(y_i = k | f_i) = ∫ N(w) Π_{j≠k} Φ(w + f_ik - f_ij) dw`` of Riihimäki,
Jylänki and Vehtari, "Nested expectation propagation for Gaussian process classification with
a multinomial probit likelihood" (JMLR 14, 2013), eq. 5.

Sites
-----
Every input keeps nested EP's inner sites (the paper's §3; :mod:`fastep._epcore.multiclass_ep`),
which define an outer site on f_i with the structured precision
``T̃_i = D_i - D_i 1 1ᵀ D_i / (1ᵀ D_i 1)`` and linear term ``ν̃_i`` (eqs 13-15).  Integrating the
FITC noise out gives the site's action on ``g_i``: precision ``P_i = T̃_i (I + δ_i T̃_i)⁻¹`` and
linear term ``h_i = (I + δ_i T̃_i)⁻¹ ν̃_i`` (``P = T̃``, ``h = ν̃`` for DTC).  The posterior over
the ``c m`` whitened inducing values is one Gaussian that couples the classes,

    q(v) = N(A⁻¹ h_w, A⁻¹),   A = I + Σ_i P_i ⊗ b_i b_iᵀ,   h_w = Σ_i h_i ⊗ b_i,

(class-major blocks: block (j, l) of ``Σ_i P_i ⊗ b_i b_iᵀ`` is ``Σ_i P_i[j, l] b_i b_iᵀ``), so
that with c = 2 the model is binary sparse EP on ``(f_1 - f_0)/√2`` and with Z = X (m = n) it is
dense nested EP.  Memory O(c² m² + c n + n m); one outer iteration costs O(c² m² n + c³ m³).

One outer iteration (parallel EP, damped as in the dense model)
---------------------------------------------------------------
The marginal of ``g_i`` is ``N(μ_i, S_i)``, ``μ_i = V_i A⁻¹ h_w``, ``S_i = V_i A⁻¹ V_iᵀ``.
Removing the site gives the cavity in covariance form, without inverting ``S_i``,

    C_i = (I - S_i P_i)⁻¹ S_i,     m_i = (I - S_i P_i)⁻¹ (μ_i - S_i h_i),

and the cavity of ``f_i`` is ``N(m_i, C_i + δ_i I)``.  Nested EP updates the inner sites from it
(one damped inner sweep per outer iteration, warm-started).

Evidence
--------
Minka's EP energy with the sites acting on g,

    log Z = -½ log|A| + ½ h_wᵀ A⁻¹ h_w + Σ_i [log Ẑ_i - log ∫ N(g; m_i, C_i) t̃_i(g) dg],

``t̃_i(g) = exp(-½ gᵀ P_i g + h_iᵀ g)`` and ``log Ẑ_i`` nested EP's tilted normaliser at the
cavity of f_i.  The site integral is
``-½ log|I + C P| - ½ mᵀ P m + hᵀ m + ½ rᵀ (I + C P)⁻¹ C r``, ``r = h - P m``.

Evidence gradient (at the EP fixed point only the explicit dependence counts)
-----------------------------------------------------------------------------
With ``a_i = h_i - P_i μ_i`` (= ∂ log Ẑ_i/∂m_i), for FITC
``c_i = ∂ log Ẑ_i/∂δ_i = ½ (|a_i|² - tr(P_i (I + C_i P_i)⁻¹))`` (0 for DTC), and
``H_i = Σ_{j,l} P_i[l, j] (A⁻¹)_{jl} b_i``, the derivative in any kernel parameter or inducing
input is ``2 ⟨G, ∂K_mn⟩ - ⟨G Uᵀ, ∂K_mm⟩ + ⟨c, ∂ diag K⟩`` (as for the binary model,
:mod:`fastep._sparse.problem`) with ``U = K_mm⁻¹ K_mn`` and

    G[:, i] = L⁻ᵀ (½ (M_w a_i - H_i) - c_i b_i),    M_w = [A⁻¹ h_w]_j as columns (m x c):

the class-summed diagonal blocks of ``½ ββᵀ - ½ (Q + P⁻¹)⁻¹`` pushed through ``K_mm⁻¹ K_mn``,
with ``Σ_i P_i ⊗ b_i b_iᵀ A⁻¹ = I - A⁻¹`` and ``Σ_i a_i ⊗ b_i = A⁻¹ h_w`` written through the
posterior.  Every term is a sum over inputs of quantities of the input's site and of the
m-sized global state, so the rows are processed in blocks (and estimated from minibatches).

Prediction
----------
``E[f*_j] = b*ᵀ [A⁻¹ h_w]_j``, ``Cov[f*]_{jl} = b*ᵀ (A⁻¹)_{jl} b* + δ_jl (k** - |b*|²)``; the
class probabilities by inner EP on that c-variate Gaussian, normalised over the classes
(:func:`fastep._dense.multiclass.class_probabilities`).
"""
import contextlib
from typing import Any, NamedTuple

import numpy as np
from scipy.linalg import blas as _blas, lapack, solve_triangular

from .._epcore import multiclass_ep as _nested
from .._epcore._common import SweepDriver, SweepResult
from .._gp.fit_options import SparseFitOptions
from .._dense.multiclass import (ADAPTIVE_DAMPING_START, DAMPING_SHRINK, MIN_DAMPING, NestedSites, _outer_sites,
                                 class_probabilities)
from .._gp.hyperparameters import Hyperparameters
from .._gp.problem import WARM_START_FAILURES, SiteProblem
from .._linalg import (batched_cholesky, batched_cholesky_solve, batched_solve, inner, matmul,
                       symmetrize_from_lower)
from .._prediction import BatchedPredictor
from ..progress import sweep_callback_of
from .blocks import BLOCK_ELEMENTS, PREDICT_BATCH, gradient_from_sums, project_rows
from .inducing import auto_sizes as _binary_auto_sizes
from .stochastic import MINIBATCH_MIN_ROWS as _BINARY_MINIBATCH_MIN_ROWS

__all__ = ["MultinomialSparseEP", "MultinomialSparsePosterior", "MultinomialSparseProblem",
           "MultinomialSparsePredictor", "effective_sites", "cavities_from_marginals", "site_log_normalisers",
           "gradient_terms"]

#: Largest c m of ``n_inducing='auto'``: the posterior's (c m)² matrices and its (c m)³ factorisation
#: per outer iteration stay small beside the O(c² m² n) of the sites.
JOINT_MAX = 3072


def iteration_flops(n, n_classes, m):
    """Leading flops of one outer iteration on n points at m inducing inputs: the site sums and
    the marginals (2 c² m² n each) and the posterior's factorisation and inverse ((c m)³)."""
    return 4.0 * n_classes ** 2 * m ** 2 * n + float(n_classes * m) ** 3


def auto_sizes(n, n_classes):
    """The sizes ``n_inducing='auto'`` tries: the binary model's (:func:`fastep._sparse.inducing.auto_sizes`),
    with c m at most ``JOINT_MAX`` (the last size clipped to it), and, after the first, only
    sizes whose outer iteration costs less than the dense model's (about 4 c n³ flops): a sparse
    model as costly as the exact one is not worth its approximation."""
    cap = max(1, JOINT_MAX // n_classes)
    sizes = sorted({min(m, cap) for m in _binary_auto_sizes(n)})
    dense = 4.0 * n_classes * float(n) ** 3
    return sizes[:1] + [m for m in sizes[1:] if iteration_flops(n, n_classes, m) < dense]


#: ``learning='auto'`` learns the joint model from minibatches from this many rows on (5 555): the
#: binary model's threshold times (1024 / JOINT_MAX)², so that an outer iteration at the largest
#: ``n_inducing='auto'`` size (c m = JOINT_MAX) costs at the threshold what the binary model's
#: costs at its threshold and largest size (m = 1024).
MINIBATCH_MIN_ROWS = _BINARY_MINIBATCH_MIN_ROWS * 1024 ** 2 // JOINT_MAX ** 2

#: Largest c m of minibatch learning's default m (every step factorises a c m x c m matrix).
JOINT_MINIBATCH_MAX = 1024


def minibatch_size(n_classes):
    """The default m of minibatch learning: 256 (the binary model's), with c m at most
    ``JOINT_MINIBATCH_MAX``, and at least 32."""
    return int(max(32, min(256, JOINT_MINIBATCH_MAX // n_classes)))


def first_size(n, n_classes):
    """The first size of :func:`auto_sizes`."""
    return auto_sizes(n, n_classes)[0]


def select_across_classes(X, labels, n_classes, kernel, m, seed=0):
    """m inducing inputs informative for every class: the IVM's selection (Algorithm 1 of the
    Informative Vector Machine, :func:`fastep.ivm.select_active_set`, probit sites) run on each
    class's one-vs-rest problem with a budget of ``ceil(m / c)`` (rows in class order, then
    inclusion order; a row chosen by two classes is kept once, and the budget left by such rows is
    filled from the classes' next choices in turn)."""
    from .._ivm.selection import select_active_set
    from ..likelihoods import Probit

    n = X.shape[0]
    m = min(int(m), n)
    share = int(np.ceil(m / n_classes))
    chosen, seen = [], set()
    extra = max(1, min(n, 2 * share)) if n_classes > 1 else share
    lists = []
    for j in range(n_classes):
        target = np.where(labels == j, 1.0, -1.0)
        lists.append(select_active_set(X, target, kernel, Probit(), min(n, extra), seed=seed))
    for depth in range(max(len(a) for a in lists)):
        for a in lists:
            if len(chosen) >= m:
                break
            if depth < len(a) and int(a[depth]) not in seen:
                seen.add(int(a[depth]))
                chosen.append(int(a[depth]))
    if len(chosen) < m:                              # tiny problems: the remaining rows in order
        chosen += [i for i in range(n) if i not in seen][:m - len(chosen)]
    return np.ascontiguousarray(X[np.array(chosen, dtype=np.intp)])


def _rows_per_block(c, m):
    """Rows per block so that a rows x (c m) temporary has about ``BLOCK_ELEMENTS`` entries."""
    return max(1, BLOCK_ELEMENTS // max(c * m, 1))


def _transpose(a):
    return np.transpose(a, (0, 2, 1))


# -- per-input algebra (batched over inputs; c x c each) ------------------------------------------
def outer_site_precisions(pi):
    """``T̃_i = diag(π_i) - π_i π_iᵀ / (1ᵀ π_i)``, shape (n, c, c), of the outer sites."""
    n, c = pi.shape
    T = -pi[:, :, None] * pi[:, None, :] / pi.sum(axis=1)[:, None, None]
    T[:, np.arange(c), np.arange(c)] += pi
    return T


def effective_sites(pi, nu, fitc_variance):
    """The outer sites' action on g (module docstring, "Sites"): ``(κ, h)``, each (n, c).

    ``I + δ T̃`` is diagonal plus rank one, and so is ``P = T̃ (I + δ T̃)⁻¹``: by Sherman-Morrison
    ``P = diag(κ) - κ κᵀ / (1ᵀκ)`` with ``κ = π / (1 + δ π)`` (T̃'s form with π replaced by κ;
    :func:`outer_site_precisions` of κ), and ``h = (I + δ T̃)⁻¹ ν̃ = ν̃ / (1 + δ π) + δ κ (κᵀ ν̃) / (1ᵀκ)``.
    """
    if not np.any(fitc_variance):
        return np.array(pi, dtype=np.float64), np.array(nu, dtype=np.float64)
    scale = 1.0 / (1.0 + fitc_variance[:, None] * pi)
    kappa = pi * scale
    h = nu * scale + kappa * (fitc_variance * np.sum(kappa * nu, axis=1) / kappa.sum(axis=1))[:, None]
    return kappa, h


def cavities_from_marginals(marginal_cov, marginal_mean, P, h):
    """Cavities of g in covariance form: ``(C, m)`` with ``C = (I - S P)⁻¹ S`` and
    ``m = (I - S P)⁻¹ (μ - S h)`` (module docstring), from the marginals ``N(μ, S)``."""
    c = P.shape[1]
    M = np.eye(c) - np.einsum("iab,ibc->iac", marginal_cov, P)
    rhs = marginal_mean - np.einsum("iab,ib->ia", marginal_cov, h)
    both, _, _ = batched_solve(M, np.concatenate([marginal_cov, rhs[:, :, None]], axis=2))
    C = both[:, :, :c]
    C = 0.5 * (C + _transpose(C))
    return C, both[:, :, c]


def f_cavities(C, mean, fitc_variance):
    """Natural parameters ``(Λ, η)`` of the cavities of f, ``N(m, C + δ I)``, for the nested site
    kernel, and the mask of proper ones (the others get ``Λ = -I``, which the kernel skips)."""
    n, c, _ = C.shape
    Cf = C + fitc_variance[:, None, None] * np.eye(c)
    chol, ok = batched_cholesky(Cf)
    ok &= np.all(np.isfinite(mean), axis=1)
    prec = np.empty_like(C)
    eye = np.eye(c)
    if np.any(ok):
        good = chol[ok]
        inv = np.empty((good.shape[0], c, c))
        for k in range(c):
            inv[:, :, k] = batched_cholesky_solve(good, np.broadcast_to(eye[k], (good.shape[0], c)))
        prec[ok] = 0.5 * (inv + _transpose(inv))
    prec[~ok] = -eye
    lin = np.einsum("iab,ib->ia", prec, np.where(ok[:, None], mean, 0.0))
    return np.ascontiguousarray(prec), np.ascontiguousarray(lin), ok


def site_log_normalisers(C, mean, P, h):
    """``log ∫ N(g; m, C) exp(-½ gᵀ P g + hᵀ g) dg`` per input (module docstring, "Evidence")."""
    c = P.shape[1]
    M = np.eye(c) + np.einsum("iab,ibc->iac", C, P)
    r = h - np.einsum("iab,ib->ia", P, mean)
    Cr = np.einsum("iab,ib->ia", C, r)
    solved, sign, log_det = batched_solve(M, Cr)
    quad = np.sum(r * solved, axis=1)
    out = (-0.5 * log_det - 0.5 * np.einsum("ia,iab,ib->i", mean, P, mean) + np.sum(h * mean, axis=1)
           + 0.5 * quad)
    return np.where(sign > 0, out, np.nan)


def gradient_terms(marginal_mean, C, P, h, fitc):
    """Per input: ``a = h - P μ`` (n, c) and ``c = ½ (|a|² - tr(P (I + C P)⁻¹))`` (n; zeros
    unless ``fitc``), the evidence gradient's site terms (module docstring)."""
    a = h - np.einsum("iab,ib->ia", P, marginal_mean)
    if not fitc:
        return a, np.zeros(a.shape[0])
    c = P.shape[1]
    M = np.eye(c) + np.einsum("iab,ibc->iac", C, P)
    trace = np.trace(batched_solve(_transpose(M), P)[0], axis1=1, axis2=2)    # tr(P M⁻¹) = tr(M⁻ᵀ P)
    return a, 0.5 * (np.sum(a * a, axis=1) - trace)


# -- the posterior over the c m whitened inducing values ------------------------------------------
def site_sums(Vt, kappa, h):
    """``(Σ_i P_i ⊗ b_i b_iᵀ, Σ_i h_i ⊗ b_i)``, shapes (c m, c m) (Fortran-ordered, symmetric) and
    (c m), class-major, over the rows ``Vt`` (n x m) in blocks, with
    ``P_i = diag(κ_i) - κ_i κ_iᵀ / (1ᵀκ_i)``: the c diagonal blocks ``Vtᵀ diag(κ_j) Vt`` minus
    ``F Fᵀ``, ``F`` the columns ``κ_i ⊗ b_i / √(1ᵀκ_i)`` (symmetric rank-k updates, ``dsyrk``, into
    one lower triangle; c² m² n flops in all)."""
    n, m = Vt.shape
    c = kappa.shape[1]
    precision = np.zeros((c * m, c * m), order="F")
    diagonal = [np.zeros((m, m), order="F") for _ in range(c)]
    rows = _rows_per_block(c, m)
    for s in range(0, n, rows):
        V = Vt[s:s + rows]
        k = kappa[s:s + rows]
        for j in range(c):
            diagonal[j] = _blas.dsyrk(1.0, (V * np.sqrt(k[:, j])[:, None]).T, beta=1.0, c=diagonal[j],
                                      trans=0, lower=1, overwrite_c=1)
        F = ((k / np.sqrt(k.sum(axis=1))[:, None])[:, :, None] * V[:, None, :]).reshape(V.shape[0], c * m)
        precision = _blas.dsyrk(-1.0, F.T, beta=1.0, c=precision, trans=0, lower=1, overwrite_c=1)
    for j in range(c):
        precision[j * m:(j + 1) * m, j * m:(j + 1) * m] += diagonal[j]
    symmetrize_from_lower(precision)
    natural = matmul(Vt.T, h).T.reshape(c * m)
    return precision, natural


class MultinomialSparsePosterior:
    """``q(v) = N(A⁻¹ h_w, A⁻¹)`` over the c m whitened inducing values (module docstring).

    Attributes: ``mean_w`` (c, m), ``cov_w`` (c m, c m) = A⁻¹, ``log_det`` = log|A|,
    ``quad`` = ``h_wᵀ A⁻¹ h_w``.
    """

    def __init__(self, precision, natural, n_classes):
        cm = natural.shape[0]
        A = np.asfortranarray(precision)
        A.flat[::cm + 1] += 1.0
        factor, info = lapack.dpotrf(A, lower=1, clean=0, overwrite_a=1)
        if info != 0 or not np.all(np.isfinite(np.diag(factor))):
            raise np.linalg.LinAlgError("the joint multiclass posterior I + Σ P_i ⊗ b_i b_iᵀ is not positive "
                                        "definite (non-finite projections or sites)")
        self.log_det = 2.0 * float(np.sum(np.log(np.diag(factor))))
        mean, _ = lapack.dpotrs(factor, natural, lower=1)
        self.quad = float(inner(natural, mean))
        inv, info = lapack.dpotri(factor, lower=1, overwrite_c=1)
        if info != 0:
            raise np.linalg.LinAlgError("the joint multiclass posterior could not be inverted")
        symmetrize_from_lower(inv)
        self.cov_w = np.ascontiguousarray(inv)
        self.mean_w = mean.reshape(n_classes, cm // n_classes)

    def marginals(self, Vt):
        """Marginals of g at the rows ``Vt``: ``(μ (n, c), S (n, c, c))``, ``S_i[l, j] = b_iᵀ (A⁻¹)_{lj} b_i``
        (the blocks j >= l, mirrored)."""
        n, m = Vt.shape
        c = self.mean_w.shape[0]
        mean = matmul(Vt, self.mean_w.T.copy())
        S = np.empty((n, c, c))
        rows = _rows_per_block(c, m)
        for s in range(0, n, rows):
            V = Vt[s:s + rows]
            for l in range(c):
                T = matmul(V, self.cov_w[l * m:(l + 1) * m, l * m:]).reshape(V.shape[0], c - l, m)
                S[s:s + rows, l, l:] = np.einsum("ijk,ik->ij", T, V)
        upper = np.triu_indices(c, 1)
        S[:, upper[1], upper[0]] = S[:, upper[0], upper[1]]
        return mean, S

    def gradient_rows(self, Vt, P):
        """``H (n, m)``, ``H_i = Σ_{j,l} P_i[l, j] (A⁻¹)_{jl} b_i``, the gradient's term (module docstring)."""
        n, m = Vt.shape
        c = self.mean_w.shape[0]
        H = np.zeros((n, m))
        for l in range(c):
            T = matmul(Vt, self.cov_w[l * m:(l + 1) * m]).reshape(n, c, m)      # rows (A⁻¹)_{jl} b_i
            H += np.einsum("ij,ijk->ik", P[:, l, :], T)
        return H


# -- the engine ------------------------------------------------------------------------------------
class MultinomialSparseEP:
    """Nested EP for the joint multiclass sparse GP on fixed projections (module docstring):
    damped parallel outer iterations around :class:`~fastep._epcore.multiclass_ep.InnerEP`.

    Parameters
    ----------
    Vt : ndarray (n, m)
        Whitened projections ``b_i = L⁻¹ k_m(x_i)`` as rows.
    fitc_variance : ndarray (n,)
        δ_i (zeros for DTC).
    labels : int32 ndarray (n,)
        Classes 0..c-1.
    n_classes : int >= 2
    inner_precision, inner_natural_mean : ndarray (n, c)
        Nested EP's inner sites, updated in place by :meth:`run`.
    damping : float in (0, 1]
    adaptive_damping : bool
        Shrink the damping after an iteration whose largest site change grew (as the dense
        :class:`~fastep._epcore.multiclass_ep.MultinomialEP`).
    tol : float
        Convergence threshold on the largest relative inner-site change and the change of log Z.
    max_sweeps : int

    Notes
    -----
    The inner probit sites never have negative precision, so κ >= 0 and every ``P_i`` is
    positive semi-definite: the posterior stays proper and no negative-precision policy is
    needed. A site whose cavity is not positive definite, or whose inner EP fails, is left
    unchanged and counted in ``n_failed``; its evidence term is left out.
    """

    def __init__(self, Vt, fitc_variance, labels, n_classes, inner_precision, inner_natural_mean, *,
                 damping=1.0, adaptive_damping=False, tol=1e-6, max_sweeps=100):
        self.Vt, self.fitc_variance, self.labels, self.n_classes = Vt, fitc_variance, labels, n_classes
        self.inner_precision, self.inner_natural_mean = inner_precision, inner_natural_mean
        self.damping, self.adaptive_damping = float(damping), bool(adaptive_damping)
        self.tol, self.max_sweeps = tol, max_sweeps
        self.fitc = bool(np.any(fitc_variance))
        self.posterior = self.state = None

    def _state(self):
        """The posterior of the current inner sites, the marginals, the cavities and the evidence."""
        pi, nu = _outer_sites(self.labels, self.inner_precision, self.inner_natural_mean)
        kappa, h = effective_sites(pi, nu, self.fitc_variance)
        P = outer_site_precisions(kappa)
        post = MultinomialSparsePosterior(*site_sums(self.Vt, kappa, h), self.n_classes)
        mean, S = post.marginals(self.Vt)
        C, m_c = cavities_from_marginals(S, mean, P, h)
        cav_prec, cav_lin, proper = f_cavities(C, m_c, self.fitc_variance)
        log_z_sites, _ = _nested.InnerEP(n_inner_sweeps=0).update(self.labels, cav_prec, cav_lin,
                                                                  self.inner_precision.copy(),
                                                                  self.inner_natural_mean.copy())
        terms = log_z_sites - site_log_normalisers(C, m_c, P, h)
        ok = proper & np.isfinite(terms)
        log_z = -0.5 * post.log_det + 0.5 * post.quad + float(np.sum(terms[ok]))
        state = dict(pi=pi, nu=nu, P=P, h=h, mean=mean, C=C, cavity=(cav_prec, cav_lin))
        return post, state, log_z, int(np.count_nonzero(~ok))

    def run(self, *, sweep_callback=None):
        """Outer iterations from the current inner sites to convergence or ``max_sweeps``;
        returns a :class:`~fastep._epcore._common.SweepResult` (``log_z`` of the returned sites).
        Afterwards ``posterior`` and ``state`` describe the returned sites."""
        alpha, beta = self.inner_precision, self.inner_natural_mean
        post, state, log_z, n_failed = self._state()
        driver = SweepDriver(self.tol, self.max_sweeps, sweep_callback)
        driver.set_log_z(log_z)
        damping, previous_change, sweep = self.damping, np.inf, 0
        while sweep < driver.max_sweeps:
            sweep += 1
            old_alpha, old_beta = alpha.copy(), beta.copy()
            _, status = _nested.InnerEP(n_inner_sweeps=1, damping=damping).update(self.labels, *state["cavity"],
                                                                                  alpha, beta)
            max_change = float(max(np.max(np.abs(alpha - old_alpha) / np.maximum(1.0, np.abs(old_alpha))),
                                   np.max(np.abs(beta - old_beta) / np.maximum(1.0, np.abs(old_beta)))))
            if self.adaptive_damping and max_change > previous_change:
                damping = max(MIN_DAMPING, damping * DAMPING_SHRINK)
            previous_change = max_change
            post, state, new_log_z, n_failed = self._state()
            n_failed += int(np.count_nonzero(status != 0))
            if driver.end_sweep(sweep, max_change, new_log_z, n_failed):
                break
        self.posterior, self.state = post, state
        if not np.isfinite(driver.log_z):
            raise np.linalg.LinAlgError("the joint multiclass sparse EP's log marginal likelihood is not finite; "
                                        "increase jitter or check the kernel")
        return driver.result()


# -- the evidence gradient's adjoints, per block of rows ------------------------------------------
def adjoint_block(L, Vt, mean_w, a, H, c):
    """``G`` (m x rows) of the module docstring's gradient for a block of rows."""
    inner_part = 0.5 * (matmul(mean_w.T.copy(), a.T.copy()) - H.T) - Vt.T * c
    return solve_triangular(L, inner_part, lower=True, trans="T")


def adjoint_shares(kernel, Z, X, L, Vt, G, c, learn_inducing):
    """A block's shares of ``2 ⟨G, ∂K_mn⟩ + ⟨c, ∂ diag K⟩`` (per kernel parameter), of
    ``G Uᵀ`` (m x m) and of the inducing-input gradient ``input_gradient(Z, X, 2G)``."""
    U = solve_triangular(L, Vt.T, lower=True, trans="T")
    Gmm = matmul(G, U.T)
    g_kernel = np.zeros(kernel.n_theta)
    if kernel.n_theta:
        g_kernel = 2.0 * kernel._weighted_grads(Z, X, G)
        if np.any(c):
            g_kernel += matmul(c, np.column_stack(list(kernel._diag_grads(X, list(range(kernel.n_theta))))))
    g_z = kernel._input_grad(Z, X, 2.0 * G) if learn_inducing else None
    return g_kernel, Gmm, g_z


class MultinomialSparsePredictor(BatchedPredictor):
    """Latent predictive (means and c x c covariances) and class probabilities of a fitted joint
    multiclass sparse GP (module docstring, "Prediction")."""

    batch_size = PREDICT_BATCH

    def __init__(self, kernel, Z, chol_mm, mean_w, cov_w):
        self.kernel, self.Z, self.chol_mm = kernel, Z, chol_mm
        self.mean_w, self.cov_w = mean_w, cov_w

    def latent_full(self, Xs):
        """``(mean (n*, c), cov (n*, c, c))`` of the latent functions at the rows of Xs."""
        out_mean, out_cov = [], []
        for s in range(0, Xs.shape[0], self.batch_size):
            X = Xs[s:s + self.batch_size]
            Kms = self.kernel._K(self.Z, X)
            B = np.ascontiguousarray(solve_triangular(self.chol_mm, Kms, lower=True).T)      # rows b*ᵀ
            c, m = self.mean_w.shape
            mean = matmul(B, self.mean_w.T.copy())
            cov = np.empty((X.shape[0], c, c))
            for l in range(c):
                T = matmul(B, self.cov_w[l * m:(l + 1) * m]).reshape(X.shape[0], c, m)
                cov[:, l, :] = np.einsum("ijk,ik->ij", T, B)
            cov = 0.5 * (cov + _transpose(cov))
            resid = np.maximum(self.kernel._diag(X) - np.einsum("ij,ij->i", B, B), 0.0)
            cov[:, np.arange(c), np.arange(c)] += resid[:, None]
            out_mean.append(mean)
            out_cov.append(cov)
        return np.concatenate(out_mean), np.concatenate(out_cov)

    def _latent_batch(self, Xs):
        mean, cov = self.latent_full(Xs)
        return mean, np.diagonal(cov, axis1=1, axis2=2).copy()

    def predict_proba(self, Xs):
        return class_probabilities(*self.latent_full(Xs))


# -- one problem --------------------------------------------------------------------------------------
class MultinomialSparseEPState(NamedTuple):
    """One joint multiclass sparse EP run's result: the inner sites it ended at (n, c), the
    engine's per-input state (:attr:`MultinomialSparseEP.state`), the posterior of the weights
    and the engine's summary."""

    inner_precision: np.ndarray
    inner_natural_mean: np.ndarray
    sites: dict[str, Any]
    posterior: MultinomialSparsePosterior
    info: SweepResult


class MultinomialSparseProblem(NestedSites, SiteProblem):
    """One joint multiclass sparse GP problem: nested EP runs, the evidence, its gradient in the
    kernel's θ (and Z when ``learn_inducing``), and the prediction state.

    ``y`` holds the class indices 0..c-1 (int32).  The sites are nested EP's inner sites
    ``inner_precision``, ``inner_natural_mean`` (n, c); ``site_precision`` = π and
    ``site_natural_mean`` = ν̃ (the outer sites), both (c, n).
    """

    options_class = SparseFitOptions

    algorithm = "joint multiclass sparse EP"
    search_tol = None
    search_ftol = 1e-5

    def __init__(self, kernel, Z, X, labels, n_classes, options, learn_inducing=False):
        super().__init__(kernel, None, X, labels, options,
                         Hyperparameters(kernel, None, False, extra=Z if learn_inducing else None,
                                         hyperprior=options.hyperprior))
        n = X.shape[0]
        self.Z = Z
        self.n_classes = int(n_classes)
        self.learn_likelihood = False
        self.learn_inducing = bool(learn_inducing)
        self._zero_nested_sites(n, self.n_classes)

    def _ep(self, Vt, d, warm):
        """One nested EP run on the projections from the stored inner sites (``warm``) or zero sites."""
        opts = self.options
        n, c = Vt.shape[0], self.n_classes
        engine = MultinomialSparseEP(
            Vt, d, self.y, c, self.inner_precision.copy() if warm else np.zeros((n, c)),
            self.inner_natural_mean.copy() if warm else np.zeros((n, c)), damping=opts.damping,
            adaptive_damping=opts.adaptive_damping, tol=opts.tol, max_sweeps=opts.max_sweeps)
        info = engine.run(sweep_callback=sweep_callback_of(opts))
        return MultinomialSparseEPState(engine.inner_precision, engine.inner_natural_mean, engine.state,
                                        engine.posterior, info)

    def evaluate(self, params, *, gradient, warm, keep=False):
        """Nested EP at ``params`` = ``(kernel, None, Z)`` (Z None: the stored inducing inputs), the
        gradient in the kernel's θ (and ``Z.ravel()`` when ``learn_inducing``) and, with ``keep``,
        the prediction state; ``(log_z, grad or None, info)``."""
        kernel, Z = params[0], self.Z if params[2] is None else params[2]
        Kmm = np.ascontiguousarray(kernel._K(Z, None), dtype=np.float64)
        L, Vt, d = project_rows(kernel, self.X, Z, Kmm, self.options)
        state = None
        if warm and self._has_sites():
            with contextlib.suppress(*WARM_START_FAILURES):
                state = self._ep(Vt, d, warm=True)
        if state is None or state.info.n_failed:
            state = self._ep(Vt, d, warm=False)
        info, st, post = state.info, state.sites, state.posterior
        self.inner_precision, self.inner_natural_mean = state.inner_precision, state.inner_natural_mean
        self.site_precision, self.site_natural_mean = st["pi"].T.copy(), st["nu"].T.copy()
        grad = None
        if gradient:
            grad = self._gradient(kernel, Z, L, Vt, st, post)
        if keep:
            self.kernel, self.Z = kernel, Z
            self.predictor = MultinomialSparsePredictor(kernel, Z, L, post.mean_w, post.cov_w)
            self.log_ml, self.info = float(info.log_z), info
        return float(info.log_z), grad, info

    def _gradient(self, kernel, Z, L, Vt, st, post):
        n, m = Vt.shape
        fitc = self.options.approximation == "fitc"
        rows = _rows_per_block(self.n_classes, m)
        g_kernel, Gmm, g_z = 0.0, 0.0, 0.0
        for s in range(0, n, rows):
            sl = slice(s, min(s + rows, n))
            P = st["P"][sl]
            mean = matmul(Vt[sl], post.mean_w.T.copy())
            H = post.gradient_rows(Vt[sl], P)
            a, c = gradient_terms(mean, st["C"][sl], P, st["h"][sl], fitc)
            G = adjoint_block(L, Vt[sl], post.mean_w, a, H, c)
            gk, gm, gz = adjoint_shares(kernel, Z, self.X[sl], L, Vt[sl], G, c, self.learn_inducing)
            g_kernel, Gmm = g_kernel + gk, Gmm + gm
            g_z = g_z + gz if self.learn_inducing else None
        return gradient_from_sums(kernel, Z, g_kernel, Gmm, g_z, None, False, self.learn_inducing)
