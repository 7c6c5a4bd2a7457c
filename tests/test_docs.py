"""The documentation's examples run as written: every ``.. code-block:: python`` and ``.. plot::``
body of each page, in order, in a fresh interpreter per page (a page may configure logging)."""
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(DOCS.rglob("*.rst")) if DOCS.exists() else []


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


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_page_examples_run(page, tmp_path):
    text = page.read_text(encoding="utf-8")
    blocks = _blocks(text)
    if not blocks:
        return
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
