"""The ``failures`` table: each failed attempt at a batch, so a poison batch stops.

A batch whose data work fails the same way every time (a transform error on
one row under ANSI mode, duplicate keys in a MERGE batch) would otherwise be
replayed forever. Each failed attempt appends a row here (batch id, runner,
time, the error's first line, and its kind: ``data`` when the batch's data work
failed, ``operational`` when something around it did — a file gone, history
gone, a damaged checkpoint; see ``lowmark.batches.loop.poison``, which counts them).
Created by the first failure; rows are events, not a batch's output, so they
carry no idempotency key (a repeated row only counts an attempt twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import pyarrow as pa

from lowmark.state.log import utc_now
from lowmark.state.table import UTC_MICROS, DriverTable

SCHEMA = pa.schema(
    [
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("runner_id", pa.string(), nullable=False),
        pa.field("failed_at", UTC_MICROS, nullable=False),
        pa.field("error", pa.string(), nullable=False),
        # Added later: rows written before it have none, and were data failures.
        pa.field("kind", pa.string(), nullable=True),
    ]
)

FailureKind = Literal["data", "operational"]


@dataclass(frozen=True)
class Failure:
    batch_id: int
    runner_id: str
    failed_at: datetime
    error: str
    kind: FailureKind = "data"


class FailureLog:
    """The ``failures`` table of a checkpoint."""

    def __init__(self, path: str) -> None:
        self.table = DriverTable(path, SCHEMA, "failures table")
        self.path = self.table.path

    def record(self, batch_id: int, runner_id: str, error: str, kind: FailureKind = "data") -> None:
        row = {
            "batch_id": batch_id,
            "runner_id": runner_id,
            "failed_at": utc_now(),
            "error": error,
            "kind": kind,
        }
        self.table.append(pa.Table.from_pylist([row], schema=SCHEMA))

    def of(self, batch_id: int) -> list[Failure]:
        """Failed attempts at ``batch_id``, oldest first."""
        if not self.table.exists():
            return []
        rows = self.table.read(f'"batch_id" = {int(batch_id)}').to_pylist()
        failures = (Failure(**(r | {"kind": r.get("kind") or "data"})) for r in rows)
        return sorted(failures, key=lambda f: f.failed_at)
