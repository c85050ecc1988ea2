"""What ``lowmark ui`` prints while it serves, and what it leaves in its log."""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
import pytest

from lowmark.orchestration.ui import UI_LOG, ConsoleFeed
from tests.helpers import tick, write_json_lines
from tests.orchestration.dagster_dev import start_ui, wait_for


@pytest.mark.slow
@pytest.mark.integration
def test_the_ui_prints_its_address_its_log_and_each_run_and_logs_the_rest(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    # Runs that end once caught up, so a run's end is printed too.
    dev = start_ui(
        tmp_path / "home", data, tmp_path / "console.txt", {"LOWMARK_FOLLOW_SECONDS": "0"}
    )
    try:
        wait_for("a sensor's skip", lambda: "ticks_sensor skipped" in dev.log.read_text(), dev)
        write_json_lines(data / "ticks/in", "f0.json", [tick("a", 1, 1)], 1)
        ran = r"ticks: run (\w{8}) succeeded in \d+ s"
        ended = wait_for("ticks' run to end", lambda: re.search(ran, dev.log.read_text()), dev)
    finally:
        dev.stop()
    printed = dev.log.read_text()
    assert f"ticks: run {ended[1]} started (ticks_sensor)" in printed, printed
    assert dev.url in printed and f"its log: {dev.home / UI_LOG}" in printed, printed
    assert len(printed.splitlines()) <= 16, printed
    assert not re.search("DEBUG|INFO|Warning|RUN_START", printed), printed
    logged = dev.dagster_log.read_text()
    assert "ticks_sensor skipped" in logged and "BetaWarning" in logged
    assert f"DEBUG - ticks_microbatches - {ended[1]}" in logged  # the run's events


def record(logger: str, level: str, message: str) -> str:
    """A log record as ``dagster dev`` writes it, colours included."""
    return (
        f"\x1b[32m2026-11-29 00:01:27 +0000\x1b[0m - {logger} - \x1b[34m{level}\x1b[0m - {message}"
    )


RUN_ID = "0a1b2c3d-0000-4000-8000-000000000000"
RUN = f"ticks_microbatches - {RUN_ID} - 4242"
CAUGHT_UP = "Sensor ticks_sensor skipped: ticks is caught up (last committed batch 0): no new data"
DAEMON_DIED = [
    record("dagster.daemon.SensorDaemon", "INFO", "Checking for new runs for sensor: ticks_sensor"),
    record(
        "dagster.daemon.SensorDaemon",
        "INFO",
        f"Sensor ticks_sensor skipped: run {RUN_ID} is STARTED",
    ),
    record("dagster.daemon.SensorDaemon", "INFO", CAUGHT_UP),
    record("dagster.daemon.SensorDaemon", "INFO", CAUGHT_UP),
    record("dagster", "DEBUG", f"{RUN} - RUN_START - Started execution of run"),
    record("dagster", "ERROR", f"{RUN} - lowmark_ticks - STEP_FAILURE - Execution of step failed"),
    "Traceback (most recent call last):",
    '  File "x.py", line 1, in <module>',
    "ValueError: the run's own error",
    "/venv/click/core.py:911: SupersessionWarning: Function `dev_command` is superseded",
    "  return fn(*args, **kwargs)",
    record("dagster", "ERROR", "An unexpected exception has occurred"),
    "Traceback (most recent call last):",
    '  File "/venv/dagster/_cli/dev.py", line 305, in dev_command_impl',
    "    raise Exception(",
    "Exception: dagster-daemon process shut down unexpectedly with return code -9",
    record("dagster", "INFO", "Shutting down Dagster services..."),
]
"""Lines of ``dagster dev``'s output as it writes them (colours included)."""


def test_the_ui_prints_of_its_log_a_changed_skip_reason_and_errors_not_a_runs_own_events(
    tmp_path: Path,
) -> None:
    log = tmp_path / UI_LOG
    text = "\n".join(DAEMON_DIED) + "\n"
    log.write_text(text[:200])  # a line cut short: printed once it is whole
    with dg.DagsterInstance.ephemeral() as instance:
        feed = ConsoleFeed(instance, log)
        assert feed.poll() == []
        log.write_text(text)
        printed = feed.poll()
    assert printed == [
        CAUGHT_UP,
        "error: dagster: An unexpected exception has occurred",
        "error: Exception: dagster-daemon process shut down unexpectedly with return code -9",
    ]
