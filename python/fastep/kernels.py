"""Covariance functions (kernels) with exact gradients in an unconstrained parameter space.

Kernels (IVM §4, Lawrence, Seeger & Herbrich)
---------------------------------------------
=============  ==============================================================  =========================
class          k(x, y)                                                         hyperparameters
=============  ==============================================================  =========================
``Linear``     v xᵀy                                                           variance
``RBF``        v exp(-γ/2 |x - y|²)                                            variance, inverse_width
``MLP``        v (2/π) asin((w xᵀy + b) / sqrt((w xᵀx + b + 1)(w yᵀy + b + 1)))  variance, weight_variance,
                                                                               bias_variance
``White``      v δ(x, y)  (see below)                                          variance
``Bias``       v                                                               variance
``LinearARD``  ``Linear`` with xᵀy replaced by xᵀAy                            + scales
``RBFARD``     ``RBF`` with |x - y|² replaced by (x - y)ᵀA(x - y)              + scales
``MLPARD``     ``MLP`` with every inner product xᵀy replaced by xᵀAy           + scales
=============  ==============================================================  =========================

``A = diag(α)`` holds one input scale per column (IVM §4: "automatic relevance
determination"); ``ard_groups`` ties columns to a shared scale (``α_col =
scales[ard_groups[col]]``), as the IVM paper does for blocks of USPS pixels.
Sums and products of kernels are kernels: ``k1 + k2``, ``k1 * k2``,
``Sum([...])``, ``Product([...])``.

Conventions worth knowing:

* ``MLP`` carries the factor 2/π of Williams (1997) so that ``v`` bounds the
  process variance (|k| < v); the IVM paper's θ_mlp equals ``(2/π) v`` here.
* ``White`` is a noise process attached to the *training sample*: ``K(X, X) =
  v I`` but every cross-covariance ``K(X*, X)`` is zero, even if rows of ``X*``
  coincide with rows of ``X`` (new observations get new, independent noise).
  ``diag(X*)`` is ``v`` (the marginal variance of a fresh noisy observation).
* ``RBF`` uses the IVM inverse width γ; a length-scale ℓ corresponds to
  γ = 1/ℓ² (``RBF.lengthscale`` reports it).

Parameters and transforms
-------------------------
Every hyperparameter has a *constrained* value x (what the formulas use,
reported by ``get_params``) and an *unconstrained* value t (``kernel.theta``,
what an optimiser moves) linked by a transform x = g(t):

=============  ==========================  ========================  ==========================
transform      x = g(t)                    dx/dt                     t = g⁻¹(x)
=============  ==========================  ========================  ==========================
``softplus``   log(1 + eᵗ)  (IVM §4)       σ(t) = 1/(1 + e⁻ᵗ)        x + log(1 - e⁻ˣ)
``log``        eᵗ                          eᵗ = x                    log x
``sigmoid``    σ(t)  (IVM §4, ARD scales)  σ(t) σ(-t) = x (1 - x)    log x - log(1 - x)
=============  ==========================  ========================  ==========================

``softplus`` is the default for every positive parameter, ``sigmoid`` for ARD
scales (which then lie in (0, 1): the overall scale is carried by the variance,
the inverse width or the weight variance). They are evaluated stably:
``softplus`` as ``logaddexp(0, t)``, its inverse as ``x + log(-expm1(-x))``
(no overflow for large x, full precision for tiny x), ``σ`` with
``scipy.special.expit`` and σ(t)σ(-t) for its derivative. A parameter can also
be marked ``'fixed'``: it keeps its value and is left out of ``theta`` and of
the gradients. Choose per parameter with ``transforms={'variance': 'log'}``.

Gradients are exact derivatives of K with respect to the unconstrained
parameters, dK/dt = dK/dx · dx/dt, in ``theta`` order
(``kernel.hyperparameter_names``).

Memory
------
``kernel(X)`` forms one n×n result (plus at most a few n×n temporaries);
``kernel.diag(X)`` works in O(n d) without forming any n×n array;
``kernel(X, eval_gradient=True)`` returns the full (n, n, n_theta) array; for
O(n²) memory use ``kernel.gradient(X, i)`` (one parameter) or
``kernel.gradient_iter(X)`` (one n×n derivative at a time). ``kernel.columns(X)``
returns an oracle for single columns of K(X, X) (O(n d) each, no n×n array;
used by the IVM). Peak n×n arrays
alive, besides the result: about 2 for K of RBF/Linear, 4 for K of MLP; while
differentiating, 3 for RBF and 7 for MLP (shared intermediates P = XAXᵀ,
sqrt(N), atan2 argument, scale factor, two work buffers), plus, for a product
of kernels, the product of the other factors.

Sparse GPs (inducing inputs Z) need derivatives of cross-covariances and of the
diagonal: ``kernel.cross_gradient_iter(Z, X)`` yields ∂K(Z, X)/∂θ_i one (m, n) array at a
time, ``kernel.diag_gradient(X)`` is the (n, n_theta) array of ∂k(x_i, x_i)/∂θ_j, and
``kernel.input_gradient(Z, X, W)`` is the (m, d) gradient of Σ_ij W_ij k(z_i, x_j) with respect
to Z (X fixed): for RBF/RBFARD ``G_i = -γ a ∘ Σ_j W_ij k(z_i, x_j) (z_i - x_j)``, for
Linear/LinearARD ``G = v (W X) A``, for MLP/MLPARD ``G_i = w A Σ_j R_ij (x_j - (a_ij/d_i) z_i)``
with ``R = (2/π) v W / sqrt(N)`` (notation of ``MLP``), zero for White and Bias, and by the sum
and product rules for composites. Every kernel here provides all three.

Squared distances are computed as |x|² + |y|² - 2 XYᵀ with BLAS (``X @ X.T``
takes numpy's syrk path and is exactly symmetric), after subtracting the mean
of ``X`` from both inputs (distances are translation invariant; centring removes
the cancellation for data far from the origin), and clamped at 0.
"""
import collections
import copy
import numbers

import numpy as np
from scipy.special import expit

from . import _validation as _v

__all__ = [
    "Kernel", "Linear", "RBF", "MLP", "White", "Bias", "LinearARD", "RBFARD", "MLPARD",
    "Sum", "Product", "Transform", "TRANSFORMS", "KernelColumns", "ColumnProductCache",
]

_TWO_OVER_PI = 2.0 / np.pi
_FIXED = "fixed"


# --------------------------------------------------------------------------------------------
# Transforms
# --------------------------------------------------------------------------------------------
class Transform:
    """A bijection x = g(t) from the real line onto the domain of a hyperparameter.

    Attributes
    ----------
    name : str
    bounds : (float, float)
        Unconstrained interval on which g(t) is a finite, positive, normal float;
        ``Kernel.bounds`` reports it per parameter (usable by L-BFGS-B).
    """

    name = None
    bounds = (-np.inf, np.inf)
    upper = np.inf          # open upper limit of the constrained domain (0, upper)

    def forward(self, t):
        """Constrained value x = g(t)."""
        raise NotImplementedError

    def inverse(self, x):
        """Unconstrained value t = g⁻¹(x); x must lie in the domain."""
        raise NotImplementedError

    def derivative(self, t):
        """dx/dt at t."""
        raise NotImplementedError

    def check(self, x, name):
        """Raise ``ValueError`` naming ``name`` unless every x is in (0, upper)."""
        x = np.asarray(x, dtype=float)
        bad = ~((x > 0) & (x < self.upper))
        if np.any(bad):
            value = x.reshape(-1)[np.flatnonzero(bad.reshape(-1))[0]]
            dom = "(0, 1)" if np.isfinite(self.upper) else "> 0 and finite"
            raise ValueError(f"{name} must be {dom} for the {self.name!r} transform, got {value!r}")

    def __repr__(self):
        return f"Transform({self.name!r})"


class _Softplus(Transform):
    name = "softplus"
    bounds = (-700.0, np.inf)

    def forward(self, t):
        return np.logaddexp(0.0, t)

    def inverse(self, x):
        x = np.asarray(x, dtype=float)
        return x + np.log(-np.expm1(-x))

    def derivative(self, t):
        return expit(t)


class _Log(Transform):
    name = "log"
    bounds = (-700.0, 700.0)

    def forward(self, t):
        with np.errstate(over="ignore"):
            return np.exp(t)

    def inverse(self, x):
        return np.log(x)

    def derivative(self, t):
        with np.errstate(over="ignore"):
            return np.exp(t)


class _Sigmoid(Transform):
    name = "sigmoid"
    bounds = (-700.0, np.inf)
    upper = 1.0

    def forward(self, t):
        return expit(t)

    def inverse(self, x):
        x = np.asarray(x, dtype=float)
        return np.log(x) - np.log1p(-x)

    def derivative(self, t):
        return expit(t) * expit(-np.asarray(t, dtype=float))


#: The available transforms by name (``'fixed'`` is accepted in ``transforms=`` too).
TRANSFORMS = {t.name: t for t in (_Softplus(), _Log(), _Sigmoid())}


# --------------------------------------------------------------------------------------------
# Numerical helpers (BLAS-backed)
# --------------------------------------------------------------------------------------------
def _gram(X, Y=None):
    """X Xᵀ (syrk, exactly symmetric) or X Yᵀ."""
    if Y is None:
        return X @ X.T
    return X @ Y.T


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
        self.xc_mu = self.Xc @ mu
        self.mu2 = float(mu @ mu)
        self.norms = _row_sq_norms(X)
        self.max_columns = int(max_columns)
        self._stored = collections.OrderedDict()
        self.hits = 0
        self.misses = 0

    def centred_product(self, j):
        if self.max_columns <= 0:
            return self.Xc @ self.Xc[j]
        pc = self._stored.get(j)
        if pc is not None:
            self._stored.move_to_end(j)
            self.hits += 1
            return pc
        self.misses += 1
        pc = self.Xc @ self.Xc[j]
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
    """

    def __init__(self, X, max_columns):
        X = _v.as_float_matrix(X, "X")
        max_columns = _v.check_int(max_columns, "max_columns", minimum=1)
        self.X = X
        self._shared = _CentredColumns(X, max_columns)

    @property
    def max_columns(self):
        return self._shared.max_columns

    @property
    def n_stored(self):
        return len(self._shared._stored)

    @property
    def nbytes(self):
        return sum(a.nbytes for a in self._shared._stored.values())

    @property
    def hits(self):
        return self._shared.hits

    @property
    def misses(self):
        return self._shared.misses

    def clear(self):
        self._shared._stored.clear()

    def _for(self, X):
        if X is not self.X and (X.shape != self.X.shape or not np.array_equal(X, self.X)):
            raise ValueError("product_cache was built for different inputs X")
        return self._shared


def _shares_centred(kernel):
    """True for the leaves whose column ``_column_centred`` builds from the shared product."""
    return type(kernel) in (Linear, RBF, MLP)


def _check_index(index, n_theta):
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, numbers.Integral):
        raise TypeError(f"index must be an integer, got {type(index).__name__}")
    index = int(index)
    if not 0 <= index < n_theta:
        raise ValueError(f"index must be in [0, {n_theta}) (the kernel has {n_theta} free parameters), got {index}")
    return index


# --------------------------------------------------------------------------------------------
# Base classes
# --------------------------------------------------------------------------------------------
class Kernel:
    """Base class of all kernels: the public API, shared by leaves and composites.

    Subclasses implement ``_K(X, Y)``, ``_diag(X)``, ``_grads(X, slots)`` (a
    generator of dK/dθ_s for the requested unconstrained indices, each a fresh
    array) and ``_value_and_gradient(X, dK_out)`` (K, with dK written into
    ``dK_out``, sharing intermediate results between the two).
    """

    # ---- public parameter API -------------------------------------------------------------
    @property
    def theta(self):
        """Unconstrained free hyperparameters as a 1-D float64 array (a copy)."""
        return self._get_theta()

    @theta.setter
    def theta(self, value):
        value = _v.as_float_vector(value, "theta", length=self.n_theta)
        self._set_theta(value, 0)

    @property
    def n_theta(self):
        """Number of free (unconstrained) hyperparameters."""
        return len(self.hyperparameter_names)

    @property
    def bounds(self):
        """(n_theta, 2) array of lower/upper limits for ``theta`` (see ``Transform.bounds``)."""
        return np.array(self._bounds(), dtype=float).reshape(-1, 2)

    def clone_with_theta(self, theta):
        """Return a deep copy with ``theta`` set."""
        new = copy.deepcopy(self)
        new.theta = theta
        return new

    # ---- evaluation --------------------------------------------------------------------------
    def __call__(self, X, Y=None, eval_gradient=False):
        """Kernel matrix K(X, Y) (K(X, X) when ``Y`` is None).

        Parameters
        ----------
        X : array-like (n, d)
        Y : array-like (m, d) or None
        eval_gradient : bool
            Only with ``Y=None``: also return dK of shape (n, n, n_theta),
            ``dK[:, :, i] = ∂K/∂theta[i]`` in the unconstrained space.

        Returns
        -------
        K : ndarray (n, m)
        dK : ndarray (n, n, n_theta), only if ``eval_gradient``
        """
        X = self._validate_X(X, "X")
        if not isinstance(eval_gradient, (bool, np.bool_)):
            raise TypeError(f"eval_gradient must be a bool, got {type(eval_gradient).__name__}")
        if Y is not None:
            if eval_gradient:
                raise ValueError("eval_gradient=True is only supported with Y=None (gradients of K(X, X))")
            Y = self._validate_X(Y, "Y")
            if Y.shape[1] != X.shape[1]:
                raise ValueError(f"Y must have the same number of columns as X ({X.shape[1]}), got {Y.shape[1]}")
            return self._K(X, Y)
        if not eval_gradient:
            return self._K(X, None)
        return self._unchecked_value_and_gradient(X)

    def diag(self, X):
        """The diagonal of K(X, X) in O(n d) time and memory, without forming K."""
        X = self._validate_X(X, "X")
        return self._diag(X)

    def gradient(self, X, index):
        """∂K(X, X)/∂theta[index] as an (n, n) array (one parameter; O(n²) memory)."""
        X = self._validate_X(X, "X")
        index = _check_index(index, self.n_theta)
        return next(self._grads(X, [index]))

    def gradient_iter(self, X):
        """Iterator over ∂K(X, X)/∂theta[i], i = 0 .. n_theta-1, one fresh (n, n) array at a time.

        Intermediate quantities (distances, inner products) are computed once per
        leaf kernel; the caller may modify or discard each array.
        """
        X = self._validate_X(X, "X")
        return self._unchecked_gradient_iter(X)

    def columns(self, X, product_cache=None):
        """Column oracle of K(X, X): ``cols = kernel.columns(X)``, then ``cols(j)`` is ``K(X, X)[:, j]``.

        For algorithms that need a few columns of an n×n kernel matrix that is never
        formed (the IVM includes one point at a time). The setup (validation,
        centring, row norms, ``diag``) costs O(n d) once; each column then costs
        O(n d) time and O(n) memory (about one matrix-vector product per leaf
        kernel). Entry ``j`` of column ``j`` is exactly ``cols.diag[j]`` =
        ``kernel.diag(X)[j]``, so ``White`` contributes there and nowhere else, as in
        ``K(X, X)``. The other entries agree with ``kernel(X)`` to rounding.

        ``product_cache`` (a :class:`ColumnProductCache` built on the same X) supplies
        and keeps the parameter-free product ``Xc x̃_j`` of the non-ARD Linear, RBF and
        MLP terms of this kernel (the kernel itself or the terms of sums and products),
        so that columns requested again under other parameters skip the O(n p) gemv.
        Columns are bitwise identical to the uncached ones when every sum or product
        has at least two such terms (as the IVM paper's RBF + Linear + ...) or the
        kernel is a lone RBF; otherwise (a lone Linear or MLP term, which uncached uses
        ``X x_j`` directly) they agree to rounding.
        """
        X = self._validate_X(X, "X")
        if product_cache is not None and not isinstance(product_cache, ColumnProductCache):
            raise TypeError(f"product_cache must be a ColumnProductCache, got {type(product_cache).__name__}")
        return self._unchecked_columns(X, product_cache)

    def _column_state(self, X):
        """Per-X intermediates for ``_column`` (default: X itself)."""
        return X

    # ---- cross-covariance and input gradients (sparse GPs with inducing inputs) ---------------
    def cross_gradient_iter(self, X, Y):
        """Iterator over ∂K(X, Y)/∂theta[i], i = 0 .. n_theta-1, one fresh (n_x, n_y) array at a time.

        For sparse GPs (K_mn = K(Z, X) with inducing inputs Z). ``White`` contributes zeros
        (its cross-covariance is 0 for any second argument).
        """
        X, Y = self._validate_pair(X, Y)
        return self._unchecked_cross_gradient_iter(X, Y)

    def diag_gradient(self, X):
        """∂k(x_i, x_i)/∂theta[j] as an (n, n_theta) array, in O(n d) without forming K."""
        X = self._validate_X(X, "X")
        return self._unchecked_diag_gradient(X)

    def input_gradient(self, X, Y, weights):
        """Gradient with respect to the rows of X of ``Σ_ij weights_ij k(x_i, y_j)`` with Y held fixed.

        Returns an (n_x, d) array ``G[i] = Σ_j weights_ij ∂k(x_i, y_j)/∂x_i``. For the gradient of
        ``Σ_ij W_ij k(z_i, z_j)`` with respect to Z (both arguments moving) pass ``Y = Z`` and
        ``W + Wᵀ``. Available for every kernel of this module and their sums and products
        (``NotImplementedError`` for a user-defined kernel that does not implement it).
        """
        X, Y = self._validate_pair(X, Y)
        W = _v.as_float_matrix(weights, "weights", min_rows=0, min_cols=0)
        if W.shape != (X.shape[0], Y.shape[0]):
            raise ValueError(f"weights must have shape ({X.shape[0]}, {Y.shape[0]}) = (rows of X, rows of Y), "
                             f"got {W.shape}")
        return self._input_grad(X, Y, W)

    # ---- unchecked twins of the methods above --------------------------------------------------
    # For callers that have validated their inputs once already (the estimators, at every
    # optimiser step): float64 2-D arrays with the kernel's number of columns. The public
    # methods validate and then call these; the results are the same bit for bit.
    def _unchecked_call(self, X, Y=None):
        return self._K(X, Y)

    def _unchecked_value_and_gradient(self, X):
        n = X.shape[0]
        dK = np.empty((n, n, self.n_theta))
        K = self._value_and_gradient(X, dK)
        return K, dK

    def _unchecked_diag(self, X):
        return self._diag(X)

    def _unchecked_gradient_iter(self, X):
        return self._grads(X, list(range(self.n_theta)))

    def _unchecked_cross_gradient_iter(self, X, Y):
        return self._cross_grads(X, Y, list(range(self.n_theta)))

    def _unchecked_diag_gradient(self, X):
        cols = list(self._diag_grads(X, list(range(self.n_theta))))
        if not cols:
            return np.zeros((X.shape[0], 0))
        return np.column_stack(cols)

    def _unchecked_input_gradient(self, X, Y, weights):
        return self._input_grad(X, Y, weights)

    def _unchecked_columns(self, X, product_cache=None):
        return KernelColumns(self, X, None if product_cache is None else product_cache._for(X))

    def _validate_pair(self, X, Y):
        X = self._validate_X(X, "X")
        Y = self._validate_X(Y, "Y")
        if Y.shape[1] != X.shape[1]:
            raise ValueError(f"Y must have the same number of columns as X ({X.shape[1]}), got {Y.shape[1]}")
        return X, Y

    def _cross_grads(self, X, Y, slots):
        raise NotImplementedError(f"{type(self).__name__} does not provide cross-covariance gradients")

    def _diag_grads(self, X, slots):
        raise NotImplementedError(f"{type(self).__name__} does not provide gradients of its diagonal")

    def _input_grad(self, X, Y, W):
        raise NotImplementedError(f"{type(self).__name__} does not provide gradients with respect to its inputs")

    def _column(self, state, j):
        """Column j of K(X, X) except its j-th entry (fresh array); default: one K(X, x_j) call."""
        X = state
        return np.ascontiguousarray(self._K(X, X[j:j + 1])[:, 0])

    # ---- input checks ------------------------------------------------------------------------
    @property
    def n_features(self):
        """Number of input columns this kernel requires (None: any)."""
        return None

    def _validate_X(self, X, name):
        X = _v.as_float_matrix(X, name)
        need = self.n_features
        if need is not None and X.shape[1] != need:
            raise ValueError(
                f"{name} has {X.shape[1]} columns, but the kernel {self!r} expects {need} "
                f"(one per entry of ard_groups, or one per ARD scale)")
        return X

    # ---- algebra -----------------------------------------------------------------------------
    def __add__(self, other):
        if not isinstance(other, Kernel):
            return NotImplemented
        return Sum(_flatten(Sum, [self, other]))

    def __mul__(self, other):
        if not isinstance(other, Kernel):
            return NotImplemented
        return Product(_flatten(Product, [self, other]))


def _flatten(cls, kernels):
    out = []
    for k in kernels:
        out.extend(k.kernels if type(k) is cls else [k])
    return out


class KernelColumns:
    """Columns of K(X, X) one at a time (see :meth:`Kernel.columns`).

    Attributes
    ----------
    kernel : Kernel
        The kernel (not copied: do not change its parameters while using the oracle).
    X : ndarray (n, d)
    diag : ndarray (n,)
        ``kernel.diag(X)``.
    """

    def __init__(self, kernel, X, shared=None):
        self.kernel = kernel
        self.X = X
        self.diag = np.array(kernel._diag(X), dtype=float, copy=True).reshape(-1)
        self._leaf_shared = None
        if shared is not None and _shares_centred(kernel):
            self._leaf_shared = shared
        elif shared is not None and isinstance(kernel, _Composite):
            self._state = kernel._shared_column_state(X, shared)
        else:
            self._state = kernel._column_state(X)

    @property
    def n(self):
        return self.X.shape[0]

    def __call__(self, j):
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


class _Leaf(Kernel):
    """A kernel with its own hyperparameters (stored constrained and unconstrained)."""

    _scalar_params = ()          # names of scalar hyperparameters, in theta order
    _has_scales = False          # ARD kernels: a 'scales' vector follows the scalars

    # ---- construction ------------------------------------------------------------------------
    def _setup(self, values, transforms, scales=None, ard_groups=None):
        self._transforms = self._resolve_transforms(transforms)
        self._x = {}
        self._t = {}
        for name in self._scalar_params:
            self._store_constrained(name, self._coerce_scalar(values[name], name))
        if self._has_scales:
            scales, groups = self._coerce_scales_groups(scales, ard_groups)
            self._groups = groups
            self._store_constrained("scales", scales)

    def _param_names(self):
        return list(self._scalar_params) + (["scales"] if self._has_scales else [])

    def _resolve_transforms(self, transforms):
        names = self._param_names()
        out = {name: ("sigmoid" if name == "scales" else "softplus") for name in names}
        if transforms is None:
            return out
        if not isinstance(transforms, dict):
            raise TypeError(f"transforms must be a dict mapping parameter names to transform names, "
                            f"got {type(transforms).__name__}")
        for key, value in transforms.items():
            if key not in out:
                raise ValueError(f"transforms has an unknown parameter {key!r}; "
                                 f"{type(self).__name__} has parameters {names}")
            if not isinstance(value, str) or (value not in TRANSFORMS and value != _FIXED):
                raise ValueError(f"transforms[{key!r}] must be one of "
                                 f"{sorted(TRANSFORMS) + [_FIXED]}, got {value!r}")
            out[key] = value
        return out

    @staticmethod
    def _coerce_scalar(value, name):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
        return float(value)

    def _coerce_scales_groups(self, scales, ard_groups):
        if scales is None:
            raise TypeError("scales must be a 1-D array of ARD input scales (one per scale index), got None")
        if np.ndim(scales) == 0:
            raise ValueError("scales must be a 1-D array with one entry per input scale, got a scalar")
        scales = _v.as_float_vector(scales, "scales")
        if scales.shape[0] == 0:
            raise ValueError("scales must have at least one entry")
        if ard_groups is None:
            return scales, None
        groups = np.asarray(ard_groups)
        if groups.dtype == bool or not np.issubdtype(groups.dtype, np.integer):
            raise TypeError(f"ard_groups must be an array of integers (a scale index per input column), "
                            f"got dtype {groups.dtype}")
        if groups.ndim != 1 or groups.shape[0] == 0:
            raise ValueError(f"ard_groups must be a non-empty 1-D array, got shape {groups.shape}")
        n_scales = scales.shape[0]
        if groups.min() < 0 or groups.max() >= n_scales:
            raise ValueError(f"ard_groups entries must be in [0, {n_scales}) (len(scales) = {n_scales}), "
                             f"got values in [{groups.min()}, {groups.max()}]")
        unused = np.setdiff1d(np.arange(n_scales), groups)
        if unused.size:
            raise ValueError(f"ard_groups must use every scale; scale index {int(unused[0])} "
                             f"maps to no input column")
        return scales, np.ascontiguousarray(groups, dtype=np.intp)

    def _store_constrained(self, name, value):
        """Validate a constrained value against its transform and store it with its t."""
        tname = self._transforms[name]
        value = np.array(value, dtype=float)
        if not np.all(np.isfinite(value)):
            raise ValueError(f"{name} must be finite, got {value.tolist()!r}")
        if tname == _FIXED:
            if np.any(value <= 0):
                raise ValueError(f"{name} must be > 0, got {value.tolist()!r}")
            t = np.full(value.shape, np.nan)
        else:
            TRANSFORMS[tname].check(value, name)
            t = np.asarray(TRANSFORMS[tname].inverse(value), dtype=float)
        self._x[name] = value
        self._t[name] = t

    # ---- parameter views ---------------------------------------------------------------------
    def _free(self):
        return [name for name in self._param_names() if self._transforms[name] != _FIXED]

    def _slots(self):
        """(name, element) for each entry of theta, in order (element None for scalars)."""
        out = []
        for name in self._free():
            if name == "scales":
                out.extend(("scales", j) for j in range(self._x["scales"].shape[0]))
            else:
                out.append((name, None))
        return out

    @property
    def hyperparameter_names(self):
        """Names of the entries of ``theta`` (``'scales[j]'`` for ARD scales)."""
        return [name if j is None else f"{name}[{j}]" for name, j in self._slots()]

    def _get_theta(self):
        parts = [np.atleast_1d(self._t[name]) for name in self._free()]
        return np.concatenate(parts) if parts else np.empty(0)

    def _set_theta(self, theta, offset):
        new_t, new_x = {}, {}
        pos = offset
        for name in self._free():
            size = self._x[name].size
            t = theta[pos:pos + size].copy()
            tr = TRANSFORMS[self._transforms[name]]
            x = np.asarray(tr.forward(t), dtype=float)
            bad = ~(np.isfinite(x) & (x > 0))
            if np.any(bad):
                j = int(np.flatnonzero(bad)[0])
                label = name if self._x[name].ndim == 0 else f"{name}[{j}]"
                raise ValueError(
                    f"theta entry {pos + j} ({label}) = {t[j]!r} maps to {label} = {x[j]!r} under the "
                    f"{tr.name!r} transform, outside the representable range; keep theta within kernel.bounds "
                    f"{tr.bounds}")
            new_t[name] = t.reshape(self._x[name].shape)
            new_x[name] = x.reshape(self._x[name].shape)
            pos += size
        self._t.update(new_t)
        self._x.update(new_x)
        return pos

    def _bounds(self):
        return [TRANSFORMS[self._transforms[name]].bounds for name, _ in self._slots()]

    def _dxdt(self, name, j):
        t = self._t[name] if j is None else self._t[name][j]
        return float(TRANSFORMS[self._transforms[name]].derivative(t))

    def _value(self, name):
        return float(self._x[name])

    # ---- get/set params ----------------------------------------------------------------------
    def get_params(self, deep=True):
        """Constructor arguments with the current *constrained* values (and full ``transforms``)."""
        out = {name: float(self._x[name]) for name in self._scalar_params}
        if self._has_scales:
            out["scales"] = self._x["scales"].copy()
            out["ard_groups"] = None if self._groups is None else self._groups.copy()
        out["transforms"] = dict(self._transforms)
        return out

    def set_params(self, **params):
        """Set constructor arguments (constrained values); returns ``self``.

        ``transforms`` has the constructor's meaning (unlisted parameters get the
        default transform); values of parameters not passed are kept.
        """
        valid = set(self.get_params())
        for key in params:
            if key not in valid:
                raise ValueError(f"invalid parameter {key!r} for {type(self).__name__}; "
                                 f"valid parameters are {sorted(valid)}")
        new = copy.copy(self)
        new._x = dict(self._x)
        new._t = dict(self._t)
        if "transforms" in params:
            new._transforms = self._resolve_transforms(params["transforms"])
            for name in self._param_names():
                if name not in params and new._transforms[name] != self._transforms[name]:
                    new._store_constrained(name, self._x[name])
        for name in self._scalar_params:
            if name in params:
                new._store_constrained(name, self._coerce_scalar(params[name], name))
        if self._has_scales and ("scales" in params or "ard_groups" in params):
            scales = params.get("scales", self._x["scales"])
            groups = params["ard_groups"] if "ard_groups" in params else self._groups
            scales, groups = self._coerce_scales_groups(scales, groups)
            new._groups = groups
            if "scales" in params or scales.shape != self._x["scales"].shape:
                new._store_constrained("scales", scales)
        self.__dict__.update(new.__dict__)
        return self

    def __repr__(self):
        parts = [f"{name}={float(self._x[name])!r}" for name in self._scalar_params]
        if self._has_scales:
            parts.insert(0, f"scales={np.array2string(self._x['scales'], separator=', ', precision=6)}")
            if self._groups is not None:
                parts.append(f"ard_groups={np.array2string(self._groups, separator=', ', threshold=20)}")
        changed = {k: t for k, t in self._transforms.items()
                   if t != ("sigmoid" if k == "scales" else "softplus")}
        if changed:
            parts.append(f"transforms={changed!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    # ---- gradients ---------------------------------------------------------------------------
    def _grads(self, X, slots, state=None):
        all_slots = self._slots()
        pairs = [all_slots[s] for s in slots]
        for (name, j), g in zip(pairs, self._grads_constrained(X, pairs, state)):
            g *= self._dxdt(name, j)
            yield g

    def _value_and_gradient(self, X, dK_out):
        state = self._grad_state(X)
        K = self._K_from_state(X, state)
        for i, g in enumerate(self._grads(X, list(range(dK_out.shape[2])), state)):
            dK_out[:, :, i] = g
        return K

    def _grad_state(self, X):
        """Intermediate results shared by K(X, X) and its derivatives (None: nothing to share)."""
        return None

    def _K_from_state(self, X, state):
        return self._K(X, None)

    def _grads_constrained(self, X, pairs, state):  # pragma: no cover - abstract
        """Yield ∂K/∂x for each (name, element) pair: fresh arrays (``state`` may be None)."""
        raise NotImplementedError

    def _cross_grads(self, X, Y, slots):
        all_slots = self._slots()
        pairs = [all_slots[s] for s in slots]
        for (name, j), g in zip(pairs, self._cross_grads_constrained(X, Y, pairs)):
            g *= self._dxdt(name, j)
            yield g

    def _diag_grads(self, X, slots):
        all_slots = self._slots()
        pairs = [all_slots[s] for s in slots]
        for (name, j), g in zip(pairs, self._diag_grads_constrained(X, pairs)):
            g *= self._dxdt(name, j)
            yield g

    def _cross_grads_constrained(self, X, Y, pairs):
        """Yield ∂K(X, Y)/∂x for each (name, element) pair (fresh arrays)."""
        raise NotImplementedError(f"{type(self).__name__} does not provide cross-covariance gradients")

    def _diag_grads_constrained(self, X, pairs):
        """Yield ∂diag K(X, X)/∂x for each (name, element) pair (fresh arrays)."""
        raise NotImplementedError(f"{type(self).__name__} does not provide gradients of its diagonal")


class _ARDMixin:
    """Per-column scales α_col = scales[ard_groups[col]] and the column sets of each scale."""

    _has_scales = True

    @property
    def n_features(self):
        return self._x["scales"].shape[0] if self._groups is None else self._groups.shape[0]

    @property
    def ard_groups(self):
        """Scale index of each input column (None: one scale per column)."""
        return None if self._groups is None else self._groups.copy()

    def _column_scales(self):
        s = self._x["scales"]
        return s if self._groups is None else s[self._groups]

    def _columns_of(self, j):
        if self._groups is None:
            return np.array([j])
        return np.flatnonzero(self._groups == j)


# --------------------------------------------------------------------------------------------
# Leaf kernels
# --------------------------------------------------------------------------------------------
class Linear(_Leaf):
    """Linear kernel k(x, y) = v xᵀy (IVM §4, k_lin).

    Parameters
    ----------
    variance : float > 0
        Process variance v.
    transforms : dict, optional
        ``{'variance': 'softplus' | 'log' | 'sigmoid' | 'fixed'}``; default softplus.
    """

    _scalar_params = ("variance",)

    def __init__(self, variance=1.0, transforms=None):
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
        col = X @ X[j]
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
        G = W @ Y
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
    """

    _scalar_params = ("variance",)

    def __init__(self, scales, variance=1.0, ard_groups=None, transforms=None):
        self._setup({"variance": variance}, transforms, scales, ard_groups)

    def _K(self, X, Y):
        r = np.sqrt(self._column_scales())
        K = _gram(X * r, None if Y is None else Y * r)
        K *= self._value("variance")
        return K

    def _diag(self, X):
        return self._value("variance") * (X * X) @ self._column_scales()

    def _column_state(self, X):
        return np.ascontiguousarray(X * np.sqrt(self._column_scales()))

    def _column(self, Z, j):
        col = Z @ Z[j]
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
                yield (X * X) @ self._column_scales()
            else:
                cols = self._columns_of(j)
                yield v * np.sum(X[:, cols] ** 2, axis=1)

    def _input_grad(self, X, Y, W):
        G = W @ Y
        G *= self._value("variance") * self._column_scales()
        return G


class RBF(_Leaf):
    """Squared-exponential kernel k(x, y) = v exp(-γ/2 |x - y|²) (IVM §4, k_rbf).

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
    """

    _scalar_params = ("variance", "inverse_width")

    def __init__(self, variance=1.0, inverse_width=1.0, transforms=None):
        self._setup({"variance": variance, "inverse_width": inverse_width}, transforms)

    @property
    def lengthscale(self):
        """ℓ = 1/sqrt(γ)."""
        return 1.0 / np.sqrt(self._value("inverse_width"))

    def _sqdist(self, X, Y):
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
        D = Xc @ Xc[j] if pc is None else pc * 1.0
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
        v, gamma = self._value("variance"), self._value("inverse_width")
        D, E = self._grad_state(X) if state is None else state
        for name, j in pairs:
            if name == "variance":
                yield E.copy()
            elif name == "inverse_width":
                g = D * E
                g *= -0.5 * v
                yield g
            else:
                yield self._ard_grad(X, j, E, v, gamma)

    def _cross_grads_constrained(self, X, Y, pairs):
        v, gamma = self._value("variance"), self._value("inverse_width")
        D = self._sqdist(X, Y)
        E = np.exp(-0.5 * gamma * D)
        for name, j in pairs:
            if name == "variance":
                yield E.copy()
            elif name == "inverse_width":
                g = D * E
                g *= -0.5 * v
                yield g
            else:
                yield self._ard_grad_cross(X, Y, j, E, v, gamma)

    def _diag_grads_constrained(self, X, pairs):
        for name, _ in pairs:
            yield np.ones(X.shape[0]) if name == "variance" else np.zeros(X.shape[0])

    def _input_scales(self, d):
        return np.ones(d)

    def _input_grad(self, X, Y, W):
        # ∂k(x, y)/∂x_c = -γ a_c (x_c - y_c) k(x, y); differences from centred inputs
        Xc, Yc = _centre(X, Y)
        P = W * self._K(X, Y)
        G = Xc * P.sum(axis=1)[:, None]
        G -= P @ Yc
        G *= -self._value("inverse_width") * self._input_scales(X.shape[1])
        return G


class RBFARD(_ARDMixin, RBF):
    """RBF ARD kernel k(x, y) = v exp(-γ/2 Σ_c α_c (x_c - y_c)²) (IVM §4).

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
    """

    _scalar_params = ("variance", "inverse_width")

    def __init__(self, scales, variance=1.0, inverse_width=1.0, ard_groups=None, transforms=None):
        self._setup({"variance": variance, "inverse_width": inverse_width}, transforms, scales, ard_groups)

    def _sqdist(self, X, Y):
        r = np.sqrt(self._column_scales())
        Xc, Yc = _centre(X, Y)
        return _sqdist_centred(Xc * r, None if Yc is None else Yc * r)

    def _ard_grad(self, X, j, E, v, gamma):
        Xc, _ = _centre(X)
        g = _sqdist_centred(Xc[:, self._columns_of(j)])
        g *= E
        g *= -0.5 * gamma * v
        return g

    def _ard_grad_cross(self, X, Y, j, E, v, gamma):
        Xc, Yc = _centre(X, Y)
        cols = self._columns_of(j)
        g = _sqdist_centred(Xc[:, cols], Yc[:, cols])
        g *= E
        g *= -0.5 * gamma * v
        return g

    def _input_scales(self, d):
        return self._column_scales()


class MLP(_Leaf):
    """MLP (arcsine) kernel of Williams (1997) (IVM §4, k_mlp, with the factor 2/π).

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
    cancellation as N = w²(|x|²|y|² - (xᵀy)²) + w b |x - y|² + (d - 1) + (e - 1) + 1
    (each term ≥ 0, N ≥ 1; exactly 2s + 1 on the diagonal, s = d - 1). With
    Q = (2/π) v / sqrt(N) the derivatives are

    * ∂K/∂v = (2/π) asin(z)
    * ∂K/∂w = Q [e (P + b (P - |x|²)) + d (P + b (P - |y|²))] / (2 d e),  P = xᵀy
    * ∂K/∂b = Q [d (1 + w (|y|² - P)) + e (1 + w (|x|² - P))] / (2 d e)
    * ∂K/∂α_g (ARD) = Q w [e T_x + d T_y] / (2 d e),
      T_x = w (|x|² P_g - P |x_g|²) + b (P_g - |x_g|²) + P_g  (T_y likewise),

    from d asin z = [da - (a/2)(dd/d + de/e)] / sqrt(N), arranged so that the
    diagonal has no cancellation. The same formulas, with d for the rows of X and e for
    those of Y, give ∂K(X, Y)/∂θ (``cross_gradient_iter``). For sparse GPs also

    * ∂k(x, x)/∂θ (``diag_gradient``): with s = w|x|² + b, k(x, x) = (2/π) v asin(s/(s + 1))
      and d asin(s/(s + 1))/ds = 1/((s + 1) sqrt(2s + 1)), so ∂/∂v = (2/π) asin(s/(s + 1)),
      ∂/∂w = q |x|², ∂/∂b = q, ∂/∂α_g = q w |x_g|² with q = (2/π) v / ((s + 1) sqrt(2s + 1));
    * ∂k(x, y)/∂x (``input_gradient``) = (2/π) v w A (y - (a/d) x) / sqrt(N) (e does not
      depend on x).
    """

    _scalar_params = ("variance", "weight_variance", "bias_variance")

    def __init__(self, variance=1.0, weight_variance=1.0, bias_variance=1.0, transforms=None):
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
            P = Z @ Z[j]
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
        Q = (_TWO_OVER_PI * v) / root              # (2/π) v / sqrt(N)
        Q /= 2.0 * np.multiply.outer(d, d)         # ... / (2 d d')
        M = np.empty_like(P)
        tmp = None
        for name, j in pairs:
            if name == "variance":
                g = np.arctan2(a, root)
                g *= _TWO_OVER_PI
                yield g
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
        Q = (_TWO_OVER_PI * v) / root              # (2/π) v / sqrt(N)
        Q /= 2.0 * np.multiply.outer(d, e)         # ... / (2 d e)
        for name, j in pairs:
            if name == "variance":
                g = np.arctan2(a, root)
                g *= _TWO_OVER_PI
                yield g
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
        G = R @ Y
        G -= c[:, None] * X
        G *= w * self._input_scales(X.shape[1])
        return G


class MLPARD(_ARDMixin, MLP):
    """MLP ARD kernel: ``MLP`` with xᵀy, xᵀx, yᵀy replaced by xᵀAy, xᵀAx, yᵀAy (IVM §4).

    Parameters
    ----------
    scales : array-like (n_scales,)
        Input scales α in (0, 1).
    variance, weight_variance, bias_variance : float > 0
    ard_groups : int array (n_features,), optional
    transforms : dict, optional
    """

    _scalar_params = ("variance", "weight_variance", "bias_variance")

    def __init__(self, scales, variance=1.0, weight_variance=1.0, bias_variance=1.0, ard_groups=None,
                 transforms=None):
        self._setup({"variance": variance, "weight_variance": weight_variance,
                     "bias_variance": bias_variance}, transforms, scales, ard_groups)

    def _scaled(self, X):
        return X * np.sqrt(self._column_scales())


class White(_Leaf):
    """White noise k(x_i, x_j) = v δ_ij (IVM §4, k_white).

    ``K(X, X) = v I``; ``K(X*, X) = 0`` for any second argument (new
    observations carry independent noise), ``diag(X) = v``.
    """

    _scalar_params = ("variance",)

    def __init__(self, variance=1.0, transforms=None):
        self._setup({"variance": variance}, transforms)

    def _K(self, X, Y):
        if Y is None:
            return np.eye(X.shape[0]) * self._value("variance")
        return np.zeros((X.shape[0], Y.shape[0]))

    def _diag(self, X):
        return np.full(X.shape[0], self._value("variance"))

    def _grads_constrained(self, X, pairs, state):
        for _ in pairs:
            yield np.eye(X.shape[0])

    def _column(self, X, j):
        return np.zeros(X.shape[0])     # the variance sits on the diagonal only

    def _cross_grads_constrained(self, X, Y, pairs):
        for _ in pairs:
            yield np.zeros((X.shape[0], Y.shape[0]))

    def _diag_grads_constrained(self, X, pairs):
        for _ in pairs:
            yield np.ones(X.shape[0])

    def _input_grad(self, X, Y, W):
        return np.zeros(X.shape)


class Bias(_Leaf):
    """Constant kernel k(x, y) = v (IVM §4, k_bias): uncertainty in an offset."""

    _scalar_params = ("variance",)

    def __init__(self, variance=1.0, transforms=None):
        self._setup({"variance": variance}, transforms)

    def _K(self, X, Y):
        m = X.shape[0] if Y is None else Y.shape[0]
        return np.full((X.shape[0], m), self._value("variance"))

    def _diag(self, X):
        return np.full(X.shape[0], self._value("variance"))

    def _grads_constrained(self, X, pairs, state):
        for _ in pairs:
            yield np.ones((X.shape[0], X.shape[0]))

    def _column(self, X, j):
        return np.full(X.shape[0], self._value("variance"))

    def _cross_grads_constrained(self, X, Y, pairs):
        for _ in pairs:
            yield np.ones((X.shape[0], Y.shape[0]))

    def _diag_grads_constrained(self, X, pairs):
        for _ in pairs:
            yield np.ones(X.shape[0])

    def _input_grad(self, X, Y, W):
        return np.zeros(X.shape)


# --------------------------------------------------------------------------------------------
# Composite kernels
# --------------------------------------------------------------------------------------------
class _Composite(Kernel):
    """Shared machinery of Sum and Product: children are deep copies, theta is their concatenation.

    Hyperparameter names are ``'k{i}__{name}'``; ``get_params``/``set_params``
    use the same ``k{i}__`` prefixes (and ``kernels`` for the list itself).
    """

    _symbol = None

    def __init__(self, kernels):
        if isinstance(kernels, Kernel) or not isinstance(kernels, (list, tuple)):
            raise TypeError(f"kernels must be a list of Kernel instances, got {type(kernels).__name__}")
        if len(kernels) == 0:
            raise ValueError("kernels must contain at least one kernel")
        for i, k in enumerate(kernels):
            if not isinstance(k, Kernel):
                raise TypeError(f"kernels[{i}] must be a Kernel instance, got {type(k).__name__}")
        need = {k.n_features for k in kernels} - {None}
        if len(need) > 1:
            raise ValueError(f"kernels expect different numbers of input columns: {sorted(need)}")
        self.kernels = [copy.deepcopy(k) for k in kernels]

    @property
    def n_features(self):
        need = {k.n_features for k in self.kernels} - {None}
        return need.pop() if need else None

    @property
    def hyperparameter_names(self):
        return [f"k{i}__{name}" for i, k in enumerate(self.kernels) for name in k.hyperparameter_names]

    def _get_theta(self):
        parts = [k._get_theta() for k in self.kernels]
        return np.concatenate(parts) if parts else np.empty(0)

    def _set_theta(self, theta, offset):
        # validate every child before changing any (atomic update)
        trial = [copy.deepcopy(k) for k in self.kernels]
        pos = offset
        for k in trial:
            pos = k._set_theta(theta, pos)
        for k, t in zip(self.kernels, trial):
            k.__dict__.update(t.__dict__)
        return pos

    def _bounds(self):
        return [b for k in self.kernels for b in k._bounds()]

    def _runs(self, slots):
        """Split global theta indices into consecutive runs (child index, [local indices])."""
        sizes = [k.n_theta for k in self.kernels]
        starts = np.concatenate([[0], np.cumsum(sizes)])
        runs = []
        for s in slots:
            c = int(np.searchsorted(starts, s, side="right") - 1)
            local = s - int(starts[c])
            if runs and runs[-1][0] == c:
                runs[-1][1].append(local)
            else:
                runs.append((c, [local]))
        return runs

    def _child_ranges(self):
        pos = 0
        for k in self.kernels:
            yield k, slice(pos, pos + k.n_theta)
            pos += k.n_theta

    def _shared_column_state(self, X, shared=None):
        """Child column states; leaves that can share one centred product (``_CentredColumns``) get None.

        ``shared``: a caching ``_CentredColumns`` of X (from a ColumnProductCache) to use
        even for a single sharing leaf, and in nested sums and products.
        """
        sharing = [_shares_centred(k) for k in self.kernels]
        cache = shared
        if shared is None and sum(sharing) >= 2:
            shared = _CentredColumns(X)
        states = []
        for k, share in zip(self.kernels, sharing):
            if share and shared is not None:
                states.append(None)
            elif cache is not None and isinstance(k, _Composite):
                states.append(k._shared_column_state(X, cache))
            else:
                states.append(k._column_state(X))
        return shared, states

    def _child_columns(self, state, j):
        shared, states = state
        pc = None
        for k, st in zip(self.kernels, states):
            if st is None and shared is not None:
                if pc is None:
                    pc = shared.centred_product(j)
                yield k._column_centred(shared, j, pc)
            else:
                yield k._column(st, j)

    def get_params(self, deep=True):
        out = {"kernels": list(self.kernels)}
        if deep:
            for i, k in enumerate(self.kernels):
                for name, value in k.get_params(deep=True).items():
                    out[f"k{i}__{name}"] = value
        return out

    def set_params(self, **params):
        """Set ``kernels`` (copied) or child parameters ``k{i}__name``; returns ``self``."""
        if "kernels" in params:
            type(self).__init__(self, params.pop("kernels"))
        by_child = {}
        for key, value in params.items():
            head, sep, rest = key.partition("__")
            ok = sep and head.startswith("k") and head[1:].isdigit() and int(head[1:]) < len(self.kernels)
            if not ok:
                raise ValueError(f"invalid parameter {key!r} for {type(self).__name__}; use 'kernels' or "
                                 f"'k<i>__<name>' with i < {len(self.kernels)}")
            by_child.setdefault(int(head[1:]), {})[rest] = value
        trial = {i: copy.deepcopy(self.kernels[i]).set_params(**p) for i, p in by_child.items()}
        for i, k in trial.items():
            self.kernels[i] = k
        return self

    def __repr__(self):
        inner = f" {self._symbol} ".join(
            f"({k!r})" if isinstance(k, _Composite) else repr(k) for k in self.kernels)
        return inner if len(self.kernels) > 1 else f"{type(self).__name__}([{inner}])"


class Sum(_Composite):
    """Sum of kernels, K = Σ_c K_c (a valid covariance: sums of PSD matrices are PSD).

    ``Sum([k1, k2, ...])`` or ``k1 + k2``; the terms are deep-copied, so
    ``k + k`` has two independent sets of parameters. ∂K/∂θ of a term's
    parameter is that term's derivative.
    """

    _symbol = "+"

    def _K(self, X, Y):
        K = self.kernels[0]._K(X, Y)
        for k in self.kernels[1:]:
            K += k._K(X, Y)
        return K

    def _diag(self, X):
        out = self.kernels[0]._diag(X)
        for k in self.kernels[1:]:
            out = out + k._diag(X)
        return out

    def _column_state(self, X):
        return self._shared_column_state(X)

    def _column(self, states, j):
        cols = self._child_columns(states, j)
        col = next(cols)
        for c in cols:
            col += c
        return col

    def _grads(self, X, slots, state=None):
        for c, local in self._runs(slots):
            yield from self.kernels[c]._grads(X, local)

    def _cross_grads(self, X, Y, slots):
        for c, local in self._runs(slots):
            yield from self.kernels[c]._cross_grads(X, Y, local)

    def _diag_grads(self, X, slots):
        for c, local in self._runs(slots):
            yield from self.kernels[c]._diag_grads(X, local)

    def _input_grad(self, X, Y, W):
        G = self.kernels[0]._input_grad(X, Y, W)
        for k in self.kernels[1:]:
            G = G + k._input_grad(X, Y, W)
        return G

    def _value_and_gradient(self, X, dK_out):
        K = None
        for k, rng in self._child_ranges():
            Kc = k._value_and_gradient(X, dK_out[:, :, rng])
            if K is None:
                K = Kc
            else:
                K += Kc
        return K


class Product(_Composite):
    """Elementwise (Schur) product of kernels, K = ∏_c K_c (PSD by the Schur product theorem).

    ``Product([k1, k2, ...])`` or ``k1 * k2``; terms are deep-copied.
    ∂K/∂θ of a parameter of term c is ∂K_c/∂θ ∘ ∏_{o≠c} K_o.
    """

    _symbol = "*"

    def _K(self, X, Y):
        K = self.kernels[0]._K(X, Y)
        for k in self.kernels[1:]:
            K *= k._K(X, Y)
        return K

    def _diag(self, X):
        out = self.kernels[0]._diag(X)
        for k in self.kernels[1:]:
            out = out * k._diag(X)
        return out

    def _column_state(self, X):
        return self._shared_column_state(X)

    def _column(self, states, j):
        cols = self._child_columns(states, j)
        col = next(cols)
        for c in cols:
            col *= c
        return col

    def _others(self, X, c):
        other = None
        for o, k in enumerate(self.kernels):
            if o == c:
                continue
            if other is None:
                other = k._K(X, None)
            else:
                other *= k._K(X, None)
        return other

    def _grads(self, X, slots, state=None):
        for c, local in self._runs(slots):
            other = self._others(X, c)
            for g in self.kernels[c]._grads(X, local):
                if other is not None:
                    g *= other
                yield g

    def _others_cross(self, X, Y, c):
        other = None
        for o, k in enumerate(self.kernels):
            if o != c:
                other = k._K(X, Y) if other is None else other * k._K(X, Y)
        return other

    def _cross_grads(self, X, Y, slots):
        for c, local in self._runs(slots):
            other = self._others_cross(X, Y, c)
            for g in self.kernels[c]._cross_grads(X, Y, local):
                if other is not None:
                    g *= other
                yield g

    def _diag_grads(self, X, slots):
        for c, local in self._runs(slots):
            other = None
            for o, k in enumerate(self.kernels):
                if o != c:
                    other = k._diag(X) if other is None else other * k._diag(X)
            for g in self.kernels[c]._diag_grads(X, local):
                yield g if other is None else g * other

    def _input_grad(self, X, Y, W):
        G = None
        for c, k in enumerate(self.kernels):
            other = self._others_cross(X, Y, c)
            Gc = k._input_grad(X, Y, W if other is None else W * other)
            G = Gc if G is None else G + Gc
        return G

    def _value_and_gradient(self, X, dK_out):
        ranges = list(self._child_ranges())
        Ks = [k._value_and_gradient(X, dK_out[:, :, rng]) for k, rng in ranges]
        for c, (_, rng) in enumerate(ranges):
            if rng.stop == rng.start:
                continue
            other = None
            for o, Ko in enumerate(Ks):
                if o != c:
                    other = Ko.copy() if other is None else other * Ko
            if other is not None:
                dK_out[:, :, rng] *= other[:, :, None]
        K = Ks[0]
        for Ko in Ks[1:]:
            K *= Ko
        return K
