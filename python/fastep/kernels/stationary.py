"""Stationary kernels: RBF and RBFARD (squared exponential), White (noise on the training
sample) and Bias (a constant)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._base import KERNEL_EXAMPLES_DOC, fill_doc
from .._linalg import matmul
from ._distances import _centre, _row_sq_norms, _sqdist_centred, _training_sqdist
from .base import _ARDMixin, _Leaf

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["RBF", "RBFARD", "White", "Bias"]


class RBF(_Leaf):
    """Squared-exponential kernel k(x, y) = v exp(-γ/2 ‖x - y‖²) (IVM §4, k_rbf).

    Parameters
    ----------
    variance : float > 0
        Process variance v.
    inverse_width : float > 0
        γ; a length-scale ℓ corresponds to γ = 1/ℓ².
    transforms : dict, optional

    Notes
    -----
    With E = exp(-γ D/2): ∂K/∂v = E, ∂K/∂γ = -(v/2) D ∘ E.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep.kernels import RBF
    >>> kernel = RBF(variance=2.0, inverse_width=0.5)
    >>> np.round(kernel(np.array([[0.0], [2.0]])), 4)
    array([[2.    , 0.7358],
           [0.7358, 2.    ]])
    >>> print(kernel.lengthscale)
    1.414213562373095
    """

    _scalar_params = ("variance", "inverse_width")
    _centred_columns = True

    def __init__(self, variance: float = 1.0, inverse_width: float = 1.0, transforms: dict[str, str] | None = None
                 ) -> None:
        self._setup({"variance": variance, "inverse_width": inverse_width}, transforms)

    @property
    def lengthscale(self) -> float:
        """ℓ = 1/sqrt(γ)."""
        return 1.0 / np.sqrt(self._value("inverse_width"))

    def _sqdist(self, X, Y):
        if Y is None:
            return _training_sqdist(X)
        Xc, Yc = _centre(X, Y)
        return _sqdist_centred(Xc, Yc)

    def _K(self, X, Y):
        D = self._sqdist(X, Y)
        D *= -0.5 * self._value("inverse_width")
        np.exp(D, out=D)
        D *= self._value("variance")
        return D

    def _diag(self, X):
        return np.full(X.shape[0], self._value("variance"))

    def _column_state(self, X):
        Xc, _ = _centre(X)                      # a fresh array: scale it in place (one n x p copy, not two)
        if self._has_scales:
            Xc *= np.sqrt(self._column_scales())
        Xc = np.ascontiguousarray(Xc)
        return Xc, _row_sq_norms(Xc)

    def _column(self, state, j, pc=None):
        Xc, norms = state
        D = matmul(Xc, Xc[j]) if pc is None else pc * 1.0
        D *= -2.0
        D += norms
        D += norms[j]
        np.maximum(D, 0.0, out=D)
        D *= -0.5 * self._value("inverse_width")
        np.exp(D, out=D)
        D *= self._value("variance")
        return D

    def _column_centred(self, shared, j, pc):
        return self._column((shared.Xc, shared.norms_c), j, pc)

    def _grad_state(self, X):
        D = self._sqdist(X, None)
        return D, np.exp(-0.5 * self._value("inverse_width") * D)

    def _K_from_state(self, X, state):
        return state[1] * self._value("variance")

    def _grads_constrained(self, X, pairs, state):
        D, E = self._grad_state(X) if state is None else state
        return self._distance_grads(X, None, D, E, pairs)

    def _cross_grads_constrained(self, X, Y, pairs):
        D = self._sqdist(X, Y)
        return self._distance_grads(X, Y, D, np.exp(-0.5 * self._value("inverse_width") * D), pairs)

    def _distance_grads(self, X, Y, D, E, pairs):
        """∂K(X, Y)/∂x (``Y`` None: of K(X, X)) from the squared distances D and E = exp(-γ D/2)."""
        v, gamma = self._value("variance"), self._value("inverse_width")
        for name, j in pairs:
            if name == "variance":
                yield E.copy()
            elif name == "inverse_width":
                g = D * E
                g *= -0.5 * v
                yield g
            else:
                yield self._ard_grad(X, Y, j, E, v, gamma)

    def _diag_grads_constrained(self, X, pairs):
        for name, _ in pairs:
            yield np.ones(X.shape[0]) if name == "variance" else np.zeros(X.shape[0])

    def _weighted_grads_constrained(self, X, Y, W, pairs):
        """``Σ_ij W_ij ∂K_ij/∂x`` for each (name, element) pair, from one pass over K: with
        ``Q = W ∘ E``, ``Σ Q`` (variance), ``-(v/2) Σ Q ∘ D`` (inverse width) and, for an ARD
        scale, ``-(γ v/2) Σ_c∈group [Σ_i x_ic² (Q1)_i + Σ_j y_jc² (Qᵀ1)_j - 2 Σ_i x_ic (Q Y)_ic]``
        (centred inputs), so that no per-scale distance matrix is formed."""
        v, gamma = self._value("variance"), self._value("inverse_width")
        D = self._sqdist(X, Y)
        Q = np.exp(-0.5 * gamma * D)
        Q *= W
        per_column = None
        if any(name == "scales" for name, _ in pairs):
            Xc, Yc = _centre(X, Y)
            Yc = Xc if Yc is None else Yc
            QY = matmul(Q, Yc)
            per_column = (matmul((Xc * Xc).T, Q.sum(axis=1)) + matmul((Yc * Yc).T, Q.sum(axis=0))
                          - 2.0 * np.einsum("ij,ij->j", Xc, QY))
        out = []
        for name, j in pairs:
            if name == "variance":
                out.append(float(np.sum(Q)))
            elif name == "inverse_width":
                out.append(-0.5 * v * float(np.sum(Q * D)))
            else:
                out.append(-0.5 * gamma * v * float(np.sum(per_column[self._columns_of(j)])))
        return out

    def _input_scales(self, d):
        return np.ones(d)

    def _input_grad(self, X, Y, W):
        # ∂k(x, y)/∂x_c = -γ a_c (x_c - y_c) k(x, y); differences from centred inputs
        Xc, Yc = _centre(X, Y)
        P = W * self._K(X, Y)
        G = Xc * P.sum(axis=1)[:, None]
        G -= matmul(P, Yc)
        G *= -self._value("inverse_width") * self._input_scales(X.shape[1])
        return G




class RBFARD(_ARDMixin, RBF):
    __doc__ = fill_doc("""RBF ARD kernel k(x, y) = v exp(-γ/2 Σ_c α_c (x_c - y_c)²) (IVM §4).

    Parameters
    ----------
    scales : array-like (n_scales,)
        Input scales α in (0, 1).
    variance, inverse_width : float > 0
    ard_groups : int array (n_features,), optional
    transforms : dict, optional

    Notes
    -----
    ∂K/∂α_g = -(γ v/2) D_g ∘ E with D_g the squared distance over the columns of group g.

    %EXAMPLES%
    >>> from fastep.kernels import RBFARD
    >>> kernel = RBFARD([0.9, 0.01], inverse_width=1.0)
    >>> np.round(kernel(X)[0], 3)
    array([1.   , 0.634, 0.164])
    """, EXAMPLES=KERNEL_EXAMPLES_DOC)

    _scalar_params = ("variance", "inverse_width")

    def __init__(self, scales: ArrayLike, variance: float = 1.0, inverse_width: float = 1.0,
                 ard_groups: ArrayLike | None = None, transforms: dict[str, str] | None = None) -> None:
        self._setup({"variance": variance, "inverse_width": inverse_width}, transforms, scales, ard_groups)

    def _sqdist(self, X, Y):
        r = np.sqrt(self._column_scales())
        Xc, Yc = _centre(X, Y)
        return _sqdist_centred(Xc * r, None if Yc is None else Yc * r)

    def _ard_grad(self, X, Y, j, E, v, gamma):
        """∂K(X, Y)/∂α_j (``Y`` None: of K(X, X)) = -(γ v/2) D_j ∘ E."""
        Xc, Yc = _centre(X, Y)
        cols = self._columns_of(j)
        g = _sqdist_centred(Xc[:, cols], None if Yc is None else Yc[:, cols])
        g *= E
        g *= -0.5 * gamma * v
        return g

    def _input_scales(self, d):
        return self._column_scales()




class _InputFreeVariance(_Leaf):
    """White and Bias: the one parameter is the variance v = k(x, x), whatever the inputs."""

    _scalar_params = ("variance",)

    def __init__(self, variance: float = 1.0, transforms: dict[str, str] | None = None) -> None:
        self._setup({"variance": variance}, transforms)

    def _diag(self, X):
        return np.full(X.shape[0], self._value("variance"))

    def _diag_grads_constrained(self, X, pairs):
        for _ in pairs:
            yield np.ones(X.shape[0])

    def _input_grad(self, X, Y, W):
        return np.zeros(X.shape)




class White(_InputFreeVariance):
    __doc__ = fill_doc("""White noise k(x_i, x_j) = v δ_ij (IVM §4, k_white).

    ``K(X, X) = v I``; ``K(X*, X) = 0`` for any second argument (new
    observations carry independent noise), ``diag(X) = v``.

    Parameters
    ----------
    variance : float > 0, default 1.0
        The noise variance v.
    transforms : dict, optional
        ``{'variance': 'softplus' | 'log' | 'fixed'}``; default softplus.

    %EXAMPLES%
    >>> from fastep.kernels import White
    >>> White(0.1)(X)
    array([[0.1, 0. , 0. ],
           [0. , 0.1, 0. ],
           [0. , 0. , 0.1]])
    >>> White(0.1)(X, X)
    array([[0., 0., 0.],
           [0., 0., 0.],
           [0., 0., 0.]])
    """, EXAMPLES=KERNEL_EXAMPLES_DOC)

    def _K(self, X, Y):
        if Y is None:
            return np.eye(X.shape[0]) * self._value("variance")
        return np.zeros((X.shape[0], Y.shape[0]))

    def _grads_constrained(self, X, pairs, state):
        for _ in pairs:
            yield np.eye(X.shape[0])

    def _column(self, X, j):
        return np.zeros(X.shape[0])     # the variance sits on the diagonal only

    def _cross_grads_constrained(self, X, Y, pairs):
        for _ in pairs:
            yield np.zeros((X.shape[0], Y.shape[0]))




class Bias(_InputFreeVariance):
    __doc__ = fill_doc("""Constant kernel k(x, y) = v (IVM §4, k_bias): uncertainty in an offset.

    Parameters
    ----------
    variance : float > 0, default 1.0
        The variance v of the constant offset.
    transforms : dict, optional
        ``{'variance': 'softplus' | 'log' | 'fixed'}``; default softplus.

    %EXAMPLES%
    >>> from fastep.kernels import Bias
    >>> Bias(2.0)(X[:2])
    array([[2., 2.],
           [2., 2.]])
    """, EXAMPLES=KERNEL_EXAMPLES_DOC)

    def _K(self, X, Y):
        m = X.shape[0] if Y is None else Y.shape[0]
        return np.full((X.shape[0], m), self._value("variance"))

    def _grads_constrained(self, X, pairs, state):
        for _ in pairs:
            yield np.ones((X.shape[0], X.shape[0]))

    def _column(self, X, j):
        return np.full(X.shape[0], self._value("variance"))

    def _cross_grads_constrained(self, X, Y, pairs):
        for _ in pairs:
            yield np.ones((X.shape[0], Y.shape[0]))


def relevance_weights(kernel, n_features):
    """Per-input inverse length-scales ``sqrt(γ α_c)`` of an ARD RBF kernel, alone or as the one
    :class:`RBFARD` term of a sum; None for any other kernel, or when a weight is not finite and
    positive.

    Parameters
    ----------
    kernel : Kernel
    n_features : int
        The number of inputs the weights must cover.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep.kernels import RBFARD, White
    >>> from fastep.kernels.stationary import relevance_weights
    >>> relevance_weights(RBFARD(np.array([1.0, 0.25]), inverse_width=4.0) + White(0.1), 2)
    array([2., 1.])
    >>> relevance_weights(White(0.1), 2) is None
    True
    """
    from .combinators import Sum
    parts = kernel.kernels if isinstance(kernel, Sum) else [kernel]
    ard = [k for k in parts if isinstance(k, RBFARD)]
    if len(ard) != 1:
        return None
    weights = np.sqrt(ard[0].get_params()["inverse_width"] * np.asarray(ard[0]._column_scales(), dtype=np.float64))
    if weights.shape != (n_features,) or not np.all(np.isfinite(weights)) or np.any(weights <= 0.0):
        return None
    return weights
