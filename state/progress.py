"""The progress table: one row per committed batch, for people and dashboards.

Like Spark's ``StreamingQueryProgress``, but a Delta table you can query.
Written after the commit; it describes, it never decides recovery.
"""

from __future__ import annotations

from typing import ClassVar

from pyspark.sql.types import BooleanType, LongType, StringType, StructField

from state.log import LogEntry, MetadataLog


class ProgressEntry(LogEntry):
    """Timings and counts of one committed batch."""

    COLUMNS: ClassVar[list[StructField]] = [
        StructField("replayed", BooleanType(), False),
        StructField("durations_ms", StringType(), False),
        StructField("rows_in", LongType(), False),
        StructField("rows_out", LongType(), False),
        StructField("rows_bad", LongType(), False),
        StructField("rows_late", LongType(), False),
        StructField("watermark_ms", LongType(), True),
        StructField("lag_ms", LongType(), True),
    ]
    JSON_FIELDS: ClassVar[frozenset[str]] = frozenset({"durations_ms"})

    replayed: bool = False
    durations_ms: dict[str, int]
    rows_in: int
    rows_out: int
    rows_bad: int
    rows_late: int = 0
    watermark_ms: int | None = None
    lag_ms: int | None = None


class ProgressLog(MetadataLog[ProgressEntry]):
    """The ``progress`` table of a checkpoint."""
