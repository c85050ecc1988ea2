"""File-to-sink latency through a real ``dagster dev``, each run starting its own Spark and
with the Spark ``lowmark ui`` shares, next to ``lowmark run --follow``.

The Dagster path a user takes: ``lowmark ui`` over the benchmark's windowed
pipeline (``bench.streaming.bench_follow``), sensors every
``--sensor-interval`` seconds, a run following the source for
``--follow-seconds`` once caught up. In each of two modes:

- ``per-run``: each run starts a local Spark JVM of its own (what ``lowmark ui``
  did before it shared one; ``--no-shared-spark``);
- ``shared``: ``lowmark ui``'s default, a Spark Connect server started with
  the UI, which every run connects to.

the same schedule: the first file lands while no run exists (cold: the sensor
tick, the run's start, its Spark, the batch); then ``--files`` files land
``--gap`` seconds apart while that run follows the source (warm); then,
``--restarts`` times, the following run's window ends and a file lands while
no run is following (what every Materialize, backfill or end of a follow
window left before: a new run, and before the shared Spark, a new JVM). A
file's latency is the commit time of the batch that took it (checkpoint
``files`` + ``commits``) minus the time it landed.

In the same run, for comparison, the same landing schedule against
``lowmark run --follow`` with no Dagster (scenario (d) of
``bench/streaming.py``). Targets: following, p50 within the sensor interval +
one batch + 10 s; a file landing with no run following, with the shared
Spark, within the sensor interval + 15 s (a run's start costs no JVM). No
assertions; prints a table and ratios.

    .venv/bin/python -m bench.dagster_latency            # about 12 minutes
    .venv/bin/python -m bench.dagster_latency --files 5 --restarts 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.streaming import (
    FOLLOW_PIPELINE,
    FULL,
    _all_committed,
    _committed_at,
    _env,
    _p95,
    _read_delta,
    _say,
    event_lines,
    follow_latency,
    land,
)
from lowmark.orchestration.ui import DagsterDev
from lowmark.state.connect_server import free_port

SEED = 7


MODES = {"per-run": False, "shared": True}
"""Mode name → whether ``lowmark ui`` shares one Spark among its runs."""


@dataclasses.dataclass(frozen=True)
class Schedule:
    files: int
    """Files landing while a run follows (after the first one)."""
    gap_s: float
    sensor_interval_s: int
    follow_s: float
    restarts: int
    """Files landing, one at a time, after the following run's window ended."""


def dagster_latency(work: Path, schedule: Schedule, shared: bool) -> dict[str, Any]:
    """Land files into a pipeline ``lowmark ui`` serves (module docstring); latencies in
    seconds."""
    mode = "shared" if shared else "per-run"
    root = work / mode
    incoming = root / "in"
    env = {
        **_env(),
        "LOWMARK_PIPELINES": "bench.streaming",
        "LOWMARK_DATA_ROOT": str(root),
        "LOWMARK_SENSOR_INTERVAL_SECONDS": str(schedule.sensor_interval_s),
        "LOWMARK_SENSORS": "running",
        "LOWMARK_FOLLOW_SECONDS": str(schedule.follow_s),
    }
    env.pop("LOWMARK_SPARK_MASTER", None)
    checkpoint = root / "_lowmark" / FOLLOW_PIPELINE
    log = work / f"dagster-dev-{mode}.log"
    with log.open("w") as out:
        dev = DagsterDev.start(
            work / f"dagster_home_{mode}", free_port(), env=env, output=out, shared_spark=shared
        )
    landed: dict[str, float] = {}
    try:
        if not dev.wait_until_up():
            raise RuntimeError(f"dagster dev did not start; see {log}")
        _say(f"[{mode}] {dev.url} up; sensors every {schedule.sensor_interval_s} s")

        def drop(k: int) -> str:
            name = f"f{k:05d}.json"
            land(incoming, name, event_lines(SEED, "follow", k, 200, FULL.users), time.time())
            landed[name] = time.time()
            _say(f"  landed {name}")
            return name

        def until(what: str, done: Callable[[], bool], timeout_s: float = 600) -> None:
            deadline = time.monotonic() + timeout_s
            while not done():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out waiting for {what}; see {log}")
                time.sleep(0.2)

        def committed() -> bool:
            return _all_committed(checkpoint, landed)

        first = drop(0)
        until("the first file", committed)
        for k in range(1, schedule.files + 1):
            time.sleep(schedule.gap_s)
            drop(k)
        until("the followed files", committed)
        unfollowed = []
        for k in range(schedule.files + 1, schedule.files + 1 + schedule.restarts):
            until("the following run's end", lambda: dev.runs_in_flight() == 0, 900)
            time.sleep(1)
            unfollowed.append(drop(k))
            until(f"file {k}", committed)
        taken = _committed_at(checkpoint)
        batches = _read_delta(checkpoint / "progress", "batch_id, rows_in, durations_ms")
    finally:
        stopped_in = dev.stop()
    followed = [n for n in landed if n != first and n not in unfollowed]
    batch_s = [
        json.loads(b["durations_ms"])["total"] / 1000
        for b in batches
        if b["batch_id"] > 0 and b["rows_in"]
    ]
    return {
        "first_s": taken[first] - landed[first],
        "latency_s": sorted(taken[n] - landed[n] for n in followed),
        "unfollowed_s": [taken[n] - landed[n] for n in unfollowed],
        "batch_s": batch_s,
        "stop_s": stopped_in,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10, help="Files while a run follows.")
    parser.add_argument("--gap", type=float, default=5.0, help="Seconds between those files.")
    parser.add_argument("--sensor-interval", type=int, default=10, help="Seconds between ticks.")
    parser.add_argument(
        "--follow-seconds", type=float, default=75, help="How long a run follows once caught up."
    )
    parser.add_argument(
        "--restarts", type=int, default=3, help="Files landing after a follow window ended."
    )
    parser.add_argument(
        "--modes", default="per-run,shared", help="Modes to measure, comma-separated."
    )
    parser.add_argument("--work-dir", type=Path, help="Where the data goes (default: a temp dir).")
    args = parser.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="lowmark-dagster-latency-"))
    work.mkdir(parents=True, exist_ok=True)
    schedule = Schedule(
        args.files, args.gap, args.sensor_interval, args.follow_seconds, args.restarts
    )
    results = {m: dagster_latency(work, schedule, MODES[m]) for m in args.modes.split(",")}
    sizes = dataclasses.replace(FULL, follow_files=args.files, follow_gap_s=args.gap)
    cli = follow_latency(work, sizes, SEED)
    print(report(results, cli["latency_s"], schedule), flush=True)


def report(results: dict[str, dict[str, Any]], cli_latency: list[float], schedule: Schedule) -> str:
    """The table ``main`` prints: latencies per mode, the targets, and shared / per-run."""
    interval = schedule.sensor_interval_s
    lines = [
        f"file-to-sink latency through dagster dev (sensor interval {interval} s; "
        f"{schedule.files} files {schedule.gap_s:g} s apart while a run follows; "
        f"{schedule.restarts} landing after a {schedule.follow_s:g} s follow window ended)",
        f"  {'':<10} {'first file':>11} {'no run following (median)':>26} "
        f"{'following p50':>14} {'p95':>6} {'batch':>6} {'stop':>6}",
    ]
    for mode, r in results.items():
        unfollowed = statistics.median(r["unfollowed_s"]) if r["unfollowed_s"] else 0.0
        lines.append(
            f"  {mode:<10} {r['first_s']:>10.1f}s {unfollowed:>25.1f}s "
            f"{statistics.median(r['latency_s']):>13.2f}s {_p95(r['latency_s']) or 0.0:>5.2f}s "
            f"{statistics.median(r['batch_s']) if r['batch_s'] else 0.0:>5.2f}s "
            f"{r['stop_s']:>5.1f}s"
        )
    lines.append(f"  lowmark run --follow, same files: p50 {statistics.median(cli_latency):.2f} s")
    if "shared" in results:
        shared = results["shared"]
        p50 = statistics.median(shared["latency_s"])
        batch = statistics.median(shared["batch_s"]) if shared["batch_s"] else 0.0
        bound = interval + batch + 10
        lines.append(
            f"  target, following: p50 <= sensor interval + one batch + 10 s = {bound:.1f} s: "
            f"{p50:.2f} s ({'met' if p50 <= bound else 'NOT met'})"
        )
        if shared["unfollowed_s"]:
            worst = max(shared["unfollowed_s"])
            lines.append(
                f"  target, no run following: every file <= sensor interval + 15 s = "
                f"{interval + 15} s: worst {worst:.1f} s "
                f"({'met' if worst <= interval + 15 else 'NOT met'})"
            )
    if {"shared", "per-run"} <= set(results) and results["per-run"]["unfollowed_s"]:
        before, after = results["per-run"], results["shared"]
        unfollowed = statistics.median(after["unfollowed_s"]) / statistics.median(
            before["unfollowed_s"]
        )
        lines.append(
            f"  shared / per-run: first file {after['first_s'] / before['first_s']:.2f}, "
            f"no run following {unfollowed:.2f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
