"""Ingestion-time watermarks: the event-time clock follows when the source's records were
written (a file's first listing), minus the maximum event-time lag.

The clock is a fake one; the files, the checkpoint and the sink are real. Each result is
compared with a plain Spark batch over the whole input (``tests.helpers.reference``).
"""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import JsonMetadataValue
from deltalake import write_deltalake
from pydantic import ValidationError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.status import pipeline_plan, pipeline_status
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.loop.faults import STEPS, InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSource, Pipeline, SyntheticSource, UnionSource
from lowmark.batches.registry import get_pipeline
from lowmark.batches.sources.base import PARTITION_COLUMN
from lowmark.batches.sources.synthetic import SyntheticStreamSource
from lowmark.batches.windows import EventTime, IngestionWatermark, Tumbling
from lowmark.orchestration.metadata import batch_metadata
from lowmark.state.checkpoint import Checkpoint
from tests.examples.test_outbox_source import PIPELINES, insert
from tests.helpers import (
    T0,
    FakeClock,
    delta_frame,
    event,
    reference,
    reference_of,
    sink,
    windowed,
)
from tests.helpers import write_json_lines as land

WINDOW = Tumbling(size="10 seconds")
LAG = IngestionWatermark(strategy="ingestion_time", max_event_time_lag="30 seconds")
T0_MS = int(T0.timestamp() * 1000)


def _pipeline(watermark: IngestionWatermark | None = LAG, by_folder: bool = False) -> Pipeline:
    base = windowed(WINDOW)
    source = base.source.model_copy(update={"partition_by_folder": by_folder})
    return base.model_copy(
        update={"source": source, "event_time": EventTime(column="ts", watermark=watermark)}
    )


def _at(clock: FakeClock, second: int) -> None:
    clock.now = T0_MS + second * 1000


def _windows(df: DataFrame) -> list[tuple[str, int]]:
    rows = df.select("user", F.unix_seconds("window_start").alias("s")).collect()
    return sorted((r["user"], r["s"] - T0_MS // 1000) for r in rows)


def _late(spark: SparkSession, root: Path, pipeline: Pipeline) -> list[Any]:
    path = Checkpoint(pipeline.checkpoint_location(root), pipeline.name).late.path
    return sorted(r["record"] for r in delta_frame(spark, path).select("record").collect())


def test_an_idle_stream_closes_its_last_windows_by_tail_reads_alone(
    spark: SparkSession, tmp_path: Path
) -> None:
    for name, watermark in (("ingestion", LAG), ("event", None)):
        root, clock = tmp_path / name, FakeClock()
        _at(clock, 60)
        land(root / "in", "a.json", [event("a", 40, 1), event("a", 52, 2), event("b", 58, 4)], 1)
        runner = MicroBatchRunner(spark, _pipeline(watermark), root, clock)
        first = runner.run(max_batches=None)[0]
        # Ingestion time: listed at 1:00, nothing ingested before it is to come, so the
        # clock after the batch is 0:30.
        assert first.rows_late == 0
        if watermark is not None:
            assert first.watermark_ms == T0_MS + 30_000
            shown = batch_metadata(first, {})["ingested_up_to"]
            assert isinstance(shown, JsonMetadataValue)
            assert shown.data == {"0": "2026-01-01 00:01:00 UTC"}
        _at(clock, 200)  # nothing lands any more
        if watermark is not None:  # the plan: an emit-only batch, and where its clock stands
            plan = pipeline_plan(spark, _pipeline(watermark), root, clock)
            assert plan.emit_only and plan.watermark_ms == T0_MS + 170_000
            assert plan.ingestion_ms == {"0": T0_MS + 200_000}
        runner.run(max_batches=None)
    ingestion, event_time = sink(spark, tmp_path / "ingestion"), sink(spark, tmp_path / "event")
    # The tail read at 3:20 moved the clock to 2:50: every window closed and was emitted.
    assertDataFrameEqual(ingestion, reference(spark, tmp_path / "ingestion", WINDOW))
    # Following the event times seen, the last windows wait for a record that never comes.
    assert _windows(event_time) == [("a", 40)]


def test_a_sparse_partition_does_not_hold_windows_open(spark: SparkSession, tmp_path: Path) -> None:
    emitted = {}
    for name, watermark in (("ingestion", LAG), ("event", None)):
        root, clock = tmp_path / name, FakeClock()
        _at(clock, 60)
        land(root / "in" / "busy", "1.json", [event("a", 40, 1), event("a", 55, 2)], 1)
        land(root / "in" / "sparse", "1.json", [event("s", 41, 8)], 2)
        runner = MicroBatchRunner(spark, _pipeline(watermark, by_folder=True), root, clock)
        runner.run(max_batches=None)
        _at(clock, 120)  # only the busy folder gets a file; the sparse one stays silent
        land(root / "in" / "busy", "2.json", [event("a", 95, 4), event("a", 118, 16)], 3)
        runner.run(max_batches=None)
        emitted[name] = _windows(sink(spark, root))
        if watermark is not None:  # status shows each folder's ingestion clock
            status = pipeline_status(spark, _pipeline(watermark, by_folder=True), root, clock)
            shown = {(p.partition, p.ingestion_ms, p.watermark_ms) for p in status.partitions}
            at, clock_at = T0_MS + 120_000, T0_MS + 90_000
            assert shown == {("busy", at, clock_at), ("sparse", at, clock_at)}
    # Ingestion time: the clock at the second batch is 1:30 (both folders' clocks are past
    # it: the sparse one has nothing waiting), so every window before 1:30 is final.
    assert emitted["ingestion"] == [("a", 40), ("a", 50), ("s", 40)]
    # Event time: the sparse folder's watermark (0:41) holds a's window of 0:50 open.
    assert ("a", 50) not in emitted["event"]


def test_a_record_written_longer_after_its_event_time_than_the_lag_is_late(
    spark: SparkSession, tmp_path: Path
) -> None:
    clock = FakeClock()
    _at(clock, 60)
    land(tmp_path / "in", "a.json", [event("a", 40, 1)], 1)
    runner = MicroBatchRunner(spark, _pipeline(), tmp_path, clock)
    runner.run(max_batches=None)
    _at(clock, 120)
    late_one = event("b", 85, 2)  # listed at 2:00: 35 s after its event time
    land(tmp_path / "in", "b.json", [late_one, event("a", 95, 4)], 2)
    [batch] = runner.run(max_batches=None)
    assert batch.rows_late == 1 and batch.rows_in == 2
    [record] = _late(spark, tmp_path, _pipeline())
    assert '"user":"b"' in record
    # Everything else is where a plain batch over the records within the lag puts it.
    _at(clock, 300)
    runner.run(max_batches=None)
    kept = tmp_path / "kept"
    land(kept / "in", "a.json", [event("a", 40, 1), event("a", 95, 4)], 1)
    assertDataFrameEqual(sink(spark, tmp_path), reference(spark, kept, WINDOW))


def test_by_modification_time_a_backlog_listed_late_gives_what_the_live_run_gave(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Two files written at 1:00 and 2:00 (their modification times), first listed a day
    # later. By their modification times the clock is what a live run's was: b@85, written
    # 35 s after its event time, is the one late record. By listing time every record
    # came a day late.
    clock, t0 = FakeClock(), T0_MS // 1000
    _at(clock, 86_400)
    land(tmp_path / "in", "a.json", [event("a", 40, 1)], t0 + 60)
    land(tmp_path / "in", "b.json", [event("b", 85, 2), event("a", 95, 4)], t0 + 120)
    late: dict[str, int] = {}
    for ingestion_time in ("modified", "listed"):
        base = _pipeline()
        source = base.source.model_copy(
            update={"ingestion_time": ingestion_time, "max_files_per_batch": 1}
        )
        pipeline = base.model_copy(update={"source": source})
        root = tmp_path / ingestion_time
        shutil.copytree(tmp_path / "in", root / "in")
        results = MicroBatchRunner(spark, pipeline, root, clock).run(max_batches=None)
        late[ingestion_time] = sum(r.rows_late for r in results)
        if ingestion_time == "modified":
            [record] = _late(spark, root, pipeline)
            assert '"user":"b"' in record
            kept = tmp_path / "kept"
            land(kept / "in", "a.json", [event("a", 40, 1), event("a", 95, 4)], 1)
            assertDataFrameEqual(sink(spark, root), reference(spark, kept, WINDOW))
    assert late == {"modified": 1, "listed": 3}


FILES = [  # (listed at second, events): the third file comes after a quiet spell
    (60, [event("a", 40, 1), event("b", 52, 2)]),
    (90, [event("a", 70, 4), event("b", 58, 8), event("c", 45, 16)]),
    (200, [event("a", 175, 32), event("c", 150, 64)]),
]


def _run_with_crash(spark: SparkSession, root: Path, crash: KillPoint | None) -> None:
    """FILES landing at their times, a batch after each, then a tail read; with ``crash``,
    the batch dies there and is run again ten seconds later."""
    clock = FakeClock()
    for n, (second, events) in enumerate(FILES):
        _at(clock, second)
        land(root / "in", f"f{n}.json", events, n + 1)
        if crash is not None and crash.batch_id == n:
            with pytest.raises(InjectedCrash), crash_at(crash):
                MicroBatchRunner(spark, _pipeline(), root, clock).run(max_batches=None)
            clock.advance(10_000)
        MicroBatchRunner(spark, _pipeline(), root, clock).run(max_batches=None)
    _at(clock, 400)
    MicroBatchRunner(spark, _pipeline(), root, clock).run(max_batches=None)


@pytest.fixture(scope="module")
def clean(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``FILES`` run with no fault."""
    root = tmp_path_factory.mktemp("clean")
    _run_with_crash(spark, root, None)
    return root


def _marks(root: Path) -> list[tuple[int, int | None]]:
    """Each commit's batch and the watermark the next batch starts from."""
    commits = Checkpoint(_pipeline().checkpoint_location(root), "w").commits.get_range()
    return [(c.batch_id, c.next_watermark_ms) for c in commits]


IN_MAKE_TEST = ("after_state",)
"""Steps whose crash runs in `make test`; the others run in `make test-integration`."""


@pytest.mark.parametrize(
    "step",
    [pytest.param(s, marks=[] if s in IN_MAKE_TEST else [pytest.mark.integration]) for s in STEPS],
)
def test_a_replay_after_a_crash_gives_the_same_clock_windows_and_late_records(
    spark: SparkSession, clean: Path, tmp_path: Path, step: str
) -> None:
    _run_with_crash(spark, tmp_path, KillPoint(step, 1))
    assertDataFrameEqual(sink(spark, tmp_path), sink(spark, clean))
    late = _late(spark, clean, _pipeline())
    assert late and _late(spark, tmp_path, _pipeline()) == late
    if step != "after_plan":  # else batch 1 was never written: it is planned anew, later
        assert _marks(tmp_path) == _marks(clean)


def _delta_pipeline(table: Path) -> Pipeline:
    return _pipeline().model_copy(
        update={"source": DeltaSource(path=str(table), max_versions_per_batch=1)}
    )


def test_a_delta_backlog_read_long_after_it_was_written_gives_what_the_live_run_gave(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A version's ingestion time is its commit timestamp, so reading the versions as they
    are committed (each batch one version) and reading them an hour later give the same
    clock per batch: the same windows, and the same record late."""
    table, live = tmp_path / "events", FakeClock()
    schema = pa.schema(
        [("user", pa.string()), ("ts", pa.timestamp("us", "UTC")), ("amount", pa.int64())]
    )
    for version, seconds_ago in enumerate([(28, 3), (25, 12, 2), (6, 75), (20, 1)]):
        now = time.time()
        rows = [
            (
                "abc"[(version + n) % 3],
                datetime.fromtimestamp(now - ago, UTC),
                2 ** (3 * version + n),
            )
            for n, ago in enumerate(seconds_ago)
        ]
        write_deltalake(
            str(table),
            pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema),
            mode="append",
        )
        live.now = int(time.time() * 1000)
        MicroBatchRunner(spark, _delta_pipeline(table), tmp_path / "live", live).run(
            max_batches=None
        )
    live.advance(3_600_000)
    MicroBatchRunner(spark, _delta_pipeline(table), tmp_path / "live", live).run(max_batches=None)
    later = FakeClock(live.now + 3_600_000)
    MicroBatchRunner(spark, _delta_pipeline(table), tmp_path / "later", later).run(max_batches=None)
    assertDataFrameEqual(sink(spark, tmp_path / "later"), sink(spark, tmp_path / "live"))
    late = _late(spark, tmp_path / "live", _delta_pipeline(table))
    assert len(late) == 1  # written 75 s after its event time, with a lag of 30 s
    assert _late(spark, tmp_path / "later", _delta_pipeline(table)) == late
    # Every record within the lag is in a window, as a plain batch over the table puts it.
    whole = delta_frame(spark, table).where(F.col("amount") != 2**7)  # the late one
    expected = reference_of(whole, WINDOW)
    assertDataFrameEqual(sink(spark, tmp_path / "later"), expected)


def test_a_union_s_clock_is_the_earliest_of_its_sources_and_a_silent_one_holds_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Files beside a Delta table that was written once: after the files' second landing
    every window before the clock is in the sink, though the table never spoke again."""
    table, clock = tmp_path / "table", FakeClock()
    start = time.time()
    rows = [{"user": "t", "ts": datetime.fromtimestamp(start - 20, UTC), "amount": 1}]
    schema = pa.schema(
        [("user", pa.string()), ("ts", pa.timestamp("us", "UTC")), ("amount", pa.int64())]
    )
    write_deltalake(str(table), pa.Table.from_pylist(rows, schema))
    base = _pipeline()
    union = UnionSource(sources={"files": base.source, "table": DeltaSource(path=str(table))})
    pipeline = base.model_copy(update={"source": union})
    for n, after_s in enumerate((60, 120)):
        clock.now = int((start + after_s) * 1000)
        at = clock.now / 1000 - T0_MS / 1000
        land(tmp_path / "in", f"{n}.json", [event("a", at - 25, 1), event("b", at - 5, 2)], n)
        MicroBatchRunner(spark, pipeline, tmp_path, clock).run(max_batches=None)
    closed_by = datetime.fromtimestamp(start + 90, UTC)
    everything = delta_frame(spark, table).unionByName(
        spark.read.schema("user STRING, ts TIMESTAMP, amount LONG").json(str(tmp_path / "in"))
    )
    expected = reference_of(everything, WINDOW).where(F.col("window_end") <= F.lit(closed_by))
    assert expected.count() >= 3
    written = sink(spark, tmp_path).where(F.col("window_end") <= F.lit(closed_by))
    assertDataFrameEqual(written, expected)


def _as_events(df: DataFrame) -> DataFrame:
    """Synthetic records with the columns of ``event``'s."""
    renamed = {"key": "user", "event_time": "ts", "value": "amount"}
    return df.withColumnsRenamed(renamed).drop("seq", "source_partition")


def test_a_union_s_sources_may_each_follow_their_own_strategy(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A live stream by its ingestion clock beside a folder by the event times seen: the
    stream, read to its end, holds no window open, and the folder's records, listed long
    after their event time, are not late."""
    live = SyntheticSource(rows_per_second=1, total_rows=10, keys=2, starting_offsets="earliest")
    base = _pipeline(watermark=None)
    union = UnionSource(
        sources={"live": live, "files": base.source}, transforms={"live": _as_events}
    )
    watermarks, results = {}, {}
    for name, strategies in (("mixed", {"live": LAG}), ("event", {})):
        root, clock = tmp_path / name, FakeClock()
        source = union.model_copy(update={"watermarks": strategies})
        pipeline = base.model_copy(update={"source": source})
        runner = MicroBatchRunner(spark, pipeline, root, clock)
        _at(clock, 60)
        land(root / "in", "0.json", [event("a", 40, 1), event("b", 55, 2)], 1)
        results[name] = runner.run(max_batches=None)
        _at(clock, 120)
        land(root / "in", "1.json", [event("a", 70, 4), event("b", 115, 8)], 2)
        results[name] += runner.run(max_batches=None)
        last = results[name][-1].watermark_ms
        watermarks[name] = None if last is None else (last - T0_MS) // 1000
    # Mixed: the folder's clock (its newest event, 1:55) and the stream's (read to its end
    # at 2:00, minus the 30 s lag) give 1:30; nothing is late (the folder's second file
    # met the folder's 0:55, not 2:00 minus the lag).
    assert watermarks == {"mixed": 90, "event": 9}
    assert sum(r.rows_late for r in results["mixed"]) == 0
    records = SyntheticStreamSource(spark, live).read({}, {"0": 10}, 0).records
    everything = _as_events(records.drop(PARTITION_COLUMN)).unionByName(
        spark.read.schema("user STRING, ts TIMESTAMP, amount LONG").json(
            str(tmp_path / "mixed" / "in")
        )
    )
    closed_by = datetime.fromtimestamp(T0_MS / 1000 + 90, UTC)
    expected = reference_of(everything, WINDOW).where(F.col("window_end") <= F.lit(closed_by))
    assert expected.count() >= 4
    assertDataFrameEqual(sink(spark, tmp_path / "mixed"), expected)
    # Both by the event times seen, the stream's last record (0:09) holds every window open.
    assert sum(r.rows_out for r in results["event"]) == 0


def test_a_union_s_watermarks_name_its_sources_and_keep_its_fingerprint() -> None:
    base = _pipeline(watermark=None)
    sources = {"a": base.source, "b": SyntheticSource()}
    with pytest.raises(ValidationError, match=r"`watermarks` names no source \['c'\]"):
        UnionSource(sources=sources, watermarks={"c": LAG})
    per_source = UnionSource(sources=sources, watermarks={"b": LAG})
    both = {"source": per_source, "event_time": EventTime(column="ts", watermark=LAG)}
    with pytest.raises(ValidationError, match="remove it, or the union's `watermarks`"):
        Pipeline.model_validate(base.model_dump() | both)
    # Unset, the union's definition (and so the fingerprint) is the one it had before.
    union = UnionSource(sources=sources)
    assert "watermarks" not in base.model_copy(update={"source": union}).definition()["source"]


def test_the_strategy_is_checked_before_any_batch(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="remove `max_out_of_orderness` and `idle_timeout`"):
        EventTime(column="ts", idle_timeout="1 minute", watermark=LAG)
    # A source of the user's that keeps no ingestion clock is refused before Spark work.
    (tmp_path / "p.yaml").write_text(PIPELINES)
    insert(tmp_path / "app.db", ['{"order_id": 1, "amount": 1}'])
    outbox = get_pipeline("outbox_orders", str(tmp_path / "p.yaml"))
    clocked = outbox.model_copy(update={"event_time": EventTime(column="ts", watermark=LAG)})
    with pytest.raises(PipelineConfigInvalid, match="custom source keeps no ingestion clock"):
        MicroBatchRunner(spark, clocked, tmp_path).run_batch()
    # Unset, the definition (and so the fingerprint) is the one pipelines had before.
    assert "watermark" not in windowed(WINDOW).definition()["event_time"]
