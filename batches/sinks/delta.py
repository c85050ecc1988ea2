"""The Delta sink: append or MERGE, exactly once per batch.

Both modes are Delta idempotent writes keyed on ``(<pipeline_id>:sink,
batch_id)``: a replayed batch whose write already landed is skipped by Delta.
"""

from __future__ import annotations

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from batches.errors import SinkWriteFailed
from batches.pipeline import DeltaSink
from batches.sinks.base import Sink
from state.delta import append_once, latest_version, upsert_once


class DeltaTableSink(Sink):
    def __init__(self, spark: SparkSession, config: DeltaSink, path: str, txn_app_id: str) -> None:
        self.spark = spark
        self.config = config
        self.path = path
        self.txn_app_id = txn_app_id

    def write(self, df: DataFrame, batch_id: int, retract: DataFrame | None = None) -> int:
        try:
            if self.config.mode == "append":
                append_once(df, self.path, self.txn_app_id, batch_id)
            else:
                keys = self.config.keys
                upsert_once(self.spark, self.path, df, retract, keys, self.txn_app_id, batch_id)
        except AnalysisException as exc:
            first = str(exc).strip().splitlines()[0]
            raise SinkWriteFailed(
                f"sink {self.path} refused batch {batch_id}: {first}; fix the transform "
                "or point the sink at a new table"
            ) from exc
        return latest_version(self.spark, self.path)
