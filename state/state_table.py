"""The one exactly-once contract of every state table a batch writes.

Window state (``state_windows``), the ids deduplication let through
(``dedup_ids``), a keyed step's state and timers (``keyed_state``,
``keyed_timers``) and a stream-stream join's held rows (``join_state``) are
each a ``StateTable``: a Delta table of the checkpoint, written from the
driver with delta-rs, under one rule:

- **Write.** Batch N's changes commit with the application transaction
  (``<pipeline id>:<role>``, N): a repeat of the batch finds it there and
  skips the write (``landed``). Deletes of whole slots the watermark passed
  carry no transaction: repeating one is harmless.
- **Record.** Commit N records the table's version after the batch under
  ``role`` (``CommitEntry.table_versions``; ``version_after``).
- **Read.** Batch N reads as of ``read_version``: a replay whose own write
  landed reads the version commit N-1 recorded (``base`` when it recorded
  none), so it sees what its first attempt saw; any other batch the newest.
- **skip-batch** puts the table back as commit N-1 left it (``restore``).
- **reset --after-sink** copies the rows as of the version the sink's last
  batch recorded into the new checkpoint (``carry_over``).
- **Maintenance** keeps the version the last commit recorded readable
  (``lowmark.state.maintenance``), the one a pending replay reads.

Each is declared by a ``TableSpec`` of the step that holds it, registered
with its step in ``lowmark.batches.loop.steps.STEPS``: the one registration
the batches, maintenance, skip-batch and reset go through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from lowmark.state.errors import CheckpointCorrupt
from lowmark.state.storage import open_table
from lowmark.state.table import DriverTable

BATCH_COLUMNS = ("batch_id", "updated_batch")
"""Columns of state rows that hold the number of the batch that wrote them."""
ROW_ID = "row_id"
"""A state row's id given by the batch that read it: ``<batch id>:<n>`` (join rows)."""
NEWEST = -1
"""As a version to read: the newest, whatever it is when read (``read_version``)."""
CARRIED = "lowmark:reset"
"""The application transaction of the rows ``carry_over`` copies into a new checkpoint."""


@dataclass(frozen=True)
class TableSpec:
    """A state table a step holds, as a checkpoint names it."""

    folder: str
    """Its folder in the checkpoint."""
    role: str
    """The name commit N records its version under, and the last part of its application
    transaction id (``StateTable.role``)."""
    base: int | None
    """``StateTable.base``."""


@dataclass(frozen=True)
class StateTable:
    """One state table of a checkpoint under the contract above."""

    role: str
    """Its name in ``CommitEntry.table_versions`` (``TableSpec.role``)."""
    table: DriverTable
    app_id: str
    """The application transaction of its writes: ``<pipeline id>:<role>``."""
    base: int | None
    """The version a batch reads when no commit before it recorded one: 0 for a table
    created empty before the checkpoint's first batch, None (nothing held) for one its
    first write creates."""

    def landed(self, batch_id: int) -> bool:
        """Whether batch ``batch_id``'s write (or a later batch's) committed here."""
        return self.table.landed(self.app_id, batch_id)

    def recorded(self, versions: Mapping[str, int]) -> int | None:
        """Its version in a commit's ``versions`` (``base`` if that commit recorded none)."""
        return versions.get(self.role, self.base)

    def read_version(
        self, recorded: Mapping[str, int], replay: bool, batch_id: int, pin: bool = True
    ) -> int | None:
        """The version batch ``batch_id`` reads, ``recorded`` being commit N-1's versions:
        for a replay whose own write landed, the one recorded; else the newest (its number,
        or ``NEWEST`` unless ``pin``: between two batches only maintenance commits here,
        which changes files, not rows). None: no rows are held (no table yet)."""
        if not self.table.exists():
            return None
        if replay and self.landed(batch_id):
            return self.recorded(recorded)
        return self.table.version() if pin else NEWEST

    def version_after(self) -> int | None:
        """The version now (None: no table): what the batch's commit records."""
        return self.table.version() if self.table.exists() else None

    def restore(self, recorded: Mapping[str, int], batch_id: int) -> int | None:
        """Put the table back as the commit before batch ``batch_id`` left it (``recorded``,
        that commit's versions): what ``lowmark skip-batch`` does to a batch it sets aside.
        Returns the version restored (None: the table holds nothing now). A table nothing
        changed since is left alone."""
        if not self.table.exists():
            return None
        target = self.recorded(recorded)
        table = open_table(self.table.path)
        if target is None:  # nothing was held before the batch
            if table.to_pyarrow_dataset().count_rows():
                table.delete()
            return None
        if table.version() == target:
            return target
        try:
            table.restore(target)
        except Exception as exc:  # delta-rs raises plain exceptions for a log or files gone
            raise CheckpointCorrupt(
                f"{self.table.what} {self.table.path} no longer has version {target}, the "
                f"state batch {batch_id} is set aside to (a VACUUM with a retention shorter "
                "than the time since the crash removed its files): restore them from backup, "
                "or start over with `lowmark reset`"
            ) from exc
        return target

    def carry_over(self, recorded: Mapping[str, int], last_batch: int, location: str) -> int | None:
        """Copy the rows this table held as of ``recorded`` (the versions the commit of batch
        ``last_batch`` recorded) into the same table of the checkpoint at ``location``: what
        ``lowmark reset --after-sink`` carries into the new checkpoint, whose batches number
        from 0 again. So the carried rows' batch numbers (``BATCH_COLUMNS``, and the batch
        part of a ``ROW_ID``) are moved below 0, in their order: ``last_batch`` becomes -1,
        and a newest-version read still finds every later batch's rows newer, and no row id
        the new batches give collides with a carried one. Returns the new table's version
        (None: nothing was held, no table made)."""
        version = self.recorded(recorded)
        if version is None or not self.table.exists():
            return None
        rows = _renumbered(self.table.read(None, version), -(last_batch + 1))
        folder = self.table.path.rsplit("/", 1)[-1]
        partitions = tuple(self.table.open(version).metadata().partition_columns)
        copy = DriverTable(
            f"{location.rstrip('/')}/{folder}", None, self.table.what, partition_by=partitions
        )
        copy.append_once(rows, CARRIED, 0)
        return copy.version()


def existing(location: str, pipeline_id: str, specs: Sequence[TableSpec]) -> list[StateTable]:
    """The tables of ``specs`` the checkpoint at ``location`` (of ``pipeline_id``) holds."""
    found = []
    for spec in specs:
        path = f"{location.rstrip('/')}/{spec.folder}"
        table = DriverTable(path, None, f"{spec.folder} table")
        if table.exists():
            found.append(StateTable(spec.role, table, f"{pipeline_id}:{spec.role}", spec.base))
    return found


def _renumbered(rows: pa.Table, shift: int) -> pa.Table:
    """``rows`` with the batch numbers they hold moved by ``shift`` (``carry_over``)."""
    import pyarrow.compute as pc  # a carry-over's only: reading state needs no compute

    for name in BATCH_COLUMNS:
        if name in rows.column_names:
            at = rows.column_names.index(name)
            moved = pc.add(rows.column(name), pa.scalar(shift, rows.schema.field(name).type))
            rows = rows.set_column(at, rows.schema.field(name), moved)
    if ROW_ID in rows.column_names:
        at = rows.column_names.index(ROW_ID)
        ids = [
            None if v is None else f"{int(v.split(':', 1)[0]) + shift}:{v.split(':', 1)[1]}"
            for v in rows.column(ROW_ID).to_pylist()
        ]
        rows = rows.set_column(at, rows.schema.field(ROW_ID), pa.array(ids, pa.string()))
    return rows
