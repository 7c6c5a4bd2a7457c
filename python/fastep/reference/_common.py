"""What the reference EP loops share: option checks, warm-start sites and the damped step that
halves until the new sites are acceptable."""
import numpy as np


def check_option(value, name, choices):
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}")


def initial_sites(n, site_precision=None, site_natural_mean=None):
    """``(tau, nu)``: copies of the warm-start site parameters, zeros where not given."""
    tau = np.zeros(n) if site_precision is None else np.array(site_precision, dtype=float)
    nu = np.zeros(n) if site_natural_mean is None else np.array(site_natural_mean, dtype=float)
    return tau, nu


def damped_step(tau, nu, target_tau, target_nu, damping, max_halvings, acceptable):
    """The step ``τ + δ (τ* - τ)``, ``ν + δ (ν* - ν)`` from ``δ = damping``, ``δ`` halved (at most
    ``max_halvings`` times) until ``acceptable(τ_new, ν_new)``; None if no step is acceptable."""
    step = damping
    for _ in range(max_halvings + 1):
        tau_new = tau + step * (target_tau - tau)
        nu_new = nu + step * (target_nu - nu)
        if acceptable(tau_new, nu_new):
            return tau_new, nu_new
        step *= 0.5
    return None
