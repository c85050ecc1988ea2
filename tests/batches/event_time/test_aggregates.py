"""The aggregates beyond count/sum/min/max/avg against a plain Spark batch aggregation of
the whole input: split into batches, out of order, through a crash and its replay."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.windows import Aggregate, Session, Sliding, Tumbling
from tests.helpers import drop_batches, event, per_window, sink, spark_window, windowed

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG, item STRING"

AGGREGATES = (
    Aggregate(fn="count"),
    Aggregate(fn="count_distinct", column="item", max_items=2),
    Aggregate(fn="approx_count_distinct", column="item"),
    Aggregate(fn="approx_percentile", column="amount", percentage=0.5, name="median"),
    Aggregate(fn="approx_percentile", column="amount", percentage=(0.25, 0.9), name="quartiles"),
    Aggregate(fn="first", column="item"),
    Aggregate(fn="last", column="item"),
    Aggregate(fn="min_by", column="item", by="amount"),
    Aggregate(fn="max_by", column="item", by="amount"),
    Aggregate(fn="collect_set", column="item", max_items=2),
)


def sold(user: str, second: int, amount: int | None, item: str | None) -> dict[str, Any]:
    return {**event(user, second, 0), "amount": amount, "item": item}


# Each batch holds records up to 10 s older than the newest before it: none is late.
# Ties: a's two records at 8 s (first/last), its amounts 1 and 5 twice (min_by/max_by).
BATCHES = [
    [
        sold("a", 3, 5, "x"),
        sold("b", 2, 7, "y"),
        sold("a", 8, 1, "z"),
        sold("a", 8, 3, "w"),
        sold("a", 12, 3, "x"),
    ],
    [
        sold("a", 5, None, "v"),
        sold("a", 1, 1, "u"),
        sold("b", 14, 2, None),
        sold("b", 19, 9, "y"),
        sold("a", 6, 5, "y"),
        sold("a", 21, 4, "q"),
        sold("c", 25, 6, "x"),
    ],
    # b at 16 s bridges b's two stored sessions.
    [sold("b", 16, 2, "y"), sold("b", 33, 8, "r"), sold("a", 41, 2, "s"), sold("a", 24, 3, "t")],
]


def reference(spark: SparkSession, root: Path, window: Tumbling | Sliding | Session) -> DataFrame:
    """The same aggregates, as one plain Spark batch over every file."""
    df = spark.read.schema(SCHEMA).json(str(root / "in"))
    item, amount = F.col("item"), F.col("amount")

    def by(order: Column, kept: Column) -> Column:  # skips rows where ``kept`` is null
        return F.when(kept.isNotNull(), F.struct(order, item))

    def quantile(p: float) -> Column:  # KLL's quantile: the smallest value of rank >= p
        return F.expr(f"percentile_disc({p}) WITHIN GROUP (ORDER BY amount)").cast("double")

    return per_window(
        df,
        "user",
        spark_window(window),
        F.count(F.lit(1)).alias("count"),
        F.count_distinct(item).alias("count_distinct_item"),
        F.count_distinct(item).alias("approx_count_distinct_item"),
        quantile(0.5).alias("median"),
        F.array(quantile(0.25), quantile(0.9)).alias("quartiles"),
        F.min_by(item, by(F.col("ts"), item)).alias("first_item"),
        F.max_by(item, by(F.col("ts"), item)).alias("last_item"),
        F.min_by(item, by(amount, amount)).alias("min_by_item"),
        F.max_by(item, by(amount, amount)).alias("max_by_item"),
        F.slice(F.array_sort(F.collect_set(item)), 1, 2).alias("collect_set_item"),
    )


@pytest.mark.parametrize(
    ("window", "mode", "crash"),
    [
        (Tumbling(size="10 seconds"), "append", False),
        (Sliding(size="10 seconds", slide="5 seconds"), "update", False),
        (Session(gap="5 seconds"), "update", True),
    ],
    ids=["tumbling-append", "sliding-update", "session-update-replayed"],
)
def test_every_aggregate_equals_a_batch_aggregation_across_batches_and_a_replay(
    spark: SparkSession,
    data_root: Path,
    window: Tumbling | Sliding | Session,
    mode: str,
    crash: bool,
) -> None:
    drop_batches(data_root, BATCHES)
    pipeline = windowed(window, mode, AGGREGATES, SCHEMA, max_out_of_orderness="10 seconds")
    if crash:
        # Batch 1 dies with its window state written, before its sink: the replay must
        # read the state batch 0 left, not merge batch 1's records twice.
        with crash_at(KillPoint("after_state", 1)), pytest.raises(InjectedCrash):
            MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)
    results = MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)
    assert results[0].batch_id == (1 if crash else 0)
    assert sum(r.rows_late for r in results) == 0
    expected = reference(spark, data_root, window)
    if mode == "append":
        expected = expected.where(F.unix_millis("window_end") <= F.lit(results[-1].watermark_ms))
    assertDataFrameEqual(sink(spark, data_root), expected)


def test_a_definition_written_before_these_aggregates_keeps_its_fingerprint() -> None:
    # The fingerprints of these definitions before `by`, `max_items` and `percentage`
    # existed: an existing checkpoint must still accept its definition.
    assert windowed(Tumbling(size="10 seconds")).fingerprint() == "79c07202403fe320"
    assert windowed(Session(gap="5 seconds"), "update").fingerprint() == "55664250f862856d"


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"fn": "min_by", "column": "item"}, "aggregate 'min_by' needs `by`"),
        ({"fn": "sum", "column": "amount", "by": "ts"}, "`by` is for min_by and max_by only"),
        ({"fn": "max", "column": "amount", "max_items": 5}, "`max_items` is for count_distinct"),
        ({"fn": "approx_percentile", "column": "amount"}, "needs `percentage`"),
        (
            {"fn": "approx_percentile", "column": "amount", "percentage": [0.5, 95]},
            "`percentage` must be within [0, 1]",
        ),
    ],
)
def test_an_aggregate_names_the_field_its_function_lacks_or_does_not_take(
    fields: dict[str, Any], error: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        Aggregate(**fields)


def test_the_array_aggregates_keep_a_bounded_number_of_items_by_default() -> None:
    assert Aggregate(fn="count_distinct", column="item").max_items == 1000
    assert Aggregate(fn="collect_set", column="item").max_items == 100
