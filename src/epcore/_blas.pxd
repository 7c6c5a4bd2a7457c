# cython: language_level=3
"""Inline, GIL-free wrappers around scipy's BLAS/LAPACK for the EP kernels.

All matrices handed to these wrappers are C-contiguous row-major arrays.  A
row-major symmetric matrix is its own transpose, so a row-major array seen by
Fortran BLAS is the same matrix; ``uplo='U'`` for BLAS means the *lower*
triangle of the row-major array.  Wrappers take row-major semantics and
translate: ``lower=True`` here means the lower triangle of the C array is
referenced.
"""
include "_blas_int.pxi"

from scipy.linalg.cython_blas cimport (
    ddot as _ddot, daxpy as _daxpy, dscal as _dscal, dcopy as _dcopy, dnrm2 as _dnrm2,
    dsymv as _dsymv, dgemv as _dgemv, dsyr as _dsyr, dger as _dger, dtrsv as _dtrsv,
    dsyrk as _dsyrk, dgemm as _dgemm, dsymm as _dsymm, dtrsm as _dtrsm, dsyr2 as _dsyr2,
)
from scipy.linalg.cython_lapack cimport (
    dpotrf as _dpotrf, dpotri as _dpotri, dpotrs as _dpotrs, dtrtri as _dtrtri,
)


# Named values of the wrappers' flag arguments (``lower``, ``transpose``, ``right``), so that a
# call reads ``trsm_right(LOWER, TRANS, ...)`` rather than ``trsm_right(True, True, ...)``.
cdef enum Triangle:
    UPPER = 0
    LOWER = 1

cdef enum Transpose:
    NO_TRANS = 0
    TRANS = 1

cdef enum Side:
    LEFT = 0
    RIGHT = 1


cdef inline double ddot(int n, const double* x, int incx, const double* y, int incy) noexcept nogil:
    cdef blas_int n_ = n, ix = incx, iy = incy
    return _ddot(&n_, <double*>x, &ix, <double*>y, &iy)


cdef inline void daxpy(int n, double alpha, const double* x, int incx, double* y, int incy) noexcept nogil:
    cdef blas_int n_ = n, ix = incx, iy = incy
    _daxpy(&n_, &alpha, <double*>x, &ix, y, &iy)


cdef inline void dscal(int n, double alpha, double* x, int incx) noexcept nogil:
    cdef blas_int n_ = n, ix = incx
    _dscal(&n_, &alpha, x, &ix)


cdef inline void dcopy(int n, const double* x, int incx, double* y, int incy) noexcept nogil:
    cdef blas_int n_ = n, ix = incx, iy = incy
    _dcopy(&n_, <double*>x, &ix, y, &iy)


cdef inline void symv(bint lower, int n, double alpha, const double* a, int lda,
                      const double* x, double beta, double* y) noexcept nogil:
    """y = alpha * A x + beta * y for symmetric row-major A, one triangle referenced."""
    cdef blas_int n_ = n, lda_ = lda, one = 1
    cdef char uplo = b'U' if lower else b'L'
    _dsymv(&uplo, &n_, &alpha, <double*>a, &lda_, <double*>x, &one, &beta, y, &one)


cdef inline void gemv(int m, int n, double alpha, const double* a, int lda,
                      const double* x, double beta, double* y) noexcept nogil:
    """y = alpha * A x + beta * y for row-major A (m x n)."""
    cdef blas_int m_ = m, n_ = n, lda_ = lda, one = 1
    cdef char trans = b'T'
    _dgemv(&trans, &n_, &m_, &alpha, <double*>a, &lda_, <double*>x, &one, &beta, y, &one)


cdef inline void gemv_t(int m, int n, double alpha, const double* a, int lda,
                        const double* x, double beta, double* y) noexcept nogil:
    """y = alpha * A^T x + beta * y for row-major A (m x n); y has n entries."""
    cdef blas_int m_ = m, n_ = n, lda_ = lda, one = 1
    cdef char trans = b'N'
    _dgemv(&trans, &n_, &m_, &alpha, <double*>a, &lda_, <double*>x, &one, &beta, y, &one)


cdef inline void syr(bint lower, int n, double alpha, const double* x, double* a, int lda) noexcept nogil:
    """A += alpha * x x^T on one triangle of symmetric row-major A."""
    cdef blas_int n_ = n, lda_ = lda, one = 1
    cdef char uplo = b'U' if lower else b'L'
    _dsyr(&uplo, &n_, &alpha, <double*>x, &one, a, &lda_)


cdef inline void ger(int m, int n, double alpha, const double* x, const double* y,
                     double* a, int lda) noexcept nogil:
    """A += alpha * x y^T for row-major A (m x n)."""
    cdef blas_int m_ = m, n_ = n, lda_ = lda, one = 1
    _dger(&n_, &m_, &alpha, <double*>y, &one, <double*>x, &one, a, &lda_)


cdef inline void syrk(bint lower, int n, int k, double alpha, const double* a, int lda,
                      double beta, double* c, int ldc) noexcept nogil:
    """C = alpha * A^T A + beta * C for row-major A (k x n), one triangle of C."""
    cdef blas_int n_ = n, k_ = k, lda_ = lda, ldc_ = ldc
    cdef char uplo = b'U' if lower else b'L'
    cdef char trans = b'N'
    # Fortran sees A^T (n x k, column-major with leading dim lda): C = A^T (A^T)^T.
    _dsyrk(&uplo, &trans, &n_, &k_, &alpha, <double*>a, &lda_, &beta, c, &ldc_)


cdef inline void trsv(bint lower, bint transpose, int n, const double* a, int lda, double* x) noexcept nogil:
    """Solve op(A) x = b in place, A triangular row-major (non-unit diagonal)."""
    cdef blas_int n_ = n, lda_ = lda, one = 1
    # Row-major lower == column-major upper of the transpose.
    cdef char uplo = b'U' if lower else b'L'
    cdef char trans = b'N' if transpose else b'T'
    cdef char diag = b'N'
    _dtrsv(&uplo, &trans, &diag, &n_, <double*>a, &lda_, x, &one)


cdef inline int potrf(bint lower, int n, double* a, int lda) noexcept nogil:
    """Cholesky in place of symmetric row-major A: lower=True gives A = L L^T in the lower triangle.

    Returns LAPACK's info (0 on success, k > 0 if the leading k x k minor is not PD).
    """
    cdef blas_int n_ = n, lda_ = lda, info = 0
    cdef char uplo = b'U' if lower else b'L'
    _dpotrf(&uplo, &n_, a, &lda_, &info)
    return <int>info


cdef inline int potri(bint lower, int n, double* a, int lda) noexcept nogil:
    """Inverse from a Cholesky factor in place (one triangle of the result is written)."""
    cdef blas_int n_ = n, lda_ = lda, info = 0
    cdef char uplo = b'U' if lower else b'L'
    _dpotri(&uplo, &n_, a, &lda_, &info)
    return <int>info


cdef inline int trtri(bint lower, int n, double* a, int lda) noexcept nogil:
    """Inverse in place of a triangular row-major A (non-unit diagonal); lower=True: the lower
    triangle of the C array is inverted (the other triangle is not referenced).

    Returns LAPACK's info (0 on success, k > 0 if A[k-1, k-1] is exactly zero).
    """
    cdef blas_int n_ = n, lda_ = lda, info = 0
    cdef char uplo = b'U' if lower else b'L'
    cdef char diag = b'N'
    _dtrtri(&uplo, &diag, &n_, a, &lda_, &info)
    return <int>info


cdef inline void symmetrize(bint from_lower, int n, double* a, int lda) noexcept nogil:
    """Copy one triangle of row-major A onto the other."""
    cdef int i, j
    if from_lower:
        for i in range(n):
            for j in range(i):
                a[j * lda + i] = a[i * lda + j]
    else:
        for i in range(n):
            for j in range(i):
                a[i * lda + j] = a[j * lda + i]


cdef inline void symm_right(bint lower, int m, int n, double alpha, const double* a, int lda,
                            const double* b, int ldb, double beta, double* c, int ldc) noexcept nogil:
    """C = alpha * B A + beta * C for symmetric row-major A (n x n, one triangle referenced).

    B and C are row-major (m x n).  With B = rows of a data matrix this gives the
    products x_i^T A for a block of rows at BLAS-3 speed.
    """
    cdef blas_int m_ = m, n_ = n, lda_ = lda, ldb_ = ldb, ldc_ = ldc
    cdef char side = b'L'
    cdef char uplo = b'U' if lower else b'L'
    # Fortran sees C^T (n x m) = A B^T: a left-side symm on the transposed views.
    _dsymm(&side, &uplo, &n_, &m_, &alpha, <double*>a, &lda_, <double*>b, &ldb_, &beta, c, &ldc_)

# ---------------------------------------------------------------------------
# Rank-k additions (helper C, rank_k_ep): BLAS-3 and small LU wrappers.
# Same row-major conventions as above.  Everything below this line belongs to
# this block; other additions should go in their own block.
# ---------------------------------------------------------------------------
from scipy.linalg.cython_blas cimport dsyr2k as _dsyr2k
from scipy.linalg.cython_lapack cimport dgetrf as _dgetrf, dgetrs as _dgetrs
from libc.math cimport log as _log_rk, INFINITY as _INF_rk


cdef inline void gemm(bint trans_a, bint trans_b, int m, int n, int k, double alpha,
                      const double* a, int lda, const double* b, int ldb,
                      double beta, double* c, int ldc) noexcept nogil:
    """C = alpha * op(A) op(B) + beta * C for row-major arrays; C is m x n, op(A) m x k, op(B) k x n."""
    cdef blas_int m_ = m, n_ = n, k_ = k, lda_ = lda, ldb_ = ldb, ldc_ = ldc
    # Column-major sees C^T = op(B)^T op(A)^T; the memory of a row-major A is A^T.
    cdef char ta = b'T' if trans_a else b'N'
    cdef char tb = b'T' if trans_b else b'N'
    _dgemm(&tb, &ta, &n_, &m_, &k_, &alpha, <double*>b, &ldb_, <double*>a, &lda_, &beta, c, &ldc_)


cdef inline void symm(bint right, bint lower, int m, int n, double alpha, const double* a, int lda,
                      const double* b, int ldb, double beta, double* c, int ldc) noexcept nogil:
    """C = alpha * A B + beta * C (right=False, A m x m symmetric) or alpha * B A + beta * C
    (right=True, A n x n symmetric) for row-major arrays; C and B are m x n; one triangle of A is referenced."""
    cdef blas_int m_ = n, n_ = m, lda_ = lda, ldb_ = ldb, ldc_ = ldc
    # Column-major sees C^T = B^T A (left) or A B^T (right): the side flips.
    cdef char side = b'L' if right else b'R'
    cdef char uplo = b'U' if lower else b'L'
    _dsymm(&side, &uplo, &m_, &n_, &alpha, <double*>a, &lda_, <double*>b, &ldb_, &beta, c, &ldc_)


cdef inline void syr2k(bint lower, int n, int k, double alpha, const double* a, int lda,
                       const double* b, int ldb, double beta, double* c, int ldc) noexcept nogil:
    """C = alpha * (A^T B + B^T A) + beta * C on one triangle of symmetric row-major C (n x n); A, B are k x n."""
    cdef blas_int n_ = n, k_ = k, lda_ = lda, ldb_ = ldb, ldc_ = ldc
    cdef char uplo = b'U' if lower else b'L'
    cdef char trans = b'N'
    _dsyr2k(&uplo, &trans, &n_, &k_, &alpha, <double*>a, &lda_, <double*>b, &ldb_, &beta, c, &ldc_)


cdef inline void trsm(bint lower, bint transpose, int n, int nrhs, double alpha, const double* a, int lda,
                      double* b, int ldb) noexcept nogil:
    """Solve op(A) X = alpha * B in place (X overwrites B); A n x n triangular row-major (non-unit
    diagonal), B n x nrhs row-major."""
    cdef blas_int m_ = nrhs, n_ = n, lda_ = lda, ldb_ = ldb
    # Column-major: X^T op(A)^T = alpha B^T with the memory of A read as A^T.
    cdef char side = b'R'
    cdef char uplo = b'U' if lower else b'L'
    cdef char trans = b'T' if transpose else b'N'
    cdef char diag = b'N'
    _dtrsm(&side, &uplo, &trans, &diag, &m_, &n_, &alpha, <double*>a, &lda_, b, &ldb_)


cdef inline int lu_factor(int n, double* a, int lda, blas_int* ipiv) noexcept nogil:
    """LU factorisation with partial pivoting in place of a general row-major A (n x n).

    LAPACK factorises the column-major view A^T; use ``lu_solve`` to solve with A itself.
    Returns LAPACK's info (0 on success, j > 0 if U[j-1, j-1] is exactly zero).
    """
    cdef blas_int n_ = n, lda_ = lda, info = 0
    _dgetrf(&n_, &n_, a, &lda_, ipiv, &info)
    return <int>info


cdef inline void lu_solve(int n, const double* lu, int lda, const blas_int* ipiv, double* x) noexcept nogil:
    """Solve A x = b in place for one right-hand side, from ``lu_factor`` of row-major A."""
    cdef blas_int n_ = n, lda_ = lda, one = 1, info = 0
    cdef char trans = b'T'   # (A^T)^T x = b
    _dgetrs(&trans, &n_, &one, <double*>lu, &lda_, <blas_int*>ipiv, x, &n_, &info)


cdef inline double lu_log_abs_det(int n, const double* lu, int lda, const blas_int* ipiv,
                                  int* sign) noexcept nogil:
    """log |det A| and its sign (written to ``sign``: +1, -1, or 0 if singular) from ``lu_factor``."""
    cdef int j, s = 1
    cdef double total = 0.0, u
    for j in range(n):
        u = lu[j * lda + j]
        if u == 0.0:
            sign[0] = 0
            return -_INF_rk
        if u < 0.0:
            s = -s
            u = -u
        if ipiv[j] != j + 1:
            s = -s
        total += _log_rk(u)
    sign[0] = s
    return total

# ---------------------------------------------------------------------------
# Sparse GP EP (sparse_ep): right-side triangular solve.  Same row-major
# conventions as above.  Everything below this line belongs to this block.
# ---------------------------------------------------------------------------

cdef inline void trsm_right(bint lower, bint transpose, int m, int n, double alpha,
                            const double* a, int lda, double* b, int ldb) noexcept nogil:
    """Solve X op(A) = alpha * B in place (X overwrites B); B m x n row-major, A n x n
    triangular row-major (non-unit diagonal); ``lower`` says which triangle of A is referenced."""
    cdef blas_int m_ = n, n_ = m, lda_ = lda, ldb_ = ldb
    # Column-major sees Bᵀ (n x m): op(A)ᵀ Xᵀ = alpha Bᵀ, a left-side solve; the memory of
    # row-major A read column-major is Aᵀ, so op_F = 'N' gives op(A)ᵀ when transpose is False.
    cdef char side = b'L'
    cdef char uplo = b'U' if lower else b'L'
    cdef char trans = b'T' if transpose else b'N'
    cdef char diag = b'N'
    _dtrsm(&side, &uplo, &trans, &diag, &m_, &n_, &alpha, <double*>a, &lda_, b, &ldb_)
