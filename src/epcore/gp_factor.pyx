# cython: language_level=3
"""Dense GP EP: the factorisation of B = I + S^½ K S^½ and the EP evidence (see gp_ep.pyx).

Refactorisation (``gp_refactor``): ``s = sqrt(τ)``; ``B = I + diag(s) K diag(s)``; ``L = chol(B)``;
``V = L⁻¹ diag(s) K``; ``diag Σ = diag K - column norms² of V``; ``μ = K ν - Vᵀ (V ν)``; and,
unless only the diagonal is needed, ``Σ = K - VᵀV``. ``gp_refactor_marginals`` forms only
``diag Σ`` and ``μ`` from ``diag(B⁻¹)``. The log marginal likelihood (Minka, *EP: a quick
reference*, eqs 87-88; Rasmussen & Williams eq 3.65) in the textbook form from ``diag Σ``
(``gp_log_z``) and in the stable form from the Cholesky factor of B (``gp_log_z_stable``,
``gp_log_z_stable_factored``). The module docstring of :mod:`fastep._epcore.gp_ep` gives the
algebra and costs; every routine here is ``noexcept nogil`` and does no allocation.
"""
from libc.math cimport sqrt, log, log1p, fabs, isfinite, INFINITY, NAN
from libc.string cimport memset, memcpy
from fastep._epcore._blas cimport (
    UPPER, LOWER, NO_TRANS, TRANS, LEFT, RIGHT,
    daxpy, dscal, dcopy, symv, gemv, gemv_t, syr, syrk, trsm, trsv, potrf, trtri, symmetrize,
)
from fastep._epcore.sites cimport SiteModel, site_moments

# A refactorised posterior variance below -this * K_ii means K is not PSD (LinAlgError).
cdef double _NEGATIVE_VARIANCE_RTOL = 1e-8


# --------------------------------------------------------------------------- #
# refactorisation and evidence
# --------------------------------------------------------------------------- #

cdef void gp_form_covariance(const double* K, int n, const double* V, double* post_cov) noexcept nogil:
    """Lower triangle of Σ = K - VᵀV into ``post_cov`` (``syrk``)."""
    cdef int i
    for i in range(n):
        dcopy(i + 1, K + <Py_ssize_t>i * n, 1, post_cov + <Py_ssize_t>i * n, 1)
    syrk(LOWER, n, n, -1.0, V, n, 1.0, post_cov, n)


cdef int gp_refactor(const double* K, int n, const double* site_precision,
                     const double* site_natural_mean, double* post_cov, double* post_mean,
                     double* post_diag, double* work, double* sqrt_prec,
                     double* log_chol_diag_sum, bint form_cov) noexcept nogil:
    """Posterior from the sites through B = I + S^½ K S^½ = L Lᵀ (R&W Alg. 3.5, Σ form).

    Writes ``post_mean`` (μ = Σν), ``post_diag`` (diag Σ), ``log_chol_diag_sum``
    (Σ log L_ii = ½ log|B|), ``work`` (V = L⁻¹ S^½ K, n x n) and either the lower
    triangle of Σ = K - VᵀV into ``post_cov`` (``form_cov``) or leaves L there.
    ``sqrt_prec`` (n doubles) is scratch.  Uses the lower triangle of K for B and μ and
    full rows of K for V.  Every ``τ_i`` must be >= 0.  Returns 0 on success, potrf's info
    ``k > 0`` if the leading minor of order k of B is not positive definite, or ``-(i+1)``
    if ``Σ_ii < -1e-8 K_ii`` (impossible for PSD K beyond rounding).  Either failure means
    K is not (numerically) positive semi-definite.
    """
    cdef Py_ssize_t i, j, k
    cdef Py_ssize_t nn = n
    cdef bint any_positive = False
    cdef double si
    cdef double* row
    cdef const double* krow
    cdef int info
    _sqrt_precisions(n, site_precision, sqrt_prec)
    for i in range(nn):
        if sqrt_prec[i] > 0.0:
            any_positive = True
    if not any_positive:
        # B = I, L = I, V = 0: Σ = K, μ = K ν.
        log_chol_diag_sum[0] = 0.0
        for i in range(nn):
            post_diag[i] = K[i * nn + i]
        symv(LOWER, n, 1.0, K, n, site_natural_mean, 0.0, post_mean)
        for i in range(nn):
            memset(work + i * nn, 0, nn * sizeof(double))
        if form_cov:
            for i in range(nn):
                dcopy(<int>(i + 1), K + i * nn, 1, post_cov + i * nn, 1)
        return 0
    # L = chol(B) in post_cov
    info = _factor_b(K, n, sqrt_prec, post_cov, log_chol_diag_sum)
    if info != 0:
        return info
    # V = L⁻¹ diag(s) K in work
    for i in range(nn):
        si = sqrt_prec[i]
        row = work + i * nn
        if si == 0.0:
            memset(row, 0, nn * sizeof(double))
        else:
            krow = K + i * nn
            for j in range(nn):
                row[j] = si * krow[j]
    trsm(LOWER, NO_TRANS, n, n, 1.0, post_cov, n, work, n)
    # diag Σ = diag K - squared column norms of V
    for i in range(nn):
        post_diag[i] = K[i * nn + i]
    for k in range(nn):
        row = work + k * nn
        for i in range(nn):
            post_diag[i] -= row[i] * row[i]
    # 0 <= Σ_ii <= K_ii for PSD K; a clearly negative variance means K is not PSD.
    for i in range(nn):
        if post_diag[i] < -_NEGATIVE_VARIANCE_RTOL * K[i * nn + i]:
            return <int>(-(i + 1))
    # μ = K ν - Vᵀ (V ν)   (sqrt_prec reused for V ν)
    symv(LOWER, n, 1.0, K, n, site_natural_mean, 0.0, post_mean)
    gemv(n, n, 1.0, work, n, site_natural_mean, 0.0, sqrt_prec)
    gemv_t(n, n, -1.0, work, n, sqrt_prec, 1.0, post_mean)
    if form_cov:
        gp_form_covariance(K, n, work, post_cov)
    return 0


# Diagonal entries of B⁻¹ closer to 1 than this are recomputed from V = L⁻¹ S^½ K in
# gp_refactor_marginals: there Σ_ii = (1 - (B⁻¹)_ii) / τ_i loses about
# eps / (τ_i Σ_ii) relative accuracy (measured ≲ 1e-12 at τ_i Σ_ii = 1e-4).
cdef double _INVERSE_DIAG_CUTOFF = 1e-4


cdef void _fill_b_lower(const double* K, int n, const double* sqrt_prec, double* out) noexcept nogil:
    """Lower triangle of B = I + S^½ K S^½ into ``out`` (row-major n x n)."""
    cdef Py_ssize_t i, j, nn = n
    cdef double si
    cdef double* row
    cdef const double* krow
    for i in range(nn):
        si = sqrt_prec[i]
        row = out + i * nn
        krow = K + i * nn
        for j in range(i):
            row[j] = si * krow[j] * sqrt_prec[j]
        row[i] = 1.0 + si * si * krow[i]


cdef int _factor_b(const double* K, int n, const double* sqrt_prec, double* out,
                   double* log_chol_diag_sum) noexcept nogil:
    """L = chol(B), B = I + S^½ K S^½, into the lower triangle of ``out`` (row-major n x n);
    Σ log L_ii (= ½ log|B|) into ``log_chol_diag_sum`` unless it is NULL. Returns potrf's info."""
    cdef Py_ssize_t i, nn = n
    cdef double acc = 0.0
    cdef int info
    _fill_b_lower(K, n, sqrt_prec, out)
    info = potrf(LOWER, n, out, n)
    if info != 0 or log_chol_diag_sum == NULL:
        return info
    for i in range(nn):
        acc += log(out[i * nn + i])
    log_chol_diag_sum[0] = acc
    return 0


cdef void _sqrt_precisions(int n, const double* site_precision, double* sqrt_prec) noexcept nogil:
    cdef int i
    for i in range(n):
        sqrt_prec[i] = sqrt(site_precision[i]) if site_precision[i] > 0.0 else 0.0


cdef int _inverse_factor_diag(int n, const double* chol, double* work, double* out) noexcept nogil:
    """``out = diag(B⁻¹)``, the squared column norms of ``L⁻¹`` (rows k >= i of column i).

    ``chol`` holds L (row-major upper = column-major lower, as ``potrf`` leaves it); its
    triangle is copied into ``work`` (n x n) unless ``work`` is ``chol``, and inverted there
    in place by ``trtri``. Returns ``trtri``'s info (0 on success).
    """
    cdef Py_ssize_t i, k, nn = n
    cdef int info
    cdef double* row
    if work != chol:
        for i in range(nn):
            dcopy(<int>(i + 1), chol + i * nn, 1, work + i * nn, 1)
    info = trtri(LOWER, n, work, n)
    if info != 0:
        return info
    memset(out, 0, nn * sizeof(double))
    for k in range(nn):
        row = work + k * nn
        for i in range(k + 1):
            out[i] += row[i] * row[i]
    return 0


cdef int gp_refactor_marginals(const double* K, int n, const double* site_precision,
                               const double* site_natural_mean, double* post_cov,
                               double* post_mean, double* post_diag, double* work,
                               double* sqrt_prec, double* log_chol_diag_sum,
                               double* inv_diag) noexcept nogil:
    """diag Σ, μ and ½ log|B| of the sites without forming Σ; L = chol(B) is left in ``post_cov``.

    Same outputs as ``gp_refactor(..., form_cov=False)`` except that ``work`` is scratch
    (not V), at about half the cost: ``potrf`` (n³/3) and ``trtri`` of a copy of L
    (n³/3) instead of ``potrf`` and an n x n ``trsm`` (n³).  With ``b = diag(B⁻¹)``
    (squared column norms of L⁻¹), ``Σ = S^-½ (I - B⁻¹) S^-½`` on the sites with
    ``τ_i > 0`` gives ``Σ_ii = (1 - b_i) / τ_i``; where ``1 - b_i < 1e-4`` (including
    every ``τ_i = 0``) that difference is inaccurate and ``Σ_ii = K_ii - |L⁻¹ S^½ K e_i|²``
    is computed instead, by one ``trsm`` on just those columns.  ``μ = K ν - K S^½ B⁻¹
    S^½ K ν`` by two triangular solves (O(n²)).  The strict upper triangle of
    ``post_cov`` is left undefined.  If ``inv_diag`` is not NULL it receives ``b`` (n
    doubles; what ``gp_log_z_stable_factored`` would otherwise recompute by a second
    ``trtri``).  Return codes as ``gp_refactor``.
    """
    cdef Py_ssize_t i, j, k, nn = n, q, n_fallback = 0
    cdef double bi, acc
    cdef double* row
    cdef const double* krow
    cdef int info
    _sqrt_precisions(n, site_precision, sqrt_prec)
    info = _factor_b(K, n, sqrt_prec, post_cov, log_chol_diag_sum)
    if info != 0:
        return info
    # b = diag(B⁻¹): column norms² of L⁻¹ (rows k >= i of column i)
    info = _inverse_factor_diag(n, post_cov, work, post_diag)
    if info != 0:                      # impossible after a successful potrf
        return info
    if inv_diag != NULL:
        memcpy(inv_diag, post_diag, nn * sizeof(double))
    # Σ_ii where accurate; mark the rest (-1 is never a valid variance here)
    for i in range(nn):
        bi = post_diag[i]
        if 1.0 - bi >= _INVERSE_DIAG_CUTOFF and site_precision[i] > 0.0:
            post_diag[i] = (1.0 - bi) / site_precision[i]
        else:
            post_diag[i] = -1.0
            n_fallback += 1
    if n_fallback > 0:
        # panel P (n x n_fallback) with P[:, q] = S^½ K e_i in work, then L⁻¹ P
        q = 0
        for i in range(nn):
            if post_diag[i] == -1.0:
                krow = K + i * nn
                for j in range(nn):
                    work[j * n_fallback + q] = sqrt_prec[j] * krow[j]
                q += 1
        trsm(LOWER, NO_TRANS, n, <int>n_fallback, 1.0, post_cov, n, work, <int>n_fallback)
        q = 0
        for i in range(nn):
            if post_diag[i] == -1.0:
                acc = K[i * nn + i]
                for j in range(nn):
                    acc -= work[j * n_fallback + q] * work[j * n_fallback + q]
                post_diag[i] = acc
                q += 1
    for i in range(nn):
        if post_diag[i] < -_NEGATIVE_VARIANCE_RTOL * K[i * nn + i]:
            return <int>(-(i + 1))
    # μ = t - K (s ∘ B⁻¹ (s ∘ t)) with t = K ν   (work row 0 as the vector scratch)
    symv(LOWER, n, 1.0, K, n, site_natural_mean, 0.0, post_mean)
    for i in range(nn):
        work[i] = sqrt_prec[i] * post_mean[i]
    trsv(LOWER, NO_TRANS, n, post_cov, n, work)
    trsv(LOWER, TRANS, n, post_cov, n, work)
    for i in range(nn):
        work[i] *= sqrt_prec[i]
    symv(LOWER, n, -1.0, K, n, work, 1.0, post_mean)
    return 0


cdef void gp_covariance_from_factor(const double* K, int n, const double* site_precision,
                                    double* post_cov, double* work, double* sqrt_prec) noexcept nogil:
    """Σ = K - VᵀV (lower triangle) over L = chol(B) held in ``post_cov``; V = L⁻¹ S^½ K in ``work``.

    Completes ``gp_refactor_marginals`` to the state ``gp_refactor(..., form_cov=True)``
    leaves (``trsm`` + ``syrk``, 2 n³ flops); ``sqrt_prec`` is scratch.
    """
    cdef Py_ssize_t i, j, nn = n
    cdef double si
    cdef double* row
    cdef const double* krow
    _sqrt_precisions(n, site_precision, sqrt_prec)
    for i in range(nn):
        si = sqrt_prec[i]
        row = work + i * nn
        krow = K + i * nn
        for j in range(nn):
            row[j] = si * krow[j]
    trsm(LOWER, NO_TRANS, n, n, 1.0, post_cov, n, work, n)
    gp_form_covariance(K, n, work, post_cov)


cdef int gp_factor_only(const double* K, int n, const double* site_precision, double* post_cov,
                        double* sqrt_prec) noexcept nogil:
    """L = chol(B) into the lower triangle of ``post_cov`` (``potrf``); potrf's info."""
    _sqrt_precisions(n, site_precision, sqrt_prec)
    return _factor_b(K, n, sqrt_prec, post_cov, NULL)


cdef double gp_log_z(const SiteModel* model, const double* y, int n,
                     const double* site_precision, const double* site_natural_mean,
                     const double* post_diag, const double* post_mean,
                     double log_chol_diag_sum, int* bad_site) noexcept nogil:
    """log Z_EP of the sites (module docstring; Minka eqs 87-88 in the stable B form).

    ``post_diag``/``post_mean``/``log_chol_diag_sum`` as left by ``gp_refactor`` for these
    sites.  Returns NaN and the first offending index in ``bad_site`` if a site's cavity
    is improper or its kernel fails at the cavity (otherwise ``bad_site = -1``).
    """
    cdef int i, status
    cdef double total = -log_chol_diag_sum
    cdef double sii, mi, tau, nu, denom, tau_cav, nu_cav, cav_var, log_z = 0.0, alpha, beta
    bad_site[0] = -1
    for i in range(n):
        sii = post_diag[i]
        mi = post_mean[i]
        tau = site_precision[i]
        nu = site_natural_mean[i]
        denom = 1.0 - tau * sii
        if not (sii > 0.0 and denom > 0.0 and isfinite(sii) and isfinite(mi)):
            bad_site[0] = i
            return NAN
        tau_cav = denom / sii                  # 1/Σ_ii - τ_i
        nu_cav = mi / sii - nu
        cav_var = sii / denom                  # λ_i, eq 79
        status = site_moments(model, y[i], nu_cav * cav_var, cav_var, &log_z, &alpha, &beta)
        if status != 0 or not isfinite(log_z):
            bad_site[0] = i
            return NAN
        total += (log_z + 0.5 * nu * mi
                  + 0.5 * nu_cav * (tau * cav_var * nu_cav - 2.0 * nu) / (tau + tau_cav)
                  - 0.5 * nu * nu / (tau_cav + tau)
                  + 0.5 * log1p(tau * cav_var))
    return total


# Evidence in the stable form is used wherever some site has (B⁻¹)_ii = 1 - τ_i Σ_ii
# below this (DenseEP.run's convergence monitor; the reported log Z always uses it).
cdef double _STABLE_EVIDENCE_CUTOFF = 1e-4


cdef bint gp_needs_stable_log_z(int n, const double* site_precision,
                                const double* post_diag) noexcept nogil:
    """True if some site has ``1 - τ_i Σ_ii < 1e-4`` (``gp_log_z`` would lose digits there)."""
    cdef int i
    for i in range(n):
        if 1.0 - site_precision[i] * post_diag[i] < _STABLE_EVIDENCE_CUTOFF:
            return True
    return False


cdef double gp_log_z_stable(const SiteModel* model, const double* y, int n, const double* K,
                            const double* site_precision, const double* site_natural_mean,
                            const double* post_diag, double* work, double* vec,
                            double* cavity_mean, double* cavity_var, int* bad_site) noexcept nogil:
    """log Z_EP of the sites from the Cholesky of B alone (Minka eq 88, R&W eq 3.65), stably.

    ``work`` (n x n) and ``vec`` (4n doubles) are scratch; ``post_diag`` is diag Σ of
    these sites (read only where ``(B⁻¹)_ii >= 1 - 1e-4``, e.g. ``τ_i = 0``);
    ``cavity_mean``/``cavity_var`` (n doubles each, may be NULL) receive the cavities.
    NaN and ``bad_site`` as ``gp_log_z`` (``bad_site = -2``: the Cholesky of B failed).

    Derivation.  Write P for the sites with ``τ_i > 0`` and Z for the rest, ``s = √τ``,
    ``m̃_i = ν_i/τ_i`` (i in P), ``r = S^-½ ν_P`` (0 on Z), ``t = K ν_Z`` and

        w = B⁻¹ (r - S^½ t),       b_i = (B⁻¹)_ii = |L⁻¹ e_i|².

    From ``S^½ Σ S^½ = I - B⁻¹`` and ``S^½ K ν = (B - I) r + S^½ t``:
    ``1 - τ_i Σ_ii = b_i``, ``μ = Σν = t + K S^½ w``, ``s_i μ_i = r_i - w_i`` (i in P),
    and the cavity (eqs 78-79) ``λ_i = Σ_ii / b_i = (1 - b_i)/(τ_i b_i)``,
    ``h_i = (μ_i - Σ_ii ν_i)/b_i = (r_i - w_i/b_i)/s_i`` (i in P).  Inserting these into
    eq 88 (the module docstring's form, whose Gaussian part is
    ``½ νᵀΣν + Σ_i [½ log(1 + τ_i λ_i) - ½ μ_i²/Σ_ii + ½ h_i²/λ_i]``), the
    per-site Gaussian terms collapse to ``½ log(1 + τ_i λ_i) = -½ log b_i`` and

        ½ νᵀΣν + Σ_i [- ½ μ_i²/Σ_ii + ½ h_i²/λ_i] = -½ Σ_i c_i h_i,
        c_i = ν_i - τ_i μ_i = s_i w_i  (i in P),   c_i = ν_i  (i in Z),

    so that

        log Z_EP = Σ_i log Ẑ_i(h_i, λ_i) - Σ_i log L_ii - ½ Σ_i log b_i - ½ Σ_i c_i h_i.

    The textbook form adds terms of size ``τ_i m̃_i²`` (``½ νᵀΣν`` and ``½ ν_i²/(τ_i +
    τ₋_i)``) that cancel to O(1), and its cavity ``τ₋ = 1/Σ_ii - τ_i`` cancels to the
    last digit once ``τ_i λ_i`` approaches 1/eps: with τ_i ~ 1e13 (a probit slope of
    1e6-1e9 on a nearly singular RBF kernel) it was off by 0.03, with larger τ by O(10).
    Here no term is larger than the result's parts: ``w`` and ``b`` come from triangular
    solves with L (accurate relative to the equilibrated B), ``log b_i`` and
    ``c_i h_i`` are O(1) per site.  Where ``b_i >= 1 - 1e-4`` (small ``τ_i Σ_ii``,
    including ``τ_i = 0``) ``λ_i = Σ_ii/b_i`` and ``h_i = (μ_i - Σ_ii ν_i)/b_i`` are
    the accurate forms instead.  For one site (n = 1) the cavity is the prior and the
    result is exactly ``log Ẑ_1`` at it.  Cost: ``potrf`` + ``trtri`` (2n³/3) + O(n²);
    ``gp_log_z_stable_factored`` does the same from a factor (and ``b``) already at hand.
    """
    cdef int info
    bad_site[0] = -1
    _sqrt_precisions(n, site_precision, vec)
    info = _factor_b(K, n, vec, work, NULL)
    if info != 0:
        bad_site[0] = -2
        return NAN
    return gp_log_z_stable_factored(model, y, n, K, site_precision, site_natural_mean, post_diag,
                                    work, NULL, work, vec, cavity_mean, cavity_var, bad_site)


cdef double gp_log_z_stable_factored(const SiteModel* model, const double* y, int n,
                                     const double* K, const double* site_precision,
                                     const double* site_natural_mean, const double* post_diag,
                                     const double* chol, const double* inv_diag, double* work,
                                     double* vec, double* cavity_mean, double* cavity_var,
                                     int* bad_site) noexcept nogil:
    """``gp_log_z_stable`` given ``L = chol(B)`` of these sites (lower triangle of ``chol``).

    ``inv_diag``: ``b = diag(B⁻¹)`` as left by ``gp_refactor_marginals`` (its ``inv_diag``)
    for the same sites, or NULL to form it by ``trtri`` of a copy of L in ``work`` (n x n
    scratch; unused if ``inv_diag`` is given; may be ``chol`` itself, which is then
    overwritten by L⁻¹ after its last use).  Only the lower triangle of ``chol`` is read.
    The operations on L (and the ``trtri``, when done) are exactly those of
    ``gp_log_z_stable``, so a factor from the same ``potrf`` of the same B gives the same
    bits.  Cost: O(n²) with ``inv_diag``, ``trtri`` (n³/3) + O(n²) without.
    """
    cdef Py_ssize_t i, k, nn = n
    cdef int status, info
    cdef double* s = vec
    cdef double* w = vec + nn
    cdef double* mu = vec + 2 * nn
    cdef double* b = vec + 3 * nn
    cdef double total = 0.0, bi, si, lam, h, c, log_z = 0.0, alpha, beta
    cdef double* row
    bad_site[0] = -1
    _sqrt_precisions(n, site_precision, s)
    for i in range(nn):
        total -= log(chol[i * nn + i])
    # t = K ν_Z into mu (w as the masked ν), then w = r - S^½ t, w <- B⁻¹ w
    for i in range(nn):
        w[i] = site_natural_mean[i] if s[i] == 0.0 else 0.0
    symv(LOWER, n, 1.0, K, n, w, 0.0, mu)
    for i in range(nn):
        si = s[i]
        w[i] = site_natural_mean[i] / si - si * mu[i] if si > 0.0 else 0.0
    trsv(LOWER, NO_TRANS, n, chol, n, w)
    trsv(LOWER, TRANS, n, chol, n, w)
    # μ = t + K S^½ w   (b as the vector scratch)
    for i in range(nn):
        b[i] = s[i] * w[i]
    symv(LOWER, n, 1.0, K, n, b, 1.0, mu)
    # b = diag(B⁻¹): squared column norms of L⁻¹
    if inv_diag != NULL:
        memcpy(b, inv_diag, nn * sizeof(double))
    else:
        info = _inverse_factor_diag(n, chol, work, b)
        if info != 0:
            bad_site[0] = -2
            return NAN
    for i in range(nn):
        bi = b[i]
        si = s[i]
        if si > 0.0 and 1.0 - bi >= _STABLE_EVIDENCE_CUTOFF:
            lam = (1.0 - bi) / (site_precision[i] * bi)
            h = (site_natural_mean[i] / si - w[i] / bi) / si
        else:
            lam = post_diag[i] / bi
            h = (mu[i] - post_diag[i] * site_natural_mean[i]) / bi
        c = si * w[i] if si > 0.0 else site_natural_mean[i]
        if not (lam > 0.0 and isfinite(lam) and isfinite(h) and bi > 0.0):
            bad_site[0] = <int>i
            return NAN
        if cavity_mean != NULL:
            cavity_mean[i] = h
        if cavity_var != NULL:
            cavity_var[i] = lam
        status = site_moments(model, y[i], h, lam, &log_z, &alpha, &beta)
        if status != 0 or not isfinite(log_z):
            bad_site[0] = <int>i
            return NAN
        total += log_z - 0.5 * log(bi) - 0.5 * c * h
    return total


