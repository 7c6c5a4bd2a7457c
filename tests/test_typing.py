"""fastep ships its types (``py.typed``, PEP 561): code that uses it type-checks under ``mypy --strict``.

``tests/typing/downstream.py`` is a downstream project's script that uses every estimator,
composed kernels, persistence and ``fit_many``; mypy must accept it in strict mode (which also
rejects any call into an unannotated fastep function). A second snippet misuses the API on
purpose: mypy must reject each misuse and reveal real types, not ``Any``, so the check fails if
fastep's annotations were missing or turned into ``Any``.

mypy reads an installed fastep through its ``py.typed`` marker. An editable install (meson-python's
import hook) is invisible to mypy; fastep's source folder is then given on ``MYPYPATH`` with
``--follow-imports=silent`` (fastep itself is checked, its own errors not reported), and the
marker is checked as a file.
"""
import inspect
import os
import pathlib
import re
import site
import subprocess
import sys
import textwrap

import pytest

import fastep
import fastep.batch
import fastep.cli
import fastep.datasets
import fastep.hyperpriors
import fastep.kernels
import fastep.likelihoods
import fastep.persistence
import fastep.plotting
import fastep.progress

PACKAGE = pathlib.Path(fastep.__file__).resolve().parent
DOWNSTREAM = pathlib.Path(__file__).resolve().parent / "typing" / "downstream.py"


def _installed():
    """Whether fastep sits in a site-packages folder, where mypy finds installed packages."""
    roots = [*site.getsitepackages(), site.getusersitepackages()]
    return any(PACKAGE.parent == pathlib.Path(root).resolve() for root in roots)


def _mypy(tmp_path, *files):
    """``(exit status, output)`` of ``mypy --strict`` on ``files``, run in ``tmp_path`` (no config file)."""
    pytest.importorskip("mypy")
    command = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--show-error-codes",
               "--no-color-output", "--cache-dir", str(tmp_path / "mypy-cache")]
    env = {key: value for key, value in os.environ.items() if key != "MYPYPATH"}
    if not _installed():
        env["MYPYPATH"] = str(PACKAGE.parent)
        command.append("--follow-imports=silent")
    out = subprocess.run([*command, *map(str, files)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    return out.returncode, out.stdout + out.stderr


def test_the_package_ships_its_py_typed_marker():
    assert (PACKAGE / "py.typed").is_file()


@pytest.mark.typing
def test_a_downstream_script_type_checks_in_strict_mode(tmp_path):
    status, output = _mypy(tmp_path, DOWNSTREAM)
    assert status == 0, f"mypy --strict rejects {DOWNSTREAM.name}:\n{output}"


#: Each line marked ``# E: code`` must be reported with that error code, and nothing else;
#: each ``reveal_type`` must reveal a type containing the text after ``# R:`` (case aside).
MISUSE = '''
import numpy as np
import fastep
from fastep.batch import fit_many
from fastep.kernels import RBF

X = np.zeros((4, 2))
y = np.array([0, 1, 0, 1])
model = fastep.GaussianProcessClassifier(RBF()).fit(X, y)
reveal_type(model)  # R: fastep.gp.GaussianProcessClassifier
reveal_type(model.predict_proba(X))  # R: numpy.ndarray
reveal_type(model.log_marginal_likelihood_value_)  # R: float
reveal_type(fastep.GaussianProcessRegressor().fit(X, X[:, 0]).predict(X, return_std=True))  # R: tuple[numpy.ndarray
reveal_type(fastep.load("model.npz"))  # R: fastep._base.BaseEstimator
reveal_type(RBF() * RBF() + RBF())  # R: fastep.kernels.base.Kernel
reveal_type(fit_many(fastep.LinearEPRegressor(), [(X, X[:, 0])]))  # R: list[fastep.linear.LinearEPRegressor]
count: int = model.predict_proba(X)  # E: assignment
fastep.save(model, 3.5)  # E: arg-type
RBF() + 1  # E: operator
fastep.GaussianProcessRegressor(kernel="rbf")  # E: arg-type
fastep.GaussianProcessClassifier(optimizer="lbfgs")  # E: arg-type
model.fit(X, y).no_such_attribute  # E: attr-defined
fastep.IVMClassifier().fit(X)  # E: call-arg
'''


@pytest.mark.typing
def test_mypy_sees_real_types_and_rejects_misuse(tmp_path):
    script = tmp_path / "misuse.py"
    script.write_text(textwrap.dedent(MISUSE))
    status, output = _mypy(tmp_path, script)
    lines = MISUSE.splitlines()
    expected_errors = {(number, line.split("# E: ")[1].strip()) for number, line in enumerate(lines, start=1)
                       if "# E: " in line}
    reveals = {number: line.split("# R: ")[1].strip() for number, line in enumerate(lines, start=1)
               if "# R: " in line}
    found_errors, found_reveals = set(), {}
    for message in output.splitlines():
        match = re.match(r".*misuse\.py:(\d+): (error|note): (.*)", message)
        if match is None:
            continue
        number, kind, text = int(match[1]), match[2], match[3]
        if kind == "error":
            code = re.search(r"\[([a-z-]+)\]$", text)
            found_errors.add((number, code[1] if code else text))
        elif text.startswith("Revealed type is"):
            found_reveals[number] = text
    assert status == 1, output
    assert found_errors == expected_errors, output
    for number, wanted in reveals.items():
        revealed = found_reveals.get(number, "").lower().replace("builtins.", "")
        assert wanted.lower() in revealed, f"line {number}: expected {wanted!r}\n{output}"


# -- the annotations themselves (no mypy needed) --------------------------------------------------

_MODULES = (fastep, fastep.batch, fastep.cli, fastep.datasets, fastep.hyperpriors, fastep.kernels,
            fastep.likelihoods, fastep.persistence, fastep.plotting, fastep.progress)


def _public_objects():
    seen = {}
    for module in _MODULES:
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                seen.setdefault(f"{obj.__module__}.{obj.__qualname__}", obj)
    return dict(sorted(seen.items()))


PUBLIC = _public_objects()
_DUNDERS = ("__init__", "__call__", "__add__", "__mul__")


def _functions(obj):
    """``{name: function}``: a public function, or a class's public methods (properties by getter,
    unless the class annotates the attribute itself) defined in fastep, inherited ones included."""
    if inspect.isfunction(obj):
        return {obj.__qualname__: obj}
    out = {}
    for klass in reversed(obj.__mro__):
        if not (klass.__module__ or "").startswith("fastep"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") and name not in _DUNDERS:
                continue
            if isinstance(value, property):
                if name in vars(klass).get("__annotations__", {}):
                    out.pop(name, None)
                    continue
                value = value.fget
            if inspect.isfunction(value) and value.__module__.startswith("fastep"):
                out[name] = value
    return out


@pytest.mark.parametrize("name", list(PUBLIC))
def test_public_signatures_are_annotated(name):
    missing = []
    for method, function in _functions(PUBLIC[name]).items():
        signature = inspect.signature(function)
        for parameter in list(signature.parameters.values())[1 if "." in function.__qualname__ else 0:]:
            if parameter.annotation is inspect.Parameter.empty:
                missing.append(f"{method}({parameter.name})")
        if signature.return_annotation is inspect.Signature.empty:
            missing.append(f"{method} -> ?")
    assert not missing, f"{name}: unannotated {missing}"


ESTIMATORS = {name: obj for name, obj in PUBLIC.items() if inspect.isclass(obj) and hasattr(obj, "fit")}


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_constructor_parameters_are_declared_attributes(name):
    """``set_params`` and scikit-learn read the constructor's parameters as attributes: each has a
    class-level annotation, the same as its ``__init__`` annotation (kept in step)."""
    cls = ESTIMATORS[name]
    declared = {}
    for klass in reversed(cls.__mro__):
        declared.update(vars(klass).get("__annotations__", {}))
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert len(parameters) >= 2
    wrong = {p.name: (declared.get(p.name), p.annotation) for p in parameters
             if str(declared.get(p.name)).replace(" ", "") != str(p.annotation).replace(" ", "")}
    assert not wrong, f"{name}: attribute annotation differs from __init__'s (attribute, parameter): {wrong}"
