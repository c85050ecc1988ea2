"""The demo: sample order files and the pipelines that read them.

These are the default pipelines (``LOWMARK_PIPELINES`` unset). ``lowmark
demo`` writes the sample files, runs ``orders`` until caught up and prints
what landed.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from lowmark.batches.pipeline import (
    DeltaSink,
    EventTimePartitions,
    FileSource,
    HealthChecks,
    Pipeline,
)
from lowmark.batches.windows import Aggregate, EventTime, Tumbling, WindowedAggregation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

INCOMING = "demo/incoming"
USERS = ["ada", "bob", "cyd", "dee", "eve"]


def clean_orders(df: DataFrame) -> DataFrame:
    """Typed orders with revenue; orders without a positive quantity are dropped.

    ``try_to_timestamp``: an unparseable time becomes null (a windowed pipeline
    sets its record aside in the late table) instead of failing the batch on
    every replay (Spark's ANSI mode makes ``to_timestamp`` raise). PySpark is imported
    here, not with the module: ``lowmark list`` and ``show`` read the demo's definitions
    without it.
    """
    from pyspark.sql import functions as F

    return (
        df.where(F.col("quantity") > 0)
        .withColumn("event_time", F.try_to_timestamp(F.col("ts")))
        .withColumn("revenue", F.round(F.col("price") * F.col("quantity"), 2))
        .select("order_id", "user", "event_time", "quantity", "price", "revenue")
    )


orders = Pipeline(
    name="orders",
    description="Demo: order events (JSON files) → cleaned orders (Delta, append).",
    source=FileSource(path=INCOMING, format="json", max_files_per_batch=2),
    transform=clean_orders,
    sink=DeltaSink(path="demo/orders"),
)

user_revenue = Pipeline(
    name="user_revenue",
    description="Demo: orders and revenue per user per minute (tumbling windows, append).",
    source=FileSource(path=INCOMING, format="json", max_files_per_batch=2),
    transform=clean_orders,
    sink=DeltaSink(path="demo/user_revenue"),
    event_time=EventTime(
        column="event_time", max_out_of_orderness="30 seconds", allowed_lateness="1 minute"
    ),
    aggregation=WindowedAggregation(
        keys=("user",),
        window=Tumbling(size="1 minute"),
        aggregates=(
            Aggregate(fn="count", name="orders"),
            Aggregate(fn="sum", column="revenue", name="revenue"),
        ),
    ),
    backfill=EventTimePartitions(granularity="hourly"),
    # The demo's last file is a straggler on purpose (its 40 orders land late: see the
    # late table), so a sixth of the rows are late; anything more says something broke.
    checks=HealthChecks(max_late_fraction=0.2),
)


def write_sample_files(
    data_root: Path, files: int = 6, rows_per_file: int = 40, now: datetime | None = None
) -> list[Path]:
    """Write the demo's order files (deterministic given ``now``; existing files are kept).

    Event times are recent, so the health checks and backfills have something
    real to show: file ``f`` holds orders about 3 s apart starting at
    ``T0 + f * 20 minutes``, where ``T0`` is ``now`` minus 1 h 25 min (for 6 files), so
    the newest regular order is about 3 minutes old and the hour of the first
    ones is over (a partition to backfill). The third file carries two malformed lines (→
    bad_records); the last file is a straggler whose orders are from ``T0 +
    30 minutes`` (→ the late table of ``user_revenue``, their windows long
    closed by the time it lands).
    """
    folder = data_root / INCOMING
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    now = now or datetime.now(UTC)
    first = now.replace(microsecond=0) - timedelta(minutes=20 * (files - 2) + 5)
    written = []
    for f in range(files):
        # The straggler lands last with orders from between the first files: by then
        # the watermark has passed their windows' end plus the allowed lateness.
        base = first + timedelta(minutes=30 if f == files - 1 else 20 * f)
        lines = []
        for r in range(rows_per_file):
            order_id = f * rows_per_file + r
            ts = base + timedelta(seconds=r * 3 + rng.randint(0, 20))
            lines.append(
                json.dumps(
                    {
                        "order_id": order_id,
                        "user": rng.choice(USERS),
                        "ts": ts.isoformat().replace("+00:00", "Z"),
                        "quantity": rng.randint(0, 4),
                        "price": round(rng.uniform(1, 50), 2),
                    }
                )
            )
        if f == 2:
            lines[5:5] = ['{"order_id": oops', "not json at all"]
        path = folder / f"orders-{f:03d}.json"
        if not path.exists():
            path.write_text("\n".join(lines) + "\n")
            written.append(path)
    return written
