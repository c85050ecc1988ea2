"""Builders shared by the engine tests."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from batches.pipeline import DeltaSink, FileSource, Pipeline
from batches.sources.base import Range, Source, SourceRead
from batches.windows import Aggregate, EventTime, Tumbling, WindowedAggregation
from state.checkpoint import Checkpoint
from state.offset_log import Offsets
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


class FlakyReads(Source):
    """``inner``, whose first ``failures`` reads raise ``error`` (a broker away for a
    while); everything else is ``inner``'s."""

    def __init__(self, inner: Source, failures: int, error: Exception) -> None:
        self.inner = inner
        self.failures = failures
        self.error = error
        self.reads = 0

    def read(
        self,
        start: Offsets,
        end: Offsets,
        batch_id: int,
        cache: bool = False,
        strict: bool = False,
    ) -> SourceRead:
        self.reads += 1
        if self.reads <= self.failures:
            raise self.error
        return self.inner.read(start, end, batch_id, cache, strict)

    def initial_offsets(self) -> Offsets:
        return self.inner.initial_offsets()

    def plan(
        self, start: Offsets, batch_id: int, record: bool = True, discover: bool = True
    ) -> Offsets:
        return self.inner.plan(start, batch_id, record, discover)

    def backlog(self, committed_end: Offsets) -> dict[str, int]:
        return self.inner.backlog(committed_end)

    def read_batches(self, batches: Sequence[Range]) -> SourceRead | None:
        return None  # every read goes through ``read``, so each counts

    def partitions(self, start: Offsets, end: Offsets) -> tuple[str, ...]:
        return self.inner.partitions(start, end)

    def inputs(self, start: Offsets, end: Offsets) -> list[str]:
        return self.inner.inputs(start, end)

    def confirm(self, batch: Range) -> None:
        self.inner.confirm(batch)

    def commit(self, end: Offsets) -> None:
        self.inner.commit(end)


def parse_times(df: DataFrame) -> DataFrame:
    """Parses ``ts``; under ANSI mode a value that is no time fails the batch."""
    return df.withColumn("at", F.to_timestamp("ts"))


def slowly(df: DataFrame) -> DataFrame:
    """Half a second per record: a batch long enough to be interrupted."""

    # Nested, so it is pickled by value: Spark's Python workers need not import this
    # module (and what it imports). No type hints: PySpark would look for a pandas UDF.
    def after_half_a_second(value):
        time.sleep(0.5)
        return value

    slow_id = F.udf(after_half_a_second, LongType(), useArrow=False)
    return df.withColumn("id", slow_id("id"))


FIRST_CONTACT_YAML = """
pipelines:
  - name: times
    source: {kind: files, path: in, format: json, schema_ddl: "id LONG, ts STRING"}
    transform: tests.batches.helpers:parse_times
    sink: {kind: delta, path: out}
  - name: into_a_file
    source: {kind: files, path: in, format: json, schema_ddl: "id LONG, ts STRING"}
    sink: {kind: delta, path: a_file}
  - name: string_time
    source: {kind: files, path: in, format: json, schema_ddl: "id LONG, ts STRING"}
    sink: {kind: delta, path: out}
    event_time: {column: ts, max_out_of_orderness: 10 seconds}
    aggregation:
      keys: [id]
      window: {kind: tumbling, size: 1 minute}
      aggregates: [{fn: count}]
  - name: slow
    source: {kind: files, path: in, format: json, schema_ddl: "id LONG, ts STRING"}
    transform: tests.batches.helpers:slowly
    sink: {kind: delta, path: out}
"""
"""Pipelines a new user gets wrong: a transform that fails on a record, a sink path that
is a file, an event-time column that is a string; and one slow enough to interrupt."""
