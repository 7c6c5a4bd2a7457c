"""Reference (plain numpy/scipy) twin of horseshoe-prior EP with learnt feature-selection dependencies.

Equation numbers refer to the supplement of Hernández-Lobato & Hernández-Lobato,
*Learning Feature Selection Dependencies in Multi-task Learning* (NIPS 2013).

Model (one task)
----------------
``y = X w + ε``, ``ε ~ N(0, σ² I)``; ``g_j(w_j, u_j, v_j) = N(w_j | 0, u_j²/v_j²)``;
``u ~ N(0, ρ² C)``, ``v ~ N(0, γ² C)``, ``C = Δ D Δ + Δ P Pᵀ Δ`` with ``Δ`` diagonal such that
``diag C = 1``. In the multi-task model every task has its own ``w, u, v`` and ``σ²``; all
tasks share ``C`` (``P``, ``D``), ``ρ²`` and ``γ²``.

Sites (eq 1) are stored in natural form, per feature ``j``:

* ``pi_w[j] = 1/η̃_j`` and ``h_w[j] = m̃_j/η̃_j`` (Gaussian in ``w_j``),
* ``pi_u[j] = 1/ν̃_j``, ``pi_v[j] = 1/ξ̃_j`` (zero-mean Gaussians in ``u_j``, ``v_j``),

zero meaning a flat site. Negative precisions are allowed (they are needed: eqs 18-21 give
``E[u²] = 2ν(1 - t)`` and ``E[v²] = 2ξt`` with ``t ∈ (0, 1)``, so one of the two u/v sites is
negative for almost every feature); a state is *valid* when the posterior is a proper
Gaussian and every cavity (eq 14) has a positive variance. A damped step that would leave
the valid set is retried with half the step (see :func:`run_ep`).

This module is written for clarity; it never imports the compiled core. Its w-marginals
use eq (3) literally (``Π⁻¹`` Woodbury when ``n < d``), which loses digits when a site
precision is tiny compared with the feature's data precision; the compiled engine uses a
split form without that cancellation.
"""
import warnings

import numpy as np
import scipy.linalg as sla
from scipy.special import expit

__all__ = [
    "tilted_moments", "horseshoe_density", "correlation_factors", "correlation_matrix",
    "w_marginals", "latent_marginals", "cavities", "site_targets", "site_log_normalisers",
    "initial_sites", "run_ep", "log_evidence", "evidence_gradients",
    "run_multitask_ep", "multitask_log_evidence", "multitask_evidence_gradients",
]

_LOG_2PI = np.log(2.0 * np.pi)


# --------------------------------------------------------------------------------------
# Tilted moments (eqs 15-21) by one-dimensional quadrature over λ
# --------------------------------------------------------------------------------------
def _log_integrand(s, m, eta, log_a):
    """log of ``N(m | 0, λ² + η) · C⁺(λ | 0, √a) · λ`` at ``λ = exp(s)`` (eq 15 after ``dλ = λ ds``)."""
    log_q = np.logaddexp(2.0 * s, np.log(eta))            # log(λ² + η)
    # half-Cauchy with scale √a times λ: 2 λ̂/(π(1 + λ̂²)) with λ̂ = λ/√a
    log_hc = np.log(2.0 / np.pi) + (s - 0.5 * log_a) - np.logaddexp(0.0, 2.0 * s - log_a)
    return -0.5 * (_LOG_2PI + log_q) - 0.5 * m * m * np.exp(-log_q) + log_hc


def tilted_moments(m, eta, nu, xi, *, step=0.1):
    """Moments of ``g_j q^{\\j}`` for cavities ``N(w|m, η) N(u|0, ν) N(v|0, ξ)`` (eqs 15-21).

    With ``a = ν/ξ`` the ratio ``u/v`` under the cavity is Cauchy with scale ``√a``, so
    ``s_j = ∫_0^∞ N(m | 0, λ² + η) C⁺(λ | 0, √a) dλ`` (eq 15). Given ``λ`` the tilted ``w`` is
    Gaussian with mean ``r m`` and variance ``r η``, ``r = λ²/(λ² + η)`` (eqs 16-17). For ``u``
    and ``v`` eqs 18-21 reduce to ``E[u²] = 2ν(1 - t)``, ``E[v²] = 2ξ t`` with
    ``t = E[a/(a + λ²)]`` (expectation over the tilted ``λ``), which is eq 20 written as
    ``ν ∂log s/∂ν = 1/2 - t`` (and eq 21: ``ξ ∂log s/∂ξ = t - 1/2``).

    Quadrature: the trapezoidal rule in ``s = log λ`` with step ``step`` over a window
    wide enough that the integrand is below ``e^-40`` of its largest value beyond it
    (the integrand decays like ``e^{s}`` to the left and ``e^{-2s}`` to the right).

    Returns
    -------
    log_s, mean, var, Eu2, Ev2, t : ndarrays
        ``log s_j``, ``E[w_j]``, ``Var[w_j]``, ``E[u_j²]``, ``E[v_j²]`` and ``t_j``.
    """
    m, eta, nu, xi = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (m, eta, nu, xi)))
    shape = m.shape
    m, eta, nu, xi = (v.ravel() for v in (m, eta, nu, xi))
    out = np.empty((6, m.size))
    for j in range(m.size):
        log_a = np.log(nu[j]) - np.log(xi[j])
        half_log_eta = 0.5 * np.log(eta[j])
        centres = [0.5 * log_a, half_log_eta]
        if m[j] != 0.0:
            centres.append(np.log(abs(m[j])))
        lo = min(0.5 * log_a, half_log_eta) - 40.0
        hi = max(centres) + 22.0
        s = np.arange(lo, hi + step, step)
        g = _log_integrand(s, m[j], eta[j], log_a)
        g_max = g.max()
        weights = np.exp(g - g_max)
        total = weights.sum()
        p = weights / total
        r = expit(2.0 * s - np.log(eta[j]))             # λ²/(λ² + η)
        kappa = expit(np.log(eta[j]) - 2.0 * s)         # 1 - r, accurate where r is near 1
        mean_r, mean_kappa = p @ r, p @ kappa
        # Var r = Var κ: centre the smaller of the two to keep the digits
        var_r = p @ (r - mean_r) ** 2 if mean_r <= mean_kappa else p @ (kappa - mean_kappa) ** 2
        t = p @ expit(log_a - 2.0 * s)                  # E[a/(a + λ²)]
        one_minus_t = p @ expit(2.0 * s - log_a)        # E[λ²/(a + λ²)], no cancellation
        out[0, j] = np.log(total * step) + g_max
        out[1, j] = m[j] * mean_r
        out[2, j] = eta[j] * mean_r + m[j] ** 2 * var_r
        out[3, j] = 2.0 * nu[j] * one_minus_t
        out[4, j] = 2.0 * xi[j] * t
        out[5, j] = t
    return tuple(o.reshape(shape) for o in out)


def horseshoe_density(w, scale, *, step=0.05):
    """Horseshoe density ``p(w) = ∫_0^∞ N(w | 0, scale² λ²) C⁺(λ | 0, 1) dλ`` (``w ≠ 0``).

    The normaliser ``s_j`` of eq (15) in the limit of a point-mass cavity (``η → 0``),
    evaluated with the same trapezoidal rule in ``log λ`` as :func:`tilted_moments`.
    """
    w = np.asarray(w, dtype=float)
    out = np.empty(w.shape)
    log_a = 2.0 * np.log(scale)
    for i, wi in np.ndenumerate(w):
        if wi == 0.0:
            out[i] = np.inf                      # the horseshoe density has a pole at 0
            continue
        centres = (0.5 * log_a, np.log(abs(wi)))
        s = np.arange(min(centres) - 40.0, max(centres) + 22.0, step)
        g = (
            -0.5 * (_LOG_2PI + 2.0 * s) - 0.5 * wi * wi * np.exp(-2.0 * s)
            + np.log(2.0 / np.pi) + (s - 0.5 * log_a) - np.logaddexp(0.0, 2.0 * s - log_a))
        g_max = g.max()
        out[i] = np.exp(g_max) * np.sum(np.exp(g - g_max)) * step
    return out


# --------------------------------------------------------------------------------------
# The correlation matrix C = Δ D Δ + Δ P Pᵀ Δ
# --------------------------------------------------------------------------------------
def correlation_factors(P, D):
    """``δ = diag Δ = (D + rowsum(P²))^{-1/2}``, ``a = diag(Δ D Δ)`` and ``U = Δ P`` so that ``C = diag(a) + U Uᵀ``."""
    P = np.asarray(P, dtype=float)
    D = np.asarray(D, dtype=float)
    delta = 1.0 / np.sqrt(D + np.sum(P * P, axis=1))
    return delta, delta * delta * D, delta[:, None] * P


def correlation_matrix(P, D):
    """The dense ``d x d`` matrix ``C`` (small ``d`` only; for tests and reports)."""
    delta, a, U = correlation_factors(P, D)
    return np.diag(a) + U @ U.T


# --------------------------------------------------------------------------------------
# Marginals of q (eqs 2-13)
# --------------------------------------------------------------------------------------
def w_marginals(X, y, sigma2, pi_w, h_w):
    """Mean, marginal variances and evidence term of ``q(w) ∝ N(y|Xw, σ²I) Π_j exp(-π_j w_j²/2 + h_j w_j)``.

    ``V_w⁻¹ = Π + XᵀX/σ²``, ``μ = V_w (Xᵀy/σ² + h)`` (eq 2). For ``n < d``, ``V_w`` by eq (3):
    ``V_w = Π⁻¹ - Π⁻¹Xᵀ M⁻¹ X Π⁻¹`` with ``M = σ²I + XΠ⁻¹Xᵀ`` (any nonzero ``π_j``; ``M`` is
    solved by LU). Otherwise the ``d x d`` precision is factorised directly.

    Returns a dict with ``mean``, ``var`` (diag ``V_w``), ``log_z`` =
    ``log ∫ N(y|Xw, σ²I) Π_j exp(-π_j w_j²/2 + h_j w_j) dw`` (the w-part of eq 27, with
    eqs 28 and 32), ``grad_sigma2`` = its derivative w.r.t. ``σ²`` (eqs 33-35), and ``ok``
    (False when ``V_w`` is not positive definite).
    """
    X = np.asarray(X, dtype=float)
    n, d = X.shape
    pi_w = np.asarray(pi_w, dtype=float)
    h_w = np.asarray(h_w, dtype=float)
    b = X.T @ y / sigma2 + h_w
    if n < d and np.all(pi_w != 0.0):
        inv_pi = 1.0 / pi_w
        XPi = X * inv_pi                                 # X Π⁻¹
        M = sigma2 * np.eye(n) + XPi @ X.T               # eq (3)
        lu = sla.lu_factor(M)
        A = sla.lu_solve(lu, XPi)                        # M⁻¹ X Π⁻¹
        var = inv_pi - np.einsum("ij,ij->j", XPi, A)
        mean = inv_pi * b - XPi.T @ sla.lu_solve(lu, XPi @ b)
        # log|V_w| = -log|Π| - log|I + XΠ⁻¹Xᵀ/σ²| (eq 28); signs must agree for V_w PD
        sign_pi = np.prod(np.sign(pi_w))
        sign_m, logdet_m = np.linalg.slogdet(M)
        logdet_v = -np.sum(np.log(np.abs(pi_w))) - (logdet_m - n * np.log(sigma2))
        ok = bool(sign_pi * sign_m > 0 and np.all(var > 0))
        # μᵀV_w⁻¹μ = bᵀ V_w b (eq 32)
        quad = b @ mean
        # tr(X V_w Xᵀ) = σ²(n - σ² tr M⁻¹) from eq (3)
        tr_xvx = sigma2 * (n - sigma2 * np.trace(sla.lu_solve(lu, np.eye(n))))
    else:
        prec = np.diag(pi_w) + X.T @ X / sigma2
        try:
            L = np.linalg.cholesky(prec)
        except np.linalg.LinAlgError:
            return {"ok": False}
        Linv = sla.solve_triangular(L, np.eye(d), lower=True)
        V = Linv.T @ Linv
        var = np.diag(V).copy()
        mean = V @ b
        logdet_v = -2.0 * np.sum(np.log(np.diag(L)))
        quad = b @ mean
        tr_xvx = np.einsum("ij,jk,ik->", X, V, X)
        ok = bool(np.all(var > 0))
    log_z = (-0.5 * n * np.log(2 * np.pi * sigma2) - 0.5 * y @ y / sigma2 + 0.5 * d * _LOG_2PI
             + 0.5 * logdet_v + 0.5 * quad)
    resid = y - X @ mean
    # d log Z_w/dσ² = (E||y - Xw||²)/(2σ⁴) - n/(2σ²): eq (33) with eqs (34)-(35) simplified
    grad_sigma2 = (resid @ resid + tr_xvx) / (2 * sigma2 ** 2) - n / (2 * sigma2)
    return {"ok": ok, "mean": mean, "var": var, "log_z": log_z, "grad_sigma2": grad_sigma2}


def latent_marginals(P, D, scale2, pi):
    """Marginal variances of ``q(u) ∝ N(u | 0, scale2·C) Π_j exp(-π_j u_j²/2)`` (eqs 5-13).

    With ``C = diag(a) + U Uᵀ`` (``a = diag ΔDΔ``, ``U = ΔP``) and ``g_j = 1 + scale2 a_j π_j``:
    ``G = diag(scale2 a/g)`` (eqs 8-9), ``L = √scale2 · diag(1/g) U`` (eqs 12-13),
    ``M = I + Pᵀ B P = I + scale2 Uᵀ diag(π/g) U`` (``B`` of eqs 12-13), and
    ``V = G + L M⁻¹ Lᵀ`` (eqs 10-11). Cost O(m² d); no ``d x d`` matrix.

    Returns a dict with ``var`` (diag V), ``log_z`` = ``½log|V| - ½log|scale2 C|`` =
    ``-½ Σ log g_j - ½ log|M|`` (eqs 29-31 by Sylvester's theorem), its gradients
    ``grad_scale2`` (eqs 36-38) and ``grad_P`` (eqs 40-50), and ``ok`` (False unless every
    ``g_j > 0`` and ``M`` is positive definite, which together are equivalent to V ≻ 0).
    """
    P = np.asarray(P, dtype=float)
    pi = np.asarray(pi, dtype=float)
    d, m = P.shape
    delta, a, U = correlation_factors(P, D)
    g = 1.0 + scale2 * a * pi
    if np.any(g <= 0):
        return {"ok": False}
    G = scale2 * a / g
    Lmat = np.sqrt(scale2) * U / g[:, None]
    M = np.eye(m) + scale2 * (U * (pi / g)[:, None]).T @ U
    try:
        R = np.linalg.cholesky(M)
    except np.linalg.LinAlgError:
        return {"ok": False}
    # R⁻¹ Lᵀ (m x d); with no shared factor (m = 0) it is empty, which older scipy's
    # solve_triangular refuses
    T = sla.solve_triangular(R, Lmat.T, lower=True) if m else np.zeros((0, Lmat.shape[0]))
    var = G + np.sum(T * T, axis=0)
    log_z = -0.5 * np.sum(np.log(g)) - 2.0 * 0.5 * np.sum(np.log(np.diag(R)))
    # d/d scale2 of -½ log|I + scale2 C Π| = -tr(V Π)/(2 scale2)
    grad_scale2 = -np.sum(var * pi) / (2.0 * scale2)
    # d/dP: with W = Π - Π V Π, ∂/∂P = -scale2 Δ W Δ P + diag(δ² V_jj π_j) P
    Z = (pi * delta)[:, None] * P                          # Π Δ P
    VZ = G[:, None] * Z                                    # V Π Δ P
    if m:
        VZ = VZ + Lmat @ sla.cho_solve((R, True), Lmat.T @ Z)
    WDP = Z - pi[:, None] * VZ                             # W Δ P
    grad_P = -scale2 * delta[:, None] * WDP + (delta ** 2 * var * pi)[:, None] * P
    return {"ok": True, "var": var, "log_z": log_z, "grad_scale2": grad_scale2, "grad_P": grad_P}


def cavities(var, pi, mean=None, h=None):
    """Cavity parameters (eq 14): ``1/cav_var = 1/V_jj - π_j`` and, for w, ``cav_mean``.

    Returns ``cav_var`` (and ``cav_mean`` when ``mean`` and ``h`` are given); entries are
    ``nan`` where the cavity precision is not positive (an invalid state).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        cav_prec = 1.0 / var - pi
        cav_var = np.where(cav_prec > 0, 1.0 / cav_prec, np.nan)
        if mean is None:
            return cav_var
        cav_mean = cav_var * (mean / var - h)
    return cav_var, cav_mean


def site_targets(cav_mean, cav_var, cav_nu, cav_xi, *, w_floor=-0.1):
    """Undamped site updates (eqs 22-25) from the tilted moments, in natural form.

    A w-site precision below ``w_floor/η_j`` is raised to it and ``h_w`` set so that the
    marginal mean still equals ``E[w_j]``: ``h_w = E[w_j](1 + w_floor)/η_j - m_j/η_j``.

    Returns ``(pi_w, h_w, pi_u, pi_v, log_s)``.
    """
    log_s, mean, var, Eu2, Ev2, t = tilted_moments(cav_mean, cav_var, cav_nu, cav_xi)
    pi_w = 1.0 / var - 1.0 / cav_var                       # eq (22)
    h_w = mean / var - cav_mean / cav_var                  # eq (23)
    clipped = pi_w * cav_var < w_floor
    pi_w = np.where(clipped, w_floor / cav_var, pi_w)
    h_w = np.where(clipped, (mean * (1.0 + w_floor) - cav_mean) / cav_var, h_w)
    pi_u = 1.0 / Eu2 - 1.0 / cav_nu                        # eq (24)
    pi_v = 1.0 / Ev2 - 1.0 / cav_xi                        # eq (25)
    return pi_w, h_w, pi_u, pi_v, log_s


def site_log_normalisers(log_s, cav_mean, cav_var, cav_nu, cav_xi, mean, var, var_u, var_v):
    """``log Z̃'_j``: eq (26) for the current sites, without the ``m̃²/η̃`` term.

    Writing the site as ``Z̃'_j exp(-π_j w²/2 + h_j w - π_u u²/2 - π_v v²/2)``, the
    condition ``∫ g̃_j q^{\\j} = s_j`` gives
    ``log Z̃'_j = log s_j - ½log(V_jj/η_j) - μ_j²/(2V_jj) + m_j²/(2η_j) - ½log(V^u_jj/ν_j) - ½log(V^v_jj/ξ_j)``.
    At convergence (marginals = tilted moments) this is eq (26) minus ``m̃_j²/(2η̃_j)``,
    which cancels against the ``-½ m̃ᵀΠm̃`` term of eq (27).
    """
    return (log_s - 0.5 * np.log(var / cav_var) - 0.5 * mean ** 2 / var + 0.5 * cav_mean ** 2 / cav_var
            - 0.5 * np.log(var_u / cav_nu) - 0.5 * np.log(var_v / cav_xi))


# --------------------------------------------------------------------------------------
# EP loop
# --------------------------------------------------------------------------------------
def initial_sites(d, rho2, gamma2):
    """Cold start: w-sites with precision ``γ²/ρ²`` (the prior's ``λ = 1`` variance), flat u and v sites."""
    return {"pi_w": np.full(d, gamma2 / rho2), "h_w": np.zeros(d), "pi_u": np.zeros(d), "pi_v": np.zeros(d)}


def _state(X, y, sigma2, rho2, gamma2, P, D, sites):
    """Marginals and cavities of a site configuration; ``None`` if it is not valid."""
    wm = w_marginals(X, y, sigma2, sites["pi_w"], sites["h_w"])
    if not wm["ok"]:
        return None
    um = latent_marginals(P, D, rho2, sites["pi_u"])
    vm = latent_marginals(P, D, gamma2, sites["pi_v"])
    if not (um["ok"] and vm["ok"]):
        return None
    cav_var, cav_mean = cavities(wm["var"], sites["pi_w"], wm["mean"], sites["h_w"])
    cav_nu = cavities(um["var"], sites["pi_u"])
    cav_xi = cavities(vm["var"], sites["pi_v"])
    if not (np.all(np.isfinite(cav_var)) and np.all(np.isfinite(cav_nu)) and np.all(np.isfinite(cav_xi))):
        return None
    return {"w": wm, "u": um, "v": vm, "cav_mean": cav_mean, "cav_var": cav_var,
            "cav_nu": cav_nu, "cav_xi": cav_xi}


def run_ep(X, y, sigma2, rho2, gamma2, P, D, *, sites=None, damping=0.5, damping_decay=0.99,
           min_damping=0.3, tol=1e-8, max_sweeps=1000, max_halvings=30, negative_precision="clip",
           w_floor=-0.1):
    """Parallel EP with damping for one task (supplement §1).

    Each iteration computes all marginals (eqs 2-13), all cavities (eq 14), the tilted
    moments (eqs 15-21) and the undamped site targets (eqs 22-25), then moves every site
    a fraction ``ε`` of the way in natural parameters (``g̃ ← g̃_new^ε g̃_old^{1-ε}``), with
    ``ε = damping · damping_decay^k`` at iteration ``k`` (the supplement's 0.5 and 1%),
    never below ``min_damping``.

    Policy for negative site variances: u- and v-sites keep them; w-site precisions are kept
    ``>= w_floor/η_j`` (mean matched) when ``negative_precision='clip'`` and unbounded with
    ``'allow'``. A step is accepted only if the new state is valid (proper posterior, every
    cavity variance positive); otherwise it is halved (at most ``max_halvings`` times) and,
    if still invalid, EP stops with a warning.

    Convergence: the largest scaled distance between current and target sites,
    ``max(|Δπ_w|/p_w, |Δh_w|/√p_w, |Δπ_u|/p_u, |Δπ_v|/p_v)`` over features with
    ``p_w = 1/η + |π_w|`` etc. (cavity plus site precision: relative changes of the
    marginals), below ``tol``.

    Returns
    -------
    dict with ``sites``, ``state`` (marginals and cavities), ``n_iter``, ``converged``, ``residual``.
    """
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    n, d = X.shape
    D = np.broadcast_to(np.asarray(D, dtype=float), (d,))
    P = np.asarray(P, dtype=float).reshape(d, -1)
    sites = initial_sites(d, rho2, gamma2) if sites is None else {k: np.array(v, dtype=float) for k, v in sites.items()}
    state = _state(X, y, sigma2, rho2, gamma2, P, D, sites)
    if state is None:
        raise ValueError("initial sites give an invalid EP state")
    converged = False
    residual = np.inf
    it = 0
    for it in range(1, max_sweeps + 1):
        target = dict(zip(("pi_w", "h_w", "pi_u", "pi_v"),
                          site_targets(state["cav_mean"], state["cav_var"], state["cav_nu"], state["cav_xi"],
                                       w_floor=w_floor if negative_precision == "clip" else -np.inf)[:4]))
        p_w = 1.0 / state["cav_var"] + np.abs(sites["pi_w"])
        residual = max(
            np.max(np.abs(target["pi_w"] - sites["pi_w"]) / p_w),
            np.max(np.abs(target["h_w"] - sites["h_w"]) / np.sqrt(p_w)),
            np.max(np.abs(target["pi_u"] - sites["pi_u"]) / (1.0 / state["cav_nu"] + np.abs(sites["pi_u"]))),
            np.max(np.abs(target["pi_v"] - sites["pi_v"]) / (1.0 / state["cav_xi"] + np.abs(sites["pi_v"]))),
        )
        if residual < tol:
            converged = True
            it -= 1
            break
        eps = max(damping * damping_decay ** (it - 1), min_damping)
        for _ in range(max_halvings + 1):
            new = {k: (1 - eps) * sites[k] + eps * target[k] for k in sites}
            new_state = _state(X, y, sigma2, rho2, gamma2, P, D, new)
            if new_state is not None:
                break
            eps *= 0.5
        else:
            warnings.warn("EP stopped: no damped step kept the posterior and cavities proper",
                          RuntimeWarning, stacklevel=2)
            break
        sites, state = new, new_state
    return {"sites": sites, "state": state, "n_iter": it, "converged": converged, "residual": residual}


def log_evidence(X, y, sigma2, rho2, gamma2, P, D, sites):
    """EP approximation of the log evidence, eq (27), at the given sites.

    ``log Z̃ = Σ_j log Z̃'_j + log Z_w + [½log|V_u| - ½log|ρ²C|] + [½log|V_v| - ½log|γ²C|]``
    with ``log Z̃'_j`` from :func:`site_log_normalisers` (eq 26), ``log Z_w`` the w-terms of
    eq (27) (eqs 28, 32) and the u/v terms by eqs (29)-(31).
    """
    X = np.asarray(X, dtype=float)
    d = X.shape[1]
    D = np.broadcast_to(np.asarray(D, dtype=float), (d,))
    P = np.asarray(P, dtype=float).reshape(d, -1)
    st = _state(X, np.asarray(y, dtype=float), sigma2, rho2, gamma2, P, D, sites)
    if st is None:
        raise ValueError("sites give an invalid EP state")
    log_s = tilted_moments(st["cav_mean"], st["cav_var"], st["cav_nu"], st["cav_xi"])[0]
    log_zj = site_log_normalisers(log_s, st["cav_mean"], st["cav_var"], st["cav_nu"], st["cav_xi"],
                                  st["w"]["mean"], st["w"]["var"], st["u"]["var"], st["v"]["var"])
    return float(np.sum(log_zj) + st["w"]["log_z"] + st["u"]["log_z"] + st["v"]["log_z"])


def evidence_gradients(X, y, sigma2, rho2, gamma2, P, D, sites):
    """Gradients of eq (27) w.r.t. ``σ², ρ², γ², P`` at an EP fixed point (eqs 33-50).

    At a fixed point the site parameters' own dependence on the hyperparameters drops
    out, so each gradient is the explicit derivative of the Gaussian integrals:
    ``∂/∂σ² = E‖y - Xw‖²/(2σ⁴) - n/(2σ²)`` (eqs 33-35), ``∂/∂ρ² = -tr(V_uΠ_ν)/(2ρ²)``
    (eqs 36-38; the supplement's eq 38 has the opposite sign, a typo: ``log|V_u|`` grows
    more slowly than ``log|ρ²C|``), likewise for ``γ²`` (eq 39), and for ``P`` eqs (40)-(50)
    in the compact form ``-ρ² ΔW_uΔP + diag(δ² V^u_jj π^u_j) P`` (+ the same for v) with
    ``W_u = Π_ν - Π_ν V_u Π_ν`` (eq 46) and ``δ = diag Δ`` (eq 43).

    Returns
    -------
    dict with ``sigma2``, ``rho2``, ``gamma2`` (floats) and ``P`` (d x m).
    """
    X = np.asarray(X, dtype=float)
    d = X.shape[1]
    D = np.broadcast_to(np.asarray(D, dtype=float), (d,))
    P = np.asarray(P, dtype=float).reshape(d, -1)
    wm = w_marginals(X, np.asarray(y, dtype=float), sigma2, sites["pi_w"], sites["h_w"])
    um = latent_marginals(P, D, rho2, sites["pi_u"])
    vm = latent_marginals(P, D, gamma2, sites["pi_v"])
    return {"sigma2": float(wm["grad_sigma2"]), "rho2": float(um["grad_scale2"]),
            "gamma2": float(vm["grad_scale2"]), "P": um["grad_P"] + vm["grad_P"]}


# --------------------------------------------------------------------------------------
# Multi-task: tasks share C (P, D), ρ² and γ²; each has its own w, u, v, σ² and sites
# --------------------------------------------------------------------------------------
def run_multitask_ep(Xs, ys, sigma2s, rho2, gamma2, P, D, **options):
    """EP for every task (given the shared hyperparameters the tasks' posteriors are independent)."""
    return [run_ep(X, y, s2, rho2, gamma2, P, D, **options) for X, y, s2 in zip(Xs, ys, sigma2s)]


def multitask_log_evidence(Xs, ys, sigma2s, rho2, gamma2, P, D, sites_list):
    """Sum over tasks of eq (27)."""
    return float(sum(log_evidence(X, y, s2, rho2, gamma2, P, D, st)
                     for X, y, s2, st in zip(Xs, ys, sigma2s, sites_list)))


def multitask_evidence_gradients(Xs, ys, sigma2s, rho2, gamma2, P, D, sites_list):
    """Per-task ``σ_t²`` gradients; ``ρ², γ², P`` gradients summed over tasks."""
    grads = [evidence_gradients(X, y, s2, rho2, gamma2, P, D, st)
             for X, y, s2, st in zip(Xs, ys, sigma2s, sites_list)]
    return {"sigma2": np.array([g["sigma2"] for g in grads]),
            "rho2": float(sum(g["rho2"] for g in grads)),
            "gamma2": float(sum(g["gamma2"] for g in grads)),
            "P": sum(g["P"] for g in grads)}
