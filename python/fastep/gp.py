"""Gaussian-process classification and regression by dense kernel-space EP (Minka §2, eqs 77-88).

The compiled engine :mod:`fastep._epcore.gp_ep` runs the EP sweeps on the n×n
kernel matrix; this module holds the estimators (options, validation, one problem per
class, prediction); one problem's EP runs, evidence gradient and prediction state live in
:mod:`fastep._dense.problem`, the hyperparameter search in :mod:`fastep._gp.problem`.

Prediction (R&W Alg. 3.6): with ``s = sqrt(site_precision)``,
``B = I + S^½ K S^½ = L Lᵀ`` and ``b = (K + S⁻¹)⁻¹ S⁻¹ ν = ν − s ⊙ B⁻¹(s ⊙ K ν)``,
the latent predictive at ``x*`` is ``N(k*ᵀ b, k** − |L⁻¹(s ⊙ k*)|²)``; class
probabilities integrate the likelihood against it (probit: ``Φ(μ*/sqrt(1 + σ*²))``
for unit slope).

Jitter policy: ``jitter`` (default 0) is added to the diagonal of K. If the
kernel matrix is numerically indefinite, B's Cholesky factorisation fails and
``fit`` raises ``numpy.linalg.LinAlgError`` asking for a larger ``jitter`` (or a
``White`` term in the kernel); nothing is fitted.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from . import _validation as v
from ._memory import check_memory, concurrent_problems, dense_gp_bytes, format_bytes, student_t_gp_bytes
from ._epcore import gp_ep as _engine
from ._base import EXAMPLES_DOC, fill_doc, records_feature_names
from ._gp.docs import (EP_RUN_ATTRIBUTES, HYPERPRIOR_DOC, LEARNING_ATTRIBUTES, MIXED_UNITS_DOC, N_JOBS_DOC,
                       REGRESSOR_ATTRIBUTES)
from ._gp.estimator import (EPEvidenceMixin, EPParameters, GPClassifierMixin, GPEstimator, GPRegressorMixin,
                            MultinomialClassifierMixin)
from ._gp.fit_options import DenseFitOptions
from ._gp.options import check_classifier_likelihood, ep_option_constraints, start_kernel, use_fractional_ep
from ._constraints import Integer, validate_params
from ._dense.problem import DenseGPProblem
from ._dense.multiclass import ADAPTIVE_DAMPING_START, MultinomialGPProblem
from ._student_t.problem import StudentTGPProblem
from .likelihoods import Gaussian, Probit, StudentT
from .likelihoods.checks import resolve_noise_model
from .progress import CALLBACK_DOC
from .batch import map_in_order
from .kernels.base import check_kernel

if TYPE_CHECKING:
    from typing import Literal

    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

    from ._typing import Callback, Hyperprior
    from .kernels import Kernel
    from .likelihoods import Likelihood, Logistic, Step

__all__ = ["GaussianProcessClassifier", "GaussianProcessRegressor"]

#: The dense problem of each EP variant (:attr:`fastep.likelihoods.Likelihood.ep_variant`).
_PROBLEMS = {"standard": DenseGPProblem, "fractional": StudentTGPProblem}

_SCHEDULES = {"sequential": _engine.SCHEDULE_SEQUENTIAL, "parallel": _engine.SCHEDULE_PARALLEL,
              "blocked": _engine.SCHEDULE_BLOCKED}
_ORDERS = {"fixed": _engine.ORDER_FIXED, "random": _engine.ORDER_RANDOM, "entropy": _engine.ORDER_ENTROPY}
_POLICIES = {"clip": _engine.NEGATIVE_CLIP, "skip": _engine.NEGATIVE_SKIP}
# Sweeps between full refactorisations (the final answer is always refactorised):
# after every sweep for the plain rank-1 path (the cross-check), every 10 sweeps for the
# blocked path, where the O(n³) refactorisation costs about twice a sweep
# (measured in benchmarks/compare_gpc_peers.py).
_DEFAULT_REFACTOR_EVERY = {"sequential": 1, "blocked": 10, "parallel": 1}


class _GPEPBase(EPParameters, EPEvidenceMixin, GPEstimator):
    """Fit options and the per-problem fit shared by the dense GP estimators."""

    schedule: Literal["blocked", "sequential", "parallel"]
    order: Literal["fixed", "random", "entropy"]
    block_size: int | None
    refresh_every: int | None
    refactor_every: int | None | Literal["deprecated"]
    X_train_: NDArray[np.float64]

    _renamed_parameters = {"refactor_every": "refresh_every"}
    _parameter_constraints = dict(ep_option_constraints(_SCHEDULES, _ORDERS, _POLICIES),
                                  block_size=Integer(1, allow_none=True), refresh_every=Integer(1, allow_none=True))

    def _fit_options(self):
        """The fit's :class:`~fastep._gp.fit_options.DenseFitOptions` from the parameters (validated)."""
        p = validate_params(self, self._parameter_constraints)
        damping = p["damping"]
        if damping is None:
            damping = 0.5 if self.schedule == "parallel" else 1.0
        refactor_every = p["refresh_every"]
        if self.refactor_every != "deprecated":
            warnings.warn("refactor_every is deprecated and will be removed in the next release; use refresh_every",
                          FutureWarning, stacklevel=3)
            if refactor_every is not None:
                raise ValueError(f"give refresh_every only (refactor_every={self.refactor_every!r} is its deprecated "
                                 f"name; refresh_every={refactor_every!r})")
            refactor_every = Integer(1, allow_none=True).check(self.refactor_every, "refactor_every")
        if refactor_every is None:
            refactor_every = _DEFAULT_REFACTOR_EVERY[self.schedule]
        return DenseFitOptions(schedule=_SCHEDULES[self.schedule], order=_ORDERS[self.order], seed=p["random_state"],
                               damping=float(damping), tol=p["tol"], max_sweeps=p["max_sweeps"],
                               negative_precision=_POLICIES[self.negative_precision],
                               block_size=0 if p["block_size"] is None else p["block_size"],
                               jitter=p["jitter"], refresh_every=refactor_every, hyperprior=p["hyperprior"],
                               progress=self._new_progress())

    def _check_memory(self, X, n_problems, n_classes_multinomial, student_t=False):
        """Raise :class:`~fastep.exceptions.MemoryLimitError` before a fit that cannot fit in memory."""
        n = X.shape[0]
        learning = self.optimizer is not None
        if student_t:
            estimate = student_t_gp_bytes(n, learning=learning)
        else:
            estimate = dense_gp_bytes(n, learning=learning, n_problems=n_problems,
                                      n_concurrent=concurrent_problems(getattr(self, "n_jobs", None)),
                                      n_classes_multinomial=n_classes_multinomial)
        sparse = "SparseGPClassifier" if isinstance(self, GPClassifierMixin) else "SparseGPRegressor"
        ivm = "IVMClassifier" if isinstance(self, GPClassifierMixin) else "IVMRegressor"
        check_memory(estimate, f"{type(self).__name__}.fit on n = {n} rows (O(n²) memory: "
                               f"{format_bytes(8 * n * n)} per n×n array)",
                     f"For data this large use {sparse}() (O(n m) memory, m inducing inputs) or "
                     f"{ivm}(active_set_size=d) (O(n d) memory), or fit on a subsample")

    @records_feature_names
    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Fit the EP posterior (and the hyperparameters unless ``optimizer=None``).

        Parameters
        ----------
        X : array-like (n_samples, n_features)
        y : array-like (n_samples,)
            Class labels of a classifier (any sortable values; two or more classes), or real
            targets of a regressor.

        Returns
        -------
        self
        """
        X, problems, n_jobs, classes = self._check_fit_arguments(X, y)
        problems = map_in_order(self._fit_problem, problems, n_jobs)
        # Everything computed: set the fitted attributes.
        self._set_fitted(X, problems, classes)
        return self

    def _check_fit_arguments(self, X, y):
        """``(X, problems, n_jobs, classes)``: the parameters and the data validated, the unfitted
        problems, the ``n_jobs`` to fit them with and the class labels (None: a regressor)."""
        raise NotImplementedError

    def _set_fitted(self, X, problems, classes):
        """Set the fitted attributes from the fitted ``problems``."""
        self.X_train_ = X
        self._set_problems(X, problems)
        self._set_ep_summary(problems)



_EP_PARAMS = fill_doc("""schedule : {'blocked', 'sequential', 'parallel'}, default 'blocked'
        Sequential EP with BLAS-3 blocked updates, the plain rank-1 sequential path, or
        parallel (damped) EP. All reach the same fixed point.
    order : {'fixed', 'random', 'entropy'}, default 'fixed'
        Site order of the sequential schedules: 0..n-1, a seeded permutation per sweep, or
        Seeger's differential-entropy score (Minka, eq 86).
    damping : float in (0, 1] or None, default None
        Fraction of each site change applied (natural parameters); None means 1 for the
        sequential schedules and 0.5 for 'parallel'.
    tol : float, default 1e-4
        EP stops when the largest relative site-parameter change of a sweep and the relative
        change of log Z are both below ``tol``. Sequential EP converges linearly, so the site
        error at the stop is several times below ``tol``, and log Z, stationary at the fixed
        point, is accurate to about its square. Gradients and predictions are accurate to
        about the site error; lower ``tol`` for tighter answers.
    max_sweeps : int, default 200
        Sweeps before EP gives up (with a :class:`~fastep.ConvergenceWarning`).
    block_size : int or None, default None
        Sites per BLAS-3 block of the 'blocked' schedule (None: the engine's default).
    refresh_every : int or None, default None
        Sweeps between refreshes of the posterior: a full refactorisation from the Cholesky
        factor of ``B = I + S^½ K S^½``; the returned posterior and log Z always come from a
        fresh one. None: 1 for 'sequential' and 'parallel', 10 for 'blocked'.
    refactor_every : int or None
        Deprecated name of ``refresh_every`` (a ``FutureWarning``; removed in the next release).
    negative_precision : {'clip', 'skip'}, default 'clip'
        Policy for negative site precisions (possible for the step likelihood with flip
        noise): clip to 0 keeping the tilted mean matched, or skip the update.
    optimizer : 'L-BFGS-B' or None, default 'L-BFGS-B'
        Learn the hyperparameters with L-BFGS-B, using the EP log marginal likelihood's exact
        gradient at the EP fixed point (the objective: ``hyperprior``); None keeps them fixed.
    n_restarts_optimizer : int >= 0, default 0
        Extra optimiser starts at ``theta0 + N(0, I)`` (in the search's log coordinates),
        seeded by ``random_state``.
    %HYPERPRIOR%
    jitter : float >= 0, default 0.0
        Added to the diagonal of the kernel matrix. A kernel matrix that is numerically
        indefinite makes ``fit`` raise ``numpy.linalg.LinAlgError`` asking for more.
    random_state : int or None, default None
        Seed of the random site order and of the optimiser restarts (None: 0).
    warm_start : bool, default True
        Start each EP run of the optimiser from the previous evaluation's sites (a warm
        start that fails is retried from zero sites).
    %CALLBACK%""", HYPERPRIOR=HYPERPRIOR_DOC, CALLBACK=CALLBACK_DOC)

_EP_ATTRIBUTES = fill_doc("""log_marginal_likelihood_value_ : float
        EP log marginal likelihood at the fitted hyperparameters (summed over the
        one-vs-rest problems).
    %LEARNING%
    site_precision_, site_natural_mean_ : ndarray (n_samples,) or (n_classes, n_samples)
        The EP sites ``τ̃_i`` and ``ν̃_i = τ̃_i μ̃_i`` at the fixed point.
    %EP_RUN%
    X_train_ : ndarray (n_samples, n_features)
        The training inputs (the predictive needs them).
    n_features_in_ : int
        Number of features seen in ``fit``.""", LEARNING=LEARNING_ATTRIBUTES, EP_RUN=EP_RUN_ATTRIBUTES)

_REFERENCES = """Minka, T. P. *EP: a quick reference*, §2, eqs 77-88 (EP in kernel space), and
    *Expectation Propagation for approximate Bayesian inference* (UAI 2001).
    Rasmussen, C. E. and Williams, C. K. I. *Gaussian Processes for Machine Learning*
    (MIT Press, 2006), §3.6, Algorithms 3.5-3.6 (EP for GP classification, prediction)."""


class GaussianProcessClassifier(MultinomialClassifierMixin, GPClassifierMixin, _GPEPBase):
    __doc__ = fill_doc("""Gaussian-process classifier fitted by dense expectation propagation.

    Model: a latent function ``f ~ GP(0, k)`` and ``p(y_i | f_i) = t(y_i f_i)`` for a binary
    likelihood ``t`` (probit by default). EP in kernel space gives a Gaussian posterior over
    ``f`` at the training inputs and the EP estimate of the log marginal likelihood; the
    hyperparameters are learnt by maximising it with L-BFGS-B and its exact gradient at the
    EP fixed point, ``∂ log Z/∂θ_j = ½ bᵀ ∂K_j b - ½ tr(R ∂K_j)`` with ``R = S^½ B⁻¹ S^½``.
    More than two classes are handled one-vs-rest (one binary GP per class, probabilities
    normalised to sum to one) or, with ``multi_class="multinomial"``, by one joint model: c
    latent functions with a shared kernel and the multinomial probit likelihood
    ``p(y = k | f) = ∫ N(u) Π_{j≠k} Φ(u + f_k - f_j) du``, fitted by nested EP (Riihimäki,
    Jylänki & Vehtari 2013) with its evidence and exact gradient. O(n³) time and O(n²) memory
    per EP run (O(c n³) and O(c n²) for the multinomial model).

    Parameters
    ----------
    kernel : fastep.kernels.Kernel or None, default None
        Prior covariance; its ``theta`` is the optimiser's starting point. None starts from
        ``RBF(1, γ)``, γ = 1 / (median squared distance between the training inputs, over a
        seeded sample of at most 1000 rows), so that inputs of any scale give a kernel whose
        evidence can be learnt; a kernel given here is the start as it is.
        %MIXED_UNITS%
    likelihood : Probit, Step or Logistic, default Probit()
        The binary site model (:mod:`fastep.likelihoods`).
    %EP_PARAMS%
    learn_likelihood : bool, default False
        Also learn the likelihood's parameters (probit bias and finite slope, step flip noise).
    multi_class : {'one_vs_rest', 'multinomial'}, default 'one_vs_rest'
        'one_vs_rest': one binary GP per class (two classes: one binary GP). 'multinomial': the
        multinomial probit model by nested EP (any number of classes >= 2; the likelihood must be
        the default probit, ``learn_likelihood`` False). It runs damped parallel EP; ``damping``
        None starts every run at 0.9 and multiplies it by 0.7 whenever an iteration's largest
        site change exceeds the previous one's, down to 0.25 (the fixed point is the same as
        with any fixed damping); ``schedule``, ``order``, ``block_size``, ``refresh_every``,
        ``negative_precision`` and ``n_jobs`` do not apply. Two classes give the binary probit
        model with the same kernel. ``decision_function`` then returns the latent means (n, c)
        (two classes: the predictive log-odds of ``classes_[1]``, as the binary classifiers).
        Above 300 training points its hyperparameter search first runs on a third of them
        (drawn per class with a fixed seed, the hyperprior's weight scaled by the same third,
        each nested EP iteration 27 times cheaper) and the search on all points starts where
        that one ends, from its sites on those points, with a first step of length 0.25 in the
        log-parameters. That search ends by the rules of every search or, earlier, at an
        accepted step that moved no training class probability by more than 0.02 and raised the
        objective by less than 1e-3 per point: the model has stopped changing, and the
        predictions are those of the stationary point of the objective on all points to about
        that tolerance.
    %N_JOBS%

    Attributes
    ----------
    classes_ : ndarray (n_classes,)
        Sorted class labels; ``classes_[1]`` is the positive class of a binary problem.
    kernel_ : Kernel or list of Kernel
        The fitted kernel (one per class one-vs-rest).
    likelihood_ : Likelihood or list of Likelihood
        The fitted likelihood (one per class one-vs-rest).
    %EP_ATTRIBUTES%

    See Also
    --------
    SparseGPClassifier : EP with m inducing inputs, O(nm²) time.
    IVMClassifier : sparse GP classification by greedy active-set selection, O(d²n) time.

    References
    ----------
    %REFERENCES%

    %EXAMPLES%
    >>> X = rng.normal(size=(80, 2))
    >>> y = np.where(X[:, 0] + X[:, 1] > 0, "yes", "no")
    >>> clf = GaussianProcessClassifier().fit(X, y)
    >>> clf.classes_.tolist()
    ['no', 'yes']
    >>> clf.predict([[2.0, 2.0], [-2.0, -2.0]]).tolist()
    ['yes', 'no']
    >>> proba = clf.predict_proba([[2.0, 2.0]])
    >>> proba.shape, bool(proba[0, 1] > 0.9)
    ((1, 2), True)
    """, EXAMPLES=EXAMPLES_DOC, ESTIMATOR="GaussianProcessClassifier", EP_PARAMS=_EP_PARAMS, N_JOBS=N_JOBS_DOC,
        EP_ATTRIBUTES=_EP_ATTRIBUTES, REFERENCES=_REFERENCES, MIXED_UNITS=MIXED_UNITS_DOC)

    likelihood: Probit | Step | Logistic | None
    learn_likelihood: bool
    n_jobs: int | None
    multi_class: Literal["one_vs_rest", "multinomial"]
    kernel_: Kernel | list[Kernel]
    #: ``"multinomial_probit"`` for ``multi_class="multinomial"``.
    likelihood_: Likelihood | list[Likelihood] | str

    def __init__(self, kernel: Kernel | None = None, likelihood: Probit | Step | Logistic | None = None, *,
                 schedule: Literal["blocked", "sequential", "parallel"] = "blocked",
                 order: Literal["fixed", "random", "entropy"] = "fixed", damping: float | None = None,
                 tol: float = 1e-4, max_sweeps: int = 200, block_size: int | None = None,
                 refresh_every: int | None = None, negative_precision: Literal["clip", "skip"] = "clip",
                 optimizer: Literal["L-BFGS-B"] | None = "L-BFGS-B", n_restarts_optimizer: int = 0,
                 learn_likelihood: bool = False, jitter: float = 0.0, random_state: int | None = None,
                 warm_start: bool = True, n_jobs: int | None = None,
                 multi_class: Literal["one_vs_rest", "multinomial"] = "one_vs_rest",
                 hyperprior: Hyperprior = "auto", verbose: int = 0,
                 callback: Callback = None, refactor_every: int | None | Literal["deprecated"] = "deprecated") -> None:
        self._set_init_params(locals())

    def _set_fitted(self, X, problems, classes):
        self.classes_ = classes
        super()._set_fitted(X, problems, classes)
        if self._multinomial():
            self.likelihood_ = "multinomial_probit"

    def _check_fit_arguments(self, X, y):
        """``(X, problems, n_jobs, classes)``: the estimator's parameters and the data validated, the
        unfitted problems (one per class one-vs-rest, or one multinomial problem), the ``n_jobs`` to
        fit them with and the sorted class labels."""
        options = self._fit_options()
        v.check_choice(self.multi_class, "multi_class", ("one_vs_rest", "multinomial"))
        kernel = check_kernel(self.kernel)
        likelihood, learn_likelihood = check_classifier_likelihood(self.likelihood, self.learn_likelihood)
        if self.multi_class == "multinomial":
            if not likelihood == Probit() or learn_likelihood:
                raise ValueError("multi_class='multinomial' uses the multinomial probit likelihood: leave "
                                 f"likelihood at its default and learn_likelihood=False (got {self.likelihood!r}, "
                                 f"learn_likelihood={self.learn_likelihood!r})")
            if self.damping is None:
                options = options.replace(damping=ADAPTIVE_DAMPING_START, adaptive_damping=True)
        X, y = v.check_X_y(X, y)
        classes, targets = v.encode_one_vs_rest_labels(y)
        self._check_memory(X, len(targets), classes.shape[0] if self.multi_class == "multinomial" else 0)
        kernel = start_kernel(kernel, X)
        kernel._validate_X(X, "X")
        if self.multi_class == "multinomial":
            labels = np.searchsorted(classes, y).astype(np.int32) if classes.dtype != object else \
                np.array([int(np.flatnonzero(classes == label)[0]) for label in y], dtype=np.int32)
            # one problem, fitted as it is (n_jobs does not apply)
            return X, [MultinomialGPProblem(kernel, X, labels, classes.shape[0], options)], None, classes
        problem_class = _PROBLEMS[likelihood.ep_variant]
        return (X, [problem_class(kernel, likelihood, X, t, options, learn_likelihood) for t in targets], self.n_jobs,
                classes)

    def _multinomial(self) -> bool:
        return isinstance(self._problems[0], MultinomialGPProblem)

    def _multinomial_means(self, X):
        return self._problems[0].latent(X)[0]


class GaussianProcessRegressor(GPRegressorMixin, _GPEPBase):
    __doc__ = fill_doc("""Gaussian-process regression through EP: Gaussian noise (exact), or Student-t noise (robust).

    With ``p(y_i | f_i) = N(y_i; f_i, noise_variance)`` (the default) EP's fixed point (reached in
    one sweep) is the exact posterior, and its log marginal likelihood is
    ``log N(y; 0, K + σ² I)``: this is ordinary GP regression, computed by the same engine
    and API as :class:`GaussianProcessClassifier` (and a check of that engine).

    With ``likelihood=StudentT(...)`` (or ``"student_t"``) the noise is Student-t, whose heavy
    tails keep gross outliers from dragging the fit (Jylänki, Vanhatalo & Vehtari 2011). The
    likelihood is not log-concave, so EP's sites may get negative precisions; the fit runs
    damped parallel *fractional* EP (power η = ``power``, 0.5 by default, the paper's robust
    choice; eqs 11-14) in :mod:`fastep._epcore.student_t_ep`, which keeps the posterior
    ``(K⁻¹ + T)⁻¹`` proper by halving a step that would break it. If it stalls or does not
    converge, the fit continues with the convergent double-loop algorithm (the paper's §4.2;
    Heskes & Zoeter 2002). ν and σ are learnt with the kernel (``learn_noise``) from the
    fractional EP evidence and its exact gradient.

    Parameters
    ----------
    kernel : fastep.kernels.Kernel or None, default None
        Prior covariance; its ``theta`` is the optimiser's starting point. None starts from
        ``RBF(var(y), γ) + Bias(mean(y)²)``, γ = 1 / (median squared distance between the training
        inputs, over a seeded sample of at most 1000 rows); a kernel given here is the start as it
        is.
        %MIXED_UNITS%
    noise_variance : float > 0 or None, default None
        Variance σ² of the Gaussian noise (the starting point when learnt); None starts from var(y) / 10.
    likelihood : None, 'gaussian', 'student_t', Gaussian or StudentT, default None
        The noise model. None or ``'gaussian'``: Gaussian with ``noise_variance``.
        ``'student_t'``: ``StudentT(dof=4, scale=sqrt(noise_variance))``, with ``noise_variance``
        var(y) / 10 unless given: a start from the targets' scale. A likelihood object is the start as it is (then ``noise_variance`` must be None).
    power : float in (0, 1] or None, default None
        Fractional EP's power η for the Student-t likelihood (None: 0.5; 1 is standard EP, which
        may fail to converge on outlier-heavy data). Not used with Gaussian noise.
    learn_noise : bool, default True
        Learn the noise model with the kernel hyperparameters (when ``optimizer`` is set): σ², or
        the Student-t's ν and σ.
    %EP_PARAMS%
        With a Student-t likelihood EP always runs the damped parallel schedule: ``schedule``,
        ``order``, ``block_size``, ``refresh_every`` and ``negative_precision`` do not apply,
        ``damping`` (None: 0.5) is the first step of every iteration, the double-loop fallback
        runs up to ``5 * max_sweeps`` outer iterations, and a kernel matrix that is numerically
        singular gets up to ``1e-6`` (relative) extra jitter.

    Attributes
    ----------
    %REGRESSOR_ATTRIBUTES%
    %EP_ATTRIBUTES%

    References
    ----------
    Rasmussen, C. E. and Williams, C. K. I. *Gaussian Processes for Machine Learning*
    (MIT Press, 2006), §2.2 and §5.4 (predictive and log marginal likelihood).
    Jylänki, P., Vanhatalo, J. and Vehtari, A. *Robust Gaussian process regression with a
    Student-t likelihood*, JMLR 12 (2011), §§3-4 (fractional EP, its evidence and gradients).
    Heskes, T. and Zoeter, O. *Expectation propagation for approximate inference in dynamic
    Bayesian networks*, UAI 2002, §4 (the double-loop algorithm).

    %EXAMPLES%
    >>> X = rng.uniform(-3, 3, size=(60, 1))
    >>> y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=60)
    >>> reg = GaussianProcessRegressor().fit(X, y)
    >>> mean, std = reg.predict([[0.5]], return_std=True)
    >>> bool(abs(mean[0] - np.sin(0.5)) < 0.2), bool(0.0 < std[0] < 0.5)
    (True, True)

    Five gross outliers barely move the Student-t fit:

    >>> y_bad = y.copy()
    >>> y_bad[:5] += 8.0
    >>> robust = GaussianProcessRegressor(likelihood="student_t").fit(X, y_bad)
    >>> bool(abs(robust.predict([[0.5]])[0] - np.sin(0.5)) < 0.2)
    True
    """, EXAMPLES=EXAMPLES_DOC, ESTIMATOR="GaussianProcessRegressor", EP_PARAMS=_EP_PARAMS,
        EP_ATTRIBUTES=_EP_ATTRIBUTES, REGRESSOR_ATTRIBUTES=REGRESSOR_ATTRIBUTES, MIXED_UNITS=MIXED_UNITS_DOC)

    noise_variance: float | None
    likelihood: Literal["gaussian", "student_t"] | Gaussian | StudentT | None
    power: float | None
    learn_noise: bool
    kernel_: Kernel
    likelihood_: Gaussian | StudentT

    def __init__(self, kernel: Kernel | None = None, noise_variance: float | None = None, *,
                 likelihood: Literal["gaussian", "student_t"] | Gaussian | StudentT | None = None,
                 power: float | None = None, learn_noise: bool = True,
                 schedule: Literal["blocked", "sequential", "parallel"] = "blocked",
                 order: Literal["fixed", "random", "entropy"] = "fixed", damping: float | None = None,
                 tol: float = 1e-4, max_sweeps: int = 200, block_size: int | None = None,
                 refresh_every: int | None = None, negative_precision: Literal["clip", "skip"] = "clip",
                 optimizer: Literal["L-BFGS-B"] | None = "L-BFGS-B", n_restarts_optimizer: int = 0,
                 jitter: float = 0.0, random_state: int | None = None, warm_start: bool = True,
                 hyperprior: Hyperprior = "auto", verbose: int = 0,
                 callback: Callback = None, refactor_every: int | None | Literal["deprecated"] = "deprecated") -> None:
        self._set_init_params(locals())

    def _set_fitted(self, X, problems, classes):
        super()._set_fitted(X, problems, classes)
        self.noise_variance_ = float(problems[0].likelihood.noise_variance)

    def _check_fit_arguments(self, X, y):
        """``(X, [problem], None, None)``: the estimator's parameters and the data validated, and the
        unfitted problem of the noise model's EP variant (as :meth:`_GPEPBase._check_fit_arguments`)."""
        options = self._fit_options()
        kernel = check_kernel(self.kernel)
        noise_class, noise = resolve_noise_model(self.likelihood, self.noise_variance)
        fractional = noise_class.ep_variant == "fractional"
        if self.power is not None and not fractional:
            raise ValueError(f"power applies to the Student-t likelihood only; got power={self.power!r} "
                             f"with {self.likelihood!r}")
        if fractional:
            power = None if self.power is None else v.check_in_range(self.power, "power", 0.0, 1.0,
                                                                     low_inclusive=False)
            options = use_fractional_ep(options, noise_class, power, self.damping)
        gaussian, learn_noise, X, y, kernel = self._check_regression_inputs(X, y, kernel)
        self._check_memory(X, 1, 0, fractional)
        likelihood = noise_class.from_noise_variance(gaussian.noise_variance) if noise is None else noise
        return X, [_PROBLEMS[likelihood.ep_variant](kernel, likelihood, X, y, options, learn_noise)], None, None
