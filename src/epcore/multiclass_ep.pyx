# cython: language_level=3
"""Nested EP for the multinomial probit likelihood: the site kernel of multiclass GP EP.

Riihimäki, Jylänki & Vehtari, "Nested expectation propagation for Gaussian process
classification with a multinomial probit likelihood" (JMLR 14, 2013), §3.

Likelihood of class ``k`` for the c latent values ``f`` at one input:

    p(y = k | f) = ∫ N(u; 0, 1) Π_{j≠k} Φ(u + f_k - f_j) du,

i.e. a product of c - 1 probit factors ``Φ(w_jᵀ z)`` of the augmented vector ``z = (f, u)``,
``w_j = e_k - e_j + e_u``, under the prior ``N(u; 0, 1)``. The tilted distribution of an outer
EP site, ``N(f; cavity) p(y | f)``, is approximated by an *inner* EP over those factors in the
c + 1 dimensions of z: each factor gets a 1-D Gaussian site ``exp(-α̃_j x²/2 + β̃_j x)`` in
``x = w_jᵀ z`` (the probit site of :mod:`fastep._epcore.sites`, slope 1, y = +1), updated by
rank-1 steps of the (c+1)×(c+1) inner posterior. Integrating u out of the inner sites gives the
outer site on f (eqs 13-15 of the paper):

    T̃ = D - D 1 1ᵀ D / (1ᵀ D 1),   D = diag(π),   π_j = α̃_j (j ≠ k),  π_k = 1,
    ν̃ = π (Σ_j β̃_j) / (1ᵀ π) - β̃           (β̃_k = 0),

so the outer site is determined by the 2(c - 1) inner site parameters, which persist between
outer iterations: every outer update runs ``n_inner_sweeps`` inner sweeps warm-started from
them (the paper's nested scheme; one sweep suffices for convergence of the outer iteration).

The tilted normaliser is the inner EP's evidence,

    log Ẑ = log ∫ N(z; z₀, Q₀) Π_j t̃_j(w_jᵀ z) dz
            + Σ_j [log Ẑ_j + Ψ(1/v_j - α̃_j, m_j/v_j - β̃_j) - Ψ(1/v_j, m_j/v_j)],

``Q₀ = blkdiag(cavity covariance, 1)``, ``(m_j, v_j)`` the inner marginal of x_j,
``Ψ(τ, ν) = ½ log 2π - ½ log τ + ν²/(2τ)``. For c = 2 the inner EP is exact (one probit factor).

Python API: ``nested_site_updates`` (one outer parallel iteration's site kernel over all sites),
``nested_log_probabilities`` (class probabilities of Gaussian latent predictives by inner EP
run to convergence). The plain-numpy twin is :mod:`fastep.reference.multiclass_ep`.
"""
import numpy as np

from libc.math cimport sqrt, log, fabs, isfinite
from libc.stdlib cimport malloc, free
from fastep._epcore._blas cimport potrf, potri, symmetrize, UPPER, LOWER, NO_TRANS, TRANS, LEFT, RIGHT
from fastep._epcore.sites cimport SiteModel, site_moments, SITE_OK, LIK_PROBIT

cdef double _LOG_2PI = 1.8378770664093454836

cdef enum NestedStatus:
    NESTED_OK = 0
    NESTED_IMPROPER_CAVITY = 1      # the cavity precision is not positive definite (site unchanged)
    NESTED_FAILED = 2               # the inner EP failed (site unchanged)

globals().update(NESTED_OK=int(NESTED_OK), NESTED_IMPROPER_CAVITY=int(NESTED_IMPROPER_CAVITY),
                 NESTED_FAILED=int(NESTED_FAILED))


cdef int _inner_posterior(int c, int label, const double* cav_prec, const double* cav_lin,
                          const double* alpha_s, const double* beta_s, double* cov, double* mean,
                          double* lin, double* log_det_cov) noexcept nogil:
    """Inner posterior ``N(z; mean, cov)`` of the inner sites: precision blkdiag(Λ, 1) + Σ α̃_j w_j w_jᵀ.

    ``lin`` receives the precision-times-mean vector. Returns 0 or potrf's info.
    """
    cdef int dim = c + 1, u = c, i, j, info
    cdef double a, s
    for i in range(dim):
        for j in range(dim):
            cov[i * dim + j] = 0.0
    for i in range(c):
        for j in range(c):
            cov[i * dim + j] = cav_prec[i * c + j]
        lin[i] = cav_lin[i]
    cov[u * dim + u] = 1.0
    lin[u] = 0.0
    for j in range(c):
        if j == label:
            continue
        a = alpha_s[j]
        cov[label * dim + label] += a
        cov[j * dim + j] += a
        cov[u * dim + u] += a
        cov[label * dim + j] -= a
        cov[j * dim + label] -= a
        cov[label * dim + u] += a
        cov[u * dim + label] += a
        cov[j * dim + u] -= a
        cov[u * dim + j] -= a
        lin[label] += beta_s[j]
        lin[j] -= beta_s[j]
        lin[u] += beta_s[j]
    info = potrf(LOWER, dim, cov, dim)
    if info != 0:
        return info
    log_det_cov[0] = 0.0
    for i in range(dim):
        log_det_cov[0] -= 2.0 * log(cov[i * dim + i])
    info = potri(LOWER, dim, cov, dim)
    if info != 0:
        return info
    symmetrize(LOWER, dim, cov, dim)
    for i in range(dim):
        s = 0.0
        for j in range(dim):
            s += cov[i * dim + j] * lin[j]
        mean[i] = s
    return 0


cdef inline void _projection(int dim, int label, int j, const double* cov, const double* mean,
                             double* v, double* m) noexcept nogil:
    """``v = w_jᵀ cov w_j`` and ``m = w_jᵀ mean`` for ``w_j = e_label - e_j + e_u``."""
    cdef int u = dim - 1
    v[0] = (cov[label * dim + label] + cov[j * dim + j] + cov[u * dim + u]
            - 2.0 * cov[label * dim + j] + 2.0 * cov[label * dim + u] - 2.0 * cov[j * dim + u])
    m[0] = mean[label] - mean[j] + mean[u]


cdef int nested_site(int c, int label, const double* cav_prec, const double* cav_lin,
                     double* alpha_s, double* beta_s, int max_sweeps, double tol, double damping,
                     double* log_z, double* work) noexcept nogil:
    """Inner EP for one outer site (module docstring), from the stored inner sites.

    ``cav_prec`` (c×c) and ``cav_lin`` (c) are the cavity's natural parameters; ``alpha_s``,
    ``beta_s`` (c; entry ``label`` unused, kept 0) the inner sites, updated in place (damped by
    ``damping``) over at most ``max_sweeps`` sweeps, stopping early once the largest change of a
    sweep is below ``tol``. ``log_z`` receives the inner evidence at the final sites. ``work``
    holds 3 (c+1)² + 4 (c+1) + c² doubles. Returns a NESTED_* status.
    """
    cdef int dim = c + 1, i, j, l, sweep
    cdef double* cov = work
    cdef double* mean = work + dim * dim
    cdef double* lin = mean + dim
    cdef double* col = lin + dim
    cdef double* chol = col + dim                 # c×c
    cdef double log_det_cov = 0.0, log_det_prec_c = 0.0, quad_c = 0.0
    cdef double v, m, tau_c, nu_c, v_c, m_c, lz, a, b, one_minus, tau_t, nu_t, tau_new, nu_new
    cdef double d_tau, d_nu, denom, coef, shift, change, max_change, total
    cdef double probit_params[2]
    cdef SiteModel probit
    probit_params[0] = 1.0
    probit_params[1] = 0.0
    probit.code = LIK_PROBIT
    probit.params = probit_params
    probit.n_params = 2
    probit.gh_nodes = NULL
    probit.gh_log_weights = NULL
    probit.n_nodes = 0
    # the cavity must be proper: Cholesky of Λ, and log|Λ|, ηᵀΛ⁻¹η for the evidence
    for i in range(c * c):
        chol[i] = cav_prec[i]
    if potrf(LOWER, c, chol, c) != 0:
        return NESTED_IMPROPER_CAVITY
    for i in range(c):
        log_det_prec_c += 2.0 * log(chol[i * c + i])
    for i in range(c):                            # forward solve L x = η into col
        total = cav_lin[i]
        for j in range(i):
            total -= chol[i * c + j] * col[j]
        col[i] = total / chol[i * c + i]
    for i in range(c):
        quad_c += col[i] * col[i]
    if _inner_posterior(c, label, cav_prec, cav_lin, alpha_s, beta_s, cov, mean, lin, &log_det_cov) != 0:
        return NESTED_FAILED
    for sweep in range(max_sweeps):
        max_change = 0.0
        for j in range(c):
            if j == label:
                continue
            _projection(dim, label, j, cov, mean, &v, &m)
            tau_c = 1.0 / v - alpha_s[j]
            if not (tau_c > 0.0 and isfinite(tau_c)):
                return NESTED_FAILED
            v_c = 1.0 / tau_c
            m_c = v_c * (m / v - beta_s[j])
            if site_moments(&probit, 1.0, m_c, v_c, &lz, &a, &b) != SITE_OK:
                return NESTED_FAILED
            one_minus = 1.0 - v_c * b
            if not one_minus > 0.0:
                return NESTED_FAILED
            tau_t = b / one_minus
            nu_t = (a + b * m_c) / one_minus
            tau_new = alpha_s[j] + damping * (tau_t - alpha_s[j])
            nu_new = beta_s[j] + damping * (nu_t - beta_s[j])
            d_tau = tau_new - alpha_s[j]
            d_nu = nu_new - beta_s[j]
            change = fabs(d_tau) / (fabs(alpha_s[j]) if fabs(alpha_s[j]) > 1.0 else 1.0)
            if change > max_change:
                max_change = change
            change = fabs(d_nu) / (fabs(beta_s[j]) if fabs(beta_s[j]) > 1.0 else 1.0)
            if change > max_change:
                max_change = change
            alpha_s[j] = tau_new
            beta_s[j] = nu_new
            # rank-1 update of the inner posterior along w_j
            denom = 1.0 + d_tau * v
            for i in range(dim):
                col[i] = cov[i * dim + label] - cov[i * dim + j] + cov[i * dim + c]
            coef = d_tau / denom
            shift = (d_nu - d_tau * m) / denom
            for i in range(dim):
                mean[i] += shift * col[i]
                for l in range(dim):
                    cov[i * dim + l] -= coef * col[i] * col[l]
        if max_change < tol:
            break
    # evidence from a fresh posterior of the final inner sites
    if _inner_posterior(c, label, cav_prec, cav_lin, alpha_s, beta_s, cov, mean, lin, &log_det_cov) != 0:
        return NESTED_FAILED
    total = 0.5 * log_det_cov + 0.5 * log_det_prec_c - 0.5 * quad_c
    for i in range(dim):
        total += 0.5 * mean[i] * lin[i]
    for j in range(c):
        if j == label:
            continue
        _projection(dim, label, j, cov, mean, &v, &m)
        tau_c = 1.0 / v - alpha_s[j]
        nu_c = m / v - beta_s[j]
        if not tau_c > 0.0:
            return NESTED_FAILED
        if site_moments(&probit, 1.0, nu_c / tau_c, 1.0 / tau_c, &lz, &a, &b) != SITE_OK:
            return NESTED_FAILED
        total += lz - 0.5 * log(tau_c * v) + 0.5 * nu_c * nu_c / tau_c - 0.5 * m * m / v
    log_z[0] = total
    if not isfinite(total):
        return NESTED_FAILED
    return NESTED_OK


def _check_shapes(labels, cavity_precision, cavity_natural_mean, inner_precision, inner_natural_mean):
    n, c = cavity_natural_mean.shape
    if c < 2:
        raise ValueError(f"the multinomial probit needs >= 2 classes, got {c}")
    if cavity_precision.shape != (n, c, c):
        raise ValueError(f"cavity_precision must have shape {(n, c, c)}, got {cavity_precision.shape}")
    for name, arr in (("inner_precision", inner_precision), ("inner_natural_mean", inner_natural_mean)):
        if arr.shape != (n, c):
            raise ValueError(f"{name} must have shape {(n, c)}, got {arr.shape}")
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape {(n,)}, got {labels.shape}")
    if np.any((labels < 0) | (labels >= c)):
        raise ValueError(f"labels must be in 0..{c - 1}")
    return n, c


def nested_site_updates(const int[::1] labels, const double[:, :, ::1] cavity_precision,
                        const double[:, ::1] cavity_natural_mean, double[:, ::1] inner_precision,
                        double[:, ::1] inner_natural_mean, *, int n_inner_sweeps=1, double damping=1.0,
                        double tol=0.0):
    """Inner EP at every site from its cavity (module docstring); the GIL is released.

    Parameters
    ----------
    labels : int32 ndarray (n,)
        Class of every site, 0..c-1.
    cavity_precision : ndarray (n, c, c)
        Cavity precision matrices (must be positive definite where the site is updated).
    cavity_natural_mean : ndarray (n, c)
        Cavity precision-times-mean vectors.
    inner_precision, inner_natural_mean : ndarray (n, c)
        The inner sites ``α̃``, ``β̃`` (column ``labels[i]`` unused, 0), updated in place.
    n_inner_sweeps : int >= 0
        Inner sweeps per site (at most, with ``tol`` > 0); 0 only evaluates ``log Ẑ`` at the
        given inner sites.
    damping : float in (0, 1]
        Fraction of every inner site change applied.
    tol : float >= 0
        Stop a site's inner sweeps once the largest relative change of a sweep is below it.

    Returns
    -------
    log_z : ndarray (n,)
        The tilted normalisers (NaN where the site failed).
    status : int32 ndarray (n,)
        NESTED_OK, NESTED_IMPROPER_CAVITY (sites left unchanged) or NESTED_FAILED.
    """
    n, c = _check_shapes(np.asarray(labels), np.asarray(cavity_precision), np.asarray(cavity_natural_mean),
                         np.asarray(inner_precision), np.asarray(inner_natural_mean))
    if n_inner_sweeps < 0 or not (0.0 < damping <= 1.0) or not tol >= 0:
        raise ValueError("n_inner_sweeps must be >= 0, damping in (0, 1] and tol >= 0")
    log_z = np.full(n, np.nan)
    status = np.zeros(n, dtype=np.int32)
    if n == 0:
        return log_z, status
    cdef double[::1] lz = log_z
    cdef int[::1] st = status
    cdef int i, j, nn = n, cc = c, dim = c + 1
    cdef double* work = <double*>malloc((3 * dim * dim + 4 * dim + cc * cc + 2 * cc) * sizeof(double))
    cdef double* saved_alpha
    cdef double* saved_beta
    if work == NULL:
        raise MemoryError()
    saved_alpha = work + 3 * dim * dim + 4 * dim + cc * cc
    saved_beta = saved_alpha + cc
    try:
        with nogil:
            for i in range(nn):
                for j in range(cc):
                    saved_alpha[j] = inner_precision[i, j]
                    saved_beta[j] = inner_natural_mean[i, j]
                st[i] = nested_site(cc, labels[i], &cavity_precision[i, 0, 0], &cavity_natural_mean[i, 0],
                                    &inner_precision[i, 0], &inner_natural_mean[i, 0], n_inner_sweeps, tol,
                                    damping, &lz[i], work)
                if st[i] != NESTED_OK:           # a failed site keeps its inner sites
                    for j in range(cc):
                        inner_precision[i, j] = saved_alpha[j]
                        inner_natural_mean[i, j] = saved_beta[j]
    finally:
        free(work)
    log_z[status != int(NESTED_OK)] = np.nan
    return log_z, status


def nested_log_probabilities(const double[:, ::1] mean, const double[:, :, ::1] cov, *,
                             int max_sweeps=50, double tol=1e-8):
    """``log p(y = k)`` for latent ``f ~ N(mean_i, cov_i)`` and every class k, by inner EP.

    ``p(y = k) = ∫ N(f; mean, cov) p(y = k | f) df`` is the inner EP evidence from zero inner
    sites, run to ``tol`` (at most ``max_sweeps`` sweeps); the returned log probabilities are
    not normalised (their exponentials sum to 1 up to the EP approximation; exactly for c = 2).

    Returns
    -------
    ndarray (n, c)
        NaN where a covariance is not positive definite or the inner EP failed.
    """
    mean_arr = np.asarray(mean)
    cov_arr = np.asarray(cov)
    n, c = mean_arr.shape
    if cov_arr.shape != (n, c, c):
        raise ValueError(f"cov must have shape {(n, c, c)}, got {cov_arr.shape}")
    precision = np.empty_like(cov_arr)
    natural = np.empty_like(mean_arr)
    ok = np.ones(n, dtype=bool)
    for i in range(n):
        try:
            chol = np.linalg.cholesky(cov_arr[i])
        except np.linalg.LinAlgError:
            ok[i] = False
            precision[i] = np.eye(c)
            natural[i] = 0.0
            continue
        inv_chol = np.linalg.inv(chol)
        precision[i] = inv_chol.T @ inv_chol
        natural[i] = precision[i] @ mean_arr[i]
    out = np.empty((n, c))
    alpha = np.zeros((n, c))
    beta = np.zeros((n, c))
    for k in range(c):
        alpha[:] = 0.0
        beta[:] = 0.0
        log_z, status = nested_site_updates(np.full(n, k, dtype=np.int32), precision, natural, alpha, beta,
                                            n_inner_sweeps=max_sweeps, damping=1.0, tol=tol)
        out[:, k] = log_z
    out[~ok] = np.nan
    return out
