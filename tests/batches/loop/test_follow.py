"""Follow mode: batches back to back, polls when caught up, stops only between batches."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.loop.follow import follow
from lowmark.batches.loop.microbatch import BatchResult, MicroBatchRunner
from lowmark.batches.pipeline import FileSource
from tests.helpers import FakeClock, drop_file, pipeline, sink_ids

REPO = Path(__file__).resolve().parents[3]
LOWMARK = str(Path(sys.executable).parent / "lowmark")


def one_file_per_batch() -> FileSource:
    return FileSource(
        path="in", format="json", schema_ddl="id LONG, amount LONG", max_files_per_batch=1
    )


def test_files_dropped_while_caught_up_are_taken_by_later_batches_until_max_seconds(
    spark: SparkSession, data_root: Path, clock: FakeClock
) -> None:
    drop_file(data_root, 0)
    runner = MicroBatchRunner(spark, pipeline(), data_root, clock=clock)
    slept: list[float] = []
    drops = {1: 1, 8: 2}  # sleep call number → file dropped during it

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(round(seconds * 1000))
        if len(slept) in drops:
            drop_file(data_root, drops[len(slept)])

    committed: list[int] = []
    result = follow(
        runner,
        poll_interval_s=1,
        max_seconds=10,
        on_batch=lambda b: committed.append(b.batch_id),
        clock=clock,
        sleep=sleep,
    )

    assert [b.batch_id for b in result.batches] == committed == [0, 1, 2]
    assert [b.rows_in for b in result.batches] == [3, 3, 3]
    assert sink_ids(spark, data_root) == [0, 1, 2, 100, 101, 102, 200, 201, 202]
    assert result.stopped_by == "max_seconds"
    assert sum(slept) == pytest.approx(10) and max(slept) <= 1
    assert result.describe() == "stopped after 3 batches: time limit reached"


class SignalDuringBatch:
    """A runner that receives ``signum`` while its batch is running."""

    def __init__(self, runner: MicroBatchRunner, signum: signal.Signals) -> None:
        self.runner = runner
        self.signum = signum

    def run_batch(self) -> BatchResult | None:
        signal.raise_signal(self.signum)
        return self.runner.run_batch()


def test_a_stop_signal_during_a_batch_stops_the_loop_after_that_batch_committed(
    spark: SparkSession, data_root: Path, clock: FakeClock
) -> None:
    p = pipeline(source=one_file_per_batch())
    for i in range(3):
        drop_file(data_root, i)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    runner = MicroBatchRunner(spark, p, data_root, clock=clock)

    def no_sleep(seconds: float) -> None:
        raise AssertionError("the loop slept although files were waiting")

    result = follow(SignalDuringBatch(runner, signal.SIGINT), 1, clock=clock, sleep=no_sleep)

    assert result.stopped_by == "signal" and result.signal_name == "SIGINT"
    assert [b.batch_id for b in result.batches] == [0]
    assert result.describe() == "stopped by SIGINT after 1 batch"
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    # Batch 0 committed: a new runner goes on with batch 1 rather than replaying it.
    after = MicroBatchRunner(spark, p, data_root, clock=clock).run_batch()
    assert after is not None and after.batch_id == 1 and not after.replay
    assert sink_ids(spark, data_root) == [0, 1, 2, 100, 101, 102]


class IdleRunner:
    """Never has work; counts polls."""

    def __init__(self) -> None:
        self.polls = 0

    def run_batch(self) -> BatchResult | None:
        self.polls += 1
        return None


def test_sigterm_while_caught_up_ends_the_poll_sleep_early(clock: FakeClock) -> None:
    runner = IdleRunner()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(round(seconds * 1000))
        if len(slept) == 2:
            signal.raise_signal(signal.SIGTERM)

    result = follow(runner, poll_interval_s=30, clock=clock, sleep=sleep)

    assert result.stopped_by == "signal" and result.signal_name == "SIGTERM"
    assert runner.polls == 1 and sum(slept) == pytest.approx(0.4)


def test_should_stop_is_asked_between_batches_and_polls(clock: FakeClock) -> None:
    runner = IdleRunner()

    def sleep(seconds: float) -> None:
        clock.advance(round(seconds * 1000))

    result = follow(
        runner,
        poll_interval_s=1,
        clock=clock,
        sleep=sleep,
        should_stop=lambda: runner.polls >= 3,
        handle_signals=False,
    )

    assert result.stopped_by == "should_stop" and runner.polls == 3
    assert result.describe() == "stopped on request after 0 batches"


def _lowmark(root: Path, *args: str) -> list[str]:
    return [LOWMARK, "--pipelines", str(root / "pipelines.yaml"), "--data-root", str(root), *args]


@pytest.mark.integration
@pytest.mark.slow
def test_lowmark_run_follow_stops_cleanly_on_sigint_after_the_batch_in_progress(
    data_root: Path,
) -> None:
    (data_root / "pipelines.yaml").write_text(
        "pipelines:\n"
        "  - name: t\n"
        "    source: {kind: files, path: in, format: json, schema_ddl: 'id LONG, amount LONG',\n"
        "             max_files_per_batch: 1}\n"
        "    sink: {kind: delta, path: out}\n"
    )
    for i in range(3):
        drop_file(data_root, i)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        _lowmark(
            data_root, "run", "t", "--follow", "--poll-interval", "1s", "--max-seconds", "600"
        ),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if line.startswith("batch 0 committed"):
                # Batch 1 starts right away (files wait): this interrupts it or the next poll.
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines += out.splitlines()

    assert proc.returncode == 0, err[-3000:]
    batches = [line for line in lines if line.startswith("batch ")]
    assert batches and all(" committed: " in line for line in batches)
    assert lines[-1] == f"t: stopped by SIGINT after {len(batches)} " + (
        "batch" if len(batches) == 1 else "batches"
    )
    status = subprocess.run(
        _lowmark(data_root, "status", "t", "--json"),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    checkpoint = json.loads(status.stdout)
    assert checkpoint["pending_batch"] is None
    assert checkpoint["last_committed_batch"] == len(batches) - 1
