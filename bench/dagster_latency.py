"""File-to-sink latency through a real ``dagster dev``, next to ``lowmark run --follow``.

The Dagster path a user takes: ``lowmark ui`` over the benchmark's windowed
pipeline (``bench.streaming.bench_follow``), sensors every
``--sensor-interval`` seconds. The first file lands; the sensor launches a
run, which starts Spark, commits it and then follows the source. Then files
land one at a time ``--gap`` seconds apart. A file's latency is the commit
time of the batch that took it (checkpoint ``files`` + ``commits``) minus the
time it landed. The first file's latency (sensor tick + run start + Spark
start + batch) is reported apart from the rest.

In the same run, for comparison, the same landing schedule against
``lowmark run --follow`` with no Dagster (scenario (d) of
``bench/streaming.py``). The target (issue: fresh results): p50 within the
sensor interval + one batch + 10 s. No assertions; prints a table and ratios.

    .venv/bin/python -m bench.dagster_latency            # about 4 minutes
    .venv/bin/python -m bench.dagster_latency --files 5  # shorter
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
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
from lowmark.orchestration.ui import DagsterDev, free_port

SEED = 7


def dagster_latency(work: Path, files: int, gap_s: float, interval_s: int) -> dict[str, Any]:
    """Land ``files`` + 1 files into a pipeline ``lowmark ui`` serves; latencies in seconds."""
    root = work / "dagster"
    incoming = root / "in"
    env = {
        **_env(),
        "LOWMARK_PIPELINES": "bench.streaming",
        "LOWMARK_DATA_ROOT": str(root),
        "LOWMARK_SENSOR_INTERVAL_SECONDS": str(interval_s),
        "LOWMARK_SENSORS": "running",
        "LOWMARK_FOLLOW_SECONDS": "3600",
    }
    checkpoint = root / "_lowmark" / FOLLOW_PIPELINE
    log = work / "dagster-dev.log"
    with log.open("w") as out:
        dev = DagsterDev.start(work / "dagster_home", free_port(), env=env, output=out)
    try:
        if not dev.wait_until_up():
            raise RuntimeError(f"dagster dev did not start; see {log}")
        _say(f"[dagster] {dev.url} up; sensors every {interval_s} s")
        landed: dict[str, float] = {}

        def drop(k: int) -> None:
            name = f"f{k:05d}.json"
            land(incoming, name, event_lines(SEED, "follow", k, 200, FULL.users), time.time())
            landed[name] = time.time()
            _say(f"  landed {name}")

        def until_committed(timeout_s: float) -> None:
            deadline = time.monotonic() + timeout_s
            while not _all_committed(checkpoint, landed):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not every landed file was committed; see {log}")
                time.sleep(0.2)

        drop(0)
        until_committed(600)
        for k in range(1, files + 1):
            time.sleep(gap_s)
            drop(k)
        until_committed(600)
        taken = _committed_at(checkpoint)
        batches = _read_delta(checkpoint / "progress", "batch_id, rows_in, durations_ms")
    finally:
        stopped_in = dev.stop()
    first = taken["f00000.json"] - landed["f00000.json"]
    rest = sorted(taken[n] - at for n, at in landed.items() if n != "f00000.json")
    batch_s = [
        json.loads(b["durations_ms"])["total"] / 1000
        for b in batches
        if b["batch_id"] > 0 and b["rows_in"]
    ]
    return {"first_s": first, "latency_s": rest, "batch_s": batch_s, "stop_s": stopped_in}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20, help="Files after the first one.")
    parser.add_argument("--gap", type=float, default=5.0, help="Seconds between files.")
    parser.add_argument("--sensor-interval", type=int, default=10, help="Seconds between ticks.")
    parser.add_argument("--work-dir", type=Path, help="Where the data goes (default: a temp dir).")
    args = parser.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="lowmark-dagster-latency-"))
    work.mkdir(parents=True, exist_ok=True)
    dagster = dagster_latency(work, args.files, args.gap, args.sensor_interval)
    sizes = dataclasses.replace(FULL, follow_files=args.files, follow_gap_s=args.gap)
    cli = follow_latency(work, sizes, SEED)

    latency, cli_latency = dagster["latency_s"], cli["latency_s"]
    p50, p95 = statistics.median(latency), _p95(latency) or 0.0
    batch = statistics.median(dagster["batch_s"]) if dagster["batch_s"] else 0.0
    bound = args.sensor_interval + batch + 10
    cli_p50, cli_p95 = statistics.median(cli_latency), _p95(cli_latency) or 0.0
    lines = [
        f"file-to-sink latency, {args.files} files {args.gap:g} s apart "
        f"(sensor interval {args.sensor_interval} s)",
        f"  through dagster dev: p50 {p50:.2f} s, p95 {p95:.2f} s, max {max(latency):.2f} s; "
        f"median batch {batch:.2f} s",
        f"  first file (sensor tick + run + Spark start + batch): {dagster['first_s']:.1f} s",
        f"  lowmark run --follow, same files: p50 {cli_p50:.2f} s, p95 {cli_p95:.2f} s",
        f"  target: p50 <= sensor interval + one batch + 10 s = {bound:.1f} s: "
        f"ratio {p50 / bound:.2f} ({'met' if p50 <= bound else 'NOT met'})",
        f"  Dagster's cost over the CLI at p50: {p50 - cli_p50:+.2f} s",
        f"  lowmark ui stopped (webserver, daemon, code server, run, Spark) in "
        f"{dagster['stop_s']:.1f} s",
    ]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
