"""Horseshoe-prior EP's parallel (damped) loop, in numpy around the compiled site step:
marginals, the EP iteration, the evidence and its gradients.

Equation numbers refer to the supplement of Hernández-Lobato & Hernández-Lobato,
*Learning Feature Selection Dependencies in Multi-task Learning* (NIPS 2013). The per-feature work
(cavities, eq 14; tilted moments by quadrature, eqs 15-21; site targets, eqs 22-25;
site normalisers, eq 26) runs in one compiled, GIL-free call
(:func:`fastep._epcore.horseshoe.site_step`); the marginals (eqs 2-13) are BLAS-3
operations on ``n x d`` / ``m x d`` arrays, never a ``d x d`` one when ``d > n``.

Sites are stored in natural form per task: ``pi_w = 1/η̃``, ``h_w = m̃/η̃``,
``pi_u = 1/ν̃``, ``pi_v = 1/ξ̃`` (eq 1).

w-marginals: the split Woodbury form
------------------------------------
Eq (3) needs ``Π⁻¹``; it loses ``log10(data precision / π_j)`` digits for a feature whose
site precision ``π_j`` is small next to its data precision ``‖x_j‖²/σ²`` (the relevant
features, whose sites are flat or negative), and fails for ``π_j ≤ 0``. We therefore split
the features into ``S = {j : π_j < 1e-4 ‖x_j‖²/σ²}`` (typically the few relevant ones,
``k = |S|``, capped at ``n`` by :func:`split_set`) and ``B`` (the rest, ``π_j > 0``),
apply eq (3) to ``B`` only,

    M_B = σ²I + X_B Π_B⁻¹ X_Bᵀ = L Lᵀ,    A_B⁻¹ = Π_B⁻¹ - Π_B⁻¹ X_Bᵀ M_B⁻¹ X_B Π_B⁻¹,

and treat ``S`` exactly through the Schur complement ``Q = Π_S + X_Sᵀ M_B⁻¹ X_S`` (k x k):

    V_SS = Q⁻¹,   V_BB = A_B⁻¹ + G Q⁻¹ Gᵀ,   V_SB = -Q⁻¹Gᵀ,   G = Π_B⁻¹ W_Bᵀ W_S,   W = L⁻¹X.

``V_w ≻ 0`` iff ``Q ≻ 0`` (``Π_B ≻ 0``), so negative site precisions are handled exactly;
the relative rounding of the ``B`` variances is at most ``ε/1e-4`` (while ``S`` is not
capped). Cost ``O(n²d + k²d + k³)``, memory ``O((n + k)d)``: ``O(n²d)`` and ``O(nd)`` with
``k <= n``; no ``d x d`` (or ``k x d`` with ``k > n``) array is formed.
When ``d ≤ n`` the ``d x d`` precision ``Π + XᵀX/σ²`` is factorised directly.
"""
import numpy as np
import scipy.linalg as sla
from scipy.linalg import blas as _blas

from .._epcore import horseshoe as _core
from .._linalg import gram, inner, matmul

__all__ = ["Task", "CorrelationFactors", "w_marginals", "latent_marginals", "run_task_ep",
           "initial_sites", "predictive_variance"]

_LOG_2PI = float(np.log(2.0 * np.pi))
#: Features whose site precision is below SPLIT times their data precision ‖x_j‖²/σ² go to S
#: (at most n of them, see :func:`split_set`) ...
SPLIT = 1e-4
#: ... except those below HARD_SPLIT times it, which always do.
HARD_SPLIT = 1e-10


class Task:
    """One task's data with the products EP reuses (``XᵀX`` only when ``d ≤ n``)."""

    def __init__(self, X, y):
        self.X = np.ascontiguousarray(X, dtype=float)
        self.y = np.ascontiguousarray(y, dtype=float)
        self.n, self.d = self.X.shape
        self.col_sq = np.einsum("ij,ij->j", self.X, self.X)
        self.Xty = matmul(self.X.T, self.y)
        self.yy = inner(self.y, self.y)
        self.dense = self.d <= self.n
        self.XtX = gram(self.X.T) if self.dense else None


class CorrelationFactors:
    """``C = diag(a) + U Uᵀ`` with ``δ = (D + rowsum P²)^{-1/2}``, ``a = δ² D``, ``U = ΔP`` (eqs 5, 31, 43)."""

    def __init__(self, P, D):
        self.P = np.ascontiguousarray(P, dtype=float)
        self.D = np.ascontiguousarray(D, dtype=float)
        self.m = self.P.shape[1]
        self.delta = 1.0 / np.sqrt(self.D + np.einsum("ij,ij->i", self.P, self.P))
        self.a = self.delta ** 2 * self.D
        self.U = self.delta[:, None] * self.P


def initial_sites(d, rho2, gamma2):
    """Cold start: w-sites of precision ``γ²/ρ²`` (the prior variance at ``λ = 1``), flat u and v sites."""
    return {"pi_w": np.full(d, gamma2 / rho2), "h_w": np.zeros(d), "pi_u": np.zeros(d), "pi_v": np.zeros(d)}


# --------------------------------------------------------------------------------------
# w-marginals (eqs 2-3, 27-28, 32-35)
# --------------------------------------------------------------------------------------
def _chol(A):
    try:
        return sla.cholesky(A, lower=True, check_finite=False)
    except (np.linalg.LinAlgError, ValueError):
        return None


def split_set(task, sigma2, pi):
    """The features treated exactly through the Schur complement (``S``, module docstring).

    ``S`` holds the features whose ratio ``r_j = π_j σ²/‖x_j‖²`` (site over data precision)
    is below ``SPLIT``, but at most ``n``: the cost is ``O(n²d + nkd + k²d + k³)`` and the
    memory ``O((n + k)d)``, so ``k = |S| <= n`` keeps one iteration ``O(n²d)``. When more
    features qualify (a transient of EP at large d: 4262 of d = 10 000 at n = 100, all
    with ``r >= 3e-7``, against k <= 10 at convergence), ``S`` takes every ``π_j <= 0`` and
    those with ``r_j < HARD_SPLIT`` and then the smallest ratios up to ``n``; the others
    stay in ``B``, whose variances then lose about ``log10(SPLIT/r_j)`` more digits than
    the ``ε/SPLIT`` bound. Returns ``None`` if more than ``n`` site precisions are ``<= 0``
    (then ``Π + XᵀX/σ²`` is not positive definite: those coordinates span more
    dimensions than the data can lift).
    """
    r = pi * (sigma2 / task.col_sq)
    in_s = r < SPLIT
    k = int(np.count_nonzero(in_s))
    if k <= task.n:
        return in_s
    forced = r < HARD_SPLIT
    n_forced = int(np.count_nonzero(forced))
    if np.count_nonzero(pi <= 0) > task.n:
        return None
    if n_forced >= task.n:
        return forced
    rest = np.flatnonzero(in_s & ~forced)
    keep = rest[np.argpartition(r[rest], task.n - n_forced - 1)[: task.n - n_forced]]
    forced[keep] = True
    return forced


def w_marginals(task, sigma2, pi, h, *, keep_factors=False):
    """Mean and marginal variances of ``q(w)``, the w-part of ``log Z̃`` and its ``σ²`` derivative.

    ``q(w) ∝ N(y | Xw, σ²I) Π_j exp(-π_j w_j²/2 + h_j w_j)``: ``V_w⁻¹ = Π + XᵀX/σ²``,
    ``μ = V_w(Xᵀy/σ² + h)`` (eq 2), by the split form of eq (3) (module docstring).

    Returns ``None`` if ``V_w`` is not positive definite, else a dict with ``mean``, ``var``,
    ``log_z = log ∫ N(y|Xw, σ²I) Π_j exp(-π_j w_j²/2 + h_j w_j) dw`` (the w-terms of eq 27,
    eqs 28 and 32, written around the residual ``y - Xμ`` so that no large terms cancel),
    ``grad_sigma2 = ∂ log_z/∂σ²`` (eqs 33-35: ``E‖y - Xw‖²/(2σ⁴) - n/(2σ²)``) and, with
    ``keep_factors``, what :func:`predictive_variance` needs.
    """
    X, n, d = task.X, task.n, task.d
    if task.dense:
        prec = task.XtX / sigma2
        prec[np.diag_indices(d)] += pi
        L = _chol(prec)
        if L is None:
            return None
        b = h + task.Xty / sigma2
        mean = sla.cho_solve((L, True), b, check_finite=False)
        Linv = sla.solve_triangular(L, np.eye(d), lower=True, check_finite=False)
        V = gram(Linv.T)
        var = np.diag(V).copy()
        resid = task.y - matmul(X, mean)
        rr = inner(resid, resid)
        log_z = (-0.5 * n * np.log(2 * np.pi * sigma2) + 0.5 * d * _LOG_2PI - np.sum(np.log(np.diag(L)))
                 - 0.5 * rr / sigma2 - 0.5 * inner(mean, pi * mean) + inner(h, mean))
        VXtX = np.einsum("ij,ij->i", V, task.XtX)
        tr_xvx = float(np.sum(VXtX))
        grad = (rr + tr_xvx) / (2 * sigma2 ** 2) - n / (2 * sigma2)
        # cavities (eq 14) without forming 1/V_jj - π_j: 1 - π_j V_jj = (V XᵀX)_jj/σ² =: e_j,
        # cavity precision e_j/V_jj, cavity mean (μ_j - V_jj h_j)/e_j
        e = VXtX / sigma2
        V_off = V.copy()
        V_off[np.diag_indices(d)] = 0.0
        cav_prec = e / var
        cav_mean = (matmul(V, task.Xty) / sigma2 + matmul(V_off, h)) / e
        out = {"mean": mean, "var": var, "log_z": float(log_z), "grad_sigma2": float(grad),
               "cav_prec": cav_prec, "cav_mean": cav_mean}
        if keep_factors:
            out["factors"] = ("dense", V)
        return out

    in_s = split_set(task, sigma2, pi)
    if in_s is None:
        return None
    S = np.flatnonzero(in_s)
    k = S.size
    inv_pi_b = np.where(in_s, 0.0, 1.0 / np.where(in_s, 1.0, pi))       # Π_B⁻¹ (0 on S)
    # M_B = σ²I + X_B Π_B⁻¹ X_Bᵀ by one syrk on X diag(Π_B^{-1/2})
    Z = X * np.sqrt(inv_pi_b)
    M = _blas.dsyrk(1.0, Z.T, trans=1, lower=1)                         # Z Zᵀ, lower triangle
    M[np.diag_indices(n)] += sigma2
    L = _chol(np.tril(M) + np.tril(M, -1).T)
    if L is None:
        return None
    # W = L⁻¹X: X's row-major memory is Xᵀ column-major, so solve Wᵀ Lᵀ = Xᵀ from the right.
    W = _blas.dtrsm(1.0, L, X.T, side=1, lower=1, trans_a=1).T         # (n, d), C order
    w_sq = np.einsum("ij,ij->j", W, W)
    m_b = h * inv_pi_b                                                 # prior means of B features
    r0 = task.y - matmul(X, m_b)
    alpha = sla.solve_triangular(L, r0, lower=True, check_finite=False)
    var = inv_pi_b * (1.0 - w_sq * inv_pi_b)                           # diag A_B⁻¹ (0 on S)
    log_z = (0.5 * (d - k) * _LOG_2PI + 0.5 * np.sum(np.log(pi[~in_s])) * -1.0
             + 0.5 * float(np.sum(h * m_b)) - 0.5 * n * _LOG_2PI - np.sum(np.log(np.diag(L))))
    if k:
        WS = np.ascontiguousarray(W[:, S])
        Q = gram(WS.T)
        Q[np.diag_indices(k)] += pi[S]
        LQ = _chol(Q)
        if LQ is None:
            return None
        b_s = h[S] + matmul(WS.T, alpha)
        mu_s = sla.cho_solve((LQ, True), b_s, check_finite=False)
        beta = alpha - matmul(WS, mu_s)
        # V_BB correction: diag(G Q⁻¹ Gᵀ), G = Π_B⁻¹ W_Bᵀ W_S
        T = sla.solve_triangular(LQ, matmul(WS.T, W), lower=True, check_finite=False)   # (k, d)
        e = w_sq - np.einsum("ij,ij->j", T, T)
        var = inv_pi_b * (1.0 - e * inv_pi_b)
        LQinv = sla.solve_triangular(LQ, np.eye(k), lower=True, check_finite=False)
        var[S] = np.einsum("ij,ij->j", LQinv, LQinv)
        # -½‖α‖² + ½ b_SᵀQ⁻¹b_S = -½‖β‖² - ½ μ_SᵀΠ_Sμ_S + h_Sᵀμ_S (no cancellation)
        log_z += (0.5 * k * _LOG_2PI - np.sum(np.log(np.diag(LQ))) - 0.5 * inner(beta, beta)
                  - 0.5 * inner(mu_s, pi[S] * mu_s) + inner(h[S], mu_s))
    else:
        beta = alpha
        e = w_sq
        log_z += -0.5 * inner(beta, beta)
    Wb = matmul(W.T, beta)
    mean = m_b + Wb * inv_pi_b
    # cavities (eq 14) for B without the cancellation of 1/V_jj - π_j: with
    # V_jj = (1 - e_j/π_j)/π_j, the cavity precision is e_j/(1 - e_j/π_j) and the cavity
    # mean m_B,j + (Wᵀβ)_j/e_j
    with np.errstate(divide="ignore", invalid="ignore"):
        cav_prec = e / (1.0 - e * inv_pi_b)
        cav_mean = m_b + Wb / e
    if k:
        mean[S] = mu_s
        cav_prec[S] = 1.0 / var[S] - pi[S]
        cav_mean[S] = (mu_s / var[S] - h[S]) / cav_prec[S]
    # σ² gradient: -½tr M_B⁻¹ + ½‖M_B⁻¹(r₀ - X_Sμ_S)‖² + ½tr(Q⁻¹ X_Sᵀ M_B⁻² X_S)
    Linv = sla.solve_triangular(L, np.eye(n), lower=True, check_finite=False)
    Mb = matmul(Linv.T, beta)                                                 # M_B⁻¹(r₀ - X_Sμ_S)
    grad = -0.5 * float(np.sum(Linv * Linv)) + 0.5 * inner(Mb, Mb)
    if k:
        Zs = matmul(Linv.T, WS)                                               # M_B⁻¹ X_S  (n, k)
        Y = sla.solve_triangular(LQ, Zs.T, lower=True, check_finite=False)
        grad += 0.5 * float(np.sum(Y * Y))
    out = {"mean": mean, "var": var, "log_z": float(log_z), "grad_sigma2": float(grad),
           "cav_prec": cav_prec, "cav_mean": cav_mean}
    if keep_factors:
        out["factors"] = ("split", in_s, inv_pi_b, L, WS if k else None, LQ if k else None)
    return out


def predictive_variance(task, factors, Xnew):
    """``x*ᵀ V_w x*`` for each row of ``Xnew`` from the factors kept by :func:`w_marginals`."""
    Xnew = np.asarray(Xnew, dtype=float)
    if factors[0] == "dense":
        V = factors[1]
        return np.einsum("ij,jk,ik->i", Xnew, V, Xnew)
    _, in_s, inv_pi_b, L, WS, LQ = factors
    U = Xnew * inv_pi_b                                                # x_B Π_B⁻¹ (0 on S)
    Y = sla.solve_triangular(L, matmul(task.X, U.T), lower=True, check_finite=False)   # L⁻¹X_BΠ_B⁻¹x_B
    var = np.einsum("ij,ij->i", Xnew, U) - np.einsum("ij,ij->j", Y, Y)
    if WS is not None:
        g = matmul(WS.T, Y) - Xnew[:, in_s].T                                 # Gᵀx_B - x_S
        T = sla.solve_triangular(LQ, g, lower=True, check_finite=False)
        var += np.einsum("ij,ij->j", T, T)
    return np.maximum(var, 0.0)


# --------------------------------------------------------------------------------------
# u- and v-marginals (eqs 5-13, 29-31) and their gradients (eqs 36-50)
# --------------------------------------------------------------------------------------
def latent_marginals(cf, scale2, pi, *, gradients=False):
    """Marginal variances of ``q(u) ∝ N(u | 0, scale2·C) Π_j exp(-π_j u_j²/2)`` in O(m²d).

    ``g = 1 + scale2·a·π``, ``G = scale2·a/g`` (eqs 8-9), ``L = √scale2·U/g`` (eqs 12-13),
    ``M = I + scale2·Uᵀdiag(π/g)U`` (= ``I + PᵀBP``), ``V = G + L M⁻¹ Lᵀ`` (eqs 10-11).
    ``log_z = ½log|V| - ½log|scale2·C| = -½Σ log g - ½log|M|`` (eqs 29-31).

    Returns ``None`` unless every ``g_j > 0`` and ``M ≻ 0`` (together equivalent to
    ``V ≻ 0``). With ``gradients``: ``grad_scale2 = -tr(VΠ)/(2 scale2)`` (eqs 36-38) and
    ``grad_P = -scale2·ΔWΔP + diag(δ²·V_jj·π_j)P``, ``W = Π - ΠVΠ`` (eqs 40-50).
    """
    g = 1.0 + scale2 * cf.a * pi
    if not np.all(g > 0):
        return None
    G = scale2 * cf.a / g
    if cf.m == 0:
        var = G
        log_z = -0.5 * float(np.sum(np.log(g)))
        out = {"var": var, "log_z": log_z, "cav_var": scale2 * cf.a}      # cavity = prior marginal
        if gradients:
            out["grad_scale2"] = -inner(var, pi) / (2.0 * scale2)
            out["grad_P"] = np.zeros_like(cf.P)
        return out
    Lm = (np.sqrt(scale2) / g)[:, None] * cf.U
    M = matmul((cf.U * (scale2 * pi / g)[:, None]).T, cf.U)
    M[np.diag_indices(cf.m)] += 1.0
    R = _chol(M)
    if R is None:
        return None
    T = sla.solve_triangular(R, Lm.T, lower=True, check_finite=False)   # R⁻¹Lᵀ (m, d)
    var = G + np.einsum("ij,ij->j", T, T)
    log_z = -0.5 * float(np.sum(np.log(g))) - float(np.sum(np.log(np.diag(R))))
    # cavity (eq 14) without 1/V_jj - π_j: u_j = ρ(√a_j z_j + U_j ζ) with ζ ~ N(0, I_m) and the
    # other sites acting on ζ only, so ν_j = scale2 (a_j + U_j M_{-j}⁻¹ U_jᵀ) with
    # M_{-j} = M - c_j U_jᵀU_j, c_j = scale2 π_j/g_j: by Sherman-Morrison
    # U_j M_{-j}⁻¹ U_jᵀ = s_j/(1 - c_j s_j), s_j = U_j M⁻¹ U_jᵀ, and 1 - c_j s_j >= 1/(1 + ‖P_j‖²/D_j).
    sj = np.einsum("ij,ij->j", T, T) * g * g / scale2
    cj = scale2 * pi / g
    with np.errstate(divide="ignore", invalid="ignore"):
        cav_var = scale2 * (cf.a + sj / (1.0 - cj * sj))
    out = {"var": var, "log_z": log_z, "cav_var": cav_var}
    if gradients:
        out["grad_scale2"] = -inner(var, pi) / (2.0 * scale2)
        Zp = (pi * cf.delta)[:, None] * cf.P                          # ΠΔP
        VZ = G[:, None] * Zp + matmul(T.T, matmul(T, Zp))                          # V ΠΔP (L M⁻¹ Lᵀ = TᵀT)
        out["grad_P"] = (-scale2 * cf.delta[:, None] * (Zp - pi[:, None] * VZ)
                         + (cf.delta ** 2 * var * pi)[:, None] * cf.P)
    return out


# --------------------------------------------------------------------------------------
# The EP loop
# --------------------------------------------------------------------------------------
def _marginals(task, sigma2, rho2, gamma2, cf, sites, *, gradients=False, keep_factors=False):
    """All marginals of a site configuration, or ``None`` if it is not valid (eq 14 cavities included)."""
    wm = w_marginals(task, sigma2, sites["pi_w"], sites["h_w"], keep_factors=keep_factors)
    if wm is None:
        return None
    um = latent_marginals(cf, rho2, sites["pi_u"], gradients=gradients)
    if um is None:
        return None
    vm = latent_marginals(cf, gamma2, sites["pi_v"], gradients=gradients)
    if vm is None:
        return None
    # every marginal and cavity (eq 14) must be proper
    cav_prec = wm["cav_prec"]
    if not (np.all(wm["var"] > 0) and np.all(um["var"] > 0) and np.all(vm["var"] > 0)
            and np.all(cav_prec > 0) and np.all(np.isfinite(cav_prec)) and np.all(np.isfinite(wm["cav_mean"]))
            and np.all(um["cav_var"] > 0) and np.all(np.isfinite(um["cav_var"]))
            and np.all(vm["cav_var"] > 0) and np.all(np.isfinite(vm["cav_var"]))
            and np.all(np.isfinite(wm["mean"]))):
        return None
    return {"w": wm, "u": um, "v": vm, "cav_var": 1.0 / cav_prec}


def run_task_ep(task, sigma2, rho2, gamma2, cf, sites, *, damping=0.5, damping_decay=0.99,
                min_damping=0.3, tol=1e-8, max_iter=1000, max_halvings=10, max_held=25,
                negative_precision="clip", w_floor=-0.1, n_threads=None, stall_window=50,
                stall_factor=0.5, lowest_damping=0.02):
    """Parallel damped EP for one task (supplement §1); the sites are updated in place.

    Iteration ``k`` (from 0): marginals (eqs 2-13) → cavities, tilted moments and target
    sites for all features in one compiled call (eqs 14-25) → every site moves a fraction
    ``ε_k = max(damping · damping_decay^k, floor)`` towards its target in natural
    parameters (``g̃ ← g̃_new^ε g̃_old^{1-ε}``). The supplement's schedule is 0.5, reduced by
    1% per iteration; it sums to 50, so alone it can stall before ``tol``: the ``floor``
    (``min_damping``, 0.3 by default) keeps EP moving (see the ``damping`` parameters of
    :class:`fastep.MultiTaskHorseshoeRegression`).

    Stall watch. Every ``stall_window`` iterations, if every step of the window was taken at
    the scheduled ``ε`` (no halving, below) and the smallest residual of the window is not
    below ``stall_factor`` times that of the previous window, the floor is halved (never
    below ``lowest_damping``). When ``C`` has strong correlations (``|C_ij|`` near 0.95) a
    fixed floor of 0.3 leaves an oscillating mode that contracts by only about 1% per
    iteration; the smaller step damps it (about five times fewer iterations to ``tol = 1e-8``).

    Negative site precisions (the policy):

    - u- and v-sites: negative precisions are accepted (eqs 18-21 make one of the two
      negative for almost every feature; the tilted second moments are at most twice the
      cavity variances, so a target is never below ``-1/(2ν_j)`` or ``-1/(2ξ_j)``).
    - w-sites: ``negative_precision='clip'`` (default) keeps a target precision
      ``>= w_floor/η_j`` (``η_j`` the cavity variance, default ``w_floor = -0.1``) with the
      mean still matched; ``'allow'`` keeps every target. Unbounded negative w-sites are
      exact EP but unstable when many features are ambiguous (bimodal tilted ``w``, targets
      of -0.2/η to -0.35/η): together they make the posterior nearly improper along some
      direction, other features' cavity variances blow up and the iteration diverges (for
      instance at small σ² with n = 60 and d = 200, also in the reference twin, where a
      floor of -0.2/η still diverges and -0.1/η converges). Clearly relevant features have
      small negative targets (about -0.001/η to -0.02/η) that pass the floor, so on
      well-determined problems nothing is clipped (``n_clipped == 0``); the evidence
      gradient is exact only then.
    - Every step must leave a valid state: ``V_w``, ``V_u``, ``V_v`` positive definite and
      every cavity variance (eq 14) positive and finite. An invalid step is halved, up to
      ``max_halvings`` times. If it is still invalid, the step is taken with every
      site-precision *decrease* held back (increases and ``h_w`` move by the full ``ε``):
      raising site precisions raises the posterior precision and every cavity precision,
      so this step keeps a valid state valid (it is checked all the same). After more than ``max_held`` consecutive held iterations EP
      stops with ``status='stuck'`` (the targets lie outside the region where all cavities
      are proper, typically when ``C`` correlates features strongly), keeping the last valid
      state. Nothing returned is NaN; the estimators warn (``ConvergenceWarning``) whenever
      ``status`` is not 'converged'.

    Converged when the largest scaled site residual (target minus current, undamped)
    ``max_j max(|Δπ_w|/p_w, |Δh_w|/√p_w, |Δπ_u|/p_u, |Δπ_v|/p_v)``, ``p_w = 1/η + |π_w|``,
    ``p_u = 1/ν + |π_u|``, ``p_v = 1/ξ + |π_v|`` (relative changes of the marginals; a
    plain ``|Δπ|η`` stalls at rounding level for the huge v-site precisions of relevant
    features under strong global shrinkage) is below ``tol``.

    Returns
    -------
    dict with ``converged``, ``status`` ('converged', 'max_iter', 'stuck'), ``n_iter``,
    ``residual``, ``n_clipped`` (w-site targets clipped in the last iteration), ``n_held``
    (site-precision decreases held back in the last held iteration, 0 if none),
    ``n_held_iter`` (iterations with held decreases), ``min_damping`` (the floor reached by
    the stall watch), ``state`` (marginals with gradients and prediction factors) and
    ``site`` (the last :func:`fastep._epcore.horseshoe.site_step` output, evaluated at
    ``state``).
    Raises ``ValueError`` if the starting sites are not valid.
    """
    if negative_precision not in ("clip", "allow"):
        raise ValueError(f"negative_precision must be 'clip' or 'allow', got {negative_precision!r}")
    w_floor_value = float(w_floor) if negative_precision == "clip" else -np.inf
    state = _marginals(task, sigma2, rho2, gamma2, cf, sites)
    if state is None:
        raise ValueError("the starting sites give an improper posterior or cavity")
    status = "max_iter"
    it = 0
    n_held = 0
    n_held_iter = 0
    held_run = 0
    residual = np.inf
    damp_floor = float(min_damping)
    window_best, prev_window_best, window_clean = np.inf, np.inf, True
    while True:
        out, n_bad, n_clipped = _core.site_step(
            state["w"]["cav_mean"], state["cav_var"], state["u"]["cav_var"], state["v"]["cav_var"],
            state["w"]["mean"], state["w"]["var"], state["u"]["var"], state["v"]["var"], sites["pi_w"],
            sites["h_w"], sites["pi_u"], sites["pi_v"], w_floor=w_floor_value, n_threads=n_threads)
        if n_bad:  # cannot happen for a validated state; never continue with NaN
            raise FloatingPointError("EP produced an improper cavity; this is a bug, please report it")
        residual = float(np.max(out[5])) if task.d else 0.0
        if residual < tol:
            status = "converged"
            break
        if it >= max_iter:
            break
        # stall watch: a window of stall_window iterations, all taken at the scheduled step,
        # that did not lower the residual by stall_factor halves the floor
        window_best = min(window_best, residual)
        if it and it % stall_window == 0:
            if window_clean and window_best > stall_factor * prev_window_best:
                damp_floor = max(0.5 * damp_floor, lowest_damping)
            prev_window_best, window_best, window_clean = window_best, np.inf, True
        eps = max(damping * damping_decay ** it, damp_floor)
        targets = {"pi_w": out[0], "h_w": out[1], "pi_u": out[2], "pi_v": out[3]}
        eps0 = eps
        for _ in range(max_halvings + 1):
            new = {key: sites[key] + eps * (targets[key] - sites[key]) for key in sites}
            new_state = _marginals(task, sigma2, rho2, gamma2, cf, new)
            if new_state is not None:
                held_run = 0
                break
            eps *= 0.5
            window_clean = False
        else:
            # Hold the precision decreases: raising site precisions can only raise the posterior
            # precision and every cavity precision, so this step keeps the state valid (docstring).
            new = {key: sites[key] + eps0 * (np.maximum(targets[key], sites[key]) - sites[key])
                   if key != "h_w" else sites[key] + eps0 * (targets[key] - sites[key]) for key in sites}
            n_held = int(sum(np.count_nonzero(targets[key] < sites[key]) for key in ("pi_w", "pi_u", "pi_v")))
            new_state = _marginals(task, sigma2, rho2, gamma2, cf, new)
            held_run += 1
            n_held_iter += 1
            if new_state is None or held_run > max_held:
                status = "stuck"
                break
        for key in sites:
            sites[key][...] = new[key]
        state = new_state
        it += 1
    final = _marginals(task, sigma2, rho2, gamma2, cf, sites, gradients=True, keep_factors=True)
    log_z = float(np.sum(out[4]) + final["w"]["log_z"] + final["u"]["log_z"] + final["v"]["log_z"])
    return {"converged": status == "converged", "status": status, "n_iter": it, "residual": residual,
            "state": final, "site": out, "log_z": log_z, "n_clipped": n_clipped, "n_held": n_held,
            "n_held_iter": n_held_iter, "min_damping": damp_floor}
