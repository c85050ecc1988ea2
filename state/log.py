"""A generic, append-only metadata log kept as a Delta table: one row per batch.

Modelled on Spark's ``HDFSMetadataLog``: ``add``, ``get``, ``get_latest`` and
``get_range`` over typed, versioned entries. Each row carries the format it was
written in (``FORMAT_VERSION``, the checkpoint's); a reader refuses rows from a
newer format instead of misreading them. ``add`` is idempotent per batch (a Delta application
transaction keyed on the pipeline and the log's role); ``claim`` also
detects another runner's entry.

A log is a ``DriverTable``: read and written on the driver, no Spark job.
The newest batch id is the log's transaction version (kept in the Delta log
itself), so ``get_latest`` reads one row, never the whole table.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Generic, TypeVar

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from lowmark.state.errors import CheckpointCorrupt, ConcurrentRunner, UnsupportedLogFormat
from lowmark.state.table import UTC_MICROS, DriverTable

FORMAT_VERSION = 2
"""The checkpoint format this lowmark writes, and the newest it reads: recorded in a
checkpoint's metadata table when it is created (``lowmark.state.checkpoint``) and in every log
row (offsets, commits, progress). The checkpoint's other tables (manifest, schema, watermarks,
window state, seen ids, keyed state and timers, join state, late and bad records, failures)
record none of their own: they are of their checkpoint's format. A checkpoint or row that
records none is of format 1, the format of everything written before lowmark recorded it. A
newer one is refused, never misread.

What a new format means, and how to make one: raise this constant only for a change an older
lowmark would misread (a column it reads differently, a table it would not know to keep up);
a nullable column an older lowmark ignores, or reads as its default, is no new format. With
the raise, give ``Checkpoint`` one migration per step, ``FORMAT_VERSION - 1`` to
``FORMAT_VERSION`` (a function of the checkpoint; the identity when only the recorded number
changes), which ``Checkpoint`` runs in order on a checkpoint of an older format when it opens
it, before anything reads its tables, recording each step's format in the metadata table. A
raise whose change is only a value in new log rows needs no step: each row carries its format,
so an older lowmark refuses the first new row it reads in one line, and this one reads the old
rows as they are.

The formats: 1, the first; 2, offsets rows whose ``late_rule`` is ``own_horizon`` (a value
format 1 readers do not know, ``lowmark.state.offset_log.LateRule``), no step."""

BASE_FIELDS = [
    pa.field("batch_id", pa.int64(), nullable=False),
    pa.field("format_version", pa.int32(), nullable=False),
    pa.field("runner_id", pa.string(), nullable=False),
    pa.field("created_at", UTC_MICROS, nullable=False),
]


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def utc_now() -> datetime:
    """Wall-clock now, timezone-aware UTC."""
    return datetime.now(UTC)


class LogEntry(BaseModel):
    """One batch's row. Subclasses add fields and list their Arrow columns.

    ``COLUMNS`` are the subclass's own columns, after the base ones; fields
    named in ``JSON_FIELDS`` are stored as JSON text (maps of offsets etc.).
    """

    model_config = ConfigDict(frozen=True)

    FORMAT_VERSION: ClassVar[int] = FORMAT_VERSION
    COLUMNS: ClassVar[list[pa.Field]] = []
    JSON_FIELDS: ClassVar[frozenset[str]] = frozenset()

    batch_id: int = Field(ge=0)
    runner_id: str
    created_at: datetime = Field(default_factory=utc_now)

    @property
    def created_ms(self) -> int:
        """``created_at`` in epoch milliseconds, exactly (no float rounding: a replay must
        plan with the very processing time its batch was planned with)."""
        return (self.created_at - EPOCH) // timedelta(milliseconds=1)

    @classmethod
    def arrow_schema(cls) -> pa.Schema:
        return pa.schema(BASE_FIELDS + cls.COLUMNS)

    def to_row(self) -> dict[str, Any]:
        values = self.model_dump()
        values["format_version"] = self.FORMAT_VERSION
        for name in self.JSON_FIELDS:
            values[name] = json.dumps(values[name], sort_keys=True)
        return {name: values[name] for name in self.arrow_schema().names}

    @classmethod
    def from_row(cls, values: dict[str, Any], path: str) -> LogEntry:
        if values["format_version"] > cls.FORMAT_VERSION:
            raise UnsupportedLogFormat(
                f"{path} batch {values['batch_id']} has format {values['format_version']}, "
                f"this lowmark reads up to {cls.FORMAT_VERSION}: upgrade lowmark"
            )
        try:
            for name in cls.JSON_FIELDS:
                if values.get(name) is not None:  # null: a column added after the row
                    values[name] = json.loads(values[name])
            values["created_at"] = values["created_at"].astimezone(UTC)
            # A column added after a row was written is null in it: the field's default.
            return cls.model_validate({k: v for k, v in values.items() if v is not None})
        except (ValueError, TypeError) as exc:
            raise CheckpointCorrupt(
                f"checkpoint table {path} batch {values.get('batch_id')} cannot be read "
                f"({str(exc).splitlines()[0]}): restore it from backup, or start over with "
                "`lowmark reset`"
            ) from exc


E = TypeVar("E", bound=LogEntry)


class MetadataLog(Generic[E]):
    """An append-only Delta table of ``entry_type`` rows, one per batch id."""

    def __init__(self, path: str, entry_type: type[E], txn_app_id: str) -> None:
        self.table = DriverTable(path, entry_type.arrow_schema())
        self.path = self.table.path
        self.entry_type = entry_type
        self.txn_app_id = txn_app_id

    def create(self) -> None:
        self.table.create()

    def exists(self) -> bool:
        return self.table.exists()

    def add(self, entry: E) -> bool:
        """Append ``entry`` once per batch id: if an entry for its id already landed, no-op.

        Returns True if this call wrote it.
        """
        rows = pa.Table.from_pylist([entry.to_row()], schema=self.table.schema)
        return self.table.append_once(rows, self.txn_app_id, entry.batch_id)

    def claim(self, entry: E) -> None:
        """``add`` ``entry``, then make sure the stored entry for its id is this runner's.

        An append whose batch already landed is skipped, so without reading
        back, a runner whose entry lost to another runner's would go on as if
        it had written it. Raises ConcurrentRunner naming the owner instead.
        """
        if self.add(entry):
            return
        stored = self.get(entry.batch_id)
        if stored is None or stored.runner_id != entry.runner_id:
            owner = stored.runner_id if stored else "nobody"
            raise ConcurrentRunner(
                f"batch {entry.batch_id} in {self.path} belongs to runner {owner}, not "
                f"{entry.runner_id}: another `lowmark run` of this pipeline is active; stop one"
            )

    def get(self, batch_id: int) -> E | None:
        rows = self._read(f'"batch_id" = {int(batch_id)}')
        return rows[0] if rows else None

    def latest_batch_id(self) -> int | None:
        """The newest batch id in the log, from its transaction version (no data read)."""
        found = self.table.open().transaction_version(self.txn_app_id)
        return None if found is None else int(found)

    def get_latest(self) -> E | None:
        latest = self.latest_batch_id()
        return None if latest is None else self.get(latest)

    def get_range(
        self, start: int | None = None, end: int | None = None, table: DriverTable | None = None
    ) -> list[E]:
        """Entries with ``start <= batch_id <= end`` (either bound open) in ``table`` (None:
        the log's), in batch order."""
        bounds = []
        if start is not None:
            bounds.append(f'"batch_id" >= {int(start)}')
        if end is not None:
            bounds.append(f'"batch_id" <= {int(end)}')
        found = self._read(" AND ".join(bounds) or None, table)
        return sorted(found, key=lambda e: e.batch_id)

    def _read(self, where: str | None, table: DriverTable | None = None) -> list[E]:
        """The entries of the rows matching ``where`` in ``table`` (None: the log's)."""
        table = table or self.table
        rows = table.read(where).to_pylist()
        return [self.entry_type.from_row(r, table.path) for r in rows]  # type: ignore[misc]
