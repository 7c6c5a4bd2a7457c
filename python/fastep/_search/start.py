"""Data-aware starting values for the estimators' default kernel and noise variance.

A GP estimator left at ``kernel=None`` starts from a kernel whose width and scale come from
the data, so that type-II ML starts where the evidence has a usable gradient (with 256
inputs in [0, 255], ``RBF(1, 1)`` makes every off-diagonal kernel value ~0 and the
evidence flat in the width). The rules, written once for every estimator:

* RBF inverse width γ = 1 / median of the squared distances |x_i - x_j|² over the pairs
  of a seeded random subsample of at most 1000 rows (the median heuristic), so that a
  typical pair has k(x_i, x_j) = v e^(-1/2);
* classification (and ordinal regression): ``RBF(1, γ)``, a unit latent scale for the
  probit / logistic links;
* regression (targets y): ``RBF(var(y), γ) + Bias(mean(y)²)`` for the zero-mean GP
  regressors (the bias term carries the targets' offset), ``RBF(var(y), γ)`` where the
  estimator subtracts the offset itself (the IVM regressor); noise variance
  ``var(y) / 10`` when ``noise_variance=None``.

* inputs of mixed units: when the ranges (max - min) of the input columns differ by more
  than a factor of 100, the kernel measures each column in units of its range: the RBF
  becomes ``RBFARD`` with fixed scales α_c = 1/range_c² (columns constant on the training
  rows take the largest range), γ the median heuristic on the range-scaled inputs. Such
  a start, and the kernel learnt from it, are the same for any per-column rescaling of the
  inputs (raw or standardised columns give one model); columns whose ranges agree within
  that factor (pixels, z-scores) keep the isotropic RBF on the inputs as they are, where
  range scaling would magnify rarely-varying columns.

Degenerate data keep finite, positive values: all pairs at distance 0 give γ = 1, constant
targets give unit variances.
"""
import numpy as np

from ..kernels import RBF, RBFARD, Bias
from ..kernels._distances import _centre, _sqdist_centred

__all__ = ["median_inverse_width", "default_kernel", "input_scales", "COMMENSURATE_RATIO", "default_noise_variance", "target_scale", "sample_rows",
           "SAMPLE_ROWS"]

SAMPLE_ROWS = 1000
#: Input columns whose ranges differ by more than this factor are measured in units of their range.
COMMENSURATE_RATIO = 100.0
_SEED = 0


def sample_rows(n, max_rows=SAMPLE_ROWS, seed=_SEED):
    """Sorted indices of a seeded random subsample of ``min(n, max_rows)`` of ``n`` rows."""
    if n <= max_rows:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=max_rows, replace=False))


def median_inverse_width(X, *, ard=False, max_rows=SAMPLE_ROWS, seed=_SEED):
    """The median heuristic for an RBF inverse width: γ = 1 / median |x_i - x_j|².

    Parameters
    ----------
    X : ndarray (n, p)
        Finite inputs.
    ard : bool, default False
        One γ_d per input dimension, 1 / median (x_id - x_jd)² (for ``RBFARD``).
    max_rows : int, default 1000
        The median is taken over the pairs of a seeded random subsample of this many rows.
    seed : int, default 0

    Returns
    -------
    float, or ndarray (p,) with ``ard``
        Zero medians (duplicated rows, constant columns) fall back to the median of the
        positive squared distances, and to 1 when there are none.
    """
    X = np.asarray(X, dtype=np.float64)
    S = X[sample_rows(X.shape[0], max_rows, seed)]
    upper = np.triu_indices(S.shape[0], k=1)
    if ard:
        return np.array([_inverse_median((S[:, j][:, None] - S[:, j][None, :])[upper] ** 2)
                         for j in range(S.shape[1])])
    Sc, _ = _centre(S)
    return _inverse_median(_sqdist_centred(Sc)[upper])


def _inverse_median(squared):
    squared = squared[np.isfinite(squared)]
    if squared.size == 0:
        return 1.0
    median = float(np.median(squared))
    if not median > 0.0:
        positive = squared[squared > 0.0]
        if positive.size == 0:
            return 1.0
        median = float(np.median(positive))
    return 1.0 / median


def input_scales(X, max_ratio=COMMENSURATE_RATIO):
    """Per-column ARD scales α_c = 1/range_c² for inputs of mixed units, or None.

    Parameters
    ----------
    X : ndarray (n, p)
        Finite inputs.
    max_ratio : float, default 100
        Columns whose ranges (max - min) all agree within this factor are commensurate: None.

    Returns
    -------
    ndarray (p,) or None
        Constant columns take the largest range of the others.
    """
    X = np.asarray(X, dtype=np.float64)
    ranges = np.ptp(X, axis=0) if X.shape[0] else np.zeros(X.shape[1])
    positive = ranges[ranges > 0.0]
    if positive.size < 2 or positive.max() <= max_ratio * positive.min():
        return None
    ranges = np.where(ranges > 0.0, ranges, positive.max())
    return 1.0 / ranges ** 2


def target_scale(y):
    """(variance, mean²) of the targets y, each replaced by 1 when not positive and finite.

    ``y`` may also be the triple ``(n, Σ y_i, Σ y_i²)`` (targets summed where they live)."""
    if isinstance(y, tuple):
        n, total, total_sq = (float(t) for t in y)
        mean = total / n if n > 0 else 0.0
        variance = max(total_sq / n - mean * mean, 0.0) if n > 1 else 0.0
    else:
        y = np.asarray(y, dtype=np.float64)
        mean = float(np.mean(y)) if y.size else 0.0
        variance = float(np.var(y)) if y.size > 1 else 0.0
    offset = mean * mean
    variance = variance if np.isfinite(variance) and variance > 0.0 else 1.0
    offset = offset if np.isfinite(offset) and offset > 0.0 else 1.0
    return variance, offset


def default_kernel(X, y=None, *, regression=False, bias=True):
    """The starting kernel of an estimator left at ``kernel=None`` (rules in the module docstring).

    Parameters
    ----------
    X : ndarray (n, p)
        Training inputs (or a sample of their rows).
    y : ndarray (n,) or tuple, optional
        Real targets, or their moments (see :func:`target_scale`); regression only.
    regression : bool, default False
    bias : bool, default True
        Regression: add ``Bias(mean(y)²)`` for the targets' offset (False where the estimator
        subtracts it).
    """
    scales = input_scales(X)
    if scales is None:
        gamma = median_inverse_width(X)
        make = lambda variance: RBF(variance, gamma)  # noqa: E731
    else:
        gamma = median_inverse_width(np.asarray(X, dtype=np.float64) * np.sqrt(scales))
        make = lambda variance: RBFARD(scales, variance, gamma, transforms={"scales": "fixed"})  # noqa: E731
    if not regression:
        return make(1.0)
    variance, offset = target_scale(y)
    kernel = make(variance)
    return kernel + Bias(offset) if bias else kernel


def default_ard_kernel(X, y=None, *, regression=False, bias=True):
    """The starting kernel of minibatch learning at ``kernel=None``: an RBF with one learnt
    relevance per input (ARD), so that learning can set irrelevant inputs aside.

    ``RBFARD(α, v, γ)`` (``k = v exp(-γ/2 Σ_c α_c (x_c - x'_c)²)``) with every relevance
    ``α_c = ½ s_c / max(s)`` (``s``: the per-column scales of :func:`input_scales` for inputs
    of mixed units, else ones) and ``γ = 1 / median_c var(√α_c x_c)``: the length-scale
    ``(γ α_c)^(-1/2)`` of every input starts at the median input's standard deviation (in
    the units of ``input_scales`` for inputs of mixed units), as for one input alone, and not
    at the isotropic median heuristic over all inputs, whose length-scale grows with the
    number of inputs and starts every input far smoother than its own variation (learning
    then tends to set relevant inputs aside too). Each relevance can then grow or shrink.
    Variance and bias as :func:`default_kernel`.
    """
    X = np.asarray(X, dtype=np.float64)
    base = input_scales(X)
    base = np.ones(X.shape[1]) if base is None else base
    scales = 0.5 * base / np.max(base)
    spread = float(np.median(np.var(X * np.sqrt(scales), axis=0))) if X.shape[0] > 1 else 0.0
    gamma = 1.0 / spread if np.isfinite(spread) and spread > 0.0 else median_inverse_width(X * np.sqrt(scales))
    if not regression:
        return RBFARD(scales, 1.0, gamma)
    variance, offset = target_scale(y)
    kernel = RBFARD(scales, variance, gamma)
    return kernel + Bias(offset) if bias else kernel


def default_noise_variance(y):
    """Starting noise variance for ``noise_variance=None``: var(y) / 10 (1/10 if y is constant).

    ``y``: the targets or their moments (see :func:`target_scale`)."""
    return target_scale(y)[0] / 10.0
