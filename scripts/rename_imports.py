"""Moves every reference to lowmark's top-level packages under the one import namespace
``lowmark``: ``batches.x`` becomes ``lowmark.batches.x`` (``state``, ``orchestration`` too).

Run from the repository's root: ``python -m scripts.rename_imports``. It is deterministic and
idempotent (a second run changes nothing), so it can be run again on a newer tree. What it
rewrites, in the files git tracks:

- Python: import statements (``from batches.x import``, ``import state.y``, ``from state import
  quarantine``), and module paths in strings and comments (``"batches.sources.files:F"``, a
  ``monkeypatch`` target, a logger name, ``-m state.smoke``, a docstring's ``batches.loop``).
  Code is never touched otherwise, so a local variable named ``state`` (``state.table``)
  stays as it is.
- Every other text file (docs, README, Makefile, YAML, TOML, shell): module paths.
- A few spots that name the packages bare (``SPOTS``); one that is not found is reported.
- The generated configuration reference is generated again from the renamed docstrings.

A module path is a package name followed by one of its own modules or subpackages (as the
folders hold them now), not preceded by a word character, a dot, a slash or a dash: so
``state.table`` in a docstring becomes ``lowmark.state.table``, but a folder such as
``tests/state/x`` or an attribute ``self.state.table`` does not. Afterwards ``ruff`` sorts the
imports and formats the Python files it changed (a longer import may no longer fit a line),
and a comment, docstring or string line the prefix made too long is wrapped (``wrap_long``).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path

NAMESPACE = "lowmark"
PACKAGES = ("batches", "state", "orchestration")
ROOT = Path(__file__).resolve().parents[1]
GENERATED = "docs/reference/pipeline.md"  # scripts/config_reference.py writes it from docstrings
SKIPPED = {"scripts/rename_imports.py", GENERATED}
TEXT_SUFFIXES = {".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini"}
TEXT_NAMES = {"Makefile", "scripts/setup", ".ci/run", "jvm/fetch-jars"}
LIMIT = 100  # pyproject.toml's line-length

SPOTS: dict[str, list[tuple[str, str]]] = {
    # Logger names follow the modules' names; lowmark's own loggers (lowmark.details) are not
    # among the packages'.
    "batches/cli/logs.py": [
        (
            'OWN_LOGGERS = ("batches", "state", "orchestration")',
            f'OWN_LOGGERS = ("{NAMESPACE}.batches", "{NAMESPACE}.state", '
            f'"{NAMESPACE}.orchestration")',
        ),
        (
            'record.name.split(".")[0] in OWN_LOGGERS',
            'record.name.startswith(tuple(f"{name}." for name in OWN_LOGGERS))',
        ),
    ],
    # What is imported before a project's folder goes on sys.path.
    "orchestration/project.py": [
        (
            'LOWMARK_PACKAGES = ("batches", "orchestration", "state")',
            f'LOWMARK_PACKAGES = ("{NAMESPACE}",)',
        )
    ],
    # The import graph's root.
    "tests/test_layers.py": [
        ('PACKAGES = ("batches", "state", "orchestration")', f'PACKAGES = ("{NAMESPACE}",)')
    ],
    "pyproject.toml": [
        (
            'root_packages = ["batches", "state", "orchestration"]',
            f'root_packages = ["{NAMESPACE}"]',
        ),
        ('\n    "orchestration",\n', f'\n    "{NAMESPACE}.orchestration",\n'),
        ('\n    "state",\n]', f'\n    "{NAMESPACE}.state",\n]'),
        (
            'packages = ["batches", "state", "orchestration", "tests", "bench"]',
            f'packages = ["{NAMESPACE}", "tests", "bench"]',
        ),
    ],
}
"""Per file: (old, new) texts replaced once; a spot already new is left alone."""


def submodules(package: str) -> list[str]:
    """The modules and subpackages directly in ``package``'s folder."""
    folder = ROOT / package
    names = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    return sorted(names)


def module_path_pattern() -> re.Pattern[str]:
    """A module path of one of the packages, at the start of a dotted name."""
    alternatives = "|".join(
        rf"{package}\.(?:{'|'.join(submodules(package))})\b" for package in PACKAGES
    )
    return re.compile(rf"(?<![\w./\-])(?=(?:{alternatives}))")


def rename_text(text: str, pattern: re.Pattern[str]) -> str:
    """Module paths in free text prefixed with the namespace."""
    return pattern.sub(f"{NAMESPACE}.", text)


def rename_python(source: str, pattern: re.Pattern[str]) -> str:
    """Import statements, and module paths in strings and comments, prefixed."""
    inserts: list[tuple[int, int]] = []  # (row, column) where the prefix goes
    edits: list[tuple[tuple[int, int], tuple[int, int], str]] = []  # token replacements
    statement: str | None = None  # "import" or "from" while inside such a statement
    expect_module = False  # the next NAME starts a module path
    depth = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER) or (
            tok.type == tokenize.OP and tok.string == ";"
        ):
            statement, expect_module = None, False
            continue
        if tok.type in (tokenize.STRING, tokenize.COMMENT):
            new = rename_text(tok.string, pattern)
            if new != tok.string:
                edits.append((tok.start, tok.end, new))
            continue
        starts = tok.type == tokenize.NAME and tok.string in ("import", "from")
        if starts and statement is None and depth == 0 and _starts_statement(tok):
            statement, expect_module = tok.string, True
            continue
        if statement is None:
            if tok.type == tokenize.OP and tok.string in "([{":
                depth += 1
            elif tok.type == tokenize.OP and tok.string in ")]}":
                depth -= 1
            continue
        if tok.type == tokenize.NAME:
            if expect_module and tok.string in PACKAGES:
                inserts.append(tok.start)
            if tok.string == "import" and statement == "from":
                statement = "from-names"
            expect_module = statement == "import" and tok.string == "import"
            if tok.string == "as":
                expect_module = False
        elif tok.type == tokenize.OP and tok.string == "," and statement == "import":
            expect_module = True
        elif tok.type == tokenize.OP and tok.string == ".":
            expect_module = False
    lines = source.splitlines(keepends=True)
    changes = [(start, start, f"{NAMESPACE}.") for start in inserts] + [
        (start, end, new) for start, end, new in edits
    ]
    for (srow, scol), (erow, ecol), new in sorted(changes, reverse=True):
        head = lines[srow - 1][:scol]
        tail = lines[erow - 1][ecol:]
        lines[srow - 1 : erow] = [head + new + tail]
    return "".join(lines)


def _starts_statement(tok: tokenize.TokenInfo) -> bool:
    """Whether ``import``/``from`` begins a statement (not ``yield from``, ``raise .. from``)."""
    before = tok.line[: tok.start[1]].strip()
    return before in ("", ":") or before.endswith(":") or before.endswith(";")


def wrap_long(source: str) -> tuple[str, list[int]]:
    """Lines past ``LIMIT`` that hold the namespace wrapped at a space: a comment or a
    docstring line carries its tail into the next line of the same paragraph (or a new one),
    a one-line string inside brackets is split in two adjacent literals. Returns the source
    and the rows it could not wrap."""
    left: list[int] = []
    for _ in range(1000):
        lines = source.splitlines(keepends=True)
        long = [
            row
            for row, line in enumerate(lines, 1)
            if len(line.rstrip("\n")) > LIMIT and f"{NAMESPACE}." in line and row not in left
        ]
        if not long:
            return source, left
        row = long[0]
        new = _wrap_line(source, lines, row)
        if new is None:
            left.append(row)
        else:
            source = new
    raise RuntimeError("wrapping did not settle")


def _wrap_line(source: str, lines: list[str], row: int) -> str | None:
    """``source`` with line ``row`` wrapped, or None when no rule applies."""
    line = lines[row - 1].rstrip("\n")
    depth = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        if not tok.start[0] <= row <= tok.end[0]:
            continue
        more = row < len(lines)
        if tok.type == tokenize.COMMENT and not line[: tok.start[1]].strip():
            col = tok.start[1]
            follows = more and lines[row][:col].strip() == "" and lines[row][col:].startswith("# ")
            return _carry(lines, row, col, "# ", follows)
        if tok.type == tokenize.STRING and tok.string.endswith(('"""', "'''")):
            col = tok.start[1]
            follows = more and row + 1 <= tok.end[0] and _same_paragraph(lines[row], col)
            return _carry(lines, row, col, "", follows)
        if tok.type == tokenize.STRING and tok.start[0] == tok.end[0] and depth > 0:
            return _split_string(lines, row, tok)
    return None


def _same_paragraph(text: str, indent: int) -> bool:
    body = text.rstrip("\n")
    return (
        len(body) - len(body.lstrip()) == indent
        and body.strip() not in ("", '"""')
        and not body.lstrip().startswith(("- ", "* ", ">>>", ":", "``"))
    )


def _carry(lines: list[str], row: int, indent: int, lead: str, follows: bool) -> str | None:
    """Line ``row`` cut at its last space within ``LIMIT``; the tail begins the next line when
    it ``follows`` in the same paragraph, else a new line of ``indent`` spaces and ``lead``."""
    line = lines[row - 1].rstrip("\n")
    cut = line.rfind(" ", indent + len(lead) + 1, LIMIT + 1)
    if cut < 0:
        return None
    head, tail = line[:cut], line[cut + 1 :]
    pad = " " * indent + lead
    if follows:
        following = lines[row].rstrip("\n")[len(pad) :]
        lines[row - 1 : row + 1] = [head + "\n", f"{pad}{tail} {following}\n"]
    else:
        lines[row - 1 : row] = [head + "\n", f"{pad}{tail}\n"]
    return "".join(lines)


def _split_string(lines: list[str], row: int, tok: tokenize.TokenInfo) -> str | None:
    """A one-line string inside brackets as two adjacent literals, cut after a space (outside
    an f-string's braces) so the first fits; each keeps an ``f`` only if it has a brace."""
    text = tok.string
    opening = re.match(r"[A-Za-z]*['\"]", text)
    if opening is None:
        return None
    prefix, quote = opening.group()[:-1], opening.group()[-1]
    body = text[opening.end() : -1]
    room = LIMIT - tok.start[1] - len(opening.group()) - 1
    cut, braces = -1, 0
    for i, char in enumerate(body[:room]):
        braces += {"{": 1, "}": -1}.get(char, 0)
        if char == " " and braces == 0:
            cut = i + 1
    if cut <= 0:
        return None

    def literal(part: str) -> str:
        keep = prefix if "{" in part else prefix.replace("f", "").replace("F", "")
        return f"{keep}{quote}{part}{quote}"

    line = lines[row - 1]
    head = line[: tok.start[1]] + literal(body[:cut])
    tail = " " * tok.start[1] + literal(body[cut:]) + line[tok.end[1] :]
    lines[row - 1 : row] = [head + "\n", tail]
    return "".join(lines)


def apply_spots(path: str, text: str) -> tuple[str, list[str]]:
    """``SPOTS`` for ``path`` applied; the spots found neither old nor new."""
    missing = []
    for old, new in SPOTS.get(path, []):
        if old in text:
            text = text.replace(old, new, 1)
        elif new not in text:
            missing.append(f"{path}: {old!r}")
    return text, missing


def regenerate_reference() -> None:
    """``scripts.config_reference`` run over the renamed tree. ``lowmark`` is put on the path as
    a namespace of links to the packages, as the tree may not have its ``lowmark`` folder yet
    (where it has one, that folder wins)."""
    with tempfile.TemporaryDirectory() as tmp:
        namespace = Path(tmp) / NAMESPACE
        namespace.mkdir()
        for package in PACKAGES:
            (namespace / package).symlink_to(ROOT / package)
        subprocess.run(
            [sys.executable, "-m", "scripts.config_reference"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), tmp])},
            check=True,
        )


def tracked_files() -> list[str]:
    done = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [
        name
        for name in done.stdout.splitlines()
        if name not in SKIPPED
        and (ROOT / name).is_file()
        and not (ROOT / name).is_symlink()
        and (name.endswith(".py") or Path(name).suffix in TEXT_SUFFIXES or name in TEXT_NAMES)
    ]


def main() -> int:
    pattern = module_path_pattern()
    changed: list[str] = []
    missing: list[str] = []
    for name in tracked_files():
        path = ROOT / name
        text = path.read_text()
        new = rename_python(text, pattern) if name.endswith(".py") else rename_text(text, pattern)
        new, not_found = apply_spots(name, new)
        missing += not_found
        if new != text:
            path.write_text(new)
            changed.append(name)
    python = [name for name in changed if name.endswith(".py")]
    if python:
        # `lowmark` is first-party whether or not its folder exists yet.
        first_party = f"lint.isort.known-first-party = ['{NAMESPACE}']"
        ruff = [sys.executable, "-m", "ruff"]
        subprocess.run(
            [*ruff, "check", "--config", first_party, "--select", "I", "--fix", "-q", *python],
            cwd=ROOT,
            check=True,
        )
        subprocess.run([*ruff, "format", "-q", *python], cwd=ROOT, check=True)
        for name in python:
            path = ROOT / name
            text = path.read_text()
            wrapped, left = wrap_long(text)
            if wrapped != text:
                path.write_text(wrapped)
            missing += [f"{name}:{row}: too long, not wrapped" for row in left]
        subprocess.run([*ruff, "format", "-q", *python], cwd=ROOT, check=True)
    regenerate_reference()
    print(f"{len(changed)} files changed")
    for spot in missing:
        print(f"not found: {spot}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
