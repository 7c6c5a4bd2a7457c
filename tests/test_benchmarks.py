"""The benchmark scripts and the asv suite stay runnable.

Every script in ``benchmarks/`` compiles under this interpreter (the support matrix runs the
oldest supported Python); every asv benchmark module imports and names its benchmarks; the
cheap asv benchmarks (the engine kernels) run once at their smallest parameters through
``benchmarks/run_once.py``, which ``.ci/run`` also runs for the whole suite.
"""
import importlib.util
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")
SCRIPTS = sorted(os.path.join(folder, name) for folder in (ROOT, os.path.join(ROOT, "benchmarks"))
                 for name in os.listdir(folder) if name.endswith(".py"))


def _run_once():
    spec = importlib.util.spec_from_file_location("run_once", os.path.join(ROOT, "run_once.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_benchmark_script_compiles(path):
    with open(path, encoding="utf-8") as f:
        compile(f.read(), path, "exec")


def test_the_asv_suite_imports_and_names_its_benchmarks():
    run_once = _run_once()
    found = [ident for module in run_once.modules() for ident, _, _ in run_once.benchmarks(module)]
    assert len(found) >= 30
    prefixes = {ident.rsplit(".", 1)[-1].split("_", 1)[0] for ident in found}
    assert {"time", "track", "peakmem"} <= prefixes


def test_smallest_parameters():
    run_once = _run_once()
    assert run_once.smallest([2000, 500]) == 500
    assert run_once.smallest([(10_000, 10), (10_000, 100), (2_000, 1000)]) == (10_000, 10)
    assert run_once.smallest(["sequential", "blocked"]) == "sequential"

    class Bench:
        params = [[2000, 500], ["a", "b"]]

    class Flat:
        params = [1.0, 0.5]

    assert run_once.parameters(Bench) == (500, "a")
    assert run_once.parameters(Flat) == (0.5,)


# The engine benchmarks: seconds in all, so every run exercises their setup and bodies (the dense
# engine's, the longest, in the slow tier; CI also runs the whole asv suite once).
CHEAP = [pytest.param("bench_gp_ep", marks=pytest.mark.slow), "bench_sparse_ep", "bench_linear_ep", "bench_sites"]


@pytest.mark.parametrize("module_name", CHEAP)
def test_the_engine_benchmarks_run_once(module_name):
    run_once = _run_once()
    (module,) = run_once.modules([module_name])
    by_class = {}
    for _, cls, method in run_once.benchmarks(module):
        by_class.setdefault(cls, []).append(method)
    assert by_class
    for cls, methods in by_class.items():
        results = run_once.run_class(cls, methods)
        for method, (_, value) in results.items():
            if method.startswith("track_"):
                assert value is not None and value == value, f"{cls.__name__}.{method} returned {value!r}"
