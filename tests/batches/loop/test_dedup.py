"""Deduplication by record id (``dedup``): a record whose id was let through within the
horizon never reaches the sink again, and every dropped record is counted.

Records sent again (a file delivered twice, twins within a file, a record repeated in a
later file) must leave the sink exactly as a plain Spark batch that deduplicates the
whole input, and as Structured Streaming's ``dropDuplicatesWithinWatermark`` over the
same files; behind windows, as a plain batch that deduplicates and then aggregates.
Records older than the horizon go to the late table with their reason, seen ids below
it are purged, and the accounting identity holds per batch with the duplicates in it.
(Replays after kills: the ``dedup_tumbling`` pipeline of the kill matrix.)
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.reset import reset
from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.dedup import Dedup
from lowmark.batches.event_time.dedup import BEFORE_HORIZON, NO_EVENT_TIME
from lowmark.batches.loop.backfill import backfill_partition
from lowmark.batches.loop.events import BatchResult
from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, FileSource, Pipeline
from lowmark.batches.registry import get_pipeline
from lowmark.batches.windows import EventTime
from lowmark.orchestration.metadata import batch_line, batch_metadata
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.commit_log import CommitEntry
from tests.helpers import REPO, FakeClock, delta_frame, per_window, sink, write_json_lines

SCHEMA = "id STRING, user STRING, ts TIMESTAMP, amount LONG"


def _event(id_: str, user: str, second: int, amount: int = 1) -> dict[str, Any]:
    ts = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=second)
    return {"id": id_, "user": user, "ts": ts.isoformat(), "amount": amount}


FIRST = [
    _event("e1", "a", 1),
    _event("e2", "b", 2, 2),
    _event("e2", "b", 2, 2),
    _event("e3", "a", 12),
]
SECOND = [_event("e4", "b", 15, 4), _event("e1", "a", 1), _event("e5", "c", 21, 5)]
RESENT: list[list[dict[str, Any]]] = [
    FIRST,
    SECOND,
    [_event("e6", "a", 30, 6), _event("e5", "c", 21, 5), _event("e7", "b", 33, 7)],
    SECOND,  # the second file, delivered twice
]
"""Four files, one per batch: twins in a file, records repeated in later files, a file
delivered twice; every repeat within the horizon of an hour."""


def _files(root: Path, files: list[list[dict[str, Any]]], folder: str = "in") -> None:
    for i, rows in enumerate(files):
        write_json_lines(root / folder, f"f{i:03d}.json", rows, 1_700_000_000 + i)


def _deduplicating(**fields: Any) -> Pipeline:
    defined: dict[str, Any] = {
        "name": "d",
        "source": FileSource(path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=1),
        "sink": DeltaSink(path="out"),
        "event_time": EventTime(column="ts"),
        "dedup": Dedup(columns=("id",), within="1 hour"),
    }
    return Pipeline(**(defined | fields))


def _commits(root: Path, name: str = "d") -> list[CommitEntry]:
    return Checkpoint(str(root / "_lowmark" / name), name).commits.get_range()


def _whole_input(spark: SparkSession, root: Path) -> DataFrame:
    return spark.read.schema(SCHEMA).json(str(root / "in"))


def test_records_sent_again_reach_the_sink_once_as_plain_spark_and_structured_streaming_keep_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    _files(tmp_path, RESENT)
    with MicroBatchRunner(spark, _deduplicating(), tmp_path, FakeClock()) as runner:
        results = runner.run(max_batches=None)
    assert len(results) == len(RESENT)

    got = sink(spark, tmp_path)
    # A plain Spark batch over the whole input (every twin is the same record).
    assertDataFrameEqual(got, _whole_input(spark, tmp_path).dropDuplicates(["id"]))
    # Structured Streaming's deduplication within the watermark, a file per trigger.
    stream = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "in"))
        .withWatermark("ts", "1 hour")
        .dropDuplicatesWithinWatermark(["id"])
    )
    query = (
        stream.writeStream.format("memory")
        .queryName("dedup_peer")
        .option("checkpointLocation", str(tmp_path / "peer"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assertDataFrameEqual(got, spark.table("dedup_peer"))

    # Every repeat is counted once, per batch, in the accounting identity.
    lines = [r for rows in RESENT for r in rows]
    commits = _commits(tmp_path)
    assert sum(c.rows_duplicate for c in commits) == len(lines) - len({r["id"] for r in lines})
    assert [c.rows_duplicate for c in commits] == [1, 1, 1, 3]
    for c in commits:
        assert (
            c.rows_in == c.rows_bad + c.rows_dropped + c.rows_duplicate + c.rows_late + c.rows_out
        )
        assert c.rows_dropped == 0
    status = pipeline_status(spark, _deduplicating(), tmp_path)
    assert status.accounting == {
        "read": len(lines),
        "bad": 0,
        "dropped_by_transform": 0,
        "duplicates": 6,
        "late": 0,
        "in_sink": got.count(),
    }
    assert [r.rows_duplicate for r in results] == [1, 1, 1, 3]


def test_the_example_dedup_in_front_of_windows_equals_a_plain_batch_that_dedups_then_sums(
    spark: SparkSession, tmp_path: Path
) -> None:
    # examples/pipelines.yaml's unique_orders. A last order an hour on closes every
    # window of the first hour, so that hour can be backfilled.
    orders = [
        [{"order_id": r["id"], **{k: v for k, v in r.items() if k != "id"}} for r in rows]
        for rows in [*RESENT, [_event("e8", "a", 3700)]]
    ]
    _files(tmp_path, orders, "orders/incoming")
    pipeline = get_pipeline("unique_orders", str(REPO / "examples" / "pipelines.yaml"))
    MicroBatchRunner(spark, pipeline, tmp_path, FakeClock()).run(max_batches=None)

    schema = "order_id STRING, user STRING, amount LONG, ts TIMESTAMP"
    kept = spark.read.schema(schema).json(str(tmp_path / "orders" / "incoming"))
    kept = kept.dropDuplicates(["order_id"])
    expected = per_window(
        kept,
        "user",
        F.window("ts", "1 minute"),
        F.count(F.lit(1)).alias("count"),
        F.sum("amount").alias("revenue"),
    )
    revenue = delta_frame(spark, tmp_path / "orders" / "revenue_per_minute")
    assertDataFrameEqual(revenue, expected)
    # A backfill of the first hour recomputes it from the whole history, deduplicated.
    first_hour = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 1, tzinfo=UTC)
    assert not backfill_partition(spark, pipeline, tmp_path, *first_hour).skipped
    assertDataFrameEqual(revenue, expected)
    commits = _commits(tmp_path, "unique_orders")
    for c in commits:
        assert (
            c.rows_in
            == c.rows_bad + c.rows_dropped + c.rows_duplicate + c.rows_late + c.rows_windowed
        )
    assert commits[-1].totals["rows_duplicate"] == 6
    assert commits[-1].totals["rows_windowed"] == kept.count()


def _arrival_order_revenue(spark: SparkSession, folder: Path) -> DataFrame:
    """A plain Spark batch's revenue per user and minute of the orders in ``folder``, each
    order id counted once: its copy in the first file (the files arrive in name order)."""
    schema = "order_id STRING, user STRING, amount LONG, ts TIMESTAMP"
    orders = spark.read.schema(schema).json(str(folder)).withColumn("file", F.input_file_name())
    first = F.row_number().over(Window.partitionBy("order_id").orderBy("file"))
    kept = orders.withColumn("n", first).where("n = 1").drop("n", "file")
    return per_window(
        kept,
        "user",
        F.window("ts", "1 minute"),
        F.count(F.lit(1)).alias("count"),
        F.sum("amount").alias("revenue"),
    )


@pytest.mark.parametrize("within", ["1 hour", "1 minute"])
def test_a_backfill_with_no_new_input_keeps_the_copies_the_stream_let_through_not_the_earliest(
    spark: SparkSession, tmp_path: Path, within: str
) -> None:
    # Order x arrives at 00:01:10, then again with an earlier event time (00:00:30): the
    # stream keeps the first to arrive, in the 00:01 window. A last order an hour on
    # closes the first hour. Within a minute, x's id is purged by then.
    files = [
        [_event("x", "a", 70, 5), _event("y", "b", 20)],
        [_event("x", "a", 30, 5)],
        [_event("z", "a", 3700)],
        [_event("w", "b", 3710)],  # runs with the watermark z moved: purges below it
    ]
    orders = [[{"order_id": r.pop("id"), **r} for r in rows] for rows in files]
    pipeline = get_pipeline("unique_orders", str(REPO / "examples" / "pipelines.yaml"))
    pipeline = pipeline.model_copy(update={"dedup": Dedup(columns=("order_id",), within=within)})
    for i, rows in enumerate(orders):  # one batch per file, in this order
        write_json_lines(tmp_path / "orders" / "incoming", f"f{i}.json", rows, 1_700_000_000 + i)
        MicroBatchRunner(spark, pipeline, tmp_path, FakeClock()).run(max_batches=None)
    revenue = delta_frame(spark, tmp_path / "orders" / "revenue_per_minute")
    expected = _arrival_order_revenue(spark, tmp_path / "orders" / "incoming")
    assertDataFrameEqual(revenue, expected)
    held = DeltaTable(str(tmp_path / "_lowmark" / "unique_orders" / "dedup_ids"))
    assert ('{"order_id":"x"}' in held.to_pyarrow_table()["id"].to_pylist()) == (within == "1 hour")

    first_hour = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 1, tzinfo=UTC)
    assert not backfill_partition(spark, pipeline, tmp_path, *first_hour).skipped
    revenue = delta_frame(spark, tmp_path / "orders" / "revenue_per_minute")
    assertDataFrameEqual(revenue, expected)


def test_records_older_than_the_horizon_go_to_the_late_table_and_their_ids_are_purged(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Ids are held for 30 s of event time behind the watermark (no out-of-orderness: the
    # watermark is the newest event time).
    files = [
        [_event("a", "u", 0), _event("b", "u", 100)],  # watermark 100 s: held from 70 s
        [
            _event("a", "u", 0),  # before the horizon: late, not let through again
            _event("b", "u", 100),  # held: a duplicate
            _event("c", "u", 80),  # new, within the horizon
            {"id": "d", "user": "u", "amount": 1},  # no event time: late
        ],
        [_event("e", "u", 200)],  # watermark 200 s: held from 170 s, slots below 120 s go
        [_event("c", "u", 180)],  # c's id was purged; 180 s is within the horizon: new again
    ]
    _files(tmp_path, files)
    pipeline = _deduplicating(dedup=Dedup(columns=("id",), within="30 seconds"))
    MicroBatchRunner(spark, pipeline, tmp_path, FakeClock()).run(max_batches=None)

    assert sorted(r["id"] for r in sink(spark, tmp_path).collect()) == ["a", "b", "c", "c", "e"]
    late = delta_frame(spark, tmp_path / "_lowmark" / "d" / "late").collect()
    assert sorted((json.loads(r["record"])["id"], r["reason"], r["batch_id"]) for r in late) == [
        ("a", BEFORE_HORIZON, 1),
        ("d", NO_EVENT_TIME, 1),
    ]
    held = DeltaTable(str(tmp_path / "_lowmark" / "d" / "dedup_ids")).to_pyarrow_table()
    # Slots are a minute: [120 s, 180 s) and [180 s, 240 s) remain.
    assert sorted(held.column("id").to_pylist()) == ['{"id":"c"}', '{"id":"e"}']
    commits = _commits(tmp_path)
    assert [(c.rows_duplicate, c.rows_late) for c in commits] == [(0, 0), (1, 2), (0, 0), (0, 0)]
    for c in commits:
        assert (
            c.rows_in == c.rows_bad + c.rows_dropped + c.rows_duplicate + c.rows_late + c.rows_out
        )


def test_dedup_needs_event_time_and_counts_in_the_fingerprint_only_when_set() -> None:
    with pytest.raises(ValueError, match=r"`dedup` .* needs `event_time`"):
        _deduplicating(event_time=None)
    plain = _deduplicating(dedup=None)
    assert "dedup" not in plain.definition()
    assert _deduplicating().fingerprint() != plain.fingerprint()
    from_yaml = Pipeline.model_validate(
        {
            "name": "d",
            "source": {
                "path": "in",
                "format": "json",
                "schema_ddl": SCHEMA,
                "max_files_per_batch": 1,
            },
            "sink": {"path": "out"},
            "event_time": {"column": "ts"},
            "dedup": {"columns": ["id"], "within": "1 hour"},
        }
    )
    assert from_yaml.fingerprint() == _deduplicating().fingerprint()


@pytest.mark.parametrize("batch", [0, 1])
def test_a_batch_replayed_after_its_ids_were_written_judges_its_records_as_before(
    spark: SparkSession, tmp_path: Path, batch: int
) -> None:
    # Killed once the batch's new ids are in the seen-ids table, before its sink write:
    # its replay must not take its own records for duplicates.
    _files(tmp_path, RESENT[:2])
    with crash_at(KillPoint("after_state", batch)), pytest.raises(InjectedCrash):
        MicroBatchRunner(spark, _deduplicating(), tmp_path, FakeClock()).run(max_batches=None)
    MicroBatchRunner(spark, _deduplicating(), tmp_path, FakeClock()).run(max_batches=None)

    assertDataFrameEqual(
        sink(spark, tmp_path), _whole_input(spark, tmp_path).dropDuplicates(["id"])
    )
    assert [c.rows_duplicate for c in _commits(tmp_path)] == [1, 1]


def test_a_reset_after_the_sink_keeps_the_ids_its_records_hold(
    spark: SparkSession, tmp_path: Path
) -> None:
    _files(tmp_path, RESENT[:2])
    MicroBatchRunner(spark, _deduplicating(), tmp_path, FakeClock()).run(max_batches=None)
    before = sink(spark, tmp_path).collect()
    reset(spark, _deduplicating(), tmp_path, "after")
    _files(tmp_path, [*RESENT[:2], SECOND])  # the second file delivered again, after the reset

    results = MicroBatchRunner(spark, _deduplicating(), tmp_path, FakeClock()).run()
    assert [(r.rows_in, r.rows_out, r.rows_duplicate) for r in results] == [(3, 0, 3)]
    assertDataFrameEqual(sink(spark, tmp_path), before)


def test_dagster_shows_a_batchs_duplicates_and_only_for_a_deduplicating_pipeline() -> None:
    committed = BatchResult("d", 3, False, {"p": 0}, {"p": 5}, 5, 2, 0, 0, None, None)
    deduplicating = dataclasses.replace(committed, rows_duplicate=3)
    assert batch_metadata(deduplicating, {})["rows_duplicate"] == 3
    assert "rows_duplicate" not in batch_metadata(committed, {})
    assert ", 3 duplicates;" in batch_line(_deduplicating(), deduplicating)
    assert "duplicates" not in batch_line(_deduplicating(), committed)
