"""Catch-up of a stream with late rows, one file a batch, against one plain Spark batch job.

The shape of real out-of-order data: every file moves event time forward by 10
minutes with its events up to 60 minutes out of order (the pipeline's maximum
out-of-orderness), and about a third of the files also hold a few stragglers
from two to three hours back, which the watermark has passed: late rows,
scattered over the batches. The query is ``bench.streaming``'s (per user,
1-hour tumbling windows, ``count`` and ``avg(amount)``, append mode, into
Delta).

In one process, one Spark session, after the same warm-up for each (one run
over a smaller set of files): ``lowmark`` catches up one file a batch, reading
ahead in one job as far as the pipeline's default allows; ``lowmark (no read-ahead)``
runs each batch's own job, as files arriving one at a time do; the plain job aggregates every
file at once (it has no watermark: it also counts the stragglers). Printed:
seconds of each, the ratio lowmark / plain, the batches with late rows, and
whether both lowmark runs wrote the same sink and late rows (they must), and
the plain job's windows, less the late rows lowmark set aside, equal
lowmark's.

Usage: ``python -m bench.late_catch_up [--files 40] [--events 40000] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.streaming import READ_AHEAD_BATCHES, SCHEMA, T0_S, _aggregate, land, windowed_pipeline
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.state.session import SparkSettings, get_spark

FILE_SPAN_S = 600
DISORDER_S = 3600
STRAGGLER_S = (7200, 10800)
"""How far back a straggler is: past the 60-minute watermark of the files before it."""


def _line(rng: random.Random, t: float, users: int) -> str:
    ts = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    amount = rng.randint(100, 10_000) / 100
    return f'{{"user": "u{rng.randrange(users)}", "ts": "{ts}", "amount": {amount}}}\n'


def generate(folder: Path, seed: int, files: int, events: int, users: int = 20) -> None:
    """``files`` files of ``events`` events in all; a third of them with 1-3 stragglers."""
    first_mtime = time.time() - 3600
    for i in range(files):
        rng = random.Random(f"{seed}/{i}")
        base = T0_S + i * FILE_SPAN_S
        times = [
            base + rng.random() * FILE_SPAN_S - rng.random() * DISORDER_S
            for _ in range(events // files)
        ]
        if i >= 3 and rng.random() < 1 / 3:
            times += [base - rng.uniform(*STRAGGLER_S) for _ in range(rng.randint(1, 3))]
        land(
            folder, f"f{i:05d}.json", "".join(_line(rng, t, users) for t in times), first_mtime + i
        )


def lowmark(spark: SparkSession, root: Path, read_ahead: int) -> tuple[float, int, int]:
    """Seconds to catch up over ``root/in``, one file a batch; batches, and those with late
    rows."""
    pipeline = windowed_pipeline(f"late_catch_up_{read_ahead}", "in", 1, read_ahead)
    runner = MicroBatchRunner(spark, pipeline, root)
    started = time.perf_counter()
    results = runner.run(max_batches=None)
    seconds = time.perf_counter() - started
    return seconds, len(results), sum(1 for r in results if r.rows_late)


def plain(spark: SparkSession, root: Path) -> float:
    """Seconds of one Spark job over every file of ``root/in`` into Delta ``root/plain``."""
    started = time.perf_counter()
    events = spark.read.schema(SCHEMA).json(str(root / "in"))
    _aggregate(events).write.format("delta").mode("overwrite").save(str(root / "plain"))
    return time.perf_counter() - started


def _windows(df: DataFrame) -> set[tuple[object, ...]]:
    """Each window's (user, start, count, avg rounded to 9 digits: summed in another order)."""
    rows = df.select("user", "window_start", "count", F.round("avg_amount", 9)).collect()
    return {tuple(r) for r in rows}


def check(spark: SparkSession, pipeline_of: dict[Path, str], ahead: Path, alone: Path) -> str:
    """Whether both lowmark runs wrote the same windows and late rows, and each window they
    wrote equals the plain job's over every record less the late ones (an open window is
    not written yet)."""
    delta = spark.read.format("delta")

    def late(root: Path) -> DataFrame:
        location = windowed_pipeline(pipeline_of[root], "in", 1).checkpoint_location(root)
        return delta.load(f"{location}/late")

    ahead_out, alone_out = (_windows(delta.load(str(r / "out"))) for r in (ahead, alone))
    late_rows = {tuple(r) for r in late(ahead).select("event_time", "record").collect()}
    alone_late = {tuple(r) for r in late(alone).select("event_time", "record").collect()}
    set_aside = spark.read.schema(SCHEMA).json(late(ahead).select("record").rdd.map(lambda r: r[0]))
    kept = spark.read.schema(SCHEMA).json(str(ahead / "in")).exceptAll(set_aside)
    reference = _windows(_aggregate(kept))
    problems = [
        "the runs' windows differ" if ahead_out != alone_out else "",
        "the runs' late rows differ" if late_rows != alone_late else "",
        "a window differs from the plain job's" if not ahead_out <= reference else "",
    ]
    found = "; ".join(p for p in problems if p)
    return (
        f"outputs: {found}"
        if found
        else (
            f"outputs equal: {len(ahead_out)} windows, {len(late_rows)} late rows, each window "
            "as the plain job's over the records less the late ones"
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=40, help="files, one batch each")
    parser.add_argument("--events", type=int, default=40_000, help="events in all")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    spark = get_spark(SparkSettings(app_name="lowmark-bench-late-catch-up"))
    work = Path(tempfile.mkdtemp(prefix="lowmark-late-catch-up-"))
    try:
        warm = work / "warm"
        generate(warm / "in", args.seed + 1, 12, 3_000)
        lowmark(spark, warm, READ_AHEAD_BATCHES)
        plain(spark, warm)
        ahead, alone = work / "ahead", work / "alone"
        generate(ahead / "in", args.seed, args.files, args.events)
        shutil.copytree(ahead / "in", alone / "in")
        plain_s = plain(spark, ahead)
        ahead_s, batches, late_batches = lowmark(spark, ahead, READ_AHEAD_BATCHES)
        alone_s, _, _ = lowmark(spark, alone, 1)
        names = {ahead: f"late_catch_up_{READ_AHEAD_BATCHES}", alone: "late_catch_up_1"}
        print(
            f"files {args.files}, events {args.events}, batches {batches}, "
            f"with late rows {late_batches}"
        )
        print(f"plain Spark batch job        {plain_s:7.2f} s")
        print(f"lowmark catch-up, read-ahead {ahead_s:7.2f} s   {ahead_s / plain_s:.2f}x plain")
        print(f"lowmark, no read-ahead       {alone_s:7.2f} s   {alone_s / plain_s:.2f}x plain")
        print(check(spark, names, ahead, alone))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
