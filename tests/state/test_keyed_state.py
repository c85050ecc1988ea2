"""The keyed step's state table: the newest row of each (key, state) wins, and compaction
keeps exactly those (cleared ones left out), whatever order the rows came in."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa

from lowmark.state.keyed_state import (
    BUCKET,
    STATE,
    TIMER_CHANGE,
    Expiry,
    KeyedTables,
    compact_latest,
    held,
    latest,
)
from lowmark.state.table import DriverTable


def _rows(rng: random.Random, batches: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for batch in range(batches):
        for key in rng.sample(range(20), 8):
            for name in rng.sample(["a", "b"], rng.randint(1, 2)):
                value = None if rng.random() < 0.2 else f'{{"value": [{batch}]}}'
                rows.append(
                    {"key": f"[{key}]", "state": name, "value": value, "expires_ms": None,
                     "batch_id": batch, BUCKET: key % 4}
                )  # fmt: skip
    return rows


def _newest(rows: list[dict[str, object]]) -> dict[tuple[object, object], object]:
    """The rule, plainly: per (key, state), the value of the row of the highest batch."""
    newest: dict[tuple[object, object], dict[str, object]] = {}
    for row in rows:
        k = (row["key"], row["state"])
        if k not in newest or row["batch_id"] > newest[k]["batch_id"]:  # type: ignore[operator]
            newest[k] = row
    return {k: r["value"] for k, r in newest.items()}


def test_the_newest_row_of_each_key_and_state_wins_in_any_order() -> None:
    rng = random.Random(3)
    rows = _rows(rng, 12)
    rng.shuffle(rows)
    got = latest(pa.Table.from_pylist(rows, schema=STATE), ("key", "state")).to_pylist()
    assert {(r["key"], r["state"]): r["value"] for r in got} == _newest(rows)
    assert len(got) == len(_newest(rows))


def test_compaction_keeps_the_newest_values_and_drops_cleared_ones(tmp_path: Path) -> None:
    rng = random.Random(4)
    rows = _rows(rng, 12)
    table = DriverTable(str(tmp_path / "keyed_state"), STATE, partition_by=(BUCKET,))
    for batch in range(12):
        table.append_once(
            pa.Table.from_pylist([r for r in rows if r["batch_id"] == batch], schema=STATE),
            "app",
            batch,
        )
    before = table.version()
    compact_latest(table)
    held = {k: v for k, v in _newest(rows).items() if v is not None}
    after = table.read().to_pylist()
    assert table.version() == before + 1
    assert {(r["key"], r["state"]): r["value"] for r in after} == held
    assert len(after) == len(held)
    # The version a pending replay reads is still there, unchanged.
    assert table.read(None, before).num_rows == len(rows)


def test_compaction_drops_values_expired_by_the_last_batch_and_keeps_those_without_ttl(
    tmp_path: Path,
) -> None:
    rng = random.Random(5)
    rows = _rows(rng, 12)
    for row in rows:  # half the values with a TTL, expiring 15 ms after their batch's 10 ms
        row["expires_ms"] = None if rng.random() < 0.5 else int(str(row["batch_id"])) * 10 + 15
    table = DriverTable(str(tmp_path / "keyed_state"), STATE, partition_by=(BUCKET,))
    table.append_once(pa.Table.from_pylist(rows, schema=STATE), "app", 0)
    compact_latest(table, Expiry(processing_ms=80))

    newest: dict[tuple[object, object], dict[str, object]] = {}
    for row in sorted(rows, key=lambda r: int(str(r["batch_id"]))):
        newest[(row["key"], row["state"])] = row
    held = {
        k: r["value"]
        for k, r in newest.items()
        if r["value"] is not None and (r["expires_ms"] is None or int(str(r["expires_ms"])) > 80)
    }
    after = table.read().to_pylist()
    assert {(r["key"], r["state"]): r["value"] for r in after} == held
    assert {r["expires_ms"] is None for r in after} == {True, False}


def test_a_key_whose_every_state_expired_is_not_held(tmp_path: Path) -> None:
    def row(key: str, state: str, expires_ms: int | None) -> dict[str, object]:
        return {"key": key, "state": state, "value": "{}", "expires_ms": expires_ms,
                "batch_id": 0, BUCKET: 0}  # fmt: skip

    rows = [row("[1]", "a", 100), row("[1]", "b", None), row("[2]", "a", 100), row("[3]", "a", 101)]
    table = DriverTable(str(tmp_path / "keyed_state"), STATE, partition_by=(BUCKET,))
    table.append_once(pa.Table.from_pylist(rows, schema=STATE), "app", 0)
    timers = str(tmp_path / "keyed_timers")
    assert held(table.path, timers).keys == 3
    assert held(table.path, timers, Expiry(100)).keys == 2  # key 2's only state expired
    # State "a"'s TTL by event time: the processing time no longer expires it, the
    # watermark does; no watermark yet, nothing has.
    by_event = frozenset({"a"})
    assert held(table.path, timers, Expiry(10**12, 99, by_event)).keys == 3
    assert held(table.path, timers, Expiry(10**12, 100, by_event)).keys == 2
    assert held(table.path, timers, Expiry(10**12, 101, by_event)).keys == 1
    assert held(table.path, timers, Expiry(10**12, None, by_event)).keys == 3


def test_compaction_drops_event_time_ttl_values_by_the_watermark(tmp_path: Path) -> None:
    rows = [
        {
            "key": f"[{i}]",
            "state": state,
            "value": "{}",
            "expires_ms": expires,
            "batch_id": 0,
            BUCKET: 0,
        }
        for i, (state, expires) in enumerate(
            [("by_event", 50), ("by_event", 80), ("by_processing", 80), ("by_processing", 150)]
        )
    ]
    rows += [r | {"batch_id": 1} for r in rows] + [r | {"batch_id": 2} for r in rows]
    table = DriverTable(str(tmp_path / "keyed_state"), STATE, partition_by=(BUCKET,))
    table.append_once(pa.Table.from_pylist(rows, schema=STATE), "app", 0)
    compact_latest(
        table, Expiry(processing_ms=100, watermark_ms=60, by_event_time=frozenset({"by_event"}))
    )
    assert sorted(r["key"] for r in table.read().to_pylist()) == ["[1]", "[3]"]


def test_the_next_pending_timer_is_the_earliest_set_and_not_deleted_since(tmp_path: Path) -> None:
    """Timers set, deleted and set again over batches, with more deleted timers before the
    first pending one than a page of ``next_pending``'s reads holds: the answer is the
    plain simulation's (the latest row of each (key, timer) decides)."""
    rng = random.Random(5)
    tables = KeyedTables(str(tmp_path / "state"), str(tmp_path / "timers"), "app", 60_000)
    tables.create()
    pinned = tables.pinned({}, replay=False, batch_id=0)
    pending: set[tuple[str, int]] = set()
    # Batch 0 sets 2,500 early timers that batch 1 deletes, and later ones that stay, all in
    # one slot (60 s).
    early = [(f'["k{i}"]', 1_000 + i) for i in range(2_500)]
    late = [(f'["k{i}"]', 20_000 + rng.randrange(30_000)) for i in range(300)]
    plan = [(0, [(k, t, True) for k, t in early + late]), (1, [(k, t, False) for k, t in early])]
    # Then batches that set, delete and set again a few timers at random.
    for batch in range(2, 8):
        changes = []
        for key, timer in rng.sample(early + late, 40):
            changes.append((key, timer, (key, timer) not in pending or rng.random() < 0.3))
        plan.append((batch, list({(k, t): (k, t, p) for k, t, p in changes}.values())))
    for batch, changes in plan:
        timers = pa.Table.from_pylist(
            [{"key": k, "timer_ms": t, BUCKET: 0, "pending": p, "batch_id": batch}
             for k, t, p in changes],
            schema=TIMER_CHANGE,
        )  # fmt: skip
        files = pinned.written(STATE.empty_table(), timers, batch)
        tables.write(files, batch, now_ms=None)
        for key, timer, is_pending in changes:
            (pending.add if is_pending else pending.discard)((key, timer))
        expected = min((t for _, t in pending), default=None)
        assert tables.next_pending(None) == expected, batch
        after = 10_000
        assert tables.next_pending(after) == min(
            (t for _, t in pending if t > after), default=None
        ), batch
