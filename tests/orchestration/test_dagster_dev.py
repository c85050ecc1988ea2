"""End to end through a real ``dagster dev`` (webserver + daemon) on a free loopback port:
the sensor launches runs that commit batches, a SIGKILLed run is replayed by the next
one, and the UI (headless Chromium) shows the job, the sensor and the successful run."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.instance.ref import InstanceRef
from pyspark.sql import SparkSession

from tests.conftest import write_json_lines
from tests.orchestration.pipelines import HOLD
from tests.orchestration.test_jobs import tick

REPO = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).parent / "dagster"
CHROMIUM = shutil.which("chromium")

pytestmark = pytest.mark.slow


@dataclass
class DagsterDev:
    url: str
    home: Path
    data_root: Path
    log: Path

    def instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(self.home)))

    def runs(self, pipeline: str) -> list[dg.DagsterRun]:
        """Runs of ``pipeline``, oldest first."""
        with self.instance() as instance:
            records = instance.get_run_records(dg.RunsFilter(tags={"lowmark/pipeline": pipeline}))
        return [r.dagster_run for r in reversed(records)]


def wait_for(what: str, ready: Callable[[], Any], dev: DagsterDev, seconds: float = 300) -> Any:
    """Poll ``ready`` until it returns something truthy; fail with the server log's tail."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(1)
    tail = "\n".join(dev.log.read_text().splitlines()[-40:])
    pytest.fail(f"timed out after {seconds:.0f} s waiting for {what}; dagster dev log:\n{tail}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterDev]:
    base = tmp_path_factory.mktemp("dagster_dev")
    home, data_root, log = base / "home", base / "data", base / "dagster-dev.log"
    home.mkdir()
    data_root.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    port = free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "LOWMARK_PIPELINES": "tests.orchestration.pipelines",
        "LOWMARK_DATA_ROOT": str(data_root),
        "LOWMARK_SENSOR_INTERVAL_SECONDS": "5",
        "LOWMARK_SENSORS": "running",
    }
    with log.open("w") as out:
        server = subprocess.Popen(
            [str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    dev = DagsterDev(f"http://127.0.0.1:{port}", home, data_root, log)
    try:
        wait_for("the webserver", lambda: answers(f"{dev.url}/server_info"), dev, 180)
        yield dev
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture(scope="module")
def ticks_run(dev: DagsterDev) -> dg.DagsterRun:
    """New ticks land; the sensor launches a run; it succeeds."""
    write_json_lines(dev.data_root / "ticks/in", "f0.json", [tick("a", 1, 1), tick("a", 30, 2)], 1)
    return wait_for(
        "a successful ticks run",
        lambda: [r for r in dev.runs("ticks") if r.status == dg.DagsterRunStatus.SUCCESS],
        dev,
    )[0]


def test_the_sensor_launches_a_run_that_commits_the_new_batch(
    spark: SparkSession, dev: DagsterDev, ticks_run: dg.DagsterRun
) -> None:
    assert ticks_run.job_name == "ticks_microbatches"
    assert ticks_run.tags["dagster/run_key"] == "ticks:batch-0"
    commits = spark.read.format("delta").load(str(dev.data_root / "_lowmark/ticks/commits"))
    # Batch 0 takes the file; a batch 1 with no input may follow, emitting the window
    # [0 s, 10 s) that the watermark (30 s) closed.
    rows_in = {r.batch_id: r.rows_in for r in commits.collect()}
    assert rows_in[0] == 2 and sum(rows_in.values()) == 2
    with dev.instance() as instance:
        records = instance.fetch_materializations(dg.AssetKey(["lowmark", "ticks"]), limit=10)
    materialized = {
        r.asset_materialization.metadata["batch_id"].value  # type: ignore[union-attr]
        for r in records.records
    }
    assert materialized == set(rows_in)


def test_a_run_killed_mid_batch_is_replayed_by_the_next_sensor_run(
    spark: SparkSession, dev: DagsterDev
) -> None:
    (dev.data_root / HOLD).touch()
    write_json_lines(dev.data_root / "slow/in", "f0.json", [{"id": 1}, {"id": 2}], 1)
    pid_file = dev.data_root / "HELD.pid"
    wait_for("the slow run to hold mid-batch", pid_file.exists, dev)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    (dev.data_root / HOLD).unlink()

    runs = wait_for(
        "a failed run, then a successful replay",
        lambda: (r := dev.runs("slow"))
        and r[0].status == dg.DagsterRunStatus.FAILURE
        and r[-1].status == dg.DagsterRunStatus.SUCCESS
        and r,
        dev,
    )
    assert runs[-1].tags["dagster/run_key"] == f"slow:batch-0:replay-after-{runs[0].run_id}"
    checkpoint = dev.data_root / "_lowmark/slow"
    progress = spark.read.format("delta").load(str(checkpoint / "progress")).collect()
    assert [(r.batch_id, r.replayed) for r in progress] == [(0, True)]
    offsets = spark.read.format("delta").load(str(checkpoint / "offsets")).collect()
    assert [r.batch_id for r in offsets] == [0]
    sink = spark.read.format("delta").load(str(dev.data_root / "slow/out")).collect()
    assert sorted(r.id for r in sink) == [1, 2]


def test_the_ui_shows_the_job_the_sensor_and_the_successful_run(
    dev: DagsterDev, ticks_run: dg.DagsterRun, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None, "Debian's chromium is missing: run `make setup`"
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page()
        page.goto(f"{dev.url}/jobs")
        page.get_by_text("ticks_microbatches").first.wait_for(timeout=60_000)
        page.goto(f"{dev.url}/automation")
        page.get_by_text("ticks_sensor").first.wait_for(timeout=60_000)
        page.goto(f"{dev.url}/runs/{ticks_run.run_id}")
        page.get_by_text("Success").first.wait_for(timeout=60_000)
        page.screenshot(path=str(tmp_path / "run.png"))
        browser.close()
