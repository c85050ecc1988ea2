"""Spark jobs per batch: a count, not a time, so it can be asserted on any machine.

Bookkeeping runs on the driver; the Spark jobs of a batch are its data work
only. The bounds are the performance budget's (windowed <= 8; stateless <= 2
when the sink's write is the batch's one look at it, else <= 4); the per-step
counts are printed for the README's table.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from examples.keyed import ALERTS, SilenceAlert
from lowmark.batches.dedup import Dedup
from lowmark.batches.expectations import Expectation
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import Maintenance, Pipeline
from lowmark.batches.windows import Aggregate, EventTime, IngestionWatermark, Session, Tumbling
from tests.helpers import (
    T0,
    FakeClock,
    counted_batch,
    delta_frame,
    drop_batches,
    drop_file,
    event,
    pipeline,
    timed,
    windowed,
    write_json_lines,
)

ONE_JOB_LIMIT = 1
"""A stateless batch whose sink write looks at it (``lowmark.batches.loop.one_job``): the
write, which reads and transforms the batch (deduplicates it, runs its keyed step) and
observes its counts as it writes. Delta's check of a Spark-written sink's application
transaction reads the table's state, which the write before built once it landed, off the
batch's path (``lowmark.state.delta``); a deduplicating or keyed batch's tasks write their
rows as files, which the driver commits (``DeltaFilesSink``)."""
STATELESS_LIMIT = 3
"""A stateless batch that looks at its records before it writes (an expectation can fail
it): its look (two jobs), then the sink's write."""
WINDOWED_LIMIT = 8
LONG_RUN = 22
SINK_CREATION_JOBS = 1
"""The write that creates a Spark-written sink runs one more job than its later writes."""
SINK_CHECKPOINT_JOBS = 3
"""A Spark-written sink checkpoints its Delta log every 10 commits, in the batch that commits."""


STATELESS = {
    "plain": timed(),
    "dedup": timed(dedup=Dedup(columns=("user", "ts"), within="1 hour")),
    "keyed": timed(keyed=Keyed(processor=SilenceAlert, keys=("user",), output_schema=ALERTS)),
}


@pytest.mark.parametrize("kind", list(STATELESS))
def test_a_stateless_batch_is_its_sink_write_in_one_spark_job(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A plain, a deduplicating and a keyed batch: ``ONE_JOB_LIMIT`` jobs, the commit's
    counts as the batch's look would give them (each file: 3 records, one a duplicate,
    one a new user; the keyed step's silences fire as event time moves on)."""
    drop_batches(
        data_root,
        [
            [
                event("a", 10 * i, 1),
                event("b", 10 * i + 2, 2),
                event("b", 10 * i + 2, 2),
                event(f"u{i}", 10 * i + 5, 3),
            ]
            for i in range(2)
        ],
    )
    runner = MicroBatchRunner(spark, STATELESS[kind], data_root, FakeClock())
    runner.run_batch()  # the first batch creates the sink
    _, counter = counted_batch(spark, runner, monkeypatch)
    assert counter.jobs() <= ONE_JOB_LIMIT, counter.per_step
    # Deduplication shuffles no small input (``ONE_TASK_BYTES``): its records meet in the
    # task that reads them (the keyed step groups its keys: a shuffle).
    assert counter.stages() == (2 if kind == "keyed" else 1)
    # Planning, the logs and the commit run on the driver: no job at all.
    assert counter.per_step["after_plan"] == counter.per_step["after_commit"] == 0
    commit = runner.checkpoint.commits.get(1)
    assert commit is not None
    assert (commit.rows_in, commit.rows_bad, commit.rows_late) == (4, 0, 0)
    assert commit.rows_duplicate == (1 if kind == "dedup" else 0)
    assert commit.rows_keyed == (4 if kind == "keyed" else 0)
    if kind != "keyed":  # whose rows out are the alerts its timers gave
        assert commit.rows_out == {"plain": 4, "dedup": 3}[kind]
    first = runner.checkpoint.commits.get(0)
    assert first is not None
    assert first.rows_out + commit.rows_out == delta_frame(spark, data_root / "out").count()
    assert commit.next_watermark_ms == int(T0.timestamp() * 1000) + 15_000


def test_a_stateless_batch_an_expectation_can_fail_looks_first_in_at_most_three_spark_jobs(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(2):
        drop_file(data_root, i)
    must = Expectation(name="has_amount", condition="amount IS NOT NULL", on_violation="fail")
    p = pipeline(
        source=pipeline().source.model_copy(update={"max_files_per_batch": 1}),
        expectations=(must,),
    )
    runner = MicroBatchRunner(spark, p, data_root)
    runner.run_batch()  # the first batch creates the sink
    result, counter = counted_batch(spark, runner, monkeypatch)
    assert result.rows_out == 3
    assert ONE_JOB_LIMIT < counter.jobs() <= STATELESS_LIMIT, counter.per_step
    assert counter.per_step["after_plan"] == counter.per_step["after_commit"] == 0


def _alerts_per_window() -> Pipeline:
    """Tumbling windows over a keyed step's output: the silence alerts per user and window
    of when they were raised."""
    tumbling = windowed(Tumbling(size="10 seconds"), max_out_of_orderness="5 seconds")
    assert tumbling.aggregation is not None
    keyed = Keyed(
        processor=SilenceAlert, keys=("user",), output_schema=ALERTS, output_event_time="alerted_at"
    )
    counts = tumbling.aggregation.model_copy(update={"aggregates": (Aggregate(fn="count"),)})
    return tumbling.model_copy(update={"keyed": keyed, "aggregation": counts})


@pytest.mark.parametrize(
    "windowing",
    [
        windowed(Tumbling(size="10 seconds"), max_out_of_orderness="5 seconds"),
        windowed(Session(gap="10 seconds"), "update", max_out_of_orderness="5 seconds"),
        _alerts_per_window(),
    ],
    ids=["tumbling-append", "session-update", "keyed-then-tumbling"],
)
def test_a_windowed_batch_with_state_late_rows_and_output_runs_at_most_eight_spark_jobs(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch, windowing: Pipeline
) -> None:
    drop_batches(
        data_root,
        [
            [event("a", 1, 1), event("b", 2, 1)],
            [event("a", 14, 1), event("b", 30, 2)],
            # updates open windows, emits closed ones and holds one late record
            [event("a", 33, 3), event("b", 1, 9), event("c", 45, 4)],
            # the same, for windows after a keyed step, which close a batch later
            [event("a", 50, 1), event("b", 1, 9)],
        ],
    )
    runner = MicroBatchRunner(spark, windowing, data_root)
    runner.run(max_batches=3 if windowing.keyed else 2)
    result, counter = counted_batch(spark, runner, monkeypatch)
    assert (result.rows_late, result.rows_out > 0) == (1, True)
    assert counter.jobs() <= WINDOWED_LIMIT, counter.per_step
    assert counter.per_step["after_plan"] == counter.per_step["after_commit"] == 0


def test_a_small_windowed_batch_aggregates_in_the_one_task_that_reads_it(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Input up to ``ONE_TASK_BYTES`` is read in one task, whose records the aggregation
    takes as they are: one job of one stage, no shuffle (two files: Spark would read them
    in two tasks and shuffle their partials)."""
    drop_batches(data_root, [[event("a", 1, 1)], [event("b", 16, 1)]])
    tumbling = windowed(Tumbling(size="10 seconds"), max_out_of_orderness="5 seconds")
    two_files = tumbling.source.model_copy(update={"max_files_per_batch": 2})
    runner = MicroBatchRunner(spark, tumbling.model_copy(update={"source": two_files}), data_root)
    runner.run_batch()
    for i, row in enumerate((event("a", 30, 2), event("b", 31, 2)), start=2):
        write_json_lines(data_root / "in", f"b{i:03d}.json", [row], 1_700_000_000 + i)
    result, counter = counted_batch(spark, runner, monkeypatch)
    assert (result.rows_in, result.rows_out) == (2, 1)  # a's window [0 s, 10 s) closed at 11 s
    assert (counter.jobs(), counter.stages()) == (1, 1), counter.per_step


def test_a_windowed_batch_judging_records_by_their_own_ingestion_time_gains_no_spark_job(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under an ingestion-time watermark each record is also judged by its own ingestion
    time (its file's modification time): a comparison in the batch's one job, no job of
    its own. Files land 20 s apart, a batch each, then two in one batch: the batch's clock
    is the first one's (40 s, less the lag), and the second holds a record whose window
    closed 5 s before its file was written (late by its own time alone); the batch emits
    the closed windows."""
    t0_s = int(T0.timestamp())
    tumbling = windowed(Tumbling(size="10 seconds"))
    lag = IngestionWatermark(strategy="ingestion_time", max_event_time_lag="5 seconds")
    by_modification = tumbling.source.model_copy(
        update={"ingestion_time": "modified", "max_files_per_batch": 2}
    )
    own_clock = tumbling.model_copy(
        update={"source": by_modification, "event_time": EventTime(column="ts", watermark=lag)}
    )
    files = [
        [event("a", 1, 1), event("b", 2, 1)],
        [event("a", 14, 1), event("b", 15, 2)],
        [event("a", 38, 3)],
        [event("a", 58, 4), event("b", 41, 9)],  # b@41: window [40, 50) closed at 60 - 5
    ]
    clock = FakeClock(t0_s * 1000)
    runner = MicroBatchRunner(spark, own_clock, data_root, clock)
    for i, rows in enumerate(files):
        write_json_lines(data_root / "in", f"b{i:03d}.json", rows, t0_s + 20 * i)
        clock.now = (t0_s + 20 * i + 1) * 1000
        if i < 2:
            runner.run(max_batches=None)
    result, counter = counted_batch(spark, runner, monkeypatch)
    assert (result.rows_late, result.rows_out > 0) == (1, True)
    assert counter.jobs() <= WINDOWED_LIMIT, counter.per_step


def sink_checkpoints(root: Path) -> int:
    """Delta log checkpoints of the sink table (a Spark writer makes one every 10 commits)."""
    return len(list((root / "out" / "_delta_log").glob("*.checkpoint*.parquet")))


@pytest.mark.integration
def test_every_batch_of_a_long_stateless_run_stays_within_one_job_plus_three_per_sink_checkpoint(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Long enough for the sink's Delta checkpoints (commits 10 and 20) and maintenance.
    for i in range(LONG_RUN):
        drop_file(data_root, i)
    p = pipeline(
        source=pipeline().source.model_copy(update={"max_files_per_batch": 1}),
        maintenance=Maintenance(every_batches=5),
    )
    runner = MicroBatchRunner(spark, p, data_root)
    over: dict[int, dict[str, int]] = {}
    checkpointed = 0
    for _ in range(LONG_RUN):
        before = sink_checkpoints(data_root)
        result, counter = counted_batch(spark, runner, monkeypatch)
        made = sink_checkpoints(data_root) - before
        checkpointed += made
        created = SINK_CREATION_JOBS if result.batch_id == 0 else 0
        if counter.jobs() > ONE_JOB_LIMIT + created + made * SINK_CHECKPOINT_JOBS:
            over[result.batch_id] = counter.per_step
        if made:  # Delta's checkpoint of the sink runs in the sink's write (step 4), nowhere else
            assert counter.per_step["after_read"] <= ONE_JOB_LIMIT + SINK_CHECKPOINT_JOBS, (
                counter.per_step
            )
    assert checkpointed >= 2
    assert over == {}


def test_every_batch_of_a_long_windowed_run_with_late_rows_and_maintenance_runs_at_most_eight_jobs(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each batch moves event time on by 10 s (one window); every fifth also holds a late row.
    drop_batches(
        data_root,
        [
            [event("a", 10 * i, 1), event("b", 10 * i + 3, 2)]
            + ([event("c", 0, 5)] if i % 5 == 4 else [])
            for i in range(LONG_RUN)
        ],
    )
    p = windowed(Tumbling(size="10 seconds"), max_out_of_orderness="5 seconds").model_copy(
        update={"maintenance": Maintenance(every_batches=5)}
    )
    runner = MicroBatchRunner(spark, p, data_root)
    jobs: dict[int, int] = {}
    late = 0
    for _ in range(LONG_RUN):
        result, counter = counted_batch(spark, runner, monkeypatch)
        jobs[result.batch_id] = counter.jobs()
        late += result.rows_late
    assert late == LONG_RUN // 5
    assert max(jobs.values()) <= WINDOWED_LIMIT, jobs


def test_a_keyed_batch_that_only_fires_timers_runs_no_spark_job(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b's silence timer (5 s + 10 s) is due once a's later event moves the watermark to 20 s:
    the batch after has no input; its processor runs on the driver, and its one alert is
    appended to the sink from there by delta-rs (a's alert came with its event at 20 s)."""
    drop_batches(data_root, [[event("a", 0, 1), event("b", 5, 1)], [event("a", 20, 1)]])
    runner = MicroBatchRunner(spark, STATELESS["keyed"], data_root, FakeClock())
    runner.run(max_batches=2)
    result, counter = counted_batch(spark, runner, monkeypatch)
    assert (result.rows_in, result.rows_out) == (0, 1)
    assert counter.jobs() == 0, counter.per_step
    alerts = delta_frame(spark, data_root / "out").collect()
    naive_t0 = T0.replace(tzinfo=None)  # Spark hands back the session's (UTC) wall time
    assert sorted((r.user, r.silent_since - naive_t0) for r in alerts) == [
        ("a", timedelta(0)),
        ("b", timedelta(seconds=5)),
    ]


def test_a_windowed_batch_without_records_builds_no_read_and_runs_no_spark_job(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b's event at 30 s moves the watermark past a's window [0 s, 10 s): the batch after
    the last file has no records and emits that window, with no read built for it."""
    drop_batches(data_root, [[event("a", 1, 1), event("a", 2, 2)], [event("b", 30, 3)]])
    runner = MicroBatchRunner(spark, windowed(Tumbling(size="10 seconds")), data_root)
    assert len(runner.run(max_batches=2)) == 2
    source, reads = runner.parts.source, []
    read = source.read

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(args)
        return read(*args, **kwargs)

    monkeypatch.setattr(source, "read", counted)
    result, counter = counted_batch(spark, runner, monkeypatch)
    assert (result.rows_in, result.rows_out, reads, counter.jobs()) == (0, 1, [], 0)
    [window] = delta_frame(spark, data_root / "out").collect()
    assert (window.user, window["count"]) == ("a", 2)
