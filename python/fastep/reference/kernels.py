"""Reference (plain numpy/scipy) kernel values and parameter transforms.

Independent twins of :mod:`fastep.kernels` for the test suite: each kernel is
written straight from its defining formula (IVM §4) with explicit pairwise
differences (``scipy.spatial.distance.cdist``, which subtracts coordinates and
so has no |x|² + |y|² - 2xᵀy cancellation) and explicit inner products. They
are clear rather than fast or robust: the MLP kernel uses ``arcsin`` directly
(ill-conditioned when its argument is near ±1), the transforms use the naive
formulas (valid for moderate arguments, roughly |t| < 30). This module never
imports :mod:`fastep.kernels` nor the compiled core.

Every kernel takes ``(X, Y, ...)`` with ``Y=None`` meaning ``Y = X``, and ARD
scales as one value per input column (expand tied groups with
:func:`column_scales`).
"""
import numpy as np
from scipy.spatial.distance import cdist

__all__ = [
    "softplus", "softplus_derivative", "inverse_softplus",
    "log_transform", "log_transform_derivative", "inverse_log_transform",
    "sigmoid", "sigmoid_derivative", "logit",
    "column_scales", "linear", "rbf", "mlp", "white", "bias",
]


# ---- transforms x = g(t) (IVM §4) --------------------------------------------------------------
def softplus(t):
    """x = log(1 + e^t) (``log1p`` so that small e^t is not lost against 1)."""
    return np.log1p(np.exp(t))


def softplus_derivative(t):
    """dx/dt = e^t / (1 + e^t)."""
    return np.exp(t) / (1.0 + np.exp(t))


def inverse_softplus(x):
    """t = log(e^x - 1) (``expm1`` so that small x is not lost)."""
    return np.log(np.expm1(x))


def log_transform(t):
    """x = e^t."""
    return np.exp(t)


def log_transform_derivative(t):
    """dx/dt = e^t."""
    return np.exp(t)


def inverse_log_transform(x):
    """t = log x."""
    return np.log(x)


def sigmoid(t):
    """x = 1 / (1 + e^-t)."""
    return 1.0 / (1.0 + np.exp(-t))


def sigmoid_derivative(t):
    """dx/dt = e^-t / (1 + e^-t)²."""
    return np.exp(-t) / (1.0 + np.exp(-t)) ** 2


def logit(x):
    """t = log(x / (1 - x))."""
    return np.log(x / (1.0 - x))


# ---- kernels -----------------------------------------------------------------------------------
def column_scales(scales, ard_groups=None):
    """One scale per input column: ``scales[ard_groups]`` (or ``scales`` if no groups)."""
    scales = np.asarray(scales, dtype=float)
    return scales if ard_groups is None else scales[np.asarray(ard_groups)]


def _ones_like_columns(X):
    return np.ones(np.asarray(X).shape[1])


def _inner(X, Y, scales):
    """Matrix of Σ_c α_c x_c y_c."""
    return np.einsum("ic,jc,c->ij", X, Y, scales)


def linear(X, Y=None, variance=1.0, scales=None):
    """k(x, y) = v Σ_c α_c x_c y_c (α = 1 for the plain linear kernel)."""
    X = np.asarray(X, dtype=float)
    Y = X if Y is None else np.asarray(Y, dtype=float)
    scales = _ones_like_columns(X) if scales is None else np.asarray(scales, dtype=float)
    return variance * _inner(X, Y, scales)


def rbf(X, Y=None, variance=1.0, inverse_width=1.0, scales=None):
    """k(x, y) = v exp(-γ/2 Σ_c α_c (x_c - y_c)²)."""
    X = np.asarray(X, dtype=float)
    Y = X if Y is None else np.asarray(Y, dtype=float)
    scales = _ones_like_columns(X) if scales is None else np.asarray(scales, dtype=float)
    r2 = cdist(X, Y, metric="sqeuclidean", w=scales)
    return variance * np.exp(-0.5 * inverse_width * r2)


def mlp(X, Y=None, variance=1.0, weight_variance=1.0, bias_variance=1.0, scales=None):
    """k(x, y) = v (2/π) asin((w xᵀAy + b) / sqrt((w xᵀAx + b + 1)(w yᵀAy + b + 1)))."""
    X = np.asarray(X, dtype=float)
    Y = X if Y is None else np.asarray(Y, dtype=float)
    scales = _ones_like_columns(X) if scales is None else np.asarray(scales, dtype=float)
    w, b = weight_variance, bias_variance
    numerator = w * _inner(X, Y, scales) + b
    dx = w * np.einsum("ic,ic,c->i", X, X, scales) + b + 1.0
    dy = w * np.einsum("jc,jc,c->j", Y, Y, scales) + b + 1.0
    return variance * (2.0 / np.pi) * np.arcsin(numerator / np.sqrt(np.outer(dx, dy)))


def white(X, Y=None, variance=1.0):
    """v I for K(X, X); zeros for any cross-covariance K(X, Y)."""
    X = np.asarray(X, dtype=float)
    if Y is None:
        return variance * np.eye(X.shape[0])
    return np.zeros((X.shape[0], np.asarray(Y).shape[0]))


def bias(X, Y=None, variance=1.0):
    """k(x, y) = v."""
    X = np.asarray(X, dtype=float)
    m = X.shape[0] if Y is None else np.asarray(Y).shape[0]
    return variance * np.ones((X.shape[0], m))
