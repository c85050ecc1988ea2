"""The Delta sink: append and merge, exactly once per batch."""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from lowmark.batches.errors import SinkWriteFailed
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, Maintenance
from lowmark.batches.sinks.delta import DeltaFilesSink, DeltaTableSink
from lowmark.state.delta import TXN_APP_ID_CONF, idempotent_dml
from lowmark.state.table import TABLE_CONFIGURATION
from tests.helpers import counted_per_window, delta_frame, drop_file, pipeline


def test_append_of_the_same_batch_twice_lands_once(spark: SparkSession, tmp_path: Path) -> None:
    sink = DeltaTableSink(spark, DeltaSink(path="x"), str(tmp_path / "t"), "pid:sink")
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id LONG, v STRING")
    first = sink.write(df, 0)
    again = sink.write(df, 0)
    assert first == again
    assert delta_frame(spark, str(tmp_path / "t")).count() == 2


def test_merge_upserts_on_keys_and_a_replayed_batch_is_skipped(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    sink = DeltaTableSink(spark, DeltaSink(path="x", mode="merge", keys=("id",)), path, "pid:sink")
    sink.write(spark.createDataFrame([(1, 10), (2, 20)], "id LONG, n LONG"), 0)
    batch1 = spark.createDataFrame([(2, 21), (3, 30)], "id LONG, n LONG")
    sink.write(batch1, 1)
    # Someone changes a row; a replay of batch 1 must not overwrite it again.
    spark.sql(f"UPDATE delta.`{path}` SET n = 99 WHERE id = 2")
    sink.write(batch1, 1)
    rows = {r.id: r.n for r in delta_frame(spark, path).collect()}
    assert rows == {1: 10, 2: 99, 3: 30}
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None


def test_a_batch_that_does_not_fit_the_sink_schema_is_a_clear_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    sink = DeltaTableSink(spark, DeltaSink(path="x"), str(tmp_path / "t"), "pid:sink")
    sink.write(spark.createDataFrame([(1,)], "id LONG"), 0)
    with pytest.raises(SinkWriteFailed, match="refused batch 1"):
        sink.write(spark.createDataFrame([("a", 1)], "name STRING, n LONG"), 1)


def test_a_merge_in_one_thread_never_takes_or_unsets_another_pipelines_transaction(
    spark: SparkSession, tmp_path: Path
) -> None:
    config = DeltaSink(path="x", mode="merge", keys=("id",))
    a = DeltaTableSink(spark, config, str(tmp_path / "a"), "A:sink")
    b = DeltaTableSink(spark, config, str(tmp_path / "b"), "B:sink")
    rows = spark.createDataFrame([(1, 10)], "id LONG, n LONG")
    a.write(rows, 0)
    # A's MERGE of batch 5 is under way in one thread (its transaction set) while
    # pipeline B, in another thread of the process, writes its batch 1 start to end.
    with idempotent_dml(a.session, "A:sink", 5):
        b.write(rows, 1)
        assert a.session.conf.get(TXN_APP_ID_CONF) == "A:sink"
    assert DeltaTable(str(tmp_path / "b")).transaction_version("A:sink") is None
    assert DeltaTable(str(tmp_path / "b")).transaction_version("B:sink") == 1


@pytest.mark.parametrize("windowed", [False, True], ids=["written-by-spark", "written-by-delta-rs"])
def test_a_sink_has_deltas_defaults_and_the_properties_its_user_set_never_the_checkpoints(
    spark: SparkSession, tmp_path: Path, windowed: bool
) -> None:
    change_feed = {"delta.enableChangeDataFeed": "true"}
    for name, properties in (("defaults", {}), ("change_feed", change_feed)):
        root = tmp_path / name
        # Maintenance after every batch: it maintains the checkpoint, never the sink.
        fields = {
            "sink": DeltaSink(path="out", properties=properties),
            "maintenance": Maintenance(every_batches=1),
        }
        p = counted_per_window(**fields) if windowed else pipeline(**fields)
        for index in range(2):  # the second batch writes to the table the first created
            drop_file(root, index)
            assert len(MicroBatchRunner(spark, p, root).run(max_batches=None)) == 1
        config = DeltaTable(str(root / "out")).metadata().configuration
        assert set(config) & set(TABLE_CONFIGURATION) == set(), config
        assert config.items() >= properties.items()
    # Six records, one per id (a window each): six rows inserted, as the change feed says.
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(str(tmp_path / "change_feed" / "out"))
    )
    assert changes.where("_change_type = 'insert'").count() == 6


@pytest.mark.parametrize(
    ("key", "example"),
    [(3, '{"id":3,"part":"a"}'), (2, '{"id":2,"part":"a"}'), (2, None)],
    ids=["new-key", "key-in-the-sink", "key-in-the-sink-source-not-materialized"],
)
def test_a_merge_batch_holding_two_records_of_one_key_is_refused_and_writes_nothing(
    spark: SparkSession, tmp_path: Path, key: int, example: str | None
) -> None:
    path = str(tmp_path / "t")
    config = DeltaSink(path="x", mode="merge", keys=("id", "part"))
    sink = DeltaTableSink(spark, config, path, "pid:sink")
    schema = "id LONG, part STRING, n LONG"
    sink.write(spark.createDataFrame([(1, "a", 10), (2, "a", 20)], schema), 0)
    if example is None:  # as for a source of Delta tables only: Delta's own check comes first
        sink.session.conf.set("spark.databricks.delta.merge.materializeSource", "none")
    twice = spark.createDataFrame([(key, "a", 30), (1, "b", 11), (key, "a", 31)], schema)
    named = re.escape(f"e.g. {example}") if example else "one the sink holds"
    refusal = (
        rf"^sink {path} refused batch 1: keys \(id, part\) are not unique within the batch "
        rf"\({named} is in two records\)"
    )
    with pytest.raises(SinkWriteFailed, match=refusal):
        sink.write(twice, 1)
    rows = sorted((r.id, r.part, r.n) for r in delta_frame(spark, path).collect())
    assert rows == [(1, "a", 10), (2, "a", 20)]


NESTED = "id LONG, at TIMESTAMP, amount DECIMAL(10,2), tags ARRAY<STRING>, who STRUCT<name: STRING>"


def _engines(path: str) -> set[str]:
    """The engines that wrote each commit of the table at ``path`` (delta-rs or Spark)."""
    infos = DeltaTable(path).history()
    return {"delta-rs" if "clientVersion" in i else str(i.get("engineInfo")) for i in infos}


def test_a_files_sink_appends_each_batch_once_as_the_files_its_tasks_wrote(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Three partitions of rows: three data files, committed by delta-rs (no Spark commit),
    every value as Spark wrote it; a replay of the batch writes nothing."""
    path = str(tmp_path / "t")
    sink = DeltaFilesSink(DeltaSink(path="x"), path, "pid:sink")
    at = datetime(2026, 1, 2, 3, 4, 5, 678_901)
    rows = [(i, at, Decimal(f"{i}.25"), ["a", str(i)], (f"n{i}",)) for i in range(6)]
    df = spark.createDataFrame(rows, NESTED).repartition(3)
    version = sink.write(df, 0)
    assert sink.write(df, 0) == version
    assert len(DeltaTable(path).file_uris()) == 3
    assert _engines(path) == {"delta-rs"}
    back = delta_frame(spark, path)
    assert sorted(tuple(r) for r in back.collect()) == sorted(
        tuple(r) for r in spark.createDataFrame(rows, NESTED).collect()
    )
    assert DeltaTable(path).transaction_version("pid:sink") == 0


def test_a_files_sink_records_an_empty_batch_and_takes_rows_made_on_the_driver(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    sink = DeltaFilesSink(DeltaSink(path="x"), path, "pid:sink")
    sink.write(spark.createDataFrame([], "id LONG, v STRING"), 0)
    assert sink.landed(0) and delta_frame(spark, path).count() == 0
    sink.write_rows(pa.table({"id": [1], "v": ["a"]}), 1)
    sink.write_rows(pa.table({"id": [1], "v": ["a"]}), 1)
    assert [tuple(r) for r in delta_frame(spark, path).collect()] == [(1, "a")]
    assert _engines(path) == {"delta-rs"}


def test_a_files_sink_gains_a_new_column_and_refuses_rows_that_do_not_fit(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A batch with one more column (a definition changed) widens the table, nulls before;
    one whose column changed its kind is refused, and nothing of it lands."""
    path = str(tmp_path / "t")
    sink = DeltaFilesSink(DeltaSink(path="x"), path, "pid:sink")
    sink.write(spark.createDataFrame([(1,)], "id LONG"), 0)
    sink.write(spark.createDataFrame([(2, "b")], "id LONG, v STRING"), 1)
    assert sorted(tuple(r) for r in delta_frame(spark, path).collect()) == [(1, None), (2, "b")]
    with pytest.raises(SinkWriteFailed, match="refused batch 2"):
        sink.write(spark.createDataFrame([("x", "c")], "id STRING, v STRING"), 2)
    assert not sink.landed(2) and delta_frame(spark, path).count() == 2


def test_a_files_sink_checks_the_constraints_of_a_table_its_user_made(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A user's table with a CHECK constraint: its rows go through delta-rs's writer, which
    refuses a batch with a row against the constraint and lands a batch without one."""
    path = str(tmp_path / "t")
    spark.createDataFrame([(1,)], "n LONG").write.format("delta").save(path)
    spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT positive CHECK (n > 0)")
    sink = DeltaFilesSink(DeltaSink(path="x"), path, "pid:sink")
    with pytest.raises(SinkWriteFailed, match=r"refused batch 0: .* failed validation check"):
        sink.write(spark.createDataFrame([(5,), (-1,)], "n LONG"), 0)
    assert not sink.landed(0)
    sink.write(spark.createDataFrame([(5,)], "n LONG"), 0)
    assert sorted(r.n for r in delta_frame(spark, path).collect()) == [1, 5]


@pytest.mark.parametrize(
    ("column", "named"),
    [("INTERVAL '1' YEAR", "YearMonthIntervalType"), ("parse_json('[1]')", "VARIANT")],
    ids=["interval", "variant"],
)
def test_a_files_sink_refuses_a_column_it_cannot_write_as_it_is_and_writes_nothing(
    spark: SparkSession, tmp_path: Path, column: str, named: str
) -> None:
    path = str(tmp_path / "t")
    sink = DeltaFilesSink(DeltaSink(path="x"), path, "pid:sink")
    rows = spark.sql(f"SELECT 1 AS id, {column} AS v")
    with pytest.raises(SinkWriteFailed, match=f"refused batch 0: .*{named}"):
        sink.write(rows, 0)
    assert not sink.landed(0)


def test_a_files_sink_goes_on_with_a_table_spark_appended_to_and_knows_what_landed(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A deduplicating or keyed pipeline's sink that an older lowmark wrote with Spark: the
    batch Spark wrote is not written again, the next one is appended by delta-rs."""
    path = str(tmp_path / "t")
    first = spark.createDataFrame([(1, "a")], "id LONG, v STRING")
    DeltaTableSink(spark, DeltaSink(path="x"), path, "pid:sink").write(first, 0)
    sink = DeltaFilesSink(DeltaSink(path="x"), path, "pid:sink")
    assert sink.landed(0) and sink.last_landed() == 0
    sink.write(first, 0)
    sink.write(spark.createDataFrame([(2, "b")], "id LONG, v STRING"), 1)
    assert sorted(tuple(r) for r in delta_frame(spark, path).collect()) == [(1, "a"), (2, "b")]
    assert len(_engines(path)) == 2 and sink.last_landed() == 1
