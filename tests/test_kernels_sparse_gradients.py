"""Kernel derivatives used by sparse GPs: ∂K(X, Y)/∂θ, ∂diag K/∂θ and ∂/∂X Σ W ∘ K(X, Y), by finite differences."""
import numpy as np
import pytest

from fastep.kernels import MLP, MLPARD, RBF, Bias, Kernel, Linear, LinearARD, RBFARD, White

KERNELS = {
    "rbf": lambda: RBF(variance=1.3, inverse_width=0.7),
    "rbf_log": lambda: RBF(variance=0.8, inverse_width=2.0, transforms={"variance": "log"}),
    "rbfard": lambda: RBFARD(scales=[0.3, 0.8, 0.5], variance=1.1, inverse_width=1.4),
    "rbfard_groups": lambda: RBFARD(scales=[0.3, 0.8], ard_groups=[0, 1, 0], variance=1.1, inverse_width=0.9),
    "linear": lambda: Linear(variance=0.6),
    "linearard": lambda: LinearARD(scales=[0.2, 0.7, 0.4], variance=1.5),
    "white": lambda: White(variance=0.3),
    "bias": lambda: Bias(variance=0.4),
    "sum": lambda: RBF(variance=1.2, inverse_width=0.5) + Linear(variance=0.3) + White(0.1),
    "product": lambda: RBFARD(scales=[0.3, 0.8, 0.5], inverse_width=1.1) * Linear(variance=0.5) + Bias(0.2),
    "mlp": lambda: MLP(variance=1.3, weight_variance=0.7, bias_variance=2.0),
    "mlp_log": lambda: MLP(variance=0.8, weight_variance=3.0, bias_variance=0.3, transforms={"bias_variance": "log"}),
    "mlpard": lambda: MLPARD(scales=[0.3, 0.8, 0.5], variance=1.1, weight_variance=2.0, bias_variance=0.6),
    "mlpard_groups": lambda: MLPARD(scales=[0.3, 0.8], ard_groups=[0, 1, 0], variance=0.9, weight_variance=5.0,
                                    bias_variance=1.5),
    "mlp_product": lambda: MLP(variance=1.2, weight_variance=0.5) * RBF(inverse_width=0.3) + MLPARD([0.4, 0.6, 0.9]),
}


def data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(7, 3)) + 5.0, rng.normal(size=(5, 3)) + 5.0, rng.normal(size=(7, 5))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_cross_gradient_matches_finite_differences(name):
    k = KERNELS[name]()
    X, Y, _ = data()
    theta = k.theta
    grads = list(k.cross_gradient_iter(X, Y))
    assert len(grads) == k.n_theta
    h = 1e-6
    for i, g in enumerate(grads):
        e = np.zeros_like(theta)
        e[i] = h
        fd = (k.clone_with_theta(theta + e)(X, Y) - k.clone_with_theta(theta - e)(X, Y)) / (2 * h)
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", sorted(set(KERNELS) - {"white", "sum"}))
def test_cross_gradient_with_y_equal_x_is_the_gradient_of_k(name):
    k = KERNELS[name]()
    X, _, _ = data(1)
    for g, g_sym in zip(k.cross_gradient_iter(X, X), k.gradient_iter(X)):
        np.testing.assert_allclose(g, g_sym, rtol=1e-12, atol=1e-12)


def test_white_cross_gradient_is_zero():
    # White is attached to the training sample: K(X, X) = v I, but K(X, Y) = 0 for any Y
    X, _, _ = data(1)
    (g,) = White(0.3).cross_gradient_iter(X, X)
    np.testing.assert_array_equal(g, 0.0)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_diag_gradient_matches_finite_differences(name):
    k = KERNELS[name]()
    X, _, _ = data(2)
    G = k.diag_gradient(X)
    assert G.shape == (X.shape[0], k.n_theta)
    theta = k.theta
    h = 1e-6
    for i in range(k.n_theta):
        e = np.zeros_like(theta)
        e[i] = h
        fd = (k.clone_with_theta(theta + e).diag(X) - k.clone_with_theta(theta - e).diag(X)) / (2 * h)
        np.testing.assert_allclose(G[:, i], fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_input_gradient_matches_finite_differences(name):
    k = KERNELS[name]()
    X, Y, W = data(3)
    G = k.input_gradient(X, Y, W)
    assert G.shape == X.shape
    h = 1e-6
    fd = np.empty_like(X)
    for i in range(X.shape[0]):
        for c in range(X.shape[1]):
            Xp, Xm = X.copy(), X.copy()
            Xp[i, c] += h
            Xm[i, c] -= h
            fd[i, c] = (np.sum(W * k(Xp, Y)) - np.sum(W * k(Xm, Y))) / (2 * h)
    np.testing.assert_allclose(G, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["rbf", "rbfard", "linearard", "product", "mlp", "mlpard_groups", "mlp_product"])
def test_input_gradient_of_a_symmetric_form_in_z(name):
    # d/dZ Σ_ij W_ij k(z_i, z_j) = input_gradient(Z, Z, W + Wᵀ) (both arguments move)
    k = KERNELS[name]()
    Z, _, _ = data(4)
    W = np.random.default_rng(5).normal(size=(7, 7))
    G = k.input_gradient(Z, Z, W + W.T)
    h = 1e-6
    fd = np.empty_like(Z)
    for i in range(Z.shape[0]):
        for c in range(Z.shape[1]):
            Zp, Zm = Z.copy(), Z.copy()
            Zp[i, c] += h
            Zm[i, c] -= h
            fd[i, c] = (np.sum(W * k(Zp, Zp)) - np.sum(W * k(Zm, Zm))) / (2 * h)
    np.testing.assert_allclose(G, fd, rtol=1e-6, atol=1e-7)


def test_bad_input_and_unsupported_kernels():
    X, Y, W = data()
    k = RBF()
    with pytest.raises(ValueError, match="weights must have shape"):
        k.input_gradient(X, Y, W[:, :2])
    with pytest.raises(ValueError, match="Y must have the same number of columns"):
        list(k.cross_gradient_iter(X, Y[:, :2]))
    with pytest.raises(ValueError, match="weights must be finite"):
        W2 = W.copy()
        W2[0, 0] = np.nan
        k.input_gradient(X, Y, W2)
    k = NoSparseGradients()
    with pytest.raises(NotImplementedError, match="NoSparseGradients"):
        list(k.cross_gradient_iter(X, Y))
    with pytest.raises(NotImplementedError, match="NoSparseGradients"):
        k.diag_gradient(X)
    with pytest.raises(NotImplementedError, match="NoSparseGradients"):
        k.input_gradient(X, Y, W)


class NoSparseGradients(Kernel):
    """A user-defined kernel with only K and its diagonal (k(x, y) = 1 + xᵀy)."""

    hyperparameter_names = []

    def _get_theta(self):
        return np.empty(0)

    def _K(self, X, Y):
        return 1.0 + X @ (X if Y is None else Y).T

    def _diag(self, X):
        return 1.0 + np.sum(X * X, axis=1)

