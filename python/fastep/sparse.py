"""Sparse Gaussian-process classification and regression by EP with inducing inputs (EP-FITC, EP-DTC, power EP).

The compiled engine :mod:`fastep._epcore.sparse_ep` runs the EP sweeps in O(nm²) time and
O(nm) memory; this module validates input, initialises the inducing inputs, evaluates the
kernel blocks, computes the exact evidence gradient with respect to the kernel and
likelihood hyperparameters and the inducing inputs Z, learns them with L-BFGS-B and predicts
through q(u | y).  Equations: the tutorial slides *Expectation Propagation for Gaussian
processes* ("Sparse EP", "EP-FITC", "EP-DTC", "EP variants"); derivations in
:mod:`fastep.reference.sparse_ep`.

Model
-----
``u = f(Z) ~ N(0, K_mm)``, ``L = chol(K_mm + jitter I)``, ``v_i = L⁻¹ k_m(x_i)``; the prior of
the training latents is ``Q + diag(K - Q)`` (``approximation='fitc'``) or ``Q``
(``'dtc'``), ``Q = K_nm K_mm⁻¹ K_mn`` (slide "Sparse EP").  Sites act on u (slide "EP-FITC");
``power`` α < 1 runs power EP (α = 1: EP-FITC / EP-DTC; α → 0 approaches the variational
bound, slide "EP variants").

Evidence gradient
-----------------
Exact, O(nm²), from the sites at the EP fixed point: :mod:`fastep._sparse.problem`.

Prediction (O(m) for the mean, O(m²) for the variance per test point)
--------------------------------------------------------------------
``q(f* | y) = ∫ p(f* | u) q(u | y) du`` (slide "EP-FITC"): with ``p = L⁻¹ k_m(x*)``,
``E f* = pᵀ μ_w = k_m(x*)ᵀ (L⁻ᵀ μ_w)`` and ``Var f* = k(x*, x*) - |p|² + |R⁻ᵀ p|²``.

Jitter policy: ``jitter`` (absolute, default 1e-6) is added to the diagonal of K_mm before
its Cholesky factorisation; a failure raises ``numpy.linalg.LinAlgError`` asking for more.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._sparse import distributed as _chunked
from . import _validation as v
from ._base import EXAMPLES_DOC, fill_doc, records_feature_names
from ._gp.docs import (CLASSIFIER_ATTRIBUTES, EP_RUN_ATTRIBUTES, HYPERPRIOR_DOC, LEARNING_ATTRIBUTES,
                       MIXED_UNITS_DOC, N_JOBS_DOC, REGRESSOR_ATTRIBUTES)
from ._gp.estimator import GPClassifierMixin, GPRegressorMixin, MultinomialClassifierMixin
from ._gp.options import check_classifier_likelihood, check_noise_variance, start_kernel, use_fractional_ep
from ._search.start import default_noise_variance
from .progress import CALLBACK_DOC
from ._sparse.inducing import auto_sizes, kmeans_plus_plus
from ._sparse import multinomial as _multinomial
from .batch import map_in_order
from .kernels.base import check_kernel
from .likelihoods import Gaussian, Probit, StudentT
from .likelihoods.checks import resolve_noise_model

from ._sparse.estimator import (_kmeans_sample, _SparseGPBase)
from ._sparse.chunked_predict import _ChunkedClassifierMixin, _ChunkedRegressorMixin

if TYPE_CHECKING:
    from typing import Any, Literal

    from numpy.typing import ArrayLike
    from typing_extensions import Self

    from ._typing import Callback, Hyperprior
    from .kernels import Kernel
    from .likelihoods import Likelihood, Logistic, Step

__all__ = ["SparseGPClassifier", "SparseGPRegressor", "kmeans_plus_plus", "auto_sizes"]

_INDUCING_PARAMS = """n_inducing : int or 'auto', default 'auto'
        Number m of inducing inputs when ``inducing_init`` is a string; a value above
        n_samples is clipped to n_samples (every training input is then a candidate, and
        ``'random'`` and ``'ivm'`` take each training input once). ``'auto'`` chooses m from
        the data: the model is learnt at m = 64, then m is doubled, with new inducing inputs
        from ``inducing_init`` (the IVM's selection at the kernel learnt so far for
        ``'ivm'``) and the search started from the previous size's hyperparameters and sites
        (the hyperprior stays centred at the start), while a doubling raises the EP log
        marginal likelihood by at least 0.01 nats per training point; the size with the
        larger evidence of the last doubling is kept. m stays at most
        ``min(n_samples, 1024)`` and at most the m whose n × m projection takes 1 GiB
        (:func:`auto_sizes`); in core, growth also stops (with a warning) before a size whose
        estimated working memory exceeds the memory available (``FASTEP_MAX_MEMORY``, see
        :class:`~fastep.MemoryLimitError`). On a dask array the k-means++ inputs of every size come from
        the same seeded sample of rows (``inducing_init``). Ignored when ``inducing_init``
        is an array.
    approximation : {'fitc', 'dtc'}, default 'fitc'
        Prior of the training latents: ``Q + diag(K - Q)`` (EP-FITC, the "generalized FITC"
        of Naish-Guzman & Holden) or ``Q`` (EP-DTC); slides "Sparse EP", "EP-FITC", "EP-DTC"."""

_POWER_EP = """Power-EP α (slide "EP variants"): 1 is plain EP; α -> 0 approaches the variational
    (Titsias) bound. For α < 1 the likelihood needs a pointwise log density (probit with a
    finite slope, logistic, Gaussian); non-Gaussian sites then use Gauss-Hermite quadrature
    with ``n_quadrature`` nodes."""

_COMMON_PARAMS = fill_doc(
    """inducing_init : {'auto', 'kmeans++', 'random', 'ivm'} or array-like (m, n_features), default 'auto'
        ``'auto'``: ``'ivm'`` for a classifier fitted in core, ``'kmeans++'`` for a regressor
        and on a dask array (the cluster's rows are not selected from one by one). Otherwise
        seeded k-means++ (seeding plus 10 Lloyd steps, :func:`kmeans_plus_plus`), a seeded
        random subset of the training inputs, the active set of an IVM selection, or explicit
        inducing inputs (then ``n_inducing`` is ignored). For classification the points near
        the decision boundary carry the evidence, and the selection finds them where k-means++
        spreads its inputs over the whole input space. ``'ivm'`` takes the m training
        inputs that the Informative Vector Machine includes greedily
        (:func:`fastep.ivm.select_active_set`: Algorithm 1, each inclusion maximising the
        entropy reduction of the ADF posterior, eq 26) under the estimator's initial kernel
        and likelihood (for regression: the initial ``noise_variance`` and a zero offset).
        Rows are in inclusion order. One-vs-rest, each binary problem starts from its own
        selection. O(m² n) time, O(m n) memory per problem; the kernel must have a positive
        diagonal on X.
    learn_inducing : bool or 'auto', default 'auto'
        Also learn the inducing inputs by type-II ML (exact gradient; ``m · n_features`` more
        parameters). ``'auto'``: not in full-batch learning (the chosen inputs already cover
        the data, and learning them costs many more optimiser iterations: hundreds at m = 50
        on a 2-D toy of n = 2000, for a similar test error); in minibatch learning, in the
        second stage only (see ``learning``), where they start from k-means++ in the learnt
        metric, with a third of the step, when the kernel has input gradients. ``True``:
        learnt from the start in either mode; ``False``: never.
    schedule : {'sequential', 'parallel'}, default 'sequential'
        One site at a time (O(m²) per site, rank-1 Cholesky updates) or every site from the
        same posterior (damped; O(nm²) per iteration).
    order : {'fixed', 'random'}, default 'fixed'
        Site order of the sequential schedule (random: a seeded permutation per sweep).
    damping : float in (0, 1] or None, default None
        None means 1 for 'sequential' and 0.5 for 'parallel'.
    tol : float, default 1e-6
        Convergence threshold on the relative site change and the relative change of log Z.
    max_sweeps : int, default 200
        Sweeps before EP gives up (with a :class:`~fastep.ConvergenceWarning`).
    negative_precision : {'clip', 'skip'}, default 'clip'
        Policy for negative site precisions: clip to 0 keeping the tilted mean matched, or
        skip the update.
    n_quadrature : int in [1, 256], default 32
        Gauss-Hermite nodes of the powered site moments (power < 1, non-Gaussian likelihoods).
    optimizer : 'L-BFGS-B' or None, default 'L-BFGS-B'
        None keeps the hyperparameters and the inducing inputs fixed.
    n_restarts_optimizer : int >= 0, default 0
        Extra optimiser starts at ``theta0 + N(0, I)`` (in the search's log coordinates),
        seeded by ``random_state``.
    %HYPERPRIOR%
    jitter : float >= 0, default 1e-6
        Added to the diagonal of K_mm (absolute).
    random_state : int or None, default None
        Seed of the inducing-input initialisation, the random site order and the restarts
        (None: 0).
    warm_start : bool, default True
        Start each EP run of the optimiser from the previous evaluation's sites (a warm start
        that fails is retried from zero sites). Every ``fit`` starts afresh; to continue
        learning from minibatches from the previous fit, call :meth:`continue_fit`.
    learning : {'auto', 'full-batch', 'minibatch'}, default 'auto'
        How the hyperparameters are learnt. ``'full-batch'``: L-BFGS-B on the exact EP
        evidence, every evaluation EP over all n points (O(nm) memory). ``'minibatch'``:
        minibatch EP with tied sites (stochastic EP; Li, Hernández-Lobato and Turner 2015)
        interleaved with Adam steps on an unbiased minibatch estimate of the evidence
        gradient (Hernández-Lobato and Hernández-Lobato 2016), O(m² + n) memory, no n × m
        array; learning stops when the running leave-one-out log loss stops improving
        (module :mod:`fastep._sparse.stochastic`). With ``kernel=None`` the minibatch mode
        starts from an RBF with a learnt relevance per input (:class:`~fastep.kernels.RBFARD`),
        which sets irrelevant inputs aside (up to 32 inputs; the isotropic default above), and
        ``n_inducing='auto'`` is m = 256 chosen by k-means++ on a seeded sample of
        max(20 000, 50 m) rows. When an ARD RBF kernel was learnt with inducing inputs chosen
        by k-means++ (``inducing_init`` 'auto' or 'kmeans++', ``learn_inducing`` not True), they are
        then chosen again by k-means++ in the inputs scaled by the learnt inverse
        length-scales, where irrelevant inputs no longer spread them, and learning continues
        there from the learnt parameters (sites afresh), the inducing inputs learnt too with
        ``learn_inducing='auto'``; that second fit is kept when its best window's running log
        loss is at least as low as the first's. ``'auto'``: minibatch from
        ``MINIBATCH_MIN_ROWS`` = 50 000 training rows on (not for a Student-t likelihood), else
        full-batch (the same rule for a dask ``X``). ``X`` may then be a ``numpy.memmap`` or a
        dask array: it is read in chunks of 65 536 rows, each chunk once per pass (a dask
        array's chunks are computed on its cluster, the next while the current one is used,
        and the updates run on the driver, which holds O(m²) plus one chunk); for one
        ``random_state`` the three give the same fit.
    batch_size : int >= 1, default 512
        Points per minibatch (``learning='minibatch'``).
    learning_rate : float > 0, default 0.03
        Adam's step in the search coordinates (logs of the positive hyperparameters, and the
        inducing inputs in the units of X when they are learnt) (``learning='minibatch'``);
        a third of it in the second stage that learns the inducing inputs
        (``learn_inducing='auto'``).
    max_epochs : int >= 1, default 20
        Passes over the data after which minibatch learning stops in any case.
    sites : {'tied', 'per-point'}, default 'tied'
        Minibatch EP's sites: one tied site for all points (O(m²) memory) or one per point
        (O(n) memory; with one minibatch of all the data, full-batch EP's parallel schedule).
    %CALLBACK%""", HYPERPRIOR=HYPERPRIOR_DOC, CALLBACK=CALLBACK_DOC)

_COMMON_ATTRIBUTES = fill_doc("""log_marginal_likelihood_value_ : float
        EP log marginal likelihood at the fitted parameters (summed over one-vs-rest problems).
    inducing_inputs_ : ndarray (m, n_features) or (n_classes, m, n_features)
        The inducing inputs Z (one-vs-rest: a list of arrays when ``n_inducing='auto'`` chose
        different sizes for different classes).
    n_inducing_ : int or ndarray (n_classes,)
        m, the number of inducing inputs of the fitted model.
    learning_ : {'full-batch', 'minibatch'}
        How the model was learnt (``learning``). A minibatch fit's
        ``log_marginal_likelihood_value_`` is an estimate from a seeded sample of 20 000 rows,
        ``n_sweeps_`` counts passes over the data and ``n_evaluations_`` hyperparameter steps.
    growth_history_ : list of dict or None (a list of them per class one-vs-rest)
        ``n_inducing='auto'``: one record per size tried (n_inducing, log_marginal_likelihood,
        n_evaluations); None otherwise.
    %LEARNING%
    site_precision_, site_natural_mean_ : ndarray (n_samples,) or (n_classes, n_samples), or None
        The EP sites on the projections of u (:mod:`fastep._epcore.sparse_ep`); None for a
        minibatch fit with tied sites.
    %EP_RUN%
    n_features_in_ : int
        Number of features seen in ``fit``.""", LEARNING=LEARNING_ATTRIBUTES, EP_RUN=EP_RUN_ATTRIBUTES)

#: The end of the sparse estimators' ``fit`` docstrings: the cluster of a dask ``X``, and what ``fit`` returns.
_CLIENT_DOC = """client : dask.distributed.Client, optional
        The cluster for a dask ``X`` (default: the current client).

    Returns
    -------
    self"""

_REFERENCES = """Naish-Guzman, A. and Holden, S. *The generalized FITC approximation* (NIPS 2007).
    Snelson, E. and Ghahramani, Z. *Sparse Gaussian processes using pseudo-inputs* (NIPS 2005).
    Bui, T. D., Yan, J. and Turner, R. E. *A unifying framework for Gaussian process
    pseudo-point approximations using power expectation propagation* (JMLR 2017).
    The tutorial slides *Expectation Propagation for Gaussian processes*: "Sparse EP",
    "EP-FITC", "EP-DTC", "EP variants"."""


class SparseGPClassifier(MultinomialClassifierMixin, _ChunkedClassifierMixin, GPClassifierMixin, _SparseGPBase):
    __doc__ = fill_doc(
        """Gaussian-process classifier fitted by sparse EP with inducing inputs (EP-FITC, EP-DTC, power EP).

    The API of :class:`fastep.GaussianProcessClassifier` (one-vs-rest for more than two
    classes) at O(nm²) time and O(nm) memory per EP run and per evidence gradient, for m
    inducing inputs ``Z``. The kernel hyperparameters and Z are learnt together by L-BFGS-B
    with the exact gradient of the EP log marginal likelihood (module :mod:`fastep.sparse`).
    Predictions go through q(u | y): O(m) per test point for the mean, O(m²) for the variance.

    Parameters
    ----------
    kernel : fastep.kernels.Kernel or None, default None
        Prior covariance. With an optimiser it must provide ``cross_gradient_iter`` and
        ``diag_gradient`` (and ``input_gradient`` to learn Z); every kernel of
        :mod:`fastep.kernels` and their sums and products do. None starts from ``RBF(1, γ)``,
        γ = 1 / (median squared distance between the training inputs, over a seeded sample of
        at most 1000 rows), so that inputs of any scale give a kernel whose evidence can be
        learnt; a kernel given here is the start as it is.
        %MIXED_UNITS%
    likelihood : Probit, Step or Logistic, default Probit()
        The binary site model.
    %INDUCING_PARAMS%
    power : float in (0, 1], default 1.0
        %POWER_EP%
    %COMMON_PARAMS%
    learn_likelihood : bool, default False
        Also learn the likelihood's parameters (power = 1 only).
    %N_JOBS%
    multi_class : {'one_vs_rest', 'multinomial'}, default 'one_vs_rest'
        More than two classes: one binary sparse GP per class, each with its own inducing
        inputs and hyperparameters (probabilities normalised to sum to one), or one joint
        model: c latent GPs with one kernel and one set of m inducing inputs, under the
        multinomial probit likelihood (Riihimäki, Jylänki & Vehtari, "Nested expectation
        propagation for Gaussian process classification with a multinomial probit
        likelihood", JMLR 2013), fitted by sparse nested EP whose posterior over the c m
        inducing values couples the classes (module :mod:`fastep._sparse.multinomial`).
        With two classes it is the binary probit model; with Z the training inputs (DTC), the
        dense :class:`GaussianProcessClassifier` ``(multi_class='multinomial')``. It needs
        the default likelihood, ``power=1`` and in-core X; EP runs the damped parallel
        schedule (``damping`` None: adaptive, starting at 0.9). One outer iteration costs
        O(c² m² n + c³ m³) time and O(c² m² + c m n) memory: ``n_inducing='auto'`` keeps
        c m <= 3072 and stops before a size whose outer iteration costs more than the dense
        model's (about 4 c n³ flops), and ``learning='auto'`` learns from minibatches (tied sites, O(c² m²)
        memory at any n) from 5 555 training rows on (the binary threshold scaled by the cost
        of an outer iteration), with m = 1024 / c by default (at least 32, at most 256). ``inducing_init='auto'``
        (full-batch) selects the inducing inputs with the IVM in every class's one-vs-rest
        problem at an equal share of m; minibatch learning places them by k-means++.
        ``site_precision_`` and ``site_natural_mean_`` are then nested EP's outer sites
        π and ν̃, each (n_classes, n_samples).

    Attributes
    ----------
    %CLASSIFIER_ATTRIBUTES%
    %COMMON_ATTRIBUTES%

    See Also
    --------
    GaussianProcessClassifier : dense EP, O(n³).
    IVMClassifier : sparse GP classification by greedy active-set selection.

    References
    ----------
    %REFERENCES%

    %EXAMPLES%
    >>> X = rng.normal(size=(200, 2))
    >>> y = (X[:, 0] ** 2 + X[:, 1] ** 2 < 1.5).astype(int)
    >>> clf = SparseGPClassifier(n_inducing=10, learn_inducing=False, random_state=0).fit(X, y)
    >>> clf.inducing_inputs_.shape
    (10, 2)
    >>> clf.predict([[0.0, 0.0], [3.0, 3.0]]).tolist()
    [1, 0]
    """, EXAMPLES=EXAMPLES_DOC, ESTIMATOR="SparseGPClassifier", MIXED_UNITS=MIXED_UNITS_DOC,
        INDUCING_PARAMS=_INDUCING_PARAMS, POWER_EP=_POWER_EP, COMMON_PARAMS=_COMMON_PARAMS, N_JOBS=N_JOBS_DOC,
        CLASSIFIER_ATTRIBUTES=CLASSIFIER_ATTRIBUTES, COMMON_ATTRIBUTES=_COMMON_ATTRIBUTES,
        REFERENCES=_REFERENCES)

    _informative_selection = True
    likelihood: Probit | Step | Logistic | None
    power: float
    learn_likelihood: bool
    n_jobs: int | None
    multi_class: Literal["one_vs_rest", "multinomial"]
    kernel_: Kernel | list[Kernel]
    likelihood_: Likelihood | list[Likelihood]

    def __init__(self, kernel: Kernel | None = None, likelihood: Probit | Step | Logistic | None = None, *,
                 n_inducing: int | Literal["auto"] = "auto", approximation: Literal["fitc", "dtc"] = "fitc",
                 power: float = 1.0, inducing_init: Literal["auto", "kmeans++", "random", "ivm"] | ArrayLike = "auto",
                 learn_inducing: bool | Literal["auto"] = "auto",
                 schedule: Literal["sequential", "parallel"] = "sequential",
                 order: Literal["fixed", "random"] = "fixed",
                 damping: float | None = None, tol: float = 1e-6,
                 max_sweeps: int = 200, negative_precision: Literal["clip", "skip"] = "clip", n_quadrature: int = 32,
                 optimizer: Literal["L-BFGS-B"] | None = "L-BFGS-B", n_restarts_optimizer: int = 0,
                 learn_likelihood: bool = False, jitter: float = 1e-6, random_state: int | None = None,
                 warm_start: bool = True, n_jobs: int | None = None,
                 hyperprior: Hyperprior = "auto",
                 learning: Literal["auto", "full-batch", "minibatch"] = "auto", batch_size: int = 512,
                 learning_rate: float = 0.03, max_epochs: int = 20,
                 sites: Literal["tied", "per-point"] = "tied",
                 multi_class: Literal["one_vs_rest", "multinomial"] = "one_vs_rest", verbose: int = 0,
                 callback: Callback = None) -> None:
        self._set_init_params(locals())

    @records_feature_names
    def fit(self, X: ArrayLike, y: ArrayLike, client: Any = None) -> Self:
        """Fit the sparse EP posterior (and the hyperparameters and Z unless ``optimizer=None``).

        Parameters
        ----------
        X : array-like (n_samples, n_features), or dask.array.Array
            A dask array (chunked by rows) that learns from minibatches (``learning``) is read
            a chunk at a time to this process. Otherwise it is fitted where its chunks live,
            on the workers of a Dask cluster, by the map-reduce form of the parallel schedule:
            each chunk keeps
            its rows of K(X, Z), its FITC diagonal and its sites; every EP iteration sends
            the m x m posterior to the chunks and sums their m x m contributions, and so do
            the evidence and its gradient. Needs ``schedule='parallel'`` and the ``dask``
            extra; ``site_precision_`` and ``site_natural_mean_`` are then dask arrays that
            stay on the cluster.
        y : array-like (n_samples,), or dask.array.Array
            Class labels (any sortable values; two or more classes).
        %CLIENT%
        """
        options = self._fit_options()
        if getattr(self, "_continuing", False):
            options = options.replace(learning="minibatch")
        kernel = check_kernel(self.kernel)
        v.check_choice(self.multi_class, "multi_class", ("one_vs_rest", "multinomial"))
        if self.multi_class == "multinomial":
            return self._fit_multinomial(X, y, client, kernel, options)
        likelihood, learn_likelihood = check_classifier_likelihood(self.likelihood, self.learn_likelihood)
        self._check_fit_options(options, kernel, likelihood, learn_likelihood)
        on_cluster = client is not None or _chunked.is_dask_array(X)
        if on_cluster and not self._dask_learns_from_minibatches(X, options, likelihood):
            classes, X, problems = self._fit_chunked(X, y, client, kernel, likelihood, options,
                                                     learn_likelihood, classifier=True)
        else:
            if on_cluster:
                X, y = self._driver_rows(X, y, client)
            else:
                X, y = v.check_X_y(X, y)
            classes, targets = v.encode_one_vs_rest_labels(y)
            previous = None
            if self._learns_from_minibatches(X.shape[0], options, likelihood):
                options = options.replace(minibatch=True, n_features=X.shape[1])
                previous = self._previous_minibatch_fits(X, options, len(targets), classes)
                kernel = previous[0].kernel if previous else self._minibatch_start(kernel, X)
            else:
                kernel = start_kernel(kernel, X)
            kernel._validate_X(X[:1], "X")        # X itself is validated above (a dask X as it is read)
            self._check_kernel_gradients(kernel, X, self._learns_inducing())
            Zs = ([p.Z for p in previous] if previous
                  else self._inducing_inputs(X, options, kernel, likelihood, targets))
            options = options.replace(n_problems=len(targets))
            self._check_memory(X.shape[0], Zs[0].shape[0], options)
            starts = previous or [None] * len(targets)
            problems = map_in_order(
                lambda job: self._fit_one(X, job[0], job[1], kernel, likelihood, options, learn_likelihood,
                                              start=job[2]),
                list(zip(targets, Zs, starts)), self.n_jobs)
        self.classes_ = classes
        self._set_fitted(X, problems)
        return self

    fit.__doc__ = fill_doc(fit.__doc__, CLIENT=_CLIENT_DOC)  # type: ignore[arg-type]  # it has a docstring

    def _fit_multinomial(self, X, y, client, kernel, options):
        """``multi_class='multinomial'``: one joint problem of c latent GPs sharing the inducing
        inputs (:mod:`fastep._sparse.multinomial`)."""
        if not (self.likelihood is None or self.likelihood == Probit()) or self.learn_likelihood:
            raise ValueError("multi_class='multinomial' uses the multinomial probit likelihood: leave likelihood "
                             f"at its default and learn_likelihood=False (got {self.likelihood!r}, "
                             f"learn_likelihood={self.learn_likelihood!r})")
        if options.power != 1.0:
            raise ValueError(f"multi_class='multinomial' runs plain EP: power must be 1.0, got {self.power!r}")
        if client is not None or _chunked.is_dask_array(X):
            raise ValueError("multi_class='multinomial' fits in-core data (an array or a numpy.memmap), "
                             "not a dask array")
        if self.damping is None:
            options = options.replace(damping=_multinomial.ADAPTIVE_DAMPING_START, adaptive_damping=True)
        if getattr(self, "_continuing", False):
            raise ValueError("continue_fit is not available with multi_class='multinomial'; call fit")
        X, y = v.check_X_y(X, y)
        classes, labels = v.encode_class_indices(y)
        n_classes = classes.shape[0]
        options = options.replace(n_classes=n_classes)
        minibatch = self._learns_from_minibatches(X.shape[0], options, None,
                                                  min_rows=_multinomial.MINIBATCH_MIN_ROWS)
        if minibatch:
            options = options.replace(minibatch=True, n_features=X.shape[1])
            kernel = self._minibatch_start(kernel, X)
        else:
            kernel = start_kernel(kernel, X)
        kernel._validate_X(X[:1], "X")
        self._check_kernel_gradients(kernel, X, self._learns_inducing())
        m = None
        if isinstance(self.inducing_init, str):
            if self._grows():
                m = (_multinomial.minibatch_size(n_classes) if minibatch
                     else _multinomial.first_size(X.shape[0], n_classes))
            else:
                m = v.check_int(self.n_inducing, "n_inducing", minimum=1)
            m = min(m, X.shape[0])
        Z = self._multinomial_inducing_inputs(X, labels, n_classes, options, kernel, m, minibatch)
        # the posterior's (c m)² matrices are what grows with c: plan with c m inducing values
        self._check_memory(X.shape[0], n_classes * Z.shape[0], options)
        learn_inducing = self._learns_inducing()
        if minibatch:
            problem = self._fit_minibatch(X, labels, Z, kernel, None, options, False)
            problem.likelihood = "multinomial_probit"
            self.classes_ = classes
            self._set_fitted(X, [problem])
            return self

        def make_problem(Z):
            return _multinomial.MultinomialSparseProblem(kernel, Z, X, labels, n_classes, options, learn_inducing)

        def choose(m, fitted):
            return self._multinomial_inducing_inputs(X, labels, n_classes, options, fitted.kernel, m)

        problem = self._fit_growing(make_problem, choose, Z, options,
                                    sizes=_multinomial.auto_sizes(X.shape[0], n_classes))
        problem.likelihood = "multinomial_probit"
        problem.estimator_name = type(self).__name__
        self.classes_ = classes
        self._set_fitted(X, [problem])
        return self

    def _multinomial_inducing_inputs(self, X, labels, n_classes, options, kernel, m, minibatch=False):
        """Inducing inputs of the joint model: ``inducing_init='ivm'``, and ``'auto'`` in full-batch
        learning, select in every class's one-vs-rest problem with a share of the budget
        (:func:`fastep._sparse.multinomial.select_across_classes`); the other choices are those of the
        binary model (``'auto'`` in minibatch learning is k-means++)."""
        init = self.inducing_init
        if isinstance(init, str) and (init == "ivm" or (init == "auto" and not minibatch)):
            return _multinomial.select_across_classes(X, labels, n_classes, kernel, m, seed=options.seed)
        if isinstance(init, str) and init == "auto":
            rng = np.random.default_rng(options.seed)
            return np.ascontiguousarray(kmeans_plus_plus(_kmeans_sample(X, m, rng), m, rng))
        return self._inducing_inputs(X, options, kernel, Probit(), [labels], m=m)[0]

    def _multinomial(self) -> bool:
        return bool(getattr(self, "_problems", None)) and isinstance(getattr(self._problems[0], "predictor", None),
                                                                     _multinomial.MultinomialSparsePredictor)

    def _multinomial_means(self, X):
        return self._problems[0].predictor.latent_full(X)[0]


class SparseGPRegressor(_ChunkedRegressorMixin, GPRegressorMixin, _SparseGPBase):
    __doc__ = fill_doc("""Sparse GP regression (FITC, DTC or power EP) with Gaussian or Student-t noise.

    With Gaussian noise, at the fixed point (one sweep) the evidence is the closed-form FITC
    ``log N(y; 0, Q + diag(K - Q) + σ²I)``, DTC ``log N(y; 0, Q + σ²I)`` or, for power α,
    ``log N(y; 0, Q + α diag(K - Q) + σ²I) - (1-α)/(2α) Σ log(1 + α d_i/σ²)`` (α → 0 gives
    the variational bound), with ``Q = K_nm K_mm⁻¹ K_mn`` and ``d = diag(K - Q)``.

    With ``likelihood=StudentT(...)`` (or ``'student_t'``) the fit is robust to gross outliers
    (Jylänki, Vanhatalo & Vehtari 2011): damped parallel *fractional* EP (α = ``power``, 0.5 by
    default; the paper's eqs 11-14) on the sparse representation, whose sites may have negative
    precisions (:class:`fastep._epcore.student_t_ep.SparseStudentTEP`; a step that would make
    the posterior or a cavity improper is halved), with ν and σ learnt from the fractional EP
    evidence and its exact gradient. If it stalls or does not converge, the fit continues with
    the convergent double-loop algorithm (the paper's §4.2; Heskes & Zoeter 2002) on the same
    representation, in O(nm) memory. In-core data only.

    Parameters
    ----------
    kernel : fastep.kernels.Kernel or None, default None
        Prior covariance (see :class:`SparseGPClassifier` for the gradients it must provide). None
        starts from ``RBF(var(y), γ) + Bias(mean(y)²)``, γ = 1 / (median squared distance between
        the training inputs, over a seeded sample of at most 1000 rows); a kernel given here is the
        start as it is.
        %MIXED_UNITS%
    noise_variance : float > 0 or None, default None
        Variance σ² of the Gaussian noise (the starting point when learnt); None starts from var(y) / 10.
    likelihood : None, 'gaussian', 'student_t', Gaussian or StudentT, default None
        The noise model. None or ``'gaussian'``: Gaussian with ``noise_variance``.
        ``'student_t'``: ``StudentT(dof=4, scale=sqrt(noise_variance))``, with ``noise_variance``
        var(y) / 10 unless given. A likelihood object is the
        start as it is (then ``noise_variance`` must be None). The Student-t runs the damped
        parallel schedule (``schedule``, ``order`` and ``negative_precision`` do not apply;
        ``damping`` None means 0.5), and its double-loop fallback runs up to ``5 * max_sweeps``
        outer iterations.
    learn_noise : bool, default True
        Learn the noise model (σ², or the Student-t's ν and σ) with the kernel hyperparameters and Z.
    %INDUCING_PARAMS%
    power : float in (0, 1] or None, default None
        None: 1.0, or 0.5 with a Student-t likelihood (fractional EP's robust choice).
        %POWER_EP%
    %COMMON_PARAMS%

    Attributes
    ----------
    %REGRESSOR_ATTRIBUTES%
    %COMMON_ATTRIBUTES%

    References
    ----------
    %REFERENCES%

    %EXAMPLES%
    >>> X = rng.uniform(-3, 3, size=(300, 1))
    >>> y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=300)
    >>> reg = SparseGPRegressor(n_inducing=8, learn_inducing=False, random_state=0).fit(X, y)
    >>> mean = reg.predict([[0.5]])
    >>> bool(abs(mean[0] - np.sin(0.5)) < 0.2)
    True

    Gross outliers barely move the Student-t fit:

    >>> y_bad = y.copy()
    >>> y_bad[::20] += 8.0
    >>> robust = SparseGPRegressor(likelihood="student_t", n_inducing=8, random_state=0).fit(X, y_bad)
    >>> bool(abs(robust.predict([[0.5]])[0] - np.sin(0.5)) < 0.2)
    True
    """, EXAMPLES=EXAMPLES_DOC, ESTIMATOR="SparseGPRegressor", MIXED_UNITS=MIXED_UNITS_DOC,
        INDUCING_PARAMS=_INDUCING_PARAMS, POWER_EP=_POWER_EP, COMMON_PARAMS=_COMMON_PARAMS,
        REGRESSOR_ATTRIBUTES=REGRESSOR_ATTRIBUTES, COMMON_ATTRIBUTES=_COMMON_ATTRIBUTES, REFERENCES=_REFERENCES)

    likelihood: Literal["gaussian", "student_t"] | Gaussian | StudentT | None
    power: float | None
    kernel_: Kernel
    likelihood_: Gaussian | StudentT

    def __init__(self, kernel: Kernel | None = None, noise_variance: float | None = None, *,
                 likelihood: Literal["gaussian", "student_t"] | Gaussian | StudentT | None = None,
                 learn_noise: bool = True, n_inducing: int | Literal["auto"] = "auto",
                 approximation: Literal["fitc", "dtc"] = "fitc", power: float | None = None,
                 inducing_init: Literal["auto", "kmeans++", "random", "ivm"] | ArrayLike = "auto",
                 learn_inducing: bool | Literal["auto"] = "auto",
                 schedule: Literal["sequential", "parallel"] = "sequential",
                 order: Literal["fixed", "random"] = "fixed",
                 damping: float | None = None, tol: float = 1e-6,
                 max_sweeps: int = 200, negative_precision: Literal["clip", "skip"] = "clip", n_quadrature: int = 32,
                 optimizer: Literal["L-BFGS-B"] | None = "L-BFGS-B", n_restarts_optimizer: int = 0,
                 jitter: float = 1e-6, random_state: int | None = None, warm_start: bool = True,
                 hyperprior: Hyperprior = "auto",
                 learning: Literal["auto", "full-batch", "minibatch"] = "auto", batch_size: int = 512,
                 learning_rate: float = 0.03, max_epochs: int = 20,
                 sites: Literal["tied", "per-point"] = "tied", verbose: int = 0,
                 callback: Callback = None) -> None:
        self._set_init_params(locals())

    @records_feature_names
    def fit(self, X: ArrayLike, y: ArrayLike, client: Any = None) -> Self:
        """Fit the posterior (and the hyperparameters and Z unless ``optimizer=None``).

        Parameters
        ----------
        X : array-like (n_samples, n_features), or dask.array.Array
            A dask array (chunked by rows) is fitted on the Dask cluster that holds it, as
            in :meth:`SparseGPClassifier.fit` (``schedule='parallel'``).
        y : array-like (n_samples,), or dask.array.Array
            Real targets.
        %CLIENT%
        """
        options = self._fit_options()
        if getattr(self, "_continuing", False):
            options = options.replace(learning="minibatch")
        kernel = check_kernel(self.kernel)
        noise_class, noise = resolve_noise_model(self.likelihood, self.noise_variance)
        fractional = noise_class.ep_variant == "fractional"
        if fractional:
            options = use_fractional_ep(options, noise_class, None if self.power is None else options.power,
                                        self.damping)
        noise_variance = check_noise_variance(self.noise_variance)
        # a placeholder noise model for the checks before the data are read; None becomes var(y) / 10 below
        likelihood = (noise_class.from_noise_variance(1.0 if noise_variance is None else noise_variance)
                      if noise is None else noise)
        learn_noise = v.check_bool(self.learn_noise, "learn_noise")
        self._check_fit_options(options, kernel, likelihood, learn_noise)
        on_cluster = client is not None or _chunked.is_dask_array(X)
        if on_cluster and fractional:
            raise ValueError(f"the {noise_class.__name__} likelihood is fitted in core only: a dask X (or a client) "
                             "needs likelihood=None (Gaussian noise)")
        if on_cluster and not self._dask_learns_from_minibatches(X, options, likelihood):
            _, X, problems = self._fit_chunked(X, y, client, kernel, likelihood, options, learn_noise,
                                               classifier=False)
        else:
            if on_cluster:
                # rows read from the cluster as learning needs them; the start as in core, from y
                # and a sample of the rows
                X, y = self._driver_rows(X, y, client, y_numeric=True)
                gaussian = Gaussian(noise_variance=default_noise_variance(y) if noise_variance is None
                                    else noise_variance)
                if kernel is not None:
                    kernel._validate_X(X[:1], "X")
                start = kernel
            else:
                gaussian, _, X, y, start = self._check_regression_inputs(X, y, kernel)
            previous = None
            if self._learns_from_minibatches(X.shape[0], options, likelihood):
                options = options.replace(minibatch=True, n_features=X.shape[1])
                previous = self._previous_minibatch_fits(X, options, 1)
                start = previous[0].kernel if previous else self._minibatch_start(kernel, X, y, regression=True)
            kernel = start
            if noise is None:
                likelihood = noise_class.from_noise_variance(gaussian.noise_variance)
            self._check_kernel_gradients(kernel, X, self._learns_inducing())
            # the IVM initialisation scores inclusions under Gaussian noise of the targets' scale
            (Z,) = ([previous[0].Z] if previous
                    else self._inducing_inputs(X, options, kernel, gaussian if fractional else likelihood, [y]))
            self._check_memory(X.shape[0], Z.shape[0], options)
            problems = [self._fit_one(X, y, Z, kernel, likelihood, options, learn_noise,
                                          start=previous[0] if previous else None)]
        self._set_fitted(X, problems)
        self.noise_variance_ = float(problems[0].likelihood.noise_variance)
        return self

    fit.__doc__ = fill_doc(fit.__doc__, CLIENT=_CLIENT_DOC)  # type: ignore[arg-type]  # it has a docstring
