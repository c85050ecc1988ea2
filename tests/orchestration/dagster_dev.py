"""``lowmark ui`` — a real ``dagster dev`` (webserver, daemon, code server) on a free loopback
port — for the end-to-end Dagster tests: started over the test pipelines, watched through
its instance and its log, stopped with its whole process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.instance.ref import InstanceRef

from lowmark.orchestration.ui import UI_LOG, live_group_members
from lowmark.state.connect_server import free_port
from tests.helpers import children, command_line

REPO = Path(__file__).resolve().parents[2]
SHARED_SPARK = "SparkConnectServer"
"""In the command line of the shared Spark ``lowmark ui`` starts (its JVM)."""
LOWMARK = Path(sys.executable).parent / "lowmark"


@dataclass
class DagsterDev:
    ui: subprocess.Popen[bytes]
    """``lowmark ui``."""
    url: str
    home: Path
    data_root: Path
    log: Path
    """What ``lowmark ui`` printed."""

    @property
    def dagster_log(self) -> Path:
        """The rest of ``dagster dev``'s output: every run event, every sensor tick."""
        return self.home / UI_LOG

    def instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(self.home)))

    def runs(self, **filters: Any) -> list[dg.DagsterRun]:
        """Runs matching ``filters`` (``dg.RunsFilter``'s), oldest first."""
        with self.instance() as instance:
            records = instance.get_run_records(dg.RunsFilter(**filters))
        return [r.dagster_run for r in reversed(records)]

    def materializations(self, key: dg.AssetKey) -> list[dg.EventLogRecord]:
        """Unpartitioned materializations of ``key`` (one per batch), oldest first."""
        with self.instance() as instance:
            records = instance.fetch_materializations(key, limit=100).records
        return [r for r in reversed(records) if r.partition_key is None]

    def group(self) -> list[int]:
        """Every process ``lowmark ui`` started, with theirs: ``dagster dev``'s group and the
        shared Spark's (each a child of ``lowmark ui`` leading a group of its own)."""
        return [pid for leader in children(self.ui.pid) for pid in live_group_members(leader)]

    def dagster_group(self) -> list[int]:
        """``dagster dev``'s group only: its webserver, daemon, code server and runs."""
        leaders = [p for p in children(self.ui.pid) if SHARED_SPARK not in command_line(p)]
        return [pid for leader in leaders for pid in live_group_members(leader)]

    def stop(self) -> None:
        """SIGTERM ``lowmark ui`` (it stops its group); SIGKILL all of it if that hangs."""
        if self.ui.poll() is not None:
            return
        group = self.group()
        self.ui.send_signal(signal.SIGTERM)
        try:
            self.ui.wait(30)
        except subprocess.TimeoutExpired:
            for pid in [self.ui.pid, *group]:
                os.kill(pid, signal.SIGKILL)


def start_ui(
    home: Path,
    data_root: Path,
    log: Path,
    env: dict[str, str],
    args: tuple[str, ...] = (),
    cwd: Path = REPO,
) -> DagsterDev:
    """``lowmark ui ARGS`` over ``tests.orchestration.pipelines`` with its instance in
    ``home``, sensors running every 5 s and following for 10 minutes, its output appended to
    ``log``; returns once it printed its address. ``env`` adds to this process's
    environment. It runs in ``cwd``: a folder with a ``lowmark.toml`` makes it a project's
    (its ``[spark]`` table read), though these pipelines and instance, flags and ``env``
    win over its other settings."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DAGSTER_HOME": str(home),
        "LOWMARK_DATA_ROOT": str(data_root),
        "LOWMARK_SENSOR_INTERVAL_SECONDS": "5",
        "LOWMARK_SENSORS": "running",
        "LOWMARK_FOLLOW_SECONDS": "600",
        # Each run starts a short-lived Spark JVM: faster without C2 (timing is not asserted).
        "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        **env,
    }
    command = ["--pipelines", "tests.orchestration.pipelines", "ui", "--port", str(port)]
    # Served in a project too, where the default would be the project's workspace.
    command += ["--workspace", str(REPO / "workspace.yaml"), *args]
    with log.open("a") as out:
        ui = subprocess.Popen(
            [str(LOWMARK), *command], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    dev = DagsterDev(ui, f"http://127.0.0.1:{port}", home, data_root, log)
    try:
        wait_for("the UI's address", lambda: dev.url in log.read_text(), dev, 180)
    except BaseException:
        dev.stop()
        raise
    return dev


def wait_for(what: str, ready: Callable[[], Any], dev: DagsterDev, seconds: float = 300) -> Any:
    """Poll ``ready`` until it returns something truthy; fail with the server log's tail."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(1)
    tail = "\n".join(dev.log.read_text().splitlines()[-20:])
    logged = dev.dagster_log.read_text() if dev.dagster_log.exists() else ""
    rest = "\n".join(logged.splitlines()[-40:])
    pytest.fail(
        f"timed out after {seconds:.0f} s waiting for {what}; lowmark ui printed:\n{tail}\n"
        f"its log {dev.dagster_log}:\n{rest}"
    )
