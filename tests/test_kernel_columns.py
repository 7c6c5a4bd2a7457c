"""Kernel.columns: single columns of K(X, X) without forming it (used by the IVM)."""
import numpy as np
import pytest

from fastep.kernels import MLP, MLPARD, RBF, RBFARD, Bias, ColumnProductCache, Kernel, Linear, LinearARD, White

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


def test_the_kernels_that_share_the_centred_product():
    """The non-ARD Linear, RBF and MLP columns come from the shared product Xc x̃_j; the ARD
    variants (subclasses of RBF and MLP) scale their inputs and do not."""
    sharing = {type(k).__name__ for k in KERNELS if k._centred_columns}
    assert sharing == {"Linear", "RBF", "MLP"}


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


# ---- ColumnProductCache: parameter-free products kept between calls ---------------------------
SHARING = [RBF() + Linear() + Bias(0.1) + White(0.1), RBF() * Linear() + White(0.2),
           MLP(1.0, 2.0, 1.0) + Linear(0.5) + RBF(0.7, 0.3) + RBFARD([0.5, 0.2, 0.9, 0.4]), RBF(1.3, 0.4)]


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: repr(k)[:40])
def test_cached_columns_equal_the_kernel_matrix(kernel):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 4)) + 3.0
    cache = ColumnProductCache(X, max_columns=100)
    for scale in (0.0, 0.3):                    # the same cache under two parameter settings
        k = kernel.clone_with_theta(kernel.theta + scale)
        K = k(X)
        cols = k.columns(X, product_cache=cache)
        np.testing.assert_array_equal(cols.diag, k.diag(X))
        for j in (0, 5, 17, 39, 5):
            np.testing.assert_allclose(cols(j), K[:, j], rtol=1e-12, atol=1e-12 * np.abs(K).max())


@pytest.mark.parametrize("kernel", SHARING, ids=lambda k: repr(k)[:40])
def test_cached_columns_are_bitwise_the_uncached_ones(kernel):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(60, 4))
    cache = ColumnProductCache(X, max_columns=100)
    for scale in (0.0, -0.2, 0.5):
        k = kernel.clone_with_theta(kernel.theta + scale)
        plain, cached = k.columns(X), k.columns(X, product_cache=cache)
        for j in (3, 11, 3, 59):
            np.testing.assert_array_equal(cached(j), plain(j))
    assert cache.misses == 3 and cache.hits == 9 and cache.n_stored == 3
    assert cache.nbytes == 3 * 60 * 8


def test_cache_is_bounded_and_read_only():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(20, 3))
    k = RBF(1.0, 0.5) + Linear(0.3)
    cache = ColumnProductCache(X, max_columns=3)
    cols = k.columns(X, product_cache=cache)
    for j in (0, 1, 2, 0, 3):                   # 0 is used again before 3 arrives: 1 is dropped
        cols(j)
    assert cache.n_stored == 3 and cache.misses == 4 and cache.hits == 1
    cols(1)
    assert cache.misses == 5
    stored = cache._shared._stored
    assert all(not a.flags.writeable for a in stored.values())
    c = cols(2)
    c[:] = np.nan                               # the returned column is a fresh array
    np.testing.assert_allclose(cols(2), k(X)[:, 2], rtol=1e-12)
    cache.clear()
    assert cache.n_stored == 0


def test_cache_checks_its_inputs():
    X = np.random.default_rng(6).normal(size=(10, 2))
    cache = ColumnProductCache(X, max_columns=2)
    RBF().columns(X.copy(), product_cache=cache)          # equal values are accepted
    with pytest.raises(ValueError, match="different inputs"):
        RBF().columns(X + 1.0, product_cache=cache)
    with pytest.raises(TypeError, match="ColumnProductCache"):
        RBF().columns(X, product_cache={})
    with pytest.raises(ValueError, match="max_columns"):
        ColumnProductCache(X, max_columns=0)
