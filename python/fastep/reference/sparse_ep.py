"""Reference sparse GP EP with inducing inputs: EP-FITC, EP-DTC and power EP (plain numpy).

Written for clarity: the independent check of :mod:`fastep._epcore.sparse_ep`; it never
imports the compiled core.  Equations: the tutorial slides *Expectation Propagation for Gaussian Processes*
(slides "Sparse EP", "EP-FITC (aka generalized FITC)", "EP-DTC", "EP variants"), Minka's
quick reference for the site algebra (eqs 17-19 for the moments, 78-83 for the site
update, 87-88 for the evidence), and the power-EP view of pseudo-point approximations
(Bui, Yan & Turner 2017) for ``power < 1``.

Model
-----
Inducing inputs ``Z`` (m of them), ``u = f(Z) ~ N(0, K_mm)``; with ``L = chol(K_mm + jitter I)``
and ``V = L⁻¹ K_mn`` (m x n) the projections are ``g = Vᵀ w``, ``w ~ N(0, I_m)``, so
``Cov(g) = Q_nn = K_nm K_mm⁻¹ K_mn`` (slide "Sparse EP").  Each latent value is

    f_n = g_n + ε_n,   ε_n ~ N(0, d_n),   d_n = K_nn - Q_nn  (FITC)   or   d_n = 0  (DTC),

i.e. the prior covariance of f is ``Q_nn + diag(K_nn - Q_nn)`` (FITC) or ``Q_nn`` (DTC).

Sites live on the projections (the "pseudo-point" sites ``t_n(u)`` of the slide "EP-FITC":
predictions depend on u only): ``t_n(g_n) = exp(-τ_n g_n²/2 + ν_n g_n)`` with
``site_precision = τ`` and ``site_natural_mean = ν``.  The approximate posterior is

    q(w) = N(μ_w, Σ_w),   A = Σ_w⁻¹ = I + V diag(τ) Vᵀ,   μ_w = A⁻¹ V ν,

an m x m problem: this is the O(nm²) representation.  For ``power = 1`` the sites are
equivalent to sites ``t̃_n(f_n)`` of precision ``τ^f_n = τ_n / (1 - d_n τ_n)`` in dense EP on
the FITC prior (integrating ε_n out of a Gaussian site on f_n gives a site on g_n of variance
``1/τ^f_n + d_n``); the posterior marginals of f under that dense model are
(:func:`latent_marginals`)

    E f_n = (1 - d_n τ_n) E g_n + d_n ν_n,   Var f_n = (1 - d_n τ_n)² Var g_n + d_n (1 - d_n τ_n).

Site update with power α ∈ (0, 1] (Minka's power EP)
---------------------------------------------------
From the marginal ``N(g_n; h, s)`` of q: the cavity removes the fraction α of the site
(eqs 78-79 with α τ_n, α ν_n), ``τ_c = 1/s - α τ_n``, ``ν_c = h/s - α ν_n``,
``v_c = 1/τ_c``, ``m_c = ν_c v_c``; the tilted distribution ``q^{\\n}(u) ∫ p(f_n|u) p(y_n|f_n)^α df_n``
has normaliser ``Z_n = ∫ p(y_n | f)^α N(f; m_c, v_c + d_n) df`` and, with
``a = ∂ log Z_n/∂m_c`` and ``b = -∂² log Z_n/∂m_c²`` (the site kernel's alpha and beta at the
cavity of f, variance ``v_c + d_n``), moments ``m_c + v_c a`` and ``v_c - v_c² b`` in g_n.  The
new site (eqs 81-83 divided by α, because the moment-matched change is t_n^α):

    τ* = b / (α (1 - v_c b)),     ν* = (a + b m_c) / (α (1 - v_c b)).

For α = 1 this is EP-FITC (EP-DTC when d = 0).  Policies as the dense reference
(:mod:`fastep.reference.gp_ep`): damping in natural parameters, ``negative_precision`` "clip"
(τ* < 0 becomes τ* = 0, ν* = a/α) or "skip", failed sites (improper cavity, failing moments,
``1 - v_c b <= 0``) left unchanged.

Evidence
--------
With Ψ(τ, ν) = ½ log 2π - ½ log τ + ν²/(2τ) the log normaliser of a 1-D Gaussian in natural
parameters, the power-EP estimate of log p(y) (Minka's power-EP energy; α = 1: eqs 87-88) is

    log Z = -½ log|A| + ½ bᵀ A⁻¹ b
            + Σ_n (1/α) [log Z_n + Ψ(τ_c,n, ν_c,n) - Ψ(1/s_n, h_n/s_n)],   b = V ν.

For a Gaussian likelihood this equals, at the fixed point, the closed forms
(:func:`regression_log_evidence`): FITC ``log N(y; 0, Q + diag(K - Q) + σ²I)``, DTC
``log N(y; 0, Q + σ²I)`` and, for power α on FITC,
``log N(y; 0, Q + α diag(K - Q) + σ²I) - (1-α)/(2α) Σ_n log(1 + α d_n/σ²)``, which tends to the
variational (Titsias) bound ``log N(y; 0, Q + σ²I) - tr(K - Q)/(2σ²)`` as α → 0.

Evidence gradient (:func:`log_marginal_likelihood_gradient`, dense for clarity)
----------------------------------------------------------------------------------
At a fixed point only the explicit dependence on the prior counts.  With ``T = diag(τ)``,
``a = ν - T E[g]``, ``M = (T⁻¹ + Q)⁻¹ = T - T Vᵀ A⁻¹ V T`` and
``c_n = (1/α) ∂ log Z_n/∂(v_c + d_n) = (a_n² - b_n)/(2α)`` (FITC; 0 for DTC):

    ∂ log Z = ½ aᵀ ∂Q a - ½ tr(M ∂Q) + Σ_n c_n (∂K_nn - ∂Q_nn),
    ∂Q = ∂K_nm K_mm⁻¹ K_mn + K_nm K_mm⁻¹ ∂K_mn - K_nm K_mm⁻¹ ∂K_mm K_mm⁻¹ K_mn.

Double loop (Student-t, :func:`fastep._student_t.double_loop.run_sparse_double_loop_ep`)
--------------------------------------------------------------------------------
Its inner objective and gradient with an explicit A and quadrature moments
(:func:`robust_double_loop_inner_objective`) and the fixed-point test of its result
(:func:`robust_fixed_point_residual`).
"""
import numpy as np
from scipy import integrate
from scipy.linalg import cho_solve, cholesky, solve_triangular
from scipy.special import log_ndtr

from ._common import check_option, damped_step, initial_sites

__all__ = [
    "sparse_prior", "prior_covariance", "posterior_from_sites", "latent_marginals",
    "run_sparse_ep", "log_marginal_likelihood", "log_marginal_likelihood_gradient",
    "regression_log_evidence", "quadrature_power_moments", "gaussian_power_moments",
    "power_moments", "predict", "student_t_power_moments", "run_robust_sparse_ep",
    "robust_double_loop_inner_objective", "robust_fixed_point_residual",
]

_POLICIES = ("clip", "skip")
_SCHEDULES = ("sequential", "parallel")
_LOG_2PI = np.log(2.0 * np.pi)


# --------------------------------------------------------------------------------------------
# prior
# --------------------------------------------------------------------------------------------

def sparse_prior(Kmm, Kmn, kdiag, approximation="fitc", jitter=0.0):
    """``(V, d, L)``: ``L = chol(K_mm + jitter I)``, ``V = L⁻¹ K_mn``, ``d = K_nn - Q_nn`` (FITC) or 0 (DTC).

    ``d`` is clipped at 0 (it is nonnegative in exact arithmetic when ``jitter = 0``; with
    jitter, Q_nn is slightly smaller and d slightly larger).
    """
    if approximation not in ("fitc", "dtc"):
        raise ValueError("approximation must be 'fitc' or 'dtc'")
    Kmm = np.asarray(Kmm, dtype=float)
    L = cholesky(Kmm + jitter * np.eye(Kmm.shape[0]), lower=True)
    V = solve_triangular(L, np.asarray(Kmn, dtype=float), lower=True)
    if approximation == "dtc":
        d = np.zeros(V.shape[1])
    else:
        d = np.maximum(np.asarray(kdiag, dtype=float) - np.sum(V * V, axis=0), 0.0)
    return V, d, L


def prior_covariance(V, d):
    """The explicit n x n prior covariance ``Q + diag(d)`` (dense, for tests)."""
    return V.T @ V + np.diag(d)


# --------------------------------------------------------------------------------------------
# posterior
# --------------------------------------------------------------------------------------------

def posterior_from_sites(V, site_precision, site_natural_mean):
    """``(mu_w, Sigma_w, g_mean, g_var)`` of q(w) = N(mu_w, Sigma_w), A = I + V T Vᵀ (module docstring)."""
    V = np.asarray(V, dtype=float)
    tau = np.asarray(site_precision, dtype=float)
    nu = np.asarray(site_natural_mean, dtype=float)
    A = np.eye(V.shape[0]) + (V * tau) @ V.T
    c = cholesky(A, lower=True)
    Sigma_w = cho_solve((c, True), np.eye(V.shape[0]))
    Sigma_w = 0.5 * (Sigma_w + Sigma_w.T)
    mu_w = Sigma_w @ (V @ nu)
    g_mean = V.T @ mu_w
    g_var = np.einsum("in,ij,jn->n", V, Sigma_w, V)
    return mu_w, Sigma_w, g_mean, g_var


def latent_marginals(g_mean, g_var, d, site_precision, site_natural_mean):
    """Posterior marginals of f under dense EP on the FITC prior (power 1; module docstring)."""
    r = 1.0 - np.asarray(d) * site_precision
    return r * g_mean + d * site_natural_mean, r * r * g_var + d * r


# --------------------------------------------------------------------------------------------
# powered site moments
# --------------------------------------------------------------------------------------------

def gaussian_power_moments(noise_variance):
    """``pm(y, mean, var, power)`` for ``p(y|f) = N(y; f, σ²)`` in closed form.

    ``N(y; f, σ²)^α = (2πσ²)^((1-α)/2) α^(-1/2) N(y; f, σ²/α)``, so
    ``Z = (2πσ²)^((1-α)/2) α^(-1/2) N(y; mean, var + σ²/α)``.
    """
    s2 = float(noise_variance)

    def pm(y, mean, var, power):
        v = np.asarray(var, dtype=float) + s2 / power
        r = np.asarray(y, dtype=float) - mean
        log_z = (0.5 * (1.0 - power) * np.log(2 * np.pi * s2) - 0.5 * np.log(power)
                 - 0.5 * np.log(2 * np.pi * v) - 0.5 * r * r / v)
        return log_z, r / v, 1.0 / v
    return pm


def quadrature_power_moments(log_lik):
    """``pm(y, mean, var, power)`` by adaptive quadrature (scipy.integrate.quad) of
    ``p(y|f)^α N(f; mean, var)``, for a vectorised pointwise ``log_lik(y, f)``.

    In the standardised variable t = (f - mean)/sqrt(var): ``Z = E[e^{α ℓ}]``,
    ``alpha = E_p[t]/sd``, ``beta = (1 - Var_p[t])/var`` with p the normalised tilted density.
    Slow (three integrals per site); meant for small test problems.
    """
    def pm(y, mean, var, power):
        y, mean, var = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (y, mean, var)))
        out = np.empty((3,) + y.shape)
        for idx in np.ndindex(y.shape):
            sd = np.sqrt(var[idx])
            grid = np.linspace(-12, 12, 481)
            log_f = power * log_lik(y[idx], mean[idx] + sd * grid) - 0.5 * grid**2
            shift = np.max(log_f)

            def dens(t, k, _y=y[idx], _m=mean[idx], _sd=sd, _shift=shift):
                return t**k * np.exp(power * log_lik(_y, _m + _sd * t) - 0.5 * t * t - _shift)
            t_mode = grid[np.argmax(log_f)]
            pts = [t_mode - 1.0, t_mode, t_mode + 1.0]
            moments = [integrate.quad(dens, -40, 40, args=(k,), points=pts, limit=200,
                                      epsabs=0.0, epsrel=1e-12)[0] for k in range(3)]
            z0, z1, z2 = moments
            mean_t = z1 / z0
            var_t = z2 / z0 - mean_t**2
            out[0][idx] = np.log(z0) + shift - 0.5 * _LOG_2PI
            out[1][idx] = mean_t / sd
            out[2][idx] = (1.0 - var_t) / var[idx]
        return out[0], out[1], out[2]
    return pm


def power_moments(moments, power_moments_fn=None):
    """A ``pm(y, mean, var, power)`` callable: ``moments`` at power 1, else ``power_moments_fn``."""
    def pm(y, mean, var, power):
        if power == 1.0:
            return moments(y, mean, var)
        if power_moments_fn is None:
            raise ValueError("power != 1 needs power_moments")
        return power_moments_fn(y, mean, var, power)
    return pm


def probit_log_lik(y, f, slope=1.0, bias=0.0):
    """Pointwise log p(y|f) of the probit likelihood (for :func:`quadrature_power_moments`)."""
    return log_ndtr(slope * y * (np.asarray(f) + bias))


# --------------------------------------------------------------------------------------------
# EP
# --------------------------------------------------------------------------------------------

def _new_site(y_i, pm, g_mean_i, g_var_i, d_i, tau_i, nu_i, power, damping, negative_precision):
    """(status, tau_new, nu_new) of one power-EP site update (module docstring)."""
    tau_cav = 1.0 / g_var_i - power * tau_i
    nu_cav = g_mean_i / g_var_i - power * nu_i
    if not (tau_cav > 0 and np.isfinite(tau_cav) and np.isfinite(nu_cav)):
        return "failed", tau_i, nu_i
    v_c = 1.0 / tau_cav
    m_c = nu_cav * v_c
    log_z, a, b = (float(np.asarray(v).reshape(-1)[0])
                   for v in pm(np.array([y_i]), np.array([m_c]), np.array([v_c + d_i]), power))
    if not (np.isfinite(log_z) and np.isfinite(a) and np.isfinite(b)):
        return "failed", tau_i, nu_i
    one_minus = 1.0 - v_c * b
    if not one_minus > 0:
        return "failed", tau_i, nu_i
    tau_t = b / (power * one_minus)
    nu_t = (a + b * m_c) / (power * one_minus)
    status = "applied"
    if tau_t < 0:
        if negative_precision == "skip":
            return "skipped", tau_i, nu_i
        tau_t, nu_t, status = 0.0, a / power, "clipped"
    tau_new = tau_i + damping * (tau_t - tau_i)
    nu_new = nu_i + damping * (nu_t - nu_i)
    if tau_new < 0:
        if negative_precision == "skip":
            return "skipped", tau_i, nu_i
        tau_new, status = 0.0, "clipped"
    return status, tau_new, nu_new


def run_sparse_ep(V, d, y, pm, site_precision=None, site_natural_mean=None, *, power=1.0,
                  schedule="sequential", damping=1.0, tol=1e-8, max_sweeps=100,
                  negative_precision="clip"):
    """Sparse (power) EP until convergence.

    Parameters
    ----------
    V : ndarray (m, n)
        ``L⁻¹ K_mn`` (:func:`sparse_prior`).
    d : ndarray (n,)
        ``K_nn - Q_nn`` (FITC) or zeros (DTC).
    y : ndarray (n,)
    pm : callable
        ``pm(y, mean, var, power) -> (log_z, alpha, beta)`` of ``∫ p(y|f)^power N(f; mean, var) df``
        (:func:`power_moments`).
    site_precision, site_natural_mean : ndarray (n,), optional
        Warm start (default zeros); not modified.
    power : float in (0, 1]
    schedule : {"sequential", "parallel"}
    damping, tol, max_sweeps, negative_precision
        As :func:`fastep.reference.gp_ep.run_gp_ep`.

    Returns
    -------
    dict with ``site_precision``, ``site_natural_mean``, ``w_mean``, ``w_cov``, ``g_mean``,
    ``g_var``, ``n_sweeps``, ``converged``, ``max_change``, ``log_z``, ``n_clipped``,
    ``n_skipped``, ``n_failed``.
    """
    V = np.asarray(V, dtype=float)
    d = np.asarray(d, dtype=float)
    y = np.asarray(y, dtype=float)
    n = V.shape[1]
    check_option(schedule, "schedule", _SCHEDULES)
    check_option(negative_precision, "negative_precision", _POLICIES)
    if not 0.0 < power <= 1.0:
        raise ValueError("power must be in (0, 1]")
    tau, nu = initial_sites(n, site_precision, site_natural_mean)
    mu_w, Sigma_w, g_mean, g_var = posterior_from_sites(V, tau, nu)
    log_z = log_marginal_likelihood(V, d, y, pm, tau, nu, power=power)
    converged = False
    counts = {"clipped": 0, "skipped": 0, "failed": 0}
    max_change = np.inf
    sweep = 0
    for sweep in range(1, max_sweeps + 1):
        tau_before, nu_before = tau.copy(), nu.copy()
        counts = {"clipped": 0, "skipped": 0, "failed": 0}
        if schedule == "parallel":
            for i in range(n):
                status, tau[i], nu[i] = _new_site(y[i], pm, g_mean[i], g_var[i], d[i], tau[i], nu[i],
                                                  power, damping, negative_precision)
                if status != "applied":
                    counts[status] += 1
        else:
            for i in range(n):
                v = V[:, i]
                u = Sigma_w @ v
                s = v @ u
                h = v @ mu_w
                status, tau_new, nu_new = _new_site(y[i], pm, h, s, d[i], tau[i], nu[i], power,
                                                    damping, negative_precision)
                if status in ("applied", "clipped"):
                    d_tau, d_nu = tau_new - tau[i], nu_new - nu[i]
                    c = 1.0 + d_tau * s
                    if not c > 0:
                        status = "skipped"
                    else:
                        # A += d_tau v vᵀ, V ν += d_nu v (Sherman-Morrison on Σ_w)
                        Sigma_w = Sigma_w - (d_tau / c) * np.outer(u, u)
                        mu_w = mu_w + ((d_nu - d_tau * h) / c) * u
                        tau[i], nu[i] = tau_new, nu_new
                if status != "applied":
                    counts[status] += 1
        mu_w, Sigma_w, g_mean, g_var = posterior_from_sites(V, tau, nu)   # rebuild
        new_log_z = log_marginal_likelihood(V, d, y, pm, tau, nu, power=power)
        change_tau = np.max(np.abs(tau - tau_before) / np.maximum(1.0, np.abs(tau)))
        change_nu = np.max(np.abs(nu - nu_before) / np.maximum(1.0, np.abs(nu)))
        max_change = max(change_tau, change_nu)
        log_z_change = abs(new_log_z - log_z)
        log_z = new_log_z
        if max_change < tol and counts["failed"] == 0 and log_z_change < tol * max(1.0, abs(log_z)):
            converged = True
            break
    return {
        "site_precision": tau, "site_natural_mean": nu, "w_mean": mu_w, "w_cov": Sigma_w,
        "g_mean": g_mean, "g_var": g_var, "n_sweeps": sweep, "converged": converged,
        "max_change": max_change, "log_z": log_z, "n_clipped": counts["clipped"],
        "n_skipped": counts["skipped"] + counts["failed"], "n_failed": counts["failed"],
    }


def parallel_chunk_step(V, d, y, pm, site_precision, site_natural_mean, w_mean, w_cov, *, power=1.0,
                        damping=1.0, negative_precision="clip", update=True):
    """One block of sites' share of a parallel sparse EP iteration (the map of a map-reduce).

    Given the posterior ``q(w) = N(w_mean, w_cov)`` of *all* sites, the block's marginals
    ``E[g_i] = v_iᵀ μ_w`` and ``Var[g_i] = v_iᵀ Σ_w v_i``, its evidence terms
    ``Σ_i (1/α)[log Z_i + Ψ(cavity) - Ψ(marginal)]``, and with ``update`` the damped parallel
    update of its sites and their sums ``Σ τ_i v_i v_iᵀ`` and ``Σ ν_i v_i``.  Summing the
    blocks' sums and adding the identity gives the next ``A``.

    Parameters
    ----------
    V : ndarray (m, n_block)
        Projections of the block's sites.
    d, y, site_precision, site_natural_mean : ndarray (n_block,)
    pm : callable
        Powered moments (:func:`power_moments`).
    w_mean, w_cov : ndarray (m,), (m, m)
        Posterior of w from all sites.

    Returns
    -------
    dict with ``g_mean``, ``g_var``, ``log_z_sites``; with ``update`` also
    ``site_precision``, ``site_natural_mean``, ``n_clipped``, ``n_skipped``, ``n_failed``,
    ``precision_sum`` (m x m, symmetric), ``natural_mean_sum``.
    """
    V = np.asarray(V, dtype=float)
    tau = np.array(site_precision, dtype=float)
    nu = np.array(site_natural_mean, dtype=float)
    g_mean = V.T @ w_mean
    g_var = np.einsum("in,ij,jn->n", V, w_cov, V)
    tau_q, nu_q = 1.0 / g_var, g_mean / g_var
    tau_c, nu_c = tau_q - power * tau, nu_q - power * nu
    v_c = 1.0 / tau_c
    log_z, _, _ = pm(np.asarray(y, dtype=float), nu_c * v_c, v_c + d, power)
    sites = (np.asarray(log_z) + _psi(tau_c, nu_c) - _psi(tau_q, nu_q)) / power
    out = {"g_mean": g_mean, "g_var": g_var, "log_z_sites": float(np.sum(sites))}
    if not update:
        return out
    counts = {"clipped": 0, "skipped": 0, "failed": 0}
    for i in range(tau.shape[0]):
        status, tau[i], nu[i] = _new_site(y[i], pm, g_mean[i], g_var[i], d[i], tau[i], nu[i], power,
                                          damping, negative_precision)
        if status != "applied":
            counts[status] += 1
    out.update(site_precision=tau, site_natural_mean=nu, n_clipped=counts["clipped"],
               n_skipped=counts["skipped"] + counts["failed"], n_failed=counts["failed"],
               precision_sum=(V * tau) @ V.T, natural_mean_sum=V @ nu)
    return out


def _psi(tau, nu):
    return 0.5 * _LOG_2PI - 0.5 * np.log(tau) + 0.5 * nu * nu / tau


def _cavity_terms(V, d, y, pm, tau, nu, power):
    mu_w, Sigma_w, g_mean, g_var = posterior_from_sites(V, tau, nu)
    tau_q, nu_q = 1.0 / g_var, g_mean / g_var
    tau_c, nu_c = tau_q - power * tau, nu_q - power * nu
    v_c = 1.0 / tau_c
    log_z, a, b = pm(y, nu_c * v_c, v_c + d, power)
    return mu_w, g_mean, g_var, tau_q, nu_q, tau_c, nu_c, np.asarray(log_z), np.asarray(a), np.asarray(b)


def log_marginal_likelihood(V, d, y, pm, site_precision, site_natural_mean, *, power=1.0):
    """Power-EP log marginal likelihood of the given sites (module docstring)."""
    V = np.asarray(V, dtype=float)
    tau = np.asarray(site_precision, dtype=float)
    nu = np.asarray(site_natural_mean, dtype=float)
    mu_w, _, _, tau_q, nu_q, tau_c, nu_c, log_z, _, _ = _cavity_terms(V, np.asarray(d, dtype=float),
                                                                        np.asarray(y, dtype=float),
                                                                        pm, tau, nu, power)
    if np.any(~(tau_c > 0)):
        raise ValueError("a cavity is improper")
    A = np.eye(V.shape[0]) + (V * tau) @ V.T
    _, logdet_a = np.linalg.slogdet(A)
    b = V @ nu
    sites = (log_z + _psi(tau_c, nu_c) - _psi(tau_q, nu_q)) / power
    return float(-0.5 * logdet_a + 0.5 * b @ mu_w + np.sum(sites))


def student_t_power_moments(dof, scale):
    """``pm(y, mean, var, power) -> (log Z, a, b)`` of the powered Student-t site, from the
    adaptive-quadrature reference :func:`fastep.reference.sites.student_t_moments`."""
    from .sites import student_t_moments

    def pm(y, mean, var, power):
        log_z, a, b, _, _ = student_t_moments(y, mean, var, dof, scale, power)
        return log_z, a, b
    return pm


def run_robust_sparse_ep(V, d, y, pm, *, power=0.5, damping=0.5, n_sweeps=10, max_halvings=10,
                         site_precision=None, site_natural_mean=None):
    """``n_sweeps`` iterations of sparse fractional EP with sites of either sign (Student-t).

    Every iteration takes all targets from one posterior, ``τ* = b/(α(1 - v_c b))``,
    ``ν* = (a + b m_c)/(α(1 - v_c b))`` (no clipping; a site with an improper cavity keeps its
    value), then the damped step ``τ + δ(τ* - τ)``, with δ halved while ``A = I + V T Vᵀ`` is not
    positive definite or a new cavity ``1/Var[g_i] - α τ_i`` is not positive. Returns
    ``(site_precision, site_natural_mean)``.
    """
    V = np.asarray(V, dtype=float)
    d = np.asarray(d, dtype=float)
    y = np.asarray(y, dtype=float)
    n = V.shape[1]
    tau, nu = initial_sites(n, site_precision, site_natural_mean)

    def acceptable(tau_new, nu_new):
        try:
            _, _, _, var_new = posterior_from_sites(V, tau_new, nu_new)
        except np.linalg.LinAlgError:
            return False
        return np.all(1.0 / var_new - power * tau_new > 0)

    for _ in range(n_sweeps):
        _, _, g_mean, g_var = posterior_from_sites(V, tau, nu)
        tau_c = 1.0 / g_var - power * tau
        nu_c = g_mean / g_var - power * nu
        target_tau, target_nu = tau.copy(), nu.copy()
        proper = tau_c > 0
        v_c = 1.0 / tau_c[proper]
        m_c = nu_c[proper] * v_c
        _, a, b = pm(y[proper], m_c, v_c + d[proper], power)
        one_minus = 1.0 - v_c * np.asarray(b)
        ok = one_minus > 0
        idx = np.flatnonzero(proper)[ok]
        target_tau[idx] = np.asarray(b)[ok] / (power * one_minus[ok])
        target_nu[idx] = (np.asarray(a)[ok] + np.asarray(b)[ok] * m_c[ok]) / (power * one_minus[ok])
        new = damped_step(tau, nu, target_tau, target_nu, damping, max_halvings, acceptable)
        if new is None:
            break
        tau, nu = new
    return tau, nu


def _tilted_moments(V, d, y, pm, a_tau, a_nu, power):
    """Tilted ``(log normaliser, mean, variance)`` of g_i for cavities ``a`` (natural parameters):
    ``exp(-a_τ g²/2 + a_ν g) ∫ p(y_i | g + ε)^α N(ε; 0, d_i) dε``."""
    v_c = 1.0 / a_tau
    m_c = a_nu * v_c
    log_z, a, b = (np.asarray(t) for t in pm(y, m_c, v_c + d, power))
    return log_z + _psi(a_tau, a_nu), m_c + v_c * a, v_c - v_c ** 2 * b


def robust_double_loop_inner_objective(V, d, y, pm, theta_tau, theta_nu, a, power):
    """``(J(a; θ), ∇J)`` of the sparse double loop's inner problem, or None outside its domain.

    The sparse form of :func:`fastep.reference.student_t_ep.double_loop_inner_objective`: for the
    sites ``s = (θ - a)/α``, ``J = -½ log|A| + ½ bᵀA⁻¹b + (1/α) Σ_i g_i(a_i)`` with
    ``A = I + V diag(s_τ) Vᵀ``, ``b = V s_ν`` and ``g_i`` the log normaliser of the tilted
    density of ``g_i`` (:func:`_tilted_moments`); ``∇J = (E_tilted[φ] - E_q[φ])/α``,
    ``φ(g) = (-g²/2, g)``. Dense (explicit A, one site at a time in ``pm``), for tests.
    """
    V = np.asarray(V, dtype=float)
    n = V.shape[1]
    a = np.asarray(a, dtype=float)
    a_tau, a_nu = a[:n], a[n:]
    if np.any(a_tau <= 0):
        return None
    s_tau, s_nu = (theta_tau - a_tau) / power, (theta_nu - a_nu) / power
    try:
        mu_w, _, g_mean, g_var = posterior_from_sites(V, s_tau, s_nu)
    except np.linalg.LinAlgError:
        return None
    _, logdet_a = np.linalg.slogdet(np.eye(V.shape[0]) + (V * s_tau) @ V.T)
    g, t_mean, t_var = _tilted_moments(V, np.asarray(d, dtype=float), np.asarray(y, dtype=float), pm, a_tau,
                                       a_nu, power)
    if np.any(t_var <= 0) or not np.all(np.isfinite(g)):
        return None
    value = -0.5 * logdet_a + 0.5 * (V @ s_nu) @ mu_w + np.sum(g) / power
    grad = np.concatenate([-0.5 * (t_var + t_mean ** 2) + 0.5 * (g_var + g_mean ** 2), t_mean - g_mean]) / power
    return float(value), grad


def robust_fixed_point_residual(V, d, y, pm, site_precision, site_natural_mean, *, power=0.5):
    """How far sites are from a sparse fractional EP fixed point: the largest
    ``|m̂_i - E[g_i]|/sqrt(Var[g_i])`` or ``|v̂_i - Var[g_i]|/Var[g_i]`` between the tilted
    moments of g at the fractional cavities and the posterior marginals (``inf`` if a cavity
    is improper)."""
    V = np.asarray(V, dtype=float)
    tau = np.asarray(site_precision, dtype=float)
    nu = np.asarray(site_natural_mean, dtype=float)
    _, _, g_mean, g_var = posterior_from_sites(V, tau, nu)
    tau_c, nu_c = 1.0 / g_var - power * tau, g_mean / g_var - power * nu
    if np.any(tau_c <= 0):
        return np.inf
    _, t_mean, t_var = _tilted_moments(V, np.asarray(d, dtype=float), np.asarray(y, dtype=float), pm, tau_c,
                                       nu_c, power)
    return float(max(np.max(np.abs(t_mean - g_mean) / np.sqrt(g_var)), np.max(np.abs(t_var - g_var) / g_var)))


def log_marginal_likelihood_gradient(Kmm, Kmn, kdiag, dKmm, dKmn, dkdiag, y, pm, site_precision,
                                     site_natural_mean, *, approximation="fitc", power=1.0,
                                     jitter=0.0):
    """Gradient of :func:`log_marginal_likelihood` at an EP fixed point, dense for clarity.

    ``dKmm`` (p, m, m), ``dKmn`` (p, m, n), ``dkdiag`` (p, n): derivatives of K_mm, K_mn and
    diag K_nn with respect to p parameters (kernel hyperparameters, or inducing-input
    coordinates, for which ``dkdiag`` is 0).  The sites must be an EP fixed point of the
    prior given by ``Kmm``, ``Kmn``, ``kdiag`` (module docstring for the formula).
    """
    V, d, _ = sparse_prior(Kmm, Kmn, kdiag, approximation, jitter)
    Kj = np.asarray(Kmm, dtype=float) + jitter * np.eye(len(Kmm))
    Kmn = np.asarray(Kmn, dtype=float)
    U = np.linalg.solve(Kj, Kmn)                                    # K_mm⁻¹ K_mn
    tau = np.asarray(site_precision, dtype=float)
    nu = np.asarray(site_natural_mean, dtype=float)
    _, g_mean, _, _, _, _, _, _, a_z, b_z = _cavity_terms(V, d, np.asarray(y, dtype=float), pm,
                                                          tau, nu, power)
    a = nu - tau * g_mean                                           # (I + T Q)⁻¹ ν
    A = np.eye(V.shape[0]) + (V * tau) @ V.T
    TV = V * tau                                                    # V T  (m, n)
    M = np.diag(tau) - TV.T @ np.linalg.solve(A, TV)                # (T⁻¹ + Q)⁻¹
    c = (a_z**2 - b_z) / (2.0 * power) if approximation == "fitc" else np.zeros_like(tau)
    out = []
    for dmm, dmn, dnn in zip(np.asarray(dKmm, dtype=float), np.asarray(dKmn, dtype=float),
                             np.asarray(dkdiag, dtype=float)):
        dQ = dmn.T @ U + U.T @ dmn - U.T @ dmm @ U
        out.append(0.5 * a @ dQ @ a - 0.5 * np.sum(M * dQ) + np.sum(c * (dnn - np.diag(dQ))))
    return np.array(out)


def regression_log_evidence(Kmm, Kmn, kdiag, y, noise_variance, *, approximation="fitc",
                            power=1.0, jitter=0.0):
    """Closed-form sparse GP regression log evidence (dense n x n, for tests).

    ``approximation="fitc"``: ``log N(y; 0, Q + α D + σ²I) - (1-α)/(2α) Σ log(1 + α d_n/σ²)``
    (α = 1: FITC); ``"dtc"``: ``log N(y; 0, Q + σ²I)``; ``"vfe"``: the variational bound
    ``log N(y; 0, Q + σ²I) - tr(D)/(2σ²)``, with ``D = diag(K - Q)``.
    """
    V, d, _ = sparse_prior(Kmm, Kmn, kdiag, "dtc" if approximation == "dtc" else "fitc", jitter)
    if approximation == "dtc":
        d = np.zeros_like(d)
    y = np.asarray(y, dtype=float)
    s2 = float(noise_variance)
    Q = V.T @ V
    extra = 0.0
    if approximation == "fitc":
        C = Q + np.diag(power * d + s2)
        extra = -(1.0 - power) / (2.0 * power) * np.sum(np.log1p(power * d / s2))
    elif approximation == "vfe":
        C = Q + s2 * np.eye(len(y))
        extra = -np.sum(d) / (2.0 * s2)
    else:
        C = Q + s2 * np.eye(len(y))
    _, logdet = np.linalg.slogdet(C)
    return float(-0.5 * y @ np.linalg.solve(C, y) - 0.5 * logdet - 0.5 * len(y) * _LOG_2PI + extra)


def predict(Kmm, Ksm, kss_diag, w_mean, w_cov, jitter=0.0):
    """Latent predictive mean and variance at test points through q(u) (slide "EP-FITC").

    ``f* | u ~ N(K_*m K_mm⁻¹ u, k** - Q**)`` and ``u = L w``:
    mean ``(L⁻¹ k*)ᵀ μ_w``, variance ``k** - |L⁻¹ k*|² + (L⁻¹ k*)ᵀ Σ_w (L⁻¹ k*)``.
    """
    L = cholesky(np.asarray(Kmm, dtype=float) + jitter * np.eye(len(Kmm)), lower=True)
    P = solve_triangular(L, np.asarray(Ksm, dtype=float).T, lower=True)   # (m, n*)
    mean = P.T @ w_mean
    var = kss_diag - np.sum(P * P, axis=0) + np.einsum("in,ij,jn->n", P, w_cov, P)
    return mean, var
