"""Sphinx configuration of fastep's documentation (``pip install ".[docs]"``, then
``python -m sphinx -W -b html docs docs/_build/html``)."""
import os
import sys

import matplotlib

matplotlib.use("Agg")

from importlib.metadata import PackageNotFoundError, version as _installed_version  # noqa: E402

project = "fastep"
author = "the fastep developers"
copyright = "2026, the fastep developers"
try:
    release = _installed_version("fastep")
except PackageNotFoundError:       # building from a source tree without an install
    release = "0.0.0"
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "python")))

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "numpydoc",
    "matplotlib.sphinxext.plot_directive",
]

# numpydoc: no per-member stub pages (the API page documents members in place)
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
autodoc_default_options = {"members": False}
autodoc_member_order = "bysource"
# the numpydoc sections give every type; the annotations (for type checkers, py.typed) name aliases
# imported under TYPE_CHECKING only, and overloads, which would clutter the signatures
autodoc_typehints = "none"

# the gallery's figures are produced by running the examples while the docs build
plot_include_source = True
plot_html_show_source_link = False
plot_html_show_formats = False
plot_formats = [("png", 100)]
plot_pre_code = "import numpy as np\nimport matplotlib.pyplot as plt\n"

exclude_patterns = ["_build"]
html_theme = "alabaster"
version = release
html_title = f"fastep {release}"
html_static_path = []
