"""The stream-stream join (``stream_join``): each batch's orders and payments meet each other
and the rows held from earlier batches; the result equals a plain Spark join over the whole
input, and the held rows go once the watermark passes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, DeltaSource, Pipeline, UnionSource
from lowmark.batches.stream_join import JoinTime, StreamJoin
from lowmark.batches.windows import EventTime
from tests.helpers import delta_frame

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
ORDERS = pa.schema(
    [("order_id", pa.int64()), ("order_time", pa.timestamp("us", "UTC")), ("amount", pa.int64())]
)
PAYMENTS = pa.schema(
    [("order_id", pa.int64()), ("paid_at", pa.timestamp("us", "UTC")), ("paid", pa.int64())]
)


def at(minute: float) -> datetime:
    return T0 + timedelta(minutes=minute)


# Per batch: (orders, payments) as (order_id, minute, amount). Out of order within the
# 10 minutes' out-of-orderness, a payment before its order, one after the hour, a
# payment twice, keys on one side only (order 10, passed by the watermark before the end;
# order 11, not); nothing is behind the watermark.
BATCHES: list[tuple[list[tuple[int, float, int]], list[tuple[int, float, int]]]] = [
    ([(1, 0, 10), (2, 3, 20)], [(1, 5, 10)]),
    ([(3, 8, 30), (4, 2, 40)], [(2, 70, 20), (4, 9, 40), (9, 9, 90)]),
    ([(5, 20, 50)], [(3, 7, 30), (3, 30, 30), (5, 21, 50)]),
    ([(6, 40, 60), (1, 35, 11), (10, 50, 100)], [(1, 36, 11), (6, 95, 60)]),
    ([(7, 120, 70), (11, 150, 110)], [(7, 125, 70), (5, 118, 51)]),
    ([(8, 200, 80)], [(8, 201, 80)]),
]


def write_versions(root: Path) -> None:
    """The orders and payments tables, one Delta version per batch and side."""
    for orders, payments in BATCHES:
        for name, schema, rows in (("orders", ORDERS, orders), ("payments", PAYMENTS, payments)):
            table = pa.Table.from_pylist(
                [dict(zip(schema.names, (k, at(m), v), strict=True)) for k, m, v in rows],
                schema=schema,
            )
            write_deltalake(str(root / name), table, mode="append")


def joined(how: str = "inner", **overrides: Any) -> Pipeline:
    def side(name: str) -> DeltaSource:
        return DeltaSource(path=name, starting_version="earliest", max_versions_per_batch=1)

    return Pipeline(
        name="orders_payments",
        source=UnionSource(sources={"orders": side("orders"), "payments": side("payments")}),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="order_time", max_out_of_orderness="10 minutes"),
        stream_join=StreamJoin(
            left="orders",
            right="payments",
            on=("order_id",),
            how=how,
            time=JoinTime(left="order_time", right="paid_at", lower="0 s", upper="1 hour"),
        ),
        **overrides,
    )


def reference(spark: SparkSession, root: Path, how: str = "inner") -> DataFrame:
    """The same join as one plain Spark batch over every record."""
    orders = spark.read.format("delta").load(str(root / "orders")).alias("o")
    payments = spark.read.format("delta").load(str(root / "payments")).alias("p")
    condition = (
        (F.col("o.order_id") == F.col("p.order_id"))
        & (F.col("p.paid_at") >= F.col("o.order_time"))
        & (F.col("p.paid_at") <= F.col("o.order_time") + F.expr("INTERVAL 1 HOUR"))
    )
    key = F.col("p.order_id") if how == "right" else F.col("o.order_id")
    return orders.join(payments, condition, how).select(
        key.alias("order_id"), "o.order_time", "o.amount", "p.paid_at", "p.paid"
    )


def test_an_inner_join_over_several_batches_equals_one_spark_join_over_all_input(
    spark: SparkSession, data_root: Path
) -> None:
    write_versions(data_root)
    results = MicroBatchRunner(spark, joined(), data_root).run(max_batches=None)
    # One batch per version of each side, then one with no input: the watermark moved.
    assert [r.rows_in for r in results][-1:] == [0] and len(results) == len(BATCHES) + 1
    assert sum(r.rows_late for r in results) == 0
    assertDataFrameEqual(delta_frame(spark, data_root / "out"), reference(spark, data_root))


def test_held_rows_go_once_the_watermark_passes_them(
    spark: SparkSession, data_root: Path
) -> None:
    write_versions(data_root)
    MicroBatchRunner(spark, joined(), data_root).run(max_batches=None)
    state = DeltaTable(str(data_root / "_lowmark/orders_payments/join_state")).to_pyarrow_table()
    # The last batch (no input) has the watermark minute 200 - 10 = 190: orders before
    # minute 130 and payments before minute 190 can match nothing to come. Their slots are
    # deleted (ten minutes wide: the out-of-orderness); the rest are held.
    held = sorted((r["side"], (r["time_ms"] - T0_MS) / 60_000) for r in state.to_pylist())
    assert held == [("left", 150), ("left", 200), ("right", 201)]
