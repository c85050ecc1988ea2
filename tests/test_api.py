"""The public API, ``from lowmark import ...``: every name is the object of the module it
comes from, type checkers see the same names, and importing ``lowmark`` loads no Spark."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import lowmark
from lowmark.batches.pipeline import Pipeline
from scripts import config_reference

REPO = Path(__file__).resolve().parents[1]


def test_every_public_name_is_its_modules_object() -> None:
    for name, module in lowmark._HOME.items():
        assert getattr(lowmark, name) is getattr(importlib.import_module(module), name)
    assert set(lowmark.__all__) == {"__version__", *lowmark._HOME}


def test_type_checkers_see_the_same_names_from_the_same_modules() -> None:
    tree = ast.parse((REPO / "lowmark" / "__init__.py").read_text())
    (block,) = [
        n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
    ]
    typed = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == lowmark._HOME


def test_importing_lowmark_loads_no_spark() -> None:
    code = "import sys, lowmark; print(lowmark.__version__, 'pyspark' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [lowmark.__version__, "False"]


def test_every_model_a_pipeline_is_built_from_is_public() -> None:
    """Each section of the configuration reference is a class ``from lowmark import`` finds."""
    models = {m.__name__: m for m in config_reference.reachable(Pipeline)}
    assert {name: getattr(lowmark, name, None) for name in models} == models


def test_every_public_name_is_named_in_the_docs() -> None:
    """``__all__`` is the documented API: no public name the docs never mention (the docs'
    examples import only public names: tests/test_docs.py)."""
    text = "\n".join(p.read_text() for p in [REPO / "README.md", *(REPO / "docs").rglob("*.md")])
    words = set(re.findall(r"\w+", text))
    assert [n for n in lowmark.__all__ if n != "__version__" and n not in words] == []
