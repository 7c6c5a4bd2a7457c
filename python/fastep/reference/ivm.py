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
"""
import numpy as np
from scipy.linalg import cho_solve, cholesky

__all__ = ["select", "log_likelihood", "predict_latent"]

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
