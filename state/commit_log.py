"""The commit log: batch N is done once its entry is here.

Written AFTER every sink, state and late-table write of batch N succeeded.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pyspark.sql.types import LongType, StringType, StructField

from state.log import LogEntry, MetadataLog


class CommitEntry(LogEntry):
    """What batch N left behind: counts, the next watermark, versions it wrote."""

    COLUMNS: ClassVar[list[StructField]] = [
        StructField("next_watermark_ms", LongType(), True),
        StructField("max_event_time_ms", StringType(), False),
        StructField("table_versions", StringType(), False),
        StructField("rows_in", LongType(), False),
        StructField("rows_out", LongType(), False),
        StructField("rows_bad", LongType(), False),
        StructField("rows_late", LongType(), False),
    ]
    JSON_FIELDS: ClassVar[frozenset[str]] = frozenset({"max_event_time_ms", "table_versions"})

    next_watermark_ms: int | None = None
    max_event_time_ms: dict[str, int] = Field(default_factory=dict)
    table_versions: dict[str, int] = Field(default_factory=dict)
    rows_in: int = 0
    rows_out: int = 0
    rows_bad: int = 0
    rows_late: int = 0


class CommitLog(MetadataLog[CommitEntry]):
    """The ``commits`` table of a checkpoint.

    The batch loop ``claim``s its entry: a runner whose commit lost to another
    runner's (one replaying a batch this one was still running) stops.
    """
