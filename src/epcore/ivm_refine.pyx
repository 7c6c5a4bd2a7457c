# cython: language_level=3
"""Refinement on a fixed-size IVM active set: EP deletion-inclusion sweeps and exchange moves;
the options of the IVM engine and what its runs report.

Seeger, *Notes on Minka's Expectation Propagation for Gaussian process classification*,
§2.1 and §2.3, applied to the state of the Informative Vector Machine after selection
(Lawrence, Seeger & Herbrich, *Fast sparse Gaussian process methods: the informative vector
machine*; the arrays of ``IVMEP`` are listed in ivm.pxd).  The ``IVMEP`` methods
``refactorize``, ``refine``, ``exchange_gains``, ``exchange`` and ``run`` (ivm.pyx) run them.

Notation: A = Σ (the posterior covariance of f, Seeger's A with C = K), h = μ,
v_i⁻¹ = β_i (site precision), m_i (site mean), b = B m (natural site means);
the active points sit in "slots" r = 0..k-1 (``active[r]``, inclusion order).

* EP deletion-inclusion sweeps (``refine_sweeps``): cavity from the marginal, moment
  matching with the site kernel, eq (7) and the h update; sites that change by <= tol are
  skipped.  A sweep only ever reads Σ[I, I] and μ_I, so it keeps just that k x k block
  (``SII``) and μ_I: O(k²) per site, O(k³) per sweep.  The marginals of all n points
  (ς, μ), L and M are then rebuilt from the site parameters and K[I, :] (``_refactor``,
  O(k² n)), the periodic refactorisation the notes ask for; Σ[I, I] can also be rebuilt
  between sweeps (``_refactor_active``, O(k³)).  The sweeps run through the sweep driver
  (``_common.SweepDriver``: progress callback, Ctrl-C, the state restored on an error).
* Exchange moves (``exchange_moves``): j ∈ I out, i ∉ I in, scored by eqs (8)-(9) and the
  entropy criterion, which need A[j, i] for every pair: they keep ``S`` = Σ[I, :] (k x n)
  with ς and μ of all points and apply the 2x2 Woodbury update of A and h (one rank-2
  update, O(k n)); greedy or seeded random search.  The criterion is
  ``½ log|I + B_I^½ K_I B_I^½|`` (``IVMEP.entropy_reduction``).
* The refinement stages of a run (``refine_stages``, as ``IVMOptions`` asks): EP sweeps,
  exchange moves, and the EP sweeps again after any exchange (the entering points carry
  ADF sites).

Both keep the active set size.  They need K[I, :], fetched through the caller's
``column_fn`` and cached per column_fn (``KernelRows``), and one k x k or k x n work
array, so memory stays O(d n).  Every loop over sites or points runs with the GIL released.
"""
import numpy as np

from libc.math cimport INFINITY, NAN, M_PI
from libc.string cimport memmove, memcpy
from fastep._epcore._blas cimport gemv_t, potrf, trsm, gemm, ger, trsv as _trsv
from fastep._epcore._common import replaced_fields, same_fields
from fastep._epcore._common cimport (random_permutation, SweepDriver, SweepStats, sweep_stats_reset,
                                     interrupt_requested)

# g and ν at a cavity (inline, shared with the fused scoring pass of ivm.pyx), _log1m,
# the PSD tolerance
include "_ivm_moments.pxi"

cdef enum:
    EP_APPLIED = 0
    EP_SKIPPED = 1      # relative change of the site <= tol: nothing to do (converged site)
    EP_REJECTED = 2     # improper cavity, failing site kernel or improper new site: site kept


# --------------------------------------------------------------------------- #
# nogil building blocks
# --------------------------------------------------------------------------- #

cdef int _factor_sites(IVMArrays* s, const double* KI, double* t) noexcept nogil:
    """L = chol(I + B_I^½ K_I B_I^½) and t = L⁻¹ B_I^½ m_I, K_I read from KI = K[I, :].

    Returns 0, or the LAPACK info (> 0) when the matrix is not positive definite.
    """
    cdef int k = s.k, dm = s.d_max, r, q, info
    cdef Py_ssize_t nn = s.n
    cdef double sbr
    for r in range(k):
        sbr = sqrt(s.site_precision[s.active[r]])
        for q in range(r + 1):
            s.L[r * dm + q] = sbr * KI[r * nn + s.active[q]] * sqrt(s.site_precision[s.active[q]])
        s.L[r * dm + r] += 1.0
        for q in range(r + 1, k):
            s.L[r * dm + q] = 0.0
    info = potrf(True, k, s.L, dm)
    if info != 0:
        return info
    for r in range(k):
        t[r] = sqrt(s.site_precision[s.active[r]]) * s.site_mean[s.active[r]]
    _trsv(True, False, k, s.L, dm, t)
    return 0


cdef int _refactor(IVMArrays* s, const double* KI, double* S, double* work) noexcept nogil:
    """Rebuild L, M and the marginals ς, μ of all n points from the sites and K[I, :].

    With B̃ = I + B_I^½ K_I B_I^½ = L Lᵀ (Seeger §2.1): ``M = L⁻¹ B_I^½ K[I, :]`` (one trsm),
    ``ς = diag K - colsum(M²)`` (IVM eq 29), ``μ = Mᵀ L⁻¹ B_I^½ m_I`` (= K[:, I] w, §2.2), and
    when ``S`` is not NULL also ``S = Σ[I, :] = K[I, :] - M[:, I]ᵀ M`` (one gemm).  ``KI``
    holds K[I, :] in slot order.  ``work``: k² + k doubles.  Returns 0; the LAPACK info
    (> 0) when B̃ is not positive definite; -1 when some ς_i < -1e-8 K_ii after the rebuild.
    """
    cdef int k = s.k, n = s.n, r, q
    cdef Py_ssize_t i, nn = n
    cdef double sbr
    cdef double* t = work
    cdef double* G = work + k
    cdef double* row
    cdef const double* src
    cdef int info
    if k == 0:
        for i in range(nn):
            s.post_var[i] = s.diag_k[i]
            s.post_mean[i] = 0.0
        return 0
    info = _factor_sites(s, KI, t)
    if info != 0:
        return info
    for r in range(k):
        sbr = sqrt(s.site_precision[s.active[r]])
        src = KI + r * nn
        row = s.M + r * nn
        for i in range(nn):
            row[i] = sbr * src[i]
    trsm(True, False, k, n, 1.0, s.L, s.d_max, s.M, n)
    for i in range(nn):
        s.post_var[i] = s.diag_k[i]
    for r in range(k):
        row = s.M + r * nn
        for i in range(nn):
            s.post_var[i] -= row[i] * row[i]
    gemv_t(k, n, 1.0, s.M, n, t, 0.0, s.post_mean)
    if S != NULL:
        for r in range(k):
            for q in range(k):
                G[r * k + q] = s.M[r * nn + s.active[q]]
        memcpy(S, KI, <size_t>k * <size_t>n * sizeof(double))
        gemm(True, False, k, n, k, -1.0, G, k, s.M, n, 1.0, S, n)
    for i in range(nn):
        if s.post_var[i] < -_NEGATIVE_VARIANCE_RTOL * s.diag_k[i]:
            return -1
    return 0


cdef int _refactor_active(IVMArrays* s, const double* KI, double* SII, double* mu_I,
                          double* work) noexcept nogil:
    """Σ[I, I] and μ_I from the sites, O(k³) (also rewrites L for the current sites).

    ``V = L⁻¹ B_I^½ K_I``, ``Σ_II = K_I - VᵀV``, ``μ_I = Vᵀ L⁻¹ B_I^½ m_I``.
    ``work``: k² + k doubles.  Returns 0 or the LAPACK info.
    """
    cdef int k = s.k, r, q, info
    cdef Py_ssize_t nn = s.n
    cdef double sbr
    cdef double* V = work
    cdef double* t = work + <Py_ssize_t>k * k
    info = _factor_sites(s, KI, t)
    if info != 0:
        return info
    for r in range(k):
        sbr = sqrt(s.site_precision[s.active[r]])
        for q in range(k):
            V[r * k + q] = sbr * KI[r * nn + s.active[q]]
            SII[r * k + q] = KI[r * nn + s.active[q]]
    trsm(True, False, k, k, 1.0, s.L, s.d_max, V, k)
    gemm(True, False, k, k, k, -1.0, V, k, V, k, 1.0, SII, k)
    gemv_t(k, k, 1.0, V, k, t, 0.0, mu_I)
    return 0


cdef double _log_z_of_factor(const IVMArrays* s, const double* t) noexcept nogil:
    """eq 32 of the active set, ``log N(m_I; 0, K_I + B_I⁻¹)``, from L = chol(I + B_I^½ K_I B_I^½)
    (``s.L``) and ``t = L⁻¹ B_I^½ m_I``: ``K_I + B_I⁻¹ = B_I^{-½} L Lᵀ B_I^{-½}`` gives
    ``-½ tᵀt - Σ log L_rr + ½ Σ log β_r - (k/2) log 2π``."""
    cdef int k = s.k, r
    cdef double quad = 0.0, log_det = 0.0, log_beta = 0.0
    for r in range(k):
        quad += t[r] * t[r]
        log_det += log(s.L[<Py_ssize_t>r * s.d_max + r])
        log_beta += log(s.site_precision[s.active[r]])
    return -0.5 * quad - log_det + 0.5 * log_beta - 0.5 * k * log(2.0 * M_PI)


cdef double active_log_z(const IVMArrays* s, double* t) noexcept nogil:
    """eq 32 of the active set at its sites, from the current factor ``s.L`` (one triangular
    solve, O(k²)); ``t``: k doubles of scratch. 0 for an empty active set."""
    cdef int r
    if s.k == 0:
        return 0.0
    for r in range(s.k):
        t[r] = sqrt(s.site_precision[s.active[r]]) * s.site_mean[s.active[r]]
    _trsv(True, False, s.k, s.L, s.d_max, t)
    return _log_z_of_factor(s, t)


def active_set_evidence(L, site_mean, site_precision):
    """Eq 32 and the prediction weights from the factor of the active set's ``A`` (the
    problems' form of ``active_log_z``, with scipy).

    Given the lower Cholesky factor ``L`` of ``A = I + B^½ K_I B^½`` (``B = diag(β)``, the
    active sites' precisions) and the site means ``m``, returns ``(value, w)``: ``value =
    log N(m; 0, K_I + B⁻¹)`` (eq 32 of Lawrence, Seeger & Herbrich) as ``_log_z_of_factor``
    and ``w = (K_I + B⁻¹)⁻¹ m = B^½ L⁻ᵀ t`` (Seeger's notes §2.2), ``t = L⁻¹ B^½ m``.
    """
    from scipy.linalg import solve_triangular
    from scipy.linalg.blas import ddot

    beta = np.ascontiguousarray(site_precision, dtype=np.float64)
    sb = np.sqrt(beta)
    t = solve_triangular(L, sb * site_mean, lower=True)
    value = (-0.5 * float(ddot(t, t)) - float(np.sum(np.log(np.diag(L))))
             + 0.5 * float(np.sum(np.log(beta))) - 0.5 * beta.shape[0] * np.log(2.0 * np.pi))
    return value, sb * solve_triangular(L, t, lower=True, trans="T")


cdef inline bint _new_site(const SiteModel* model, double y, double cav_mean, double cav_var,
                           double sigma2, double* beta, double* mean, double* g, double* nu) noexcept nogil:
    """ADF/EP site from the cavity N(cav_mean, cav_var) (site kernel at cav_var + sigma2).

    ``β = ν/(1 - ν λ)``, ``m = h + g/ν`` (Seeger eq 5 = IVM eqs 22-23); the spherical
    Gaussian model keeps ``β = 1/(σ² + sigma2)``, ``m = y``.  False when the cavity is
    improper, the site kernel fails or the new site would not be proper (ν <= 0, ν λ >= 1).
    """
    cdef double log_z = 0.0
    if not (cav_var > 0.0 and isfinite(cav_var)):
        return False
    if site_moments(model, y, cav_mean, cav_var + sigma2, &log_z, g, nu) != SITE_OK:
        return False
    if not (nu[0] > 0.0 and nu[0] * cav_var < 1.0):
        return False
    if model.code == LIK_GAUSSIAN:
        beta[0] = 1.0 / (model.params[0] + sigma2)
        mean[0] = y
    else:
        beta[0] = nu[0] / (1.0 - nu[0] * cav_var)
        mean[0] = cav_mean + g[0] / nu[0]
    return isfinite(beta[0]) and isfinite(mean[0]) and beta[0] > 0.0


cdef int _ep_site(const SiteModel* model, const double* y, IVMArrays* s, double sigma2,
                  double* SII, double* mu_I, int r, double tol, double* w, double* change) noexcept nogil:
    """One EP deletion-inclusion step for the active point in slot r (Seeger §2.1, steps 1-3).

    1. cavity from the marginal: ``λ = (ς_p⁻¹ - β_p)⁻¹``, ``h\\p = μ_p + λ β_p (μ_p - m_p)``;
    2. moment match with the site kernel: new ``β_p``, ``m_p`` (eq 5);
    3. eq (7), ``A_new = A - (Δ + a_pp)⁻¹ a_p a_pᵀ`` with ``Δ⁻¹ = Δβ``, written as
       ``A -= Δβ/(1 + Δβ a_pp) a_p a_pᵀ`` (no division by Δβ), and the h update
       ``h += (Δb - Δβ h_p)/(1 + Δβ a_pp) a_p`` (``a_pᵀ b_old = h_p``), on Σ[I, I] and μ_I.
       ``1 + Δβ a_pp = (1 + λ β_new)/(1 + λ β_old)`` is formed without cancellation.

    The site is skipped (EP_SKIPPED, nothing changes) when ``|Δβ|/β_old <= tol`` and
    ``|Δm| β_old^½ <= tol`` (the notes' advice for v_new⁻¹ ≈ v_old⁻¹; such a site has
    converged).  ``change`` receives ``max(|Δβ|/β_old, |Δm| β_old^½)``.  ``w``: k doubles.
    """
    cdef int k = s.k, p = s.active[r], q
    cdef double var = SII[<Py_ssize_t>r * k + r], mu = mu_I[r]
    cdef double b_old = s.site_precision[p], m_old = s.site_mean[p]
    cdef double lam, h, b_new = 0.0, m_new = 0.0, g = 0.0, nu = 0.0, ch, denom, c, cm
    change[0] = 0.0
    if not (var > 0.0 and b_old > 0.0 and b_old * var < 1.0):
        return EP_REJECTED
    lam = var / (1.0 - b_old * var)
    h = mu + lam * b_old * (mu - m_old)
    if not _new_site(model, y[p], h, lam, sigma2, &b_new, &m_new, &g, &nu):
        return EP_REJECTED
    ch = fabs(b_new - b_old) / b_old
    c = fabs(m_new - m_old) * sqrt(b_old)
    if c > ch:
        ch = c
    change[0] = ch
    if ch <= tol:
        return EP_SKIPPED
    denom = (1.0 + lam * b_new) / (1.0 + lam * b_old)
    c = (b_new - b_old) / denom
    cm = (b_new * (m_new - mu) - b_old * (m_old - mu)) / denom
    memcpy(w, SII + <Py_ssize_t>r * k, k * sizeof(double))
    ger(k, k, -c, w, w, SII, k)
    for q in range(k):
        mu_I[q] += cm * w[q]
    s.site_precision[p] = b_new
    s.site_mean[p] = m_new
    s.g[p] = g
    s.nu[p] = nu
    return EP_APPLIED


cdef int _exchange_row(const SiteModel* model, const double* y, IVMArrays* s, double sigma2,
                       const double* S, int r, double* best_gain, int* best_i) noexcept nogil:
    """Best exchange partner i ∉ I for the active point j in slot r; returns the number of eligible i.

    The cavity of i with j's site removed (eqs 8-9):
    ``λ_i\\j = a_ii + β_j a_ij² / (1 - β_j a_jj)``, ``h_i\\j = h_i + a_ij β_j (h_j - m_j)/(1 - β_j a_jj)``.
    The entropy criterion: the exchange changes the posterior entropy by
    ``½ log(1 - ν_i λ_i\\j) - ½ log(1 - β_j a_jj)`` (deleting j multiplies |A| by
    ``1/(1 - β_j a_jj)``, the ADF inclusion of i by ``1 - ν_i λ_i\\j``, eq 4), so the gain
    (entropy reduction) is ``-½ log(1 - ν_i λ_i\\j) + ½ log(1 - β_j a_jj)``.
    ν_i (and g_i, unused) come from ``_point_moments`` at the cavity ``N(h_i\\j, λ_i\\j + sigma2)``:
    no log Z; probit and Gaussian sites inline, bitwise the site kernel's α and β (as in
    the fused scoring pass), other likelihoods and out-of-range points through
    ``site_moments``.  ``best_i`` = -1 when no i is eligible; ties go to the lowest i.
    """
    cdef int n = s.n, i, j = s.active[r], count = 0
    cdef double bj = s.site_precision[j], vj = s.post_var[j], den, base, cv, chh, a, lam, h
    cdef double g = 0.0, nu = 0.0, gain, best = -INFINITY
    cdef const double* row = S + <Py_ssize_t>r * n
    cdef _Lik lik
    _prepare(model, &lik)
    best_i[0] = -1
    best_gain[0] = -INFINITY
    den = 1.0 - bj * vj
    if not (den > 0.0):
        return 0
    base = -0.5 * _log1m(bj * vj)
    cv = bj / den
    chh = bj * (s.post_mean[j] - s.site_mean[j]) / den
    for i in range(n):
        if s.is_active[i]:
            continue
        a = row[i]
        lam = s.post_var[i] + cv * a * a                                   # eq 8
        h = s.post_mean[i] + chh * a                                       # eq 9
        if not (lam > 0.0):
            continue
        if not _point_moments(model, &lik, y[i], lam, h, sigma2, &g, &nu):
            continue
        if not (nu > 0.0 and nu * lam < 1.0):
            continue
        count += 1
        gain = -0.5 * _log1m(nu * lam) - base
        if gain > best:
            best = gain
            best_i[0] = i
    best_gain[0] = best
    return count


cdef int _exchange_apply(const SiteModel* model, const double* y, IVMArrays* s, double sigma2,
                         double* S, double* KI, int* ki_idx, int r, int i,
                         const double* col, double* work, double* gain) noexcept nogil:
    """Exchange the active point j in slot r for the inactive point i (Seeger §2.3).

    ``col`` = K[:, i].  The new site of i is the ADF site at the cavity of eqs (8)-(9);
    j's site is reset to zero.  With ``Δβ = diag(β_i, -β_j)``, ``U = (a_i a_j)`` (columns
    of A at i and j; ``a_i = K[:, i] - S ᵀ B_I K[I, i]``, since ``Σ[:, I] B_I = K[:, I] W``
    with ``W = (K_I + B_I⁻¹)⁻¹``), ``A_ij`` the 2x2 block and ``Δb = (β_i m_i, -β_j m_j)``:

        A_new = A - U G Uᵀ,   G = (I₂ + Δβ A_ij)⁻¹ Δβ   (= (Δβ⁻¹ + A_ij)⁻¹, the 2x2 Woodbury)
        h_new = h + U ν,      ν = Δb - G (h_{ij} + A_ij Δb)

    This is the notes' update with Δ^{-½}(I + Δ^{-½} A_ij Δ^{-½})⁻¹ Δ^{-½} rewritten as G,
    which stays real although Δ_j⁻¹ = -β_j < 0.  S (= A[I, :]), ς and μ get the rank-2
    update; then slot r is removed (later slots move up one) and i takes the last slot, so
    ``active`` stays in order of entry.  ``work``: 3n + 3k doubles.  Returns 0, or 1 when
    i's new site is not proper or the 2x2 system is singular (nothing changed).
    """
    cdef int k = s.k, n = s.n, j = s.active[r], q
    cdef Py_ssize_t l, nn = n
    cdef double bj = s.site_precision[j], mj = s.site_mean[j], vj = s.post_var[j]
    cdef double den = 1.0 - bj * vj, aij, lam, h, bi = 0.0, mi = 0.0, g = 0.0, nu = 0.0
    cdef double w00, w01, w11, d0, d1, det, G00, G01, G11, db0, db1, rhs0, rhs1, nu0, nu1, p0, p1
    cdef double u0, u1
    cdef double* U0 = work
    cdef double* U1 = work + nn
    cdef double* rowi = work + 2 * nn
    cdef double* x = work + 3 * nn
    cdef double* P = work + 3 * nn + k
    if not (den > 0.0):
        return 1
    aij = S[<Py_ssize_t>r * nn + i]
    lam = s.post_var[i] + bj * aij * aij / den                              # eq 8
    h = s.post_mean[i] + aij * bj * (s.post_mean[j] - mj) / den             # eq 9
    if not _new_site(model, y[i], h, lam, sigma2, &bi, &mi, &g, &nu):
        return 1
    w00 = s.post_var[i]
    w01 = aij
    w11 = vj
    d0 = bi
    d1 = -bj
    det = (1.0 + d0 * w00) * (1.0 + d1 * w11) - d0 * d1 * w01 * w01
    if not (det > 0.0 and isfinite(det)):
        return 1
    gain[0] = -0.5 * _log1m(nu * lam) + 0.5 * _log1m(bj * vj)
    G00 = (1.0 + d1 * w11) * d0 / det
    G01 = -d0 * d1 * w01 / det
    G11 = (1.0 + d0 * w00) * d1 / det
    db0 = bi * mi
    db1 = -bj * mj
    rhs0 = s.post_mean[i] + w00 * db0 + w01 * db1
    rhs1 = s.post_mean[j] + w01 * db0 + w11 * db1
    nu0 = db0 - (G00 * rhs0 + G01 * rhs1)
    nu1 = db1 - (G01 * rhs0 + G11 * rhs1)
    # a_i = K[:, i] - Sᵀ B_I K[I, i] (the current column of A at i), a_j = S[r, :]
    for q in range(k):
        x[q] = s.site_precision[s.active[q]] * col[s.active[q]]
    memcpy(U0, col, nn * sizeof(double))
    gemv_t(k, n, -1.0, S, n, x, 1.0, U0)
    memcpy(U1, S + <Py_ssize_t>r * nn, nn * sizeof(double))
    # the new row of S for i: A_new[i, :] = a_iᵀ - (w00, w01) G U
    p0 = w00 * G00 + w01 * G01
    p1 = w00 * G01 + w01 * G11
    for l in range(nn):
        rowi[l] = (1.0 - p0) * U0[l] - p1 * U1[l]
    # S -= (S[:, (i, j)] G) U  (rank 2), ς and μ
    for q in range(k):
        u0 = S[<Py_ssize_t>q * nn + i]
        u1 = S[<Py_ssize_t>q * nn + j]
        P[2 * q] = u0 * G00 + u1 * G01
        P[2 * q + 1] = u0 * G01 + u1 * G11
    gemm(False, False, k, n, 2, -1.0, P, 2, U0, n, 1.0, S, n)
    for l in range(nn):
        u0 = U0[l]
        u1 = U1[l]
        s.post_var[l] -= G00 * u0 * u0 + 2.0 * G01 * u0 * u1 + G11 * u1 * u1
        s.post_mean[l] += nu0 * u0 + nu1 * u1
    # slot bookkeeping: drop slot r, append i
    if r < k - 1:
        memmove(S + <Py_ssize_t>r * nn, S + <Py_ssize_t>(r + 1) * nn,
                <size_t>(k - 1 - r) * <size_t>n * sizeof(double))
        memmove(KI + <Py_ssize_t>r * nn, KI + <Py_ssize_t>(r + 1) * nn,
                <size_t>(k - 1 - r) * <size_t>n * sizeof(double))
        memmove(s.active + r, s.active + r + 1, (k - 1 - r) * sizeof(int))
        memmove(ki_idx + r, ki_idx + r + 1, (k - 1 - r) * sizeof(int))
        memmove(s.chosen + r, s.chosen + r + 1, (k - 1 - r) * sizeof(double))
    memcpy(S + <Py_ssize_t>(k - 1) * nn, rowi, nn * sizeof(double))
    memcpy(KI + <Py_ssize_t>(k - 1) * nn, col, nn * sizeof(double))
    s.active[k - 1] = i
    ki_idx[k - 1] = i
    s.chosen[k - 1] = -0.5 * _log1m(nu * lam)
    s.is_active[j] = 0
    s.is_active[i] = 1
    s.site_precision[j] = 0.0
    s.site_mean[j] = 0.0
    s.site_precision[i] = bi
    s.site_mean[i] = mi
    s.g[i] = g
    s.nu[i] = nu
    return 0


cdef void _exchange_search(const SiteModel* model, const double* y, IVMArrays* s, double sigma2,
                           const double* S, bint greedy, double tol, int* perm, unsigned long long* rng,
                           double* best, int* best_r, int* best_i) noexcept nogil:
    """One search for an exchange move; ``best_r`` = ``best_i`` = -1 when there is none.

    Greedy: the best pair over all slots (ties: lowest slot, then lowest i).  Random: the
    slots in a seeded random order (``perm``: k ints), the first slot whose best partner
    gains more than ``tol``; ``best`` then holds the gain of the last slot visited.
    """
    cdef int k = s.k, r, t, bi = -1
    cdef double bg = 0.0
    best[0] = -INFINITY
    best_r[0] = -1
    best_i[0] = -1
    if greedy:
        for r in range(k):
            _exchange_row(model, y, s, sigma2, S, r, &bg, &bi)
            if bi >= 0 and bg > best[0]:
                best[0] = bg
                best_r[0] = r
                best_i[0] = bi
    else:
        random_permutation(k, perm, rng)
        for t in range(k):
            _exchange_row(model, y, s, sigma2, S, perm[t], &bg, &bi)
            best[0] = bg
            if bi >= 0 and bg > tol:
                best_r[0] = perm[t]
                best_i[0] = bi
                break


# --------------------------------------------------------------------------- #
# The options of the engine and what it reports
# --------------------------------------------------------------------------- #

#: The selection criteria by name: their ``IVMCriterion`` codes (ivm.pxd; written out, since
#: cimporting a cpdef enum from ivm would import ivm, which imports this module, at import).
CRITERIA = {"entropy": 0, "info_gain": 1, "random": 2}


cdef class IVMOptions:
    """The options of an IVM engine (:class:`~fastep._epcore.ivm.IVMEP`), validated once.

    Read-only; given to ``IVMEP`` at construction. ``IVMEP.run`` includes ``d`` points
    by Algorithm 1 of Lawrence, Seeger & Herbrich, *Fast sparse Gaussian process methods: the
    informative vector machine* (eqs 14-30), then refines the active set as asked (Seeger's
    notes §2.1, §2.3): EP sweeps, exchange moves, and after a move the EP sweeps again.

    Parameters
    ----------
    d : int >= 1
        Size of the active set (d_max): the capacity of the state and the number of points
        ``run`` includes in all.
    criterion : {'entropy', 'info_gain', 'random'} or int, default 'entropy'
        Selection score (``CRITERION_*`` of :mod:`fastep._epcore.ivm`): the entropy
        reduction (eq 26), the information gain ``KL(q_new ‖ q_old)``, or a seeded uniform
        draw among the eligible points. Stored as its integer code.
    seed : int in [0, 2**64), default 0
        Seed of the random criterion and of the random exchange search.
    refine_sweeps : int >= 0, default 0
        Maximum number of EP deletion-inclusion sweeps over the active set (0: none).
    refine_tol : float >= 0, default 1e-9
        A site whose parameters would change by at most this, ``max(|Δβ|/β, |Δm| β^½)``, is
        skipped; the sweeps have converged when a sweep skips every site and rejects none.
    exchange : {None, 'greedy', 'random'}, default None
        Exchange moves (Seeger §2.3, ``IVMEP.exchange``'s ``mode``), or None for none.
    exchange_tol : float >= 0, default 1e-6
        Minimum gain (nats of the entropy criterion) of an applied move.
    max_exchanges : int >= 0 or None, default None
        Maximum number of moves; None means d.

    A value out of range raises ValueError naming the option.
    """

    def __init__(self, d, criterion="entropy", seed=0, refine_sweeps=0, refine_tol=1e-9,
                 exchange=None, exchange_tol=1e-6, max_exchanges=None):
        d = _check_int(d, "d (the active set size, d_max)", 1)
        code = CRITERIA.get(criterion, -1) if isinstance(criterion, str) else criterion
        if isinstance(code, (bool, np.bool_)) or not isinstance(code, (int, np.integer)) \
                or code not in CRITERIA.values():
            raise ValueError(f"criterion must be one of {sorted(CRITERIA)} or its code "
                             f"(CRITERION_ENTROPY, CRITERION_INFO_GAIN, CRITERION_RANDOM); got {criterion!r}")
        seed = _check_count(seed, "seed", 0)
        if seed >= 2 ** 64:
            raise ValueError(f"seed must be below 2**64; got {seed!r}")
        if exchange is not None and (not isinstance(exchange, str) or exchange not in ("greedy", "random")):
            raise ValueError(f"exchange must be None, 'greedy' or 'random'; got {exchange!r}")
        self.d = d
        self.criterion = int(code)
        self.seed = seed
        self.refine_sweeps = _check_int(refine_sweeps, "refine_sweeps", 0)
        self.refine_tol = _check_tol(refine_tol, "refine_tol")
        self.exchange = exchange
        self.exchange_tol = _check_tol(exchange_tol, "exchange_tol")
        self.max_exchanges = None if max_exchanges is None else _check_int(max_exchanges, "max_exchanges", 0)

    _FIELDS = ("d", "criterion", "seed", "refine_sweeps", "refine_tol", "exchange", "exchange_tol",
               "max_exchanges")

    def as_dict(self):
        """The options as a plain dict."""
        return {name: getattr(self, name) for name in self._FIELDS}

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self.as_dict() == other.as_dict()

    def __reduce__(self):
        return (IVMOptions, tuple(getattr(self, name) for name in self._FIELDS))

    def __repr__(self):
        return _fields_repr(self)


def _fields_repr(result):
    fields = ", ".join(f"{name}={getattr(result, name)!r}" for name in result._FIELDS)
    return f"{type(result).__name__}({fields})"


cdef class RefineResult(SweepResult):
    """What the EP deletion-inclusion sweeps over the active set report (``IVMEP.refine``,
    the 'ep' and 'ep_after_exchange' stages of ``IVMEP.run``; Seeger's notes §2.1): the
    :class:`~fastep._epcore._common.SweepResult` fields the sweeps keep and their own counts.
    Read-only; equality (NaN equals NaN), ``as_dict``, pickling and ``repr`` cover ``_FIELDS``.

    Parameters
    ----------
    n_sweeps, converged, max_change, n_updates, n_skipped, n_rejected, log_z, stopped
        The attributes of the same names (``n_failed`` is ``n_rejected``).

    Attributes
    ----------
    n_sweeps : int
        Sweeps run.
    converged : bool
        The last sweep skipped every site and rejected none (True for an empty active set).
    max_change : float
        Largest site change ``max(|Δβ|/β, |Δm| β^½)`` in the last sweep (0 if none ran).
    log_z : float
        eq 32 (Lawrence, Seeger & Herbrich), ``log N(m_I; 0, K_I + B_I⁻¹)``, at the returned
        sites; NaN if no sweep ran.
    n_skipped : int
        Site updates skipped (a change of at most ``tol``), summed over the sweeps; unlike
        the rank-1 engines' count, without the rejected ones.
    n_failed, n_rejected : int
        Site updates rejected (improper cavity, site kernel or new site: the site is left
        unchanged), summed over the sweeps.
    stopped : bool
        The progress callback returned False.
    n_updates : int
        Site updates applied, summed over the sweeps.

    ``log_z_change`` and ``n_clipped`` are not tracked (``inf`` and 0).
    """

    _FIELDS = ("n_sweeps", "converged", "max_change", "log_z", "n_skipped", "n_failed", "stopped",
               "n_updates", "n_rejected")
    _ARGS = ("n_sweeps", "converged", "max_change", "n_updates", "n_skipped", "n_rejected", "log_z",
             "stopped")

    def __init__(self, int n_sweeps=0, bint converged=False, double max_change=0.0, long n_updates=0,
                 long n_skipped=0, long n_rejected=0, double log_z=NAN, bint stopped=False):
        SweepResult.__init__(self, n_sweeps, converged, max_change, log_z, stopped=stopped,
                             counts={"n_skipped": n_skipped, "n_failed": n_rejected})
        self.n_updates = n_updates
        self.n_rejected = n_rejected

    def replace(self, **changes):
        """A copy with the given fields changed (those of the constructor)."""
        return RefineResult(**replaced_fields(self, changes, self._ARGS))

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return same_fields(self, other)

    def __reduce__(self):
        return (RefineResult, tuple(getattr(self, name) for name in self._ARGS))

    def __repr__(self):
        return _fields_repr(self)


cdef class ExchangeResult:
    """What the exchange moves on the active set report (``IVMEP.exchange``, the 'exchange'
    stage of ``IVMEP.run``; Seeger's notes §2.3). Read-only; equality, pickling and
    ``repr`` cover ``_FIELDS``, ``as_dict`` adds ``n_moves``.

    Attributes
    ----------
    moves : tuple of (int, int, float)
        ``(j_out, i_in, gain)`` of every move, in order (the gain in nats).
    converged : bool
        The last search found no move gaining more than ``tol``.
    best_gain : float
        The best remaining gain found by the last search (-inf if no pair is eligible; in
        random mode that of the last slot visited).
    n_moves : int
        ``len(moves)``.
    """

    _FIELDS = ("moves", "converged", "best_gain")

    def __init__(self, moves=(), bint converged=False, double best_gain=-INFINITY):
        self.moves = tuple((int(j), int(i), float(gain)) for j, i, gain in moves)
        self.converged = converged
        self.best_gain = best_gain

    @property
    def n_moves(self):
        return len(self.moves)

    def as_dict(self):
        """The fields and ``n_moves`` as a plain dict (for logging and JSON)."""
        return dict(moves=self.moves, converged=self.converged, best_gain=self.best_gain, n_moves=self.n_moves)

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return same_fields(self, other)

    def __reduce__(self):
        return (ExchangeResult, (self.moves, self.converged, self.best_gain))

    def __repr__(self):
        return _fields_repr(self)


#: The refinement stages of a run, in the order they run.
_STAGES = ("ep", "exchange", "ep_after_exchange")


cdef class IVMResult(SweepResult):
    """What one ``IVMEP.run`` reports (Algorithm 1 of Lawrence, Seeger & Herbrich, then the
    refinement stages of Seeger's notes §2.1, §2.3): the :class:`~fastep._epcore._common.SweepResult`
    fields for the run as a whole, the size of the active set and every stage's report.
    Read-only; equality (NaN equals NaN), pickling and ``repr`` cover ``_FIELDS``.

    Parameters
    ----------
    n_active, log_z
        The attributes.
    refinement : dict or None
        The stage reports by name, as :attr:`refinement` gives them (the common fields
        follow from them).

    Attributes
    ----------
    n_sweeps : int
        EP sweeps run over the active set, both EP stages together (0 without refinement).
    converged : bool
        Every stage that ran converged (True when none ran: selection alone has no test).
    max_change : float
        Largest site change in the last sweep of the last EP stage (0 if none ran).
    log_z : float
        eq 32, ``log N(m_I; 0, K_I + B_I⁻¹)``, at the returned sites.
    n_skipped, n_failed : int
        Site updates skipped and rejected, summed over the EP stages.
    stopped : bool
        The progress callback stopped an EP stage (the stages after it did not run).
    n_active : int
        Size of the active set at the end of the run.
    ep, exchange, ep_after_exchange : RefineResult, ExchangeResult, RefineResult or None
        The EP sweeps after the selection, the exchange moves, the EP sweeps after a move
        (None where the stage did not run).
    """

    _FIELDS = ("n_sweeps", "converged", "max_change", "log_z", "n_skipped", "n_failed", "stopped",
               "n_active", "ep", "exchange", "ep_after_exchange")

    def __init__(self, int n_active=0, double log_z=NAN, refinement=None):
        stages = {} if refinement is None else dict(refinement)
        unknown = set(stages) - set(_STAGES)
        if unknown:
            raise ValueError(f"unknown refinement stage(s): {sorted(unknown)}")
        cdef int n_sweeps = 0
        cdef long n_skipped = 0, n_failed = 0
        cdef double max_change = 0.0
        cdef bint stopped = False
        cdef RefineResult ep
        for name in ("ep", "ep_after_exchange"):
            ep = stages.get(name)
            if ep is not None:
                n_sweeps += ep.n_sweeps
                n_skipped += ep.n_skipped
                n_failed += ep.n_failed
                max_change = ep.max_change
                stopped = stopped or ep.stopped
        converged = True
        for report in stages.values():
            converged = converged and report.converged
        SweepResult.__init__(self, n_sweeps, converged, max_change, log_z, stopped=stopped,
                             counts={"n_skipped": n_skipped, "n_failed": n_failed})
        self.n_active = n_active
        self.ep = stages.get("ep")
        self.exchange = stages.get("exchange")
        self.ep_after_exchange = stages.get("ep_after_exchange")

    @property
    def refinement(self):
        """The stage reports by name as run (``'ep'``, ``'exchange'``, ``'ep_after_exchange'``;
        the estimators' ``refinement_``), or None when no refinement ran."""
        stages = {name: getattr(self, name) for name in _STAGES if getattr(self, name) is not None}
        return stages or None

    def replace(self, **changes):
        """A copy with the given constructor arguments (``n_active``, ``log_z``,
        ``refinement``) changed."""
        unknown = set(changes) - {"n_active", "log_z", "refinement"}
        if unknown:
            raise TypeError(f"unknown IVMResult argument(s): {sorted(unknown)}")
        args = dict(n_active=self.n_active, log_z=self.log_z, refinement=self.refinement)
        args.update(changes)
        return IVMResult(**args)

    def as_dict(self):
        """The fields as a plain dict, stage reports as theirs (for logging and JSON)."""
        out = {name: getattr(self, name) for name in self._FIELDS}
        for name in _STAGES:
            if out[name] is not None:
                out[name] = out[name].as_dict()
        return out

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return same_fields(self, other)

    def __reduce__(self):
        return (IVMResult, (self.n_active, self.log_z, self.refinement))

    def __repr__(self):
        return _fields_repr(self)


# --------------------------------------------------------------------------- #
# Python-level drivers (called by the methods of IVMEP)
# --------------------------------------------------------------------------- #

cdef class KernelRows:
    """K[I, :] in slot order (a d_max x n buffer), cached per ``column_fn`` object.

    A row is fetched again only when its slot holds another point than when it was fetched;
    exchange moves keep the rows in step with the slots (``_exchange_apply``).  The buffer
    is allocated at the first refinement call, so selection alone keeps only M.
    """

    cdef double* fetch(self, const IVMArrays* s, column_fn) except NULL:
        """K[I, :] for the current active set of ``s`` (fetching the rows that are missing)."""
        cdef int r, p
        cdef double[:, ::1] rows
        cdef int[::1] index
        if self.rows is None or self.column_fn is not column_fn:
            self.rows = np.empty((s.d_max, s.n))
            self.index = np.full(s.d_max, -1, dtype=np.intc)
            self.column_fn = column_fn
        rows = self.rows
        index = self.index
        for r in range(s.k):
            p = s.active[r]
            if index[r] != p:
                self.rows[r] = fetch_column(column_fn, p, s.n, True)
                index[r] = p
        self.index_ptr = &index[0]
        return &rows[0, 0]


cdef object fetch_column(column_fn, int point, int n, bint check_finite):
    """``column_fn(point)`` as a contiguous float64 vector of length n (ValueError otherwise;
    with ``check_finite`` also when it is not finite)."""
    col = np.ascontiguousarray(column_fn(point), dtype=np.float64)
    if col.ndim != 1 or col.shape[0] != n:
        raise ValueError(f"column_fn({point}) must return a vector of length n = {n}; "
                         f"got shape {col.shape}")
    if check_finite and not np.all(np.isfinite(col)):
        raise ValueError(f"column_fn({point}) returned a column that is not finite")
    return col


cdef int check_column_fn(column_fn) except -1:
    """TypeError unless ``column_fn`` is callable."""
    if not callable(column_fn):
        raise TypeError("column_fn must be callable: column_fn(point) -> K[:, point]")
    return 0


def _check_count(value, name, int minimum):
    """An integer >= minimum (not bool), else ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def _check_int(value, name, int minimum):
    """``_check_count`` held to a C int (a larger count is the same as no limit here)."""
    return min(_check_count(value, name, minimum), 2 ** 31 - 1)


def _check_tol(value, name):
    """A finite real >= 0, else ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not (value >= 0 and np.isfinite(value)):
        raise ValueError(f"{name} must be a finite number >= 0; got {value!r}")
    return float(value)


cdef RefineSettings check_refine_settings(n_sweeps, tol, refactor_every) except *:
    """The arguments of ``IVMEP.refine``, checked."""
    cdef RefineSettings out
    out.n_sweeps = _check_int(n_sweeps, "n_sweeps", 0)
    out.tol = _check_tol(tol, "tol")
    out.refactor_every = _check_int(refactor_every, "refactor_every", 1)
    return out


cdef ExchangeSettings check_exchange_settings(int k, mode, tol, max_moves, seed, refactor_every) except *:
    """The arguments of ``IVMEP.exchange`` on an active set of k points, checked (None:
    k moves, a rebuild after k moves)."""
    cdef ExchangeSettings out
    if not isinstance(mode, str) or mode not in ("greedy", "random"):
        raise ValueError(f"mode must be 'greedy' or 'random'; got {mode!r}")
    out.greedy = mode == "greedy"
    out.tol = _check_tol(tol, "tol")
    out.max_moves = k if max_moves is None else _check_int(max_moves, "max_moves", 0)
    out.refactor_every = k if refactor_every is None else _check_int(refactor_every, "refactor_every", 1)
    out.seed = _check_count(seed, "seed", 0)
    return out


cdef int _check_factor(const IVMArrays* s, int status) except -1:
    """LinAlgError for a failed refactorisation (``status`` of ``_refactor``, ``_refactor_active``)."""
    if status == 0:
        return 0
    if status > 0:
        raise np.linalg.LinAlgError(
            f"refactorising the active set failed: I + B^1/2 K_I B^1/2 is not positive definite "
            f"(LAPACK dpotrf info {status}); is the kernel positive semi-definite?")
    var = np.asarray(<double[:s.n]> s.post_var)
    bad = int(np.argmin(var / np.asarray(<double[:s.n]> <double*> s.diag_k)))
    raise np.linalg.LinAlgError(
        f"posterior variance ς[{bad}] = {var[bad]!r} < 0 after refactorising: the kernel "
        "matrix is not positive semi-definite (add a White term or jitter)")


cdef int _rebuild(IVMArrays* s, const double* KI, double* S, double* work) except -1:
    """``_refactor`` with the GIL released; LinAlgError if it fails."""
    cdef int status
    with nogil:
        status = _refactor(s, KI, S, work)
    return _check_factor(s, status)


cdef int _refactor_active_checked(IVMArrays* s, const double* KI, double* SII, double* mu_I,
                                  double* work) except -1:
    """``_refactor_active`` with the GIL released; LinAlgError if it fails."""
    cdef int status
    with nogil:
        status = _refactor_active(s, KI, SII, mu_I, work)
    return _check_factor(s, status)


cdef refactorize(IVMArrays* s, KernelRows rows, column_fn):
    """The body of ``IVMEP.refactorize``: L, M, ς and μ from the sites and K[I, :]."""
    check_column_fn(column_fn)
    if s.k == 0:
        return
    cdef const double* ki = rows.fetch(s, column_fn)
    cdef double[::1] work = np.empty(s.k * s.k + s.k)
    _rebuild(s, ki, NULL, &work[0])


cdef RefineResult refine_sweeps(IVMArrays* s, const IVMTargets* t, KernelRows rows, column_fn,
                                const RefineSettings* settings, callback):
    """The body of ``IVMEP.refine`` (validated settings): EP deletion-inclusion sweeps
    (``_ep_site``) on Σ[I, I] and μ_I, rebuilt every ``refactor_every`` sweeps, then the full
    rebuild; through a ``SweepDriver`` (``callback(sweep, max_change, log_z)`` with eq 32 at
    the sites after each sweep, Ctrl-C polled about every 1e6 / k² sites). On Ctrl-C, an error
    of the callback or a failed refactorisation, the sites, g, ν and L are put back as they
    were (M, ς and μ are rewritten only by the final rebuild) and the exception is raised."""
    cdef int k = s.k, r, st, sweep, n_applied = 0, n_sweeps = settings.n_sweeps
    cdef int refactor_every = settings.refactor_every, info
    cdef long n_up = 0
    cdef double ch = 0.0, tol = settings.tol, log_z
    cdef bint refactored
    if k == 0 or n_sweeps == 0:
        return RefineResult(converged=k == 0)
    cdef const double* ki = rows.fetch(s, column_fn)
    cdef double[:, ::1] SII = np.empty((k, k))
    cdef double[::1] mu_I = np.empty(k)
    cdef double[::1] work = np.empty(k * k + k)
    cdef double[::1] t_buf = np.empty(k)
    cdef double* sii = &SII[0, 0]
    cdef double* mui = &mu_I[0]
    cdef double* w = &work[0]
    cdef SweepDriver driver = SweepDriver(tol, n_sweeps, callback, 2.0 * k * k)
    cdef SweepStats* stats = driver.begin_sweep()
    cdef Py_ssize_t l_size = <Py_ssize_t>s.d_max * s.d_max
    driver.keep(<double[:s.n]> s.site_mean, <double[:s.n]> s.site_precision, <double[:s.n]> s.g,
                <double[:s.n]> s.nu, <double[:l_size]> s.L)      # views of the state's arrays
    try:
        _refactor_active_checked(s, ki, sii, mui, w)
        for sweep in range(1, n_sweeps + 1):
            sweep_stats_reset(stats)
            n_applied = 0
            with nogil:
                for r in range(k):
                    if interrupt_requested(stats):
                        break
                    st = _ep_site(t.model, t.y, s, t.sigma2, sii, mui, r, tol, w, &ch)
                    if st == EP_APPLIED:
                        n_applied += 1
                    elif st == EP_SKIPPED:
                        stats.n_skipped += 1
                    else:
                        stats.n_failed += 1
                    if ch > stats.max_change_precision:
                        stats.max_change_precision = ch
            if driver.interrupted():
                break                  # Ctrl-C: the state is restored and the exception raised below
            driver.record_sweep(sweep)
            n_up += n_applied
            driver.test_unchanged(n_applied)
            refactored = n_applied > 0 and sweep % refactor_every == 0 and sweep < n_sweeps
            if refactored:
                _refactor_active_checked(s, ki, sii, mui, w)
            if callback is not None:
                # eq 32 at the sites after the sweep, from the factor just rebuilt or a new one
                # (L is rewritten from the sites before it is read again)
                with nogil:
                    if refactored:
                        log_z = _log_z_of_factor(s, w + <Py_ssize_t>k * k)
                    else:
                        info = _factor_sites(s, ki, &t_buf[0])
                        log_z = _log_z_of_factor(s, &t_buf[0]) if info == 0 else NAN
                driver.log_z = log_z
                if driver.notify(sweep):
                    break
            if n_applied == 0:
                break
        driver.raise_pending()
    except BaseException:
        driver.restore()
        raise
    _rebuild(s, ki, NULL, w)
    with nogil:
        log_z = _log_z_of_factor(s, w)                  # _refactor leaves t = L⁻¹ B_I^½ m_I in w
    return RefineResult(driver.n_sweeps, driver.converged, driver.max_change, n_up, driver.n_skipped,
                        driver.n_failed, log_z, driver.stopped)


cdef tuple exchange_gains(IVMArrays* s, const IVMTargets* t, KernelRows rows, column_fn):
    """The body of ``IVMEP.exchange_gains``: ``_exchange_row`` for every slot after a rebuild."""
    check_column_fn(column_fn)
    cdef int k = s.k, r, bi = -1
    cdef double bg = 0.0
    partner = np.full(k, -1, dtype=np.intp)
    gains = np.full(k, -np.inf)
    if k == 0:
        return partner, gains
    cdef const double* ki = rows.fetch(s, column_fn)
    cdef double[:, ::1] S = np.empty((k, s.n))
    cdef double[::1] work = np.empty(k * k + k)
    _rebuild(s, ki, &S[0, 0], &work[0])
    for r in range(k):
        with nogil:
            _exchange_row(t.model, t.y, s, t.sigma2, &S[0, 0], r, &bg, &bi)
        partner[r] = bi
        gains[r] = bg
    return partner, gains


cdef ExchangeResult exchange_moves(IVMArrays* s, const IVMTargets* t, KernelRows rows, column_fn,
                                   const ExchangeSettings* settings):
    """The body of ``IVMEP.exchange`` (validated settings): searches (``_exchange_search``)
    and moves (``_exchange_apply``) until no move gains more than ``tol`` or ``max_moves``
    were made; Σ[I, :], ς and μ rebuilt every ``refactor_every`` moves and L, M, ς, μ at the
    end."""
    cdef int k = s.k, n = s.n, max_moves = settings.max_moves, refactor_every = settings.refactor_every
    cdef bint greedy = settings.greedy
    cdef int status = 0, best_r = -1, best_i = -1, since = 0
    cdef double best = -INFINITY, tol_c = settings.tol, gain = 0.0
    cdef unsigned long long rng = settings.seed
    moves = []
    if k == 0 or k == n:
        return ExchangeResult(converged=True)
    cdef double* ki = rows.fetch(s, column_fn)
    cdef int* ki_idx = rows.index_ptr
    cdef double[:, ::1] S_arr = np.empty((k, n))
    cdef double[::1] work = np.empty(max(k * k + k, 3 * n + 3 * k))
    cdef int[::1] perm = np.empty(k, dtype=np.intc)
    cdef double* S = &S_arr[0, 0]
    cdef double* w = &work[0]
    cdef const double[::1] col
    converged = False
    _rebuild(s, ki, S, w)
    try:
        while True:
            with nogil:
                _exchange_search(t.model, t.y, s, t.sigma2, S, greedy, tol_c, &perm[0], &rng,
                                 &best, &best_r, &best_i)
            if not (best_i >= 0 and best > tol_c):
                converged = True
                break
            if len(moves) >= max_moves:
                break
            col = fetch_column(column_fn, best_i, n, True)
            j = s.active[best_r]
            with nogil:
                status = _exchange_apply(t.model, t.y, s, t.sigma2, S, ki, ki_idx, best_r, best_i,
                                         &col[0], w, &gain)
            if status != 0:
                raise RuntimeError(f"exchange of active point {j} for {best_i} failed: the new site "
                                   "is not proper (numerical breakdown)")
            moves.append((j, best_i, gain))
            since += 1
            if since >= refactor_every:
                since = 0
                _rebuild(s, ki, S, w)
    finally:
        with nogil:
            status = _refactor(s, ki, NULL, w)
    _check_factor(s, status)
    return ExchangeResult(moves, converged, best)


cdef IVMResult refine_stages(IVMArrays* s, const IVMTargets* t, KernelRows rows, column_fn,
                             IVMOptions options, callback):
    """The refinement stages of ``IVMEP.run`` on the active set after selection, as
    ``options`` asks: EP sweeps ('ep'), exchange moves ('exchange') and, if a move was made,
    the EP sweeps again ('ep_after_exchange', the entering points carry ADF sites). A
    stage stopped by ``callback`` ends the refinement. Returns the :class:`IVMResult` (its
    ``log_z`` that of the active set at the end)."""
    cdef RefineSettings sweeps
    cdef ExchangeSettings moves
    cdef RefineResult ep
    cdef ExchangeResult ex
    cdef double[::1] t_buf
    stages = {}
    sweeps.n_sweeps = options.refine_sweeps
    sweeps.tol = options.refine_tol
    sweeps.refactor_every = 1
    if options.refine_sweeps:
        ep = refine_sweeps(s, t, rows, column_fn, &sweeps, callback)
        stages["ep"] = ep
    if options.exchange is not None and not (options.refine_sweeps and ep.stopped):
        moves.greedy = options.exchange == "greedy"
        moves.tol = options.exchange_tol
        moves.max_moves = s.k if options.max_exchanges is None else options.max_exchanges
        moves.seed = options.seed
        moves.refactor_every = s.k if s.k > 0 else 1      # (an empty set makes no move)
        ex = exchange_moves(s, t, rows, column_fn, &moves)
        stages["exchange"] = ex
        if options.refine_sweeps and ex.n_moves:
            stages["ep_after_exchange"] = refine_sweeps(s, t, rows, column_fn, &sweeps, callback)
    t_buf = np.empty(max(s.k, 1))
    return IVMResult(s.k, active_log_z(s, &t_buf[0]), stages or None)
