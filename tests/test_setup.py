"""The set-up (``make setup``, ``make test-setup``, ``make integration-setup``: scripts/setup) on
a PATH that holds only the tools it may use — python3.11, java, mvn, make and plain shell tools;
no apt-get, no browser.

The demo's and the tests' set-up succeed there; a missing or wrong tool, and the integration
set-up's missing browser, end it with one line naming what to install; a failing step prints
its log's last lines and one line naming the step. They rely on the markers of the
repository's ``make test-setup`` being current (as ``make test`` leaves them), so nothing is
downloaded or run again and each takes a second or two.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SETUP = REPO / "scripts" / "setup"
SHELL_TOOLS = (
    # the shells and make
    "bash", "sh", "env", "make",
    # what scripts/setup, jvm/fetch-jars, mvn's launcher and Spark's use
    "basename", "cat", "chmod", "cut", "date", "dirname", "expr", "grep", "head", "id", "ls",
    "mkdir", "readlink", "rm", "sed", "sha256sum", "sleep", "tail", "touch", "tr", "uname",
    "wc",
)  # fmt: skip
"""The demo's set-up needs nothing else: no apt-get, no chromium, no curl, no sudo."""


def tool_path(
    tmp_path: Path, *, leave_out: str = "", fakes: dict[str, str] | None = None
) -> dict[str, str]:
    """An environment whose PATH is a folder of links to python3.11 (this venv's base
    interpreter), java, mvn and ``SHELL_TOOLS``, except ``leave_out``; ``fakes`` maps a tool's
    name to a shell script standing in for it (an old java, say) or added to them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java_home = os.environ.get("JAVA_HOME")
    found = {
        "python3.11": str(Path(sys.executable).resolve()),
        "java": f"{java_home}/bin/java" if java_home else shutil.which("java"),
        "mvn": shutil.which("mvn"),
        **{name: shutil.which(name) for name in SHELL_TOOLS},
    }
    for name, target in found.items():
        assert target is not None, f"{name} is not installed on this machine"
        if name != leave_out:
            (bin_dir / name).symlink_to(target)
    for name, script in (fakes or {}).items():
        fake = bin_dir / name
        fake.unlink(missing_ok=True)
        fake.write_text(f"#!/bin/sh\n{script}\n")
        fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in {"JAVA_HOME", "PYTHON"}}
    env = {k: v for k, v in env.items() if not k.startswith(("MAKE", "MFLAGS"))}
    env["PATH"] = str(bin_dir)
    return env


def run(args: list[str], env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """stdout and stderr as a terminal shows them: one stream."""
    return subprocess.run(
        args,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )


@pytest.mark.integration
def test_demo_setup_succeeds_without_apt_get_or_a_browser(tmp_path: Path) -> None:
    done = run(["make", "setup"], tool_path(tmp_path))
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert [line.split(" ")[0] for line in lines] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]", "set-up"]
    assert lines[0].startswith("[1/4] tools (python3.11, java, mvn) … python 3.11.")
    assert all(" … up to date" in line or " done in " in line for line in lines[1:4]), lines
    assert "apt" not in done.stdout and "chromium" not in done.stdout


def test_the_tests_setup_needs_no_browser_and_no_smoke_check(tmp_path: Path) -> None:
    """``make test`` runs no browser (only ``make test-integration``'s set-up asks for one)
    and no smoke check (its tests start Spark first thing)."""
    done = run([str(SETUP), "test"], tool_path(tmp_path))
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    steps = ["[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]", "set-up"]
    assert [line.split(" ")[0] for line in lines] == steps
    assert lines[3].startswith("[4/5] Kafka test broker's jars via mvn into jvm/kafka/lib … ")
    # The Postgres sink's tests start a server from the binaries the image has.
    assert lines[4].startswith("[5/5] PostgreSQL server binaries") and "up to date" in lines[4]
    assert "smoke" not in done.stdout, "the tests start Spark first thing: no smoke check"
    assert "apt" not in done.stdout and "chromium" not in done.stdout


JAVA_17 = "install a Java 17 JDK (Spark 4.2 runs on Java 17, 21 or 25.0.3+)"


def says_version(line: str) -> str:
    """A fake tool that prints one version line on stderr, as ``java -version`` does."""
    return f"echo '{line}' >&2"


@pytest.mark.parametrize(
    ("leave_out", "fakes", "says"),
    [
        pytest.param(
            "python3.11",
            {},
            "python3.11 not found: install Python 3.11 and rerun, or pass PYTHON=",
            id="no python3.11",
        ),
        pytest.param(
            "",
            {"python3.11": "echo 3.12.1"},
            "python3.11 is Python 3.12.1, lowmark needs 3.11: install Python 3.11",
            id="python3.11 is 3.12",
        ),
        pytest.param("java", {}, f"java not found: {JAVA_17} and put it on PATH", id="no java"),
        pytest.param(
            "",
            {"java": says_version('openjdk version "11.0.22" 2024-01-16')},
            f"java 17 not found (java -version says 11): {JAVA_17} and put it first on PATH",
            id="java 11",
        ),
        pytest.param(
            "",
            {"java": says_version('java version "1.8.0_292"')},
            "java 17 not found (java -version says 8)",
            id="java 8",
        ),
        pytest.param(
            "",
            {"java": says_version('openjdk version "22.0.2"')},
            "java 17 not found (java -version says 22)",
            id="java 22",
        ),
        pytest.param(
            "",
            {"java": says_version('openjdk version "25.0.1"')},
            "java 25 before 25.0.3 is deprecated",
            id="java 25.0.1",
        ),
        pytest.param(
            "",
            {"java": "echo 'Unable to locate a Java Runtime.' >&2; exit 1"},
            f"java does not run (Unable to locate a Java Runtime.): {JAVA_17}",
            id="java does not run",
        ),
        pytest.param(
            "mvn",
            {},
            "mvn not found: install Apache Maven (3.6.3 or newer) and put it on PATH",
            id="no mvn",
        ),
        pytest.param(
            "",
            {"mvn": "echo 'Apache Maven 3.6.0'"},
            "mvn is Maven 3.6.0: install Apache Maven 3.6.3 or newer",
            id="maven 3.6.0",
        ),
    ],
)
def test_a_missing_or_wrong_tool_is_one_line_naming_what_to_install(
    tmp_path: Path, leave_out: str, fakes: dict[str, str], says: str
) -> None:
    done = run([str(SETUP), "demo"], tool_path(tmp_path, leave_out=leave_out, fakes=fakes))
    assert done.returncode == 1
    [line] = done.stdout.splitlines()
    assert line.startswith(f"[1/4] tools (python3.11, java, mvn) … {says}"), line


def test_integration_setup_without_apt_get_or_a_browser_is_one_line_naming_chromium(
    tmp_path: Path,
) -> None:
    done = run([str(SETUP), "integration"], tool_path(tmp_path))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "chromium not found on PATH and apt-get is not available: install Chromium so that "
        "`chromium` is on PATH, and rerun"
    ]


def test_integration_setup_of_a_user_who_is_not_root_does_not_run_apt_get(
    tmp_path: Path,
) -> None:
    ran = tmp_path / "apt-get ran"
    env = tool_path(tmp_path, fakes={"id": "echo 1000", "apt-get": f"touch '{ran}'"})
    done = run([str(SETUP), "integration"], env)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "chromium not found on PATH and apt-get needs root: run `sudo apt-get install chromium` "
        "and rerun"
    ]
    assert not ran.exists()


def test_a_failing_step_prints_the_end_of_its_log_and_one_line_naming_it(tmp_path: Path) -> None:
    """A copy of the set-up files whose venv has a python but no pip: the packages step fails."""
    project = tmp_path / "project"
    for name in ("Makefile", "pyproject.toml", "constraints.txt", "scripts/setup"):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, project / name)
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / ".venv" / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    done = run(["scripts/setup", "demo"], tool_path(tmp_path), cwd=project)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[1].startswith("[2/4] Python packages into .venv (pyproject.toml or constraints")
    assert " … failed after " in lines[1]
    assert ".venv/bin/pip: No such file or directory" in done.stdout
    assert lines[-1] == (
        "set-up failed at [2/4] Python packages into .venv (make --no-print-directory "
        ".venv/.installed): the last lines of .venv/setup.log are above"
    )
    log = (project / ".venv" / "setup.log").read_text()
    assert "\n".join(lines[2:-1]) in log
