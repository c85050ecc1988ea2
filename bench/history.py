"""Do a batch and a sensor tick cost the same at batch 10 and after a long history?

One windowed pipeline (1-minute tumbling windows per user, count + sum) runs
``--batches`` one-file batches, twice: with checkpoint maintenance (every 100
batches, the default) and without (``every_batches`` beyond the run). At
batch 10 and then every ``--every`` batches it takes the median batch time
since the last mark (``durations_ms["total"]``), and measures what a sensor tick
and ``lowmark status`` do, ``pipeline_status`` (driver only, no Spark job),
as the median of 5 calls, and counts the files a tick opens: live data files
and ``_delta_log`` files of the logs and of the window state.

The input folder and the file manifest do grow with history (a row and a
file per batch here): discovery lists the folder, as Structured Streaming's
file source does. Both runs have them, so the difference between the two
columns is what maintenance buys. Timings are wall-clock; run on a quiet box.

    .venv/bin/python -m bench.history                 # 1,000 batches (make bench)
    .venv/bin/python -m bench.history --batches 120 --every 40   # a smoke run
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession

from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, FileSource, Maintenance, Pipeline
from lowmark.batches.windows import Aggregate, EventTime, Tumbling, WindowedAggregation
from lowmark.state.session import SparkSettings, get_spark
from lowmark.state.table import DriverTable

T0_S = 1_767_225_600
LOGS = ("offsets", "commits", "watermarks", "progress", "state_windows")


def history_pipeline(maintained: bool) -> Pipeline:
    return Pipeline(
        name="maintained" if maintained else "unmaintained",
        source=FileSource(
            path="in",
            format="json",
            schema_ddl="user STRING, ts TIMESTAMP, amount LONG",
            max_files_per_batch=1,
        ),
        sink=DeltaSink(path="out_maintained" if maintained else "out_unmaintained"),
        event_time=EventTime(column="ts", max_out_of_orderness="1 minute"),
        aggregation=WindowedAggregation(
            keys=("user",),
            window=Tumbling(size="1 minute"),
            aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
        ),
        maintenance=Maintenance() if maintained else Maintenance(every_batches=10**9),
    )


def land(folder: Path, index: int) -> None:
    """File ``index``: 20 events, 10 s of event time, 4 users."""
    lines = [
        f'{{"user": "u{j % 4}", "ts": "{_iso(T0_S + index * 10 + j / 2)}", "amount": {j}}}\n'
        for j in range(20)
    ]
    path = folder / f"f{index:06d}.json"
    path.write_text("".join(lines))
    os.utime(path, (T0_S + index, T0_S + index))


def _iso(seconds: float) -> str:
    millis = int(seconds * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def files_opened(checkpoint: str) -> tuple[int, int]:
    """(live data files, _delta_log files) over the logs and the window state."""
    data = logs = 0
    for name in LOGS:
        path = Path(checkpoint) / name
        table = DriverTable(str(path))
        if table.exists():
            data += table.files()
            logs += sum(1 for _ in (path / "_delta_log").iterdir())
    return data, logs


def tick_ms(spark: SparkSession, pipeline: Pipeline, root: Path) -> float:
    times = []
    for _ in range(5):
        began = time.perf_counter()
        pipeline_status(spark, pipeline, root)
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.history",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--batches", type=int, default=1000, help="batches per run (default 1000)")
    parser.add_argument("--every", type=int, default=250, help="measure every this many batches")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="lowmark-bench-history-"))
    started = time.perf_counter()
    try:
        (root / "in").mkdir()
        for i in range(args.batches):
            land(root / "in", i)
        spark = get_spark(SparkSettings(app_name="lowmark-bench-history"))
        spark.sparkContext.setLogLevel("ERROR")
        marks = sorted({10, *range(args.every, args.batches + 1, args.every)})
        rows: dict[int, list[str]] = {m: [] for m in marks}
        for maintained in (True, False):
            pipeline = history_pipeline(maintained)
            runner = MicroBatchRunner(spark, pipeline, root)
            done = 0
            for mark in marks:
                results = runner.run(max_batches=mark - done)
                done += len(results)
                batch_ms = statistics.median(r.durations_ms["total"] for r in results)
                data, logs = files_opened(runner.checkpoint.location)
                ms = tick_ms(spark, pipeline, root)
                rows[mark] += [f"{batch_ms:.0f}", f"{ms:.0f}", str(data), str(logs)]
                print(
                    f"  {pipeline.name} at batch {done}: batches {batch_ms:.0f} ms (median since "
                    f"the last mark), status {ms:.0f} ms, {data} data files, {logs} log files",
                    flush=True,
                )
        spark.stop()
        print()
        print(
            "| batches | batch ms (maintained) | status ms | data files | log files "
            "| batch ms (unmaintained) | status ms | data files | log files |"
        )
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for mark in marks:
            print(f"| {mark:,} | " + " | ".join(rows[mark]) + " |")
        first, last = rows[marks[0]], rows[marks[-1]]
        for what, at in (("a batch", 0), ("status", 1)):
            print(
                f"{what} at batch {marks[-1]:,} / batch 10: maintained "
                f"{float(last[at]) / float(first[at]):.2f}x, unmaintained "
                f"{float(last[at + 4]) / float(first[at + 4]):.2f}x"
            )
        print(f"took {(time.perf_counter() - started) / 60:.1f} minutes")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
