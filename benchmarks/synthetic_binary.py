"""The synthetic binary problem of the minibatch-learning benchmarks (10 inputs, 6 irrelevant).

``x ~ U[-3, 3]^10``, ``y = sign(f(x) + 0.3 ε)`` with ``f(x) = sin(1.5 x₁) + 0.5 x₂ + 0.5 cos(x₃ x₄)``
and ``ε ~ N(0, 1)``: inputs 5-10 are irrelevant. The Bayes classifier predicts ``sign f(x)``
with ``p(y = 1 | x) = Φ(f(x) / 0.3)``, so its error and log loss on any test set are known
exactly (:func:`bayes`).

Usage: ``python benchmarks/synthetic_binary.py [n]`` prints the Bayes error and log loss of a
test set of 10⁴ points (seed 1) and, for n, the size of a training set in memory.
"""
import sys

import numpy as np
from scipy.special import log_ndtr

NOISE_SD = 0.3
N_FEATURES = 10


def latent(X):
    return np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1] + 0.5 * np.cos(X[:, 2] * X[:, 3])


def make(n, seed=0, dtype=np.float64):
    """``(X, y)``: n points, labels in {0, 1}."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 3.0, size=(n, N_FEATURES)).astype(dtype, copy=False)
    y = (latent(X) + NOISE_SD * rng.standard_normal(n) > 0).astype(np.int8)
    return X, y


def make_memmap(path, n, seed=0, chunk=1 << 20):
    """Write n points to ``path`` (X, float64, C order) and ``path + '.y.npy'``, a chunk at a time,
    and return ``(numpy.memmap X, y)``. The rows differ from :func:`make`'s (one stream per chunk)."""
    X = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, N_FEATURES))
    y = np.empty(n, dtype=np.int8)
    for k, s in enumerate(range(0, n, chunk)):
        Xc, yc = make(min(chunk, n - s), seed=(seed, k))
        X[s:s + Xc.shape[0]] = Xc
        y[s:s + Xc.shape[0]] = yc
    X.flush()
    np.save(path + ".y.npy", y)
    return np.load(path, mmap_mode="r"), y


def bayes(X, y):
    """``(error, log loss)`` of the Bayes classifier on ``(X, y)``."""
    z = latent(X) / NOISE_SD
    error = float(np.mean((z > 0) != (y == 1)))
    log_loss = float(-np.mean(np.where(y == 1, log_ndtr(z), log_ndtr(-z))))
    return error, log_loss


def test_set(n=10_000):
    return make(n, seed=1)


if __name__ == "__main__":
    Xt, yt = test_set()
    err, ll = bayes(Xt, yt)
    print(f"Bayes error {100 * err:.2f} %, Bayes log loss {ll:.4f} on {len(yt)} test points")
    if len(sys.argv) > 1:
        n = int(float(sys.argv[1]))
        print(f"n = {n}: X takes {8 * n * N_FEATURES / 2**20:.0f} MiB")
