"""Sphinx configuration: ``python -m sphinx -W -b html docs docs/_build/html`` (built-in extensions only)."""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "sparse-accumulation"
author = "sparse-accumulation developers"
copyright = "sparse-accumulation developers"  # noqa: A001 - Sphinx's name
release = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
]

exclude_patterns = ["_build", "conventions_cg_notes.md"]
source_suffix = {".rst": "restructuredtext"}
root_doc = "index"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = "sparse-accumulation"
