"""The cost of going distributed: the windowed benchmark's small batches and catch-up in local
mode and on a Spark standalone cluster, lowmark next to Structured Streaming on each.

The query, data and engines are ``bench/streaming.py``'s scenarios (a) and (b): JSON-lines
files of ``{user, ts, amount}``, count and average per user per hour of event time, into a
Delta table; lowmark batch by batch with ``MicroBatchRunner``, Structured Streaming (SSS)
available-now with ``maxFilesPerTrigger`` = lowmark's ``max_files_per_batch``. Each engine
on each deployment runs in a child process of its own (its own driver JVM), first warmed by
an unreported catch-up over the small files.

Deployments:

- ``local``: ``local[2]``, the driver's own two cores (what every other benchmark runs);
- ``standalone``: a real standalone cluster started by this script on loopback, one master
  and two workers of one core each (``tests/spark_cluster.py``), the driver taking both
  executors; the data and tables in local folders every process sees, as a cluster's
  shared file system;
- ``connect``: a real Spark Connect server started by this script
  (``lowmark.state.connect_server``, what ``lowmark ui`` shares: ``local[2]`` here, Delta and
  a local session's confs in its own JVM), each engine's process its client (lowmark's
  catch-up then reads no batches ahead: docs/deploy.md#spark-connect).

Measured per deployment and engine: (a) the median and p95 seconds of one-file batches
(lowmark: wall time of ``run_batch``; SSS: ``triggerExecution``), (b) events/s of the
catch-up from start to caught up, with Structured Streaming run twice: taking the files of
one lowmark batch a trigger, and, like for like, the files of one lowmark read-ahead (10
batches') a trigger. Ratios: lowmark / SSS on each deployment (the same
targets as ``bench/streaming.py``), and each engine's standalone / local and connect / local
(the cost of executors in other JVMs, tasks shipped to them, results shipped back; over
Connect, every plan and result through gRPC).

Checked in the run (raises if not): every engine on every deployment writes the same
windows with the same counts. Timings are wall-clock on whatever else the machine is doing
(the cluster's daemons and both drivers share this machine's cores); run it on a quiet box.

    .venv/bin/python -m bench.distributed            # the full run (make bench)
    .venv/bin/python -m bench.distributed --quick    # a smoke run with tiny sizes
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.side_by_side import parser, report
from bench.streaming import (
    FULL,
    QUICK,
    READ_AHEAD_BATCHES,
    Measure,
    Ratio,
    Sizes,
    _div,
    _median,
    _p95,
    _say,
    generate,
    run_engine,
    run_meta,
)
from lowmark.state.connect_server import ConnectServer
from tests.spark_cluster import SparkCluster

ENGINES = ("lowmark", "sss")


def engine_scenarios(work: Path, deployment: str, engine: str, sizes: Sizes) -> dict[str, Any]:
    """The warm-up, (a) and (b) of ``engine`` on ``deployment``, as ``run_engine`` takes
    them; the data under ``work/data``, each run's tables under ``work/<deployment>``."""
    data, root = work / "data", work / deployment / engine
    small_events = sizes.small_batches * sizes.events_per_small_file
    scenarios: dict[str, Any] = {
        "warmup": {
            "input": str(data / "small"),
            "root": str(root / "warmup"),
            "files_per_batch": sizes.files_per_batch,
            "events": small_events,
        },
        "small": {
            "input": str(data / "small"),
            "root": str(root / "small"),
            "files_per_batch": 1,
            "events": small_events,
        },
        "catchup": {
            "input": str(data / "catchup"),
            "root": str(root / "catchup"),
            "files_per_batch": sizes.files_per_batch,
            "events": sizes.catchup_events,
        },
    }
    if engine == "sss":  # again, taking per trigger what lowmark reads in one read-ahead:
        # first, as warm as lowmark's one catch-up (bench/streaming.py says why)
        catchup = scenarios.pop("catchup")
        scenarios["catchup_wide"] = {
            **catchup,
            "root": str(root / "catchup_wide"),
            "files_per_batch": sizes.files_per_batch * READ_AHEAD_BATCHES,
        }
        scenarios["catchup"] = catchup
    return scenarios


def run_deployments(work: Path, sizes: Sizes, seed: int) -> dict[str, dict[str, Any]]:
    """Each engine's results (``run_engine``'s) by deployment, then engine."""
    _say(f"[data] small: {sizes.small_batches} files x {sizes.events_per_small_file} events")
    small_events = sizes.small_batches * sizes.events_per_small_file
    generate(work / "data" / "small", seed, "small", sizes.small_batches, small_events, sizes.users)
    _say(f"[data] catch-up: {sizes.catchup_events:,} events in {sizes.catchup_files} files")
    generate(
        work / "data" / "catchup",
        seed,
        "catchup",
        sizes.catchup_files,
        sizes.catchup_events,
        sizes.users,
    )
    results: dict[str, dict[str, Any]] = {"local": {}, "standalone": {}, "connect": {}}
    _say("[local] local[2]")
    for engine in ENGINES:
        scenarios = engine_scenarios(work, "local", engine, sizes)
        results["local"][engine], _ = run_engine(work, engine, scenarios, "local[2]")
    _say("[standalone] a master and two one-core workers on loopback")
    cluster = SparkCluster.start(work / "cluster")
    try:
        for engine in ENGINES:
            scenarios = engine_scenarios(work, "standalone", engine, sizes)
            results["standalone"][engine], _ = run_engine(
                work, engine, scenarios, cluster.master_url, SparkCluster.driver_confs()
            )
    finally:
        cluster.stop()
    _say("[connect] a Spark Connect server (local[2] in its own JVM), each engine its client")
    server = ConnectServer.start(work / "connect" / "server.log", cores="2")
    try:
        server.wait_until_up()
        for engine in ENGINES:
            scenarios = engine_scenarios(work, "connect", engine, sizes)
            results["connect"][engine], _ = run_engine(
                work, engine, scenarios, server.url, env=server.client_env()
            )
    finally:
        server.stop()
    _check_outputs(results)
    return results


def _check_outputs(results: dict[str, dict[str, Any]]) -> None:
    """Raise unless every engine on every deployment wrote the same windows from the same
    input (the digest of each scenario's sink: windows, the events they count, every window's
    values); Structured Streaming's like-for-like catch-up reads the catch-up's input."""
    for scenario, runs in (("small", ("small",)), ("catchup", ("catchup", "catchup_wide"))):
        digests = {
            f"{engine} ({run}) on {deployment}": by_engine[engine][run]["output"]
            for deployment, by_engine in results.items()
            for engine in ENGINES
            for run in runs
            if run in by_engine[engine]
        }
        counts = {k: f"{d['windows']} windows / {d['events']} events" for k, d in digests.items()}
        if len({json.dumps(d, sort_keys=True) for d in digests.values()}) != 1:
            raise RuntimeError(f"{scenario}: the sinks differ in some window's values: {counts}")
        _say(
            f"  {scenario}: every engine on every deployment wrote the same "
            f"{next(iter(counts.values()))}, every value equal"
        )


def build_report(
    results: dict[str, dict[str, Any]], catchup_events: int
) -> tuple[list[Measure], list[Ratio]]:
    """The measures of each deployment (a row each, lowmark and SSS its columns) and the
    ratios."""

    def small(deployment: str, engine: str) -> list[float]:
        return list(results[deployment][engine]["small"]["batch_s"])

    def rate(deployment: str, engine: str) -> float:
        return float(catchup_events / results[deployment][engine]["catchup"]["seconds"])

    def wide_rate(deployment: str) -> float:
        return float(catchup_events / results[deployment]["sss"]["catchup_wide"]["seconds"])

    measures: list[Measure] = []
    for d in results:
        measures += [
            Measure(  # the like-for-like catch-up first: the comparison a skeptic starts from
                f"b_wide_rate_{d}",
                f"(b) like-for-like catch-up, {d}: events/s (SSS one read-ahead's files a trigger)",
                rate(d, "lowmark"),
                wide_rate(d),
            ),
            Measure(
                f"a_median_{d}",
                f"(a) small batch, {d}: median s",
                _median(small(d, "lowmark")),
                _median(small(d, "sss")),
            ),
            Measure(
                f"a_p95_{d}",
                f"(a) small batch, {d}: p95 s",
                _p95(small(d, "lowmark")),
                _p95(small(d, "sss")),
            ),
            Measure(
                f"b_rate_{d}", f"(b) catch-up, {d}: events/s", rate(d, "lowmark"), rate(d, "sss")
            ),
        ]
    m = {x.key: x for x in measures}
    ratios: list[Ratio] = []
    for d in results:
        ratios += [
            Ratio(
                f"b_wide_{d}",
                f"(b) like-for-like catch-up events/s, {d}: lowmark / SSS",
                _div(m[f"b_wide_rate_{d}"].lowmark, m[f"b_wide_rate_{d}"].sss),
                ">= 1.0",
            ),
            Ratio(
                f"a_{d}",
                f"(a) small batch median, {d}: lowmark / SSS",
                _div(m[f"a_median_{d}"].lowmark, m[f"a_median_{d}"].sss),
                "<= 1.0",
            ),
            Ratio(
                f"b_{d}",
                f"(b) catch-up events/s, {d}: lowmark / SSS",
                _div(m[f"b_rate_{d}"].lowmark, m[f"b_rate_{d}"].sss),
                ">= 1.0",
            ),
        ]
    for d in (d for d in results if d != "local"):
        for engine in ENGINES:
            name = "lowmark" if engine == "lowmark" else "SSS"
            ratios += [
                Ratio(
                    f"a_cost_{d}_{engine}",
                    f"(a) small batch median, {name}: {d} / local",
                    _div(getattr(m[f"a_median_{d}"], engine), getattr(m["a_median_local"], engine)),
                    "<= 1.5",
                ),
                Ratio(
                    f"b_cost_{d}_{engine}",
                    f"(b) catch-up events/s, {name}: {d} / local",
                    _div(getattr(m[f"b_rate_{d}"], engine), getattr(m["b_rate_local"], engine)),
                    ">= 0.5",
                ),
            ]
    return measures, ratios


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    started = time.monotonic()
    sizes = QUICK if args.quick else FULL
    overrides = {"small_batches": args.small_batches, "catchup_events": args.catchup_events}
    sizes = dataclasses.replace(sizes, **{k: v for k, v in overrides.items() if v})
    meta = run_meta(sizes, started, "bench.distributed")  # load average before Spark starts
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="lowmark-bench-distributed-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        results = run_deployments(work, sizes, args.seed)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    measures, ratios = build_report(results, sizes.catchup_events)
    note = (
        "Each engine on each deployment in a driver process of its own; see the docstring "
        "of `bench/distributed.py` for what each row measures."
    )
    report(args, "bench/distributed.py", meta, started, measures, ratios, note)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parsing = parser("python -m bench.distributed", __doc__, FULL, QUICK)
    parsing.add_argument("--small-batches", type=int, help="(a) one-file batches")
    parsing.add_argument("--catchup-events", type=int, help="(b) events in all")
    return parsing.parse_args(argv)


if __name__ == "__main__":
    main()
