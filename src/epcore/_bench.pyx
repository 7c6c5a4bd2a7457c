# cython: language_level=3
"""Baselines for the benchmarks: bare BLAS work with no EP logic around it."""
import numpy as np

from fastep._epcore._blas cimport gemv, gemv_t, symv, syr, trsv, UPPER, LOWER, NO_TRANS, TRANS, LEFT, RIGHT


def bare_rank1_updates(double[:, ::1] matrix, const double[:, ::1] vectors, double alpha):
    """Apply ``matrix += alpha * x x^T`` (one triangle, BLAS dsyr) for every row x of ``vectors``.

    The yardstick for one EP sweep: n rank-1 updates of a d x d matrix and nothing else.
    """
    cdef int n = vectors.shape[0], d = vectors.shape[1], i
    if matrix.shape[0] != d or matrix.shape[1] != d:
        raise ValueError("matrix must be (d, d) with d = vectors.shape[1]")
    with nogil:
        for i in range(n):
            syr(LOWER, d, alpha, &vectors[i, 0], &matrix[0, 0], d)


def bare_symv_rank1_updates(double[:, ::1] matrix, const double[:, ::1] vectors, double alpha,
                            double[::1] work):
    """For every row x: ``u = matrix @ x`` (dsymv) then ``matrix += alpha * u u^T`` (dsyr).

    The BLAS-only floor of a rank-1 EP site update (two passes over one triangle).
    """
    cdef int n = vectors.shape[0], d = vectors.shape[1], i
    if matrix.shape[0] != d or matrix.shape[1] != d or work.shape[0] != d:
        raise ValueError("matrix must be (d, d) and work (d,) with d = vectors.shape[1]")
    with nogil:
        for i in range(n):
            symv(LOWER, d, 1.0, &matrix[0, 0], d, &vectors[i, 0], 0.0, &work[0])
            syr(LOWER, d, alpha, &work[0], &matrix[0, 0], d)


def bare_blas_selection(const double[:, ::1] M, const double[:, ::1] L, const int[::1] points,
                        bint solves=True, X=None):
    """The BLAS work of a d-point selection and nothing else (benchmarks only).

    For k = 0..d-1 (d = len(points)): gather ``a = M[:k, points[k]]``, ``s = -M[:k]ᵀ a``
    (the M reads of eq 30, one gemv) and, with ``solves``, the Cholesky row-append
    solve ``L[:k, :k]⁻¹ a`` (one trsv; the engine obtains that row from M without it).
    ``M`` is (>= d) x n, ``L`` (>= d) x (>= d) lower triangular with a nonzero diagonal.
    With ``X`` (n x p, C-contiguous float64) each step first forms ``X x_{points[k]}`` (one
    gemv: the O(n p) product of a kernel column), so that X and M compete for the caches as
    in a selection.
    """
    cdef int d = points.shape[0], n = M.shape[1], ldl = L.shape[1], k, j, p = 0
    if M.shape[0] < d or L.shape[0] < d or ldl < d:
        raise ValueError("M and L need at least len(points) rows (and L as many columns)")
    cdef const double[:, ::1] Xv
    cdef const double* xp = NULL
    if X is not None:
        Xv = X
        if Xv.shape[0] != n:
            raise ValueError("X must have as many rows as M has columns")
        p = Xv.shape[1]
        xp = &Xv[0, 0]
    s_arr = np.empty(n)
    a_arr = np.empty(max(d, 1))
    xs_arr = np.empty(n)
    cdef double[::1] s = s_arr
    cdef double[::1] a = a_arr
    cdef double[::1] xs = xs_arr
    with nogil:
        for k in range(d):
            if xp != NULL:
                gemv(n, p, 1.0, xp, p, xp + <Py_ssize_t>points[k] * p, 0.0, &xs[0])
            for j in range(k):
                a[j] = M[j, points[k]]
            if k > 0:
                gemv_t(k, n, -1.0, &M[0, 0], n, &a[0], 0.0, &s[0])
                if solves:
                    trsv(LOWER, NO_TRANS, k, &L[0, 0], ldl, &a[0])
