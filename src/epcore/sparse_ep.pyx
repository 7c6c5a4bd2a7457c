# cython: language_level=3
"""Sparse GP EP with inducing inputs: EP-FITC, EP-DTC and power EP in O(nm) memory.

Equations: the tutorial slides *Expectation Propagation for Gaussian Processes* (slides "Sparse EP", "EP-FITC (aka
generalized FITC)", "EP-DTC", "EP variants"); the site algebra is Minka's (quick reference,
eqs 17-19, 78-83, 87-88) with the power-EP generalisation (Minka 2004; Bui, Yan & Turner
2017 for pseudo-point models).  The plain-numpy twin is :mod:`fastep.reference.sparse_ep`,
whose docstring derives every formula used here.

Model and representation
------------------------
m inducing inputs, ``L = chol(K_mm + jitter I)``, projections ``v_i = L⁻¹ k_m(x_i)`` (rows of
``Vt``, n x m), ``g = Vt w`` with ``w ~ N(0, I_m)`` so that ``Cov(g) = Q_nn``, and
``f_i = g_i + ε_i``, ``ε_i ~ N(0, d_i)``: FITC ``d_i = K_ii - Q_ii``, DTC ``d_i = 0``
(slide "Sparse EP").  Sites act on the projections (slide "EP-FITC": predictions depend on u),
``t_i(g_i) = exp(-τ_i g_i²/2 + ν_i g_i)``; the posterior over w is

    A = I + Vtᵀ diag(τ) Vt = Rᵀ R,     μ_w = A⁻¹ Vtᵀ ν,
    E[g_i] = v_iᵀ μ_w,                 Var[g_i] = |R⁻ᵀ v_i|²,

the "generalized FITC" representation of Naish-Guzman & Holden: the diagonal ``d``, the
projection ``Vt`` and the m x m triangular factor ``R``.  Memory O(nm): ``Vt`` plus O(n + m²).
For power 1 these sites are equivalent to dense EP on the explicit prior ``Q + diag(d)`` (a
Gaussian site on f_i of precision ``τ_i / (1 - d_i τ_i)``); tests check that equality.

One site and the powered moments
--------------------------------
``power_site_step`` and ``power_site_moments`` of :mod:`fastep._epcore.power_ep` (the cavity of
``g_i``, the likelihood to the power α at the cavity of ``f_i``, the damped new site and the
negative-precision policy). Student-t sites, whose precisions must be allowed to go negative,
have their own parallel schedule with step halving in :mod:`fastep._epcore.student_t_ep`.

Sequential sweep (``sparse_sweep_sequential``): O(m²) per site
--------------------------------------------------------------
During a sweep the mean is carried as ``β = R⁻ᵀ Vtᵀ ν`` (μ_w = R⁻¹ β).  Per site:
``w = R⁻ᵀ v_i`` (one trsv), ``s = Var[g_i] = |w|²``, ``h = E[g_i] = wᵀβ``, the site step, then
with ``Δτ, Δν``: ``β += Δν w`` (the new ``b = Vtᵀ ν`` under the old R) and ``R`` by a rank-1
Cholesky update (Δτ > 0) or downdate (Δτ < 0) with ``x = sqrt|Δτ| v_i``
(``cholesky_rank1``: Givens / hyperbolic rotations on the rows of R), the same rotations
applied to ``[β; 0]`` so that ``Rᵀβ`` (= b) is preserved.  One triangular solve and one
rotation pass per site, about 3m² flops.  If a downdate fails through rounding (A >= I in exact
arithmetic, so this is a symptom of drift), R and β are rebuilt at once and the event is
counted (``n_rebuilds``).

Rebuild (``sparse_rebuild``): O(nm² + m³), after every sweep / parallel iteration
--------------------------------------------------------------------------------------
``A = I + Σ_i τ_i v_i v_iᵀ`` by ``syrk`` over row blocks of ``Vt`` scaled by ``sqrt(τ)``,
``R = chol(A)`` (``potrf``), ``μ_w = A⁻¹ Vtᵀ ν`` (gemv, two trsv), ``E[g] = Vt μ_w`` (gemv),
``Var[g_i] = |R⁻ᵀ v_i|²`` (right-side ``trsm`` on row blocks), ``½ log|A| = Σ log R_kk`` and
``bᵀA⁻¹b = |R⁻ᵀ Vtᵀ ν|²``.  This removes the drift of the rank-1 updates; tests check that
a rebuild after a sweep changes the sweep's R and μ_w by ≲ 1e-10.

Evidence (``sparse_log_z``), Minka's power-EP energy (α = 1: eqs 87-88)
-----------------------------------------------------------------------
    log Z = -½ log|A| + ½ bᵀA⁻¹b + Σ_i (1/α) [log Z_i + Ψ(τ_c, ν_c) - Ψ(1/s_i, h_i/s_i)],

``Ψ(τ, ν) = ½ log 2π - ½ log τ + ν²/(2τ)``, where the bracket's Ψ difference is evaluated as
``-½ log1p(-α τ_i s_i) + ½ v_c (α² ν_i² - 2 α ν_i h_i/s_i + α τ_i h_i²/s_i)`` (no cancellation
for small sites).  O(n) given the rebuild.  For a Gaussian likelihood it equals the closed-form
FITC, DTC and power-EP regression evidence at the fixed point.

Convergence and schedules
-------------------------
As :mod:`fastep._epcore.gp_ep`: after each sweep's rebuild the run has converged when the
largest relative site change (_common's SweepStats) and the relative change of log Z are
below ``tol`` and no site failed.  ``SPARSE_SEQUENTIAL`` (orders: fixed, or a seeded random
permutation per sweep from gp_ep's splitmix64 Fisher-Yates) or ``SPARSE_PARALLEL`` (all sites
from one posterior, damped, then a rebuild).

Python API
----------
``sparse_projection`` (Cholesky of ``K_mm + jitter I``, ``Vt`` and ``d``), ``SparseEP`` (the
engine: built once from the projection, ``run`` sweeps from given sites;
``incremental_sweep``, a test hook, performs one sweep without the rebuild),
``log_marginal_likelihood`` (from scratch), ``power_moments_array`` (the powered site kernel
over arrays, for gradients and tests) and ``rebuild`` (a test hook: the representation from
the sites).
"""
import numpy as np

from libc.math cimport sqrt, log, log1p, exp, fabs, isfinite, INFINITY, NAN
from libc.stdint cimport uint64_t
from libc.string cimport memcpy, memset
from fastep._epcore._blas cimport (
    UPPER, LOWER, NO_TRANS, TRANS, LEFT, RIGHT,
    ddot, daxpy, dscal, dcopy, gemv, gemv_t, syrk, trsv, potrf, trsm_right,
)
from fastep._epcore.sites cimport (
    SiteModel, SiteSpec, site_moments, LIK_GAUSSIAN, LIK_ORDINAL, LIK_STUDENT_T, GH_MAX_NODES, SITE_OK,
    SITE_BAD_PARAMS,
)
from fastep._epcore._common cimport (
    SiteUpdateOptions, SweepStats, sweep_stats_reset, sweep_stats_record,
    NEGATIVE_CLIP, NEGATIVE_SKIP, NEGATIVE_ALLOW, STEP_APPLIED, STEP_CLIPPED, STEP_SKIPPED, STEP_FAILED,
    random_permutation, interrupt_requested, natural_update_options, SweepDriver,
    EngineOptions, SweepResult, SweepSettings,
)
from fastep._epcore._common import _check_no_aliasing, _check_targets, _check_vector
from fastep._epcore.power_ep cimport PowerRule, PowerQuadrature, power_site_moments, power_site_step
from fastep._epcore.power_ep import DEFAULT_N_QUADRATURE, _check_power, _check_power_range, power_moments_array
from fastep._epcore.gp_ep import ORDER_FIXED, ORDER_RANDOM

for _member in SparseSchedule:
    globals()[_member.name] = int(_member)
del _member
globals().update(NEGATIVE_CLIP=int(NEGATIVE_CLIP), NEGATIVE_SKIP=int(NEGATIVE_SKIP),
                 NEGATIVE_ALLOW=int(NEGATIVE_ALLOW), ORDER_FIXED=ORDER_FIXED,
                 ORDER_RANDOM=ORDER_RANDOM)

cdef double _LOG_2PI = 1.8378770664093454836

# The inner loop of one rotation in ``cholesky_rank1`` as C with restrict pointers, so that the
# compiler vectorises it without a runtime aliasing check (row and x never overlap).
cdef extern from *:
    """
    static inline void fastep_sparse_rotate_row(double* __restrict row, double* __restrict x,
                                                Py_ssize_t count, double ss, double inv_c,
                                                double c, double s) {
        for (Py_ssize_t j = 0; j < count; ++j) {
            double xj = x[j];
            double rkj = (row[j] + ss * xj) * inv_c;
            row[j] = rkj;
            x[j] = c * xj - s * rkj;
        }
    }
    """
    void fastep_sparse_rotate_row(double* row, double* x, Py_ssize_t count, double ss, double inv_c,
                                  double c, double s) noexcept nogil



# --------------------------------------------------------------------------- #
# factor updates, sweeps, rebuild, evidence
# --------------------------------------------------------------------------- #

cdef int cholesky_rank1(double* R, int m, double* x, bint downdate, double* beta) noexcept nogil:
    """R ← chol(RᵀR ± x xᵀ) in place for upper-triangular row-major R; ``x`` is destroyed.

    Rotations on the rows of R (Givens for an update, hyperbolic for a downdate), O(m²).  If
    ``beta`` is not NULL the same rotations are applied to the column ``[beta; 0]`` appended to
    ``[R; xᵀ]``, which keeps ``Rᵀ beta`` unchanged: afterwards ``beta = R_new⁻ᵀ (R_oldᵀ beta)``.
    Returns 0, or k + 1 if the downdate makes the leading (k+1) x (k+1) block not positive
    definite (R is then partly modified and must be rebuilt).
    """
    cdef Py_ssize_t k, mm = m
    cdef double rkk, xk, r2, r, c, inv_c, s, ss, eta = 0.0, bk
    cdef double sign = -1.0 if downdate else 1.0
    cdef double* row
    for k in range(mm):
        row = R + k * mm
        rkk = row[k]
        xk = x[k]
        if xk == 0.0:
            continue
        r2 = rkk * rkk + sign * xk * xk
        if not (r2 > 0.0 and rkk > 0.0):
            return <int>(k + 1)
        r = sqrt(r2)
        c = r / rkk
        inv_c = rkk / r
        s = xk / rkk
        ss = sign * s
        row[k] = r
        fastep_sparse_rotate_row(row + k + 1, x + k + 1, mm - k - 1, ss, inv_c, c, s)
        if beta != NULL:
            bk = (beta[k] + ss * eta) * inv_c
            beta[k] = bk
            eta = c * eta - s * bk
    return 0


cdef int sparse_sweep_sequential(const SiteModel* model, const PowerRule* rule, const double* y,
                                 const double* Vt, const double* d, int n, int m,
                                 double* site_precision, double* site_natural_mean,
                                 double* R, double* beta, const int* perm,
                                 double* w, double* z, double* scratch, int scratch_rows,
                                 const SiteUpdateOptions* opts, SweepStats* stats) noexcept nogil:
    """One sequential sweep (module docstring) on ``R`` and ``beta = R⁻ᵀ Vtᵀ ν`` (so that
    ``E[g_i] = wᵀ beta`` with ``w = R⁻ᵀ v_i``, and μ_w = R⁻¹ beta).  ``w``, ``z``: m doubles
    each; ``scratch`` (scratch_rows x m) is used only to rebuild after a failed downdate.

    Per site: one trsv (w), the site step, ``beta += Δν w`` (beta = R⁻ᵀ of the new Vtᵀ ν) and
    the rank-1 Cholesky update/downdate of R carrying beta along (``cholesky_rank1``).
    Returns the number of rebuilds after failed downdates, or -(potrf info) if one failed.
    """
    cdef int t, i, result, n_rebuilds = 0, info
    cdef double tau_old, nu_old, s, h, d_tau, d_nu, dummy1, dummy2
    cdef const double* v
    sweep_stats_reset(stats)
    for t in range(n):
        if interrupt_requested(stats):
            return n_rebuilds
        i = perm[t] if perm != NULL else t
        v = Vt + <Py_ssize_t>i * m
        dcopy(m, v, 1, w, 1)
        trsv(UPPER, TRANS, m, R, m, w)            # Rᵀ w = v
        s = ddot(m, w, 1, w, 1)                  # Var[g_i] = vᵀ A⁻¹ v
        h = ddot(m, w, 1, beta, 1)               # E[g_i] = vᵀ A⁻¹ b
        tau_old = site_precision[i]
        nu_old = site_natural_mean[i]
        result = power_site_step(model, rule, y[i], h, s, d[i], &site_precision[i],
                                 &site_natural_mean[i], opts)
        sweep_stats_record(stats, result, tau_old, nu_old, site_precision[i], site_natural_mean[i])
        if not (result == STEP_APPLIED or result == STEP_CLIPPED):
            continue
        d_tau = site_precision[i] - tau_old
        d_nu = site_natural_mean[i] - nu_old
        if d_nu != 0.0:
            daxpy(m, d_nu, w, 1, beta, 1)        # b += Δν v
        if d_tau != 0.0:
            dcopy(m, v, 1, z, 1)
            dscal(m, sqrt(fabs(d_tau)), z, 1)
            if cholesky_rank1(R, m, z, d_tau < 0.0, beta) != 0:
                n_rebuilds += 1
                info = sparse_rebuild(Vt, n, m, site_precision, site_natural_mean, R, z,
                                      NULL, NULL, scratch, scratch_rows, &dummy1, &dummy2, beta)
                if info != 0:
                    return -info
    return n_rebuilds


cdef void _beta_from_w_mean(const double* R, int m, const double* w_mean, double* beta) noexcept nogil:
    """beta = R μ_w (upper-triangular row-major R)."""
    cdef Py_ssize_t i, mm = m
    for i in range(mm):
        beta[i] = ddot(<int>(mm - i), R + i * mm + i, 1, w_mean + i, 1)


cdef void sparse_parallel_update(const SiteModel* model, const PowerRule* rule, const double* y,
                                 const double* d, int n, double* site_precision,
                                 double* site_natural_mean, const double* g_mean,
                                 const double* g_var, const SiteUpdateOptions* opts,
                                 SweepStats* stats) noexcept nogil:
    """Every site from the same marginals (E[g], Var[g]); the representation is not touched."""
    cdef int i, result
    cdef double tau_old, nu_old
    sweep_stats_reset(stats)
    for i in range(n):
        tau_old = site_precision[i]
        nu_old = site_natural_mean[i]
        result = power_site_step(model, rule, y[i], g_mean[i], g_var[i], d[i], &site_precision[i],
                                 &site_natural_mean[i], opts)
        sweep_stats_record(stats, result, tau_old, nu_old, site_precision[i], site_natural_mean[i])


cdef void sparse_natural_sums(const double* Vt, int n, int m, const double* site_precision,
                              const double* site_natural_mean, double* precision_sum,
                              double* natural_mean_sum, double* scratch, int scratch_rows) noexcept nogil:
    """``precision_sum += Σ_i τ_i v_i v_iᵀ`` (upper triangle, row-major) and
    ``natural_mean_sum = Vtᵀ ν``: the sites' share of A and b (one chunk's contribution in
    the distributed parallel schedule). ``scratch``: scratch_rows x m doubles. Negative τ_i
    (Student-t sites) are subtracted by a second ``syrk`` pass."""
    cdef Py_ssize_t i, j, r0, cnt, mm = m, rows = scratch_rows
    cdef double si
    cdef double* row
    cdef const double* src
    cdef bint any_negative = False
    r0 = 0
    while r0 < n:
        cnt = rows if n - r0 > rows else n - r0
        for i in range(cnt):
            si = site_precision[r0 + i]
            if si < 0.0:
                any_negative = True
            si = sqrt(si) if si > 0.0 else 0.0
            row = scratch + i * mm
            src = Vt + (r0 + i) * mm
            for j in range(mm):
                row[j] = si * src[j]
        syrk(UPPER, m, <int>cnt, 1.0, scratch, m, 1.0, precision_sum, m)
        r0 += cnt
    r0 = 0
    while any_negative and r0 < n:          # negative sites (Student-t): subtract |τ_i| v_i v_iᵀ
        cnt = rows if n - r0 > rows else n - r0
        for i in range(cnt):
            si = site_precision[r0 + i]
            si = sqrt(-si) if si < 0.0 else 0.0
            row = scratch + i * mm
            src = Vt + (r0 + i) * mm
            for j in range(mm):
                row[j] = si * src[j]
        syrk(UPPER, m, <int>cnt, -1.0, scratch, m, 1.0, precision_sum, m)
        r0 += cnt
    if n > 0:
        gemv_t(n, m, 1.0, Vt, m, site_natural_mean, 0.0, natural_mean_sum)
    else:
        memset(natural_mean_sum, 0, mm * sizeof(double))


cdef void sparse_marginal_variances(const double* Vt, int n, int m, const double* R, double* g_var,
                                    double* scratch, int scratch_rows) noexcept nogil:
    """``g_var[i] = |R⁻ᵀ v_i|²`` = Var[g_i] for the upper-triangular factor R of A (row
    blocks of one right-side trsm each). ``scratch``: scratch_rows x m doubles."""
    cdef Py_ssize_t i, k, r0, cnt, mm = m, rows = scratch_rows
    cdef double acc
    cdef double* row
    r0 = 0
    while r0 < n:
        cnt = rows if n - r0 > rows else n - r0
        dcopy(<int>(cnt * mm), Vt + r0 * mm, 1, scratch, 1)
        trsm_right(UPPER, NO_TRANS, <int>cnt, m, 1.0, R, m, scratch, m)   # rows v_iᵀ R⁻¹
        for i in range(cnt):
            row = scratch + i * mm
            acc = 0.0
            for k in range(mm):
                acc += row[k] * row[k]
            g_var[r0 + i] = acc
        r0 += cnt


cdef int sparse_rebuild(const double* Vt, int n, int m, const double* site_precision,
                        const double* site_natural_mean, double* R, double* w_mean,
                        double* g_mean, double* g_var, double* scratch, int scratch_rows,
                        double* half_log_det_a, double* quad_b, double* beta) noexcept nogil:
    """R, μ_w (and, unless NULL, E[g], Var[g] and beta = R⁻ᵀ b) from the sites; ½ log|A| and bᵀA⁻¹b.

    ``scratch``: scratch_rows x m doubles.  Returns 0 or potrf's info (A is SPD in exact
    arithmetic, so a failure means non-finite input).
    """
    cdef Py_ssize_t i, j, mm = m
    cdef double acc
    cdef int info
    for i in range(mm):
        memset(R + i * mm, 0, mm * sizeof(double))
        R[i * mm + i] = 1.0
    sparse_natural_sums(Vt, n, m, site_precision, site_natural_mean, R, w_mean, scratch,
                        scratch_rows)                               # upper A; w_mean = b = Vtᵀ ν
    info = potrf(UPPER, m, R, m)                                    # A = Rᵀ R
    if info != 0:
        return info
    acc = 0.0
    for i in range(mm):
        acc += log(R[i * mm + i])
        for j in range(i):
            R[i * mm + j] = 0.0
    half_log_det_a[0] = acc
    trsv(UPPER, TRANS, m, R, m, w_mean)                              # R⁻ᵀ b
    quad_b[0] = ddot(m, w_mean, 1, w_mean, 1)
    if beta != NULL:
        dcopy(m, w_mean, 1, beta, 1)
    trsv(UPPER, NO_TRANS, m, R, m, w_mean)                             # A⁻¹ b
    if g_mean != NULL:
        gemv(n, m, 1.0, Vt, m, w_mean, 0.0, g_mean)
    if g_var != NULL:
        sparse_marginal_variances(Vt, n, m, R, g_var, scratch, scratch_rows)
    return 0


cdef double sparse_log_z(const SiteModel* model, const PowerRule* rule, const double* y,
                         const double* d, int n, const double* site_precision,
                         const double* site_natural_mean, const double* g_mean,
                         const double* g_var, double half_log_det_a, double quad_b,
                         int* bad_site) noexcept nogil:
    """Power-EP log Z from a rebuild's marginals (module docstring); NaN with ``bad_site`` set
    if a cavity is improper or the kernel fails there."""
    cdef double power = rule.power
    cdef double total = -half_log_det_a + 0.5 * quad_b, s, h, tau, nu, denom, v_c, m_c
    cdef double log_z = 0.0, a = 0.0, b = 0.0, dt, dn
    cdef int i
    bad_site[0] = -1
    for i in range(n):
        s = g_var[i]
        h = g_mean[i]
        tau = site_precision[i]
        nu = site_natural_mean[i]
        dt = power * tau
        dn = power * nu
        denom = 1.0 - dt * s
        if not (s >= 0.0 and denom > 0.0):
            bad_site[0] = i
            return NAN
        v_c = s / denom
        m_c = h + v_c * (dt * h - dn)
        if power_site_moments(model, rule, y[i], m_c, v_c + d[i], &log_z, &a, &b) != 0:
            bad_site[0] = i
            return NAN
        # ½ v_c (dn² - 2 dn h/s + dt h²/s) with v_c/s = 1/denom (finite at s = 0: f_i independent of u)
        total += (log_z - 0.5 * log1p(-dt * s)
                  + 0.5 * (v_c * dn * dn + (dt * h * h - 2.0 * dn * h) / denom)) / power
    return total


# --------------------------------------------------------------------------- #
# Python API
# --------------------------------------------------------------------------- #

cdef int scratch_rows(int n, int m) noexcept nogil:
    cdef int rows = 131072 // (m if m > 0 else 1)
    if rows < 64:
        rows = 64
    if rows > n:
        rows = n
    return rows if rows > 0 else 1


def _check_projection(const double[:, ::1] Vt, const double[::1] d):
    cdef Py_ssize_t n = Vt.shape[0]
    if d.shape[0] != n:
        raise ValueError(f"d must have length n = Vt.shape[0] = {n}; got {d.shape[0]}")
    if Vt.shape[1] < 1:
        raise ValueError("Vt must have at least one column (one inducing input)")
    a = np.asarray(Vt)
    if not np.all(np.isfinite(a)):
        i, j = np.argwhere(~np.isfinite(a))[0]
        raise ValueError(f"Vt must be finite; Vt[{i}, {j}] = {a[i, j]!r}")
    _check_vector("d", d, <int>n)
    bad = np.asarray(d) < 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"d must be >= 0 (the FITC diagonal K_ii - Q_ii); d[{i}] = {float(d[i])!r}")
    return <int>n, <int>Vt.shape[1]


cdef class SparseEPOptions(EngineOptions):
    """Options of the sparse (power) EP engine (:class:`SparseEP`), checked once here (read-only).

    Parameters
    ----------
    power : float in (0, 1]
        Power-EP α (1: EP-FITC / EP-DTC). For α < 1 the likelihood needs a pointwise log
        density (probit/ordinal with finite slope, logistic, Gaussian; checked by the engine).
    n_quadrature : int in [1, 256]
        Gauss-Hermite nodes of the powered moments (α < 1, non-Gaussian likelihoods).
    schedule : {SPARSE_SEQUENTIAL, SPARSE_PARALLEL}
    order : {ORDER_FIXED, ORDER_RANDOM}
        Site order of the sequential schedule (random: a seeded permutation per sweep).
    damping : float in (0, 1]
    tol : float > 0
    max_sweeps : int >= 1
    negative_precision : {NEGATIVE_CLIP, NEGATIVE_SKIP}

    Raises
    ------
    ValueError
        A field out of range (the message names it).
    """
    _FIELDS = ("power", "n_quadrature", "schedule", "order", "damping", "tol", "max_sweeps",
               "negative_precision")

    def __init__(self, *, double power=1.0, int n_quadrature=DEFAULT_N_QUADRATURE,
                 int schedule=SPARSE_SEQUENTIAL, int order=ORDER_FIXED, double damping=1.0,
                 double tol=1e-8, int max_sweeps=100, int negative_precision=NEGATIVE_CLIP):
        _check_power_range(power, n_quadrature)
        if schedule not in (SPARSE_SEQUENTIAL, SPARSE_PARALLEL):
            raise ValueError(f"schedule must be SPARSE_SEQUENTIAL (0) or SPARSE_PARALLEL (1); got {schedule}")
        if order not in (ORDER_FIXED, ORDER_RANDOM):
            raise ValueError(f"order must be ORDER_FIXED (0) or ORDER_RANDOM (1); got {order}")
        self.set_sweep(damping, tol, max_sweeps, 1, True)
        self.set_negative_precision(negative_precision,
                                    "sparse EP (site precisions stay >= 0 so that A = I + Vtᵀ T Vt >= I)")
        self.sweep.schedule, self.sweep.order = schedule, order
        self.power = power
        self.n_quadrature = n_quadrature


_DEFAULT_OPTIONS = SparseEPOptions()


def _check_marginal_outputs(g_mean, g_var, int n):
    """E[g] / Var[g] output buffers (None allowed) must have length n."""
    for name, arr in (("g_mean", g_mean), ("g_var", g_var)):
        if arr is not None and arr.shape[0] != n:
            raise ValueError(f"{name} must have shape ({n},); got ({arr.shape[0]},)")


def _check_factor_outputs(R, w_mean, int m):
    if R.shape[0] != m or R.shape[1] != m:
        raise ValueError(f"post_factor must have shape ({m}, {m}); got ({R.shape[0]}, {R.shape[1]})")
    if w_mean.shape[0] != m:
        raise ValueError(f"post_w_mean must have length m = {m}; got {w_mean.shape[0]}")


cdef uint64_t EXPONENT_BITS = 0x7ff0000000000000ULL     # of an IEEE double


cdef inline bint _has_non_finite(const double* x, Py_ssize_t count) noexcept nogil:
    """Whether ``x[0:count]`` holds an infinity or a NaN: the exponent bits all ones, tested
    branch-free on the bit patterns (the loop vectorises)."""
    cdef uint64_t acc = 0, bits
    cdef Py_ssize_t j
    for j in range(count):
        memcpy(&bits, x + j, 8)
        acc |= ((bits & EXPONENT_BITS) ^ EXPONENT_BITS) - 1     # top bit set iff all ones
    return (acc >> 63) != 0


cdef Py_ssize_t _first_non_finite_rows(const double* a, Py_ssize_t rows, Py_ssize_t cols,
                                       Py_ssize_t stride) noexcept nogil:
    """Flat index ``i * cols + j`` of the first non-finite entry of a strided matrix, or -1."""
    cdef Py_ssize_t i, j
    cdef const double* row
    for i in range(rows):
        row = a + i * stride
        if _has_non_finite(row, cols):
            for j in range(cols):
                if not isfinite(row[j]):
                    return i * cols + j
    return -1


def sparse_projection(const double[:, ::1] Kmm, double[:, ::1] Knm, const double[::1] kdiag, *,
                      approximation="fitc", double jitter=0.0, bint overwrite_knm=False):
    """Prior representation of FITC / DTC: ``L = chol(K_mm + jitter I)``, ``Vt = K_nm L⁻ᵀ``, ``d``.

    The inputs are checked (shapes, finiteness, ``jitter``, ``approximation``) before
    anything is computed or overwritten; the checks are one pass over each input, small
    beside the O(nm²) triangular solve.

    Parameters
    ----------
    Kmm : (m, m) float64
        Kernel matrix of the inducing inputs (symmetric; only its lower triangle is read).
    Knm : (n, m) float64
        Cross-covariances k(x_i, z_j).  Overwritten by ``Vt`` if ``overwrite_knm`` (saves one
        n x m array; the O(nm) memory of the engine is then this one array).
    kdiag : (n,) float64
        Prior variances k(x_i, x_i) (only read for FITC).
    approximation : {"fitc", "dtc"}
    jitter : float >= 0
        Added to the diagonal of K_mm before its Cholesky factorisation.  It also enters Q:
        ``Q_nn = K_nm (K_mm + jitter I)⁻¹ K_mn``, which only decreases Q (so ``d`` stays >= 0).
    overwrite_knm : bool, default False
        Return ``Vt`` in the ``Knm`` buffer itself.

    Returns
    -------
    L : (m, m) lower-triangular Cholesky factor of ``K_mm + jitter I``
    Vt : (n, m) rows ``v_i = L⁻¹ k_m(x_i)`` (the ``Knm`` buffer itself if ``overwrite_knm``)
    d : (n,) ``max(k(x_i, x_i) - |v_i|², 0)`` for FITC (negative values are rounding: Q <= K
        for a PSD kernel), zeros for DTC.

    Raises
    ------
    ValueError
        Bad shapes, non-finite input, negative jitter, unknown approximation.
    numpy.linalg.LinAlgError
        ``K_mm + jitter I`` is not numerically positive definite (increase ``jitter``).
    """
    cdef int m = Kmm.shape[0], n = Knm.shape[0], info, i, j
    cdef Py_ssize_t bad = -1
    if approximation not in ("fitc", "dtc"):
        raise ValueError(f"approximation must be 'fitc' or 'dtc'; got {approximation!r}")
    if Kmm.shape[1] != m:
        raise ValueError(f"Kmm must be square; got shape ({Kmm.shape[0]}, {Kmm.shape[1]})")
    if m < 1:
        raise ValueError("Kmm must have at least one row (one inducing input)")
    if Knm.shape[1] != m:
        raise ValueError(f"Knm must have m = {m} columns (one per inducing input); got {Knm.shape[1]}")
    if kdiag.shape[0] != n:
        raise ValueError(f"kdiag must have length n = Knm.shape[0] = {n}; got {kdiag.shape[0]}")
    if not (jitter >= 0.0 and isfinite(jitter)):
        raise ValueError(f"jitter must be finite and >= 0; got {jitter}")
    with nogil:
        bad = _first_non_finite_rows(&Kmm[0, 0], m, m, m)
    if bad >= 0:
        raise ValueError("Kmm must be finite")
    if n > 0:
        with nogil:
            bad = _first_non_finite_rows(&Knm[0, 0], n, m, m)
        if bad >= 0:
            raise ValueError("Knm must be finite")
        with nogil:
            bad = _first_non_finite_rows(&kdiag[0], 1, n, n)
        if bad >= 0:
            raise ValueError("kdiag must be finite")
    L = np.array(Kmm, dtype=np.float64, order="C", copy=True)
    cdef double[:, ::1] Lv = L
    for i in range(m):
        Lv[i, i] += jitter
    with nogil:
        info = potrf(LOWER, m, &Lv[0, 0], m)
    if info != 0:
        raise np.linalg.LinAlgError(
            f"Cholesky factorisation of K_mm + jitter I failed (leading minor of order {info} is not "
            f"positive; jitter = {jitter:g}): the inducing inputs are (nearly) duplicated or the kernel "
            "matrix is numerically singular; increase jitter")
    for i in range(m):
        for j in range(i + 1, m):
            Lv[i, j] = 0.0
    Vt = np.asarray(Knm) if overwrite_knm else np.array(Knm, dtype=np.float64, order="C", copy=True)
    cdef double[:, ::1] Vv = Vt
    if n > 0:
        with nogil:
            trsm_right(LOWER, TRANS, n, m, 1.0, &Lv[0, 0], m, &Vv[0, 0], m)    # X Lᵀ = K_nm
    if approximation == "dtc":
        d = np.zeros(n)
    else:
        d = np.asarray(kdiag, dtype=np.float64) - np.einsum("ij,ij->i", Vt, Vt)
        np.maximum(d, 0.0, out=d)
    return L, Vt, d


cdef class SparseEPResult(SweepResult):
    """The :class:`~fastep._epcore._common.SweepResult` of one :meth:`SparseEP.run` with the
    extra rebuilds of its sequential sweeps (``SparseEPResult(result, n_rebuilds)``).

    Attributes
    ----------
    n_rebuilds : int
        Rebuilds of the factor within the sequential sweeps, after a rank-1 downdate that
        failed through rounding, summed over the run (the rebuild after every sweep is not
        counted; 0 for the parallel schedule).
    """
    _OWN = ("n_rebuilds",)
    _FIELDS = SweepResult._FIELDS + ("n_rebuilds",)

    def __init__(self, SweepResult result=None, long n_rebuilds=0):
        self.copy_common(SweepResult() if result is None else result)
        self.n_rebuilds = n_rebuilds


cdef class SparseEP:
    """Sparse (power) EP bound to one projection, its targets and likelihood (module docstring).

    Built once from validated inputs; :meth:`run` sweeps from given sites to convergence and
    returns a :class:`SparseEPResult`.

    Parameters
    ----------
    Vt : (n, m) float64, C-contiguous
        Projections ``v_i = L⁻¹ k_m(x_i)`` (``sparse_projection``).
    d : (n,) float64 >= 0
        FITC diagonal ``K_ii - Q_ii`` (zeros: DTC).
    y : (n,) float64
        Targets for the site kernel.
    spec : SiteSpec
        Likelihood (``Likelihood.site_spec()``).
    options : SparseEPOptions, optional
        Power, schedule, order, damping and convergence test (default: ``SparseEPOptions()``).
    seed : int >= 0
        Seed of ORDER_RANDOM's generator.
    validate : bool, default True
        Check the inputs here (also that the likelihood supports the options' power) and the
        site and output arrays at every :meth:`run` (ValueError naming the argument).
        ``False`` is the one path for callers that validated them already (the estimators, at
        every optimiser step).

    Examples
    --------
    >>> import numpy as np
    >>> from fastep import Probit
    >>> from fastep._epcore import sparse_ep
    >>> x = np.linspace(-2, 2, 30)[:, None]
    >>> z = np.linspace(-2, 2, 5)[:, None]
    >>> k = lambda a, b: np.exp(-0.5 * (a - b.T) ** 2)
    >>> _, Vt, d = sparse_ep.sparse_projection(k(z, z), k(x, z), np.ones(30), jitter=1e-8)
    >>> engine = sparse_ep.SparseEP(Vt, d, np.sign(x[:, 0]) + 0.0, Probit().site_spec(),
    ...                             sparse_ep.SparseEPOptions(tol=1e-6))
    >>> result = engine.run(np.zeros(30), np.zeros(30), np.empty((5, 5)), np.empty(5))
    >>> result.converged
    True
    """

    def __init__(self, Vt, d, y, SiteSpec spec not None, SparseEPOptions options=None, *,
                 unsigned long seed=0, bint validate=True):
        if options is None:
            options = _DEFAULT_OPTIONS
        if validate:
            self.n, self.m = _check_projection(Vt, d)
            _check_targets(spec, y, self.n)
            _check_power(options.power, spec, options.n_quadrature)
        else:
            self.n, self.m = Vt.shape[0], Vt.shape[1]
        self.Vt, self.d, self.y, self.spec = Vt, d, y, spec
        self.options, self.seed = options, seed
        self.power, self.n_quadrature = options.power, options.n_quadrature
        self.sweep = options.sweep
        self.validate = validate
        self.quadrature = PowerQuadrature(self.power, self.n_quadrature)

    def _check_run(self, site_precision, site_natural_mean, post_factor, post_w_mean, g_mean, g_var):
        cdef int n = self.n
        _check_vector("site_precision", site_precision, n, nonnegative=True)
        _check_vector("site_natural_mean", site_natural_mean, n)
        _check_factor_outputs(post_factor, post_w_mean, self.m)
        outputs = {"site_precision": site_precision, "site_natural_mean": site_natural_mean,
                   "post_factor": post_factor, "post_w_mean": post_w_mean}
        _check_marginal_outputs(g_mean, g_var, n)
        for name, arr in (("g_mean", g_mean), ("g_var", g_var)):
            if arr is not None:
                outputs[name] = arr
        _check_no_aliasing({"Vt": self.Vt, "d": self.d, "y": self.y}, outputs)

    def run(self, double[::1] site_precision, double[::1] site_natural_mean,
            double[:, ::1] post_factor, double[::1] post_w_mean, *,
            double[::1] g_mean=None, double[::1] g_var=None, object sweep_callback=None):
        """Sweep from the given sites to convergence (or ``max_sweeps``).

        Parameters
        ----------
        site_precision, site_natural_mean : (n,) float64, in/out
            Sites on the projections (τ_i >= 0; zeros = cold start). Updated in place.
        post_factor : (m, m) float64, out
            Upper-triangular R with ``Rᵀ R = A = I + Vtᵀ diag(τ) Vt`` (strict lower triangle zero).
        post_w_mean : (m,) float64, out
            μ_w = A⁻¹ Vtᵀ ν.
        g_mean, g_var : (n,) float64, out, optional
            E[g_i] and Var[g_i] of the returned sites.
        sweep_callback : callable, optional
            ``sweep_callback(sweep, max_change, log_z)`` after every sweep (with the GIL,
            between sweeps). Returning ``False`` stops the sweeps there (``stopped`` is True).
            An exception it raises is re-raised after the sites are restored to their input
            values.

        Returns
        -------
        SparseEPResult
            ``log_z`` is NaN only if a cavity is improper or the kernel fails at the returned
            state (then ``converged`` is False); ``n_rebuilds`` counts the extra rebuilds
            after failed downdates.

        Raises
        ------
        ValueError
            (``validate=True``) bad shapes, non-finite or negative sites, aliasing outputs.
            Nothing is modified.
        numpy.linalg.LinAlgError
            A rebuild's Cholesky factorisation failed (only with non-finite intermediate
            values); the sites are restored.
        """
        if self.validate:
            self._check_run(site_precision, site_natural_mean, post_factor, post_w_mean, g_mean, g_var)
        cdef int n = self.n, m = self.m
        cdef SiteUpdateOptions opts = natural_update_options(self.sweep.damping, self.sweep.negative_precision)
        cdef bint parallel = self.sweep.schedule == SPARSE_PARALLEL
        cdef bint shuffled = self.sweep.order == ORDER_RANDOM and not parallel
        cdef int rows = scratch_rows(n, m)
        cdef double[::1] gm = np.empty(max(n, 1)) if g_mean is None else g_mean
        cdef double[::1] gv = np.empty(max(n, 1)) if g_var is None else g_var
        cdef double[:, ::1] scratch = np.empty((rows, m))
        cdef double[::1] w = np.empty(m)
        cdef double[::1] z = np.empty(m)
        cdef double[::1] beta = np.empty(m)
        cdef int[::1] perm = np.empty(max(n, 1), dtype=np.intc)
        if n == 0:
            np.asarray(post_factor)[:] = np.eye(m)
            np.asarray(post_w_mean)[:] = 0.0
            return SparseEPResult(SweepResult(converged=True, max_change=0.0, log_z=0.0, log_z_change=0.0))
        cdef SweepDriver driver = SweepDriver(self.sweep.tol, self.sweep.max_sweeps, sweep_callback, 3.0 * m * m)
        driver.keep(site_precision, site_natural_mean)

        cdef const double[:, ::1] Vt = self.Vt
        cdef const double[::1] d = self.d
        cdef const double[::1] y = self.y
        cdef const SiteModel* model = &self.spec.model
        cdef const PowerRule* rule = &self.quadrature.rule
        cdef const double* vt_ptr = &Vt[0, 0]
        cdef const double* d_ptr = &d[0]
        cdef const double* y_ptr = &y[0]
        cdef double* tau_ptr = &site_precision[0]
        cdef double* nu_ptr = &site_natural_mean[0]
        cdef double* r_ptr = &post_factor[0, 0]
        cdef double* wm_ptr = &post_w_mean[0]
        cdef double* gm_ptr = &gm[0]
        cdef double* gv_ptr = &gv[0]
        cdef const int* perm_ptr = &perm[0] if shuffled else NULL
        cdef unsigned long long rng_state = self.seed
        cdef SweepStats* stats = driver.begin_sweep()
        cdef int info = 0, failed_sweep = -1, sweep, bad_site = -1, rebuilt
        cdef long total_rebuilds = 0
        cdef double half_log_det = 0.0, quad_b = 0.0, new_log_z
        with nogil:
            info = sparse_rebuild(vt_ptr, n, m, tau_ptr, nu_ptr, r_ptr, wm_ptr, gm_ptr, gv_ptr,
                                  &scratch[0, 0], rows, &half_log_det, &quad_b, &beta[0])
            if info == 0:
                driver.log_z = sparse_log_z(model, rule, y_ptr, d_ptr, n, tau_ptr, nu_ptr, gm_ptr,
                                            gv_ptr, half_log_det, quad_b, &bad_site)
                for sweep in range(1, self.sweep.max_sweeps + 1):
                    if parallel:
                        sparse_parallel_update(model, rule, y_ptr, d_ptr, n, tau_ptr, nu_ptr, gm_ptr,
                                               gv_ptr, &opts, stats)
                    else:
                        if shuffled:
                            random_permutation(n, &perm[0], &rng_state)
                        rebuilt = sparse_sweep_sequential(model, rule, y_ptr, vt_ptr, d_ptr, n, m,
                                                          tau_ptr, nu_ptr, r_ptr, &beta[0], perm_ptr,
                                                          &w[0], &z[0], &scratch[0, 0], rows, &opts,
                                                          stats)
                        if rebuilt < 0:
                            info = -rebuilt
                            failed_sweep = sweep
                            break
                        total_rebuilds += rebuilt
                    if driver.interrupted():
                        break               # Ctrl-C: the sites are restored and the exception raised below
                    driver.record_sweep(sweep)
                    info = sparse_rebuild(vt_ptr, n, m, tau_ptr, nu_ptr, r_ptr, wm_ptr, gm_ptr, gv_ptr,
                                          &scratch[0, 0], rows, &half_log_det, &quad_b, &beta[0])
                    if info != 0:
                        failed_sweep = sweep
                        break
                    new_log_z = sparse_log_z(model, rule, y_ptr, d_ptr, n, tau_ptr, nu_ptr, gm_ptr,
                                             gv_ptr, half_log_det, quad_b, &bad_site)
                    driver.test(new_log_z, driver.log_z)
                    driver.log_z = new_log_z
                    driver.notify(sweep)
                    if driver.converged or driver.stopped:
                        break
        driver.raise_pending()                  # Ctrl-C or the callback raised: inputs back, re-raise
        if info != 0:
            driver.restore()
            where = "for the initial sites" if failed_sweep < 0 else f"after sweep {failed_sweep}"
            raise np.linalg.LinAlgError(
                f"Cholesky factorisation of A = I + Vt^T diag(tau) Vt failed {where} (leading minor of "
                f"order {info}): non-finite projections or sites")
        return SparseEPResult(driver.result(), total_rebuilds)

    def incremental_sweep(self, double[::1] site_precision, double[::1] site_natural_mean,
                          double[:, ::1] post_factor, double[::1] post_w_mean):
        """One sequential sweep on the given representation, without the rebuild.

        A hook for tests and diagnostics: ``post_factor`` and ``post_w_mean`` are updated by
        the rank-1 factor updates only, so they can be compared with :func:`rebuild` of the
        new sites. Fixed order; the engine's power, quadrature, damping and
        negative-precision policy apply (its schedule and order are not used).

        Parameters
        ----------
        site_precision, site_natural_mean : (n,) float64, in/out
            Sites on the projections (τ_i >= 0); updated in place.
        post_factor : (m, m) float64, in/out
            Upper-triangular R of the given sites (e.g. from :func:`rebuild`).
        post_w_mean : (m,) float64, in/out
            μ_w of the given sites.

        Returns
        -------
        dict
            The sweep's ``max_change``, ``n_skipped``, ``n_clipped``, ``n_failed`` and
            ``n_rebuilds``.

        Raises
        ------
        ValueError
            (``validate=True``) bad shapes, non-finite or negative sites.
        """
        cdef int n = self.n, m = self.m
        if self.validate:
            _check_vector("site_precision", site_precision, n, nonnegative=True)
            _check_vector("site_natural_mean", site_natural_mean, n)
            _check_factor_outputs(post_factor, post_w_mean, m)
        cdef const double[:, ::1] Vt = self.Vt
        cdef const double[::1] d = self.d
        cdef const double[::1] y = self.y
        cdef SiteUpdateOptions opts = natural_update_options(self.sweep.damping, self.sweep.negative_precision)
        cdef int rows = scratch_rows(n, m)
        cdef double[:, ::1] scratch = np.empty((rows, m))
        cdef double[::1] w = np.empty(m)
        cdef double[::1] z = np.empty(m)
        cdef double[::1] beta = np.empty(m)
        cdef const SiteModel* model = &self.spec.model
        cdef const PowerRule* rule = &self.quadrature.rule
        cdef SweepStats stats
        cdef int rebuilt = 0
        sweep_stats_reset(&stats)
        stats.interrupt = NULL
        if n > 0:
            with nogil:
                _beta_from_w_mean(&post_factor[0, 0], m, &post_w_mean[0], &beta[0])
                rebuilt = sparse_sweep_sequential(model, rule, &y[0], &Vt[0, 0],
                                                  &d[0], n, m, &site_precision[0], &site_natural_mean[0],
                                                  &post_factor[0, 0], &beta[0], NULL, &w[0], &z[0],
                                                  &scratch[0, 0], rows, &opts, &stats)
                dcopy(m, &beta[0], 1, &post_w_mean[0], 1)
                trsv(UPPER, NO_TRANS, m, &post_factor[0, 0], m, &post_w_mean[0])    # μ_w = R⁻¹ beta
        return dict(max_change=float(max(stats.max_change_precision, stats.max_change_natural_mean)),
                    n_skipped=int(stats.n_skipped), n_clipped=int(stats.n_clipped),
                    n_failed=int(stats.n_failed), n_rebuilds=int(rebuilt))


def _natural_sums(const double[:, ::1] Vt, const double[::1] site_precision,
                  const double[::1] site_natural_mean):
    """``(Σ_i τ_i v_i v_iᵀ, Σ_i ν_i v_i)`` of a block of sites (the first matrix upper
    triangular: its strict lower triangle is zero). The sites' share of
    ``A = I + Vtᵀ diag(τ) Vt`` and ``b = Vtᵀ ν`` (module docstring, "Rebuild"); no input
    checks (callers validate)."""
    cdef int n = Vt.shape[0], m = Vt.shape[1]
    cdef int rows = scratch_rows(n, m)
    precision_sum = np.zeros((m, m))
    natural_mean_sum = np.zeros(m)
    cdef double[:, ::1] P = precision_sum
    cdef double[::1] b = natural_mean_sum
    cdef double[:, ::1] scratch = np.empty((rows, m))
    if n > 0 and m > 0:
        with nogil:
            sparse_natural_sums(&Vt[0, 0], n, m, &site_precision[0], &site_natural_mean[0], &P[0, 0],
                                &b[0], &scratch[0, 0], rows)
    return precision_sum, natural_mean_sum


def _parallel_chunk_step(const double[:, ::1] Vt, const double[::1] d, const double[::1] y,
                         SiteSpec spec not None, const double[::1] site_precision,
                         const double[::1] site_natural_mean, const double[:, ::1] post_factor,
                         const double[::1] post_w_mean, *, double power=1.0,
                         int n_quadrature=DEFAULT_N_QUADRATURE, double damping=1.0,
                         int negative_precision=NEGATIVE_CLIP, bint update=True):
    """One block of sites' share of a parallel sparse EP iteration (the map of a map-reduce).

    Given the posterior of all sites, ``R`` (upper, ``Rᵀ R = A``) and ``μ_w``, this computes
    for the block's sites what the parallel schedule of :meth:`SparseEP.run` computes for
    all of them: the marginals ``E[g_i] = v_iᵀ μ_w`` and ``Var[g_i] = |R⁻ᵀ v_i|²``, their
    evidence terms ``Σ_i (1/α)[log Z_i + Ψ(cavity) - Ψ(marginal)]`` (module docstring,
    "Evidence"; the global ``-½ log|A| + ½ bᵀA⁻¹b`` is the caller's), and, with ``update``,
    the damped parallel site update and the new sites' natural-parameter sums
    (:func:`_natural_sums`).  Summing the blocks' sums, adding the identity and factorising
    gives the next iteration's posterior, so the blocks can live on different machines.
    The input sites are not modified.  No input checks (callers validate).

    Returns
    -------
    dict
        ``g_mean``, ``g_var`` (the block's marginals); ``log_z_sites`` (NaN if a cavity is
        improper or the site kernel fails, ``bad_site`` then the block-local index, else -1);
        with ``update``: ``site_precision``, ``site_natural_mean`` (new arrays),
        ``max_change``, ``n_skipped``, ``n_clipped``, ``n_failed`` (the update's SweepStats),
        ``precision_sum``, ``natural_mean_sum``.
    """
    cdef int n = Vt.shape[0], m = Vt.shape[1]
    cdef PowerQuadrature quadrature = PowerQuadrature(power, n_quadrature)
    cdef SiteUpdateOptions opts = natural_update_options(damping, negative_precision)
    cdef int rows = scratch_rows(n, m)
    g_mean = np.zeros(n)
    g_var = np.zeros(n)
    new_tau = np.array(site_precision, dtype=np.float64, copy=True)
    new_nu = np.array(site_natural_mean, dtype=np.float64, copy=True)
    precision_sum = np.zeros((m, m))
    natural_mean_sum = np.zeros(m)
    cdef double[::1] gm = g_mean
    cdef double[::1] gv = g_var
    cdef double[::1] tau_v = new_tau
    cdef double[::1] nu_v = new_nu
    cdef double[:, ::1] P = precision_sum
    cdef double[::1] b = natural_mean_sum
    cdef double[:, ::1] scratch = np.empty((rows, max(m, 1)))
    cdef SweepStats stats
    cdef int bad_site = -1
    cdef double log_z_sites = 0.0
    sweep_stats_reset(&stats)
    stats.interrupt = NULL
    if n > 0 and m > 0:
        with nogil:
            gemv(n, m, 1.0, &Vt[0, 0], m, &post_w_mean[0], 0.0, &gm[0])
            sparse_marginal_variances(&Vt[0, 0], n, m, &post_factor[0, 0], &gv[0], &scratch[0, 0], rows)
            log_z_sites = sparse_log_z(&spec.model, &quadrature.rule, &y[0], &d[0], n, &site_precision[0],
                                       &site_natural_mean[0], &gm[0], &gv[0], 0.0, 0.0, &bad_site)
            if update:
                sparse_parallel_update(&spec.model, &quadrature.rule, &y[0], &d[0], n, &tau_v[0], &nu_v[0],
                                       &gm[0], &gv[0], &opts, &stats)
                sparse_natural_sums(&Vt[0, 0], n, m, &tau_v[0], &nu_v[0], &P[0, 0], &b[0],
                                    &scratch[0, 0], rows)
    out = dict(g_mean=g_mean, g_var=g_var, log_z_sites=float(log_z_sites), bad_site=int(bad_site))
    if update:
        out.update(site_precision=new_tau, site_natural_mean=new_nu,
                   max_change=float(max(stats.max_change_precision, stats.max_change_natural_mean)),
                   n_skipped=int(stats.n_skipped), n_clipped=int(stats.n_clipped),
                   n_failed=int(stats.n_failed), precision_sum=precision_sum,
                   natural_mean_sum=natural_mean_sum)
    return out


def rebuild(const double[:, ::1] Vt, const double[::1] site_precision,
            const double[::1] site_natural_mean, double[:, ::1] post_factor,
            double[::1] post_w_mean, double[::1] g_mean=None, double[::1] g_var=None):
    """R, μ_w (and E[g], Var[g]) from the sites (the engine's rebuild; a test hook).

    Returns ``(half_log_det_a, quad_b)`` = (½ log|A|, bᵀA⁻¹b).
    """
    cdef int n = Vt.shape[0], m = Vt.shape[1], info
    _check_vector("site_precision", site_precision, n, nonnegative=True)
    _check_vector("site_natural_mean", site_natural_mean, n)
    _check_factor_outputs(post_factor, post_w_mean, m)
    _check_marginal_outputs(g_mean, g_var, n)
    cdef int rows = scratch_rows(n, m)
    cdef double[:, ::1] scratch = np.empty((rows, m))
    cdef double half_log_det = 0.0, quad_b = 0.0
    cdef double* gm_ptr = NULL if g_mean is None else &g_mean[0]
    cdef double* gv_ptr = NULL if g_var is None else &g_var[0]
    if n == 0:
        np.asarray(post_factor)[:] = np.eye(m)
        np.asarray(post_w_mean)[:] = 0.0
        return 0.0, 0.0
    with nogil:
        info = sparse_rebuild(&Vt[0, 0], n, m, &site_precision[0], &site_natural_mean[0],
                              &post_factor[0, 0], &post_w_mean[0], gm_ptr, gv_ptr,
                              &scratch[0, 0], rows, &half_log_det, &quad_b, NULL)
    if info != 0:
        raise np.linalg.LinAlgError(f"Cholesky factorisation of A failed (leading minor of order {info})")
    return float(half_log_det), float(quad_b)


def site_posterior(const double[:, ::1] Vt, const double[::1] site_precision,
                   const double[::1] site_natural_mean, double[:, ::1] post_factor,
                   double[::1] post_w_mean, double[::1] g_mean, double[::1] g_var):
    """The posterior of sites of any sign on the sparse representation (module docstring).

    ``A = I + Vtᵀ T Vt = Rᵀ R`` (negative τ subtracted), ``μ_w = A⁻¹ Vtᵀ ν``, ``E[g] = Vt μ_w``,
    ``Var[g_i] = |R⁻ᵀ v_i|²``.

    Parameters
    ----------
    Vt : ndarray (n, m)
    site_precision, site_natural_mean : ndarray (n,)
        τ (any sign) and ν of the sites.
    post_factor, post_w_mean : ndarray (m, m), (m,)
        Outputs: the upper-triangular R and μ_w.
    g_mean, g_var : ndarray (n,)
        Outputs: E[g] and Var[g].

    Returns
    -------
    tuple of float or None
        ``(½ log|A|, bᵀA⁻¹b)`` with ``b = Vtᵀ ν``, or None if A is not positive definite (the
        posterior is improper; the outputs are then undefined).
    """
    cdef int n = Vt.shape[0], m = Vt.shape[1], info
    _check_vector("site_precision", site_precision, n)
    _check_vector("site_natural_mean", site_natural_mean, n)
    _check_marginal_outputs(g_mean, g_var, n)
    _check_factor_outputs(post_factor, post_w_mean, m)
    if n == 0:
        np.asarray(post_factor)[:] = np.eye(m)
        np.asarray(post_w_mean)[:] = 0.0
        return 0.0, 0.0
    cdef int rows = scratch_rows(n, m)
    cdef double[:, ::1] scratch = np.empty((rows, m))
    cdef double half_log_det = 0.0, quad_b = 0.0
    with nogil:
        info = sparse_rebuild(&Vt[0, 0], n, m, &site_precision[0], &site_natural_mean[0],
                              &post_factor[0, 0], &post_w_mean[0], &g_mean[0], &g_var[0],
                              &scratch[0, 0], rows, &half_log_det, &quad_b, NULL)
    if info != 0:
        return None
    return float(half_log_det), float(quad_b)


def log_marginal_likelihood(const double[:, ::1] Vt, const double[::1] d, const double[::1] y,
                            SiteSpec spec not None, const double[::1] site_precision,
                            const double[::1] site_natural_mean, *, double power=1.0,
                            int n_quadrature=DEFAULT_N_QUADRATURE):
    """Power-EP log Z of the given sites, from scratch (O(nm² + m³); module docstring).

    Raises ValueError for bad input or a site whose cavity is improper / whose kernel fails.
    """
    cdef int n, m
    n, m = _check_projection(Vt, d)
    _check_targets(spec, y, n)
    _check_vector("site_precision", site_precision, n, nonnegative=True)
    _check_vector("site_natural_mean", site_natural_mean, n)
    _check_power(power, spec, n_quadrature)
    if n == 0:
        return 0.0
    cdef PowerQuadrature quadrature = PowerQuadrature(power, n_quadrature)
    cdef int rows = scratch_rows(n, m), info, bad_site = -1
    cdef double[:, ::1] scratch = np.empty((rows, m))
    cdef double[:, ::1] R = np.empty((m, m))
    cdef double[::1] wm = np.empty(m)
    cdef double[::1] gm = np.empty(n)
    cdef double[::1] gv = np.empty(n)
    cdef double half_log_det = 0.0, quad_b = 0.0, total = NAN
    with nogil:
        info = sparse_rebuild(&Vt[0, 0], n, m, &site_precision[0], &site_natural_mean[0], &R[0, 0],
                              &wm[0], &gm[0], &gv[0], &scratch[0, 0], rows, &half_log_det, &quad_b,
                              NULL)
        if info == 0:
            total = sparse_log_z(&spec.model, &quadrature.rule, &y[0], &d[0], n, &site_precision[0],
                                 &site_natural_mean[0], &gm[0], &gv[0], half_log_det, quad_b,
                                 &bad_site)
    if info != 0:
        raise np.linalg.LinAlgError(f"Cholesky factorisation of A failed (leading minor of order {info})")
    if bad_site >= 0:
        raise ValueError(f"site {bad_site} has an improper cavity or its site kernel fails at the "
                         "cavity; log marginal likelihood undefined for these sites")
    return float(total)


def cholesky_rank1_update(double[:, ::1] R, x, bint downdate=False, double[::1] beta=None):
    """R ← chol(RᵀR ± x xᵀ) in place (upper-triangular row-major R; a test hook for
    ``cholesky_rank1``); ``beta`` (optional, in/out) becomes ``R_new⁻ᵀ R_oldᵀ beta``.  Returns 0,
    or k + 1 when the downdate leaves the leading (k+1) x (k+1) block not positive definite (R is
    then partly modified)."""
    cdef int m = R.shape[0]
    if R.shape[1] != m:
        raise ValueError(f"R must be square; got shape ({R.shape[0]}, {R.shape[1]})")
    cdef double[::1] xv = np.array(x, dtype=np.float64, copy=True).reshape(-1)
    if xv.shape[0] != m:
        raise ValueError(f"x must have length {m}; got {xv.shape[0]}")
    if beta is not None and beta.shape[0] != m:
        raise ValueError(f"beta must have length {m}; got {beta.shape[0]}")
    if m == 0:
        return 0
    cdef int info
    cdef double* beta_ptr = NULL if beta is None else &beta[0]
    with nogil:
        info = cholesky_rank1(&R[0, 0], m, &xv[0], downdate, beta_ptr)
    return info
