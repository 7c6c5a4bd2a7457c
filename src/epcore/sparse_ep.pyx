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

One site (``power_site_step``, power α ∈ (0, 1])
------------------------------------------------
From ``s = Var[g_i]`` and ``h = E[g_i]``: cavity variance ``v_c = s / (1 - α τ_i s)`` and mean
``m_c = h + v_c α (τ_i h - ν_i)`` (eqs 78-79 with α τ_i, α ν_i); the site kernel of the
likelihood raised to the power α at the cavity of f, ``N(m_c, v_c + d_i)``, gives
``(log Z_i, a, b)`` (``power_site_moments``); the new site is

    τ* = b / (α (1 - v_c b)),      ν* = (a + b m_c) / (α (1 - v_c b))      (eqs 81-83, / α),

then damping in natural parameters and linear_ep's negative-precision policy
(``NEGATIVE_CLIP``: τ* < 0 becomes 0 with ν* = a/α; ``NEGATIVE_SKIP``; ``NEGATIVE_ALLOW`` is
rejected: τ >= 0 keeps A >= I, so every downdate below is well posed). Student-t sites, whose
precisions must be allowed to go negative, have their own parallel schedule with step halving,
``run_robust_sparse_ep`` (fractional EP; A is then built with a subtracting ``syrk`` for the
negative sites and its Cholesky factorisation is the check that the posterior is proper).  A site with an improper
cavity, a failing kernel or ``1 - v_c b <= 0`` is left unchanged and counted as failed.

Powered moments (``power_site_moments``)
---------------------------------------
``Z = ∫ p(y | f)^α N(f; m, v) df``.  α = 1: the site kernel itself.  Gaussian likelihood:
closed form, ``N(y; f, σ²)^α = (2πσ²)^((1-α)/2) α^(-1/2) N(y; f, σ²/α)``.  Otherwise
Gauss-Hermite quadrature centred on ``N(m_b, v_b)``, the cavity times the α-th power of the
power-1 EP site (from the site kernel at the cavity; 0 if that site has negative precision),
which follows the tilted density when the cavity is wide:

    Z = Σ_k w_k exp(α ℓ(f_k)) N(f_k; m, v) / N(f_k; m_b, v_b),   f_k = m_b + sqrt(2 v_b) t_k,

with ``ℓ, ℓ', -ℓ''`` from the site kernel at zero cavity variance (the pointwise
log-likelihood), and, differentiating under the integral,
``a = α E_p[ℓ']``, ``b = α E_p[-ℓ''] - α² Var_p[ℓ']`` (p: the normalised quadrature weights).
This needs a likelihood with a pointwise log density: probit/ordinal with finite slope,
logistic, Gaussian.  The step likelihood (and infinite slopes) are rejected for α < 1.
Accuracy (probit, against adaptive scipy quadrature and a 2·10⁶-point grid): relative error
< 1e-5 at 64 nodes (~1e-7 typical at 32) for cavity variances up to ~10; it degrades when a
wide cavity sits on the wrong side of the decision boundary (variance 100, mean 5, y = -1:
~1e-2 at 32 nodes, ~5e-3 at 64), where the tilted density is a half-Gaussian with a kink
that a Gaussian rule resolves poorly.  Raise ``n_quadrature`` (<= 256) for such problems.

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
largest relative site change (linear_ep's SweepStats) and the relative change of log Z are
below ``tol`` and no site failed.  ``SPARSE_SEQUENTIAL`` (orders: fixed, or a seeded random
permutation per sweep from gp_ep's splitmix64 Fisher-Yates) or ``SPARSE_PARALLEL`` (all sites
from one posterior, damped, then a rebuild).

Python API
----------
``sparse_projection`` (Cholesky of ``K_mm + jitter I``, ``Vt`` and ``d``), ``run_sparse_ep``
(the engine), ``log_marginal_likelihood`` (from scratch), ``power_moments_array`` (the powered
site kernel over arrays, for gradients and tests), ``rebuild`` and ``incremental_sweep`` (test
hooks: the representation from the sites, and one sweep without the rebuild).
"""
import numpy as np

from libc.math cimport sqrt, log, log1p, exp, fabs, isfinite, INFINITY, NAN
from libc.string cimport memset
from cpython.exc cimport PyErr_CheckSignals
from fastep._epcore._blas cimport (
    ddot, daxpy, dscal, dcopy, gemv, gemv_t, syrk, trsv, potrf, trsm_right,
)
from fastep._epcore.sites cimport (
    SiteModel, SiteSpec, site_moments, LIK_GAUSSIAN, LIK_ORDINAL, LIK_STUDENT_T, GH_MAX_NODES, SITE_OK,
    SITE_BAD_PARAMS, student_t_moments, student_t_log_norm,
)
from fastep._epcore._common cimport (
    SiteUpdateOptions, SweepStats, sweep_stats_reset, sweep_stats_record, max_relative_site_change,
    UPDATE_NATURAL, NEGATIVE_CLIP, NEGATIVE_SKIP, NEGATIVE_ALLOW,
    STEP_APPLIED, STEP_CLIPPED, STEP_SKIPPED, STEP_FAILED,
)
from fastep._epcore._common cimport (
    random_permutation, sweep_callback_stops, InterruptCheck, interrupt_init, interrupt_poll, interrupt_reraise,
    interrupt_requested,
)
from fastep._epcore._common import _check_no_aliasing, _check_targets, _check_vector
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

#: Default number of Gauss-Hermite nodes of the powered site moments (α < 1).
DEFAULT_N_QUADRATURE = 32


# --------------------------------------------------------------------------- #
# powered site moments and the site step
# --------------------------------------------------------------------------- #

cdef int power_site_moments(const SiteModel* model, const PowerRule* rule, double y, double mean,
                            double var, double* log_z, double* alpha, double* beta) noexcept nogil:
    """log Z, a = ∂ log Z/∂mean, b = -∂² log Z/∂mean² of ``Z = ∫ p(y|f)^α N(f; mean, var) df``.

    Module docstring ("Powered moments").  Returns the site kernel's status (SITE_OK = 0 on
    success, with finite outputs).
    """
    cdef double power = rule.power
    cdef SiteModel local
    cdef double noise, lz1, a1, b1, one_minus, site_tau, site_nu, prec_b, var_b, mean_b, sd_b
    cdef double f, l, d1, d2, lw_max, total, p, e1, e2, e11, half_log_ratio
    cdef double lw[GH_MAX_NODES]
    cdef double g1[GH_MAX_NODES]
    cdef double g2[GH_MAX_NODES]
    cdef int k, status, n_nodes = rule.n_nodes
    if model.code == LIK_STUDENT_T:
        # the powered Student-t site by its own panel quadrature (any α; the tilted density
        # may be bimodal, which a Gauss-Hermite rule centred on one site would miss)
        if model.n_params != 2:
            return SITE_BAD_PARAMS
        if not (var >= 0.0 and isfinite(var) and isfinite(mean)):
            return SITE_BAD_PARAMS
        status = student_t_moments(model.params[0], model.params[1], power,
                                   student_t_log_norm(model.params[0], model.params[1]), y, mean, var,
                                   log_z, alpha, beta, &e1, &e2)
        if status == SITE_OK and not (isfinite(log_z[0]) and isfinite(alpha[0]) and isfinite(beta[0])):
            return 5    # SITE_OVERFLOW
        return status
    if power == 1.0:
        return site_moments(model, y, mean, var, log_z, alpha, beta)
    if model.code == LIK_GAUSSIAN:
        if model.n_params != 1:
            return SITE_BAD_PARAMS
        noise = model.params[0]
        local = model[0]
        noise = noise / power
        local.params = &noise
        status = site_moments(&local, y, mean, var, log_z, alpha, beta)
        if status == SITE_OK:
            log_z[0] += 0.5 * (1.0 - power) * (_LOG_2PI + log(model.params[0])) - 0.5 * log(power)
        return status
    if n_nodes < 1 or n_nodes > GH_MAX_NODES or rule.nodes == NULL or rule.log_weights == NULL:
        return SITE_BAD_PARAMS
    # quadrature base: the cavity times the α-th power of the power-1 site
    status = site_moments(model, y, mean, var, &lz1, &a1, &b1)
    if status != SITE_OK:
        return status
    one_minus = 1.0 - var * b1
    if b1 > 0.0 and one_minus > 0.0:
        site_tau = b1 / one_minus
        site_nu = (a1 + b1 * mean) / one_minus
    else:
        site_tau = 0.0
        site_nu = a1
    prec_b = 1.0 / var + power * site_tau
    var_b = 1.0 / prec_b
    mean_b = (mean / var + power * site_nu) * var_b
    sd_b = sqrt(2.0 * var_b)
    half_log_ratio = 0.5 * log(var_b / var)
    lw_max = -INFINITY
    for k in range(n_nodes):
        f = mean_b + sd_b * rule.nodes[k]
        status = site_moments(model, y, f, 0.0, &l, &d1, &d2)
        if status != SITE_OK:
            return status
        # log w_k + α ℓ(f_k) + log N(f_k; mean, var) - log N(f_k; mean_b, var_b)
        lw[k] = (rule.log_weights[k] + power * l - 0.5 * (f - mean) * (f - mean) / var
                 + rule.nodes[k] * rule.nodes[k] + half_log_ratio)
        g1[k] = d1
        g2[k] = d2
        if lw[k] > lw_max:
            lw_max = lw[k]
    if not isfinite(lw_max):
        return 3    # SITE_ZERO_MASS
    total = 0.0
    for k in range(n_nodes):
        lw[k] = exp(lw[k] - lw_max)
        total += lw[k]
    e1 = 0.0
    e2 = 0.0
    for k in range(n_nodes):
        p = lw[k] / total
        lw[k] = p
        e1 += p * g1[k]
        e2 += p * g2[k]
    e11 = 0.0
    for k in range(n_nodes):
        e11 += lw[k] * (g1[k] - e1) * (g1[k] - e1)
    log_z[0] = lw_max + log(total)
    alpha[0] = power * e1
    beta[0] = power * e2 - power * power * e11
    if not (isfinite(log_z[0]) and isfinite(alpha[0]) and isfinite(beta[0])):
        return 5    # SITE_OVERFLOW
    return SITE_OK


cdef int power_site_step(const SiteModel* model, const PowerRule* rule, double y, double g_mean,
                         double g_var, double d, double* site_precision_i,
                         double* site_natural_mean_i, const SiteUpdateOptions* opts) noexcept nogil:
    """One power-EP site update from the marginal ``N(g_i; g_mean, g_var)`` (module docstring).

    Writes the new site unless the result is STEP_SKIPPED / STEP_FAILED; returns a
    linear_ep ``SiteStepResult``.  The update of the posterior it implies,
    ``1 + Δτ g_var``, is checked to be > 0 (else STEP_SKIPPED).
    """
    cdef double power = rule.power
    cdef double tau_old = site_precision_i[0], nu_old = site_natural_mean_i[0]
    cdef double denom, v_c, m_c, log_z = 0.0, a = 0.0, b = 0.0, one_minus
    cdef double tau_t, nu_t, tau_new, nu_new
    cdef int result = STEP_APPLIED
    if not (g_var >= 0.0 and isfinite(g_var) and isfinite(g_mean)):      # 0: f_i independent of u
        return STEP_FAILED
    denom = 1.0 - power * tau_old * g_var
    if not denom > 0.0:
        return STEP_FAILED
    v_c = g_var / denom                                                   # eq 79
    m_c = g_mean + v_c * power * (tau_old * g_mean - nu_old)             # eq 78
    if not (isfinite(v_c) and isfinite(m_c)):
        return STEP_FAILED
    if power_site_moments(model, rule, y, m_c, v_c + d, &log_z, &a, &b) != 0:
        return STEP_FAILED
    one_minus = 1.0 - v_c * b
    if not one_minus > 0.0:
        return STEP_FAILED
    tau_t = b / (power * one_minus)                                       # eqs 81-83, / α
    nu_t = (a + b * m_c) / (power * one_minus)
    if tau_t < 0.0:
        if opts.negative_precision == NEGATIVE_SKIP:
            return STEP_SKIPPED
        tau_t = 0.0
        nu_t = a / power
        result = STEP_CLIPPED
    if opts.damping == 1.0:
        tau_new = tau_t
        nu_new = nu_t
    else:
        tau_new = tau_old + opts.damping * (tau_t - tau_old)
        nu_new = nu_old + opts.damping * (nu_t - nu_old)
        if tau_new < 0.0:
            if opts.negative_precision == NEGATIVE_SKIP:
                return STEP_SKIPPED
            tau_new = 0.0
            result = STEP_CLIPPED
    if not 1.0 + (tau_new - tau_old) * g_var > 0.0:
        return STEP_SKIPPED
    site_precision_i[0] = tau_new
    site_natural_mean_i[0] = nu_new
    return result


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
        trsv(False, True, m, R, m, w)            # Rᵀ w = v
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
        syrk(False, m, <int>cnt, 1.0, scratch, m, 1.0, precision_sum, m)
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
        syrk(False, m, <int>cnt, -1.0, scratch, m, 1.0, precision_sum, m)
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
        trsm_right(False, False, <int>cnt, m, 1.0, R, m, scratch, m)   # rows v_iᵀ R⁻¹
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
    info = potrf(False, m, R, m)                                    # A = Rᵀ R
    if info != 0:
        return info
    acc = 0.0
    for i in range(mm):
        acc += log(R[i * mm + i])
        for j in range(i):
            R[i * mm + j] = 0.0
    half_log_det_a[0] = acc
    trsv(False, True, m, R, m, w_mean)                              # R⁻ᵀ b
    quad_b[0] = ddot(m, w_mean, 1, w_mean, 1)
    if beta != NULL:
        dcopy(m, w_mean, 1, beta, 1)
    trsv(False, False, m, R, m, w_mean)                             # A⁻¹ b
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

_RULES = {}


def _gauss_hermite(int n_nodes):
    """Physicists' Gauss-Hermite nodes and log(w_k/sqrt(pi)) (cached)."""
    rule = _RULES.get(n_nodes)
    if rule is None:
        nodes, weights = np.polynomial.hermite.hermgauss(n_nodes)
        rule = (np.ascontiguousarray(nodes), np.ascontiguousarray(np.log(weights) - 0.5 * np.log(np.pi)))
        _RULES[n_nodes] = rule
    return rule


cdef int _scratch_rows(int n, int m):
    cdef int rows = 131072 // (m if m > 0 else 1)
    if rows < 64:
        rows = 64
    if rows > n:
        rows = n
    return rows if rows > 0 else 1


def _check_power(double power, SiteSpec spec, int n_quadrature):
    """power in (0, 1]; for power < 1 a likelihood with a pointwise log density."""
    cdef double log_z, alpha, beta
    cdef int status
    if not (power > 0.0 and power <= 1.0):
        raise ValueError(f"power must be in (0, 1]; got {power}")
    if not (1 <= n_quadrature <= GH_MAX_NODES):
        raise ValueError(f"n_quadrature must be in [1, {GH_MAX_NODES}]; got {n_quadrature}")
    if power < 1.0 and spec.code != LIK_GAUSSIAN:
        # the quadrature evaluates the likelihood pointwise: zero cavity variance must work
        status = site_moments(&spec.model, 0.0 if spec.code == LIK_ORDINAL else 1.0, 0.0, 0.0, &log_z,
                              &alpha, &beta)
        if status != SITE_OK:
            raise ValueError("power < 1 needs a likelihood with a pointwise log density (probit or "
                             "ordinal with a finite slope, logistic, Gaussian); the step likelihood "
                             "and infinite slopes support power = 1 only")


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


def _check_options(int schedule, int order, double damping, int negative_precision):
    if schedule not in (SPARSE_SEQUENTIAL, SPARSE_PARALLEL):
        raise ValueError(f"schedule must be SPARSE_SEQUENTIAL (0) or SPARSE_PARALLEL (1); got {schedule}")
    if order not in (ORDER_FIXED, ORDER_RANDOM):
        raise ValueError(f"order must be ORDER_FIXED (0) or ORDER_RANDOM (1); got {order}")
    if not (damping > 0.0 and damping <= 1.0):
        raise ValueError(f"damping must be in (0, 1]; got {damping}")
    if negative_precision == NEGATIVE_ALLOW:
        raise ValueError("negative_precision = NEGATIVE_ALLOW (2) is not supported by sparse EP "
                         "(site precisions stay >= 0 so that A = I + Vtᵀ T Vt >= I); use NEGATIVE_CLIP "
                         "(0) or NEGATIVE_SKIP (1)")
    if negative_precision not in (NEGATIVE_CLIP, NEGATIVE_SKIP):
        raise ValueError(f"negative_precision must be NEGATIVE_CLIP (0) or NEGATIVE_SKIP (1); got "
                         f"{negative_precision}")


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


def sparse_projection(const double[:, ::1] Kmm, double[:, ::1] Knm, const double[::1] kdiag, *,
                      approximation="fitc", double jitter=0.0, bint overwrite_knm=False):
    """Prior representation of FITC / DTC: ``L = chol(K_mm + jitter I)``, ``Vt = K_nm L⁻ᵀ``, ``d``.

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
    for name, arr in (("Kmm", Kmm), ("Knm", Knm), ("kdiag", kdiag)):
        a = np.asarray(arr)
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name} must be finite")
    return _sparse_projection(Kmm, Knm, kdiag, approximation=approximation, jitter=jitter,
                              overwrite_knm=overwrite_knm)


def _sparse_projection(const double[:, ::1] Kmm, double[:, ::1] Knm, const double[::1] kdiag, *,
                       approximation="fitc", double jitter=0.0, bint overwrite_knm=False):
    """:func:`sparse_projection` without its input checks, for callers that validated the
    inputs already (the estimators, at every optimiser step). Same arguments and
    results; invalid inputs give undefined results instead of an error."""
    cdef int m = Kmm.shape[0], n = Knm.shape[0], info, i, j
    L = np.array(Kmm, dtype=np.float64, order="C", copy=True)
    cdef double[:, ::1] Lv = L
    for i in range(m):
        Lv[i, i] += jitter
    with nogil:
        info = potrf(True, m, &Lv[0, 0], m)
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
            trsm_right(True, True, n, m, 1.0, &Lv[0, 0], m, &Vv[0, 0], m)    # X Lᵀ = K_nm
    if approximation == "dtc":
        d = np.zeros(n)
    else:
        d = np.asarray(kdiag, dtype=np.float64) - np.einsum("ij,ij->i", Vt, Vt)
        np.maximum(d, 0.0, out=d)
    return L, Vt, d


def run_sparse_ep(const double[:, ::1] Vt, const double[::1] d, const double[::1] y,
                  SiteSpec spec not None, double[::1] site_precision, double[::1] site_natural_mean,
                  double[:, ::1] post_factor, double[::1] post_w_mean, *, double power=1.0,
                  int n_quadrature=DEFAULT_N_QUADRATURE, int schedule=SPARSE_SEQUENTIAL,
                  int order=ORDER_FIXED, unsigned long seed=0, double damping=1.0, double tol=1e-8,
                  int max_sweeps=100, int negative_precision=NEGATIVE_CLIP,
                  double[::1] g_mean=None, double[::1] g_var=None, object sweep_callback=None):
    """Run sparse (power) EP to convergence (module docstring).

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
    site_precision, site_natural_mean : (n,) float64, in/out
        Sites on the projections (τ_i >= 0; zeros = cold start).  Updated in place.
    post_factor : (m, m) float64, out
        Upper-triangular R with ``Rᵀ R = A = I + Vtᵀ diag(τ) Vt`` (strict lower triangle zero).
    post_w_mean : (m,) float64, out
        μ_w = A⁻¹ Vtᵀ ν.
    power : float in (0, 1]
        Power-EP α (1: EP-FITC / EP-DTC).  For α < 1 the likelihood needs a pointwise log
        density (probit/ordinal with finite slope, logistic, Gaussian).
    n_quadrature : int in [1, 256]
        Gauss-Hermite nodes of the powered moments (α < 1, non-Gaussian likelihoods).
    schedule : {SPARSE_SEQUENTIAL, SPARSE_PARALLEL}
    order : {ORDER_FIXED, ORDER_RANDOM}
        Site order of the sequential schedule (gp_ep's constants; random: a seeded
        permutation per sweep).
    seed : int >= 0
    damping : float in (0, 1]
    tol : float > 0
    max_sweeps : int >= 1
    negative_precision : {NEGATIVE_CLIP, NEGATIVE_SKIP}
    g_mean, g_var : (n,) float64, out, optional
        E[g_i] and Var[g_i] of the returned sites.
    sweep_callback : callable, optional
        Called as ``sweep_callback(sweep, max_change, log_z)`` after every sweep (with the GIL,
        between sweeps). Returning ``False`` stops the sweeps there (the returned state is that
        of the current sites; ``stopped`` is True). An exception it raises is re-raised after
        the sites are restored to their input values.

    Returns
    -------
    dict
        ``n_sweeps``, ``converged``, ``max_change``, ``log_z`` (NaN only if a cavity is
        improper or the kernel fails at the returned state, then ``converged`` is False),
        ``log_z_change``, ``n_skipped``, ``n_clipped``, ``n_failed`` (totals over sweeps),
        ``n_rebuilds`` (extra rebuilds after failed downdates), ``stopped``.

    Raises
    ------
    ValueError
        Bad shapes, non-finite or negative input, targets outside the likelihood's support,
        out-of-range options, aliasing outputs.  Nothing is modified.
    numpy.linalg.LinAlgError
        A rebuild's Cholesky factorisation failed (only with non-finite intermediate values);
        the sites are restored.
    """
    cdef int n, m
    n, m = _check_projection(Vt, d)
    _check_targets(spec, y, n)
    _check_vector("site_precision", site_precision, n, nonnegative=True)
    _check_vector("site_natural_mean", site_natural_mean, n)
    _check_factor_outputs(post_factor, post_w_mean, m)
    _check_options(schedule, order, damping, negative_precision)
    _check_power(power, spec, n_quadrature)
    if not tol > 0.0:
        raise ValueError(f"tol must be > 0; got {tol}")
    if max_sweeps < 1:
        raise ValueError(f"max_sweeps must be >= 1; got {max_sweeps}")
    outputs = {"site_precision": site_precision, "site_natural_mean": site_natural_mean,
               "post_factor": post_factor, "post_w_mean": post_w_mean}
    _check_marginal_outputs(g_mean, g_var, n)
    for name, arr in (("g_mean", g_mean), ("g_var", g_var)):
        if arr is not None:
            outputs[name] = arr
    _check_no_aliasing({"Vt": Vt, "d": d, "y": y}, outputs)

    return _run_sparse_ep(Vt, d, y, spec, site_precision, site_natural_mean, post_factor, post_w_mean,
                          power=power, n_quadrature=n_quadrature, schedule=schedule, order=order, seed=seed,
                          damping=damping, tol=tol, max_sweeps=max_sweeps, negative_precision=negative_precision,
                          g_mean=g_mean, g_var=g_var, sweep_callback=sweep_callback)


def _run_sparse_ep(const double[:, ::1] Vt, const double[::1] d, const double[::1] y,
                   SiteSpec spec not None, double[::1] site_precision, double[::1] site_natural_mean,
                   double[:, ::1] post_factor, double[::1] post_w_mean, *, double power=1.0,
                   int n_quadrature=DEFAULT_N_QUADRATURE, int schedule=SPARSE_SEQUENTIAL,
                   int order=ORDER_FIXED, unsigned long seed=0, double damping=1.0, double tol=1e-8,
                   int max_sweeps=100, int negative_precision=NEGATIVE_CLIP,
                   double[::1] g_mean=None, double[::1] g_var=None, object sweep_callback=None):
    """:func:`run_sparse_ep` without its input checks, for callers that validated the
    inputs already (the estimators, at every optimiser step). Same arguments and
    results; invalid inputs give undefined results instead of an error."""
    cdef int n = Vt.shape[0], m = Vt.shape[1]
    nodes, log_weights = _gauss_hermite(n_quadrature)
    cdef const double[::1] nodes_v = nodes
    cdef const double[::1] lw_v = log_weights
    cdef PowerRule rule
    rule.power = power
    rule.nodes = &nodes_v[0]
    rule.log_weights = &lw_v[0]
    rule.n_nodes = n_quadrature
    cdef SiteUpdateOptions opts
    opts.update_form = UPDATE_NATURAL
    opts.damping = damping
    opts.negative_precision = negative_precision
    cdef bint parallel = schedule == SPARSE_PARALLEL
    cdef bint shuffled = order == ORDER_RANDOM and not parallel
    cdef int rows = _scratch_rows(n, m)
    cdef double[::1] gm = np.empty(max(n, 1)) if g_mean is None else g_mean
    cdef double[::1] gv = np.empty(max(n, 1)) if g_var is None else g_var
    cdef double[:, ::1] scratch = np.empty((rows, m))
    cdef double[::1] w = np.empty(m)
    cdef double[::1] z = np.empty(m)
    cdef double[::1] beta = np.empty(m)
    cdef int[::1] perm = np.empty(max(n, 1), dtype=np.intc)
    tau_saved = np.array(site_precision, copy=True)
    nu_saved = np.array(site_natural_mean, copy=True)
    if n == 0:
        np.asarray(post_factor)[:] = np.eye(m)
        np.asarray(post_w_mean)[:] = 0.0
        return dict(n_sweeps=0, converged=True, max_change=0.0, log_z=0.0, log_z_change=0.0,
                    n_skipped=0, n_clipped=0, n_failed=0, n_rebuilds=0, stopped=False)

    cdef const SiteModel* model = &spec.model
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
    cdef unsigned long long rng_state = seed
    cdef SweepStats stats
    cdef int info = 0, failed_sweep = -1, sweep, n_sweeps = 0, bad_site = -1, rebuilt
    cdef long total_skipped = 0, total_clipped = 0, total_failed = 0, total_rebuilds = 0
    cdef bint converged = False
    cdef double half_log_det = 0.0, quad_b = 0.0, log_z = NAN, new_log_z
    cdef double log_z_change = INFINITY, max_change = INFINITY, scale
    cdef bint has_callback = sweep_callback is not None, stopped = False
    cdef list callback_errors = []
    cdef InterruptCheck interrupt
    sweep_stats_reset(&stats)
    interrupt_init(&interrupt, &stats, 3.0 * m * m)
    with nogil:
        info = sparse_rebuild(vt_ptr, n, m, tau_ptr, nu_ptr, r_ptr, wm_ptr, gm_ptr, gv_ptr,
                              &scratch[0, 0], rows, &half_log_det, &quad_b, &beta[0])
        if info == 0:
            log_z = sparse_log_z(model, &rule, y_ptr, d_ptr, n, tau_ptr, nu_ptr, gm_ptr, gv_ptr,
                                 half_log_det, quad_b, &bad_site)
            for sweep in range(1, max_sweeps + 1):
                if parallel:
                    sparse_parallel_update(model, &rule, y_ptr, d_ptr, n, tau_ptr, nu_ptr, gm_ptr,
                                           gv_ptr, &opts, &stats)
                else:
                    if shuffled:
                        random_permutation(n, &perm[0], &rng_state)
                    rebuilt = sparse_sweep_sequential(model, &rule, y_ptr, vt_ptr, d_ptr, n, m,
                                                      tau_ptr, nu_ptr, r_ptr, &beta[0], perm_ptr,
                                                      &w[0], &z[0], &scratch[0, 0], rows, &opts,
                                                      &stats)
                    if rebuilt < 0:
                        info = -rebuilt
                        failed_sweep = sweep
                        break
                    total_rebuilds += rebuilt
                if stats.interrupt != NULL and interrupt_poll(stats.interrupt):
                    break                   # Ctrl-C: the sites are restored and the exception raised below
                n_sweeps = sweep
                total_skipped += stats.n_skipped
                total_clipped += stats.n_clipped
                total_failed += stats.n_failed
                max_change = stats.max_change_precision
                if stats.max_change_natural_mean > max_change:
                    max_change = stats.max_change_natural_mean
                info = sparse_rebuild(vt_ptr, n, m, tau_ptr, nu_ptr, r_ptr, wm_ptr, gm_ptr, gv_ptr,
                                      &scratch[0, 0], rows, &half_log_det, &quad_b, &beta[0])
                if info != 0:
                    failed_sweep = sweep
                    break
                new_log_z = sparse_log_z(model, &rule, y_ptr, d_ptr, n, tau_ptr, nu_ptr, gm_ptr,
                                         gv_ptr, half_log_det, quad_b, &bad_site)
                log_z_change = fabs(new_log_z - log_z)
                log_z = new_log_z
                scale = fabs(log_z)
                if not scale > 1.0:
                    scale = 1.0
                converged = (max_change < tol and log_z_change < tol * scale
                             and stats.n_failed == 0)
                if has_callback:
                    with gil:
                        stopped = sweep_callback_stops(sweep_callback, sweep, max_change, log_z,
                                                       callback_errors)
                if converged or stopped:
                    break
    if interrupt.pending or callback_errors:        # Ctrl-C or the callback raised: inputs back, re-raise
        np.asarray(site_precision)[:] = tau_saved
        np.asarray(site_natural_mean)[:] = nu_saved
        interrupt_reraise(&interrupt)
        raise callback_errors[0]
    if info != 0:
        np.asarray(site_precision)[:] = tau_saved
        np.asarray(site_natural_mean)[:] = nu_saved
        where = "for the initial sites" if failed_sweep < 0 else f"after sweep {failed_sweep}"
        raise np.linalg.LinAlgError(
            f"Cholesky factorisation of A = I + Vt^T diag(tau) Vt failed {where} (leading minor of "
            f"order {info}): non-finite projections or sites")
    if not isfinite(log_z):
        converged = False
    return dict(n_sweeps=n_sweeps, converged=bool(converged), max_change=float(max_change),
                log_z=float(log_z), log_z_change=float(log_z_change),
                n_skipped=int(total_skipped), n_clipped=int(total_clipped),
                n_failed=int(total_failed), n_rebuilds=int(total_rebuilds), stopped=bool(stopped))


cdef int _robust_targets(const SiteModel* model, const PowerRule* rule, const double* y, const double* d,
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


def run_robust_sparse_ep(const double[:, ::1] Vt, const double[::1] d, const double[::1] y,
                         SiteSpec spec not None, double[::1] site_precision,
                         double[::1] site_natural_mean, double[:, ::1] post_factor,
                         double[::1] post_w_mean, double[::1] g_mean, double[::1] g_var, *,
                         double power=0.5, double damping=0.5, double tol=1e-4, int max_sweeps=200,
                         int max_halvings=10, object sweep_callback=None):
    """Sparse fractional EP that allows negative site precisions (robust Student-t regression).

    The parallel schedule of :func:`fastep._epcore.robust_ep.run_robust_gp_ep` on the sparse
    representation of this module: every iteration computes all targets from one posterior
    (no clipping; a site with an improper cavity keeps its value and counts as failed), then
    steps ``τ ← τ + δ (τ* - τ)`` (likewise ν) from ``δ = damping``, halving δ (up to
    ``max_halvings`` times) while ``A = I + Vtᵀ T Vt`` is not positive definite (the posterior
    would be improper; A is built with a second, subtracting ``syrk`` for the negative sites)
    or a new cavity ``1 - α τ_i Var[g_i]`` is not positive. The evidence is
    :func:`log_marginal_likelihood`'s power-EP energy, which for negative sites is the
    fractional EP energy of Jylänki, Vanhatalo & Vehtari (2011, eq 14).

    Parameters
    ----------
    Vt, d, y, spec, site_precision, site_natural_mean, post_factor, post_w_mean
        As :func:`run_sparse_ep`; the sites may have any sign but must give a proper start.
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
    dict
        ``log_z``, ``n_sweeps``, ``converged``, ``max_change``, ``log_z_change``, ``n_failed``
        (sites whose update failed in the last iteration), ``n_halvings``, ``stuck`` (an
        iteration found no proper step), ``stopped``.

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
    if not (0.0 < damping <= 1.0):
        raise ValueError(f"damping must be in (0, 1], got {damping!r}")
    if not tol > 0 or max_sweeps < 1 or max_halvings < 0:
        raise ValueError("tol must be > 0, max_sweeps >= 1 and max_halvings >= 0")
    if n == 0:
        np.asarray(post_factor)[:] = np.eye(m)
        np.asarray(post_w_mean)[:] = 0.0
        return dict(log_z=0.0, n_sweeps=0, converged=True, max_change=0.0, log_z_change=0.0,
                    n_failed=0, n_halvings=0, stuck=False, stopped=False)
    nodes, log_weights = _gauss_hermite(DEFAULT_N_QUADRATURE)
    cdef const double[::1] nodes_v = nodes
    cdef const double[::1] lw_v = log_weights
    cdef PowerRule rule
    rule.power = power
    rule.nodes = &nodes_v[0]
    rule.log_weights = &lw_v[0]
    rule.n_nodes = DEFAULT_N_QUADRATURE
    cdef const SiteModel* model = &spec.model
    cdef int rows = _scratch_rows(n, m)
    cdef double[:, ::1] scratch = np.empty((rows, m))
    cdef double[:, ::1] trial_factor = np.empty((m, m))
    cdef double[::1] trial_w = np.empty(m)
    vectors = np.empty((6, n))
    cdef double[:, ::1] vec = vectors     # rows: target τ, target ν, trial τ, trial ν, trial E[g], trial Var[g]
    cdef int info, i, sweep = 0, halving, n_failed = 0, n_halvings = 0
    cdef double half_log_det = 0.0, quad_b = 0.0, log_z, new_log_z, step, max_change = 0.0
    cdef double log_z_change = 0.0, sum_terms = 0.0
    cdef bint accepted, converged = False, stuck = False, stopped = False
    with nogil:
        info = sparse_rebuild(&Vt[0, 0], n, m, &site_precision[0], &site_natural_mean[0],
                              &post_factor[0, 0], &post_w_mean[0], &g_mean[0], &g_var[0],
                              &scratch[0, 0], rows, &half_log_det, &quad_b, NULL)
    if info != 0:
        raise np.linalg.LinAlgError("the start sites give an improper posterior (A = I + Vt^T T Vt is "
                                    "not positive definite); start from zero sites")
    with nogil:
        n_failed = _robust_targets(model, &rule, &y[0], &d[0], n, &site_precision[0],
                                   &site_natural_mean[0], &g_mean[0], &g_var[0], &vec[0, 0], &vec[1, 0],
                                   &sum_terms)
    log_z = -half_log_det + 0.5 * quad_b + sum_terms
    while sweep < max_sweeps:
        sweep += 1
        step = damping
        accepted = False
        with nogil:
            for halving in range(max_halvings + 1):
                for i in range(n):
                    vec[2, i] = site_precision[i] + step * (vec[0, i] - site_precision[i])
                    vec[3, i] = site_natural_mean[i] + step * (vec[1, i] - site_natural_mean[i])
                info = sparse_rebuild(&Vt[0, 0], n, m, &vec[2, 0], &vec[3, 0], &trial_factor[0, 0],
                                      &trial_w[0], &vec[4, 0], &vec[5, 0], &scratch[0, 0], rows,
                                      &half_log_det, &quad_b, NULL)
                if info == 0:
                    accepted = True
                    for i in range(n):
                        if not (vec[5, i] > 0.0 and 1.0 - power * vec[2, i] * vec[5, i] > 0.0):
                            accepted = False
                            break
                if accepted:
                    break
                step *= 0.5
                n_halvings += 1
        if not accepted:
            stuck = True
            with nogil:      # the factor of the current sites (the trials used their own buffers)
                sparse_rebuild(&Vt[0, 0], n, m, &site_precision[0], &site_natural_mean[0],
                               &post_factor[0, 0], &post_w_mean[0], &g_mean[0], &g_var[0],
                               &scratch[0, 0], rows, &half_log_det, &quad_b, NULL)
            break
        with nogil:
            max_change = max_relative_site_change(n, &site_precision[0], &site_natural_mean[0],
                                                  &vec[2, 0], &vec[3, 0])
            for i in range(n):
                site_precision[i] = vec[2, i]
                site_natural_mean[i] = vec[3, i]
                g_mean[i] = vec[4, i]
                g_var[i] = vec[5, i]
            dcopy(m * m, &trial_factor[0, 0], 1, &post_factor[0, 0], 1)
            dcopy(m, &trial_w[0], 1, &post_w_mean[0], 1)
            n_failed = _robust_targets(model, &rule, &y[0], &d[0], n, &site_precision[0],
                                       &site_natural_mean[0], &g_mean[0], &g_var[0], &vec[0, 0],
                                       &vec[1, 0], &sum_terms)
            new_log_z = -half_log_det + 0.5 * quad_b + sum_terms
        log_z_change = fabs(new_log_z - log_z)
        log_z = new_log_z
        PyErr_CheckSignals()
        if sweep_callback is not None and sweep_callback(sweep, max_change, log_z) is False:
            stopped = True
            break
        if max_change < tol and log_z_change < tol * max(1.0, fabs(log_z)) and n_failed == 0:
            converged = True
            break
    if not isfinite(log_z):
        converged = False
    return dict(log_z=float(log_z), n_sweeps=sweep, converged=bool(converged),
                max_change=float(max_change), log_z_change=float(log_z_change),
                n_failed=int(n_failed), n_halvings=int(n_halvings), stuck=bool(stuck),
                stopped=bool(stopped))


def _natural_sums(const double[:, ::1] Vt, const double[::1] site_precision,
                  const double[::1] site_natural_mean):
    """``(Σ_i τ_i v_i v_iᵀ, Σ_i ν_i v_i)`` of a block of sites (the first matrix upper
    triangular: its strict lower triangle is zero). The sites' share of
    ``A = I + Vtᵀ diag(τ) Vt`` and ``b = Vtᵀ ν`` (module docstring, "Rebuild"); no input
    checks (callers validate)."""
    cdef int n = Vt.shape[0], m = Vt.shape[1]
    cdef int rows = _scratch_rows(n, m)
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
    for the block's sites what the parallel schedule of :func:`run_sparse_ep` computes for
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
    nodes, log_weights = _gauss_hermite(n_quadrature)
    cdef const double[::1] nodes_v = nodes
    cdef const double[::1] lw_v = log_weights
    cdef PowerRule rule
    rule.power = power
    rule.nodes = &nodes_v[0]
    rule.log_weights = &lw_v[0]
    rule.n_nodes = n_quadrature
    cdef SiteUpdateOptions opts
    opts.update_form = UPDATE_NATURAL
    opts.damping = damping
    opts.negative_precision = negative_precision
    cdef int rows = _scratch_rows(n, m)
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
            log_z_sites = sparse_log_z(&spec.model, &rule, &y[0], &d[0], n, &site_precision[0],
                                       &site_natural_mean[0], &gm[0], &gv[0], 0.0, 0.0, &bad_site)
            if update:
                sparse_parallel_update(&spec.model, &rule, &y[0], &d[0], n, &tau_v[0], &nu_v[0],
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
    cdef int rows = _scratch_rows(n, m)
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
    cdef int rows = _scratch_rows(n, m)
    cdef double[:, ::1] scratch = np.empty((rows, m))
    cdef double half_log_det = 0.0, quad_b = 0.0
    with nogil:
        info = sparse_rebuild(&Vt[0, 0], n, m, &site_precision[0], &site_natural_mean[0],
                              &post_factor[0, 0], &post_w_mean[0], &g_mean[0], &g_var[0],
                              &scratch[0, 0], rows, &half_log_det, &quad_b, NULL)
    if info != 0:
        return None
    return float(half_log_det), float(quad_b)


def incremental_sweep(const double[:, ::1] Vt, const double[::1] d, const double[::1] y,
                      SiteSpec spec not None, double[::1] site_precision,
                      double[::1] site_natural_mean, double[:, ::1] post_factor,
                      double[::1] post_w_mean, *, double power=1.0,
                      int n_quadrature=DEFAULT_N_QUADRATURE, double damping=1.0,
                      int negative_precision=NEGATIVE_CLIP):
    """One sequential sweep on the given representation WITHOUT the rebuild (a test hook).

    ``post_factor`` / ``post_w_mean`` (in/out) must be the representation of the sites (e.g.
    from ``rebuild``); compare them afterwards with ``rebuild`` of the new sites.  Returns
    the sweep's ``max_change``, ``n_skipped``, ``n_clipped``, ``n_failed``, ``n_rebuilds``.
    """
    cdef int n, m
    n, m = _check_projection(Vt, d)
    _check_targets(spec, y, n)
    _check_vector("site_precision", site_precision, n, nonnegative=True)
    _check_vector("site_natural_mean", site_natural_mean, n)
    _check_factor_outputs(post_factor, post_w_mean, m)
    _check_options(SPARSE_SEQUENTIAL, ORDER_FIXED, damping, negative_precision)
    _check_power(power, spec, n_quadrature)
    nodes, log_weights = _gauss_hermite(n_quadrature)
    cdef const double[::1] nodes_v = nodes
    cdef const double[::1] lw_v = log_weights
    cdef PowerRule rule
    rule.power = power
    rule.nodes = &nodes_v[0]
    rule.log_weights = &lw_v[0]
    rule.n_nodes = n_quadrature
    cdef SiteUpdateOptions opts
    opts.update_form = UPDATE_NATURAL
    opts.damping = damping
    opts.negative_precision = negative_precision
    cdef int rows = _scratch_rows(n, m)
    cdef double[:, ::1] scratch = np.empty((rows, m))
    cdef double[::1] w = np.empty(m)
    cdef double[::1] z = np.empty(m)
    cdef double[::1] beta = np.empty(m)
    cdef SweepStats stats
    cdef int rebuilt = 0
    sweep_stats_reset(&stats)
    stats.interrupt = NULL
    if n > 0:
        with nogil:
            _beta_from_w_mean(&post_factor[0, 0], m, &post_w_mean[0], &beta[0])
            rebuilt = sparse_sweep_sequential(&spec.model, &rule, &y[0], &Vt[0, 0], &d[0], n, m,
                                              &site_precision[0], &site_natural_mean[0],
                                              &post_factor[0, 0], &beta[0], NULL, &w[0],
                                              &z[0], &scratch[0, 0], rows, &opts, &stats)
            dcopy(m, &beta[0], 1, &post_w_mean[0], 1)
            trsv(False, False, m, &post_factor[0, 0], m, &post_w_mean[0])    # μ_w = R⁻¹ beta
    return dict(max_change=float(max(stats.max_change_precision, stats.max_change_natural_mean)),
                n_skipped=int(stats.n_skipped), n_clipped=int(stats.n_clipped),
                n_failed=int(stats.n_failed), n_rebuilds=int(rebuilt))


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
    nodes, log_weights = _gauss_hermite(n_quadrature)
    cdef const double[::1] nodes_v = nodes
    cdef const double[::1] lw_v = log_weights
    cdef PowerRule rule
    rule.power = power
    rule.nodes = &nodes_v[0]
    rule.log_weights = &lw_v[0]
    rule.n_nodes = n_quadrature
    cdef int rows = _scratch_rows(n, m), info, bad_site = -1
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
            total = sparse_log_z(&spec.model, &rule, &y[0], &d[0], n, &site_precision[0],
                                 &site_natural_mean[0], &gm[0], &gv[0], half_log_det, quad_b,
                                 &bad_site)
    if info != 0:
        raise np.linalg.LinAlgError(f"Cholesky factorisation of A failed (leading minor of order {info})")
    if bad_site >= 0:
        raise ValueError(f"site {bad_site} has an improper cavity or its site kernel fails at the "
                         "cavity; log marginal likelihood undefined for these sites")
    return float(total)


def power_moments_array(SiteSpec spec not None, y, mean, var, *, double power=1.0,
                        int n_quadrature=DEFAULT_N_QUADRATURE):
    """``(log_z, alpha, beta)`` of ``∫ p(y_i|f)^α N(f; mean_i, var_i) df`` for arrays (module docstring).

    Raises ValueError naming the first site whose kernel fails.
    """
    cdef const double[::1] yv = np.ascontiguousarray(y, dtype=np.float64)
    cdef const double[::1] mv = np.ascontiguousarray(mean, dtype=np.float64)
    cdef const double[::1] vv = np.ascontiguousarray(var, dtype=np.float64)
    cdef Py_ssize_t n = yv.shape[0], i, bad = -1
    if mv.shape[0] != n or vv.shape[0] != n:
        raise ValueError("y, mean and var must have the same length")
    _check_power(power, spec, n_quadrature)
    nodes, log_weights = _gauss_hermite(n_quadrature)
    cdef const double[::1] nodes_v = nodes
    cdef const double[::1] lw_v = log_weights
    cdef PowerRule rule
    rule.power = power
    rule.nodes = &nodes_v[0]
    rule.log_weights = &lw_v[0]
    rule.n_nodes = n_quadrature
    log_z = np.empty(n)
    alpha = np.empty(n)
    beta = np.empty(n)
    cdef double[::1] lz = log_z
    cdef double[::1] al = alpha
    cdef double[::1] be = beta
    cdef int status = 0
    with nogil:
        for i in range(n):
            status = power_site_moments(&spec.model, &rule, yv[i], mv[i], vv[i], &lz[i], &al[i], &be[i])
            if status != 0:
                bad = i
                break
    if bad >= 0:
        raise ValueError(f"site {bad}: the site kernel failed (status {status}) at y = {yv[bad]!r}, "
                         f"mean = {mv[bad]!r}, var = {vv[bad]!r}")
    return log_z, alpha, beta


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
