"""The installed distribution's version, :data:`fastep.__version__`."""
from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("fastep")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"
