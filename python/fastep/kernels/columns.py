"""Single columns of K(X, X) without forming it: the column oracle the IVM uses, and the
cache of the parameter-free products it shares between selections.

This module names no kernel class: a kernel says through its class attribute
``_centred_columns`` whether ``_column_centred`` builds its column from the shared product
(see :class:`_CentredColumns`), and sums and products provide ``_shared_column_state``."""
from __future__ import annotations

import collections
import numbers
from typing import TYPE_CHECKING

import numpy as np

from .._base import KERNEL_EXAMPLES_DOC, fill_doc
from .. import _validation as _v
from .._linalg import inner, matmul
from ._distances import _row_sq_norms

if TYPE_CHECKING:
    from typing import Any

    from numpy.typing import ArrayLike, NDArray

__all__ = ["KernelColumns", "ColumnProductCache"]


class _CentredColumns:
    """Shared per-X data for kernel columns built on one product ``pc = Xc x̃_j`` (Xc = X - mean).

    RBF needs ``|x_i - x_j|² = |x̃_i|² + |x̃_j|² - 2 x̃_iᵀx̃_j``; Linear and MLP need
    ``x_iᵀx_j = x̃_iᵀx̃_j + x̃_iᵀμ + x̃_jᵀμ + μᵀμ``. One gemv over Xc per column therefore
    serves every non-ARD leaf of a sum or product (the column is memory bound: this halves
    the reads of X for RBF + Linear).

    With ``max_columns > 0`` the products are also kept (least recently used first out,
    read-only arrays) so that a later request for the same j skips the gemv: the product
    does not depend on any kernel parameter, so it can be reused across parameter values
    (see :class:`ColumnProductCache`).
    """

    def __init__(self, X, max_columns=0):
        mu = X.mean(axis=0)
        self.Xc = np.ascontiguousarray(X - mu)
        self.norms_c = _row_sq_norms(self.Xc)
        self.xc_mu = matmul(self.Xc, mu)
        self.mu2 = inner(mu, mu)
        self.norms = _row_sq_norms(X)
        self.max_columns = int(max_columns)
        self._stored = collections.OrderedDict()
        self.hits = 0
        self.misses = 0

    def centred_product(self, j):
        if self.max_columns <= 0:
            return matmul(self.Xc, self.Xc[j])
        pc = self._stored.get(j)
        if pc is not None:
            self._stored.move_to_end(j)
            self.hits += 1
            return pc
        self.misses += 1
        pc = matmul(self.Xc, self.Xc[j])
        pc.flags.writeable = False
        self._stored[j] = pc
        if len(self._stored) > self.max_columns:
            self._stored.popitem(last=False)
        return pc

    def inner_product(self, pc, j):
        """x_iᵀx_j for all i from pc = Xc x̃_j."""
        out = pc + self.xc_mu
        out += self.xc_mu[j] + self.mu2
        return out


class ColumnProductCache:
    __doc__ = fill_doc(
        """Inner products ``x̃_iᵀx̃_j`` (centred X) kept between calls of :meth:`Kernel.columns` on one X.

    The columns of the non-ARD ``Linear``, ``RBF`` and ``MLP`` kernels are built from one
    product of the centred inputs with the chosen row, ``Xc x̃_j`` (an O(n p) memory-bound
    gemv), which does not depend on the kernel's parameters. An algorithm that asks for
    columns of the same points again under new parameters (the IVM's Algorithm 2
    reselects mostly the same active set after each optimisation) can keep those
    products: ``cache = ColumnProductCache(X, max_columns)``, then
    ``kernel.columns(X, product_cache=cache)`` for every parameter value (see
    :meth:`Kernel.columns` for when the columns are bitwise identical to uncached ones).

    Parameters
    ----------
    X : array (n, p)
        The inputs (the same values must be passed to ``columns``).
    max_columns : int >= 1
        At most this many products are kept (n floats each; least recently used
        dropped first).

    Attributes
    ----------
    hits, misses : int
        Products served from the cache / computed.

    %EXAMPLES%
    >>> from fastep.kernels import RBF, ColumnProductCache
    >>> cache = ColumnProductCache(X, max_columns=3)
    >>> first = RBF(1.0, 0.5).columns(X, product_cache=cache)(2)
    >>> again = RBF(2.0, 0.1).columns(X, product_cache=cache)(2)
    >>> bool(np.allclose(again, RBF(2.0, 0.1)(X)[:, 2]))
    True
    """, EXAMPLES=KERNEL_EXAMPLES_DOC)

    def __init__(self, X: ArrayLike, max_columns: int) -> None:
        X = _v.as_float_matrix(X, "X")
        max_columns = _v.check_int(max_columns, "max_columns", minimum=1)
        self.X = X
        self._shared = _CentredColumns(X, max_columns)

    @property
    def max_columns(self) -> int:
        return self._shared.max_columns

    @property
    def n_stored(self) -> int:
        return len(self._shared._stored)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._shared._stored.values())

    @property
    def hits(self) -> int:
        return self._shared.hits

    @property
    def misses(self) -> int:
        return self._shared.misses

    def clear(self) -> None:
        self._shared._stored.clear()

    def _for(self, X):
        if X is not self.X and (X.shape != self.X.shape or not np.array_equal(X, self.X)):
            raise ValueError("product_cache was built for different inputs X")
        return self._shared


class KernelColumns:
    __doc__ = fill_doc("""Columns of K(X, X) one at a time (see :meth:`Kernel.columns`).

    Attributes
    ----------
    kernel : Kernel
        The kernel (not copied: do not change its parameters while using the oracle).
    X : ndarray (n, d)
    diag : ndarray (n,)
        ``kernel.diag(X)``.

    Parameters
    ----------
    kernel : Kernel
        The kernel.
    X : ndarray (n, d)
        Validated inputs (float64, C-ordered).
    shared : object, optional
        Products shared with a :class:`ColumnProductCache` (built by :meth:`Kernel.columns`).

    %EXAMPLES%
    >>> from fastep.kernels import RBF
    >>> kernel = RBF(1.0, 0.5)
    >>> columns = kernel.columns(X)
    >>> bool(np.allclose(columns(1), kernel(X)[:, 1]))
    True
    """, EXAMPLES=KERNEL_EXAMPLES_DOC)

    def __init__(self, kernel: Any, X: NDArray[np.float64], shared: Any = None) -> None:
        self.kernel = kernel
        self.X = X
        self.diag = np.array(kernel._diag(X), dtype=float, copy=True).reshape(-1)
        self._leaf_shared = None
        if shared is not None and kernel._centred_columns:
            self._leaf_shared = shared
        elif shared is not None and hasattr(kernel, "_shared_column_state"):     # a sum or product
            self._state = kernel._shared_column_state(X, shared)
        else:
            self._state = kernel._column_state(X)

    @property
    def n(self) -> int:
        return self.X.shape[0]

    def __call__(self, j: int) -> NDArray[np.float64]:
        """``K(X, X)[:, j]`` as a fresh float64 array of length n."""
        if isinstance(j, (bool, np.bool_)) or not isinstance(j, numbers.Integral):
            raise TypeError(f"j must be an integer, got {type(j).__name__}")
        j = int(j)
        if not 0 <= j < self.X.shape[0]:
            raise ValueError(f"j must be in [0, {self.X.shape[0]}), got {j}")
        if self._leaf_shared is not None:
            col = self.kernel._column_centred(self._leaf_shared, j, self._leaf_shared.centred_product(j))
        else:
            col = self.kernel._column(self._state, j)
        col[j] = self.diag[j]
        return col
