"""Where the ``lowmark`` command's details go: a log file, so the console stays short.

A failing batch's first contact should be one paragraph, not Spark's
executor logs, PySpark's JSON blobs and a traceback. So the CLI sends

- Python's logging (lowmark, py4j, PySpark's JSON error loggers) to
  ``<data root>/_lowmark/_logs/lowmark.log`` (``log_file``), and to the
  console only lowmark's own warnings (``LOWMARK_LOG_LEVEL``), or
  everything with ``--verbose``;
- everything the Spark JVM prints (log4j's ERROR lines, its start-up
  notices, its Python workers' output) to the same file: the JVM inherits
  the file as its stdout and stderr (``jvm_output_to``).

Pipeline names start with a letter or digit, so ``_logs`` never collides with
a checkpoint folder.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

OWN_LOGGERS = ("lowmark.batches", "lowmark.state", "lowmark.orchestration")
"""lowmark's packages: their warnings are for the person at the console."""

DETAILS = "lowmark.details"
"""The logger of what is for the log file only (and ``--verbose``): an error's traceback."""

PYSPARK_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")
"""PySpark's loggers that print a whole error as one JSON line to stderr by themselves."""

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_file(data_root: Path) -> Path:
    """The CLI's log file under ``data_root`` (created on the first line written)."""
    return data_root / "_lowmark" / "_logs" / "lowmark.log"


class _FileHandler(logging.FileHandler):
    """Appends to a file whose folder is made when the first record is written, so a
    command that logs nothing (``lowmark status``) creates nothing."""

    def _open(self) -> io.TextIOWrapper:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


class _Console(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (a test may swap it)."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _: object) -> None:
        pass


_INSTALLED = "lowmark"
"""The name of the handlers ``send_logs`` installs, so a second call replaces them."""


def send_logs(path: Path, verbose: bool) -> None:
    """Route logging as the module doc says; calling it again replaces what it set up."""
    root = logging.getLogger()
    _remove_installed(root)
    root.setLevel(logging.INFO)
    file = _installed(_FileHandler(path, delay=True))
    file.setFormatter(logging.Formatter(_FORMAT))
    root.addHandler(file)
    console = _installed(_Console())
    console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    if not verbose:
        console.setLevel(os.environ.get("LOWMARK_LOG_LEVEL", "WARNING"))
        console.addFilter(
            lambda record: record.name.startswith(tuple(f"{name}." for name in OWN_LOGGERS))
        )
    root.addHandler(console)
    _sent[:] = [(path, verbose)]
    if "pyspark" in sys.modules:
        send_pyspark_logs()


_sent: list[tuple[Path, bool]] = []
"""Where ``send_logs`` last sent logs, and if verbosely: for ``send_pyspark_logs``."""


def send_pyspark_logs() -> None:
    """PySpark's JSON error loggers to where ``send_logs`` sends logs (nothing when it was
    not called). ``send_logs`` does it when PySpark is imported; otherwise a command calls
    this before it starts Spark, so that one that never needs Spark never imports PySpark."""
    if not _sent:
        return
    from pyspark.logger import PySparkLogger

    path, verbose = _sent[0]
    for name in PYSPARK_LOGGERS:
        _to_file_only(PySparkLogger.getLogger(name), path, verbose)


def _to_file_only(logger: logging.Logger, path: Path, verbose: bool) -> None:
    """Replace a PySpark logger's stderr handler with the log file (and, ``verbose``, the
    console): it does not propagate, and formats as JSON whatever handler it is given."""
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.addHandler(_installed(_FileHandler(path, delay=True)))
    if verbose:
        logger.addHandler(_installed(_Console()))


def _installed(handler: logging.Handler) -> logging.Handler:
    handler.set_name(_INSTALLED)
    return handler


def _remove_installed(logger: logging.Logger) -> None:
    for handler in list(logger.handlers):
        if handler.get_name() == _INSTALLED:
            logger.removeHandler(handler)
            handler.close()


def stop_logs() -> None:
    """Take away what ``send_logs`` set up (a process that goes on after the command: a
    test, a caller of ``lowmark.batches.cli.commands.main``): root back to Python's default
    level."""
    _remove_installed(logging.getLogger())
    logging.getLogger().setLevel(logging.WARNING)
    _sent.clear()
    for name in PYSPARK_LOGGERS:
        _remove_installed(logging.getLogger(name))


def installed_log_file() -> Path | None:
    """The file ``send_logs`` sends details to, or None when it was not called."""
    for handler in logging.getLogger().handlers:
        if handler.get_name() == _INSTALLED and isinstance(handler, logging.FileHandler):
            return Path(handler.baseFilename)
    return None


@contextmanager
def jvm_output_to(path: Path) -> Iterator[None]:
    """While Spark starts inside this block, its JVM is given ``path`` as its stdout and
    stderr (a child inherits them at start, and keeps them); ours are put back after."""
    path.parent.mkdir(parents=True, exist_ok=True)
    target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        for fd in saved:
            os.dup2(target, fd)
        yield
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        os.close(target)
