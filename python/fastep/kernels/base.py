"""The kernel base class (the public API: evaluation, gradients, columns, parameters), the
leaf-kernel parameter framework with its transforms, ARD scales, and the composite base."""
from __future__ import annotations

import copy
import numbers
from typing import TYPE_CHECKING, overload

import numpy as np

from .._base import KERNEL_EXAMPLES_DOC, fill_doc
from .. import _validation as _v
from .columns import ColumnProductCache, KernelColumns, _CentredColumns
from .transforms import FIXED as _FIXED
from .transforms import TRANSFORMS

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import Any, Literal

    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

__all__ = ["Kernel"]


def _check_index(index, n_theta):
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, numbers.Integral):
        raise TypeError(f"index must be an integer, got {type(index).__name__}")
    index = int(index)
    if not 0 <= index < n_theta:
        raise ValueError(f"index must be in [0, {n_theta}) (the kernel has {n_theta} free parameters), got {index}")
    return index




class Kernel:
    __doc__ = fill_doc("""Base class of all kernels: the public API, shared by leaves and composites.

    Subclasses implement ``_K(X, Y)``, ``_diag(X)``, ``_grads(X, slots)`` (a
    generator of dK/dθ_s for the requested unconstrained indices, each a fresh
    array) and ``_value_and_gradient(X, dK_out)`` (K, with dK written into
    ``dK_out``, sharing intermediate results between the two); for sparse GPs also
    ``_cross_grads(X, Y, slots)``, ``_diag_grads(X, slots)``, ``_input_grad(X, Y, W)``
    and optionally ``_weighted_grads(X, Y, W)``. The public methods validate their
    inputs and call these; code that validated its inputs once already (the
    estimators, at every optimiser step) calls these implementation methods directly,
    on float64 2-D arrays with the kernel's number of columns.

    %EXAMPLES%
    >>> from fastep.kernels import RBF, Linear
    >>> kernel = RBF(variance=2.0, inverse_width=0.5) + Linear(variance=0.1)
    >>> kernel.hyperparameter_names
    ['k0__variance', 'k0__inverse_width', 'k1__variance']
    >>> kernel(X).shape, kernel.diag(X).shape
    ((3, 3), (3,))
    >>> K, dK = kernel(X, eval_gradient=True)
    >>> dK.shape
    (3, 3, 3)
    >>> bool(np.allclose(K, kernel(X)))
    True
    """, EXAMPLES=KERNEL_EXAMPLES_DOC)

    #: Whether ``_column_centred(shared, j, pc)`` builds this kernel's column of K(X, X) from the
    #: product ``pc = Xc x̃_j`` of the centred inputs, shared by the terms of a sum or product
    #: (:class:`~fastep.kernels.columns.KernelColumns` reads it). True for the non-ARD Linear,
    #: RBF and MLP kernels.
    _centred_columns = False

    if TYPE_CHECKING:
        # What every kernel class defines: the leaves in ``_Leaf``, sums and products in ``_Composite``.
        @property
        def hyperparameter_names(self) -> list[str]:
            """Names of the entries of ``theta``."""

        def get_params(self, deep: bool = True) -> dict[str, Any]:
            """The constructor's parameters (scikit-learn's parameter protocol)."""

        def set_params(self, **params: Any) -> Self:
            """Set constructor parameters; returns ``self``."""

        def _get_theta(self) -> NDArray[np.float64]: ...

        def _set_theta(self, theta: NDArray[np.float64], offset: int) -> int: ...

        def _bounds(self) -> list[tuple[float, float]]: ...

        def _K(self, X: NDArray[np.float64], Y: NDArray[np.float64] | None) -> NDArray[np.float64]: ...

        def _diag(self, X: NDArray[np.float64]) -> NDArray[np.float64]: ...

        def _grads(self, X: NDArray[np.float64], slots: list[int], state: Any = None
                   ) -> Iterator[NDArray[np.float64]]: ...

        def _value_and_gradient(self, X: NDArray[np.float64], dK_out: NDArray[np.float64]
                                ) -> NDArray[np.float64]: ...

    # ---- public parameter API -------------------------------------------------------------
    @property
    def theta(self) -> NDArray[np.float64]:
        """Unconstrained free hyperparameters as a 1-D float64 array (a copy)."""
        return self._get_theta()

    @theta.setter
    def theta(self, value: ArrayLike) -> None:
        value = _v.as_float_vector(value, "theta", length=self.n_theta)
        self._set_theta(value, 0)

    @property
    def n_theta(self) -> int:
        """Number of free (unconstrained) hyperparameters."""
        return len(self.hyperparameter_names)

    @property
    def bounds(self) -> NDArray[np.float64]:
        """(n_theta, 2) array of lower/upper limits for ``theta`` (see ``Transform.bounds``)."""
        return np.array(self._bounds(), dtype=float).reshape(-1, 2)

    @property
    def theta_transforms(self) -> list[str]:
        """The transform of each entry of ``theta``, by name (``'softplus'``, ``'log'`` or ``'sigmoid'``;
        ``'unknown'`` for a kernel class that does not say)."""
        return list(self._theta_transforms())

    def _theta_transforms(self):
        return ["unknown"] * self.n_theta

    def __sklearn_clone__(self) -> Self:
        """scikit-learn's ``clone``: an independent deep copy (parameters and transforms)."""
        return copy.deepcopy(self)

    def clone_with_theta(self, theta: ArrayLike) -> Self:
        """Return a deep copy with ``theta`` set."""
        new = copy.deepcopy(self)
        new.theta = theta
        return new

    # ---- evaluation --------------------------------------------------------------------------
    @overload
    def __call__(self, X: ArrayLike, Y: ArrayLike | None = None, eval_gradient: Literal[False] = False
                 ) -> NDArray[np.float64]: ...
    @overload
    def __call__(self, X: ArrayLike, Y: None = None, *, eval_gradient: Literal[True]
                 ) -> tuple[NDArray[np.float64], NDArray[np.float64]]: ...
    @overload
    def __call__(self, X: ArrayLike, Y: ArrayLike | None = None, eval_gradient: bool = False
                 ) -> NDArray[np.float64] | tuple[NDArray[np.float64], NDArray[np.float64]]: ...
    def __call__(self, X: ArrayLike, Y: ArrayLike | None = None, eval_gradient: bool = False
                 ) -> NDArray[np.float64] | tuple[NDArray[np.float64], NDArray[np.float64]]:
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
        n = X.shape[0]
        dK = np.empty((n, n, self.n_theta))
        K = self._value_and_gradient(X, dK)
        return K, dK

    def diag(self, X: ArrayLike) -> NDArray[np.float64]:
        """The diagonal of K(X, X) in O(n d) time and memory, without forming K."""
        X = self._validate_X(X, "X")
        return self._diag(X)

    def gradient(self, X: ArrayLike, index: int) -> NDArray[np.float64]:
        """∂K(X, X)/∂theta[index] as an (n, n) array (one parameter; O(n²) memory)."""
        X = self._validate_X(X, "X")
        index = _check_index(index, self.n_theta)
        return next(self._grads(X, [index]))

    def gradient_iter(self, X: ArrayLike) -> Iterator[NDArray[np.float64]]:
        """Iterator over ∂K(X, X)/∂theta[i], i = 0 .. n_theta-1, one fresh (n, n) array at a time.

        Intermediate quantities (distances, inner products) are computed once per
        leaf kernel; the caller may modify or discard each array.
        """
        X = self._validate_X(X, "X")
        return self._grads(X, list(range(self.n_theta)))

    def columns(self, X: ArrayLike, product_cache: ColumnProductCache | None = None) -> KernelColumns:
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
        return KernelColumns(self, X, None if product_cache is None else product_cache._for(X))

    def _column_state(self, X):
        """Per-X intermediates for ``_column`` (default: X itself)."""
        return X

    # ---- cross-covariance and input gradients (sparse GPs with inducing inputs) ---------------
    def cross_gradient_iter(self, X: ArrayLike, Y: ArrayLike) -> Iterator[NDArray[np.float64]]:
        """Iterator over ∂K(X, Y)/∂theta[i], i = 0 .. n_theta-1, one fresh (n_x, n_y) array at a time.

        For sparse GPs (K_mn = K(Z, X) with inducing inputs Z). ``White`` contributes zeros
        (its cross-covariance is 0 for any second argument).
        """
        X, Y = self._validate_pair(X, Y)
        return self._cross_grads(X, Y, list(range(self.n_theta)))

    def diag_gradient(self, X: ArrayLike) -> NDArray[np.float64]:
        """∂k(x_i, x_i)/∂theta[j] as an (n, n_theta) array, in O(n d) without forming K."""
        X = self._validate_X(X, "X")
        cols = list(self._diag_grads(X, list(range(self.n_theta))))
        if not cols:
            return np.zeros((X.shape[0], 0))
        return np.column_stack(cols)

    def input_gradient(self, X: ArrayLike, Y: ArrayLike, weights: ArrayLike) -> NDArray[np.float64]:
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

    # ---- implementation methods with a default ------------------------------------------------
    def _weighted_grads(self, X, Y, W):
        """``[Σ_ij W_ij ∂K(X, Y)_ij/∂θ_s for every entry s of theta]`` (``Y`` None: of K(X, X)):
        the contraction the evidence gradients take, without forming each ∂K when the kernel
        knows a shorter way (the RBF family); by default from the gradient matrices."""
        from .._linalg import inner
        slots = list(range(self.n_theta))
        grads = self._grads(X, slots) if Y is None else self._cross_grads(X, Y, slots)
        return np.array([inner(W, g) for g in grads], dtype=np.float64)

    def _validate_pair(self, X: ArrayLike, Y: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
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
    def n_features(self) -> int | None:
        """Number of input columns this kernel requires (None: any)."""
        return None

    def _validate_X(self, X: ArrayLike, name: str) -> NDArray[np.float64]:
        X = _v.as_float_matrix(X, name)
        need = self.n_features
        if need is not None and X.shape[1] != need:
            raise ValueError(
                f"{name} has {X.shape[1]} columns, but the kernel {self!r} expects {need} "
                f"(one per entry of ard_groups, or one per ARD scale)")
        return X

    # ---- algebra -----------------------------------------------------------------------------
    def __add__(self, other: Kernel) -> Kernel:
        if not isinstance(other, Kernel):
            return NotImplemented
        return _combine("+", [self, other])

    def __mul__(self, other: Kernel) -> Kernel:
        if not isinstance(other, Kernel):
            return NotImplemented
        return _combine("*", [self, other])




#: ``{'+': Sum, '*': Product}``: each subclass of ``_Composite`` that declares its ``_symbol``
#: registers itself here when it is defined (in ``combinators``, which imports this module).
_COMPOSITES: dict[str, type[_Composite]] = {}


def _combine(symbol, kernels):
    """``k1 + k2`` / ``k1 * k2``: one Sum or Product, with the terms of operands of that type inlined."""
    cls = _COMPOSITES[symbol]
    out = []
    for k in kernels:
        out.extend(k.kernels if type(k) is cls else [k])
    return cls(out)




class _Leaf(Kernel):
    """A kernel with its own hyperparameters (stored constrained and unconstrained)."""

    _scalar_params: tuple[str, ...] = ()          # names of scalar hyperparameters, in theta order
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
    def hyperparameter_names(self) -> list[str]:
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

    def _theta_transforms(self):
        return [self._transforms[name] for name, _ in self._slots()]

    def _dxdt(self, name, j):
        t = self._t[name] if j is None else self._t[name][j]
        return float(TRANSFORMS[self._transforms[name]].derivative(t))

    def _value(self, name):
        return float(self._x[name])

    # ---- get/set params ----------------------------------------------------------------------
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Constructor arguments with the current *constrained* values (and full ``transforms``)."""
        out: dict[str, Any] = {name: float(self._x[name]) for name in self._scalar_params}
        if self._has_scales:
            out["scales"] = self._x["scales"].copy()
            out["ard_groups"] = None if self._groups is None else self._groups.copy()
        out["transforms"] = dict(self._transforms)
        return out

    def set_params(self, **params: Any) -> Self:
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

    def __repr__(self) -> str:
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
    def _chain_rule(self, slots, constrained_grads):
        """∂/∂θ_s for the requested entries ``slots`` of theta: each ∂/∂x that
        ``constrained_grads(pairs)`` yields for the (name, element) pairs, scaled in place by dx/dθ."""
        all_slots = self._slots()
        pairs = [all_slots[s] for s in slots]
        for (name, j), g in zip(pairs, constrained_grads(pairs)):
            g *= self._dxdt(name, j)
            yield g

    def _grads(self, X, slots, state=None):
        return self._chain_rule(slots, lambda pairs: self._grads_constrained(X, pairs, state))

    def _weighted_grads(self, X, Y, W):
        contract = getattr(self, "_weighted_grads_constrained", None)
        if contract is None:
            return super()._weighted_grads(X, Y, W)
        pairs = self._slots()
        values = contract(X, Y, W, pairs)
        return np.array([value * self._dxdt(name, j) for (name, j), value in zip(pairs, values)], dtype=np.float64)

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
        return self._chain_rule(slots, lambda pairs: self._cross_grads_constrained(X, Y, pairs))

    def _diag_grads(self, X, slots):
        return self._chain_rule(slots, lambda pairs: self._diag_grads_constrained(X, pairs))

    def _cross_grads_constrained(self, X, Y, pairs):
        """Yield ∂K(X, Y)/∂x for each (name, element) pair (fresh arrays)."""
        raise NotImplementedError(f"{type(self).__name__} does not provide cross-covariance gradients")

    def _diag_grads_constrained(self, X, pairs):
        """Yield ∂diag K(X, X)/∂x for each (name, element) pair (fresh arrays)."""
        raise NotImplementedError(f"{type(self).__name__} does not provide gradients of its diagonal")




class _ARDMixin:
    """Per-column scales α_col = scales[ard_groups[col]] and the column sets of each scale."""

    _has_scales = True
    _centred_columns = False     # the shared product is of unscaled inputs
    _x: dict[str, NDArray[np.float64]]
    _groups: NDArray[np.intp] | None

    @property
    def n_features(self) -> int:
        return self._x["scales"].shape[0] if self._groups is None else self._groups.shape[0]

    @property
    def ard_groups(self) -> NDArray[np.intp] | None:
        """Scale index of each input column (None: one scale per column)."""
        return None if self._groups is None else self._groups.copy()

    def _column_scales(self):
        s = self._x["scales"]
        return s if self._groups is None else s[self._groups]

    def _columns_of(self, j):
        if self._groups is None:
            return np.array([j])
        return np.flatnonzero(self._groups == j)




class _Composite(Kernel):
    """Shared machinery of Sum and Product: children are deep copies, theta is their concatenation.

    Hyperparameter names are ``'k{i}__{name}'``; ``get_params``/``set_params``
    use the same ``k{i}__`` prefixes (and ``kernels`` for the list itself).
    """

    _symbol: str | None = None
    _ufunc: Any = None               # np.add (Sum) or np.multiply (Product): how the terms' values combine

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_symbol" in vars(cls):
            _COMPOSITES.setdefault(cls._symbol, cls)

    def __init__(self, kernels: Sequence[Kernel]) -> None:
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
    def n_features(self) -> int | None:
        need = {k.n_features for k in self.kernels} - {None}
        return need.pop() if need else None

    @property
    def hyperparameter_names(self) -> list[str]:
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

    def _theta_transforms(self):
        return [name for k in self.kernels for name in k._theta_transforms()]

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

    def _K(self, X, Y):
        K = self.kernels[0]._K(X, Y)
        for k in self.kernels[1:]:
            self._ufunc(K, k._K(X, Y), out=K)
        return K

    def _diag(self, X):
        out = self.kernels[0]._diag(X)
        for k in self.kernels[1:]:
            out = self._ufunc(out, k._diag(X))
        return out

    def _column_state(self, X):
        return self._shared_column_state(X)

    def _column(self, states, j):
        cols = self._child_columns(states, j)
        col = next(cols)
        for c in cols:
            self._ufunc(col, c, out=col)
        return col

    def _shared_column_state(self, X, shared=None):
        """Child column states; leaves that can share one centred product (``_CentredColumns``) get None.

        ``shared``: a caching ``_CentredColumns`` of X (from a ColumnProductCache) to use
        even for a single sharing leaf, and in nested sums and products.
        """
        sharing = [k._centred_columns for k in self.kernels]
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

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"kernels": list(self.kernels)}
        if deep:
            for i, k in enumerate(self.kernels):
                for name, value in k.get_params(deep=True).items():
                    out[f"k{i}__{name}"] = value
        return out

    def set_params(self, **params: Any) -> Self:
        """Set ``kernels`` (copied) or child parameters ``k{i}__name``; returns ``self``."""
        if "kernels" in params:
            type(self).__init__(self, params.pop("kernels"))
        by_child: dict[int, dict[str, Any]] = {}
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

    def __repr__(self) -> str:
        inner = f" {self._symbol} ".join(
            f"({k!r})" if isinstance(k, _Composite) else repr(k) for k in self.kernels)
        return inner if len(self.kernels) > 1 else f"{type(self).__name__}([{inner}])"


def check_kernel(kernel):
    """An estimator's ``kernel`` parameter: None (the estimator's data-aware start) or a
    :class:`Kernel`.

    Raises
    ------
    TypeError
        Naming ``kernel`` and the type given.
    """
    if kernel is not None and not isinstance(kernel, Kernel):
        raise TypeError(f"kernel must be a fastep.kernels.Kernel or None, got {type(kernel).__name__}")
    return kernel
