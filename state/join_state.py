"""Join state: the rows a stream-stream join holds until the watermark passes them.

The ``join_state`` table holds, per held record: ``side`` (``left`` or
``right``), ``key`` (the join keys as a JSON array; null when a key is null:
such a row never matches), ``time_ms`` (its event time), ``row`` (the
record's columns as JSON), ``row_id`` (``<batch id>:<n>``, given by the
batch that read it), ``matched`` (an outer join's preserved side: it matched
a row already), ``evicted`` (an outer join emitted it with nulls: it is gone),
``batch_id`` (the batch that wrote this version of the row), partitioned by
side and ``_lowmark_slot`` (``time_ms`` in steps of ``slot_ms``).

The table is append-only but for whole slots: a row's newest version (highest
``batch_id``) is what it is (``latest``). A batch reads the rows of the time
range its new records can match (``candidates``) or that its watermark makes
final (``passed``), as of the version the commit of batch N-1 recorded (a
replay sees what the first attempt saw), then appends its changes in ONE
idempotent commit (``<pipeline id>:join_state``, batch id) and deletes the
slots wholly below both sides' eviction times (deleting again is harmless).
Cost follows the time range a batch touches, never the whole state.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from lowmark.state.keyed_state import latest
from lowmark.state.state_table import StateTable
from lowmark.state.table import DriverTable

SLOT = "_lowmark_slot"
TABLE = "join_state"
"""The table's name in the checkpoint, and its role in application transaction ids."""
SLOT_MIN_MS = 60_000

ROWS = pa.schema(
    [
        pa.field("side", pa.string(), nullable=False),
        pa.field("key", pa.string()),
        pa.field("time_ms", pa.int64(), nullable=False),
        pa.field("row", pa.string(), nullable=False),
        pa.field("row_id", pa.string(), nullable=False),
        pa.field("matched", pa.bool_(), nullable=False),
        pa.field("evicted", pa.bool_(), nullable=False),
        pa.field("batch_id", pa.int64(), nullable=False),
    ]
)
"""A held row as a batch gives it (``JoinState.write`` adds the slot)."""
STORED = ROWS.append(pa.field(SLOT, pa.int64(), nullable=False))


class JoinState:
    """The ``join_state`` table of a checkpoint (see above)."""

    def __init__(self, path: str, app_id: str, slot_ms: int) -> None:
        """``app_id``: the application transaction of its writes (``<pipeline id>:join_state``);
        ``slot_ms``: the partition step (at least a minute)."""
        self.table = DriverTable(path, STORED, "join state table", partition_by=("side", SLOT))
        self.app_id = app_id
        self.contract = StateTable(TABLE, self.table, app_id, base=0)
        """How a batch reads, records and writes it (``lowmark.state.state_table``)."""
        self.slot_ms = max(slot_ms, SLOT_MIN_MS)

    def create(self) -> None:
        """The table, empty, unless it exists: version 0 is what the first batch reads."""
        self.table.create()

    def candidates(
        self, side: str, keys: pa.Array, lo_ms: int, hi_ms: int, version: int
    ) -> pa.Table:
        """The held rows of ``side`` with a key of ``keys`` and ``lo_ms <= time_ms <= hi_ms``,
        newest version of each, not evicted."""
        if not len(keys):
            return ROWS.empty_table()
        rows = self._read(
            f'"side" = \'{side}\' AND "{SLOT}" >= {lo_ms // self.slot_ms} '
            f'AND "{SLOT}" <= {hi_ms // self.slot_ms} '
            f'AND "time_ms" >= {lo_ms} AND "time_ms" <= {hi_ms}',
            version,
        )
        rows = rows.filter(pc.is_in(rows.column("key"), value_set=keys))
        return rows.filter(pc.invert(rows.column("evicted")))

    def passed(self, side: str, below_ms: int, version: int) -> pa.Table:
        """The held rows of ``side`` with ``time_ms < below_ms``, newest version of each,
        neither matched nor evicted: what an outer join emits with nulls."""
        rows = self._read(
            f'"side" = \'{side}\' AND "{SLOT}" <= {below_ms // self.slot_ms} '
            f'AND "time_ms" < {below_ms}',
            version,
        )
        return rows.filter(pc.invert(pc.or_(rows.column("matched"), rows.column("evicted"))))

    def _read(self, where: str, version: int) -> pa.Table:
        rows = self.table.read(where, version)
        return latest(rows.select(ROWS.names).cast(ROWS), ("row_id",))

    def write(self, rows: pa.Table, batch_id: int, evict_below: dict[str, int]) -> int:
        """Append ``rows`` (``ROWS``) once for batch ``batch_id``, then delete each side's slots
        wholly below its time in ``evict_below`` (rows the watermark passed: they can match
        no row to come, and an outer join emitted them before this). Returns the version
        after the batch."""
        if rows.num_rows:
            slots = pc.floor(pc.divide(rows.column("time_ms").cast(pa.float64()), self.slot_ms))
            stored = rows.append_column(SLOT, slots.cast(pa.int64()))
            self.table.append_once(stored, self.app_id, batch_id)
        below = {side: ms // self.slot_ms for side, ms in evict_below.items()}
        held = {(str(p["side"]), int(p[SLOT])) for p in self.table.open().partitions()}
        gone = [
            f'("side" = \'{side}\' AND "{SLOT}" < {slot})'
            for side, slot in below.items()
            if any(s == side and held_slot < slot for s, held_slot in held)
        ]
        if gone:
            self.table.delete(" OR ".join(gone), batch_id)
        return self.table.version()


def rows_held(path: str) -> dict[str, int]:
    """Rows the ``join_state`` table at ``path`` holds per side (``left``, ``right``): newest
    versions not evicted, those the watermark passed whose slot is not deleted yet included.
    For ``lowmark status``: it reads the whole table."""
    table = DriverTable(path, STORED, "join state table")
    if not table.exists():
        return {}
    rows = latest(table.query("SELECT side, row_id, evicted, batch_id FROM t"), ("row_id",))
    rows = rows.filter(pc.invert(rows.column("evicted")))
    counts = rows.group_by("side").aggregate([("row_id", "count")])
    return dict(
        zip(
            counts.column("side").to_pylist(),
            counts.column("row_id_count").to_pylist(),
            strict=True,
        )
    )
