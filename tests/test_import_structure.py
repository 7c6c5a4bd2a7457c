"""The import structure of the Python package, read from the sources with ``ast`` (every import
statement, including those inside functions): the kernel modules import one another one way
only, and no module reaches up into a package ``__init__`` that it belongs to."""
import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "python"
PACKAGE = SOURCE / "fastep"


def _module_name(path):
    parts = list(path.relative_to(SOURCE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name):
    return MODULES.get(name) is not None and MODULES[name].name == "__init__.py"


def _imports(name):
    """``[(line, target, what)]`` for every import in module ``name`` that resolves into the source
    tree: ``target`` is the module imported, or the module a name is taken from; ``what`` is that
    name (None for a whole module)."""
    path = MODULES[name]
    package = name if _is_package(name) else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name, None) for alias in node.names if alias.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            if source not in MODULES:
                continue                     # outside the source tree (numpy, the compiled core, ...)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in MODULES:
                    out.append((node.lineno, submodule, None))
                else:
                    out.append((node.lineno, source, alias.name))
    return out


def _graph(names):
    return {name: sorted({target for _, target, _ in _imports(name) if target in names and target != name})
            for name in names}


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_source_tree_is_found():
    assert "fastep.kernels.base" in MODULES and "fastep.kernels.columns" in MODULES
    found = {(target, what) for _, target, what in _imports("fastep")}
    assert ("fastep.kernels", None) in found                       # from . import kernels: a submodule
    assert ("fastep.persistence", "load") in found                 # from .persistence import load: a name


def test_cycle_finder_reports_a_cycle():
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert _cycles({"a": ["b"], "b": [], "c": ["a", "b"]}) == []


def test_kernel_modules_import_one_way():
    kernels = {name for name in MODULES if name == "fastep.kernels" or name.startswith("fastep.kernels.")}
    graph = _graph(kernels)
    assert graph["fastep.kernels.columns"] == ["fastep.kernels._distances"]
    assert _cycles(graph) == [], "import cycle among the kernel modules"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_from_its_own_package_init(name):
    """``from . import name`` (or ``import fastep``) where the name is defined in the ``__init__`` of a
    package this module belongs to runs that ``__init__`` mid-import and ties the module to the
    public facade; modules import from the module that defines the name."""
    ancestors = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1)}
    if _is_package(name):
        ancestors.add(name)
    upward = [(line, target, what) for line, target, what in _imports(name)
              if target in ancestors and (what is not None or target == "fastep")]
    assert upward == [], f"{name} imports from its own package's __init__: {upward}"
