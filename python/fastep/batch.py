"""Many independent fits at once: a thread pool on this machine, or a Dask cluster.

:func:`fit_many` fits a fresh copy of an estimator (or of each of several estimators) on
each of many data sets -- one-vs-rest problems, cross-validation folds, hyperparameter
grids, bootstrap replicates, one model per user or per sensor -- and returns the fitted
copies in input order.

On this machine the fits run in a thread pool: fastep's compiled loops release the GIL, so
threads run them side by side without copying the data. Given a
``dask.distributed.Client`` the fits run on the cluster's workers instead; each distinct
input array is sent to the cluster once (``Client.scatter``), however many fits use it.
"""
from __future__ import annotations

import copy
import dataclasses
import numbers
import os
import threading
import time
from typing import TYPE_CHECKING, overload

from threadpoolctl import threadpool_limits

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, Literal, Protocol, TypeVar

    from numpy.typing import ArrayLike

    class _Estimator(Protocol):
        """What :func:`fit_many` fits: an estimator with scikit-learn's ``get_params`` and ``fit``."""

        def get_params(self, deep: bool = ...) -> dict[str, Any]: ...

        def fit(self, X: Any, y: Any, /) -> Any: ...

    _E = TypeVar("_E", bound=_Estimator)
    _T = TypeVar("_T")
    _R = TypeVar("_R")

__all__ = ["fit_many", "map_in_order", "BatchProgress", "effective_n_jobs"]


@dataclasses.dataclass(repr=False, slots=True)
class BatchProgress:
    """What :func:`fit_many` reports after each finished fit.

    Parameters
    ----------
    index, n_done, n_total : int
    failed : bool
    elapsed : float
    converged : bool or None, default None
        As the attributes.

    Attributes
    ----------
    index : int
        Position (in the input order) of the fit that just finished.
    n_done : int
        Fits finished so far, this one included.
    n_total : int
        Fits in the batch.
    failed : bool
        Whether this fit raised.
    elapsed : float
        Seconds since the batch started.
    converged : bool or None
        The fitted model's ``converged_`` (False: it is returned, but EP or the search did not
        converge; :func:`fit_many` also warns); None for a failed fit or a model without it.

    Examples
    --------
    >>> from fastep.batch import BatchProgress
    >>> BatchProgress(index=3, n_done=1, n_total=10, failed=False, elapsed=0.5)
    BatchProgress(index=3, n_done=1, n_total=10, failed=False, elapsed=0.50 s, converged=None)
    """

    index: int
    n_done: int
    n_total: int
    failed: bool
    elapsed: float
    converged: bool | None = None

    def __repr__(self) -> str:
        return (f"BatchProgress(index={self.index}, n_done={self.n_done}, n_total={self.n_total}, "
                f"failed={self.failed}, elapsed={self.elapsed:.2f} s, converged={self.converged})")


def effective_n_jobs(n_jobs: int | None) -> int:
    """The number of workers ``n_jobs`` asks for, scikit-learn's convention.

    Parameters
    ----------
    n_jobs : int or None
        ``None`` or 1: one worker; a positive integer: that many; ``-1``: as many as the
        process may use CPU cores; ``-2``: all but one, and so on.

    Returns
    -------
    int
        At least 1.

    Examples
    --------
    >>> from fastep.batch import effective_n_jobs
    >>> effective_n_jobs(None), effective_n_jobs(3)
    (1, 3)
    >>> effective_n_jobs(-1) >= 1
    True
    """
    if n_jobs is None:
        return 1
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, numbers.Integral) or n_jobs == 0:
        raise ValueError(f"n_jobs must be None or a non-zero integer, got {n_jobs!r}")
    if n_jobs > 0:
        return int(n_jobs)
    return max(1, _n_cores() + 1 + int(n_jobs))


def _n_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def map_in_order(function: Callable[[_T], _R], items: Iterable[_T], n_jobs: int | None) -> list[_R]:
    """``[function(item) for item in items]``, in a thread pool when ``n_jobs`` is an integer.

    The policy of ``n_jobs`` in fastep: None runs the calls one after the other with the
    process's BLAS threads; an integer ``k`` (``-1``: one per core) runs them in a pool of
    ``min(k, len(items))`` threads, every BLAS call on one thread (so the results are
    bitwise identical for every integer ``n_jobs``, 1 included). The first exception raised
    by a call is raised after the running calls end.

    Parameters
    ----------
    function : callable
        Called once per item; must be safe to run in several threads at once.
    items : sequence
    n_jobs : int or None

    Returns
    -------
    list
        The results, in the order of ``items``.

    Examples
    --------
    >>> from fastep.batch import map_in_order
    >>> map_in_order(lambda x: x * x, [1, 2, 3], n_jobs=2)
    [1, 4, 9]
    """
    items = list(items)
    if n_jobs is None:
        return [function(item) for item in items]
    n_workers = min(effective_n_jobs(n_jobs), max(len(items), 1))
    with threadpool_limits(1, user_api="blas"):
        if n_workers == 1:
            return [function(item) for item in items]
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(n_workers, thread_name_prefix="fastep-n-jobs") as pool:
            futures = [pool.submit(function, item) for item in items]
            errors = [f.exception() for f in futures]
            for error in errors:
                if error is not None:
                    raise error
            return [f.result() for f in futures]


def _fresh_copy(estimator):
    """An unfitted estimator with deep copies of ``estimator``'s constructor parameters."""
    if not hasattr(estimator, "get_params") or not hasattr(estimator, "fit"):
        raise TypeError(f"estimator must be a fastep (or scikit-learn) estimator with get_params and "
                        f"fit, got {type(estimator).__name__}")
    params = {name: copy.deepcopy(value) for name, value in estimator.get_params(deep=False).items()}
    return type(estimator)(**params)


def _fit_one(estimator, X, y):
    return _fresh_copy(estimator).fit(X, y)


def _pairs(estimator, datasets):
    """``[(estimator, X, y), ...]``: one estimator broadcast over many data sets, many over one,
    or one to one."""
    if isinstance(datasets, tuple) and len(datasets) == 2 and not isinstance(datasets[0], tuple):
        raise TypeError("datasets must be a sequence of (X, y) pairs; wrap a single data set as [(X, y)]")
    try:
        datasets = list(datasets)
    except TypeError:
        raise TypeError(f"datasets must be a sequence of (X, y) pairs, got {type(datasets).__name__}") from None
    for i, item in enumerate(datasets):
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TypeError(f"datasets[{i}] must be an (X, y) pair, got {type(item).__name__}")
    estimators = list(estimator) if isinstance(estimator, (list, tuple)) else [estimator]
    for est in estimators:
        if not hasattr(est, "get_params") or not hasattr(est, "fit"):
            raise TypeError(f"estimator must be an estimator or a list of estimators, got "
                            f"{type(est).__name__}")
    if not estimators or not datasets:
        raise ValueError("fit_many needs at least one estimator and one data set")
    if len(estimators) == 1:
        estimators = estimators * len(datasets)
    elif len(datasets) == 1:
        datasets = datasets * len(estimators)
    elif len(estimators) != len(datasets):
        raise ValueError(f"{len(estimators)} estimators and {len(datasets)} data sets: give one estimator, "
                         "one data set, or as many estimators as data sets")
    return [(est, X, y) for est, (X, y) in zip(estimators, datasets)]


def _check_on_error(on_error):
    if on_error not in ("raise", "collect"):
        raise ValueError(f"on_error must be 'raise' or 'collect', got {on_error!r}")


@overload
def fit_many(estimator: _E | list[_E] | tuple[_E, ...], datasets: Iterable[tuple[ArrayLike, ArrayLike]], *,
             n_jobs: int | None = None, client: Any = None, on_error: Literal["raise"] = "raise",
             progress: Callable[[BatchProgress], object] | None = None) -> list[_E]: ...
@overload
def fit_many(estimator: _E | list[_E] | tuple[_E, ...], datasets: Iterable[tuple[ArrayLike, ArrayLike]], *,
             n_jobs: int | None = None, client: Any = None, on_error: Literal["collect"],
             progress: Callable[[BatchProgress], object] | None = None) -> list[_E | BaseException]: ...
@overload
def fit_many(estimator: _E | list[_E] | tuple[_E, ...], datasets: Iterable[tuple[ArrayLike, ArrayLike]], *,
             n_jobs: int | None = None, client: Any = None, on_error: str = "raise",
             progress: Callable[[BatchProgress], object] | None = None) -> list[_E] | list[_E | BaseException]: ...
def fit_many(estimator: Any, datasets: Any, *, n_jobs: int | None = None, client: Any = None,
             on_error: str = "raise", progress: Callable[[BatchProgress], object] | None = None) -> list[Any]:
    """Fit a fresh copy of an estimator on each of many data sets.

    Parameters
    ----------
    estimator : estimator or list of estimators
        What to fit. Each fit uses a new unfitted copy (its constructor parameters deep-copied),
        so the estimators passed in are never modified. One estimator is fitted on every data
        set; a list is paired with ``datasets`` element by element, or with a single data set
        (a hyperparameter grid).
    datasets : sequence of (X, y) pairs
        The training data of each fit.
    n_jobs : int or None, default None
        Fits run at once in this process's thread pool (``-1``: one per core, ``-2``: all but
        one, ...). ``None`` fits one after the other and leaves the BLAS libraries as they
        are. With an integer, including 1, every fit's BLAS calls run on one thread (the
        pool's workers are the parallelism; ``threadpoolctl`` sets it for the duration of
        the call and restores it after -- the one place fastep changes a thread count, at
        the caller's request), so the results are bitwise identical for every integer
        ``n_jobs``. Ignored when ``client`` is given (Dask's workers run their BLAS on one
        thread by default).
    client : dask.distributed.Client, optional
        Run the fits on this Dask cluster's workers. Each distinct array is scattered to
        the cluster once, however many fits use it. Needs the ``dask`` extra
        (``pip install "fastep[dask]"``).
    on_error : {'raise', 'collect'}, default 'raise'
        ``'raise'``: the first failing fit's exception is raised (after the running fits
        end). ``'collect'``: a failing fit's exception object takes its place in the
        returned list and the other fits are kept. On a cluster a fit whose worker dies is
        run again on another worker (Dask's ``allowed-failures``); once Dask gives up, its
        ``KilledWorker`` exception is that fit's failure.
    progress : callable, optional
        Called in the calling thread after each fit finishes, with a :class:`BatchProgress`.

    Returns
    -------
    list
        The fitted estimators (or, with ``on_error='collect'``, exceptions) in input order.
        Every estimator in it completed its ``fit``; none is partial.

    Warns
    -----
    ConvergenceWarning
        Once, naming the fits whose model has ``converged_`` False (they are returned; the
        warnings a fit raises in a pool thread or on a worker do not reach the caller).

    Examples
    --------
    >>> import numpy as np
    >>> from fastep import GaussianProcessRegressor
    >>> from fastep.batch import fit_many
    >>> rng = np.random.default_rng(0)
    >>> datasets = []
    >>> for _ in range(4):
    ...     X = rng.normal(size=(30, 2))
    ...     datasets.append((X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=30)))
    >>> models = fit_many(GaussianProcessRegressor(), datasets, n_jobs=2)
    >>> len(models), all(m.n_features_in_ == 2 for m in models)
    (4, True)

    With ``on_error='collect'`` a fit that fails is returned as its exception:

    >>> bad = (np.ones((3, 2)), np.array([1.0, np.nan, 2.0]))
    >>> out = fit_many(GaussianProcessRegressor(), [datasets[0], bad], on_error="collect")
    >>> type(out[1]).__name__
    'ValueError'
    """
    _check_on_error(on_error)
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable, got {type(progress).__name__}")
    tasks = _pairs(estimator, datasets)
    if client is not None:
        results = _fit_on_cluster(client, tasks, on_error, progress)
    elif n_jobs is None:
        results = _fit_in_threads(tasks, 1, on_error, progress)
    else:
        n_workers = effective_n_jobs(n_jobs)
        with threadpool_limits(1, user_api="blas"):
            results = _fit_in_threads(tasks, n_workers, on_error, progress)
    _warn_unconverged(results)
    return results


def _converged(result):
    if isinstance(result, BaseException):
        return None
    value = getattr(result, "converged_", None)
    return None if value is None else bool(value)


def _warn_unconverged(results):
    late = [i for i, result in enumerate(results) if _converged(result) is False]
    if late:
        import warnings
        from .exceptions import ConvergenceWarning
        warnings.warn(f"fit_many: {len(late)} of {len(results)} fits did not converge (converged_ is False), at "
                      f"positions {late[:20]}{' ...' if len(late) > 20 else ''}; their models are returned",
                      ConvergenceWarning, stacklevel=3)


def _report(progress, index, n_done, n_total, result, start):
    if progress is not None:
        progress(BatchProgress(index, n_done, n_total, isinstance(result, BaseException),
                               time.perf_counter() - start, _converged(result)))


def _fit_in_threads(tasks, n_workers, on_error, progress):
    start = time.perf_counter()
    n_total = len(tasks)
    results = [None] * n_total
    n_workers = min(n_workers, n_total)
    if n_workers == 1:
        for i, (est, X, y) in enumerate(tasks):
            try:
                results[i] = _fit_one(est, X, y)
            except Exception as error:
                if on_error == "raise":
                    raise
                results[i] = error
            _report(progress, i, i + 1, n_total, results[i], start)
        return results

    from concurrent.futures import ThreadPoolExecutor, as_completed
    stop = threading.Event()

    def run(i):
        if stop.is_set():
            return None
        est, X, y = tasks[i]
        return _fit_one(est, X, y)

    first_error = None
    with ThreadPoolExecutor(n_workers, thread_name_prefix="fastep-fit-many") as pool:
        futures = {pool.submit(run, i): i for i in range(n_total)}
        for n_done, future in enumerate(as_completed(futures), start=1):
            i = futures[future]
            exc = future.exception()
            if exc is not None:
                if on_error == "raise":
                    if first_error is None:
                        first_error = exc
                        stop.set()
                    continue
                results[i] = exc
            else:
                results[i] = future.result()
            _report(progress, i, n_done, n_total, exc if exc is not None else results[i], start)
    if first_error is not None:
        raise first_error
    return results


def _import_distributed():
    try:
        import distributed
    except ImportError as exc:
        raise ImportError("fit_many(client=...) needs Dask distributed: pip install \"fastep[dask]\"") from exc
    return distributed


#: Resubmissions of a fit whose inputs were lost with a worker (the data scattered to it).
CLUSTER_RETRIES = 2


def _lost(future):
    """Whether a finished-unsuccessfully future failed because the cluster lost something (a
    worker and the data on it), not because the fit raised: it is then worth running again."""
    if future.status in ("cancelled", "lost"):
        return True
    try:
        exc = future.exception()
    except Exception:                  # noqa: BLE001 - a cancelled future raises here
        return True
    name = type(exc).__name__
    return name in ("FutureCancelledError", "CancelledError", "CommClosedError")


def _fit_on_cluster(client, tasks, on_error, progress):
    distributed = _import_distributed()
    if not isinstance(client, distributed.Client):
        raise TypeError(f"client must be a dask.distributed.Client, got {type(client).__name__}")
    start = time.perf_counter()
    # Scatter each distinct array once (the same X in a hyperparameter grid, say); again if the
    # worker holding it dies.
    scattered = {}

    def remote(array):
        key = id(array)
        held = scattered.get(key)
        if held is None or held[1].status != "finished":
            for attempt in range(CLUSTER_RETRIES + 1):
                try:
                    future = client.scatter(array, broadcast=False, hash=False)
                    break
                except Exception:              # noqa: BLE001 - see below
                    # A worker that dies while the data goes to it fails the scatter with
                    # whatever the scheduler hit first (a closed comm, an unknown worker's
                    # KeyError); the next attempt goes to a live worker. An error of the array
                    # itself repeats and is raised after the last attempt.
                    if attempt == CLUSTER_RETRIES:
                        raise
                    time.sleep(0.2 * (attempt + 1))
            scattered[key] = (array, future)
        return scattered[key][1]

    def submit(i):
        est, X, y = tasks[i]
        return client.submit(_fit_one, est, remote(X), remote(y), pure=False)

    futures = [submit(i) for i in range(len(tasks))]
    index_of = {future.key: i for i, future in enumerate(futures)}
    attempts = [0] * len(tasks)
    results = [None] * len(tasks)
    n_total, n_done = len(tasks), 0
    pending = distributed.as_completed(futures)
    try:
        for future in pending:
            i = index_of[future.key]
            if future.status == "finished":
                results[i] = future.result()
            elif _lost(future) and attempts[i] < CLUSTER_RETRIES:
                attempts[i] += 1                  # a worker died with this fit's inputs: run it again
                again = submit(i)
                index_of[again.key] = i
                futures.append(again)
                pending.add(again)
                continue
            else:
                try:
                    exc = future.exception()
                except Exception as cancelled:    # noqa: BLE001 - a cancelled future raises here
                    exc = cancelled
                if on_error == "raise":
                    raise exc
                results[i] = exc
            n_done += 1
            _report(progress, i, n_done, n_total, results[i], start)
    finally:
        for future in futures:
            future.cancel()
        for _, remote_future in scattered.values():
            remote_future.release()
    return results
