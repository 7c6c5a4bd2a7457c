"""Kernel.columns: single columns of K(X, X) without forming it (used by the IVM)."""
import numpy as np
import pytest

from fastep.kernels import MLP, MLPARD, RBF, RBFARD, Bias, Kernel, Linear, LinearARD, White

KERNELS = [
    Linear(0.7), RBF(1.3, 0.4), MLP(1.2, 3.0, 2.0), White(0.3), Bias(0.2),
    LinearARD([0.3, 0.5, 0.9, 0.1]), RBFARD([0.3, 0.5], ard_groups=[0, 1, 1, 0], inverse_width=2.0),
    MLPARD([0.2, 0.6, 0.5, 0.9], 1.0, 5.0, 3.0),
    RBF() + Linear() + Bias(0.1) + White(0.1), RBF() * Linear() + White(0.2), (RBF() + White(0.1)) * Bias(2.0),
    MLP(1.0, 2.0, 1.0) + Linear(0.5) + RBF(0.7, 0.3) + RBFARD([0.5, 0.2, 0.9, 0.4]),
]


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: repr(k)[:40])
def test_columns_equal_the_kernel_matrix(kernel):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 4)) + 3.0          # off-centre data: the RBF path centres like K(X, X)
    X[7] = X[3]                                 # a duplicate row: White stays on the diagonal only
    K = kernel(X)
    cols = kernel.columns(X)
    assert cols.n == 50
    np.testing.assert_array_equal(cols.diag, kernel.diag(X))
    for j in range(50):
        c = cols(j)
        assert c.shape == (50,) and c.dtype == np.float64
        np.testing.assert_allclose(c, K[:, j], rtol=1e-12, atol=1e-12 * np.abs(K).max())
        assert c[j] == cols.diag[j]


def test_default_column_path_for_kernels_without_a_fast_path():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(30, 3))
    k = RBF(2.0, 0.5) + White(0.5)
    state = Kernel._column_state(k, X)
    K = k(X)
    for j in (0, 11, 29):
        c = Kernel._column(k, state, j)
        c[j] = k.diag(X)[j]
        np.testing.assert_allclose(c, K[:, j], rtol=1e-12, atol=1e-14)


def test_bad_indices_and_inputs():
    X = np.ones((5, 2))
    cols = RBF().columns(X)
    with pytest.raises(ValueError, match="j"):
        cols(5)
    with pytest.raises(TypeError, match="j"):
        cols(1.0)
    with pytest.raises(ValueError, match="X"):
        RBF().columns(np.full((3, 2), np.nan))
