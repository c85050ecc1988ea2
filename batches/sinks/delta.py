"""The Delta sinks: append or MERGE, exactly once per batch.

Every sink write is a Delta idempotent write keyed on ``(<pipeline_id>:sink,
batch_id)``: a replayed batch whose write already landed is skipped. Each
sink table has one writer engine, fixed by the pipeline's kind:

- ``DeltaTableSink``: a stateless pipeline's records, any number of them,
  written by Spark's executors;
- ``DeltaFilesSink``: the records of a pipeline that deduplicates or has a keyed
  step, appended: written as data files by the Python tasks that made them, added
  to the table by delta-rs from the driver;
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

import json
from collections.abc import Callable

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from lowmark.batches.errors import SinkWriteFailed
from lowmark.batches.pipeline import DeltaSink, Pipeline
from lowmark.batches.sinks.base import Sink, SinkFence, WindowedSink
from lowmark.batches.sinks.owner import check_sink_is_ours
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.delta import append_once, duplicate_key, latest_version, upsert_once
from lowmark.state.errors import first_line
from lowmark.state.session import SparkLike, own_session, provider
from lowmark.state.table import DriverTable
from lowmark.state.task_appends import FileWriter, WrittenFile

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


class _DriverWritten(DeltaFence):
    """A Delta sink whose commits delta-rs makes from the driver (``DriverTable``): the
    user's table, created with the sink's properties."""

    def __init__(self, config: DeltaSink, path: str, txn_app_id: str) -> None:
        self.config = config
        self.table = DriverTable(path, None, "sink", config.properties)
        self.path = self.table.path
        self.txn_app_id = txn_app_id

    def _landed_by(self, write: Callable[[], object], batch_id: int) -> int:
        """Run ``write``, delta-rs's of batch ``batch_id``; the table's version after it.
        Rows that do not fit the table raise ``SinkWriteFailed`` (``_refused``)."""
        try:
            write()
        except Exception as exc:
            refused = _refused(self.path, batch_id, exc)
            if refused is None:
                raise
            raise refused from exc
        return self.table.version()


class DeltaFilesSink(_DriverWritten, Sink):
    """The Delta append sink of a pipeline whose records pass through Python tasks anyway
    (``dedup``, a ``keyed`` step): written by delta-rs, never by Spark's Delta writer.

    The batch's job ends in the tasks that made its rows: each writes them as a
    data file into the table's folder (``task_appends.FileWriter``), and the
    driver adds the files in one commit carrying the batch's transaction
    (``DriverTable.commit_files``), as it commits keyed state and seen ids. No
    row passes through the driver. (Spark's Delta writer checks the transaction
    against a state it builds in a job of its own for every version, and commits
    from the JVM: 0.3-0.5 s of a small batch.)

    Rows that cannot go into a file as they are (the table would gain a column, or
    asks something of its rows: constraints, generated columns, partitions,
    reader features; see ``DriverTable.file_schema``) are brought to the driver and
    appended by delta-rs's writer (``DriverTable.append_once``), which evolves the
    schema or checks the rows. So are a batch's rows made on the driver already
    (``write_rows``: a keyed batch that only fired timers).
    """

    def write(self, df: DataFrame, batch_id: int, retract: DataFrame | None = None) -> int:
        if self.table.landed(self.txn_app_id, batch_id):
            return self.table.version()
        try:
            given = to_arrow_schema(df.schema, timezone="UTC")
        except TypeError as exc:  # PySpark's: a type Arrow cannot hold (its message names it)
            raise SinkWriteFailed(
                f"sink {self.path} refused batch {batch_id}: {first_line(exc)}; cast the "
                "column in the transform"
            ) from exc
        variants = [f.name for f in given if _holds_variant(f)]
        if variants:  # Arrow carries a VARIANT as a struct of two binaries: not a variant
            raise SinkWriteFailed(
                f"sink {self.path} refused batch {batch_id}: column {variants[0]} holds a "
                "VARIANT, which the sink of a deduplicating or keyed pipeline cannot write; "
                "make it a string in the transform (to_json)"
            )
        if not self.table.exists():  # created empty, so that the tasks' files have a table
            DriverTable(self.path, given, "sink", self.config.properties).create()
        schema = self.table.file_schema(given)
        if schema is None:
            return self.write_rows(df.toArrow(), batch_id)
        writer = FileWriter(self.path, schema, batch_id)
        described = df.mapInArrow(writer, f"{FileWriter.DESCRIBED} string").collect()
        files = [WrittenFile.of(json.loads(row[0])) for row in described]
        self.table.commit_files(files, self.txn_app_id, batch_id)
        return self.table.version()

    def write_rows(self, rows: pa.Table, batch_id: int) -> int:
        """Append ``rows``, on the driver, as batch ``batch_id`` (once); the table's version."""
        return self._landed_by(
            lambda: self.table.append_once(rows, self.txn_app_id, batch_id), batch_id
        )


class DeltaWindowSink(_DriverWritten, WindowedSink):
    """The sink of a windowed pipeline: emitted windows appended, or MERGEd on keys + window
    (contract: ``WindowedSink``)."""

    def write(self, rows: pa.Table, batch_id: int, retract: pa.Table | None = None) -> int | None:
        """Write batch ``batch_id``'s windows once; the sink's version after it.

        Nothing is written for a batch without changes, but the first batch
        creates the table (empty), so readers find it from the start.
        """
        changed = rows.num_rows or (retract is not None and retract.num_rows)
        if not changed and self.table.exists():
            return self.table.version()

        def write() -> None:
            if self.config.mode == "append" or not self.table.exists():
                self.table.append_once(rows, self.txn_app_id, batch_id)
            else:
                deletes = retract if retract is not None else rows.select(self.config.keys)[:0]
                self.table.merge_once(rows, deletes, self.config.keys, self.txn_app_id, batch_id)

        return self._landed_by(write, batch_id)


def _holds_variant(field: pa.Field) -> bool:
    """Whether ``field`` is, or holds, a Spark VARIANT (as PySpark gives it to Arrow)."""
    if field.metadata and field.metadata.get(b"variant") == b"true":
        return True
    kind = field.type
    if pa.types.is_struct(kind):
        return any(_holds_variant(kind.field(i)) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _holds_variant(kind.value_field)
    if pa.types.is_map(kind):
        return _holds_variant(kind.key_field) or _holds_variant(kind.item_field)
    return False


_UNFIT = {
    "schema": "point the sink at a new table or restore its schema",
    "cast error": "point the sink at a new table or restore its schema",
    "failed validation check": "make the transform's rows meet the table's constraints",
}
"""What delta-rs's writer says of rows that do not fit a table (lower case), and the way on."""


def _refused(path: str, batch_id: int, exc: Exception) -> SinkWriteFailed | None:
    """``SinkWriteFailed`` for ``exc``, raised by delta-rs's write of batch ``batch_id`` to the
    sink at ``path``, when the rows do not fit the table: its schema, or its constraints
    (None: another error)."""
    said = f"{type(exc).__name__} {exc}".lower()
    way_on = next((way for cause, way in _UNFIT.items() if cause in said), None)
    if way_on is None:
        return None
    first = str(exc).strip().splitlines()[0]
    return SinkWriteFailed(f"sink {path} refused batch {batch_id}: {first}; {way_on}")
