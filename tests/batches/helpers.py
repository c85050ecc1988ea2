"""Builders shared by the engine tests."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from batches.pipeline import DeltaSink, FileSource, Pipeline
from batches.windows import Aggregate, EventTime, Tumbling, WindowedAggregation
from state.checkpoint import Checkpoint
from tests.conftest import write_json_lines


def double_amount(df: DataFrame) -> DataFrame:
    return df.withColumn("amount", F.col("amount") * 2)


def pipeline(**overrides: Any) -> Pipeline:
    fields: dict[str, Any] = {
        "name": "t",
        "source": FileSource(path="in", format="json", schema_ddl="id LONG, amount LONG"),
        "sink": DeltaSink(path="out"),
    }
    fields.update(overrides)
    return Pipeline(**fields)


def amount_as_seconds(df: DataFrame) -> DataFrame:
    """``drop_file``'s records with an event time: ``amount`` seconds after the epoch."""
    return df.withColumn("ts", F.timestamp_seconds("amount"))


def counted_per_window(**overrides: Any) -> Pipeline:
    """``pipeline`` with windows: records per id in 10-second windows of ``ts``, upserted
    (update mode: every window a batch changes is written at once)."""
    windows: dict[str, Any] = {
        "transform": amount_as_seconds,
        "event_time": EventTime(column="ts"),
        "aggregation": WindowedAggregation(
            keys=("id",),
            window=Tumbling(size="10 seconds"),
            aggregates=(Aggregate(fn="count"),),
            output_mode="update",
        ),
    }
    return pipeline(**(windows | overrides))


def drop_file(root: Path, index: int, rows: int = 3) -> Path:
    """File ``index`` holds ids index*100 .. index*100+rows-1; mtimes follow ``index``."""
    records = [{"id": index * 100 + i, "amount": i} for i in range(rows)]
    return write_json_lines(root / "in", f"f{index:03d}.json", records, 1_700_000_000 + index)


def sink_ids(spark: SparkSession, root: Path, table: str = "out") -> list[int]:
    df = spark.read.format("delta").load(str(root / table))
    return sorted(r["id"] for r in df.select("id").collect())


def per_window(df: DataFrame, key: str, window: Column, *aggregates: Column) -> DataFrame:
    """A plain Spark batch's windowed aggregation of ``df``, shaped as lowmark's sink:
    ``key``, ``window_start``, ``window_end``, then the (aliased) ``aggregates``."""
    out = df.groupBy(key, window.alias("w")).agg(*aggregates)
    return out.select(
        key,
        F.col("w.start").alias("window_start"),
        F.col("w.end").alias("window_end"),
        *[c for c in out.columns if c not in (key, "w")],
    )


def append_events(spark: SparkSession, table: Path, events: list[dict[str, Any]]) -> None:
    """Append ``events`` (``user``, ``ts`` as ISO text, ``amount``) to the Delta table
    ``table`` as one version."""
    rows = [(e["user"], datetime.fromisoformat(e["ts"]), e["amount"]) for e in events]
    df = spark.createDataFrame(rows, "user STRING, ts TIMESTAMP, amount LONG")
    df.write.format("delta").mode("append").save(str(table))


def vacuum_every_version(spark: SparkSession, table: Path) -> None:
    """OPTIMIZE the Delta table ``table`` into new files, then VACUUM with no retention: the
    files every earlier version added are gone."""
    spark.sql(f"OPTIMIZE delta.`{table}`")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{table}` RETAIN 0 HOURS")
    finally:
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "true")


def forget_start_offsets(checkpoint: Checkpoint) -> None:
    """Make ``checkpoint`` look as one written before it recorded where batch 0 started."""
    rows = pa.Table.from_pylist(
        [{"pipeline_id": checkpoint.pipeline_id, "start_offsets": None}],
        schema=pa.schema([("pipeline_id", pa.string()), ("start_offsets", pa.string())]),
    )
    checkpoint.metadata.update(rows, "pipeline_id", 0)
