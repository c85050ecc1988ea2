"""Window state layout: a small batch's MERGE rewrites the files of the windows it touches,
before and after maintenance compacts the table."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from lowmark.state.maintenance import KEEP_HOURS
from lowmark.state.table import UTC_MICROS
from lowmark.state.window_state import LATEST, ROWS, WindowState

MINUTE_US = 60_000_000
T0_US = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp()) * 1_000_000
USERS = 50
MINUTES = 20


def windows(users: range, minutes: range, batch_id: int) -> pa.Table:
    """One-minute windows of ``users`` x ``minutes``, each holding one record."""
    cells = [(u, m) for m in minutes for u in users]
    starts = [T0_US + m * MINUTE_US for _, m in cells]
    return pa.table(
        {
            "user": [f"u{u:03d}" for u, _ in cells],
            "window_start": pa.array(starts, pa.int64()).cast(UTC_MICROS),
            "window_end": pa.array([s + MINUTE_US for s in starts], pa.int64()).cast(UTC_MICROS),
            "count__count": pa.array([1] * len(cells), pa.int64()),
            ROWS: pa.array([1] * len(cells), pa.int64()),
            "updated_batch": pa.array([batch_id] * len(cells), pa.int64()),
        }
    )


def no_deletes() -> pa.Table:
    return windows(range(0), range(0), 0).select(["user", "window_start", "window_end"])


def held(state: WindowState, where: str) -> int:
    """Windows the state holds now that match ``where``."""
    rows = state.rows(LATEST, where)
    assert rows is not None
    return rows.num_rows


def rows_copied(path: Path) -> int:
    """Unchanged rows the newest MERGE copied into new files (delta-rs's merge metrics)."""
    last = DeltaTable(str(path)).history(1)[0]
    assert last["operation"] == "MERGE", last
    return int(last["operationMetrics"]["num_target_rows_copied"])


def test_a_small_merge_after_maintenance_copies_only_the_rows_of_the_windows_it_touches(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state_windows"
    state = WindowState(str(path), "p:state", ("user",), slot_us=MINUTE_US)
    # Filled as a stream fills it: a minute of windows per batch.
    for minute in range(MINUTES):
        state.apply(windows(range(USERS), range(minute, minute + 1), minute), no_deletes(), minute)
    state.table.maintain(None, KEEP_HOURS)  # maintenance: compacts the small files
    assert held(state, "true") == USERS * MINUTES
    # A small batch: five users' windows of the newest minute.
    touched = windows(range(5), range(MINUTES - 1, MINUTES), MINUTES)
    state.apply(touched, no_deletes(), MINUTES)
    # The only other rows in the files it rewrote are the rest of that minute's windows:
    # one minute of 50 users, not the 20 minutes the table holds.
    assert rows_copied(path) <= USERS - 5
    after = state.rows(LATEST, '"updated_batch" = 20')
    assert after is not None
    assert sorted(after.column("user").to_pylist()) == [f"u{u:03d}" for u in range(5)]
    assert held(state, "true") == USERS * MINUTES
