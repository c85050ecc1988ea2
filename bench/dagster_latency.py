"""File-to-sink latency through a real ``dagster dev``: each run starting its own Spark, runs
sharing a Spark Connect server, and the warm runner ``lowmark ui`` starts; next to ``lowmark
run --follow``.

The Dagster path a user takes: ``lowmark ui`` over the benchmark's windowed
pipeline (``bench.streaming.bench_follow``; with ``--pipelines N``, N copies of it:
``bench.many_pipelines``), sensors every ``--sensor-interval`` seconds, a run
following the source for ``--follow-seconds`` once caught up. In each mode:

- ``per-run``: each run a process of its own starting a local Spark JVM of its own
  (``--no-runner --no-shared-spark``);
- ``shared``: each run a process of its own, a client of a Spark Connect server
  started with the UI (``--no-runner``);
- ``runner``: ``lowmark ui``'s default, one runner process executing every run on
  one Spark it starts and warms with the UI.

The same schedule: the UI starts (time until it answers); the first file lands
as soon as it answers, while no run exists (cold: the sensor tick, the run's start,
its Spark unless warm, the batch); then ``--files`` files land ``--gap`` seconds
apart while that run follows the source (warm); then, ``--restarts`` times, the
following run's window ends and a file lands while no run is following. With
``--pipelines N`` every file lands in each pipeline's folder at once and each
pipeline's latency counts. A file's latency is the commit time of the batch that
took it (checkpoint ``files`` + ``commits``) minus the time it landed. Memory: the
largest sum of the resident set sizes of every process the UI started (its groups
and their children: webserver, daemon, code server, runs, runner, JVMs), sampled
every second.

In the same run, for comparison, the same landing schedule against
``lowmark run --follow`` with no Dagster (scenario (d) of
``bench/streaming.py``; ``--no-cli`` leaves it out). Targets: following, p50 within
the sensor interval + one batch + 10 s; a file landing with no run following,
within the sensor interval + 15 s; with the runner, the first file within 10 s
beyond Spark's start, a warm file within 2 s, 20 pipelines within 4 GiB. No
assertions; prints a table and ratios.

    .venv/bin/python -m bench.dagster_latency            # about 15 minutes
    .venv/bin/python -m bench.dagster_latency --modes runner --files 3 --restarts 1
    .venv/bin/python -m bench.dagster_latency --modes runner --pipelines 20 --no-cli
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.instance.ref import InstanceRef

from bench.many_pipelines import COUNT_ENV, names
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
from lowmark.orchestration.keys import PIPELINE_TAG
from lowmark.orchestration.sensors import SENSOR_INTERVAL_S
from lowmark.orchestration.ui import DagsterDev, live_group_members
from lowmark.state.connect_server import free_port

SEED = 7


MODES = {"per-run": (False, False), "shared": (True, False), "runner": (False, True)}
"""Mode name → (a Spark Connect server the runs share, the warm runner)."""


@dataclasses.dataclass(frozen=True)
class Schedule:
    files: int
    """Files landing while a run follows (after the first one)."""
    gap_s: float
    sensor_interval_s: int
    follow_s: float
    restarts: int
    """Files landing, one at a time, after the following run's window ended."""


def dagster_latency(work: Path, schedule: Schedule, mode: str, pipelines: int) -> dict[str, Any]:
    """Land files into the pipelines ``lowmark ui`` serves (module docstring); latencies in
    seconds, memory in MiB."""
    shared, runner = MODES[mode]
    root = work / f"{mode}-{pipelines}"
    many = pipelines > 1
    folders = {
        n: (root / f"in_{i:02d}", root / "_lowmark" / n) for i, n in enumerate(names(pipelines))
    }
    if not many:
        folders = {FOLLOW_PIPELINE: (root / "in", root / "_lowmark" / FOLLOW_PIPELINE)}
    env = {
        **_env(),
        "LOWMARK_PIPELINES": "bench.many_pipelines" if many else "bench.streaming",
        COUNT_ENV: str(pipelines),
        "LOWMARK_DATA_ROOT": str(root),
        "LOWMARK_SENSOR_INTERVAL_SECONDS": str(schedule.sensor_interval_s),
        "LOWMARK_SENSORS": "running",
        "LOWMARK_FOLLOW_SECONDS": str(schedule.follow_s),
    }
    env.pop("LOWMARK_SPARK_MASTER", None)
    for incoming, _ in folders.values():
        incoming.mkdir(parents=True, exist_ok=True)  # a missing folder is a mistake to name
    log = work / f"dagster-dev-{mode}-{pipelines}.log"
    started, wall_started = time.monotonic(), time.time()
    with log.open("w") as out:
        dev = DagsterDev.start(
            work / f"dagster_home_{mode}_{pipelines}",
            free_port(),
            env=env,
            output=out,
            shared_spark=shared,
            runner=runner,
        )
    memory = Memory(dev)
    warm = WarmSeen(log) if runner else None
    landed: dict[str, float] = {}
    try:
        if not dev.wait_until_up():
            raise RuntimeError(f"dagster dev did not start; see {log}")
        ui_s = time.monotonic() - started
        memory.start()
        _say(f"[{mode}, {pipelines}] {dev.url} up in {ui_s:.1f} s")

        def drop(k: int) -> str:
            name = f"f{k:05d}.json"
            text = event_lines(SEED, "follow", k, 200, FULL.users)
            for incoming, _ in folders.values():
                land(incoming, name, text, time.time())
            landed[name] = time.time()
            _say(f"  landed {name}")
            return name

        def until(what: str, done: Callable[[], bool], timeout_s: float = 900) -> None:
            deadline = time.monotonic() + timeout_s
            while not done():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out waiting for {what}; see {log}")
                time.sleep(0.2)

        def committed() -> bool:
            return all(_all_committed(checkpoint, landed) for _, checkpoint in folders.values())

        first = drop(0)
        until("the first file", committed)
        # A followed file measures a poll and a batch only while its pipeline's run follows:
        # with many pipelines the first files may outlast the first runs' follow window.
        following = dev.runs_in_flight()
        for k in range(1, schedule.files + 1):
            time.sleep(schedule.gap_s)
            drop(k)
        until("the followed files", committed)
        unfollowed = []
        for k in range(schedule.files + 1, schedule.files + 1 + schedule.restarts):
            until("the following runs' end", lambda: dev.runs_in_flight() == 0, 900)
            time.sleep(1)
            unfollowed.append(drop(k))
            until(f"file {k}", committed)
        taken = {n: _committed_at(checkpoint) for n, (_, checkpoint) in folders.items()}
        first_runs = _first_runs(dev.home, list(folders))
        batches = [
            b
            for _, checkpoint in folders.values()
            for b in _read_delta(checkpoint / "progress", "batch_id, rows_in, durations_ms")
        ]
    finally:
        memory.stop()
        if warm is not None:
            warm.stop()
        stopped_in = dev.stop()
    followed = [n for n in landed if n != first and n not in unfollowed]

    def latencies(files: list[str]) -> list[float]:
        return sorted(t[f] - landed[f] for t in taken.values() for f in files)

    batch_s = [
        json.loads(b["durations_ms"])["total"] / 1000
        for b in batches
        if b["batch_id"] > 0 and b["rows_in"]
    ]
    # The first file's time, split (medians over the pipelines): landing to the sensor's
    # run, the run's wait to start (the queue, the hand-over, Spark's warm-up), its start to
    # the batch's commit (the run's set-up and the batch).
    split = {
        "sensor_s": [r.create_timestamp.timestamp() - landed[first] for r in first_runs.values()],
        "to_start_s": [
            (r.start_time or 0) - r.create_timestamp.timestamp() for r in first_runs.values()
        ],
        "to_commit_s": [taken[n][first] - (r.start_time or 0) for n, r in first_runs.items()],
    }
    return {
        "pipelines": pipelines,
        "ui_s": ui_s,
        "warm_s": None if warm is None or warm.at is None else warm.at - started,
        "first_landed_s": landed[first] - wall_started,
        "first_split": {k: statistics.median(v) for k, v in split.items()},
        "first_s": max(latencies([first])),
        "following_at_landing": following,
        "latency_s": latencies(followed),
        "unfollowed_s": latencies(unfollowed),
        "batch_s": batch_s,
        "stop_s": stopped_in,
        "rss_mib": memory.peak_mib,
    }


class WarmSeen:
    """When the runner said its Spark is warm (``lowmark serve``'s line in ``log``: "…
    serving HOME, Spark warm", wrapped where the terminal is narrow), as ``time.monotonic``;
    watched every 0.2 s in a thread."""

    SAID = re.compile(r"lowmark runner \(pid \d+\): serving .*?Spark\s+warm", re.DOTALL)

    def __init__(self, log: Path) -> None:
        self.log = log
        self.at: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while self.at is None and not self._done.wait(0.2):
            if self.SAID.search(self.log.read_text(errors="replace")):
                self.at = time.monotonic()


def _first_runs(home: Path, pipelines: list[str]) -> dict[str, dg.RunRecord]:
    """Each pipeline's first run (the one its sensor started for the first file)."""
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        return {
            name: instance.get_run_records(
                dg.RunsFilter(tags={PIPELINE_TAG: name}),
                order_by="create_timestamp",
                ascending=True,
                limit=1,
            )[0]
            for name in pipelines
        }


class Memory:
    """The largest sum of resident set sizes of a ``DagsterDev``'s processes (its groups, the
    shared Spark's, and every descendant), sampled every second in a thread."""

    def __init__(self, dev: DagsterDev) -> None:
        self.dev, self.peak_mib = dev, 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._done.wait(1.0):
            self.peak_mib = max(self.peak_mib, sum(map(_rss_mib, self._pids())))

    def _pids(self) -> set[int]:
        roots = set(self.dev.processes())
        if self.dev.spark is not None:
            roots |= set(live_group_members(self.dev.spark.process.pid))
        found, todo = set(), list(roots)
        while todo:
            pid = todo.pop()
            if pid in found:
                continue
            found.add(pid)
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            todo += map(int, children)
        return found


def _rss_mib(pid: int) -> float:
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 1024 / 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10, help="Files while a run follows.")
    parser.add_argument("--gap", type=float, default=5.0, help="Seconds between those files.")
    parser.add_argument(
        "--sensor-interval",
        type=int,
        default=SENSOR_INTERVAL_S,
        help="Seconds between ticks (default: lowmark's).",
    )
    parser.add_argument(
        "--follow-seconds", type=float, default=75, help="How long a run follows once caught up."
    )
    parser.add_argument(
        "--restarts", type=int, default=3, help="Files landing after a follow window ended."
    )
    parser.add_argument(
        "--modes", default="per-run,shared,runner", help="Modes to measure, comma-separated."
    )
    parser.add_argument(
        "--pipelines",
        default="1",
        help="How many pipelines the UI serves, comma-separated for several measures (e.g. "
        "1,20); every mode is measured with each.",
    )
    parser.add_argument("--no-cli", action="store_true", help="Leave out lowmark run --follow.")
    parser.add_argument("--work-dir", type=Path, help="Where the data goes (default: a temp dir).")
    args = parser.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="lowmark-dagster-latency-"))
    work.mkdir(parents=True, exist_ok=True)
    schedule = Schedule(
        args.files, args.gap, args.sensor_interval, args.follow_seconds, args.restarts
    )
    results = {
        (m, int(n)): dagster_latency(work, schedule, m, int(n))
        for n in args.pipelines.split(",")
        for m in args.modes.split(",")
    }
    cli = None
    if not args.no_cli:
        sizes = dataclasses.replace(FULL, follow_files=args.files, follow_gap_s=args.gap)
        cli = follow_latency(work, sizes, SEED)["latency_s"]
    print(report(results, cli, schedule), flush=True)


def report(
    results: dict[tuple[str, int], dict[str, Any]],
    cli_latency: list[float] | None,
    schedule: Schedule,
) -> str:
    """The table ``main`` prints: per mode and pipeline count, the UI's start, latencies,
    memory; then the targets and the ratios to per-run."""
    interval = schedule.sensor_interval_s
    lines = [
        f"file-to-sink latency through dagster dev (sensor interval {interval} s; "
        f"{schedule.files} files {schedule.gap_s:g} s apart while a run follows; "
        f"{schedule.restarts} landing after a {schedule.follow_s:g} s follow window ended)",
        f"  {'mode':<8} {'pipes':>5} {'UI up':>6} {'first file':>11} {'no run (med)':>13} "
        f"{'following p50':>14} {'p95':>6} {'batch':>6} {'stop':>6} {'RSS MiB':>8}",
    ]
    for (mode, n), r in results.items():
        unfollowed = statistics.median(r["unfollowed_s"]) if r["unfollowed_s"] else 0.0
        lines.append(
            f"  {mode:<8} {n:>5} {r['ui_s']:>5.1f}s {r['first_s']:>10.1f}s {unfollowed:>12.1f}s "
            f"{statistics.median(r['latency_s']):>13.2f}s {_p95(r['latency_s']) or 0.0:>5.2f}s "
            f"{statistics.median(r['batch_s']) if r['batch_s'] else 0.0:>5.2f}s "
            f"{r['stop_s']:>5.1f}s {r['rss_mib']:>8.0f}"
        )
    if cli_latency:
        lines.append(
            f"  lowmark run --follow, same files: p50 {statistics.median(cli_latency):.2f} s"
        )
    for (mode, n), r in results.items():
        if mode == "per-run":
            continue
        p50 = statistics.median(r["latency_s"])
        batch = statistics.median(r["batch_s"]) if r["batch_s"] else 0.0
        bound = interval + batch + 10
        lines.append(
            f"  {mode}, {n}: following p50 <= sensor interval + one batch + 10 s = {bound:.1f} s: "
            f"{p50:.2f} s ({'met' if p50 <= bound else 'NOT met'})"
        )
        if r["unfollowed_s"]:
            worst = max(r["unfollowed_s"])
            lines.append(
                f"  {mode}, {n}: no run following, every file <= sensor interval + 15 s = "
                f"{interval + 15} s: worst {worst:.1f} s "
                f"({'met' if worst <= interval + 15 else 'NOT met'})"
            )
        if r["following_at_landing"] < n:
            lines.append(
                f"  {mode}, {n}: only {r['following_at_landing']} of {n} pipelines had a run "
                "following when the followed files landed (the others' follow window had ended: "
                "their files wait for a tick and a new run); give a longer --follow-seconds"
            )
        if r["warm_s"] is not None:
            split = r["first_split"]
            when = (
                f"Spark warm {r['warm_s']:.1f} s after the UI's start, the first file landed at "
                f"{r['first_landed_s']:.1f} s"
            )
            if r["warm_s"] > r["first_landed_s"]:
                when += (
                    f", in the sink {r['first_landed_s'] + r['first_s'] - r['warm_s']:.1f} s after"
                )
            lines.append(
                f"  {mode}, {n}: {when}; first file (median over pipelines): tick "
                f"{split['sensor_s']:.1f} s + run start {split['to_start_s']:.1f} s (queue, "
                f"hand-over, warm-up) + run to commit {split['to_commit_s']:.1f} s"
            )
        if mode == "runner" and r["warm_s"] is not None:
            warm_first = r["warm_s"] is not None and r["warm_s"] <= r["first_landed_s"]
            beyond = (
                r["first_s"] if warm_first else r["first_landed_s"] + r["first_s"] - r["warm_s"]
            )
            lines.append(
                f"  runner, {n}: first file <= 10 s beyond Spark's warm start: {beyond:.1f} s "
                f"({'met' if beyond <= 10 else 'NOT met'}); warm file <= 2 s: p50 {p50:.2f} s "
                f"({'met' if p50 <= 2 else 'NOT met'})"
            )
        if mode == "runner" and n >= 20:
            lines.append(
                f"  runner, {n} pipelines within 4 GiB: {r['rss_mib']:.0f} MiB "
                f"({'met' if r['rss_mib'] <= 4096 else 'NOT met'})"
            )
        before = results.get(("per-run", n))
        if before is not None and before["unfollowed_s"] and r["unfollowed_s"]:
            unfollowed = statistics.median(r["unfollowed_s"]) / statistics.median(
                before["unfollowed_s"]
            )
            lines.append(
                f"  {mode} / per-run, {n}: first file {r['first_s'] / before['first_s']:.2f}, "
                f"no run following {unfollowed:.2f}, memory {r['rss_mib'] / before['rss_mib']:.2f}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
