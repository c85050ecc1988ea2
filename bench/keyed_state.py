"""Keyed state and timers: lowmark's keyed step next to Structured Streaming's
``transformWithStateInPandas``, on the same data, in the same run.

One processor, ``examples.keyed.SilenceAlert`` (per user: the last event time as
value state, an event-time timer at last + 10 s, an alert row naming when the
silence began), runs under both engines.

- lowmark: files source → ``keyed: {processor: examples.keyed:SilenceAlert,
  keys: [user], output_schema: examples.keyed.ALERTS, time_mode: event_time}``
  → Delta sink, ``event_time`` with 30 seconds of ``max_out_of_orderness``,
  run batch by batch with ``MicroBatchRunner``.
- Structured Streaming (SSS): ``withWatermark("ts", "30 seconds")
  .groupBy("user").transformWithStateInPandas(SilenceAlert(), ALERTS,
  "Append", "EventTime")``, Delta sink with a checkpoint,
  ``maxFilesPerTrigger`` = lowmark's ``max_files_per_batch``,
  ``trigger(availableNow=True)``, the RocksDB state store
  (``spark.sql.streaming.stateStore.providerClass`` =
  ``RocksDBStateStoreProvider``: transformWithState refuses any other) with
  changelog checkpointing (each trigger uploads its changes, not a snapshot).

The data is generated from a seed: JSON-lines files of ``{user, ts, amount}``,
each file covering 10 seconds of arrival time. A user sends bursts (1-5 events
within 8 s), then is silent for longer than a batch's files span, so a silence
alert follows each burst: in the next burst's batch, or from the timer once the
watermark passes it. A user's events arrive with a lag of its own (under 20 s,
below the 30-second delay): files are in arrival order, each user's events in
event-time order, users out of order with each other, nothing ever behind a
watermark.

Where the two engines differ, and how the data keeps their results comparable:

- SSS hands ``handleInputRows`` a key's rows in no set order (a batch's files
  are read by several tasks and shuffled); lowmark hands them in event-time
  order. The processor looks at the gaps between consecutive rows, so a key
  whose rows in one batch span a silence would give other alerts under SSS: the
  data never puts two bursts of a user in one batch.
- SSS fires a timer once the watermark is *above* it (``getExpiredTimers``:
  ``timer < watermark``), lowmark once the watermark *reaches* it
  (``timer <= watermark``). Every event time is an even number of
  milliseconds except the newest one, which is odd: the last watermark (the
  newest event time - 30 s) never equals a timer, and both engines fire the
  same timers by the end.
- SSS drops rows behind the previous batch's watermark silently; lowmark sends
  rows behind its batch's watermark to the late table. The data has none.

Both engines run in this one process's Spark session, one after the other.
Each is first warmed the same way: an unreported run over a small warm-up
dataset. Scenarios:

(a) small batches: one file (about 300 events) per batch; seconds per batch,
    median and p95 (lowmark: wall time of ``run_batch``; SSS: each batch's
    ``durationMs.triggerExecution``); batches that read no input (timers only)
    left out, and reported apart: lowmark's timer-only batches of (a) and (b),
    their median and the slowest; (a)'s slowest against 0.5 s (a few alerts
    each; (b)'s last batch fires every timer still pending, its time the
    processor's own).
(b) catch-up: about 200 000 events in 40 files, 10 files per batch; events/s
    from "start the stream" to "caught up" (timer-only batches included).
(c) state scaling, lowmark only (SSS would need as long to fill its state):
    the median of 5 small batches touching 200 users, once the state holds
    10 000 users and once it holds 1 000 000 (filled by catch-up batches of
    100 000 distinct users, one event each, their timers never due), and the
    ratio large / small. Both states are filled first; then the touches of the
    two alternate, batch for batch, so that whatever else the machine does
    weighs on both alike. ``--state-large`` sets the larger size.

Checked in the run (raises if not): in (a) and (b) each sink holds exactly the
alerts of the rule over the whole input (every silence of more than 10 s
between two events of a user, and each user's last event once the last
watermark has passed it by 10 s), each once; in (c) every event reached the
processor and no alert was written. Prints a table and the ratios against
their targets, and writes them to ``--results`` if given. Timings are
wall-clock on whatever else the machine is doing; run it on a quiet box.

    .venv/bin/python -m bench.keyed_state            # the full run (make bench)
    .venv/bin/python -m bench.keyed_state --quick    # a smoke run with tiny sizes
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import shutil
import statistics
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.side_by_side import (
    Engine,
    Run,
    iso_ms,
    lowmark_batches,
    parser,
    report,
    scenarios,
    session,
    small_and_catchup,
    sss_over_files,
)
from bench.streaming import (
    T0_S,
    Measure,
    Ratio,
    _say,
    land,
    run_meta,
)
from examples.keyed import ALERTS, SILENCE_MS, SilenceAlert
from lowmark.batches.durations import parse_duration_ms
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.loop.microbatch import BatchResult, MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, FileSource, Pipeline
from lowmark.batches.windows import EventTime

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"
DELAY = "30 seconds"
"""SSS's watermark delay and lowmark's ``max_out_of_orderness``."""
DELAY_MS = parse_duration_ms(DELAY)
PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
FILE_SPAN_MS = 10_000
"""Arrival time each file covers."""
LAG_MS = 20_000
"""A user's events arrive up to this much after their event time (below ``DELAY``)."""
BURST_MS = 8_000
"""A burst's events lie within this much event time (below the 10-second silence)."""
BURST_EVENTS = (1, 5)
QUIET_EXTRA_MS = 60_000
"""A user's silence lasts a batch's files span + 10 s + up to this much."""
FILL_CHUNK = 100_000
"""(c): distinct users per fill file (one batch each)."""
FILL_SPAN_MS = 15_000
"""(c): the fill's event times lie within this much: with touches up to 5 s after, the
watermark stays below every fill timer (event time + 10 s)."""
T0_MS = T0_S * 1000


@dataclass(frozen=True)
class Sizes:
    warmup_files: int
    small_batches: int
    events_per_small_file: int
    catchup_events: int
    catchup_files: int
    files_per_batch: int
    state_small: int
    state_large: int
    touched_users: int
    touch_batches: int


FULL = Sizes(5, 30, 300, 200_000, 40, 10, 10_000, 1_000_000, 200, 5)
QUICK = Sizes(5, 5, 300, 3_000, 10, 5, 1_000, 20_000, 200, 3)


@dataclass(frozen=True)
class Dataset:
    """Generated input: its folder, its events, and the alerts the rule gives over it
    (``(user, silent_since_ms)``, sorted)."""

    folder: Path
    events: int
    alerts: list[tuple[str, int]]


# ---------------------------------------------------------------- data


def generate(
    folder: Path, seed: int, dataset: str, files: int, events: int, files_per_batch: int
) -> Dataset:
    """``files`` files of about ``events`` events in all, in bursts (see the module
    docstring); modification times in file order. Deterministic given the seed."""
    rng = random.Random(f"{seed}/{dataset}")
    span_ms = files * FILE_SPAN_MS
    # Longer than a batch's files span: a user's two bursts never share a batch.
    quiet_ms = files_per_batch * FILE_SPAN_MS + SILENCE_MS
    mean_burst = sum(BURST_EVENTS) / 2
    per_user = span_ms / (BURST_MS / 2 + quiet_ms + QUIET_EXTRA_MS / 2) * mean_burst
    rows: list[tuple[int, str, int]] = []  # arrival ms, user, event ms: all even
    for u in range(max(1, round(events / per_user))):
        user, lag = f"u{u}", rng.randrange(0, LAG_MS, 2)
        # The first burst before the files begin: as many users active at any time.
        at = rng.randrange(-quiet_ms - QUIET_EXTRA_MS - BURST_MS, 0, 2)
        while at < span_ms:
            burst = sorted(rng.randrange(0, BURST_MS, 2) for _ in range(rng.randint(*BURST_EVENTS)))
            rows += [(at + off + lag, user, at + off) for off in burst if at + off + lag >= 0]
            at += burst[-1] + quiet_ms + rng.randrange(0, QUIET_EXTRA_MS, 2)
    rows = sorted(r for r in rows if r[0] < span_ms)
    # The newest event an odd millisecond: the last watermark equals no timer (see above).
    newest = max(range(len(rows)), key=lambda i: rows[i][2])
    arrival, user, ts = rows[newest]
    rows[newest] = (arrival, user, ts + 1)
    by_file: list[list[str]] = [[] for _ in range(files)]
    for arrival, user, ts in rows:
        line = (
            f'{{"user": "{user}", "ts": "{iso_ms(T0_MS + ts)}", "amount": {rng.randint(1, 999)}}}'
        )
        by_file[arrival // FILE_SPAN_MS].append(line + "\n")
    first_mtime = time.time() - 3600
    for i, lines in enumerate(by_file):
        land(folder, f"f{i:05d}.json", "".join(lines), first_mtime + i)
    return Dataset(folder, len(rows), silences([(u, T0_MS + ts) for _, u, ts in rows]))


def silences(events: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The alerts of ``SilenceAlert``'s rule over the whole input, as ``(user,
    silent_since_ms)``, sorted: each gap of more than 10 s between two events of a user,
    and each user's last event once the last watermark (newest event - delay) has passed it
    by 10 s."""
    watermark = max(ms for _, ms in events) - DELAY_MS
    times: dict[str, list[int]] = {}
    for user, ms in events:
        times.setdefault(user, []).append(ms)
    found = []
    for user, ts in times.items():
        ts.sort()
        found += [(user, a) for a, b in itertools.pairwise(ts) if b - a > SILENCE_MS]
        if ts[-1] + SILENCE_MS < watermark:
            found.append((user, ts[-1]))
    return sorted(found)


def datasets(folder: Path, seed: int, sizes: Sizes) -> dict[str, Dataset]:
    """The warm-up, small-batch and catch-up inputs, each in its folder below ``folder``."""
    per_small = sizes.events_per_small_file
    shapes = {  # files, events, files per batch
        "warmup": (sizes.warmup_files, sizes.warmup_files * per_small, 1),
        "small": (sizes.small_batches, sizes.small_batches * per_small, 1),
        "catchup": (sizes.catchup_files, sizes.catchup_events, sizes.files_per_batch),
    }
    return {
        name: generate(folder / name, seed, name, files, events, per_batch)
        for name, (files, events, per_batch) in shapes.items()
    }


def state_data(folder: Path, seed: int, held: int, sizes: Sizes) -> int:
    """(c)'s input: ``held`` distinct users in fill files of ``FILL_CHUNK`` (one event each,
    within ``FILL_SPAN_MS``), then ``touch_batches`` files each touching ``touched_users`` of
    them a second later than the file before. The files to skip before the touches."""
    rng = random.Random(f"{seed}/state/{held}")
    at = [rng.randrange(0, FILL_SPAN_MS, 2) for _ in range(held)]
    first_mtime = time.time() - 3600
    fills = range(0, held, FILL_CHUNK)
    for n, start in enumerate(fills):
        users = range(start, min(held, start + FILL_CHUNK))
        text = "".join(_state_line(u, at[u]) for u in users)
        land(folder, f"f{n:05d}.json", text, first_mtime + n)
    touched = rng.sample(range(held), min(held, sizes.touched_users))
    for k in range(sizes.touch_batches):
        text = "".join(_state_line(u, at[u] + (k + 1) * 1000) for u in touched)
        land(folder, f"f{len(fills) + k:05d}.json", text, first_mtime + len(fills) + k)
    return len(fills)


def _state_line(user: int, ms: int) -> str:
    return f'{{"user": "s{user}", "ts": "{iso_ms(T0_MS + ms)}", "amount": 1}}\n'


# ---------------------------------------------------------------- engines


def keyed_pipeline(name: str, source: Path, files_per_batch: int) -> Pipeline:
    """The benchmark's lowmark pipeline: ``source``'s files through the silence alert, into
    the Delta table ``out``."""
    return Pipeline(
        name=name,
        description="bench/keyed_state.py: an alert when a user has been silent for 10 s",
        source=FileSource(
            path=str(source), format="json", schema_ddl=SCHEMA, max_files_per_batch=files_per_batch
        ),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts", max_out_of_orderness=DELAY),
        keyed=Keyed(
            processor=SilenceAlert, keys=("user",), output_schema=ALERTS, time_mode="event_time"
        ),
    )


def run_lowmark(
    spark: SparkSession, data: Dataset, root: Path, name: str, files_per_batch: int
) -> Run:
    """lowmark over ``data``, batch by batch until caught up (timer-only batches included);
    the sink is ``root/out``."""
    started = time.perf_counter()
    pipeline = keyed_pipeline(f"keyed_{name}", data.folder, files_per_batch)
    results, seconds = lowmark_batches(spark, pipeline, root, name)
    total = time.perf_counter() - started
    rows_in = sum(r.rows_in for r in results)
    set_aside = sum(r.rows_bad + r.rows_late for r in results)
    if rows_in != data.events or set_aside:
        raise RuntimeError(
            f"lowmark {name}: read {rows_in} of {data.events} events, "
            f"set {set_aside} aside as bad or late"
        )
    timed = list(zip(results, seconds, strict=True))
    return Run([s for r, s in timed if r.rows_in], total, [s for r, s in timed if not r.rows_in])


def run_structured_streaming(
    spark: SparkSession, data: Dataset, root: Path, name: str, files_per_batch: int
) -> Run:
    """SSS's transformWithStateInPandas over ``data``, available-now; the sink is
    ``root/out``."""
    return sss_over_files(
        spark,
        SCHEMA,
        DELAY,
        data.folder,
        root,
        name,
        files_per_batch,
        lambda e: e.groupBy("user").transformWithStateInPandas(
            statefulProcessor=SilenceAlert(),
            outputStructType=ALERTS,
            outputMode="Append",
            timeMode="EventTime",
        ),
        data.events,
    )


def check_sinks(spark: SparkSession, name: str, data: Dataset, sinks: dict[str, Path]) -> None:
    """Raise unless every sink holds exactly the rule's alerts over ``data``, each once, each
    alerted 10 s after its silence began."""
    for engine, table in sinks.items():
        rows = (
            spark.read.format("delta")
            .load(str(table))
            .select(
                "user",
                F.unix_millis("silent_since").alias("since"),
                F.unix_millis("alerted_at").alias("at"),
            )
            .collect()
        )
        got = sorted((r.user, r.since) for r in rows)
        wrong_at = sum(r.at != r.since + SILENCE_MS for r in rows)
        if got != data.alerts or wrong_at:
            missing = sorted(set(data.alerts) - set(got))
            extra = sorted(set(got) - set(data.alerts))
            raise RuntimeError(
                f"{name}: {engine}'s sink holds {len(got)} alerts, the rule gives "
                f"{len(data.alerts)}; missing {missing[:5]}, extra {extra[:5]}, "
                f"repeated {len(got) - len(set(got))}, {wrong_at} with a wrong alerted_at"
            )
    _say(f"  {name}: both sinks hold the rule's {len(data.alerts):,} alerts once each")


def state_scaling(spark: SparkSession, work: Path, seed: int, sizes: Sizes) -> dict[int, float]:
    """(c): users held → lowmark's median seconds of a small batch touching
    ``touched_users`` of them. Each state is filled in turn; then their touch batches
    alternate."""
    held_sizes = (sizes.state_small, sizes.state_large)
    seconds: dict[int, list[float]] = {held: [] for held in held_sizes}
    with ExitStack() as stack:
        runners = {}
        for held in held_sizes:
            name = f"state_{held}"
            folder = work / "data" / name
            fills = state_data(folder, seed, held, sizes)
            pipeline = keyed_pipeline(f"keyed_{name}", folder, 1)
            runner = stack.enter_context(MicroBatchRunner(spark, pipeline, work / "lowmark" / name))
            started = time.perf_counter()
            filled = [_touch(runner, name) for _ in range(fills)]
            _say(f"  {name}: filled {held:,} users in {time.perf_counter() - started:.1f} s")
            _check_state(name, filled, held)
            runners[held] = runner
        for _ in range(sizes.touch_batches):
            for held, runner in runners.items():
                began = time.perf_counter()
                result = _touch(runner, f"state_{held}")
                seconds[held].append(time.perf_counter() - began)
                _check_state(f"state_{held}", [result], min(held, sizes.touched_users))
        if any(runner.run_batch() is not None for runner in runners.values()):
            raise RuntimeError("(c): a batch was left after the touches")
    medians = {held: statistics.median(s) for held, s in seconds.items()}
    for held, median in medians.items():
        _say(f"  state_{held}: small batch median {median:.2f} s")
    return medians


def _touch(runner: MicroBatchRunner, name: str) -> BatchResult:
    """One batch of ``runner``, printed."""
    began = time.perf_counter()
    result = runner.run_batch()
    if result is None:
        raise RuntimeError(f"{name}: no batch to run")
    _say(
        f"  lowmark {name} batch {result.batch_id}: {result.rows_in:,} rows in, "
        f"{result.rows_out:,} rows out, {time.perf_counter() - began:.2f} s"
    )
    return result


def _check_state(name: str, results: list[BatchResult], events: int) -> None:
    """Raise unless ``results`` read ``events`` events in all and wrote no alert (no
    timer of (c) is ever due)."""
    rows_in, alerts = sum(r.rows_in for r in results), sum(r.rows_out for r in results)
    if rows_in != events or alerts:
        raise RuntimeError(
            f"{name}: {len(results)} batches read {rows_in} of {events} events and wrote "
            f"{alerts} alerts (none expected)"
        )


# ---------------------------------------------------------------- report


def build_report(
    small: dict[str, Run],
    catchup: dict[str, Run],
    catchup_events: int,
    scaling: dict[int, float],
) -> tuple[list[Measure], list[Ratio]]:
    measures, ratios = small_and_catchup(small, catchup, catchup_events, ">= 1.2")
    (few, few_s), (many, many_s) = sorted(scaling.items())
    measures += [
        Measure("c_few", f"(c) small batch, {few:,} users held: median s", few_s),
        Measure("c_many", f"(c) small batch, {many:,} users held: median s", many_s),
    ]
    ratios.append(
        Ratio(
            "c", f"(c) lowmark small batch, {many:,} / {few:,} users held", many_s / few_s, "<= 1.5"
        )
    )
    # A small run's timer-only batches fire a few alerts: their cost is the batch's own.
    # The catch-up's last one fires every pending timer, its cost the processor's.
    for key, run in (("a", small["lowmark"]), ("b", catchup["lowmark"])):
        if run.idle_s:
            label = f"({key}) timer-only batches: median s"
            measures.append(Measure(f"{key}_timers", label, statistics.median(run.idle_s)))
            label = f"({key}) timer-only batches: the slowest s"
            measures.append(Measure(f"{key}_timers_max", label, max(run.idle_s)))
    if small["lowmark"].idle_s:
        slowest = max(small["lowmark"].idle_s)
        ratios.append(Ratio("timers", "(a) timer-only batch, the slowest: s", slowest, "<= 0.5"))
    return measures, ratios


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    started = time.monotonic()
    sizes = QUICK if args.quick else FULL
    overrides = {"small_batches": args.small_batches, "state_large": args.state_large}
    sizes = dataclasses.replace(sizes, **{k: v for k, v in overrides.items() if v})
    meta = run_meta(sizes, started, "bench.keyed_state")  # load average before Spark starts
    spark = session("lowmark-bench-keyed-state", {PROVIDER: ROCKSDB, CHANGELOG: "true"})
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="lowmark-bench-keyed-"))
    try:
        sets = datasets(work / "data", args.seed, sizes)
        for name, d in sets.items():
            _say(
                f"[data] {name}: {d.events:,} events, {len(d.alerts):,} alerts by the rule, "
                f"in {len(list(d.folder.iterdir()))} files"
            )
        engines: dict[str, Engine[Dataset]] = {
            "lowmark": run_lowmark,
            "sss": run_structured_streaming,
        }
        small_runs, catchup_runs = scenarios(
            spark, work, sets, sizes.files_per_batch, engines, check_sinks
        )
        _say(f"[c] state scaling: {sizes.state_small:,} vs {sizes.state_large:,} users held")
        scaling = state_scaling(spark, work, args.seed, sizes)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    measures, ratios = build_report(small_runs, catchup_runs, sets["catchup"].events, scaling)
    note = (
        "Both engines in one process, one after the other ((c): lowmark only); see the "
        "docstring of `bench/keyed_state.py` for what each row measures."
    )
    report(args, "bench/keyed_state.py", meta, started, measures, ratios, note)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parsing = parser("python -m bench.keyed_state", __doc__, FULL, QUICK)
    parsing.add_argument("--small-batches", type=int, help="(a) one-file batches")
    parsing.add_argument("--state-large", type=int, help="(c) users held in the large state")
    return parsing.parse_args(argv)


if __name__ == "__main__":
    main()
