"""BLAS threading policy around the sequential EP sweeps.

A sequential EP sweep issues one small BLAS-2/BLAS-3 call per site (or per
block of sites). With the default two OpenBLAS threads those calls were slower
than single-threaded for d up to a few hundred, and up to tens of times slower
when other processes competed for the cores (benchmarks/compare_reference.py,
issue 2 closing note); for d >= ~500 the threaded BLAS-3 updates win. So the
engines run with one BLAS thread below ``SINGLE_THREAD_BELOW`` weights and with
the process default above it.
"""
import contextlib

from threadpoolctl import ThreadpoolController

__all__ = ["SINGLE_THREAD_BELOW", "sweep_blas_threads"]

#: Problems with fewer weights than this run their sweeps with one BLAS thread.
SINGLE_THREAD_BELOW = 512

_controller = None


def _get_controller():
    # Inspecting the loaded libraries costs ~0.5 ms; do it once, lazily.
    global _controller
    if _controller is None:
        _controller = ThreadpoolController()
    return _controller


def sweep_blas_threads(n_weights):
    """Context manager limiting BLAS to one thread for problems with fewer than SINGLE_THREAD_BELOW weights."""
    if n_weights < SINGLE_THREAD_BELOW:
        return _get_controller().limit(limits=1, user_api="blas")
    return contextlib.nullcontext()
