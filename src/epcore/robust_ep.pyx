# cython: language_level=3
"""Dense GP EP with Student-t sites: fractional (power) EP that allows negative site precisions.

Robust regression (Jylänki, Vanhatalo & Vehtari, "Robust Gaussian process regression with a
Student-t likelihood", JMLR 2011, §§3-4). The Student-t likelihood is not log-concave, so EP
sites get negative precisions: the dense engine of :mod:`fastep._epcore.gp_ep` (``B = I +
S^½ K S^½``, τ >= 0) cannot hold them. This engine keeps the posterior as

    Σ = (K⁻¹ + T)⁻¹ = L_K A⁻¹ L_Kᵀ,   A = I + L_Kᵀ T L_K = R Rᵀ,   μ = Σ ν,

``K = L_K L_Kᵀ`` (``K`` must be positive definite: add jitter), ``T = diag(τ)`` of any sign.
``A`` is positive definite exactly when the posterior is proper, so its Cholesky factorisation
is the check. With ``X = R⁻¹ L_Kᵀ``: ``Σ = XᵀX``, ``Σ_ii`` = squared column norms of X,
``μ = Xᵀ(Xν)``, ``log|I + KT| = 2 Σ log R_ii``. One factorisation costs about 7n³/3 flops:
``A`` by two ``syrk`` over the rows of ``L_K`` scaled by ``sqrt|τ_i|`` (positive and negative
parts), ``potrf``, and one ``trsm`` for X.

Fractional EP (the paper's eqs 11-13; Minka's power EP with α = η)
------------------------------------------------------------------
Site ``i`` is updated from the cavity that removes only the fraction η of its site,
``τ₋ = 1/Σ_ii - η τ_i``, ``ν₋ = μ_i/Σ_ii - η ν_i``; the tilted distribution is
``N(f; ν₋/τ₋, 1/τ₋) t(y_i | f)^η`` (moments: ``sites.student_t_moments``) and the new site
satisfies ``q_new ∝ cavity · site_new^η``:

    τ*_i = β / (η (1 - β/τ₋)),     ν*_i = (α + β ν₋/τ₋) / (η (1 - β/τ₋)).

Parallel schedule with damping: every iteration computes all targets from one posterior, then
``τ ← τ + δ (τ* - τ)`` (likewise ν) with ``δ = damping``; if the new posterior is improper
(``potrf`` fails) or a new cavity precision is not positive, δ is halved and the step retried
(up to ``max_halvings`` times; the paper's safeguard). Sites whose cavity is improper keep
their values and are counted as failed.

Evidence (the fractional EP energy, the paper's eq 14)
------------------------------------------------------
    log Z = -½ log|I + KT| + ½ νᵀΣν
            + Σ_i (1/η) [log Ẑ_i - ½ log(1 - η τ_i Σ_ii)
                         + ½ (η² ν_i² - 2 η ν_i μ_i/Σ_ii + η τ_i μ_i²/Σ_ii) / τ₋_i],

``Ẑ_i`` the tilted normaliser of the powered site. For η = 1 this is the usual EP evidence
(Minka eq 88); for Gaussian sites it is exact for every η.

Convergence: as the other engines, the largest relative site change of an iteration and the
relative change of log Z below ``tol`` with no failed site.
"""
import numpy as np

from cpython.exc cimport PyErr_CheckSignals
from libc.math cimport sqrt, log, log1p, fabs, isfinite
from fastep._epcore._blas cimport syrk, potrf, trsm, gemv, gemv_t, symmetrize
from fastep._epcore.sites cimport student_t_moments, student_t_log_norm, SITE_OK
from fastep._epcore._common cimport max_relative_site_change

cdef double _LOG_2PI = 1.8378770664093454836


cdef int robust_factor(const double* K_chol, int n, const double* site_precision,
                       const double* site_natural_mean, double* a_work, double* x_work, double* tmp,
                       double* post_mean, double* post_var, double* log_det, double* quad) noexcept nogil:
    """The posterior of the sites (module docstring): ``Σ_ii``, ``μ``, ``log|A|`` and ``νᵀΣν``.

    ``a_work`` receives R (lower, row-major), ``x_work`` the matrix X = R⁻¹ L_Kᵀ, ``tmp`` X ν.
    Returns 0, or the failing ``potrf``'s info (> 0: the posterior is not proper).
    """
    cdef int i, j, k_pos = 0, k_neg = 0, info
    cdef double s
    # rows sqrt(τ_i) L_K[i, :] for τ_i > 0 from the top of x_work, sqrt(-τ_i) L_K[i, :] from the bottom
    for i in range(n):
        if site_precision[i] > 0.0:
            s = sqrt(site_precision[i])
            for j in range(n):
                x_work[k_pos * n + j] = s * K_chol[i * n + j] if j <= i else 0.0
            k_pos += 1
        elif site_precision[i] < 0.0:
            k_neg += 1
            s = sqrt(-site_precision[i])
            for j in range(n):
                x_work[(n - k_neg) * n + j] = s * K_chol[i * n + j] if j <= i else 0.0
    for i in range(n):
        for j in range(i + 1):
            a_work[i * n + j] = 1.0 if i == j else 0.0
    if k_pos:
        syrk(True, n, k_pos, 1.0, x_work, n, 1.0, a_work, n)
    if k_neg:
        syrk(True, n, k_neg, -1.0, &x_work[(n - k_neg) * n], n, 1.0, a_work, n)
    info = potrf(True, n, a_work, n)
    if info != 0:
        return info
    log_det[0] = 0.0
    for i in range(n):
        log_det[0] += 2.0 * log(a_work[i * n + i])
    # X = R⁻¹ L_Kᵀ
    for i in range(n):
        for j in range(n):
            x_work[i * n + j] = K_chol[j * n + i] if i <= j else 0.0
    trsm(True, False, n, n, 1.0, a_work, n, x_work, n)
    for j in range(n):
        post_var[j] = 0.0
    for i in range(n):
        for j in range(n):
            post_var[j] += x_work[i * n + j] * x_work[i * n + j]
    gemv(n, n, 1.0, x_work, n, site_natural_mean, 0.0, tmp)
    gemv_t(n, n, 1.0, x_work, n, tmp, 0.0, post_mean)
    quad[0] = 0.0
    for i in range(n):
        quad[0] += tmp[i] * tmp[i]
    return 0


cdef int robust_targets(const double* y, int n, double dof, double scale, double power,
                        const double* site_precision, const double* site_natural_mean,
                        const double* post_mean, const double* post_var,
                        double* cavity_mean, double* cavity_var, double* site_log_z,
                        double* target_precision, double* target_natural_mean,
                        double* sum_terms) noexcept nogil:
    """Cavities, powered tilted moments and target sites of every site; returns the number failed.

    ``sum_terms`` receives Σ_i (1/η)[log Ẑ_i + the cavity/marginal terms] of the evidence over
    the sites with a proper cavity. A failed site (improper cavity, failing quadrature) keeps its
    values as its target and gets NaN cavity moments.
    """
    cdef int i, n_failed = 0, status
    cdef double log_norm = student_t_log_norm(dof, scale)
    cdef double tau_c, nu_c, v_c, m_c, log_z, alpha, beta, e1, e2, one_minus, ratio
    sum_terms[0] = 0.0
    for i in range(n):
        tau_c = 1.0 / post_var[i] - power * site_precision[i]
        nu_c = post_mean[i] / post_var[i] - power * site_natural_mean[i]
        target_precision[i] = site_precision[i]
        target_natural_mean[i] = site_natural_mean[i]
        if not (tau_c > 0.0 and isfinite(tau_c) and isfinite(nu_c)):
            cavity_mean[i] = 0.0
            cavity_var[i] = -1.0
            site_log_z[i] = 0.0
            n_failed += 1
            continue
        v_c = 1.0 / tau_c
        m_c = nu_c * v_c
        cavity_mean[i] = m_c
        cavity_var[i] = v_c
        status = student_t_moments(dof, scale, power, log_norm, y[i], m_c, v_c,
                                   &log_z, &alpha, &beta, &e1, &e2)
        one_minus = 1.0 - beta * v_c
        if status != SITE_OK or not (one_minus > 0.0) or not isfinite(log_z):
            site_log_z[i] = 0.0
            n_failed += 1
            continue
        site_log_z[i] = log_z
        target_precision[i] = beta / (power * one_minus)
        target_natural_mean[i] = (alpha + beta * m_c) / (power * one_minus)
        ratio = power * site_precision[i] * post_var[i]
        sum_terms[0] += (log_z - 0.5 * log1p(-ratio)
                         + 0.5 * v_c * (power * power * site_natural_mean[i] * site_natural_mean[i]
                                        - 2.0 * power * site_natural_mean[i] * post_mean[i] / post_var[i]
                                        + power * site_precision[i] * post_mean[i] * post_mean[i]
                                        / post_var[i])) / power
    return n_failed


cdef str _NOT_PD = ("the kernel matrix is not positive definite (its Cholesky factorisation failed); "
                     "increase jitter or add a White kernel term")


cdef int _lower_cholesky(double* a, int n) noexcept nogil:
    """``potrf`` of the row-major ``a`` in place, then zero its strict upper triangle."""
    cdef int i, j, info = potrf(True, n, a, n)
    if info == 0:
        for i in range(n):
            for j in range(i + 1, n):
                a[i * n + j] = 0.0
    return info


cdef _check_post_cov(post_cov, int n):
    """Raise ValueError unless ``post_cov`` is a writeable C-contiguous float64 (n, n) array."""
    if not (isinstance(post_cov, np.ndarray) and post_cov.dtype == np.float64
            and post_cov.shape == (n, n) and post_cov.flags.c_contiguous and post_cov.flags.writeable):
        raise ValueError("post_cov must be a writeable C-contiguous float64 (n, n) array")


def kernel_cholesky(const double[:, ::1] K):
    """The lower Cholesky factor ``L_K`` of ``K`` with a zero upper triangle (C-contiguous).

    The form :func:`site_posterior` takes.

    Raises
    ------
    numpy.linalg.LinAlgError
        ``K`` is not positive definite.
    """
    cdef int n = K.shape[0]
    if K.shape[1] != n:
        raise ValueError(f"K must be square, got shape {(K.shape[0], K.shape[1])}")
    chol_arr = np.array(K, dtype=np.float64, order="C")
    if n == 0:
        return chol_arr
    cdef double[:, ::1] chol = chol_arr
    cdef int info
    with nogil:
        info = _lower_cholesky(&chol[0, 0], n)
    if info != 0:
        raise np.linalg.LinAlgError(_NOT_PD)
    return chol_arr


def site_posterior(const double[:, ::1] K_chol, const double[::1] site_precision,
                   const double[::1] site_natural_mean, double[::1] post_mean, double[::1] post_var,
                   post_cov=None):
    """The GP posterior of sites of any sign (module docstring): ``Σ = (K⁻¹ + T)⁻¹``, ``μ = Σν``.

    Parameters
    ----------
    K_chol : ndarray (n, n)
        ``L_K`` from :func:`kernel_cholesky`.
    site_precision, site_natural_mean : ndarray (n,)
        τ and ν of the sites.
    post_mean, post_var : ndarray (n,)
        Outputs: μ and the diagonal of Σ.
    post_cov : ndarray (n, n) or None
        If given (writeable, C-contiguous), receives Σ.

    Returns
    -------
    tuple of float or None
        ``(log|I + K T|, νᵀ Σ ν)``, or None if the posterior is improper (``K⁻¹ + T`` is not
        positive definite; the outputs are then undefined).
    """
    cdef int n = K_chol.shape[0]
    if K_chol.shape[1] != n:
        raise ValueError("K_chol must be square")
    for name, arg in (("site_precision", site_precision), ("site_natural_mean", site_natural_mean),
                      ("post_mean", post_mean), ("post_var", post_var)):
        if arg.shape[0] != n:
            raise ValueError(f"{name} must have length n = {n}, got {arg.shape[0]}")
    cdef double[:, ::1] cov_view
    if post_cov is not None:
        _check_post_cov(post_cov, n)
        cov_view = post_cov
    if n == 0:
        return 0.0, 0.0
    a_arr = np.empty((n, n))
    x_arr = np.empty((n, n))
    tmp_arr = np.empty(n)
    cdef double[:, ::1] a_work = a_arr
    cdef double[:, ::1] x_work = x_arr
    cdef double[::1] tmp = tmp_arr
    cdef double log_det = 0.0, quad = 0.0
    cdef int info
    with nogil:
        info = robust_factor(&K_chol[0, 0], n, &site_precision[0], &site_natural_mean[0], &a_work[0, 0],
                             &x_work[0, 0], &tmp[0], &post_mean[0], &post_var[0], &log_det, &quad)
        if info == 0 and post_cov is not None:
            syrk(True, n, n, 1.0, &x_work[0, 0], n, 0.0, &cov_view[0, 0], n)
            symmetrize(True, n, &cov_view[0, 0], n)
    if info != 0:
        return None
    return float(log_det), float(quad)


def run_robust_gp_ep(const double[:, ::1] K, const double[::1] y, double dof, double scale,
                     double power, double[::1] site_precision, double[::1] site_natural_mean,
                     double[::1] post_mean, double[::1] post_var, double[::1] cavity_mean,
                     double[::1] cavity_var, *, double damping=0.5, double tol=1e-4,
                     int max_sweeps=200, int max_halvings=10, post_cov=None, sweep_callback=None):
    """Fractional EP for GP regression with a Student-t likelihood (module docstring).

    Parameters
    ----------
    K : ndarray (n, n), C-contiguous
        Prior covariance, positive definite (Cholesky must succeed; add jitter).
    y : ndarray (n,)
        Finite targets.
    dof, scale : float > 0
        Student-t ν and σ.
    power : float in (0, 1]
        The fraction η.
    site_precision, site_natural_mean : ndarray (n,)
        Start sites (zeros: a cold start), updated in place to the final sites.
    post_mean, post_var, cavity_mean, cavity_var : ndarray (n,)
        Outputs: the posterior marginals and the final (fractional) cavities.
    damping : float in (0, 1]
        Initial step δ of every iteration (halved while the step makes the posterior or a
        cavity improper).
    tol : float > 0
    max_sweeps : int >= 1
        Parallel iterations.
    max_halvings : int >= 0
    post_cov : ndarray (n, n) or None
        If given, receives the full posterior covariance Σ at the end.
    sweep_callback : callable or None
        ``callback(sweep, max_change, log_z)`` after every iteration (with the GIL); returning
        False stops the run at the current sites.

    Returns
    -------
    dict
        ``log_z``, ``n_sweeps``, ``converged``, ``max_change``, ``log_z_change``, ``n_failed``
        (sites whose update failed in the last iteration), ``n_halvings`` (step reductions over
        the run), ``stuck`` (an iteration found no proper step), ``stopped``.

    Raises
    ------
    numpy.linalg.LinAlgError
        K not positive definite, or the start sites give an improper posterior.
    ValueError
        Bad shapes, non-finite inputs or options.
    """
    cdef int n = K.shape[0]
    if K.shape[1] != n:
        raise ValueError(f"K must be square, got shape {(K.shape[0], K.shape[1])}")
    for name, arg in (("y", y), ("site_precision", site_precision),
                      ("site_natural_mean", site_natural_mean), ("post_mean", post_mean),
                      ("post_var", post_var), ("cavity_mean", cavity_mean), ("cavity_var", cavity_var)):
        if arg.shape[0] != n:
            raise ValueError(f"{name} must have length n = {n}, got {arg.shape[0]}")
    if not (dof > 0 and np.isfinite(dof) and scale > 0 and np.isfinite(scale)):
        raise ValueError(f"dof and scale must be finite and > 0, got {dof!r} and {scale!r}")
    if not (0.0 < power <= 1.0):
        raise ValueError(f"power must be in (0, 1], got {power!r}")
    if not (0.0 < damping <= 1.0):
        raise ValueError(f"damping must be in (0, 1], got {damping!r}")
    if not tol > 0 or max_sweeps < 1 or max_halvings < 0:
        raise ValueError("tol must be > 0, max_sweeps >= 1 and max_halvings >= 0")
    for name, arg in (("y", y), ("site_precision", site_precision), ("site_natural_mean", site_natural_mean)):
        if not np.all(np.isfinite(np.asarray(arg))):
            raise ValueError(f"{name} must be finite")
    cdef double[:, ::1] cov_view
    if post_cov is not None:
        _check_post_cov(post_cov, n)
        cov_view = post_cov
    if n == 0:
        return {"log_z": 0.0, "n_sweeps": 0, "converged": True, "max_change": 0.0,
                "log_z_change": 0.0, "n_failed": 0, "n_halvings": 0, "stuck": False, "stopped": False}

    chol_arr = np.array(K, dtype=np.float64, order="C")
    a_arr = np.empty((n, n))
    x_arr = np.empty((n, n))
    cdef double[:, ::1] chol = chol_arr
    cdef double[:, ::1] a_work = a_arr
    cdef double[:, ::1] x_work = x_arr
    vectors = np.zeros((7, n))
    cdef double[:, ::1] vec = vectors     # rows: tmp, site log Z, target τ, target ν, trial τ, trial ν, trial mean
    trial_var_arr = np.empty(n)
    cdef double[::1] trial_var = trial_var_arr
    cdef int info, i, sweep, halving, n_failed = 0, n_halvings = 0
    cdef double log_det = 0.0, quad = 0.0, sum_terms = 0.0, log_z, new_log_z, step, max_change = 0.0
    cdef double log_z_change = 0.0
    cdef bint accepted, converged = False, stuck = False, stopped = False
    with nogil:
        info = _lower_cholesky(&chol[0, 0], n)
    if info != 0:
        raise np.linalg.LinAlgError(_NOT_PD)
    with nogil:
        info = robust_factor(&chol[0, 0], n, &site_precision[0], &site_natural_mean[0], &a_work[0, 0],
                             &x_work[0, 0], &vec[0, 0], &post_mean[0], &post_var[0], &log_det, &quad)
    if info != 0:
        raise np.linalg.LinAlgError("the start sites give an improper posterior (K⁻¹ + T is not "
                                    "positive definite); start from zero sites")
    with nogil:
        n_failed = robust_targets(&y[0], n, dof, scale, power, &site_precision[0], &site_natural_mean[0],
                                  &post_mean[0], &post_var[0], &cavity_mean[0], &cavity_var[0],
                                  &vec[1, 0], &vec[2, 0], &vec[3, 0], &sum_terms)
    log_z = -0.5 * log_det + 0.5 * quad + sum_terms
    sweep = 0
    while sweep < max_sweeps:
        sweep += 1
        step = damping
        accepted = False
        with nogil:
            for halving in range(max_halvings + 1):
                for i in range(n):
                    vec[4, i] = site_precision[i] + step * (vec[2, i] - site_precision[i])
                    vec[5, i] = site_natural_mean[i] + step * (vec[3, i] - site_natural_mean[i])
                info = robust_factor(&chol[0, 0], n, &vec[4, 0], &vec[5, 0], &a_work[0, 0], &x_work[0, 0],
                                     &vec[0, 0], &vec[6, 0], &trial_var[0], &log_det, &quad)
                if info == 0:
                    accepted = True
                    for i in range(n):
                        if not (1.0 / trial_var[i] - power * vec[4, i] > 0.0):
                            accepted = False
                            break
                if accepted:
                    break
                step *= 0.5
                n_halvings += 1
        if not accepted:
            stuck = True
            # the posterior of the current sites (the last trial overwrote the work arrays)
            with nogil:
                robust_factor(&chol[0, 0], n, &site_precision[0], &site_natural_mean[0], &a_work[0, 0],
                              &x_work[0, 0], &vec[0, 0], &post_mean[0], &post_var[0], &log_det, &quad)
            break
        with nogil:
            max_change = max_relative_site_change(n, &site_precision[0], &site_natural_mean[0],
                                                  &vec[4, 0], &vec[5, 0])
            for i in range(n):
                site_precision[i] = vec[4, i]
                site_natural_mean[i] = vec[5, i]
                post_mean[i] = vec[6, i]
                post_var[i] = trial_var[i]
            n_failed = robust_targets(&y[0], n, dof, scale, power, &site_precision[0], &site_natural_mean[0],
                                      &post_mean[0], &post_var[0], &cavity_mean[0], &cavity_var[0],
                                      &vec[1, 0], &vec[2, 0], &vec[3, 0], &sum_terms)
        new_log_z = -0.5 * log_det + 0.5 * quad + sum_terms
        log_z_change = fabs(new_log_z - log_z)
        log_z = new_log_z
        PyErr_CheckSignals()
        if sweep_callback is not None and sweep_callback(sweep, max_change, log_z) is False:
            stopped = True
            break
        if max_change < tol and log_z_change < tol * max(1.0, fabs(log_z)) and n_failed == 0:
            converged = True
            break
    if post_cov is not None:
        with nogil:
            # x_work holds X of the current sites (the accepted trial, or the refactorisation)
            syrk(True, n, n, 1.0, &x_work[0, 0], n, 0.0, &cov_view[0, 0], n)
            symmetrize(True, n, &cov_view[0, 0], n)
    return {"log_z": float(log_z), "n_sweeps": sweep, "converged": bool(converged),
            "max_change": float(max_change), "log_z_change": float(log_z_change),
            "n_failed": int(n_failed), "n_halvings": int(n_halvings), "stuck": bool(stuck),
            "stopped": bool(stopped)}
