"""Products, squared distances and centring shared by the kernels (BLAS through
:mod:`fastep._linalg`)."""
import contextlib
import threading

import numpy as np

from .._linalg import gram, matmul

_reuse = threading.local()


@contextlib.contextmanager
def reuse_training_distances(X):
    """Within the block (and this thread), the squared distances among the rows of this very
    array ``X`` are computed once by the kernels that use them (the isotropic RBF): a
    hyperparameter search evaluates K(X, X) and its gradient at many θ, on the same X. Holds
    one more n x n array for the duration of the block."""
    previous = getattr(_reuse, "entry", None)
    _reuse.entry = [X, None]
    try:
        yield
    finally:
        _reuse.entry = previous


def _training_sqdist(X):
    """Squared distances among the rows of X (a fresh array the caller may overwrite), from the
    cache of :func:`reuse_training_distances` when X is its array."""
    entry = getattr(_reuse, "entry", None)
    if entry is None or entry[0] is not X:
        return _sqdist_centred(_centre(X)[0])
    if entry[1] is None:
        entry[1] = _sqdist_centred(_centre(X)[0])
    return entry[1].copy()


def _gram(X, Y=None):
    """X Xᵀ (syrk, exactly symmetric) or X Yᵀ."""
    if Y is None:
        return gram(X)
    return matmul(X, Y.T)


def _row_sq_norms(X):
    return np.einsum("ij,ij->i", X, X)


def _sqdist_centred(Xc, Yc=None):
    """Squared Euclidean distances of already-centred inputs, |x|² + |y|² - 2 xᵀy clamped at 0.

    For ``Yc=None`` the result is exactly symmetric with an exactly zero diagonal.
    A single column (one ARD scale per feature) uses the exact (x_i - y_j)² instead,
    which is also faster than a rank-1 Gram matrix.
    """
    if Xc.shape[1] == 1:
        x = Xc[:, 0]
        D = np.subtract.outer(x, x if Yc is None else Yc[:, 0])
        D *= D
        return D
    Xc = np.ascontiguousarray(Xc)
    if Yc is None:
        G = _gram(Xc)
        nx = np.diag(G).copy()
        D = np.add.outer(nx, nx)
        G *= 2.0
        D -= G
        del G
        np.maximum(D, 0.0, out=D)
        np.fill_diagonal(D, 0.0)
        return D
    Yc = np.ascontiguousarray(Yc)
    G = _gram(Xc, Yc)
    D = np.add.outer(_row_sq_norms(Xc), _row_sq_norms(Yc))
    G *= 2.0
    D -= G
    del G
    np.maximum(D, 0.0, out=D)
    return D


def _centre(X, Y=None):
    shift = X.mean(axis=0)
    return X - shift, (None if Y is None else Y - shift)
