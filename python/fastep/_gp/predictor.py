"""The latent predictive of a GP whose posterior is given by sites on a set of training
inputs (dense EP and the IVM)."""
from __future__ import annotations


import numpy as np
from scipy.linalg import solve_triangular

from .._prediction import BatchedPredictor
from .._linalg import matmul

__all__ = ["DensePredictor"]


class DensePredictor(BatchedPredictor):
    """Latent predictive of a GP posterior given by Gaussian sites on a set of inputs.

    With sites of precision ``B = diag(β)`` on the inputs ``X_basis``,
    ``A = I + B^½ K B^½ = L Lᵀ`` and weights ``w = (K + B⁻¹)⁻¹ B⁻¹ ν``, the latent
    predictive at ``x*`` is ``N(k*ᵀ w, k(x*, x*) - |L⁻¹ B^½ k*|²)`` (Rasmussen & Williams,
    *Gaussian Processes for Machine Learning*, Algorithm 3.6; the IVM's prediction,
    Seeger's notes §2.2, is the same formula on the active set).

    Parameters
    ----------
    kernel : Kernel
    X_basis : ndarray (n, n_features)
    weights : ndarray (n,)
    chol : ndarray (n, n)
        Lower Cholesky factor L of A.
    sqrt_precision : ndarray (n,)
        ``sqrt(β)``.
    """

    def __init__(self, kernel, X_basis, weights, chol, sqrt_precision):
        self.kernel, self.X_basis, self.weights = kernel, X_basis, weights
        self.chol, self.sqrt_precision = chol, sqrt_precision

    def _latent_batch(self, X):
        Ks = self.kernel._K(X, self.X_basis)                           # (batch, n)
        V = solve_triangular(self.chol, self.sqrt_precision[:, None] * Ks.T, lower=True)
        return matmul(Ks, self.weights), self.kernel._diag(X) - np.einsum("ij,ij->j", V, V)
