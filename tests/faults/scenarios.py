"""Pipelines and inputs the crash tests run, in process and as `lowmark run` subprocesses.

A subprocess finds the pipelines with ``--pipelines tests.faults.scenarios``.
Every pipeline reads ``../input`` relative to its data root, so runs that
live in sibling folders (a reference, a template, one copy per crash case)
share one input folder, have one fingerprint, and a copied checkpoint's
file manifest still names files that exist. One source partition and no
idle timeout keep the watermark a function of the input alone, so a run
killed by a subprocess and a fault-free run in the test process agree.
"""

from __future__ import annotations

import json
import os
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from batches.pipeline import DeltaSink, FileSource, Pipeline
from batches.windows import (
    Aggregate,
    EventTime,
    Session,
    Sliding,
    Tumbling,
    WindowedAggregation,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"
INPUT = "../input"
SINK = "out"

Event = tuple[str, int, int]
"""(user, second after T0, amount)."""

File = list[Event | str]
"""One input file: events, and raw text for a malformed line."""


def _source() -> FileSource:
    return FileSource(path=INPUT, format="json", schema_ddl=SCHEMA, max_files_per_batch=1)


def _windowed(name: str, window: Tumbling | Sliding | Session, mode: str) -> Pipeline:
    return Pipeline(
        name=name,
        source=_source(),
        sink=DeltaSink(path=SINK),
        event_time=EventTime(
            column="ts", max_out_of_orderness="5 seconds", allowed_lateness="10 seconds"
        ),
        aggregation=WindowedAggregation(
            keys=("user",),
            window=window,
            # Integer aggregates only: the comparison with a reference run is exact.
            aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
            output_mode=mode,
        ),
    )


tumbling_append = _windowed("tumbling_append", Tumbling(size="10 seconds"), "append")
session_update = _windowed("session_update", Session(gap="5 seconds"), "update")
sliding_update = _windowed(
    "sliding_update", Sliding(size="10 seconds", slide="5 seconds"), "update"
)
plain_append = Pipeline(name="plain_append", source=_source(), sink=DeltaSink(path=SINK))

PIPELINES = {p.name: p for p in (tumbling_append, session_update, sliding_update, plain_append)}

FIXED_INPUT: list[File] = [
    [("a", 1, 1), ("b", 2, 2)],
    [("a", 7, 3), ("b", 14, 4), ("a", 14, 5)],
    [("c", 30, 6), '{"user": "b", "ts": oops', ("b", 18, 7)],
    # The batch the kill matrix kills (watermark 25 s): a@4 is late, a@16 and
    # b@21 extend windows and sessions open since earlier batches, the windows
    # [0,10) and sessions ending by 15 s are final and emitted or purged.
    [("a", 4, 8), ("a", 16, 9), ("b", 21, 10), ("c", 33, 11)],
]
"""Four files, one per batch; the last batch's watermark (28 s) closes nothing more."""


def random_input(rng: random.Random, files: int) -> list[File]:
    """``files`` files of a few events each, time moving forward with some disorder."""
    result: list[File] = []
    now = 0
    for _ in range(files):
        now += rng.randint(0, 15)
        rows: File = [
            (rng.choice("abc"), max(0, now - rng.randint(0, 25)), rng.randint(1, 9))
            for _ in range(rng.randint(1, 4))
        ]
        if rng.random() < 0.2:
            rows.insert(rng.randint(0, len(rows)), '{"user": oops')
        result.append(rows)
    return result


def write_input(folder: Path, files: list[File]) -> None:
    """File i as JSON lines, modified at second i (discovery order = list order)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, rows in enumerate(files):
        path = folder / f"f{i:03d}.json"
        path.write_text("".join(_line(r) + "\n" for r in rows))
        stamp = 1_700_000_000 + i
        os.utime(path, (stamp, stamp))


def _line(row: Event | str) -> str:
    if isinstance(row, str):
        return row
    user, second, amount = row
    record: dict[str, Any] = {
        "user": user,
        "ts": (T0 + timedelta(seconds=second)).isoformat(),
        "amount": amount,
    }
    return json.dumps(record)
