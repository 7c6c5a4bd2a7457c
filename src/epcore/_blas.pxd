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
from scipy.linalg.cython_lapack cimport dpotrf as _dpotrf, dpotri as _dpotri, dpotrs as _dpotrs


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
