"""Reference weight-space Gaussian EP with rank-1 sites (Minka, "EP: a quick reference", §1.1).

Plain numpy, written for clarity rather than speed: every site update forms the
cavity ``N(m_cav, V_cav)`` explicitly (eqs 23-29) and the posterior update is
done either by the ADF formulas (eqs 35, 37; ``update_form="moment"``) or by
adding the new site to the cavity precision matrix (``update_form="natural"``).
It is the independent check of :mod:`fastep._epcore.linear_ep` and must never
import the compiled core.

The site moments come from a plain Python callable
``moments(y, cavity_mean, cavity_var) -> (log_z, alpha, beta)`` with
``alpha = d log Z / d mean`` and ``beta = -d^2 log Z / d mean^2`` (eqs 17-19).

Sites are stored in natural parameters: ``site_precision = tau_i = 1/v_i``,
``site_natural_mean = nu_i = m_i / v_i``.  Options and policies are the same as
the compiled engine's (see its module docstring):

* damping ``omega`` acts on natural parameters;
* ``negative_precision``: ``"clip"`` (tau := 0, nu := alpha), ``"skip"``,
  ``"allow"`` (skip only if V would become indefinite);
* a site with an improper cavity or failing/non-finite moments is left unchanged;
* convergence: ``max |dtau|/max(1,|tau|)`` and ``max |dnu|/max(1,|nu|)`` of a
  sweep below ``tol`` with no failed site in that sweep;
* ``refresh_every``: recompute V, m from the sites (eqs 46-47) every that many
  sweeps and after the last sweep; ``<= 0`` or ``> max_sweeps`` disables it.
"""
import numpy as np

from ._common import check_option, initial_sites

__all__ = ["run_linear_ep", "posterior_from_sites", "log_evidence", "log_evidence_literal"]

_UPDATE_FORMS = ("moment", "natural")
_POLICIES = ("clip", "skip", "allow")


def posterior_from_sites(X, prior_mean, prior_cov, site_precision, site_natural_mean):
    """Posterior mean and covariance from the EP invariant, eqs 46-47 (explicit inverses)."""
    X = np.asarray(X, dtype=float)
    prior_precision = np.linalg.inv(prior_cov)
    precision = prior_precision + X.T @ (np.asarray(site_precision)[:, None] * X)   # eq 46
    if np.any(np.linalg.eigvalsh(precision) <= 0):
        raise np.linalg.LinAlgError("posterior precision is not positive definite")
    post_cov = np.linalg.inv(precision)
    post_cov = 0.5 * (post_cov + post_cov.T)
    post_mean = post_cov @ (prior_precision @ prior_mean + X.T @ site_natural_mean)  # eq 47
    return post_mean, post_cov


def _cavity(x, post_mean, post_cov, tau, nu):
    """Explicit cavity N(m_cav, V_cav) of a rank-1 site, eqs 23-28 (None if improper)."""
    Vx = post_cov @ x
    s = x @ Vx
    denom = 1.0 - tau * s
    if not denom > 0.0:
        return None
    # eq 24 with v_i^-1 = tau: (v_i - x^T V x)^-1 = tau / (1 - tau x^T V x)
    cavity_cov = post_cov + np.outer(Vx, Vx) * (tau / denom)
    # eq 27: m_cav = m + V_cav x v_i^-1 (x^T m - m_i) = m + V_cav x (tau x^T m - nu)
    cavity_mean = post_mean + (cavity_cov @ x) * (tau * (x @ post_mean) - nu)
    return cavity_mean, cavity_cov


def _site_update(x, y_i, moments, post_mean, post_cov, tau_old, nu_old, update_form, damping,
                 negative_precision):
    """One site: returns (status, tau, nu, post_mean, post_cov); status in
    {"applied", "clipped", "skipped", "failed"}."""
    unchanged = (tau_old, nu_old, post_mean, post_cov)
    cav = _cavity(x, post_mean, post_cov, tau_old, nu_old)
    if cav is None:
        return ("failed",) + unchanged
    cavity_mean, cavity_cov = cav
    cavity_var = x @ cavity_cov @ x          # lambda_i, eq 25
    cavity_proj_mean = x @ cavity_mean       # h_i, eq 29
    try:
        log_z, alpha, beta = (float(v) for v in moments(y_i, cavity_proj_mean, cavity_var))
    except (ValueError, FloatingPointError, ZeroDivisionError):
        return ("failed",) + unchanged
    if not (np.isfinite(log_z) and np.isfinite(alpha) and np.isfinite(beta)):
        return ("failed",) + unchanged
    if not 1.0 - cavity_var * beta > 0.0:
        return ("failed",) + unchanged
    # eqs 39-41: r = beta / (lambda^-1 - beta), 1/v = r / lambda, m/v = r (alpha + h/lambda) + alpha
    r = cavity_var * beta / (1.0 - cavity_var * beta)
    tau_target = beta / (1.0 - cavity_var * beta)
    nu_target = r * alpha + tau_target * cavity_proj_mean + alpha
    status = "applied"
    beta_eff = beta
    if tau_target < 0.0:
        if negative_precision == "skip":
            return ("skipped",) + unchanged
        if negative_precision == "clip":
            tau_target, nu_target, beta_eff, status = 0.0, alpha, 0.0, "clipped"
    tau_new = tau_old + damping * (tau_target - tau_old)
    nu_new = nu_old + damping * (nu_target - nu_old)
    if damping == 1.0:
        tau_new, nu_new = tau_target, nu_target
    if tau_new < 0.0:
        if negative_precision == "clip":
            tau_new, status = 0.0, "clipped"
        elif negative_precision == "skip":
            return ("skipped",) + unchanged
    s = x @ post_cov @ x
    if not 1.0 + s * (tau_new - tau_old) > 0.0:   # V would lose positive definiteness (eq 44)
        return ("skipped",) + unchanged

    cavity_cov_x = cavity_cov @ x
    if update_form == "moment" and damping == 1.0:
        # ADF, eqs 35 and 37, with the (possibly clipped) beta
        new_mean = cavity_mean + cavity_cov_x * alpha
        new_cov = cavity_cov - np.outer(cavity_cov_x, cavity_cov_x) * beta_eff
        if status != "clipped" and beta != 0.0:
            # site from eqs 30-31
            v_site = 1.0 / beta - cavity_var
            m_site = cavity_proj_mean + alpha / beta
            tau_new, nu_new = 1.0 / v_site, m_site / v_site
    else:
        # include the (damped) site in the cavity precision: V_new^-1 = V_cav^-1 + tau x x^T
        cavity_precision = np.linalg.inv(cavity_cov)
        new_precision = cavity_precision + tau_new * np.outer(x, x)
        new_cov = np.linalg.inv(new_precision)
        new_mean = new_cov @ (cavity_precision @ cavity_mean + nu_new * x)
    new_cov = 0.5 * (new_cov + new_cov.T)
    return status, tau_new, nu_new, new_mean, new_cov


def run_linear_ep(X, y, prior_mean, prior_cov, moments, site_precision=None,
                  site_natural_mean=None, update_form="natural", damping=1.0, tol=1e-8,
                  max_sweeps=200, refresh_every=1, negative_precision="clip"):
    """Sequential rank-1 EP sweeps (reference).

    Returns a dict with ``post_mean``, ``post_cov``, ``site_precision``,
    ``site_natural_mean`` (new arrays) and ``n_sweeps``, ``converged``,
    ``max_change``, ``n_skipped``, ``n_clipped``, ``n_failed`` as the compiled
    engine reports them.
    """
    check_option(update_form, "update_form", _UPDATE_FORMS)
    check_option(negative_precision, "negative_precision", _POLICIES)
    if not 0.0 < damping <= 1.0:
        raise ValueError("damping must be in (0, 1]")
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    n, d = X.shape
    tau, nu = initial_sites(n, site_precision, site_natural_mean)
    prior_mean = np.asarray(prior_mean, dtype=float)
    prior_cov = np.asarray(prior_cov, dtype=float)
    np.linalg.cholesky(prior_cov)     # raises LinAlgError when not PD
    post_mean, post_cov = posterior_from_sites(X, prior_mean, prior_cov, tau, nu)
    refreshing = 0 < refresh_every <= max_sweeps
    counts = dict(n_skipped=0, n_clipped=0, n_failed=0)
    converged = False
    max_change = np.inf
    n_sweeps = 0
    for sweep in range(1, max_sweeps + 1):
        change_tau = change_nu = 0.0
        failed_this_sweep = 0
        for i in range(n):
            status, tau_i, nu_i, post_mean, post_cov = _site_update(
                X[i], y[i], moments, post_mean, post_cov, tau[i], nu[i], update_form, damping,
                negative_precision)
            if status in ("skipped", "failed"):
                counts["n_skipped"] += 1
                if status == "failed":
                    counts["n_failed"] += 1
                    failed_this_sweep += 1
                continue
            if status == "clipped":
                counts["n_clipped"] += 1
            change_tau = max(change_tau, abs(tau_i - tau[i]) / max(1.0, abs(tau_i)))
            change_nu = max(change_nu, abs(nu_i - nu[i]) / max(1.0, abs(nu_i)))
            tau[i], nu[i] = tau_i, nu_i
        n_sweeps = sweep
        max_change = max(change_tau, change_nu)
        converged = max_change < tol and failed_this_sweep == 0
        if refreshing and (sweep % refresh_every == 0 or converged or sweep == max_sweeps):
            post_mean, post_cov = posterior_from_sites(X, prior_mean, prior_cov, tau, nu)
        if converged:
            break
    return dict(post_mean=post_mean, post_cov=post_cov, site_precision=tau,
                site_natural_mean=nu, n_sweeps=n_sweeps, converged=converged,
                max_change=max_change, **counts)


def _cavities(X, post_mean, post_cov, tau, nu):
    """Projected cavities (h_i, lambda_i) of all sites, eqs 25 and 29."""
    s = np.einsum("ij,jk,ik->i", X, post_cov, X)
    h = X @ post_mean
    denom = 1.0 - tau * s
    if np.any(denom <= 0):
        raise ValueError("a site has an improper cavity")
    lam = s / denom
    h_cav = h + lam * (tau * h - nu)
    return h_cav, lam


def _global_terms(X, prior_mean, prior_cov, tau, nu):
    post_mean, post_cov = posterior_from_sites(X, prior_mean, prior_cov, tau, nu)
    _, log_det_post = np.linalg.slogdet(post_cov)
    _, log_det_prior = np.linalg.slogdet(prior_cov)
    quad_post = post_mean @ np.linalg.solve(post_cov, post_mean)
    quad_prior = prior_mean @ np.linalg.solve(prior_cov, prior_mean)
    return post_mean, post_cov, log_det_post, log_det_prior, quad_post, quad_prior


def log_evidence_literal(X, y, prior_mean, prior_cov, moments, site_precision, site_natural_mean,
                         site_scale="stored"):
    """EP log evidence by eqs 48-49 as written (requires every ``tau_i > 0``).

    ``site_scale="stored"`` computes ``s_i`` from eq 15 projected on ``x_i`` with
    the stored site ``(v_i, m_i)``,
    ``s_i = Z_i sqrt((v_i + lambda_i)/v_i) exp((m_i - h_i)^2 / (2 (v_i + lambda_i)))``,
    valid at any state; ``"moments"`` uses eq 33 with ``(alpha, beta)`` from the
    moments at the current cavity, which agrees at an EP fixed point.
    """
    X = np.asarray(X, dtype=float)
    tau = np.asarray(site_precision, dtype=float)
    nu = np.asarray(site_natural_mean, dtype=float)
    if np.any(tau <= 0):
        raise ValueError("the literal eqs 48-49 need every site_precision > 0")
    post_mean, post_cov, log_det_post, log_det_prior, quad_post, quad_prior = _global_terms(
        X, prior_mean, prior_cov, tau, nu)
    h_cav, lam = _cavities(X, post_mean, post_cov, tau, nu)
    v_site = 1.0 / tau
    m_site = nu / tau
    log_s = 0.0
    for i in range(X.shape[0]):
        log_z, alpha, beta = (float(v) for v in moments(y[i], h_cav[i], lam[i]))
        if site_scale == "stored":
            log_s += (log_z + 0.5 * np.log((v_site[i] + lam[i]) / v_site[i])
                      + 0.5 * (m_site[i] - h_cav[i]) ** 2 / (v_site[i] + lam[i]))
        elif site_scale == "moments":
            log_s += log_z + 0.5 * np.log(1.0 + lam[i] / v_site[i]) + alpha ** 2 / (2.0 * beta)  # eq 33
        else:
            raise ValueError("site_scale must be 'stored' or 'moments'")
    B = quad_post - quad_prior - np.sum(m_site ** 2 / v_site)             # eq 49
    return 0.5 * (log_det_post - log_det_prior) + 0.5 * B + log_s          # eq 48 (in logs)


def log_evidence(X, y, prior_mean, prior_cov, moments, site_precision, site_natural_mean):
    """EP log evidence, eqs 48-49 regrouped per site so that ``tau_i = 0`` is allowed.

    ``log Z = 1/2 log|V|/|V0| + 1/2 (m^T V^-1 m - m0^T V0^-1 m0)
    + sum_i [log Z_i + 1/2 log(1 + lambda_i tau_i)
    - 1/2 (2 h_i nu_i + lambda_i nu_i^2 - h_i^2 tau_i) / (1 + lambda_i tau_i)]``.
    """
    X = np.asarray(X, dtype=float)
    tau = np.asarray(site_precision, dtype=float)
    nu = np.asarray(site_natural_mean, dtype=float)
    post_mean, post_cov, log_det_post, log_det_prior, quad_post, quad_prior = _global_terms(
        X, prior_mean, prior_cov, tau, nu)
    h_cav, lam = _cavities(X, post_mean, post_cov, tau, nu)
    total = 0.5 * (log_det_post - log_det_prior) + 0.5 * (quad_post - quad_prior)
    for i in range(X.shape[0]):
        log_z = float(moments(y[i], h_cav[i], lam[i])[0])
        one_plus = 1.0 + lam[i] * tau[i]
        total += (log_z + 0.5 * np.log(one_plus)
                  - 0.5 * (2 * h_cav[i] * nu[i] + lam[i] * nu[i] ** 2 - h_cav[i] ** 2 * tau[i]) / one_plus)
    return float(total)
