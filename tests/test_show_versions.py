"""``fastep.show_versions()``: the versions of fastep, Python, its dependencies, the BLAS and OpenMP
libraries loaded and the optional extras (``fastep info`` prints the same; tests/test_cli.py)."""
import importlib.metadata
import io
import subprocess
import sys

import numpy
import scipy
import threadpoolctl

import fastep
from fastep import _show_versions

DISTRIBUTIONS = ["dask", "distributed", "matplotlib", "tqdm", "sphinx", "numpydoc", "pandas", "scikit-learn"]


def _installed(distribution):
    module = {"scikit-learn": "sklearn"}.get(distribution, distribution)
    try:
        __import__(module)
    except ImportError:
        return None
    return importlib.metadata.version(distribution)


def test_versions_names_fastep_python_dependencies_and_extras():
    facts = _show_versions.versions()
    assert facts["fastep"] == fastep.__version__
    assert facts["system"]["executable"] == sys.executable
    assert facts["system"]["python"].startswith(".".join(map(str, sys.version_info[:3])))
    assert set(facts["system"]) == {"python", "executable", "machine", "platform"}
    assert facts["dependencies"] == {"numpy": numpy.__version__, "scipy": scipy.__version__,
                                     "threadpoolctl": threadpoolctl.__version__}
    assert list(facts["extras"]) == DISTRIBUTIONS
    for distribution in DISTRIBUTIONS:
        assert facts["extras"][distribution] == _installed(distribution), distribution
    assert facts["extra_of"] == {"dask": "dask", "distributed": "dask", "matplotlib": "plot", "tqdm": "progress",
                                 "sphinx": "docs", "numpydoc": "docs", "pandas": "test", "scikit-learn": "test"}


def test_versions_lists_the_blas_threadpoolctl_sees():
    libraries = _show_versions.versions()["libraries"]
    blas = [library for library in libraries if library["user_api"] == "blas"]
    assert blas, libraries
    expected = {(info["internal_api"], info["filepath"]) for info in threadpoolctl.threadpool_info()}
    assert {(library["internal_api"], library["filepath"]) for library in libraries} == expected
    for library in blas:
        assert isinstance(library["num_threads"], int) and library["num_threads"] >= 1
        assert set(library) <= set(_show_versions.LIBRARY_KEYS)


def test_show_versions_prints_the_report(capsys):
    fastep.show_versions()
    out = capsys.readouterr().out
    facts = _show_versions.versions()
    assert out.startswith(f"fastep: {fastep.__version__}\n")
    for name, version in facts["dependencies"].items():
        assert f"{name}: {version}" in out
    for library in facts["libraries"]:
        assert f"filepath: {library['filepath']}" in out
    buffer = io.StringIO()
    fastep.show_versions(file=buffer)
    assert buffer.getvalue() == out


def test_a_missing_extra_is_reported_as_not_installed(monkeypatch):
    monkeypatch.setattr(_show_versions, "_importable", lambda module: module != "tqdm")
    facts = _show_versions.versions()
    assert facts["extras"]["tqdm"] is None
    buffer = io.StringIO()
    fastep.show_versions(file=buffer)
    (line,) = [line for line in buffer.getvalue().splitlines() if line.strip().startswith("tqdm:")]
    assert line.split() == ["tqdm:", "not", "installed", "fastep[progress]"]


def test_an_extra_without_metadata_has_an_unknown_version(monkeypatch):
    monkeypatch.setattr(_show_versions, "_importable", lambda module: True)
    monkeypatch.setattr(_show_versions, "_distribution_version", lambda distribution: None)
    assert set(_show_versions.versions()["extras"].values()) == {"unknown version"}


def test_an_import_hook_refusing_a_module_makes_it_missing():
    """A package hidden from the interpreter (here by a finder that refuses ``tqdm``, as a user's
    sitecustomize might) is not installed as far as fastep is concerned, whatever its metadata says."""
    code = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "tqdm" or name.startswith("tqdm."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, Refuse())
import fastep
fastep.show_versions()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (line,) = [line for line in out.stdout.splitlines() if line.strip().startswith("tqdm:")]
    assert "not installed" in line


def test_the_optional_packages_are_not_imported():
    code = ("import sys, fastep; fastep.show_versions(); "
            "print(sorted(m for m in ('dask', 'distributed', 'matplotlib', 'tqdm', 'pandas', 'sklearn', 'sphinx', "
            "'numpydoc') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]"


def test_show_versions_is_public_and_imported_on_first_use():
    assert "show_versions" in fastep.__all__ and "show_versions" in dir(fastep)
    code = ("import sys, fastep; print('fastep._show_versions' in sys.modules); "
            "from fastep import show_versions; print('fastep._show_versions' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]
