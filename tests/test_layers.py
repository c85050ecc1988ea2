"""The import graph: layers only import downwards (import-linter's contract in pyproject.toml,
run here as `make lint` runs it) and no module imports itself back through others."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
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


def test_every_module_and_folder_of_batches_is_in_a_layer() -> None:
    """A module in no layer may import anything: the contract names each of them."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    named = {name.strip() for layer in layers for name in layer.split("|")}
    modules = {
        f"lowmark.batches.{path.stem}"
        for path in (REPO / "batches").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    }
    assert sorted(modules - named) == []


def test_lowmark_links_the_top_level_folders_so_each_file_has_one_module_name() -> None:
    """``lowmark/`` holds ``__init__.py`` and links only (docs/development.md, "The
    package"): a checkout on ``PYTHONPATH`` imports its own files, and tools that do not
    follow links (ruff, git) see each file once, under its top-level folder."""
    real = sorted(p.name for p in (REPO / "lowmark").iterdir() if not p.is_symlink())
    assert real in (["__init__.py"], ["__init__.py", "__pycache__"])
    for folder in FOLDERS:
        assert (REPO / "lowmark" / folder).readlink() == Path("..", folder)
    ruff = Path(sys.executable).parent / "ruff"
    shown = subprocess.run(
        [str(ruff), "check", "--show-files", "."], cwd=REPO, capture_output=True, text=True
    ).stdout.split()
    assert [f for f in shown if "/lowmark/" in f] == [str(REPO / "lowmark" / "__init__.py")]


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
