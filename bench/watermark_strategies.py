"""The two watermark strategies on the same out-of-order data: late records, windows
emitted, and how long after its end a window reaches the sink.

Simulated time (a fake clock; the files, checkpoints and sinks are real): every
``--step`` seconds each of ``--busy`` folders lands a file of events whose event times
trail the landing by a random delay (exponential, mean ``--mean-delay`` seconds; one
event in fifty is a straggler, minutes behind), a sparse folder lands one file every
``--sparse-every`` steps, and after ``--minutes`` of traffic the stream goes idle for as
long again. After each landing (and every step of the idle tail) the pipeline runs
until it has nothing to do. Per-minute tumbling windows of a count per user, the same
pipeline but for its watermark:

- event time: ``max_out_of_orderness`` = ``--bound``, without an idle timeout (a folder
  with nothing new is not guessed done) and with one of 2 minutes;
- ingestion time: ``max_event_time_lag`` = ``--bound``.

Measured per strategy: records late, windows in the sink at the end, and per window the
simulated seconds from its end to the batch that wrote it (median, p95, max). Checked
against a plain Spark batch over every record (``check``, raises if not): no window
written holds more records than the reference's, and the records in the windows written,
the late ones and those of the windows not written add up to every record. Simulated
time, so the numbers do not depend on the machine.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.streaming import _say
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, FileSource, Pipeline
from lowmark.batches.windows import (
    Aggregate,
    EventTime,
    IngestionWatermark,
    Tumbling,
    WindowedAggregation,
)
from lowmark.state.session import SparkSettings, get_spark

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"
T0_MS = 1_767_225_600_000  # 2026-01-01 00:00 UTC


STRATEGIES = ("event time", "event time, idle 2 min", "ingestion time")


class Clock:
    """Simulated processing time."""

    def __init__(self) -> None:
        self.now = T0_MS

    def now_ms(self) -> int:
        return self.now


@dataclass(frozen=True)
class Outcome:
    """One strategy's run."""

    late: int
    windows: int
    delays_s: list[float]
    """Per window written: seconds from its end to the batch that wrote it."""


def pipeline(strategy: str, bound: str) -> Pipeline:
    event_time = {
        "event time": EventTime(column="ts", max_out_of_orderness=bound),
        "event time, idle 2 min": EventTime(
            column="ts", max_out_of_orderness=bound, idle_timeout="2 minutes"
        ),
        "ingestion time": EventTime(
            column="ts",
            watermark=IngestionWatermark(strategy="ingestion_time", max_event_time_lag=bound),
        ),
    }[strategy]
    return Pipeline(
        name="strategies",
        source=FileSource(path="in", format="json", schema_ddl=SCHEMA, partition_by_folder=True),
        sink=DeltaSink(path="out"),
        event_time=event_time,
        aggregation=WindowedAggregation(
            keys=("user",), window=Tumbling(size="1 minute"), aggregates=(Aggregate(fn="count"),)
        ),
    )


def landings(args: argparse.Namespace) -> list[list[tuple[str, list[str]]]]:
    """Per step, the files that land: (folder, JSON lines)."""
    rng = random.Random(args.seed)
    steps = []
    for step in range(int(args.minutes * 60 / args.step)):
        now_s = (step + 1) * args.step
        files = []
        folders = [f"busy{b}" for b in range(args.busy)]
        if step % args.sparse_every == 0:
            folders.append("sparse")
        for folder in folders:
            lines = []
            for _ in range(args.events):
                delay = rng.expovariate(1 / args.mean_delay)
                if rng.random() < 0.02:
                    delay += rng.uniform(60, 300)  # a straggler
                at = T0_MS + int((now_s - min(delay, now_s)) * 1000)
                ts = datetime.fromtimestamp(at / 1000, UTC).isoformat()
                lines.append(f'{{"user": "u{rng.randrange(5)}", "ts": "{ts}", "amount": 1}}')
            files.append((folder, lines))
        steps.append(files)
    return steps


def run(spark: SparkSession, root: Path, strategy: str, args: argparse.Namespace) -> Outcome:
    clock = Clock()
    runner = MicroBatchRunner(spark, pipeline(strategy, args.bound), root, clock)
    written: dict[tuple[str, int], float] = {}
    late = 0

    def batches() -> None:
        nonlocal late
        late += sum(r.rows_late for r in runner.run(max_batches=None))
        if not (root / "out").exists():
            return
        sink = spark.read.format("delta").load(str(root / "out"))
        for row in sink.select("user", F.unix_millis("window_end").alias("end")).collect():
            written.setdefault((row.user, row.end), (clock.now - row.end) / 1000)

    steps = landings(args)
    for n, files in enumerate(steps):
        clock.now = T0_MS + (n + 1) * args.step * 1000
        for folder, lines in files:
            target = root / "in" / folder / f"f{n:05d}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("\n".join(lines) + "\n")
        batches()
    for _ in steps:  # the idle tail: nothing lands
        clock.now += args.step * 1000
        batches()
    check(spark, root, late)
    return Outcome(late, len(written), sorted(written.values()))


def check(spark: SparkSession, root: Path, late: int) -> None:
    """Against a plain Spark batch over every file: no window holds more records than the
    reference's, and written + late + not yet written = every record."""
    every = spark.read.schema(SCHEMA).json(str(root / "in" / "*" / "*.json"))
    reference = {
        (r.user, r.start): r["count"]
        for r in every.groupBy("user", F.window("ts", "1 minute").start.alias("start"))
        .count()
        .collect()
    }
    sink = spark.read.format("delta").load(str(root / "out"))
    written = {(r.user, r.window_start): r["count"] for r in sink.collect()}
    over = [w for w, n in written.items() if n > reference.get(w, 0)]
    unwritten = sum(n for w, n in reference.items() if w not in written)
    if over or sum(written.values()) + late + unwritten != sum(reference.values()):
        raise RuntimeError(
            f"{root.name}: {len(over)} windows over the reference, or {sum(written.values())} "
            f"written + {late} late + {unwritten} unwritten != {sum(reference.values())}"
        )


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    spark = get_spark(SparkSettings(master="local[2]", confs={"spark.sql.shuffle.partitions": "2"}))
    work = Path(tempfile.mkdtemp(prefix="lowmark-strategies-"))
    _say(
        f"{args.busy} busy folders + 1 sparse, a file each every {args.step} s "
        f"({args.events} events, delay mean {args.mean_delay} s, 2% stragglers), "
        f"{args.minutes} min then idle; bound {args.bound}"
    )
    total = sum(len(lines) for files in landings(args) for _, lines in files)
    rows = []
    for n, strategy in enumerate(STRATEGIES):
        out = run(spark, work / str(n), strategy, args)
        delays = out.delays_s
        p95 = delays[min(len(delays) - 1, int(0.95 * len(delays)))] if delays else float("nan")
        median = statistics.median(delays) if delays else float("nan")
        rows.append(
            f"| {strategy} | {out.late:,} of {total:,} ({out.late / total:.1%}) | {out.windows} "
            f"| {median:.0f} | {p95:.0f} | {max(delays, default=float('nan')):.0f} |"
        )
    _say("| watermark | late records | windows emitted | delay median s | p95 s | max s |")
    _say("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        _say(row)
    shutil.rmtree(work, ignore_errors=True)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parsing = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parsing.add_argument("--busy", type=int, default=2, help="busy folders")
    parsing.add_argument("--step", type=int, default=30, help="seconds between landings")
    parsing.add_argument("--events", type=int, default=40, help="events per file")
    parsing.add_argument("--mean-delay", type=float, default=5.0, help="mean event delay, s")
    parsing.add_argument("--sparse-every", type=int, default=10, help="steps between sparse files")
    parsing.add_argument("--minutes", type=float, default=10, help="minutes of traffic")
    parsing.add_argument("--bound", default="30 seconds", help="out-of-orderness / lag bound")
    parsing.add_argument("--seed", type=int, default=7)
    return parsing.parse_args(argv)


if __name__ == "__main__":
    main()
