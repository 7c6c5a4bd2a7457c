"""Bayesian linear models fitted by weight-space Gaussian EP (Minka, "EP: a quick reference").

Rank-1 sites (§1): :class:`LinearEPClassifier` and :class:`LinearEPRegressor`, whose sweeps run
in the compiled engine :mod:`fastep._epcore.linear_ep`. Rank-k sites (§3):
:class:`LinearEPRankK`, each factor seeing a k-dimensional projection ``z_i = X[i] @ w`` (``X``
of shape (n, k, d)), run by :mod:`fastep._epcore.rank_k_ep`. This module validates input,
encodes labels, and exposes scikit-learn style estimators.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
from ._special import expit

from . import _validation as v
from ._base import (EXAMPLES_DOC, BaseEstimator, ClassifierMixin, RegressorMixin, check_is_fitted, deprecated_alias,
                    fill_doc, records_feature_names)
from ._epcore import linear_ep as _engine
from ._epcore import rank_k_ep as _rank_k
from ._epcore.rank_k_ep import RankKLikelihood
from ._epcore.sites import SiteSpec
from ._linalg import cholesky_lower, matmul
from .exceptions import ConvergenceWarning
from .likelihoods import Gaussian, Likelihood, Logistic, Probit, Step
from .likelihoods.checks import check_binary_likelihood, is_likelihood, rank_k_likelihood
from .progress import CALLBACK_DOC

if TYPE_CHECKING:
    from typing import Any, Literal

    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

    from ._typing import Callback, MeanStd

__all__ = ["LinearEPClassifier", "LinearEPRegressor", "LinearEPRankK"]

_UPDATE_FORMS = {"natural": _engine.UPDATE_NATURAL, "moment": _engine.UPDATE_MOMENT}
_NEGATIVE_POLICIES = {
    "clip": _engine.NEGATIVE_CLIP, "skip": _engine.NEGATIVE_SKIP, "allow": _engine.NEGATIVE_ALLOW,
}


class WeightSpacePosterior:
    """The fitted attributes every weight-space EP estimator has: the Gaussian posterior over
    the weights, the EP sites and the evidence (:class:`LinearEPClassifier`,
    :class:`LinearEPRegressor`, :class:`fastep.LinearEPRankK`)."""

    posterior_mean_: NDArray[np.float64]
    posterior_cov_: NDArray[np.float64]
    site_precision_: NDArray[np.float64]
    site_natural_mean_: NDArray[np.float64]
    log_marginal_likelihood_value_: float
    _renamed_attributes = {"log_evidence_": "log_marginal_likelihood_value_"}
    log_evidence_ = deprecated_alias("log_evidence_", "log_marginal_likelihood_value_")
    n_sweeps_: int
    converged_: bool


class _LinearEPBase(WeightSpacePosterior, BaseEstimator):
    """Shared fitting machinery: prior handling, the engine call, fitted attributes."""

    # constructor parameters
    prior_mean: ArrayLike | None
    prior_cov: ArrayLike
    update_form: Literal["natural", "moment"]
    tol: float
    max_sweeps: int
    damping: float
    refresh_every: int
    negative_precision: Literal["clip", "skip", "allow"]
    fit_intercept: bool
    intercept_prior_var: float
    # fitted attributes (and those of WeightSpacePosterior)
    n_skipped_updates_: int
    n_clipped_updates_: int
    n_features_in_: int

    def _check_options(self):
        v.check_choice(self.update_form, "update_form", _UPDATE_FORMS)
        v.check_choice(self.negative_precision, "negative_precision", _NEGATIVE_POLICIES)
        v.check_positive(self.tol, "tol")
        v.check_int(self.max_sweeps, "max_sweeps", minimum=1)
        v.check_int(self.refresh_every, "refresh_every", minimum=1)
        v.check_in_range(self.damping, "damping", 0.0, 1.0, low_inclusive=False)
        if not isinstance(self.fit_intercept, (bool, np.bool_)):
            raise TypeError(f"fit_intercept must be a bool, got {type(self.fit_intercept).__name__}")
        if self.fit_intercept:
            v.check_positive(self.intercept_prior_var, "intercept_prior_var")

    def _design(self, X):
        if self.fit_intercept:
            return np.ascontiguousarray(np.hstack([X, np.ones((X.shape[0], 1))]))
        return X

    def _prior(self, n_features):
        mean, cov = v.check_prior(self.prior_mean, self.prior_cov, n_features)
        if self.fit_intercept:
            d = n_features
            big = np.zeros((d + 1, d + 1))
            big[:d, :d] = cov
            big[d, d] = float(self.intercept_prior_var)
            mean = np.append(mean, 0.0)
            cov = big
        return mean, cov

    def _run_ep(self, design, targets, likelihood):
        progress = self._new_progress()
        prior_mean, prior_cov = self._prior(design.shape[1] - int(bool(self.fit_intercept)))
        n, d = design.shape
        spec = likelihood.site_spec()
        site_precision = np.zeros(n)
        site_natural_mean = np.zeros(n)
        post_mean = np.empty(d)
        post_cov = np.empty((d, d))
        options = _engine.LinearEPOptions(
            update_form=_UPDATE_FORMS[self.update_form], damping=float(self.damping), tol=float(self.tol),
            max_sweeps=int(self.max_sweeps), refresh_every=int(self.refresh_every),
            negative_precision=_NEGATIVE_POLICIES[self.negative_precision])
        engine = _engine.LinearEP(design, targets, prior_mean, prior_cov, spec, options, validate=False)
        info = engine.run(site_precision, site_natural_mean, post_mean, post_cov,
                          sweep_callback=progress.sweep_callback())
        try:
            log_evidence = engine.log_evidence(site_precision, site_natural_mean, post_mean, post_cov)
        except ValueError as error:
            if "improper cavity" not in str(error):
                raise
            # 1 - τ_i x_iᵀ V x_i lost to rounding: a site's data outweigh the prior by ~1e16
            scale = float(np.max(np.abs(design)))
            raise ValueError(
                f"the EP evidence cannot be formed in double precision: {error.args[0].split(';')[0]}, because "
                f"the data outweigh the prior by a factor near 1e16 (X has entries up to {scale:.3g}, prior_cov "
                f"{self.prior_cov!r}). Standardise the columns of X, or scale prior_cov to the data") from None
        progress.report("done", info.n_sweeps, log_evidence, info.max_change)
        if info.stopped:
            self._warn_if_stopped(progress, stacklevel=4)
        elif not info.converged:
            warnings.warn(
                f"EP did not converge in {info.n_sweeps} sweeps (max_sweeps={self.max_sweeps}); "
                f"the largest site-parameter change in the last sweep was {info.max_change:.3g} "
                f"> tol={self.tol:g}. Increase max_sweeps, lower damping, or check the model.",
                ConvergenceWarning, stacklevel=3)
        if not np.isfinite(log_evidence) or not np.all(np.isfinite(post_mean)):
            raise FloatingPointError(
                "EP produced a non-finite posterior or evidence; this is a bug, please report it")
        # Everything computed: only now set fitted attributes (no half-fitted state on error).
        self.posterior_mean_ = post_mean
        self.posterior_cov_ = post_cov
        self.site_precision_ = site_precision
        self.site_natural_mean_ = site_natural_mean
        self.log_marginal_likelihood_value_ = float(log_evidence)
        self.n_sweeps_ = int(info.n_sweeps)
        self.converged_ = bool(info.converged)
        self.n_skipped_updates_ = int(info.n_skipped)
        self.n_clipped_updates_ = int(info.n_clipped)
        self.n_features_in_ = design.shape[1] - int(bool(self.fit_intercept))
        return self

    @property
    def coef_(self) -> NDArray[np.float64]:
        """Posterior mean of the feature weights (without the intercept)."""
        check_is_fitted(self, "posterior_mean_")
        return self.posterior_mean_[: self.n_features_in_]

    @property
    def intercept_(self) -> float:
        """Posterior mean of the intercept (0.0 when ``fit_intercept=False``)."""
        check_is_fitted(self, "posterior_mean_")
        return float(self.posterior_mean_[-1]) if self.fit_intercept else 0.0

    def predict_latent(self, X: ArrayLike) -> MeanStd:
        """Posterior mean and variance of the latent ``f(x) = x^T w`` at each row of ``X``.

        Returns
        -------
        mean, var : ndarray of shape (n_samples,)
        """
        check_is_fitted(self, "posterior_mean_")
        design = self._design(v.check_n_features(X, self.n_features_in_, estimator=self))
        mean = matmul(design, self.posterior_mean_)
        var = np.einsum("ij,ij->i", matmul(design, self.posterior_cov_), design)
        return mean, np.maximum(var, 0.0)


_SHARED_PARAMETERS_DOC = fill_doc("""prior_mean : None, float or array of shape (n_features,), default None (zero)
    prior_cov : float, array of shape (n_features,) or (n_features, n_features), default 1.0
        Isotropic variance, diagonal variances, or a positive-definite matrix.
    update_form : {'natural', 'moment'}, default 'natural'
        Site update equations: natural parameters (eqs 39–45) or the (v_i, m_i) form (eqs 23–38).
    tol : float, default 1e-8
        Convergence threshold on the largest change of the site parameters in a sweep.
    max_sweeps : int, default 100
    damping : float in (0, 1], default 1.0
        Fraction of each site change applied (in natural parameters); 1 is undamped EP.
    refresh_every : int, default 1
        Recompute V and m from the invariant (eqs 46–47) every this many sweeps.
    negative_precision : {'clip', 'skip', 'allow'}, default 'clip'
        What to do when a site update asks for a negative site precision (only possible for
        non-log-concave likelihoods such as the step with flip noise): 'clip' keeps the mean
        matched with zero site precision, 'skip' leaves the site unchanged, 'allow' accepts it
        while the posterior stays proper.
    fit_intercept : bool, default False
        Append a constant feature whose weight has prior N(0, intercept_prior_var).
    intercept_prior_var : float, default 1.0
    %CALLBACK%""", CALLBACK=CALLBACK_DOC)

_SHARED_ATTRIBUTES_DOC = """posterior_mean_, posterior_cov_ : ndarray
    site_precision_, site_natural_mean_ : ndarray of shape (n_samples,)
        Site parameters v_i^-1 and v_i^-1 m_i (eq 20 onward).
    log_marginal_likelihood_value_ : float
    n_sweeps_ : int
    converged_ : bool
"""

_REFERENCES_DOC = """References
    ----------
    Minka, T. P. *Expectation Propagation for approximate Bayesian inference* (UAI 2001) and
    *EP: a quick reference*, §1.1: site updates eqs 23-45, posterior invariant eqs 46-47,
    evidence eqs 48-49.
"""


class LinearEPClassifier(ClassifierMixin, _LinearEPBase):
    __doc__ = fill_doc("""Bayesian linear binary classifier fitted by Gaussian EP with rank-1 sites.

    Model: ``w ~ N(prior_mean, prior_cov)``, ``p(y_i | w) = t(y_i x_i^T w)``
    for a binary likelihood ``t`` (probit, step with flip noise, or logistic).
    EP (Minka 2001, §1.1, eqs 23–49) approximates the posterior by
    ``N(posterior_mean_, posterior_cov_)`` and gives the evidence ``log_marginal_likelihood_value_``.

    Parameters
    ----------
    likelihood : fastep.likelihoods.Probit, Step or Logistic, default Probit()
    %SHARED_PARAMETERS%

    Attributes
    ----------
    classes_ : ndarray of shape (2,)
        The two labels; ``classes_[1]`` is the positive class.
    %SHARED_ATTRIBUTES%

    %REFERENCES%

    %EXAMPLES%
    >>> X = rng.normal(size=(200, 3))
    >>> y = np.where(X @ np.array([2.0, -1.0, 0.0]) + 0.3 * rng.normal(size=200) > 0, "pos", "neg")
    >>> clf = LinearEPClassifier(fit_intercept=True).fit(X, y)
    >>> clf.classes_.tolist()
    ['neg', 'pos']
    >>> bool(clf.score(X, y) > 0.9), clf.posterior_cov_.shape
    (True, (4, 4))
    """, EXAMPLES=EXAMPLES_DOC, ESTIMATOR="LinearEPClassifier", SHARED_PARAMETERS=_SHARED_PARAMETERS_DOC,
        SHARED_ATTRIBUTES=_SHARED_ATTRIBUTES_DOC, REFERENCES=_REFERENCES_DOC)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False          # binary: one weight vector
        return tags

    likelihood: Probit | Step | Logistic | None
    classes_: NDArray[Any]
    likelihood_: Probit | Step | Logistic

    def __init__(self, likelihood: Probit | Step | Logistic | None = None, *, prior_mean: ArrayLike | None = None,
                 prior_cov: ArrayLike = 1.0, update_form: Literal["natural", "moment"] = "natural",
                 tol: float = 1e-8, max_sweeps: int = 100, damping: float = 1.0, refresh_every: int = 1,
                 negative_precision: Literal["clip", "skip", "allow"] = "clip", fit_intercept: bool = False,
                 intercept_prior_var: float = 1.0, verbose: int = 0,
                 callback: Callback = None) -> None:
        self._set_init_params(locals())

    def _likelihood(self):
        return check_binary_likelihood(self.likelihood)

    @records_feature_names
    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Fit the EP posterior to training data.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
            Exactly two distinct labels (any type numpy can sort).

        Returns
        -------
        self
        """
        self._check_options()
        likelihood = self._likelihood()
        X, y = v.check_X_y(X, y)
        classes, targets = v.encode_binary_labels(y)
        self._run_ep(self._design(X), targets, likelihood)
        self.classes_ = classes
        self.likelihood_ = likelihood
        return self

    def decision_function(self, X: ArrayLike) -> NDArray[np.float64]:
        """Log-odds ``log p(y=classes_[1] | x) - log p(y=classes_[0] | x)`` under the EP predictive.

        Positive values predict ``classes_[1]``.
        """
        check_is_fitted(self, "classes_")
        mean, var = self.predict_latent(X)
        lik = self.likelihood_
        log_p_pos = lik.moments(np.ones_like(mean), mean, var)[0]
        log_p_neg = lik.moments(-np.ones_like(mean), mean, var)[0]
        return log_p_pos - log_p_neg

    def predict_proba(self, X: ArrayLike) -> NDArray[np.float64]:
        """Predictive class probabilities ``∫ p(y | f) N(f; mean, var) df``, columns ordered as ``classes_``.

        For the probit likelihood this is Φ(λ(μ* + b) / sqrt(1 + λ² σ*²)).
        """
        p_pos = expit(self.decision_function(X))
        return np.column_stack([1.0 - p_pos, p_pos])

    def predict(self, X: ArrayLike) -> NDArray[Any]:
        """Most probable class label for each row of ``X``."""
        check_is_fitted(self, "classes_")
        return self.classes_[(self.decision_function(X) > 0).astype(int)]


class LinearEPRegressor(RegressorMixin, _LinearEPBase):
    __doc__ = fill_doc("""Bayesian linear regression ``y = x^T w + N(0, noise_variance)`` through the same EP engine.

    With a Gaussian likelihood EP is exact: one sweep gives the conjugate
    posterior and the evidence ``log N(y; X m0, X V0 X^T + σ² I)``; this
    estimator exists so that the EP engine's answer can be used (and checked)
    as ordinary Bayesian linear regression.

    Parameters
    ----------
    noise_variance : float > 0, default 1.0
        σ², the variance of the Gaussian noise.
    %SHARED_PARAMETERS%

    Attributes
    ----------
    %SHARED_ATTRIBUTES%

    %REFERENCES%

    %EXAMPLES%
    >>> X = rng.normal(size=(100, 2))
    >>> y = X @ np.array([1.5, -0.5]) + 0.1 * rng.normal(size=100)
    >>> reg = LinearEPRegressor(noise_variance=0.01, prior_cov=10.0).fit(X, y)
    >>> np.round(reg.posterior_mean_, 1)
    array([ 1.5, -0.5])
    """, EXAMPLES=EXAMPLES_DOC, ESTIMATOR="LinearEPRegressor", SHARED_PARAMETERS=_SHARED_PARAMETERS_DOC,
        SHARED_ATTRIBUTES=_SHARED_ATTRIBUTES_DOC, REFERENCES=_REFERENCES_DOC)

    noise_variance: float
    noise_variance_: float

    def __init__(self, noise_variance: float = 1.0, *, prior_mean: ArrayLike | None = None,
                 prior_cov: ArrayLike = 1.0, update_form: Literal["natural", "moment"] = "natural",
                 tol: float = 1e-8, max_sweeps: int = 100, damping: float = 1.0, refresh_every: int = 1,
                 negative_precision: Literal["clip", "skip", "allow"] = "clip", fit_intercept: bool = False,
                 intercept_prior_var: float = 1.0, verbose: int = 0,
                 callback: Callback = None) -> None:
        self._set_init_params(locals())

    @records_feature_names
    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Fit the posterior over weights; returns ``self``."""
        self._check_options()
        likelihood = Gaussian(noise_variance=v.check_positive(self.noise_variance, "noise_variance"))
        X, y = v.check_X_y(X, y, y_numeric=True)
        self._run_ep(self._design(X), y, likelihood)
        self.noise_variance_ = likelihood.noise_variance
        return self

    def _predict_mean_std(self, X: ArrayLike, return_std: bool) -> NDArray[np.float64] | MeanStd:
        mean, var = self.predict_latent(X)
        if return_std:
            return mean, np.sqrt(var + self.noise_variance_)
        return mean


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
