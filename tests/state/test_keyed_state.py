"""The keyed step's state table: the newest row of each (key, state) wins, and compaction
keeps exactly those (cleared ones left out), whatever order the rows came in."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lowmark.state.errors import CheckpointCorrupt
from lowmark.state.keyed_state import (
    BUCKET,
    STATE,
    TIMER_CHANGE,
    Expiry,
    FileRows,
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


def _batch(tables: KeyedTables, batch: int, values: dict[int, str], timers: dict[int, int]) -> None:
    """Batch ``batch``'s changes, committed as a batch's tasks and driver commit them: key
    ``[k]`` (bucket k % 4) gets state ``a`` = ``values[k]`` and a pending timer ``timers[k]``."""
    states = [
        {"key": f"[{k}]", "state": "a", "value": v, "expires_ms": None, "batch_id": batch,
         BUCKET: k % 4}
        for k, v in values.items()
    ]  # fmt: skip
    timer_rows = [
        {"key": f"[{k}]", "timer_ms": t, BUCKET: k % 4, "pending": True, "batch_id": batch}
        for k, t in timers.items()
    ]
    pinned = tables.pinned({}, replay=False, batch_id=batch)
    files = pinned.written(
        pa.Table.from_pylist(states, schema=STATE),
        pa.Table.from_pylist(timer_rows, schema=TIMER_CHANGE),
        batch,
    )
    tables.write(files, batch, now_ms=None)


def _data_files(folder: Path) -> list[Path]:
    return [f for f in folder.rglob("*.parquet") if "_delta_log" not in f.parts]


def test_a_later_batch_reads_only_the_state_and_timer_files_committed_since_the_last_read(
    tmp_path: Path,
) -> None:
    """Batch 0's files are read once; then they are gone from the disk (not from the log),
    and a read as of batch 1's version still finds their keys' states and timers beside
    batch 1's newer ones: nothing but batch 1's files was opened again."""
    tables = KeyedTables(str(tmp_path / "state"), str(tmp_path / "timers"), "app", 60_000)
    tables.create()
    _batch(tables, 0, {k: f"v0-{k}" for k in range(8)}, {k: 1_000 + k for k in range(8)})
    first = tables.pinned({}, replay=False, batch_id=1)
    keys = [f"[{k}]" for k in range(8)]
    assert first.states(range(4), keys).num_rows == 8
    assert first.due(range(4), 5_000).num_rows == 8
    for f in _data_files(tmp_path):
        f.unlink()
    _batch(tables, 1, {1: "v1-1", 6: "v1-6"}, {1: 2_000})
    second = tables.pinned({}, replay=False, batch_id=2)
    held = second.states(range(4), keys).to_pylist()
    assert {r["key"]: r["value"] for r in held} == {
        f"[{k}]": "v1-1" if k == 1 else "v1-6" if k == 6 else f"v0-{k}" for k in range(8)
    }
    due = second.due([1, 2], 1_500).to_pylist()  # the buckets of keys 1, 2, 5, 6
    assert sorted((r["key"], r["timer_ms"]) for r in due) == [
        ("[1]", 1_001), ("[2]", 1_002), ("[5]", 1_005), ("[6]", 1_006)
    ]  # fmt: skip
    # The version batch 1 read is read as it was: its own files, not batch 1's.
    assert {r["key"]: r["value"] for r in first.states([1], ["[1]"]).to_pylist()} == {"[1]": "v0-1"}


@pytest.mark.parametrize("damage", ["deleted", "overwritten"])
def test_a_file_whose_rows_no_longer_fit_the_kept_bytes_is_read_again(
    tmp_path: Path, damage: str
) -> None:
    """With room for no file's rows, every read opens the files: once they are gone from the
    disk, or are no longer Parquet, the read fails, naming the table and the way out."""
    tables = KeyedTables(str(tmp_path / "state"), str(tmp_path / "timers"), "app", 60_000)
    tables.create()
    _batch(tables, 0, {k: f"v0-{k}" for k in range(8)}, {})
    version = tables.state.version()
    rows = FileRows(limit=0)

    def wanted(buckets: pa.ChunkedArray) -> pa.ChunkedArray:
        return pc.is_valid(buckets)

    assert rows.rows(tables.state, version, BUCKET, wanted).num_rows == 8
    for f in _data_files(tmp_path / "state"):
        if damage == "deleted":
            f.unlink()
        else:
            f.write_bytes(b"not parquet")
    with pytest.raises(CheckpointCorrupt, match=r"keyed state table .* cannot be read as of"):
        rows.rows(tables.state, version, BUCKET, wanted)
