"""The offset log: the write-ahead record of what each batch reads.

Entry N is written BEFORE batch N processes anything, so a replay of N reads
exactly the same input with exactly the same watermark.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from lowmark.state.log import LogEntry, MetadataLog
from lowmark.state.table import DriverTable

Offsets = dict[str, int]
"""Source position per source partition, exclusive: ``{"0": 42}`` = records 0..41 taken."""

Identity = dict[str, str]
"""What a source's data is, by what it reads (``{"Kafka topic clicks": "<topic id>"}``): a
source deleted and created again under the same name has a new identity, and offsets
recorded against the old one mean nothing in it."""


LateRule = Literal["batch_clock", "own_clock", "own_horizon"]
"""How a batch judges a record late or a duplicate: ``batch_clock``, under an ingestion-time
watermark, when its windows closed under the batch's watermark; ``own_clock``, also when they
had closed by its own ingestion time minus the lag (docs/concepts.md, "Ingestion-time
watermarks"); ``own_horizon``, that, and deduplication, a stream-stream join and
``max_future`` by each record's own ingestion time too, deduplication judging an id's copies
in ingestion order and a copy behind its horizon late before a duplicate, under either
watermark (docs/deduplication.md)."""

LATE_RULE: LateRule = "own_horizon"
"""The rule this lowmark judges by (``lowmark.batches.event_time``)."""


class OffsetEntry(LogEntry):
    """Batch N's input range and the watermark it runs with."""

    COLUMNS: ClassVar[list[pa.Field]] = [
        pa.field("start_offsets", pa.string(), nullable=False),
        pa.field("end_offsets", pa.string(), nullable=False),
        pa.field("batch_watermark_ms", pa.int64()),
        pa.field("pipeline_fingerprint", pa.string(), nullable=False),
        pa.field("source_identity", pa.string()),
        pa.field("input_skipped", pa.string()),
        # Added later: null in entries written before.
        pa.field("waiting_partitions", pa.list_(pa.string())),
        pa.field("pipeline_definition", pa.string()),
        pa.field("ingestion_ms", pa.string()),
        pa.field("window_watermark_ms", pa.int64()),
        pa.field("dimension_versions", pa.string()),
        pa.field("late_rule", pa.string()),
    ]
    JSON_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {
            "start_offsets",
            "end_offsets",
            "source_identity",
            "input_skipped",
            "pipeline_definition",
            "ingestion_ms",
            "dimension_versions",
        }
    )

    start_offsets: Offsets
    end_offsets: Offsets
    batch_watermark_ms: int | None = None
    pipeline_fingerprint: str
    source_identity: Identity = Field(default_factory=dict)
    """The source's identity when the batch was planned (empty in entries written before
    lowmark recorded it: the next batch records it)."""
    input_skipped: dict[str, int] = Field(default_factory=dict)
    """Input upstream lost between the previous batch's end and this batch's start, which
    the batch passed over (``on_data_loss: skip``), by units (``{"records": 10}``)."""
    waiting_partitions: list[str] = Field(default_factory=list)
    """Source partitions with records past ``end_offsets`` when the batch was planned (the
    admission limit left them for later batches): never idle for the batch's watermarks."""
    pipeline_definition: dict[str, Any] | None = None
    """What ``pipeline_fingerprint`` hashes, as JSON (None in entries written before lowmark
    recorded it): a changed definition is then named field by field."""
    ingestion_ms: dict[str, int] | None = None
    """With an ingestion-time watermark: per source partition, the ingestion time of the
    first record past ``end_offsets`` when the batch was planned (``Source.ingestion_times``):
    the clock the next batch starts from, recorded so a replay commits the same one. None
    otherwise."""
    window_watermark_ms: int | None = None
    """With a keyed step before windows: the watermark the window stage runs with, the
    keyed step's of the batch before (``batch_watermark_ms`` of batch N-1), recorded so a
    replay judges lateness and closes windows alike. None otherwise (the window stage,
    if any, runs with ``batch_watermark_ms``)."""
    dimension_versions: dict[str, int] | None = None
    """With stream-table joins: the Delta version of each joined table (by its ``table`` as
    written), its newest when the batch was planned, recorded so a replay joins against the
    same rows. None otherwise."""
    late_rule: LateRule = LATE_RULE
    """The rule the batch judges late records by, this lowmark's when it was planned. Entries
    written before lowmark recorded it read as ``batch_clock``: every lowmark before it judged
    by the batch's clock, but for the short time ``own_clock`` went unrecorded, with no
    release in between."""

    @classmethod
    def from_row(cls, values: dict[str, Any], path: str) -> OffsetEntry:
        if values.get("late_rule") is None:  # planned before lowmark recorded its rule
            values = {**values, "late_rule": "batch_clock"}
        entry = super().from_row(values, path)
        assert isinstance(entry, OffsetEntry)
        return entry


class OffsetLog(MetadataLog[OffsetEntry]):
    """The ``offsets`` table of a checkpoint, and ``offsets_history``: the entries
    maintenance retired from it.

    Claiming a batch id here (``claim``) is what makes a runner the
    pipeline's runner: two runners can never process different offsets
    under one batch id. Recovery reads only the newest entries, so maintenance keeps the
    last ``maintenance.log_batches`` in the log; the older ones move to the history
    (``retire``), where ``lowmark rebuild`` finds every batch's boundaries (``recorded``).
    No batch reads or writes the history: it grows by one append per maintenance.
    """

    def __init__(self, path: str, entry_type: type[OffsetEntry], txn_app_id: str) -> None:
        super().__init__(path, entry_type, txn_app_id)
        self.history = DriverTable(f"{self.path}_history", self.table.schema, "offset log history")

    def retire(self, below: int) -> None:
        """Copy the entries of batches before ``below`` to the history, before maintenance
        drops them from the log. Appended whole, not once per batch: a maintenance cut short
        between this and the drop, or two at once, leave an entry twice in the history,
        which ``recorded`` reads once."""
        rows = self.table.read(f'"batch_id" < {int(below)}')
        if rows.num_rows:
            self.history.append(rows)

    def recorded(self, start: int, end: int) -> list[OffsetEntry]:
        """Entries with ``start <= batch_id <= end``, from the log and, for the batches
        maintenance retired from it, from the history (each once), in batch order."""
        found = {e.batch_id: e for e in self.get_range(start, end)}
        if (not found or min(found) > start) and self.history.exists():
            retired = self.get_range(start, end, self.history)
            found = {e.batch_id: e for e in retired} | found
        return [found[batch_id] for batch_id in sorted(found)]
