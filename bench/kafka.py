"""Per-batch time of a windowed pipeline over Kafka: lowmark next to Structured Streaming.

A real single-node broker (``tests.kafka_broker``) holds one topic of
``--partitions`` partitions with ``--batches`` x ``--batch-records`` events
(the benchmark's events: user, ts, amount). Both engines run the same query
— count and avg(amount) per user per hour of event time, append mode, into a
Delta table — over the same topic, ``--batch-records`` records a batch
(lowmark: ``max_offsets_per_batch``; Structured Streaming: its Kafka source
with ``maxOffsetsPerTrigger`` and an available-now trigger), one after the
other in one Spark session. Both are warmed alike: each first runs over the
whole topic once, unreported (into tables of its own), and of the measured
runs each engine's first two batches (which create its tables) are left out
of the medians. No assertions; prints a table and the ratio, against the
catch-up issue's target (<= 0.5).

    .venv/bin/python -m bench.kafka                 # about 2 minutes
    .venv/bin/python -m bench.kafka --batches 6     # shorter
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.streaming import (
    OUT_OF_ORDERNESS,
    SCHEMA,
    _p95,
    _say,
    event_lines,
    run_sss,
    windowed_pipeline,
)
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import KafkaSource
from lowmark.state.session import get_spark
from tests.kafka_broker import KafkaBroker

TOPIC = "bench_events"
WARM_BATCHES = 2
"""Each engine's first batches of its measured run, left out of the medians."""
TARGET = 0.5
"""lowmark's median batch over Structured Streaming's (the catch-up issue's target)."""


def fill_topic(broker: KafkaBroker, partitions: int, batches: int, per_batch: int) -> int:
    """The events of ``batches`` batches, spread evenly over the partitions; how many."""
    broker.create_topic(TOPIC, partitions)
    per_partition = per_batch // partitions
    for b in range(batches):
        for p in range(partitions):
            lines = event_lines(7, "kafka", b * partitions + p, per_partition, 1000)
            broker.produce(TOPIC, lines.splitlines(), partition=p)
    return batches * per_partition * partitions


def lowmark_batches(
    spark: SparkSession, broker: KafkaBroker, root: Path, per_batch: int
) -> dict[str, Any]:
    base = windowed_pipeline(f"bench_kafka_{root.name}", "unused", 1, read_ahead_batches=1)
    source = KafkaSource(
        bootstrap_servers=broker.bootstrap,
        topics=(TOPIC,),
        schema_ddl=SCHEMA,
        max_offsets_per_batch=per_batch,
    )
    runner = MicroBatchRunner(spark, base.model_copy(update={"source": source}), root)
    seconds, rows = [], 0
    while True:
        began = time.perf_counter()
        result = runner.run_batch()
        if result is None:
            break
        if result.rows_in:
            seconds.append(time.perf_counter() - began)
            rows += result.rows_in
            _say(f"  lowmark batch {result.batch_id}: {result.rows_in:,} rows, {seconds[-1]:.2f} s")
    return {"batch_s": seconds, "rows": rows}


def sss_batches(
    spark: SparkSession, broker: KafkaBroker, root: Path, per_batch: int
) -> dict[str, Any]:
    events = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_batch)
        .load()
        .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"))
        .select("e.*")
        .withWatermark("ts", OUT_OF_ORDERNESS)
    )
    progress = run_sss(events, root / "sss_checkpoint", root / "sss_out", f"kafka_{root.name}")
    seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    return {"batch_s": seconds, "rows": sum(int(p["numInputRows"]) for p in progress)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--batch-records", type=int, default=3000)
    parser.add_argument("--work-dir", type=Path, help="Where data goes (default: a temp dir).")
    args = parser.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="lowmark-bench-kafka-"))
    broker = KafkaBroker.start(work / "broker")
    try:
        events = fill_topic(broker, args.partitions, args.batches, args.batch_records)
        _say(f"[kafka] {events:,} events in {args.partitions} partitions of {TOPIC}")
        spark = get_spark()
        per_batch = args.batch_records
        for run in ("warm_up", "measured"):
            _say(f"[kafka] {run.replace('_', '-')} run of each engine")
            lowmark = lowmark_batches(spark, broker, work / "lowmark" / run, per_batch)
            sss = sss_batches(spark, broker, work / "sss" / run, per_batch)
    finally:
        broker.stop()
    for name, r in (("lowmark", lowmark), ("SSS", sss)):
        if r["rows"] != events:
            raise RuntimeError(f"{name} read {r['rows']} of {events} events")
    low, ss = lowmark["batch_s"][WARM_BATCHES:], sss["batch_s"][WARM_BATCHES:]
    ratio = statistics.median(low) / statistics.median(ss)
    print(
        "\n".join(
            [
                f"windowed pipeline over Kafka: {events:,} events, {args.partitions} partitions, "
                f"{per_batch:,} records a batch ({len(low)} batches measured per engine)",
                f"  lowmark                median {statistics.median(low):.2f} s, "
                f"p95 {_p95(low) or 0:.2f} s",
                f"  Structured Streaming   median {statistics.median(ss):.2f} s, "
                f"p95 {_p95(ss) or 0:.2f} s",
                f"  ratio lowmark / SSS (median): {ratio:.2f} (target <= {TARGET}: "
                f"{'met' if ratio <= TARGET else 'NOT met'})",
            ]
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
