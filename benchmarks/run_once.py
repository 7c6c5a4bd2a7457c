"""Run every asv benchmark once, at its smallest parameters, in this process.

asv discovers benchmarks by name (``time_``, ``peakmem_``, ``mem_``, ``track_``,
``timeraw_`` methods of classes, or module-level functions) in the modules of
``benchmarks/benchmarks``. This script does what asv does for one repetition of each, without
asv and without timing: ``setup_cache`` once per class, then for each benchmark method
``setup(*params)``, the method, ``teardown(*params)``. "Smallest" is the minimum of each
numeric parameter list and the first entry of any other list, so an API change that breaks a
benchmark shows here in a fraction of ``asv run --quick``'s time.

A benchmark whose setup raises ``NotImplementedError`` is skipped, as asv skips it (missing
optional data or packages).

    python benchmarks/run_once.py            # all, a line per benchmark
    python benchmarks/run_once.py bench_sites  # the benchmarks of some modules
"""
import importlib
import inspect
import itertools
import numbers
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, "benchmarks")
PREFIXES = ("time_", "timeraw_", "peakmem_", "mem_", "track_")


def smallest(values):
    """The smallest of a parameter's values (numbers; tuples by their product), else the first."""
    def size(value):
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return value
        if isinstance(value, tuple) and value and all(isinstance(v, numbers.Real) for v in value):
            out = 1
            for v in value:
                out *= v
            return out
        return None
    sizes = [size(v) for v in values]
    if all(s is not None for s in sizes):
        return values[sizes.index(min(sizes))]
    return values[0]


def modules(names=None):
    """The benchmark modules (``bench_*.py``), imported with the suite folder on the path."""
    if SUITE not in sys.path:
        sys.path.insert(0, os.path.dirname(SUITE))
    found = sorted(f[:-3] for f in os.listdir(SUITE) if f.startswith("bench") and f.endswith(".py"))
    if names:
        found = [f for f in found if f in names]
    return [importlib.import_module(f"benchmarks.{name}") for name in found]


def benchmarks(module):
    """``(id, class or None, method name)`` for every benchmark defined in ``module``."""
    out = []
    for name, value in sorted(vars(module).items()):
        if inspect.isclass(value) and value.__module__ == module.__name__ and not name.startswith("_"):
            for attr in sorted(dir(value)):
                if attr.startswith(PREFIXES) and callable(getattr(value, attr)):
                    out.append((f"{module.__name__.split('.')[-1]}.{name}.{attr}", value, attr))
        elif inspect.isfunction(value) and value.__module__ == module.__name__ and name.startswith(PREFIXES):
            out.append((f"{module.__name__.split('.')[-1]}.{name}", None, name))
    return out


class Skipped(Exception):
    """The benchmark's setup raised NotImplementedError."""


def parameters(cls):
    params = getattr(cls, "params", None)
    if params is None or params == []:
        return ()
    if not (isinstance(params, (list, tuple)) and params and isinstance(params[0], (list, tuple))):
        params = [params]                      # one parameter given as a flat list
    return tuple(smallest(list(values)) for values in params)


def run_class(cls, methods):
    """Run ``methods`` of benchmark class ``cls`` once at its smallest parameters.

    Returns ``{method: (seconds, result)}``; raises :class:`Skipped` when setup (or
    setup_cache) raises NotImplementedError.
    """
    args = parameters(cls)
    cache = ()
    if hasattr(cls, "setup_cache"):
        try:
            cache = (cls().setup_cache(),)
        except NotImplementedError as exc:
            raise Skipped(str(exc)) from None
    results = {}
    for method in methods:
        instance = cls()
        if hasattr(instance, "setup"):
            try:
                instance.setup(*cache, *args)
            except NotImplementedError as exc:
                raise Skipped(str(exc)) from None
        try:
            start = time.perf_counter()
            if method.startswith("timeraw_"):
                import subprocess
                code = getattr(instance, method)(*cache, *args)
                subprocess.run([sys.executable, "-c", code], check=True)
                value = None
            else:
                value = getattr(instance, method)(*cache, *args)
            results[method] = (time.perf_counter() - start, value)
        finally:
            if hasattr(instance, "teardown"):
                instance.teardown(*cache, *args)
    return results


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    failed = 0
    for module in modules(argv or None):
        by_class = {}
        for ident, cls, method in benchmarks(module):
            if cls is None:
                start = time.perf_counter()
                getattr(module, method)()
                print(f"ok      {time.perf_counter() - start:7.2f} s  {ident}")
                continue
            by_class.setdefault(cls, []).append((ident, method))
        for cls, entries in by_class.items():
            start = time.perf_counter()
            try:
                run_class(cls, [method for _, method in entries])
                status = "ok"
            except Skipped as exc:
                status = f"skipped ({exc})"
            except Exception:
                failed += 1
                status = "FAILED"
                traceback.print_exc()
            name = f"{module.__name__.split('.')[-1]}.{cls.__name__}"
            print(f"{status:7s} {time.perf_counter() - start:7.2f} s  {name} {parameters(cls)}"
                  f" ({len(entries)} benchmarks)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
