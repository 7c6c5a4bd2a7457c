"""Kernels built on inner products: Linear, LinearARD, MLP (arc-sine) and MLPARD."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._base import KERNEL_EXAMPLES_DOC, fill_doc
from .._linalg import matmul
from ._distances import _gram, _row_sq_norms
from .base import _ARDMixin, _Leaf

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["Linear", "LinearARD", "MLP", "MLPARD"]

_TWO_OVER_PI = 2.0 / np.pi


def _arcsine(a, root):
    """(2/π) asin(a / sqrt(d e)) = (2/π) atan2(a, sqrt(N)): the MLP kernel over v, and ∂K/∂v."""
    g = np.arctan2(a, root)
    g *= _TWO_OVER_PI
    return g


def _gradient_factor(v, root, d, e):
    """Q = (2/π) v / (2 d e sqrt(N)), the factor common to the MLP kernel's ∂K/∂w, ∂K/∂b and ∂K/∂α."""
    Q = (_TWO_OVER_PI * v) / root
    Q /= 2.0 * np.multiply.outer(d, e)
    return Q


class Linear(_Leaf):
    """Linear kernel k(x, y) = v xᵀy (IVM §4, k_lin).

    Parameters
    ----------
    variance : float > 0
        Process variance v.
    transforms : dict, optional
        ``{'variance': 'softplus' | 'log' | 'sigmoid' | 'fixed'}``; default softplus.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep.kernels import Linear
    >>> Linear(variance=0.5)(np.array([[1.0, 2.0], [3.0, 4.0]]))
    array([[ 2.5,  5.5],
           [ 5.5, 12.5]])
    """

    _scalar_params = ("variance",)
    _centred_columns = True

    def __init__(self, variance: float = 1.0, transforms: dict[str, str] | None = None) -> None:
        self._setup({"variance": variance}, transforms)

    def _K(self, X, Y):
        K = _gram(X, Y)
        K *= self._value("variance")
        return K

    def _diag(self, X):
        return self._value("variance") * _row_sq_norms(X)

    def _grad_state(self, X):
        return _gram(X)                         # shared by K and ∂K/∂v (one syrk instead of two)

    def _K_from_state(self, X, state):
        return state * self._value("variance")

    def _grads_constrained(self, X, pairs, state):
        for _ in pairs:
            yield _gram(X) if state is None else state.copy()

    def _column(self, X, j):
        col = matmul(X, X[j])
        col *= self._value("variance")
        return col

    def _column_centred(self, shared, j, pc):
        col = shared.inner_product(pc, j)
        col *= self._value("variance")
        return col

    def _cross_grads_constrained(self, X, Y, pairs):
        for _ in pairs:
            yield _gram(X, Y)

    def _diag_grads_constrained(self, X, pairs):
        for _ in pairs:
            yield _row_sq_norms(X)

    def _input_grad(self, X, Y, W):
        G = matmul(W, Y)
        G *= self._value("variance")
        return G




class LinearARD(_ARDMixin, _Leaf):
    """Linear ARD kernel k(x, y) = v Σ_c α_c x_c y_c (IVM §4).

    Parameters
    ----------
    scales : array-like (n_scales,)
        Input scales α in (0, 1) (IVM initialisation 0.999).
    variance : float > 0
    ard_groups : int array (n_features,), optional
        Scale index of each input column (tied scales); default one scale per column.
    transforms : dict, optional
        Per-parameter transform; defaults softplus for ``variance``, sigmoid for ``scales``.

    Notes
    -----
    ∂K/∂v = X A Xᵀ, ∂K/∂α_g = v X_g X_gᵀ (columns of group g).

    Examples
    --------
    >>> import numpy as np
    >>> from fastep.kernels import LinearARD
    >>> kernel = LinearARD([0.5, 0.1], variance=2.0)
    >>> kernel(np.array([[1.0, 2.0], [0.0, 1.0]]))
    array([[1.8, 0.4],
           [0.4, 0.2]])
    >>> kernel.n_theta
    3
    """

    _scalar_params = ("variance",)

    def __init__(self, scales: ArrayLike, variance: float = 1.0, ard_groups: ArrayLike | None = None,
                 transforms: dict[str, str] | None = None) -> None:
        self._setup({"variance": variance}, transforms, scales, ard_groups)

    def _K(self, X, Y):
        r = np.sqrt(self._column_scales())
        K = _gram(X * r, None if Y is None else Y * r)
        K *= self._value("variance")
        return K

    def _diag(self, X):
        return self._value("variance") * matmul(X * X, self._column_scales())

    def _column_state(self, X):
        return np.ascontiguousarray(X * np.sqrt(self._column_scales()))

    def _column(self, Z, j):
        col = matmul(Z, Z[j])
        col *= self._value("variance")
        return col

    def _grads_constrained(self, X, pairs, state):
        v = self._value("variance")
        for name, j in pairs:
            if name == "variance":
                yield _gram(X * np.sqrt(self._column_scales()))
            else:
                g = _gram(np.ascontiguousarray(X[:, self._columns_of(j)]))
                g *= v
                yield g

    def _cross_grads_constrained(self, X, Y, pairs):
        v = self._value("variance")
        for name, j in pairs:
            if name == "variance":
                r = np.sqrt(self._column_scales())
                yield _gram(X * r, Y * r)
            else:
                cols = self._columns_of(j)
                g = _gram(np.ascontiguousarray(X[:, cols]), np.ascontiguousarray(Y[:, cols]))
                g *= v
                yield g

    def _diag_grads_constrained(self, X, pairs):
        v = self._value("variance")
        for name, j in pairs:
            if name == "variance":
                yield matmul(X * X, self._column_scales())
            else:
                cols = self._columns_of(j)
                yield v * np.sum(X[:, cols] ** 2, axis=1)

    def _input_grad(self, X, Y, W):
        G = matmul(W, Y)
        G *= self._value("variance") * self._column_scales()
        return G




class MLP(_Leaf):
    __doc__ = fill_doc("""MLP (arcsine) kernel of Williams (1997) (IVM §4, k_mlp, with the factor 2/π).

    k(x, y) = v (2/π) asin(a / sqrt(d e)),  a = w xᵀy + b,  d = w xᵀx + b + 1,  e = w yᵀy + b + 1.

    Parameters
    ----------
    variance : float > 0
        v (the IVM paper's θ_mlp is (2/π) v).
    weight_variance : float > 0
        w (IVM initialisation 10).
    bias_variance : float > 0
        b (IVM initialisation 10).
    transforms : dict, optional

    Notes
    -----
    Evaluated as asin(z) = atan2(a, sqrt(N)) with N = d e - a² formed without
    cancellation as N = w²(‖x‖²‖y‖² - (xᵀy)²) + w b ‖x - y‖² + (d - 1) + (e - 1) + 1
    (each term ≥ 0, N ≥ 1; exactly 2s + 1 on the diagonal, s = d - 1). With
    Q = (2/π) v / sqrt(N) the derivatives are

    * ∂K/∂v = (2/π) asin(z)
    * ∂K/∂w = Q [e (P + b (P - ‖x‖²)) + d (P + b (P - ‖y‖²))] / (2 d e),  P = xᵀy
    * ∂K/∂b = Q [d (1 + w (‖y‖² - P)) + e (1 + w (‖x‖² - P))] / (2 d e)
    * ∂K/∂α_g (ARD) = Q w [e T_x + d T_y] / (2 d e),
      T_x = w (‖x‖² P_g - P ‖x_g‖²) + b (P_g - ‖x_g‖²) + P_g  (T_y likewise),

    from d asin z = [da - (a/2)(dd/d + de/e)] / sqrt(N), arranged so that the
    diagonal has no cancellation. The same formulas, with d for the rows of X and e for
    those of Y, give ∂K(X, Y)/∂θ (``cross_gradient_iter``). For sparse GPs also

    * ∂k(x, x)/∂θ (``diag_gradient``): with s = w‖x‖² + b, k(x, x) = (2/π) v asin(s/(s + 1))
      and d asin(s/(s + 1))/ds = 1/((s + 1) sqrt(2s + 1)), so ∂/∂v = (2/π) asin(s/(s + 1)),
      ∂/∂w = q ‖x‖², ∂/∂b = q, ∂/∂α_g = q w ‖x_g‖² with q = (2/π) v / ((s + 1) sqrt(2s + 1));
    * ∂k(x, y)/∂x (``input_gradient``) = (2/π) v w A (y - (a/d) x) / sqrt(N) (e does not
      depend on x).

    %EXAMPLES%
    >>> from fastep.kernels import MLP
    >>> K = MLP(variance=1.0, weight_variance=10.0, bias_variance=10.0)(X)
    >>> bool(np.all(np.abs(K) < 1.0)), bool(np.allclose(K, K.T))
    (True, True)
    """, EXAMPLES=KERNEL_EXAMPLES_DOC)

    _scalar_params = ("variance", "weight_variance", "bias_variance")
    _centred_columns = True

    def __init__(self, variance: float = 1.0, weight_variance: float = 1.0, bias_variance: float = 1.0,
                 transforms: dict[str, str] | None = None) -> None:
        self._setup({"variance": variance, "weight_variance": weight_variance,
                     "bias_variance": bias_variance}, transforms)

    def _scaled(self, X):
        return X

    def _parts(self, X, Y):
        """P = Z Zyᵀ, |z|², |zy|², a, d, e and sqrt(N) for scaled inputs Z."""
        w, b = self._value("weight_variance"), self._value("bias_variance")
        Z = np.ascontiguousarray(self._scaled(X))
        if Y is None:
            P = _gram(Z)
            nx = np.diag(P).copy()
            ny = nx
        else:
            Zy = np.ascontiguousarray(self._scaled(Y))
            P = _gram(Z, Zy)
            nx, ny = _row_sq_norms(Z), _row_sq_norms(Zy)
        sx, sy = w * nx + b, w * ny + b
        N = np.multiply.outer(nx, ny)
        N -= P * P
        np.maximum(N, 0.0, out=N)
        N *= w * w
        T = np.add.outer(nx, ny)
        T -= 2.0 * P
        np.maximum(T, 0.0, out=T)
        T *= w * b
        N += T
        np.add.outer(sx, sy, out=T)
        T += 1.0
        N += T
        del T
        np.sqrt(N, out=N)
        return P, nx, ny, sx + 1.0, sy + 1.0, N

    def _K(self, X, Y):
        w, b = self._value("weight_variance"), self._value("bias_variance")
        P, _, _, _, _, root = self._parts(X, Y)
        P *= w
        P += b
        K = np.arctan2(P, root, out=P)
        K *= _TWO_OVER_PI * self._value("variance")
        return K

    def _diag(self, X):
        w, b = self._value("weight_variance"), self._value("bias_variance")
        Z = self._scaled(X)
        s = w * _row_sq_norms(Z) + b
        return _TWO_OVER_PI * self._value("variance") * np.arctan2(s, np.sqrt(2.0 * s + 1.0))

    def _column_state(self, X):
        Z = np.ascontiguousarray(self._scaled(X))
        return Z, _row_sq_norms(Z)

    def _column(self, state, j, P=None):
        # The single-column case of _parts (same terms, same order).
        w, b = self._value("weight_variance"), self._value("bias_variance")
        Z, nx = state
        ny = nx[j]
        if P is None:
            P = matmul(Z, Z[j])
        N = nx * ny - P * P
        np.maximum(N, 0.0, out=N)
        N *= w * w
        T = nx + ny - 2.0 * P
        np.maximum(T, 0.0, out=T)
        T *= w * b
        N += T
        N += (w * nx + b) + (w * ny + b) + 1.0
        np.sqrt(N, out=N)
        P *= w
        P += b
        K = np.arctan2(P, N, out=P)
        K *= _TWO_OVER_PI * self._value("variance")
        return K

    def _column_centred(self, shared, j, pc):
        return self._column((None, shared.norms), j, shared.inner_product(pc, j))

    def _grad_state(self, X):
        w, b = self._value("weight_variance"), self._value("bias_variance")
        P, nx, ny, d, e, root = self._parts(X, None)
        a = P * w
        a += b
        return P, nx, ny, d, e, root, a

    def _K_from_state(self, X, state):
        a, root = state[6], state[5]
        K = np.arctan2(a, root)
        K *= _TWO_OVER_PI * self._value("variance")
        return K

    def _grads_constrained(self, X, pairs, state):
        v, w, b = (self._value(n) for n in ("variance", "weight_variance", "bias_variance"))
        P, n, _, d, _, root, a = self._grad_state(X) if state is None else state
        # K(X, X) is symmetric (n = |x|², d = n w + b + 1 for both arguments): each numerator
        # of the class docstring is M + Mᵀ with M below, which also makes dK exactly symmetric.
        Q = _gradient_factor(v, root, d, d)
        M = np.empty_like(P)
        tmp = None
        for name, j in pairs:
            if name == "variance":
                yield _arcsine(a, root)
                continue
            if name == "weight_variance":           # M_ij = d_j (P_ij + b (P_ij - n_i))
                np.subtract(P, n[:, None], out=M)
                M *= b
                M += P
                M *= d[None, :]
            elif name == "bias_variance":           # M_ij = d_i (1 + w (n_j - P_ij))
                np.subtract(n[None, :], P, out=M)
                M *= w
                M += 1.0
                M *= d[:, None]
            else:                                   # M_ij = w d_j T_ij, T as in the class docstring
                Pg = _gram(np.ascontiguousarray(X[:, self._columns_of(j)]))
                ng = np.diag(Pg).copy()
                if tmp is None:
                    tmp = np.empty_like(P)
                np.multiply(Pg, n[:, None], out=M)
                np.multiply(P, ng[:, None], out=tmp)
                M -= tmp
                M *= w
                np.subtract(Pg, ng[:, None], out=tmp)
                tmp *= b
                M += tmp
                M += Pg
                del Pg
                M *= d[None, :]
                M *= w
            g = M + M.T
            g *= Q
            yield g
    # ---- sparse-GP derivatives (cross-covariance, diagonal, inputs) ---------------------------
    def _input_scales(self, d):
        """Per-column factor of A (all ones without ARD)."""
        return self._column_scales() if self._has_scales else np.ones(d)

    def _cross_grads_constrained(self, X, Y, pairs):
        # The class docstring's formulas with separate d (rows, X) and e (columns, Y).
        v, w, b = (self._value(n) for n in ("variance", "weight_variance", "bias_variance"))
        P, nx, ny, d, e, root = self._parts(X, Y)
        a = P * w
        a += b
        Q = _gradient_factor(v, root, d, e)
        for name, j in pairs:
            if name == "variance":
                yield _arcsine(a, root)
                continue
            if name == "weight_variance":           # e (P + b (P - |x|²)) + d (P + b (P - |y|²))
                g = P - nx[:, None]
                g *= b
                g += P
                g *= e[None, :]
                t = P - ny[None, :]
                t *= b
                t += P
                t *= d[:, None]
            elif name == "bias_variance":           # d (1 + w (|y|² - P)) + e (1 + w (|x|² - P))
                g = ny[None, :] - P
                g *= w
                g += 1.0
                g *= d[:, None]
                t = nx[:, None] - P
                t *= w
                t += 1.0
                t *= e[None, :]
            else:                                   # w (e T_x + d T_y), raw columns of group j
                cols = self._columns_of(j)
                Xg = np.ascontiguousarray(X[:, cols])
                Yg = np.ascontiguousarray(Y[:, cols])
                Pg = _gram(Xg, Yg)
                nxg, nyg = _row_sq_norms(Xg), _row_sq_norms(Yg)
                g = Pg * nx[:, None]                # T_x = w (|x|² P_g - P |x_g|²) + b (P_g - |x_g|²) + P_g
                g -= P * nxg[:, None]
                g *= w
                g += b * (Pg - nxg[:, None])
                g += Pg
                g *= e[None, :]
                t = Pg * ny[None, :]                # T_y likewise
                t -= P * nyg[None, :]
                t *= w
                t += b * (Pg - nyg[None, :])
                t += Pg
                t *= d[:, None]
                t *= w
                g *= w
            g += t
            del t
            g *= Q
            yield g

    def _diag_grads_constrained(self, X, pairs):
        # k(x, x) = (2/π) v asin(s/(s + 1)), s = w |x|² + b: d asin/ds = 1/((s + 1) sqrt(2s + 1))
        v, w, b = (self._value(n) for n in ("variance", "weight_variance", "bias_variance"))
        n = _row_sq_norms(self._scaled(X))
        s = w * n + b
        r = np.sqrt(2.0 * s + 1.0)
        q = (_TWO_OVER_PI * v) / ((s + 1.0) * r)
        for name, j in pairs:
            if name == "variance":
                yield _TWO_OVER_PI * np.arctan2(s, r)
            elif name == "weight_variance":
                yield q * n
            elif name == "bias_variance":
                yield q.copy()
            else:
                yield q * (w * _row_sq_norms(X[:, self._columns_of(j)]))

    def _input_grad(self, X, Y, W):
        # ∂k(x, y)/∂x = (2/π) v w A (y - (a/d) x) / sqrt(N)  (e does not depend on x)
        v, w, b = (self._value(n) for n in ("variance", "weight_variance", "bias_variance"))
        P, _, _, d, _, root = self._parts(X, Y)
        R = W / root
        R *= _TWO_OVER_PI * v
        a = P
        a *= w
        a += b
        c = np.einsum("ij,ij->i", R, a)
        c /= d
        G = matmul(R, Y)
        G -= c[:, None] * X
        G *= w * self._input_scales(X.shape[1])
        return G




class MLPARD(_ARDMixin, MLP):
    __doc__ = fill_doc("""MLP ARD kernel: ``MLP`` with xᵀy, xᵀx, yᵀy replaced by xᵀAy, xᵀAx, yᵀAy (IVM §4).

    Parameters
    ----------
    scales : array-like (n_scales,)
        Input scales α in (0, 1).
    variance, weight_variance, bias_variance : float > 0
    ard_groups : int array (n_features,), optional
    transforms : dict, optional

    %EXAMPLES%
    >>> from fastep.kernels import MLPARD
    >>> kernel = MLPARD([0.9, 0.2])
    >>> kernel(X).shape, kernel.hyperparameter_names
    ((3, 3), ['variance', 'weight_variance', 'bias_variance', 'scales[0]', 'scales[1]'])
    """, EXAMPLES=KERNEL_EXAMPLES_DOC)

    _scalar_params = ("variance", "weight_variance", "bias_variance")

    def __init__(self, scales: ArrayLike, variance: float = 1.0, weight_variance: float = 1.0,
                 bias_variance: float = 1.0, ard_groups: ArrayLike | None = None,
                 transforms: dict[str, str] | None = None) -> None:
        self._setup({"variance": variance, "weight_variance": weight_variance,
                     "bias_variance": bias_variance}, transforms, scales, ard_groups)

    def _scaled(self, X):
        return X * np.sqrt(self._column_scales())
