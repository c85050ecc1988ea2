"""Watermarks across partitions, idleness, restarts and replays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.health import watermark_lag
from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.event_time.stage import FUTURE
from lowmark.batches.loop.microbatch import MicroBatchRunner
from tests.helpers import FakeClock, at, delta_frame, drop, event, partitioned

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"


def test_the_pipeline_watermark_is_the_min_over_partitions_until_one_goes_idle(
    spark: SparkSession, data_root: Path, clock: FakeClock
) -> None:
    pipeline = partitioned(idle_timeout="30 seconds")
    runner = MicroBatchRunner(spark, pipeline, data_root, clock=clock)
    drop(data_root, "p0", "a.json", [event("a", 5, 1)], 0)
    drop(data_root, "p1", "a.json", [event("b", 10, 1)], 1)
    assert runner.run_batch().watermark_ms == at(5)  # type: ignore[union-attr]

    clock.advance(10_000)
    drop(data_root, "p0", "b.json", [event("a", 50, 1)], 2)
    assert runner.run_batch().watermark_ms == at(10)  # type: ignore[union-attr]  # p1 holds it

    clock.advance(40_000)  # p1 silent for 50 s > idle_timeout
    drop(data_root, "p0", "c.json", [event("a", 100, 1)], 3)
    result = runner.run_batch()
    assert result is not None and result.watermark_ms == at(100)
    offsets = runner.checkpoint.offsets.get(2)
    assert offsets is not None and offsets.batch_watermark_ms == at(50)
    marks = delta_frame(spark, runner.checkpoint.table("watermarks"))
    latest = {r.partition: r.max_event_time_ms for r in marks.where("batch_id = 2").collect()}
    assert latest == {"p0": at(100), "p1": at(10)}


def test_an_idle_partition_lets_time_close_windows_without_new_data(
    spark: SparkSession, data_root: Path, clock: FakeClock
) -> None:
    runner = MicroBatchRunner(spark, partitioned(idle_timeout="30 seconds"), data_root, clock=clock)
    drop(data_root, "p0", "a.json", [event("a", 5, 1), event("a", 40, 1)], 0)
    drop(data_root, "p1", "a.json", [event("b", 3, 1)], 1)
    runner.run_batch()  # watermark min(40, 3) = 3: nothing closes
    assert runner.run_batch() is None
    assert pipeline_status(spark, runner.pipeline, data_root, clock).next_batch is None
    clock.advance(60_000)  # both idle: the max (40 s) is used
    # `lowmark status` and the Dagster sensor ask the runner's rule: they see the batch too.
    assert pipeline_status(spark, runner.pipeline, data_root, clock).to_json()["next_batch"] == {
        "batch_id": 1,
        "replay": False,
        "emit_only": True,
        "reason": "the watermark moved: windows close without new data",
    }
    emitting = runner.run_batch()
    assert emitting is not None and emitting.rows_in == 0 and emitting.rows_out == 2
    sink = delta_frame(spark, str(data_root / "out")).collect()
    assert sorted((r.user, r.window_start.second) for r in sink) == [("a", 0), ("b", 0)]


def test_the_watermark_never_goes_back_across_restarts(
    spark: SparkSession, data_root: Path, clock: FakeClock
) -> None:
    pipeline = partitioned(idle_timeout="30 seconds")
    drop(data_root, "p0", "a.json", [event("a", 5, 1)], 0)
    drop(data_root, "p1", "a.json", [event("b", 100, 1)], 1)
    MicroBatchRunner(spark, pipeline, data_root, clock=clock).run_batch()
    clock.advance(60_000)
    drop(data_root, "p1", "b.json", [event("b", 120, 1)], 2)
    first = MicroBatchRunner(spark, pipeline, data_root, clock=clock).run_batch()
    assert first is not None and first.watermark_ms == at(120)  # p0 idle

    drop(data_root, "p0", "b.json", [event("a", 7, 1)], 3)  # p0 wakes up far behind
    restarted = MicroBatchRunner(spark, pipeline, data_root, clock=clock)
    result = restarted.run_batch()
    assert result is not None and result.watermark_ms == at(120)
    assert result.rows_late == 1


@pytest.mark.parametrize("mode", ["append", "update"])
def test_a_crash_after_the_state_write_replays_with_open_windows_exactly_once(
    spark: SparkSession,
    data_root: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    files = [
        [event("a", 1, 1), event("b", 4, 2)],
        [event("a", 12, 3), event("a", 8, 4)],
        [event("b", 25, 5), event("a", 31, 6)],
        [event("a", 47, 7)],
    ]
    reference_root = data_root / "reference"
    for root in (data_root, reference_root):
        for i, rows in enumerate(files):
            drop(root, "p0", f"f{i}.json", rows, i)
    one_at_a_time = partitioned(mode).model_copy(
        update={"source": partitioned().source.model_copy(update={"max_files_per_batch": 1})}
    )
    MicroBatchRunner(spark, one_at_a_time, reference_root, clock=clock).run(max_batches=None)

    runner = MicroBatchRunner(spark, one_at_a_time, data_root, clock=clock)
    runner.run(max_batches=2)

    def die(df: Any, batch_id: int, retract: Any = None) -> int:
        raise RuntimeError("killed after the state write")

    monkeypatch.setattr(runner.sink, "write", die)
    with pytest.raises(RuntimeError):
        runner.run_batch()
    resumed = MicroBatchRunner(spark, one_at_a_time, data_root, clock=clock).run(max_batches=None)
    assert resumed[0].replay and resumed[0].batch_id == 2
    for table in ("out", "_lowmark/p/state_windows"):
        assertDataFrameEqual(
            delta_frame(spark, str(data_root / table)).drop("updated_batch"),
            delta_frame(spark, str(reference_root / table)).drop("updated_batch"),
        )


def test_a_partition_with_records_waiting_is_never_idle_however_long_a_batch_takes(
    spark: SparkSession, data_root: Path
) -> None:
    # Each partition's events only move forward: not one record is late for a watermark
    # that is the min over the partitions (the run without an idle timeout below).
    files = [
        ("p0", [event("a", 10, 1)]),
        ("p1", [event("b", 8, 2)]),
        ("p0", [event("a", 20, 3)]),
        ("p0", [event("a", 30, 4)]),  # batch 1 takes both p0 files: p1's wait past its end
        ("p1", [event("b", 12, 5)]),
        ("p1", [event("b", 14, 6)]),
    ]
    roots = {"timeout": data_root / "timeout", "none": data_root / "none"}
    for root in roots.values():
        for i, (partition, rows) in enumerate(files):
            drop(root, partition, f"f{i}.json", rows, i)
    two_files = partitioned().source.model_copy(update={"max_files_per_batch": 2})
    late = {}
    for name, root in roots.items():
        timeout = {"idle_timeout": "5 seconds"} if name == "timeout" else {}
        pipeline = partitioned(**timeout).model_copy(update={"source": two_files})
        # Every reading of the clock moves it 6 s on: each batch outlasts the idle timeout.
        slow = FakeClock(step_ms=6_000)
        # The three batches of input (then, input read, an idle timeout closes windows).
        results = MicroBatchRunner(spark, pipeline, root, clock=slow).run(max_batches=3)
        assert [r.rows_in for r in results] == [2, 2, 2]
        late[name] = [r.rows_late for r in results]
    assert late == {"timeout": [0, 0, 0], "none": [0, 0, 0]}
    for table in ("out", "_lowmark/p/late"):
        assertDataFrameEqual(
            delta_frame(spark, str(roots["timeout"] / table)),
            delta_frame(spark, str(roots["none"] / table)),
        )


YEAR_AHEAD = {"user": "z", "ts": "2027-01-01T00:00:00Z", "amount": 1}


def test_an_event_time_from_the_future_is_set_aside_and_never_moves_the_watermark(
    spark: SparkSession, data_root: Path, clock: FakeClock
) -> None:
    runner = MicroBatchRunner(spark, partitioned(max_future="1 hour"), data_root, clock=clock)
    drop(data_root, "p0", "a.json", [event("a", 5, 1), YEAR_AHEAD], 0)
    first = runner.run_batch()
    assert first is not None and (first.rows_late, first.watermark_ms) == (1, at(5))
    clock.advance(10_000)
    drop(data_root, "p0", "b.json", [event("a", 8, 2)], 1)
    second = runner.run_batch()
    # On time: a year-ahead watermark would have made this record late.
    assert second is not None and second.rows_late == 0
    late = delta_frame(spark, runner.checkpoint.table("late")).collect()
    assert [(r.reason, '"user":"z"' in r.record) for r in late] == [(FUTURE, True)]
    state = delta_frame(spark, runner.checkpoint.table("state_windows"))
    assert state.where("user = 'z'").count() == 0


def test_the_lag_check_fails_on_a_watermark_ahead_of_processing_time(
    spark: SparkSession, data_root: Path, clock: FakeClock
) -> None:
    pipeline = partitioned(max_future="3650 days")  # lets the year-ahead record through
    drop(data_root, "p0", "a.json", [event("a", 5, 1), YEAR_AHEAD], 0)
    MicroBatchRunner(spark, pipeline, data_root, clock=clock).run_batch()
    outcome = watermark_lag(pipeline, data_root)
    assert not outcome.passed and "AHEAD" in outcome.description
    assert outcome.metadata["lag_seconds"] < 0


def test_max_future_counts_in_the_fingerprint_only_when_set() -> None:
    default = partitioned().fingerprint()
    assert partitioned(max_future="1 day").fingerprint() == default
    assert partitioned(max_future="2 hours").fingerprint() != default
