"""The catch-up read-ahead's one job against one wide Structured Streaming trigger and a plain
Spark job, over the same files, in the same warm JVM.

``bench/streaming.py`` and ``bench/distributed.py`` run each engine in a process of its own
and time its whole catch-up. This one isolates the read-ahead's job, the piece of a catch-up
the issue's target speaks of (no more than 1.1x Structured Streaming's job over the same
files): one Spark session runs, round after round, a plain Spark batch job (read,
aggregate, write into Delta), lowmark's catch-up of the files (``bench.streaming``'s query,
10 files a batch, every batch read ahead in one job) and Structured Streaming given all
the files in one trigger (``maxFilesPerTrigger`` = every file, available-now), each into a
new table. The first rounds warm the JVM and are not reported.

Per engine and round, read from Spark's own accounting (the UI's REST API): the wall
seconds, the executors' CPU seconds of all its stages, and of its biggest stage (the scan
and partial aggregation, for every engine). CPU is what the machine's load disturbs least;
wall is what a user waits for. Printed: the median of each, and the ratios lowmark / SSS
and lowmark / plain. Each round checks lowmark's windows equal Structured Streaming's and
both the plain job's, value by value (``bench.streaming.value_differences``), and stops if
not.

    .venv/bin/python -m bench.read_ahead_job             # 500,000 events, 100 files, 6 rounds
    .venv/bin/python -m bench.read_ahead_job --quick     # a smoke run
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from bench.streaming import (
    OUT_OF_ORDERNESS,
    SCHEMA,
    _aggregate,
    _digest,
    generate,
    run_sss,
    value_differences,
    windowed_pipeline,
)
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.state.session import SparkSettings, get_spark

ENGINES = ("plain", "lowmark", "sss")


class Stages:
    """The stages of the jobs an engine ran, from the Spark UI's REST API."""

    def __init__(self, spark: SparkSession) -> None:
        sc = spark.sparkContext
        self.api = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}"

    def _get(self, what: str) -> Any:
        with urllib.request.urlopen(f"{self.api}/{what}") as response:
            return json.load(response)

    def job_ids(self) -> set[int]:
        return {int(j["jobId"]) for j in self._get("jobs")}

    def cpu_s(self, since: set[int]) -> tuple[float, float]:
        """Executors' CPU seconds of the stages of jobs not in ``since``: all, and the biggest."""
        cpus = [
            attempt["executorCpuTime"] / 1e9
            for job in self._get("jobs")
            if int(job["jobId"]) not in since
            for stage in job["stageIds"]
            for attempt in self._get(f"stages/{stage}")
            if attempt["status"] == "COMPLETE"
        ]
        return sum(cpus), max(cpus, default=0.0)


def run_round(spark: SparkSession, data: Path, work: Path, n: int) -> dict[str, Any]:
    """Each engine once over ``data``, into tables of round ``n`` under ``work``."""
    stages = Stages(spark)

    def plain() -> Path:
        out = work / f"plain{n}"
        events = spark.read.schema(SCHEMA).json(str(data))
        _aggregate(events).write.format("delta").mode("overwrite").save(str(out))
        return out

    def lowmark() -> Path:
        root = work / f"lowmark{n}"
        runner = MicroBatchRunner(spark, windowed_pipeline(f"ra{n}", str(data), 10), root)
        while runner.run_batch() is not None:
            pass
        return root / "out"

    def sss() -> Path:
        root = work / f"sss{n}"
        events = (
            spark.readStream.schema(SCHEMA)
            .option("maxFilesPerTrigger", 100_000)
            .json(str(data))
            .withWatermark("ts", OUT_OF_ORDERNESS)
        )
        run_sss(events, root / "checkpoint", root / "out", f"wide{n}")
        return root / "out"

    runs: dict[str, Callable[[], Path]] = {"plain": plain, "lowmark": lowmark, "sss": sss}
    got: dict[str, Any] = {}
    for engine in ENGINES:
        before = stages.job_ids()
        began = time.perf_counter()
        out = runs[engine]()
        wall = time.perf_counter() - began
        cpu, biggest = stages.cpu_s(before)
        got[engine] = {"wall_s": wall, "cpu_s": cpu, "scan_cpu_s": biggest, "out": out}
    return got


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500_000, help="events in all")
    parser.add_argument("--files", type=int, default=100, help="files they are in")
    parser.add_argument("--rounds", type=int, default=6, help="rounds reported")
    parser.add_argument("--warm-up", type=int, default=2, help="rounds run first, not reported")
    parser.add_argument("--quick", action="store_true", help="20,000 events, 1 + 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.files, args.rounds, args.warm_up = 20_000, 10, 2, 1
    work = Path(tempfile.mkdtemp(prefix="lowmark-read-ahead-"))
    try:
        data = work / "in"
        generate(data, 8, "catchup", args.files, args.events, 8)
        spark = get_spark(SparkSettings(app_name="lowmark-bench-read-ahead", ui=True))
        rounds = []
        for n in range(args.warm_up + args.rounds):
            got = run_round(spark, data, work, n)
            if differ := value_differences({e: _digest(spark, got[e]["out"]) for e in ENGINES}):
                raise SystemExit(f"round {n}: outputs differ: {'; '.join(differ)}")
            line = ", ".join(
                f"{e} {got[e]['wall_s']:.2f} s ({got[e]['cpu_s']:.2f} s CPU)" for e in ENGINES
            )
            reported = n >= args.warm_up
            print(f"round {n}{'' if reported else ' (warm-up)'}: {line}", flush=True)
            if reported:
                rounds.append(got)
        print(report(rounds, args.events, args.files))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(rounds: list[dict[str, Any]], events: int, files: int) -> str:
    """The medians of each measure per engine, and lowmark's ratios to the others."""

    def median(engine: str, measure: str) -> float:
        return statistics.median(r[engine][measure] for r in rounds)

    measures = {
        "wall_s": "wall s",
        "cpu_s": "executors' CPU s, all stages",
        "scan_cpu_s": "executors' CPU s, the biggest stage",
    }
    lines = [
        f"{events:,} events in {files} files, median of {len(rounds)} rounds",
        f"{'measure':40s} {'plain':>8s} {'lowmark':>8s} {'SSS':>8s} {'lm/SSS':>7s} {'lm/pl':>7s}",
    ]
    for key, what in measures.items():
        p, lm, s = (median(e, key) for e in ENGINES)
        lines.append(f"{what:40s} {p:8.2f} {lm:8.2f} {s:8.2f} {lm / s:7.2f} {lm / p:7.2f}")
    lines.append("target: lowmark's job <= 1.1x SSS's trigger (executors' CPU, all stages)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
