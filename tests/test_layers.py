"""The import graph: layers only import downwards (import-linter's contract in pyproject.toml,
run here as `make lint` runs it) and no module imports itself back through others."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("lowmark",)


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
