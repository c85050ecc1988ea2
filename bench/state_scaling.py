"""Does a batch's cost follow the windows it touches, or total state?

For each state size N, a windowed pipeline (tumbling one-minute windows per
user, count + sum) is filled with N open windows through the engine, in
``--populate-batches`` batches of Parquet files that advance in event time
as a stream would; ``allowed_lateness`` is ten years, so every window stays
open. Then ``--repeat`` small batches each update ``--touch`` windows of the
newest minute (``--spread``: of as many minutes back from the newest, one
window start each), and their wall time is what is measured.

Spark Structured Streaming runs the same aggregation over the same files in
the same Spark session, as the peer: a file source with
``maxFilesPerTrigger=1``, ``withWatermark`` of ten years, append mode, the
``noop`` sink, the RocksDB state store with changelog checkpointing, kept
running (``processAllAvailable``) so its time is the small batch's
``triggerExecution``, not query start-up. It reads a folder of its own, into
which each file is linked only once lowmark's batch took it: its trigger runs
after lowmark's batch, never during it.

Then lowmark's checkpoint maintenance runs (``lowmark compact``: among
others, OPTIMIZE of the state table, which leaves few large files) and
``--repeat`` more small batches are timed, by both engines: a state layout
whose MERGE rewrites every row of a compacted file would show here (each
small batch's line prints the state step's time and the rows its MERGE
copied unchanged).

Printed: per size the median small-batch time of each engine before and
after maintenance, then the ratios N_max / N_min per engine and lowmark /
SSS per size. Both engines run in one process, one small batch after the
other, so whatever else the machine does slows both. Timings are
wall-clock; run it on a quiet box.

    .venv/bin/python -m bench.state_scaling            # 10 000 and 1 000 000 windows (make bench)
    .venv/bin/python -m bench.state_scaling --quick    # 2 000 and 50 000
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from deltalake import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from lowmark.batches.loop.maintenance import maintain_checkpoint
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, FileSource, Pipeline
from lowmark.batches.windows import Aggregate, EventTime, Tumbling, WindowedAggregation
from lowmark.state.session import SparkSettings, get_spark

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"
T0_S = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp())
LATENESS = "3650 days"
SSS_CONFS = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


@dataclass(frozen=True)
class Medians:
    """Median small-batch seconds of each engine, before and after lowmark's maintenance."""

    lowmark: float
    sss: float | None
    lowmark_maintained: float
    sss_maintained: float | None


@dataclass(frozen=True)
class Shape:
    """How N open windows are laid out: ``users`` keys x ``minutes`` one-minute windows."""

    windows: int
    users: int

    @property
    def minutes(self) -> int:
        return max(1, self.windows // self.users)


def main() -> None:
    args = _parse_args()
    sizes = [2_000, 50_000] if args.quick else args.sizes
    spark = get_spark(SparkSettings(app_name="lowmark-bench", confs=SSS_CONFS))
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="lowmark-bench-"))
    results: dict[int, Medians] = {}
    try:
        for n in sizes:
            shape = Shape(n, min(args.users, n))
            results[n] = _run_size(spark, work / f"n{n}", shape, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    _report(results, args.touch)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Prints median small-batch times and the ratios; no assertions.",
    )
    parser.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[10_000, 1_000_000],
        help="open windows per run, comma-separated (default: 10000,1000000)",
    )
    parser.add_argument("--quick", action="store_true", help="sizes 2000,50000 (a smoke run)")
    parser.add_argument("--users", type=int, default=1_000, help="keys (default: 1000)")
    parser.add_argument(
        "--populate-batches", type=int, default=10, help="batches that fill state (default: 10)"
    )
    parser.add_argument(
        "--touch", type=int, default=100, help="windows each small batch updates (default: 100)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="small batches timed (default: 3)")
    parser.add_argument(
        "--spread",
        action="store_true",
        help="each small batch touches windows of --touch window starts, not of one",
    )
    parser.add_argument("--skip-sss", action="store_true", help="lowmark only")
    parser.add_argument("--work-dir", help="where data goes (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    return parser.parse_args()


def _run_size(spark: SparkSession, root: Path, shape: Shape, args: argparse.Namespace) -> Medians:
    """Median small-batch seconds of lowmark and SSS with ``shape.windows`` open windows,
    before and after lowmark's checkpoint maintenance."""
    _say(f"[{shape.windows:,} windows] {shape.users} users x {shape.minutes} minutes")
    incoming = root / "in"
    slices = _split(shape.minutes, args.populate_batches)
    for i, (first, last) in enumerate(slices):
        _write_file(spark, root, incoming, f"fill{i:04d}", _fill(spark, shape, first, last))
    runner = MicroBatchRunner(spark, _pipeline(), root)
    started = time.monotonic()
    runner.run(
        max_batches=None,
        on_batch=lambda b: _say(
            f"  lowmark fill batch {b.batch_id}: {b.rows_in:,} rows, "
            f"{b.durations_ms['total'] / 1000:.1f} s"
        ),
    )
    _say(f"  lowmark state filled in {time.monotonic() - started:.0f} s")
    query = None if args.skip_sss else _start_sss(spark, root, _hand_to_sss(root, incoming))
    try:
        if query is not None:
            started = time.monotonic()
            query.processAllAvailable()
            _say(f"  SSS state filled in {time.monotonic() - started:.0f} s")
        before = _small_batches(spark, root, runner, query, shape, args, range(args.repeat))
        started = time.monotonic()
        maintain_checkpoint(spark, _pipeline(), root)
        _say(f"  lowmark maintenance (lowmark compact) in {time.monotonic() - started:.1f} s")
        after = _small_batches(
            spark, root, runner, query, shape, args, range(args.repeat, 2 * args.repeat)
        )
    finally:
        if query is not None:
            query.stop()
    return Medians(before[0], before[1], after[0], after[1])


def _small_batches(
    spark: SparkSession,
    root: Path,
    runner: MicroBatchRunner,
    query: StreamingQuery | None,
    shape: Shape,
    args: argparse.Namespace,
    numbers: range,
) -> tuple[float, float | None]:
    """Small batches ``numbers``, each taken by lowmark then SSS; their median seconds."""
    lowmark_s: list[float] = []
    sss_s: list[float] = []
    assert runner.stage is not None
    state = runner.stage.state.path
    for r in numbers:
        minute = shape.minutes - 1 - r % shape.minutes
        name = f"touch{r:04d}"
        touched = _touch(spark, shape, minute, args.touch, args.spread)
        _write_file(spark, root, root / "in", name, touched)
        started = time.monotonic()
        result = runner.run_batch()
        lowmark_s.append(time.monotonic() - started)
        if result is None or result.rows_in != args.touch:
            raise RuntimeError(f"small batch {r} did not read {args.touch} rows: {result}")
        metrics = DeltaTable(state).history(1)[0].get("operationMetrics", {})
        line = (
            f"  small batch {r}: lowmark {lowmark_s[-1]:.2f} s (state "
            f"{result.durations_ms['state']} ms, "
            f"{int(metrics.get('num_target_rows_copied', 0)):,} state rows copied) "
            f"{result.durations_ms}"
        )
        if query is not None:
            _hand_to_sss(root, root / "in")
            sss_s.append(_sss_batch_seconds(query, args.touch))
            line += f"; SSS {sss_s[-1]:.2f} s"
        _say(line)
    return statistics.median(lowmark_s), statistics.median(sss_s) if sss_s else None


def _pipeline() -> Pipeline:
    return Pipeline(
        name="state_scaling",
        source=FileSource(path="in", format="parquet", schema_ddl=SCHEMA, max_files_per_batch=1),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts", allowed_lateness=LATENESS),
        aggregation=WindowedAggregation(
            keys=("user",),
            window=Tumbling(size="1 minute"),
            aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
            output_mode="append",
        ),
    )


def _split(minutes: int, batches: int) -> list[tuple[int, int]]:
    """``batches`` consecutive [first, last) minute ranges covering ``minutes``."""
    batches = max(1, min(batches, minutes))
    bounds = [minutes * i // batches for i in range(batches + 1)]
    return list(itertools.pairwise(bounds))


def _fill(spark: SparkSession, shape: Shape, first: int, last: int) -> DataFrame:
    """One event per (user, minute) for minutes [first, last): one new window each."""
    cells = spark.range(first * shape.users, last * shape.users)
    return _events(cells, shape, F.col("id") % shape.users, F.col("id") / shape.users)


def _touch(spark: SparkSession, shape: Shape, minute: int, touch: int, spread: bool) -> DataFrame:
    """One event for each of ``touch`` users in ``minute``: updates that many open windows,
    of one window start; ``spread``: user i's event in the i-th minute before ``minute``
    instead, ``touch`` windows of as many starts (as late data over a day would)."""
    users = spark.range(min(touch, shape.users))
    if not spread:
        return _events(users, shape, F.col("id"), F.lit(minute))
    return _events(users, shape, F.col("id"), F.lit(minute) - F.col("id") % shape.minutes)


def _events(ids: DataFrame, shape: Shape, user: Column, minute: Column) -> DataFrame:
    seconds = F.lit(T0_S) + F.floor(minute) * 60 + F.lit(30)
    return ids.select(
        F.format_string("u%05d", user).alias("user"),
        F.timestamp_seconds(seconds).alias("ts"),
        F.lit(1).cast("long").alias("amount"),
    )


def _write_file(spark: SparkSession, root: Path, folder: Path, name: str, df: DataFrame) -> None:
    """Write ``df`` as one Parquet file ``folder/name.parquet`` (sources list files, not dirs)."""
    staging = root / "staging" / name
    df.coalesce(1).write.mode("overwrite").parquet(str(staging))
    part = next(staging.glob("part-*.parquet"))
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}.parquet"
    shutil.move(str(part), target)
    # Both engines take files in modification-time order; make it the write order.
    stamp = time.time()
    os.utime(target, (stamp, stamp))
    shutil.rmtree(staging)


def _hand_to_sss(root: Path, incoming: Path) -> Path:
    """SSS's input folder, with every file of lowmark's ``incoming`` linked into it that it
    lacks (same name and modification time). SSS reads only its own folder, so a file
    reaches it when lowmark's batch is done with it: its trigger never runs during
    lowmark's batch."""
    folder = root / "in_sss"
    folder.mkdir(exist_ok=True)
    for source in sorted(incoming.glob("*.parquet"), key=lambda p: p.stat().st_mtime):
        target = folder / source.name
        if not target.exists():
            os.link(source, target)
    return folder


def _start_sss(spark: SparkSession, root: Path, incoming: Path) -> StreamingQuery:
    events = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(incoming))
        .withWatermark("ts", LATENESS)
    )
    counts = events.groupBy("user", F.window("ts", "1 minute")).agg(
        F.count(F.lit(1)).alias("count"), F.sum("amount").alias("sum_amount")
    )
    return (
        counts.writeStream.format("noop")
        .outputMode("append")
        .option("checkpointLocation", str(root / "sss_checkpoint"))
        .start()
    )


def _sss_batch_seconds(query: StreamingQuery, rows: int) -> float:
    """Process the new file; seconds of the batch that read it (not the no-data one after)."""
    query.processAllAvailable()
    for progress in reversed(query.recentProgress):
        if progress["numInputRows"] == rows:
            return float(progress["durationMs"]["triggerExecution"]) / 1000
    raise RuntimeError(f"no SSS batch read {rows} rows: {query.recentProgress[-3:]}")


def _report(results: dict[int, Medians], touch: int) -> None:
    sizes = sorted(results)
    _say(f"\nsmall batch ({touch} windows touched), median seconds:")
    _say(
        f"{'open windows':>14} {'lowmark':>9} {'SSS':>9} {'lowmark/SSS':>12}"
        f" {'lowmark after maintenance':>26} {'SSS':>9} {'lowmark/SSS':>12}"
    )
    for n in sizes:
        m = results[n]
        _say(
            f"{n:>14,} {m.lowmark:>9.2f} {_text(m.sss):>9} {_text(_ratio(m.lowmark, m.sss)):>12}"
            f" {m.lowmark_maintained:>26.2f} {_text(m.sss_maintained):>9}"
            f" {_text(_ratio(m.lowmark_maintained, m.sss_maintained)):>12}"
        )
    if len(sizes) > 1:
        small, large = results[sizes[0]], results[sizes[-1]]
        label = f"{sizes[-1]:,}/{sizes[0]:,}"
        _say(f"lowmark {label}: {large.lowmark / small.lowmark:.2f}x")
        _say(
            f"lowmark after maintenance {label}: "
            f"{large.lowmark_maintained / small.lowmark_maintained:.2f}x"
        )
        if small.sss and large.sss:
            _say(f"SSS     {label}: {large.sss / small.sss:.2f}x")


def _ratio(a: float, b: float | None) -> float | None:
    return a / b if b else None


def _text(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "-"


def _say(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    main()
