"""What the benchmarks that run lowmark and Structured Streaming in one process share
(``bench/dedup.py``, ``bench/keyed_state.py``): the command line, the Spark session, each
engine's run over a folder of files, and the printed and markdown report.

Both engines run in this one process's Spark session, one after the other: lowmark batch by
batch with ``MicroBatchRunner``, Structured Streaming (SSS) available-now with
``maxFilesPerTrigger`` = lowmark's ``max_files_per_batch``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pyspark.sql import DataFrame, SparkSession

from bench.streaming import (
    Measure,
    Ratio,
    _say,
    lowmark_over_sss,
    markdown_header,
    markdown_tables,
    run_meta,
    run_sss,
    small_batch_measures,
    text_report,
)
from lowmark.batches.loop.microbatch import BatchResult, MicroBatchRunner
from lowmark.batches.pipeline import Pipeline
from lowmark.state.session import SparkSettings, get_spark


@dataclass(frozen=True)
class Run:
    """One engine over one dataset: seconds of each batch that read input, and in all."""

    batch_s: list[float]
    seconds: float
    idle_s: list[float] = field(default_factory=list)
    """Seconds of each batch that read no input (a keyed step's timers only), where the
    engine reports them apart."""


D = TypeVar("D")
Engine = Callable[[SparkSession, D, Path, str, int], Run]
"""One engine's run over a dataset: (spark, data, root, scenario name, files per batch);
its sink is ``root/out``."""


def scenarios(
    spark: SparkSession,
    work: Path,
    sets: dict[str, D],
    files_per_batch: int,
    engines: dict[str, Engine[D]],
    check: Callable[[SparkSession, str, D, dict[str, Path]], None],
) -> tuple[dict[str, Run], dict[str, Run]]:
    """The warm-up (unreported), (a) small batches of one file and (b) the catch-up of
    ``files_per_batch`` files a batch, over ``sets``' datasets of those names: each engine
    in turn (under ``work/<engine>/<scenario>``), then ``check`` over their sinks. (a)'s and
    (b)'s runs by engine."""

    def scenario(name: str, per_batch: int) -> dict[str, Run]:
        runs = {
            engine: run(spark, sets[name], work / engine / name, name, per_batch)
            for engine, run in engines.items()
        }
        check(spark, name, sets[name], {e: work / e / name / "out" for e in runs})
        return runs

    _say("[warm-up] unreported, each engine alike")
    scenario("warmup", 1)
    _say("[a] small batches: one file per batch")
    small = scenario("small", 1)
    _say(f"[b] catch-up: {files_per_batch} files per batch")
    return small, scenario("catchup", files_per_batch)


def main_of_two_scenarios(
    args: argparse.Namespace,
    sizes: Any,
    module: str,
    datasets: Callable[[Path], dict[str, D]],
    describe: Callable[[D], str],
    engines: dict[str, Engine[D]],
    check: Callable[[SparkSession, str, D, dict[str, Path]], None],
    events: Callable[[D], int],
) -> None:
    """The run of a benchmark of (a) and (b) alone (``bench.dedup``, ``bench.stream_join``):
    the datasets made (``datasets``, under the work folder; each described by ``describe``),
    ``scenarios`` over them, and ``small_and_catchup``'s report (catch-up target ``>= 1.0``,
    over ``events`` of the catch-up dataset). ``sizes`` (a dataclass with
    ``files_per_batch``) go into the report's header."""
    started = time.monotonic()
    meta = run_meta(sizes, started, module)  # load average before Spark starts
    name = module.replace(".", "-").replace("_", "-")
    spark = session(f"lowmark-{name}")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix=f"lowmark-{name}-"))
    try:
        sets = datasets(work / "data")
        for kind, data in sets.items():
            _say(f"[data] {kind}: {describe(data)}")
        small, catchup = scenarios(spark, work, sets, sizes.files_per_batch, engines, check)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    measures, ratios = small_and_catchup(small, catchup, events(sets["catchup"]), ">= 1.0")
    script = f"bench/{module.removeprefix('bench.')}.py"
    note = (
        "Both engines in one process, one after the other; see the docstring of "
        f"`{script}` for what each row measures."
    )
    report(args, script, meta, started, measures, ratios, note)


def parser(prog: str, doc: str | None, full: object, quick: object) -> argparse.ArgumentParser:
    """The options every such benchmark has (``--quick``, ``--seed``, ``--results``,
    ``--work-dir``, ``--keep``); the caller adds its own."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Full sizes: {full}.\nQuick sizes: {quick}.",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--seed", type=int, default=8, help="data generator seed (default: 8)")
    parser.add_argument("--results", help="also write the tables as markdown here")
    parser.add_argument("--work-dir", help="where data and checkpoints go (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    return parser


def session(app_name: str, confs: dict[str, str] | None = None) -> SparkSession:
    """The one Spark session both engines run in, keeping every batch's progress."""
    confs = {"spark.sql.streaming.numRecentProgressUpdates": "10000", **(confs or {})}
    spark = get_spark(SparkSettings(app_name=app_name, confs=confs))
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def lowmark_batches(
    spark: SparkSession, pipeline: Pipeline, root: Path, name: str
) -> tuple[list[BatchResult], list[float]]:
    """``pipeline`` under ``root``, batch by batch until caught up (batches without input
    included); each batch's result and wall seconds, each printed."""
    results: list[BatchResult] = []
    seconds: list[float] = []
    with MicroBatchRunner(spark, pipeline, root) as runner:
        while True:
            began = time.perf_counter()
            result = runner.run_batch()
            if result is None:
                return results, seconds
            results.append(result)
            seconds.append(time.perf_counter() - began)
            _say(
                f"  lowmark {name} batch {result.batch_id}: {result.rows_in:,} rows in, "
                f"{result.rows_out:,} rows out, {result.rows_duplicate or 0:,} duplicates, "
                f"{seconds[-1]:.2f} s {result.durations_ms}"
            )


def sss_over_files(
    spark: SparkSession,
    schema: str,
    delay: str,
    source: Path,
    root: Path,
    name: str,
    files_per_batch: int,
    shape: Callable[[DataFrame], DataFrame],
    events: int,
) -> Run:
    """``shape`` over ``source``'s JSON files with a watermark ``delay`` behind, in SSS
    (available-now, ``files_per_batch`` files a batch) into the Delta table ``root/out``.
    Raises unless it read ``events`` rows."""
    started = time.perf_counter()
    stream = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", files_per_batch)
        .json(str(source))
        .withWatermark("ts", delay)
    )
    progress = run_sss(stream, root / "checkpoint", root / "out", name, shape=shape)
    total = time.perf_counter() - started
    rows_in = sum(int(p["numInputRows"]) for p in progress)
    if rows_in != events:
        raise RuntimeError(f"SSS {name}: read {rows_in} of {events} events")
    return Run([p["durationMs"]["triggerExecution"] / 1000 for p in progress], total)


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as an ISO-8601 UTC time to the millisecond, as the input files
    hold event times."""
    return datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S") + (
        f".{ms % 1000:03d}Z"
    )


SMALL_TARGET = "<= 0.7"
"""A stateful small batch (deduplication, keyed state, a stream-stream join) against its
Structured Streaming peer's: the catch-up issue's target."""


def small_and_catchup(
    small: dict[str, Run], catchup: dict[str, Run], catchup_events: int, catchup_target: str
) -> tuple[list[Measure], list[Ratio]]:
    """(a)'s small-batch median and p95 and (b)'s catch-up events/s and wall seconds of each
    engine, and the ratios lowmark / SSS: (a)'s median against ``SMALL_TARGET``, (b)'s
    events/s against ``catchup_target``."""

    def rate(engine: str) -> float:
        return catchup_events / catchup[engine].seconds

    measures = [
        *small_batch_measures(small["lowmark"].batch_s, small["sss"].batch_s),
        Measure("b_rate", "(b) catch-up: events/s", rate("lowmark"), rate("sss")),
        Measure(
            "b_seconds", "(b) catch-up: wall s", catchup["lowmark"].seconds, catchup["sss"].seconds
        ),
    ]
    m = {x.key: x for x in measures}
    ratios = [
        lowmark_over_sss("a", "(a) small batch median", m["a_median"], SMALL_TARGET),
        lowmark_over_sss("b", "(b) catch-up events/s", m["b_rate"], catchup_target),
    ]
    return measures, ratios


def report(
    args: argparse.Namespace,
    script: str,
    meta: dict[str, Any],
    started: float,
    measures: list[Measure],
    ratios: list[Ratio],
    note: str,
) -> None:
    """Print the tables; with ``--results``, write them as markdown after ``meta``
    (``run_meta``) and ``note``; then the minutes since ``started`` (monotonic)."""
    _say("")
    _say(text_report(measures, ratios, plain=False))
    if args.results:
        meta["took_s"] = time.monotonic() - started
        lines = [
            *markdown_header(script, meta),
            note,
            "",
            *markdown_tables(measures, ratios, plain=False),
        ]
        Path(args.results).write_text("\n".join(lines) + "\n")
        _say(f"\nwrote {args.results}")
    _say(f"took {(time.monotonic() - started) / 60:.1f} minutes")
