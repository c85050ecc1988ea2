"""The ``failures`` table: each failed attempt at a batch, so a poison batch stops.

A batch whose data work fails the same way every time (a transform error on
one row under ANSI mode, duplicate keys in a MERGE batch) would otherwise be
replayed forever. Each failed attempt appends a row here (batch id, runner,
time, the error's first line); ``batches.poison`` counts them. Created by the
first failure; rows are events, not a batch's output, so they carry no
idempotency key (a repeated row only counts an attempt twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa

from state.log import utc_now
from state.table import UTC_MICROS, DriverTable

SCHEMA = pa.schema(
    [
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("runner_id", pa.string(), nullable=False),
        pa.field("failed_at", UTC_MICROS, nullable=False),
        pa.field("error", pa.string(), nullable=False),
    ]
)


@dataclass(frozen=True)
class Failure:
    batch_id: int
    runner_id: str
    failed_at: datetime
    error: str


class FailureLog:
    """The ``failures`` table of a checkpoint."""

    def __init__(self, path: str) -> None:
        self.table = DriverTable(path, SCHEMA, "failures table")
        self.path = self.table.path

    def record(self, batch_id: int, runner_id: str, error: str) -> None:
        row = {"batch_id": batch_id, "runner_id": runner_id, "failed_at": utc_now(), "error": error}
        self.table.append(pa.Table.from_pylist([row], schema=SCHEMA))

    def of(self, batch_id: int) -> list[Failure]:
        """Failed attempts at ``batch_id``, oldest first."""
        if not self.table.exists():
            return []
        rows = self.table.read(f'"batch_id" = {int(batch_id)}').to_pylist()
        return sorted((Failure(**r) for r in rows), key=lambda f: f.failed_at)
