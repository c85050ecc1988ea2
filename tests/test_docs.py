"""The docs: the site builds without a warning (broken links and anchors are warnings), the
README's links lead somewhere, the configuration reference is the one the models give, and
every make target, ``lowmark`` command and environment variable the docs name is real.

All quick: one ``mkdocs build`` (about a second), the rest reads files.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import click
import pytest
import typer
from markdown.extensions.toc import slugify

import lowmark
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.registry import load_pipelines
from scripts import config_reference

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
"""Every page of the site."""

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
"""A Markdown link or image: ``[text](target)``."""
CODE = re.compile(r"```.*?```|``.+?``|`[^`]+`", re.DOTALL)
"""A fenced code block or a code span: where commands are written."""


PYTHON = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
"""A fenced Python block of a page."""


def python_examples(path: Path) -> list[ast.Module]:
    """The Python blocks of a Markdown file, parsed (a block that is not Python fails here)."""
    return [
        ast.parse(m.group(1), filename=f"{path.name}:{m.start()}")
        for m in PYTHON.finditer(path.read_text())
    ]


def lowmark_imports(example: ast.Module) -> list[ast.ImportFrom]:
    return [
        n
        for n in ast.walk(example)
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "lowmark"
    ]


def bound_names(example: ast.Module) -> set[str]:
    """The names an example binds: imports, definitions, assignments, arguments."""
    bound = set()
    for node in ast.walk(example):
        if isinstance(node, ast.Import | ast.ImportFrom):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
    return bound


def free_names(example: ast.Module) -> set[str]:
    """The names an example uses without binding them (nor being builtins)."""
    used = {n.id for n in ast.walk(example) if isinstance(n, ast.Name)}
    return used - bound_names(example) - set(dir(builtins))


def code_in(path: Path) -> list[str]:
    """The code blocks and spans of a Markdown file, or the string literals' backticked
    parts of a Python file (where error messages name commands)."""
    return [m.group(0).strip("`") for m in CODE.finditer(path.read_text())]


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as MkDocs makes them (explicit ``{#id}`` or the
    slug of the heading's text)."""
    found = set()
    for line in page.read_text().splitlines():
        heading = re.match(r"#{1,6} (.*)", line)
        if heading:
            text = heading.group(1)
            explicit = re.search(r"\{#([\w-]+)\}\s*$", text)
            plain = re.sub(r"`|\[([^\]]*)\]\([^)]*\)", r"\1", text)
            found.add(explicit.group(1) if explicit else slugify(plain, "-"))
    return found


def mkdocs_build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the project's mkdocs.yml into ``site``, as ``make docs``
    runs it, but from another folder: the config must not depend on where it is run."""
    config = project / "mkdocs.yml"
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=site.parent,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_site_builds_with_no_warning(tmp_path: Path) -> None:
    built = mkdocs_build(REPO, tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    assert "WARNING -" not in built.stderr, built.stderr
    assert (tmp_path / "site" / "reference" / "pipeline" / "index.html").exists()


def test_the_site_fails_on_a_broken_anchor(tmp_path: Path) -> None:
    """The link check is on: a link to a heading that is not there stops the build."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](other.md#no-such-heading)\n")
    (docs / "other.md").write_text("# Other\n")
    config = (REPO / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    config = re.sub(r"(?ms)^nav:.*?^(?=\w)", "", config)
    (tmp_path / "mkdocs.yml").write_text(config)
    built = mkdocs_build(tmp_path, tmp_path / "site")
    assert built.returncode != 0
    assert "does not contain an anchor '#no-such-heading'" in built.stderr


def test_every_relative_link_in_the_readme_points_at_a_file_and_heading() -> None:
    broken = []
    for target in LINK.findall(README.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path, _, anchor = target.partition("#")
        file = (REPO / path).resolve()
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert not broken, f"README.md links to what is not there: {broken}"


def test_the_home_page_links_every_page_of_the_site() -> None:
    index = DOCS / "index.md"
    linked = {(DOCS / t.partition("#")[0]).resolve() for t in LINK.findall(index.read_text())}
    unlinked = [str(p.relative_to(DOCS)) for p in PAGES if p != index and p not in linked]
    assert not unlinked, f"docs/index.md's table of pages lacks {unlinked}"


def test_the_readme_stays_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 300
    first_block = text.split("```")[1]
    assert first_block.splitlines()[1].startswith("make demo")
    assert first_block.splitlines()[2].startswith("make test")
    assert "lowmark init" in first_block


def test_the_configuration_reference_is_current() -> None:
    committed = config_reference.PAGE.read_text()
    assert committed == config_reference.render(), (
        "docs/reference/pipeline.md is stale: run `make docs` (or "
        "`python -m scripts.config_reference`) and commit it"
    )


def test_every_configuration_key_has_a_description() -> None:
    assert config_reference.missing_descriptions() == []


def test_the_reference_names_every_key_of_every_model() -> None:
    page = config_reference.PAGE.read_text()
    for model in config_reference.reachable(config_reference.Pipeline):
        assert f"\n## {model.__name__}\n" in page
        for name in model.model_fields:
            assert f"| `{name}` |" in page, f"{model.__name__}.{name}"


def make_targets() -> set[str]:
    makefile = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", makefile, re.MULTILINE))


@pytest.mark.parametrize(
    "path",
    [README, *PAGES, *sorted((REPO / "state").glob("*.py")), REPO / "scripts" / "setup"],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_every_make_target_named_exists(path: Path) -> None:
    """In the docs, and in the messages that tell a user what to run."""
    named = {
        target
        for code in code_in(path)
        for target in re.findall(r"(?:^|[\s(])make ([a-z][\w-]*)", code, re.MULTILINE)
    }
    assert named - make_targets() == set()


def lowmark_command() -> click.Group:
    """The ``lowmark`` command as its entry point builds it (engine and Dagster commands)."""
    import lowmark.orchestration.cli as entry

    app = next(
        module.app
        for module in vars(entry).values()
        if isinstance(module, ModuleType) and isinstance(getattr(module, "app", None), typer.Typer)
    )
    group = typer.main.get_command(app)
    assert isinstance(group, click.Group)
    return group


def test_every_lowmark_command_and_option_the_docs_name_exists() -> None:
    group = lowmark_command()
    shared = {opt for param in group.params for opt in _flags(param)}
    unknown = []
    for path in [README, *PAGES]:
        for code in code_in(path):
            for line in code.splitlines():
                # `from lowmark import ...` is Python, not the command.
                command_use = r"(?:^|(?<!from)[\s$(])lowmark ([a-z][\w-]*)([^|;&#]*)"
                for used in re.finditer(command_use, line):
                    name, rest = used.groups()
                    command = group.commands.get(name)
                    if command is None:
                        unknown.append(f"{path.name}: lowmark {name}")
                        continue
                    options = shared | {opt for param in command.params for opt in _flags(param)}
                    unknown += [
                        f"{path.name}: lowmark {name} {option}"
                        for option in re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)
                        if option not in options
                    ]
    assert unknown == []


def test_the_cli_synopsis_lists_every_command_with_real_options() -> None:
    """The first code block of the CLI page is ``lowmark``'s synopsis: one command a line."""
    group = lowmark_command()
    synopsis = (DOCS / "cli.md").read_text().split("```")[1]
    listed: dict[str, set[str]] = {}
    for line in synopsis.splitlines():
        entry = re.match(r" {2}([a-z][\w-]*)\b(.*)", line)
        if entry:
            options = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", entry.group(2)))
            listed.setdefault(entry.group(1), set()).update(options)
    assert set(listed) == set(group.commands)
    for name, options in listed.items():
        real = {opt for param in group.commands[name].params for opt in _flags(param)}
        assert options <= real, (name, options - real)


def test_every_environment_variable_lowmark_reads_is_documented() -> None:
    documented = (DOCS / "reference" / "environment.md").read_text()
    read = {
        name
        for package in ("batches", "state", "orchestration")
        for source in (REPO / package).rglob("*.py")
        for name in re.findall(r"[\"'](LOWMARK_[A-Z_]+)[\"']", source.read_text())
    }
    assert read, "no LOWMARK_ variable found: the pattern is wrong"
    assert {name for name in read if f"`{name}`" not in documented} == set()


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: str(p.relative_to(REPO)))
def test_a_page_names_ideas_not_documents_and_one_word_for_maintenance(path: Path) -> None:
    text = path.read_text()
    assert not re.search(r"\bseeds? \d{3}|\bissue #?\d+", text, re.IGNORECASE)
    assert not re.search(r"\b(tidy|tidies|tidied|upkeep|compaction)\b", text, re.IGNORECASE)


def _flags(param: click.Parameter) -> list[str]:
    """Every flag of ``param``: ``--x`` and, for an on/off flag, ``--no-x`` too."""
    return [*param.opts, *param.secondary_opts]


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: str(p.relative_to(REPO)))
def test_a_docs_example_imports_only_public_names_and_from_lowmark_itself(path: Path) -> None:
    for example in python_examples(path):
        for node in lowmark_imports(example):
            names = [a.name for a in node.names]
            assert node.module == "lowmark", f"{path.name}: from {node.module} import {names}"
            assert set(names) <= set(lowmark.__all__), f"{path.name}: {names}"


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: str(p.relative_to(REPO)))
def test_every_lowmark_class_a_docs_example_uses_is_imported_on_its_page(path: Path) -> None:
    """A reader copying a page's examples gets every lowmark class they use (an example may
    use what an earlier block of the page imported or defined)."""
    bound: set[str] = set()
    for example in python_examples(path):
        missing = (free_names(example) - bound) & set(lowmark.__all__)
        assert missing == set(), f"{path.name}: {sorted(missing)} used, not imported"
        bound |= bound_names(example)


def test_every_self_contained_docs_example_builds_its_pipeline() -> None:
    """Each example that uses nothing it does not define runs, and the ones that make a
    ``Pipeline`` make a valid one (the stream-stream join's among them)."""
    built: dict[str, Pipeline] = {}
    for path in [README, *PAGES]:
        for example in python_examples(path):
            if lowmark_imports(example) and not free_names(example):
                namespace: dict[str, object] = {}
                exec(compile(example, path.name, "exec"), namespace)
                built |= {
                    f"{path.name}:{name}": value
                    for name, value in namespace.items()
                    if isinstance(value, Pipeline)
                }
    assert {"joins.md:paid_orders", "getting-started.md:orders"} <= set(built)


def test_the_python_stream_join_example_is_the_yaml_one(tmp_path: Path) -> None:
    text = (DOCS / "joins.md").read_text()
    section = text[text.index("{#stream-stream-joins}") :]
    yaml_example = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert yaml_example is not None
    (tmp_path / "join.yaml").write_text(yaml_example.group(1))
    from_yaml = load_pipelines(str(tmp_path / "join.yaml"))["paid_orders"]
    (python_example,) = [e for e in python_examples(DOCS / "joins.md") if lowmark_imports(e)]
    namespace: dict[str, object] = {}
    exec(compile(python_example, "joins.md", "exec"), namespace)

    assert namespace["paid_orders"] == from_yaml
