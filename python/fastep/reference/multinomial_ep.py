"""Reference nested EP for the multinomial probit likelihood, and the dense outer posterior.

Plain numpy, written for clarity: the independent check of :mod:`fastep._epcore.multiclass_ep`
and of the O(c n³) posterior algebra in :mod:`fastep._dense.multiclass` (Riihimäki, Jylänki &
Vehtari, "Nested expectation propagation for Gaussian process classification with a
multinomial probit likelihood", JMLR 2013), and of the compiled outer iteration
:class:`fastep._epcore.multiclass_ep.MultinomialEP` (:func:`nested_ep`). Never imports the compiled core.

Inner EP of one site with label k and cavity ``N(f; m, V)`` (natural parameters ``Λ = V⁻¹``,
``η = Λ m``): the augmented ``z = (f, u)`` has prior ``N(z; (m, 0), blkdiag(V, 1))`` and factors
``Φ(w_jᵀ z)``, ``w_j = e_k - e_j + e_u`` (j ≠ k), each with a Gaussian site
``exp(-α_j x²/2 + β_j x)`` in ``x = w_jᵀ z``. The inner posterior is formed here from scratch
(explicit inverse) before every factor's update; the compiled kernel updates it by rank-1 steps.
"""
import numpy as np
from scipy.special import log_ndtr

__all__ = ["probit_moments", "nested_site", "outer_sites", "stacked_sites", "dense_posterior", "evidence", "nested_ep"]


def probit_moments(mean, var):
    """``log Z``, ``α``, ``β`` of ``∫ Φ(x) N(x; mean, var) dx`` (R&W eqs 3.58, 3.82)."""
    scale = np.sqrt(1.0 + var)
    z = mean / scale
    log_z = log_ndtr(z)
    ratio = np.exp(-0.5 * z * z - 0.5 * np.log(2 * np.pi) - log_z)
    alpha = ratio / scale
    beta = alpha * (alpha + mean / (1.0 + var))
    return log_z, alpha, beta


def _directions(c, label):
    rows = []
    for j in range(c):
        if j == label:
            continue
        w = np.zeros(c + 1)
        w[label], w[j], w[c] = 1.0, -1.0, 1.0
        rows.append((j, w))
    return rows


def _inner_posterior(cav_prec, cav_lin, label, alpha, beta):
    c = cav_lin.size
    precision = np.zeros((c + 1, c + 1))
    precision[:c, :c] = cav_prec
    precision[c, c] = 1.0
    lin = np.concatenate([cav_lin, [0.0]])
    for j, w in _directions(c, label):
        precision += alpha[j] * np.outer(w, w)
        lin += beta[j] * w
    cov = np.linalg.inv(precision)
    return cov, cov @ lin, precision, lin


def nested_site(cav_prec, cav_lin, label, alpha, beta, n_sweeps=1, damping=1.0):
    """Inner EP sweeps from the inner sites ``(alpha, beta)``; returns ``(alpha, beta, log_z)``."""
    alpha = np.array(alpha, dtype=float)
    beta = np.array(beta, dtype=float)
    c = cav_lin.size
    for _ in range(n_sweeps):
        for j, w in _directions(c, label):
            cov, mean, _, _ = _inner_posterior(cav_prec, cav_lin, label, alpha, beta)
            v, m = w @ cov @ w, w @ mean
            tau_c = 1.0 / v - alpha[j]
            nu_c = m / v - beta[j]
            _, a, b = probit_moments(nu_c / tau_c, 1.0 / tau_c)
            v_c, m_c = 1.0 / tau_c, nu_c / tau_c
            tau_t = b / (1.0 - v_c * b)
            nu_t = (a + b * m_c) / (1.0 - v_c * b)
            alpha[j] += damping * (tau_t - alpha[j])
            beta[j] += damping * (nu_t - beta[j])
    # inner evidence: log ∫ N(z; z0, Q0) Π t̃_j dz + Σ_j [log Ẑ_j + Ψ(cavity_j) - Ψ(marginal_j)]
    cov, mean, precision, lin = _inner_posterior(cav_prec, cav_lin, label, alpha, beta)
    cav_cov = np.linalg.inv(cav_prec)
    log_z = (0.5 * np.linalg.slogdet(cov)[1] + 0.5 * mean @ lin
             + 0.5 * np.linalg.slogdet(cav_prec)[1] - 0.5 * cav_lin @ cav_cov @ cav_lin)
    for j, w in _directions(c, label):
        v, m = w @ cov @ w, w @ mean
        tau_c, nu_c = 1.0 / v - alpha[j], m / v - beta[j]
        lz, _, _ = probit_moments(nu_c / tau_c, 1.0 / tau_c)
        log_z += lz - 0.5 * np.log(tau_c * v) + 0.5 * nu_c ** 2 / tau_c - 0.5 * m * m / v
    return alpha, beta, float(log_z)


def outer_sites(labels, alpha, beta):
    """Per site ``(T̃_i, ν̃_i)`` (c×c, c) by integrating u out of the inner sites and N(u; 0, 1)."""
    n, c = alpha.shape
    precisions, lins = np.empty((n, c, c)), np.empty((n, c))
    for i in range(n):
        precision = np.zeros((c + 1, c + 1))
        lin = np.zeros(c + 1)
        precision[c, c] = 1.0                    # the prior of u
        for j, w in _directions(c, labels[i]):
            precision += alpha[i, j] * np.outer(w, w)
            lin += beta[i, j] * w
        p_fu, p_uu = precision[:c, c], precision[c, c]
        precisions[i] = precision[:c, :c] - np.outer(p_fu, p_fu) / p_uu
        lins[i] = lin[:c] - p_fu * lin[c] / p_uu
    return precisions, lins


def stacked_sites(site_precisions, site_lins):
    """The n outer sites as one class-major (cn)×(cn) precision ``Π`` and (cn,) linear term ``ν̃``
    (entry ``j n + i`` is class j of input i)."""
    n, c = site_lins.shape
    Pi = np.zeros((c * n, c * n))
    nu = np.zeros(c * n)
    for i in range(n):
        idx = [j * n + i for j in range(c)]
        Pi[np.ix_(idx, idx)] += site_precisions[i]
        nu[idx] += site_lins[i]
    return Pi, nu


def dense_posterior(K, site_precisions, site_lins):
    """``(Σ, μ, log|I + KΠ|)`` of the outer sites on the (cn)×(cn) class-major prior ``I_c ⊗ K``."""
    n = K.shape[0]
    c = site_lins.shape[1]
    Pi, nu = stacked_sites(site_precisions, site_lins)
    prior = np.kron(np.eye(c), K)
    cov = np.linalg.inv(np.linalg.inv(prior) + Pi)
    return cov, cov @ nu, np.linalg.slogdet(np.eye(c * n) + prior @ Pi)[1]


def _marginals(K, labels, alpha, beta):
    """Outer sites, the dense posterior and every site's marginal ``(Λ_i, η_i)`` of the inner sites."""
    n, c = alpha.shape
    site_prec, site_lin = outer_sites(labels, alpha, beta)
    cov, mean, log_det = dense_posterior(K, site_prec, site_lin)
    marginals = []
    for i in range(n):
        idx = [j * n + i for j in range(c)]
        prec = np.linalg.inv(cov[np.ix_(idx, idx)])
        marginals.append((prec, prec @ mean[idx]))
    return site_prec, site_lin, mean, log_det, marginals


def _psi(precision, lin):
    return -0.5 * np.linalg.slogdet(precision)[1] + 0.5 * lin @ np.linalg.solve(precision, lin)


def evidence(K, labels, alpha, beta):
    """The outer EP energy of the inner sites (§4 of the paper):
    ``-½ log|I + KΠ| + ½ ν̃ᵀμ + Σ_i [log Ẑ_i + Ψ(cavity_i) - Ψ(marginal_i)]``."""
    site_prec, site_lin, mean, log_det, marginals = _marginals(K, labels, alpha, beta)
    total = -0.5 * log_det + 0.5 * site_lin.T.reshape(-1) @ mean
    for i, (prec, lin) in enumerate(marginals):
        cav_prec, cav_lin = prec - site_prec[i], lin - site_lin[i]
        _, _, log_z = nested_site(cav_prec, cav_lin, labels[i], alpha[i], beta[i], n_sweeps=0)
        total += log_z + _psi(cav_prec, cav_lin) - _psi(prec, lin)
    return float(total)


def nested_ep(K, labels, c, damping=0.5, tol=1e-10, max_iter=2000, alpha=None, beta=None):
    """Damped parallel outer EP (§4) from the inner sites ``(alpha, beta)`` (default zero, each
    (n, c)): every iteration updates all sites from one posterior by one damped inner sweep each.
    Stops when the largest relative change of an inner site parameter is below ``tol``. Returns
    ``(alpha, beta, log_z, iterations)``."""
    n = len(labels)
    alpha = np.zeros((n, c)) if alpha is None else np.array(alpha, dtype=float)
    beta = np.zeros((n, c)) if beta is None else np.array(beta, dtype=float)
    for iteration in range(1, max_iter + 1):
        site_prec, site_lin, _, _, marginals = _marginals(K, labels, alpha, beta)
        new_alpha, new_beta = alpha.copy(), beta.copy()
        for i, (prec, lin) in enumerate(marginals):
            new_alpha[i], new_beta[i], _ = nested_site(prec - site_prec[i], lin - site_lin[i], labels[i], alpha[i],
                                                       beta[i], n_sweeps=1, damping=damping)
        change = max(np.max(np.abs(new_alpha - alpha) / np.maximum(1.0, np.abs(alpha))),
                     np.max(np.abs(new_beta - beta) / np.maximum(1.0, np.abs(beta))))
        alpha, beta = new_alpha, new_beta
        if change < tol:
            break
    return alpha, beta, evidence(K, labels, alpha, beta), iteration
