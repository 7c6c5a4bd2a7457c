"""The GP estimators' shared base and mixins: the fitted-state handling (one problem per
binary task, stacked one-vs-rest), the evidence methods and the predict methods."""
from __future__ import annotations

from typing import TYPE_CHECKING, overload

import numpy as np

from .. import _validation as v
from .._base import BaseEstimator, ClassifierMixin, RegressorMixin, check_is_fitted, one_vs_rest_proba
from .._search.start import default_noise_variance
from ..kernels import Kernel
from ..likelihoods import Gaussian

if TYPE_CHECKING:
    from typing import Any, Literal

    from numpy.typing import ArrayLike, NDArray

    from .._typing import Hyperprior, MeanStd
from .options import check_noise_variance, start_kernel

__all__ = ["stack_problems", "EPParameters", "GPEstimator", "LogMarginalLikelihoodMixin", "EPEvidenceMixin", "GPClassifierMixin", "MultinomialClassifierMixin", "GPRegressorMixin"]


def stack_problems(arrays):
    """One problem: its array; several (one-vs-rest): stacked along a new first axis."""
    return arrays[0] if len(arrays) == 1 else np.stack(arrays)


class EPParameters:
    """The constructor parameters the dense and sparse EP estimators share, declared once (their
    docstrings give them)."""

    damping: float | None
    tol: float
    max_sweeps: int
    negative_precision: Literal["clip", "skip"]
    optimizer: Literal["L-BFGS-B"] | None
    n_restarts_optimizer: int
    jitter: float
    random_state: int | None
    warm_start: bool
    hyperprior: Hyperprior


class GPEstimator(BaseEstimator):
    """Fitted-state handling and the latent predictive shared by the GP estimators.

    Subclasses fit a list of problems (each with ``latent(X)``, ``kernel`` and
    ``likelihood``) and call :meth:`_set_problems`.
    """

    kernel: Kernel | None
    _problems: list[Any]
    n_features_in_: int

    def _set_problems(self, X, problems):
        """Store the problems and the fitted attributes every GP estimator has."""
        self._problems = problems
        self.n_features_in_ = X.shape[1]
        binary = len(problems) == 1
        self.kernel_ = problems[0].kernel if binary else [p.kernel for p in problems]
        self.likelihood_ = problems[0].likelihood if binary else [p.likelihood for p in problems]

    def _set_ep_summary(self, problems):
        """Sites, sweep counts, convergence and log marginal likelihood of EP problems."""
        self.log_marginal_likelihood_value_ = float(sum(p.log_ml for p in problems))
        self.log_hyperposterior_value_ = float(sum(getattr(p, "log_objective", p.log_ml) for p in problems))
        self.n_evaluations_ = (getattr(problems[0], "n_evaluations", 0) if len(problems) == 1
                               else np.array([getattr(p, "n_evaluations", 0) for p in problems]))
        tied = any(p.site_precision is None for p in problems)     # minibatch EP with tied sites
        self.site_precision_ = None if tied else stack_problems([p.site_precision for p in problems])
        self.site_natural_mean_ = None if tied else stack_problems([p.site_natural_mean for p in problems])
        self.n_sweeps_ = (problems[0].info.n_sweeps if len(problems) == 1
                          else np.array([p.info.n_sweeps for p in problems]))
        self.converged_ = all(bool(p.info.converged) for p in problems)
        progress = None
        for p in problems:                      # the fit's reporter is not part of the fitted state
            progress = p.options.progress or progress
            if p.options.progress is not None:
                p.options = p.options.replace(progress=None)
        if progress is not None:
            self._warn_if_stopped(progress, stacklevel=4)

    def _fit_problem(self, problem):
        """Fit ``problem`` (a :class:`SiteProblem` holding its ``hyperparameters`` and engine
        options) by its :meth:`SiteProblem.fit`, with the estimator's ``optimizer``,
        ``n_restarts_optimizer``, ``warm_start``, ``max_sweeps`` and ``tol`` and the options'
        ``seed``, named after the estimator for its warnings; returns the problem."""
        problem.estimator_name = type(self).__name__
        problem.latent_scale = 1.0 if isinstance(self, GPClassifierMixin) else None
        return problem.fit(optimizer=self.optimizer, n_restarts=self.n_restarts_optimizer, seed=problem.options.seed,
                           warm_start=self.warm_start, max_sweeps=self.max_sweeps, tol=self.tol)

    def _check_X(self, X: ArrayLike) -> NDArray[np.float64]:
        """Prediction-time X, validated against the training features (raises if not fitted)."""
        check_is_fitted(self, "_problems")
        return v.check_n_features(X, self.n_features_in_, estimator=self)

    def predict_latent(self, X: ArrayLike) -> MeanStd:
        """Latent predictive mean and variance at the rows of ``X``.

        Parameters
        ----------
        X : array-like (n_samples, n_features)

        Returns
        -------
        mean, var : ndarray (n_samples,), or (n_samples, n_classes) one-vs-rest
        """
        X = self._check_X(X)
        out = [p.latent(X) for p in self._problems]
        if len(out) == 1:
            return out[0]
        return np.column_stack([m for m, _ in out]), np.column_stack([s for _, s in out])


class LogMarginalLikelihoodMixin:
    """``log_marginal_likelihood(theta, eval_gradient)`` of the GP estimators, summed over their
    problems (one per class one-vs-rest).

    An estimator supplies the evidence of one problem at ``theta``
    (``_problem_log_marginal_likelihood``) and, optionally, the check of its fitted value
    (``_fitted_log_marginal_likelihood``).
    """

    _problems: list[Any]
    log_marginal_likelihood_value_: float | None

    @overload
    def log_marginal_likelihood(self, theta: ArrayLike | None = None, eval_gradient: Literal[False] = False
                                ) -> float: ...
    @overload
    def log_marginal_likelihood(self, theta: ArrayLike | None, eval_gradient: Literal[True]
                                ) -> tuple[float, NDArray[np.float64]]: ...
    @overload
    def log_marginal_likelihood(self, theta: ArrayLike | None = None, *, eval_gradient: Literal[True]
                                ) -> tuple[float, NDArray[np.float64]]: ...
    @overload
    def log_marginal_likelihood(self, theta: ArrayLike | None = None, eval_gradient: bool = False
                                ) -> float | tuple[float, NDArray[np.float64]]: ...
    def log_marginal_likelihood(self, theta: ArrayLike | None = None, eval_gradient: bool = False
                                ) -> float | tuple[float, NDArray[np.float64]]:
        """EP log marginal likelihood (and its gradient) at ``theta``.

        The evidence of the model the estimator fits: for the dense and sparse GP estimators,
        of their EP approximation on the training data; for the IVM estimators, the full-data
        objective: the sparse model on all training points with the fitted active inputs as
        inducing inputs (EP-FITC), ``K_mm``'s jitter at its fitted value.

        Parameters
        ----------
        theta : array-like or None, default None
            Unconstrained hyperparameters, in the order ``kernel_.theta``; then the
            likelihood's learnt parameters (``learn_likelihood``, or log σ² with
            ``learn_noise``; :meth:`fastep.likelihoods.Likelihood.theta_names` gives their
            coordinates); then, for the sparse models whose fit learnt the inducing inputs
            (``learn_inducing=True``, or a minibatch fit's second stage),
            ``inducing_inputs_.ravel()``. None returns the fitted value
            (``log_marginal_likelihood_value_``). One-vs-rest: the same ``theta`` for every
            class, and the sum over the classes is returned.
        eval_gradient : bool, default False
            Also return the gradient with respect to ``theta`` (exact at the EP fixed point).

        Returns
        -------
        float, or (float, ndarray) with ``eval_gradient``
            EP runs from zero sites at ``theta``; the fitted state is left unchanged.
        """
        check_is_fitted(self, "_problems")
        if theta is None:
            if eval_gradient:
                raise ValueError("eval_gradient=True requires theta")
            return self._fitted_log_marginal_likelihood()
        values = [self._problem_log_marginal_likelihood(p, theta, eval_gradient) for p in self._problems]
        if eval_gradient:
            return float(sum(val for val, _ in values)), np.sum([g for _, g in values], axis=0)
        return float(sum(values))

    def _fitted_log_marginal_likelihood(self) -> float:
        return self.log_marginal_likelihood_value_  # type: ignore[return-value]

    def _problem_log_marginal_likelihood(self, problem, theta, eval_gradient):
        return problem.log_ml_at(problem.hyperparameters, theta, eval_gradient)


class EPEvidenceMixin(LogMarginalLikelihoodMixin):
    """``log_marginal_likelihood`` and ``log_hyperposterior`` of the estimators whose problems
    are :class:`SiteProblem`, and the fitted attributes of their EP runs."""

    log_marginal_likelihood_value_: float
    log_hyperposterior_value_: float
    n_evaluations_: int | NDArray[np.int_]
    site_precision_: NDArray[np.float64]
    site_natural_mean_: NDArray[np.float64]
    n_sweeps_: int | NDArray[np.int_]
    converged_: bool

    @overload
    def log_hyperposterior(self, theta: ArrayLike | None = None, eval_gradient: Literal[False] = False
                           ) -> float: ...
    @overload
    def log_hyperposterior(self, theta: ArrayLike | None, eval_gradient: Literal[True]
                           ) -> tuple[float, NDArray[np.float64]]: ...
    @overload
    def log_hyperposterior(self, theta: ArrayLike | None = None, *, eval_gradient: Literal[True]
                           ) -> tuple[float, NDArray[np.float64]]: ...
    @overload
    def log_hyperposterior(self, theta: ArrayLike | None = None, eval_gradient: bool = False
                           ) -> float | tuple[float, NDArray[np.float64]]: ...
    def log_hyperposterior(self, theta: ArrayLike | None = None, eval_gradient: bool = False
                           ) -> float | tuple[float, NDArray[np.float64]]:
        """The objective of the hyperparameter search at ``theta``: the EP log marginal likelihood
        plus the log density of the hyperprior (``hyperprior``; none: the evidence alone).

        Parameters
        ----------
        theta : array-like or None, default None
            As for :meth:`log_marginal_likelihood`; None returns the fitted value
            (``log_hyperposterior_value_``).
        eval_gradient : bool, default False
            Also return the gradient with respect to ``theta``.

        Returns
        -------
        float, or (float, ndarray) with ``eval_gradient``
        """
        check_is_fitted(self, "_problems")
        if theta is None:
            if eval_gradient:
                raise ValueError("eval_gradient=True requires theta")
            return self.log_hyperposterior_value_
        evidence: Any = self.log_marginal_likelihood(theta, eval_gradient)
        hyper = self._problems[0].hyperparameters
        theta = hyper.check(theta)
        prior = [p.hyperparameters.log_prior(theta, eval_gradient) for p in self._problems]
        if eval_gradient:
            return (evidence[0] + float(sum(val for val, _ in prior)),
                    evidence[1] + np.sum([g for _, g in prior], axis=0))
        return evidence + float(sum(prior))


class GPClassifierMixin(ClassifierMixin):
    """Class probabilities, decision values and labels from binary latent predictives."""

    _problems: list[Any]
    classes_: NDArray[Any]

    if TYPE_CHECKING:
        def _check_X(self, X: ArrayLike) -> NDArray[np.float64]: ...

    def predict_proba(self, X: ArrayLike) -> NDArray[np.float64]:
        """Class probabilities, columns ordered as ``classes_``.

        Binary: ``p(y = classes_[1] | x) = ∫ t(f) N(f; μ*, σ*²) df`` with the likelihood
        ``t`` (probit with unit slope: ``Φ(μ*/sqrt(1 + σ*²))``). One-vs-rest: each class's
        binary predictive, normalised to sum to one.

        Parameters
        ----------
        X : array-like (n_samples, n_features)

        Returns
        -------
        ndarray (n_samples, n_classes)
        """
        X = self._check_X(X)
        return one_vs_rest_proba(self._problems, X)

    def decision_function(self, X: ArrayLike) -> NDArray[np.float64]:
        """Predictive log-odds ``log p(+1 | x) - log p(-1 | x)`` of each binary problem.

        Parameters
        ----------
        X : array-like (n_samples, n_features)

        Returns
        -------
        ndarray (n_samples,), or (n_samples, n_classes) one-vs-rest
        """
        X = self._check_X(X)
        cols = []
        for p in self._problems:
            mean, var = p.latent(X)
            ones = np.ones_like(mean)
            cols.append(p.likelihood.moments(ones, mean, var)[0] - p.likelihood.moments(-ones, mean, var)[0])
        return cols[0] if len(cols) == 1 else np.column_stack(cols)

    def _multiclass_scores(self, X):
        """Scores whose row-wise argmax is the one-vs-rest prediction."""
        return self.predict_proba(X)

    def predict(self, X: ArrayLike) -> NDArray[Any]:
        """Most probable class for each row of ``X``.

        Parameters
        ----------
        X : array-like (n_samples, n_features)

        Returns
        -------
        ndarray (n_samples,) of labels from ``classes_``
        """
        check_is_fitted(self, "_problems")
        if len(self._problems) == 1:
            return self.classes_[(self.decision_function(X) > 0).astype(int)]
        return self.classes_[np.argmax(self._multiclass_scores(X), axis=1)]


class MultinomialClassifierMixin:
    """``predict_proba``, ``decision_function`` and ``predict`` of a classifier whose fit may be one
    multinomial problem (:meth:`_multinomial`): class probabilities from that problem's
    predictor and latent means from :meth:`_multinomial_means`; otherwise those of the next
    class in the method resolution order (:class:`GPClassifierMixin`)."""

    _problems: list[Any]
    classes_: NDArray[Any]

    def _multinomial(self) -> bool:
        """Whether the fitted model is one multinomial problem."""
        raise NotImplementedError

    def _multinomial_means(self, X):
        """Latent means (n, c) of the multinomial problem at the validated ``X``."""
        raise NotImplementedError

    def predict_proba(self, X: ArrayLike) -> NDArray[np.float64]:
        check_is_fitted(self, "_problems")
        if self._multinomial():
            return self._problems[0].predictor.predict_proba(self._check_X(X))  # type: ignore[attr-defined]
        return super().predict_proba(X)  # type: ignore[misc]

    def decision_function(self, X: ArrayLike) -> NDArray[np.float64]:
        check_is_fitted(self, "_problems")
        if self._multinomial():
            X = self._check_X(X)  # type: ignore[attr-defined]
            if len(self.classes_) == 2:
                # one column, the predictive log-odds of classes_[1] as for every binary classifier
                log_p = np.log(self._problems[0].predictor.predict_proba(X))
                return log_p[:, 1] - log_p[:, 0]
            return self._multinomial_means(X)
        return super().decision_function(X)  # type: ignore[misc]

    def predict(self, X: ArrayLike) -> NDArray[Any]:
        check_is_fitted(self, "_problems")
        if self._multinomial():
            return self.classes_[np.argmax(self.predict_proba(X), axis=1)]
        return super().predict(X)  # type: ignore[misc]

    predict_proba.__doc__ = GPClassifierMixin.predict_proba.__doc__
    decision_function.__doc__ = GPClassifierMixin.decision_function.__doc__
    predict.__doc__ = GPClassifierMixin.predict.__doc__


class GPRegressorMixin(RegressorMixin):
    """Predictive mean and standard deviation of a GP regressor with Gaussian noise."""

    noise_variance: float | None
    learn_noise: bool
    noise_variance_: float

    if TYPE_CHECKING:
        def predict_latent(self, X: ArrayLike) -> MeanStd: ...

    #: Added to the latent mean (the IVM regressor's bias); 0 for a zero-mean GP.
    def _output_offset(self) -> float:
        return 0.0

    def _check_regression_inputs(self, X: ArrayLike, y: ArrayLike, kernel: Kernel | None, bias: bool = True
                                 ) -> tuple[Gaussian, bool, NDArray[np.float64], NDArray[np.float64], Kernel]:
        """``(likelihood, learn_noise, X, y, kernel)``: the Gaussian noise model from
        ``noise_variance`` (data-aware when None), ``learn_noise`` as a bool, X (validated
        once, also against the kernel), real y, and the starting kernel (:func:`start_kernel`;
        ``bias`` False for an estimator that subtracts the targets' offset itself)."""
        noise_variance = check_noise_variance(self.noise_variance)
        learn_noise = v.check_bool(self.learn_noise, "learn_noise")
        X, y = v.check_X_y(X, y, y_numeric=True)
        if noise_variance is None:
            noise_variance = default_noise_variance(y)
        kernel = start_kernel(kernel, X, y, regression=True, bias=bias)
        kernel._validate_X(X, "X")
        return Gaussian(noise_variance=noise_variance), learn_noise, X, y, kernel

    def _predict_mean_std(self, X: ArrayLike, return_std: bool) -> NDArray[np.float64] | MeanStd:
        # std = sqrt(σ*² + noise_variance_)
        mean, var = self.predict_latent(X)
        offset = self._output_offset()
        if offset:
            mean = mean + offset
        if return_std:
            return mean, np.sqrt(var + self.noise_variance_)
        return mean
