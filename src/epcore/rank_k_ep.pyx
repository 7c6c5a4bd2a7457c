# cython: language_level=3
"""Weight-space Gaussian EP with rank-k factors (Minka, "EP: a quick reference", §3).

Model
-----
Prior ``N(w; m0, V0)`` on ``w`` in R^d and n factors ``t_i(z_i)`` of k-dimensional
projections ``z_i = X_i^T w``.  The projections are stored as one C-contiguous
array ``X`` of shape (n, k, d) with ``X[i] = X_i^T`` so that ``z_i = X[i] @ w``.

Each site is a Gaussian in z_i kept in natural form (eq 98):

    site_i(z) = C_i exp(-1/2 z^T P_i z + b_i^T z),   P_i = v_i^{-1},  b_i = v_i^{-1} m_i,

so a site with a singular (e.g. zero, the initial value) precision is representable.
The posterior ``q(w) = N(m, V)`` satisfies the invariant (eqs 46-47 for rank k)

    V^{-1} = V0^{-1} + sum_i X_i P_i X_i^T,    m = V (V0^{-1} m0 + sum_i X_i b_i).

Per factor update (all k x k algebra except two BLAS-3 calls on d x k blocks)
-----------------------------------------------------------------------------
    U^T = X_i^T V (k x d),  S = X_i^T V X_i,  X_i^T m
    cavity (eqs 103, 106):  (I - S P_i) [Lambda_i | h_i] = [S | X_i^T m - S b_i]
    tilted moments (eqs 95-97, rank_k_sites): log Z_i, a_i = d log Z_i / d h, B_i = -d^2 log Z_i / dh dh^T
    new site (eqs 107-108, natural form, no inverse of B_i needed):
        P_new = (B_i^{-1} - Lambda_i)^{-1} = (I - B_i Lambda_i)^{-1} B_i
        b_new = P_new (h_i + B_i^{-1} a_i) = a_i + P_new (Lambda_i a_i + h_i)
    damping in natural parameters: dP = damping (P_new - P_i), db = damping (b_new - b_i)
    posterior (eqs 114/116 in Woodbury form):
        (I + dP S) [G | c] = [dP | db - dP X_i^T m],   V <- V - U G U^T,   m <- m + U c.

Policy for improper updates: the update of factor i is SKIPPED (site unchanged,
counted in ``n_skipped``) when its cavity is improper (``I - S P_i`` singular or
Lambda_i not positive definite), when the tilted moments are not finite, or when
the new site would make V non-positive-definite (checked exactly through
``X_i^T V_new X_i = S - S G S``, which is PD iff V_new is PD given V PD and
S PD).  Sites may therefore have indefinite precision, but V and every visited
cavity stay proper.

Log evidence (eqs 48-49 and 109-110 regrouped)
----------------------------------------------
With the site written as ``C_i exp(-1/2 z^T P_i z + b_i^T z)`` and ``C_i`` chosen so
that its integral against the cavity equals ``Z_i``,

    log Z_EP = 1/2 log(|V| / |V0|) + 1/2 (m^T V^{-1} m - m0^T V0^{-1} m0)
               + sum_i [log Z_i - log G_i],
    log G_i = log ∫ exp(-1/2 z^T P_i z + b_i^T z) N(z; h_i, Lambda_i) dz
            = -1/2 log|I + P_i Lambda_i| + h_i^T (I + P_i Lambda_i)^{-1} (b_i - 1/2 P_i h_i)
              + 1/2 t_i^T Lambda_i b_i,          t_i = (I + P_i Lambda_i)^{-1} b_i,

which stays finite for singular P_i and equals the literal eqs 48, 49, 109 when all
P_i are PD and the sites are at an EP fixed point.

Python API: ``RankKEP`` (one problem with its sites: ``run``, ``log_evidence``) and
``tilted_moments``; the likelihoods (``RankKLikelihood``) and their moment kernels are in
:mod:`fastep._epcore.rank_k_sites`.
"""
import numpy as np
from numpy.linalg import LinAlgError

from libc.math cimport log, fabs, isfinite

from fastep._epcore._blas cimport (
    LOWER, NO_TRANS, TRANS, RIGHT, blas_int, gemv, gemv_t, trsv, potrf, potri, symmetrize,
    gemm, symm, syr2k, lu_factor, lu_solve, lu_log_abs_det,
)
from fastep._epcore._common cimport SweepDriver, EngineOptions, SweepSettings
from fastep._epcore.rank_k_sites import MAX_QUADRATURE_POINTS
from fastep._epcore._common import former_name

__all__ = ["RankKLikelihood", "RankKEP", "RankKEPOptions", "tilted_moments", "MAX_QUADRATURE_POINTS"]

globals()["RankKLikelihood"] = RankKLikelihood     # defined in rank_k_sites, importable from here too

_IPIV_DTYPE = np.intc if sizeof(blas_int) == sizeof(int) else np.int64
# Factors per chunk in the refresh (bounds the scratch to CHUNK * k * d doubles).
cdef int REFRESH_CHUNK = 256


# ---------------------------------------------------------------------------
# Small helpers (k x k, row-major; the shared ones are in rank_k_sites.pxd)
# ---------------------------------------------------------------------------
cdef inline void _add_identity(int n, double* a) noexcept nogil:
    cdef int i
    for i in range(n):
        a[i * n + i] += 1.0


cdef inline void _solve_sym_rhs(int n, const double* lu, const blas_int* ipiv, const double* rhs,
                                double* out, double* col) noexcept nogil:
    """out = A^{-1} R for a symmetric right-hand side R (column c of R = row c), A from lu_factor."""
    cdef int c, j
    for c in range(n):
        for j in range(n):
            col[j] = rhs[c * n + j]
        lu_solve(n, lu, n, ipiv, col)
        for j in range(n):
            out[j * n + c] = col[j]


# ---------------------------------------------------------------------------
# Engine state and per-factor work
# ---------------------------------------------------------------------------
cdef struct Work:
    double* ut        # k x d: X_i^T V
    double* wt        # k x d: G X_i^T V
    double* s         # k x k: X_i^T V X_i
    double* lam       # k x k: cavity covariance
    double* lam_chol  # k x k
    double* hm        # k: X_i^T m
    double* h         # k: cavity mean
    double* lu        # k x k LU scratch
    double* a         # k
    double* b_mat     # k x k
    double* p_new     # k x k
    double* b_new     # k
    double* dp        # k x k
    double* db        # k
    double* g         # k x k
    double* c         # k
    double* tmp       # k x k
    double* vec       # k
    double* col       # k
    double* mwork     # 2 k^2 + 8 k
    blas_int* ipiv    # k
    int* iwork        # k


cdef int _work_doubles(int k, int d) noexcept nogil:
    return 2 * k * d + 9 * k * k + 9 * k + (2 * k * k + 8 * k)


cdef void _work_layout(Work* w, double* buf, blas_int* ipiv, int* iwork, int k, int d) noexcept nogil:
    cdef double* p = buf
    w.ut = p; p += k * d
    w.wt = p; p += k * d
    w.s = p; p += k * k
    w.lam = p; p += k * k
    w.lam_chol = p; p += k * k
    w.lu = p; p += k * k
    w.b_mat = p; p += k * k
    w.p_new = p; p += k * k
    w.dp = p; p += k * k
    w.g = p; p += k * k
    w.tmp = p; p += k * k
    w.hm = p; p += k
    w.h = p; p += k
    w.a = p; p += k
    w.b_new = p; p += k
    w.db = p; p += k
    w.c = p; p += k
    w.vec = p; p += k
    w.col = p; p += k
    p += k
    w.mwork = p
    w.ipiv = ipiv
    w.iwork = iwork


cdef inline bint _lu_shifted(int k, double alpha, const double* a, const double* b, Work* w) noexcept nogil:
    """LU-factor ``I + alpha A B`` (k x k) into ``w.lu``, ``w.ipiv``; False if it is singular."""
    gemm(NO_TRANS, NO_TRANS, k, k, k, alpha, a, k, b, k, 0.0, w.lu, k)
    _add_identity(k, w.lu)
    return lu_factor(k, w.lu, k, w.ipiv) == 0


cdef inline bint _solve_shifted(int k, double alpha, const double* a, const double* b, const double* rhs,
                                double* out, Work* w) noexcept nogil:
    """``out = (I + alpha A B)^{-1} R`` for a symmetric R, symmetrised; the LU stays in ``w.lu``.

    Returns False (``out`` untouched) if ``I + alpha A B`` is singular.
    """
    if not _lu_shifted(k, alpha, a, b, w):
        return False
    _solve_sym_rhs(k, w.lu, w.ipiv, rhs, out, w.col)
    sym_average(k, out)
    return True


cdef int _cavity(int k, int d, const double* x_i, const double* v, const double* m,
                 const double* p_site, const double* b_site, Work* w) noexcept nogil:
    """Projected cavity of factor i (eqs 103, 106) from the current V (lower triangle used), m.

    (I - S P_i) Lambda_i = S  and  (I - S P_i) h_i = X_i^T m - S b_i.
    """
    cdef int j
    symm(RIGHT, LOWER, k, d, 1.0, v, d, x_i, d, 0.0, w.ut, d)          # U^T = X_i^T V
    gemm(NO_TRANS, TRANS, k, k, d, 1.0, x_i, d, w.ut, d, 0.0, w.s, k)    # S = X_i^T V X_i
    sym_average(k, w.s)
    gemv(k, d, 1.0, x_i, d, m, 0.0, w.hm)                            # X_i^T m
    if not _solve_shifted(k, -1.0, w.s, p_site, w.s, w.lam, w):
        return RANKK_BAD_CAVITY
    for j in range(k):
        w.h[j] = w.hm[j]
    gemv(k, k, -1.0, w.s, k, b_site, 1.0, w.h)
    lu_solve(k, w.lu, k, w.ipiv, w.h)
    if not (all_finite(k * k, w.lam) and all_finite(k, w.h)):
        return RANKK_BAD_CAVITY
    if not cholesky_lower(k, w.lam, w.lam_chol):
        return RANKK_BAD_CAVITY
    return RANKK_OK


cdef int _update_factor(const RankKModel* model, int k, int d, const double* x_i, const double* y_i,
                        double* v, double* m, double* p_site, double* b_site, double damping,
                        double* max_change, Work* w) noexcept nogil:
    """One EP update of factor i in place (sites, V lower triangle, m).  Returns a RankKStatus."""
    cdef int j, st
    cdef double log_z, change
    st = _cavity(k, d, x_i, v, m, p_site, b_site, w)
    if st != RANKK_OK:
        return st
    st = rank_k_moments(model, k, y_i, w.h, w.lam, w.lam_chol, &log_z, w.a, w.b_mat, w.mwork, w.iwork)
    if st != RANKK_OK:
        return st
    # New site (eqs 107-108): P_new = (I - B Lambda)^{-1} B;  b_new = a + P_new (Lambda a + h).
    if not _solve_shifted(k, -1.0, w.b_mat, w.lam, w.b_mat, w.p_new, w):
        return RANKK_FAILED
    for j in range(k):
        w.vec[j] = w.h[j]
    gemv(k, k, 1.0, w.lam, k, w.a, 1.0, w.vec)
    for j in range(k):
        w.b_new[j] = w.a[j]
    gemv(k, k, 1.0, w.p_new, k, w.vec, 1.0, w.b_new)
    if not (all_finite(k * k, w.p_new) and all_finite(k, w.b_new)):
        return RANKK_FAILED
    # Damped change in natural parameters.
    for j in range(k * k):
        w.dp[j] = damping * (w.p_new[j] - p_site[j])
    for j in range(k):
        w.db[j] = damping * (w.b_new[j] - b_site[j])
    # Woodbury (eqs 114, 116): (I + dP S) [G | c] = [dP | db - dP X_i^T m].
    if not _solve_shifted(k, 1.0, w.dp, w.s, w.dp, w.g, w):
        return RANKK_NOT_PD
    for j in range(k):
        w.c[j] = w.db[j]
    gemv(k, k, -1.0, w.dp, k, w.hm, 1.0, w.c)
    lu_solve(k, w.lu, k, w.ipiv, w.c)
    if not (all_finite(k * k, w.g) and all_finite(k, w.c)):
        return RANKK_FAILED
    # V_new PD  <=>  X_i^T V_new X_i = S - S G S is PD (V PD, S PD).
    gemm(NO_TRANS, NO_TRANS, k, k, k, 1.0, w.g, k, w.s, k, 0.0, w.tmp, k)
    for j in range(k * k):
        w.b_mat[j] = w.s[j]
    gemm(NO_TRANS, NO_TRANS, k, k, k, -1.0, w.s, k, w.tmp, k, 1.0, w.b_mat, k)
    sym_average(k, w.b_mat)
    if not cholesky_lower(k, w.b_mat, w.tmp):
        return RANKK_NOT_PD
    # Apply: m += U c;  V -= U G U^T  (BLAS-3, lower triangle only).
    gemv_t(k, d, 1.0, w.ut, d, w.c, 1.0, m)
    gemm(NO_TRANS, NO_TRANS, k, d, k, 1.0, w.g, k, w.ut, d, 0.0, w.wt, d)
    syr2k(LOWER, d, k, -0.5, w.ut, d, w.wt, d, 1.0, v, d)
    change = max_change[0]
    for j in range(k * k):
        p_site[j] += w.dp[j]
        if fabs(w.dp[j]) > change:
            change = fabs(w.dp[j])
    for j in range(k):
        b_site[j] += w.db[j]
        if fabs(w.db[j]) > change:
            change = fabs(w.db[j])
    max_change[0] = change
    return RANKK_OK


cdef int _refresh(const RankKProblem* problem, const double* p_sites, const double* b_sites, double* v,
                  double* m, double* rhs, double* chunk, double* log_det_precision) noexcept nogil:
    """Rebuild V and m from the sites (invariant, eqs 46-47 for rank k).

    V^{-1} = V0^{-1} + sum_i X_i P_i X_i^T (one gemm per chunk of factors),
    rhs = V0^{-1} m0 + sum_i X_i b_i, m = V rhs via the Cholesky factor.  Writes
    ``rhs`` (so that m^T V^{-1} m = rhs^T m) and log |V^{-1}|.  Returns potrf's info.
    """
    cdef int n = problem.n, k = problem.k, d = problem.d
    cdef const double* x = problem.x
    cdef const double* v0_inv = problem.v0_inv
    cdef const double* v0_inv_m0 = problem.v0_inv_m0
    cdef int i, j, i0, nb, info
    cdef double total = 0.0
    for j in range(d * d):
        v[j] = v0_inv[j]
    for j in range(d):
        rhs[j] = v0_inv_m0[j]
    i0 = 0
    while i0 < n:
        nb = n - i0
        if nb > REFRESH_CHUNK:
            nb = REFRESH_CHUNK
        for i in range(nb):
            gemm(NO_TRANS, NO_TRANS, k, d, k, 1.0, p_sites + (i0 + i) * k * k, k,
                 x + (i0 + i) * k * d, d, 0.0, chunk + i * k * d, d)
        gemm(TRANS, NO_TRANS, d, d, nb * k, 1.0, x + i0 * k * d, d, chunk, d, 1.0, v, d)
        i0 += nb
    if n > 0:
        gemv_t(n * k, d, 1.0, x, d, b_sites, 1.0, rhs)
    sym_average(d, v)
    info = potrf(LOWER, d, v, d)
    if info != 0:
        return info
    for j in range(d):
        total += log(v[j * d + j])
    log_det_precision[0] = 2.0 * total
    for j in range(d):
        m[j] = rhs[j]
    trsv(LOWER, NO_TRANS, d, v, d, m)
    trsv(LOWER, TRANS, d, v, d, m)
    info = potri(LOWER, d, v, d)
    if info != 0:
        return info
    symmetrize(LOWER, d, v, d)
    return 0


# ---------------------------------------------------------------------------
# Python-level API
# ---------------------------------------------------------------------------
def _input(arr, name, shape):
    """Read-only float64 C-contiguous view of an input array, with a clear error."""
    a = np.ascontiguousarray(arr, dtype=np.float64) if not (
        isinstance(arr, np.ndarray) and arr.dtype == np.float64 and arr.flags.c_contiguous) else arr
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite")
    return a


def _inout(arr, name, shape):
    """Check a state array updated in place: float64, C-contiguous, writeable, right shape."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(arr).__name__}")
    if arr.dtype != np.float64 or not arr.flags.c_contiguous or not arr.flags.writeable:
        raise TypeError(f"{name} must be a writeable C-contiguous float64 array")
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
    return arr


cdef class RankKEPOptions(EngineOptions):
    """Options of the rank-k engine (:class:`RankKEP`), checked once here (read-only).

    Parameters
    ----------
    damping : float in (0, 1]
        Fraction of the natural-parameter step taken per update.
    tol : float >= 0
        Sweeps stop when the largest absolute change of any site natural parameter in
        a sweep is below ``tol``; ``converged`` is True only if, in addition, no factor
        update was skipped in that sweep (a skipped factor is not at a fixed point).
    max_sweeps : int >= 0
        0 only rebuilds ``post_mean``/``post_cov`` from the sites.
    refresh_every : int >= 0
        Rebuild V, m from the invariant every this many sweeps and after the last
        sweep; 0 never refreshes after the initial build (for drift tests).

    Raises
    ------
    ValueError
        A field out of range (the message names it).
    """
    _FIELDS = ("damping", "tol", "max_sweeps", "refresh_every")

    def __init__(self, *, double damping=1.0, double tol=1e-8, int max_sweeps=200, int refresh_every=1):
        self.set_sweep(damping, tol, max_sweeps, 0, False)
        if refresh_every < 0:
            raise ValueError(f"refresh_every must be >= 0; got {refresh_every}")
        self.refresh_every = refresh_every


_DEFAULT_OPTIONS = RankKEPOptions()


def _state_arrays(state):
    """``(site_precision, site_natural_mean, post_mean, post_cov)`` of a RankKEP ``state``."""
    if state is None:
        return None, None, None, None
    state = tuple(state)
    if len(state) not in (2, 4):
        raise ValueError("state must be (site_precision, site_natural_mean) or (site_precision, "
                         f"site_natural_mean, post_mean, post_cov); got {len(state)} arrays")
    return state + (None,) * (4 - len(state))


def _check_likelihood(RankKLikelihood likelihood, int k, str where):
    """TypeError unless ``likelihood`` is built; ValueError unless it fits k outputs (k >= 0)."""
    if likelihood is None or likelihood.kind < 0:
        raise TypeError("likelihood must be built with RankKLikelihood.mvgaussian or RankKLikelihood.product")
    if k < 0:
        return
    if likelihood.kind == RANKK_MVGAUSSIAN and likelihood.k != k:
        raise ValueError(f"likelihood noise_cov is {likelihood.k}x{likelihood.k} but {where} has k = {k}")
    if likelihood.kind == RANKK_PRODUCT and k > 1 and likelihood.n_nodes ** k > MAX_QUADRATURE_POINTS:
        raise ValueError(f"n_nodes**k = {likelihood.n_nodes}**{k} exceeds {MAX_QUADRATURE_POINTS} "
                         "quadrature points; lower n_nodes")


def _check_problem(X, y, prior_mean, prior_cov, RankKLikelihood likelihood):
    """``(X, y, prior_mean, prior_cov)`` as checked float64 C-contiguous arrays."""
    _check_likelihood(likelihood, -1, "X")
    if not isinstance(X, np.ndarray) or X.ndim != 3:
        raise ValueError("X must be a 3-D array of shape (n, k, d)")
    n, k, d = X.shape
    if n < 1 or k < 1 or d < 1:
        raise ValueError(f"X must have n >= 1, k >= 1 and d >= 1, got shape {X.shape}")
    X = _input(X, "X", (n, k, d))
    y = _input(y, "y", (n, k))
    prior_mean = _input(prior_mean, "prior_mean", (d,))
    prior_cov = _input(prior_cov, "prior_cov", (d, d))
    _check_likelihood(likelihood, k, "X")
    return X, y, prior_mean, prior_cov


def _check_sites(site_precision, site_natural_mean, n, k):
    """The site arrays (updated in place), checked: writeable float64 C-contiguous, finite,
    symmetric precisions."""
    site_precision = _inout(site_precision, "site_precision", (n, k, k))
    site_natural_mean = _inout(site_natural_mean, "site_natural_mean", (n, k))
    if not (np.all(np.isfinite(site_precision)) and np.all(np.isfinite(site_natural_mean))):
        raise ValueError("site_precision and site_natural_mean must be finite")
    if np.any(np.abs(site_precision - site_precision.transpose(0, 2, 1))
              > 1e-10 * (1.0 + np.abs(site_precision))):
        raise ValueError("site_precision must hold symmetric k x k matrices")
    return site_precision, site_natural_mean


def _prior_precision(prior_mean, const double[:, ::1] prior_cov):
    """``(V0^{-1}, V0^{-1} m0, log |V0|)`` by Cholesky; LinAlgError if V0 is not PD."""
    cdef int d = prior_cov.shape[0], info = 0
    v0_inv = np.empty((d, d))
    cdef double[:, ::1] inv_v = v0_inv
    cdef bint ok
    with nogil:
        ok = cholesky_lower(d, &prior_cov[0, 0], &inv_v[0, 0])
    if not ok:
        raise LinAlgError("prior_cov is not positive definite")
    log_det_v0 = 2.0 * float(np.sum(np.log(np.diag(v0_inv))))
    with nogil:
        info = potri(LOWER, d, &inv_v[0, 0], d)
        symmetrize(LOWER, d, &inv_v[0, 0], d)
    if info != 0:
        raise LinAlgError("prior_cov is singular")
    return v0_inv, v0_inv @ prior_mean, log_det_v0


def _status_error(int status, Py_ssize_t i):
    if status == RANKK_BAD_LABEL:
        return ValueError(f"y[{i}] holds a label outside the support of the likelihood")
    if status == RANKK_NO_QUADRATURE:
        return ValueError(
            f"factor {i} has a correlated cavity covariance; the PRODUCT quadrature supports only "
            "probit (finite slope), logistic and Gaussian 1-D likelihoods")
    return None


cdef class _Scratch:
    """Scratch of one :meth:`RankKEP.run` or :meth:`RankKEP.log_evidence` call: the
    refresh's right-hand side and chunk of factors, and the per-factor work (``Work``)."""
    cdef object rhs_array
    cdef object buffers
    cdef double* rhs
    cdef double* chunk
    cdef Work w

    def __cinit__(self, int n, int k, int d):
        rhs = np.empty(d)
        chunk = np.empty(min(max(n, 1), REFRESH_CHUNK) * k * d)
        work = np.empty(_work_doubles(k, d))
        ipiv = np.empty(k, dtype=_IPIV_DTYPE)
        iwork = np.empty(k, dtype=np.intc)
        cdef double[::1] rhs_v = rhs, chunk_v = chunk, work_v = work
        cdef blas_int[::1] ipiv_v = ipiv
        cdef int[::1] iwork_v = iwork
        self.rhs_array = rhs
        self.buffers = (chunk, work, ipiv, iwork)     # keep the buffers behind the pointers alive
        self.rhs = &rhs_v[0]
        self.chunk = &chunk_v[0]
        _work_layout(&self.w, &work_v[0], &ipiv_v[0], &iwork_v[0], k, d)


cdef int _rebuild(const RankKProblem* problem, _Scratch scratch, const double* p_sites, const double* b_sites,
                  double* v, double* m, double* log_det_precision, str failure) except -1:
    """:func:`_refresh` with the GIL released; LinAlgError(``failure``) if V^{-1} is not PD."""
    cdef int info
    with nogil:
        info = _refresh(problem, p_sites, b_sites, v, m, scratch.rhs, scratch.chunk, log_det_precision)
    if info != 0:
        raise LinAlgError(failure)
    return 0


cdef int _log_site_normaliser(int k, const double* p_site, const double* b_site, double* log_g,
                              Work* w) noexcept nogil:
    """log G_i of the module docstring from the cavity in ``w.h``, ``w.lam``; a RankKStatus.

    With (I + P Lambda): t = (I + P Lambda)^{-1} b,  u = (I + P Lambda)^{-1} P h.
    """
    cdef int j, sign = 0
    cdef double log_det
    if not _lu_shifted(k, 1.0, p_site, w.lam, w):
        return RANKK_BAD_CAVITY
    log_det = lu_log_abs_det(k, w.lu, k, w.ipiv, &sign)
    if sign <= 0:
        return RANKK_BAD_CAVITY
    for j in range(k):
        w.vec[j] = b_site[j]
    lu_solve(k, w.lu, k, w.ipiv, w.vec)                           # t
    gemv(k, k, 1.0, p_site, k, w.h, 0.0, w.c)
    lu_solve(k, w.lu, k, w.ipiv, w.c)                             # u
    gemv(k, k, 1.0, w.lam, k, b_site, 0.0, w.col)                 # Lambda b
    log_g[0] = -0.5 * log_det
    for j in range(k):
        log_g[0] += w.h[j] * w.vec[j] - 0.5 * w.h[j] * w.c[j] + 0.5 * w.vec[j] * w.col[j]
    return RANKK_OK


cdef class RankKEP:
    """Sequential rank-k Gaussian EP (Minka, *EP: a quick reference*, §3, eqs 95-116) on one
    problem: the projections, targets, prior and likelihood, and the site and posterior arrays.

    Built once from validated inputs; :meth:`run` sweeps from the current sites, updating
    them and V, m in place, and returns a :class:`~fastep._epcore._common.SweepResult`;
    :meth:`log_evidence` gives the EP evidence of the current sites (module docstring).

    Parameters
    ----------
    X : ndarray, shape (n, k, d)
        Projections, ``X[i] = X_i^T`` so that ``z_i = X[i] @ w``.
    y : ndarray, shape (n, k)
        Observations / labels per factor.
    prior_mean : ndarray, shape (d,)
    prior_cov : ndarray, shape (d, d)
        Symmetric positive-definite prior covariance V0.
    likelihood : RankKLikelihood
    options : RankKEPOptions, optional
        Damping, convergence test and refresh (default: ``RankKEPOptions()``).
    state : tuple, optional
        The :term:`EP state` to start from and write to: ``(site_precision,
        site_natural_mean)`` or ``(site_precision, site_natural_mean, post_mean, post_cov)``.
        The site precisions P_i = v_i^{-1} and natural means b_i = v_i^{-1} m_i (eq 98),
        shapes (n, k, k) and (n, k), are updated in place by :meth:`run` (None or omitted:
        zeros, a cold start); ``post_mean`` (d,) and ``post_cov`` (d, d) are where
        :meth:`run` writes m and V (None or omitted: new arrays). Every run first rebuilds m
        and V from the sites (eqs 46-47), so a warm start is given by the sites alone.
    validate : bool, default True
        Check the arrays here (ValueError or TypeError naming the argument; the
        site and posterior arrays must be writeable C-contiguous float64). ``False`` is the
        one path for callers that checked them already: invalid inputs then give undefined
        results instead of an error. A prior_cov that is not positive definite raises
        LinAlgError either way.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep._epcore.rank_k_ep import RankKLikelihood, RankKEP
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(40, 2, 3))
    >>> Y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=(40, 2))
    >>> state = RankKEP(X, Y, np.zeros(3), np.eye(3), RankKLikelihood.mvgaussian(0.01 * np.eye(2)))
    >>> state.run().converged
    True
    >>> np.round(state.post_mean, 1)
    array([ 1. , -2. ,  0.5])
    """

    def __init__(self, X, y, prior_mean, prior_cov, RankKLikelihood likelihood,
                 RankKEPOptions options=None, *, state=None, bint validate=True):
        if options is None:
            options = _DEFAULT_OPTIONS
        site_precision, site_natural_mean, post_mean, post_cov = _state_arrays(state)
        if validate:
            X, y, prior_mean, prior_cov = _check_problem(X, y, prior_mean, prior_cov, likelihood)
        n, k, d = X.shape
        if not validate:
            _check_likelihood(likelihood, k, "X")
        if site_precision is None:
            site_precision = np.zeros((n, k, k))
        if site_natural_mean is None:
            site_natural_mean = np.zeros((n, k))
        if validate:
            site_precision, site_natural_mean = _check_sites(site_precision, site_natural_mean, n, k)
        self.prior_precision, self.prior_precision_mean, self.log_det_prior_cov = _prior_precision(
            prior_mean, prior_cov)
        post_mean = np.empty(d) if post_mean is None else post_mean
        post_cov = np.empty((d, d)) if post_cov is None else post_cov
        if validate:
            _inout(post_mean, "post_mean", (d,))
            _inout(post_cov, "post_cov", (d, d))
        self.X, self.y, self.prior_mean, self.prior_cov, self.likelihood = X, y, prior_mean, prior_cov, likelihood
        self.site_precision, self.site_natural_mean = site_precision, site_natural_mean
        self.post_mean, self.post_cov = post_mean, post_cov
        self.n, self.k, self.d = n, k, d
        self.options = options
        self.sweep, self.refresh_every = options.sweep, options.refresh_every
        self.validate = validate
        cdef const double[:, :, ::1] x_v = X
        cdef const double[:, ::1] y_v = y
        cdef const double[:, ::1] v0i_v = self.prior_precision
        cdef const double[::1] v0im0_v = self.prior_precision_mean
        self.problem.n, self.problem.k, self.problem.d = n, k, d
        self.problem.x = &x_v[0, 0, 0]
        self.problem.y = &y_v[0, 0]
        self.problem.v0_inv = &v0i_v[0, 0]
        self.problem.v0_inv_m0 = &v0im0_v[0]

    def run(self, *, object sweep_callback=None):
        """Run EP sweeps (eqs 103-116) from the current sites, updating them and V, m in place.

        Parameters
        ----------
        sweep_callback : callable, optional
            ``sweep_callback(sweep, max_change, nan)`` after every sweep that did not stall;
            returning ``False`` stops the sweeps (V, m are refreshed, ``stopped`` is True).

        Returns
        -------
        SweepResult
            ``max_change`` of the last sweep, ``n_skipped`` the factor updates skipped in all
            sweeps (module docstring), ``diagnostics["n_skipped_last_sweep"]``; ``log_z`` is
            NaN (:meth:`log_evidence` computes it).

        Raises
        ------
        numpy.linalg.LinAlgError
            The sites give a non-PD posterior precision at a rebuild.
        ValueError
            A label the likelihood rejects, or an unsupported quadrature; the sites and V, m
            are then as after the last completed factor update.
        """
        cdef const RankKProblem* problem = &self.problem
        cdef _Scratch scratch = _Scratch(problem.n, problem.k, problem.d)
        cdef double[:, :, ::1] p_v = self.site_precision
        cdef double[:, ::1] b_v = self.site_natural_mean
        cdef double[::1] m_v = self.post_mean
        cdef double[:, ::1] v_v = self.post_cov
        cdef double* p = &p_v[0, 0, 0]
        cdef double* b = &b_v[0, 0]
        cdef double* m = &m_v[0]
        cdef double* v = &v_v[0, 0]
        cdef int n = problem.n, k = problem.k, d = problem.d
        cdef int max_sweeps = self.sweep.max_sweeps, refresh_every = self.refresh_every
        cdef double damping = self.sweep.damping, tol = self.sweep.tol
        cdef const RankKModel* model = &self.likelihood.model
        cdef double log_det_prec = 0.0, max_change = 0.0
        cdef int i, st = RANKK_OK, bad_status = RANKK_OK
        cdef Py_ssize_t bad_i = -1
        cdef int sweep, n_sweeps = 0, n_skip_sweep = 0
        cdef long n_skipped = 0
        cdef bint stalled = False, refreshed_last = True
        cdef SweepDriver driver = SweepDriver(tol, max_sweeps, sweep_callback)

        _rebuild(problem, scratch, p, b, v, m, &log_det_prec,
                 "posterior precision V0^{-1} + sum_i X_i P_i X_i^T is not positive definite "
                 "(site_precision gives an improper posterior)")
        for sweep in range(max_sweeps):
            with nogil:
                max_change = 0.0
                n_skip_sweep = 0
                for i in range(n):
                    st = _update_factor(model, k, d, problem.x + <Py_ssize_t>i * k * d,
                                        problem.y + <Py_ssize_t>i * k, v, m, p + <Py_ssize_t>i * k * k,
                                        b + <Py_ssize_t>i * k, damping, &max_change, &scratch.w)
                    if st == RANKK_BAD_LABEL or st == RANKK_NO_QUADRATURE:
                        bad_i = i
                        bad_status = st
                        break
                    if st != RANKK_OK:
                        n_skip_sweep += 1
            if bad_i >= 0:
                symmetrize(LOWER, d, v, d)
                raise _status_error(bad_status, bad_i)
            n_sweeps += 1
            n_skipped += n_skip_sweep
            driver.record_change(n_sweeps, max_change, n_skip_sweep)
            # Stop once a sweep changes nothing (the next would repeat it); it is only a
            # fixed point if no factor was skipped in that sweep.
            stalled = max_change < tol
            driver.test_sites()
            refreshed_last = False
            if not stalled:
                driver.notify(n_sweeps)
                driver.raise_pending()
            if refresh_every > 0 and (n_sweeps % refresh_every == 0 or stalled or driver.stopped
                                      or sweep == max_sweeps - 1):
                _rebuild(problem, scratch, p, b, v, m, &log_det_prec,
                         f"posterior precision lost positive definiteness at a refresh after sweep {n_sweeps}")
                refreshed_last = True
            if stalled or driver.stopped:
                break
        if not refreshed_last:
            symmetrize(LOWER, d, v, d)
        return driver.result(has_log_z=False, diagnostics={"n_skipped_last_sweep": int(n_skip_sweep)}).replace(
            max_change=float(max_change), n_skipped=n_skipped, n_failed=0)

    def log_evidence(self):
        """EP approximation of log p(y) from the current sites (eqs 48-49, 109-110 regrouped).

        V and m are rebuilt from the sites (eqs 46-47) into scratch arrays, not read from
        ``post_cov``/``post_mean``; each factor adds ``log Z_i - log G_i`` (module docstring).

        Raises
        ------
        numpy.linalg.LinAlgError
            If the posterior or a cavity is improper (the evidence is then undefined).
        ValueError, FloatingPointError
            A label the likelihood rejects, an unsupported quadrature, or non-finite moments.
        """
        cdef const RankKProblem* problem = &self.problem
        cdef int n = problem.n, k = problem.k, d = problem.d, i, st = RANKK_OK
        cdef _Scratch scratch = _Scratch(n, k, d)
        post_cov = np.empty((d, d))
        post_mean = np.empty(d)
        cdef const double[:, :, ::1] p_v = self.site_precision
        cdef const double[:, ::1] b_v = self.site_natural_mean
        cdef double[::1] m_v = post_mean
        cdef double[:, ::1] v_v = post_cov
        cdef const double* p_i
        cdef const double* b_i
        cdef Py_ssize_t bad_i = -1
        cdef Work* w = &scratch.w
        cdef const RankKModel* model = &self.likelihood.model
        cdef double log_det_prec = 0.0, log_z, log_g, quad, total = 0.0
        _rebuild(problem, scratch, &p_v[0, 0, 0], &b_v[0, 0], &v_v[0, 0], &m_v[0], &log_det_prec,
                 "posterior precision V0^{-1} + sum_i X_i P_i X_i^T is not positive definite")
        with nogil:
            for i in range(n):
                p_i = &p_v[i, 0, 0]
                b_i = &b_v[i, 0]
                st = _cavity(k, d, problem.x + <Py_ssize_t>i * k * d, &v_v[0, 0], &m_v[0], p_i, b_i, w)
                if st == RANKK_OK:
                    st = rank_k_moments(model, k, problem.y + <Py_ssize_t>i * k, w.h, w.lam, w.lam_chol,
                                        &log_z, w.a, w.b_mat, w.mwork, w.iwork)
                if st == RANKK_OK:
                    st = _log_site_normaliser(k, p_i, b_i, &log_g, w)
                if st != RANKK_OK:
                    bad_i = i
                    break
                total += log_z - log_g
        if bad_i >= 0:
            err = _status_error(st, bad_i)
            if err is not None:
                raise err
            if st == RANKK_FAILED:
                raise FloatingPointError(f"tilted moments of factor {bad_i} are not finite")
            raise LinAlgError(f"cavity of factor {bad_i} is improper; the EP log evidence is undefined")
        quad = float(scratch.rhs_array @ post_mean) - float(self.prior_mean @ self.prior_precision_mean)
        total += 0.5 * (-log_det_prec - self.log_det_prior_cov) + 0.5 * quad
        if not isfinite(total):
            raise FloatingPointError("log evidence is not finite")
        return float(total)


def tilted_moments(RankKLikelihood likelihood not None, y, cavity_mean, cavity_cov):
    """Moments of t(z) N(z; h, Lambda) for one factor (eqs 95-97): ``(log_z, a, B)``.

    Python-level access to the compiled moment kernels (for tests and diagnostics).
    ``cavity_cov`` must be symmetric positive definite.
    """
    h = np.ascontiguousarray(cavity_mean, dtype=np.float64)
    if h.ndim != 1 or h.shape[0] < 1:
        raise ValueError(f"cavity_mean must be a non-empty 1-D array, got shape {h.shape}")
    k = h.shape[0]
    yy = _input(y, "y", (k,))
    lam = _input(cavity_cov, "cavity_cov", (k, k))
    _input(h, "cavity_mean", (k,))
    if np.max(np.abs(lam - lam.T)) > 1e-12 * np.max(np.abs(lam)):
        raise ValueError("cavity_cov must be symmetric")
    _check_likelihood(likelihood, k, "the cavity")
    chol = np.empty((k, k))
    a = np.empty(k)
    b_mat = np.empty((k, k))
    work = np.empty(2 * k * k + 8 * k)
    iwork = np.empty(k, dtype=np.intc)
    cdef const double[::1] y_v = yy, h_v = h
    cdef const double[:, ::1] lam_v = lam
    cdef double[:, ::1] chol_v = chol
    cdef double[::1] a_v = a, work_v = work
    cdef double[:, ::1] bm_v = b_mat
    cdef int[::1] iw_v = iwork
    cdef double log_z = 0.0
    cdef int st, k_ = k
    if not cholesky_lower(k_, &lam_v[0, 0], &chol_v[0, 0]):
        raise LinAlgError("cavity_cov is not positive definite")
    with nogil:
        st = rank_k_moments(&likelihood.model, k_, &y_v[0], &h_v[0], &lam_v[0, 0], &chol_v[0, 0], &log_z,
                            &a_v[0], &bm_v[0, 0], &work_v[0], &iw_v[0])
    if st != RANKK_OK:
        err = _status_error(st, 0)
        if err is not None:
            raise err
        raise FloatingPointError(f"tilted moments failed (status {st})")
    return float(log_z), a, b_mat


#: The engine's former names: ``{former: current}``; a former name still reads, with a
#: ``FutureWarning``, until the next release.
_RENAMED = {"RankKState": "RankKEP"}


def __getattr__(name):
    return former_name(globals(), _RENAMED, name)
