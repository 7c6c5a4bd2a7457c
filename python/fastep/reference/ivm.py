"""Reference IVM selection (Lawrence, Seeger & Herbrich 2005, Algorithm 1) with the full covariance.

Plain numpy, written for clarity: the independent check of
:mod:`fastep._epcore.ivm`, never importing the compiled core. Where the
compiled engine stores ``Σ = K - MᵀM`` through the low-rank factor M, this twin
keeps the whole n x n posterior covariance and applies the ADF updates of
eqs 15-16 literally:

* score every inactive point from ``g_n``, ``ν_n`` (the site moments at the
  cavity ``N(μ_n, Σ_nn + sigma2)``, eqs 14-25): entropy reduction
  ``-½ log(1 - ν_n Σ_nn)`` (eq 26), information gain
  ``½ (g_n² Σ_nn - ν_n Σ_nn - log(1 - ν_n Σ_nn))``, or a seeded random choice;
  ineligible points (failed moments, ``Σ_nn <= 0``, ``ν_n <= 0`` or
  ``ν_n Σ_nn >= 1``) are never chosen; the first maximum wins;
* sites ``β_n = ν_n / (1 - ν_n Σ_nn)``, ``m_n = μ_n + g_n / ν_n`` (eqs 22-23)
  or, for a Gaussian likelihood, ``β_n = 1/(noise_variance + sigma2)``,
  ``m_n = y_n``;
* ``μ += g_n Σ[:, n]`` (eq 15), ``Σ -= ν_n Σ[:, n] Σ[:, n]ᵀ`` (eq 16).

The random criterion draws from numpy's generator (not the engine's splitmix64),
so random selections are not expected to agree with the engine.
Refinement on a fixed-size active set (the twins of ``IVMEP.refine`` and
``IVMEP.exchange``, :mod:`fastep._epcore.ivm_refine`; Seeger's notes §2.1 and §2.3): ``ep_refine``,
``exchange_gains``, ``exchange``, ``posterior_from_sites`` and
``entropy_reduction``; they recompute the posterior from the sites after every
change instead of applying eq (7) or the 2x2 Woodbury update.
"""
import numpy as np
from scipy.linalg import cho_solve, cholesky, solve_triangular

__all__ = ["select", "log_likelihood", "predict_latent", "posterior_from_sites", "entropy_reduction",
           "ep_refine", "exchange_gains", "exchange"]

_CRITERIA = ("entropy", "info_gain", "random")


def select(K, y, moments, d, *, sigma2=0.0, criterion="entropy", spherical_noise=None, seed=0):
    """Run d steps of Algorithm 1 on the full kernel matrix K.

    Parameters
    ----------
    K : ndarray (n, n)
    y : ndarray (n,)
    moments : callable
        ``moments(y, cavity_mean, cavity_var) -> (log_z, g, nu)`` vectorised.
    d : int
        Number of points to include.
    sigma2 : float
        Extra variance added to the cavity variance handed to ``moments``.
    criterion : {"entropy", "info_gain", "random"}
    spherical_noise : float or None
        Noise variance of a Gaussian likelihood: the sites are then set to
        ``β = 1/(spherical_noise + sigma2)``, ``m = y`` (the spherical model).
    seed : int
        Seed of the random criterion.

    Returns
    -------
    dict with ``active`` (inclusion order), ``site_mean``, ``site_precision`` (length n,
    zero for inactive points), ``post_mean``, ``post_cov``, ``scores`` (criterion value of
    each chosen point).
    """
    if criterion not in _CRITERIA:
        raise ValueError(f"criterion must be one of {_CRITERIA}")
    K = np.array(K, dtype=float)
    y = np.asarray(y, dtype=float)
    n = K.shape[0]
    Sigma = K.copy()
    mu = np.zeros(n)
    site_mean = np.zeros(n)
    site_precision = np.zeros(n)
    active = []
    chosen_scores = []
    inactive = np.ones(n, dtype=bool)
    rng = np.random.default_rng(seed)
    for _ in range(d):
        var = np.diag(Sigma).copy()
        scores = np.full(n, -np.inf)
        with np.errstate(all="ignore"):
            _, g, nu = moments(y, mu, var + sigma2)
            g, nu = np.asarray(g, dtype=float), np.asarray(nu, dtype=float)
            prod = var * nu
            ok = inactive & np.isfinite(g) & np.isfinite(nu) & (var > 0) & (nu > 0) & (prod < 1)
            log1m = np.log1p(-prod)
            if criterion == "info_gain":
                raw = 0.5 * (g * g * var - prod - log1m)
            else:
                raw = -0.5 * log1m
        scores[ok] = raw[ok]
        if not np.any(ok):
            raise RuntimeError(f"no eligible point after {len(active)} inclusions")
        if criterion == "random":
            i = int(rng.choice(np.flatnonzero(ok)))
        else:
            i = int(np.argmax(scores))
        if spherical_noise is not None:
            site_precision[i] = 1.0 / (spherical_noise + sigma2)
            site_mean[i] = y[i]
        else:
            site_precision[i] = nu[i] / (1.0 - nu[i] * var[i])              # eq 23
            site_mean[i] = mu[i] + g[i] / nu[i]                             # eq 22
        s = Sigma[:, i].copy()
        mu = mu + g[i] * s                                                  # eq 15
        Sigma = Sigma - nu[i] * np.outer(s, s)                              # eq 16
        active.append(i)
        chosen_scores.append(scores[i])
        inactive[i] = False
    return {"active": np.array(active, dtype=np.intp), "site_mean": site_mean,
            "site_precision": site_precision, "post_mean": mu, "post_cov": Sigma,
            "scores": np.array(chosen_scores)}


def log_likelihood(K_active, site_mean, site_precision):
    """``log N(m_I; 0, K_I + B_I⁻¹)`` (IVM eq 32), by a dense Cholesky."""
    C = np.asarray(K_active, dtype=float) + np.diag(1.0 / np.asarray(site_precision, dtype=float))
    m = np.asarray(site_mean, dtype=float)
    c = cholesky(C, lower=True)
    alpha = cho_solve((c, True), m)
    return float(-0.5 * m @ alpha - np.sum(np.log(np.diag(c))) - 0.5 * m.shape[0] * np.log(2.0 * np.pi))


def predict_latent(K_active, K_cross, k_diag, site_mean, site_precision):
    """Latent predictive ``(mean, var)`` from the active set: the GP posterior given the active sites.

    ``K_cross`` (m, k) holds k(x*, x_I); mean ``K_cross (K_I + B⁻¹)⁻¹ m_I``, variance
    ``k** - diag(K_cross (K_I + B⁻¹)⁻¹ K_crossᵀ)``.
    """
    C = np.asarray(K_active, dtype=float) + np.diag(1.0 / np.asarray(site_precision, dtype=float))
    c = cholesky(C, lower=True)
    mean = K_cross @ cho_solve((c, True), site_mean)
    V = cho_solve((c, True), K_cross.T)
    var = k_diag - np.einsum("ij,ji->i", K_cross, V)
    return mean, var


# --------------------------------------------------------------------------- #
# Refinement on a fixed-size active set (Seeger's notes §2.1 and §2.3)
# --------------------------------------------------------------------------- #
#
# The twin of ``IVMEP.refine`` / ``IVMEP.exchange``. Where the engine updates
# Σ[I, I] or Σ[I, :] with eq (7) and the 2x2 Woodbury formula, this twin recomputes
# the whole posterior from the site parameters after every change
# (``posterior_from_sites``), and takes the exchange cavities q\j by literally removing
# site j, so it does not share the update algebra it checks.


def posterior_from_sites(K, active, site_mean, site_precision):
    """``(mu, Sigma)`` of ``q(f) ∝ N(f; 0, K) ∏_{i ∈ I} N(m_i; f_i, β_i⁻¹)``.

    Through ``B̃ = I + B_I^½ K_I B_I^½ = L Lᵀ`` (Seeger §2.1, eq 6): ``V = L⁻¹ B_I^½ K[I, :]``,
    ``Sigma = K - VᵀV``, ``mu = Vᵀ L⁻¹ B_I^½ m_I``. ``site_mean``/``site_precision`` have
    length n; only the entries of ``active`` are used.
    """
    K = np.asarray(K, dtype=float)
    idx = np.asarray(active, dtype=np.intp)
    if idx.size == 0:
        return np.zeros(K.shape[0]), K.copy()
    sb = np.sqrt(np.asarray(site_precision, dtype=float)[idx])
    B = np.eye(idx.size) + sb[:, None] * K[np.ix_(idx, idx)] * sb[None, :]
    c = cholesky(B, lower=True)
    V = solve_triangular(c, sb[:, None] * K[idx, :], lower=True)
    t = solve_triangular(c, sb * np.asarray(site_mean, dtype=float)[idx], lower=True)
    return V.T @ t, K - V.T @ V


def entropy_reduction(K, active, site_precision):
    """``H(prior) - H(q) = ½ log|I + B_I^½ K_I B_I^½|`` (the exchange criterion; Seeger eq 4 summed)."""
    idx = np.asarray(active, dtype=np.intp)
    if idx.size == 0:
        return 0.0
    sb = np.sqrt(np.asarray(site_precision, dtype=float)[idx])
    B = np.eye(idx.size) + sb[:, None] * np.asarray(K, dtype=float)[np.ix_(idx, idx)] * sb[None, :]
    sign, logdet = np.linalg.slogdet(B)
    return 0.5 * logdet


def _site_from_cavity(y_i, cav_mean, cav_var, moments, sigma2, spherical_noise):
    """New site ``(β, m, ν)`` from the cavity (Seeger eq 5), or None if improper/failed."""
    if not (cav_var > 0 and np.isfinite(cav_var)):
        return None
    with np.errstate(all="ignore"):
        _, g, nu = moments(np.array([y_i]), np.array([cav_mean]), np.array([cav_var + sigma2]))
    g, nu = float(np.asarray(g)[0]), float(np.asarray(nu)[0])
    if not (np.isfinite(g) and np.isfinite(nu) and nu > 0 and nu * cav_var < 1):
        return None
    if spherical_noise is not None:
        return 1.0 / (spherical_noise + sigma2), float(y_i), nu
    beta = nu / (1.0 - nu * cav_var)
    m = cav_mean + g / nu
    if not (np.isfinite(beta) and np.isfinite(m) and beta > 0):
        return None
    return beta, m, nu


def ep_refine(K, y, moments, active, site_mean, site_precision, n_sweeps, *, sigma2=0.0,
              spherical_noise=None, tol=1e-9):
    """EP deletion-inclusion sweeps over the active set (Seeger §2.1), the twin of ``IVMEP.refine``.

    For each active point p in order: cavity ``λ = (1/Σ_pp - β_p)⁻¹``,
    ``h = λ (μ_p/Σ_pp - β_p m_p)``; site kernel at ``N(h, λ + sigma2)``; new site eq 5
    (spherical Gaussian: fixed). Skipped when ``max(|Δβ|/β, |Δm| β^½) <= tol``;
    left unchanged when the cavity or the new site is improper. The posterior is
    recomputed from the sites after every applied update. Converged when a sweep
    applies nothing and rejects nothing.

    Returns a dict with ``site_mean``, ``site_precision`` (length n), ``post_mean``,
    ``post_cov``, ``n_sweeps``, ``converged``, ``max_change``, ``n_updates``, ``n_rejected``.
    """
    if n_sweeps < 0:
        raise ValueError("n_sweeps must be >= 0")
    y = np.asarray(y, dtype=float)
    active = [int(i) for i in active]
    mean = np.array(site_mean, dtype=float)
    prec = np.array(site_precision, dtype=float)
    mu, Sigma = posterior_from_sites(K, active, mean, prec)
    converged, sweep, max_change, n_updates, n_rejected = not active, 0, 0.0, 0, 0
    for sweep in range(1, n_sweeps + 1):
        applied = rejected = 0
        max_change = 0.0
        for p in active:
            var, b, m = Sigma[p, p], prec[p], mean[p]
            if not (var > 0 and b > 0 and b * var < 1):
                rejected += 1
                continue
            lam = 1.0 / (1.0 / var - b)
            h = lam * (mu[p] / var - b * m)
            new = _site_from_cavity(y[p], h, lam, moments, sigma2, spherical_noise)
            if new is None:
                rejected += 1
                continue
            b_new, m_new, _ = new
            change = max(abs(b_new - b) / b, abs(m_new - m) * np.sqrt(b))
            max_change = max(max_change, change)
            if change <= tol:
                continue
            prec[p], mean[p] = b_new, m_new
            mu, Sigma = posterior_from_sites(K, active, mean, prec)
            applied += 1
        n_updates += applied
        n_rejected += rejected
        if applied == 0:
            converged = rejected == 0
            break
    return {"site_mean": mean, "site_precision": prec, "post_mean": mu, "post_cov": Sigma,
            "n_sweeps": sweep, "converged": converged, "max_change": max_change,
            "n_updates": n_updates, "n_rejected": n_rejected}


def exchange_gains(K, y, moments, active, site_mean, site_precision, *, sigma2=0.0, spherical_noise=None):
    """Entropy gains of all exchanges (Seeger §2.3): a (k, n) array, -inf where not eligible.

    Row r: remove the site of ``j = active[r]`` and recompute the cavity posterior q\\j
    from the remaining sites (eqs 8-9 are its marginals); for an inactive i with the site
    kernel at ``N(h_i\\j, λ_i\\j + sigma2)`` the gain is
    ``-½ log(1 - ν_i λ_i\\j) - ½ log(Σ\\j_jj / Σ_jj)``, the entropy of q minus that of the
    posterior after the exchange.
    """
    y = np.asarray(y, dtype=float)
    K = np.asarray(K, dtype=float)
    active = [int(i) for i in active]
    n = K.shape[0]
    mu, Sigma = posterior_from_sites(K, active, site_mean, site_precision)
    inactive = np.ones(n, dtype=bool)
    inactive[active] = False
    gains = np.full((len(active), n), -np.inf)
    for r, j in enumerate(active):
        rest = active[:r] + active[r + 1:]
        mu_j, Sigma_j = posterior_from_sites(K, rest, site_mean, site_precision)
        lam = np.diag(Sigma_j).copy()
        base = 0.5 * np.log(Sigma_j[j, j] / Sigma[j, j])
        with np.errstate(all="ignore"):
            _, g, nu = moments(y, mu_j, lam + sigma2)
            g, nu = np.asarray(g, dtype=float), np.asarray(nu, dtype=float)
            ok = inactive & np.isfinite(g) & np.isfinite(nu) & (lam > 0) & (nu > 0) & (nu * lam < 1)
            raw = -0.5 * np.log1p(-nu * lam) - base
        gains[r, ok] = raw[ok]
    return gains


def exchange(K, y, moments, active, site_mean, site_precision, *, mode="greedy", tol=1e-6, max_moves=None,
             sigma2=0.0, spherical_noise=None, seed=0):
    """Exchange moves (Seeger §2.3), the twin of ``IVMEP.exchange``.

    'greedy': apply the best pair of ``exchange_gains`` (first maximum in (slot, i)
    order) while its gain exceeds ``tol``; 'random': visit the slots in a random order
    (numpy's generator, so not the engine's sequence) and exchange the first slot whose
    best partner gains more than ``tol``. The new site of i is eq 5 at q\\j; j's site is
    reset; j's slot is removed and i appended. ``max_moves`` None means k.

    Returns a dict with ``active``, ``site_mean``, ``site_precision``, ``post_mean``,
    ``post_cov``, ``moves`` (list of ``(j, i, gain)``), ``converged``.
    """
    if mode not in ("greedy", "random"):
        raise ValueError("mode must be 'greedy' or 'random'")
    y = np.asarray(y, dtype=float)
    K = np.asarray(K, dtype=float)
    active = [int(i) for i in active]
    mean = np.array(site_mean, dtype=float)
    prec = np.array(site_precision, dtype=float)
    k = len(active)
    max_moves = k if max_moves is None else max_moves
    rng = np.random.default_rng(seed)
    moves, converged = [], False
    while True:
        gains = exchange_gains(K, y, moments, active, mean, prec, sigma2=sigma2, spherical_noise=spherical_noise)
        if mode == "greedy":
            flat = int(np.argmax(gains))
            r, i = divmod(flat, gains.shape[1])
        else:
            r = i = None
            for slot in rng.permutation(k):
                if np.max(gains[slot]) > tol:
                    r, i = int(slot), int(np.argmax(gains[slot]))
                    break
        if r is None or not gains[r, i] > tol:
            converged = True
            break
        if len(moves) >= max_moves:
            break
        j = active[r]
        rest = active[:r] + active[r + 1:]
        mu_j, Sigma_j = posterior_from_sites(K, rest, mean, prec)
        new = _site_from_cavity(y[i], mu_j[i], Sigma_j[i, i], moments, sigma2, spherical_noise)
        prec[j] = mean[j] = 0.0
        prec[i], mean[i], _ = new
        active = rest + [i]
        moves.append((j, i, float(gains[r, i])))
    mu, Sigma = posterior_from_sites(K, active, mean, prec)
    return {"active": np.array(active, dtype=np.intp), "site_mean": mean, "site_precision": prec,
            "post_mean": mu, "post_cov": Sigma, "moves": moves, "converged": converged}
