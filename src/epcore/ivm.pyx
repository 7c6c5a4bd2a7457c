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
1. **Score every inactive point** (one compiled pass, ``ivm_score``).  The site
   kernel (``sites.site_moments``) gives at the cavity ``N(μ_n, ς_n + sigma2)``

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
   and ties go to the lowest index.  ``IVMState.score`` runs the site kernels
   through ``sites.site_moments_array`` (the staged, vectorisable site loop; about
   2x faster than one ``site_moments`` call per point at n = 7291; active points
   get a dummy proper cavity) and then ``ivm_pick``; if any site fails there it
   falls back to ``ivm_score`` (one ``site_moments`` call per inactive point,
   failing sites simply ineligible).  Both give bitwise the same scores.
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

What the rest of fastep uses (and later refinement/exchange code can build on)
------------------------------------------------------------------------------
* approximate log likelihood (eq 32) ``log N(m_I; 0, K_I + B_I⁻¹)``: with
  ``K_I + B_I⁻¹ = B_I^{-½} L Lᵀ B_I^{-½}`` it is
  ``-½ |L⁻¹ B_I^½ m_I|² - Σ log L_ii + ½ Σ log β_i - (k/2) log 2π``
  (``IVMState.log_likelihood``);
* prediction weights ``w = (K_I + B_I⁻¹)⁻¹ m_I = B_I^½ L⁻ᵀ L⁻¹ B_I^½ m_I`` and
  ``σ*² = k** - |L⁻¹ B_I^½ k*|²`` (``IVMState.weights``; Seeger §2.2).
"""
import numpy as np

from libc.math cimport sqrt, log, log1p, isfinite, INFINITY
from fastep._epcore._blas cimport dcopy, gemv_t
from fastep._epcore.sites cimport SiteModel, SiteSpec, site_moments, SITE_OK, LIK_GAUSSIAN
from fastep._epcore.gp_ep cimport splitmix64_next
from fastep._epcore.sites import site_moments_array as _site_moments_array

# Module-level integer constants (CRITERION_*, IVM_*) for Python callers.
for _enum_class in (IVMCriterion, IVMStatus):
    for _member in _enum_class:
        globals()[_member.name] = int(_member)
del _enum_class, _member

CRITERIA = {"entropy": int(CRITERION_ENTROPY), "info_gain": int(CRITERION_INFO_GAIN), "random": int(CRITERION_RANDOM)}

# A posterior variance below -this * K_ii after an update means K is not PSD.
cdef double _NEGATIVE_VARIANCE_RTOL = 1e-8


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


cdef inline double _log1m(double x) noexcept nogil:
    """log(1 - x) for x < 1."""
    if x < 0.5:
        return log1p(-x)
    return log(1.0 - x)


cdef inline double _criterion(int criterion, double var, double g, double nu) noexcept nogil:
    """Score of an eligible point (entropy reduction eq 26, or the information gain)."""
    cdef double prod = var * nu
    cdef double lg = _log1m(prod)
    if criterion == CRITERION_INFO_GAIN:
        return 0.5 * (g * g * var - prod - lg)
    return -0.5 * lg


cdef inline int _finish_pick(IVMArrays* s, int criterion, unsigned long long* rng_state,
                             int n_eligible, int chosen, int* best) noexcept nogil:
    """Random criterion: replace ``chosen`` by a uniformly drawn eligible point."""
    cdef int i, r
    if n_eligible == 0:
        best[0] = -1
        return IVM_NO_CANDIDATE
    if criterion == CRITERION_RANDOM:
        r = <int>(splitmix64_next(rng_state) % <unsigned long long>n_eligible)
        for i in range(s.n):
            if not s.is_active[i] and s.score[i] > -INFINITY:
                if r == 0:
                    chosen = i
                    break
                r -= 1
    best[0] = chosen
    return IVM_OK


cdef int ivm_score(const SiteModel* model, const double* y, IVMArrays* s, double sigma2,
                   int criterion, unsigned long long* rng_state, int* best) noexcept nogil:
    """Score every inactive point (fills g, nu, score; ineligible points score -inf).

    ``best`` receives the chosen point: the highest score, lowest index among ties
    (random criterion: a uniformly drawn eligible point).  Returns IVM_OK or
    IVM_NO_CANDIDATE.  One ``site_moments`` call per inactive point.
    """
    cdef int i, n = s.n, chosen = -1, n_eligible = 0
    cdef double gi = 0.0, nui = 0.0, var, sc, best_score = -INFINITY
    for i in range(n):
        if s.is_active[i]:
            continue
        var = s.post_var[i]
        if not _moments(model, y[i], s.post_mean[i], var, sigma2, &gi, &nui):
            s.g[i] = gi
            s.nu[i] = nui
            s.score[i] = -INFINITY
            continue
        n_eligible += 1
        sc = _criterion(criterion, var, gi, nui)
        s.g[i] = gi
        s.nu[i] = nui
        s.score[i] = sc
        if sc > best_score:
            best_score = sc
            chosen = i
    return _finish_pick(s, criterion, rng_state, n_eligible, chosen, best)


cdef int ivm_pick(IVMArrays* s, const double* g_all, const double* nu_all, int criterion,
                  unsigned long long* rng_state, int* best) noexcept nogil:
    """As ``ivm_score``, from site moments g_all, nu_all already computed for every point
    (all site kernels succeeded): the eligibility test, the scores and the choice."""
    cdef int i, n = s.n, chosen = -1, n_eligible = 0
    cdef double gi, nui, var, sc, best_score = -INFINITY
    for i in range(n):
        if s.is_active[i]:
            continue
        var = s.post_var[i]
        gi = g_all[i]
        nui = nu_all[i]
        s.g[i] = gi
        s.nu[i] = nui
        if not (var > 0.0 and nui > 0.0 and var * nui < 1.0):
            s.score[i] = -INFINITY
            continue
        n_eligible += 1
        sc = _criterion(criterion, var, gi, nui)
        s.score[i] = sc
        if sc > best_score:
            best_score = sc
            chosen = i
    return _finish_pick(s, criterion, rng_state, n_eligible, chosen, best)


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
    cdef bint finite = True
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
    # eqs 27-28 and the new row of M
    sq_nu = sqrt(nu)
    row = s.M + <Py_ssize_t>k * nn
    for i in range(nn):
        si = col[i]
        pv[i] -= nu * si * si
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
    for i in range(nn):
        if pv[i] < -_NEGATIVE_VARIANCE_RTOL * s.diag_k[i]:
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


cdef class IVMState:
    """The IVM posterior after k inclusions, with Algorithm 1's selection and inclusion steps.

    Parameters
    ----------
    y : (n,) float64
        Targets as the likelihood expects them (checked against its support).
    spec : SiteSpec
        Likelihood (``Likelihood.site_spec()``); the Gaussian code is treated as the
        spherical fixed-precision model.
    diag_k : (n,) float64
        ``diag K``, all > 0: the prior variances (ς₀, Algorithm 1).
    d_max : int, 1 <= d_max <= n
        Capacity of the active set (rows allocated for M and L).
    sigma2 : float >= 0, default 0
        Extra variance added to every cavity variance handed to the site kernel.
    criterion : CRITERION_ENTROPY (default), CRITERION_INFO_GAIN or CRITERION_RANDOM
    seed : int >= 0
        Seed of the random criterion.

    Attributes (read-only numpy views of the engine's arrays, see ``ivm.pxd``)
    -------------------------------------------------------------------------
    n, d_max, n_active; active (inclusion order), M (k x n), L (k x k),
    post_var, post_mean, g, nu, score, site_mean, site_precision (n),
    chosen_score (k): the criterion value of each point when it was included.
    """
    cdef IVMArrays a
    cdef SiteSpec spec
    cdef readonly double sigma2
    cdef readonly int criterion
    cdef unsigned long long rng_state
    cdef const double* y_ptr
    cdef double* work_ptr
    cdef object _y, _diag, _M, _L, _var, _mean, _g, _nu, _score, _site_mean, _site_prec
    cdef object _active, _is_active, _work, _chosen, _cav_var, _log_z_all, _g_all, _nu_all

    def __init__(self, y, SiteSpec spec not None, diag_k, int d_max, double sigma2=0.0,
                 int criterion=CRITERION_ENTROPY, unsigned long long seed=0):
        y_arr = _as_vector("y", y)
        cdef int n = y_arr.shape[0]
        if n < 1:
            raise ValueError("y must hold at least one target")
        diag = _as_vector("diag_k", diag_k, n)
        bad = np.flatnonzero(~(diag > 0))
        if bad.size:
            raise ValueError(f"diag_k (the kernel diagonal) must be > 0 everywhere; "
                             f"diag_k[{bad[0]}] = {diag[bad[0]]!r}")
        if not 1 <= d_max <= n:
            raise ValueError(f"d_max must be in [1, n] = [1, {n}]; got {d_max}")
        if not (sigma2 >= 0.0 and isfinite(sigma2)):
            raise ValueError(f"sigma2 must be finite and >= 0; got {sigma2!r}")
        if criterion not in (CRITERION_ENTROPY, CRITERION_INFO_GAIN, CRITERION_RANDOM):
            raise ValueError("criterion must be CRITERION_ENTROPY (0), CRITERION_INFO_GAIN (1) or "
                             f"CRITERION_RANDOM (2); got {criterion}")
        _check_targets(spec, y_arr, diag, sigma2)
        self.spec = spec
        self.sigma2 = sigma2
        self.criterion = criterion
        self.rng_state = seed
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
        self._cav_var = np.empty(n)
        self._log_z_all = np.empty(n)
        self._g_all = np.empty(n)
        self._nu_all = np.empty(n)
        self.a.n = n
        self.a.d_max = d_max
        self.a.k = 0
        self.a.M = _ptr2(self._M)
        self.a.L = _ptr2(self._L)
        self.a.post_var = _ptr(self._var)
        self.a.post_mean = _ptr(self._mean)
        self.a.g = _ptr(self._g)
        self.a.nu = _ptr(self._nu)
        self.a.score = _ptr(self._score)
        self.a.site_mean = _ptr(self._site_mean)
        self.a.site_precision = _ptr(self._site_prec)
        self.a.diag_k = _ptr(self._diag)
        self.a.active = _iptr(self._active)
        self.a.is_active = _bptr(self._is_active)
        self.y_ptr = _cptr(self._y)
        self.work_ptr = _ptr(self._work)

    # -- steps ----------------------------------------------------------------------------
    def score(self):
        """Score every inactive point at the current posterior; return the chosen index.

        Fills ``g``, ``nu`` and ``score_values``.  Raises RuntimeError when no inactive
        point is eligible (every site failed, or ν ς >= 1, or ν <= 0, or ς <= 0).
        """
        return self._score_all()

    cdef int _score_all(self) except -2:
        """The scoring pass: the staged site loop of ``sites.site_moments_array`` over all
        n points (active points get a dummy proper cavity), then ``ivm_pick``; if any
        site fails there, the per-site ``ivm_score`` (which skips failing sites)."""
        cdef int best = -1, status, i
        cdef double* cav = _ptr(self._cav_var)
        cdef const double* var = self.a.post_var
        cdef unsigned char* act = self.a.is_active
        cdef double s2 = self.sigma2
        with nogil:
            for i in range(self.a.n):
                cav[i] = 1.0 if act[i] else var[i] + s2
        try:
            _site_moments_array(self.spec, self._y, self._mean, self._cav_var,
                                self._log_z_all, self._g_all, self._nu_all)
            fast = True
        except ValueError:
            fast = False
        cdef const double* g_all = _cptr(self._g_all)
        cdef const double* nu_all = _cptr(self._nu_all)
        if fast:
            with nogil:
                status = ivm_pick(&self.a, g_all, nu_all, self.criterion, &self.rng_state, &best)
        else:
            with nogil:
                status = ivm_score(&self.spec.model, self.y_ptr, &self.a, self.sigma2,
                                   self.criterion, &self.rng_state, &best)
        if status != IVM_OK:
            raise RuntimeError(_no_candidate_message(self.a.k))
        return best

    def score_per_site(self):
        """``score`` through the per-site nogil pass ``ivm_score`` only (the cross-check)."""
        cdef int best = -1, status
        with nogil:
            status = ivm_score(&self.spec.model, self.y_ptr, &self.a, self.sigma2,
                               self.criterion, &self.rng_state, &best)
        if status != IVM_OK:
            raise RuntimeError(_no_candidate_message(self.a.k))
        return best

    def include_point(self, int point, column):
        """Include ``point`` given its kernel column ``K[:, point]`` (length n, finite)."""
        col = np.ascontiguousarray(column, dtype=np.float64)
        if col.ndim != 1 or col.shape[0] != self.a.n:
            raise ValueError(f"column must be a vector of length n = {self.a.n}; got shape {col.shape}")
        self._include(point, col, np.nan)

    cdef _include(self, int point, col, double chosen_score):
        cdef const double[::1] cv = col
        cdef int status, k = self.a.k
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
            col = np.ascontiguousarray(column_fn(best), dtype=np.float64)
            if col.ndim != 1 or col.shape[0] != self.a.n:
                raise ValueError(f"column_fn({best}) must return a vector of length n = {self.a.n}; "
                                 f"got shape {col.shape}")
            self._include(best, col, self._score[best])
        return self._active[start:self.a.k].astype(np.intp)

    # -- derived quantities -----------------------------------------------------------------
    def weights(self):
        """Prediction weights ``w = (K_I + B_I⁻¹)⁻¹ m_I`` (active order), Seeger §2.2."""
        from scipy.linalg import solve_triangular
        k = self.a.k
        if k == 0:
            return np.zeros(0)
        idx = self.active
        sb = np.sqrt(self._site_prec[idx])
        L = self.L
        t = solve_triangular(L, sb * self._site_mean[idx], lower=True)
        return sb * solve_triangular(L, t, lower=True, trans="T")

    def log_likelihood(self):
        """Approximate log likelihood of the active set, ``log N(m_I; 0, K_I + B_I⁻¹)`` (eq 32)."""
        from scipy.linalg import solve_triangular
        k = self.a.k
        if k == 0:
            return 0.0
        idx = self.active
        beta = self._site_prec[idx]
        L = self.L
        t = solve_triangular(L, np.sqrt(beta) * self._site_mean[idx], lower=True)
        return float(-0.5 * (t @ t) - np.sum(np.log(np.diag(L))) + 0.5 * np.sum(np.log(beta))
                     - 0.5 * k * np.log(2.0 * np.pi))

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
    def post_var(self):
        return _readonly(self._var)

    @property
    def post_mean(self):
        return _readonly(self._mean)

    @property
    def g(self):
        return _readonly(self._g)

    @property
    def nu(self):
        return _readonly(self._nu)

    @property
    def score_values(self):
        return _readonly(self._score)

    @property
    def site_mean(self):
        return _readonly(self._site_mean)

    @property
    def site_precision(self):
        return _readonly(self._site_prec)

    @property
    def chosen_score(self):
        return _readonly(self._chosen[:self.a.k])

    @property
    def is_active(self):
        return _readonly(self._is_active.view(np.bool_))

    @property
    def diag_k(self):
        return _readonly(self._diag)

    @property
    def y(self):
        return _readonly(self._y)


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


cdef double* _ptr(arr):
    cdef double[::1] v = arr
    return &v[0]


cdef const double* _cptr(arr):
    cdef const double[::1] v = arr
    return &v[0]


cdef double* _ptr2(arr):
    cdef double[:, ::1] v = arr
    return &v[0, 0]


cdef int* _iptr(arr):
    cdef int[::1] v = arr
    return &v[0]


cdef unsigned char* _bptr(arr):
    cdef unsigned char[::1] v = arr
    return &v[0]


# --------------------------------------------------------------------------- #
# benchmark yardstick
# --------------------------------------------------------------------------- #

from fastep._epcore._blas cimport trsv


def bare_blas_selection(const double[:, ::1] M, const double[:, ::1] L, const int[::1] points,
                        bint solves=True):
    """The BLAS work of a d-point selection and nothing else (benchmarks only).

    For k = 0..d-1 (d = len(points)): gather ``a = M[:k, points[k]]``, ``s = -M[:k]ᵀ a``
    (the M reads of eq 30, one gemv) and, with ``solves``, the Cholesky row-append
    solve ``L[:k, :k]⁻¹ a`` (one trsv; the engine obtains that row from M without it).
    ``M`` is (>= d) x n, ``L`` (>= d) x (>= d) lower triangular with a nonzero diagonal.
    """
    cdef int d = points.shape[0], n = M.shape[1], ldl = L.shape[1], k, j
    if M.shape[0] < d or L.shape[0] < d or ldl < d:
        raise ValueError("M and L need at least len(points) rows (and L as many columns)")
    s_arr = np.empty(n)
    a_arr = np.empty(max(d, 1))
    cdef double[::1] s = s_arr
    cdef double[::1] a = a_arr
    with nogil:
        for k in range(d):
            for j in range(k):
                a[j] = M[j, points[k]]
            if k > 0:
                gemv_t(k, n, -1.0, &M[0, 0], n, &a[0], 0.0, &s[0])
                if solves:
                    trsv(True, False, k, &L[0, 0], ldl, &a[0])
