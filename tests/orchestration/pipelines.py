"""Pipelines the orchestration tests load (``LOWMARK_PIPELINES=tests.orchestration.pipelines``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pyspark.sql import DataFrame

from lowmark.batches.pipeline import DeltaSink, EventTimePartitions, FileSource, Pipeline
from lowmark.batches.windows import Aggregate, EventTime, Tumbling, WindowedAggregation

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"
HOLD = "HOLD"
"""While ``<data root>/HOLD`` exists, ``slow``'s transform blocks (and says its pid)."""
SESSION = "slow/session.json"
"""Under the data root: the Spark confs the session of ``slow``'s latest batch has."""


def hold_while_flagged(df: DataFrame) -> DataFrame:
    """Write the batch's session's Spark confs to ``SESSION``; block mid-batch (after the
    offset log, before any sink) while the HOLD file exists."""
    root = Path(os.environ["LOWMARK_DATA_ROOT"])
    # What the batch's own session has, not what was asked for: the proof that the confs
    # given `lowmark ui` and the project reach the runs it starts.
    (root / SESSION).write_text(json.dumps(df.sparkSession.conf.getAll, sort_keys=True))
    if (root / HOLD).exists():
        (root / "HELD.pid").write_text(str(os.getpid()))
        deadline = time.monotonic() + 300
        while (root / HOLD).exists() and time.monotonic() < deadline:
            time.sleep(0.5)
    return df


ticks = Pipeline(
    name="ticks",
    description="Per-user 10 s windows of ticks.",
    source=FileSource(path="ticks/in", format="json", schema_ddl=SCHEMA, max_files_per_batch=1),
    sink=DeltaSink(path="ticks/out"),
    event_time=EventTime(column="ts", allowed_lateness="10 seconds"),
    aggregation=WindowedAggregation(
        keys=("user",),
        window=Tumbling(size="10 seconds"),
        aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
    ),
    backfill=EventTimePartitions(granularity="hourly", start="2026-01-01"),
)

slow = Pipeline(
    name="slow",
    description="Copies ids; its transform says its session's Spark confs and can be held "
    "mid-batch to kill the run.",
    source=FileSource(path="slow/in", format="json", schema_ddl="id LONG"),
    transform=hold_while_flagged,
    sink=DeltaSink(path="slow/out"),
)
