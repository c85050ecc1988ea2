"""The one contract of every state table (``lowmark.state.state_table``), on real Delta
tables written by delta-rs; no Spark."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from lowmark.batches.loop.steps import found_state_tables
from lowmark.state.state_table import StateTable
from lowmark.state.table import DriverTable

ROWS = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("row_id", pa.string(), nullable=False),
        pa.field("batch_id", pa.int64(), nullable=False),
    ]
)


def _join_state(location: Path) -> StateTable:
    table = DriverTable(str(location / "join_state"), ROWS, "join state table")
    table.create()
    return StateTable("join_state", table, "p:join_state", base=0)


def _rows(*rows: tuple[str, str, int]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"key": k, "row_id": r, "batch_id": b} for k, r, b in rows], schema=ROWS
    )


def test_a_replay_whose_write_landed_reads_what_the_commit_before_recorded(
    tmp_path: Path,
) -> None:
    state = _join_state(tmp_path)
    state.table.append_once(_rows(("a", "0:0", 0)), state.app_id, 0)
    recorded = {"join_state": state.table.version()}
    state.table.append_once(_rows(("b", "1:0", 1)), state.app_id, 1)

    assert state.read_version(recorded, replay=True, batch_id=1) == recorded["join_state"]
    assert state.read_version(recorded, replay=False, batch_id=2) == state.table.version()
    assert state.read_version({}, replay=True, batch_id=0) == 0  # created empty: base


def test_restore_puts_back_the_rows_the_commit_before_recorded(tmp_path: Path) -> None:
    state = _join_state(tmp_path)
    state.table.append_once(_rows(("a", "0:0", 0)), state.app_id, 0)
    recorded = {"join_state": state.table.version()}
    state.table.append_once(_rows(("b", "1:0", 1)), state.app_id, 1)

    assert state.restore(recorded, 1) == recorded["join_state"]

    assert state.table.read().column("key").to_pylist() == ["a"]


def test_carried_rows_number_below_the_new_checkpoints_batches_in_their_order(
    tmp_path: Path,
) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    state = _join_state(old)
    rows = _rows(("a", "3:0", 3), ("a", "4:1", 4), ("b", "4:0", 4))
    state.table.append_once(rows, state.app_id, 4)

    version = state.carry_over({"join_state": state.table.version()}, 4, str(new))

    [carried] = found_state_tables(str(new), "q")
    assert version == carried.table.version() and carried.role == "join_state"
    got = sorted(carried.table.read().to_pylist(), key=lambda r: r["row_id"])
    # Batch 4, the last carried, becomes -1: every batch of the new checkpoint is newer, and
    # its row ids (``<batch>:<n>``, from batch 0 on) never collide with a carried one.
    assert got == [
        {"key": "b", "row_id": "-1:0", "batch_id": -1},
        {"key": "a", "row_id": "-1:1", "batch_id": -1},
        {"key": "a", "row_id": "-2:0", "batch_id": -2},
    ]
