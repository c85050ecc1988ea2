"""Window state: one row per open (key, window) with mergeable partial aggregates.

The ``state_windows`` table is a Delta table written on the driver with
delta-rs (``lowmark.state.table``): a batch changes it with ONE idempotent MERGE
(``<pipeline_id>:state``, batch id) that upserts the windows the batch
touched and deletes the windows it emitted as final. Open windows are
therefore a plain table to query: one row per open (key, window).

A batch reads the state its previous commit left. A new batch reads the
newest version (``LATEST``): between two batches only maintenance or a user's
OPTIMIZE commits to the table, which change files, not windows, so the newest
version holds the same windows and its files survive any VACUUM. A replay
whose own MERGE landed reads the version commit N-1 recorded (Delta time
travel), so it recomputes exactly the same changes; that version's files must
still be there (VACUUM retention, docs/guarantees.md).

Cost follows touched state, not total state. Every read carries bounds on
``window_start`` or ``window_end`` and the MERGE a target-only bound on
``window_start`` and on its slot; delta-rs keeps min/max statistics per file
and opens only the files whose range can match. delta-rs rewrites every file
a MERGE matches whole (it writes no deletion vectors), so the table is
partitioned by ``SLOT``, the window start in steps of ``slot_us`` (one
window period, at least a minute): a file never holds windows of two slots,
not even after maintenance's OPTIMIZE, which compacts each partition on its
own. A stream's batches touch recent windows, so a MERGE rewrites the files
of the few recent slots it touches, and each batch's write stays
proportional to its windows, before and after maintenance. (A state table
created before it was partitioned keeps its one partition, with the slot as
a plain column, until ``lowmark reset``.)
"""

from __future__ import annotations

import pyarrow as pa

from lowmark.state.errors import CheckpointCorrupt, CheckpointMissing
from lowmark.state.state_table import NEWEST, StateTable
from lowmark.state.table import DriverTable, floor_div, micros_literal

WINDOW_COLUMNS = ("window_start", "window_end")
LATEST = NEWEST
"""As a version to read: the newest (what a new batch reads, see above)."""
ROWS = "_lowmark_rows"
"""State column: the records a window holds (null in windows stored before it existed)."""
SLOT = "_lowmark_slot"
"""State column the table is partitioned by: ``window_start`` (epoch µs) // ``slot_us``."""


class WindowState:
    """The ``state_windows`` table of a checkpoint, keyed by ``key_columns`` + window."""

    def __init__(
        self, path: str, txn_app_id: str, key_columns: tuple[str, ...], slot_us: int
    ) -> None:
        self.table = DriverTable(path, None, "window state table", partition_by=(SLOT,))
        self.path = self.table.path
        self.txn_app_id = txn_app_id
        self.contract = StateTable("state", self.table, txn_app_id, base=None)
        """How a batch reads, records and writes it (``lowmark.state.state_table``)."""
        self.identity = (*key_columns, *WINDOW_COLUMNS)
        self.slot_us = slot_us

    def rows(self, version: int | None, where: str) -> pa.Table | None:
        """Rows matching ``where`` as of ``version`` (``LATEST``: the newest; None: no state
        written yet)."""
        if version is None:
            return None
        if not self.table.exists():
            raise CheckpointMissing(
                f"window state table {self.path} is missing, but the commit log recorded that "
                "it was written: restore it from backup, or start over with "
                "`lowmark reset`"
            )
        try:
            rows = self.table.read(where, None if version == LATEST else version)
        except CheckpointCorrupt as exc:
            if version == LATEST:
                raise
            raise CheckpointCorrupt(
                f"window state table {self.path} no longer has version {version}, the state "
                "a crashed batch's replay must start from (a VACUUM with a retention shorter "
                "than the time since the crash removed its files): restore them from backup, "
                "or start over with `lowmark reset`"
            ) from exc
        if ROWS not in rows.column_names:  # state written before windows counted their rows
            rows = rows.append_column(ROWS, pa.nulls(rows.num_rows, pa.int64()))
        if SLOT in rows.column_names:  # the layout's, not the window's
            rows = rows.drop_columns([SLOT])
        return rows

    def touched(self, version: int | None, lo_us: int, hi_us: int) -> pa.Table | None:
        """Windows starting within [``lo_us``, ``hi_us``] (epoch microseconds)."""
        return self.rows(
            version,
            f'"window_start" >= {micros_literal(lo_us)} '
            f'AND "window_start" <= {micros_literal(hi_us)}',
        )

    def overlapping(self, version: int | None, lo_us: int, hi_us: int) -> pa.Table | None:
        """Windows overlapping [``lo_us``, ``hi_us``): they end after it starts and start before
        it ends."""
        return self.rows(
            version,
            f'"window_start" < {micros_literal(hi_us)} AND "window_end" > {micros_literal(lo_us)}',
        )

    def ending_before(self, version: int | None, limit_us: int) -> pa.Table | None:
        """Windows whose end is before ``limit_us``: those a watermark makes final."""
        return self.rows(version, f'"window_end" < {micros_literal(limit_us)}')

    def apply(self, upserts: pa.Table, deletes: pa.Table, batch_id: int) -> int | None:
        """Upsert ``upserts`` (full state rows), delete ``deletes`` (identity columns) once.

        Returns the state version after the batch (None if there never was state).
        """
        import pyarrow.compute as pc  # a write's only: reading state needs no compute

        if not upserts.num_rows and not deletes.num_rows:
            return self.table.version() if self.table.exists() else None
        starts = pa.concat_arrays(
            [
                upserts.column("window_start").combine_chunks(),
                deletes.column("window_start").combine_chunks(),
            ]
        ).cast(pa.int64())
        bounds = pc.min_max(starts)
        lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
        # Every target row a change matches has the change's window_start, and its slot:
        # the bound on the partition column is what keeps the other slots' files out.
        within = (
            f't."window_start" >= {micros_literal(lo)} AND t."window_start" <= {micros_literal(hi)}'
        )
        if self._partitioned():
            within += (
                f' AND t."{SLOT}" >= {lo // self.slot_us} AND t."{SLOT}" <= {hi // self.slot_us}'
            )
        upsert_starts = upserts.column("window_start").combine_chunks().cast(pa.int64())
        self.table.merge_once(
            upserts.append_column(SLOT, floor_div(upsert_starts, self.slot_us)),
            deletes,
            self.identity,
            self.txn_app_id,
            batch_id,
            target_where=within,
        )
        return self.table.version()

    def _partitioned(self) -> bool:
        """True unless the table exists unpartitioned (created before ``SLOT``: its rows
        from then have no slot, so no bound on it may decide whether they match)."""
        if not self.table.exists():
            return True
        return SLOT in self.table.open().metadata().partition_columns
