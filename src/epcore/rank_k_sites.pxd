# cython: language_level=3
"""k-output likelihoods and tilted moments of the rank-k engine (Minka §3, eqs 95-97): cdef
interface, with the small k x k helpers (row-major) that the engine shares."""
from libc.math cimport isfinite
from fastep._epcore._blas cimport LOWER, potrf
from fastep._epcore.sites cimport SiteModel, SiteSpec

cdef enum RankKKind:
    RANKK_MVGAUSSIAN = 0     # t(z) = N(y | z, R), R a k x k noise covariance (exact moments)
    RANKK_PRODUCT = 1        # t(z) = prod_j f(y_j, z_j) for a 1-D site kernel

cdef enum RankKStatus:
    RANKK_OK = 0
    RANKK_BAD_CAVITY = 1     # cavity improper: I - S P singular or Lambda not positive definite
    RANKK_BAD_LABEL = 2      # the 1-D site kernel rejected a label
    RANKK_FAILED = 3         # moments not finite / zero tilted mass / singular k x k system
    RANKK_NOT_PD = 4         # the new site would make the posterior covariance V non-PD
    RANKK_NO_QUADRATURE = 5  # correlated cavity but the 1-D likelihood has no log f for quadrature

cdef struct RankKModel:
    int kind                     # RankKKind
    int k                        # output dimension for RANKK_MVGAUSSIAN, -1 (any) for RANKK_PRODUCT
    const double* noise_cov      # RANKK_MVGAUSSIAN: k x k row-major R (PD)
    const SiteModel* site        # RANKK_PRODUCT: the 1-D likelihood
    bint quadrature_ok           # RANKK_PRODUCT: log f(y, z) = site log Z at zero cavity variance
    int n_nodes                  # Gauss-Hermite nodes per dimension
    const double* gh_points      # nodes xi_q for E_{xi ~ N(0,1)} (= sqrt(2) t_q)
    const double* gh_log_weights # log(w_q / sqrt(pi)); sum_q exp(.) = 1

cdef int rank_k_moments(const RankKModel* model, int k, const double* y,
                        const double* cavity_mean, const double* cavity_cov, const double* cavity_chol,
                        double* log_z, double* a, double* b_mat, double* work, int* iwork) noexcept nogil

cdef class RankKLikelihood:
    cdef readonly int kind
    cdef readonly int k
    cdef readonly object noise_cov        # float64 (k, k) or None
    cdef readonly SiteSpec site           # or None
    cdef readonly int n_nodes
    cdef readonly object gh_points
    cdef readonly object gh_log_weights
    cdef RankKModel model
    cdef _fill_model(self)


cdef inline void sym_average(int n, double* a) noexcept nogil:
    """Replace a by (a + a^T) / 2."""
    cdef int i, j
    cdef double v
    for i in range(n):
        for j in range(i):
            v = 0.5 * (a[i * n + j] + a[j * n + i])
            a[i * n + j] = v
            a[j * n + i] = v


cdef inline bint all_finite(int n, const double* a) noexcept nogil:
    cdef int i
    for i in range(n):
        if not isfinite(a[i]):
            return False
    return True


cdef inline bint cholesky_lower(int n, const double* a, double* l) noexcept nogil:
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
