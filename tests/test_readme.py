"""The README's examples run as written: every ```python block, in order, in one namespace."""
import pathlib
import re
import warnings

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks():
    if not README.exists():            # an installed test tree without the source checkout
        pytest.skip("README.md is not beside the tests")
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_examples_run(capsys):
    blocks = _python_blocks()
    assert len(blocks) >= 5
    namespace = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # optimiser budgets in the short examples
        for i, block in enumerate(blocks):
            exec(compile(block, f"README.md python block {i}", "exec"), namespace)
    assert "same" in namespace and "hs" in namespace
