"""The import graph: layers only import downwards (import-linter's contract in pyproject.toml,
run here as `make lint` runs it) and no module imports itself back through others."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("lowmark",)
FOLDERS = ("batches", "state", "orchestration")
"""The top-level folders ``lowmark/`` links."""


def test_each_layer_imports_only_the_layers_below_it() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


def test_no_import_circle() -> None:
    graph = grimp.build_graph(*PACKAGES)
    circles = sorted(
        (importer, imported)
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if graph.chain_exists(importer=imported, imported=importer)
    )
    assert circles == []


def test_every_import_of_lowmarks_own_modules_is_under_lowmark() -> None:
    """``batches``, ``state`` and ``orchestration`` are folders, installed under ``lowmark``:
    a bare ``import state`` would load a project's own ``state.py``, or a second copy."""
    bare = sorted(
        f"{path.relative_to(REPO)}:{line}"
        for folder in (*FOLDERS, "tests", "bench", "examples", "scripts")
        for path in (REPO / folder).rglob("*.py")
        for line, name in _imported(ast.parse(path.read_text()))
        if name.split(".")[0] in FOLDERS
    )
    assert bare == []


def _imported(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of each absolute import in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found
