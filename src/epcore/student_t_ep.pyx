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
:class:`SparseStudentTEP` is the same parallel schedule on the FITC/DTC representation of
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

from libc.math cimport sqrt, log, log1p, isfinite
from fastep._epcore._blas cimport syrk, potrf, trsm, gemv, gemv_t, symmetrize, dcopy, LOWER, NO_TRANS
from fastep._epcore.sites cimport SiteModel, SiteSpec, SITE_OK
from fastep._epcore.student_t_sites cimport student_t_moments, student_t_log_norm
from fastep._epcore._common cimport max_relative_site_change, SweepDriver, EngineOptions, SweepResult, SweepSettings
from fastep._epcore._common import _check_vector
from fastep._epcore.power_ep cimport PowerRule, PowerQuadrature, power_site_moments
from fastep._epcore.power_ep import DEFAULT_N_QUADRATURE, _check_power, _check_power_range
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
            _covariance(&x_work[0, 0], n, &cov_view[0, 0])
    if info != 0:
        return None
    return float(log_det), float(quad)


cdef void _covariance(const double* x_work, int n, double* cov) noexcept nogil:
    """``Σ = XᵀX`` (full, symmetric) from the ``X`` that :func:`robust_factor` left in ``x_work``."""
    syrk(LOWER, n, n, 1.0, x_work, n, 0.0, cov, n)
    symmetrize(LOWER, n, cov, n)


cdef inline bint _cavities_proper(int n, double power, const double* tau, const double* var,
                                  bint dense) noexcept nogil:
    """True if every fractional cavity of sites ``tau`` at the marginal variances ``var`` is
    proper: ``1/var_i - η τ_i > 0`` (dense), ``var_i > 0`` and ``1 - η τ_i var_i > 0`` (sparse,
    ``var`` the variances of g)."""
    cdef int i
    cdef bint proper
    for i in range(n):
        if dense:
            proper = 1.0 / var[i] - power * tau[i] > 0.0
        else:
            proper = var[i] > 0.0 and 1.0 - power * tau[i] * var[i] > 0.0
        if not proper:
            return False
    return True


# --------------------------------------------------------------------------- #
# the step-halving driver (dense and sparse)
# --------------------------------------------------------------------------- #

cdef int fractional_ep_sweeps(SweepDriver driver, FractionalStep* s, long* n_halvings,
                              bint* stuck) except -1:
    """The parallel fractional-EP iterations of both Student-t engines.

    Factorises at the start sites and computes their targets; then each iteration steps
    ``τ ← τ + δ (τ* - τ)`` (likewise ν) from ``δ = damping`` and halves δ (at most
    ``max_halvings`` times) while ``trial`` rejects the step; a step that is never accepted
    marks the run ``stuck`` and leaves the current sites' posterior. ``driver`` keeps the
    bookkeeping (convergence, callback, interrupts).

    Returns
    -------
    int
        0, or the failing ``potrf``'s info (> 0) if the start sites give an improper
        posterior; nothing else has run then.
    """
    cdef int sweep = 0, halving, i, n = s.n, n_failed = 0, info
    cdef double step, max_change = 0.0, new_log_z, log_z = 0.0
    cdef bint accepted
    with nogil:
        info = s.current(s.ctx)
        if info == 0:
            log_z = s.targets(s.ctx, &n_failed)
    if info != 0:
        return info
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
                s.adopt(s.ctx)
                new_log_z = s.targets(s.ctx, &n_failed)
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


cdef class StudentTEPOptions(EngineOptions):
    """Options of the Student-t engines (:class:`DenseStudentTEP`, :class:`SparseStudentTEP`),
    checked once here (read-only).

    Parameters
    ----------
    power : float in (0, 1]
        The fraction η (0.5 is the robust choice).
    n_quadrature : int in [1, 256]
        Gauss-Hermite nodes of the sparse engine's powered moments (the dense engine's are in
        closed form).
    damping : float in (0, 1]
        Initial step δ of every iteration (halved while the step makes the posterior or a
        cavity improper).
    tol : float > 0
        Convergence threshold on the largest relative site change and the relative change of
        log Z (with no failed site).
    max_sweeps : int >= 1
        Parallel iterations.
    max_halvings : int >= 0
        Halvings of δ per iteration before the run is declared stuck.

    Raises
    ------
    ValueError
        A field out of range (the message names it).
    """
    _FIELDS = ("power", "n_quadrature", "damping", "tol", "max_sweeps", "max_halvings")

    def __init__(self, *, double power=0.5, int n_quadrature=DEFAULT_N_QUADRATURE, double damping=0.5,
                 double tol=1e-4, int max_sweeps=200, int max_halvings=10):
        _check_power_range(power, n_quadrature)
        self.set_sweep(damping, tol, max_sweeps, 1, True)
        if max_halvings < 0:
            raise ValueError(f"max_halvings must be >= 0; got {max_halvings}")
        self.power = power
        self.n_quadrature = n_quadrature
        self.max_halvings = max_halvings


_DEFAULT_OPTIONS = StudentTEPOptions()


cdef class StudentTEPResult(SweepResult):
    """What one run of :class:`DenseStudentTEP` or :class:`SparseStudentTEP` reports (and one
    of their double-loop fallbacks, :mod:`fastep._student_t.double_loop`): the
    :class:`~fastep._epcore._common.SweepResult` fields and those of the step halving
    (``StudentTEPResult(result, n_halvings, stuck)``).

    Attributes
    ----------
    n_halvings : int
        Step halvings over the run (a damped step that would make the posterior or a cavity
        improper is halved, up to ``max_halvings`` times).
    stuck : bool
        An iteration found no proper step and the run stopped there (the double loop: an inner
        minimisation could not start).
    """
    _OWN = ("n_halvings", "stuck")
    _FIELDS = SweepResult._FIELDS + ("n_halvings", "stuck")

    def __init__(self, SweepResult result=None, long n_halvings=0, bint stuck=False):
        self.copy_common(SweepResult() if result is None else result)
        self.n_halvings = n_halvings
        self.stuck = stuck


cdef class FractionalEP:
    """What the dense and the sparse Student-t engine share: the options of the parallel
    schedule with step halving (module docstring), the :class:`FractionalStep` handed to
    :func:`fractional_ep_sweeps`, and a run from given sites to a
    :class:`StudentTEPResult`. Not built itself: see
    :class:`DenseStudentTEP` and :class:`SparseStudentTEP`.
    """

    cdef _configure(self, int n, StudentTEPOptions options, bint validate, double site_cost):
        """Keep the options (None: the defaults); ``site_cost`` sets the interrupt polling."""
        if options is None:
            options = _DEFAULT_OPTIONS
        self.options, self.sweep = options, options.sweep
        self.n, self.power, self.max_halvings, self.validate = n, options.power, options.max_halvings, validate
        self.site_cost = site_cost
        self.step.n, self.step.damping, self.step.max_halvings = n, self.sweep.damping, self.max_halvings

    cdef _sweeps(self, double[::1] site_precision, double[::1] site_natural_mean,
                 object sweep_callback, str improper):
        """Run :func:`fractional_ep_sweeps` from the given sites (the engine's state already
        points at the run's outputs); the StudentTEPResult. ``improper`` names the matrix whose
        Cholesky factorisation fails at an improper start."""
        if self.n == 0:
            return StudentTEPResult(SweepResult(converged=True, max_change=0.0, log_z=0.0, log_z_change=0.0))
        cdef long n_halvings = 0
        cdef bint stuck = False
        cdef SweepDriver driver = SweepDriver(self.sweep.tol, self.sweep.max_sweeps, sweep_callback, self.site_cost)
        driver.keep(site_precision, site_natural_mean)
        self.step.site_precision, self.step.site_natural_mean = &site_precision[0], &site_natural_mean[0]
        if fractional_ep_sweeps(driver, &self.step, &n_halvings, &stuck) != 0:
            raise np.linalg.LinAlgError(f"the start sites give an improper posterior ({improper} is not "
                                        "positive definite); start from zero sites")
        return StudentTEPResult(driver.result(), n_halvings, stuck)


# --------------------------------------------------------------------------- #
# the dense engine
# --------------------------------------------------------------------------- #

cdef bint _dense_trial(void* ctx, const double* tau, const double* nu) noexcept nogil:
    cdef DenseStudentTState* d = <DenseStudentTState*>ctx
    return (robust_factor(d.chol, d.n, tau, nu, d.a_work, d.x_work, d.tmp, d.trial_mean, d.trial_var,
                          &d.log_det, &d.quad) == 0
            and _cavities_proper(d.n, d.power, tau, d.trial_var, True))


cdef void _dense_adopt(void* ctx) noexcept nogil:
    cdef DenseStudentTState* d = <DenseStudentTState*>ctx
    dcopy(d.n, d.trial_mean, 1, d.post_mean, 1)
    dcopy(d.n, d.trial_var, 1, d.post_var, 1)


cdef double _dense_targets(void* ctx, int* n_failed) noexcept nogil:
    cdef DenseStudentTState* d = <DenseStudentTState*>ctx
    cdef double sum_terms = 0.0
    n_failed[0] = robust_targets(d.y, d.n, d.dof, d.scale, d.power, d.site_precision, d.site_natural_mean,
                                 d.post_mean, d.post_var, d.cavity_mean, d.cavity_var, d.site_log_z,
                                 d.target_precision, d.target_natural_mean, &sum_terms)
    return -0.5 * d.log_det + 0.5 * d.quad + sum_terms


cdef int _dense_current(void* ctx) noexcept nogil:
    # the posterior of the current sites (a trial overwrites the work arrays)
    cdef DenseStudentTState* d = <DenseStudentTState*>ctx
    return robust_factor(d.chol, d.n, d.site_precision, d.site_natural_mean, d.a_work, d.x_work, d.tmp,
                         d.post_mean, d.post_var, &d.log_det, &d.quad)


cdef class DenseStudentTEP(FractionalEP):
    """Fractional EP for GP regression with a Student-t likelihood, bound to one kernel matrix,
    its targets and the likelihood's ν and σ.

    Jylänki, Vanhatalo & Vehtari, "Robust Gaussian process regression with a Student-t
    likelihood" (JMLR 2011, §§3-4): the posterior ``Σ = L_K A⁻¹ L_Kᵀ`` of sites of any sign,
    the fractional updates of eqs 11-13 in the parallel schedule with step halving and the
    evidence of eq 14 (module docstring). Built once: factorises ``K = L_K L_Kᵀ`` and allocates
    the work arrays (the factor of A, X, the target and trial sites); :meth:`run` performs the
    iterations from given sites and returns a :class:`~fastep._epcore._common.SweepResult`.
    The work arrays are the engine's own, so an engine runs one problem at a time (build one
    per thread).

    Parameters
    ----------
    K : ndarray (n, n), C-contiguous
        Prior covariance, positive definite (Cholesky must succeed; add jitter).
    y : ndarray (n,)
        Finite targets.
    dof, scale : float > 0
        Student-t ν and σ.
    options : StudentTEPOptions, optional
        Power, damping, convergence test and step halving (default: ``StudentTEPOptions()``).
    validate : bool, default True
        Check K and y here and the site and output arrays at every :meth:`run`
        (ValueError naming the argument). ``False`` is the path for callers that validated
        them already (the estimators, at every optimiser step): invalid inputs then give
        undefined results instead of an error.

    Raises
    ------
    numpy.linalg.LinAlgError
        K is not positive definite.
    ValueError
        (``validate``) bad shapes or non-finite inputs.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep._epcore import student_t_ep
    >>> x = np.linspace(-3, 3, 30)
    >>> K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2) + 1e-6 * np.eye(30)
    >>> y = np.sin(x)
    >>> y[::7] += 4.0
    >>> engine = student_t_ep.DenseStudentTEP(K, y, 4.0, 0.1, student_t_ep.StudentTEPOptions(tol=1e-6))
    >>> tau, nu, post_mean, post_var = np.zeros(30), np.zeros(30), np.empty(30), np.empty(30)
    >>> result = engine.run(tau, nu, post_mean, post_var)
    >>> bool(result.converged), bool(np.any(tau < 0))
    (True, True)
    """

    def __init__(self, const double[:, ::1] K not None, const double[::1] y not None, double dof,
                 double scale, StudentTEPOptions options=None, *, bint validate=True):
        cdef int n = K.shape[0], info
        if validate:
            if K.shape[1] != n:
                raise ValueError(f"K must be square, got shape {(K.shape[0], K.shape[1])}")
            _check_vector("y", y, n)
            if not (dof > 0 and isfinite(dof) and scale > 0 and isfinite(scale)):
                raise ValueError(f"dof and scale must be finite and > 0, got {dof!r} and {scale!r}")
        self._configure(n, options, validate, <double>n * n)
        self.y, self.dof, self.scale = y, dof, scale
        self.K_chol = np.array(K, dtype=np.float64, order="C")
        if n == 0:
            return
        cdef double[:, ::1] chol = self.K_chol
        with nogil:
            info = _lower_cholesky(&chol[0, 0], n)
        if info != 0:
            raise np.linalg.LinAlgError(_NOT_PD)
        # rows of vec: tmp, site log Z, target τ, target ν, trial τ, trial ν, trial mean
        self.buffers = (np.empty((n, n)), np.empty((n, n)), np.zeros((7, n)), np.empty(n))
        cdef double[:, ::1] a_work = self.buffers[0]
        cdef double[:, ::1] x_work = self.buffers[1]
        cdef double[:, ::1] vec = self.buffers[2]
        cdef double[::1] trial_var = self.buffers[3]
        cdef DenseStudentTState* d = &self.state
        d.chol, d.y, d.n = &chol[0, 0], &y[0], n
        d.dof, d.scale, d.power = dof, scale, self.power
        d.a_work, d.x_work, d.tmp, d.site_log_z = &a_work[0, 0], &x_work[0, 0], &vec[0, 0], &vec[1, 0]
        d.target_precision, d.target_natural_mean = &vec[2, 0], &vec[3, 0]
        d.trial_mean, d.trial_var = &vec[6, 0], &trial_var[0]
        self.step.target_precision, self.step.target_natural_mean = &vec[2, 0], &vec[3, 0]
        self.step.trial_precision, self.step.trial_natural_mean = &vec[4, 0], &vec[5, 0]
        self.step.trial, self.step.adopt = _dense_trial, _dense_adopt
        self.step.targets, self.step.current = _dense_targets, _dense_current
        self.step.ctx = d

    def _check_run(self, site_precision, site_natural_mean, post_mean, post_var, cavity_mean,
                   cavity_var, post_cov):
        cdef int n = self.n
        _check_vector("site_precision", site_precision, n)
        _check_vector("site_natural_mean", site_natural_mean, n)
        for name, out in (("post_mean", post_mean), ("post_var", post_var),
                          ("cavity_mean", cavity_mean), ("cavity_var", cavity_var)):
            if out is not None and out.shape[0] != n:
                raise ValueError(f"{name} must have length n = {n}, got {out.shape[0]}")
        if post_cov is not None:
            _check_post_cov(post_cov, n)

    def run(self, double[::1] site_precision not None, double[::1] site_natural_mean not None,
            double[::1] post_mean not None, double[::1] post_var not None, *,
            double[::1] cavity_mean=None, double[::1] cavity_var=None, post_cov=None,
            object sweep_callback=None):
        """Iterate from the given sites to convergence (or ``max_sweeps``, or a stuck iteration).

        Parameters
        ----------
        site_precision, site_natural_mean : ndarray (n,), in/out
            Start sites τ (any sign) and ν (zeros: a cold start), updated in place to the
            final sites. They must give a proper posterior.
        post_mean, post_var : ndarray (n,), out
            The posterior marginals μ and ``diag Σ`` of the final sites.
        cavity_mean, cavity_var : ndarray (n,), out, optional
            The final fractional cavities (eqs 11-12; mean 0 and variance -1 where a cavity
            is improper).
        post_cov : ndarray (n, n) or None
            If given (writeable, C-contiguous float64), receives the full posterior
            covariance Σ at the end.
        sweep_callback : callable or None
            ``callback(sweep, max_change, log_z)`` after every iteration (with the GIL);
            returning False stops the run at the current sites. An exception it raises (or
            Ctrl-C) is re-raised after the sites are restored to their input values.

        Returns
        -------
        StudentTEPResult
            ``n_failed`` counts the sites whose update failed in the last iteration,
            ``n_halvings`` the step reductions over the run, ``stuck`` an iteration that
            found no proper step.

        Raises
        ------
        numpy.linalg.LinAlgError
            The start sites give an improper posterior.
        ValueError
            (``validate``) bad shapes or non-finite sites.
        """
        if self.validate:
            self._check_run(site_precision, site_natural_mean, post_mean, post_var, cavity_mean,
                            cavity_var, post_cov)
        cdef int n = self.n
        cdef double[:, ::1] cov
        if cavity_mean is None:
            cavity_mean = np.empty(n)
        if cavity_var is None:
            cavity_var = np.empty(n)
        cdef DenseStudentTState* d = &self.state
        d.site_precision, d.site_natural_mean = &site_precision[0], &site_natural_mean[0]
        d.post_mean, d.post_var = &post_mean[0], &post_var[0]
        d.cavity_mean, d.cavity_var = &cavity_mean[0], &cavity_var[0]
        result = self._sweeps(site_precision, site_natural_mean, sweep_callback, "K⁻¹ + T")
        if post_cov is not None and n > 0:
            cov = post_cov
            with nogil:
                # x_work holds X of the current sites (the accepted trial, or the refactorisation)
                _covariance(d.x_work, n, &cov[0, 0])
        return result


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


cdef bint _sparse_trial(void* ctx, const double* tau, const double* nu) noexcept nogil:
    cdef SparseStudentTState* s = <SparseStudentTState*>ctx
    return (sparse_rebuild(s.Vt, s.n, s.m, tau, nu, s.trial_factor, s.trial_w, s.trial_g_mean,
                           s.trial_g_var, s.scratch, s.rows, &s.half_log_det, &s.quad_b, NULL) == 0
            and _cavities_proper(s.n, s.power, tau, s.trial_g_var, False))


cdef void _sparse_adopt(void* ctx) noexcept nogil:
    cdef SparseStudentTState* s = <SparseStudentTState*>ctx
    cdef int i
    for i in range(s.n):
        s.g_mean[i] = s.trial_g_mean[i]
        s.g_var[i] = s.trial_g_var[i]
    dcopy(s.m * s.m, s.trial_factor, 1, s.post_factor, 1)
    dcopy(s.m, s.trial_w, 1, s.post_w_mean, 1)


cdef double _sparse_energy(void* ctx, int* n_failed) noexcept nogil:
    # the targets of the current sites and their log Z (the sparse power-EP energy)
    cdef SparseStudentTState* s = <SparseStudentTState*>ctx
    cdef double sum_terms = 0.0
    n_failed[0] = _sparse_targets(s.model, s.rule, s.y, s.d, s.n, s.site_precision, s.site_natural_mean,
                                  s.g_mean, s.g_var, s.target_precision, s.target_natural_mean, &sum_terms)
    return -s.half_log_det + 0.5 * s.quad_b + sum_terms


cdef int _sparse_current(void* ctx) noexcept nogil:
    # the factor of the current sites (the trials used their own buffers)
    cdef SparseStudentTState* s = <SparseStudentTState*>ctx
    return sparse_rebuild(s.Vt, s.n, s.m, s.site_precision, s.site_natural_mean, s.post_factor,
                          s.post_w_mean, s.g_mean, s.g_var, s.scratch, s.rows, &s.half_log_det,
                          &s.quad_b, NULL)


cdef class SparseStudentTEP(FractionalEP):
    """Sparse fractional EP that allows negative site precisions (robust Student-t
    regression), bound to one projection, its targets and likelihood.

    The parallel schedule of :class:`DenseStudentTEP` on the FITC/DTC representation of
    :mod:`fastep._epcore.sparse_ep` (module docstring, "Sparse models"). The evidence is
    :func:`fastep._epcore.sparse_ep.log_marginal_likelihood`'s power-EP energy, which for
    negative sites is the fractional EP energy of Jylänki, Vanhatalo & Vehtari, "Robust
    Gaussian process regression with a Student-t likelihood" (JMLR 2011, eq 14). Built once
    (the quadrature rule and the work arrays: the trial factor, the target and trial sites);
    :meth:`run` iterates from given sites. One run at a time per engine, as
    :class:`DenseStudentTEP`.

    Parameters
    ----------
    Vt : ndarray (n, m), C-contiguous
        Projections ``v_i = L⁻¹ k_m(x_i)`` (:func:`fastep._epcore.sparse_ep.sparse_projection`).
    d : ndarray (n,) >= 0
        FITC diagonal ``K_ii - Q_ii`` (zeros: DTC).
    y : ndarray (n,)
        Finite targets.
    spec : SiteSpec
        The likelihood (``StudentT(...).site_spec()``).
    options : StudentTEPOptions, optional
        As :class:`DenseStudentTEP` (``n_quadrature`` applies here).
    validate : bool, default True
        Check Vt, d, y (and that the likelihood supports the options' power) here, the sites
        and outputs at every :meth:`run`.

    Raises
    ------
    ValueError
        (``validate``) bad shapes or non-finite inputs.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep import StudentT
    >>> from fastep._epcore import sparse_ep, student_t_ep
    >>> x = np.linspace(-3, 3, 30)[:, None]
    >>> z = np.linspace(-3, 3, 8)[:, None]
    >>> k = lambda a, b: np.exp(-0.5 * (a - b.T) ** 2)
    >>> _, Vt, d = sparse_ep.sparse_projection(k(z, z), k(x, z), np.ones(30), jitter=1e-8)
    >>> y = np.sin(x[:, 0])
    >>> y[::7] += 4.0
    >>> engine = student_t_ep.SparseStudentTEP(Vt, d, y, StudentT(4.0, 0.1).site_spec(),
    ...                                   student_t_ep.StudentTEPOptions(tol=1e-6))
    >>> tau, nu = np.zeros(30), np.zeros(30)
    >>> result = engine.run(tau, nu, np.empty((8, 8)), np.empty(8))
    >>> bool(result.converged)
    True
    """

    def __init__(self, const double[:, ::1] Vt not None, const double[::1] d not None,
                 const double[::1] y not None, SiteSpec spec not None, StudentTEPOptions options=None,
                 *, bint validate=True):
        cdef int n = Vt.shape[0], m = Vt.shape[1]
        self._configure(n, options, validate, 3.0 * m * m)
        if validate:
            _check_projection(Vt, d)
            _check_vector("y", y, n)
            _check_power(self.power, spec, self.options.n_quadrature)
        self.Vt, self.d, self.y, self.spec = Vt, d, y, spec
        self.m, self.n_quadrature = m, self.options.n_quadrature
        self.quadrature = PowerQuadrature(self.power, self.n_quadrature)
        if n == 0:
            return
        cdef int rows = scratch_rows(n, m)
        # rows of vec: target τ, target ν, trial τ, trial ν, trial E[g], trial Var[g]
        self.buffers = (np.empty((rows, m)), np.empty((m, m)), np.empty(m), np.empty((6, n)))
        cdef double[:, ::1] scratch = self.buffers[0]
        cdef double[:, ::1] trial_factor = self.buffers[1]
        cdef double[::1] trial_w = self.buffers[2]
        cdef double[:, ::1] vec = self.buffers[3]
        cdef SparseStudentTState* s = &self.state
        s.model, s.rule = &spec.model, &self.quadrature.rule
        s.Vt, s.d, s.y = &Vt[0, 0], &d[0], &y[0]
        s.n, s.m, s.rows, s.power, s.scratch = n, m, rows, self.power, &scratch[0, 0]
        s.trial_factor, s.trial_w = &trial_factor[0, 0], &trial_w[0]
        s.trial_g_mean, s.trial_g_var = &vec[4, 0], &vec[5, 0]
        s.target_precision, s.target_natural_mean = &vec[0, 0], &vec[1, 0]
        self.step.target_precision, self.step.target_natural_mean = &vec[0, 0], &vec[1, 0]
        self.step.trial_precision, self.step.trial_natural_mean = &vec[2, 0], &vec[3, 0]
        self.step.trial, self.step.adopt = _sparse_trial, _sparse_adopt
        self.step.targets, self.step.current = _sparse_energy, _sparse_current
        self.step.ctx = s

    def _check_run(self, site_precision, site_natural_mean, post_factor, post_w_mean, g_mean, g_var):
        _check_vector("site_precision", site_precision, self.n)
        _check_vector("site_natural_mean", site_natural_mean, self.n)
        _check_marginal_outputs(g_mean, g_var, self.n)
        _check_factor_outputs(post_factor, post_w_mean, self.m)

    def run(self, double[::1] site_precision not None, double[::1] site_natural_mean not None,
            double[:, ::1] post_factor not None, double[::1] post_w_mean not None, *,
            double[::1] g_mean=None, double[::1] g_var=None, object sweep_callback=None):
        """Iterate from the given sites to convergence (or ``max_sweeps``, or a stuck iteration).

        Parameters
        ----------
        site_precision, site_natural_mean : ndarray (n,), in/out
            Sites on the projections, of any sign, giving a proper start (zeros: a cold
            start); updated in place.
        post_factor : ndarray (m, m), out
            Upper-triangular R with ``Rᵀ R = A = I + Vtᵀ diag(τ) Vt`` of the final sites.
        post_w_mean : ndarray (m,), out
            μ_w = A⁻¹ Vtᵀ ν.
        g_mean, g_var : ndarray (n,), out, optional
            E[g] and Var[g] of the final posterior.
        sweep_callback : callable or None
            As :meth:`DenseStudentTEP.run`.

        Returns
        -------
        StudentTEPResult
            As :meth:`DenseStudentTEP.run`.

        Raises
        ------
        ValueError
            (``validate``) bad shapes, non-finite sites.
        numpy.linalg.LinAlgError
            ``A`` is not positive definite at the start sites (an improper start posterior).
        """
        if self.validate:
            self._check_run(site_precision, site_natural_mean, post_factor, post_w_mean, g_mean, g_var)
        if self.n == 0:
            np.asarray(post_factor)[:] = np.eye(self.m)
            np.asarray(post_w_mean)[:] = 0.0
        cdef double[::1] gm = np.empty(self.n) if g_mean is None else g_mean
        cdef double[::1] gv = np.empty(self.n) if g_var is None else g_var
        cdef SparseStudentTState* s = &self.state
        s.post_factor, s.post_w_mean, s.g_mean, s.g_var = &post_factor[0, 0], &post_w_mean[0], &gm[0], &gv[0]
        s.site_precision, s.site_natural_mean = &site_precision[0], &site_natural_mean[0]
        return self._sweeps(site_precision, site_natural_mean, sweep_callback, "A = I + Vt^T T Vt")
