"""Task-written appends: data files Spark tasks write into a checkpoint table's folder are
added by one idempotent driver commit, read alike by delta-rs and Spark, skipped by their
statistics, and never read when no commit added them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from lowmark.state.keyed_state import TIMER_INDEX, TIMER_PARTITIONS
from lowmark.state.seen_ids import PARTITIONS as ID_PARTITIONS
from lowmark.state.seen_ids import SCHEMA as IDS
from lowmark.state.table import DriverTable
from lowmark.state.task_appends import WrittenFile, write_files

APP = "pipeline:keyed_timers"


def _timer_rows(batch_id: int) -> list[dict[str, object]]:
    """Timers in three slots (one of them negative) and four buckets."""
    return [
        {"timer_ms": 1000 * i + 60_000 * (i % 3 - 1), "key": f"[{i}]", "_lowmark_bucket": i % 4,
         "pending": i % 5 != 0, "batch_id": batch_id, "_lowmark_slot": i % 3 - 1}
        for i in range(40)
    ]  # fmt: skip


def _written_by_tasks(spark: SparkSession, path: str, rows: list[dict[str, object]]) -> list[str]:
    """``rows`` written into the table at ``path`` by two Spark tasks (nothing committed);
    the descriptors they gave back, as the job brings them to the driver."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        data = pa.Table.from_batches(list(batches)).cast(TIMER_INDEX)
        files = write_files(path, data, TIMER_PARTITIONS, 7)
        yield pa.record_batch({"file": [json.dumps(f.as_dict()) for f in files]})

    frame = spark.createDataFrame(pa.Table.from_pylist(rows, schema=TIMER_INDEX)).repartition(2)
    return [r.file for r in frame.mapInArrow(task, "file string").collect()]


def _sorted(rows: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return sorted(tuple(r[c] for c in TIMER_INDEX.names) for r in rows)


def _timers(tmp_path: Path) -> DriverTable:
    table = DriverTable(str(tmp_path / "keyed_timers"), TIMER_INDEX, partition_by=TIMER_PARTITIONS)
    table.create()
    return table


def test_files_tasks_wrote_are_committed_once_and_read_alike_by_spark_and_delta_rs(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = _timers(tmp_path)
    rows = _timer_rows(7)
    described = _written_by_tasks(spark, table.path, rows)
    files = [WrittenFile.of(json.loads(d)) for d in described]
    before = table.version()

    assert table.commit_files(files, APP, 7)
    # A replay of the batch writes its rows again, to new files: its commit adds nothing.
    replayed = write_files(
        table.path, pa.Table.from_pylist(rows, schema=TIMER_INDEX), TIMER_PARTITIONS, 7
    )
    assert not table.commit_files(replayed, APP, 7)
    assert table.version() == before + 1
    assert sum(f.rows for f in files) == len(rows)
    by_spark = spark.read.format("delta").load(table.path).select(*TIMER_INDEX.names)
    assert _sorted([r.asDict() for r in by_spark.collect()]) == _sorted(rows)
    assert _sorted(table.read().to_pylist()) == _sorted(rows)
    slots = {int(p["_lowmark_slot"]) for p in table.open().partitions()}
    assert slots == {-1, 0, 1}


def test_files_of_an_attempt_that_never_committed_are_never_read(tmp_path: Path) -> None:
    table = _timers(tmp_path)
    rows = _timer_rows(7)
    data = pa.Table.from_pylist(rows, schema=TIMER_INDEX)
    crashed = write_files(table.path, data, TIMER_PARTITIONS, 7)  # no commit: the driver died
    replayed = write_files(table.path, data, TIMER_PARTITIONS, 7)

    assert table.commit_files(replayed, APP, 7)
    on_disk = {p.relative_to(table.path).as_posix() for p in Path(table.path).rglob("*.parquet")}
    assert {f.path for f in crashed} <= on_disk  # there, and orphans
    assert _sorted(table.read().to_pylist()) == _sorted(rows)


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _micros(at: datetime) -> int:
    return (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _read(spark: SparkSession, table: DriverTable, reader: str, where: str) -> list[object]:
    """The ``key`` or ``id`` of each row matching ``where`` (column names unquoted,
    timestamps as ``TIMESTAMP '...'`` in UTC), as ``reader`` reads it."""
    column = "key" if "timer_ms" in table.schema.names else "id"  # type: ignore[union-attr]
    if reader == "spark":
        found = spark.read.format("delta").load(table.path).where(where).select(column)
        return sorted(r[0] for r in found.collect())
    rows = table.query(f"SELECT {column} FROM t WHERE {where}")
    return sorted(rows.column(column).to_pylist())


def _commit_apart(
    table: DriverTable, parts: list[list[dict[str, object]]], batch_id: int
) -> list[WrittenFile]:
    """Each of ``parts`` written as its own files (as by its own task), all committed at once."""
    assert table.schema is not None
    files = [
        f
        for part in parts
        for f in write_files(
            table.path,
            pa.Table.from_pylist(part, schema=table.schema),
            table.partition_by,
            batch_id,
        )
    ]
    assert table.commit_files(files, f"app:{batch_id}", batch_id)
    return files


def _delete(table: DriverTable, files: list[WrittenFile]) -> None:
    for f in files:
        (Path(table.path) / f.path).unlink()


@pytest.mark.parametrize("reader", ["spark", "delta-rs"])
def test_reads_skip_the_files_whose_partition_or_statistics_exclude_them(
    spark: SparkSession, tmp_path: Path, reader: str
) -> None:
    """A file a filter excludes by its partition or its statistics is deleted: a read that
    opened it would fail. Timestamps are kept to the millisecond, so a row a microsecond
    past a file's last whole millisecond is still found."""
    timers = _timers(tmp_path)
    early, _later, next_slot = _commit_apart(
        timers,
        [
            [{"timer_ms": ms, "key": f"[{ms}]", "_lowmark_bucket": 0, "pending": True,
              "batch_id": 1, "_lowmark_slot": 0} for ms in range(0, 10_000, 1000)],
            [{"timer_ms": ms, "key": f"[{ms}]", "_lowmark_bucket": 1, "pending": True,
              "batch_id": 1, "_lowmark_slot": 0} for ms in range(20_000, 30_000, 1000)],
            [{"timer_ms": 60_000, "key": "[60000]", "_lowmark_bucket": 1, "pending": True,
              "batch_id": 1, "_lowmark_slot": 1}],
        ],
        1,
    )  # fmt: skip
    _delete(timers, [early, next_slot])
    assert _read(spark, timers, reader, "_lowmark_slot = 0 AND timer_ms >= 20000") == sorted(
        f"[{ms}]" for ms in range(20_000, 30_000, 1000)
    )
    assert len(_read(spark, timers, reader, "_lowmark_slot = 0 AND _lowmark_bucket = 1")) == 10

    ids = DriverTable(str(tmp_path / "dedup_ids"), IDS, partition_by=ID_PARTITIONS)
    ids.create()
    edge = T0 + timedelta(microseconds=1_234)
    first, second = _commit_apart(
        ids,
        [
            [{"id": "a", "event_time": T0, "batch_id": 2, "_lowmark_slot": 0},
             {"id": "b", "event_time": edge, "batch_id": 2, "_lowmark_slot": 0}],
            [{"id": "c", "event_time": T0 + timedelta(seconds=5), "batch_id": 2,
              "_lowmark_slot": 0}],
        ],
        2,
    )  # fmt: skip
    assert json.loads(first.stats)["maxValues"]["event_time"] == "2026-01-01T00:00:00.002Z"
    assert _read(spark, ids, reader, f"event_time >= TIMESTAMP '{edge:%Y-%m-%d %H:%M:%S.%f}'") == [
        "b",
        "c",
    ]
    _delete(ids, [first])
    assert _read(spark, ids, reader, "event_time >= TIMESTAMP '2026-01-01 00:00:01'") == ["c"]
    assert second.rows == 1


def test_a_checkpoint_tables_appends_are_files_lowmark_writes_read_alike_by_spark_and_delta_rs(
    spark: SparkSession, tmp_path: Path
) -> None:
    # delta-rs's own append costs more with every file the table holds (12 ms at 100 files,
    # 45 ms at 500, docs/benchmarks.md); a checkpoint table's append writes its file itself
    # and commits it, as a task's does.
    table = _timers(tmp_path)
    first, second = _timer_rows(1), _timer_rows(2)
    assert table.append_once(pa.Table.from_pylist(first, schema=TIMER_INDEX), APP, 1)
    assert table.append_once(pa.Table.from_pylist(second, schema=TIMER_INDEX), APP, 2)
    version = table.version()
    assert not table.append_once(pa.Table.from_pylist(second, schema=TIMER_INDEX), APP, 2)
    assert table.version() == version

    paths = pa.table(table.open().get_add_actions(flatten=True)).column("path").to_pylist()
    assert all(p.split("/")[-1].startswith(("part-00000001-", "part-00000002-")) for p in paths)
    by_spark = spark.read.format("delta").load(table.path).select(*TIMER_INDEX.names)
    assert _sorted([r.asDict() for r in by_spark.collect()]) == _sorted(first + second)
    assert _sorted(table.read().to_pylist()) == _sorted(first + second)
    assert {int(p["_lowmark_slot"]) for p in table.open().partitions()} == {-1, 0, 1}


def test_a_checkpoint_tables_append_with_a_column_the_table_lacks_adds_the_column(
    tmp_path: Path,
) -> None:
    narrow = pa.schema([pa.field("batch_id", pa.int64(), nullable=False)])
    DriverTable(str(tmp_path / "log"), narrow).append_once(pa.table({"batch_id": [0]}), APP, 0)
    wide = narrow.append(pa.field("note", pa.string()))
    table = DriverTable(str(tmp_path / "log"), wide)

    assert table.append_once(pa.table({"batch_id": [1], "note": ["new"]}), APP, 1)
    rows = sorted(table.read().to_pylist(), key=lambda r: r["batch_id"])
    assert rows == [{"batch_id": 0, "note": None}, {"batch_id": 1, "note": "new"}]


def test_a_users_table_gets_lowmarks_file_unless_the_table_asks_something_of_its_rows(
    spark: SparkSession, tmp_path: Path
) -> None:
    def sink(name: str) -> DriverTable:
        table = DriverTable(str(tmp_path / name), None, "sink", {})
        table.append_once(pa.table({"user": ["a"], "n": pa.array([1], pa.int64())}), APP, 0)
        return table

    plain, checked = sink("plain"), sink("checked")
    checked.open().alter.add_constraint({"positive": "n > 0"})
    rows = pa.table({"user": ["b"], "n": pa.array([-2], pa.int32())})  # narrower: widened

    assert plain.append_once(rows, APP, 1)
    with pytest.raises(Exception, match="validation"):
        checked.append_once(rows, APP, 1)

    names = pa.table(plain.open().get_add_actions(flatten=True)).column("path").to_pylist()
    assert any(n.startswith("part-00000001-") for n in names)
    got = spark.read.format("delta").load(plain.path).orderBy("user").collect()
    assert [(r.user, r.n) for r in got] == [("a", 1), ("b", -2)]
    assert checked.read().num_rows == 1


def test_a_checkpoint_tables_append_of_a_column_of_another_type_is_written_in_the_tables(
    spark: SparkSession, tmp_path: Path
) -> None:
    older = pa.schema([pa.field("batch_id", pa.int64(), nullable=False), pa.field("n", pa.int32())])
    path = str(tmp_path / "log")
    DriverTable(path, older).append_once(pa.table({"batch_id": [0], "n": [1]}, older), APP, 0)
    newer = pa.schema([pa.field("batch_id", pa.int64(), nullable=False), pa.field("n", pa.int64())])

    assert DriverTable(path, newer).append_once(
        pa.table({"batch_id": [1], "n": [2]}, newer), APP, 1
    )
    got = spark.read.format("delta").load(path).orderBy("batch_id").collect()
    assert [(r.batch_id, r.n) for r in got] == [(0, 1), (1, 2)]
