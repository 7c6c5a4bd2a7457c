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

import copy
import functools
from typing import TYPE_CHECKING

import numpy as np

from ._sparse import distributed as _chunked
from . import _validation as v
from ._epcore import sparse_ep as _engine
from ._epcore.power_ep import power_moments_array
from ._base import EXAMPLES_DOC, check_is_fitted, fill_doc, records_feature_names
from ._gp_base import (CLASSIFIER_ATTRIBUTES, EP_RUN_ATTRIBUTES, HYPERPRIOR_DOC, LEARNING_ATTRIBUTES, MIXED_UNITS_DOC,
                       N_JOBS_DOC, REGRESSOR_ATTRIBUTES, EPEvidenceMixin, GPClassifierMixin,
                       GPEstimator, GPRegressorMixin, Hyperparameters,
                       check_classifier_likelihood, check_noise_variance,
                       ep_option_constraints, stack_problems, start_kernel, use_fractional_ep)
from ._constraints import Boolean, Choice, Integer, Interval, validate_params
from ._search.start import default_ard_kernel, default_noise_variance, sample_rows
from .progress import CALLBACK_DOC
from ._sparse.inducing import auto_sizes, grow_inducing, kmeans_plus_plus
from ._memory import (check_memory, concurrent_problems, fits_in_memory, format_bytes, minibatch_sparse_bytes,
                      sparse_gp_bytes)
from ._sparse.problem import _BinarySparseEP, _StudentTSparseEP
from ._sparse import multinomial as _multinomial
from ._sparse import stochastic as _minibatch
from ._sparse.stochastic import (MINIBATCH_ARD_MAX_FEATURES, MINIBATCH_MIN_ROWS, MINIBATCH_PATIENCE, SECOND_STAGE_STEP,
                                 minibatch_windows)
from .batch import map_in_order
from .kernels.base import check_kernel
from .kernels.stationary import relevance_weights
from ._ivm.selection import select_active_set
from .likelihoods import Gaussian, Probit, StudentT
from .likelihoods.checks import resolve_noise_model

if TYPE_CHECKING:
    from typing import Any, Literal

    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

    from ._typing import Callback, Hyperprior, MeanStd
    from .kernels import Kernel
    from .likelihoods import Likelihood, Logistic, Step

__all__ = ["SparseGPClassifier", "SparseGPRegressor", "kmeans_plus_plus", "auto_sizes"]

_SCHEDULES = {"sequential": _engine.SPARSE_SEQUENTIAL, "parallel": _engine.SPARSE_PARALLEL}
_ORDERS = {"fixed": _engine.ORDER_FIXED, "random": _engine.ORDER_RANDOM}
_POLICIES = {"clip": _engine.NEGATIVE_CLIP, "skip": _engine.NEGATIVE_SKIP}
_APPROXIMATIONS = ("fitc", "dtc")
#: The sparse problem of each EP variant (:attr:`fastep.likelihoods.Likelihood.ep_variant`).
_PROBLEMS = {"standard": _BinarySparseEP, "fractional": _StudentTSparseEP}
_INDUCING_INITS = ("auto", "kmeans++", "random", "ivm")
_LEARNING_MODES = ("auto", "full-batch", "minibatch")
#: m of ``n_inducing='auto'`` when learning from minibatches (no growth: each size would be a new fit).
MINIBATCH_INDUCING = 256
#: Rows of the seeded sample k-means++ chooses the inducing inputs from in a minibatch fit (at least 50 per input).
MINIBATCH_KMEANS_ROWS = 20_000


def _check_likelihood_learnable_with_power(likelihood, power):
    if power == 1.0 or likelihood.learnable_with_power:
        return
    raise ValueError("learn_likelihood with power < 1 is supported for the noise models' parameters only (Gaussian, "
                     f"Student-t; {type(likelihood).__name__} has {likelihood.theta_names()}); use power=1 or "
                     "learn_likelihood=False")


#: Constructor parameters a continued fit (``continue_fit``) may change: how long and how it learns.
_CONTINUATION_PARAMETERS = ("max_epochs", "batch_size", "learning_rate", "learning", "random_state", "verbose",
                            "callback", "n_jobs", "warm_start")


def _model_parameters(estimator):
    """The constructor parameters that define the model, each as the digest of its pickle, for
    ``continue_fit`` to check that none changed since the fit it continues."""
    import hashlib
    import pickle
    out = {}
    for name, value in estimator.get_params(deep=False).items():
        if name in _CONTINUATION_PARAMETERS:
            continue
        try:
            out[name] = hashlib.sha256(pickle.dumps(value)).hexdigest()
        except Exception:                    # an unpicklable value cannot be compared: counted as changed
            out[name] = f"unpicklable {id(value)}"
    return out


def _kmeans_sample(X, m, rng):
    """The rows k-means++ chooses m inducing inputs from in a minibatch fit: a seeded sample of
    max(``MINIBATCH_KMEANS_ROWS``, 50 m) rows (all rows when fewer), as a float64 array."""
    n, rows = X.shape[0], max(MINIBATCH_KMEANS_ROWS, 50 * m)
    index = np.sort(rng.choice(n, size=rows, replace=False)) if n > rows else np.arange(n)
    return np.asarray(X[index], dtype=np.float64)


class _SparseGPBase(EPEvidenceMixin, GPEstimator):
    """Engine options, inducing inputs and the per-problem fit shared by the sparse estimators."""

    #: What ``inducing_init='auto'`` means in core: the IVM's selection (True) or k-means++.
    _informative_selection = False

    n_inducing: int | Literal["auto"]
    approximation: Literal["fitc", "dtc"]
    inducing_init: Literal["auto", "kmeans++", "random", "ivm"] | ArrayLike
    learn_inducing: bool | Literal["auto"]
    learning: Literal["auto", "full-batch", "minibatch"]
    batch_size: int
    learning_rate: float
    max_epochs: int
    sites: Literal["tied", "per-point"]
    schedule: Literal["sequential", "parallel"]
    order: Literal["fixed", "random"]
    damping: float | None
    tol: float
    max_sweeps: int
    negative_precision: Literal["clip", "skip"]
    n_quadrature: int
    optimizer: Literal["L-BFGS-B"] | None
    n_restarts_optimizer: int
    jitter: float
    random_state: int | None
    warm_start: bool
    hyperprior: Hyperprior
    #: One-vs-rest: a list of arrays when ``n_inducing='auto'`` chose different sizes.
    inducing_inputs_: NDArray[np.float64] | list[NDArray[np.float64]]
    n_inducing_: int | NDArray[np.int_]
    growth_history_: list[Any] | None

    _parameter_constraints = dict(ep_option_constraints(_SCHEDULES, _ORDERS, _POLICIES),
                                  approximation=Choice(_APPROXIMATIONS),
                                  power=Interval(0.0, 1.0, low_inclusive=False, allow_none=True),
                                  n_quadrature=Integer(1, 256), learn_inducing=Boolean(also=("auto",)),
                                  learning=Choice(_LEARNING_MODES), batch_size=Integer(1),
                                  max_epochs=Integer(1), learning_rate=Interval(0.0, np.inf, low_inclusive=False,
                                                                                finite=True),
                                  sites=Choice(_minibatch.SITE_MODES))

    def _engine_options(self):
        p = validate_params(self, self._parameter_constraints)
        damping = p["damping"]
        if damping is None:
            damping = 0.5 if self.schedule == "parallel" else 1.0
        return {"schedule": _SCHEDULES[self.schedule], "order": _ORDERS[self.order], "seed": p["random_state"],
                "damping": float(damping), "tol": p["tol"], "max_sweeps": p["max_sweeps"],
                "negative_precision": _POLICIES[self.negative_precision], "jitter": p["jitter"],
                "approximation": self.approximation, "power": 1.0 if p["power"] is None else float(p["power"]),
                "n_quadrature": p["n_quadrature"], "hyperprior": p["hyperprior"],
                "progress": self._new_progress(), "learning": p["learning"], "batch_size": p["batch_size"],
                "max_epochs": p["max_epochs"], "learning_rate": float(p["learning_rate"]), "sites": p["sites"],
                "patience": MINIBATCH_PATIENCE}

    def _learns_from_minibatches(self, n, options, likelihood, min_rows=None):
        """Whether this fit learns from minibatches: ``learning='minibatch'``, or ``'auto'`` from
        ``min_rows`` rows on (default ``MINIBATCH_MIN_ROWS``, read at the call); sets
        ``options['minibatch']`` (and the window)."""
        if min_rows is None:
            min_rows = MINIBATCH_MIN_ROWS
        mode = options["learning"]
        if likelihood is not None and likelihood.ep_variant == "fractional":
            if mode == "minibatch":
                raise ValueError("learning='minibatch' is not available with a Student-t likelihood (its "
                                 "fractional EP sites may be negative); use learning='full-batch'")
            mode = "full-batch"
        minibatch = mode == "minibatch" or (mode == "auto" and n >= min_rows)
        options["minibatch"] = minibatch
        return minibatch

    def _dask_learns_from_minibatches(self, X, options, likelihood):
        """Whether a fit on a dask ``X`` learns from minibatches read to the driver (else it runs
        the map-reduce full-batch schedule on the cluster)."""
        n = X.shape[0] if _chunked.is_dask_array(X) and len(X.shape) == 2 else 0
        if options["learning"] == "full-batch" or n == 0:
            return False
        return self._learns_from_minibatches(n, dict(options), likelihood)

    def _driver_rows(self, X, y, client, y_numeric=False):
        """``(rows of the dask X read on demand, y validated in core)`` for minibatch learning."""
        caller = f"{type(self).__name__}.fit"
        if isinstance(self.inducing_init, str) and self.inducing_init == "ivm":
            raise ValueError(f"inducing_init='ivm' is not available for a dask array in {caller}; use "
                             "'kmeans++', 'random' or explicit inducing inputs")
        X, y = _chunked.driver_rows(X, y, client, caller)
        return X, v.check_y(y, X.shape[0], y_numeric=y_numeric)

    def continue_fit(self, X: ArrayLike, y: ArrayLike, client: Any = None) -> Self:
        """Continue learning from minibatches on ``(X, y)`` from this estimator's previous fit.

        The previous fit (by ``fit`` or ``continue_fit``, learnt from minibatches with tied
        sites) gives the start: its hyperparameters, inducing inputs and tied site (rescaled
        to the n of ``X``), and learning begins without a warm-up window, stopped by the same
        rule or ``max_epochs`` passes: to learn more from new rows of the same source, or to go
        on after ``max_epochs``. Without a previous fit it is ``fit`` with
        ``learning='minibatch'``. Only ``max_epochs``, ``batch_size``, ``learning_rate``,
        ``random_state``, ``verbose``, ``callback``, ``n_jobs`` and ``warm_start`` may change
        between the two; X must have the same features and y (classifier) the same classes,
        else a ``ValueError``. A fit that learnt its inducing inputs in the second stage
        (``learn_inducing='auto'``) continues at that stage's step, a third of
        ``learning_rate``. Returns self.
        """
        self._continuing = True
        try:
            return self.fit(X, y, client=client)
        finally:
            del self._continuing

    def _learns_inducing(self):
        """Whether the inducing inputs are learnt with the other parameters from the start
        (``learn_inducing=True``; ``'auto'`` learns them only in a minibatch fit's second stage)."""
        return not isinstance(self.learn_inducing, str) and bool(self.learn_inducing)

    def _places_inducing_by_relevance(self):
        """Whether a minibatch fit chooses its inducing inputs again in the learnt metric: learning,
        Z fixed in the first stage and chosen by k-means++ (``inducing_init`` 'auto' or 'kmeans++')."""
        return (self.optimizer is not None and not self._learns_inducing() and isinstance(self.inducing_init, str)
                and self.inducing_init in ("auto", "kmeans++"))

    def _learns_inducing_second_stage(self, kernel, Z):
        """``learn_inducing='auto'``: the second stage of a minibatch fit learns Z too, when the
        kernel has input gradients (tried on one row of Z)."""
        if not (isinstance(self.learn_inducing, str) and self.learn_inducing == "auto"):
            return False
        x = np.asarray(Z[:1], dtype=np.float64)
        try:
            kernel._unchecked_input_gradient(x, x, np.ones((1, 1)))
        except NotImplementedError:
            return False
        return True

    @staticmethod
    def _inducing_by_relevance(X, weights, m, seed):
        """m inducing inputs by k-means++ on a seeded sample of max(20 000, 50 m) rows, in the inputs
        scaled by ``weights`` (each input by its learnt inverse length-scale), mapped back."""
        rng = np.random.default_rng([seed if seed is not None else 0, 1])
        return np.ascontiguousarray(kmeans_plus_plus(_kmeans_sample(X, m, rng) * weights, m, rng) / weights)

    def _previous_minibatch_fits(self, X, options, n_problems, classes=None):
        """The fitted problems to continue from (a warm start of minibatch learning), or None.

        With ``warm_start`` and a fit that learns from minibatches with tied sites, the problems
        of this estimator's previous fit are reused when that fit also learnt from minibatches
        with tied sites, on inputs of the same width, with the same classes (and the same
        ``learn_inducing`` and ``learn_likelihood``)."""
        if not getattr(self, "_continuing", False) or getattr(self, "_problems", None) is None:
            return None
        caller = f"{type(self).__name__}.continue_fit"
        problems = self._problems
        if getattr(self, "learning_", None) != "minibatch" or any(
                getattr(p, "tied_site", None) is None for p in problems):
            raise ValueError(f"{caller} continues a fit learnt from minibatches with tied sites; this estimator's "
                             "last fit was not one: call fit to start afresh")
        if self.n_features_in_ != X.shape[1]:
            raise ValueError(f"{caller}: X has {X.shape[1]} features, the fit it continues had "
                             f"{self.n_features_in_}")
        if len(problems) != n_problems or (
                classes is not None and not np.array_equal(np.asarray(self.classes_), np.asarray(classes))):
            raise ValueError(f"{caller}: y has the classes {list(classes)}, the fit it continues had "
                             f"{list(self.classes_)}")
        changed = [name for name, value in _model_parameters(self).items()
                   if getattr(self, "_fitted_parameters", {}).get(name) != value]
        if changed:
            raise ValueError(f"{caller} continues the previous fit, but {', '.join(changed)} changed since; "
                             "call fit to start afresh")
        return problems

    def _minibatch_start(self, kernel, X, y=None, regression=False):
        """The start kernel of a minibatch fit: the one given, else ARD (:func:`default_ard_kernel`)
        on a seeded sample of the rows up to ``MINIBATCH_ARD_MAX_FEATURES`` inputs, the isotropic
        default above."""
        if kernel is not None:
            return kernel
        sample = np.asarray(X[sample_rows(X.shape[0])], dtype=np.float64)
        if X.shape[1] > MINIBATCH_ARD_MAX_FEATURES:
            return start_kernel(None, sample, y, regression=regression)
        return default_ard_kernel(sample, y, regression=regression)

    def _check_kernel_gradients(self, kernel, X, learn_inducing):
        """The kernel must provide the sparse derivatives the optimiser will need (tried on one row of X)."""
        if self.optimizer is None:
            return
        x = X[:1]
        try:
            list(kernel._unchecked_cross_gradient_iter(x, x))
            kernel._unchecked_diag_gradient(x)
            if learn_inducing:
                kernel._unchecked_input_gradient(x, x, np.ones((1, 1)))
        except NotImplementedError as exc:
            raise TypeError(f"kernel {kernel!r} cannot be used to learn a sparse GP: {exc} (use "
                            "optimizer=None, or learn_inducing=False if only input gradients are missing)"
                            ) from None

    def _grows(self):
        """Whether m is chosen by growth (``n_inducing='auto'`` with a named ``inducing_init``)."""
        if isinstance(self.n_inducing, str) and self.n_inducing == "auto":
            return isinstance(self.inducing_init, str)
        v.check_int(self.n_inducing, "n_inducing", minimum=1)
        return False

    def _resolved_init(self, executor=None):
        """``inducing_init`` with ``'auto'`` resolved (in core without ``executor``); None for an array."""
        init = self.inducing_init
        if not isinstance(init, str):
            return None
        if init == "auto":
            return "ivm" if self._informative_selection and executor is None else "kmeans++"
        return init

    def _inducing_inputs(self, X, options, kernel, likelihood, targets, executor=None, m=None):
        """Initial inducing inputs from ``inducing_init`` / ``n_inducing`` (validated), one array per
        problem of ``targets`` (the same array except for ``'ivm'``, which selects per problem).

        With ``executor`` (X a dask array) the rows are fetched from the cluster: the random
        subset itself, and for k-means++ all rows up to ``KMEANS_SAMPLE_ROWS`` (else a seeded
        uniform subsample of that many), so the result equals the in-core one up to that size."""
        n, dim = X.shape
        init = self.inducing_init
        if isinstance(init, str):
            v.check_choice(init, "inducing_init", _INDUCING_INITS)
            init = self._resolved_init(executor)
            if m is None and options.get("minibatch"):
                m = min(n, MINIBATCH_INDUCING) if self._grows() else min(
                    v.check_int(self.n_inducing, "n_inducing", minimum=1), n)
                if init == "ivm" and isinstance(self.inducing_init, str) and self.inducing_init == "auto":
                    init = "kmeans++"          # no O(m² n) selection over every row
            if m is None:
                m = auto_sizes(n)[0] if self._grows() else min(v.check_int(self.n_inducing, "n_inducing",
                                                                                minimum=1), n)
            if init == "ivm":
                # Algorithm 1 of the IVM at the initial kernel and likelihood; a regression
                # selection uses the sparse model's prior mean 0 as its offset (the entropy
                # score of Gaussian sites does not depend on y anyway)
                return [np.ascontiguousarray(X[select_active_set(X, t, kernel, likelihood, m,
                                                                 seed=options["seed"])])
                        for t in targets]
            rng = np.random.default_rng(options["seed"])
            if init == "random":
                index = np.sort(rng.choice(n, size=m, replace=False))
                Z = (np.ascontiguousarray(X[index]) if executor is None
                     else _chunked.take_rows(executor, X, index))
            else:
                sample = _chunked.KMEANS_SAMPLE_ROWS
                if executor is not None:
                    X = _chunked.take_rows(executor, X, np.arange(n) if n <= sample
                                           else np.sort(rng.choice(n, size=sample, replace=False)))
                elif options.get("minibatch"):
                    # k-means++ over a sample whose rows x m distances stay small beside the data
                    X = _kmeans_sample(X, m, rng)
                Z = np.ascontiguousarray(kmeans_plus_plus(X, m, rng))
            return [Z] * len(targets)
        Z = v.as_float_matrix(init, "inducing_init")
        if Z.shape[1] != dim:
            raise ValueError(f"inducing_init must have {dim} columns (the number of features of X), got "
                             f"{Z.shape[1]}")
        if Z.shape[0] > n:
            raise ValueError(f"inducing_init must have at most n_samples = {n} rows, got {Z.shape[0]}")
        return [Z.copy()] * len(targets)

    def _fit_problem(self, X, y, Z, kernel, likelihood, options, learn_likelihood, start=None):
        """Fit one binary/regression problem, learning hyperparameters (and Z) unless ``optimizer`` is None;
        with ``n_inducing='auto'`` growing m (:meth:`_fit_growing`). ``start``: a previous
        minibatch fit of this problem to continue from (:meth:`_previous_minibatch_fits`)."""
        if options.get("minibatch"):
            return self._fit_minibatch(X, y, Z, kernel, likelihood, options, learn_likelihood, start)
        problem_class = _PROBLEMS[likelihood.ep_variant]

        def make_problem(Z):
            return problem_class(kernel, likelihood, Z, X, y, options, learn_likelihood, self._learns_inducing())

        def choose(m, fitted):
            return self._inducing_inputs(X, options, fitted.kernel, fitted.likelihood.selection_likelihood(), [y],
                                         m=m)[0]

        return self._fit_growing(make_problem, choose, Z, kernel, likelihood, options, learn_likelihood)

    def _fit_growing(self, make_problem, choose, Z, kernel, likelihood, options, learn_likelihood, sizes=None):
        """Fit at the inducing inputs Z; with ``n_inducing='auto'`` then grow m (:func:`grow_inducing`,
        over ``sizes``, default :func:`auto_sizes`) while the next size fits in memory."""
        fitted = self._learn(make_problem(Z), kernel, likelihood, Z, options, learn_likelihood)
        if not self._grows():
            fitted.growth = None
            return fitted
        n_problems = options.get("n_problems", 1)
        return grow_inducing(fitted, lambda m, best: self._learn(self._warm(make_problem(choose(m, best)), best),
                                                                 kernel, likelihood, None, options,
                                                                 learn_likelihood, start=best),
                             options.get("progress"),
                             fits=lambda m: fits_in_memory(self._memory_estimate(fitted.n_points, m, n_problems)),
                             sizes=sizes)

    def _fit_minibatch(self, X, y, Z, kernel, likelihood, options, learn_likelihood, start=None):
        """Learn one problem from minibatches (:mod:`fastep._sparse.stochastic`); ``start``: a
        previous minibatch fit to continue from (its hyperprior, parameters, Z and tied site)."""
        window, site_window = minibatch_windows(X.shape[0], Z.shape[0])
        options = dict(options, window=window, site_window=site_window)
        if start is not None:
            hyper = copy.deepcopy(start.hyperparameters)
            if hyper.extra is not None and not self._learns_inducing():
                # a fit that learnt Z in its second stage continues at that stage's step
                options["learning_rate"] = options["learning_rate"] * SECOND_STAGE_STEP
        else:
            hyper = Hyperparameters(kernel, likelihood, learn_likelihood,
                                    extra=Z if self._learns_inducing() else None, hyperprior=options["hyperprior"])
        source = _minibatch.RowSource(X, y)
        fitted = _minibatch.fit_minibatch(kernel, likelihood, Z, source, options, hyper,
                                          learn=self.optimizer is not None, start=start)
        if start is None and self._places_inducing_by_relevance() and fitted.info.stopped != "callback":
            weights = relevance_weights(fitted.kernel, X.shape[1])
            if weights is not None:
                # the second stage: k-means++ in the learnt kernel's metric, learning continued there
                Z2 = self._inducing_by_relevance(X, weights, Z.shape[0], options["seed"])
                first = fitted
                second_options = options
                if self._learns_inducing_second_stage(first.kernel, Z2):
                    # Z learnt too, from the re-placed inputs, at a third of the first stage's step
                    hyper = Hyperparameters(kernel, likelihood, learn_likelihood, extra=Z2,
                                            hyperprior=options["hyperprior"])
                    second_options = dict(options, learning_rate=options["learning_rate"] * SECOND_STAGE_STEP)
                second = _minibatch.fit_minibatch(first.kernel, first.likelihood, Z2, source, second_options,
                                                  hyper, learn=True)
                # kept when its best window's running log loss is at least as low as the first's
                if (min((h[1] for h in second.history), default=np.inf)
                        <= min((h[1] for h in first.history), default=np.inf)):
                    fitted = second
                    fitted.n_evaluations += first.n_evaluations
                    fitted.history = first.history + fitted.history
        fitted.estimator_name = type(self).__name__
        return fitted

    def _memory_estimate(self, n, m, n_problems, options=None):
        if options is not None and options.get("minibatch"):
            return minibatch_sparse_bytes(n, m, batch_size=options["batch_size"], n_features=options["n_features"],
                                          n_problems=n_problems,
                                          n_concurrent=concurrent_problems(getattr(self, "n_jobs", None)),
                                          per_point_sites=options["sites"] == "per-point")
        return self._full_batch_memory_estimate(n, m, n_problems)

    def _full_batch_memory_estimate(self, n, m, n_problems):
        """Peak working memory of fitting ``n_problems`` problems on n rows at m inducing inputs."""
        return sparse_gp_bytes(n, m, learning=self.optimizer is not None, n_problems=n_problems,
                               n_concurrent=concurrent_problems(getattr(self, "n_jobs", None)),
                               kmeans=self._resolved_init() == "kmeans++")

    def _check_memory(self, n, m, n_problems, options):
        """Raise :class:`~fastep.exceptions.MemoryLimitError` before an in-core fit at m inducing
        inputs that cannot fit in memory; ``options`` keeps ``n_problems`` for the growth."""
        options["n_problems"] = n_problems
        if options.get("minibatch"):
            check_memory(self._memory_estimate(n, m, n_problems, options),
                         f"{type(self).__name__}.fit from minibatches on n = {n} rows with m = {m} inducing inputs",
                         "Use fewer inducing inputs (n_inducing), a smaller batch_size or fewer concurrent "
                         "problems (n_jobs)")
            return
        check_memory(self._memory_estimate(n, m, n_problems),
                     f"{type(self).__name__}.fit on n = {n} rows with m = {m} inducing inputs (O(n m) "
                     f"memory: {format_bytes(8 * n * m)} per n×m array)",
                     "Use fewer inducing inputs (n_inducing), fewer concurrent problems (n_jobs), a "
                     "dask array on a cluster, or a subsample")

    @staticmethod
    def _warm(problem, fitted):
        """``problem`` with the sites of ``fitted`` (they live on the training points, not on Z)."""
        problem.restore_sites(fitted.sites())
        return problem

    def _learn(self, problem, kernel, likelihood, Z, options, learn_likelihood, start=None):
        """Learn one problem's hyperparameters from ``kernel``/``likelihood`` (the hyperprior's centre);
        with ``start`` (a fitted problem) the search starts at its kernel and likelihood instead."""
        if Z is None:
            Z = problem.Z
        search = self._search_options(problem, Hyperparameters(kernel, likelihood, learn_likelihood,
                                                               extra=Z if self._learns_inducing() else None,
                                                               hyperprior=options["hyperprior"]), options["seed"])
        if start is not None:
            problem.hyperparameters.space.start_at(problem.hyperparameters.pack(start.kernel, start.likelihood, Z))
        return problem.fit(problem.hyperparameters, **search)

    def _check_fit_options(self, options, kernel, likelihood, learn_likelihood):
        """Checks of the likelihood against ``power`` shared by every fit, before any work."""
        if learn_likelihood:
            _check_likelihood_learnable_with_power(likelihood, options["power"])
        if options["power"] < 1.0:
            # the same check as the engine: a pointwise log density is needed
            power_moments_array(likelihood.site_spec(), np.ones(1), np.zeros(1), np.ones(1),
                                        power=options["power"], n_quadrature=options["n_quadrature"])

    def _fit_chunked(self, X, y, client, kernel, likelihood, options, learn_likelihood, classifier):
        """Fit on a row-chunked dask array by the map-reduce form of the parallel schedule
        (:mod:`fastep._sparse.distributed`); returns the fitted problems."""
        caller = f"{type(self).__name__}.fit"
        if options["schedule"] != _engine.SPARSE_PARALLEL:
            raise ValueError(f"{caller} on a dask array runs the parallel EP schedule: set "
                             "schedule='parallel' (the sequential schedule visits one site at a time)")
        if isinstance(self.inducing_init, str) and self.inducing_init == "ivm":
            raise ValueError(f"inducing_init='ivm' is not available for a dask array in {caller}; use "
                             "'kmeans++', 'random' or explicit inducing inputs")
        executor, data, sizes, X = _chunked.load_dask_data(X, y, client, kernel, classifier, caller)
        if kernel is None or (not classifier and self.noise_variance is None):
            # data-aware starts from a seeded sample of the rows and the targets' moments
            moments = None
            if not classifier:
                parts = executor.summaries(executor.map(_chunked.target_moments, data))
                moments = tuple(float(sum(p[i] for p in parts)) for i in range(3))
                if self.noise_variance is None:
                    likelihood = Gaussian(noise_variance=default_noise_variance(moments))
            if kernel is None:
                sample = _chunked.take_rows(executor, X, sample_rows(X.shape[0]))
                kernel = start_kernel(None, sample, moments, regression=not classifier)
        self._check_kernel_gradients(kernel, _chunked.take_rows(executor, X, [0]), self._learns_inducing())
        if classifier:
            labels = executor.summaries(data)
            try:
                classes = np.unique(np.concatenate(labels))
            except TypeError as exc:
                raise TypeError(f"y labels must be mutually comparable: {exc}") from None
            if classes.shape[0] < 2:
                raise ValueError(f"y must contain at least two classes; got only one class: {classes.tolist()}")
            positives = [classes[1]] if classes.shape[0] == 2 else list(classes)
        else:
            classes, positives = None, [None]
        Z = self._inducing_inputs(X, options, kernel, likelihood, [None], executor=executor)[0]
        learn_inducing = self._learns_inducing()

        def fit_one(positive):
            chunks = executor.map(_chunked.binary_targets, data, positive)

            def make_problem(Z):
                return _chunked.DistributedSparseEP(kernel, likelihood, Z, executor, chunks, sizes, options,
                                                    learn_likelihood, learn_inducing)

            def choose(m, fitted):
                return self._inducing_inputs(X, options, fitted.kernel, fitted.likelihood, [None],
                                             executor=executor, m=m)[0]

            return self._fit_growing(make_problem, choose, Z, kernel, likelihood, options, learn_likelihood)

        return classes, X, map_in_order(fit_one, positives, getattr(self, "n_jobs", None))

    def _set_fitted(self, X, problems):
        self._set_problems(X, problems)
        self.inducing_inputs_ = stack_problems([p.Z for p in problems]) if len(
            {p.Z.shape for p in problems}) == 1 else [p.Z for p in problems]
        sizes = [int(p.Z.shape[0]) for p in problems]
        self.n_inducing_ = sizes[0] if len(problems) == 1 else np.array(sizes)
        growth = [getattr(p, "growth", None) for p in problems]
        self.growth_history_ = growth[0] if len(problems) == 1 else growth
        self.learning_ = "minibatch" if isinstance(problems[0], _minibatch.MinibatchSparseFit) else "full-batch"
        self._fitted_parameters = _model_parameters(self)
        self._set_ep_summary(problems)


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


class _ChunkedPredictMixin:
    """Predictions on a dask array: the same method mapped over its row chunks (a dask array back).

    The workers receive a copy of the estimator that holds only the m-sized prediction state.
    """

    def _map_chunks(self, X, method, n_cols, dtype, **kwargs):
        check_is_fitted(self, "_problems")
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[-1] if X.ndim else 0} features, but {type(self).__name__} "
                             f"is expecting {self.n_features_in_} features as input (shape {X.shape})")
        light = copy.copy(self)
        light.__dict__ = {key: val for key, val in self.__dict__.items()
                          if key not in ("site_precision_", "site_natural_mean_", "_problems")}
        light._problems = [p.predictor for p in self._problems]
        X = X.rechunk({1: -1})
        apply = functools.partial(_predict_chunk, light, method, kwargs)
        if n_cols is None:
            return X.map_blocks(apply, drop_axis=1, dtype=dtype)
        return X.map_blocks(apply, chunks=(X.chunks[0], (n_cols,)), dtype=dtype)

    _problems: list[Any]
    n_features_in_: int
    classes_: NDArray[Any]

    def predict_latent(self, X: ArrayLike) -> MeanStd:
        if _chunked.is_dask_array(X):
            both = self._map_chunks(X, "_latent_columns", 2 * len(self._problems), np.float64)
            k = len(self._problems)
            if k == 1:
                return both[:, 0], both[:, 1]
            return both[:, :k], both[:, k:]
        return super().predict_latent(X)  # type: ignore[misc]  # the GP mixin's

    def _latent_columns(self, X):
        mean, var = self.predict_latent(X)
        return np.column_stack([mean, var])

    predict_latent.__doc__ = GPEstimator.predict_latent.__doc__


def _predict_chunk(estimator, method, kwargs, block):
    return getattr(estimator, method)(block, **kwargs)


class _ChunkedClassifierMixin(_ChunkedPredictMixin):
    def predict_proba(self, X: ArrayLike) -> NDArray[np.float64]:
        if _chunked.is_dask_array(X):
            return self._map_chunks(X, "predict_proba", len(self.classes_), np.float64)
        return super().predict_proba(X)  # type: ignore[misc]  # the GP mixin's

    def decision_function(self, X: ArrayLike) -> NDArray[np.float64]:
        if _chunked.is_dask_array(X):
            k = len(self._problems)
            return self._map_chunks(X, "decision_function", None if k == 1 else k, np.float64)
        return super().decision_function(X)  # type: ignore[misc]  # the GP mixin's

    def predict(self, X: ArrayLike) -> NDArray[Any]:
        if _chunked.is_dask_array(X):
            check_is_fitted(self, "_problems")
            return self._map_chunks(X, "predict", None, self.classes_.dtype)
        return super().predict(X)  # type: ignore[misc]  # the GP mixin's

    predict_proba.__doc__ = GPClassifierMixin.predict_proba.__doc__
    decision_function.__doc__ = GPClassifierMixin.decision_function.__doc__
    predict.__doc__ = GPClassifierMixin.predict.__doc__


class _ChunkedRegressorMixin(_ChunkedPredictMixin):
    def _predict_mean_std(self, X: ArrayLike, return_std: bool) -> NDArray[np.float64] | MeanStd:
        if _chunked.is_dask_array(X):
            if return_std:
                both = self._map_chunks(X, "_mean_std_columns", 2, np.float64)
                return both[:, 0], both[:, 1]
            return self._map_chunks(X, "predict", None, np.float64)
        return super()._predict_mean_std(X, return_std)  # type: ignore[misc]  # the GP mixin's

    def _mean_std_columns(self, X):
        return np.column_stack(self.predict(X, return_std=True))  # type: ignore[attr-defined]


class SparseGPClassifier(_ChunkedClassifierMixin, GPClassifierMixin, _SparseGPBase):
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
        options = self._engine_options()
        if getattr(self, "_continuing", False):
            options["learning"] = "minibatch"
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
                options["n_features"] = X.shape[1]
                previous = self._previous_minibatch_fits(X, options, len(targets), classes)
                kernel = previous[0].kernel if previous else self._minibatch_start(kernel, X)
            else:
                kernel = start_kernel(kernel, X)
            kernel._validate_X(X[:1], "X")        # X itself is validated above (a dask X as it is read)
            self._check_kernel_gradients(kernel, X, self._learns_inducing())
            Zs = ([p.Z for p in previous] if previous
                  else self._inducing_inputs(X, options, kernel, likelihood, targets))
            self._check_memory(X.shape[0], Zs[0].shape[0], len(targets), options)
            starts = previous or [None] * len(targets)
            problems = map_in_order(
                lambda job: self._fit_problem(X, job[0], job[1], kernel, likelihood, options, learn_likelihood,
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
        if options["power"] != 1.0:
            raise ValueError(f"multi_class='multinomial' runs plain EP: power must be 1.0, got {self.power!r}")
        if client is not None or _chunked.is_dask_array(X):
            raise ValueError("multi_class='multinomial' fits in-core data (an array or a numpy.memmap), "
                             "not a dask array")
        if self.damping is None:
            options["damping"], options["adaptive_damping"] = _multinomial.ADAPTIVE_DAMPING_START, True
        if getattr(self, "_continuing", False):
            raise ValueError("continue_fit is not available with multi_class='multinomial'; call fit")
        X, y = v.check_X_y(X, y)
        classes, labels = v.encode_class_indices(y)
        n_classes = classes.shape[0]
        options["n_classes"] = n_classes
        minibatch = self._learns_from_minibatches(X.shape[0], options, None,
                                                  min_rows=_multinomial.MINIBATCH_MIN_ROWS)
        if minibatch:
            options["n_features"], options["model"] = X.shape[1], "multinomial"
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
        self._check_memory(X.shape[0], n_classes * Z.shape[0], 1, options)
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

        problem = self._fit_growing(make_problem, choose, Z, kernel, None, options, False,
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
            return _multinomial.select_across_classes(X, labels, n_classes, kernel, m, seed=options["seed"])
        if isinstance(init, str) and init == "auto":
            rng = np.random.default_rng(options["seed"])
            return np.ascontiguousarray(kmeans_plus_plus(_kmeans_sample(X, m, rng), m, rng))
        return self._inducing_inputs(X, options, kernel, Probit(), [labels], m=m)[0]

    def _multinomial(self) -> bool:
        return bool(getattr(self, "_problems", None)) and isinstance(getattr(self._problems[0], "predictor", None),
                                                                     _multinomial.MultinomialSparsePredictor)

    def predict_proba(self, X: ArrayLike) -> NDArray[np.float64]:
        check_is_fitted(self, "_problems")
        if self._multinomial():
            return self._problems[0].predictor.predict_proba(self._check_X(X))
        return super().predict_proba(X)

    def decision_function(self, X: ArrayLike) -> NDArray[np.float64]:
        check_is_fitted(self, "_problems")
        if self._multinomial():
            X = self._check_X(X)
            if len(self.classes_) == 2:
                log_p = np.log(self._problems[0].predictor.predict_proba(X))
                return log_p[:, 1] - log_p[:, 0]
            return self._problems[0].predictor.latent_full(X)[0]
        return super().decision_function(X)

    def predict(self, X: ArrayLike) -> NDArray[Any]:
        check_is_fitted(self, "_problems")
        if self._multinomial():
            return self.classes_[np.argmax(self.predict_proba(X), axis=1)]
        return super().predict(X)

    predict_proba.__doc__ = GPClassifierMixin.predict_proba.__doc__
    decision_function.__doc__ = GPClassifierMixin.decision_function.__doc__
    predict.__doc__ = GPClassifierMixin.predict.__doc__


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
        options = self._engine_options()
        if getattr(self, "_continuing", False):
            options["learning"] = "minibatch"
        kernel = check_kernel(self.kernel)
        noise_class, noise = resolve_noise_model(self.likelihood, self.noise_variance)
        fractional = noise_class.ep_variant == "fractional"
        if fractional:
            use_fractional_ep(options, noise_class, None if self.power is None else options["power"], self.damping)
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
                options["n_features"] = X.shape[1]
                previous = self._previous_minibatch_fits(X, options, 1)
                start = previous[0].kernel if previous else self._minibatch_start(kernel, X, y, regression=True)
            kernel = start
            if noise is None:
                likelihood = noise_class.from_noise_variance(gaussian.noise_variance)
            self._check_kernel_gradients(kernel, X, self._learns_inducing())
            # the IVM initialisation scores inclusions under Gaussian noise of the targets' scale
            (Z,) = ([previous[0].Z] if previous
                    else self._inducing_inputs(X, options, kernel, gaussian if fractional else likelihood, [y]))
            self._check_memory(X.shape[0], Z.shape[0], 1, options)
            problems = [self._fit_problem(X, y, Z, kernel, likelihood, options, learn_noise,
                                          start=previous[0] if previous else None)]
        self._set_fitted(X, problems)
        self.noise_variance_ = float(problems[0].likelihood.noise_variance)
        return self

    fit.__doc__ = fill_doc(fit.__doc__, CLIENT=_CLIENT_DOC)  # type: ignore[arg-type]  # it has a docstring
