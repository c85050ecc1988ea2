"""Backfilling an event-time partition replaces exactly its slice of the sink."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.errors import BackfillHistoryLost, PartitionNotClosed
from lowmark.batches.expectations import Expectation
from lowmark.batches.loop.backfill import backfill_partition
from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.maintenance import maintain_checkpoint
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSource, EventTimePartitions, Maintenance
from lowmark.batches.windows import Tumbling
from lowmark.state.table import DriverTable
from tests.faults.harness import an_hour_passes
from tests.helpers import (
    T0,
    append_events,
    drop_batches,
    event,
    forget_start_offsets,
    reference,
    sink,
    vacuum_every_version,
    windowed,
    write_json_lines,
)

HOUR = 3600
WINDOW = Tumbling(size="10 seconds")
PIPELINE = windowed(WINDOW, allowed_lateness="10 seconds").model_copy(
    update={"backfill": EventTimePartitions(granularity="hourly", start="2026-01-01")}
)


def hour(n: int) -> tuple[datetime, datetime]:
    return T0 + timedelta(hours=n), T0 + timedelta(hours=n + 1)


def in_hour(df: DataFrame, n: int) -> DataFrame:
    start, end = hour(n)
    return df.where((F.col("window_start") >= F.lit(start)) & (F.col("window_start") < F.lit(end)))


SCHEDULE = [  # one file per batch; hour 0's late record comes after hour 1 began
    [event("a", 1, 1), event("b", 5, 2)],
    [event("a", 1800, 4), event("a", HOUR + 5, 8)],
    [event("a", 2, 16), event("b", HOUR + 30, 32)],
    [event("c", 2 * HOUR + 30, 64)],  # the watermark after it closes hour 1 ...
    [event("a", 3 * HOUR, 128)],  # ... but only this batch emits b's window of hour 1
    [event("b", 4 * HOUR + 100, 256)],
]


STREAMED = [
    [event("a", 1, 1), event("a", 15, 2), event("b", 3, 4)],
    [event("a", HOUR + 5, 8)],
    [event("a", 2, 16), event("b", HOUR + 30, 32)],
    [event("c", 3 * HOUR, 64)],
]


@pytest.fixture(scope="module")
def streamed(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four batches: hour 0, hour 1, a record late for hour 0, then time moves to hour 3."""
    root = tmp_path_factory.mktemp("streamed")
    drop_batches(root, STREAMED)
    results = MicroBatchRunner(spark, PIPELINE, root).run(max_batches=None)
    assert sum(r.rows_late for r in results) == 1  # a@2s: its window [0,10) had closed
    return root


@pytest.fixture
def root(streamed: Path, tmp_path: Path) -> Path:
    """A private copy of the streamed data root (checkpoint, sink and input)."""
    return Path(shutil.copytree(streamed, tmp_path / "copy"))


def test_a_backfill_recomputes_its_hour_from_all_history_and_leaves_other_hours_alone(
    spark: SparkSession, root: Path
) -> None:
    streamed_rows = sink(spark, root)
    others = streamed_rows.where(F.col("window_start") >= F.lit(hour(1)[0])).collect()
    result = backfill_partition(spark, PIPELINE, root, *hour(0))
    after = sink(spark, root)
    # Hour 0 now equals a plain batch aggregation of every record, the late one included.
    assertDataFrameEqual(in_hour(after, 0), in_hour(reference(spark, root, WINDOW), 0))
    assert result.windows == 3 and not result.skipped
    # Every other window is exactly as the stream wrote it.
    assertDataFrameEqual(after.where(F.col("window_start") >= F.lit(hour(1)[0])), others)


def test_repeating_a_backfill_over_the_same_history_is_skipped(
    spark: SparkSession, root: Path
) -> None:
    first = backfill_partition(spark, PIPELINE, root, *hour(0))
    rows = sink(spark, root).collect()
    again = backfill_partition(spark, PIPELINE, root, *hour(0))
    assert again.skipped and again.sink_version == first.sink_version
    assertDataFrameEqual(sink(spark, root), rows)


def test_a_partition_the_watermark_has_not_closed_is_refused_unless_forced(
    spark: SparkSession, tmp_path: Path
) -> None:
    drop_batches(tmp_path, SCHEDULE[:5])
    runner = MicroBatchRunner(spark, PIPELINE, tmp_path)
    assert len(runner.run(max_batches=5)) == 5
    # The watermark (3:00) has not closed hour 2 (3:00:20), and c's window is in state.
    with pytest.raises(PartitionNotClosed, match=r"2026-01-01 02:00\.\.2026-01-01 03:00 .* open"):
        backfill_partition(spark, PIPELINE, tmp_path, *hour(2))
    # Forced or not, a slice whose windows are still in state belongs to the stream.
    with pytest.raises(PartitionNotClosed, match=r"still has 1 window\(s\) in state"):
        backfill_partition(spark, PIPELINE, tmp_path, *hour(2), force=True)
    # The next batch emits c's window; the watermark (3:00:05) still leaves hour 2 open.
    write_json_lines(tmp_path / "in", "more.json", [event("d", 3 * HOUR + 5, 1)], 1_700_000_100)
    assert runner.run_batch() is not None
    forced = backfill_partition(spark, PIPELINE, tmp_path, *hour(2), force=True)
    assert forced.windows == 1
    expected = in_hour(reference(spark, tmp_path, WINDOW), 2)
    assertDataFrameEqual(in_hour(sink(spark, tmp_path), 2), expected)
    assert not _twice(sink(spark, tmp_path))


def _twice(df: DataFrame) -> list[Row]:
    """(key, window)s the sink holds more than once."""
    return df.groupBy("user", "window_start", "window_end").count().where("count > 1").collect()


def test_a_closed_slice_whose_windows_the_next_batch_emits_waits_for_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    drop_batches(tmp_path, SCHEDULE[:4])
    runner = MicroBatchRunner(spark, PIPELINE, tmp_path)
    for _ in range(4):
        assert runner.run_batch() is not None
    # The last commit's watermark (2:00:30) closes hour 1, but b's window [1:00:30, 1:00:40)
    # is still in state: the next batch emits it. A backfill now would write it first,
    # and the stream would append it a second time.
    with pytest.raises(PartitionNotClosed, match=r"01:00\.\..* still has 1 window\(s\) in state"):
        backfill_partition(spark, PIPELINE, tmp_path, *hour(1))
    drop_batches(tmp_path, SCHEDULE[:5])
    assert runner.run_batch() is not None
    assert backfill_partition(spark, PIPELINE, tmp_path, *hour(1)).windows == 2
    assert not _twice(sink(spark, tmp_path))
    expected = in_hour(reference(spark, tmp_path, WINDOW), 1)
    assertDataFrameEqual(in_hour(sink(spark, tmp_path), 1), expected)


@pytest.mark.parametrize(
    "crash", [pytest.param(None, marks=pytest.mark.integration), "after_state"]
)
def test_no_window_is_written_twice_whatever_runs_and_backfills_interleave(
    spark: SparkSession, tmp_path: Path, crash: str | None
) -> None:
    """Every backfill tried after every batch (and between a crash and its replay):
    each is refused or owns its slice, and no (key, window) lands twice."""
    drop_batches(tmp_path, SCHEDULE)
    hours = range(4)
    landed = set()

    def backfill_every_hour() -> None:
        for n in hours:
            try:
                backfill_partition(spark, PIPELINE, tmp_path, *hour(n))
                landed.add(n)
            except PartitionNotClosed:
                pass

    for batch_id in range(len(SCHEDULE)):
        runner = MicroBatchRunner(spark, PIPELINE, tmp_path)
        if crash is not None and batch_id == 4:  # it wrote state (b's window gone), not all
            with pytest.raises(InjectedCrash), crash_at(KillPoint(crash, batch_id)):
                runner.run_batch()
            backfill_every_hour()
            runner = MicroBatchRunner(spark, PIPELINE, tmp_path)
        assert runner.run_batch() is not None
        assert not _twice(sink(spark, tmp_path))  # a later backfill would hide a twin
        backfill_every_hour()
    assert landed == {0, 1, 2}  # hour 3's windows are still in state
    out = sink(spark, tmp_path)
    assert not _twice(out)
    expected = reference(spark, tmp_path, WINDOW)
    for n in sorted(landed):
        assertDataFrameEqual(in_hour(out, n), in_hour(expected, n))


@pytest.mark.parametrize("processed", ["archive", "delete"])
def test_a_backfill_reads_archived_files_and_names_deleted_ones(
    spark: SparkSession, tmp_path: Path, processed: str
) -> None:
    source = PIPELINE.source.model_copy(
        update={
            "processed_files": processed,
            "archive_dir": "archive" if processed == "archive" else None,
        }
    )
    # Maintenance after every batch: committed files that left the folder leave the
    # manifest planning reads (all but the last), and the backfill finds them in its history.
    p = PIPELINE.model_copy(update={"source": source, "maintenance": Maintenance(every_batches=1)})
    drop_batches(tmp_path, SCHEDULE[:3])
    shutil.copytree(tmp_path / "in", tmp_path / "all" / "in")  # for the reference
    runner = MicroBatchRunner(spark, p, tmp_path)
    runner.run(max_batches=None)
    assert list((tmp_path / "in").iterdir()) == []
    assert len(runner.checkpoint.files.files()) == 1
    assert len(runner.checkpoint.files.files(retired=True)) == 3
    if processed == "delete":
        with pytest.raises(BackfillHistoryLost, match="deleted once its batch committed"):
            backfill_partition(spark, p, tmp_path, *hour(0))
        return
    assert backfill_partition(spark, p, tmp_path, *hour(0)).windows == 3
    expected = in_hour(reference(spark, tmp_path / "all", WINDOW), 0)
    assertDataFrameEqual(in_hour(sink(spark, tmp_path), 0), expected)


FROM_LATEST = PIPELINE.model_copy(
    update={"source": DeltaSource(path="src", starting_version="latest", max_versions_per_batch=1)}
)
BEFORE_START = [event("z", 7, 1000), event("a", 1, 2000)]  # the table's, not the pipeline's
AFTER_START = [  # one Delta version (one batch) each
    [event("a", 1, 1), event("a", 15, 2), event("b", 3, 4), event("a", 1800, 8), event("c", 2, 16)],
    [event("a", HOUR + 5, 32)],
    [event("b", 3 * HOUR, 64)],
]


def stream_from_latest(spark: SparkSession, root: Path) -> None:
    """A Delta table with a version before the pipeline's first run, which starts at
    ``latest``, then three versions it streams; ``root/ref/in`` holds what it read."""
    append_events(spark, root / "src", BEFORE_START)
    runner = MicroBatchRunner(spark, FROM_LATEST, root)
    assert runner.run_batch() is None  # nothing past latest yet: only where batch 0 starts
    for rows in AFTER_START:
        append_events(spark, root / "src", rows)
    runner.run(max_batches=None)
    read = [r for rows in AFTER_START for r in rows]
    write_json_lines(root / "ref" / "in", "read.json", read, 1_700_000_000)


def test_a_backfill_of_a_pipeline_that_started_at_latest_reads_from_where_its_checkpoint_started(
    spark: SparkSession, tmp_path: Path
) -> None:
    stream_from_latest(spark, tmp_path)
    expected = in_hour(reference(spark, tmp_path / "ref", WINDOW), 0)
    assert expected.count() == 5
    assertDataFrameEqual(in_hour(sink(spark, tmp_path), 0), expected)  # as streamed
    # "latest" now is past every version: the history is where batch 0 started, and not
    # the version before it (z's window would appear) either.
    result = backfill_partition(spark, FROM_LATEST, tmp_path, *hour(0))
    assert result.windows == 5 and not result.skipped
    assertDataFrameEqual(in_hour(sink(spark, tmp_path), 0), expected)


def test_a_backfill_whose_history_the_source_no_longer_holds_is_refused_leaving_the_sink(
    spark: SparkSession, tmp_path: Path
) -> None:
    stream_from_latest(spark, tmp_path)
    before = DeltaTable(str(tmp_path / "out"))
    rows = sink(spark, tmp_path).collect()
    vacuum_every_version(spark, tmp_path / "src")
    with pytest.raises(
        BackfillHistoryLost,
        match=r"partition 2026-01-01 00:00\.\.2026-01-01 01:00 of w not backfilled, the sink is "
        r"unchanged: Delta table .*/src no longer holds files of versions 1 to 3 \(VACUUM\)",
    ):
        backfill_partition(spark, FROM_LATEST, tmp_path, *hour(0))
    assert DeltaTable(str(tmp_path / "out")).version() == before.version()
    assertDataFrameEqual(sink(spark, tmp_path), rows)


def test_an_archived_file_name_that_lands_again_is_backfilled_as_each_batch_took_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = PIPELINE.source.model_copy(
        update={"processed_files": "archive", "archive_dir": "archive"}
    )
    p = PIPELINE.model_copy(update={"source": source, "maintenance": Maintenance(every_batches=1)})
    drop_batches(tmp_path, SCHEDULE[:3])
    shutil.copytree(tmp_path / "in", tmp_path / "all" / "in")  # for the reference
    runner = MicroBatchRunner(spark, p, tmp_path)
    runner.run(max_batches=None)
    # b000.json was archived and its manifest row retired; a new file of that name lands,
    # with a record late for hour 0 and one that moves time on.
    assert len(runner.checkpoint.files.files()) == 1
    again = [event("a", 2, 500), event("c", 2 * HOUR + 30, 1000)]
    write_json_lines(tmp_path / "in", "b000.json", again, 1_700_000_100)
    write_json_lines(tmp_path / "all" / "in", "b000-again.json", again, 1_700_000_100)
    runner.run(max_batches=None)
    assert list((tmp_path / "in").iterdir()) == []
    assert backfill_partition(spark, p, tmp_path, *hour(0)).windows == 3
    expected = in_hour(reference(spark, tmp_path / "all", WINDOW), 0)
    assertDataFrameEqual(in_hour(sink(spark, tmp_path), 0), expected)
    # Both files of that name are in the manifest's history, and both in the archive.
    assert [f.path.rsplit("/", 1)[1] for f in runner.checkpoint.files.files(retired=True)] == [
        "b000.json", "b001.json", "b002.json", "b000.json",
    ]  # fmt: skip
    assert (tmp_path / "archive" / "b000.json").exists()
    assert (tmp_path / "archive" / "_reused" / "3" / "b000.json").exists()


def test_a_checkpoint_that_predates_recording_its_start_backfills_from_batch_0_or_refuses(
    spark: SparkSession, tmp_path: Path
) -> None:
    stream_from_latest(spark, tmp_path)
    ckpt = MicroBatchRunner(spark, FROM_LATEST, tmp_path).checkpoint
    forget_start_offsets(ckpt)
    expected = in_hour(reference(spark, tmp_path / "ref", WINDOW), 0)
    assert backfill_partition(spark, FROM_LATEST, tmp_path, *hour(0)).windows == 5
    assertDataFrameEqual(in_hour(sink(spark, tmp_path), 0), expected)
    # Maintenance dropped batch 0 from the offset log: where the history begins is unknown.
    ckpt.offsets.table.delete('"batch_id" = 0', 0)
    version = DeltaTable(str(tmp_path / "out")).version()
    with pytest.raises(BackfillHistoryLost, match="does not record where batch 0 started"):
        backfill_partition(spark, FROM_LATEST, tmp_path, *hour(0))
    assert DeltaTable(str(tmp_path / "out")).version() == version


def test_a_backfill_after_maintenance_twice_on_an_idle_pipeline_reads_the_last_commits_state(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Last, a window far from the open one: its MERGE adds a state file beside the other's.
    drop_batches(tmp_path, [*STREAMED, [event("d", 3 * HOUR + 12, 1)]])
    MicroBatchRunner(spark, PIPELINE, tmp_path).run(max_batches=None)
    state = DriverTable(PIPELINE.checkpoint_location(tmp_path) + "/state_windows")
    recorded = state.version()
    assert state.files() >= 2
    assert maintain_checkpoint(spark, PIPELINE, tmp_path) is not None
    assert state.version() > recorded  # its OPTIMIZE left the recorded version behind
    # The next day's maintenance, on a pipeline that ran no batch since.
    an_hour_passes(PIPELINE.checkpoint_location(tmp_path), monkeypatch)
    assert maintain_checkpoint(spark, PIPELINE, tmp_path) is not None
    assert backfill_partition(spark, PIPELINE, tmp_path, *hour(0)).windows == 3
    expected = in_hour(reference(spark, tmp_path, WINDOW), 0)
    assertDataFrameEqual(in_hour(sink(spark, tmp_path), 0), expected)


def test_a_backfill_drops_what_the_drop_expectations_drop_as_the_stream_did(
    spark: SparkSession, tmp_path: Path
) -> None:
    valid = Expectation(name="valid_amount", condition="amount >= 0", on_violation="drop")
    pipeline = PIPELINE.model_copy(update={"expectations": (valid,)})
    negative = [[event("b", 7, -100), event("a", 9, -1)], [], [event("b", 4, -7)], []]
    drop_batches(tmp_path, [b + n for b, n in zip(STREAMED, negative, strict=True)])
    results = MicroBatchRunner(spark, pipeline, tmp_path).run(max_batches=None)
    assert sum(r.violations["valid_amount"] for r in results) == 3
    backfill_partition(spark, pipeline, tmp_path, *hour(0))
    # Hour 0 equals a plain batch over every record the expectation keeps, late ones included.
    kept = tmp_path / "kept"
    drop_batches(kept, STREAMED)
    expected = in_hour(reference(spark, kept, WINDOW), 0)
    assertDataFrameEqual(in_hour(sink(spark, tmp_path), 0), expected)
