"""A stream-stream join under an ingestion-time watermark judges each record by its own
ingestion time: the same input read live or as a backlog joins the same pairs, leaves the
same rows unmatched and sets aside the same late records."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from lowmark.batches.event_time.interval_join import BEHIND_WHEN_INGESTED
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, DeltaSource, FileSource, Pipeline, UnionSource
from lowmark.batches.stream_join import JoinTime, StreamJoin
from lowmark.batches.windows import EventTime, IngestionWatermark
from tests.helpers import FakeClock, write_json_lines

PAYMENTS = [(1, [(2, -1)]), (4, [(1, -2)])]
"""Payment files, each (modified, [(order id, paid at)]) in seconds from the orders' commit
time ``c``, where orders 1 and 2 were placed at ``c - 4 s`` and ``c - 3 s``. With a lag of
5 s, payment 1 (at ``c - 2 s``, written at ``c + 4 s``) came after the join had passed it
(its own clock: ``c - 1 s``), though it is within 10 s of order 1: it is late and order 1
leaves the join unmatched, in every run. A batch that took it with the orders' clock
(``c - 5 s``) joined them."""


def _pipeline(root: Path) -> Pipeline:
    lag = IngestionWatermark(strategy="ingestion_time", max_event_time_lag="5 seconds")
    orders = DeltaSource(path=str(root / "orders"), starting_version="earliest")
    payments = FileSource(
        path="payments",
        format="json",
        schema_ddl="order_id LONG, paid_at TIMESTAMP",
        ingestion_time="modified",
    )
    return Pipeline(
        name="j",
        source=UnionSource(sources={"orders": orders, "payments": payments}),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="order_time", watermark=lag),
        stream_join=StreamJoin(
            left="orders",
            right="payments",
            keys=("order_id",),
            how="left",
            time=JoinTime(left="order_time", right="paid_at", lower="0 s", upper="10 s"),
        ),
    )


def _orders(root: Path) -> int:
    """The orders table, one version committed now, orders 1 and 2 placed 4 s and 3 s
    before: its commit time (epoch ms)."""
    now = datetime.now(UTC)
    placed = [now - timedelta(seconds=4), now - timedelta(seconds=3)]
    orders = pa.table(
        {
            "order_id": pa.array([1, 2], pa.int64()),
            "order_time": pa.array(placed, pa.timestamp("us", "UTC")),
        }
    )
    write_deltalake(str(root / "orders"), orders)
    [commit] = DeltaTable(str(root / "orders")).history()
    return int(commit["timestamp"])


def _at(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat()


def _payments(root: Path, committed_ms: int, upto: int) -> None:
    """The first ``upto`` files of ``PAYMENTS``, modified whole seconds after ``committed_ms``."""
    for i, (modified, rows) in enumerate(PAYMENTS[:upto]):
        paid = [{"order_id": n, "paid_at": _at(committed_ms + 1000 * t)} for n, t in rows]
        mtime_s = -(-committed_ms // 1000) + modified
        write_json_lines(root / "payments", f"p{i}.json", paid, mtime_s)


def _results(root: Path) -> dict[str, list[tuple[Any, ...]]]:
    """The sink, and the late records (not which batch set them aside, nor its watermark)."""

    def rows(path: Path, drop: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
        table = DeltaTable(str(path)).to_pyarrow_table().drop_columns(list(drop))
        return sorted(tuple(r.values()) for r in table.to_pylist())

    return {
        "sink": rows(root / "out"),
        "late": rows(root / "_lowmark" / "j" / "late", ("batch_id", "watermark_ms")),
    }


def test_a_join_read_live_or_as_a_backlog_joins_the_same_pairs_and_leaves_the_same_unmatched(
    spark: SparkSession, tmp_path: Path
) -> None:
    live, backlog = tmp_path / "live", tmp_path / "backlog"
    committed = _orders(live)
    clock = FakeClock()
    with MicroBatchRunner(spark, _pipeline(live), live, clock) as runner:
        for i, (modified, _) in enumerate([(0, []), *PAYMENTS]):
            _payments(live, committed, i)
            clock.now = committed + modified * 1000 + 1_000
            runner.run(max_batches=None)
        clock.advance(3_600_000)  # the clock passes order 1: it leaves the join unmatched
        runner.run(max_batches=None)
    expected = _results(live)
    assert [(r[0], r[-1] is None) for r in expected["sink"]] == [(1, True), (2, False)]
    assert [r[1] for r in expected["late"]] == [BEHIND_WHEN_INGESTED]

    # The same orders table (its commit time) and files, read an hour later.
    shutil.copytree(live / "orders", backlog / "orders")
    _payments(backlog, committed, len(PAYMENTS))
    later = FakeClock(clock.now)
    MicroBatchRunner(spark, _pipeline(backlog), backlog, later).run(max_batches=None)
    assert _results(backlog) == expected
