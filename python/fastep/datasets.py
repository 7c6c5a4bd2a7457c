"""Built-in toy problems (no download), seeded and reproducible."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from ._special import ndtr

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["make_ivm_toy_classification"]


def make_ivm_toy_classification(n_samples: int = 500, *, variance: float = 100.0, inverse_width: float = 10.0,
                                jitter: float = 1e-8, random_state: int | np.random.Generator | None = 0,
                                ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """The IVM paper's classification toy problem (Lawrence, Seeger & Herbrich, §4.1.2).

    ``n_samples`` points uniform on the unit square; a latent function is drawn
    from a GP prior with the RBF kernel ``variance * exp(-inverse_width / 2 *
    |x - x'|^2)`` (the paper uses variance 100 and inverse width 10), squashed
    through the standard normal CDF Φ, and each label is +1 with that
    probability, -1 otherwise.

    Parameters
    ----------
    n_samples : int
        Number of points (the paper uses 500).
    variance, inverse_width : float
        RBF kernel parameters of the generating GP.
    jitter : float
        Added to the kernel diagonal, relative to ``variance``, for the Cholesky factorisation.
    random_state : int or numpy.random.Generator
        Seed.

    Returns
    -------
    X : ndarray of shape (n_samples, 2)
    y : ndarray of shape (n_samples,) with values in {-1, +1}
    f : ndarray of shape (n_samples,)
        The latent GP sample (for diagnostics).
    """
    rng = np.random.default_rng(random_state)
    X = rng.uniform(0.0, 1.0, size=(n_samples, 2))
    sq = np.sum(X**2, axis=1)
    dist2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * X @ X.T, 0.0)
    K = variance * np.exp(-0.5 * inverse_width * dist2)
    K[np.diag_indices_from(K)] += jitter * variance
    f = np.linalg.cholesky(K) @ rng.standard_normal(n_samples)
    y = np.where(rng.uniform(size=n_samples) < ndtr(f), 1.0, -1.0)
    return X, y, f
