"""The progress table: one row per committed batch, for people and dashboards.

Like Spark's ``StreamingQueryProgress``, but a Delta table you can query.
Written after the commit; it describes, it never decides recovery.
"""

from __future__ import annotations

from typing import ClassVar

import pyarrow as pa
from pydantic import Field

from lowmark.state.log import LogEntry, MetadataLog


class ProgressEntry(LogEntry):
    """Timings and counts of one committed batch."""

    COLUMNS: ClassVar[list[pa.Field]] = [
        pa.field("replayed", pa.bool_(), nullable=False),
        pa.field("durations_ms", pa.string(), nullable=False),
        pa.field("rows_in", pa.int64(), nullable=False),
        pa.field("rows_out", pa.int64(), nullable=False),
        pa.field("rows_bad", pa.int64(), nullable=False),
        pa.field("rows_late", pa.int64(), nullable=False),
        pa.field("watermark_ms", pa.int64()),
        pa.field("lag_ms", pa.int64()),
        pa.field("input_skipped", pa.string()),
        # Added later: null in rows written before.
        pa.field("violations", pa.string()),
        pa.field("rows_duplicate", pa.int64()),
    ]
    JSON_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"durations_ms", "input_skipped", "violations"}
    )

    replayed: bool = False
    durations_ms: dict[str, int]
    rows_in: int
    rows_out: int
    rows_bad: int
    rows_late: int = 0
    rows_duplicate: int | None = None
    """Records deduplication dropped (None: the pipeline has no ``dedup``)."""
    violations: dict[str, int] = Field(default_factory=dict)
    """Per expectation, the records that violated it (``parsable``: rows that did not
    parse)."""
    watermark_ms: int | None = None
    lag_ms: int | None = None
    input_skipped: dict[str, int] = Field(default_factory=dict)
    """Input upstream lost before the batch read it, passed over by units (``{"records":
    10}``): the gap between the previous batch's end and this batch's start
    (``on_data_loss: skip``)."""


class ProgressLog(MetadataLog[ProgressEntry]):
    """The ``progress`` table of a checkpoint."""
