"""The synthetic 10-class problem of the multiclass benchmarks: 10 inputs, 4 of them relevant.

``x ~ N(0, I_10)``; the class scores are ``F(x) = (sin(x_{1:4}) + x_{1:4} / 2) W`` with a fixed
4 x 10 matrix W (seed 123, entries N(0, 3²)), and ``y ~ softmax(F(x))`` (drawn as the argmax of F
plus Gumbel noise). The Bayes rule predicts ``argmax F``, with error ``1 - E[max softmax F]`` and
log loss ``E[entropy of softmax F]``, both computed on the test set from F itself.

    import synthetic_multiclass as sm
    X, y = sm.make(10**6)          # training rows (seed 0)
    Xt, yt = sm.test_set()         # 20 000 test rows (seed 1)
    error, log_loss = sm.bayes(Xt)
"""
import numpy as np

N_FEATURES = 10
N_RELEVANT = 4
N_CLASSES = 10
TEST_ROWS = 20_000


def _weights():
    return 3.0 * np.random.default_rng(123).normal(size=(N_RELEVANT, N_CLASSES))


def scores(X):
    """The class scores F(x) (n, 10)."""
    Xr = X[:, :N_RELEVANT]
    return (np.sin(Xr) + 0.5 * Xr) @ _weights()


def make(n, seed=0):
    """``(X, y)``: n rows (float64, int labels 0..9)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(int(n), N_FEATURES))
    y = np.argmax(scores(X) + rng.gumbel(size=(int(n), N_CLASSES)), axis=1)
    return X, y


def test_set():
    return make(TEST_ROWS, seed=1)


def bayes(X):
    """``(error, log loss)`` of the Bayes rule on the rows X (expected over y | x)."""
    F = scores(X)
    F = F - F.max(axis=1, keepdims=True)
    p = np.exp(F)
    p /= p.sum(axis=1, keepdims=True)
    return float(np.mean(1.0 - p.max(axis=1))), float(np.mean(-np.sum(p * np.log(p), axis=1)))


def log_loss(proba, y):
    return float(-np.mean(np.log(np.clip(proba[np.arange(y.size), y], 1e-300, None))))
