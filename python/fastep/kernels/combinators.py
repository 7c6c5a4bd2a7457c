"""Sums and products of kernels (``k1 + k2``, ``k1 * k2``)."""
from __future__ import annotations

import numpy as np

from .._base import KERNEL_EXAMPLES_DOC, fill_doc
from .base import _Composite

__all__ = ["Sum", "Product"]


class Sum(_Composite):
    __doc__ = fill_doc("""Sum of kernels, K = Σ_c K_c (a valid covariance: sums of PSD matrices are PSD).

    ``Sum([k1, k2, ...])`` or ``k1 + k2``; the terms are deep-copied, so
    ``k + k`` has two independent sets of parameters. ∂K/∂θ of a term's
    parameter is that term's derivative.

    Parameters
    ----------
    kernels : sequence of Kernel
        The terms (at least one); each is deep-copied.

    %EXAMPLES%
    >>> from fastep.kernels import RBF, Sum, White
    >>> kernel = Sum([RBF(), White(0.01)])
    >>> bool(np.allclose(kernel(X), RBF()(X) + 0.01 * np.eye(3)))
    True
    >>> kernel.hyperparameter_names
    ['k0__variance', 'k0__inverse_width', 'k1__variance']
    """, EXAMPLES=KERNEL_EXAMPLES_DOC)

    _symbol = "+"
    _ufunc = np.add

    def _grads(self, X, slots, state=None):
        for c, local in self._runs(slots):
            yield from self.kernels[c]._grads(X, local)

    def _cross_grads(self, X, Y, slots):
        for c, local in self._runs(slots):
            yield from self.kernels[c]._cross_grads(X, Y, local)

    def _diag_grads(self, X, slots):
        for c, local in self._runs(slots):
            yield from self.kernels[c]._diag_grads(X, local)

    def _weighted_grads(self, X, Y, W):
        parts = [k._weighted_grads(X, Y, W) for k in self.kernels]
        return np.concatenate(parts) if parts else np.empty(0)

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
    __doc__ = fill_doc("""Elementwise (Schur) product of kernels, K = ∏_c K_c (PSD by the Schur product theorem).

    ``Product([k1, k2, ...])`` or ``k1 * k2``; terms are deep-copied.
    ∂K/∂θ of a parameter of term c is ∂K_c/∂θ ∘ ∏_{o≠c} K_o.

    Parameters
    ----------
    kernels : sequence of Kernel
        The factors (at least one); each is deep-copied.

    %EXAMPLES%
    >>> from fastep.kernels import RBF, Linear
    >>> kernel = RBF() * Linear()
    >>> bool(np.allclose(kernel(X), RBF()(X) * Linear()(X)))
    True
    """, EXAMPLES=KERNEL_EXAMPLES_DOC)

    _symbol = "*"
    _ufunc = np.multiply

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
