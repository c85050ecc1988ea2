from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pytest

from lowmark.state.checkpoint import Checkpoint
from lowmark.state.commit_log import COUNTS, CommitEntry
from lowmark.state.errors import CheckpointMissing, ConcurrentRunner, UnsupportedLogFormat
from lowmark.state.offset_log import OffsetEntry, OffsetLog
from tests.helpers import entry


def test_offset_log_roundtrips_entries_and_answers_latest_and_ranges(
    tmp_path: Path,
) -> None:
    ckpt = Checkpoint(str(tmp_path / "ckpt"), "p")
    log = ckpt.offsets
    assert log.get_latest() is None
    for n in range(3):
        log.add(entry(n, end=n + 10))

    assert log.get(1) == entry(1, end=11).model_copy(update={"created_at": log.get(1).created_at})  # type: ignore[union-attr]
    latest = log.get_latest()
    assert latest is not None and latest.batch_id == 2 and latest.end_offsets == {"0": 12}
    assert [e.batch_id for e in log.get_range(1, 2)] == [1, 2]
    assert [e.batch_id for e in log.get_range(start=2)] == [2]
    assert log.get(7) is None


def test_adding_the_same_batch_again_from_the_same_runner_is_a_no_op(
    tmp_path: Path,
) -> None:
    log = Checkpoint(str(tmp_path / "ckpt"), "p").offsets
    log.add(entry(0))
    log.add(entry(0))
    assert len(log.get_range()) == 1


def test_another_runners_entry_for_the_same_batch_raises_concurrent_runner(
    tmp_path: Path,
) -> None:
    log = Checkpoint(str(tmp_path / "ckpt"), "p").offsets
    log.claim(entry(0, runner="first"))
    with pytest.raises(ConcurrentRunner, match="belongs to runner first"):
        log.claim(entry(0, runner="second", end=99))
    stored = log.get(0)
    assert stored is not None and stored.runner_id == "first" and stored.end_offsets == {"0": 0}


def test_entries_from_a_newer_format_are_refused_not_misread(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "offsets")

    class FutureEntry(OffsetEntry):
        FORMAT_VERSION = 99

    future = OffsetLog(path, FutureEntry, "app:offsets")
    future.create()
    future.add(FutureEntry(**entry(0).model_dump()))
    with pytest.raises(UnsupportedLogFormat, match="format 99"):
        OffsetLog(path, OffsetEntry, "app:offsets").get_latest()


def test_entries_written_before_the_source_identity_was_recorded_read_as_having_none(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "offsets")

    class EntryWithoutIdentity(OffsetEntry):
        COLUMNS: ClassVar[list[pa.Field]] = [
            c for c in OffsetEntry.COLUMNS if c.name != "source_identity"
        ]

    old = OffsetLog(path, EntryWithoutIdentity, "app:offsets")
    old.create()
    old.add(EntryWithoutIdentity(**entry(0).model_dump()))
    log = OffsetLog(path, OffsetEntry, "app:offsets")
    assert log.get(0).source_identity == {}  # type: ignore[union-attr]
    # From now on it is recorded: the column is added to the table.
    log.add(entry(1).model_copy(update={"source_identity": {"Kafka topic t": "id-1"}}))
    assert [e.source_identity for e in log.get_range()] == [{}, {"Kafka topic t": "id-1"}]


def test_commit_entries_keep_their_json_maps(tmp_path: Path) -> None:
    log = Checkpoint(str(tmp_path / "ckpt"), "p").commits
    log.add(
        CommitEntry(
            batch_id=0,
            runner_id="r",
            next_watermark_ms=5,
            table_versions={"sink": 3, "state": 4},
            rows_in=10,
            rows_out=8,
            rows_bad=2,
        )
    )
    got = log.get(0)
    assert got is not None
    assert got.table_versions == {"sink": 3, "state": 4}
    assert (got.rows_in, got.rows_out, got.rows_bad) == (10, 8, 2)
    assert got.created_at.tzinfo is not None


def test_reading_a_log_whose_table_was_deleted_is_a_clear_error(
    tmp_path: Path,
) -> None:
    log = OffsetLog(str(tmp_path / "gone"), OffsetEntry, "a:offsets")
    with pytest.raises(CheckpointMissing, match="gone is missing"):
        log.get_latest()


def test_every_batch_count_is_a_column_and_a_field_of_the_commit_log() -> None:
    columns = {f.name for f in CommitEntry.COLUMNS}
    assert set(COUNTS) <= columns & set(CommitEntry.model_fields)
    assert {c for c in columns if c.startswith("rows_")} == set(COUNTS)
