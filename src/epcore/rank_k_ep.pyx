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
    tilted moments (eqs 95-97): log Z_i, a_i = d log Z_i / d h, B_i = -d^2 log Z_i / dh dh^T
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
"""
import numpy as np
from numpy.linalg import LinAlgError

from libc.math cimport log, exp, sqrt, fabs, isfinite, INFINITY
from libc.stdlib cimport malloc, free

from fastep._epcore._blas cimport (
    UPPER, LOWER, NO_TRANS, TRANS, LEFT, RIGHT,
    blas_int, dcopy, gemv, gemv_t, trsv, potrf, potri, symmetrize,
    gemm, symm, syr2k, trsm, lu_factor, lu_solve, lu_log_abs_det,
)
from fastep._epcore._common cimport SweepDriver
from fastep._epcore.sites cimport (
    SiteModel, SiteSpec, site_moments, SITE_OK, SITE_BAD_LABEL,
    LIK_PROBIT, LIK_LOGISTIC_MACKAY, LIK_LOGISTIC_GH, LIK_GAUSSIAN,
)

__all__ = ["RankKLikelihood", "run_rank_k_ep", "rank_k_log_evidence", "tilted_moments", "MAX_QUADRATURE_POINTS"]

cdef double LOG_2PI = 1.8378770664093453
# Off-diagonal entries of the cavity covariance below this fraction of
# sqrt(Lambda_jj Lambda_ll) are treated as zero (exactly separable PRODUCT moments).
cdef double DIAGONAL_REL_TOL = 1e-14
MAX_QUADRATURE_POINTS = 1_000_000
MAX_NODES_PER_DIM = 256
_IPIV_DTYPE = np.intc if sizeof(blas_int) == sizeof(int) else np.int64
# Factors per chunk in the refresh (bounds the scratch to CHUNK * k * d doubles).
cdef int REFRESH_CHUNK = 256


# ---------------------------------------------------------------------------
# Likelihood description
# ---------------------------------------------------------------------------
cdef class RankKLikelihood:
    """A k-output likelihood ``t_i(z)`` as the compiled rank-k engine sees it.

    Build with :meth:`mvgaussian` or :meth:`product`; do not call the class directly.
    """

    def __cinit__(self):
        self.kind = -1
        self.k = -1
        self.noise_cov = None
        self.site = None
        self.n_nodes = 0
        self.gh_points = np.zeros(0)
        self.gh_log_weights = np.zeros(0)

    @staticmethod
    def mvgaussian(noise_cov):
        """Multivariate Gaussian likelihood ``t_i(z) = N(y_i | z, R)`` (exact moments).

        Parameters
        ----------
        noise_cov : array_like, shape (k, k)
            Symmetric positive-definite noise covariance R, shared by all factors.
        """
        R = np.array(noise_cov, dtype=np.float64, order='C', copy=True)
        if R.ndim != 2 or R.shape[0] != R.shape[1] or R.shape[0] < 1:
            raise ValueError(f"noise_cov must be a square (k, k) matrix with k >= 1, got shape {R.shape}")
        if not np.all(np.isfinite(R)):
            raise ValueError("noise_cov must be finite")
        scale = max(float(np.max(np.abs(R))), np.finfo(float).tiny)
        if np.max(np.abs(R - R.T)) > 1e-12 * scale:
            raise ValueError("noise_cov must be symmetric")
        R = 0.5 * (R + R.T)
        try:
            np.linalg.cholesky(R)
        except LinAlgError:
            raise ValueError("noise_cov must be positive definite") from None
        R.setflags(write=False)
        cdef RankKLikelihood self = RankKLikelihood.__new__(RankKLikelihood)
        self.kind = RANKK_MVGAUSSIAN
        self.k = R.shape[0]
        self.noise_cov = R
        self._fill_model()
        return self

    @staticmethod
    def product(SiteSpec site not None, int n_nodes=20):
        """Product of independent 1-D likelihoods, ``t_i(z) = prod_j f(y_ij, z_j)``.

        When the cavity covariance is diagonal the moments separate exactly and
        use ``site_moments``; otherwise a tensor-product Gauss-Hermite rule with
        ``n_nodes`` nodes per dimension is used in the whitened cavity.  The
        quadrature evaluates ``log f(y, z)`` as the site's log Z at zero cavity
        variance, so it supports probit (finite slope), logistic and Gaussian
        likelihoods only; other codes raise ``ValueError`` if a correlated cavity
        is met.

        Parameters
        ----------
        site : SiteSpec
            The 1-D likelihood applied to every output.
        n_nodes : int, default 20
            Gauss-Hermite nodes per output dimension, at most 256
            (and ``n_nodes**k <= 10**6`` is checked when k is known).
        """
        if not (1 <= n_nodes <= MAX_NODES_PER_DIM):
            raise ValueError(f"n_nodes must be in [1, {MAX_NODES_PER_DIM}], got {n_nodes}")
        cdef RankKLikelihood self = RankKLikelihood.__new__(RankKLikelihood)
        self.kind = RANKK_PRODUCT
        self.k = -1
        self.site = site
        self.n_nodes = n_nodes
        t, w = np.polynomial.hermite.hermgauss(n_nodes)
        self.gh_points = np.ascontiguousarray(np.sqrt(2.0) * t)
        with np.errstate(divide='ignore'):
            self.gh_log_weights = np.ascontiguousarray(np.log(w) - 0.5 * np.log(np.pi))
        if not (np.all(np.isfinite(self.gh_points)) and not np.any(np.isnan(self.gh_log_weights))):
            raise ValueError(f"Gauss-Hermite rule with {n_nodes} nodes is not finite")
        self.gh_points.setflags(write=False)
        self.gh_log_weights.setflags(write=False)
        self._fill_model()
        return self

    cdef _fill_model(self):
        cdef const double[:, ::1] r_view
        cdef const double[::1] pts, lws
        self.model.kind = self.kind
        self.model.k = self.k
        self.model.noise_cov = NULL
        self.model.site = NULL
        self.model.quadrature_ok = False
        self.model.n_nodes = self.n_nodes
        self.model.gh_points = NULL
        self.model.gh_log_weights = NULL
        if self.kind == RANKK_MVGAUSSIAN:
            r_view = self.noise_cov
            self.model.noise_cov = &r_view[0, 0]
        else:
            self.model.site = &self.site.model
            code = self.site.code
            params = self.site.params
            self.model.quadrature_ok = (
                code in (LIK_LOGISTIC_MACKAY, LIK_LOGISTIC_GH, LIK_GAUSSIAN)
                or (code == LIK_PROBIT and params.shape[0] >= 1 and np.isfinite(params[0])))
            pts = self.gh_points
            lws = self.gh_log_weights
            self.model.gh_points = &pts[0]
            self.model.gh_log_weights = &lws[0]

    def __repr__(self):
        if self.kind == RANKK_MVGAUSSIAN:
            return f"RankKLikelihood.mvgaussian(noise_cov={self.noise_cov.tolist()!r})"
        return f"RankKLikelihood.product(site=<SiteSpec code={self.site.code}>, n_nodes={self.n_nodes})"


# ---------------------------------------------------------------------------
# Small helpers (k x k, row-major)
# ---------------------------------------------------------------------------
cdef inline void _sym_avg(int n, double* a) noexcept nogil:
    """Replace a by (a + a^T) / 2."""
    cdef int i, j
    cdef double v
    for i in range(n):
        for j in range(i):
            v = 0.5 * (a[i * n + j] + a[j * n + i])
            a[i * n + j] = v
            a[j * n + i] = v


cdef inline bint _all_finite(int n, const double* a) noexcept nogil:
    cdef int i
    for i in range(n):
        if not isfinite(a[i]):
            return False
    return True


cdef inline void _add_identity(int n, double* a) noexcept nogil:
    cdef int i
    for i in range(n):
        a[i * n + i] += 1.0


cdef inline bint _cholesky_lower(int n, const double* a, double* l) noexcept nogil:
    """l = chol(a) (lower, upper triangle zeroed); True iff a is numerically PD."""
    cdef int i, j
    for i in range(n * n):
        l[i] = a[i]
    if potrf(LOWER, n, l, n) != 0:
        return False
    for i in range(n):
        for j in range(i + 1, n):
            l[i * n + j] = 0.0
    return True


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
# k-output tilted moments
# ---------------------------------------------------------------------------
cdef int _moments_mvgaussian(const RankKModel* model, int k, const double* y, const double* h,
                             const double* lam, double* log_z, double* a, double* b_mat,
                             double* work) noexcept nogil:
    """Z = N(y; h, Lambda + R), a = (Lambda + R)^{-1} (y - h), B = (Lambda + R)^{-1}."""
    cdef double* c = work
    cdef double* r = work + k * k
    cdef int j
    cdef double quad = 0.0, half_logdet = 0.0
    for j in range(k * k):
        c[j] = lam[j] + model.noise_cov[j]
    if potrf(LOWER, k, c, k) != 0:
        return RANKK_FAILED
    for j in range(k):
        r[j] = y[j] - h[j]
    trsv(LOWER, NO_TRANS, k, c, k, r)
    for j in range(k):
        quad += r[j] * r[j]
        half_logdet += log(c[j * k + j])
    log_z[0] = -0.5 * k * LOG_2PI - half_logdet - 0.5 * quad
    trsv(LOWER, TRANS, k, c, k, r)
    for j in range(k):
        a[j] = r[j]
    if potri(LOWER, k, c, k) != 0:
        return RANKK_FAILED
    symmetrize(LOWER, k, c, k)
    for j in range(k * k):
        b_mat[j] = c[j]
    return RANKK_OK


cdef inline int _site_status(int st) noexcept nogil:
    if st == SITE_OK:
        return RANKK_OK
    if st == SITE_BAD_LABEL:
        return RANKK_BAD_LABEL
    return RANKK_FAILED


cdef int _moments_product_diagonal(const RankKModel* model, int k, const double* y, const double* h,
                                   const double* lam, double* log_z, double* a,
                                   double* b_mat) noexcept nogil:
    """Separable moments for a diagonal cavity: log Z = sum_j log Z_j, a = (alpha_j), B = diag(beta_j)."""
    cdef int j, st
    cdef double lz, alpha, beta, total = 0.0
    for j in range(k * k):
        b_mat[j] = 0.0
    for j in range(k):
        st = site_moments(model.site, y[j], h[j], lam[j * k + j], &lz, &alpha, &beta)
        if st != SITE_OK:
            return _site_status(st)
        total += lz
        a[j] = alpha
        b_mat[j * k + j] = beta
    log_z[0] = total
    return RANKK_OK


cdef int _quadrature_recompute(const RankKModel* model, int k, const double* y, const double* h,
                               const double* chol, const int* idx, double* xi, double* cum,
                               int start) noexcept nogil:
    """Refresh node coordinates and cumulative log integrand for dimensions >= start."""
    cdef int j, l, st
    cdef double z, lf, alpha, beta
    for j in range(start, k):
        xi[j] = model.gh_points[idx[j]]
        z = h[j]
        for l in range(j + 1):
            z += chol[j * k + l] * xi[l]
        st = site_moments(model.site, y[j], z, 0.0, &lf, &alpha, &beta)
        if st != SITE_OK:
            return _site_status(st)
        cum[j] = (cum[j - 1] if j > 0 else 0.0) + lf + model.gh_log_weights[idx[j]]
    return RANKK_OK


cdef int _moments_product_quadrature(const RankKModel* model, int k, const double* y, const double* h,
                                     const double* chol, double* log_z, double* a, double* b_mat,
                                     double* work, int* idx) noexcept nogil:
    """Tensor-product Gauss-Hermite moments in the whitened cavity z = h + L xi, xi ~ N(0, I).

    Two passes over the n_nodes**k nodes: the first finds the largest log integrand
    (log-sum-exp shift) and its node xi0; the second accumulates the weights and the
    first two moments of xi - xi0.  Then (eqs 95-97)

        a = Lambda^{-1} (E z - h) = L^{-T} E xi,
        B = Lambda^{-1} - Lambda^{-1} Cov(z) Lambda^{-1} = L^{-T} (I - Cov xi) L^{-1}.
    """
    cdef int n = model.n_nodes
    cdef double* xi = work
    cdef double* xi0 = work + k
    cdef double* cum = work + 2 * k
    cdef double* s1 = work + 3 * k
    cdef double* dev = work + 4 * k
    cdef double* s2 = work + 5 * k
    cdef int pass_, p, j, l, st
    cdef double c, w, shift = -INFINITY, s0 = 0.0
    for j in range(k):
        s1[j] = 0.0
        xi0[j] = 0.0
    for j in range(k * k):
        s2[j] = 0.0
    for pass_ in range(2):
        for j in range(k):
            idx[j] = 0
        st = _quadrature_recompute(model, k, y, h, chol, idx, xi, cum, 0)
        if st != RANKK_OK:
            return st
        while True:
            c = cum[k - 1]
            if pass_ == 0:
                if c > shift:
                    shift = c
                    for j in range(k):
                        xi0[j] = xi[j]
            else:
                w = exp(c - shift)
                if w > 0.0:
                    s0 += w
                    for j in range(k):
                        dev[j] = xi[j] - xi0[j]
                        s1[j] += w * dev[j]
                    for j in range(k):
                        for l in range(j + 1):
                            s2[j * k + l] += w * dev[j] * dev[l]
            p = k - 1
            while p >= 0:
                idx[p] += 1
                if idx[p] < n:
                    break
                idx[p] = 0
                p -= 1
            if p < 0:
                break
            st = _quadrature_recompute(model, k, y, h, chol, idx, xi, cum, p)
            if st != RANKK_OK:
                return st
        if pass_ == 0 and not isfinite(shift):
            return RANKK_FAILED
    if not (s0 > 0.0) or not isfinite(s0):
        return RANKK_FAILED
    log_z[0] = shift + log(s0)
    for j in range(k):
        s1[j] /= s0
        a[j] = xi0[j] + s1[j]
    # b_mat <- I - Cov(xi), full symmetric.
    for j in range(k):
        for l in range(j + 1):
            c = -(s2[j * k + l] / s0 - s1[j] * s1[l])
            if j == l:
                c += 1.0
            b_mat[j * k + l] = c
            b_mat[l * k + j] = c
    trsv(LOWER, TRANS, k, chol, k, a)                      # a = L^{-T} E xi
    trsm(LOWER, TRANS, k, k, 1.0, chol, k, b_mat, k)       # L^{-T} Y
    for j in range(k):                                   # transpose: Y L^{-1}
        for l in range(j):
            c = b_mat[j * k + l]
            b_mat[j * k + l] = b_mat[l * k + j]
            b_mat[l * k + j] = c
    trsm(LOWER, TRANS, k, k, 1.0, chol, k, b_mat, k)       # L^{-T} Y L^{-1}
    _sym_avg(k, b_mat)
    return RANKK_OK


cdef inline bint _is_diagonal(int k, const double* cov) noexcept nogil:
    cdef int j, l
    for j in range(k):
        for l in range(j):
            if fabs(cov[j * k + l]) > DIAGONAL_REL_TOL * sqrt(cov[j * k + j] * cov[l * k + l]):
                return False
            if fabs(cov[l * k + j]) > DIAGONAL_REL_TOL * sqrt(cov[j * k + j] * cov[l * k + l]):
                return False
    return True


cdef int rank_k_moments(const RankKModel* model, int k, const double* y,
                        const double* cavity_mean, const double* cavity_cov, const double* cavity_chol,
                        double* log_z, double* a, double* b_mat, double* work, int* iwork) noexcept nogil:
    """Moments of the k-dim tilted distribution t(z) N(z; h, Lambda) (Minka eqs 95-97).

    Writes ``log_z = log ∫ t(z) N(z; h, Lambda) dz``, ``a = d log Z / d h`` (k) and
    ``b_mat = -d^2 log Z / dh dh^T`` (k x k, row-major, symmetric).  ``cavity_chol`` is
    the lower Cholesky factor of the (PD) cavity covariance.  ``work`` needs
    ``2 k^2 + 8 k`` doubles, ``iwork`` k ints.  Returns a ``RankKStatus``.
    """
    cdef int st
    if model.kind == RANKK_MVGAUSSIAN:
        st = _moments_mvgaussian(model, k, y, cavity_mean, cavity_cov, log_z, a, b_mat, work)
    elif _is_diagonal(k, cavity_cov):
        st = _moments_product_diagonal(model, k, y, cavity_mean, cavity_cov, log_z, a, b_mat)
    elif not model.quadrature_ok:
        return RANKK_NO_QUADRATURE
    else:
        st = _moments_product_quadrature(model, k, y, cavity_mean, cavity_chol, log_z, a, b_mat,
                                         work, iwork)
    if st != RANKK_OK:
        return st
    if not (isfinite(log_z[0]) and _all_finite(k, a) and _all_finite(k * k, b_mat)):
        return RANKK_FAILED
    return RANKK_OK


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


cdef int _cavity(int k, int d, const double* x_i, const double* v, const double* m,
                 const double* p_site, const double* b_site, Work* w) noexcept nogil:
    """Projected cavity of factor i (eqs 103, 106) from the current V (lower triangle used), m.

    (I - S P_i) Lambda_i = S  and  (I - S P_i) h_i = X_i^T m - S b_i.
    """
    cdef int j
    symm(RIGHT, LOWER, k, d, 1.0, v, d, x_i, d, 0.0, w.ut, d)          # U^T = X_i^T V
    gemm(NO_TRANS, TRANS, k, k, d, 1.0, x_i, d, w.ut, d, 0.0, w.s, k)    # S = X_i^T V X_i
    _sym_avg(k, w.s)
    gemv(k, d, 1.0, x_i, d, m, 0.0, w.hm)                            # X_i^T m
    gemm(NO_TRANS, NO_TRANS, k, k, k, -1.0, w.s, k, p_site, k, 0.0, w.lu, k)
    _add_identity(k, w.lu)
    if lu_factor(k, w.lu, k, w.ipiv) != 0:
        return RANKK_BAD_CAVITY
    _solve_sym_rhs(k, w.lu, w.ipiv, w.s, w.lam, w.col)
    _sym_avg(k, w.lam)
    for j in range(k):
        w.h[j] = w.hm[j]
    gemv(k, k, -1.0, w.s, k, b_site, 1.0, w.h)
    lu_solve(k, w.lu, k, w.ipiv, w.h)
    if not (_all_finite(k * k, w.lam) and _all_finite(k, w.h)):
        return RANKK_BAD_CAVITY
    if not _cholesky_lower(k, w.lam, w.lam_chol):
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
    gemm(NO_TRANS, NO_TRANS, k, k, k, -1.0, w.b_mat, k, w.lam, k, 0.0, w.lu, k)
    _add_identity(k, w.lu)
    if lu_factor(k, w.lu, k, w.ipiv) != 0:
        return RANKK_FAILED
    _solve_sym_rhs(k, w.lu, w.ipiv, w.b_mat, w.p_new, w.col)
    _sym_avg(k, w.p_new)
    for j in range(k):
        w.vec[j] = w.h[j]
    gemv(k, k, 1.0, w.lam, k, w.a, 1.0, w.vec)
    for j in range(k):
        w.b_new[j] = w.a[j]
    gemv(k, k, 1.0, w.p_new, k, w.vec, 1.0, w.b_new)
    if not (_all_finite(k * k, w.p_new) and _all_finite(k, w.b_new)):
        return RANKK_FAILED
    # Damped change in natural parameters.
    for j in range(k * k):
        w.dp[j] = damping * (w.p_new[j] - p_site[j])
    for j in range(k):
        w.db[j] = damping * (w.b_new[j] - b_site[j])
    # Woodbury (eqs 114, 116): (I + dP S) [G | c] = [dP | db - dP X_i^T m].
    gemm(NO_TRANS, NO_TRANS, k, k, k, 1.0, w.dp, k, w.s, k, 0.0, w.lu, k)
    _add_identity(k, w.lu)
    if lu_factor(k, w.lu, k, w.ipiv) != 0:
        return RANKK_NOT_PD
    _solve_sym_rhs(k, w.lu, w.ipiv, w.dp, w.g, w.col)
    _sym_avg(k, w.g)
    for j in range(k):
        w.c[j] = w.db[j]
    gemv(k, k, -1.0, w.dp, k, w.hm, 1.0, w.c)
    lu_solve(k, w.lu, k, w.ipiv, w.c)
    if not (_all_finite(k * k, w.g) and _all_finite(k, w.c)):
        return RANKK_FAILED
    # V_new PD  <=>  X_i^T V_new X_i = S - S G S is PD (V PD, S PD).
    gemm(NO_TRANS, NO_TRANS, k, k, k, 1.0, w.g, k, w.s, k, 0.0, w.tmp, k)
    for j in range(k * k):
        w.b_mat[j] = w.s[j]
    gemm(NO_TRANS, NO_TRANS, k, k, k, -1.0, w.s, k, w.tmp, k, 1.0, w.b_mat, k)
    _sym_avg(k, w.b_mat)
    if not _cholesky_lower(k, w.b_mat, w.tmp):
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


cdef int _refresh(int n, int k, int d, const double* x, const double* p_sites, const double* b_sites,
                  const double* v0_inv, const double* v0_inv_m0, double* v, double* m,
                  double* rhs, double* chunk, double* log_det_precision) noexcept nogil:
    """Rebuild V and m from the sites (invariant, eqs 46-47 for rank k).

    V^{-1} = V0^{-1} + sum_i X_i P_i X_i^T (one gemm per chunk of factors),
    rhs = V0^{-1} m0 + sum_i X_i b_i, m = V rhs via the Cholesky factor.  Writes
    ``rhs`` (so that m^T V^{-1} m = rhs^T m) and log |V^{-1}|.  Returns potrf's info.
    """
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
    _sym_avg(d, v)
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


def _check_common(X, y, prior_mean, prior_cov, RankKLikelihood likelihood, site_precision,
                  site_natural_mean, bint sites_in_place):
    if likelihood is None or likelihood.kind < 0:
        raise TypeError("likelihood must be built with RankKLikelihood.mvgaussian or RankKLikelihood.product")
    if not isinstance(X, np.ndarray) or X.ndim != 3:
        raise ValueError("X must be a 3-D array of shape (n, k, d)")
    n, k, d = X.shape
    if n < 1 or k < 1 or d < 1:
        raise ValueError(f"X must have n >= 1, k >= 1 and d >= 1, got shape {X.shape}")
    X = _input(X, "X", (n, k, d))
    y = _input(y, "y", (n, k))
    prior_mean = _input(prior_mean, "prior_mean", (d,))
    prior_cov = _input(prior_cov, "prior_cov", (d, d))
    if likelihood.kind == RANKK_MVGAUSSIAN and likelihood.k != k:
        raise ValueError(f"likelihood noise_cov is {likelihood.k}x{likelihood.k} but X has k = {k}")
    if likelihood.kind == RANKK_PRODUCT and k > 1 and likelihood.n_nodes ** k > MAX_QUADRATURE_POINTS:
        raise ValueError(f"n_nodes**k = {likelihood.n_nodes}**{k} exceeds {MAX_QUADRATURE_POINTS} "
                         "quadrature points; lower n_nodes")
    if sites_in_place:
        site_precision = _inout(site_precision, "site_precision", (n, k, k))
        site_natural_mean = _inout(site_natural_mean, "site_natural_mean", (n, k))
    else:
        site_precision = np.ascontiguousarray(site_precision, dtype=np.float64)
        site_natural_mean = np.ascontiguousarray(site_natural_mean, dtype=np.float64)
        if site_precision.shape != (n, k, k):
            raise ValueError(f"site_precision must have shape {(n, k, k)}, got {site_precision.shape}")
        if site_natural_mean.shape != (n, k):
            raise ValueError(f"site_natural_mean must have shape {(n, k)}, got {site_natural_mean.shape}")
    if not (np.all(np.isfinite(site_precision)) and np.all(np.isfinite(site_natural_mean))):
        raise ValueError("site_precision and site_natural_mean must be finite")
    if np.any(np.abs(site_precision - site_precision.transpose(0, 2, 1))
              > 1e-10 * (1.0 + np.abs(site_precision))):
        raise ValueError("site_precision must hold symmetric k x k matrices")
    # Prior precision and V0^{-1} m0.
    L0 = prior_cov.copy()
    info = _potrf_py(L0)
    if info != 0:
        raise LinAlgError("prior_cov is not positive definite")
    log_det_v0 = 2.0 * float(np.sum(np.log(np.diag(L0))))
    v0_inv = L0
    _potri_py(v0_inv)
    v0_inv_m0 = v0_inv @ prior_mean
    return (X, y, prior_mean, v0_inv, v0_inv_m0, log_det_v0, n, k, d,
            site_precision, site_natural_mean)


def _potrf_py(double[:, ::1] a):
    cdef int n = a.shape[0], info, i, j
    with nogil:
        info = potrf(LOWER, n, &a[0, 0], n)
    if info == 0:
        for i in range(n):
            for j in range(i + 1, n):
                a[i, j] = 0.0
    return info


def _potri_py(double[:, ::1] a):
    cdef int n = a.shape[0], info
    with nogil:
        info = potri(LOWER, n, &a[0, 0], n)
        symmetrize(LOWER, n, &a[0, 0], n)
    if info != 0:
        raise LinAlgError("prior_cov is singular")


def _status_error(int status, Py_ssize_t i):
    if status == RANKK_BAD_LABEL:
        return ValueError(f"y[{i}] holds a label outside the support of the likelihood")
    if status == RANKK_NO_QUADRATURE:
        return ValueError(
            f"factor {i} has a correlated cavity covariance; the PRODUCT quadrature supports only "
            "probit (finite slope), logistic and Gaussian 1-D likelihoods")
    return None


def run_rank_k_ep(X, y, prior_mean, prior_cov, RankKLikelihood likelihood, site_precision,
                  site_natural_mean, post_mean, post_cov, double damping=1.0, double tol=1e-8,
                  int max_sweeps=200, int refresh_every=1, object sweep_callback=None):
    """Run sequential rank-k Gaussian EP sweeps (Minka eqs 95-116), updating the state in place.

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
    site_precision : ndarray, shape (n, k, k), float64, C-contiguous, in/out
        Site precisions P_i = v_i^{-1} (eq 98); zeros for a cold start.
    site_natural_mean : ndarray, shape (n, k), float64, C-contiguous, in/out
        Site natural means b_i = v_i^{-1} m_i.
    post_mean : ndarray, shape (d,), out
    post_cov : ndarray, shape (d, d), out
        Overwritten: on entry V and m are rebuilt from the sites (eqs 46-47), so any
        consistent warm start is given by the sites alone.
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
    sweep_callback : callable, optional
        Called as ``sweep_callback(sweep, max_change, nan)`` after every sweep that did not
        stall; returning ``False`` stops the sweeps (the state is refreshed from the sites and
        ``stopped`` is True).

    Returns
    -------
    SweepResult
        ``max_change`` of the last sweep, ``n_skipped`` the factor updates skipped in all
        sweeps (see the module docstring for the policy), ``diagnostics["n_skipped_last_sweep"]``;
        ``log_z`` is NaN (:func:`rank_k_log_evidence` computes it).

    Raises
    ------
    numpy.linalg.LinAlgError
        If prior_cov is not PD, or the sites give a non-PD posterior precision at a rebuild.
    ValueError
        Bad shapes / values, a label the likelihood rejects, or an unsupported quadrature.
        Input checks run before any state changes; a label error found during a sweep
        leaves the sites and V, m as they were after the last completed factor update.
    """
    if not (0.0 < damping <= 1.0):
        raise ValueError(f"damping must be in (0, 1], got {damping}")
    if not (tol >= 0.0):
        raise ValueError(f"tol must be >= 0, got {tol}")
    if max_sweeps < 0:
        raise ValueError(f"max_sweeps must be >= 0, got {max_sweeps}")
    if refresh_every < 0:
        raise ValueError(f"refresh_every must be >= 0, got {refresh_every}")
    X, y, prior_mean, v0_inv, v0_inv_m0, log_det_v0, n, k, d, site_precision, site_natural_mean = \
        _check_common(X, y, prior_mean, prior_cov, likelihood, site_precision, site_natural_mean, True)
    post_mean = _inout(post_mean, "post_mean", (d,))
    post_cov = _inout(post_cov, "post_cov", (d, d))

    cdef const double[:, :, ::1] x_v = X
    cdef const double[:, ::1] y_v = y
    cdef const double[:, ::1] v0i_v = v0_inv
    cdef const double[::1] v0im0_v = v0_inv_m0
    cdef double[:, :, ::1] p_v = site_precision
    cdef double[:, ::1] b_v = site_natural_mean
    cdef double[::1] m_v = post_mean
    cdef double[:, ::1] v_v = post_cov
    cdef int n_ = n, k_ = k, d_ = d
    rhs = np.empty(d)
    chunk = np.empty(min(max(n, 1), REFRESH_CHUNK) * k * d)
    work = np.empty(_work_doubles(k, d))
    ipiv = np.empty(k, dtype=_IPIV_DTYPE)
    iwork = np.empty(k, dtype=np.intc)
    cdef double[::1] rhs_v = rhs, chunk_v = chunk, work_v = work
    cdef blas_int[::1] ipiv_v = ipiv
    cdef int[::1] iwork_v = iwork
    cdef Work w
    cdef const RankKModel* model = &likelihood.model
    cdef double log_det_prec = 0.0, max_change = 0.0
    cdef int info, i, st = RANKK_OK, bad_status = RANKK_OK
    cdef Py_ssize_t bad_i = -1
    cdef int sweep, n_sweeps = 0, n_skip_sweep = 0
    cdef long n_skipped = 0
    cdef bint stalled = False, refreshed_last = True
    cdef SweepDriver driver = SweepDriver(tol, max_sweeps, sweep_callback)
    _work_layout(&w, &work_v[0], &ipiv_v[0], &iwork_v[0], k_, d_)

    with nogil:
        info = _refresh(n_, k_, d_, &x_v[0, 0, 0], &p_v[0, 0, 0], &b_v[0, 0], &v0i_v[0, 0], &v0im0_v[0],
                        &v_v[0, 0], &m_v[0], &rhs_v[0], &chunk_v[0], &log_det_prec)
    if info != 0:
        raise LinAlgError("posterior precision V0^{-1} + sum_i X_i P_i X_i^T is not positive definite "
                          "(site_precision gives an improper posterior)")
    for sweep in range(max_sweeps):
        with nogil:
            max_change = 0.0
            n_skip_sweep = 0
            for i in range(n_):
                st = _update_factor(model, k_, d_, &x_v[i, 0, 0], &y_v[i, 0], &v_v[0, 0], &m_v[0],
                                    &p_v[i, 0, 0], &b_v[i, 0], damping, &max_change, &w)
                if st == RANKK_BAD_LABEL or st == RANKK_NO_QUADRATURE:
                    bad_i = i
                    bad_status = st
                    break
                if st != RANKK_OK:
                    n_skip_sweep += 1
        if bad_i >= 0:
            symmetrize(LOWER, d_, &v_v[0, 0], d_)
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
            with nogil:
                info = _refresh(n_, k_, d_, &x_v[0, 0, 0], &p_v[0, 0, 0], &b_v[0, 0], &v0i_v[0, 0],
                                &v0im0_v[0], &v_v[0, 0], &m_v[0], &rhs_v[0], &chunk_v[0], &log_det_prec)
            if info != 0:
                raise LinAlgError("posterior precision lost positive definiteness at a refresh "
                                  f"after sweep {n_sweeps}")
            refreshed_last = True
        if stalled or driver.stopped:
            break
    if not refreshed_last:
        symmetrize(LOWER, d_, &v_v[0, 0], d_)
    return driver.result(has_log_z=False, diagnostics={"n_skipped_last_sweep": int(n_skip_sweep)}).replace(
        max_change=float(max_change), n_skipped=n_skipped, n_failed=0)


def rank_k_log_evidence(X, y, prior_mean, prior_cov, RankKLikelihood likelihood, site_precision,
                        site_natural_mean):
    """EP approximation of log p(y) from the sites (eqs 48-49, 109-110 regrouped).

    V and m are rebuilt from the sites (eqs 46-47) rather than read from a drifting
    state; each factor contributes ``log Z_i - log G_i`` (see the module docstring),
    which is finite for singular site precisions.

    Raises
    ------
    numpy.linalg.LinAlgError
        If the posterior or a cavity is improper (the evidence is then undefined).
    """
    X, y, prior_mean, v0_inv, v0_inv_m0, log_det_v0, n, k, d, sp, sb = _check_common(
        X, y, prior_mean, prior_cov, likelihood, site_precision, site_natural_mean, False)
    post_cov = np.empty((d, d))
    post_mean = np.empty(d)
    rhs = np.empty(d)
    chunk = np.empty(min(max(n, 1), REFRESH_CHUNK) * k * d)
    work = np.empty(_work_doubles(k, d))
    ipiv = np.empty(k, dtype=_IPIV_DTYPE)
    iwork = np.empty(k, dtype=np.intc)
    cdef const double[:, :, ::1] x_v = X
    cdef const double[:, ::1] y_v = y
    cdef const double[:, ::1] v0i_v = v0_inv
    cdef const double[::1] v0im0_v = v0_inv_m0
    cdef const double[:, :, ::1] p_v = sp
    cdef const double[:, ::1] b_v = sb
    cdef double[::1] m_v = post_mean, rhs_v = rhs, chunk_v = chunk, work_v = work
    cdef double[:, ::1] v_v = post_cov
    cdef blas_int[::1] ipiv_v = ipiv
    cdef int[::1] iwork_v = iwork
    cdef int n_ = n, k_ = k, d_ = d, i, j, info, st = RANKK_OK, sign = 0
    cdef Py_ssize_t bad_i = -1
    cdef Work w
    cdef const RankKModel* model = &likelihood.model
    cdef double log_det_prec = 0.0, log_z, log_g, log_det, quad, total = 0.0
    _work_layout(&w, &work_v[0], &ipiv_v[0], &iwork_v[0], k_, d_)
    with nogil:
        info = _refresh(n_, k_, d_, &x_v[0, 0, 0], &p_v[0, 0, 0], &b_v[0, 0], &v0i_v[0, 0], &v0im0_v[0],
                        &v_v[0, 0], &m_v[0], &rhs_v[0], &chunk_v[0], &log_det_prec)
    if info != 0:
        raise LinAlgError("posterior precision V0^{-1} + sum_i X_i P_i X_i^T is not positive definite")
    with nogil:
        for i in range(n_):
            st = _cavity(k_, d_, &x_v[i, 0, 0], &v_v[0, 0], &m_v[0], &p_v[i, 0, 0], &b_v[i, 0], &w)
            if st != RANKK_OK:
                bad_i = i
                break
            st = rank_k_moments(model, k_, &y_v[i, 0], w.h, w.lam, w.lam_chol, &log_z, w.a, w.b_mat,
                                w.mwork, w.iwork)
            if st != RANKK_OK:
                bad_i = i
                break
            # log G_i with (I + P Lambda): t = (I + P Lambda)^{-1} b,  u = (I + P Lambda)^{-1} P h.
            gemm(NO_TRANS, NO_TRANS, k_, k_, k_, 1.0, &p_v[i, 0, 0], k_, w.lam, k_, 0.0, w.lu, k_)
            _add_identity(k_, w.lu)
            if lu_factor(k_, w.lu, k_, w.ipiv) != 0:
                st = RANKK_BAD_CAVITY
                bad_i = i
                break
            log_det = lu_log_abs_det(k_, w.lu, k_, w.ipiv, &sign)
            if sign <= 0:
                st = RANKK_BAD_CAVITY
                bad_i = i
                break
            for j in range(k_):
                w.vec[j] = b_v[i, j]
            lu_solve(k_, w.lu, k_, w.ipiv, w.vec)                           # t
            gemv(k_, k_, 1.0, &p_v[i, 0, 0], k_, w.h, 0.0, w.c)
            lu_solve(k_, w.lu, k_, w.ipiv, w.c)                             # u
            gemv(k_, k_, 1.0, w.lam, k_, &b_v[i, 0], 0.0, w.col)            # Lambda b
            log_g = -0.5 * log_det
            for j in range(k_):
                log_g += w.h[j] * w.vec[j] - 0.5 * w.h[j] * w.c[j] + 0.5 * w.vec[j] * w.col[j]
            total += log_z - log_g
    if bad_i >= 0:
        err = _status_error(st, bad_i)
        if err is not None:
            raise err
        if st == RANKK_FAILED:
            raise FloatingPointError(f"tilted moments of factor {bad_i} are not finite")
        raise LinAlgError(f"cavity of factor {bad_i} is improper; the EP log evidence is undefined")
    quad = float(rhs @ post_mean) - float(prior_mean @ v0_inv_m0)
    total += 0.5 * (-log_det_prec - log_det_v0) + 0.5 * quad
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
    if likelihood.kind == RANKK_MVGAUSSIAN and likelihood.k != k:
        raise ValueError(f"likelihood noise_cov is {likelihood.k}x{likelihood.k} but the cavity has k = {k}")
    if likelihood.kind == RANKK_PRODUCT and k > 1 and likelihood.n_nodes ** k > MAX_QUADRATURE_POINTS:
        raise ValueError(f"n_nodes**k exceeds {MAX_QUADRATURE_POINTS} quadrature points")
    chol = lam.copy()
    if _potrf_py(chol) != 0:
        raise LinAlgError("cavity_cov is not positive definite")
    a = np.empty(k)
    b_mat = np.empty((k, k))
    work = np.empty(2 * k * k + 8 * k)
    iwork = np.empty(k, dtype=np.intc)
    cdef const double[::1] y_v = yy, h_v = h
    cdef const double[:, ::1] lam_v = lam, chol_v = chol
    cdef double[::1] a_v = a, work_v = work
    cdef double[:, ::1] bm_v = b_mat
    cdef int[::1] iw_v = iwork
    cdef double log_z = 0.0
    cdef int st, k_ = k
    with nogil:
        st = rank_k_moments(&likelihood.model, k_, &y_v[0], &h_v[0], &lam_v[0, 0], &chol_v[0, 0], &log_z,
                            &a_v[0], &bm_v[0, 0], &work_v[0], &iw_v[0])
    if st != RANKK_OK:
        err = _status_error(st, 0)
        if err is not None:
            raise err
        raise FloatingPointError(f"tilted moments failed (status {st})")
    return float(log_z), a, b_mat
