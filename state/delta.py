"""Spark's idempotent writes, for the one table Spark writes: a stateless pipeline's sink
(appended to without ``dedup`` or a keyed step, or merged into).

Its rows are the batch's records (any size), so Spark's executors write them.
Every write carries ``txnAppId = "<pipeline_id>:sink"`` and ``txnVersion =
batch_id``, so Delta skips a write of the same batch that already landed.
Everything else a batch writes is small and goes through ``lowmark.state.table``.

Delta checks a write's transaction against the table's state (``txnVersion`` reads
the snapshot's set transactions), which it builds in a Spark job for every new
version: the check of batch N+1's write would cost a job for the version batch N's
wrote. So once a write lands, that state is built at once, off the batch's path
(``_build_state_for_next_check``); the next write finds it built, or waits for it.
"""

from __future__ import annotations

import atexit
import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from lowmark.state.conflicts import retry_conflicts
from lowmark.state.ownership import writer_metadata
from lowmark.state.session import is_remote_session
from lowmark.state.storage import is_table, open_table

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"

log = logging.getLogger(__name__)

STATE_JOB_GROUP = "lowmark-sink-state"
"""The Spark job group of the jobs that build a table's state for its next write's check."""
_building: set[threading.Thread] = set()
"""The threads building a table's state now."""

_DUPLICATE_KEY = re.compile(r"lowmark: duplicate merge key (.*?) :lowmark", re.DOTALL)
"""The error a MERGE source row raises when another row of the batch has its keys (Spark's
``raise_error``), around the keys as JSON."""


def append_once(
    df: DataFrame,
    path: str,
    app_id: str,
    version: int,
    properties: dict[str, str] | None = None,
    merge_schema: bool = False,
) -> None:
    """Append ``df`` to the Delta table at ``path`` unless (app_id, version) landed; a table
    this creates gets the table ``properties`` (``delta.*`` options: Delta applies them when
    a write creates the table). ``merge_schema``: the table gains ``df``'s columns it lacks
    (Delta's ``mergeSchema``)."""

    rows = _uncollated(df)

    def append() -> None:
        (
            rows.write.format("delta")
            .mode("append")
            .options(**(properties or {}))
            .option("mergeSchema", str(merge_schema).lower())
            .option("txnAppId", app_id)
            .option("txnVersion", version)
            .option("userMetadata", writer_metadata(app_id, version))
            .save(path)
        )

    retry_conflicts(append, path, version)
    _build_state_for_next_check(df.sparkSession, path)


@contextmanager
def idempotent_dml(spark: SparkSession, app_id: str, version: int) -> Iterator[None]:
    """Make the MERGE/DELETE/UPDATE inside this block idempotent for (app_id, version),
    its commit naming its writer (``lowmark.state.ownership``).

    Delta reads the txn session confs for DML; they are unset afterwards so no
    later write inherits them.
    """
    spark.conf.set(TXN_APP_ID_CONF, app_id)
    spark.conf.set(TXN_VERSION_CONF, str(version))
    spark.conf.set(USER_METADATA_CONF, writer_metadata(app_id, version))
    try:
        yield
    finally:
        spark.conf.unset(TXN_APP_ID_CONF)
        spark.conf.unset(TXN_VERSION_CONF)
        spark.conf.unset(USER_METADATA_CONF)


def upsert_once(
    spark: SparkSession,
    path: str,
    upserts: DataFrame,
    deletes: DataFrame | None,
    identity: tuple[str, ...],
    app_id: str,
    version: int,
    properties: dict[str, str] | None = None,
) -> None:
    """One idempotent MERGE on ``identity``: upsert ``upserts``, delete rows matching ``deletes``.

    ``deletes`` holds identity columns only and must not share an identity
    with ``upserts``. Two rows of ``upserts`` with one identity (nulls equal) stop
    the MERGE before it commits (``duplicate_key`` reads which): Delta would insert
    both when the table lacks it. The table is created empty from ``upserts``' schema
    (with table ``properties``) if absent. Skipped by Delta when (app_id,
    version) already landed.

    A SQL ``MERGE INTO delta.`path```: the same statement in a local session
    and over Spark Connect, where Delta's Python ``DeltaTable`` needs Delta's
    Connect plugin in the server (lowmark asks for Delta's jars only).
    """
    upserts = _uncollated(upserts)
    if not is_table(path):
        # An empty first commit gives MERGE a target; racing creators are harmless.
        create = upserts.limit(0).write.format("delta").mode("append")
        create.options(**(properties or {})).save(path)
    changes = upserts.withColumn("_op", _upsert_once_per_identity(identity))
    if deletes is not None:
        changes = changes.unionByName(
            deletes.withColumn("_op", F.lit("delete")), allowMissingColumns=True
        )
    # A global temporary view: ``spark`` may be a session of its own (its own txn confs),
    # which sees neither the changes' session's temporary views nor, over Spark Connect,
    # the relations that session holds; every session of the Spark sees a global one.
    # Named after the write: a Spark Connect server outlives a killed client, and the
    # replay of its batch replaces the view that client left.
    view = "lowmark_changes_" + re.sub(r"\W", "_", f"{app_id}_{version}")
    columns = [_quoted(c) for c in upserts.columns]
    on = " AND ".join(f"t.{c} <=> s.{c}" for c in map(_quoted, identity))
    statement = (
        f"MERGE INTO delta.{_quoted(path)} AS t USING global_temp.{view} AS s ON {on}\n"
        "WHEN MATCHED AND s._op = 'delete' THEN DELETE\n"
        f"WHEN MATCHED THEN UPDATE SET {', '.join(f't.{c} = s.{c}' for c in columns)}\n"
        f"WHEN NOT MATCHED AND s._op = 'upsert' THEN INSERT ({', '.join(columns)}) "
        f"VALUES ({', '.join(f's.{c}' for c in columns)})"
    )

    def merge() -> None:
        with idempotent_dml(spark, app_id, version):
            spark.sql(statement)  # a command: runs now

    changes.createOrReplaceGlobalTempView(view)
    try:
        retry_conflicts(merge, path, version)
    finally:
        spark.catalog.dropGlobalTempView(view)
    _build_state_for_next_check(spark, path)


def _build_state_for_next_check(spark: SparkSession, path: str) -> None:
    """Build, in a thread of its own and in job group ``STATE_JOB_GROUP``, the state of the
    Delta table at ``path`` as the write that just landed left it: the snapshot delta-spark
    keeps for the table, whose set transactions the next write's check reads (a lazy value:
    a check that comes first builds it itself, one that comes during waits for it). Nothing
    over Spark Connect (the server's Delta is out of reach). A failure only means the next
    check builds the state itself: logged, never raised."""
    if is_remote_session(spark):
        return

    def build() -> None:
        try:
            spark.sparkContext.setJobGroup(
                STATE_JOB_GROUP, f"lowmark: the state of {path} for its next write's check"
            )
            jvm = spark._jvm
            table = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(  # type: ignore[union-attr]
                spark._jsparkSession, path
            )
            # As the next write's check will find it (after a Delta checkpoint, another
            # snapshot of the same version).
            nothing = jvm.scala.Option.empty()  # type: ignore[union-attr]
            table.update(False, nothing, nothing).setTransactions()
        except Exception as exc:  # a stopped Spark, a table replaced meanwhile
            log.debug("state of %s not built ahead: %s", path, exc)
        finally:
            _building.discard(thread)

    thread = threading.Thread(target=build, name=f"{STATE_JOB_GROUP} {path}", daemon=True)
    _building.add(thread)
    thread.start()


@atexit.register
def _cancel_building() -> None:
    """At exit, the state jobs still running cancelled and waited for: Spark, stopping, would
    otherwise print errors of the tasks it stopped under them (the next process's first check
    builds the state itself). Registered after PySpark's own exit hooks, so it runs first."""
    running = list(_building)
    if not running:
        return
    try:
        spark = SparkSession.getActiveSession()
        if spark is not None:
            spark.sparkContext.cancelJobGroup(STATE_JOB_GROUP)
    except Exception as exc:  # Spark already gone: nothing left to cancel
        log.debug("state jobs not cancelled: %s", exc)
    for thread in running:
        thread.join(timeout=5)


def _upsert_once_per_identity(identity: tuple[str, ...]) -> Column:
    """The ``_op`` of an upserted row: ``upsert``, or an error when another row has its
    ``identity``. In the MERGE's own job (no job of its own); in ``_op`` because every
    clause reads it, so no plan can drop it."""
    keys = [F.col(_quoted(c)) for c in identity]
    others = F.count(F.lit(1)).over(Window.partitionBy(*keys))
    found = F.concat(
        F.lit("lowmark: duplicate merge key "),
        F.to_json(F.struct(*[k.alias(c) for k, c in zip(keys, identity, strict=True)])),
        F.lit(" :lowmark"),
    )
    return F.when(others > 1, F.raise_error(found)).otherwise(F.lit("upsert"))


def duplicate_key(exc: BaseException) -> str | None:
    """The keys (JSON) of two rows of one MERGE's batch when ``exc`` is the error
    ``upsert_once`` stops on for them; None for any other error."""
    found = _DUPLICATE_KEY.search(str(exc))
    return found.group(1) if found else None


def _uncollated(df: DataFrame) -> DataFrame:
    """``df``, its string columns of Spark's default collation cast to plain strings over
    Spark Connect.

    A Python UDF's output (``mapInArrow``, ``applyInPandas``: a keyed step, a
    transform) comes back from a Spark Connect server with its strings
    explicitly collated, which Delta writes into the table's schema as
    ``string collate UTF8_BINARY``: a type delta-rs (lowmark's own reads of the
    sink) cannot read. Locally nothing changes. Nested strings are left as they are.
    """
    if not is_remote_session(df.sparkSession):
        return df
    plain = {
        f.name
        for f in df.schema.fields
        if isinstance(f.dataType, StringType) and f.dataType.collation == "UTF8_BINARY"
    }
    if not plain:
        return df

    def column(name: str) -> Column:
        col = F.col(_quoted(name))
        return col.cast("string").alias(name) if name in plain else col

    return df.select(*map(column, df.columns))


def _quoted(name: str) -> str:
    """``name`` as a SQL identifier in backquotes."""
    return "`" + name.replace("`", "``") + "`"


def latest_version(path: str) -> int:
    """The newest version of the Delta table at ``path``, read from its log (no Spark job)."""
    return int(open_table(path).version())
