"""Every public class and function has a docstring a user can read: numpydoc sections, an
example, and the example runs as written (doctest). The public warnings and exceptions have no
examples to run: theirs is a docstring of their own whose one-line summary says what they
mean, with the attributes they carry documented."""
import doctest
import inspect
import re

import numpy as np
import pytest

import fastep
import fastep.batch
import fastep.cli
import fastep.exceptions
import fastep.hyperpriors
import fastep.kernels
import fastep.likelihoods
import fastep.persistence
import fastep.plotting
import fastep.progress

_ESTIMATOR_METHODS = ("fit", "predict", "predict_proba", "predict_latent", "decision_function",
                      "score", "log_marginal_likelihood", "log_hyperposterior")


def _public_objects():
    seen = {}
    for module in (fastep, fastep.batch, fastep.exceptions, fastep.hyperpriors, fastep.kernels, fastep.likelihoods,
                   fastep.persistence, fastep.plotting, fastep.progress, fastep.cli):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                seen.setdefault(f"{obj.__module__}.{obj.__qualname__}", obj)
    return dict(sorted(seen.items()))


def _is_exception(obj):
    return inspect.isclass(obj) and issubclass(obj, BaseException)


PUBLIC = _public_objects()
#: the public warnings and errors: checked by test_exception_has_a_summary_and_documents_what_it_carries
EXCEPTIONS = {k: v for k, v in PUBLIC.items() if _is_exception(v)}
#: everything else: numpydoc sections and an example that runs
DOCUMENTED = {k: v for k, v in PUBLIC.items() if not _is_exception(v)}
ESTIMATORS = {k: v for k, v in PUBLIC.items() if inspect.isclass(v) and hasattr(v, "fit")}


def _sections(doc):
    """numpydoc section titles: a line followed by a line of dashes of the same length."""
    lines = inspect.cleandoc(doc).splitlines()
    return {a.strip() for a, b in zip(lines, lines[1:]) if b.strip() and set(b.strip()) == {"-"}
            and len(b.strip()) == len(a.strip())}


def test_the_public_surface_is_found():
    assert len(ESTIMATORS) >= 12
    assert any("RBF" in k for k in PUBLIC) and any("Probit" in k for k in PUBLIC)


def test_the_exceptions_are_exactly_the_expected_ones():
    """The classes held to the exception checks instead of the numpydoc and example checks."""
    assert set(EXCEPTIONS) == {"fastep.exceptions.ConvergenceWarning", "fastep.exceptions.DataConversionWarning",
                               "fastep.exceptions.MemoryLimitError", "fastep.exceptions.NotFittedError"}


@pytest.mark.parametrize("name", list(EXCEPTIONS))
def test_exception_has_a_summary_and_documents_what_it_carries(name):
    cls = EXCEPTIONS[name]
    doc = cls.__doc__                              # a class's own (None if it has none: not inherited)
    assert doc and len(doc.strip()) > 40, f"{name} has no docstring"
    lines = inspect.cleandoc(doc).splitlines()
    summary = lines[0]
    assert summary.endswith(".") and (len(lines) == 1 or not lines[1].strip()), (
        f"{name}: the first line is not a one-line summary: {summary!r}")
    base_summaries = {(inspect.getdoc(base) or "").split("\n", 1)[0] for base in cls.__mro__[1:]}
    assert summary not in base_summaries, f"{name} repeats its base's summary: {summary!r}"
    # what an instance carries beyond the message: its annotated attributes and the keyword
    # arguments of its own __init__, each documented under Attributes
    carried = {a for a in inspect.get_annotations(cls) if not a.startswith("_")}
    if "__init__" in vars(cls):
        carried |= {p.name for p in inspect.signature(cls.__init__).parameters.values() if p.kind == p.KEYWORD_ONLY}
    if carried:
        assert "Attributes" in _sections(doc), f"{name}: no Attributes section for {sorted(carried)}"
        documented = set(re.findall(r"^(\w+) :", inspect.cleandoc(doc), flags=re.M))
        assert carried <= documented, f"{name}: attributes not documented: {sorted(carried - documented)}"


@pytest.mark.parametrize("name", list(DOCUMENTED))
def test_public_object_has_a_numpydoc_docstring(name):
    obj = DOCUMENTED[name]
    doc = obj.__doc__
    assert doc and len(doc.strip()) > 40, f"{name} has no docstring"
    sections = _sections(doc)
    params = [p for p in inspect.signature(obj).parameters.values()
              if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if params:
        assert "Parameters" in sections, f"{name}: no Parameters section ({sorted(sections)})"
        documented = {name.strip() for names in re.findall(r"^\s*(\w+(?:\s*,\s*\w+)*)\s*:", inspect.cleandoc(doc),
                                                        flags=re.M) for name in names.split(",")}
        missing = [p.name for p in params if p.name not in documented]
        assert not missing, f"{name}: parameters not documented: {missing}"
    assert "Examples" in sections, f"{name}: no Examples section"


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_estimator_documents_attributes_references_and_methods(name):
    cls = ESTIMATORS[name]
    sections = _sections(cls.__doc__)
    assert {"Attributes", "References"} <= sections, f"{name}: sections {sorted(sections)}"
    for method in _ESTIMATOR_METHODS:
        if hasattr(cls, method):
            doc = getattr(cls, method).__doc__
            assert doc and doc.strip(), f"{name}.{method} has no docstring"


@pytest.mark.docs
@pytest.mark.parametrize("name", list(DOCUMENTED))
def test_docstring_examples_run_as_written(name):
    obj = DOCUMENTED[name]
    finder = doctest.DocTestFinder(recurse=False)
    tests = [t for t in finder.find(obj, name, globs={"np": np}) if t.examples]
    assert tests, f"{name}: no runnable example"
    if name.startswith("fastep.plotting."):
        pytest.importorskip("matplotlib")         # the plot extra's examples draw
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
