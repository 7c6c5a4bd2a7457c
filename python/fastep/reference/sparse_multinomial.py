"""Plain-numpy twin of the joint multiclass sparse EP's site algebra (:mod:`fastep._sparse.multinomial`).

One input at a time, every quantity from its definition with explicit inverses and Kronecker
products, for clarity: the site's action on g by integrating the FITC noise out, the cavity by
dividing the marginal by the site in natural parameters, the site's normaliser by completing
the square, the evidence gradient's FITC term from the tilted covariance, and the posterior over
the c m whitened inducing values from ``Σ_i kron(P_i, b_i b_iᵀ)``.

Riihimäki, Jylänki and Vehtari, "Nested expectation propagation for Gaussian process
classification with a multinomial probit likelihood" (JMLR 14, 2013), eqs 13-15 for the outer
site's form.
"""
import numpy as np

__all__ = ["effective_site", "cavity", "site_log_normaliser", "fitc_gradient_term", "posterior",
           "marginal"]


def effective_site(pi, nu, fitc_variance):
    """``(P, h)`` of one outer site ``(π, ν̃)`` on g: with ``T̃ = diag(π) - π πᵀ / Σπ``,
    ``∫ N(ε; 0, δ I) exp(-½ (g + ε)ᵀ T̃ (g + ε) + ν̃ᵀ (g + ε)) dε ∝ exp(-½ gᵀ P g + hᵀ g)``:
    ``P = T̃ (I + δ T̃)⁻¹``, ``h = (I + δ T̃)⁻¹ ν̃``."""
    pi = np.asarray(pi, dtype=float)
    c = pi.size
    T = np.diag(pi) - np.outer(pi, pi) / pi.sum()
    inverse = np.linalg.inv(np.eye(c) + fitc_variance * T)
    P = T @ inverse
    return 0.5 * (P + P.T), inverse @ np.asarray(nu, dtype=float)


def cavity(marginal_cov, marginal_mean, P, h):
    """``(C, m)`` of the marginal ``N(μ, S)`` divided by the site ``(P, h)`` in natural parameters."""
    precision = np.linalg.inv(marginal_cov) - P
    C = np.linalg.inv(precision)
    return 0.5 * (C + C.T), C @ (np.linalg.solve(marginal_cov, marginal_mean) - h)


def site_log_normaliser(C, mean, P, h):
    """``log ∫ N(g; m, C) exp(-½ gᵀ P g + hᵀ g) dg`` by completing the square."""
    C_inv = np.linalg.inv(C)
    precision = C_inv + P
    eta = C_inv @ mean + h
    return float(-0.5 * np.linalg.slogdet(C)[1] - 0.5 * np.linalg.slogdet(precision)[1]
                 - 0.5 * mean @ C_inv @ mean + 0.5 * eta @ np.linalg.solve(precision, eta))


def fitc_gradient_term(marginal_mean, C, P, h):
    """``(a, c)``: ``a = h - P μ`` (= ∂ log Ẑ/∂m) and ``c = ∂ log Ẑ/∂δ = ½ (|a|² - tr(C⁻¹ - C⁻¹ Σ̂ C⁻¹))``
    with the tilted (= marginal) covariance ``Σ̂ = (C⁻¹ + P)⁻¹``."""
    a = h - P @ marginal_mean
    C_inv = np.linalg.inv(C)
    tilted = np.linalg.inv(C_inv + P)
    return a, 0.5 * (a @ a - np.trace(C_inv - C_inv @ tilted @ C_inv))


def posterior(Vt, Ps, hs):
    """``(A, mean_w)`` with ``A = I + Σ_i kron(P_i, b_i b_iᵀ)`` and ``mean_w = A⁻¹ Σ_i kron(h_i, b_i)``
    (class-major: entry ``j m + k`` is class j, inducing value k)."""
    n, m = Vt.shape
    c = Ps[0].shape[0]
    A = np.eye(c * m)
    natural = np.zeros(c * m)
    for b, P, h in zip(Vt, Ps, hs):
        A += np.kron(P, np.outer(b, b))
        natural += np.kron(h, b)
    return A, np.linalg.solve(A, natural)


def marginal(A, mean_w, b, n_classes):
    """``(μ, S)`` of ``g = kron(I_c, bᵀ) v`` under ``N(mean_w, A⁻¹)``."""
    B = np.kron(np.eye(n_classes), b[None, :])
    return B @ mean_w, B @ np.linalg.solve(A, B.T)
