"""Reference minibatch sparse EP with tied sites and its stochastic evidence gradient (plain numpy).

Written for clarity, one point at a time: the independent check of
:mod:`fastep._sparse.stochastic`.  Model and notation of :mod:`fastep.reference.sparse_ep`
(``V = L⁻¹ K_mn``, ``g = Vᵀ w``, ``w ~ N(0, I)``).

Tied sites (Li, Hernández-Lobato and Turner, *Stochastic Expectation Propagation*, NeurIPS
2015): every point shares the site ``exp(-½ wᵀ (Λ/n) w + (b/n)ᵀ w)``, so the posterior is
``N(A⁻¹ b, A⁻¹)`` with ``A = I + Λ`` and the cavity of every point removes the fraction α of
one copy: ``A∖ = I + (1 - α/n) Λ``, ``b∖ = (1 - α/n) b``.  A minibatch B computes each point's
full-batch EP site from that cavity and moves a fraction ε of the tied site towards their
average::

    Λ ← (1 - ε) Λ + ε (n/|B|) Σ_{i∈B} τ_i v_i v_iᵀ,   b ← (1 - ε) b + ε (n/|B|) Σ_{i∈B} ν_i v_i.

The gradient estimate is ``n/|B|`` times the minibatch's share of the exact EP evidence gradient
``Σ_i [2 G_iᵀ ∂k_m(x_i) + c_i ∂k(x_i, x_i) - ⟨G_i U_iᵀ, ∂K_mm⟩]`` with
``U_i = K_mm⁻¹ k_m(x_i)``, ``G_i = ½ (K_mm⁻¹ E[u]) a_i - U_i (½ τ_i + c_i) + ½ L⁻ᵀ (I - A⁻¹) v_i τ_i``,
``a_i = (∂ log Z_i/∂μ_i)/α`` and ``c_i = ((∂ log Z_i/∂μ_i)² + ∂² log Z_i/∂μ_i²)/(2α)`` (FITC; 0
for DTC) at the point's cavity.
"""
import numpy as np


def tied_cavity(Lambda, b, n, power):
    """``(mean, covariance)`` of the tied cavity of w."""
    keep = 1.0 - power / n
    A = np.eye(len(b)) + keep * np.asarray(Lambda, dtype=float)
    cov = np.linalg.inv(A)
    return cov @ (keep * np.asarray(b, dtype=float)), cov


def _point_site(y_i, pm, v_i, d_i, cav_mean, cav_cov, power):
    """The point's cavity on g, its moments and its full-batch EP site (clip policy)."""
    mu = float(v_i @ cav_mean)
    s = float(v_i @ cav_cov @ v_i)
    log_z, a, beta = (float(np.asarray(t).reshape(-1)[0])
                      for t in pm(np.array([y_i]), np.array([mu]), np.array([s + d_i]), power))
    one_minus = 1.0 - s * beta
    tau = beta / (power * one_minus)
    nu = (a + beta * mu) / (power * one_minus)
    if tau < 0:
        tau, nu = 0.0, a / power
    return mu, s, log_z, a, beta, tau, nu


def tied_minibatch_update(V, d, y, pm, Lambda, b, n, *, power=1.0, step=None):
    """One minibatch's update of the tied site.

    Parameters
    ----------
    V : ndarray (m, |B|)
        Projections of the minibatch's points.
    d, y : ndarray (|B|,)
    pm : callable
        Powered moments, as :func:`fastep.reference.sparse_ep.power_moments`.
    Lambda, b : ndarray (m, m), (m,)
        The tied site's totals.
    n : int
        Number of training points.
    step : float, optional
        ε (default ``|B| / n``).

    Returns
    -------
    dict with ``Lambda``, ``b`` (new), ``site_precision``, ``site_natural_mean`` (the points'
    sites), ``cavity_mean``, ``cavity_var`` (of g) and ``log_z`` (powered, per point).
    """
    V = np.asarray(V, dtype=float)
    size = V.shape[1]
    eps = size / n if step is None else step
    cav_mean, cav_cov = tied_cavity(Lambda, b, n, power)
    out = {k: np.zeros(size) for k in ("site_precision", "site_natural_mean", "cavity_mean", "cavity_var",
                                          "log_z")}
    P, h = np.zeros_like(np.asarray(Lambda, dtype=float)), np.zeros(V.shape[0])
    for i in range(size):
        mu, s, log_z, _, _, tau, nu = _point_site(y[i], pm, V[:, i], d[i], cav_mean, cav_cov, power)
        P += tau * np.outer(V[:, i], V[:, i])
        h += nu * V[:, i]
        out["site_precision"][i], out["site_natural_mean"][i] = tau, nu
        out["cavity_mean"][i], out["cavity_var"][i], out["log_z"][i] = mu, s, log_z
    out["Lambda"] = (1.0 - eps) * np.asarray(Lambda, dtype=float) + eps * (n / size) * P
    out["b"] = (1.0 - eps) * np.asarray(b, dtype=float) + eps * (n / size) * h
    return out


def tied_gradient_estimate(Kmm, KmB, kdiag, dKmm, dKmB, dkdiag, y, pm, Lambda, b, n, *, power=1.0,
                           approximation="fitc", jitter=0.0):
    """The minibatch estimate of the evidence gradient at the tied sites ``(Lambda, b)``.

    ``dKmm`` (p, m, m), ``dKmB`` (p, m, |B|), ``dkdiag`` (p, |B|): derivatives of K_mm, K_mB and
    diag K_BB with respect to p parameters.
    """
    Kj = np.asarray(Kmm, dtype=float) + jitter * np.eye(len(Kmm))
    L = np.linalg.cholesky(Kj)
    KmB = np.asarray(KmB, dtype=float)
    V = np.linalg.solve(L, KmB)
    Q_diag = np.sum(V * V, axis=0)
    d = np.maximum(np.asarray(kdiag, dtype=float) - Q_diag, 0.0) if approximation == "fitc" else np.zeros(len(y))
    m, size = V.shape
    A = np.eye(m) + np.asarray(Lambda, dtype=float)
    A_inv = np.linalg.inv(A)
    w_mean = A_inv @ b
    Ua = np.linalg.solve(L.T, w_mean)                          # K_mm⁻¹ E[u]
    PA = np.linalg.solve(L.T, np.eye(m) - A_inv)
    cav_mean, cav_cov = tied_cavity(Lambda, b, n, power)
    grads = np.zeros(len(dKmm))
    for i in range(size):
        _, _, _, alpha, beta, _, _ = _point_site(y[i], pm, V[:, i], d[i], cav_mean, cav_cov, power)
        s = float(V[:, i] @ cav_cov @ V[:, i])
        tau = beta / (power * (1.0 - s * beta))
        a = alpha / power
        c = (alpha * alpha - beta) / (2.0 * power) if approximation == "fitc" else 0.0
        U_i = np.linalg.solve(Kj, KmB[:, i])
        G_i = 0.5 * Ua * a - U_i * (0.5 * tau + c) + 0.5 * (PA @ V[:, i]) * tau
        for j in range(len(dKmm)):
            grads[j] += (2.0 * G_i @ dKmB[j][:, i] + c * dkdiag[j][i]
                         - np.sum(np.outer(G_i, U_i) * 0.5 * (dKmm[j] + dKmm[j].T)))
    return grads * (n / size)
