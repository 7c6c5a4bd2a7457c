"""Plain numpy reference for weight-space Gaussian EP with rank-k factors (Minka §3).

Written for clarity: full d x d inverses, the equations of Minka's quick reference
(eqs 95-116) spelled out one by one.  It must never import the compiled core: the
test suite uses it as an independent check of ``fastep._epcore.rank_k_ep``.

Conventions match the compiled engine: ``X`` has shape (n, k, d) with
``X[i] = X_i^T`` (so ``z_i = X[i] @ w``); site i is kept in natural form with
precision ``P_i = v_i^{-1}`` (k x k) and natural mean ``b_i = v_i^{-1} m_i`` (k).

Moment functions return ``(log_z, a, B)`` with ``a = d log Z / d h`` and
``B = -d^2 log Z / dh dh^T`` for the tilted distribution ``t(z) N(z; h, Lambda)``
(eqs 95-97).
"""
import itertools

import numpy as np

__all__ = [
    "mvgaussian_moments", "product_moments_diagonal", "product_moments_quadrature",
    "cavity", "run_rank_k_ep", "posterior_from_sites", "log_evidence", "log_evidence_literal",
    "gaussian_1d_moments", "gaussian_1d_log_lik",
]


# ---------------------------------------------------------------------------
# Moments
# ---------------------------------------------------------------------------
def mvgaussian_moments(y, cavity_mean, cavity_cov, noise_cov):
    """Exact moments for t(z) = N(y | z, R): Z = N(y; h, Lambda + R)."""
    C = cavity_cov + noise_cov
    Cinv = np.linalg.inv(C)
    r = y - cavity_mean
    k = len(y)
    _, logdet = np.linalg.slogdet(C)
    log_z = -0.5 * (k * np.log(2 * np.pi) + logdet + r @ Cinv @ r)
    return log_z, Cinv @ r, 0.5 * (Cinv + Cinv.T)


def gaussian_1d_moments(y, mu, var, noise_var):
    """1-D Gaussian site: log N(y; mu, var + noise_var), alpha, beta."""
    s = var + noise_var
    return -0.5 * np.log(2 * np.pi * s) - 0.5 * (y - mu) ** 2 / s, (y - mu) / s, 1.0 / s


def gaussian_1d_log_lik(y, z, noise_var):
    """log N(y; z, noise_var), vectorised over z."""
    return -0.5 * np.log(2 * np.pi * noise_var) - 0.5 * (y - z) ** 2 / noise_var


def product_moments_diagonal(y, cavity_mean, cavity_cov, moments_1d):
    """Separable moments for a diagonal cavity: sum of 1-D log Z_j, a = alpha, B = diag(beta).

    ``moments_1d(y_j, mu_j, var_j) -> (log_z, alpha, beta)``.
    """
    k = len(y)
    out = [moments_1d(y[j], cavity_mean[j], cavity_cov[j, j]) for j in range(k)]
    return (sum(o[0] for o in out), np.array([o[1] for o in out]),
            np.diag([o[2] for o in out]))


def product_moments_quadrature(y, cavity_mean, cavity_cov, log_lik, n_nodes=20):
    """Tensor-product Gauss-Hermite moments of prod_j f(y_j, z_j) N(z; h, Lambda).

    Straightforward version: enumerate all ``n_nodes**k`` nodes ``z = h + L xi``,
    compute the tilted mean and covariance of z directly, then (eqs 95-97)
    ``a = Lambda^{-1}(E z - h)``, ``B = Lambda^{-1} - Lambda^{-1} Cov(z) Lambda^{-1}``.
    ``log_lik(y_j, z_j_array) -> log f`` vectorised over z.
    """
    k = len(y)
    t, w = np.polynomial.hermite.hermgauss(n_nodes)
    xi_1d = np.sqrt(2.0) * t
    w_1d = w / np.sqrt(np.pi)
    L = np.linalg.cholesky(cavity_cov)
    xi = np.array(list(itertools.product(xi_1d, repeat=k)))          # (N, k)
    weights = np.prod(np.array(list(itertools.product(w_1d, repeat=k))), axis=1)
    z = cavity_mean + xi @ L.T
    log_f = sum(log_lik(y[j], z[:, j]) for j in range(k))
    with np.errstate(divide='ignore'):
        log_terms = log_f + np.log(weights)
    shift = np.max(log_terms)
    p = np.exp(log_terms - shift)
    Z = p.sum()
    mean = p @ z / Z
    cov = (z - mean).T @ ((z - mean) * p[:, None]) / Z
    Linv = np.linalg.inv(cavity_cov)
    a = Linv @ (mean - cavity_mean)
    B = Linv - Linv @ cov @ Linv
    return shift + np.log(Z), a, 0.5 * (B + B.T)


# ---------------------------------------------------------------------------
# EP
# ---------------------------------------------------------------------------
def posterior_from_sites(X, prior_mean, prior_cov, site_precision, site_natural_mean):
    """Invariant (eqs 46-47, rank k): V^{-1} = V0^{-1} + sum X_i P_i X_i^T, m = V(V0^{-1} m0 + sum X_i b_i)."""
    V0inv = np.linalg.inv(prior_cov)
    prec = V0inv + sum(X[i].T @ site_precision[i] @ X[i] for i in range(len(X)))
    V = np.linalg.inv(prec)
    V = 0.5 * (V + V.T)
    m = V @ (V0inv @ prior_mean + sum(X[i].T @ site_natural_mean[i] for i in range(len(X))))
    return m, V


def cavity(Xi, m, V, P, b):
    """Cavity of one factor with full matrices (eqs 101, 104-105 in natural form).

    V^{\\i} = (V^{-1} - X_i P_i X_i^T)^{-1},  m^{\\i} = m + V^{\\i} X_i (P_i X_i^T m - b_i);
    returns (m^{\\i}, V^{\\i}, h_i = X_i^T m^{\\i}, Lambda_i = X_i^T V^{\\i} X_i) (eq 103).
    """
    X = Xi.T                                          # d x k, Minka's X_i
    V_cav = np.linalg.inv(np.linalg.inv(V) - X @ P @ X.T)
    V_cav = 0.5 * (V_cav + V_cav.T)
    m_cav = m + V_cav @ X @ (P @ (X.T @ m) - b)
    return m_cav, V_cav, X.T @ m_cav, X.T @ V_cav @ X


def _is_pd(A):
    try:
        np.linalg.cholesky(0.5 * (A + A.T))
        return True
    except np.linalg.LinAlgError:
        return False


def run_rank_k_ep(X, y, prior_mean, prior_cov, moments, site_precision=None, site_natural_mean=None,
                  damping=1.0, tol=1e-8, max_sweeps=200):
    """Sequential rank-k EP.

    ``moments(i, h, Lambda) -> (log_z, a, B)`` for factor i.  The same skip policy as
    the compiled engine: a factor whose cavity is improper or whose new site would
    make V non-PD is left unchanged and counted.

    Returns a dict with post_mean, post_cov, site_precision, site_natural_mean,
    n_sweeps, converged, n_skipped.
    """
    X = np.asarray(X, dtype=float)
    n, k, d = X.shape
    P = np.zeros((n, k, k)) if site_precision is None else np.array(site_precision, dtype=float)
    b = np.zeros((n, k)) if site_natural_mean is None else np.array(site_natural_mean, dtype=float)
    m, V = posterior_from_sites(X, prior_mean, prior_cov, P, b)
    converged = False
    n_skipped = 0
    n_sweeps = 0
    for _ in range(max_sweeps):
        max_change = 0.0
        for i in range(n):
            Xd = X[i].T                                            # d x k
            m_cav, V_cav, h, Lam = cavity(X[i], m, V, P[i], b[i])
            if not _is_pd(Lam):
                n_skipped += 1
                continue
            log_z, a, B = moments(i, h, Lam)
            # eqs 108, 107: v_i = B^{-1} - Lambda, m_i = h + B^{-1} a.
            v_new = np.linalg.inv(B) - Lam
            P_new = np.linalg.inv(v_new)
            P_new = 0.5 * (P_new + P_new.T)
            b_new = P_new @ (h + np.linalg.solve(B, a))
            P_d = P[i] + damping * (P_new - P[i])
            b_d = b[i] + damping * (b_new - b[i])
            if damping == 1.0:
                # eqs 113, 115.
                m_next = m_cav + V_cav @ Xd @ a
                V_next = V_cav - V_cav @ Xd @ B @ Xd.T @ V_cav
            else:
                prec = np.linalg.inv(V_cav) + Xd @ P_d @ Xd.T
                V_next = np.linalg.inv(prec)
                m_next = V_next @ (np.linalg.solve(V_cav, m_cav) + Xd @ b_d)
            V_next = 0.5 * (V_next + V_next.T)
            if not _is_pd(V_next):
                n_skipped += 1
                continue
            max_change = max(max_change, np.max(np.abs(P_d - P[i])), np.max(np.abs(b_d - b[i])))
            P[i], b[i], m, V = P_d, b_d, m_next, V_next
        n_sweeps += 1
        if max_change < tol:
            converged = True
            break
    m, V = posterior_from_sites(X, prior_mean, prior_cov, P, b)
    return dict(post_mean=m, post_cov=V, site_precision=P, site_natural_mean=b,
                n_sweeps=n_sweeps, converged=converged, n_skipped=n_skipped)


def _gaussian_terms(X, prior_mean, prior_cov, P, b):
    m, V = posterior_from_sites(X, prior_mean, prior_cov, P, b)
    V0inv = np.linalg.inv(prior_cov)
    _, logdet_V = np.linalg.slogdet(V)
    _, logdet_V0 = np.linalg.slogdet(prior_cov)
    quad = m @ np.linalg.solve(V, m) - prior_mean @ V0inv @ prior_mean
    return m, V, 0.5 * (logdet_V - logdet_V0) + 0.5 * quad


def log_evidence(X, y, prior_mean, prior_cov, moments, site_precision, site_natural_mean):
    """log Z_EP = Gaussian part + sum_i [log Z_i - log G_i] with

    G_i = ∫ exp(-1/2 z^T P_i z + b_i^T z) N(z; h_i, Lambda_i) dz, computed here through
    Q = Lambda^{-1} + P:  log G = -1/2 log|Lambda| - 1/2 log|Q|
    + 1/2 (Lambda^{-1} h + b)^T Q^{-1} (Lambda^{-1} h + b) - 1/2 h^T Lambda^{-1} h.
    """
    X = np.asarray(X, dtype=float)
    P, b = np.asarray(site_precision, float), np.asarray(site_natural_mean, float)
    m, V, total = _gaussian_terms(X, prior_mean, prior_cov, P, b)
    for i in range(len(X)):
        _, _, h, Lam = cavity(X[i], m, V, P[i], b[i])
        log_z, _, _ = moments(i, h, Lam)
        Lam_inv = np.linalg.inv(Lam)
        Q = Lam_inv + P[i]
        r = Lam_inv @ h + b[i]
        log_g = (-0.5 * np.linalg.slogdet(Lam)[1] - 0.5 * np.linalg.slogdet(Q)[1]
                 + 0.5 * r @ np.linalg.solve(Q, r) - 0.5 * h @ Lam_inv @ h)
        total += log_z - log_g
    return float(total)


def log_evidence_literal(X, y, prior_mean, prior_cov, moments, site_precision, site_natural_mean):
    """Literal eqs 48-49 with s_i from eq 109; needs every P_i PD and sites at a fixed point.

    log s = 1/2 log|V|/|V0| + B/2 + sum_i log s_i,
    B = m^T V^{-1} m - m0^T V0^{-1} m0 - sum_i m_i^T v_i^{-1} m_i,
    log s_i = log Z_i - 1/2 log|B_i v_i| + 1/2 a_i^T B_i^{-1} a_i.
    """
    X = np.asarray(X, dtype=float)
    P, b = np.asarray(site_precision, float), np.asarray(site_natural_mean, float)
    m, V, total = _gaussian_terms(X, prior_mean, prior_cov, P, b)
    for i in range(len(X)):
        v_i = np.linalg.inv(P[i])
        m_i = v_i @ b[i]
        _, _, h, Lam = cavity(X[i], m, V, P[i], b[i])
        log_z, a, B = moments(i, h, Lam)
        sign, logdet_Bv = np.linalg.slogdet(B @ v_i)
        if sign <= 0:
            raise ValueError(f"|B_i v_i| is not positive for factor {i}")
        log_s = log_z - 0.5 * logdet_Bv + 0.5 * a @ np.linalg.solve(B, a)
        total += log_s - 0.5 * m_i @ P[i] @ m_i
    return float(total)
