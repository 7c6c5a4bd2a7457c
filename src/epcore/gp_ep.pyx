# cython: language_level=3
"""Dense Gaussian-process EP (Minka, "EP: a quick reference", §2; R&W Alg. 3.5, Σ form).

Model
-----
Prior ``f ~ N(0, K)`` (``K`` n x n, symmetric PSD), one site per latent value,
``t~_i(f_i) ∝ exp(-τ_i f_i²/2 + ν_i f_i)``, with

* ``site_precision[i]    = τ_i = 1/v_i``   (Minka's ``v_i``, eq 73),
* ``site_natural_mean[i] = ν_i = m_i/v_i`` (the natural parameter of eq 83),

zeros meaning "no information yet", so a cold start and a warm start are the
same code.  The posterior is ``q(f) = N(μ, Σ)`` with the invariant

    Σ = (K⁻¹ + S)⁻¹ = K - K S^½ B⁻¹ S^½ K,   B = I + S^½ K S^½,   μ = Σ ν,

``S = diag(τ)`` (Σ is Minka's ``A`` of eq 74 with ``C = K`` and ``Λ = S⁻¹``;
``μ`` is eq 77).  Only ``τ >= 0`` is supported (so ``B`` is SPD): the
negative-precision policies are _common's ``NEGATIVE_CLIP`` (default) and
``NEGATIVE_SKIP``; ``NEGATIVE_ALLOW`` is rejected.

One site update
---------------
The GP site update is linear EP's natural-form update with ``x_i = e_i``,
``V = Σ``, ``m = μ``, so it reuses ``_common.site_step`` (one code path for the
site algebra): from ``Σ_ii`` and ``μ_i`` it forms the cavity
``λ_i = Σ_ii / (1 - Σ_ii τ_i)`` (eq 79) and ``h_i = μ_i + λ_i (τ_i μ_i - ν_i)``
(eq 78), calls the site kernel for ``(log Ẑ_i, α_i, β_i)``, sets the target
site ``τ* = β/(1 - λβ)`` (eq 81), ``ν* = (α + β h)/(1 - λβ)`` (eqs 82-83),
applies damping and the negative-precision policy, and returns the coefficients
of the rank-1 update with ``u = Σ[:, i]`` (before the update):

    Σ += c u uᵀ,  c = -Δτ / (1 + Σ_ii Δτ)           (eqs 84-85: δ = 1/Δτ)
    μ += m u,     m = (Δν - μ_i Δτ) / (1 + Σ_ii Δτ).

Schedules (``schedule``)
------------------------
``SCHEDULE_SEQUENTIAL`` (the cross-check): per site, read ``Σ_ii`` and ``μ_i``,
``site_step``, copy column ``i`` out of the lower triangle, one ``dsyr`` on the
lower triangle and one ``daxpy`` on ``μ``.  O(n²) memory traffic per site.

``SCHEDULE_BLOCKED`` (default): the rank-1 updates of ``k = block_size``
consecutive sites (in the sweep's order) are delayed.  With ``Σ₀`` the
covariance at the start of the block and ``U`` the stored columns
``sqrt|c_r| u_r`` of the block's updated sites (positive coefficients stored
from the top of the work array, negative ones from the bottom)

    Σ_current[:, i] = Σ₀[:, i] + U_posᵀ U_pos[:, i] - U_negᵀ U_neg[:, i],

so ``Σ_ii`` costs O(k) and the column (needed only if the site changes) one
small ``gemv`` per sign; ``μ`` is updated at once (``daxpy``).  After ``k``
sites, ``U C Uᵀ`` is folded into Σ by two BLAS-3 ``syrk`` (positive and
negative parts).  Same arithmetic as the sequential schedule up to rounding.

``SCHEDULE_PARALLEL``: each iteration computes every cavity from ``diag Σ``
and ``μ`` of the same posterior, updates all sites (damped; ``site_step`` with
``xVx = Σ_ii``, ``xm = μ_i``, its coefficients ignored), then refactorises.
Between iterations only ``diag Σ`` and ``μ`` are formed (``gp_refactor_marginals``,
below); the full Σ is formed once at the end (unless ``output=OUTPUT_FACTOR``).  Undamped parallel EP can oscillate; damping 0.5
is the usual choice.

Orders (``order``; the parallel schedule ignores it)
----------------------------------------------------
``ORDER_FIXED``: 0..n-1.  ``ORDER_RANDOM``: a fresh permutation every sweep
(Fisher-Yates driven by a splitmix64 generator seeded with ``seed``; the same
seed gives the same run).  ``ORDER_ENTROPY``: every site is still updated once
per sweep; at each step the site, among those not yet updated in this sweep,
with the most negative differential-entropy change (Minka eq 86, Seeger 2002)

    ΔH_i = ½ log((1 - λ_i β_i) / (1 - Σ_ii τ_i))

is taken next (ties go to the lowest index; sites whose cavity is improper or
whose kernel fails score +inf).  This costs n site-kernel calls per step, i.e.
O(n²) kernel calls per sweep, and keeps ``diag Σ`` current in a vector.

Refactorisation (after every sweep / parallel iteration, and at the start)
--------------------------------------------------------------------------
``s = sqrt(τ)``; ``B = I + diag(s) K diag(s)`` (lower triangle, in
``post_cov``); ``L = chol(B)`` (``potrf``); ``V = L⁻¹ diag(s) K`` (``trsm``, in
the work array); ``diag Σ = diag K - column norms² of V``;
``μ = K ν - Vᵀ (V ν)``; and, unless only the diagonal is needed (parallel
iterations), ``Σ = K - VᵀV`` (``syrk``).  About n³/3 + n³ (+ n³) flops.  If
every ``τ_i = 0`` then ``Σ = K`` and ``μ = K ν`` directly.  This removes the
drift of the rank-1 updates and gives ``log |B| = 2 Σ_i log L_ii`` for the
evidence.  A failing ``potrf`` means ``K`` is not PSD (numerically):
``numpy.linalg.LinAlgError``.

When Σ itself is not needed (parallel iterations, the last refactorisation with
``output=OUTPUT_FACTOR``, ``log_marginal_likelihood``), ``gp_refactor_marginals``
forms only ``diag Σ`` and ``μ``: ``potrf``, then ``trtri`` of a copy of L and
``b = diag(B⁻¹)`` (squared column norms of L⁻¹), so that
``Σ_ii = (1 - b_i) / τ_i`` (from ``Σ = S^-½ (I - B⁻¹) S^-½``); where
``1 - b_i < 1e-4`` (every ``τ_i = 0`` included) that difference has lost digits
and ``Σ_ii = K_ii - |L⁻¹ S^½ K e_i|²`` is used instead, one ``trsm`` over just
those columns; ``μ = K ν - K S^½ B⁻¹ S^½ K ν`` by two triangular solves.  About
2n³/3 flops (plus n² per fallback column) instead of 4n³/3.

Log marginal likelihood (eqs 87-88, stable form from the Cholesky of B)
-----------------------------------------------------------------------
With the cavities ``τ₋ = 1/Σ_ii - τ_i``, ``ν₋ = μ_i/Σ_ii - ν_i`` and
``log Ẑ_i`` from the site kernel at the cavity ``N(ν₋/τ₋, 1/τ₋)``:

    log Z_EP = Σ_i log Ẑ_i - Σ_i log L_ii + ½ νᵀΣν
               + ½ Σ_i ν₋_i (τ_i/τ₋_i ν₋_i - 2 ν_i) / (τ_i + τ₋_i)
               - ½ Σ_i ν_i² / (τ₋_i + τ_i) + ½ Σ_i log(1 + τ_i/τ₋_i)

(R&W eq 3.65 / GPML ``infEP``, = Minka eq 88 with the site scales ``s_i``).
Given ``Σ log L_ii``, ``diag Σ`` and ``μ`` it is O(n), so it is evaluated at
every refactorisation.  For a Gaussian likelihood it equals
``log N(y; 0, K + σ² I)`` at the fixed point.

Convergence
-----------
After each sweep (after its refactorisation): ``max_change`` is the larger of
``max_i |Δτ_i| / max(1, |τ_i|)`` and ``max_i |Δν_i| / max(1, |ν_i|)`` over the
sites updated in the sweep (_common's SweepStats); the run has converged when
``max_change < tol``, ``|Δ log Z| < tol max(1, |log Z|)`` and no site failed in
that sweep.

Memory
------
At most three n x n arrays are alive: ``K`` (input), ``post_cov`` and one work
array owned by the engine (``V`` after a refactorisation, the block's stored
columns during a blocked sweep).  Everything heavy runs with the GIL released.

Python API
----------
``DenseEP`` (the engine: built once from the problem, ``run`` sweeps from given sites;
``incremental_sweep`` performs one sequential/blocked sweep on a given posterior without
refactorising, a hook for tests and diagnostics that compare the rank-1-updated posterior
with the refactorised one), ``log_marginal_likelihood`` (log Z of given sites, from
scratch) and ``refactor_posterior`` (the refactorisation alone, a test hook).  ``auto_block_size`` gives the default block size.  Beyond the
spec's checks, the inputs must have a symmetric K (to 1e-8 of ``max K_ii``) with a
nonnegative diagonal and targets in the likelihood's support (ValueError); a
refactorised variance ``Σ_ii < -1e-8 K_ii`` (K not PSD) raises LinAlgError like a
failing Cholesky.  The nogil building blocks are declared in ``gp_ep.pxd``.

Costs
-----
A parallel iteration costs one diag-only refactorisation (its n site updates are O(n));
a sequential or blocked sweep costs the sweep plus one full refactorisation. The blocked
sweep is close to its BLAS-3 floor (the ``syrk`` folds); the sequential ``dsyr`` path is
memory bound. Timings, the choice of ``auto_block_size`` and sweep counts to convergence
are in the project's ``benchmarks/README.md``.
"""
import numpy as np

from libc.math cimport sqrt, log, log1p, fabs, isfinite, INFINITY, NAN
from libc.string cimport memset, memcpy
from fastep._epcore._blas cimport (
    UPPER, LOWER, NO_TRANS, TRANS, LEFT, RIGHT,
    daxpy, dscal, dcopy, symv, gemv, gemv_t, syr, syrk, trsm, trsv, potrf, trtri, symmetrize,
)
from fastep._epcore.sites cimport SiteModel, SiteSpec, site_moments, SITE_BAD_LABEL, SITE_BAD_PARAMS
from fastep._epcore._common cimport (
    site_step, SiteUpdateOptions, SweepStats, sweep_stats_reset, sweep_stats_record,
    UPDATE_NATURAL, NEGATIVE_CLIP, NEGATIVE_SKIP,
    NEGATIVE_ALLOW, STEP_APPLIED, STEP_CLIPPED, STEP_SKIPPED, STEP_FAILED,
)
from fastep._epcore._common cimport interrupt_requested, natural_update_options, SweepDriver
from fastep._epcore._common cimport EngineOptions, SweepResult, SweepSettings
from fastep._epcore.gp_factor cimport (
    gp_refactor, gp_refactor_marginals, gp_covariance_from_factor, gp_factor_only, gp_form_covariance,
    gp_log_z, gp_needs_stable_log_z, gp_log_z_stable, gp_log_z_stable_factored,
)
from fastep._epcore._common import _check_no_aliasing, _check_targets, _check_vector

# Module-level integer constants (SCHEDULE_*, ORDER_*, OUTPUT_*) and the supported policies for Python
# callers; Cython exposes the cpdef enums of gp_ep.pxd only as classes.
for _enum_class in (GPSchedule, GPOrder, GPOutput):
    for _member in _enum_class:
        globals()[_member.name] = int(_member)
del _enum_class, _member
globals().update(NEGATIVE_CLIP=int(NEGATIVE_CLIP), NEGATIVE_SKIP=int(NEGATIVE_SKIP),
                 NEGATIVE_ALLOW=int(NEGATIVE_ALLOW))

# Relative asymmetry of K accepted by the input check (|K_ij - K_ji| <= this * max_i K_ii).
cdef double _SYMMETRY_RTOL = 1e-8


# --------------------------------------------------------------------------- #
# order
# --------------------------------------------------------------------------- #

cdef double entropy_score(const SiteModel* model, double y, double post_var, double post_mean,
                          double site_precision_i, double site_natural_mean_i) noexcept nogil:
    """ΔH_i = ½ log((1 - λ_i β_i) / (1 - Σ_ii τ_i)) of updating site i now (Minka eq 86).

    +inf when the cavity is improper, the kernel fails or the tilted variance is not > 0
    (such sites are not preferred).
    """
    cdef double denom = 1.0 - site_precision_i * post_var
    cdef double lam, cavity_mean, log_z = 0.0, alpha = 0.0, beta = 0.0, num
    if not (denom > 0.0 and post_var > 0.0 and isfinite(post_var) and isfinite(post_mean)):
        return INFINITY
    lam = post_var / denom                                                   # eq 79
    cavity_mean = post_mean + lam * (site_precision_i * post_mean - site_natural_mean_i)  # eq 78
    if site_moments(model, y, cavity_mean, lam, &log_z, &alpha, &beta) != 0 or not isfinite(beta):
        return INFINITY
    num = 1.0 - lam * beta
    if not num > 0.0:
        return INFINITY
    return 0.5 * log(num / denom)


cdef int entropy_pick(const SiteModel* model, const double* y, int n,
                      const double* site_precision, const double* site_natural_mean,
                      const double* post_diag, const double* post_mean,
                      const unsigned char* done) noexcept nogil:
    """Index of the not-yet-done site with the most negative ``entropy_score`` (lowest on ties).

    Returns -1 only when every site is done.
    """
    cdef int j, best = -1
    cdef double score, best_score = INFINITY
    for j in range(n):
        if done[j]:
            continue
        score = entropy_score(model, y[j], post_diag[j], post_mean[j], site_precision[j],
                              site_natural_mean[j])
        if best < 0 or score < best_score:
            best = j
            best_score = score
    return best


# --------------------------------------------------------------------------- #
# column access (sweep bookkeeping: _common.pxd's sweep_stats_reset/record)
# --------------------------------------------------------------------------- #

cdef inline void _gather_column(const double* a, int n, int i, double* col) noexcept nogil:
    """col = column i of the symmetric row-major a of which only the lower triangle is current."""
    dcopy(i + 1, a + <Py_ssize_t>i * n, 1, col, 1)                              # a[i, 0..i]
    if i + 1 < n:
        dcopy(n - i - 1, a + <Py_ssize_t>(i + 1) * n + i, n, col + i + 1, 1)   # a[i+1.., i]


cdef inline int _next_site(int t, const int* perm, bint entropy, const SiteModel* model,
                           const double* y, int n, const double* site_precision,
                           const double* site_natural_mean, const double* post_diag,
                           const double* post_mean, unsigned char* done) noexcept nogil:
    cdef int i
    if entropy:
        i = entropy_pick(model, y, n, site_precision, site_natural_mean, post_diag, post_mean, done)
        done[i] = 1
        return i
    if perm != NULL:
        return perm[t]
    return t


# --------------------------------------------------------------------------- #
# sweeps
# --------------------------------------------------------------------------- #

cdef void gp_sweep_sequential(const SiteModel* model, const double* y, int n,
                              double* site_precision, double* site_natural_mean,
                              double* post_cov, double* post_mean,
                              const int* perm, bint entropy, double* post_diag, unsigned char* done,
                              double* col, const SiteUpdateOptions* opts,
                              SweepStats* stats, double* half_log_det_b) noexcept nogil:
    """One sequential sweep: site_step, then dsyr (lower triangle) + daxpy per site.

    ``post_cov``: lower triangle current on entry and exit.  Order: ``perm`` (NULL =
    0..n-1) unless ``entropy``, which needs ``post_diag`` and ``done`` (n each) as
    workspace; otherwise those may be NULL.  ``col``: n doubles.  ``half_log_det_b``
    (may be NULL) accumulates ½ log|B| through the determinant lemma: a site change
    Δτ_i multiplies |B| by ``1 + Δτ_i Σ_ii`` (Σ before the update).
    """
    cdef int t, i, j, result
    cdef double tau_old, nu_old, cov_coef, mean_coef, sii
    sweep_stats_reset(stats)
    if entropy:
        for j in range(n):
            post_diag[j] = post_cov[<Py_ssize_t>j * n + j]
            done[j] = 0
    for t in range(n):
        if interrupt_requested(stats):
            return
        i = _next_site(t, perm, entropy, model, y, n, site_precision, site_natural_mean,
                       post_diag, post_mean, done)
        tau_old = site_precision[i]
        nu_old = site_natural_mean[i]
        cov_coef = 0.0
        mean_coef = 0.0
        sii = post_cov[<Py_ssize_t>i * n + i]
        result = site_step(model, y[i], sii, post_mean[i],
                           &site_precision[i], &site_natural_mean[i], opts, &cov_coef, &mean_coef)
        sweep_stats_record(stats, result, tau_old, nu_old, site_precision[i], site_natural_mean[i])
        if (result == STEP_APPLIED or result == STEP_CLIPPED) and (cov_coef != 0.0 or mean_coef != 0.0):
            if half_log_det_b != NULL:
                half_log_det_b[0] += 0.5 * log1p((site_precision[i] - tau_old) * sii)
            _gather_column(post_cov, n, i, col)
            if cov_coef != 0.0:
                syr(LOWER, n, cov_coef, col, post_cov, n)                         # eq 84
            if mean_coef != 0.0:
                daxpy(n, mean_coef, col, 1, post_mean, 1)
            if entropy and cov_coef != 0.0:
                for j in range(n):
                    post_diag[j] += cov_coef * col[j] * col[j]


cdef void gp_sweep_blocked(const SiteModel* model, const double* y, int n,
                           double* site_precision, double* site_natural_mean,
                           double* post_cov, double* post_mean,
                           const int* perm, bint entropy, double* post_diag, unsigned char* done,
                           int block_size, double* rows, double* small, double* col,
                           const SiteUpdateOptions* opts, SweepStats* stats,
                           double* half_log_det_b) noexcept nogil:
    """One sweep with the rank-1 updates of ``block_size`` sites delayed and folded in by syrk.

    Same sequence of site updates as ``gp_sweep_sequential`` (up to rounding).
    Workspace: ``rows`` block_size x n, ``small`` block_size, ``col`` n doubles;
    ``post_diag``/``done`` as for the sequential sweep.  ``rows[r]`` holds
    ``sqrt(c_r) u_r`` for positive coefficients from the top and ``sqrt(-c_r) u_r``
    for negative ones from the bottom, so that within a block
    ``Σ = Σ₀ + R_posᵀ R_pos - R_negᵀ R_neg``.  ``half_log_det_b`` (may be NULL) as
    for the sequential sweep.
    """
    cdef int t = 0, kk, b, i, j, r, n_pos, n_neg, result
    cdef double tau_old, nu_old, cov_coef, mean_coef, sii, v, scale
    cdef double* dst
    cdef double* neg_rows
    sweep_stats_reset(stats)
    if entropy:
        for j in range(n):
            post_diag[j] = post_cov[<Py_ssize_t>j * n + j]
            done[j] = 0
    while t < n:
        kk = block_size if n - t > block_size else n - t
        n_pos = 0
        n_neg = 0
        for b in range(kk):
            if interrupt_requested(stats):
                return
            i = _next_site(t + b, perm, entropy, model, y, n, site_precision, site_natural_mean,
                           post_diag, post_mean, done)
            # current Σ_ii = Σ₀_ii + Σ_pos R[r, i]² - Σ_neg R[r, i]²   (O(block) work)
            sii = post_cov[<Py_ssize_t>i * n + i]
            for r in range(n_pos):
                v = rows[<Py_ssize_t>r * n + i]
                small[r] = v
                sii += v * v
            for r in range(block_size - n_neg, block_size):
                v = rows[<Py_ssize_t>r * n + i]
                small[r] = v
                sii -= v * v
            tau_old = site_precision[i]
            nu_old = site_natural_mean[i]
            cov_coef = 0.0
            mean_coef = 0.0
            result = site_step(model, y[i], sii, post_mean[i], &site_precision[i],
                               &site_natural_mean[i], opts, &cov_coef, &mean_coef)
            sweep_stats_record(stats, result, tau_old, nu_old, site_precision[i], site_natural_mean[i])
            if not ((result == STEP_APPLIED or result == STEP_CLIPPED)
                    and (cov_coef != 0.0 or mean_coef != 0.0)):
                continue
            if half_log_det_b != NULL:
                half_log_det_b[0] += 0.5 * log1p((site_precision[i] - tau_old) * sii)
            # current column u = Σ[:, i]
            _gather_column(post_cov, n, i, col)
            if n_pos > 0:
                gemv_t(n_pos, n, 1.0, rows, n, small, 1.0, col)
            if n_neg > 0:
                neg_rows = rows + <Py_ssize_t>(block_size - n_neg) * n
                gemv_t(n_neg, n, -1.0, neg_rows, n, small + block_size - n_neg, 1.0, col)
            if mean_coef != 0.0:
                daxpy(n, mean_coef, col, 1, post_mean, 1)
            if entropy and cov_coef != 0.0:
                for j in range(n):
                    post_diag[j] += cov_coef * col[j] * col[j]
            if cov_coef > 0.0:
                dst = rows + <Py_ssize_t>n_pos * n
                n_pos += 1
                scale = sqrt(cov_coef)
            elif cov_coef < 0.0:
                n_neg += 1
                dst = rows + <Py_ssize_t>(block_size - n_neg) * n
                scale = sqrt(-cov_coef)
            else:
                continue
            for j in range(n):
                dst[j] = scale * col[j]
        # fold the block in: Σ += R_posᵀ R_pos - R_negᵀ R_neg (lower triangle, BLAS-3)
        if n_pos > 0:
            syrk(LOWER, n, n_pos, 1.0, rows, n, 1.0, post_cov, n)
        if n_neg > 0:
            syrk(LOWER, n, n_neg, -1.0, rows + <Py_ssize_t>(block_size - n_neg) * n, n,
                 1.0, post_cov, n)
        t += kk


cdef void gp_parallel_update(const SiteModel* model, const double* y, int n,
                             double* site_precision, double* site_natural_mean,
                             const double* post_diag, const double* post_mean,
                             const SiteUpdateOptions* opts, SweepStats* stats) noexcept nogil:
    """Update every site from the same posterior (``diag Σ``, ``μ``); the posterior is not touched."""
    cdef int i, result
    cdef double tau_old, nu_old, cov_coef, mean_coef
    sweep_stats_reset(stats)
    for i in range(n):
        tau_old = site_precision[i]
        nu_old = site_natural_mean[i]
        result = site_step(model, y[i], post_diag[i], post_mean[i], &site_precision[i],
                           &site_natural_mean[i], opts, &cov_coef, &mean_coef)
        sweep_stats_record(stats, result, tau_old, nu_old, site_precision[i], site_natural_mean[i])


# --------------------------------------------------------------------------- #
# Python API
# --------------------------------------------------------------------------- #

def auto_block_size(int n):
    """Default ``block_size`` of the blocked schedule for n sites.

    n for n <= 64 (one fold per sweep), 64 for n < 3000, 128 above (the fastest measured
    at n = 2000 and n = 4000). Larger blocks make the syrk folds more efficient but cost
    O(k n) per site in the column reconstruction.
    """
    if n <= 64:
        return max(n, 1)
    if n < 3000:
        return 64
    return 128


cdef int _scan_kernel(const double* K, int n, double rtol, int* bad_i, int* bad_j) noexcept nogil:
    """0 if K is finite, has a nonnegative diagonal and is symmetric to ``rtol * max K_ii``;
    else 1 (non-finite), 2 (negative diagonal) or 3 (asymmetric), with the offending entry."""
    cdef Py_ssize_t i, j, nn = n
    cdef double v, a, b, scale = 0.0
    for i in range(nn):
        v = K[i * nn + i]
        if not isfinite(v):
            bad_i[0] = <int>i
            bad_j[0] = <int>i
            return 1
        if v < 0.0:
            bad_i[0] = <int>i
            bad_j[0] = <int>i
            return 2
        if v > scale:
            scale = v
    for i in range(nn):
        for j in range(i):
            a = K[i * nn + j]
            b = K[j * nn + i]
            if not (isfinite(a) and isfinite(b)):
                bad_i[0] = <int>i
                bad_j[0] = <int>j
                if isfinite(a):
                    bad_i[0] = <int>j
                    bad_j[0] = <int>i
                return 1
            if fabs(a - b) > rtol * scale:
                bad_i[0] = <int>i
                bad_j[0] = <int>j
                return 3
    return 0


cdef Py_ssize_t _first_non_finite(const double* a, Py_ssize_t count) noexcept nogil:
    cdef Py_ssize_t k
    for k in range(count):
        if not isfinite(a[k]):
            return k
    return -1


def _check_kernel_matrix(const double[:, ::1] K):
    cdef int n = K.shape[0], bad_i = -1, bad_j = -1, code
    if K.shape[1] != n:
        raise ValueError(f"K must be square; got shape ({K.shape[0]}, {K.shape[1]})")
    if n == 0:
        return 0
    with nogil:
        code = _scan_kernel(&K[0, 0], n, _SYMMETRY_RTOL, &bad_i, &bad_j)
    if code == 1:
        raise ValueError(f"K must be finite; K[{bad_i}, {bad_j}] = {K[bad_i, bad_j]!r}")
    if code == 2:
        raise ValueError(f"K must have a nonnegative diagonal; K[{bad_i}, {bad_i}] = {K[bad_i, bad_i]!r}")
    if code == 3:
        raise ValueError(f"K must be symmetric; K[{bad_i}, {bad_j}] = {K[bad_i, bad_j]!r} but "
                         f"K[{bad_j}, {bad_i}] = {K[bad_j, bad_i]!r}")
    return n


def _check_outputs(post_cov, post_mean, int n):
    if post_cov.shape[0] != n or post_cov.shape[1] != n:
        raise ValueError(f"post_cov must have shape ({n}, {n}); got "
                         f"({post_cov.shape[0]}, {post_cov.shape[1]})")
    if post_mean.shape[0] != n:
        raise ValueError(f"post_mean must have length n = {n}; got {post_mean.shape[0]}")


cdef class DenseEPOptions(EngineOptions):
    """Options of the dense GP engine (:class:`DenseEP`), checked once here (read-only).

    Parameters
    ----------
    schedule : {SCHEDULE_SEQUENTIAL, SCHEDULE_PARALLEL, SCHEDULE_BLOCKED}
        Default blocked.
    order : {ORDER_FIXED, ORDER_RANDOM, ORDER_ENTROPY}
        Site order within a sweep (ignored by the parallel schedule).
    damping : float in (0, 1]
        Step in natural parameters (1 = none).
    tol : float > 0
        Convergence threshold on the relative site change and the relative change of log Z.
    max_sweeps : int >= 1
        Maximum number of sweeps (parallel: iterations).
    negative_precision : {NEGATIVE_CLIP, NEGATIVE_SKIP}
        Policy for negative target precisions; NEGATIVE_ALLOW is rejected.
    block_size : int >= 0
        Sites per syrk fold of the blocked schedule (0 = ``auto_block_size(n)``; values
        above n are clipped to n).
    refresh_every : int >= 1
        Sequential and blocked schedules: refactorise from the Cholesky of B every this
        many sweeps, and always once more after the last sweep, so the returned posterior
        and log Z are always from a fresh factorisation. Between refactorisations log Z is
        evaluated from the incremental ``diag Σ``, ``μ`` and ½ log|B| accumulated by the
        determinant lemma. The parallel schedule refactorises every iteration.

    Raises
    ------
    ValueError
        A field out of range (the message names it).

    Examples
    --------
    >>> from fastep._epcore.gp_ep import DenseEPOptions, SCHEDULE_PARALLEL
    >>> options = DenseEPOptions(schedule=SCHEDULE_PARALLEL, damping=0.5)
    >>> options.replace(damping=0.8).damping
    0.8
    """
    _FIELDS = ("schedule", "order", "damping", "tol", "max_sweeps", "negative_precision",
               "block_size", "refresh_every")

    def __init__(self, *, int schedule=SCHEDULE_BLOCKED, int order=ORDER_FIXED, double damping=1.0,
                 double tol=1e-8, int max_sweeps=100, int negative_precision=NEGATIVE_CLIP,
                 int block_size=0, int refresh_every=1):
        if schedule not in (SCHEDULE_SEQUENTIAL, SCHEDULE_PARALLEL, SCHEDULE_BLOCKED):
            raise ValueError("schedule must be SCHEDULE_SEQUENTIAL (0), SCHEDULE_PARALLEL (1) or "
                             f"SCHEDULE_BLOCKED (2); got {schedule}")
        if order not in (ORDER_FIXED, ORDER_RANDOM, ORDER_ENTROPY):
            raise ValueError(f"order must be ORDER_FIXED (0), ORDER_RANDOM (1) or ORDER_ENTROPY (2); got {order}")
        self.set_sweep(damping, tol, max_sweeps, 1, True)
        self.set_negative_precision(negative_precision, "GP EP (site precisions must stay >= 0)")
        if block_size < 0:
            raise ValueError(f"block_size must be >= 0 (0 = automatic); got {block_size}")
        if refresh_every < 1:
            raise ValueError(f"refresh_every must be >= 1; got {refresh_every}")
        self.sweep.schedule, self.sweep.order = schedule, order
        self.block_size = block_size
        self.refresh_every = refresh_every


_DEFAULT_OPTIONS = DenseEPOptions()


def _refactor_error(int info, where):
    if info < 0:
        return np.linalg.LinAlgError(
            f"posterior variance Sigma[{-info - 1}, {-info - 1}] < 0 {where}: the kernel matrix is "
            f"not positive semi-definite; add jitter to its diagonal")
    return np.linalg.LinAlgError(
        f"Cholesky factorisation of B = I + S^1/2 K S^1/2 failed {where} (leading minor of order "
        f"{info} is not positive): the kernel matrix is not positive semi-definite; add jitter to "
        f"its diagonal")


cdef class DenseEPResult(SweepResult):
    """What one :meth:`DenseEP.run` reports: the :class:`~fastep._epcore._common.SweepResult`
    fields and the block size of the schedule it ran (built as ``DenseEPResult(result,
    block_size)`` from the sweep driver's result).

    Attributes
    ----------
    block_size : int
        Sites per syrk fold of the blocked schedule in the run (1 for the sequential
        schedule, 0 for the parallel one).
    """
    _OWN = ("block_size",)
    _FIELDS = SweepResult._FIELDS + ("block_size",)

    def __init__(self, SweepResult result=None, int block_size=0):
        self.copy_common(SweepResult() if result is None else result)
        self.block_size = block_size


def _effective_block_size(int schedule, int block_size, int n):
    if schedule == SCHEDULE_SEQUENTIAL:
        return 1
    if schedule == SCHEDULE_PARALLEL:
        return 0
    if block_size == 0:
        block_size = auto_block_size(n)
    if block_size > n:
        block_size = n
    return block_size if block_size > 0 else 1


cdef class DenseEP:
    """Dense GP EP bound to one kernel matrix, its targets and likelihood (Minka, *EP: a quick
    reference*, §2, eqs 77-88; Rasmussen & Williams Algorithm 3.5 in the Σ form).

    Built once from validated inputs; :meth:`run` performs sweeps from given sites to
    convergence and returns a :class:`DenseEPResult`. The module
    docstring describes the schedules, orders, refactorisation and evidence.

    Parameters
    ----------
    K : (n, n) float64, C-contiguous
        Prior covariance of the latent values (symmetric PSD; symmetry is checked to a
        relative 1e-8 of ``max K_ii``, positive semi-definiteness by the Cholesky of B).
    y : (n,) float64
        Targets handed to the site kernel (checked against the likelihood's support).
    spec : SiteSpec
        Likelihood (``Likelihood.site_spec()``).
    options : DenseEPOptions, optional
        Schedule, order, damping, convergence test and refactorisation (default:
        ``DenseEPOptions()``).
    seed : int >= 0
        Seed of ORDER_RANDOM's generator (the same seed gives the same run).
    output : {OUTPUT_COVARIANCE, OUTPUT_FACTOR}
        What ``post_cov`` holds after :meth:`run`: Σ (full, symmetric), or the
        lower-triangular Cholesky factor L of B = I + S^½ K S^½ (strict upper triangle
        zero), which is all that prediction and the evidence gradient need.
    validate : bool, default True
        Check K and y here and the site and output arrays at every :meth:`run`
        (ValueError naming the argument; the options were checked when built). ``False`` is the one path for callers
        that validated them already (the estimators, at every optimiser step): invalid
        inputs then give undefined results instead of an error.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep._epcore import gp_ep
    >>> from fastep import Probit
    >>> X = np.linspace(-2, 2, 20)[:, None]
    >>> K = np.exp(-0.5 * (X - X.T) ** 2) + 1e-8 * np.eye(20)
    >>> y = np.sign(X[:, 0]) + 0.0
    >>> engine = gp_ep.DenseEP(K, y, Probit().site_spec(), gp_ep.DenseEPOptions(tol=1e-6))
    >>> tau, nu = np.zeros(20), np.zeros(20)
    >>> result = engine.run(tau, nu, np.empty((20, 20)), np.empty(20))
    >>> result.converged
    True
    """

    def __init__(self, K, y, SiteSpec spec not None, DenseEPOptions options=None, *,
                 int output=OUTPUT_COVARIANCE, unsigned long seed=0, bint validate=True):
        if options is None:
            options = _DEFAULT_OPTIONS
        if validate:
            self.n = _check_kernel_matrix(K)
            _check_targets(spec, y, self.n)
            if output != OUTPUT_COVARIANCE and output != OUTPUT_FACTOR:
                raise ValueError(f"output must be OUTPUT_COVARIANCE (0) or OUTPUT_FACTOR (1); got {output}")
        else:
            self.n = K.shape[0]
        self.K = K
        self.y = y
        self.spec = spec
        self.options = options
        self.sweep = options.sweep
        self.block_size = _effective_block_size(self.sweep.schedule, options.block_size, self.n)
        self.refactor_every = options.refresh_every
        self.output = output
        self.seed = seed
        self.validate = validate

    def _check_run(self, site_precision, site_natural_mean, post_cov, post_mean, post_var,
                   cavity_mean, cavity_var):
        cdef int n = self.n
        _check_vector("site_precision", site_precision, n, nonnegative=True)
        _check_vector("site_natural_mean", site_natural_mean, n)
        _check_outputs(post_cov, post_mean, n)
        for name, out in (("cavity_mean", cavity_mean), ("cavity_var", cavity_var)):
            if out is not None and out.shape[0] != n:
                raise ValueError(f"{name} must have length n = K.shape[0] = {n}; got {out.shape[0]}")
        outputs = {"site_precision": site_precision, "site_natural_mean": site_natural_mean,
                   "post_cov": post_cov, "post_mean": post_mean}
        if post_var is not None:
            if post_var.shape[0] != n:
                raise ValueError(f"post_var must have shape ({n},); got ({post_var.shape[0]},)")
            outputs["post_var"] = post_var
        _check_no_aliasing({"K": self.K, "y": self.y}, outputs)

    def run(self, double[::1] site_precision, double[::1] site_natural_mean,
            double[:, ::1] post_cov, double[::1] post_mean, *,
            double[::1] post_var=None, double[::1] cavity_mean=None, double[::1] cavity_var=None,
            object sweep_callback=None):
        """Sweep from the given sites to convergence (or ``max_sweeps``).

        Parameters
        ----------
        site_precision, site_natural_mean : (n,) float64, in/out
            Sites ``τ_i >= 0`` and ``ν_i`` (zeros: cold start; anything valid: warm
            start). Updated in place.
        post_cov : (n, n) float64, out
            Σ of the returned sites, or the factor L (``output``).
        post_mean : (n,) float64, out
            Posterior mean μ = Σν of the returned sites.
        post_var : (n,) float64, out, optional
            diag Σ of the returned sites.
        cavity_mean, cavity_var : (n,) float64, out, optional
            The cavities ``h_i``, ``λ_i`` (eqs 78-79) of the returned sites, computed from
            the Cholesky of B (accurate also where ``τ_i Σ_ii`` is within rounding of 1).
        sweep_callback : callable, optional
            ``sweep_callback(sweep, max_change, log_z)`` after every sweep (with the GIL,
            between sweeps). Returning ``False`` stops the sweeps there (the state is
            finalised from the current sites, ``stopped`` is True). An exception it raises
            is re-raised after the site arrays are restored to their input values.

        Returns
        -------
        DenseEPResult
            ``log_z`` is always from the stable form on a fresh factorisation (NaN only if
            some site's cavity is improper or its kernel fails at the returned state; then
            ``converged`` is False); ``block_size`` is the sites per fold used.

        Raises
        ------
        ValueError
            (``validate=True``) bad shapes, non-finite or negative sites, outputs aliasing
            inputs. Nothing is modified.
        numpy.linalg.LinAlgError
            The Cholesky of B fails (K not PSD). The site arrays are restored to their
            input values; ``post_cov``/``post_mean`` are then undefined.
        """
        if self.validate:
            self._check_run(site_precision, site_natural_mean, post_cov, post_mean, post_var,
                            cavity_mean, cavity_var)
        cdef int n = self.n
        cdef int k_block = self.block_size
        cdef int schedule = self.sweep.schedule
        cdef int max_sweeps = self.sweep.max_sweeps, refactor_every = self.refactor_every
        if n == 0:
            return DenseEPResult(SweepResult(converged=True, max_change=0.0, log_z=0.0, log_z_change=0.0),
                                 k_block)
        cdef SweepDriver driver = SweepDriver(self.sweep.tol, max_sweeps, sweep_callback, <double>n * n)
        driver.keep(site_precision, site_natural_mean)
        cdef SiteUpdateOptions opts = natural_update_options(self.sweep.damping, self.sweep.negative_precision)
        cdef bint parallel = schedule == SCHEDULE_PARALLEL
        cdef bint entropy = self.sweep.order == ORDER_ENTROPY and not parallel
        cdef bint shuffled = self.sweep.order == ORDER_RANDOM and not parallel

        cdef const double[:, ::1] K = self.K
        cdef const double[::1] y = self.y
        cdef double[:, ::1] work = np.empty((n, n))
        cdef double[::1] scratch = np.empty(n)
        cdef double[::1] post_diag = np.empty(n)
        cdef double[::1] col = np.empty(n)
        cdef double[::1] vec4 = np.empty(4 * n)
        # diag(B⁻¹) from the last gp_refactor_marginals (valid while have_factor)
        cdef double[::1] inv_diag = np.empty(n)
        cdef double* cav_mean_ptr = &cavity_mean[0] if cavity_mean is not None else NULL
        cdef double* cav_var_ptr = &cavity_var[0] if cavity_var is not None else NULL
        cdef double[::1] small = np.empty(max(k_block, 1))
        cdef int[::1] perm = np.empty(n, dtype=np.intc)
        cdef unsigned char[::1] done = np.zeros(n, dtype=np.uint8)

        cdef const SiteModel* model = &self.spec.model
        cdef const double* k_ptr = &K[0, 0]
        cdef const double* y_ptr = &y[0]
        cdef double* tau_ptr = &site_precision[0]
        cdef double* nu_ptr = &site_natural_mean[0]
        cdef double* cov_ptr = &post_cov[0, 0]
        cdef double* mean_ptr = &post_mean[0]
        cdef double* diag_ptr = &post_diag[0]
        cdef double* work_ptr = &work[0, 0]
        cdef const int* perm_ptr = &perm[0] if shuffled else NULL
        cdef unsigned long long rng_state = self.seed
        cdef SweepStats* stats = driver.begin_sweep()
        cdef int info = 0, failed_sweep = -1, sweep, bad_site = -1
        cdef double log_chol = 0.0, new_log_z, prev_log_z = NAN, refactor_log_z = NAN
        cdef bint refactor_now, use_marginals, have_factor = False
        cdef bint want_factor = self.output == OUTPUT_FACTOR
        cdef Py_ssize_t j

        with nogil:
            # the parallel schedule works from diag Σ and μ alone (L kept in post_cov); the
            # sweeps need Σ itself
            if parallel:
                info = gp_refactor_marginals(k_ptr, n, tau_ptr, nu_ptr, cov_ptr, mean_ptr, diag_ptr,
                                             work_ptr, &scratch[0], &log_chol, &inv_diag[0])
            else:
                info = gp_refactor(k_ptr, n, tau_ptr, nu_ptr, cov_ptr, mean_ptr, diag_ptr, work_ptr,
                                   &scratch[0], &log_chol, True)
            have_factor = parallel
            if info == 0:
                driver.log_z = gp_log_z(model, y_ptr, n, tau_ptr, nu_ptr, diag_ptr, mean_ptr,
                                        log_chol, &bad_site)
                if gp_needs_stable_log_z(n, tau_ptr, diag_ptr):
                    if have_factor:
                        driver.log_z = gp_log_z_stable_factored(
                            model, y_ptr, n, k_ptr, tau_ptr, nu_ptr, diag_ptr, cov_ptr,
                            &inv_diag[0], work_ptr, &vec4[0], NULL, NULL, &bad_site)
                    else:
                        driver.log_z = gp_log_z_stable(model, y_ptr, n, k_ptr, tau_ptr, nu_ptr,
                                                       diag_ptr, work_ptr, &vec4[0], NULL, NULL,
                                                       &bad_site)
                refactor_log_z = driver.log_z
                for sweep in range(1, max_sweeps + 1):
                    if parallel:
                        gp_parallel_update(model, y_ptr, n, tau_ptr, nu_ptr, diag_ptr, mean_ptr,
                                           &opts, stats)
                    else:
                        if shuffled:
                            random_permutation(n, &perm[0], &rng_state)
                        if schedule == SCHEDULE_SEQUENTIAL:
                            gp_sweep_sequential(model, y_ptr, n, tau_ptr, nu_ptr, cov_ptr, mean_ptr,
                                                perm_ptr, entropy, diag_ptr, &done[0], &col[0],
                                                &opts, stats, &log_chol)
                        else:
                            gp_sweep_blocked(model, y_ptr, n, tau_ptr, nu_ptr, cov_ptr, mean_ptr,
                                             perm_ptr, entropy, diag_ptr, &done[0], k_block,
                                             work_ptr, &small[0], &col[0], &opts, stats, &log_chol)
                    if driver.interrupted():
                        break               # Ctrl-C: the sites are restored and the exception raised below
                    driver.record_sweep(sweep)
                    refactor_now = parallel or sweep % refactor_every == 0 or sweep == max_sweeps
                    if not refactor_now:
                        # incremental posterior: diag Σ from the (current) lower triangle, μ as
                        # updated, ½ log|B| accumulated by the determinant lemma
                        for j in range(n):
                            diag_ptr[j] = cov_ptr[<Py_ssize_t>j * n + j]
                        new_log_z = gp_log_z(model, y_ptr, n, tau_ptr, nu_ptr, diag_ptr, mean_ptr,
                                             log_chol, &bad_site)
                        driver.test(new_log_z, driver.log_z)
                        if not (driver.converged or not isfinite(new_log_z)):
                            driver.log_z = new_log_z
                            if driver.notify(sweep):
                                break
                            continue
                        # converged (or something needs a fresh factorisation): refactorise and
                        # report the refactorised posterior and log Z
                        prev_log_z = driver.log_z
                        # probably the last refactorisation: without Σ if only L is wanted
                        use_marginals = want_factor
                    else:
                        use_marginals = parallel
                    if use_marginals:
                        info = gp_refactor_marginals(k_ptr, n, tau_ptr, nu_ptr, cov_ptr, mean_ptr,
                                                     diag_ptr, work_ptr, &scratch[0], &log_chol,
                                                     &inv_diag[0])
                    else:
                        info = gp_refactor(k_ptr, n, tau_ptr, nu_ptr, cov_ptr, mean_ptr, diag_ptr,
                                           work_ptr, &scratch[0], &log_chol, True)
                    have_factor = use_marginals
                    if info != 0:
                        failed_sweep = sweep
                        break
                    new_log_z = gp_log_z(model, y_ptr, n, tau_ptr, nu_ptr, diag_ptr, mean_ptr,
                                         log_chol, &bad_site)
                    if gp_needs_stable_log_z(n, tau_ptr, diag_ptr):
                        # some τ_i Σ_ii within 1e-4 of 1: the textbook form loses digits
                        # (work is free after a refactorisation). The incremental values between
                        # refactorisations then disagree with it by that loss, so Δ log Z is
                        # taken against the previous refactorisation's value instead. After
                        # gp_refactor_marginals its L (post_cov) and diag(B⁻¹) are reused; after
                        # gp_refactor post_cov holds Σ, so B is factorised again.
                        if have_factor:
                            new_log_z = gp_log_z_stable_factored(model, y_ptr, n, k_ptr, tau_ptr,
                                                                 nu_ptr, diag_ptr, cov_ptr,
                                                                 &inv_diag[0], work_ptr, &vec4[0],
                                                                 NULL, NULL, &bad_site)
                        else:
                            new_log_z = gp_log_z_stable(model, y_ptr, n, k_ptr, tau_ptr, nu_ptr,
                                                        diag_ptr, work_ptr, &vec4[0], NULL, NULL,
                                                        &bad_site)
                        if not refactor_now:
                            prev_log_z = refactor_log_z
                    refactor_log_z = new_log_z
                    if not refactor_now:
                        driver.log_z = prev_log_z
                    driver.test(new_log_z, driver.log_z)
                    driver.log_z = new_log_z
                    driver.notify(sweep)
                    if driver.converged or driver.stopped:
                        break
                    if have_factor and not parallel and sweep < max_sweeps:
                        # not converged after all: the next sweep needs Σ
                        gp_covariance_from_factor(k_ptr, n, tau_ptr, cov_ptr, work_ptr, &scratch[0])
                        have_factor = False
                if info == 0 and not driver.interrupt.pending:
                    # the reported log Z (and the cavities) always in the stable form, on the
                    # final sites, from the factor at hand: after gp_refactor_marginals its L and
                    # diag(B⁻¹) (O(n²)); for OUTPUT_FACTOR after gp_refactor, the L returned
                    # anyway (+ trtri, n³/3); for Σ output after gp_refactor (post_cov holds Σ,
                    # L is gone) B is factorised again (potrf + trtri, 2n³/3; work is free here).
                    if want_factor:
                        if not have_factor:
                            info = gp_factor_only(k_ptr, n, tau_ptr, cov_ptr, &scratch[0])
                        if info == 0:
                            driver.log_z = gp_log_z_stable_factored(
                                model, y_ptr, n, k_ptr, tau_ptr, nu_ptr, diag_ptr, cov_ptr,
                                &inv_diag[0] if have_factor else NULL, work_ptr, &vec4[0],
                                cav_mean_ptr, cav_var_ptr, &bad_site)
                            for j in range(n):
                                memset(cov_ptr + j * n + j + 1, 0, (n - 1 - j) * sizeof(double))
                    else:
                        if have_factor:
                            driver.log_z = gp_log_z_stable_factored(
                                model, y_ptr, n, k_ptr, tau_ptr, nu_ptr, diag_ptr, cov_ptr,
                                &inv_diag[0], work_ptr, &vec4[0], cav_mean_ptr, cav_var_ptr,
                                &bad_site)
                            gp_covariance_from_factor(k_ptr, n, tau_ptr, cov_ptr, work_ptr, &scratch[0])
                        else:
                            driver.log_z = gp_log_z_stable(model, y_ptr, n, k_ptr, tau_ptr, nu_ptr,
                                                           diag_ptr, work_ptr, &vec4[0], cav_mean_ptr,
                                                           cav_var_ptr, &bad_site)
                        symmetrize(LOWER, n, cov_ptr, n)
        driver.raise_pending()                  # Ctrl-C or the callback raised: inputs back, re-raise
        if info == 0 and post_var is not None:
            np.asarray(post_var)[:] = np.asarray(post_diag)
        if info != 0:
            driver.restore()
            where = "for the initial sites" if failed_sweep < 0 else f"after sweep {failed_sweep}"
            raise _refactor_error(info, where)
        return DenseEPResult(driver.result(), k_block)

    def incremental_sweep(self, double[::1] site_precision, double[::1] site_natural_mean,
                          double[:, ::1] post_cov, double[::1] post_mean):
        """One sweep of the engine's schedule on the given posterior, without refactorisation.

        A hook for tests and diagnostics: ``post_cov`` and ``post_mean`` are updated by the
        rank-1 (sequential) or delayed-rank-1 (blocked) updates only, so they can be compared
        with :func:`refactor_posterior` of the new sites. The engine's schedule must be
        sequential or blocked (the parallel schedule has no incremental update); its order,
        damping, negative-precision policy and block size apply. ``K`` is not read.

        Parameters
        ----------
        site_precision, site_natural_mean : (n,) float64, in/out
            Sites ``τ_i >= 0`` and ``ν_i``; updated in place.
        post_cov : (n, n) float64, in/out
            Σ of the given sites (e.g. from :func:`refactor_posterior` or :meth:`run`);
            returned full and symmetric.
        post_mean : (n,) float64, in/out
            μ of the given sites.

        ORDER_RANDOM permutes the sites as the first sweep of :meth:`run` does (the engine's
        ``seed``).

        Returns
        -------
        dict
            ``max_change``, ``n_skipped``, ``n_clipped``, ``n_failed`` of the sweep and
            ``block_size`` used.

        Raises
        ------
        ValueError
            The engine's schedule is parallel; (``validate=True``) bad shapes, non-finite or
            negative sites, a non-finite ``post_cov``, outputs aliasing inputs.
        """
        cdef int n = self.n
        cdef int schedule = self.sweep.schedule
        if schedule == SCHEDULE_PARALLEL:
            raise ValueError("schedule must be SCHEDULE_SEQUENTIAL (0) or SCHEDULE_BLOCKED (2) for "
                             "incremental_sweep (the parallel schedule has no incremental update)")
        cdef Py_ssize_t bad = -1
        if self.validate:
            if post_cov.shape[0] != n or post_cov.shape[1] != n:
                raise ValueError(f"post_cov must have shape ({n}, {n}); got ({post_cov.shape[0]}, "
                                 f"{post_cov.shape[1]})")
            _check_vector("site_precision", site_precision, n, nonnegative=True)
            _check_vector("site_natural_mean", site_natural_mean, n)
            _check_vector("post_mean", post_mean, n)
            if n > 0:
                with nogil:
                    bad = _first_non_finite(&post_cov[0, 0], <Py_ssize_t>n * n)
            if bad >= 0:
                raise ValueError(f"post_cov must be finite; post_cov[{bad // n}, {bad % n}] = "
                                 f"{post_cov[bad // n, bad % n]!r}")
            _check_no_aliasing({"K": self.K, "y": self.y},
                               {"site_precision": site_precision, "site_natural_mean": site_natural_mean,
                                "post_cov": post_cov, "post_mean": post_mean})
        cdef int k_block = self.block_size
        if n == 0:
            return dict(max_change=0.0, n_skipped=0, n_clipped=0, n_failed=0, block_size=k_block)
        cdef const double[::1] y = self.y
        cdef SiteUpdateOptions opts
        opts.update_form = UPDATE_NATURAL
        opts.damping = self.sweep.damping
        opts.negative_precision = self.sweep.negative_precision
        cdef bint entropy = self.sweep.order == ORDER_ENTROPY
        cdef bint shuffled = self.sweep.order == ORDER_RANDOM
        cdef double[:, ::1] rows = np.empty((k_block, n))
        cdef double[::1] small = np.empty(k_block)
        cdef double[::1] col = np.empty(n)
        cdef double[::1] post_diag = np.empty(n)
        cdef int[::1] perm = np.empty(n, dtype=np.intc)
        cdef unsigned char[::1] done = np.zeros(n, dtype=np.uint8)
        cdef unsigned long long rng_state = self.seed
        cdef const int* perm_ptr = &perm[0] if shuffled else NULL
        cdef const SiteModel* model = &self.spec.model
        cdef SweepStats stats
        sweep_stats_reset(&stats)
        stats.interrupt = NULL
        with nogil:
            if shuffled:
                random_permutation(n, &perm[0], &rng_state)
            if schedule == SCHEDULE_SEQUENTIAL:
                gp_sweep_sequential(model, &y[0], n, &site_precision[0], &site_natural_mean[0],
                                    &post_cov[0, 0], &post_mean[0], perm_ptr, entropy, &post_diag[0],
                                    &done[0], &col[0], &opts, &stats, NULL)
            else:
                gp_sweep_blocked(model, &y[0], n, &site_precision[0], &site_natural_mean[0],
                                 &post_cov[0, 0], &post_mean[0], perm_ptr, entropy, &post_diag[0],
                                 &done[0], k_block, &rows[0, 0], &small[0], &col[0], &opts, &stats, NULL)
            symmetrize(LOWER, n, &post_cov[0, 0], n)
        return dict(max_change=float(max(stats.max_change_precision, stats.max_change_natural_mean)),
                    n_skipped=int(stats.n_skipped), n_clipped=int(stats.n_clipped),
                    n_failed=int(stats.n_failed), block_size=int(k_block))


def log_marginal_likelihood(const double[:, ::1] K, const double[::1] y, SiteSpec spec not None,
                            const double[::1] site_precision, const double[::1] site_natural_mean):
    """log Z_EP of the given sites (module docstring; Minka eqs 87-88, stable B form).

    Refactorises from scratch (O(n³); allocates two n x n arrays).  At an EP fixed point
    this is the EP approximation of ``log p(y | K)``; for a Gaussian likelihood at its
    fixed point it equals ``log N(y; 0, K + σ² I)``.

    Raises
    ------
    ValueError
        Bad input (as :class:`DenseEP`), or a site whose cavity is improper or whose kernel
        fails at its cavity (the sites are then not a valid EP state).
    numpy.linalg.LinAlgError
        The Cholesky of B fails (K not PSD).
    """
    cdef int n = _check_kernel_matrix(K)
    _check_targets(spec, y, n)
    _check_vector("site_precision", site_precision, n, nonnegative=True)
    _check_vector("site_natural_mean", site_natural_mean, n)
    if n == 0:
        return 0.0
    cdef double[:, ::1] chol = np.empty((n, n))
    cdef double[:, ::1] work = np.empty((n, n))
    cdef double[::1] mean = np.empty(n)
    cdef double[::1] diag = np.empty(n)
    cdef double[::1] scratch = np.empty(n)
    cdef double[::1] vec4 = np.empty(4 * n)
    cdef double[::1] inv_diag = np.empty(n)
    cdef double log_chol = 0.0, total = NAN
    cdef int info, bad_site = -1
    with nogil:
        # the stable evidence from this refactorisation's L and diag(B⁻¹) (O(n²) more)
        info = gp_refactor_marginals(&K[0, 0], n, &site_precision[0], &site_natural_mean[0],
                                     &chol[0, 0], &mean[0], &diag[0], &work[0, 0], &scratch[0],
                                     &log_chol, &inv_diag[0])
        if info == 0:
            total = gp_log_z_stable_factored(&spec.model, &y[0], n, &K[0, 0], &site_precision[0],
                                             &site_natural_mean[0], &diag[0], &chol[0, 0],
                                             &inv_diag[0], &work[0, 0], &vec4[0], NULL, NULL,
                                             &bad_site)
    if info != 0:
        raise _refactor_error(info, "in log_marginal_likelihood")
    if bad_site == -2:
        raise _refactor_error(1, "in log_marginal_likelihood")
    if bad_site >= 0:
        raise ValueError(f"site {bad_site} has an improper cavity or its site kernel fails at the "
                         f"cavity; log marginal likelihood undefined for these sites")
    return float(total)


def refactor_posterior(const double[:, ::1] K, const double[::1] site_precision,
                       const double[::1] site_natural_mean, double[:, ::1] post_cov,
                       double[::1] post_mean):
    """Recompute Σ = (K⁻¹ + S)⁻¹ and μ = Σν from the sites (the engine's refactorisation).

    Exposed for tests and diagnostics (compare with the incrementally updated posterior of
    :meth:`DenseEP.incremental_sweep`).  ``post_cov`` is returned full and symmetric.  Allocates one
    n x n work array.  Returns ``Σ_i log L_ii = ½ log|B|``.

    Raises
    ------
    ValueError
        Bad shapes, non-finite input, negative precisions, aliasing.
    numpy.linalg.LinAlgError
        The Cholesky of B fails (K not PSD).
    """
    cdef int n = _check_kernel_matrix(K)
    _check_vector("site_precision", site_precision, n, nonnegative=True)
    _check_vector("site_natural_mean", site_natural_mean, n)
    _check_outputs(post_cov, post_mean, n)
    _check_no_aliasing({"K": K, "site_precision": site_precision,
                        "site_natural_mean": site_natural_mean},
                       {"post_cov": post_cov, "post_mean": post_mean})
    if n == 0:
        return 0.0
    cdef double[:, ::1] work = np.empty((n, n))
    cdef double[::1] diag = np.empty(n)
    cdef double[::1] scratch = np.empty(n)
    cdef double log_chol = 0.0
    cdef int info
    with nogil:
        info = gp_refactor(&K[0, 0], n, &site_precision[0], &site_natural_mean[0], &post_cov[0, 0],
                           &post_mean[0], &diag[0], &work[0, 0], &scratch[0], &log_chol, True)
        if info == 0:
            symmetrize(LOWER, n, &post_cov[0, 0], n)
    if info != 0:
        raise _refactor_error(info, "in refactor_posterior")
    return float(log_chol)
