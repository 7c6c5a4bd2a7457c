"""Sparse EP on data held in row chunks, possibly on a Dask cluster: the parallel schedule as a map-reduce.

Given the posterior ``q(w) = N(μ_w, A⁻¹)``, ``A = I + Σ_i τ_i v_i v_iᵀ = Rᵀ R``, each site's
marginal ``E[g_i] = v_iᵀ μ_w``, ``Var[g_i] = |R⁻ᵀ v_i|²``, its cavity, its powered moments
and its new (damped) parameters depend only on its own row ``v_i`` of ``K_nm L⁻ᵀ``; the next
posterior needs only the sums ``Σ τ_i v_i v_iᵀ`` and ``Σ ν_i v_i``; and the evidence is
``-½ log|A| + ½ bᵀA⁻¹b`` plus a sum of per-site terms.  So one iteration of the parallel
schedule of :mod:`fastep._epcore.sparse_ep` is

* **map**, on every row chunk (``sparse_ep._parallel_chunk_step``): marginals from
  ``(R, μ_w)``, the chunk's evidence terms, the damped site update, the chunk's m x m and
  m-vector sums;
* **reduce**, on the driver (:func:`fastep._sparse.blocks.posterior_from_sums`): add the
  sums and the identity, factorise, solve.

The evidence gradient is two more such passes (:mod:`fastep._sparse.blocks`).  A chunk keeps
its rows of X, its targets, its projections ``Vt`` and FITC diagonal and its sites where
they are; only m x m matrices and m-vectors travel.  The driver never holds an array of
length n.  Iterates, convergence test and sweep counts are those of the in-core engine, so
both reach the same fixed point (up to the summation order of the reductions).

Executors: :class:`LocalChunks` runs the chunk tasks in this process (tests, and the
reduction without a cluster), :class:`DaskChunks` on the workers of a
``dask.distributed.Client`` (each task pinned to the worker that holds its chunk).
"""
import contextlib
import copy

import numpy as np

from .. import _validation as v
from .._epcore import sparse_ep as _engine
from .._epcore._common import SweepDriver, SweepResult
from .._gp.fit_options import SparseFitOptions
from .._gp.hyperparameters import Hyperparameters
from .._gp.problem import WARM_START_FAILURES, SiteProblem
from .._sparse.blocks import (SparsePredictor, gradient_first_sums, gradient_from_sums,
                             gradient_second_sums, posterior_from_sums, project_rows,
                             times_inverse_a)

__all__ = ["Chunk", "LocalChunks", "DaskChunks", "DistributedSparseEP", "run_parallel_ep"]


class Chunk:
    """A row chunk of one sparse EP problem: its data, projections, sites and last results.

    Tasks return a new ``Chunk`` that shares the unchanged arrays with its input (no copy),
    so a chunk's memory is O(rows x (n_features + m)) however many iterations run.
    """

    def __init__(self, X, y):
        self.X = X
        self.y = y
        n = X.shape[0]
        self.Vt = None
        self.d = None
        self.site_precision = np.zeros(n)
        self.site_natural_mean = np.zeros(n)
        self.g_mean = None
        self.g_var = None
        self.previous = None     # (τ, ν, E[g], Var[g]) before the last update
        self.a = None
        self.c = None
        self.summary = None      # the small result the driver gathers

    def replace(self, **changes):
        new = copy.copy(self)
        new.summary = None
        new.__dict__.update(changes)
        return new


# --------------------------------------------------------------------------------------------
# chunk tasks: module-level functions (they run on the workers and pickle by reference)
# --------------------------------------------------------------------------------------------

def load_chunk(X, y, kernel, classifier):
    """Validate one chunk of (X, y) (finite float64 X, matching y) and wrap it as a :class:`Chunk`."""
    X, y = v.check_X_y(X, y, y_numeric=not classifier)
    if kernel is not None:
        kernel._validate_X(X, "X")
    if classifier:
        v.check_class_labels(y)
    chunk = Chunk(X, y)
    chunk.summary = np.unique(y) if classifier else None
    return chunk


def target_moments(chunk):
    """The chunk, summarised by ``(rows, Σ y, Σ y²)`` of its targets."""
    new = chunk.replace()
    new.summary = (chunk.y.shape[0], float(np.sum(chunk.y)), float(np.sum(chunk.y * chunk.y)))
    return new


def binary_targets(chunk, positive):
    """The chunk with ±1 targets: +1 where the label equals ``positive`` (None: keep y as is)."""
    y = chunk.y if positive is None else np.where(chunk.y == positive, 1.0, -1.0)
    return Chunk(chunk.X, y)


def chunk_project(chunk, kernel, Z, Kmm, options):
    """The chunk with ``Vt`` and ``d`` for the given kernel and inducing inputs (sites kept)."""
    _, Vt, d = project_rows(kernel, chunk.X, Z, Kmm, options)
    return chunk.replace(Vt=Vt, d=d, previous=None, g_mean=None, g_var=None)


def chunk_start(chunk, warm):
    """The chunk with its sites (``warm``) or zero sites, summarised by their natural sums."""
    if warm:
        new = chunk.replace()
    else:
        n = chunk.X.shape[0]
        new = chunk.replace(site_precision=np.zeros(n), site_natural_mean=np.zeros(n))
    new.summary = _engine._natural_sums(new.Vt, new.site_precision, new.site_natural_mean)
    return new


def chunk_iterate(chunk, R, w_mean, likelihood, options, update):
    """One map step of the parallel schedule (``sparse_ep._parallel_chunk_step``)."""
    step = _engine._parallel_chunk_step(
        chunk.Vt, chunk.d, chunk.y, likelihood.site_spec(), chunk.site_precision,
        chunk.site_natural_mean, R, w_mean, power=options.power,
        n_quadrature=options.n_quadrature, damping=options.damping,
        negative_precision=options.negative_precision, update=update)
    if update:
        new = chunk.replace(site_precision=step["site_precision"],
                            site_natural_mean=step["site_natural_mean"],
                            previous=(chunk.site_precision, chunk.site_natural_mean, step["g_mean"],
                                      step["g_var"]),
                            g_mean=None, g_var=None)
    else:
        new = chunk.replace(g_mean=step["g_mean"], g_var=step["g_var"], previous=None)
    new.summary = {key: val for key, val in step.items()
                   if key not in ("g_mean", "g_var", "site_precision", "site_natural_mean")}
    return new


def chunk_rollback(chunk):
    """The chunk at its sites before the last update, with their marginals."""
    tau, nu, g_mean, g_var = chunk.previous
    return chunk.replace(site_precision=tau, site_natural_mean=nu, g_mean=g_mean, g_var=g_var,
                         previous=None)


def chunk_gradient_first(chunk, L, likelihood, options, learn_likelihood):
    """First gradient pass (:func:`fastep._sparse.blocks.gradient_first_sums`) on the chunk."""
    P, Ua, lik, a, c = gradient_first_sums(L, chunk.Vt, chunk.d, chunk.y, chunk.site_precision,
                                           chunk.site_natural_mean, chunk.g_mean, chunk.g_var,
                                           likelihood, options, learn_likelihood)
    new = chunk.replace(a=a, c=c)
    new.summary = (P, Ua, lik)
    return new


def chunk_gradient_second(chunk, kernel, Z, L, Ua, PA, learn_inducing):
    """Second gradient pass (:func:`fastep._sparse.blocks.gradient_second_sums`); the chunk's
    ``a`` and ``c`` are dropped."""
    new = chunk.replace(a=None, c=None)
    new.summary = gradient_second_sums(kernel, Z, chunk.X, L, chunk.Vt, chunk.site_precision, chunk.a,
                                       chunk.c, Ua, PA, learn_inducing)
    return new


def chunk_summary(chunk):
    return chunk.summary


def chunk_sites(chunk, name):
    return getattr(chunk, name)


# --------------------------------------------------------------------------------------------
# executors
# --------------------------------------------------------------------------------------------

class LocalChunks:
    """Run chunk tasks in this process, one after the other (a list of :class:`Chunk`)."""

    def map(self, fn, chunks, *args):
        return [fn(chunk, *args) for chunk in chunks]

    def summaries(self, chunks):
        return [chunk.summary for chunk in chunks]

    def sites(self, chunks, name, sizes):
        return np.concatenate([getattr(chunk, name) for chunk in chunks])


#: Bytes of array arguments sent inline with the tasks of one map call before they are scattered.
_INLINE_BYTES = 1 << 20


class DaskChunks:
    """Run chunk tasks on a Dask cluster; each task goes to the worker holding its chunk.

    Chunks are ``distributed.Future`` objects; arrays among the task arguments (the m x m
    state) are scattered to every worker once per call, not once per task.
    """

    def __init__(self, client):
        self.client = client
        self._where = {}

    def load(self, X, y, kernel, classifier):
        """Chunk futures of the row blocks of dask arrays X (n, d; one column chunk) and y."""
        import dask
        from distributed import wait

        x_blocks = X.to_delayed().ravel()
        y_blocks = y.to_delayed().ravel()
        tasks = [dask.delayed(load_chunk)(xb, yb, kernel, classifier)
                 for xb, yb in zip(x_blocks, y_blocks)]
        futures = self.client.compute(tasks)
        wait(futures)
        for future in futures:
            if future.status == "error":
                future.result()              # raises the chunk's exception here
        who_has = self.client.who_has(futures)
        for future in futures:
            self._where[future.key] = list(who_has[future.key])
        return futures

    def map(self, fn, chunks, *args):
        # The m x m arguments go inline with each task while that costs less than a round trip
        # to scatter them (~1 MB per call); above, they are scattered to every worker once.
        inline = sum(arg.nbytes for arg in args if isinstance(arg, np.ndarray)) * len(chunks)
        if inline > _INLINE_BYTES:
            shared = [self.client.scatter(arg, broadcast=True, hash=False)
                      if isinstance(arg, np.ndarray) and arg.nbytes > 8 * 1024 else arg for arg in args]
        else:
            shared = args
        out = []
        for chunk in chunks:
            where = self._where.get(chunk.key)
            future = self.client.submit(fn, chunk, *shared, pure=False, workers=where,
                                        allow_other_workers=True)
            self._where[future.key] = where
            out.append(future)
        return out

    def summaries(self, chunks):
        futures = [self.client.submit(chunk_summary, chunk, pure=False, workers=self._where.get(chunk.key),
                                      allow_other_workers=True) for chunk in chunks]
        return self.client.gather(futures)

    def sites(self, chunks, name, sizes):
        """A dask array of the chunks' ``name`` arrays (they stay on the workers)."""
        import dask
        import dask.array as da

        parts = [da.from_delayed(dask.delayed(chunk_sites)(chunk, name), shape=(size,), dtype=np.float64)
                 for chunk, size in zip(chunks, sizes)]
        return da.concatenate(parts)

    def forget(self, chunks):
        for chunk in chunks:
            self._where.pop(chunk.key, None)


# --------------------------------------------------------------------------------------------
# the driver
# --------------------------------------------------------------------------------------------

def _sum(parts):
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def run_parallel_ep(executor, chunks, likelihood, options):
    """Parallel (damped) sparse EP over row chunks, from the chunks' current sites.

    ``chunks``: the output of :func:`chunk_start` (projections and starting sites).  The loop,
    the convergence test (largest relative site change and relative change of log Z below
    ``tol``, no failed site) and the counts are those of
    :class:`~fastep._epcore.sparse_ep.SparseEP` with ``schedule=SPARSE_PARALLEL``.  Each map
    step returns the evidence of the sites it received and updates them, so the test for
    iteration k completes one step later; the update made in that step is then undone
    (:func:`chunk_rollback`).

    Returns ``(chunks, R, w_mean, info)`` with the final chunks (sites, marginals), the
    posterior factor and mean and the engine's info dict.  Raises
    ``numpy.linalg.LinAlgError`` if a factorisation fails.
    """
    max_sweeps, tol = options.max_sweeps, options.tol
    sums = executor.summaries(chunks)
    R, w_mean, half_log_det, quad_b = posterior_from_sums(_sum([s[0] for s in sums]),
                                                          _sum([s[1] for s in sums]))
    log_z = None
    last = None                       # stats of the update that produced the current sites
    totals = dict(n_skipped=0, n_clipped=0, n_failed=0)
    n_sweeps = 0
    driver = SweepDriver(tol, max_sweeps)
    for step in range(1, max_sweeps + 2):
        update = step <= max_sweeps
        new = executor.map(chunk_iterate, chunks, R, w_mean, likelihood, options, update)
        summaries = executor.summaries(new)
        terms = [s["log_z_sites"] for s in summaries]
        new_log_z = (-half_log_det + 0.5 * quad_b + float(np.sum(terms))
                     if all(s["bad_site"] < 0 for s in summaries) else np.nan)
        converged = last is not None and driver.test_change(last["max_change"], new_log_z, log_z, last["n_failed"])
        log_z = new_log_z
        if converged or not update:
            chunks = executor.map(chunk_rollback, new) if update else new
            break
        last = dict(max_change=max(s["max_change"] for s in summaries),
                    n_failed=sum(s["n_failed"] for s in summaries))
        for key in totals:
            totals[key] += sum(s[key] for s in summaries)
        R, w_mean, half_log_det, quad_b = posterior_from_sums(
            _sum([s["precision_sum"] for s in summaries]), _sum([s["natural_mean_sum"] for s in summaries]))
        chunks = new
        n_sweeps = step
    info = SweepResult(n_sweeps=n_sweeps, converged=driver.converged and bool(np.isfinite(log_z)),
                       max_change=last["max_change"] if last is not None else np.inf, log_z=float(log_z),
                       log_z_change=driver.log_z_change, counts=totals)
    return chunks, R, w_mean, info


class DistributedSparseEP(SiteProblem):
    """One binary (or regression) sparse EP problem over row chunks (parallel schedule).

    The counterpart of :class:`fastep._sparse.problem._BinarySparseEP` for chunked data: the same
    evidence, gradient and prediction state, computed by map-reduce over ``chunks`` with
    ``executor``.  Holds no array of length n: the sites stay in the chunks.
    """

    options_class = SparseFitOptions

    algorithm = "sparse EP"

    def __init__(self, kernel, likelihood, Z, executor, chunks, sizes, options, learn_likelihood,
                 learn_inducing):
        self.kernel, self.likelihood, self.Z = kernel, likelihood, Z
        self.executor, self.chunks, self.sizes = executor, chunks, list(sizes)
        self.options, self.has_sites = options, False
        self.learn_likelihood, self.learn_inducing = learn_likelihood, learn_inducing
        self.hyperparameters = Hyperparameters(kernel, likelihood, learn_likelihood,
                                               extra=Z if learn_inducing else None,
                                               hyperprior=options.hyperprior)

    def __getstate__(self):
        """A saved or pickled copy keeps what prediction needs: the cluster's executor and the
        chunks (futures on its workers) are dropped, the sites are computed into arrays."""
        state = super().__getstate__()
        state.update(executor=None, chunks=None, has_sites=False)
        for name in ("site_precision", "site_natural_mean"):
            if is_dask_array(state.get(name)):
                state[name] = np.asarray(state[name])
        return state

    def _run_from(self, projected, likelihood, warm):
        started = self.executor.map(chunk_start, projected, warm)
        chunks, R, w_mean, info = run_parallel_ep(self.executor, started, likelihood, self.options)
        if not np.isfinite(info.log_z):
            raise np.linalg.LinAlgError(
                f"sparse EP could not form a proper cavity at {info.n_failed} site(s) and the log "
                "marginal likelihood is not finite; increase jitter or check the kernel")
        return chunks, R, w_mean, info

    def evaluate(self, params, *, gradient, warm, keep=False):
        """As :meth:`fastep._sparse.problem._BinarySparseEP.evaluate`, by map-reduce over the chunks."""
        if self.executor is None:
            raise ValueError("this model was fitted on a Dask cluster and then saved or pickled: its training "
                             "data stayed on the cluster, so the evidence cannot be evaluated again; refit it")
        kernel, likelihood, Z = params
        if Z is None:
            Z = self.Z
        opts = self.options
        Kmm = np.ascontiguousarray(kernel._K(Z, None), dtype=np.float64)
        if not np.all(np.isfinite(Kmm)):
            raise ValueError(f"the kernel {kernel!r} produced non-finite values in K(Z, Z)")
        L, _, _ = _engine.sparse_projection(Kmm, np.empty((0, Z.shape[0])), np.empty(0),
                                            approximation=opts.approximation, jitter=opts.jitter)
        projected = self.executor.map(chunk_project, self.chunks, kernel, Z, Kmm, opts)
        result = None
        if warm and self.has_sites:
            with contextlib.suppress(*WARM_START_FAILURES):
                result = self._run_from(projected, likelihood, warm=True)
        if result is None or result[3].n_failed:
            result = self._run_from(projected, likelihood, warm=False)
        chunks, R, w_mean, info = result
        self.chunks, self.has_sites = chunks, True
        grad = None
        if gradient:
            first = self.executor.map(chunk_gradient_first, chunks, L, likelihood, opts,
                                      self.learn_likelihood)
            sums = self.executor.summaries(first)
            P, Ua, lik_grad = (_sum([s[k] for s in sums]) for k in range(3))
            second = self.executor.map(chunk_gradient_second, first, kernel, Z, L, Ua,
                                       times_inverse_a(P, R), self.learn_inducing)
            sums = self.executor.summaries(second)
            g_kernel, Gmm = _sum([s[0] for s in sums]), _sum([s[1] for s in sums])
            g_z = _sum([s[2] for s in sums]) if self.learn_inducing else None
            grad = gradient_from_sums(kernel, Z, g_kernel, Gmm, g_z, lik_grad, self.learn_likelihood,
                                      self.learn_inducing)
        if keep:
            self.kernel, self.likelihood, self.Z = kernel, likelihood, Z
            self.predictor = SparsePredictor(kernel, likelihood, Z, L, R, w_mean)
            self.log_ml, self.info = float(info.log_z), info
            self.site_precision = self.executor.sites(chunks, "site_precision", self.sizes)
            self.site_natural_mean = self.executor.sites(chunks, "site_natural_mean", self.sizes)
        return float(info.log_z), grad, info

    @property
    def n_points(self):
        return int(sum(self.sizes))

    def sites(self):
        return self.chunks, self.has_sites

    def restore_sites(self, sites):
        self.chunks, self.has_sites = sites



# --------------------------------------------------------------------------------------------
# dask arrays in and out
# --------------------------------------------------------------------------------------------

#: Rows of X gathered on the driver for the k-means++ start of the inducing inputs (a seeded
#: uniform subsample when X has more rows).
KMEANS_SAMPLE_ROWS = 100_000


def is_dask_array(X):
    """Whether ``X`` is a ``dask.array.Array`` (without importing dask)."""
    return type(X).__module__.split(".")[0] == "dask" and hasattr(X, "map_blocks")


def import_dask(caller):
    """``(dask.array, distributed)``, or an ``ImportError`` naming the ``dask`` extra."""
    try:
        import dask.array as da
        import distributed
    except ImportError as exc:
        raise ImportError(f"{caller} on a dask array needs Dask distributed: pip install \"fastep[dask]\""
                          ) from exc
    return da, distributed


def load_dask_data(X, y, client, kernel, classifier, caller):
    """Validate dask arrays ``X`` (n, d) and ``y`` (n,) and load their row chunks on the workers.

    Returns ``(executor, chunks, sizes, X)``: a :class:`DaskChunks` on ``client`` (default: the
    current client), futures of :class:`Chunk` objects (validated on the workers), the rows per
    chunk, and X with one column chunk.
    """
    X, client = _checked_dask_inputs(X, y, client, caller)
    da, _ = import_dask(caller)
    X = X.rechunk({1: -1})
    y = y if is_dask_array(y) else da.from_array(np.asarray(y), chunks=(X.chunks[0],))
    if y.ndim != 1:
        raise ValueError(f"y must be a 1-D array, got shape {y.shape}")
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"X and y have inconsistent numbers of samples: {X.shape[0]} and {y.shape[0]}")
    y = y.rechunk((X.chunks[0],))
    executor = DaskChunks(client)
    chunks = executor.load(X, y, kernel, classifier)
    return executor, chunks, list(X.chunks[0]), X


class DriverRows:
    """Rows of a dask array ``X`` (n, d) fetched to the driver on request, for minibatch learning.

    Indexing with a slice or a sorted integer array computes those rows on ``client`` and
    returns them as a float64 numpy array (a ``ValueError`` if they hold NaN or infinity);
    nothing else of X is held. :meth:`prefetch` starts
    computing a row range so that the next read finds it ready.
    """

    ndim = 2
    dtype = np.dtype(np.float64)

    def __init__(self, X, client):
        self.X, self.client = X, client
        self.shape = tuple(int(s) for s in X.shape)
        self._pending = {}

    def __len__(self):
        return self.shape[0]

    def prefetch(self, start, stop):
        if (start, stop) not in self._pending:
            self._pending[(start, stop)] = self.client.compute(self.X[start:stop])

    def __getitem__(self, key):
        future = None
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            future = self._pending.pop((start, stop), None) if step == 1 else None
        elif not isinstance(key, tuple):
            key = np.asarray(key)
        if future is None:
            future = self.client.compute(self.X[key])
        rows = np.ascontiguousarray(future.result(), dtype=np.float64)
        if not np.all(np.isfinite(rows)):
            raise ValueError("X must not contain NaN or infinity (found in rows read from the dask array)")
        return rows


def _checked_dask_inputs(X, y, client, caller):
    """``(X, client)`` after the checks every dask fit makes (X a 2-D dask array of known row
    chunks, a distributed client, y given)."""
    _, distributed = import_dask(caller)
    if not is_dask_array(X):
        raise TypeError(f"{caller} with client= needs X as a dask.array.Array of shape (n_samples, "
                        f"n_features), chunked by rows; got {type(X).__name__}")
    if client is None:
        try:
            client = distributed.default_client()
        except ValueError:
            raise ValueError(f"{caller} on a dask array needs a Dask client: pass client= or create a "
                             "dask.distributed.Client first") from None
    if not isinstance(client, distributed.Client):
        raise TypeError(f"client must be a dask.distributed.Client, got {type(client).__name__}")
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-D array (n_samples, n_features), got shape {X.shape}")
    if any(np.isnan(c) for c in X.chunks[0]):
        raise ValueError("X has unknown chunk sizes; call X.compute_chunk_sizes() first")
    if X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"X must have at least 1 row and 1 column, got shape {X.shape}")
    if y is None:
        raise ValueError("this estimator requires y to be passed, but the target y is None")
    return X, client


def driver_rows(X, y, client, caller):
    """Validate dask arrays ``X`` (n, d) and ``y`` (n,) for minibatch learning on the driver.

    Returns ``(DriverRows over X, y as a numpy array)``: y (n values) is computed on the
    driver (and left for the caller to validate), X stays on the cluster and is read in row
    ranges (its finiteness is checked as each range is read).
    """
    X, client = _checked_dask_inputs(X, y, client, caller)
    y = np.asarray(client.compute(y).result() if is_dask_array(y) else y)
    return DriverRows(X, client), y


def take_rows(executor, X, index):
    """Rows ``index`` (sorted, unique) of the dask array X, as a numpy array on the driver."""
    return np.ascontiguousarray(executor.client.compute(X[np.asarray(index)]).result(), dtype=np.float64)
