"""The watermarks table: per source partition, its max event time, watermark
and the last time it saw data, as of each committed batch.

Appended with every commit of a pipeline with event time (idempotently per
batch), one row per partition known so far: the rows of batch N are the
whole picture after batch N. This is the one place per-partition event
times are stored.
"""

from __future__ import annotations

import pyarrow as pa

from lowmark.state.table import DriverTable

SCHEMA = pa.schema(
    [
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("partition", pa.string(), nullable=False),
        pa.field("max_event_time_ms", pa.int64(), nullable=False),
        pa.field("watermark_ms", pa.int64(), nullable=False),
        pa.field("last_seen_ms", pa.int64(), nullable=False),
    ]
)

Row = tuple[str, int, int, int]
"""(partition, max_event_time_ms, watermark_ms, last_seen_ms)."""


class WatermarkTable:
    """The ``watermarks`` table of a checkpoint."""

    def __init__(self, path: str, txn_app_id: str) -> None:
        self.table = DriverTable(path, SCHEMA, "checkpoint table")
        self.path = self.table.path
        self.txn_app_id = txn_app_id

    def write(self, batch_id: int, rows: list[Row]) -> int:
        """Record batch ``batch_id``'s rows once; the table's version after it."""
        self.table.append_once(_rows(batch_id, rows), self.txn_app_id, batch_id)
        return self.table.version()

    def start_with(self, rows: list[Row]) -> int:
        """Record ``rows`` as batch -1's, in a checkpoint that has no batch yet (what
        ``lowmark reset --after-sink`` carries over); the table's version after it."""
        self.table.append(_rows(-1, rows))
        return self.table.version()

    def at(self, batch_id: int) -> list[Row]:
        """The rows batch ``batch_id`` wrote, by partition."""
        rows = self.table.read(f'"batch_id" = {int(batch_id)}').to_pylist()
        return sorted(
            (r["partition"], r["max_event_time_ms"], r["watermark_ms"], r["last_seen_ms"])
            for r in rows
        )


def _rows(batch_id: int, rows: list[Row]) -> pa.Table:
    """``rows`` as batch ``batch_id``'s rows of the table."""
    names = SCHEMA.names[1:]
    data = [{"batch_id": batch_id, **dict(zip(names, row, strict=True))} for row in rows]
    return pa.Table.from_pylist(data, schema=SCHEMA)
