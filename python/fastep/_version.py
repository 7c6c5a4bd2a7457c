"""The installed distribution's version: :data:`fastep.__version__` and :func:`version`.

Read from the distribution's metadata on first use (``importlib.metadata`` is not imported with
fastep), then kept.
"""
from __future__ import annotations

import functools

__all__ = ["version"]


@functools.lru_cache(maxsize=None)
def version() -> str:
    """The installed fastep's version string (``"0.0.0"`` when running from a source tree)."""
    from importlib.metadata import PackageNotFoundError, version as installed_version
    try:
        return installed_version("fastep")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"
