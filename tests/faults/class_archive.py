"""A class-data sharing archive of the classes a `lowmark run` loads, for the crash tests.

Every kill case is a `lowmark run` subprocess with a JVM of its own, and a
JVM that lives one batch spends most of its start loading and verifying
Spark's and Delta's classes. The archive holds them loaded and verified:
made once per test session by a JVM that runs the batches of a windowed and
a stateless pipeline and exits normally (``-XX:ArchiveClassesAtExit``), then
mapped by every `lowmark run` subprocess (``-XX:SharedArchiveFile``). A class
the archive lacks is loaded as without it, so the subprocesses behave the
same; only their start is cheaper (about a third less JVM CPU time for a
kill case).

Run as a script (``python -m tests.faults.class_archive FOLDER``), it is the
process whose JVM writes the archive; ``make_archive`` runs it, and the
``class_archive`` fixture (``tests.faults.conftest``) names the archive in
``ARCHIVE_ENV`` for ``subprocess_jvm_options``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pyspark import SparkContext

from lowmark.batches.cli.commands import main as lowmark
from tests.faults.scenarios import FIXED_INPUT, plain_append, session_update, write_input

JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
"""A process that lives one batch gains more from a fast JVM start than from C2. The
archive is made and used with these: a JVM refuses an archive made with other flags."""
ARCHIVE_ENV = "LOWMARK_TEST_CLASS_ARCHIVE"
"""The session's archive, when there is one."""


def subprocess_jvm_options() -> str:
    """``SPARK_SUBMIT_OPTS`` (the driver JVM's options) of a `lowmark` subprocess."""
    archive = os.environ.get(ARCHIVE_ENV)
    shared = (f"-XX:SharedArchiveFile={archive}",) if archive else ()
    return " ".join((*JVM_OPTIONS, *shared))


def make_archive(folder: Path, env: dict[str, str], cwd: Path) -> Path | None:
    """The archive, made in ``folder`` by a subprocess run with ``env`` in ``cwd`` (None:
    it could not be made; the subprocesses then start without one)."""
    archive = folder / "lowmark.jsa"
    options = " ".join((*JVM_OPTIONS, f"-XX:ArchiveClassesAtExit={archive}"))
    made = subprocess.run(
        [sys.executable, "-m", __name__, str(folder)],
        env={**env, "SPARK_SUBMIT_OPTS": options},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return archive if made.returncode == 0 and archive.exists() else None


def _load_and_exit(folder: Path) -> None:
    """Run the batches of ``session_update`` and ``plain_append`` over ``FIXED_INPUT`` up to
    the one the kill cases kill (batch 3: late rows, bad rows, windows closing), then let
    the JVM exit normally and wait until it has written the archive."""
    write_input(folder / "input", FIXED_INPUT)
    for pipeline in (session_update, plain_append):
        root = folder / pipeline.name  # beside ../input, as the scenarios expect
        args = ["--pipelines", "tests.faults.scenarios", "--data-root", str(root)]
        try:
            lowmark([*args, "run", pipeline.name, "--max-batches", "4"])
        except SystemExit as done:
            if done.code:
                raise
    gateway = SparkContext._gateway
    assert gateway is not None and gateway.proc is not None
    # The JVM exits when its stdin closes (PySpark's gateway server) and writes the
    # archive as it exits; a Python exit alone would not wait for it.
    gateway.proc.stdin.close()
    gateway.proc.wait()


if __name__ == "__main__":
    _load_and_exit(Path(sys.argv[1]))
