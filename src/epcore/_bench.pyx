# cython: language_level=3
"""Baselines for the benchmarks: bare BLAS work with no EP logic around it."""
from fastep._epcore._blas cimport syr, symv


def bare_rank1_updates(double[:, ::1] matrix, const double[:, ::1] vectors, double alpha):
    """Apply ``matrix += alpha * x x^T`` (one triangle, BLAS dsyr) for every row x of ``vectors``.

    The yardstick for one EP sweep: n rank-1 updates of a d x d matrix and nothing else.
    """
    cdef int n = vectors.shape[0], d = vectors.shape[1], i
    if matrix.shape[0] != d or matrix.shape[1] != d:
        raise ValueError("matrix must be (d, d) with d = vectors.shape[1]")
    with nogil:
        for i in range(n):
            syr(True, d, alpha, &vectors[i, 0], &matrix[0, 0], d)


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
            symv(True, d, 1.0, &matrix[0, 0], d, &vectors[i, 0], 0.0, &work[0])
            syr(True, d, alpha, &work[0], &matrix[0, 0], d)
