"""The cost of judging each record by its own ingestion time, per small batch.

Under an ingestion-time watermark every record carries its ingestion time
(``_lowmark_ingested_ms``: here its file's modification time) and the late check compares
its windows with it as well as with the batch's clock. Measured: the same windowed
pipeline (per user, 10-second tumbling windows, ``count`` and ``sum``, into Delta) run
live (simulated time: a file of ``--events`` records lands every 10 s and is taken a
second later, a batch each), with the column kept and
with it dropped by the transform (records then judged by their batch's clock alone, as
before the per-record rule). The runs alternate (with, without, with, ...) after one
warm-up of each, in one Spark session. Printed: seconds per batch of each and the ratio
(the target: at most 1.05).

Usage: ``python -m bench.own_clock [--files 12] [--events 2000] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from bench.streaming import _say
from bench.watermark_strategies import SCHEMA, T0_MS, Clock
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, FileSource, Pipeline
from lowmark.batches.records import INGESTED_COLUMN
from lowmark.batches.windows import (
    Aggregate,
    EventTime,
    IngestionWatermark,
    Tumbling,
    WindowedAggregation,
)
from lowmark.state.session import SparkSettings, get_spark

T0_S = T0_MS // 1000


def without_own_clock(records: DataFrame) -> DataFrame:
    """The records without their own ingestion time: judged by the batch's clock alone."""
    return records.drop(INGESTED_COLUMN)


def keep(records: DataFrame) -> DataFrame:
    """The records as read (the same transform step as ``without_own_clock``)."""
    return records


def pipeline(root: Path, transform: str) -> Pipeline:
    return Pipeline(
        name="own_clock",
        source=FileSource(
            path=str(root / "in"), format="json", schema_ddl=SCHEMA, ingestion_time="modified"
        ),
        transform=transform,
        sink=DeltaSink(path="out"),
        event_time=EventTime(
            column="ts",
            watermark=IngestionWatermark(strategy="ingestion_time", max_event_time_lag="5 seconds"),
        ),
        aggregation=WindowedAggregation(
            keys=("user",),
            window=Tumbling(size="10 seconds"),
            aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
        ),
    )


def run(spark: SparkSession, root: Path, transform: str, files: int, events: int) -> float:
    """Seconds per batch of a live run over ``files`` files landed one a batch."""
    shutil.rmtree(root, ignore_errors=True)
    (root / "in").mkdir(parents=True)
    rng = random.Random(0)
    clock = Clock()  # simulated: each file is taken a second after it lands
    spent = 0.0
    for i in range(files):
        landed = T0_S + 10 * i
        clock.now = (landed + 1) * 1000
        rows = [
            {
                "user": f"u{rng.randrange(50)}",
                "ts": time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime(landed - rng.expovariate(1 / 3))
                ),
                "amount": rng.randrange(100),
            }
            for _ in range(events)
        ]
        path = root / "in" / f"f{i:04d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (landed, landed))
        runner = MicroBatchRunner(spark, pipeline(root, transform), root, clock)
        began = time.perf_counter()
        runner.run(max_batches=None)
        spent += time.perf_counter() - began
    return spent / files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=12)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    spark = get_spark(SparkSettings(app_name="lowmark-bench-own-clock"))
    work = Path(tempfile.mkdtemp(prefix="own_clock_"))
    kinds = {"with": "bench.own_clock:keep", "without": "bench.own_clock:without_own_clock"}
    try:
        for name, transform in kinds.items():  # warm-up
            run(spark, work / name, transform, 3, args.events)
        seconds: dict[str, list[float]] = {name: [] for name in kinds}
        for _ in range(args.rounds):
            for name, transform in kinds.items():
                seconds[name].append(run(spark, work / name, transform, args.files, args.events))
        per_batch = {name: min(s) for name, s in seconds.items()}
        for name, s in per_batch.items():
            _say(f"{name} its own clock: {s:.3f} s per batch (best of {args.rounds})")
        _say(f"ratio with / without: {per_batch['with'] / per_batch['without']:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
