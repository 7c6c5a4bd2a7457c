"""Reference fractional (power) EP for GP regression with Student-t sites.

Plain numpy, written for clarity: the independent check of :mod:`fastep._epcore.robust_ep`
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
"""
import numpy as np

from .sites import student_t_moments

__all__ = ["posterior", "log_marginal_likelihood", "run_fractional_ep"]


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
    n = K.shape[0]
    tau = np.zeros(n) if tau is None else np.array(tau, dtype=float)
    nu = np.zeros(n) if nu is None else np.array(nu, dtype=float)
    for _ in range(n_sweeps):
        cov, mean = posterior(K, tau, nu)
        tau_c, nu_c = _cavities(cov, mean, tau, nu, power)
        m_c, v_c = nu_c / tau_c, 1.0 / tau_c
        _, alpha, beta, _, _ = student_t_moments(y, m_c, v_c, dof, scale, power)
        mean_hat = m_c + v_c * alpha
        var_hat = v_c - v_c ** 2 * beta
        tau_target = (1.0 / var_hat - tau_c) / power
        nu_target = (mean_hat / var_hat - nu_c) / power
        step = damping
        for _ in range(max_halvings + 1):
            tau_new = tau + step * (tau_target - tau)
            nu_new = nu + step * (nu_target - nu)
            post = posterior(K, tau_new, nu_new)
            if post is not None and np.all(1.0 / np.diag(post[0]) - power * tau_new > 0):
                break
            step *= 0.5
        else:
            break
        tau, nu = tau_new, nu_new
    return tau, nu
