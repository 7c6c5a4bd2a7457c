"""The documentation's examples run as written: every ``.. code-block:: python`` and ``.. plot::``
body of each page, in order, in a fresh interpreter per page (a page may configure logging).

The pages without such a block are named in :data:`PAGES_WITHOUT_EXAMPLES` and checked to be
exactly those, and no page holds Python in a form the runner would not execute."""
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(DOCS.rglob("*.rst")) if DOCS.exists() else []

#: Pages with no Python example (the API reference generated from the docstrings, whose
#: examples ``test_docstrings.py`` runs; tables; the glossary; the table of contents).
PAGES_WITHOUT_EXAMPLES = {"api.rst", "glossary.rst", "guide/choosing.rst", "implemented.rst", "index.rst",
                          "policies.rst"}

#: Python the runner would not execute: doctest prompts, other code directives, ``code-block``
#: with another name for Python (or none: Sphinx's default highlighting), an indented
#: ``code-block:: python`` or ``plot::`` (the runner reads them at the start of a line), and
#: ``::`` literal blocks that start like Python.
_UNRUN_PYTHON = re.compile(
    r"^[ \t]*>>>\s"
    r"|^[ \t]*\.\. (code|sourcecode)::[ \t]*(py|python3?|pycon|ipython3?|default)?[ \t]*$"
    r"|^[ \t]*\.\. code-block::[ \t]*(py|python3|pycon|ipython3?|default)?[ \t]*$"
    r"|^[ \t]*\.\. (doctest|testcode|testsetup|ipython|jupyter-execute)::"
    r"|^[ \t]+\.\. (code-block:: python|plot::)[ \t]*$"
    r"|^(?![ \t]*\.\. )[^\n]*::[ \t]*\n(?:[ \t]*\n)+[ \t]+(?:import |from \S+ import |>>> )",
    flags=re.M)


def _name(page):
    return page.relative_to(DOCS).as_posix()


def _blocks(text):
    """The bodies of the python code blocks and plot directives of an rst page."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if re.match(r"^\.\. (code-block:: python|plot::)\s*$", lines[i]):
            i += 1
            while i < len(lines) and (lines[i].strip().startswith(":") or not lines[i].strip()):
                i += 1
            body = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith("   ")):
                body.append(lines[i])
                i += 1
            out.append(textwrap.dedent("\n".join(body)))
        else:
            i += 1
    return out


def test_the_docs_are_found():
    if not DOCS.exists():
        pytest.skip("docs/ is not beside the tests (an installed test tree)")
    assert (DOCS / "conf.py").exists() and (DOCS / "index.rst").exists()
    assert sum(len(_blocks(p.read_text(encoding="utf-8"))) for p in PAGES) >= 15


EXAMPLE_PAGES = [p for p in PAGES if _blocks(p.read_text(encoding="utf-8"))]


def test_the_pages_without_examples_are_the_expected_ones():
    if not DOCS.exists():
        pytest.skip("docs/ is not beside the tests (an installed test tree)")
    without = {_name(p) for p in PAGES if p not in EXAMPLE_PAGES}
    assert without == PAGES_WITHOUT_EXAMPLES, (
        f"pages without examples now: {sorted(without)}; expected {sorted(PAGES_WITHOUT_EXAMPLES)}")


@pytest.mark.parametrize("page", PAGES, ids=[_name(p) for p in PAGES])
def test_no_python_in_a_form_the_runner_skips(page):
    text = page.read_text(encoding="utf-8")
    found = [match.group(0).strip() for match in _UNRUN_PYTHON.finditer(text)]
    assert not found, f"{_name(page)}: Python the examples test would not run: {found}"


@pytest.mark.docs
@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=[_name(p) for p in EXAMPLE_PAGES])
def test_page_examples_run(page, tmp_path):
    text = page.read_text(encoding="utf-8")
    blocks = _blocks(text)
    assert blocks
    if ".. plot::" in text or "matplotlib" in text:
        pytest.importorskip("matplotlib")         # the plot extra (a test extra too)
        script = ["import matplotlib", "matplotlib.use('Agg')", "import matplotlib.pyplot as plt"]
    else:
        script = []
    script += ["import numpy as np", "import warnings", "warnings.simplefilter('ignore')"]
    for k, block in enumerate(blocks):
        script.append(f"# --- block {k}")
        script.append(block)
    (tmp_path / "page.py").write_text("\n".join(script), encoding="utf-8")
    res = subprocess.run([sys.executable, str(tmp_path / "page.py")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, f"{page.name}:\n{res.stderr[-3000:]}"
