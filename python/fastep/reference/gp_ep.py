"""Reference dense GP EP in kernel space (Minka §2, eqs 77-88; Rasmussen & Williams §3.6).

Plain numpy, written for clarity rather than speed: the independent check of
:mod:`fastep._epcore.gp_ep`, never importing the compiled core.

Model: prior ``f ~ N(0, K)``, likelihood ``prod_i t_i(f_i)``; each factor is
approximated by a site ``exp(-tau_i f_i^2 / 2 + nu_i f_i)`` with natural
parameters ``site_precision = tau`` and ``site_natural_mean = nu`` (zero = no
information). The posterior is ``N(mu, Sigma)`` with (Minka eq 74)

    Sigma = (K^-1 + diag(tau))^-1,        mu = Sigma nu.

The site moments come from a callable ``moments(y, cavity_mean, cavity_var) ->
(log_z, alpha, beta)`` (``alpha = d log Z / d mean``, ``beta = -d² log Z / d mean²``,
Minka eqs 17-19), vectorised over numpy arrays.

A site update (R&W eqs 3.56-3.59, the moment-matching form): the cavity
``tau_cav = 1/Sigma_ii - tau_i``, ``nu_cav = mu_i/Sigma_ii - nu_i``; tilted
moments ``mean_hat = m_cav + s_cav alpha``, ``var_hat = s_cav - s_cav² beta``;
the new site ``tau* = 1/var_hat - tau_cav``, ``nu* = mean_hat/var_hat - nu_cav``.
Policies as in the compiled engine:

* damping ``omega`` in natural parameters: ``tau += omega (tau* - tau)``, same for ``nu``;
* ``negative_precision="clip"``: a negative target precision becomes ``tau* = 0``,
  ``nu* = alpha`` (the tilted mean stays matched); a damped precision that is
  still negative becomes 0; ``"skip"``: the site is left unchanged;
* a site with an improper cavity, failing moments or a non-positive tilted
  variance is left unchanged and counted as failed;
* ``Sigma`` is updated by the rank-1 formula (R&W eq 3.70, Minka eq 84)
  ``Sigma -= dtau / (1 + dtau Sigma_ii) s s^T`` with ``s = Sigma[:, i]``; the
  update is skipped if ``1 + dtau Sigma_ii <= 0``; ``mu = Sigma nu`` is recomputed;
* after every sweep (sequential) or iteration (parallel) ``Sigma`` and ``mu`` are
  recomputed from the sites (:func:`posterior_from_sites`);
* convergence: ``max |dtau|/max(1,|tau|)`` and ``max |dnu|/max(1,|nu|)`` below
  ``tol``, no failed site, and ``|d log Z| < tol max(1, |log Z|)``.
"""
import numpy as np
from scipy.linalg import solve_triangular

from ._common import check_option, initial_sites

__all__ = [
    "posterior_from_sites", "run_gp_ep", "entropy_change", "log_marginal_likelihood",
    "log_marginal_likelihood_rw", "log_marginal_likelihood_stable", "log_marginal_likelihood_gradient",
]

_POLICIES = ("clip", "skip")
_SCHEDULES = ("sequential", "parallel")


def posterior_from_sites(K, site_precision, site_natural_mean):
    """``(mu, Sigma)`` from the sites through B = I + S^½ K S^½ (valid for tau >= 0).

    ``Sigma = K - K S^½ B^-1 S^½ K`` (the matrix-inversion lemma applied to
    ``(K^-1 + S)^-1``, R&W eq 3.68), ``mu = Sigma nu``.
    """
    K = np.asarray(K, dtype=float)
    tau = np.asarray(site_precision, dtype=float)
    nu = np.asarray(site_natural_mean, dtype=float)
    if np.any(tau < 0):
        raise ValueError("site_precision must be >= 0")
    s = np.sqrt(tau)
    B = np.eye(K.shape[0]) + s[:, None] * K * s[None, :]
    sK = s[:, None] * K
    Sigma = K - sK.T @ np.linalg.solve(B, sK)
    Sigma = 0.5 * (Sigma + Sigma.T)
    return Sigma @ nu, Sigma


def _cavities(Sigma_diag, mu, tau, nu):
    tau_cav = 1.0 / Sigma_diag - tau
    nu_cav = mu / Sigma_diag - nu
    return tau_cav, nu_cav


def _new_site(y_i, moments, tau_cav, nu_cav, tau_old, nu_old, damping, negative_precision):
    """Target site for one cavity: (status, tau_new, nu_new, log_z, alpha, beta).

    status in {"applied", "clipped", "skipped", "failed"}.
    """
    if not (tau_cav > 0 and np.isfinite(tau_cav) and np.isfinite(nu_cav)):
        return "failed", tau_old, nu_old, None, None, None
    cav_var = 1.0 / tau_cav
    cav_mean = nu_cav * cav_var
    log_z, alpha, beta = (float(np.asarray(v).reshape(-1)[0])
                          for v in moments(np.array([y_i]), np.array([cav_mean]), np.array([cav_var])))
    if not (np.isfinite(log_z) and np.isfinite(alpha) and np.isfinite(beta)):
        return "failed", tau_old, nu_old, None, None, None
    var_hat = cav_var - cav_var**2 * beta
    if not var_hat > 0:
        return "failed", tau_old, nu_old, None, None, None
    mean_hat = cav_mean + cav_var * alpha
    tau_target = 1.0 / var_hat - tau_cav
    nu_target = mean_hat / var_hat - nu_cav
    status = "applied"
    if tau_target < 0:
        if negative_precision == "skip":
            return "skipped", tau_old, nu_old, log_z, alpha, beta
        tau_target, nu_target, status = 0.0, alpha, "clipped"
    tau_new = tau_old + damping * (tau_target - tau_old)
    nu_new = nu_old + damping * (nu_target - nu_old)
    if tau_new < 0:
        if negative_precision == "skip":
            return "skipped", tau_old, nu_old, log_z, alpha, beta
        tau_new, status = 0.0, "clipped"
    return status, tau_new, nu_new, log_z, alpha, beta


def entropy_change(cavity_var, beta, Sigma_ii, tau):
    """Seeger's differential-entropy score of including a site, Minka eq 86.

    ``dH = ½ log((1 - lambda beta) / (1 - a_ii tau))`` with ``lambda`` the
    cavity variance and ``a_ii = Sigma_ii`` the current marginal variance: the
    change of the site marginal's entropy, negative when the site sharpens it.
    """
    return 0.5 * np.log((1.0 - cavity_var * beta) / (1.0 - Sigma_ii * tau))


def _entropy_scores(remaining, y, moments, Sigma, mu, tau, nu):
    d = np.diag(Sigma)[remaining]
    tau_cav, nu_cav = _cavities(d, mu[remaining], tau[remaining], nu[remaining])
    scores = np.full(len(remaining), np.inf)
    ok = (tau_cav > 0) & np.isfinite(nu_cav)
    cav_var = 1.0 / tau_cav[ok]
    _, _, beta = moments(y[remaining][ok], nu_cav[ok] * cav_var, cav_var)
    with np.errstate(invalid="ignore", divide="ignore"):
        sc = entropy_change(cav_var, np.asarray(beta), d[ok], tau[remaining][ok])
    scores[ok] = np.where(np.isfinite(sc), sc, np.inf)
    return scores


def run_gp_ep(K, y, moments, site_precision=None, site_natural_mean=None, *, schedule="sequential",
              order="fixed", damping=1.0, tol=1e-8, max_sweeps=100, negative_precision="clip"):
    """Dense GP EP until convergence.

    Parameters
    ----------
    K : ndarray (n, n)
        Prior covariance of the latent function at the training inputs.
    y : ndarray (n,)
        Targets as the likelihood expects them.
    moments : callable
        ``moments(y, cavity_mean, cavity_var) -> (log_z, alpha, beta)``.
    site_precision, site_natural_mean : ndarray (n,), optional
        Warm start (default zeros); not modified.
    schedule : {"sequential", "parallel"}
    order : "fixed", "entropy", or a sequence of permutations (one per sweep, reused cyclically)
        Site order of the sequential schedule; "entropy" picks, among the sites not yet
        visited in the sweep, the one with the most negative eq-86 score (ties: lowest index).
    damping, tol, max_sweeps, negative_precision
        As in the module docstring.

    Returns
    -------
    dict with ``site_precision``, ``site_natural_mean``, ``post_cov``, ``post_mean``,
    ``n_sweeps``, ``converged``, ``max_change``, ``log_z``, ``n_clipped``, ``n_skipped``, ``n_failed``.
    """
    K = np.asarray(K, dtype=float)
    y = np.asarray(y, dtype=float)
    n = K.shape[0]
    check_option(schedule, "schedule", _SCHEDULES)
    check_option(negative_precision, "negative_precision", _POLICIES)
    tau, nu = initial_sites(n, site_precision, site_natural_mean)
    mu, Sigma = posterior_from_sites(K, tau, nu)
    log_z = log_marginal_likelihood(K, y, moments, tau, nu)
    converged = False
    sweep = 0
    counts = {"clipped": 0, "skipped": 0, "failed": 0}
    max_change = np.inf
    for sweep in range(1, max_sweeps + 1):
        tau_before, nu_before = tau.copy(), nu.copy()
        counts = {"clipped": 0, "skipped": 0, "failed": 0}
        if schedule == "parallel":
            tau_cav, nu_cav = _cavities(np.diag(Sigma), mu, tau, nu)
            for i in range(n):
                status, tau[i], nu[i], *_ = _new_site(
                    y[i], moments, tau_cav[i], nu_cav[i], tau[i], nu[i], damping, negative_precision)
                if status != "applied":
                    counts[status] += 1
        else:
            if isinstance(order, str) and order == "fixed":
                sequence = range(n)
            elif isinstance(order, str) and order == "entropy":
                sequence = None
            elif isinstance(order, str):
                raise ValueError("order must be 'fixed', 'entropy' or a list of permutations")
            else:
                sequence = np.asarray(order[(sweep - 1) % len(order)])
            remaining = list(range(n))
            for step in range(n):
                if sequence is None:
                    scores = _entropy_scores(np.array(remaining), y, moments, Sigma, mu, tau, nu)
                    i = remaining.pop(int(np.argmin(scores)))
                else:
                    i = int(sequence[step])
                tau_cav, nu_cav = _cavities(Sigma[i, i], mu[i], tau[i], nu[i])
                status, tau_new, nu_new, *_ = _new_site(
                    y[i], moments, tau_cav, nu_cav, tau[i], nu[i], damping, negative_precision)
                if status in ("applied", "clipped"):
                    d_tau = tau_new - tau[i]
                    c = 1.0 + d_tau * Sigma[i, i]
                    if not c > 0:
                        status = "skipped"
                    else:
                        s_col = Sigma[:, i].copy()
                        Sigma = Sigma - (d_tau / c) * np.outer(s_col, s_col)   # eq 84
                        tau[i], nu[i] = tau_new, nu_new
                        mu = Sigma @ nu
                if status != "applied":
                    counts[status] += 1
        mu, Sigma = posterior_from_sites(K, tau, nu)     # refactorisation
        new_log_z = log_marginal_likelihood(K, y, moments, tau, nu)
        change_tau = np.max(np.abs(tau - tau_before) / np.maximum(1.0, np.abs(tau)))
        change_nu = np.max(np.abs(nu - nu_before) / np.maximum(1.0, np.abs(nu)))
        max_change = max(change_tau, change_nu)
        log_z_change = abs(new_log_z - log_z)
        log_z = new_log_z
        if (max_change < tol and counts["failed"] == 0
                and log_z_change < tol * max(1.0, abs(log_z))):
            converged = True
            break
    return {
        "site_precision": tau, "site_natural_mean": nu, "post_cov": Sigma, "post_mean": mu,
        "n_sweeps": sweep, "converged": converged, "max_change": max_change, "log_z": log_z,
        "n_clipped": counts["clipped"], "n_skipped": counts["skipped"] + counts["failed"],
        "n_failed": counts["failed"],
    }


def log_marginal_likelihood(K, y, moments, site_precision, site_natural_mean):
    """EP log marginal likelihood at the given sites (valid for tau >= 0).

    The cavities are recomputed from the posterior the sites define, and

        log Z_EP = sum_i log Z_i - ½ log|B| + ½ nuᵀ Sigma nu
                   + ½ sum_i nu_cav,i (tau_i/tau_cav,i nu_cav,i - 2 nu_i) / (tau_i + tau_cav,i)
                   - ½ sum_i nu_i² / (tau_cav,i + tau_i) + ½ sum_i log(1 + tau_i / tau_cav,i)

    with ``B = I + S^½ K S^½``: Minka's eq 88 (equivalently R&W eq 3.65) rewritten so
    that sites with zero precision contribute nothing singular. ``log|B|`` is taken
    with ``slogdet`` (the compiled engine uses the Cholesky factor).
    """
    K = np.asarray(K, dtype=float)
    tau = np.asarray(site_precision, dtype=float)
    nu = np.asarray(site_natural_mean, dtype=float)
    mu, Sigma = posterior_from_sites(K, tau, nu)
    d = np.diag(Sigma)
    tau_cav, nu_cav = _cavities(d, mu, tau, nu)
    log_z_sites, _, _ = moments(np.asarray(y, dtype=float), nu_cav / tau_cav, 1.0 / tau_cav)
    s = np.sqrt(tau)
    sign, logdet_B = np.linalg.slogdet(np.eye(K.shape[0]) + s[:, None] * K * s[None, :])
    return float(
        np.sum(log_z_sites) - 0.5 * logdet_B + 0.5 * nu @ Sigma @ nu
        + 0.5 * np.sum(nu_cav * (tau / tau_cav * nu_cav - 2.0 * nu) / (tau + tau_cav))
        - 0.5 * np.sum(nu**2 / (tau_cav + tau))
        + 0.5 * np.sum(np.log1p(tau / tau_cav)))


def log_marginal_likelihood_rw(K, y, moments, site_precision, site_natural_mean):
    """EP log marginal likelihood in the textbook form (R&W eq 3.65; requires every tau > 0).

    Each site is written as ``Z~_i N(f_i; m~_i, 1/tau_i)`` with the normaliser
    ``Z~_i = Z_i sqrt(2 pi) sqrt(s_cav + 1/tau_i) exp((m_cav - m~_i)² / (2 (s_cav + 1/tau_i)))``
    (R&W eq 3.58), so that ``Z_EP = N(m~; 0, K + diag(1/tau)) prod_i Z~_i``.
    An independent check of :func:`log_marginal_likelihood` at sites with positive precision.
    """
    K = np.asarray(K, dtype=float)
    tau = np.asarray(site_precision, dtype=float)
    nu = np.asarray(site_natural_mean, dtype=float)
    if np.any(tau <= 0):
        raise ValueError("the textbook form needs every site precision > 0")
    mu, Sigma = posterior_from_sites(K, tau, nu)
    tau_cav, nu_cav = _cavities(np.diag(Sigma), mu, tau, nu)
    m_cav, s_cav = nu_cav / tau_cav, 1.0 / tau_cav
    m_site, s_site = nu / tau, 1.0 / tau
    log_z_sites, _, _ = moments(np.asarray(y, dtype=float), m_cav, s_cav)
    log_site_norm = (log_z_sites + 0.5 * np.log(2 * np.pi) + 0.5 * np.log(s_cav + s_site)
                     + 0.5 * (m_cav - m_site) ** 2 / (s_cav + s_site))
    C = K + np.diag(s_site)
    sign, logdet_C = np.linalg.slogdet(C)
    log_gauss = -0.5 * m_site @ np.linalg.solve(C, m_site) - 0.5 * logdet_C - 0.5 * len(tau) * np.log(2 * np.pi)
    return float(log_gauss + np.sum(log_site_norm))


def log_marginal_likelihood_stable(K, y, moments, site_precision, site_natural_mean):
    """EP log marginal likelihood from B's Cholesky factor, without cancelling terms (valid for tau >= 0).

    The twin of the compiled ``gp_ep.gp_log_z_stable`` (its docstring has the derivation from
    Minka eqs 78-79 and 88, R&W eq 3.65). With P the sites with ``tau_i > 0``, Z the rest,
    ``s = sqrt(tau)``, ``B = I + S^½ K S^½ = L Lᵀ``, ``r = S^-½ nu`` on P (0 on Z),
    ``t = K nu_Z``, ``w = B^-1 (r - S^½ t)`` and ``b = diag(B^-1)``:

        log Z_EP = sum_i log Z_i(h_i, lam_i) - sum_i log L_ii - ½ sum_i log b_i - ½ sum_i c_i h_i

    with the cavities ``lam_i = (1 - b_i)/(tau_i b_i)``, ``h_i = (r_i - w_i/b_i)/s_i`` on P
    where ``1 - b_i >= 1e-4`` (otherwise, including Z, ``lam_i = Sigma_ii/b_i`` and
    ``h_i = (mu_i - Sigma_ii nu_i)/b_i``), ``c_i = s_i w_i`` on P and ``nu_i`` on Z, and
    ``mu = t + K S^½ w``. Every term is O(1), unlike :func:`log_marginal_likelihood`, whose
    terms of size ``tau_i m~_i²`` cancel at huge site precisions.
    """
    K = np.asarray(K, dtype=float)
    tau = np.asarray(site_precision, dtype=float)
    nu = np.asarray(site_natural_mean, dtype=float)
    if np.any(tau < 0):
        raise ValueError("site_precision must be >= 0")
    n = K.shape[0]
    s = np.sqrt(tau)
    pos = tau > 0
    L = np.linalg.cholesky(np.eye(n) + s[:, None] * K * s[None, :])
    L_inv = solve_triangular(L, np.eye(n), lower=True)
    b = np.sum(L_inv ** 2, axis=0)                       # diag(B^-1) = squared column norms of L^-1
    t = K @ np.where(pos, 0.0, nu)
    rhs = np.zeros(n)                                   # r - S^½ t
    rhs[pos] = nu[pos] / s[pos] - s[pos] * t[pos]
    w = L_inv.T @ (L_inv @ rhs)
    mu = t + K @ (s * w)
    Sigma_diag = np.diag(posterior_from_sites(K, tau, nu)[1])
    direct = pos & (1.0 - b >= 1e-4)
    lam = np.where(direct, (1.0 - b) / np.where(pos, tau * b, 1.0), Sigma_diag / b)
    h = np.where(direct, (np.where(pos, nu / np.where(pos, s, 1.0), 0.0) - w / b) / np.where(pos, s, 1.0),
                 (mu - Sigma_diag * nu) / b)
    c = np.where(pos, s * w, nu)
    log_z_sites, _, _ = moments(np.asarray(y, dtype=float), h, lam)
    return float(np.sum(log_z_sites) - np.sum(np.log(np.diag(L))) - 0.5 * np.sum(np.log(b))
                 - 0.5 * np.sum(c * h))


def log_marginal_likelihood_gradient(K, dK, site_precision, site_natural_mean):
    """Gradient of the EP log marginal likelihood w.r.t. kernel hyperparameters at an EP fixed point.

    At a fixed point the sites are stationary, so only the explicit dependence on
    K counts (Seeger 2005; R&W eq 5.27 / GPML infEP):

        d log Z_EP / d theta_j = ½ bᵀ dK_j b - ½ tr(R dK_j),
        R = (K + S^-1)^-1 = S^½ B^-1 S^½,   b = nu - R K nu  ( = R S^-1 nu ).

    Parameters
    ----------
    K : ndarray (n, n)
    dK : ndarray (n, n, p) or sequence of (n, n) arrays
    site_precision, site_natural_mean : ndarray (n,)

    Returns
    -------
    ndarray (p,)
    """
    K = np.asarray(K, dtype=float)
    tau = np.asarray(site_precision, dtype=float)
    nu = np.asarray(site_natural_mean, dtype=float)
    n = K.shape[0]
    s = np.sqrt(tau)
    B = np.eye(n) + s[:, None] * K * s[None, :]
    R = s[:, None] * np.linalg.solve(B, np.diag(s))
    R = 0.5 * (R + R.T)
    b = nu - R @ (K @ nu)
    dK = np.asarray(dK, dtype=float)
    if dK.ndim == 2:
        dK = dK[:, :, None]
    if dK.shape[:2] != (n, n):
        dK = np.moveaxis(dK, 0, -1)
    return np.array([0.5 * b @ dK[:, :, j] @ b - 0.5 * np.sum(R * dK[:, :, j]) for j in range(dK.shape[2])])
