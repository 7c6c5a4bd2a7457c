"""Dense linear algebra for the estimators, on the BLAS library the compiled core links.

numpy and scipy wheels each carry their own OpenBLAS, each with its own pool of worker
threads. The compiled engines (:mod:`fastep._epcore`) call scipy's through
``scipy.linalg.cython_blas``; if the Python code around them (kernel matrices, evidence
gradients, predictions) used numpy's ``@`` or ``numpy.linalg``, both pools would wake
during a fit and their idle workers, which spin before they sleep, would compete for the
same cores. Every matrix product and factorisation of a fit therefore goes through the
functions here, which call scipy's BLAS/LAPACK (``scipy.linalg.blas``/``lapack``), and
never changes any thread count (the README's "Threads" section gives the policy).

The functions take float64 arrays of any memory order and avoid copies where BLAS can
read the operand as it is (a C-ordered matrix is a transposed Fortran-ordered one).
"""
import numpy as np
from scipy.linalg import blas as _blas
from scipy.linalg import lapack as _lapack

__all__ = ["matmul", "gram", "inner", "quadratic_form", "cholesky_lower"]


def _as_fortran_operand(a):
    """``(array, trans)`` with ``op(array) == a`` for BLAS, without a copy when ``a`` is contiguous."""
    if a.flags.f_contiguous:
        return a, 0
    if a.flags.c_contiguous:
        return a.T, 1
    return np.asfortranarray(a), 0


def matmul(a, b):
    """``a @ b`` for float64 vectors and matrices (1-D or 2-D operands), through scipy's BLAS.

    Matrix-matrix products return a C-ordered array (computed as ``(bᵀ aᵀ)ᵀ`` by
    ``dgemm``); products with a vector use ``dgemv``; two vectors give their inner product.

    Parameters
    ----------
    a, b : array_like of float64, 1-D or 2-D
        Operands with matching inner dimension.

    Returns
    -------
    ndarray or float
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim == 1 and b.ndim == 1:
        return inner(a, b)
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} are not aligned")
    if a.ndim == 2 and b.ndim == 2:
        if 0 in a.shape or 0 in b.shape:
            return np.zeros((a.shape[0], b.shape[1]))
        left, trans_left = _as_fortran_operand(b.T)
        right, trans_right = _as_fortran_operand(a.T)
        return _blas.dgemm(1.0, left, right, trans_a=trans_left, trans_b=trans_right).T
    if a.ndim == 2:                              # matrix @ vector
        if 0 in a.shape:
            return np.zeros(a.shape[0])
        mat, trans = _as_fortran_operand(a)
        return _blas.dgemv(1.0, mat, np.ascontiguousarray(b), trans=trans)
    if 0 in b.shape:                             # vector @ matrix = bᵀ a
        return np.zeros(b.shape[1])
    mat, trans = _as_fortran_operand(b.T)
    return _blas.dgemv(1.0, mat, np.ascontiguousarray(a), trans=trans)


def gram(a):
    """``a @ a.T`` for a float64 matrix, by ``dsyrk``: exactly symmetric, C-ordered.

    The lower triangle is computed and mirrored (what numpy's matmul does for ``a @ a.T``).
    """
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"gram: a must be 2-D, got shape {a.shape}")
    n, k = a.shape
    if n == 0 or k == 0:
        return np.zeros((n, n))
    operand, trans = _as_fortran_operand(a.T)      # op(operand) = a.T, shape (k, n)
    # dsyrk with trans=1 forms op(operand)ᵀ op(operand) = a aᵀ when op is the identity
    if trans:                                      # operand = a itself (F-ordered (n, k) view of a.T)
        out = _blas.dsyrk(1.0, operand, trans=0, lower=1)
    else:
        out = _blas.dsyrk(1.0, operand, trans=1, lower=1)
    symmetrize_from_lower(out)
    return out.T                                   # symmetric: the C-ordered view holds the same matrix


def symmetrize_from_lower(A, block=256):
    """Copy the lower triangle of square ``A`` onto its upper triangle in place, blockwise
    (temporaries of ``n x block``, never ``n x n``); ``A`` may be C- or F-ordered."""
    n = A.shape[0]
    for j0 in range(0, n, block):
        j1 = min(j0 + block, n)
        # the upper part of columns j0:j1 (rows < column) from the lower part of rows j0:j1
        blk = A[j0:j1, :j1].T.copy()               # blk[r, c - j0] = A[c, r]
        mask = np.arange(j1)[:, None] < np.arange(j0, j1)[None, :]
        A[:j1, j0:j1] = np.where(mask, blk, A[:j1, j0:j1])


def inner(a, b):
    """``Σ a_ij b_ij`` over two float64 arrays of the same shape (``numpy.vdot``), by ``ddot``."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"inner: shapes {a.shape} and {b.shape} differ")
    if a.size == 0:
        return 0.0
    # both in the same memory order, so that element k of one meets element k of the other
    if a.flags.f_contiguous and b.flags.f_contiguous and not (a.flags.c_contiguous and b.flags.c_contiguous):
        return float(_blas.ddot(a.ravel(order="F"), b.ravel(order="F")))
    return float(_blas.ddot(np.ravel(a), np.ravel(b)))


def quadratic_form(w, A):
    """``wᵀ A w`` for a vector ``w`` and a square matrix ``A``."""
    return inner(w, matmul(A, w))


def cholesky_lower(A, *, what="the matrix"):
    """Lower Cholesky factor of the symmetric positive-definite ``A`` (its lower triangle is read).

    Returns a Fortran-ordered array with the upper triangle zeroed. Raises
    ``numpy.linalg.LinAlgError`` naming ``what`` when ``A`` is not positive definite.
    """
    A = np.asarray(A, dtype=np.float64)
    factor, info = _lapack.dpotrf(A, lower=1, clean=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"{what} is not positive definite (Cholesky factorisation failed at "
                                    f"pivot {info})" if info > 0 else f"dpotrf: illegal argument {-info}")
    return factor


def batched_cholesky(A):
    """Lower Cholesky factors of a stack of small symmetric matrices ``A`` (shape (n, c, c)).

    Column by column over the stack with elementwise numpy (no BLAS, no LAPACK: c is the
    number of classes, a few to tens). Returns ``(L, ok)``: ``ok[i]`` is False where ``A[i]``
    is not positive definite (its ``L[i]`` is then meaningless).
    """
    A = np.asarray(A, dtype=np.float64)
    n, c, _ = A.shape
    L = np.zeros_like(A)
    ok = np.ones(n, dtype=bool)
    for j in range(c):
        pivot = A[:, j, j] - np.sum(L[:, j, :j] * L[:, j, :j], axis=1)
        ok &= pivot > 0
        root = np.sqrt(np.where(pivot > 0, pivot, 1.0))
        L[:, j, j] = root
        for i in range(j + 1, c):
            L[:, i, j] = (A[:, i, j] - np.sum(L[:, i, :j] * L[:, j, :j], axis=1)) / root
    return L, ok


def batched_cholesky_solve(L, b):
    """``x[i] = (L[i] L[i]ᵀ)⁻¹ b[i]`` for a stack of lower factors ``L`` (n, c, c) and ``b`` (n, c)."""
    n, c, _ = L.shape
    z = np.array(b, dtype=np.float64)
    for j in range(c):                                   # forward: L z = b
        z[:, j] = (z[:, j] - np.sum(L[:, j, :j] * z[:, :j], axis=1)) / L[:, j, j]
    for j in range(c - 1, -1, -1):                       # backward: Lᵀ x = z
        z[:, j] = (z[:, j] - np.sum(L[:, j + 1:, j] * z[:, j + 1:], axis=1)) / L[:, j, j]
    return z


def batched_log_det_from_cholesky(L):
    """``log|L Lᵀ|`` for each factor of the stack."""
    return 2.0 * np.sum(np.log(np.diagonal(L, axis1=1, axis2=2)), axis=1)


def batched_inverse_spd(A, *, what="the matrices"):
    """Inverses of a stack of small symmetric positive-definite matrices (n, c, c), symmetrised.

    Raises ``numpy.linalg.LinAlgError`` naming ``what`` if one is not positive definite.
    """
    L, ok = batched_cholesky(A)
    if not np.all(ok):
        raise np.linalg.LinAlgError(f"{what} are not all positive definite")
    n, c, _ = L.shape
    inverse = np.empty_like(L)
    eye = np.eye(c)
    for k in range(c):
        inverse[:, :, k] = batched_cholesky_solve(L, np.broadcast_to(eye[k], (n, c)))
    return 0.5 * (inverse + np.transpose(inverse, (0, 2, 1)))


def batched_solve(A, B):
    """``(x, sign, log|det A|)`` with ``x[i] = A[i]⁻¹ B[i]`` for a stack of small general matrices
    ``A`` (n, c, c) and right-hand sides ``B`` (n, c) or (n, c, k).

    Gaussian elimination with partial pivoting, column by column over the stack with elementwise
    numpy (no BLAS, no LAPACK: c is a number of classes). ``sign[i]`` is 0 where ``A[i]`` is
    singular (its ``x[i]`` is then meaningless).
    """
    A = np.array(A, dtype=np.float64)
    n, c, _ = A.shape
    vector = np.ndim(B) == 2
    X = np.array(B, dtype=np.float64)
    if vector:
        X = X[:, :, None]
    rows = np.arange(n)
    sign = np.ones(n)
    log_det = np.zeros(n)
    for j in range(c):
        pivot = j + np.argmax(np.abs(A[:, j:, j]), axis=1)
        moved = rows[pivot != j]
        if moved.size:
            to = pivot[moved]
            A[moved, j], A[moved, to] = A[moved, to].copy(), A[moved, j].copy()
            X[moved, j], X[moved, to] = X[moved, to].copy(), X[moved, j].copy()
            sign[moved] *= -1.0
        diag = A[:, j, j]
        sign *= np.sign(diag)
        log_det += np.log(np.abs(np.where(diag != 0.0, diag, 1.0)))
        factor = A[:, j + 1:, j] / np.where(diag != 0.0, diag, 1.0)[:, None]
        A[:, j + 1:, j:] -= factor[:, :, None] * A[:, None, j, j:]
        X[:, j + 1:] -= factor[:, :, None] * X[:, None, j]
    for j in range(c - 1, -1, -1):
        X[:, j] -= np.einsum("ik,ikl->il", A[:, j, j + 1:], X[:, j + 1:])
        X[:, j] /= np.where(A[:, j, j] != 0.0, A[:, j, j], 1.0)[:, None]
    return (X[:, :, 0] if vector else X), sign, log_det
