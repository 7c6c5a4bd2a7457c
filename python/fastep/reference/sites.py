"""Reference (plain numpy/scipy) site moments for every likelihood.

Each function returns ``(log_z, alpha, beta)`` with the semantics of the
compiled kernels in ``fastep._epcore.sites``: for the cavity ``N(f; mu, s2)``
and likelihood ``t(f)``,

    log_z = log ∫ t(f) N(f; mu, s2) df,  alpha = d log Z/d mu,  beta = -d² log Z/d mu²

(Minka eqs 17-19; IVM eqs 14-16 with g = alpha, nu = beta). The formulas are
the textbook ones, evaluated naively: they are accurate in the moderate regime
(roughly ``|z| < 30``) and may lose precision, overflow or cancel in the tails,
which the compiled kernels handle. Inputs broadcast as numpy arrays.
"""
import numpy as np
from scipy.special import expit, log_ndtr, logsumexp, ndtr

__all__ = [
    "gauss_hermite_rule",
    "gaussian_moments",
    "logistic_gh_moments",
    "logistic_mackay_moments",
    "ordinal_moments",
    "probit_moments",
    "step_moments",
    "student_t_log_density",
    "student_t_moments",
]

_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


def _log_npdf(z):
    return -0.5 * z * z - _LOG_SQRT_2PI


def probit_moments(y, mu, s2, slope=1.0, bias=0.0):
    """t(f) = Phi(slope * y * (f + bias)), y in {-1, +1} (IVM eqs 19-21, Minka eqs 57-60).

    u = y (mu + bias) c with c = 1/sqrt(slope⁻² + s2); Z = Phi(u);
    alpha = y c N(u)/Phi(u); beta = c² r (r + u) with r = N(u)/Phi(u).
    """
    y, mu, s2 = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (y, mu, s2)))
    c = 1.0 / np.sqrt(1.0 / slope**2 + s2)
    u = y * (mu + bias) * c
    log_z = log_ndtr(u)
    ratio = np.exp(_log_npdf(u) - log_z)
    alpha = y * c * ratio
    beta = c * c * ratio * (ratio + u)
    return log_z, alpha, beta


def step_moments(y, mu, s2, flip_noise=0.0):
    """t(f) = eps + (1 - 2 eps) Theta(y f) (Minka eqs 50-55).

    z = y mu / sqrt(s2); Z = eps + (1 - 2eps) Phi(z);
    alpha = y (1 - 2eps) N(z) / (Z sqrt(s2)); beta = alpha (alpha + mu/s2).
    """
    y, mu, s2 = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (y, mu, s2)))
    eps = flip_noise
    sd = np.sqrt(s2)
    z = y * mu / sd
    z_mass = eps + (1.0 - 2.0 * eps) * ndtr(z)
    log_z = np.log(z_mass)
    alpha = y * (1.0 - 2.0 * eps) * np.exp(_log_npdf(z)) / (z_mass * sd)
    beta = alpha * (alpha + mu / s2)
    return log_z, alpha, beta


def logistic_mackay_moments(y, mu, s2):
    """MacKay's probit-style approximation to the logistic site (Minka eqs 62-64).

    kappa = 1/sqrt(1 + pi s2/8), z = y kappa mu; log Z = log sigma(z);
    alpha = y kappa sigma(-z); beta = -d² log Z/d mu² = kappa² sigma(z) sigma(-z)
    (the exact derivative of this log Z, not Minka's eq 65).
    """
    y, mu, s2 = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (y, mu, s2)))
    kappa = 1.0 / np.sqrt(1.0 + np.pi * s2 / 8.0)
    z = y * kappa * mu
    log_z = -np.logaddexp(0.0, -z)
    alpha = y * kappa * expit(-z)
    beta = kappa**2 * expit(z) * expit(-z)
    return log_z, alpha, beta


def gauss_hermite_rule(n_nodes):
    """Physicists' Gauss-Hermite nodes t_k and log(w_k/sqrt(pi)) (weights sum to 1)."""
    nodes, weights = np.polynomial.hermite.hermgauss(n_nodes)
    return nodes, np.log(weights) - 0.5 * np.log(np.pi)


def logistic_gh_moments(y, mu, s2, n_nodes=32):
    """Logistic site by Gauss-Hermite quadrature (Minka eq 66), derivatives of the estimate.

    Z ≈ sum_k w_k sigma(y f_k), f_k = mu + sqrt(2 s2) t_k. Differentiating in mu
    (nodes move with mu): alpha = y E_p[s], beta = E_p[s (1 - s)] - Var_p[s]
    with p_k ∝ w_k sigma(y f_k) and s_k = sigma(-y f_k).
    """
    y, mu, s2 = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (y, mu, s2)))
    nodes, log_weights = gauss_hermite_rule(n_nodes)
    f = y[..., None] * (mu[..., None] + np.sqrt(2.0 * s2)[..., None] * nodes)
    log_terms = log_weights - np.logaddexp(0.0, -f)
    log_z = logsumexp(log_terms, axis=-1)
    p = np.exp(log_terms - log_z[..., None])
    s = expit(-f)
    mean_s = np.sum(p * s, axis=-1)
    var_s = np.sum(p * (s - mean_s[..., None]) ** 2, axis=-1)
    alpha = y * mean_s
    beta = np.sum(p * s * (1.0 - s), axis=-1) - var_s
    return log_z, alpha, beta


def gaussian_moments(y, mu, s2, noise_variance=1.0):
    """Z = N(y; mu, s2 + noise_variance) (IVM eqs 17-18)."""
    y, mu, s2 = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (y, mu, s2)))
    v = s2 + noise_variance
    log_z = -0.5 * np.log(2.0 * np.pi * v) - 0.5 * (y - mu) ** 2 / v
    alpha = (y - mu) / v
    beta = 1.0 / v
    return log_z, alpha, beta


def ordinal_thresholds(bias, widths):
    """theta_0 = bias, theta_k = bias + w_1 + ... + w_k (k = 0..C-2)."""
    return bias + np.concatenate([[0.0], np.cumsum(np.asarray(widths, dtype=float))])


def ordinal_moments(y, mu, s2, slope=1.0, bias=0.0, widths=()):
    """Ordered categorical site (IVM §2.4 eqs 24-25, consistent threshold model).

    p(y=k | f) = Phi(slope (theta_k - f)) - Phi(slope (theta_{k-1} - f)),
    theta_{-1} = -inf, theta_{C-1} = +inf. With c = 1/sqrt(slope⁻² + s2),
    u = c (theta_k - mu), u' = c (theta_{k-1} - mu): Z = Phi(u) - Phi(u'),
    alpha = -c (N(u) - N(u')) / Z, beta = alpha² + c² (u N(u) - u' N(u')) / Z.
    """
    y, mu, s2 = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (y, mu, s2)))
    k = y.astype(int)
    theta = np.concatenate([[-np.inf], ordinal_thresholds(bias, widths), [np.inf]])
    c = 1.0 / np.sqrt(1.0 / slope**2 + s2)
    upper = c * (theta[k + 1] - mu)
    lower = c * (theta[k] - mu)
    # Phi(u) - Phi(u'), written as Phi(-u') - Phi(-u) when both are positive.
    upper_tail = lower > 0
    z_mass = np.where(upper_tail, ndtr(-lower) - ndtr(-upper), ndtr(upper) - ndtr(lower))
    pdf_upper = np.exp(_log_npdf(upper))
    pdf_lower = np.exp(_log_npdf(lower))
    # u N(u) -> 0 at an infinite end.
    upper_term = np.zeros_like(upper)
    finite = np.isfinite(upper)
    upper_term[finite] = upper[finite] * pdf_upper[finite]
    lower_term = np.zeros_like(lower)
    finite = np.isfinite(lower)
    lower_term[finite] = lower[finite] * pdf_lower[finite]
    alpha = -c * (pdf_upper - pdf_lower) / z_mass
    beta = alpha**2 + c * c * (upper_term - lower_term) / z_mass
    return np.log(z_mass), alpha, beta


def student_t_log_density(y, f, dof, scale):
    """log t(y | f) = log Γ((ν+1)/2) - log Γ(ν/2) - ½ log(νπ) - log σ - (ν+1)/2 log(1 + (y-f)²/(νσ²))."""
    from scipy.special import gammaln
    u = (np.asarray(y, dtype=float) - np.asarray(f, dtype=float)) ** 2 / (dof * scale * scale)
    return (gammaln(0.5 * (dof + 1.0)) - gammaln(0.5 * dof) - 0.5 * np.log(dof * np.pi) - np.log(scale)
            - 0.5 * (dof + 1.0) * np.log1p(u))


def student_t_moments(y, mu, s2, dof=4.0, scale=1.0, power=1.0):
    """Powered Student-t site ``∫ t(y | f)^power N(f; mu, s2) df`` by adaptive quadrature.

    Returns ``(log_z, alpha, beta, d_log_dof, d_log_scale)`` as the compiled kernel: the tilted
    mean and variance come from ``scipy.integrate.quad`` over ``mu ± 40 sd`` with break points
    at ``y``, ``mu`` and the maxima of the tilted density (the roots of its derivative, a cubic,
    from ``numpy.roots``); the ν and σ derivatives are tilted expectations of
    ``power * ∂ log t/∂ log ν`` and ``power * ∂ log t/∂ log σ``. ``s2 = 0`` gives the pointwise
    values. Written for clarity (three quad calls per expectation, one site at a time).
    """
    from scipy.integrate import quad
    from scipy.special import digamma
    y, mu, s2 = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (y, mu, s2)))
    out = np.empty((5,) + y.shape)
    c = dof * scale * scale

    def dlog_dof(x):
        u = x * x / c
        return dof * (0.5 * (digamma(0.5 * (dof + 1.0)) - digamma(0.5 * dof)) - 0.5 / dof
                      - 0.5 * np.log1p(u) + 0.5 * (dof + 1.0) / dof * u / (1.0 + u))

    def dlog_scale(x):
        u = x * x / c
        return -1.0 + (dof + 1.0) * u / (1.0 + u)

    for idx in np.ndindex(y.shape):
        yi, mi, vi = float(y[idx]), float(mu[idx]), float(s2[idx])
        d = mi - yi
        if vi == 0.0:
            a = 0.5 * power * (dof + 1.0)
            out[(0,) + idx] = power * student_t_log_density(yi, mi, dof, scale)
            out[(1,) + idx] = -2.0 * a * d / (c + d * d)
            out[(2,) + idx] = 2.0 * a * (c - d * d) / (c + d * d) ** 2
            out[(3,) + idx] = power * dlog_dof(d)
            out[(4,) + idx] = power * dlog_scale(d)
            continue
        # tilted log density in the residual x = f - y, up to a constant
        def log_tilted(x):
            return power * student_t_log_density(0.0, x, dof, scale) - 0.5 * (x - d) ** 2 / vi
        a = 0.5 * power * (dof + 1.0)
        roots = np.roots([1.0, -d, c + 2.0 * a * vi, -d * c])
        candidates = [0.0, d] + [float(r.real) for r in roots if abs(r.imag) < 1e-9 * (1 + abs(r))]
        peak = max(candidates, key=log_tilted)
        top = log_tilted(peak)
        sd = np.sqrt(vi)
        lo, hi = min(candidates) - 40 * sd, max(candidates) + 40 * sd
        # break points around every candidate on the scales of the cavity and of the likelihood's
        # peak, so that QUADPACK's first subintervals resolve narrow peaks (it accepts a
        # subinterval whose 21 nodes all miss a peak); ones ~1e-8 sd apart make it fail
        peak_width = min(sd, np.sqrt(c / (1.0 + 2.0 * a)))
        raw = [x + k * w for x in candidates for w in (sd, peak_width) for k in (-10, -3, -1, 0, 1, 3, 10)]
        points = []
        for point in sorted(p for p in raw if lo < p < hi):
            if not points or point - points[-1] > 1e-3 * peak_width:
                points.append(point)

        def integral(g):
            return quad(lambda x: g(x) * np.exp(log_tilted(x) - top), lo, hi, points=points,
                        limit=500, epsabs=0.0, epsrel=1e-13)[0]

        z = integral(lambda x: 1.0)
        mean = integral(lambda x: x - peak) / z
        second = integral(lambda x: (x - peak) ** 2) / z
        var = second - mean * mean
        out[(0,) + idx] = np.log(z) + top - 0.5 * np.log(2 * np.pi * vi)
        out[(1,) + idx] = (peak + mean - d) / vi
        out[(2,) + idx] = (vi - var) / vi ** 2
        out[(3,) + idx] = power * integral(dlog_dof) / z
        out[(4,) + idx] = power * integral(dlog_scale) / z
    return tuple(out)
