"""Bayesian linear models fitted by weight-space Gaussian EP (Minka §1, rank-1 sites).

The compiled engine :mod:`fastep._epcore.linear_ep` runs the sweeps; this module
validates input, encodes labels, and exposes scikit-learn style estimators.
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
from ._linalg import matmul
from .exceptions import ConvergenceWarning
from .likelihoods import Gaussian, Logistic, Probit, Step
from .likelihoods.checks import check_binary_likelihood
from .progress import CALLBACK_DOC

if TYPE_CHECKING:
    from typing import Any, Literal

    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

    from ._typing import Callback, MeanStd

__all__ = ["LinearEPClassifier", "LinearEPRegressor"]

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
