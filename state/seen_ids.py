"""Seen ids: the record ids a deduplicating pipeline has let through, within its horizon.

The ``dedup_ids`` table of a checkpoint holds one row per id first seen
within the horizon: ``id`` (the record's id columns as a JSON object, the
form two records are compared in), ``event_time`` (of the record that was
let through), ``batch_id`` (the batch that let it through), partitioned by
``_lowmark_slot``, the event time in steps of ``slot_us``. The batch's
tasks write the ids they let through as data files of the table
(``write_ids``, ``lowmark.state.task_appends``), and the driver adds them with
ONE idempotent commit (``<pipeline_id>:dedup``, batch id); no id is ever
rewritten, as a duplicate is never let through.

An id is live while ``event_time >= watermark - within`` (``live_from_us``).
The batch's Spark tasks read the live ids on the executors, with delta-rs, as
of a version the driver pins (``StateTable.read_version``): a new batch the
newest, a replay whose own append landed the one commit N-1 recorded, so a
replay judges every record exactly as the first attempt did. Ids below the
horizon are left out of every read (a record judged by its own ingestion time
has a horizon at or past the batch's, and counts a held id only from there
on: ``held_ids`` gives each id's newest event time); whole slots below it are
deleted as the watermark moves (``purge``), a delete of partitions only, no
file rewritten. The purge follows the batch's watermark, never a record's
own clock: a watermark never goes back, so every record of a later batch has
its horizon at or past it, and no id a later record could count is gone.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from lowmark.state.errors import CheckpointCorrupt
from lowmark.state.state_table import StateTable
from lowmark.state.table import UTC_MICROS, DriverTable, floor_div, micros_literal
from lowmark.state.task_appends import WrittenFile, write_files

SLOT = "_lowmark_slot"
"""Partition column: ``event_time`` (epoch µs) // ``slot_us``."""
PARTITIONS = (SLOT,)
SLOT_MIN_US = 60_000_000
"""The narrowest slot: a minute."""
SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("event_time", UTC_MICROS, nullable=False),
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field(SLOT, pa.int64(), nullable=False),
    ]
)


class SeenIds:
    """The ``dedup_ids`` table at ``path``; ids live for ``within_us`` of event time."""

    def __init__(self, path: str, txn_app_id: str, within_us: int) -> None:
        self.table = DriverTable(path, SCHEMA, "deduplication table", partition_by=PARTITIONS)
        self.path = self.table.path
        self.txn_app_id = txn_app_id
        self.contract = StateTable("dedup", self.table, txn_app_id, base=0)
        """How a batch reads, records and writes it (``lowmark.state.state_table``)."""
        self.within_us = within_us
        self.slot_us = max(within_us, SLOT_MIN_US)

    def live_from_us(self, watermark_ms: int | None) -> int | None:
        """The oldest event time (epoch µs) whose ids are still held under ``watermark_ms``
        (None: no watermark yet, every id is)."""
        return None if watermark_ms is None else watermark_ms * 1000 - self.within_us

    def create(self) -> None:
        """Create the table, empty, unless it exists: before a checkpoint's first batch, so
        that version 0 is what its replay reads (``StateTable.read_version``)."""
        self.table.create()

    def commit(self, files: Sequence[WrittenFile], batch_id: int) -> None:
        """Add the data files of the ids batch ``batch_id`` let through (``write_ids``),
        once."""
        self.table.commit_files(files, self.txn_app_id, batch_id)

    def purge(self, watermark_ms: int | None, batch_id: int) -> None:
        """Delete the slots wholly below the horizon under ``watermark_ms`` (a repeat is
        harmless; a slot deleted or not changes no batch's judgement, as reads leave out
        ids below the horizon)."""
        from_us = self.live_from_us(watermark_ms)
        if from_us is None or not self.table.exists():
            return
        below = from_us // self.slot_us
        held = {int(p[SLOT]) for p in self.table.open().partitions()}
        if any(slot < below for slot in held):
            self.table.delete(f'"{SLOT}" < {below}', batch_id)


def write_ids(
    path: str, slot_us: int, ids: pa.Array, event_us: pa.Array, batch_id: int
) -> list[WrittenFile]:
    """The ``ids`` batch ``batch_id`` let through (their records' event times ``event_us``,
    epoch µs) as new data files of the table at ``path`` (nothing committed:
    ``SeenIds.commit``); what a Spark task writes, on an executor."""
    event_us = event_us.cast(pa.int64())
    rows = pa.table(
        {
            "id": ids,
            "event_time": event_us.cast(UTC_MICROS),
            "batch_id": pa.array([batch_id] * len(ids), pa.int64()),
            SLOT: floor_div(event_us, slot_us),
        }
    )
    return write_files(path, rows.cast(SCHEMA), PARTITIONS, batch_id)


def held_ids(
    path: str, slot_us: int, version: int | None, from_us: int | None, among: pa.Array
) -> pa.Table:
    """Of the ids ``among``, those the table at ``path`` held as of ``version`` from event
    time ``from_us`` on (None: every one), each once: ``id``, and ``event_us``, the newest
    event time (epoch µs) it was let through at; what a Spark task reads, with delta-rs, on
    an executor."""
    if version is None:
        return pa.table({"id": pa.array([], pa.string()), "event_us": pa.array([], pa.int64())})
    where = None
    if from_us is not None:
        where = f'"{SLOT}" >= {from_us // slot_us} AND "event_time" >= {micros_literal(from_us)}'
    table = DriverTable(path, SCHEMA, "deduplication table")
    rows = table.read(where, version).select(["id", "event_time"])
    rows = rows.filter(pc.is_in(rows.column("id"), value_set=among))
    newest = rows.group_by("id").aggregate([("event_time", "max")])
    return pa.table(
        {"id": newest.column("id"), "event_us": newest.column("event_time_max").cast(pa.int64())}
    )


def let_through(
    ids: SeenIds, batch_id: int, watermark_ms: int | None, from_us: int | None
) -> pa.Table | None:
    """``id`` and ``event_time`` of every record batches up to ``batch_id`` let through, from
    event time ``from_us`` on (None: all); ``watermark_ms``: the newest watermark a batch
    may have run with (a purge's horizon is below it).

    Read as of the newest version, and, for the ids a purge deleted, as of the version
    before each delete (a batch after ``batch_id`` that did not commit may have written
    both: its rows are left out by their ``batch_id``). None when some of them can no
    longer be read: the log no longer reaches back to the table's first version, or the
    files of such a version were vacuumed (maintenance).
    """
    if not ids.table.exists():
        return pa.table({"id": pa.array([], pa.string()), "event_time": pa.array([], UTC_MICROS)})
    where = f'"batch_id" <= {batch_id}'
    if from_us is not None:
        where += f' AND "{SLOT}" >= {from_us // ids.slot_us}'
        where += f' AND "event_time" >= {micros_literal(from_us)}'
    newest = ids.table.open()
    reads = [ids.table.read(where, newest.version())]
    live_from = ids.live_from_us(watermark_ms)
    slot = from_us // ids.slot_us if from_us is not None else None
    if live_from is not None and (slot is None or slot < live_from // ids.slot_us):
        # Some were purged: every version before a delete holds what the delete took.
        history = newest.history()
        if min((h["version"] for h in history), default=0) > 0:
            return None
        deletes = sorted(h["version"] for h in history if h["operation"] == "DELETE")
        try:
            reads += [ids.table.read(where, version - 1) for version in deletes]
        except CheckpointCorrupt:
            return None
    rows = pa.concat_tables(r.select(["id", "event_time"]) for r in reads)
    return rows.group_by(["id", "event_time"]).aggregate([])
