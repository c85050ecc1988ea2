"""lowmark vs Spark Structured Streaming vs a plain Spark batch job, on the same data.

One windowed query, three engines. The data is generated once from a seed:
JSON-lines files of events ``{user, ts, amount}`` (ISO UTC times), each file
moving event time forward by 10 minutes with events up to 60 minutes out of
order, a few users. The query: per user, 1-hour tumbling windows of event
time, ``count`` and ``avg(amount)``, 60 minutes of maximum out-of-orderness,
append mode (a window is written once, when final), into a Delta table.

- lowmark: ``MicroBatchRunner`` over a windowed pipeline.
- Structured Streaming (SSS): ``withWatermark("ts", "60 minutes")``,
  ``groupBy(user, window(ts, "1 hour"))``, append mode, Delta sink with a
  checkpoint location, ``maxFilesPerTrigger`` = the same files per batch,
  ``trigger(availableNow=True)``, default (HDFS-backed) state store.
- plain batch: one Spark job over every file, same aggregation, written to
  Delta: the reference for catch-up throughput.

Every engine is warmed the same way: before what it reports, it runs once
over (a)'s files (unreported) — lowmark and Structured Streaming each as a
catch-up of several files per batch, the plain job as its one job — so each
starts (a) and (b) in a JVM that has run that code once: equally warm.

Scenarios:
(a) small batches: one-file batches (200 events each); seconds per batch,
    median and p95 (lowmark: wall time of ``run_batch``, with no read-ahead, so
    each batch pays its own job as when files arrive one at a time; SSS: each
    batch's ``durationMs.triggerExecution``); batches that read no input are left out.
(b) catch-up: many events in many files, several files per batch; events/s
    from "start the stream" to "caught up" (lowmark, reading up to 10 batches
    ahead in one job, and SSS), and of the plain job. SSS also runs it with
    ``maxFilesPerTrigger`` = the files lowmark reads in one read-ahead (10
    batches' files): the like-for-like catch-up, as a user would tune it.
(c) state scaling: ``bench/state_scaling.py`` (small-batch time with a large
    vs a small window state, before and after lowmark's checkpoint
    maintenance), run here or read from ``--state-scaling-log``.
(d) file-to-sink latency: ``lowmark run --follow`` in a subprocess while files
    land one at a time a few seconds apart; latency = ``created_at`` of the
    commit of the batch that took the file (checkpoint ``files`` manifest +
    ``commits``, read with ``deltalake``) minus the time the file landed.
(e) peak memory: each engine runs in its own subprocess; the peak of the RSS
    summed over that process and its children (the Spark JVM), polled from /proc.

Only one Spark process runs at a time: this process never starts Spark. It
prints a table and the ratios against their targets, and writes them to
``bench/RESULTS.md`` (full run) or ``--results``. Timings are wall-clock on
whatever else the machine is doing; run it on a quiet box. No assertions.

    .venv/bin/python -m bench.streaming            # the full run (make bench), tens of minutes
    .venv/bin/python -m bench.streaming --quick    # a smoke run with tiny sizes
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import queue
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lowmark.batches.loop.microbatch import BatchResult, MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, FileSource, Pipeline
from lowmark.batches.windows import Aggregate, EventTime, Tumbling, WindowedAggregation

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "RESULTS.md"
EVERY_SCENARIO = "a,b,c,d"

SCHEMA = "user STRING, ts TIMESTAMP, amount DOUBLE"
T0_S = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp())
FILE_SPAN_S = 600
"""Event time each file moves forward."""
DISORDER_S = 3600
"""Events lag their file's position in event time by up to this much."""
WINDOW = "1 hour"
OUT_OF_ORDERNESS = "60 minutes"
FOLLOW_PIPELINE = "bench_follow"
MIB = 1024 * 1024
READ_AHEAD_BATCHES: int = Pipeline.model_fields["read_ahead_batches"].default
"""Batches lowmark's catch-up reads ahead in one job (the pipeline's default)."""


def windowed_pipeline(
    name: str, source: str, files_per_batch: int, read_ahead_batches: int = READ_AHEAD_BATCHES
) -> Pipeline:
    """The benchmark's query as a lowmark pipeline reading ``source``, writing ``out``."""
    return Pipeline(
        name=name,
        description="bench/streaming.py: count and avg(amount) per user per hour of event time",
        source=FileSource(
            path=source, format="json", schema_ddl=SCHEMA, max_files_per_batch=files_per_batch
        ),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts", max_out_of_orderness=OUT_OF_ORDERNESS),
        aggregation=WindowedAggregation(
            keys=("user",),
            window=Tumbling(size=WINDOW),
            aggregates=(
                Aggregate(fn="count", name="count"),
                Aggregate(fn="avg", column="amount", name="avg_amount"),
            ),
            output_mode="append",
        ),
        read_ahead_batches=read_ahead_batches,
    )


bench_follow = windowed_pipeline(FOLLOW_PIPELINE, "in", files_per_batch=1000)
"""What scenario (d) runs with ``lowmark --pipelines bench.streaming run bench_follow --follow``."""


@dataclass(frozen=True)
class Sizes:
    small_batches: int
    events_per_small_file: int
    catchup_events: int
    catchup_files: int
    files_per_batch: int
    follow_files: int
    follow_gap_s: float
    poll_interval: str
    users: int


FULL = Sizes(100, 200, 2_000_000, 100, 10, 20, 5.0, "1s", 8)
QUICK = Sizes(5, 200, 20_000, 10, 5, 3, 2.0, "1s", 8)
QUICK_STATE_SCALING = ["--sizes", "1000,10000", "--populate-batches", "1", "--repeat", "1"]


# ---------------------------------------------------------------- data


def event_lines(seed: int, dataset: str, index: int, events: int, users: int) -> str:
    """File ``index`` of ``dataset``: deterministic given the seed.

    Events of file i sit in [i * 10 min, (i + 1) * 10 min) of stream time, each
    then moved back by up to 60 minutes: out of order, but never behind a
    60-minute watermark of the files before it.
    """
    rng = random.Random(f"{seed}/{dataset}/{index}")
    base = T0_S + index * FILE_SPAN_S
    lines = []
    for _ in range(events):
        t = base + rng.random() * FILE_SPAN_S - rng.random() * DISORDER_S
        ts = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        amount = rng.randint(100, 10_000) / 100
        lines.append(f'{{"user": "u{rng.randrange(users)}", "ts": "{ts}", "amount": {amount}}}\n')
    return "".join(lines)


def land(folder: Path, name: str, text: str, mtime: float) -> None:
    """Write a file under a hidden name, then rename it: readers never see it half-written."""
    folder.mkdir(parents=True, exist_ok=True)
    staging = folder / f".{name}.tmp"
    staging.write_text(text)
    os.utime(staging, (mtime, mtime))
    os.replace(staging, folder / name)


def generate(folder: Path, seed: int, dataset: str, files: int, events: int, users: int) -> None:
    """``files`` files holding ``events`` events in all; modification times in file order."""
    first_mtime = time.time() - 3600
    for i in range(files):
        share = events // files + (1 if i < events % files else 0)
        text = event_lines(seed, dataset, i, share, users)
        land(folder, f"f{i:05d}.json", text, first_mtime + i)


# ---------------------------------------------------------------- engines (child processes)


def _child(spec_path: Path) -> None:
    """One engine's scenarios, in this process's own Spark session; results to a JSON file."""
    from lowmark.state.session import SparkSettings, get_spark

    spec = json.loads(spec_path.read_text())
    engine = spec["engine"]
    confs = {"spark.sql.streaming.numRecentProgressUpdates": "10000", **spec.get("confs", {})}
    settings = SparkSettings(app_name=f"lowmark-bench-{engine}", confs=confs)
    if spec.get("master"):
        settings = settings.model_copy(update={"master": spec["master"]})
    spark = get_spark(settings)  # local: its log level already ERROR
    run = {"lowmark": _lowmark_scenario, "sss": _sss_scenario, "plain": _plain_scenario}[engine]
    results = {name: run(spark, name, scenario) for name, scenario in spec["scenarios"].items()}
    Path(spec["result"]).write_text(json.dumps(results))
    spark.stop()


def _lowmark_scenario(spark: SparkSession, name: str, s: dict[str, Any]) -> dict[str, Any]:
    root = Path(s["root"])
    started = time.perf_counter()
    # (a) measures what one batch costs on its own (files arriving one at a time):
    # no read-ahead there. (b) and its warm-up are catch-ups, where the runner reads ahead.
    read_ahead = 1 if name == "small" else READ_AHEAD_BATCHES
    pipeline = windowed_pipeline(f"bench_{name}", s["input"], s["files_per_batch"], read_ahead)
    runner = MicroBatchRunner(spark, pipeline, root)
    batch_s: list[float] = []
    results: list[BatchResult] = []
    while True:
        began = time.perf_counter()
        result = runner.run_batch()
        if result is None:
            break
        results.append(result)
        if result.rows_in > 0:
            batch_s.append(time.perf_counter() - began)
        _say(
            f"  lowmark {name} batch {result.batch_id}: {result.rows_in:,} rows in, "
            f"{result.rows_out} windows out, {time.perf_counter() - began:.2f} s"
        )
    seconds = time.perf_counter() - started
    rows_in = sum(r.rows_in for r in results)
    bad = sum(r.rows_bad + r.rows_late for r in results)
    if rows_in != s["events"] or bad:
        raise RuntimeError(
            f"lowmark {name}: read {rows_in} of {s['events']} events, {bad} bad/late"
        )
    return {
        "seconds": seconds,
        "batch_s": batch_s,
        "engine_total_s": [r.durations_ms.get("total", 0) / 1000 for r in results if r.rows_in],
        "rows_in": rows_in,
        "output": _digest(spark, root / "out"),
    }


def _sss_scenario(spark: SparkSession, name: str, s: dict[str, Any]) -> dict[str, Any]:
    root = Path(s["root"])
    started = time.perf_counter()
    events = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", s["files_per_batch"])
        .json(s["input"])
        .withWatermark("ts", OUT_OF_ORDERNESS)
    )
    progress = run_sss(events, root / "sss_checkpoint", root / "out", name)
    seconds = time.perf_counter() - started
    rows_in = sum(int(p["numInputRows"]) for p in progress)
    if rows_in != s["events"]:
        raise RuntimeError(f"SSS {name}: read {rows_in} of {s['events']} events")
    return {
        "seconds": seconds,
        "batch_s": [p["durationMs"]["triggerExecution"] / 1000 for p in progress],
        "files_per_batch": s["files_per_batch"],
        "rows_in": rows_in,
        "output": _digest(spark, root / "out"),
    }


def _aggregate(events: DataFrame) -> DataFrame:
    return (
        events.groupBy("user", F.window("ts", WINDOW))
        .agg(F.count(F.lit(1)).alias("count"), F.avg("amount").alias("avg_amount"))
        .select(
            "user",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "count",
            "avg_amount",
        )
    )


def run_sss(
    events: DataFrame,
    checkpoint: Path,
    out: Path,
    name: str,
    shape: Callable[[DataFrame], DataFrame] = _aggregate,
) -> list[Any]:
    """``shape(events)`` (by default the benchmark's query) in Structured Streaming,
    available-now, appended to the Delta table ``out``; the progress of each batch that read
    rows (each one printed)."""
    query = (
        shape(events)
        .writeStream.format("delta")
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    query.awaitTermination()
    # Over Spark Connect a progress's ``numInputRows`` item is null: its property adds up
    # the sources' (as the JVM's does).
    every = [{**p, "numInputRows": p.numInputRows} for p in query.recentProgress]
    progress = [p for p in every if p["numInputRows"] > 0]
    for p in progress:
        _say(
            f"  SSS {name} batch {p['batchId']}: {p['numInputRows']:,} rows in, "
            f"{p['durationMs']['triggerExecution'] / 1000:.2f} s"
        )
    return progress


def _plain_scenario(spark: SparkSession, name: str, s: dict[str, Any]) -> dict[str, Any]:
    root = Path(s["root"])
    started = time.perf_counter()
    events = spark.read.schema(SCHEMA).json(s["input"])
    _aggregate(events).write.format("delta").mode("overwrite").save(str(root / "out"))
    seconds = time.perf_counter() - started
    _say(f"  plain batch job over {name}: {seconds:.2f} s")
    output = _digest(spark, root / "out")
    if output["events"] != s["events"]:
        raise RuntimeError(f"plain {name}: aggregated {output['events']} of {s['events']} events")
    return {"seconds": seconds, "rows_in": s["events"], "output": output}


def _digest(spark: SparkSession, table: Path) -> dict[str, Any]:
    """Windows written, the events they count, and every window's values (user, start,
    count, average rounded to 9 digits: engines sum in other orders): equal output from
    equal engines."""
    out = spark.read.format("delta").load(str(table))
    rows = out.select(
        "user", F.col("window_start").cast("string"), "count", F.round("avg_amount", 9)
    ).collect()
    values = sorted([r[0], r[1], int(r[2]), float(r[3])] for r in rows)
    return {
        "windows": len(values),
        "events": sum(v[2] for v in values),
        "values": values,
    }


def value_differences(got: dict[str, dict[str, Any]]) -> list[str]:
    """Where the engines' windows differ in a value: lowmark's and Structured Streaming's
    (both write the final windows) must be the same; each of theirs must be the plain
    job's (which writes every window, the open ones too)."""
    found = []
    rows = {e: {(v[0], v[1]): tuple(v[2:]) for v in o["values"]} for e, o in got.items()}
    if "lowmark" in rows and "sss" in rows and rows["lowmark"] != rows["sss"]:
        differ = set(rows["lowmark"].items()) ^ set(rows["sss"].items())
        found.append(f"lowmark and SSS differ in {len(differ)} window values")
    for engine in ("lowmark", "sss"):
        if engine in rows and "plain" in rows:
            plain = rows["plain"]
            unlike = [k for k, v in rows[engine].items() if plain.get(k) != v]
            if unlike:
                found.append(f"{engine} and the plain job differ in {len(unlike)} windows")
    return found


# ---------------------------------------------------------------- processes and memory


class PeakRss:
    """Peak RSS of a process plus all its descendants (the Spark JVM), polled from /proc."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mib(self) -> float | None:
        return self.peak_bytes / MIB if self.peak_bytes else None

    def _poll(self) -> None:
        if not Path("/proc/self/statm").exists():
            return  # not Linux: no memory figures
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.wait(self.interval_s):
            total = 0
            for pid in _descendants(self.pid):
                try:
                    total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
                except (OSError, IndexError, ValueError):
                    continue  # the process just ended
            self.peak_bytes = max(self.peak_bytes, total)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


def run_engine(
    work: Path,
    engine: str,
    scenarios: dict[str, Any],
    master: str | None = None,
    confs: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[dict[str, Any], float]:
    """Run ``engine``'s scenarios in a child process (its Spark on ``master``, with
    ``confs``; by default local; ``env`` added to its environment, as a Spark Connect
    server's token); its results and the driver's peak RSS (MiB)."""
    tag = f"{engine}-{master.split(':')[0]}" if master else engine
    result_path = work / f"{tag}.json"
    spec = {
        "engine": engine,
        "scenarios": scenarios,
        "result": str(result_path),
        "master": master,
        "confs": confs or {},
    }
    spec_path = work / f"{tag}.spec.json"
    spec_path.write_text(json.dumps(spec))
    log_path = work / f"{tag}.stderr.log"
    _say(f"[{engine}] starting its own Spark process (stderr in {log_path})")
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.streaming", "--child", str(spec_path)],
            cwd=REPO,
            env={**_env(), **(env or {})},
            stderr=log,
        )
        with PeakRss(proc.pid) as rss:
            code = proc.wait()
    if code != 0:
        raise RuntimeError(f"{engine} failed with exit code {code}:\n{_tail(log_path)}")
    return json.loads(result_path.read_text()), rss.peak_mib or 0.0


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# ---------------------------------------------------------------- (c) state scaling


def state_scaling(work: Path, quick: bool, log: Path | None) -> dict[str, Any]:
    """Run bench/state_scaling.py (or read its saved output); its ratios and full output."""
    if log is not None:
        text = log.read_text()
        _say(f"[state_scaling] read from {log}")
    else:
        args = [
            sys.executable,
            "-m",
            "bench.state_scaling",
            *(QUICK_STATE_SCALING if quick else []),
        ]
        _say(f"[state_scaling] {shlex.join(args[1:])}")
        log_path = work / "state_scaling.stderr.log"
        lines: list[str] = []
        with log_path.open("w") as err:
            proc = subprocess.Popen(
                args, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=err, text=True
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                _say(f"  {line.rstrip()}")
                lines.append(line)
            if proc.wait() != 0:
                raise RuntimeError(f"state_scaling failed:\n{_tail(log_path)}")
        text = "".join(lines)
    found: dict[str, Any] = {"output": text}
    engines = (
        ("lowmark", "lowmark"),
        ("lowmark after maintenance", "lowmark_maintained"),
        ("SSS", "sss"),
    )
    for engine, key in engines:
        match = re.search(rf"^{engine}\s+([\d,]+)/([\d,]+): ([\d.]+)x", text, re.MULTILINE)
        if match:
            found[key] = float(match.group(3))
            found["sizes"] = f"{match.group(1)}/{match.group(2)}"
    return found


# ---------------------------------------------------------------- (d) follow latency


@contextmanager
def _lines_of(stream: IO[str]) -> Iterator[queue.Queue[str | None]]:
    """A queue of ``stream``'s lines, read by a thread; None once it ends."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    yield lines
    thread.join(timeout=5)


def follow_latency(work: Path, sizes: Sizes, seed: int) -> dict[str, Any]:
    """Scenario (d): files land one at a time while ``lowmark run --follow`` runs."""
    root = work / "follow"
    incoming = root / "in"
    land(incoming, "f00000.json", event_lines(seed, "follow", 0, 200, sizes.users), time.time())
    args = [
        sys.executable,
        "-c",
        "from lowmark.batches.cli.commands import main; main()",
        "--pipelines",
        "bench.streaming",
        "--data-root",
        str(root),
        "run",
        FOLLOW_PIPELINE,
        "--follow",
        "--poll-interval",
        sizes.poll_interval,
        "--max-seconds",
        "3600",
    ]
    log_path = work / "follow.stderr.log"
    checkpoint = root / "_lowmark" / FOLLOW_PIPELINE
    _say(f"[follow] lowmark run {FOLLOW_PIPELINE} --follow --poll-interval {sizes.poll_interval}")
    out: list[str] = []
    landed: dict[str, float] = {}
    with log_path.open("w") as err:
        proc = subprocess.Popen(
            args, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=err, text=True
        )
        assert proc.stdout is not None
        try:
            with PeakRss(proc.pid) as rss, _lines_of(proc.stdout) as lines:

                def until(done: Callable[[], bool], what: str, timeout_s: float = 900) -> None:
                    deadline = time.monotonic() + timeout_s
                    while not done():
                        if time.monotonic() > deadline or proc.poll() is not None:
                            raise RuntimeError(f"follow: no {what}:\n{_tail(log_path)}")
                        _drain(lines, out, 0.5)

                until(lambda: any(line.startswith("batch 0 ") for line in out), "first batch")
                for k in range(1, sizes.follow_files + 1):
                    gap_ends = time.monotonic() + sizes.follow_gap_s
                    while (left := gap_ends - time.monotonic()) > 0:
                        _drain(lines, out, min(left, 0.5))
                    name = f"f{k:05d}.json"
                    land(
                        incoming,
                        name,
                        event_lines(seed, "follow", k, 200, sizes.users),
                        time.time(),
                    )
                    landed[name] = time.time()
                    _say(f"  landed {name}")
                until(lambda: _all_committed(checkpoint, landed), "commit of every landed file")
                proc.send_signal(signal.SIGINT)
                code = proc.wait(timeout=600)
                _drain(lines, out, 0)
        finally:
            if proc.poll() is None:
                proc.kill()
    if code != 0:
        raise RuntimeError(f"lowmark run --follow exited {code}:\n{_tail(log_path)}")
    taken = _committed_at(checkpoint)
    latency_s = sorted(taken[name] - at for name, at in landed.items())
    # Batches that took files, after the warm-up batch 0 (emit-only batches take none).
    # The CLI prints a batch's time as "took 596 ms" below a second, "took 1.4 s" above.
    batch_s = [
        float(m.group(3)) / (1000 if m.group(4) == "ms" else 1)
        for m in (
            re.match(r"batch (\d+) \w+: (\d+) rows in.* took ([\d.]+) (ms|s)$", line)
            for line in out
        )
        if m and int(m.group(1)) > 0 and int(m.group(2)) > 0
    ]
    return {
        "latency_s": latency_s,
        "batch_s": batch_s,
        "poll_s": _seconds(sizes.poll_interval),
        "stop_line": out[-1] if out else "",
        "peak_rss_mib": rss.peak_mib or 0.0,
    }


def _drain(lines: queue.Queue[str | None], out: list[str], wait_s: float) -> None:
    try:
        line = lines.get(timeout=wait_s) if wait_s else lines.get_nowait()
        while line is not None:
            _say(f"  {line}")
            out.append(line)
            line = lines.get_nowait()
    except queue.Empty:
        pass


def _read_delta(path: Path, columns: str) -> list[dict[str, Any]]:
    """Rows of a checkpoint table, read without Spark (delta-rs, deletion vectors included)."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    reader = QueryBuilder().register("t", DeltaTable(str(path))).execute(f"SELECT {columns} FROM t")
    return pa.table(reader.read_all()).to_pylist()


def _committed_at(checkpoint: Path) -> dict[str, float]:
    """File name → epoch seconds at which the batch that took it committed."""
    commits = {
        r["batch_id"]: _epoch_s(r["created_at"])
        for r in _read_delta(checkpoint / "commits", "batch_id, created_at")
    }
    return {
        Path(r["path"]).name: commits[r["discovered_for_batch"]]
        for r in _read_delta(checkpoint / "files", "path, discovered_for_batch")
        if r["discovered_for_batch"] in commits
    }


def _all_committed(checkpoint: Path, landed: dict[str, float]) -> bool:
    try:
        return set(landed) <= set(_committed_at(checkpoint))
    except Exception:  # the tables may not exist yet; delta-rs errors have no common base
        return False


def _epoch_s(value: Any) -> float:
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    if isinstance(value, int | float):
        return value / 1000  # epoch millis
    return datetime.fromisoformat(str(value)).timestamp()


def _seconds(duration: str) -> float:
    from lowmark.batches.durations import parse_duration_ms

    return parse_duration_ms(duration) / 1000


# ---------------------------------------------------------------- report


@dataclass
class Measure:
    key: str
    label: str
    lowmark: float | None = None
    sss: float | None = None
    plain: float | None = None


@dataclass
class Ratio:
    key: str
    label: str
    value: float | None
    target: str

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        op, bound = self.target.split()
        return self.value <= float(bound) if op == "<=" else self.value >= float(bound)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _p95(xs: list[float]) -> float | None:
    if not xs:
        return None
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def small_batch_measures(lowmark_s: list[float], sss_s: list[float]) -> list[Measure]:
    """(a)'s median and p95 of each engine's small-batch seconds."""
    return [
        Measure("a_median", "(a) small batch: median s", _median(lowmark_s), _median(sss_s)),
        Measure("a_p95", "(a) small batch: p95 s", _p95(lowmark_s), _p95(sss_s)),
    ]


def lowmark_over_sss(key: str, what: str, measure: Measure, target: str) -> Ratio:
    """``measure``'s lowmark / SSS, labelled ``what, lowmark / SSS``."""
    return Ratio(key, f"{what}, lowmark / SSS", _div(measure.lowmark, measure.sss), target)


def build_report(r: dict[str, Any]) -> tuple[list[Measure], list[Ratio]]:
    small = {e: r.get(e, {}).get("small", {}) for e in ("lowmark", "sss")}
    catchup = {e: r.get(e, {}).get("catchup", {}) for e in ("lowmark", "sss", "plain")}
    wide = r.get("sss", {}).get("catchup_wide", {})

    def rate(e: str) -> float | None:
        c = catchup[e]
        return c["rows_in"] / c["seconds"] if c else None

    wide_rate = wide["rows_in"] / wide["seconds"] if wide else None
    wide_files = wide.get("files_per_batch", "-")

    scaling = r.get("state_scaling", {})
    follow = r.get("follow", {})
    rss = r.get("rss_mib", {})
    measures = [  # the like-for-like catch-up first: the comparison a skeptic starts from
        Measure(
            "b_wide_rate",
            f"(b) like-for-like catch-up, SSS maxFilesPerTrigger {wide_files}"
            " (one read-ahead): events/s",
            rate("lowmark"),
            wide_rate,
        ),
        Measure(
            "b_wide_seconds",
            f"(b) like-for-like catch-up, SSS maxFilesPerTrigger {wide_files}: wall s",
            catchup["lowmark"].get("seconds"),
            wide.get("seconds"),
        ),
        *small_batch_measures(small["lowmark"].get("batch_s", []), small["sss"].get("batch_s", [])),
        Measure("b_rate", "(b) catch-up: events/s", rate("lowmark"), rate("sss"), rate("plain")),
        Measure(
            "b_seconds",
            "(b) catch-up: wall s",
            *(catchup[e].get("seconds") for e in ("lowmark", "sss", "plain")),
        ),
        Measure(
            "c_scaling",
            f"(c) small batch, {scaling.get('sizes', 'large/small')} open windows: x",
            scaling.get("lowmark"),
            scaling.get("sss"),
        ),
        Measure(
            "c_scaling_maintained",
            "(c) same, after lowmark's maintenance: x",
            scaling.get("lowmark_maintained"),
        ),
        Measure("d_p50", "(d) file-to-sink latency: p50 s", _median(follow.get("latency_s", []))),
        Measure("d_p95", "(d) file-to-sink latency: p95 s", _p95(follow.get("latency_s", []))),
        Measure(
            "d_batch", "(d) follow batch taking files: median s", _median(follow.get("batch_s", []))
        ),
        Measure(
            "e_rss",
            "(e) peak RSS of (a)+(b) process: MiB",
            rss.get("lowmark"),
            rss.get("sss"),
            rss.get("plain"),
        ),
        Measure("e_rss_follow", "(e) peak RSS of lowmark run --follow: MiB", rss.get("follow")),
    ]
    m = {x.key: x for x in measures}
    expected_d = None
    if follow.get("batch_s"):
        expected_d = follow["poll_s"] + (m["d_batch"].lowmark or 0)
    ratios = [
        Ratio(
            "b_wide",
            "(b) like-for-like catch-up events/s, lowmark / SSS with maxFilesPerTrigger "
            f"{wide_files}",
            _div(m["b_rate"].lowmark, wide_rate),
            ">= 1.0",
        ),
        lowmark_over_sss("a", "(a) small batch median", m["a_median"], "<= 1.0"),
        lowmark_over_sss("b_sss", "(b) catch-up events/s", m["b_rate"], ">= 1.2"),
        Ratio(
            "b_plain",
            "(b) catch-up events/s, lowmark / plain batch",
            _div(m["b_rate"].lowmark, m["b_rate"].plain),
            ">= 0.75",
        ),
        Ratio(
            "c",
            f"(c) lowmark small batch {scaling.get('sizes', 'large/small')} windows",
            scaling.get("lowmark"),
            "<= 1.5",
        ),
        Ratio(
            "c_maintained",
            f"(c) the same after maintenance {scaling.get('sizes', 'large/small')} windows",
            scaling.get("lowmark_maintained"),
            "<= 1.5",
        ),
        Ratio(
            "d",
            f"(d) latency p50 / (poll {follow.get('poll_s', 0):g} s + median batch)",
            _div(m["d_p50"].lowmark, expected_d),
            "<= 1.0",
        ),
    ]
    return measures, ratios


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.2f}"


def _met(ratio: Ratio) -> str:
    return {True: "yes", False: "no", None: "-"}[ratio.met]


def text_report(measures: list[Measure], ratios: list[Ratio], plain: bool = True) -> str:
    """The measures (with a plain-batch column if ``plain``) and the ratios, as text tables."""
    width = max(len(m.label) for m in measures)
    tail = f" {'plain batch':>12}" if plain else ""
    lines = [f"{'measure':<{width}} {'lowmark':>12} {'SSS':>12}{tail}"]
    for m in measures:
        tail = f" {_fmt(m.plain):>12}" if plain else ""
        lines.append(f"{m.label:<{width}} {_fmt(m.lowmark):>12} {_fmt(m.sss):>12}{tail}")
    width = max(len(r.label) for r in ratios)
    lines += ["", f"{'ratio':<{width}} {'value':>8} {'target':>8} {'met':>4}"]
    for r in ratios:
        lines.append(f"{r.label:<{width}} {_fmt(r.value):>8} {r.target:>8} {_met(r):>4}")
    return "\n".join(lines)


def markdown_header(script: str, meta: dict[str, Any]) -> list[str]:
    """A results file's title and the run's ``meta`` (``run_meta``) as a list, then a blank
    line."""
    return [
        f"# {script} results",
        "",
        f"- date: {meta['date']}",
        f"- command: `{meta['command']}` (took {meta['took_s'] / 60:.1f} minutes)",
        f"- machine: {meta['cores']} cores, {meta['memory_gib']:.1f} GiB memory, "
        f"{meta['cpu']}; load average at start {meta['load']}",
        f"- versions: {meta['versions']}",
        f"- sizes: {meta['sizes']}",
        "",
    ]


def markdown_tables(measures: list[Measure], ratios: list[Ratio], plain: bool = True) -> list[str]:
    """The lines of the measures' markdown table (a plain-batch column if ``plain``), a blank
    line, and the ratios' table."""
    tail, rule = (" plain batch |", " ---: |") if plain else ("", "")
    lines = [f"| measure | lowmark | Structured Streaming |{tail}", f"| --- | ---: | ---: |{rule}"]
    for m in measures:
        tail = f" {_fmt(m.plain)} |" if plain else ""
        lines.append(f"| {m.label} | {_fmt(m.lowmark)} | {_fmt(m.sss)} |{tail}")
    lines += ["", "| ratio | value | target | met |", "| --- | ---: | ---: | :---: |"]
    for r in ratios:
        lines.append(f"| {r.label} | {_fmt(r.value)} | {r.target} | {_met(r)} |")
    return lines


def markdown_report(
    measures: list[Measure],
    ratios: list[Ratio],
    results: dict[str, Any],
    meta: dict[str, Any],
) -> str:
    lines = [
        *markdown_header("bench/streaming.py", meta),
        "Measurements (engines in separate processes, one at a time; see the docstring "
        "of `bench/streaming.py` for what each row measures):",
        "",
        *markdown_tables(measures, ratios),
    ]
    lines += ["", "Same output check (windows written, events they count, every value):", ""]
    for scenario in ("small", "catchup", "catchup_wide"):
        got = {
            e: results[e][scenario]["output"]
            for e in ("lowmark", "sss", "plain")
            if scenario in results.get(e, {})
        }
        shown = ", ".join(
            f"{e} {o['windows']} windows / {o['events']:,} events" for e, o in got.items()
        )
        differ = value_differences(got)
        verdict = "; ".join(differ) if differ else "every window's values equal"
        lines.append(f"- {scenario}: {shown or '-'} — {verdict if got else '-'}")
    lines.append("  (lowmark and SSS write only final windows; the plain job writes every window.)")
    scaling = results.get("state_scaling", {}).get("output")
    if scaling:
        lines += ["", "(c) `bench/state_scaling.py` output:", "", "```", scaling.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def run_meta(sizes: Any, started: float, module: str = "bench.streaming") -> dict[str, Any]:
    """Date, command (``python -m module`` with this process's arguments), time taken since
    ``started`` (monotonic), machine, load, versions and ``sizes`` (a dataclass) of a run."""

    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "-"

    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
        java_version = (java.stderr.splitlines() or ["-"])[0]
    except OSError:
        java_version = "-"
    memory_gib = 0.0
    cpu = platform.processor() or platform.machine()
    if Path("/proc/meminfo").exists():
        kib = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
        memory_gib = int(kib.group(1)) / 1024 / 1024 if kib else 0.0
        model = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        cpu = model.group(1).strip() if model else cpu
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join([".venv/bin/python", "-m", module, *sys.argv[1:]]),
        "took_s": time.monotonic() - started,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "cpu": cpu,
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "versions": f"Python {platform.python_version()}, pyspark {version('pyspark')}, "
        f"delta-spark {version('delta-spark')}, deltalake {version('deltalake')}, {java_version}",
        "sizes": asdict(sizes),
    }


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    if args.child:
        _child(Path(args.child))
        return
    started = time.monotonic()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    sizes = QUICK if args.quick else FULL
    overrides = {
        "small_batches": args.small_batches,
        "catchup_events": args.catchup_events,
        "follow_files": args.follow_files,
    }
    sizes = dataclasses.replace(sizes, **{k: v for k, v in overrides.items() if v})
    scenarios = set(args.scenarios.split(","))
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="lowmark-bench-streaming-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        results = _run(work, sizes, scenarios, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    measures, ratios = build_report(results)
    _say("")
    _say(text_report(measures, ratios))
    meta = run_meta(sizes, started)
    meta["load"] = load
    full = not args.quick and scenarios >= set(EVERY_SCENARIO.split(","))
    target = Path(args.results) if args.results else (RESULTS if full else None)
    if target is not None:
        target.write_text(markdown_report(measures, ratios, results, meta))
        _say(f"\nwrote {target}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "measurements": [asdict(m) for m in measures],
                    "ratios": [{**asdict(r), "met": r.met} for r in ratios],
                    "meta": meta,
                },
                indent=2,
            )
        )
    _say(f"took {(time.monotonic() - started) / 60:.1f} minutes")


def _run(work: Path, sizes: Sizes, scenarios: set[str], args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"rss_mib": {}}
    data = work / "data"
    engine_scenarios: dict[str, dict[str, Any]] = {"lowmark": {}, "sss": {}, "plain": {}}
    if "a" in scenarios:
        _say(f"[data] small: {sizes.small_batches} files x {sizes.events_per_small_file} events")
        events = sizes.small_batches * sizes.events_per_small_file
        generate(data / "small", args.seed, "small", sizes.small_batches, events, sizes.users)
        # Warm-up (unreported): lowmark and Structured Streaming first catch up over
        # these files, and the plain job's "small" run over them is its warm-up: every
        # engine's JVM has then run the code its (a) and (b) run, before either starts.
        for engine in ("lowmark", "sss"):
            engine_scenarios[engine]["warmup"] = {
                "input": str(data / "small"),
                "root": str(work / engine / "warmup"),
                "files_per_batch": sizes.files_per_batch,
                "events": events,
            }
        for engine in ("lowmark", "sss", "plain"):
            engine_scenarios[engine]["small"] = {
                "input": str(data / "small"),
                "root": str(work / engine / "small"),
                "files_per_batch": 1,
                "events": events,
            }
    if "b" in scenarios:
        _say(f"[data] catch-up: {sizes.catchup_events:,} events in {sizes.catchup_files} files")
        generate(
            data / "catchup",
            args.seed,
            "catchup",
            sizes.catchup_files,
            sizes.catchup_events,
            sizes.users,
        )
        for engine in ("lowmark", "sss", "plain"):
            engine_scenarios[engine]["catchup"] = {
                "input": str(data / "catchup"),
                "root": str(work / engine / "catchup"),
                "files_per_batch": sizes.files_per_batch,
                "events": sizes.catchup_events,
            }
        # Structured Streaming again, taking per batch what lowmark reads in one read-ahead:
        # before its narrow catch-up, so that it is as warm as lowmark's one catch-up (after
        # the narrow one's ten triggers over the same files, its JVM had compiled the
        # scan and aggregation lowmark's catch-up runs for the first time).
        sss = engine_scenarios["sss"]
        wide = {
            **sss["catchup"],
            "root": str(work / "sss" / "catchup_wide"),
            "files_per_batch": sizes.files_per_batch * READ_AHEAD_BATCHES,
        }
        engine_scenarios["sss"] = {
            **{k: v for k, v in sss.items() if k != "catchup"},
            "catchup_wide": wide,
            "catchup": sss["catchup"],
        }
    for engine, chosen in engine_scenarios.items():
        if chosen:
            results[engine], results["rss_mib"][engine] = run_engine(work, engine, chosen)
    if "c" in scenarios:
        log = Path(args.state_scaling_log) if args.state_scaling_log else None
        results["state_scaling"] = state_scaling(work, args.quick, log)
    if "d" in scenarios:
        results["follow"] = follow_latency(work, sizes, args.seed)
        results["rss_mib"]["follow"] = results["follow"]["peak_rss_mib"]
    return results


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.streaming",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Full sizes: {FULL}.\nQuick sizes: {QUICK}; (c) with state_scaling "
        f"{' '.join(QUICK_STATE_SCALING)}.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes (a smoke run; writes no RESULTS.md unless --results)",
    )
    parser.add_argument("--seed", type=int, default=8, help="data generator seed (default: 8)")
    parser.add_argument(
        "--scenarios",
        default=EVERY_SCENARIO,
        help="which of a,b,c,d to run (default: all; e is always; a run of fewer writes no "
        "RESULTS.md unless --results)",
    )
    parser.add_argument("--small-batches", type=int, help="(a) one-file batches")
    parser.add_argument("--catchup-events", type=int, help="(b) events in all")
    parser.add_argument("--follow-files", type=int, help="(d) files landed one at a time")
    parser.add_argument(
        "--state-scaling-log",
        help="(c): read this saved output of bench.state_scaling instead of running it",
    )
    parser.add_argument(
        "--results", help="write the markdown report here (default: bench/RESULTS.md, full run)"
    )
    parser.add_argument("--json", help="also write the table as JSON here")
    parser.add_argument("--work-dir", help="where data and checkpoints go (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _say(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    main()
