"""Progress of long fits: ``verbose`` messages through :mod:`logging`, the ``callback`` hook and
the record it receives (:class:`ProgressRecord`), and a ready-made callback (:class:`ProgressBar`).

Every estimator takes ``verbose`` (0, 1 or 2) and ``callback``. A fit builds one
:class:`Progress` and its stages report to it:

- ``"EP sweep"``: after each EP sweep (level 2), ``iteration`` the sweep, ``change`` the largest
  relative site change, ``log_marginal_likelihood`` the EP log marginal likelihood as tracked for the
  convergence test (NaN for the weight-space engines, which do not track it per sweep; for
  the IVM's refinement sweeps over its active set, the active set's eq 32);
- ``"type-II ML"``: after each evidence evaluation of the hyperparameter search (level 1),
  ``change`` the gain over the best value before it;
- ``"Algorithm 2"`` (IVM): after each kernel / noise stage (level 1), and ``"eq 32"`` /
  ``"eq 34"`` evaluations inside them (level 2);
- ``"done"``: once at the end of the fit (level 1).

With ``verbose >= level`` the record is written as one line to the logger ``fastep`` at INFO
level; when logging is not configured (no handler on ``fastep`` or its ancestors) the line
goes to standard error instead, so that ``verbose=1`` is seen without any set-up. The
estimator's ``callback`` receives every record (all levels), in the fitting thread (with
``n_jobs`` several threads may call it). If it returns ``False`` the fit stops cleanly: a
hyperparameter search ends at the best point evaluated so far (EP then runs to convergence
there, without further calls), EP sweeps end at the current sites; the fitted model is valid
and a :class:`~fastep.ConvergenceWarning` says where it stopped. An exception raised by the
callback propagates out of ``fit`` (a ``KeyboardInterrupt`` too) and leaves the estimator as it
was before ``fit``.

:class:`ProgressBar` is such a callback: ``callback=ProgressBar()`` keeps one status line
(stage, iteration, log evidence, elapsed time) up to date on a terminal; written to a file or
pipe it prints a plain line per fitting stage and search evaluation instead (not per EP sweep).
With the optional ``tqdm`` package installed (``pip install fastep[progress]``) the terminal
line is a tqdm bar.

The public names are :class:`ProgressRecord` and :class:`ProgressBar` (``__all__``); the
reporter the estimators build (:class:`Progress` and the helpers around it) is internal.
"""
from __future__ import annotations

import logging
import math
import sys
import time
import warnings
from collections import namedtuple
from typing import TYPE_CHECKING

from . import _validation as v

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, Any, Literal, NamedTuple

    from ._gp.fit_options import FitOptions

__all__ = ["ProgressBar", "ProgressRecord"]

logger = logging.getLogger("fastep")

if TYPE_CHECKING:
    # What type checkers see: the named tuple below, with the types of its fields.
    class ProgressRecord(NamedTuple):
        estimator: str
        stage: str
        iteration: int
        log_marginal_likelihood: float
        change: float
        elapsed: float

        @property
        def log_evidence(self) -> float: ...
else:
    class ProgressRecord(namedtuple("ProgressRecord", ["estimator", "stage", "iteration", "log_marginal_likelihood",
                                                       "change", "elapsed"])):
        __slots__ = ()

        @property
        def log_evidence(self) -> float:
            """Deprecated alias of ``log_marginal_likelihood`` (removed in the next release)."""
            warnings.warn("log_evidence is deprecated and will be removed in the next release; use "
                          "log_marginal_likelihood", FutureWarning, stacklevel=2)
            return self.log_marginal_likelihood
ProgressRecord.__doc__ = """What an estimator's ``callback`` receives during ``fit`` (an immutable named tuple).

Parameters
----------
estimator : str
    The estimator's class name.
stage : str
    ``'EP sweep'``, ``'type-II ML'``, ``'Algorithm 2 kernel'`` / ``'Algorithm 2 noise'``,
    ``'eq 32'`` / ``'eq 34'`` (IVM), or ``'done'``; one-vs-rest IVM stages carry the class.
iteration : int
    The sweep, evaluation or round within the stage.
log_marginal_likelihood : float
    The log marginal likelihood (the IVM's eq 32 / eq 34 value) at this step; NaN where the
    stage has none. ``log_evidence`` is its former name, a deprecated alias (removed in the next
    release).
change : float
    For EP sweeps the largest relative site change; for search evaluations the gain over the
    best value before; NaN otherwise.
elapsed : float
    Seconds since ``fit`` began.

Examples
--------
>>> import numpy as np
>>> from fastep import GaussianProcessClassifier
>>> X = np.linspace(-2, 2, 40)[:, None]; y = (X[:, 0] > 0).astype(int)
>>> stages = []
>>> model = GaussianProcessClassifier(callback=lambda record: stages.append(record.stage)).fit(X, y)
>>> stages[0], stages[-1]
('EP sweep', 'done')
"""

CALLBACK_DOC = """verbose : int, default 0
        0: silent; 1: a line per fitting stage or hyperparameter-search evaluation; 2: also the
        finest steps (every EP sweep; the IVM's evaluations of eq 32 / eq 34). Lines go to the
        ``fastep`` logger at INFO level (to standard error when logging is not configured).
    callback : callable, optional
        Called with a :class:`fastep.ProgressRecord` (``estimator``, ``stage``, ``iteration``,
        ``log_marginal_likelihood``, ``change``, ``elapsed``) after every EP sweep, search evaluation and
        fitting stage. Returning ``False`` stops the fit cleanly at the best state so far, with
        a ``ConvergenceWarning``."""


def check_verbose(verbose: int) -> int:
    """``verbose`` as an int in {0, 1, 2} (bools accepted)."""
    if isinstance(verbose, bool):
        return int(verbose)
    verbose = v.check_int(verbose, "verbose", minimum=0)
    if verbose > 2:
        raise ValueError(f"verbose must be 0, 1 or 2, got {verbose}")
    return verbose


def check_callback(callback: Callable[[ProgressRecord], object] | None
                   ) -> Callable[[ProgressRecord], object] | None:
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
    return callback


class StopRequested(Exception):
    """Raised inside a search objective when the callback asked the fit to stop."""


def _format(record: ProgressRecord) -> str:
    parts = [f"{record.estimator}: {record.stage} {record.iteration}"]
    if not math.isnan(record.log_marginal_likelihood):
        parts.append(f"log evidence {record.log_marginal_likelihood:.6g}")
    if not math.isnan(record.change):
        parts.append(f"change {record.change:.3g}")
    parts.append(f"elapsed {record.elapsed:.2f} s")
    return ", ".join(parts)


def _emit(line: str) -> None:
    if logger.hasHandlers():
        logger.info(line)
    else:
        print(line, file=sys.stderr, flush=True)


class Progress:
    """One fit's progress reporter (see the module docstring).

    Parameters
    ----------
    estimator : str
        The estimator's name, in every record.
    verbose : int
    callback : callable or None
    """

    def __init__(self, estimator: str, verbose: int = 0,
                 callback: Callable[[ProgressRecord], object] | None = None) -> None:
        self.estimator = estimator
        self.verbose = verbose
        self.callback = callback
        self.start = time.perf_counter()
        # the record after which the callback returned False
        self.stopped_at: ProgressRecord | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A copy sent to another process (a dask worker) or stored reports nothing.
        return {"estimator": self.estimator, "verbose": 0, "callback": None, "start": self.start,
                "stopped_at": self.stopped_at}

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    @property
    def active(self) -> bool:
        """Whether anything listens at the EP-sweep level (else engines get no sweep callback)."""
        return self.verbose >= 2 or self.callback is not None

    def report(self, stage: str, iteration: int, log_evidence: float = math.nan, change: float = math.nan, *,
               level: int = 1) -> bool:
        """Emit a record; False if the callback asks to stop now (after a stop: True, silently
        continuing the clean-up, which the callback is no longer told about)."""
        record = ProgressRecord(self.estimator, stage, int(iteration), float(log_evidence), float(change),
                                time.perf_counter() - self.start)
        if self.verbose >= level:
            _emit(_format(record))
        if self.callback is None or self.stopped:
            return True
        if self.callback(record) is False:
            if self.stopped_at is None:
                self.stopped_at = record
            return False
        return True

    def message(self, text: str, *, level: int = 1) -> None:
        """A free-text line at ``level`` (not passed to the callback)."""
        if self.verbose >= level:
            _emit(f"{self.estimator}: {text}")

    def sweep_callback(self, stage: str = "EP sweep") -> Callable[[int, float, float], bool] | None:
        """The engines' ``sweep_callback`` (None when nobody listens: no per-sweep cost)."""
        if not self.active:
            return None

        def on_sweep(sweep: int, max_change: float, log_z: float) -> bool:
            return self.report(stage, sweep, log_z, max_change, level=2)
        return on_sweep

    def stop_message(self) -> str:
        record: Any = self.stopped_at              # set: the fit was stopped
        return (f"{self.estimator}: the fit was stopped by the callback after {record.stage} {record.iteration} "
                f"({record.elapsed:.2f} s)")


def quiet() -> Progress:
    """A reporter that reports nothing (internal fits, tests)."""
    return Progress("", 0, None)


def sweep_callback_of(options: FitOptions) -> Callable[[int, float, float], bool] | None:
    """The engine ``sweep_callback`` for a fit's options (None without a reporter)."""
    progress = options.progress
    return None if progress is None else progress.sweep_callback()


# -- a ready-made callback ----------------------------------------------------------------------


def _describe(record: ProgressRecord) -> str:
    text = f"{record.stage} {record.iteration}"
    if not math.isnan(record.log_marginal_likelihood):
        text += f"  log evidence {record.log_marginal_likelihood:.6g}"
    return text


class ProgressBar:
    """Show a fit's progress on a stream (a callable to pass as an estimator's ``callback``).

    Parameters
    ----------
    stream : file-like, optional
        Where to write (default ``sys.stderr``).
    backend : {'auto', 'line', 'plain', 'tqdm'}, default 'auto'
        ``'line'``: one status line rewritten in place (``\\r``); ``'plain'``: a line per stage and
        search evaluation; ``'tqdm'``: a tqdm bar (needs ``fastep[progress]``); ``'auto'``: tqdm
        if installed and ``stream`` is a terminal, else ``'line'`` on a terminal, ``'plain'`` otherwise.
    min_interval : float, default 0.1
        Seconds between redraws of the status line.

    Raises
    ------
    ImportError
        ``backend='tqdm'`` without tqdm installed (install the ``progress`` extra).

    Examples
    --------
    >>> import io
    >>> import numpy as np
    >>> from fastep import GaussianProcessClassifier
    >>> from fastep.progress import ProgressBar
    >>> X = np.linspace(-2, 2, 30)[:, None]; y = (X[:, 0] > 0).astype(int)
    >>> log = io.StringIO()
    >>> bar = ProgressBar(log, backend="plain")
    >>> model = GaussianProcessClassifier(callback=bar).fit(X, y)
    >>> bar.close()
    >>> log.getvalue().splitlines()[-1].startswith("GaussianProcessClassifier: done")
    True
    """

    def __init__(self, stream: IO[str] | None = None, *, backend: Literal["auto", "line", "plain", "tqdm"] = "auto",
                 min_interval: float = 0.1) -> None:
        if backend not in ("auto", "line", "plain", "tqdm"):
            raise ValueError(f"backend must be 'auto', 'line', 'plain' or 'tqdm', got {backend!r}")
        self.stream = sys.stderr if stream is None else stream
        terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self._tqdm: Any = None
        if backend == "tqdm" or (backend == "auto" and terminal):
            try:
                from tqdm.auto import tqdm
            except ImportError:
                if backend == "tqdm":
                    raise ImportError("ProgressBar(backend='tqdm') needs tqdm: pip install 'fastep[progress]'") from None
            else:
                self._tqdm = tqdm(file=self.stream, unit=" steps", leave=True, dynamic_ncols=True)
                backend = "tqdm"
        if backend == "auto":
            backend = "line" if terminal else "plain"
        self.backend = backend
        self.min_interval = float(min_interval)
        self._last_draw = -math.inf
        self._width = 0
        self._last: ProgressRecord | None = None

    def __call__(self, record: ProgressRecord) -> bool:
        self._last = record
        if self.backend == "tqdm":
            self._tqdm.set_description_str(f"{record.estimator}: {_describe(record)}", refresh=False)
            self._tqdm.update(1)
        elif self.backend == "plain":
            if record.stage != "EP sweep":
                self.stream.write(f"{record.estimator}: {_describe(record)}  ({record.elapsed:.1f} s)\n")
                self.stream.flush()
        else:
            now = time.perf_counter()
            if now - self._last_draw >= self.min_interval or record.stage.endswith("done"):
                self._draw(record)
                self._last_draw = now
        return True

    def _draw(self, record: ProgressRecord) -> None:
        text = f"{record.estimator}: {_describe(record)}  {record.elapsed:.1f} s"
        padding = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * padding)
        self.stream.flush()
        self._width = len(text)

    def close(self) -> None:
        """Finish the display (a newline after the status line; closes a tqdm bar)."""
        if self.backend == "tqdm" and self._tqdm is not None:
            self._tqdm.close()
        elif self.backend == "line" and self._last is not None:
            self._draw(self._last)
            self.stream.write("\n")
            self.stream.flush()
