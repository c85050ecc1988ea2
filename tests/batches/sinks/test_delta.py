"""The Delta sink: append and merge, exactly once per batch."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from batches.errors import SinkWriteFailed
from batches.pipeline import DeltaSink
from batches.sinks.delta import DeltaTableSink
from state.delta import TXN_APP_ID_CONF, idempotent_dml


def test_append_of_the_same_batch_twice_lands_once(spark: SparkSession, tmp_path: Path) -> None:
    sink = DeltaTableSink(spark, DeltaSink(path="x"), str(tmp_path / "t"), "pid:sink")
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id LONG, v STRING")
    first = sink.write(df, 0)
    again = sink.write(df, 0)
    assert first == again
    assert spark.read.format("delta").load(str(tmp_path / "t")).count() == 2


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
    rows = {r.id: r.n for r in spark.read.format("delta").load(path).collect()}
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
