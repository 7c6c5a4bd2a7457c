"""A ready-made ``callback`` that shows a fit's progress: :class:`ProgressBar`.

Any fastep estimator accepts ``callback=ProgressBar()``. On a terminal it keeps one status line
(stage, iteration, log evidence, elapsed time) up to date; written to a file or pipe it prints a
plain line per fitting stage and search evaluation instead (not per EP sweep). With the optional
``tqdm`` package installed (``pip install fastep[progress]``) the terminal line is a tqdm bar.
"""
import math
import sys
import time

from ._progress import ProgressRecord

__all__ = ["ProgressBar", "ProgressRecord"]


def _describe(record):
    text = f"{record.stage} {record.iteration}"
    if not math.isnan(record.log_evidence):
        text += f"  log evidence {record.log_evidence:.6g}"
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

    def __init__(self, stream=None, *, backend="auto", min_interval=0.1):
        if backend not in ("auto", "line", "plain", "tqdm"):
            raise ValueError(f"backend must be 'auto', 'line', 'plain' or 'tqdm', got {backend!r}")
        self.stream = sys.stderr if stream is None else stream
        terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self._tqdm = None
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
        self._last = None

    def __call__(self, record):
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

    def _draw(self, record):
        text = f"{record.estimator}: {_describe(record)}  {record.elapsed:.1f} s"
        padding = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * padding)
        self.stream.flush()
        self._width = len(text)

    def close(self):
        """Finish the display (a newline after the status line; closes a tqdm bar)."""
        if self.backend == "tqdm" and self._tqdm is not None:
            self._tqdm.close()
        elif self.backend == "line" and self._last is not None:
            self._draw(self._last)
            self.stream.write("\n")
            self.stream.flush()
