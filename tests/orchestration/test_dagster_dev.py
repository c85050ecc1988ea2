"""End to end through ``lowmark ui`` — a real ``dagster dev`` (webserver, daemon, code
server) on a free loopback port — and Debian's Chromium driven by Playwright:

- sensor ticks start no Spark; the run a tick launches commits the new file, then follows
  the source, so a file that lands later is committed by the same run; the runs use the
  Spark ``lowmark ui`` shares (a Spark Connect server) and start no JVM of their own;
- a SIGKILLed run's batch is replayed by the next run, on a session with the conf given
  ``lowmark ui --conf``;
- the UI: the asset page shows the watermark as a time and the sensor as the asset's
  automation, the input folder's page the sensor's observation of what waits there,
  Materialize launches a micro-batch run, and a backfill of two partitions launched from
  the UI runs (the following run makes way for it, and the sensor resumes following
  after it);
- SIGTERM to ``lowmark ui`` stops the server, its runs and their Spark within 15 s.

The tests share one server and run in file order; the last one stops it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from pyspark.sql import SparkSession

from lowmark.orchestration.keys import YIELDED_TO_TAG
from lowmark.orchestration.runs import IN_FLIGHT
from lowmark.state.checkpoint import Checkpoint
from tests.helpers import delta_frame, tick, write_json_lines
from tests.orchestration.dagster_dev import (
    SHARED_SPARK,
    DagsterDev,
    command_line,
    start_ui,
    wait_for,
)
from tests.orchestration.pipelines import HOLD, SESSION
from tests.orchestration.workspace import partition_range

CHROMIUM = shutil.which("chromium")
TICKS = dg.AssetKey(["lowmark", "ticks"])
SLOW = dg.AssetKey(["lowmark", "slow"])
STARTED = dg.DagsterRunStatus.STARTED

pytestmark = [pytest.mark.slow, pytest.mark.integration]
SHUFFLE = "spark.sql.shuffle.partitions"


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterDev]:
    base = tmp_path_factory.mktemp("dagster_dev")
    (base / "data").mkdir()
    # A process per run on a shared Spark Connect server (the warm runner: test_runner.py).
    args = ("--no-runner", "--conf", f"{SHUFFLE}=7")
    dev = start_ui(base / "home", base / "data", base / "lowmark-ui.log", {}, args)
    try:
        yield dev
    finally:
        dev.stop()


def test_ticks_start_no_spark_and_a_following_run_takes_files_as_they_land(
    dev: DagsterDev,
) -> None:
    # Several ticks over empty folders first: no JVM anywhere in the server's processes.
    wait_for(
        "two sensor ticks",
        lambda: dev.dagster_log.read_text().count("ticks_sensor skipped") >= 2,
        dev,
    )
    assert [p for p in dev.dagster_group() if "java" in command_line(p)] == []
    assert any(SHARED_SPARK in command_line(p) for p in dev.group())

    write_json_lines(dev.data_root / "ticks/in", "f0.json", [tick("a", 1, 1), tick("a", 30, 2)], 1)
    first = wait_for("batch 0 of ticks", lambda: dev.materializations(TICKS), dev)
    [run] = dev.runs(tags={"lowmark/pipeline": "ticks"})
    assert run.tags["dagster/run_key"] == "ticks:new:batch-0"
    # Hour 3 moves the watermark past hours 0 and 1 (10 s windows, 10 s lateness).
    write_json_lines(dev.data_root / "ticks/in", "f1.json", [tick("b", 10_800, 4)], 2)
    landed = wait_for(
        "the second file's batch",
        lambda: (m := dev.materializations(TICKS))
        and any(r.asset_materialization.metadata["rows_in"].value == 1 for r in m)  # type: ignore[union-attr]
        and m,
        dev,
    )
    assert {r.run_id for r in landed} == {first[0].run_id}  # the same run: no new Spark start
    assert [r.run_id for r in dev.runs(tags={"lowmark/pipeline": "ticks"})] == [run.run_id]
    # The run took both batches through the shared Spark: no JVM in its process.
    assert [p for p in dev.dagster_group() if "java" in command_line(p)] == []

    def materialized_partitions() -> set[str]:
        with dev.instance() as instance:
            return set(instance.get_materialized_partitions(TICKS))

    # Reported by the batch that runs with the new watermark (the emit-only one after it).
    written = wait_for(
        "hours 0 and 1 reported final",
        lambda: {"2026-01-01-00:00", "2026-01-01-01:00"} <= (w := materialized_partitions()) and w,
        dev,
        seconds=60,
    )
    assert "2026-01-01-03:00" not in written  # not final yet


def test_a_run_killed_mid_batch_is_replayed_by_the_next_sensor_run(
    spark: SparkSession, dev: DagsterDev
) -> None:
    (dev.data_root / HOLD).touch()
    write_json_lines(dev.data_root / "slow/in", "f0.json", [{"id": 1}, {"id": 2}], 1)
    pid_file = dev.data_root / "HELD.pid"
    wait_for("the slow run to hold mid-batch", pid_file.exists, dev)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    (dev.data_root / HOLD).unlink()

    checkpoint = dev.data_root / "_lowmark/slow"
    wait_for("the replayed batch", lambda: dev.materializations(SLOW), dev)
    runs = dev.runs(tags={"lowmark/pipeline": "slow"})
    assert runs[0].status == dg.DagsterRunStatus.FAILURE
    pipeline_id = Checkpoint(str(checkpoint), "slow").pipeline_id
    replay_key = f"slow:{pipeline_id}:batch-0:replay-after-{runs[0].run_id}"
    assert runs[-1].tags["dagster/run_key"] == replay_key
    progress = delta_frame(spark, str(checkpoint / "progress")).collect()
    assert [(r.batch_id, r.replayed) for r in progress] == [(0, True)]
    offsets = delta_frame(spark, str(checkpoint / "offsets")).collect()
    assert [r.batch_id for r in offsets] == [0]
    sink = delta_frame(spark, str(dev.data_root / "slow/out")).collect()
    assert sorted(r.id for r in sink) == [1, 2]
    # The replay's session (a client of the shared Spark) has the UI's --conf, not lowmark's 4.
    assert json.loads((dev.data_root / SESSION).read_text())[SHUFFLE] == "7"


def test_the_ui_shows_readable_assets_and_launches_batches_and_backfills(
    dev: DagsterDev, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None, "chromium is not on PATH: run `make test-setup`"
    wait_for("ticks' partitions", lambda: dev.materializations(TICKS), dev)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        # The sink's page: the newest batch's watermark as a time, the sensor as automation.
        page.goto(f"{dev.url}/assets/lowmark/ticks")
        watermark = page.get_by_role("row").filter(has_text="watermark").first
        watermark.wait_for(timeout=60_000)
        # The newest event is at 03:00:00 (no out-of-orderness allowed): that time, shown.
        assert "Jan 1, 3:00:00 AM" in watermark.inner_text(), watermark.inner_text()
        assert "1767" not in watermark.inner_text()  # not epoch seconds or milliseconds
        page.get_by_text("ticks_sensor").first.wait_for(timeout=30_000)
        page.screenshot(path=str(tmp_path / "asset.png"))

        # The input folder's page: an observable source the sensor observes (what waits
        # there), so it says when it was last observed, never "Never materialized".
        page.goto(f"{dev.url}/assets/lowmark/sources/files_ticks_in")
        page.get_by_text("ticks/waiting_files").first.wait_for(timeout=60_000)
        page.get_by_text("Latest observation").first.wait_for(timeout=30_000)
        assert page.get_by_text("Never materialized").count() == 0
        page.screenshot(path=str(tmp_path / "input.png"))

        # Materialize on an unpartitioned sink launches a micro-batch run.
        before = {r.run_id for r in dev.runs()}
        page.goto(f"{dev.url}/assets/lowmark/slow")
        page.get_by_role("button").filter(has_text="Materialize").first.click(timeout=60_000)
        materialized = wait_for(
            "the Materialize run",
            lambda: [
                r
                for r in dev.runs(statuses=[dg.DagsterRunStatus.SUCCESS])
                if r.run_id not in before and SLOW in (r.asset_selection or ())
            ],
            dev,
        )
        assert "lowmark/pipeline" not in materialized[0].tags  # launched by the UI, not a job

        # Materialize on the partitioned sink: a backfill of the two final partitions, one
        # run for the range (the sink's backfill policy).
        page.goto(f"{dev.url}/assets/lowmark/ticks")
        page.get_by_role("button", name="Materialize…").click(timeout=60_000)
        page.get_by_text("Show all partitions").click(timeout=30_000)
        box = page.get_by_role("dialog").locator("input[type=text]").first
        box.fill("[2026-01-01-00:00...2026-01-01-01:00]")
        box.press("Enter")
        page.get_by_role("dialog").get_by_text("2 partitions").wait_for(timeout=30_000)
        page.get_by_role("button", name="Launch backfill").click()
        backfilled = wait_for(
            "a successful backfill run",
            lambda: [
                run
                for run in dev.runs(statuses=[dg.DagsterRunStatus.SUCCESS])
                if "dagster/backfill" in run.tags
            ],
            dev,
            seconds=400,
        )
        browser.close()
    assert [partition_range(r) for r in backfilled] == [("2026-01-01-00:00", "2026-01-01-01:00")]
    # ticks' following run made way for the backfill, recording the yield; with no new
    # data, the sensor resumes following for the rest of that run's window.
    ticks_runs = dev.runs(tags={"lowmark/pipeline": "ticks"})
    *_, yielded = [r for r in ticks_runs if YIELDED_TO_TAG in r.tags]
    assert yielded.tags[YIELDED_TO_TAG] in {r.run_id for r in backfilled}
    resumed = wait_for(
        "a run resuming ticks' following",
        lambda: dev.runs(tags={"dagster/run_key": f"ticks:resume-after-{yielded.run_id}"}),
        dev,
        seconds=120,
    )
    assert resumed[0].status in IN_FLIGHT  # following, not a run that ended at once


def test_sigterm_stops_the_ui_its_runs_and_their_spark_within_15_seconds(
    dev: DagsterDev,
) -> None:
    # A new file starts a run that then follows ticks; it and the shared Spark's JVM are
    # among the processes to stop.
    write_json_lines(dev.data_root / "ticks/in", "f2.json", [tick("c", 10_900, 8)], 3)
    wait_for(
        "a following run",
        lambda: dev.runs(tags={"lowmark/pipeline": "ticks"}, statuses=[STARTED]),
        dev,
    )
    assert any("java" in command_line(p) for p in dev.group())
    group = dev.group()
    started = time.monotonic()
    dev.ui.send_signal(signal.SIGTERM)
    dev.ui.wait(30)
    assert time.monotonic() - started < 15
    assert [p for p in group if Path(f"/proc/{p}").exists() and live(p)] == []
    assert "stopped the Dagster UI and its runs" in dev.log.read_text()


def live(pid: int) -> bool:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"
