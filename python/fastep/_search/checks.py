"""Warnings for type-II ML that ends where learning did nothing.

A kernel whose values between distinct training inputs are all (nearly) equal — ≈ 0 (every
point its own island: an RBF width far below the distances) or ≈ the diagonal (an RBF
width far above them) — makes the evidence flat in the kernel's parameters: the gradient
is ~0 and the optimiser ends at its start with no complaint of its own.
:func:`warn_if_kernel_stuck` says so, and what to change.
"""
import warnings

import numpy as np

from .._search.start import median_inverse_width, sample_rows
from ..exceptions import ConvergenceWarning

__all__ = ["kernel_structure", "warn_if_kernel_stuck"]

#: Off-diagonal kernel values within this fraction of the mean prior variance of each other (all
#: but the top and bottom 10 %) count as equal: the kernel does not tell the training points apart.
DEGENERATE_SPREAD = 1e-6
#: A latent function whose prior variance of differences f(x) - f(x') is below this fraction of the
#: likelihood's scale for 90 % of the training pairs is ≈ constant where the likelihood reads it
#: (latent differences ~1e-2 move a probit probability by < 0.4 %).
VANISHING_SPREAD = 1e-4
_MAX_ROWS = 200


def kernel_structure(kernel, X, max_rows=_MAX_ROWS, latent_scale=None):
    """``'diagonal'``, ``'constant'`` or None: whether ``kernel`` on (a seeded sample of) X has
    its off-diagonal values equal (the 10 % and 90 % quantiles within ``DEGENERATE_SPREAD``
    times the mean prior variance), ≈ 0 (``'diagonal'``) or not (``'constant'``, possibly
    plus a diagonal). With ``latent_scale`` (the scale on which the likelihood reads the latent
    function: 1 for probit and logistic classification), a kernel under which the latent function
    barely varies on that scale is ``'vanishing'``: a mean prior variance below
    ``DEGENERATE_SPREAD · latent_scale``, or a prior variance of the differences
    ``f(x) - f(x')`` below ``VANISHING_SPREAD · latent_scale`` for 90 % of the pairs."""
    S = X[sample_rows(X.shape[0], max_rows)]
    if S.shape[0] < 2:
        return None
    K = kernel._K(S, None)          # S is validated training data
    scale = float(np.mean(np.diag(K)))
    if not (np.isfinite(scale) and scale > 0.0):
        return None
    if latent_scale is not None and scale <= DEGENERATE_SPREAD * latent_scale:
        return "vanishing"
    upper = np.triu_indices(S.shape[0], k=1)
    off = K[upper]
    if latent_scale is not None:
        diag = np.diag(K)
        difference_variance = diag[upper[0]] + diag[upper[1]] - 2.0 * off
        if np.quantile(difference_variance, 0.9) <= VANISHING_SPREAD * latent_scale:
            return "vanishing"
    low, high = np.quantile(off, [0.1, 0.9])       # a few near-duplicate rows do not count
    tol = DEGENERATE_SPREAD * scale
    if high - low > tol:
        return None
    return "diagonal" if max(abs(low), abs(high)) <= tol else "constant"


def warn_if_kernel_stuck(start, fitted, X, *, what, stacklevel=2, latent_scale=None):
    """Warn (``ConvergenceWarning``) if type-II ML ended with a kernel that does not tell the
    training inputs apart (:func:`kernel_structure`): either it started from one that does not
    either (a variance may have moved; the width, whose gradient is ~0, did not), or it moved
    there from a start that did (the evidence preferred a model whose
    predictions ignore the inputs).

    Parameters
    ----------
    start, fitted : Kernel
        The optimiser's starting kernel and the kernel it returned.
    X : ndarray (n, p) or None
        Training inputs (None: no check).
    what : str
        The estimator's name, for the message.
    latent_scale : float, optional
        Passed to :func:`kernel_structure` (1 for classifiers).
    """
    if X is None or not isinstance(X, np.ndarray) or X.ndim != 2:
        return
    kind = kernel_structure(fitted, X, latent_scale=latent_scale)
    if kind is None:
        return
    gamma = median_inverse_width(X)
    looks = {"diagonal": "≈ 0 between every pair of distinct training inputs (its length-scale is far shorter "
                         "than their distances)",
             "constant": "the same for every pair of distinct training inputs (its length-scale is far longer "
                         "than their distances)",
             "vanishing": "≈ constant across the inputs on the likelihood's scale (the prior latent function "
                          "varies far less than the likelihood's unit scale between inputs)"}[kind]
    if kernel_structure(start, X, latent_scale=latent_scale) is None:
        warnings.warn(
            f"{what}: type-II ML ended on a kernel that does not tell the training inputs apart: the fitted "
            f"{fitted!r} is {looks}, so the predictions ignore the inputs. The evidence preferred it to the start "
            f"{start!r}; if the inputs should matter, fix a kernel (optimizer=None; an RBF inverse width of "
            f"1 / median squared distance = {gamma:.3g} here), give the model more points (active_set_size, "
            "n_inducing) or use the dense GaussianProcessClassifier/Regressor.",
            ConvergenceWarning, stacklevel=stacklevel + 1)
        return
    warnings.warn(
        f"{what}: type-II ML did not move the kernel out of its degenerate start: the fitted {fitted!r} is "
        f"{looks}, so the evidence is flat in its width. Leave kernel=None for a start from the data (an RBF inverse "
        f"width of 1 / median squared distance = {gamma:.3g} here), rescale the inputs, or set the width "
        "near that value.", ConvergenceWarning, stacklevel=stacklevel + 1)
