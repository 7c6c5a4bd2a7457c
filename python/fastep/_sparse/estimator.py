"""The sparse GP estimators' shared machinery: fit options, when a fit learns from
minibatches, inducing inputs (their start, growth and learning), full-batch, minibatch and
Dask-cluster fits, memory checks and the fitted state."""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np

from . import distributed as _chunked
from .. import _validation as v
from .._epcore import sparse_ep as _engine
from .._epcore.power_ep import power_moments_array
from .._gp.estimator import EPEvidenceMixin, EPParameters, GPEstimator, stack_problems
from .._gp.fit_options import SparseFitOptions
from .._gp.hyperparameters import Hyperparameters
from .._gp.options import ep_option_constraints, start_kernel
from .._constraints import Boolean, Choice, Integer, Interval, validate_params
from .._search.start import default_ard_kernel, default_noise_variance, sample_rows
from .inducing import auto_sizes, grow_inducing, kmeans_plus_plus
from .._memory import (check_memory, concurrent_problems, fits_in_memory, format_bytes, minibatch_sparse_bytes,
                      sparse_gp_bytes)
from .problem import _BinarySparseEP, _StudentTSparseEP
from . import stochastic as _minibatch
from .stochastic import (MINIBATCH_ARD_MAX_FEATURES, MINIBATCH_MIN_ROWS, MINIBATCH_PATIENCE, SECOND_STAGE_STEP,
                                 minibatch_windows)
from ..batch import map_in_order
from ..kernels.stationary import relevance_weights
from .._ivm.selection import select_active_set
from ..likelihoods import Gaussian

if TYPE_CHECKING:
    from typing import Any, Literal

    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

__all__ = ["_SparseGPBase"]

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


class _SparseGPBase(EPParameters, EPEvidenceMixin, GPEstimator):
    """Fit options, inducing inputs and the per-problem fit shared by the sparse estimators."""

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
    n_quadrature: int
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

    def _fit_options(self):
        """The fit's :class:`~fastep._gp.fit_options.SparseFitOptions` from the parameters (validated)."""
        p = validate_params(self, self._parameter_constraints)
        damping = p["damping"]
        if damping is None:
            damping = 0.5 if self.schedule == "parallel" else 1.0
        return SparseFitOptions(
            schedule=_SCHEDULES[self.schedule], order=_ORDERS[self.order], seed=p["random_state"],
            damping=float(damping), tol=p["tol"], max_sweeps=p["max_sweeps"],
            negative_precision=_POLICIES[self.negative_precision], jitter=p["jitter"],
            approximation=self.approximation, power=1.0 if p["power"] is None else float(p["power"]),
            n_quadrature=p["n_quadrature"], hyperprior=p["hyperprior"], progress=self._new_progress(),
            learning=p["learning"], batch_size=p["batch_size"], max_epochs=p["max_epochs"],
            learning_rate=float(p["learning_rate"]), sites=p["sites"], patience=MINIBATCH_PATIENCE)

    def _learns_from_minibatches(self, n, options, likelihood, min_rows=None):
        """Whether this fit learns from minibatches: ``options.learning='minibatch'``, or ``'auto'``
        from ``min_rows`` rows on (default ``MINIBATCH_MIN_ROWS``, read at the call)."""
        if min_rows is None:
            min_rows = MINIBATCH_MIN_ROWS
        mode = options.learning
        if likelihood is not None and likelihood.ep_variant == "fractional":
            if mode == "minibatch":
                raise ValueError("learning='minibatch' is not available with a Student-t likelihood (its "
                                 "fractional EP sites may be negative); use learning='full-batch'")
            mode = "full-batch"
        return mode == "minibatch" or (mode == "auto" and n >= min_rows)

    def _dask_learns_from_minibatches(self, X, options, likelihood):
        """Whether a fit on a dask ``X`` learns from minibatches read to the driver (else it runs
        the map-reduce full-batch schedule on the cluster)."""
        n = X.shape[0] if _chunked.is_dask_array(X) and len(X.shape) == 2 else 0
        if options.learning == "full-batch" or n == 0:
            return False
        return self._learns_from_minibatches(n, options, likelihood)

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
            kernel._input_grad(x, x, np.ones((1, 1)))
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
            list(kernel._cross_grads(x, x, list(range(kernel.n_theta))))
            list(kernel._diag_grads(x, list(range(kernel.n_theta))))
            if learn_inducing:
                kernel._input_grad(x, x, np.ones((1, 1)))
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
            if m is None and options.minibatch:
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
                                                                 seed=options.seed)])
                        for t in targets]
            rng = np.random.default_rng(options.seed)
            if init == "random":
                index = np.sort(rng.choice(n, size=m, replace=False))
                Z = (np.ascontiguousarray(X[index]) if executor is None
                     else _chunked.take_rows(executor, X, index))
            else:
                sample = _chunked.KMEANS_SAMPLE_ROWS
                if executor is not None:
                    X = _chunked.take_rows(executor, X, np.arange(n) if n <= sample
                                           else np.sort(rng.choice(n, size=sample, replace=False)))
                elif options.minibatch:
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

    def _fit_one(self, X, y, Z, kernel, likelihood, options, learn_likelihood, start=None):
        """Fit one binary/regression problem, learning hyperparameters (and Z) unless ``optimizer`` is None;
        with ``n_inducing='auto'`` growing m (:meth:`_fit_growing`). ``start``: a previous
        minibatch fit of this problem to continue from (:meth:`_previous_minibatch_fits`)."""
        if options.minibatch:
            return self._fit_minibatch(X, y, Z, kernel, likelihood, options, learn_likelihood, start)
        problem_class = _PROBLEMS[likelihood.ep_variant]

        def make_problem(Z):
            return problem_class(kernel, likelihood, Z, X, y, options, learn_likelihood, self._learns_inducing())

        def choose(m, fitted):
            return self._inducing_inputs(X, options, fitted.kernel, fitted.likelihood.selection_likelihood(), [y],
                                         m=m)[0]

        return self._fit_growing(make_problem, choose, Z, options)

    def _fit_growing(self, make_problem, choose, Z, options, sizes=None):
        """Fit at the inducing inputs Z; with ``n_inducing='auto'`` then grow m (:func:`grow_inducing`,
        over ``sizes``, default :func:`auto_sizes`) while the next size fits in memory."""
        fitted = self._learn(make_problem(Z))
        if not self._grows():
            fitted.growth = None
            return fitted
        n_problems = options.n_problems
        return grow_inducing(fitted, lambda m, best: self._learn(self._warm(make_problem(choose(m, best)), best),
                                                                 start=best),
                             options.progress,
                             fits=lambda m: fits_in_memory(self._memory_estimate(fitted.n_points, m, n_problems)),
                             sizes=sizes)

    def _fit_minibatch(self, X, y, Z, kernel, likelihood, options, learn_likelihood, start=None):
        """Learn one problem from minibatches (:mod:`fastep._sparse.stochastic`); ``start``: a
        previous minibatch fit to continue from (its hyperprior, parameters, Z and tied site)."""
        window, site_window = minibatch_windows(X.shape[0], Z.shape[0])
        options = options.replace(window=window, site_window=site_window)
        if start is not None:
            hyper = copy.deepcopy(start.hyperparameters)
            if hyper.extra is not None and not self._learns_inducing():
                # a fit that learnt Z in its second stage continues at that stage's step
                options = options.replace(learning_rate=options.learning_rate * SECOND_STAGE_STEP)
        else:
            hyper = Hyperparameters(kernel, likelihood, learn_likelihood,
                                    extra=Z if self._learns_inducing() else None, hyperprior=options.hyperprior)
        source = _minibatch.RowSource(X, y)
        fitted = _minibatch.fit_minibatch(kernel, likelihood, Z, source, options, hyper,
                                          learn=self.optimizer is not None, start=start)
        if start is None and self._places_inducing_by_relevance() and fitted.info.stopped != "callback":
            weights = relevance_weights(fitted.kernel, X.shape[1])
            if weights is not None:
                # the second stage: k-means++ in the learnt kernel's metric, learning continued there
                Z2 = self._inducing_by_relevance(X, weights, Z.shape[0], options.seed)
                first = fitted
                second_options = options
                if self._learns_inducing_second_stage(first.kernel, Z2):
                    # Z learnt too, from the re-placed inputs, at a third of the first stage's step
                    hyper = Hyperparameters(kernel, likelihood, learn_likelihood, extra=Z2,
                                            hyperprior=options.hyperprior)
                    second_options = options.replace(learning_rate=options.learning_rate * SECOND_STAGE_STEP)
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
        if options is not None and options.minibatch:
            return minibatch_sparse_bytes(n, m, batch_size=options.batch_size, n_features=options.n_features,
                                          n_problems=n_problems,
                                          n_concurrent=concurrent_problems(getattr(self, "n_jobs", None)),
                                          per_point_sites=options.sites == "per-point")
        return self._full_batch_memory_estimate(n, m, n_problems)

    def _full_batch_memory_estimate(self, n, m, n_problems):
        """Peak working memory of fitting ``n_problems`` problems on n rows at m inducing inputs."""
        return sparse_gp_bytes(n, m, learning=self.optimizer is not None, n_problems=n_problems,
                               n_concurrent=concurrent_problems(getattr(self, "n_jobs", None)),
                               kmeans=self._resolved_init() == "kmeans++")

    def _check_memory(self, n, m, options):
        """Raise :class:`~fastep.exceptions.MemoryLimitError` before an in-core fit at m inducing
        inputs of ``options.n_problems`` problems that cannot fit in memory."""
        n_problems = options.n_problems
        if options.minibatch:
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

    def _learn(self, problem, start=None):
        """Learn one problem's hyperparameters from its kernel and likelihood (the hyperprior's
        centre); with ``start`` (a fitted problem) the search starts at its kernel and likelihood
        instead."""
        if start is not None:
            hyper = problem.hyperparameters
            hyper.space.start_at(hyper.pack(start.kernel, start.likelihood, problem.Z))
        return self._fit_problem(problem)

    def _check_fit_options(self, options, kernel, likelihood, learn_likelihood):
        """Checks of the likelihood against ``power`` shared by every fit, before any work."""
        if learn_likelihood:
            _check_likelihood_learnable_with_power(likelihood, options.power)
        if options.power < 1.0:
            # the same check as the engine: a pointwise log density is needed
            power_moments_array(likelihood.site_spec(), np.ones(1), np.zeros(1), np.ones(1),
                                        power=options.power, n_quadrature=options.n_quadrature)

    def _fit_chunked(self, X, y, client, kernel, likelihood, options, learn_likelihood, classifier):
        """Fit on a row-chunked dask array by the map-reduce form of the parallel schedule
        (:mod:`fastep._sparse.distributed`); returns the fitted problems."""
        caller = f"{type(self).__name__}.fit"
        if options.schedule != _engine.SPARSE_PARALLEL:
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

            return self._fit_growing(make_problem, choose, Z, options)

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
