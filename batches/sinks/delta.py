"""The Delta sinks: append or MERGE, exactly once per batch.

Every sink write is a Delta idempotent write keyed on ``(<pipeline_id>:sink,
batch_id)``: a replayed batch whose write already landed is skipped. Each
sink table has one writer engine, fixed by the pipeline's kind:

- ``DeltaTableSink``: a stateless pipeline's records, any number of them,
  written by Spark's executors;
- ``DeltaWindowSink``: a windowed pipeline's emitted windows, a few per batch,
  already on the driver, written there with delta-rs (no Spark job). Its
  backfills write with delta-rs too. A stream-stream join's rows, made on the
  driver, are written the same way.

A sink is the user's table, not a checkpoint table: either engine creates it
with the properties of ``DeltaSink.properties`` and Delta's defaults for the
rest (log retention, clean-up of expired log files), and lowmark's
maintenance never touches it.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from lowmark.batches.errors import SinkWriteFailed
from lowmark.batches.pipeline import DeltaSink, Pipeline
from lowmark.batches.sinks.base import Sink, SinkFence, WindowedSink
from lowmark.batches.sinks.owner import check_sink_is_ours
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.delta import append_once, duplicate_key, latest_version, upsert_once
from lowmark.state.session import SparkLike, own_session, provider
from lowmark.state.table import DriverTable

_MATCHED_TWICE = "DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE"
"""Delta's error for two source rows of one MERGE matching one row of the table: it may come
first when Delta does not materialize the MERGE's source (a source of Delta tables only)."""


class DeltaFence(SinkFence):
    """A Delta sink's fence: the app transactions of its commits, and their writers."""

    def __init__(self, path: str, txn_app_id: str) -> None:
        self.path = path
        self.txn_app_id = txn_app_id

    def landed(self, batch_id: int) -> bool:
        return DriverTable(self.path, None, "sink").landed(self.txn_app_id, batch_id)

    def last_landed(self) -> int:
        """The app transaction's version (Delta keeps the newest one per app id)."""
        table = DriverTable(self.path, None, "sink")
        found = table.open().transaction_version(self.txn_app_id) if table.exists() else None
        return -1 if found is None else found

    def check_ours(self, pipeline: Pipeline, checkpoint: Checkpoint) -> None:
        """The table's last lowmark writer (``lowmark.state.ownership``) is ours."""
        check_sink_is_ours(pipeline, checkpoint, self.path)


class DeltaTableSink(DeltaFence, Sink):
    """A stateless pipeline's sink, written by Spark.

    An append carries its transaction as write options; a MERGE takes it from
    session confs (Delta reads no options for DML), so the sink MERGEs in a
    session of its own (``session``: same Spark, own SQL confs): another
    pipeline writing in another thread of the process never sees its
    transaction, nor unsets it.
    """

    def __init__(self, spark: SparkLike, config: DeltaSink, path: str, txn_app_id: str) -> None:
        self._spark = provider(spark)
        self._session: SparkSession | None = None
        self.config = config
        self.path = path
        self.txn_app_id = txn_app_id

    @property
    def session(self) -> SparkSession:
        """The session this sink's MERGEs run in (its own, made on first use)."""
        if self._session is None:
            self._session = own_session(self._spark())
        return self._session

    def write(self, df: DataFrame, batch_id: int, retract: DataFrame | None = None) -> int:
        try:
            properties = self.config.properties
            if self.config.mode == "append":
                try:
                    append_once(df, self.path, self.txn_app_id, batch_id, properties)
                except AnalysisException:
                    if not self._adds_columns(df):
                        raise
                    # A definition changed at this batch (a new source column, a step's new
                    # column): the table gains the columns, null in the rows before.
                    append_once(df, self.path, self.txn_app_id, batch_id, properties, True)
            else:
                upsert_once(
                    self.session,
                    self.path,
                    df,
                    retract,
                    self.config.keys,
                    self.txn_app_id,
                    batch_id,
                    properties=properties,
                )
        except AnalysisException as exc:
            first = str(exc).strip().splitlines()[0]
            raise SinkWriteFailed(
                f"sink {self.path} refused batch {batch_id}: {first}; fix the transform "
                "or point the sink at a new table"
            ) from exc
        except Exception as exc:
            key = duplicate_key(exc)
            if key is None and _MATCHED_TWICE not in str(exc):
                raise
            keys = ", ".join(self.config.keys)
            example = f"e.g. {key}" if key is not None else "one the sink holds"
            raise SinkWriteFailed(
                f"sink {self.path} refused batch {batch_id}: keys ({keys}) are not unique "
                f"within the batch ({example} is in two records); make them unique in the "
                "transform (keep one record per key)"
            ) from exc
        return latest_version(self.path)

    def _adds_columns(self, df: DataFrame) -> bool:
        """Whether ``df`` has every column of the sink's table and more: it adds columns and
        drops none (a batch that lacks a column is still refused)."""
        table = DriverTable(self.path, None, "sink")
        if not table.exists():
            return False
        held = {field.name.lower() for field in table.open().schema().fields}
        return held < {name.lower() for name in df.columns}


class DeltaWindowSink(DeltaFence, WindowedSink):
    """The sink of a windowed pipeline: emitted windows appended, or MERGEd on keys + window
    (contract: ``WindowedSink``)."""

    def __init__(self, config: DeltaSink, path: str, txn_app_id: str) -> None:
        self.config = config
        self.table = DriverTable(path, None, "sink", config.properties)
        self.path = self.table.path
        self.txn_app_id = txn_app_id

    def write(self, rows: pa.Table, batch_id: int, retract: pa.Table | None = None) -> int | None:
        """Write batch ``batch_id``'s windows once; the sink's version after it.

        Nothing is written for a batch without changes, but the first batch
        creates the table (empty), so readers find it from the start.
        """
        changed = rows.num_rows or (retract is not None and retract.num_rows)
        if not changed and self.table.exists():
            return self.table.version()
        try:
            if self.config.mode == "append" or not self.table.exists():
                self.table.append_once(rows, self.txn_app_id, batch_id)
            else:
                deletes = retract if retract is not None else rows.select(self.config.keys)[:0]
                self.table.merge_once(rows, deletes, self.config.keys, self.txn_app_id, batch_id)
        except Exception as exc:
            if "Schema" not in type(exc).__name__ and "schema" not in str(exc).lower():
                raise
            first = str(exc).strip().splitlines()[0]
            raise SinkWriteFailed(
                f"sink {self.path} refused batch {batch_id}: {first}; point the sink at a new "
                "table or restore its schema"
            ) from exc
        return self.table.version()
