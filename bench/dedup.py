"""Deduplication by record id: lowmark's ``dedup`` next to Structured Streaming's
``dropDuplicatesWithinWatermark``, on the same data, in the same run.

The data is generated from a seed: JSON-lines files of events
``{id, user, ts, amount}``, each file moving event time forward by 10
minutes with events up to 20 minutes out of order. About a fifth of the
events are re-sends of an event sent shortly before (the same line: same id,
same ts, same payload): half of them a few lines after the original in the
same file, half in a later file, up to three files (30 minutes of event
time) after it. No event is ever behind either engine's watermark, so every
re-send is within the horizon: both sinks must hold each id exactly once.

- lowmark: a stateless pipeline, files source → ``dedup: {columns: [id],
  within: 60 minutes}`` → Delta sink, ``event_time`` with 60 minutes of
  ``max_out_of_orderness``, run batch by batch with ``MicroBatchRunner``.
- Structured Streaming (SSS): ``withWatermark("ts", "60 minutes")
  .dropDuplicatesWithinWatermark(["id"])``, Delta sink with a checkpoint,
  ``maxFilesPerTrigger`` = lowmark's ``max_files_per_batch``,
  ``trigger(availableNow=True)``, default (HDFS-backed) state store.

SSS holds an id until its watermark passes the id's event time plus the
watermark's delay; ``within`` equal to that delay makes lowmark hold its ids
as long. A deduplicating lowmark pipeline reads no batches ahead in a
catch-up (each batch's verdicts depend on the ids the batch before it let
through), so both engines take the input batch by batch: like for like.

Both engines run in this one process's Spark session, one after the other.
Each is first warmed the same way: an unreported catch-up over a small
warm-up dataset. Scenarios:

(a) small batches: one file of 300 events per batch; seconds per batch,
    median and p95 (lowmark: wall time of ``run_batch``; SSS: each batch's
    ``durationMs.triggerExecution``); batches that read no input left out.
(b) catch-up: 300 000 events in 50 files, 10 files per batch; events/s from
    "start the stream" to "caught up".

Checked in the run (raises if not): each sink holds as many rows as the
input has distinct ids, each id once. Prints a table and the ratios lowmark
/ SSS against their targets, and writes them to ``--results`` if given.
Timings are wall-clock on whatever else the machine is doing; run it on a
quiet box. No other assertions.

    .venv/bin/python -m bench.dedup            # the full run (make bench), a few minutes
    .venv/bin/python -m bench.dedup --quick    # a smoke run with tiny sizes
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.history import _iso
from bench.side_by_side import (
    Run,
    lowmark_batches,
    main_of_two_scenarios,
    parser,
    sss_over_files,
)
from bench.streaming import (
    T0_S,
    _say,
    land,
)
from lowmark.batches.dedup import Dedup
from lowmark.batches.pipeline import DeltaSink, FileSource, Pipeline
from lowmark.batches.windows import EventTime

SCHEMA = "id STRING, user STRING, ts TIMESTAMP, amount LONG"
DELAY = "60 minutes"
"""SSS's watermark delay, lowmark's ``max_out_of_orderness`` and its ``dedup.within``."""
FILE_SPAN_S = 600
"""Event time each file moves forward."""
DISORDER_S = 1200
"""Events lag their file's position in event time by up to this much."""
RESEND_SHARE = 0.2
"""Of each file's events, the share that are re-sends."""
RESEND_FILES = 3
"""A re-send in a later file trails its original by at most this many files. With the
disorder, 3 x 600 s + 1200 s stays below the 60-minute delay: never behind a watermark."""
RESEND_GAP_LINES = 20
"""A re-send in its original's file comes up to this many lines after it."""


@dataclass(frozen=True)
class Sizes:
    warmup_files: int
    small_batches: int
    events_per_small_file: int
    catchup_events: int
    catchup_files: int
    files_per_batch: int
    users: int


FULL = Sizes(5, 30, 300, 300_000, 50, 10, 1_000)
QUICK = Sizes(2, 5, 300, 3_000, 10, 5, 1_000)


@dataclass(frozen=True)
class Dataset:
    """Generated input: its folder, events in all (re-sends included) and distinct ids."""

    folder: Path
    events: int
    distinct: int


# ---------------------------------------------------------------- data


def generate(folder: Path, seed: int, dataset: str, files: int, events: int, users: int) -> Dataset:
    """``files`` files holding ``events`` events in all, re-sends included (see the module
    docstring); modification times in file order. Deterministic given the seed."""
    rng = random.Random(f"{seed}/{dataset}")
    recent: deque[list[str]] = deque(maxlen=RESEND_FILES)  # earlier files' original lines
    first_mtime = time.time() - 3600
    distinct = 0
    for i in range(files):
        share = events // files + (1 if i < events % files else 0)
        resends = round(share * RESEND_SHARE)
        originals = [
            _event_line(rng, f"e{i:05d}-{k:06d}", i, users) for k in range(share - resends)
        ]
        # Each line gets a place in the file: an original its index, a re-send of one of
        # this file's originals a place a few lines after it, of an earlier file's anywhere.
        placed = [(float(k), line) for k, line in enumerate(originals)]
        for _ in range(resends):
            if recent and rng.random() < 0.5:
                line = rng.choice(rng.choice(recent))
                placed.append((rng.random() * len(originals), line))
            else:
                k = rng.randrange(len(originals))
                placed.append((k + 0.5 + rng.random() * RESEND_GAP_LINES, originals[k]))
        placed.sort(key=lambda p: p[0])
        land(folder, f"f{i:05d}.json", "".join(line for _, line in placed), first_mtime + i)
        recent.append(originals)
        distinct += len(originals)
    return Dataset(folder, events, distinct)


def datasets(folder: Path, seed: int, sizes: Sizes) -> dict[str, Dataset]:
    """The warm-up, small-batch and catch-up inputs, each in its folder below ``folder``."""
    per_small = sizes.events_per_small_file
    shapes = {  # files, events
        "warmup": (sizes.warmup_files, sizes.warmup_files * per_small),
        "small": (sizes.small_batches, sizes.small_batches * per_small),
        "catchup": (sizes.catchup_files, sizes.catchup_events),
    }
    return {
        name: generate(folder / name, seed, name, files, events, sizes.users)
        for name, (files, events) in shapes.items()
    }


def _event_line(rng: random.Random, id_: str, index: int, users: int) -> str:
    t = T0_S + index * FILE_SPAN_S + rng.random() * FILE_SPAN_S - rng.random() * DISORDER_S
    user, amount = rng.randrange(users), rng.randint(1, 10_000)
    return f'{{"id": "{id_}", "user": "u{user}", "ts": "{_iso(t)}", "amount": {amount}}}\n'


# ---------------------------------------------------------------- engines


def deduplicating_pipeline(name: str, source: Path, files_per_batch: int) -> Pipeline:
    """The benchmark's lowmark pipeline: ``source``'s files, ids dropped within the horizon,
    into the Delta table ``out``."""
    return Pipeline(
        name=name,
        description="bench/dedup.py: every event once, by id",
        source=FileSource(
            path=str(source), format="json", schema_ddl=SCHEMA, max_files_per_batch=files_per_batch
        ),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts", max_out_of_orderness=DELAY),
        dedup=Dedup(columns=("id",), within=DELAY),
    )


def run_lowmark(
    spark: SparkSession, data: Dataset, root: Path, name: str, files_per_batch: int
) -> Run:
    """lowmark over ``data``, batch by batch until caught up; the sink is ``root/out``."""
    started = time.perf_counter()
    pipeline = deduplicating_pipeline(f"dedup_{name}", data.folder, files_per_batch)
    results, seconds = lowmark_batches(spark, pipeline, root, name)
    total = time.perf_counter() - started
    rows_in = sum(r.rows_in for r in results)
    duplicates = sum(r.rows_duplicate or 0 for r in results)
    set_aside = sum(r.rows_bad + r.rows_late for r in results)
    expected = data.events - data.distinct
    if rows_in != data.events or duplicates != expected or set_aside:
        raise RuntimeError(
            f"lowmark {name}: read {rows_in} of {data.events} events, dropped {duplicates} "
            f"of {expected} duplicates, set {set_aside} aside as bad or late"
        )
    return Run([s for r, s in zip(results, seconds, strict=True) if r.rows_in], total)


def run_structured_streaming(
    spark: SparkSession, data: Dataset, root: Path, name: str, files_per_batch: int
) -> Run:
    """SSS's deduplication over ``data``, available-now; the sink is ``root/out``."""
    return sss_over_files(
        spark,
        SCHEMA,
        DELAY,
        data.folder,
        root,
        name,
        files_per_batch,
        lambda e: e.dropDuplicatesWithinWatermark(["id"]),
        data.events,
    )


def check_sinks(spark: SparkSession, name: str, data: Dataset, sinks: dict[str, Path]) -> None:
    """Raise unless every sink holds each of the input's distinct ids exactly once."""
    for engine, table in sinks.items():
        rows, ids = spark.read.format("delta").load(str(table)).agg(
            F.count(F.lit(1)), F.count_distinct("id")
        ).first() or (0, 0)
        if rows != data.distinct or ids != data.distinct:
            raise RuntimeError(
                f"{name}: {engine}'s sink holds {rows} rows of {ids} ids; "
                f"the input has {data.distinct} distinct ids"
            )
    _say(f"  {name}: both sinks hold the {data.distinct:,} distinct ids once each")


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    sizes = QUICK if args.quick else FULL
    overrides = {"small_batches": args.small_batches, "catchup_events": args.catchup_events}
    sizes = dataclasses.replace(sizes, **{k: v for k, v in overrides.items() if v})
    main_of_two_scenarios(
        args,
        sizes,
        "bench.dedup",
        lambda folder: datasets(folder, args.seed, sizes),
        lambda d: (
            f"{d.events:,} events, {d.distinct:,} distinct ids, "
            f"in {len(list(d.folder.iterdir()))} files"
        ),
        {"lowmark": run_lowmark, "sss": run_structured_streaming},
        check_sinks,
        lambda d: d.events,
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parsing = parser("python -m bench.dedup", __doc__, FULL, QUICK)
    parsing.add_argument("--small-batches", type=int, help="(a) one-file batches")
    parsing.add_argument("--catchup-events", type=int, help="(b) events in all")
    return parsing.parse_args(argv)


if __name__ == "__main__":
    main()
