"""The file manifest: every file the file source ever discovered, in order.

Each discovered file gets the next sequence number ``seq`` of its source
partition, in (modification time, path) order; a batch's offsets are a
``seq`` range per partition, so "which files did batch N take" is a join of
``offsets`` with ``files`` and a replay reads exactly the same files.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from state.delta import append_once, table_exists

SCHEMA = StructType(
    [
        StructField("partition", StringType(), False),
        StructField("seq", LongType(), False),
        StructField("path", StringType(), False),
        StructField("size", LongType(), False),
        StructField("modified_ms", LongType(), False),
        StructField("discovered_for_batch", LongType(), False),
    ]
)


@dataclass(frozen=True)
class ManifestFile:
    partition: str
    seq: int
    path: str
    size: int
    modified_ms: int


class FileManifest:
    """The ``files`` table of a checkpoint."""

    def __init__(self, spark: SparkSession, path: str, txn_app_id: str) -> None:
        self.spark = spark
        self.path = path
        self.txn_app_id = txn_app_id

    def files(self) -> list[ManifestFile]:
        """Every recorded file, by (partition, seq); empty before the first ``record``."""
        if not table_exists(self.spark, self.path):
            return []
        df = self.spark.read.format("delta").load(self.path)
        return [
            ManifestFile(r["partition"], r["seq"], r["path"], r["size"], r["modified_ms"])
            for r in df.orderBy("partition", "seq").collect()
        ]

    def record(self, new: list[ManifestFile], batch_id: int) -> None:
        """Append newly discovered files (numbered by the caller) while planning ``batch_id``.

        Idempotent per planned batch: if discovery for ``batch_id`` already
        landed (a crash before its offsets were written, or a racing runner),
        Delta skips this append and the files are recorded when a later batch
        is planned. Planning and reading therefore go by the table, never by
        the caller's list: offsets only ever cover recorded files.
        """
        rows = [(f.partition, f.seq, f.path, f.size, f.modified_ms, batch_id) for f in new]
        append_once(self.spark.createDataFrame(rows, SCHEMA), self.path, self.txn_app_id, batch_id)
