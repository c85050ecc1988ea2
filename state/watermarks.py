"""The watermarks table: per source partition, its max event time, watermark
and the last time it saw data, as of each committed batch.

Appended with every commit (idempotently per batch); the current values are
the rows of the newest batch written.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from state.delta import append_once, table_exists

SCHEMA = StructType(
    [
        StructField("batch_id", LongType(), False),
        StructField("partition", StringType(), False),
        StructField("max_event_time_ms", LongType(), False),
        StructField("watermark_ms", LongType(), False),
        StructField("last_seen_ms", LongType(), False),
    ]
)

Row = tuple[str, int, int, int]
"""(partition, max_event_time_ms, watermark_ms, last_seen_ms)."""


class WatermarkTable:
    """The ``watermarks`` table of a checkpoint."""

    def __init__(self, spark: SparkSession, path: str, txn_app_id: str) -> None:
        self.spark = spark
        self.path = path
        self.txn_app_id = txn_app_id

    def write(self, batch_id: int, rows: list[Row]) -> None:
        data = [(batch_id, *row) for row in rows]
        append_once(self.spark.createDataFrame(data, SCHEMA), self.path, self.txn_app_id, batch_id)

    def as_of(self, batch_id: int) -> list[Row]:
        """The rows written by the newest batch ``<= batch_id`` (empty if none)."""
        if not table_exists(self.spark, self.path):
            return []
        df = self.spark.read.format("delta").load(self.path).where(F.col("batch_id") <= batch_id)
        newest = df.agg(F.max("batch_id")).first()
        if newest is None or newest[0] is None:
            return []
        rows = df.where(F.col("batch_id") == newest[0]).orderBy("partition").collect()
        return [
            (r["partition"], r["max_event_time_ms"], r["watermark_ms"], r["last_seen_ms"])
            for r in rows
        ]
