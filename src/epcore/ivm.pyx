# cython: language_level=3
"""Informative Vector Machine: greedy active-set selection by sparse ADF (Lawrence, Seeger & Herbrich 2005).

Model
-----
Prior ``f ~ N(0, K)`` over the n training points, likelihood ``∏_n t_n(f_n)``.
After the active set ``I = (n_1, ..., n_k)`` has been included (assumed-density
filtering, eqs 7-16) the posterior is ``q_k(f) = N(f; μ, Σ)`` with

    Σ = K - MᵀM                                      (eq 29)

and each included point carries a Gaussian site ``N(m_n; f_n, β_n⁻¹)``.  Only
O(k n) numbers are stored (``ivm.pxd`` lists the arrays); the n x n matrices K
and Σ are never formed: the caller supplies the kernel column ``K[:, n_i]`` of
each point when it is included, nothing else.

One step of Algorithm 1
-----------------------
1. **Score every inactive point** (one compiled pass).  The site kernel gives at the
   cavity ``N(μ_n, ς_n + sigma2)``

       g_n = ∂ log Z_n / ∂μ_n,   ν_n = -∂² log Z_n / ∂μ_n²      (eqs 14-25)

   (``sigma2`` is an extra variance added to the cavity variance as Lawrence's
   MATLAB toolbox does: for the probit model it is the same as a slope
   ``sigma2^(-1/2)``, for the Gaussian model part of the noise variance).  The
   scores are

   * entropy reduction ``ΔH_n = -½ log(1 - ν_n ς_n)``            (eq 26, default)
   * information gain ``KL(q_new ‖ q_old) = ½ (g_n² ς_n - ν_n ς_n - log(1 - ν_n ς_n))``
     (the relative entropy of the posterior after the ADF step from the
     one before: trace term -ν ς, mean shift g² ς (eq 15), log-determinant eq 26)
   * random: a uniformly drawn eligible point (splitmix64, seeded).

   A point is eligible when its site kernel succeeds, ``ς_n > 0``, ``ν_n > 0``
   and ``ν_n ς_n < 1`` (a proper, informative update); the highest score wins
   and ties go to the lowest index.  ``IVMEP.score`` (and ``select``) run the
   fused pass: g and ν only (no log Z), probit and Gaussian sites inline in blocks,
   the entropy criterion ranked by ``ν ς`` with the exact score evaluated only near
   the maximum, and for probit sites g and ν computed only for the points whose
   bound on ``ν ς`` reaches the best one (same choice, ties included; section "The
   fused scoring pass" below).  ``ivm_score`` (``IVMEP.score_per_site``) is the
   plain cross-check: one ``site_moments`` call and one criterion evaluation per
   point.  Both give bitwise the same g, ν, scores and choice.
2. **Include the winner** ``n = n_i`` (``ivm_include``):

   * sites (eqs 22-23): ``β_n = ν_n / (1 - ν_n ς_n)``, ``m_n = μ_n + g_n / ν_n``;
     for the Gaussian likelihood (the "spherical" model) directly
     ``β_n = 1/(σ² + sigma2)``, ``m_n = y_n`` (the same values, without the
     cancellation of eq 23 when the noise is small);
   * the covariance column ``s = Σ[:, n] = K[:, n] - Mᵀ M[:, n]``  (eq 30; one gemv);
   * ``ς -= ν_n s²`` (eq 27), ``μ += g_n s`` (eq 28), new row ``M[k] = sqrt(ν_n) sᵀ``;
   * Seeger's Cholesky row append for ``B̃ = I + B_I^½ K_I B_I^½ = L Lᵀ``:
     with ``f = sqrt(β_n) B_I^½ K[I, n]`` the new row is ``(lᵀ, l_kk)``,
     ``l = L⁻¹ f``, ``l_kk = sqrt(1 + β_n K_nn - lᵀl)``.  Because
     ``M = L⁻¹ B_I^½ K[I, :]`` (the sequential rows of eq 29 are exactly this
     triangular factor), ``l = sqrt(β_n) M[:, n]`` and
     ``l_kk = sqrt(1 + β_n ς_n)`` come for free from the column just read: no
     triangular solve is needed.

Cost per inclusion: the gemv (2 k n flops, reading k rows of M) and O(n) for the
scores and the vector updates, i.e. O(d² n) for d inclusions; memory
O(d_max n) for M.  Everything heavy runs with the GIL released; the Python
callback that produces the kernel column is the only Python call per inclusion.

What the rest of fastep uses
----------------------------
* approximate log likelihood (eq 32) ``log N(m_I; 0, K_I + B_I⁻¹)``: with
  ``K_I + B_I⁻¹ = B_I^{-½} L Lᵀ B_I^{-½}`` it is
  ``-½ |L⁻¹ B_I^½ m_I|² - Σ log L_ii + ½ Σ log β_i - (k/2) log 2π``
  (``IVMEP.log_likelihood``);
* prediction weights ``w = (K_I + B_I⁻¹)⁻¹ m_I = B_I^½ L⁻ᵀ L⁻¹ B_I^½ m_I`` and
  ``σ*² = k** - |L⁻¹ B_I^½ k*|²`` (``IVMEP.weights``; Seeger §2.2).

The engine, and refinement on a fixed-size active set (Seeger's notes §2.1, §2.3)
--------------------------------------------------------------------------------
``IVMEP(y, spec, diag_k, options, sigma2).run(column_fn, callback)`` selects ``d``
points, then refines the active set as its ``IVMOptions`` ask: EP deletion-inclusion
sweeps (``refine``, through the sweep driver of ``_common.pyx``), exchange moves scored by
eqs (8)-(9) and the entropy criterion (``exchange``), the sweeps again after a move. It
returns an ``IVMResult`` (a ``SweepResult`` with the stages' ``RefineResult`` and
``ExchangeResult``). The refinement, the options and the results live in ivm_refine.pyx
(exported here); both stages keep the active set size and memory O(d n).
"""
import numpy as np

from libc.math cimport INFINITY, NAN
from libc.string cimport memcpy
from fastep._epcore._blas cimport gemv_t
from fastep._epcore.sites cimport SiteSpec
from fastep._epcore._common cimport splitmix64_next
from fastep._epcore._common import former_name
from fastep._epcore.ivm_refine cimport (KernelRows, IVMOptions, RefineSettings, ExchangeSettings,
                                        fetch_column, check_column_fn, check_refine_settings,
                                        check_exchange_settings, active_log_z, refactorize,
                                        refine_sweeps, exchange_gains, exchange_moves, refine_stages)
# The engine's options and results, defined beside the refinement (ivm_refine.pyx), are
# exported here too (the names are cimported above, so they are set in the module's dict).
from fastep._epcore import ivm_refine as _ivm_refine
from fastep._epcore.ivm_refine import CRITERIA, active_set_evidence
for _name in ("IVMOptions", "IVMResult", "RefineResult", "ExchangeResult"):
    globals()[_name] = getattr(_ivm_refine, _name)
del _name, _ivm_refine

# g and ν at a cavity (inline probit and Gaussian kernels, shared with ivm_refine.pyx),
# _log1m, the PSD tolerance
include "_ivm_moments.pxi"

# Module-level integer constants (CRITERION_*, IVM_*) for Python callers.
for _enum_class in (IVMCriterion, IVMStatus):
    for _member in _enum_class:
        globals()[_member.name] = int(_member)
del _enum_class, _member



# --------------------------------------------------------------------------- #
# nogil building blocks
# --------------------------------------------------------------------------- #

cdef inline bint _moments(const SiteModel* model, double y, double mean, double var, double sigma2,
                          double* g, double* nu) noexcept nogil:
    """g, ν of one point at the cavity N(mean, var + sigma2); True if it is eligible for inclusion."""
    cdef double log_z = 0.0
    if not (var > 0.0):
        return False
    if site_moments(model, y, mean, var + sigma2, &log_z, g, nu) != SITE_OK:
        return False
    return nu[0] > 0.0 and var * nu[0] < 1.0


cdef inline double _criterion(int criterion, double var, double g, double nu) noexcept nogil:
    """Score of an eligible point (entropy reduction eq 26, or the information gain)."""
    cdef double prod = var * nu
    cdef double lg = _log1m(prod)
    if criterion == CRITERION_INFO_GAIN:
        return 0.5 * (g * g * var - prod - lg)
    return -0.5 * lg


cdef inline bint _store_moments(IVMArrays* s, int i, double var, bint ok, double g,
                               double nu) noexcept nogil:
    """Store g, ν of inactive point i (NaN where its site kernel failed, ``ok`` False);
    True if the point is eligible: ``ok``, ς > 0, ν > 0 and ν ς < 1."""
    if not ok:
        g = NAN
        nu = NAN
    s.g[i] = g
    s.nu[i] = nu
    return ok and var > 0.0 and nu > 0.0 and var * nu < 1.0


cdef struct _Pick:
    double p_max         # entropy / random in the fused pass: the largest p = ν ς (first index attaining it)
    double best_score    # the largest score (first index attaining it)
    int chosen
    int n_eligible


cdef inline void _pick_init(_Pick* pk) noexcept nogil:
    pk.p_max = -INFINITY
    pk.best_score = -INFINITY
    pk.chosen = -1
    pk.n_eligible = 0


cdef inline void _rank_by_score(IVMArrays* s, int criterion, int i, double var, bint eligible,
                                double g, double nu, _Pick* pk) noexcept nogil:
    """Score inactive point i by ``_criterion`` (-inf if it is not eligible) and keep the best."""
    cdef double sc
    if not eligible:
        s.score[i] = -INFINITY
        return
    pk.n_eligible += 1
    sc = _criterion(criterion, var, g, nu)
    s.score[i] = sc
    if sc > pk.best_score:
        pk.best_score = sc
        pk.chosen = i


cdef int ivm_score(const SiteModel* model, const double* y, IVMArrays* s, double sigma2,
                   int criterion, unsigned long long* rng_state, int* best) noexcept nogil:
    """Score every inactive point (fills g, nu, score; ineligible points score -inf).

    ``best`` receives the chosen point: the highest score, lowest index among ties
    (random criterion: a uniformly drawn eligible point).  Returns IVM_OK or
    IVM_NO_CANDIDATE.  One ``site_moments`` call per inactive point; g and ν are the site
    kernel's at N(μ_n, ς_n + sigma2) (NaN where it fails), as in the fused pass.
    """
    cdef int i
    cdef double gi = 0.0, nui = 0.0, var
    cdef bint ok
    cdef _Pick pk
    _pick_init(&pk)
    for i in range(s.n):
        if not s.is_active[i]:
            var = s.post_var[i]
            ok = _site_at(model, y[i], s.post_mean[i], var, sigma2, &gi, &nui)
            _rank_by_score(s, criterion, i, var, _store_moments(s, i, var, ok, gi, nui), gi, nui, &pk)
    return _finish_choice(s, criterion, s.score, False, rng_state, &pk, best)


cdef int ivm_pick(IVMArrays* s, const double* g_all, const double* nu_all, int criterion,
                  unsigned long long* rng_state, int* best) noexcept nogil:
    """As ``ivm_score``, from site moments g_all, nu_all already computed for every point
    (all site kernels succeeded): the eligibility test, the scores and the choice."""
    cdef int i
    cdef bint eligible
    cdef _Pick pk
    _pick_init(&pk)
    for i in range(s.n):
        if not s.is_active[i]:
            eligible = _store_moments(s, i, s.post_var[i], True, g_all[i], nu_all[i])
            _rank_by_score(s, criterion, i, s.post_var[i], eligible, g_all[i], nu_all[i], &pk)
    return _finish_choice(s, criterion, s.score, False, rng_state, &pk, best)


# --------------------------------------------------------------------------- #
# The fused scoring pass (``IVMEP.score`` / ``select``)
# --------------------------------------------------------------------------- #
#
# Nogil loops over the inactive points that compute only what the criterion needs:
#
# * g and ν, never log Z.  Probit and Gaussian sites are computed inline, in blocks of
#   ``_SCORE_BLOCK`` points stage by stage as ``sites.site_moments_array`` does, with the
#   very same inline functions (``_probit_terms.pxi``, included by sites.pyx as well: G(|z|),
#   N(z), ``_probit_g_nu``), so g and ν are bitwise the site kernel's α and β (tested against
#   ``site_moments``); any point outside the inline kernels' range (probit |z| >= 8,
#   ς <= 0, non-finite values) and every other likelihood goes through ``site_moments``.
# * Entropy (eq 26) and random: no logarithm per candidate.  ΔH = -½ log(1 - p) with
#   p = ν ς is increasing in p, so the pass keeps p (``prod``) and the largest p; the
#   winner is then found among the points with p >= p_max (1 - 1e-9) by their exact
#   scores (the expression of ``_criterion``), highest score and lowest index first.
#   That is exactly the choice of the full pass: for p_i < p_max (1 - 1e-9) the true
#   scores differ by at least ½ (p_max - p_i) >= ½ 1e-9 p_max, while the computed scores
#   (one log1p or log, a few ulp, |ΔH| <= 18.4 because p <= 1 - 2⁻⁵³) are off by less
#   than 1e-14 max(p_max, 1) relative; when p_max < 1e-280 (near the subnormal range,
#   where 1e-9 p_max may round away and ½ log1p(-p) loses bits) every eligible point is
#   scored.  The score array is filled from ``prod`` only when it is
#   read (``IVMEP.score_values``) or a point is included.
# * Entropy with the probit likelihood (``_score_entropy_probit``): most points are not
#   even given g and ν.  With c = (slope⁻² + ς + sigma2)^(-½) and z = y c (μ + bias),
#   ν = c² h(z), h(z) = r (r + z), r = N(z)/Φ(z); h decreases from 1 to 0, so on the cell
#   [z_k, z_k + ¼) of a grid over [-8, 8) it is at most h(z_k), and p <= ς c² h(z_k)
#   (1 + 1e-12) (``_h_bound``; the margin covers the few-ulp rounding of the inline
#   kernel).  That bound costs one sqrt and one division per point; g and ν are computed
#   (inline, exactly as above) only for the points whose bound reaches p_best (1 - 1e-9),
#   p_best the largest exact p found so far (first for the point with the largest
#   bound).  A point left out has p < p_max (1 - 1e-9), outside the window above, so
#   the choice is that of the full pass.  At USPS scale 0.1-10 % of the points are
#   computed.  The others' μ and ς are kept (``snap_mean``, ``snap_var``) and their g,
#   ν, p are computed when g, ν or the scores are read (``IVMEP._fill_moments``).
# * Information gain: the score of every eligible point, as ``_criterion``.

cdef enum:
    _SCORE_BLOCK = 64
    _H_CELLS = 64          # cells [-8 + k/4, -8 + (k + 1)/4) of the probit bound on ν

# Relative width of the window of candidates scored exactly (see above), the p_max
# below which every eligible point is scored, and the relative margin of ``_h_bound``.
cdef double _WINDOW = 1e-9
cdef double _WINDOW_MIN_P = 1e-280
cdef double _H_MARGIN = 1e-12
cdef double _h_bound[_H_CELLS]       # h(z_k) (1 + _H_MARGIN), z_k = -8 + k/4 (filled below)


cdef inline double _entropy_score(double p) noexcept nogil:
    """ΔH of an eligible point from p = ν ς (the expression of ``_criterion``)."""
    return -0.5 * _log1m(p)


cdef inline void _record(IVMArrays* s, double* prod, int criterion, int i, double var,
                         bint ok, double g, double nu, _Pick* pk) noexcept nogil:
    """Store g, ν of inactive point i (``_store_moments``) and rank it: by its score for the
    information gain, else by p = ν ς (``prod``, -inf if it is not eligible)."""
    cdef double p
    cdef bint eligible = _store_moments(s, i, var, ok, g, nu)
    if criterion == CRITERION_INFO_GAIN:
        _rank_by_score(s, criterion, i, var, eligible, g, nu, pk)
        return
    if not eligible:
        prod[i] = -INFINITY
        return
    p = var * nu
    pk.n_eligible += 1
    prod[i] = p
    if p > pk.p_max:
        pk.p_max = p
        pk.chosen = i


cdef void _moments_blocked(const SiteModel* model, const _Lik* lik, const double* y, IVMArrays* s,
                           const double* var_a, const double* mean_a, const unsigned char* only,
                           double sigma2, int criterion, double* prod, _Pick* pk) noexcept nogil:
    """g, ν and ``_record`` for every inactive point (with ``only[i]`` set, unless ``only`` is
    NULL) at the marginals ``var_a``, ``mean_a``; probit in stages over blocks of points."""
    cdef int n = s.n, i = 0, j, m, q
    cdef int idx[_SCORE_BLOCK]
    cdef double cc[_SCORE_BLOCK]
    cdef double zz[_SCORE_BLOCK]
    cdef double gt[_SCORE_BLOCK]
    cdef double nn[_SCORE_BLOCK]
    cdef double gg[_SCORE_BLOCK]
    cdef bint fast[_SCORE_BLOCK]
    cdef double var, z, x, gq = 0.0, nuq = 0.0
    cdef bint ok
    while i < n:
        m = 0
        while i < n and m < _SCORE_BLOCK:
            if not s.is_active[i] and (only == NULL or only[i]):
                idx[m] = i
                m += 1
            i += 1
        if lik.code == LIK_PROBIT:
            # stage 1: c = 1/sqrt(slope⁻² + ς + sigma2), z = y c (μ + bias); stage 2: G(|z|)
            for j in range(m):
                q = idx[j]
                cc[j] = 1.0 / sqrt((var_a[q] + sigma2) + lik.inv_slope2)
                zz[j] = y[q] * (cc[j] * (mean_a[q] + lik.bias))
            for j in range(m):
                x = fabs(zz[j])
                gt[j] = _gauss_tail_poly(x) if x < _GT_X_MAX else 0.0
            # stage 3: N(z) where 0 < z < 8 (the only call; the divisions of independent
            # points then overlap in stage 4)
            for j in range(m):
                z = zz[j]
                nn[j] = _normal_pdf(z) if 0.0 < z < _GT_X_MAX else 0.0
            # stage 4: g, ν
            for j in range(m):
                q = idx[j]
                fast[j] = var_a[q] > 0.0 and fabs(zz[j]) < _GT_X_MAX \
                    and _probit_g_nu(y[q], cc[j], zz[j], gt[j], nn[j], &gg[j], &nn[j])
            for j in range(m):
                q = idx[j]
                var = var_a[q]
                ok = fast[j]
                gq = gg[j]
                nuq = nn[j]
                if not ok:
                    ok = _site_at(model, y[q], mean_a[q], var, sigma2, &gq, &nuq)
                _record(s, prod, criterion, q, var, ok, gq, nuq, pk)
        else:
            for j in range(m):
                q = idx[j]
                var = var_a[q]
                ok = _point_moments(model, lik, y[q], var, mean_a[q], sigma2, &gq, &nuq)
                _record(s, prod, criterion, q, var, ok, gq, nuq, pk)


cdef int _finish_choice(IVMArrays* s, int criterion, const double* values, bint by_p,
                        unsigned long long* rng_state, _Pick* pk, int* best) noexcept nogil:
    """The choice after a pass, into ``best``; returns IVM_OK or IVM_NO_CANDIDATE.

    Random criterion: a uniformly drawn eligible point (``values[i] > -inf``; ``values``
    the scores, or p after the fused pass).  Entropy ranked by p (``by_p``, the fused
    pass; ``values`` = p): the best exact score in the window (see above).  Otherwise
    ``pk.chosen``.
    """
    cdef int n = s.n, i, r
    cdef double thr, sc, best_sc
    if pk.n_eligible == 0:
        best[0] = -1
        return IVM_NO_CANDIDATE
    if criterion == CRITERION_RANDOM:
        r = <int>(splitmix64_next(rng_state) % <unsigned long long>pk.n_eligible)
        for i in range(n):
            if not s.is_active[i] and values[i] > -INFINITY:
                if r == 0:
                    pk.chosen = i
                    break
                r -= 1
    elif criterion == CRITERION_ENTROPY and by_p:
        thr = -INFINITY if pk.p_max < _WINDOW_MIN_P else pk.p_max - pk.p_max * _WINDOW
        best_sc = -INFINITY
        for i in range(n):
            if not s.is_active[i] and values[i] >= thr and values[i] > -INFINITY:
                sc = _entropy_score(values[i])
                if sc > best_sc:
                    best_sc = sc
                    pk.chosen = i
    best[0] = pk.chosen
    return IVM_OK


cdef int _score_pass(const SiteModel* model, const double* y, IVMArrays* s, double sigma2,
                     int criterion, double* prod, unsigned long long* rng_state,
                     int* best) noexcept nogil:
    """The full fused pass (see above): g, ν of every inactive point, and ``prod`` (entropy,
    random; -inf for ineligible points) or ``score`` (information gain).  ``best``: the
    point ``ivm_score`` chooses.  Returns IVM_OK or IVM_NO_CANDIDATE."""
    cdef _Lik lik
    cdef _Pick pk
    _prepare(model, &lik)
    _pick_init(&pk)
    _moments_blocked(model, &lik, y, s, s.post_var, s.post_mean, NULL, sigma2, criterion, prod, &pk)
    return _finish_choice(s, criterion, prod, True, rng_state, &pk, best)


cdef inline int _h_cell(double z) noexcept nogil:
    """The cell k of ``_h_bound`` with z_k <= z, for -8 <= z < 8."""
    cdef int k = <int>((z + 8.0) * 4.0)
    if k > _H_CELLS - 1:
        k = _H_CELLS - 1
    if k > 0 and -8.0 + 0.25 * k > z:                  # (z + 8) 4 rounded up onto z_{k}
        k -= 1
    return k


cdef int _score_entropy_probit(const SiteModel* model, const _Lik* lik, const double* y,
                               IVMArrays* s, double sigma2, double* prod, double* bound,
                               unsigned char* pending, double* snap_var, double* snap_mean,
                               int* best, int* n_deferred) noexcept nogil:
    """The entropy pass for the probit likelihood with the ν bound (see above).

    Points given g, ν here get them in ``s.g``, ``s.nu`` and their p or -inf in ``prod``;
    the others get ``pending`` = 1, ``prod`` = NaN and their μ, ς in ``snap_mean``,
    ``snap_var``; ``n_deferred`` receives their number.  ``best``: the point the full pass
    chooses.  Returns IVM_OK or IVM_NO_CANDIDATE.
    """
    cdef int n = s.n, i, i0, j, m, i_top = -1, skipped = 0
    cdef double var, mu, z, u, top = -INFINITY, thr, gq = 0.0, nuq = 0.0
    cdef double cc[_SCORE_BLOCK]
    cdef double zz[_SCORE_BLOCK]
    cdef bint ok
    cdef _Pick pk
    _pick_init(&pk)
    memcpy(snap_var, s.post_var, n * sizeof(double))
    memcpy(snap_mean, s.post_mean, n * sizeof(double))
    i0 = 0
    while i0 < n:
        m = n - i0 if n - i0 < _SCORE_BLOCK else _SCORE_BLOCK
        for j in range(m):                          # independent points: the divisions overlap
            i = i0 + j
            cc[j] = 1.0 / sqrt((snap_var[i] + sigma2) + lik.inv_slope2)
            zz[j] = y[i] * (cc[j] * (snap_mean[i] + lik.bias))
        for j in range(m):
            i = i0 + j
            pending[i] = 0
            if s.is_active[i]:
                continue
            var = snap_var[i]
            z = zz[j]
            if var > 0.0 and fabs(z) < _GT_X_MAX:
                u = var * (cc[j] * cc[j]) * _h_bound[_h_cell(z)]
                bound[i] = u
                pending[i] = 1
                prod[i] = NAN
                if u > top:
                    top = u
                    i_top = i
            else:
                ok = _site_at(model, y[i], snap_mean[i], var, sigma2, &gq, &nuq)
                _record(s, prod, CRITERION_ENTROPY, i, var, ok, gq, nuq, &pk)
        i0 += m
    if i_top >= 0:
        ok = _point_moments(model, lik, y[i_top], snap_var[i_top], snap_mean[i_top], sigma2, &gq, &nuq)
        _record(s, prod, CRITERION_ENTROPY, i_top, snap_var[i_top], ok, gq, nuq, &pk)
        pending[i_top] = 0
    thr = -INFINITY if pk.p_max < _WINDOW_MIN_P else pk.p_max - pk.p_max * _WINDOW
    for i in range(n):
        if pending[i] and bound[i] >= thr:
            ok = _point_moments(model, lik, y[i], snap_var[i], snap_mean[i], sigma2, &gq, &nuq)
            _record(s, prod, CRITERION_ENTROPY, i, snap_var[i], ok, gq, nuq, &pk)
            pending[i] = 0
            if pk.p_max >= _WINDOW_MIN_P:
                thr = pk.p_max - pk.p_max * _WINDOW
        skipped += pending[i]
    n_deferred[0] = skipped
    return _finish_choice(s, CRITERION_ENTROPY, prod, True, NULL, &pk, best)


cdef void _init_h_bound() noexcept nogil:
    """``_h_bound[k]`` = h(z_k) (1 + _H_MARGIN) by the inline kernel (c = 1 gives ν = h) for
    k >= 1; 1 for the first cell (z_0 = -8 is outside the kernel's table; h < 1)."""
    cdef int k
    cdef double z, g = 0.0, h = 0.0
    _h_bound[0] = 1.0 + _H_MARGIN
    for k in range(1, _H_CELLS):
        z = -8.0 + 0.25 * k
        _probit_g_nu(1.0, 1.0, z, _gauss_tail_poly(fabs(z)), _normal_pdf(z) if z > 0.0 else 0.0, &g, &h)
        _h_bound[k] = h * (1.0 + _H_MARGIN)


_init_h_bound()


def _probit_h_bound():
    """The bound table (z_k, h(z_k) (1 + margin)) of the pruned entropy pass (for tests)."""
    return np.array([-8.0 + 0.25 * k for k in range(_H_CELLS)]), np.array([_h_bound[k] for k in range(_H_CELLS)])


cdef int ivm_include(const SiteModel* model, const double* y, IVMArrays* s, double sigma2,
                     int point, const double* column, double* work) noexcept nogil:
    """Include ``point`` (ADF step, eqs 15-16 and 22-30) given its kernel column ``K[:, point]``.

    ``work`` must hold n + d_max doubles.  g and ν are recomputed at the current
    posterior (so the call does not depend on a preceding ``ivm_score``).  Returns
    IVM_OK, or IVM_FULL / IVM_BAD_POINT / IVM_BAD_COLUMN with the state unchanged,
    or IVM_NEGATIVE_VARIANCE after the (applied) update if some ς_i fell below
    -1e-8 K_ii.
    """
    cdef int k = s.k, n = s.n, d_max = s.d_max, j
    cdef Py_ssize_t i, nn = n
    cdef double var_p, mu_p, g = 0.0, nu = 0.0, beta, m, sq_nu, sq_beta, si, c
    cdef double* a
    cdef double* col
    cdef double* row
    cdef double* pv = s.post_var
    cdef double* pm = s.post_mean
    cdef const double* dk = s.diag_k
    cdef double neg_rtol = -_NEGATIVE_VARIANCE_RTOL
    cdef bint finite = True, negative = False
    if k >= d_max:
        return IVM_FULL
    if point < 0 or point >= n or s.is_active[point]:
        return IVM_BAD_POINT
    var_p = pv[point]
    mu_p = pm[point]
    if not _moments(model, y[point], mu_p, var_p, sigma2, &g, &nu):
        return IVM_BAD_POINT
    col = work
    a = work + nn
    for i in range(nn):                                          # copy and check K[:, n]
        c = column[i]
        finite = finite & isfinite(c)
        col[i] = c
    if not finite:
        return IVM_BAD_COLUMN
    if model.code == LIK_GAUSSIAN:
        beta = 1.0 / (model.params[0] + sigma2)                  # spherical model
        m = y[point]
    else:
        beta = nu / (1.0 - nu * var_p)                           # eq 23
        m = mu_p + g / nu                                        # eq 22
    # s = K[:, n] - Mᵀ M[:, n]  (eq 30)
    for j in range(k):
        a[j] = s.M[<Py_ssize_t>j * nn + point]
    if k > 0:
        gemv_t(k, n, -1.0, s.M, n, a, 1.0, col)
    # eqs 27-28, the new row of M and the PSD check, in one pass
    sq_nu = sqrt(nu)
    row = s.M + <Py_ssize_t>k * nn
    for i in range(nn):
        si = col[i]
        c = pv[i] - nu * si * si
        pv[i] = c
        negative = negative | (c < neg_rtol * dk[i])
        pm[i] += g * si
        row[i] = sq_nu * si
    # Cholesky row append: l = sqrt(β) M[:, n], l_kk = sqrt(1 + β ς_n)
    sq_beta = sqrt(beta)
    row = s.L + <Py_ssize_t>k * d_max
    for j in range(k):
        row[j] = sq_beta * a[j]
    row[k] = sqrt(1.0 + beta * var_p)
    s.site_mean[point] = m
    s.site_precision[point] = beta
    s.g[point] = g
    s.nu[point] = nu
    s.active[k] = point
    s.is_active[point] = 1
    s.k = k + 1
    if negative:
        return IVM_NEGATIVE_VARIANCE
    return IVM_OK


# --------------------------------------------------------------------------- #
# Python-level state
# --------------------------------------------------------------------------- #

def _as_vector(name, values, n=None):
    arr = np.ascontiguousarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D; got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} must have length n = {n}; got {arr.shape[0]}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f"{name} must be finite; {name}[{bad[0]}] = {arr[bad[0]]!r}")
    return arr


def _readonly(arr):
    view = arr.view()
    view.setflags(write=False)
    return view


cdef class IVMEP:
    """The IVM engine: the posterior after k inclusions, Algorithm 1's selection and the
    refinement of the active set (Lawrence, Seeger & Herbrich, *Fast sparse Gaussian process
    methods: the informative vector machine*; Seeger, *Notes on Minka's Expectation
    Propagation for Gaussian process classification*, §2.1-2.3).

    :meth:`run` does what :class:`~fastep._epcore.ivm_refine.IVMOptions` asks: the selection
    of ``d`` points, then the refinement stages; the steps are methods too (``score``,
    ``include_point``, ``select``, ``refine``, ``exchange``, ``refactorize``).

    Parameters
    ----------
    y : (n,) float64
        Targets as the likelihood expects them (checked against its support).
    spec : SiteSpec
        Likelihood (``Likelihood.site_spec()``); the Gaussian code is treated as the
        spherical fixed-precision model.
    diag_k : (n,) float64
        ``diag K``, all > 0: the prior variances (ς₀, Algorithm 1).
    options : IVMOptions or int
        The engine's options; ``options.d`` (1 <= d <= n) is the capacity of the active set
        (d_max: rows allocated for M and L). An int d stands for ``IVMOptions(d)`` (entropy
        criterion, no refinement).
    sigma2 : float >= 0, default 0
        Extra variance added to every cavity variance handed to the site kernel.

    Attributes (read-only numpy views of the engine's arrays, see ``ivm.pxd``)
    -------------------------------------------------------------------------
    options; n, d_max, n_active; criterion, sigma2; active (inclusion order), M (k x n),
    L (k x k), post_var, post_mean, g, nu, score, site_mean, site_precision (n),
    chosen_score (k): the criterion value of each point when it was included;
    n_deferred: the number of inactive points whose g, ν the last scoring pass did not need
    (entropy with probit sites; computed when ``g``, ``nu`` or ``score_values`` are read).
    """

    def __init__(self, y, SiteSpec spec not None, diag_k, options, double sigma2=0.0):
        cdef IVMOptions opts = options if isinstance(options, IVMOptions) else IVMOptions(options)
        cdef int d_max = opts.d
        y_arr = _as_vector("y", y)
        cdef int n = y_arr.shape[0]
        if n < 1:
            raise ValueError("y must hold at least one target")
        diag = _as_vector("diag_k", diag_k, n)
        bad = np.flatnonzero(~(diag > 0))
        if bad.size:
            raise ValueError(f"diag_k (the kernel diagonal) must be > 0 everywhere; "
                             f"diag_k[{bad[0]}] = {diag[bad[0]]!r}")
        if not d_max <= n:
            raise ValueError(f"the active set size d (d_max) must be in [1, n] = [1, {n}]; got {d_max}")
        if not (sigma2 >= 0.0 and isfinite(sigma2)):
            raise ValueError(f"sigma2 must be finite and >= 0; got {sigma2!r}")
        _check_targets(spec, y_arr, diag, sigma2)
        self.options = opts
        self.spec = spec
        self.sigma2 = sigma2
        self.criterion = opts.criterion
        self.rng_state = opts.seed
        self._y = y_arr
        self._diag = diag
        self._M = np.zeros((d_max, n))
        self._L = np.zeros((d_max, d_max))
        self._var = diag.copy()
        self._mean = np.zeros(n)
        self._g = np.zeros(n)
        self._nu = np.zeros(n)
        self._score = np.full(n, np.nan)
        self._site_mean = np.zeros(n)
        self._site_prec = np.zeros(n)
        self._active = np.full(d_max, -1, dtype=np.intc)
        self._is_active = np.zeros(n, dtype=np.uint8)
        self._work = np.empty(n + d_max)
        self._chosen = np.full(d_max, np.nan)
        self._prod = np.full(n, np.nan)
        self._bound = np.empty(n)
        self._pending = np.zeros(n, dtype=np.uint8)
        self._snap_var = np.empty(n)
        self._snap_mean = np.empty(n)
        self._lazy_scores = False
        self._lazy_moments = False
        self._rows = KernelRows()
        self.a.n = n
        self.a.d_max = d_max
        self.a.k = 0
        self.a.M = _ptr(self._M.reshape(-1))
        self.a.L = _ptr(self._L.reshape(-1))
        self.a.post_var = _ptr(self._var)
        self.a.post_mean = _ptr(self._mean)
        self.a.g = _ptr(self._g)
        self.a.nu = _ptr(self._nu)
        self.a.score = _ptr(self._score)
        self.a.site_mean = _ptr(self._site_mean)
        self.a.site_precision = _ptr(self._site_prec)
        self.a.diag_k = _cptr(self._diag)
        self.a.active = _iptr(self._active)
        self.a.is_active = _bptr(self._is_active)
        self.a.chosen = _ptr(self._chosen)
        self.y_ptr = _cptr(self._y)
        self.t.model = &self.spec.model
        self.t.y = self.y_ptr
        self.t.sigma2 = sigma2
        self.work_ptr = _ptr(self._work)
        self.post_var = _readonly(self._var)
        self.post_mean = _readonly(self._mean)
        self.site_mean = _readonly(self._site_mean)
        self.site_precision = _readonly(self._site_prec)
        self.is_active = _readonly(self._is_active.view(np.bool_))
        self.diag_k = _readonly(self._diag)
        self.y = _readonly(self._y)

    # -- steps ----------------------------------------------------------------------------
    def score(self):
        """Score every inactive point at the current posterior; return the chosen index.

        Fills ``g``, ``nu`` and ``score_values``.  Raises RuntimeError when no inactive
        point is eligible (every site failed, or ν ς >= 1, or ν <= 0, or ς <= 0).
        """
        return self._score_all()

    cdef int _score_all(self) except -2:
        """The fused scoring pass (g and ν without log Z; entropy and random ranked by ν ς,
        the scores filled in only when read; entropy with probit sites through the ν bound,
        g and ν of most points computed only when read)."""
        cdef int best = -1, status, skipped = 0
        cdef double* prod = _ptr(self._prod)
        cdef double* bound = _ptr(self._bound)
        cdef unsigned char* pending = _bptr(self._pending)
        cdef double* snap_var = _ptr(self._snap_var)
        cdef double* snap_mean = _ptr(self._snap_mean)
        cdef _Lik lik
        _prepare(&self.spec.model, &lik)
        self._lazy_moments = self.criterion == CRITERION_ENTROPY and lik.code == LIK_PROBIT
        with nogil:
            if self._lazy_moments:
                status = _score_entropy_probit(&self.spec.model, &lik, self.y_ptr, &self.a, self.sigma2,
                                               prod, bound, pending, snap_var, snap_mean, &best,
                                               &skipped)
            else:
                status = _score_pass(&self.spec.model, self.y_ptr, &self.a, self.sigma2,
                                     self.criterion, prod, &self.rng_state, &best)
        self._lazy_scores = self.criterion != CRITERION_INFO_GAIN
        self.n_deferred = skipped
        if status != IVM_OK:
            raise RuntimeError(_no_candidate_message(self.a.k))
        return best

    def score_per_site(self):
        """``score`` through the per-site nogil pass ``ivm_score`` only (the cross-check: one
        ``site_moments`` call, log Z included, and one criterion evaluation per point)."""
        cdef int best = -1, status
        with nogil:
            status = ivm_score(&self.spec.model, self.y_ptr, &self.a, self.sigma2,
                               self.criterion, &self.rng_state, &best)
        self._lazy_scores = False
        self._lazy_moments = False
        self.n_deferred = 0
        if status != IVM_OK:
            raise RuntimeError(_no_candidate_message(self.a.k))
        return best

    cdef void _fill_moments(self):
        """g, ν and ν ς of the points the last (pruned) pass left out, at their μ, ς then."""
        cdef _Lik lik
        cdef _Pick pk
        cdef double* prod = _ptr(self._prod)
        cdef const unsigned char* pending = _bptr(self._pending)
        cdef const double* snap_var = _cptr(self._snap_var)
        cdef const double* snap_mean = _cptr(self._snap_mean)
        if not self._lazy_moments:
            return
        _prepare(&self.spec.model, &lik)
        _pick_init(&pk)
        with nogil:
            _moments_blocked(&self.spec.model, &lik, self.y_ptr, &self.a, snap_var, snap_mean, pending,
                             self.sigma2, CRITERION_ENTROPY, prod, &pk)
        self._pending[:] = 0
        self._lazy_moments = False

    cdef void _fill_scores(self):
        """Scores of the inactive points from ν ς after an entropy / random pass (eq 26)."""
        cdef int i
        cdef const double* prod = _cptr(self._prod)
        self._fill_moments()
        if not self._lazy_scores:
            return
        with nogil:
            for i in range(self.a.n):
                if not self.a.is_active[i]:
                    self.a.score[i] = _entropy_score(prod[i]) if prod[i] > -INFINITY else -INFINITY
        self._lazy_scores = False

    def include_point(self, int point, column):
        """Include ``point`` given its kernel column ``K[:, point]`` (length n, finite)."""
        col = np.ascontiguousarray(column, dtype=np.float64)
        if col.ndim != 1 or col.shape[0] != self.a.n:
            raise ValueError(f"column must be a vector of length n = {self.a.n}; got shape {col.shape}")
        self._include(point, col, False)

    cdef _include(self, int point, col, bint record_score):
        """Include ``point``; ``chosen_score`` gets its score from the last pass if
        ``record_score`` (``select``), NaN otherwise (``include_point``)."""
        cdef const double[::1] cv = col
        cdef int status, k = self.a.k
        cdef double chosen_score = np.nan
        if 0 <= point < self.a.n and not self.a.is_active[point]:
            if self._lazy_moments and self._pending[point]:
                self._fill_moments()                    # a point the last pass did not compute
            if self._lazy_scores:
                p = self._prod[point]
                self._score[point] = _entropy_score(p) if p > -INFINITY else -INFINITY
            if record_score:
                chosen_score = self._score[point]
        with nogil:
            status = ivm_include(&self.spec.model, self.y_ptr, &self.a, self.sigma2, point,
                                 &cv[0], self.work_ptr)
        if status == IVM_OK or status == IVM_NEGATIVE_VARIANCE:
            self._chosen[k] = chosen_score
        if status == IVM_OK:
            return
        if status == IVM_FULL:
            raise ValueError(f"the active set is full (d_max = {self.a.d_max})")
        if status == IVM_BAD_POINT:
            if not 0 <= point < self.a.n:
                raise ValueError(f"point must be in [0, {self.a.n}); got {point}")
            if self._is_active[point]:
                raise ValueError(f"point {point} is already active")
            raise ValueError(f"point {point} cannot be included: its site update is not proper "
                             f"(posterior variance {self._var[point]!r}, site kernel failure, "
                             "ν <= 0 or ν ς >= 1)")
        if status == IVM_BAD_COLUMN:
            bad = int(np.flatnonzero(~np.isfinite(col))[0])
            raise ValueError(f"column must be finite; column[{bad}] = {col[bad]!r}")
        bad = int(np.argmin(self._var / self._diag))
        raise np.linalg.LinAlgError(
            f"posterior variance ς[{bad}] = {self._var[bad]!r} < 0 after including point {point}: "
            "the kernel matrix is not positive semi-definite (add a White term or jitter)")

    def select(self, int n_points, column_fn):
        """Run ``n_points`` steps of Algorithm 1: score, then include the winner.

        ``column_fn(point)`` must return ``K[:, point]`` (length n); it is the only
        Python call per inclusion.  Returns the indices included by this call.
        """
        if n_points < 0 or self.a.k + n_points > self.a.d_max:
            raise ValueError(f"n_points must be in [0, d_max - n_active] = [0, "
                             f"{self.a.d_max - self.a.k}]; got {n_points}")
        cdef int step, best, start = self.a.k
        for step in range(n_points):
            best = self._score_all()
            self._include(best, fetch_column(column_fn, best, self.a.n, False), True)
        return self._active[start:self.a.k].astype(np.intp)

    def run(self, column_fn, callback=None):
        """Algorithm 1 up to ``options.d`` points, then the refinement stages the options ask for.

        Selection (Lawrence, Seeger & Herbrich, Algorithm 1): score every inactive point
        (eqs 14-26) and include the best (eqs 22-30) until the active set holds ``d`` points.
        Refinement on the fixed-size active set (Seeger's notes §2.1, §2.3): with
        ``refine_sweeps`` > 0, EP deletion-inclusion sweeps ('ep'); with ``exchange``,
        exchange moves ('exchange'); when both are asked for and a move was made, the EP
        sweeps again ('ep_after_exchange'), since the entering points carry ADF sites.

        Parameters
        ----------
        column_fn : callable
            ``column_fn(point) -> K[:, point]`` (length n): one call per inclusion, per
            entering point of an exchange, and once per active point for the rows K[I, :]
            the refinement keeps (fetched again only if ``column_fn`` is another object).
        callback : callable, optional
            ``callback(sweep, max_change, log_z)`` after every EP sweep (``log_z``: eq 32
            at the sites after it), with the GIL, between sweeps. Returning False stops the
            sweeps (the state is rebuilt from the current sites) and the refinement.

        Returns
        -------
        IVMResult
            ``n_active``, ``log_z`` (eq 32 at the end) and the stage reports.

        Raises
        ------
        TypeError
            ``column_fn`` is not callable.
        RuntimeError
            No inactive point can be included, or an exchange breaks down numerically.
        numpy.linalg.LinAlgError
            The kernel is not positive semi-definite.
        KeyboardInterrupt
            Ctrl-C during an EP sweep (polled between sites): that stage's sites are restored.
        """
        check_column_fn(column_fn)
        if self.options.d > self.a.k:
            self.select(self.options.d - self.a.k, column_fn)
        return refine_stages(&self.a, &self.t, self._rows, column_fn, self.options, callback)

    # -- derived quantities -----------------------------------------------------------------
    def weights(self):
        """Prediction weights ``w = (K_I + B_I⁻¹)⁻¹ m_I`` (active order), Seeger §2.2."""
        if self.a.k == 0:
            return np.zeros(0)
        idx = self.active
        return active_set_evidence(self.L, self._site_mean[idx], self._site_prec[idx])[1]

    def log_likelihood(self):
        """Approximate log likelihood of the active set, ``log N(m_I; 0, K_I + B_I⁻¹)`` (eq 32;
        the ``log_z`` of the run's results)."""
        cdef double[::1] t = np.empty(max(self.a.k, 1))
        return active_log_z(&self.a, &t[0])

    # -- refinement on a fixed-size active set (Seeger's notes §2.1, §2.3; ivm_refine.pyx) ----
    def entropy_reduction(self):
        """The entropy criterion of the active set: ``H(prior) - H(q) = ½ log|I + B_I^½ K_I B_I^½|``.

        Equals ``Σ_r log L_rr`` and, after Algorithm 1 alone, the sum of the entropy
        reductions of the inclusions (eq 26, Seeger eq 4).  Exchange moves (``exchange``)
        only ever increase it.
        """
        k = self.a.k
        if k == 0:
            return 0.0
        return float(np.sum(np.log(np.diag(self._L[:k, :k]))))

    def refactorize(self, column_fn):
        """Rebuild L, M, ς and μ of all n points from the site parameters and K[I, :].

        ``L = chol(I + B_I^½ K_I B_I^½)``, ``M = L⁻¹ B_I^½ K[I, :]``, ``ς = diag K - colsum(M²)``
        (eq 29), ``μ = Mᵀ L⁻¹ B_I^½ m_I`` (Seeger §2.1-2.2). O(k² n) with k kernel columns
        (fetched through ``column_fn`` unless cached by an earlier refinement call with the
        same ``column_fn``). After Algorithm 1 this changes the state only by rounding.
        """
        refactorize(&self.a, self._rows, column_fn)

    def refine(self, column_fn, n_sweeps=1, tol=1e-9, refactor_every=1, callback=None):
        """EP deletion-inclusion sweeps over the active set (Seeger's notes §2.1, steps 1-3:
        cavity from the marginal, moment matching with the site kernel at the cavity plus
        ``sigma2`` (eq 5), eq (7) and the h update on Σ[I, I] and μ_I; ivm_refine.pyx); the
        'ep' stages of :meth:`run`. The active set and its order never change.

        Parameters
        ----------
        column_fn : callable
            ``column_fn(point) -> K[:, point]`` (as for ``select``); called once per active
            point whose kernel row is not cached yet.
        n_sweeps : int >= 0, default 1
            Maximum number of sweeps; the loop stops early at convergence.
        tol : float >= 0, default 1e-9
            A site whose parameters would change by at most ``tol``, ``max(|Δβ|/β, |Δm| β^½)``
            (relative precision change; mean change in site standard deviations), is skipped.
            The sweeps have converged when a sweep skips every site and rejects none.
        refactor_every : int >= 1, default 1
            Rebuild Σ[I, I] and μ_I from the site parameters (O(k³)) after every
            ``refactor_every`` sweeps. L, M and the marginals ς, μ of all n points are
            always rebuilt from the sites at the end (O(k² n), ``refactorize``).
        callback : callable, optional
            ``callback(sweep, max_change, log_z)`` after every sweep, as for :meth:`run`.

        Returns
        -------
        RefineResult

        Raises ValueError (naming the argument, state unchanged) for bad arguments,
        LinAlgError when a refactorisation fails (kernel not PSD). On Ctrl-C (polled
        between sites), an exception raised by ``callback`` or a refactorisation that fails
        between sweeps the state is restored before the exception is raised.
        """
        check_column_fn(column_fn)
        cdef RefineSettings settings = check_refine_settings(n_sweeps, tol, refactor_every)
        return refine_sweeps(&self.a, &self.t, self._rows, column_fn, &settings, callback)

    def exchange_gains(self, column_fn):
        """The best exchange for every active slot: ``(partner, gain)`` arrays of length k.

        ``partner[r]`` is the inactive point with the largest entropy gain when it replaces
        ``active[r]`` (eqs 8-9 and eq 4, see ``exchange``), -1 if none is eligible. Rebuilds
        the state from the sites first (``refactorize``). For inspection and tests; O(k n)
        site-kernel calls.
        """
        return exchange_gains(&self.a, &self.t, self._rows, column_fn)

    def exchange(self, column_fn, mode="greedy", tol=1e-6, max_moves=None, seed=0, refactor_every=None):
        """Exchange moves on a fixed-size active set (Seeger's notes §2.3); the 'exchange'
        stage of :meth:`run`.

        A move removes an active point j and includes an inactive point i by ADF at the
        cavity ``q\\j`` (eqs 8-9), scored by the decrease of the posterior entropy (Seeger
        eq 4: the increase of ``entropy_reduction()``) and applied, if it gains more than
        ``tol``, by the 2x2 Woodbury update (O(k n) and one kernel column; ivm_refine.pyx);
        i takes the last slot, so ``active`` stays in order of entry. The search stops when
        no move gains more than ``tol`` (converged) or after ``max_moves`` moves.

        Parameters
        ----------
        column_fn : callable
            ``column_fn(point) -> K[:, point]``; called for each point that enters and for
            active points whose kernel row is not cached yet.
        mode : {'greedy', 'random'}, default 'greedy'
            'greedy': every move scores all k (n - k) pairs and applies the best one
            (ties: lowest slot, then lowest i). 'random': the active slots are visited in a
            seeded random order (splitmix64 Fisher-Yates); the first slot whose best partner
            gains more than ``tol`` is exchanged and a new random pass starts. Converged
            when a full pass finds no such slot, so both modes stop under the same condition.
        tol : float >= 0, default 1e-6
            Minimum gain (nats) of an applied move.
        max_moves : int >= 0 or None
            Maximum number of moves; None means k.
        seed : int >= 0, default 0
            Seed of the random mode.
        refactor_every : int >= 1 or None
            Rebuild Σ[I, :], ς and μ from the site parameters (O(k² n)) after this many
            moves; None means k. L, M, ς and μ are always rebuilt at the end.

        Returns
        -------
        ExchangeResult

        Raises ValueError (naming the argument, state unchanged) for bad arguments.
        """
        check_column_fn(column_fn)
        cdef ExchangeSettings settings = check_exchange_settings(self.a.k, mode, tol, max_moves, seed,
                                                                 refactor_every)
        return exchange_moves(&self.a, &self.t, self._rows, column_fn, &settings)

    # -- read-only views ----------------------------------------------------------------------
    @property
    def n(self):
        return self.a.n

    @property
    def d_max(self):
        return self.a.d_max

    @property
    def n_active(self):
        return self.a.k

    @property
    def active(self):
        """Active indices in inclusion order (a copy, intp)."""
        return self._active[:self.a.k].astype(np.intp)

    @property
    def M(self):
        return _readonly(self._M[:self.a.k])

    @property
    def L(self):
        return _readonly(self._L[:self.a.k, :self.a.k])

    @property
    def g(self):
        """g = ∂ log Z/∂μ of every inactive point at the last scoring pass (NaN where the site
        kernel failed); for an active point, at its inclusion (or last EP update)."""
        self._fill_moments()
        return _readonly(self._g)

    @property
    def nu(self):
        """ν = -∂² log Z/∂μ², as ``g``."""
        self._fill_moments()
        return _readonly(self._nu)

    @property
    def score_values(self):
        """The criterion of every inactive point at the last scoring pass (-inf: not
        eligible); for an active point, its score when it was included."""
        self._fill_scores()
        return _readonly(self._score)

    @property
    def chosen_score(self):
        return _readonly(self._chosen[:self.a.k])

def _no_candidate_message(int k):
    return (f"no inactive point can be included after {k} inclusions: every remaining site "
            "failed or would not give a proper, informative update (ν <= 0, ν ς >= 1 or ς <= 0)")


def _check_targets(SiteSpec spec, const double[::1] y, const double[::1] diag, double sigma2):
    """ValueError naming the first target the likelihood rejects (prior cavity N(0, K_ii + sigma2))."""
    cdef int i, n = y.shape[0], bad = -1, status = SITE_OK
    cdef double log_z, alpha, beta
    with nogil:
        for i in range(n):
            status = site_moments(&spec.model, y[i], 0.0, diag[i] + sigma2, &log_z, &alpha, &beta)
            if status != SITE_OK:
                bad = i
                break
    if bad >= 0:
        from fastep._epcore.sites import status_message
        raise ValueError(f"y[{bad}] = {y[bad]!r} is rejected by the likelihood at the prior: "
                         f"{status_message(status)}")


# The data pointers of C-contiguous 1-D arrays (writable, except for _cptr).
cdef double* _ptr(double[::1] v):
    return &v[0]


cdef const double* _cptr(const double[::1] v):
    return &v[0]


cdef int* _iptr(int[::1] v):
    return &v[0]


cdef unsigned char* _bptr(unsigned char[::1] v):
    return &v[0]


#: The engine's former names: ``{former: current}``; a former name still reads, with a
#: ``FutureWarning``, until the next release.
_RENAMED = {"IVMState": "IVMEP"}


def __getattr__(name):
    return former_name(globals(), _RENAMED, name)
