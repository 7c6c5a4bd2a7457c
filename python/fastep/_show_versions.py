"""The versions of fastep, Python, its dependencies, the BLAS it runs on and the optional extras.

:func:`show_versions` prints them (``fastep info`` on the command line prints the same report);
:func:`versions` returns them as a dict. Paste the report into a bug report.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import IO, Any

__all__ = ["show_versions", "versions"]

#: The optional extras: (module imported, distribution name, fastep extra that installs it).
EXTRAS = (
    ("dask", "dask", "dask"),
    ("distributed", "distributed", "dask"),
    ("matplotlib", "matplotlib", "plot"),
    ("tqdm", "tqdm", "progress"),
    ("sphinx", "sphinx", "docs"),
    ("numpydoc", "numpydoc", "docs"),
    ("pandas", "pandas", "test"),
    ("sklearn", "scikit-learn", "test"),
)

#: The keys of threadpoolctl's description of a library that the report shows, in this order
#: (``architecture`` for OpenBLAS and BLIS, ``threading_layer`` for OpenBLAS, BLIS and MKL).
LIBRARY_KEYS = ("user_api", "internal_api", "version", "architecture", "threading_layer", "num_threads",
                "filepath")


def _importable(module: str) -> bool:
    """Whether ``import module`` would find the module (found without importing it)."""
    from importlib.util import find_spec
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):        # an import hook refusing it, a broken entry in sys.modules
        return False


def _distribution_version(distribution: str) -> str | None:
    """The installed distribution's version from its metadata, or None without metadata."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _extra_version(module: str, distribution: str) -> str | None:
    """An optional package's version; ``"unknown version"`` when importable without metadata; None
    when it cannot be imported."""
    if not _importable(module):
        return None
    return _distribution_version(distribution) or "unknown version"


def _libraries() -> list[dict[str, Any]]:
    """threadpoolctl's description of the BLAS and OpenMP libraries loaded in this process, after
    loading scipy.linalg's BLAS and LAPACK (the ones fastep's compiled core calls) and the compiled
    site module (linked to the OpenMP runtime when fastep was built with one)."""
    import scipy.linalg  # noqa: F401  (loads scipy's BLAS so that threadpoolctl lists it)
    from threadpoolctl import threadpool_info

    from ._epcore import sites  # noqa: F401

    return [{key: info[key] for key in LIBRARY_KEYS if info.get(key) is not None}
            for info in threadpool_info()]


def versions() -> dict[str, Any]:
    """The facts :func:`show_versions` prints, as a dict.

    Optional packages are found without importing them (their versions are read from the
    installed metadata), so that the call stays quick and has no side effects.

    Returns
    -------
    dict
        ``"fastep"``: fastep's version; ``"system"``: ``{"python", "executable", "machine",
        "platform"}``; ``"dependencies"``: ``{"numpy", "scipy", "threadpoolctl"}`` versions;
        ``"libraries"``: a list with one dict per BLAS or OpenMP library loaded, as threadpoolctl
        describes it (``internal_api``, ``version``, ``architecture``, ``num_threads``,
        ``filepath``, ...); ``"extras"``: ``{distribution: version}`` for every optional package,
        None where it is not installed (importable); ``"extra_of"``: ``{distribution: extra}``,
        the fastep extra that installs it (``pip install 'fastep[extra]'``).

    See Also
    --------
    show_versions : The same facts, printed.

    Examples
    --------
    >>> from fastep._show_versions import versions
    >>> facts = versions()
    >>> sorted(facts["dependencies"])
    ['numpy', 'scipy', 'threadpoolctl']
    >>> facts["extra_of"]["matplotlib"]
    'plot'
    """
    import platform

    import numpy
    import scipy
    import threadpoolctl

    from ._version import version

    return {
        "fastep": version(),
        "system": {"python": " ".join(sys.version.split()), "executable": sys.executable,
                   "machine": platform.machine(), "platform": platform.platform()},
        "dependencies": {"numpy": numpy.__version__, "scipy": scipy.__version__,
                         "threadpoolctl": threadpoolctl.__version__},
        "libraries": _libraries(),
        "extras": {distribution: _extra_version(module, distribution) for module, distribution, _ in EXTRAS},
        "extra_of": {distribution: extra for _, distribution, extra in EXTRAS},
    }


def _block(items: dict[str, Any], width: int = 0, indent: int = 4) -> list[str]:
    """``key: value`` lines, the keys right-aligned to ``width`` characters or more."""
    width = max(width, *map(len, items)) if items else width
    return [f"{' ' * indent}{key:>{width}}: {value}" for key, value in items.items()]


def _format(facts: dict[str, Any]) -> str:
    """The report :func:`show_versions` prints, from the dict :func:`versions` returns."""
    lines = [f"fastep: {facts['fastep']}", "", "System:", *_block(facts["system"]),
             "", "Dependencies:", *_block(facts["dependencies"]),
             "", "BLAS and OpenMP libraries (threadpoolctl):"]
    if not facts["libraries"]:
        lines.append("    none found")
    width = max((len(key) for library in facts["libraries"] for key in library), default=0)
    for number, library in enumerate(facts["libraries"]):
        if number:
            lines.append("")
        lines.extend(_block(library, width))
    extras = _block({name: version or "not installed" for name, version in facts["extras"].items()})
    width = max(map(len, extras), default=0)
    lines += ["", "Optional extras:"]
    lines += [f"{line:<{width}}   fastep[{facts['extra_of'][name]}]" for name, line in zip(facts["extras"], extras)]
    return "\n".join(lines)


def show_versions(file: IO[str] | None = None) -> None:
    """Print fastep's version and those of Python, its dependencies and its optional extras.

    The report names the Python interpreter and the platform, the versions of numpy, scipy and
    threadpoolctl, the BLAS (and OpenMP) libraries loaded, as threadpoolctl sees them (the
    implementation, its version, the CPU kernel it chose, its thread count and its file), and the
    optional packages fastep uses when installed, with the extra that installs each (``pip install
    'fastep[dask]'`` and so on). Paste it into a bug report. ``fastep info`` prints the same on the
    command line.

    Parameters
    ----------
    file : file-like, optional
        Where to write the report (default ``sys.stdout``).

    See Also
    --------
    fastep._show_versions.versions : The same facts as a dict.

    Examples
    --------
    >>> import fastep
    >>> fastep.show_versions()  # doctest: +ELLIPSIS
    fastep: ...
    <BLANKLINE>
    System:
    ...
    Dependencies:
    ...
    BLAS and OpenMP libraries (threadpoolctl):
    ...
    Optional extras:
    ...
    """
    print(_format(versions()), file=sys.stdout if file is None else file)
