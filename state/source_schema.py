"""The source schema, fixed when the checkpoint first reads data.

Inferring a schema anew each batch would let two batches disagree; like
Spark's file stream source, lowmark infers once and keeps the result here.
"""

from __future__ import annotations

import json

from pyspark.sql import SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from state.delta import append_once, table_exists

SCHEMA = StructType([StructField("schema_json", StringType(), False)])


class SourceSchema:
    """The ``schema`` table of a checkpoint: at most one row."""

    def __init__(self, spark: SparkSession, path: str, txn_app_id: str) -> None:
        self.spark = spark
        self.path = path
        self.txn_app_id = txn_app_id

    def get(self) -> StructType | None:
        if not table_exists(self.spark, self.path):
            return None
        row = self.spark.read.format("delta").load(self.path).first()
        return StructType.fromJson(json.loads(row["schema_json"])) if row else None

    def fix(self, schema: StructType) -> StructType:
        """Record ``schema`` unless one is recorded; return the recorded one."""
        df = self.spark.createDataFrame([(schema.json(),)], SCHEMA)
        append_once(df, self.path, self.txn_app_id, 0)
        fixed = self.get()
        assert fixed is not None
        return fixed
