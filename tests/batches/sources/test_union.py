"""Several sources in one pipeline (``kind: union``): the offset log records each source's
offsets, the windows equal a plain batch over all their records, a source gone idle does not
hold the watermark back, and sources of different shapes need a transform each."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, Pipeline, SyntheticSource, UnionSource
from lowmark.batches.sources.synthetic import SyntheticStreamSource
from lowmark.batches.sources.union import UnionStreamSource
from lowmark.batches.windows import Aggregate, EventTime, Tumbling, WindowedAggregation
from tests.helpers import FakeClock, FlakyReads, delta_frame, per_window

START_MS = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)


def same_names(df: DataFrame) -> DataFrame:
    """A source's ``key`` and ``value`` as the pipeline names them."""
    return df.withColumnRenamed("value", "amount").withColumnRenamed("key", "user")


def as_amounts(df: DataFrame) -> DataFrame:
    """Source ``b`` counts in half units: its own transform, before the union."""
    return same_names(df).withColumn("amount", F.col("amount") * 2)


def windowed(union: UnionSource, **event_time: str) -> Pipeline:
    return Pipeline(
        name="two_sources",
        source=union,
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="event_time", **event_time),
        aggregation=WindowedAggregation(
            keys=("user",),
            window=Tumbling(size="20 seconds"),
            aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
            output_mode="update",
        ),
    )


def test_two_sources_are_one_stream_with_each_sources_offsets_recorded(
    spark: SparkSession, data_root: Path
) -> None:
    a = SyntheticSource(
        seed=1, partitions=2, keys=4, rows_per_second=2, total_rows=60,
        starting_offsets="earliest", max_rows_per_batch=50,
    )  # fmt: skip
    b = SyntheticSource(
        seed=2, keys=4, rows_per_second=1, total_rows=40, starting_offsets="earliest",
        max_rows_per_batch=15, partition_skew="0 s",
    )  # fmt: skip
    union = UnionSource(
        sources={"a": a, "b": b},
        transforms={"a": same_names, "b": as_amounts},
    )
    results = MicroBatchRunner(
        spark, windowed(union, max_out_of_orderness="5 minutes"), data_root
    ).run(max_batches=None)
    assert results[0].end == {"a/0": 25, "a/1": 25, "b/0": 15}  # each source's own limit
    assert results[-1].end == {"a/0": 60, "a/1": 60, "b/0": 40}
    assert sum(r.rows_in for r in results) == 160

    records = [
        t(SyntheticStreamSource(spark, c).read({}, end, 0).records)
        for c, t, end in (
            (a, same_names, {"0": 60, "1": 60}),
            (b, as_amounts, {"0": 40}),
        )
    ]
    every = records[0].unionByName(records[1])
    expected = per_window(
        every,
        "user",
        F.window("event_time", "20 seconds"),
        F.count(F.lit(1)).alias("count"),
        F.sum("amount").alias("sum_amount"),
    )
    assertDataFrameEqual(delta_frame(spark, str(data_root / "out")), expected)


def test_aligned_admission_orders_each_sources_partitions_by_their_own_clocks(
    spark: SparkSession,
) -> None:
    config = SyntheticSource(
        partitions=2,
        rows_per_second=None,
        total_rows=100,
        max_rows_per_batch=10,
        starting_offsets="earliest",
    )
    # ``b`` is a source written before aligned admission: its plan takes no clocks.
    old = FlakyReads(SyntheticStreamSource(spark, config), 0, RuntimeError())
    union = UnionStreamSource({"a": SyntheticStreamSource(spark, config), "b": old}, {})
    start = union.initial_offsets()
    clocks = {"a/0": 9, "a/1": 5, "b/0": 1, "b/1": 7}
    assert union.plan(start, 0, clocks=clocks) == {"a/0": 0, "a/1": 10, "b/0": 5, "b/1": 5}
    assert union.plan(start, 0) == {"a/0": 5, "a/1": 5, "b/0": 5, "b/1": 5}


def test_a_source_gone_idle_does_not_hold_the_watermark_back(
    spark: SparkSession, data_root: Path
) -> None:
    clock = FakeClock(now_ms=START_MS + 20_000)
    union = UnionSource(
        sources={
            # Paced by the clock: keeps producing.
            "live": SyntheticSource(seed=3, rows_per_second=1, starting_offsets="earliest"),
            # Five records, then nothing.
            "done": SyntheticSource(
                seed=4, rows_per_second=1, total_rows=5, starting_offsets="earliest"
            ),
        },
        transforms={"live": same_names, "done": same_names},
    )
    pipeline = windowed(union, idle_timeout="30 seconds")
    runner = MicroBatchRunner(spark, pipeline, data_root, clock=clock)
    runner.run(max_batches=None)
    for _ in range(3):
        clock.advance(30_000)
        runner.run(max_batches=None)
    status = pipeline_status(spark, pipeline, data_root, clock)
    times = {t.partition: t for t in status.partitions}
    assert set(times) == {"live/0", "done/0"}
    assert times["done/0"].max_event_time_ms == START_MS + 4_000
    # 110 s of "live" events: its watermark leads, the idle source is left out.
    assert status.watermark_ms == times["live/0"].max_event_time_ms > START_MS + 100_000


def test_sources_of_different_shapes_without_transforms_are_refused_in_one_line(
    spark: SparkSession, data_root: Path
) -> None:
    union = UnionSource(
        sources={
            "a": SyntheticSource(rows_per_second=None, total_rows=3, starting_offsets="earliest"),
            "b": SyntheticSource(rows_per_second=None, total_rows=3, starting_offsets="earliest"),
        },
        transforms={"b": as_amounts},
    )
    with pytest.raises(PipelineConfigInvalid, match="the union's sources give different columns"):
        MicroBatchRunner(spark, windowed(union), data_root).run_batch()


def test_a_union_is_declared_in_yaml_and_holds_at_most_one_folder() -> None:
    with pytest.raises(ValueError, match="at most one `files` source"):
        UnionSource.model_validate(
            {
                "sources": {
                    "x": {"kind": "files", "path": "a", "format": "json"},
                    "y": {"path": "b", "format": "json"},
                }
            }
        )
