# cython: language_level=3
"""k-output likelihoods of the rank-k EP engine and their tilted moments (Minka, "EP: a quick
reference", §3, eqs 95-97).

A factor ``t_i(z)`` of a k-dimensional projection ``z`` is a multivariate Gaussian
``N(y_i | z, R)`` (exact moments) or a product of 1-D likelihoods ``prod_j f(y_ij, z_j)``
(exact, separable moments when the cavity covariance is diagonal; a tensor-product
Gauss-Hermite rule in the whitened cavity otherwise). For a cavity ``N(z; h, Lambda)``,
``rank_k_moments`` gives

    log Z = log ∫ t(z) N(z; h, Lambda) dz,   a = d log Z / dh,   B = -d^2 log Z / dh dh^T,

which the engine (:mod:`fastep._epcore.rank_k_ep`) turns into new sites (eqs 107-108).
"""
import numpy as np
from numpy.linalg import LinAlgError

from libc.math cimport log, exp, sqrt, fabs, isfinite, INFINITY

from fastep._epcore._blas cimport LOWER, NO_TRANS, TRANS, trsv, potrf, potri, symmetrize, trsm
from fastep._epcore.sites cimport (
    SiteModel, SiteSpec, site_moments, SITE_OK, SITE_BAD_LABEL,
    LIK_PROBIT, LIK_LOGISTIC_MACKAY, LIK_LOGISTIC_GH, LIK_GAUSSIAN,
)

__all__ = ["RankKLikelihood", "MAX_QUADRATURE_POINTS"]

cdef double LOG_2PI = 1.8378770664093453
# Off-diagonal entries of the cavity covariance below this fraction of
# sqrt(Lambda_jj Lambda_ll) are treated as zero (exactly separable PRODUCT moments).
cdef double DIAGONAL_REL_TOL = 1e-14
MAX_QUADRATURE_POINTS = 1_000_000
MAX_NODES_PER_DIM = 256


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
    sym_average(k, b_mat)
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
    if not (isfinite(log_z[0]) and all_finite(k, a) and all_finite(k * k, b_mat)):
        return RANKK_FAILED
    return RANKK_OK
