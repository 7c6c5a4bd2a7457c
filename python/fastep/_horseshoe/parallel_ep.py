"""One task of the horseshoe models as the estimators keep it, and its predictive variances.

Equation numbers refer to the supplement of Hernández-Lobato & Hernández-Lobato, *Learning
Feature Selection Dependencies in Multi-task Learning* (NIPS 2013). EP itself (eqs 2-50) is the
compiled engine :class:`fastep._epcore.horseshoe_ep.HorseshoeEP`; what it returns for
prediction (``HorseshoeResult.factors``) is read here.
"""
import numpy as np
import scipy.linalg as sla

from .._linalg import matmul

__all__ = ["Task", "predictive_variance"]


class Task:
    """One task's centred data (``X`` (n, d), ``y`` (n,)) and the column sums of squares ``col_sq``."""

    def __init__(self, X, y):
        self.X = np.ascontiguousarray(X, dtype=float)
        self.y = np.ascontiguousarray(y, dtype=float)
        self.n, self.d = self.X.shape
        self.col_sq = np.einsum("ij,ij->j", self.X, self.X)


def predictive_variance(task, factors, Xnew):
    """``x*ᵀ V_w x*`` for each row of ``Xnew`` from the prediction factors of an EP run
    (``HorseshoeResult.factors``: ``('dense', V_w)`` or ``('split', in_s, Π_B⁻¹, L, W_S, L_Q)``,
    the split Woodbury form of :mod:`fastep._epcore.horseshoe_marginals`)."""
    Xnew = np.asarray(Xnew, dtype=float)
    if factors[0] == "dense":
        V = factors[1]
        return np.einsum("ij,jk,ik->i", Xnew, V, Xnew)
    _, in_s, inv_pi_b, L, WS, LQ = factors
    U = Xnew * inv_pi_b                                                # x_B Π_B⁻¹ (0 on S)
    Y = sla.solve_triangular(L, matmul(task.X, U.T), lower=True, check_finite=False)   # L⁻¹X_BΠ_B⁻¹x_B
    var = np.einsum("ij,ij->i", Xnew, U) - np.einsum("ij,ij->j", Y, Y)
    if WS is not None:
        g = matmul(WS.T, Y) - Xnew[:, in_s].T                                 # Gᵀx_B - x_S
        T = sla.solve_triangular(LQ, g, lower=True, check_finite=False)
        var += np.einsum("ij,ij->j", T, T)
    return np.maximum(var, 0.0)
