"""Weight-space EP with k-output factors (Minka, "EP: a quick reference", §3).

``LinearEPRankK`` fits the Gaussian approximation ``N(w; m, V)`` to

    p(w | Y) ∝ N(w; m0, V0) prod_i t_i(X_i^T w),

where each factor sees a k-dimensional projection ``z_i = X[i] @ w`` (``X`` of
shape (n, k, d)).  The work is done by the compiled engine
``fastep._epcore.rank_k_ep`` (its engine class ``RankKEP``).
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from ._base import BaseEstimator, fill_doc
from ._epcore import rank_k_ep as _rank_k
from ._epcore.rank_k_ep import RankKLikelihood
from ._epcore.sites import SiteSpec
from ._linalg import cholesky_lower
from .exceptions import ConvergenceWarning
from .likelihoods import Likelihood
from .likelihoods.checks import is_likelihood, rank_k_likelihood
from .linear import WeightSpacePosterior
from .progress import CALLBACK_DOC

if TYPE_CHECKING:
    from typing import Any

    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

    from ._typing import Callback

__all__ = ["LinearEPRankK", "ConvergenceWarning"]


def _as_float_array(value: Any, name: str, ndim: tuple[int, ...]) -> NDArray[np.float64]:
    try:
        arr = np.asarray(value)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise TypeError(f"{name} must be array-like of numbers") from exc
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if np.iscomplexobj(arr):
        raise TypeError(f"{name} must be real, got complex values")
    arr = np.array(arr, dtype=np.float64, order='C')   # a copy: never aliases user data
    if arr.ndim not in ndim:
        raise ValueError(f"{name} must have {' or '.join(map(str, ndim))} dimensions, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    return arr


def _check_spd(mat: NDArray[np.float64], name: str) -> NDArray[np.float64]:
    scale = max(float(np.max(np.abs(mat))), np.finfo(float).tiny)
    if np.max(np.abs(mat - mat.T)) > 1e-10 * scale:
        raise ValueError(f"{name} must be symmetric")
    mat = 0.5 * (mat + mat.T)
    try:
        cholesky_lower(mat)
    except np.linalg.LinAlgError:
        raise ValueError(f"{name} must be positive definite") from None
    return mat


class LinearEPRankK(WeightSpacePosterior, BaseEstimator):
    __doc__ = fill_doc("""Gaussian EP over weights with rank-k (k-output) likelihood factors.

    The rank-k member of the weight-space EP family (:class:`~fastep.LinearEPClassifier`,
    :class:`~fastep.LinearEPRegressor`).  ``RankKEP`` is its former name: it still imports,
    with a ``FutureWarning``, until the next release.

    Parameters
    ----------
    likelihood : {'gaussian'} or fastep.likelihoods.Likelihood or SiteSpec or RankKLikelihood
        ``'gaussian'``: ``t_i(z) = N(y_i | z, noise_cov)`` (exact, EP equals the
        conjugate posterior).  A 1-D ``Likelihood`` (e.g. ``Probit()``) or ``SiteSpec``:
        product of that likelihood over the k outputs (moments exact for diagonal
        cavities, else Gauss-Hermite with ``n_nodes`` per output; the quadrature
        supports probit, logistic and Gaussian).  A ready ``RankKLikelihood`` is used
        as is.
    noise_cov : array_like (k, k), optional
        Noise covariance for ``'gaussian'``; identity when omitted.
    n_nodes : int, default 20
        Gauss-Hermite nodes per output for a correlated product cavity.
    prior_mean : array_like (d,), optional
        Zero when omitted.
    prior_cov : float or array_like (d,) or (d, d), optional
        Scalar variance, diagonal, or full SPD matrix; identity when omitted.
    damping : float in (0, 1], default 1.0
    tol : float, default 1e-8
        Largest absolute change of a site natural parameter in a sweep.
    max_sweeps : int, default 200
    refresh_every : int, default 1
        Sweeps between rebuilds of V, m from the sites (0: never).
    %CALLBACK%

    Attributes
    ----------
    posterior_mean_ : ndarray (d,)
    posterior_cov_ : ndarray (d, d)
    site_precision_ : ndarray (n, k, k)
    site_natural_mean_ : ndarray (n, k)
    log_marginal_likelihood_value_ : float
        EP approximation of log p(Y) (Minka eqs 48-49, 109-110).
    n_sweeps_ : int
    converged_ : bool
    n_skipped_ : int
        Factor updates skipped because they would make a cavity or the posterior improper.

    References
    ----------
    Minka, T. P. *EP: a quick reference*, §1 (Gaussian EP over weights; site updates with
    rank-k factors, eqs 103-110).

    Examples
    --------
    Each sample has a (k, d) design: its k outputs are ``X_i w`` plus Gaussian noise.

    >>> import numpy as np
    >>> from fastep import LinearEPRankK
    >>> rng = np.random.default_rng(0)
    >>> w = np.array([1.0, -2.0, 0.5])
    >>> X = rng.normal(size=(200, 2, 3))
    >>> Y = X @ w + 0.1 * rng.normal(size=(200, 2))
    >>> model = LinearEPRankK(noise_cov=0.01 * np.eye(2)).fit(X, Y)
    >>> np.round(model.posterior_mean_, 1)
    array([ 1. , -2. ,  0.5])
    >>> model.converged_
    True
    """, CALLBACK=CALLBACK_DOC)

    likelihood: str | Likelihood | SiteSpec | RankKLikelihood
    noise_cov: ArrayLike | None
    n_nodes: int
    prior_mean: ArrayLike | None
    prior_cov: ArrayLike | None
    damping: float
    tol: float
    max_sweeps: int
    refresh_every: int
    n_skipped_: int

    def __init__(self, likelihood: str | Likelihood | SiteSpec | RankKLikelihood = 'gaussian', *,
                 noise_cov: ArrayLike | None = None, n_nodes: int = 20, prior_mean: ArrayLike | None = None,
                 prior_cov: ArrayLike | None = None, damping: float = 1.0, tol: float = 1e-8, max_sweeps: int = 200,
                 refresh_every: int = 1, verbose: int = 0, callback: Callback = None) -> None:
        self._set_init_params(locals())

    def _build_likelihood(self, k):
        def gaussian_noise_cov():
            if self.noise_cov is None:
                return np.eye(k)
            R = _as_float_array(self.noise_cov, "noise_cov", (2,))
            if R.shape != (k, k):
                raise ValueError(f"noise_cov must have shape ({k}, {k}), got {R.shape}")
            return _check_spd(R, "noise_cov")
        return rank_k_likelihood(self.likelihood, k, self.n_nodes, gaussian_noise_cov)

    def _check_options(self):
        damping, tol = self.damping, self.tol
        if not isinstance(damping, (int, float, np.floating)) or not (0.0 < damping <= 1.0):
            raise ValueError(f"damping must be in (0, 1], got {damping!r}")
        if not isinstance(tol, (int, float, np.floating)) or not (tol >= 0.0):
            raise ValueError(f"tol must be a number >= 0, got {tol!r}")
        for name in ('max_sweeps', 'refresh_every'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")

    def fit(self, X: ArrayLike, Y: ArrayLike) -> Self:
        """Run EP to convergence.

        Parameters
        ----------
        X : array_like, shape (n, k, d)
            ``X[i] = X_i^T``: factor i sees ``z_i = X[i] @ w``.
        Y : array_like, shape (n, k)
            Targets / labels (shape (n,) accepted when k = 1).

        Returns
        -------
        self
        """
        self._check_options()
        progress = self._new_progress()
        X = _as_float_array(X, "X", (3,))
        n, k, d = X.shape
        if n < 1 or k < 1 or d < 1:
            raise ValueError(f"X must have n, k, d >= 1, got shape {X.shape}")
        Y = _as_float_array(Y, "Y", (1, 2))
        if Y.ndim == 1 and k == 1:
            Y = Y.reshape(-1, 1)
        if Y.shape != (n, k):
            raise ValueError(f"Y must have shape ({n}, {k}) to match X, got {Y.shape}")
        if self.prior_mean is None:
            m0 = np.zeros(d)
        else:
            m0 = _as_float_array(self.prior_mean, "prior_mean", (1,))
            if m0.shape != (d,):
                raise ValueError(f"prior_mean must have shape ({d},), got {m0.shape}")
        V0: NDArray[np.float64]
        if self.prior_cov is None:
            V0 = np.eye(d)
        else:
            V0 = _as_float_array(self.prior_cov, "prior_cov", (0, 1, 2))
            if V0.ndim == 0:
                V0 = float(V0) * np.eye(d)
            elif V0.ndim == 1:
                if V0.shape != (d,):
                    raise ValueError(f"prior_cov given as a diagonal must have shape ({d},), got {V0.shape}")
                V0 = np.diag(V0)
            elif V0.shape != (d, d):
                raise ValueError(f"prior_cov must have shape ({d}, {d}), got {V0.shape}")
            V0 = _check_spd(V0, "prior_cov")
        likelihood = self._build_likelihood(k)
        if is_likelihood(self.likelihood):
            try:
                Y = np.ascontiguousarray(self.likelihood.encode_targets(Y.ravel()).reshape(n, k))
            except ValueError as exc:
                raise ValueError(f"Y (flattened row-major): {exc}") from None

        options = _rank_k.RankKEPOptions(damping=float(self.damping), tol=float(self.tol),
                                         max_sweeps=int(self.max_sweeps), refresh_every=int(self.refresh_every))
        state = _rank_k.RankKEP(X, Y, m0, V0, likelihood, options, validate=False)      # checked above
        info = state.run(sweep_callback=progress.sweep_callback())
        log_evidence = state.log_evidence()
        progress.report("done", info.n_sweeps, log_evidence, info.max_change)
        self._warn_if_stopped(progress)

        self.posterior_mean_ = state.post_mean
        self.posterior_cov_ = state.post_cov
        self.site_precision_ = state.site_precision
        self.site_natural_mean_ = state.site_natural_mean
        self.log_marginal_likelihood_value_ = log_evidence
        self.n_sweeps_ = info.n_sweeps
        self.converged_ = info.converged
        self.n_skipped_ = info.n_skipped
        if not self.converged_:
            if info.diagnostics['n_skipped_last_sweep'] > 0:
                reason = (f"{info.diagnostics['n_skipped_last_sweep']} factor update(s) skipped in the last sweep "
                          "because they would make a cavity or the posterior improper")
            else:
                reason = f"last max change {info.max_change:.3g} > tol={self.tol}"
            warnings.warn(f"EP did not converge in {self.n_sweeps_} sweeps ({reason})",
                          ConvergenceWarning, stacklevel=2)
        return self


#: Former names of this module's classes: ``{old name: new name}``.  An old name still imports,
#: with a ``FutureWarning``, and gives the class under its new name; model files and pickles that
#: name it load as the new class.
_RENAMED = {"RankKEP": "LinearEPRankK"}


def _renamed_class(name: str) -> type:
    """The class formerly called ``name``, with a ``FutureWarning`` for the caller's caller."""
    new = _RENAMED[name]
    warnings.warn(f"{name} is deprecated and will be removed in the next release; use {new}", FutureWarning,
                  stacklevel=3)
    return globals()[new]


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        return _renamed_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
