# cython: language_level=3
"""GP EP with Student-t sites, dense and sparse: fractional (power) EP that allows negative site precisions.

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
``N(f; ν₋/τ₋, 1/τ₋) t(y_i | f)^η`` (moments: ``student_t_sites.student_t_moments``) and the new site
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

Sparse models
-------------
``run_sparse`` is the same parallel schedule on the FITC/DTC representation of
:mod:`fastep._epcore.sparse_ep` (``A = I + Vtᵀ T Vt = Rᵀ R``, built with a second, subtracting
``syrk`` for the negative sites, so its Cholesky factorisation is again the check that the
posterior is proper); the tilted moments are those of the likelihood at the cavity of
``f_i = g_i + ε_i``, ``ε_i ~ N(0, d_i)``, and the evidence is the sparse engine's power-EP
energy, which for negative sites is the fractional EP energy above.

Both engines share one step-halving driver (:func:`fractional_ep_sweeps`): the damped step,
its halving while the trial posterior or a trial cavity is improper, the convergence test,
the progress callback and interrupt handling (through :class:`~fastep._epcore._common.SweepDriver`).
"""
import numpy as np

from libc.math cimport sqrt, log, log1p, fabs, isfinite
from fastep._epcore._blas cimport syrk, potrf, trsm, gemv, gemv_t, symmetrize, dcopy, UPPER, LOWER, NO_TRANS, TRANS, LEFT, RIGHT
from fastep._epcore.sites cimport SiteModel, SiteSpec, SITE_OK
from fastep._epcore.student_t_sites cimport student_t_moments, student_t_log_norm
from fastep._epcore._common cimport max_relative_site_change, SweepDriver
from fastep._epcore._common import _check_vector, SweepResult
from fastep._epcore.power_ep cimport PowerRule, PowerQuadrature, power_site_moments
from fastep._epcore.power_ep import DEFAULT_N_QUADRATURE, _check_power
from fastep._epcore.sparse_ep cimport sparse_rebuild, scratch_rows
from fastep._epcore.sparse_ep import _check_projection, _check_marginal_outputs, _check_factor_outputs

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
        syrk(LOWER, n, k_pos, 1.0, x_work, n, 1.0, a_work, n)
    if k_neg:
        syrk(LOWER, n, k_neg, -1.0, &x_work[(n - k_neg) * n], n, 1.0, a_work, n)
    info = potrf(LOWER, n, a_work, n)
    if info != 0:
        return info
    log_det[0] = 0.0
    for i in range(n):
        log_det[0] += 2.0 * log(a_work[i * n + i])
    # X = R⁻¹ L_Kᵀ
    for i in range(n):
        for j in range(n):
            x_work[i * n + j] = K_chol[j * n + i] if i <= j else 0.0
    trsm(LOWER, NO_TRANS, n, n, 1.0, a_work, n, x_work, n)
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
    cdef int i, j, info = potrf(LOWER, n, a, n)
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
            syrk(LOWER, n, n, 1.0, &x_work[0, 0], n, 0.0, &cov_view[0, 0], n)
            symmetrize(LOWER, n, &cov_view[0, 0], n)
    if info != 0:
        return None
    return float(log_det), float(quad)


# --------------------------------------------------------------------------- #
# the step-halving driver (dense and sparse)
# --------------------------------------------------------------------------- #

ctypedef bint (*TrialFn)(void* ctx, const double* tau, const double* nu) noexcept nogil
ctypedef double (*AcceptFn)(void* ctx, int* n_failed) noexcept nogil
ctypedef void (*CurrentFn)(void* ctx) noexcept nogil


cdef struct FractionalStep:
    int n
    double damping
    int max_halvings
    double* site_precision          # current sites (in/out)
    double* site_natural_mean
    double* target_precision        # fractional-EP targets of the current sites
    double* target_natural_mean
    double* trial_precision         # the damped trial step
    double* trial_natural_mean
    TrialFn trial                   # factorise at the trial sites: True if posterior and cavities are proper
    AcceptFn accept                 # adopt the trial posterior, recompute targets; returns the new log Z
    CurrentFn current               # factorise at the current sites (no proper step was found)
    void* ctx


cdef int fractional_ep_sweeps(SweepDriver driver, FractionalStep* s, double log_z, int n_failed,
                              long* n_halvings, bint* stuck) except -1:
    """The parallel fractional-EP iterations of both Student-t engines.

    Each iteration steps ``τ ← τ + δ (τ* - τ)`` (likewise ν) from ``δ = damping`` and halves δ
    (at most ``max_halvings`` times) while ``trial`` rejects the step; a step that is never
    accepted marks the run ``stuck`` and leaves the current sites' posterior. ``driver`` keeps
    the bookkeeping (convergence, callback, interrupts).
    """
    cdef int sweep = 0, halving, i, n = s.n
    cdef double step, max_change = 0.0, new_log_z
    cdef bint accepted
    driver.log_z = log_z
    driver.record_change(0, 0.0, n_failed)
    driver.log_z_change = 0.0
    while sweep < driver.max_sweeps:
        sweep += 1
        with nogil:
            step = s.damping
            accepted = False
            for halving in range(s.max_halvings + 1):
                for i in range(n):
                    s.trial_precision[i] = s.site_precision[i] + step * (s.target_precision[i] - s.site_precision[i])
                    s.trial_natural_mean[i] = (s.site_natural_mean[i]
                                               + step * (s.target_natural_mean[i] - s.site_natural_mean[i]))
                accepted = s.trial(s.ctx, s.trial_precision, s.trial_natural_mean)
                if accepted:
                    break
                step *= 0.5
                n_halvings[0] += 1
            if not accepted:
                stuck[0] = True
                s.current(s.ctx)
            else:
                max_change = max_relative_site_change(n, s.site_precision, s.site_natural_mean,
                                                      s.trial_precision, s.trial_natural_mean)
                for i in range(n):
                    s.site_precision[i] = s.trial_precision[i]
                    s.site_natural_mean[i] = s.trial_natural_mean[i]
                new_log_z = s.accept(s.ctx, &n_failed)
        if not accepted:
            driver.n_sweeps = sweep
            break
        if driver.interrupted():
            break
        driver.record_change(sweep, max_change, n_failed)
        driver.test(new_log_z, driver.log_z)
        driver.log_z = new_log_z
        if driver.notify(sweep) or driver.converged:
            break
    driver.raise_pending()
    return 0


# --------------------------------------------------------------------------- #
# the dense engine
# --------------------------------------------------------------------------- #

cdef struct _DenseState:
    const double* chol
    const double* y
    int n
    double dof, scale, power
    double* a_work
    double* x_work
    double* tmp
    double* post_mean
    double* post_var
    double* cavity_mean
    double* cavity_var
    double* site_log_z
    double* site_precision
    double* site_natural_mean
    double* target_precision
    double* target_natural_mean
    double* trial_mean
    double* trial_var
    double log_det, quad


cdef bint _dense_trial(void* ctx, const double* tau, const double* nu) noexcept nogil:
    cdef _DenseState* d = <_DenseState*>ctx
    cdef int i
    if robust_factor(d.chol, d.n, tau, nu, d.a_work, d.x_work, d.tmp, d.trial_mean, d.trial_var,
                     &d.log_det, &d.quad) != 0:
        return False
    for i in range(d.n):
        if not (1.0 / d.trial_var[i] - d.power * tau[i] > 0.0):
            return False
    return True


cdef double _dense_accept(void* ctx, int* n_failed) noexcept nogil:
    cdef _DenseState* d = <_DenseState*>ctx
    cdef double sum_terms = 0.0
    cdef int i
    for i in range(d.n):
        d.post_mean[i] = d.trial_mean[i]
        d.post_var[i] = d.trial_var[i]
    n_failed[0] = robust_targets(d.y, d.n, d.dof, d.scale, d.power, d.site_precision, d.site_natural_mean,
                                 d.post_mean, d.post_var, d.cavity_mean, d.cavity_var, d.site_log_z,
                                 d.target_precision, d.target_natural_mean, &sum_terms)
    return -0.5 * d.log_det + 0.5 * d.quad + sum_terms


cdef void _dense_current(void* ctx) noexcept nogil:
    # the posterior of the current sites (the last trial overwrote the work arrays)
    cdef _DenseState* d = <_DenseState*>ctx
    robust_factor(d.chol, d.n, d.site_precision, d.site_natural_mean, d.a_work, d.x_work, d.tmp,
                  d.post_mean, d.post_var, &d.log_det, &d.quad)


def _check_fractional_options(double power, double damping, double tol, int max_sweeps, int max_halvings):
    if not (0.0 < power <= 1.0):
        raise ValueError(f"power must be in (0, 1], got {power!r}")
    if not (0.0 < damping <= 1.0):
        raise ValueError(f"damping must be in (0, 1], got {damping!r}")
    if not tol > 0 or max_sweeps < 1 or max_halvings < 0:
        raise ValueError("tol must be > 0, max_sweeps >= 1 and max_halvings >= 0")


def run_dense(const double[:, ::1] K, const double[::1] y, double dof, double scale,
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
    SweepResult
        ``n_failed`` counts the sites whose update failed in the last iteration,
        ``n_halvings`` the step reductions over the run, ``stuck`` an iteration that found
        no proper step.

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
    _check_fractional_options(power, damping, tol, max_sweeps, max_halvings)
    for name, arg in (("y", y), ("site_precision", site_precision), ("site_natural_mean", site_natural_mean)):
        if not np.all(np.isfinite(np.asarray(arg))):
            raise ValueError(f"{name} must be finite")
    cdef double[:, ::1] cov_view
    if post_cov is not None:
        _check_post_cov(post_cov, n)
        cov_view = post_cov
    if n == 0:
        return SweepResult(converged=True, max_change=0.0, log_z=0.0, log_z_change=0.0)

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
    cdef int info, n_failed = 0
    cdef long n_halvings = 0
    cdef double sum_terms = 0.0
    cdef bint stuck = False
    cdef _DenseState state
    cdef FractionalStep step
    cdef SweepDriver driver = SweepDriver(tol, max_sweeps, sweep_callback, <double>n * n)
    driver.keep(site_precision, site_natural_mean)
    with nogil:
        info = _lower_cholesky(&chol[0, 0], n)
    if info != 0:
        raise np.linalg.LinAlgError(_NOT_PD)
    state.chol = &chol[0, 0]
    state.y = &y[0]
    state.n = n
    state.dof, state.scale, state.power = dof, scale, power
    state.a_work, state.x_work, state.tmp = &a_work[0, 0], &x_work[0, 0], &vec[0, 0]
    state.post_mean, state.post_var = &post_mean[0], &post_var[0]
    state.cavity_mean, state.cavity_var, state.site_log_z = &cavity_mean[0], &cavity_var[0], &vec[1, 0]
    state.site_precision, state.site_natural_mean = &site_precision[0], &site_natural_mean[0]
    state.target_precision, state.target_natural_mean = &vec[2, 0], &vec[3, 0]
    state.trial_mean, state.trial_var = &vec[6, 0], &trial_var[0]
    with nogil:
        info = robust_factor(&chol[0, 0], n, &site_precision[0], &site_natural_mean[0], &a_work[0, 0],
                             &x_work[0, 0], &vec[0, 0], &post_mean[0], &post_var[0], &state.log_det,
                             &state.quad)
    if info != 0:
        raise np.linalg.LinAlgError("the start sites give an improper posterior (K⁻¹ + T is not "
                                    "positive definite); start from zero sites")
    with nogil:
        n_failed = robust_targets(&y[0], n, dof, scale, power, &site_precision[0], &site_natural_mean[0],
                                  &post_mean[0], &post_var[0], &cavity_mean[0], &cavity_var[0],
                                  &vec[1, 0], &vec[2, 0], &vec[3, 0], &sum_terms)
    step.n, step.damping, step.max_halvings = n, damping, max_halvings
    step.site_precision, step.site_natural_mean = &site_precision[0], &site_natural_mean[0]
    step.target_precision, step.target_natural_mean = &vec[2, 0], &vec[3, 0]
    step.trial_precision, step.trial_natural_mean = &vec[4, 0], &vec[5, 0]
    step.trial, step.accept, step.current = _dense_trial, _dense_accept, _dense_current
    step.ctx = &state
    fractional_ep_sweeps(driver, &step, -0.5 * state.log_det + 0.5 * state.quad + sum_terms, n_failed,
                         &n_halvings, &stuck)
    if post_cov is not None:
        with nogil:
            # x_work holds X of the current sites (the accepted trial, or the refactorisation)
            syrk(LOWER, n, n, 1.0, &x_work[0, 0], n, 0.0, &cov_view[0, 0], n)
            symmetrize(LOWER, n, &cov_view[0, 0], n)
    return driver.result(n_halvings=n_halvings, stuck=stuck)


# --------------------------------------------------------------------------- #
# the sparse engine
# --------------------------------------------------------------------------- #

cdef int _sparse_targets(const SiteModel* model, const PowerRule* rule, const double* y, const double* d,
                         int n, const double* site_precision, const double* site_natural_mean,
                         const double* g_mean, const double* g_var, double* target_precision,
                         double* target_natural_mean, double* sum_terms) noexcept nogil:
    """Fractional-EP targets of every site from the same marginals, no clipping; a site whose
    cavity is improper or whose moments fail keeps its value. Returns the number failed.

    ``sum_terms`` receives the sites' share of the energy (as :func:`sparse_log_z`, from the
    same moments) over the sites that did not fail."""
    cdef int i, n_failed = 0
    cdef double power = rule.power, denom, v_c, m_c, log_z = 0.0, a = 0.0, b = 0.0, one_minus
    cdef double dt, dn, s, h
    sum_terms[0] = 0.0
    for i in range(n):
        target_precision[i] = site_precision[i]
        target_natural_mean[i] = site_natural_mean[i]
        denom = 1.0 - power * site_precision[i] * g_var[i]
        if not (g_var[i] > 0.0 and denom > 0.0):
            n_failed += 1
            continue
        v_c = g_var[i] / denom
        m_c = g_mean[i] + v_c * power * (site_precision[i] * g_mean[i] - site_natural_mean[i])
        if not (isfinite(v_c) and isfinite(m_c)) or \
                power_site_moments(model, rule, y[i], m_c, v_c + d[i], &log_z, &a, &b) != 0:
            n_failed += 1
            continue
        one_minus = 1.0 - v_c * b
        if not one_minus > 0.0:
            n_failed += 1
            continue
        target_precision[i] = b / (power * one_minus)
        target_natural_mean[i] = (a + b * m_c) / (power * one_minus)
        s = g_var[i]
        h = g_mean[i]
        dt = power * site_precision[i]
        dn = power * site_natural_mean[i]
        sum_terms[0] += (log_z - 0.5 * log1p(-dt * s)
                         + 0.5 * v_c * (dn * dn - 2.0 * dn * h / s + dt * h * h / s)) / power
    return n_failed


cdef struct _SparseState:
    const SiteModel* model
    const PowerRule* rule
    const double* Vt
    const double* d
    const double* y
    int n, m, rows
    double power
    double* scratch
    double* post_factor
    double* post_w_mean
    double* g_mean
    double* g_var
    double* trial_factor
    double* trial_w
    double* trial_g_mean
    double* trial_g_var
    double* site_precision
    double* site_natural_mean
    double* target_precision
    double* target_natural_mean
    double half_log_det, quad_b


cdef bint _sparse_trial(void* ctx, const double* tau, const double* nu) noexcept nogil:
    cdef _SparseState* s = <_SparseState*>ctx
    cdef int i
    if sparse_rebuild(s.Vt, s.n, s.m, tau, nu, s.trial_factor, s.trial_w, s.trial_g_mean, s.trial_g_var,
                      s.scratch, s.rows, &s.half_log_det, &s.quad_b, NULL) != 0:
        return False
    for i in range(s.n):
        if not (s.trial_g_var[i] > 0.0 and 1.0 - s.power * tau[i] * s.trial_g_var[i] > 0.0):
            return False
    return True


cdef double _sparse_accept(void* ctx, int* n_failed) noexcept nogil:
    cdef _SparseState* s = <_SparseState*>ctx
    cdef double sum_terms = 0.0
    cdef int i
    for i in range(s.n):
        s.g_mean[i] = s.trial_g_mean[i]
        s.g_var[i] = s.trial_g_var[i]
    dcopy(s.m * s.m, s.trial_factor, 1, s.post_factor, 1)
    dcopy(s.m, s.trial_w, 1, s.post_w_mean, 1)
    n_failed[0] = _sparse_targets(s.model, s.rule, s.y, s.d, s.n, s.site_precision, s.site_natural_mean,
                                  s.g_mean, s.g_var, s.target_precision, s.target_natural_mean, &sum_terms)
    return -s.half_log_det + 0.5 * s.quad_b + sum_terms


cdef void _sparse_current(void* ctx) noexcept nogil:
    # the factor of the current sites (the trials used their own buffers)
    cdef _SparseState* s = <_SparseState*>ctx
    sparse_rebuild(s.Vt, s.n, s.m, s.site_precision, s.site_natural_mean, s.post_factor, s.post_w_mean,
                   s.g_mean, s.g_var, s.scratch, s.rows, &s.half_log_det, &s.quad_b, NULL)


def run_sparse(const double[:, ::1] Vt, const double[::1] d, const double[::1] y,
               SiteSpec spec not None, double[::1] site_precision,
               double[::1] site_natural_mean, double[:, ::1] post_factor,
               double[::1] post_w_mean, double[::1] g_mean, double[::1] g_var, *,
               double power=0.5, double damping=0.5, double tol=1e-4, int max_sweeps=200,
               int max_halvings=10, object sweep_callback=None):
    """Sparse fractional EP that allows negative site precisions (robust Student-t regression).

    The parallel schedule of :func:`run_dense` on the sparse representation of
    :mod:`fastep._epcore.sparse_ep` (module docstring, "Sparse models"). The evidence is
    :func:`fastep._epcore.sparse_ep.log_marginal_likelihood`'s power-EP energy, which for
    negative sites is the fractional EP energy of Jylänki, Vanhatalo & Vehtari (2011, eq 14).

    Parameters
    ----------
    Vt, d, y, spec, site_precision, site_natural_mean, post_factor, post_w_mean
        As :class:`fastep._epcore.sparse_ep.SparseEP`; the sites may have any sign but must give
        a proper start.
    g_mean, g_var : ndarray (n,)
        Outputs: E[g] and Var[g] of the final posterior.
    power : float in (0, 1]
        The fraction α (0.5 is the robust choice).
    damping : float in (0, 1]
        First step of every iteration.
    tol : float > 0
    max_sweeps : int >= 1
    max_halvings : int >= 0
    sweep_callback : callable or None
        ``callback(sweep, max_change, log_z)`` after every iteration; False stops the run.

    Returns
    -------
    SweepResult
        As :func:`run_dense`.

    Raises
    ------
    numpy.linalg.LinAlgError
        The start sites give an improper posterior.
    ValueError
        Bad shapes or options.
    """
    cdef int n = Vt.shape[0], m = Vt.shape[1]
    _check_projection(Vt, d)
    _check_vector("y", y, n)
    _check_vector("site_precision", site_precision, n)
    _check_vector("site_natural_mean", site_natural_mean, n)
    _check_marginal_outputs(g_mean, g_var, n)
    _check_factor_outputs(post_factor, post_w_mean, m)
    _check_power(power, spec, DEFAULT_N_QUADRATURE)
    _check_fractional_options(power, damping, tol, max_sweeps, max_halvings)
    if n == 0:
        np.asarray(post_factor)[:] = np.eye(m)
        np.asarray(post_w_mean)[:] = 0.0
        return SweepResult(converged=True, max_change=0.0, log_z=0.0, log_z_change=0.0)
    cdef PowerQuadrature quadrature = PowerQuadrature(power, DEFAULT_N_QUADRATURE)
    cdef int rows = scratch_rows(n, m)
    cdef double[:, ::1] scratch = np.empty((rows, m))
    cdef double[:, ::1] trial_factor = np.empty((m, m))
    cdef double[::1] trial_w = np.empty(m)
    vectors = np.empty((6, n))
    cdef double[:, ::1] vec = vectors     # rows: target τ, target ν, trial τ, trial ν, trial E[g], trial Var[g]
    cdef int info, n_failed = 0
    cdef long n_halvings = 0
    cdef double sum_terms = 0.0
    cdef bint stuck = False
    cdef _SparseState state
    cdef FractionalStep step
    cdef SweepDriver driver = SweepDriver(tol, max_sweeps, sweep_callback, 3.0 * m * m)
    driver.keep(site_precision, site_natural_mean)
    state.model, state.rule = &spec.model, &quadrature.rule
    state.Vt, state.d, state.y = &Vt[0, 0], &d[0], &y[0]
    state.n, state.m, state.rows, state.power = n, m, rows, power
    state.scratch = &scratch[0, 0]
    state.post_factor, state.post_w_mean = &post_factor[0, 0], &post_w_mean[0]
    state.g_mean, state.g_var = &g_mean[0], &g_var[0]
    state.trial_factor, state.trial_w = &trial_factor[0, 0], &trial_w[0]
    state.trial_g_mean, state.trial_g_var = &vec[4, 0], &vec[5, 0]
    state.site_precision, state.site_natural_mean = &site_precision[0], &site_natural_mean[0]
    state.target_precision, state.target_natural_mean = &vec[0, 0], &vec[1, 0]
    with nogil:
        info = sparse_rebuild(&Vt[0, 0], n, m, &site_precision[0], &site_natural_mean[0],
                              &post_factor[0, 0], &post_w_mean[0], &g_mean[0], &g_var[0],
                              &scratch[0, 0], rows, &state.half_log_det, &state.quad_b, NULL)
    if info != 0:
        raise np.linalg.LinAlgError("the start sites give an improper posterior (A = I + Vt^T T Vt is "
                                    "not positive definite); start from zero sites")
    with nogil:
        n_failed = _sparse_targets(&spec.model, &quadrature.rule, &y[0], &d[0], n, &site_precision[0],
                                   &site_natural_mean[0], &g_mean[0], &g_var[0], &vec[0, 0], &vec[1, 0],
                                   &sum_terms)
    step.n, step.damping, step.max_halvings = n, damping, max_halvings
    step.site_precision, step.site_natural_mean = &site_precision[0], &site_natural_mean[0]
    step.target_precision, step.target_natural_mean = &vec[0, 0], &vec[1, 0]
    step.trial_precision, step.trial_natural_mean = &vec[2, 0], &vec[3, 0]
    step.trial, step.accept, step.current = _sparse_trial, _sparse_accept, _sparse_current
    step.ctx = &state
    fractional_ep_sweeps(driver, &step, -state.half_log_det + 0.5 * state.quad_b + sum_terms, n_failed,
                         &n_halvings, &stuck)
    return driver.result(n_halvings=n_halvings, stuck=stuck)
