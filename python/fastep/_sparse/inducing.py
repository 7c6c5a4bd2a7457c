"""Inducing inputs chosen for the data: k-means++ centres and the growth of the inducing set
(``n_inducing='auto'``) while the EP evidence per training point still gains."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._linalg import matmul

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["kmeans_plus_plus", "auto_sizes", "grow_inducing", "GROWTH_TOL"]

def kmeans_plus_plus(X: NDArray[np.float64], n_clusters: int, rng: np.random.Generator, n_iter: int = 10
                     ) -> NDArray[np.float64]:
    """Seeded k-means++ centres (Arthur & Vassilvitskii seeding, then ``n_iter`` Lloyd steps).

    The seeding picks data points with probability proportional to the squared distance to
    the nearest centre chosen so far (uniformly among the remaining points when every
    distance is 0, i.e. duplicated data); Lloyd steps move each centre to the mean of its
    points (empty clusters keep their centre).  O(n m d) per step.
    """
    n = X.shape[0]
    centres = np.empty((n_clusters, X.shape[1]))
    first = int(rng.integers(n))
    centres[0] = X[first]
    d2 = np.sum((X - centres[0]) ** 2, axis=1)
    chosen = np.zeros(n, dtype=bool)
    chosen[first] = True
    for k in range(1, n_clusters):
        total = d2.sum()
        if total > 0:
            idx = int(rng.choice(n, p=d2 / total))
        else:
            idx = int(rng.choice(np.flatnonzero(~chosen)))
        chosen[idx] = True
        centres[k] = X[idx]
        np.minimum(d2, np.sum((X - centres[k]) ** 2, axis=1), out=d2)
    x2 = np.einsum("ij,ij->i", X, X)
    for _ in range(n_iter):
        dist = x2[:, None] - 2.0 * matmul(X, centres.T) + np.einsum("ij,ij->i", centres, centres)[None, :]
        label = np.argmin(dist, axis=1)
        counts = np.bincount(label, minlength=n_clusters)
        sums = np.zeros_like(centres)
        np.add.at(sums, label, X)
        nonempty = counts > 0
        new = centres.copy()
        new[nonempty] = sums[nonempty] / counts[nonempty, None]
        if np.array_equal(new, centres):
            break
        centres = new
    return centres


#: ``n_inducing='auto'``: the first m, the largest m, and the bytes the n x m projection may take.
AUTO_FIRST = 64
AUTO_MAX = 1024
AUTO_MEMORY = 2 ** 30
#: ``n_inducing='auto'`` stops growing once doubling m raised the evidence by less than this per point.
GROWTH_TOL = 1e-2


def auto_sizes(n: int) -> list[int]:
    """The inducing-set sizes ``n_inducing='auto'`` tries on n training points: 64, 128, ...,
    doubling up to the smallest of n, 1024 and the m whose n x m projection fits in 1 GiB."""
    cap = max(1, min(n, AUTO_MAX, max(AUTO_FIRST, AUTO_MEMORY // (8 * n))))
    sizes = [min(AUTO_FIRST, cap)]
    while sizes[-1] < cap:
        sizes.append(min(2 * sizes[-1], cap))
    return sizes


def grow_inducing(fitted, fit_at, progress=None, fits=None, sizes=None):
    """Double the inducing set while the evidence per training point still gains.

    ``fitted``: a problem fitted at the first size of :func:`auto_sizes`; ``fit_at(m, best)`` fits
    the problem at m inducing inputs, starting from the best fitted problem so far. Growth stops
    when a doubling raised the EP log marginal likelihood by less than ``GROWTH_TOL`` nats per
    training point (the larger model is kept if its evidence is the higher), or at the largest
    size. Sets ``growth`` on the returned problem: one record per size tried. ``sizes``: the sizes
    to try (default :func:`auto_sizes` of n).

    ``fits(m)``, when given, says whether a fit at m inducing inputs fits in memory; growth stops
    (with a warning naming the size) before the first size that does not.
    """
    n = fitted.n_points
    history = [{"n_inducing": int(fitted.Z.shape[0]), "log_marginal_likelihood": float(fitted.log_ml),
                "n_evaluations": int(getattr(fitted, "n_evaluations", 0))}]
    best = fitted
    for m in (auto_sizes(n) if sizes is None else sizes)[1:]:
        if m <= best.Z.shape[0] or (progress is not None and progress.stopped):
            break
        if fits is not None and not fits(m):
            import warnings
            warnings.warn(f"n_inducing='auto' stopped growing at m = {best.Z.shape[0]} inducing inputs: "
                          f"m = {m} would not fit in the memory available (see fastep.MemoryLimitError; "
                          "set FASTEP_MAX_MEMORY to change the limit fastep plans with)",
                          UserWarning, stacklevel=2)
            break
        candidate = fit_at(m, best)
        history.append({"n_inducing": int(m), "log_marginal_likelihood": float(candidate.log_ml),
                        "n_evaluations": int(getattr(candidate, "n_evaluations", 0))})
        gain = (candidate.log_ml - best.log_ml) / n
        if candidate.log_ml > best.log_ml:
            best = candidate
        if gain < GROWTH_TOL:
            break
    best.growth = history
    return best
