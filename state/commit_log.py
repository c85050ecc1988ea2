"""The commit log: batch N is done once its entry is here.

Written AFTER every sink, state and late-table write of batch N succeeded.
"""

from __future__ import annotations

from typing import ClassVar

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from lowmark.state.log import LogEntry, MetadataLog


class BatchCounts(BaseModel):
    """Where a batch's records went: the counts of its commit entry, each a column of the
    commit log (all zero: no input taken). See ``CommitEntry.totals`` for how they add up."""

    model_config = ConfigDict(frozen=True)

    rows_in: int = 0
    rows_out: int = 0
    rows_bad: int = 0
    rows_late: int = 0
    rows_dropped: int = 0
    """Records the transform removed (negative: records it added)."""
    rows_windowed: int = 0
    """Records that went into windows (windowed pipelines)."""
    rows_closed: int = 0
    """Records in the windows this batch closed (emitted as final, purged from state)."""
    rows_duplicate: int = 0
    """Records deduplication dropped: their id was let through before (``dedup``)."""
    rows_keyed: int = 0
    """Records a keyed step's processor was given (``keyed``)."""
    rows_emitted: int = 0
    """Rows a keyed step's processor emitted (``keyed``): the sink's rows, or the rows the
    windows of an aggregation after it take."""
    violations: dict[str, int] = Field(default_factory=dict)
    """Per expectation, the records that violated it (``parsable``: rows that did not
    parse). A ``drop`` expectation's records are among ``rows_bad``."""


COUNTS = tuple(k for k, f in BatchCounts.model_fields.items() if f.annotation is int)
"""The count columns of the commit log."""


class CommitEntry(LogEntry, BatchCounts):
    """What batch N left behind: counts, the next watermark, versions it wrote.

    ``table_versions`` maps each table the batch wrote (``state``, ``sink``,
    ``watermarks``) to its Delta version after the batch. The per-partition
    event times live once, in the watermarks table.
    """

    COLUMNS: ClassVar[list[pa.Field]] = [
        pa.field("next_watermark_ms", pa.int64()),
        pa.field("table_versions", pa.string(), nullable=False),
        pa.field("rows_in", pa.int64(), nullable=False),
        pa.field("rows_out", pa.int64(), nullable=False),
        pa.field("rows_bad", pa.int64(), nullable=False),
        pa.field("rows_late", pa.int64(), nullable=False),
        pa.field("totals", pa.string(), nullable=False),
        # Added later: null in entries written before.
        pa.field("rows_dropped", pa.int64()),
        pa.field("rows_windowed", pa.int64()),
        pa.field("rows_closed", pa.int64()),
        pa.field("violations", pa.string()),
        pa.field("violation_totals", pa.string()),
        pa.field("rows_duplicate", pa.int64()),
        pa.field("rows_keyed", pa.int64()),
        pa.field("next_timer_ms", pa.int64()),
        pa.field("rows_emitted", pa.int64()),
    ]
    JSON_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"table_versions", "totals", "violations", "violation_totals"}
    )

    batch_id: int = Field(ge=-1)
    """-1: the commit a checkpoint made by ``lowmark reset --after-sink`` starts from
    (``Checkpoint.start_commit``; never in the log)."""
    next_watermark_ms: int | None = None
    next_timer_ms: int | None = None
    """A keyed step's earliest pending timer after the batch (None: none, or no keyed step):
    a batch with no new input runs once it is due."""
    table_versions: dict[str, int] = Field(default_factory=dict)
    totals: dict[str, int] = Field(default_factory=dict)
    """Every ``rows_*`` count summed over batches 0..N, so the totals cost one row to read at
    any batch.

    The accounting identity, per batch and in total: ``rows_in = rows_bad +
    rows_dropped + rows_duplicate + rows_late + rows_windowed`` (windowed pipelines; ``+ rows_out``,
    the sink's rows, instead of ``rows_windowed`` for stateless ones; ``+ rows_keyed``, the
    records a keyed step's processor was given, for keyed ones), and the
    records still in open windows are ``rows_windowed - rows_closed`` in total. With a
    keyed step before windows the windows take the processor's rows, so the identity
    counts them on both sides: ``rows_in + rows_emitted = rows_bad + rows_dropped +
    rows_duplicate + rows_late + rows_keyed + rows_windowed`` (``rows_late``: the records
    the keyed step set aside and its rows the windows refused)."""
    violation_totals: dict[str, int] = Field(default_factory=dict)
    """``violations`` summed over batches 0..N, per expectation (one that batches before it
    did not have counts from its first batch)."""

    def plus_totals(self, previous: CommitEntry | None) -> CommitEntry:
        """This entry with ``totals`` = ``previous``'s totals + this batch's counts, and
        ``violation_totals`` likewise."""
        return self.model_copy(
            update={
                "totals": _summed(previous.totals if previous else {}, self, COUNTS),
                "violation_totals": _added(
                    previous.violation_totals if previous else {}, self.violations
                ),
            }
        )


def _summed(before: dict[str, int], entry: BatchCounts, keys: tuple[str, ...]) -> dict[str, int]:
    return _added({k: before.get(k, 0) for k in keys}, {k: getattr(entry, k) for k in keys})


def _added(before: dict[str, int], counts: dict[str, int]) -> dict[str, int]:
    """``before`` + ``counts``, key by key (a key of either one)."""
    keys = dict.fromkeys([*before, *counts])  # in order: ``before``'s first
    return {k: before.get(k, 0) + counts.get(k, 0) for k in keys}


class CommitLog(MetadataLog[CommitEntry]):
    """The ``commits`` table of a checkpoint.

    The batch loop ``claim``s its entry: a runner whose commit lost to another
    runner's (one replaying a batch this one was still running) stops.
    """
