"""Reference fractional (power) EP for GP regression with Student-t sites.

Plain numpy, written for clarity: the independent check of :mod:`fastep._epcore.student_t_ep`
(Jylänki, Vanhatalo & Vehtari, "Robust Gaussian process regression with a Student-t
likelihood", JMLR 2011, §4). Never imports the compiled core; the site moments come from
:func:`fastep.reference.sites.student_t_moments` (adaptive quadrature).

The posterior of sites ``(τ, ν)`` (any sign) is ``Σ = (K⁻¹ + diag τ)⁻¹``, ``μ = Σ ν``, formed
here by explicit inverses; it is proper when Σ is positive definite. One parallel iteration:

* fractional cavities ``τ₋ = 1/Σ_ii - η τ_i``, ``ν₋ = μ_i/Σ_ii - η ν_i``;
* tilted moments of ``N(f; ν₋/τ₋, 1/τ₋) t(y_i | f)^η``: mean ``m̂``, variance ``v̂``;
* targets ``τ* = (1/v̂ - τ₋)/η``, ``ν* = (m̂/v̂ - ν₋)/η`` (so that ``cavity · site^η`` matches);
* damped step ``τ + δ(τ* - τ)``; δ halved while the new posterior is not positive definite or
  a new cavity precision is not positive.

Evidence (the fractional EP energy)::

    log Z = log ∫ N(f; 0, K) Π_i exp(-τ_i f_i²/2 + ν_i f_i) df
            + Σ_i (1/η) [log Ẑ_i + Ψ(τ₋_i, ν₋_i) - Ψ(1/Σ_ii, μ_i/Σ_ii)],

with ``Ψ(τ, ν) = ½ log 2π - ½ log τ + ν²/(2τ)`` (the log normaliser of a Gaussian in natural
parameters) and the first term ``-½ log|I + K T| + ½ νᵀΣν``.

Double loop (:mod:`fastep._student_t.double_loop`; Heskes & Zoeter 2002): its inner objective
``J(a; θ)`` and gradient written out with explicit inverses and quadrature moments
(:func:`double_loop_inner_objective`), and the fixed-point test of its result
(:func:`fixed_point_residual`): plain checks of the library's Newton iterations, which are too
many to repeat by quadrature.
"""
import numpy as np

from ._common import damped_step, initial_sites
from .sites import student_t_moments

__all__ = ["posterior", "log_marginal_likelihood", "run_fractional_ep", "double_loop_inner_objective",
           "fixed_point_residual"]


def posterior(K, tau, nu):
    """``(Σ, μ)`` of the sites, or ``None`` if ``K⁻¹ + diag τ`` is not positive definite."""
    precision = np.linalg.inv(K) + np.diag(tau)
    try:
        np.linalg.cholesky(precision)
    except np.linalg.LinAlgError:
        return None
    cov = np.linalg.inv(precision)
    cov = 0.5 * (cov + cov.T)
    return cov, cov @ nu


def _log_normaliser(tau, nu):
    return 0.5 * np.log(2 * np.pi) - 0.5 * np.log(tau) + nu * nu / (2 * tau)


def _cavities(cov, mean, tau, nu, power):
    var = np.diag(cov)
    return 1.0 / var - power * tau, mean / var - power * nu


def log_marginal_likelihood(K, y, tau, nu, dof, scale, power):
    """The fractional EP evidence of the sites ``(τ, ν)`` (module docstring)."""
    cov, mean = posterior(K, tau, nu)
    n = K.shape[0]
    sign, log_det = np.linalg.slogdet(np.eye(n) + K @ np.diag(tau))
    first = -0.5 * log_det + 0.5 * nu @ cov @ nu
    tau_c, nu_c = _cavities(cov, mean, tau, nu, power)
    log_z, _, _, _, _ = student_t_moments(y, nu_c / tau_c, 1.0 / tau_c, dof, scale, power)
    var = np.diag(cov)
    terms = log_z + _log_normaliser(tau_c, nu_c) - _log_normaliser(1.0 / var, mean / var)
    return float(first + np.sum(terms) / power)


def run_fractional_ep(K, y, dof, scale, power, *, damping=0.5, n_sweeps=10, max_halvings=10,
                      tau=None, nu=None):
    """``n_sweeps`` damped parallel fractional EP iterations from the given (or zero) sites.

    Returns ``(tau, nu)``.
    """
    tau, nu = initial_sites(K.shape[0], tau, nu)

    def acceptable(tau_new, nu_new):
        post = posterior(K, tau_new, nu_new)
        return post is not None and np.all(1.0 / np.diag(post[0]) - power * tau_new > 0)

    for _ in range(n_sweeps):
        cov, mean = posterior(K, tau, nu)
        tau_c, nu_c = _cavities(cov, mean, tau, nu, power)
        m_c, v_c = nu_c / tau_c, 1.0 / tau_c
        _, alpha, beta, _, _ = student_t_moments(y, m_c, v_c, dof, scale, power)
        mean_hat = m_c + v_c * alpha
        var_hat = v_c - v_c ** 2 * beta
        tau_target = (1.0 / var_hat - tau_c) / power
        nu_target = (mean_hat / var_hat - nu_c) / power
        new = damped_step(tau, nu, tau_target, nu_target, damping, max_halvings, acceptable)
        if new is None:
            break
        tau, nu = new
    return tau, nu


def _tilted_moments(y, a_tau, a_nu, dof, scale, power):
    """Tilted ``(log normaliser g, mean, variance)`` of ``exp(-a_τ f²/2 + a_ν f) t(y | f)^η``."""
    v_c = 1.0 / a_tau
    m_c = a_nu * v_c
    log_z, alpha, beta, _, _ = student_t_moments(y, m_c, v_c, dof, scale, power)
    return log_z + _log_normaliser(a_tau, a_nu), m_c + v_c * alpha, v_c - v_c ** 2 * beta


def _expected_stats(mean, var):
    """``E[φ(f)]`` for ``φ = (-f²/2, f)`` under Gaussians of the given moments (stacked)."""
    return np.concatenate([-0.5 * (var + mean * mean), mean])


def double_loop_inner_objective(K, y, theta_tau, theta_nu, a, dof, scale, power):
    """``(J(a; θ), ∇J)`` of the double loop's inner problem, or None outside its domain.

    ``a`` stacks the cavity precisions and natural means; ``J = -½ log|I + K T| + ½ νᵀΣν +
    (1/η) Σ_i g_i(a_i)`` for the sites ``(θ - a)/η`` (``g_i`` the tilted log normaliser), and
    ``∇J = (E_tilted[φ] - E_q[φ])/η`` with ``φ = (-f²/2, f)``.
    """
    n = theta_tau.size
    a_tau, a_nu = a[:n], a[n:]
    if np.any(a_tau <= 0):
        return None
    s_tau, s_nu = (theta_tau - a_tau) / power, (theta_nu - a_nu) / power
    post = posterior(K, s_tau, s_nu)
    if post is None:
        return None
    cov, mean = post
    sign, log_det = np.linalg.slogdet(np.eye(n) + K @ np.diag(s_tau))
    g, t_mean, t_var = _tilted_moments(y, a_tau, a_nu, dof, scale, power)
    if sign <= 0 or np.any(t_var <= 0) or not np.all(np.isfinite(g)):
        return None
    value = -0.5 * log_det + 0.5 * s_nu @ cov @ s_nu + np.sum(g) / power
    grad = (_expected_stats(t_mean, t_var) - _expected_stats(mean, np.diag(cov))) / power
    return value, grad


def fixed_point_residual(K, y, tau, nu, dof, scale, power):
    """How far the sites ``(τ, ν)`` are from a fractional EP fixed point.

    The largest ``|m̂_i - μ_i|/sqrt(Σ_ii)`` or ``|v̂_i - Σ_ii|/Σ_ii`` between the tilted moments
    at the fractional cavities and the posterior marginals (``inf`` if a cavity is improper).
    """
    cov, mean = posterior(K, tau, nu)
    var = np.diag(cov)
    tau_c, nu_c = _cavities(cov, mean, tau, nu, power)
    if np.any(tau_c <= 0):
        return np.inf
    _, t_mean, t_var = _tilted_moments(y, tau_c, nu_c, dof, scale, power)
    return float(max(np.max(np.abs(t_mean - mean) / np.sqrt(var)), np.max(np.abs(t_var - var) / var)))
