"""Every command lowmark's messages advise exists: each `lowmark <command> --<option>` is a
command and option of the CLI, each `make <target>` a target of the Makefile.

The messages are read from the source (every string literal of ``batches``, ``state`` and
``orchestration`` that quotes a command in backticks: error messages, and the docstrings the
CLI's help is made of), with the commands ``lowmark init`` tells a new project to run, so
advice that names a command or option that was renamed or removed fails here, not in front
of a user."""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import typer

import lowmark.orchestration.cli  # noqa: F401  (adds its commands to the app: ui, init)
from lowmark.batches.cli import commands
from lowmark.orchestration.scaffold import command_lines

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("batches", "state", "orchestration")
ADVICE = re.compile(r"`(lowmark|make)((?: [^`]*)?)`")
PLACEHOLDER = "{}"


@dataclass(frozen=True)
class Advice:
    """One command a message advises, and where."""

    where: str
    command: str
    """``lowmark`` or ``make``."""
    words: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where}: `{' '.join((self.command, *self.words))}`"


def _texts(tree: ast.AST) -> list[tuple[int, str]]:
    """Each string literal of ``tree`` with its line; an f-string's values as ``{}``."""
    inside_fstrings = {
        id(part)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for part in node.values
    }
    texts: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in inside_fstrings:
                texts.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            text = "".join(
                str(part.value) if isinstance(part, ast.Constant) else PLACEHOLDER
                for part in node.values
            )
            texts.append((node.lineno, text))
    return texts


def _advice() -> list[Advice]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for line, text in _texts(tree):
                for match in ADVICE.finditer(text):
                    where = f"{path.relative_to(REPO)}:{line}"
                    words = tuple(_split(match.group(2)))
                    found.append(Advice(where, match.group(1), words))
    for next_step in command_lines():
        command, *rest = _split(next_step.partition("#")[0])
        found.append(Advice("lowmark init's next steps", command, tuple(rest)))
    return found


def _split(words: str) -> list[str]:
    try:
        return shlex.split(words)
    except ValueError:  # an unclosed quote in an example value
        return words.split()


def _cli() -> click.Group:
    group = typer.main.get_command(commands.app)
    assert isinstance(group, click.Group)
    return group


def _options(command: click.Command) -> set[str]:
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}


def _wrong_in_cli(advice: Advice, cli: click.Group) -> str | None:
    """What of ``advice`` the CLI lacks (None: all of it is there)."""
    words = list(advice.words)
    options = _options(cli)
    # Options before the command are the group's own (`lowmark --data-root D run ...`).
    while words and words[0].startswith("-"):
        option = words.pop(0).split("=")[0]
        if option not in options:
            return f"lowmark has no option {option}"
        if words and not words[0].startswith("-"):
            words.pop(0)  # its value
    if not words:
        return None
    name = words.pop(0)
    command = cli.commands.get(name)
    if command is None:
        return f"lowmark has no command {name!r}"
    known = _options(command)
    for word in words:
        option = word.split("=")[0]
        if option.startswith("--") and option not in known:
            return f"`lowmark {name}` has no option {option}"
    return None


def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.MULTILINE))


def _wrong_in_make(advice: Advice, targets: set[str]) -> str | None:
    missing = [w for w in advice.words if not w.startswith("-") and w not in targets]
    return f"the Makefile has no target {missing[0]!r}" if missing else None


def test_messages_advise_commands_somewhere() -> None:
    found = _advice()
    assert {a.command for a in found} == {"lowmark", "make"}
    assert any(a.words[:2] == ("reset", PLACEHOLDER) for a in found)


def test_the_check_catches_an_option_or_command_that_does_not_exist() -> None:
    cli = _cli()
    assert _wrong_in_cli(Advice("x", "lowmark", ("reset", "p", "--truncate-sink")), cli) is None
    assert _wrong_in_cli(Advice("x", "lowmark", ("reset", "p", "--truncate")), cli) == (
        "`lowmark reset` has no option --truncate"
    )
    assert _wrong_in_cli(Advice("x", "lowmark", ("tidy", "p")), cli) == (
        "lowmark has no command 'tidy'"
    )
    assert _wrong_in_make(Advice("x", "make", ("jars",)), {"setup"}) == (
        "the Makefile has no target 'jars'"
    )


@pytest.mark.parametrize("advice", _advice(), ids=str)
def test_every_command_a_message_advises_exists(advice: Advice) -> None:
    wrong = (
        _wrong_in_cli(advice, _cli())
        if advice.command == "lowmark"
        else _wrong_in_make(advice, _make_targets())
    )
    assert wrong is None, f"{advice} advises what does not exist: {wrong}"
