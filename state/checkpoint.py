"""A checkpoint: the folder of Delta tables that holds a pipeline's progress.

Layout under the checkpoint location::

    checkpoint/   one row: pipeline_id, pipeline name, created_at (written last)
    offsets/      write-ahead offset log        (state.offset_log)
    commits/      commit log                    (state.commit_log)
    progress/     per-batch progress            (state.progress)
    files/        file-source manifest          (state.manifest)
    bad_records/  malformed input rows          (state.quarantine)
    schema/       the source schema, fixed once (state.source_schema)

``pipeline_id`` is random per checkpoint (Spark's query id) and is part of
every idempotency key, so a new checkpoint never collides with an old one.
"""

from __future__ import annotations

import uuid

from pyspark.sql import SparkSession
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from state.commit_log import CommitEntry, CommitLog
from state.delta import append_once, create_if_absent, table_exists
from state.errors import CheckpointMissing
from state.log import utc_now
from state.offset_log import OffsetEntry, OffsetLog
from state.progress import ProgressEntry, ProgressLog

_METADATA_SCHEMA = StructType(
    [
        StructField("pipeline_id", StringType(), False),
        StructField("pipeline_name", StringType(), False),
        StructField("created_at", TimestampType(), False),
    ]
)


class Checkpoint:
    """Opens (or creates) the checkpoint of one pipeline at ``location``."""

    def __init__(self, spark: SparkSession, location: str, pipeline_name: str) -> None:
        self.spark = spark
        self.location = location.rstrip("/")
        self.pipeline_name = pipeline_name
        self.pipeline_id = self._open_or_create()
        self.offsets = OffsetLog(
            spark, self.table("offsets"), OffsetEntry, self.txn_app_id("offsets")
        )
        self.commits = CommitLog(
            spark, self.table("commits"), CommitEntry, self.txn_app_id("commits")
        )
        self.progress = ProgressLog(
            spark, self.table("progress"), ProgressEntry, self.txn_app_id("progress")
        )

    def table(self, name: str) -> str:
        """Path of the checkpoint table ``name``."""
        return f"{self.location}/{name}"

    def txn_app_id(self, role: str) -> str:
        """The Delta ``txnAppId`` for writes of ``role`` (a table's role in the pipeline)."""
        return f"{self.pipeline_id}:{role}"

    @staticmethod
    def exists(spark: SparkSession, location: str) -> bool:
        return table_exists(spark, f"{location.rstrip('/')}/checkpoint")

    def _open_or_create(self) -> str:
        """Return the pipeline id, creating the checkpoint if there is none.

        The log tables are created first and the metadata row last, so a crash
        during creation leaves a checkpoint that is simply created again. A
        metadata table next to missing logs (or logs without metadata that
        already hold batches) is refused: never a silent restart from zero.
        """
        metadata = self.table("checkpoint")
        logs = [self.table(name) for name in ("offsets", "commits", "progress")]
        if table_exists(self.spark, metadata):
            for path in logs:
                if not table_exists(self.spark, path):
                    raise CheckpointMissing(
                        f"checkpoint table {path} is missing: restore it, or move "
                        f"{self.location} away to start the pipeline over"
                    )
            return self._read_pipeline_id(metadata)
        offsets = self.table("offsets")
        if table_exists(self.spark, offsets) and self.spark.read.format("delta").load(offsets).take(
            1
        ):
            raise CheckpointMissing(
                f"checkpoint table {metadata} is missing but {offsets} holds batches: "
                f"restore it, or move {self.location} away to start the pipeline over"
            )
        schemas = [
            OffsetEntry.spark_schema(),
            CommitEntry.spark_schema(),
            ProgressEntry.spark_schema(),
        ]
        for path, schema in zip(logs, schemas, strict=True):
            create_if_absent(self.spark, path, schema)
        row = (str(uuid.uuid4()), self.pipeline_name, utc_now())
        df = self.spark.createDataFrame([row], _METADATA_SCHEMA)
        # Two runners creating at once: txn version 0 lets only the first row land.
        append_once(df, metadata, "lowmark:checkpoint", 0)
        return self._read_pipeline_id(metadata)

    def _read_pipeline_id(self, metadata: str) -> str:
        rows = self.spark.read.format("delta").load(metadata).collect()
        if len(rows) != 1:
            raise CheckpointMissing(
                f"checkpoint table {metadata} holds {len(rows)} rows, expected 1: "
                f"restore it, or move {self.location} away to start over"
            )
        return str(rows[0]["pipeline_id"])
