"""Window state: one row per open (key, window) with mergeable partial aggregates.

A batch changes state with ONE idempotent MERGE (``txnAppId =
<pipeline_id>:state``, ``txnVersion = batch_id``) that upserts the windows
the batch touched and deletes the windows it emitted as final. A replay of
batch N reads state as of the version commit N-1 recorded (Delta time
travel), so it recomputes exactly the same changes.

Cost follows touched state, not total state. Delta keeps min/max statistics
of ``window_start`` and ``window_end`` per file, and every access carries
literal bounds on them, so files of windows a batch cannot touch are skipped
without being opened:

- reads of touched windows: ``window_start`` within the batch's windows;
- stored sessions: those overlapping the batch's sessions' time span;
- final windows: ``window_end`` below the watermark minus the lateness;
- the MERGE: a target-only ``t.window_start BETWEEN lo AND hi`` from the
  batch's upserts and deletes, which Delta uses to choose the files it scans.

That only pays if files hold narrow time ranges. A stream's batches touch
recent windows, so the rows a MERGE writes are recent and clustered by
construction; what breaks clustering is rewriting: without deletion vectors
a MERGE copies every row of each file it touches (old windows included)
into new files hashed over the whole batch, widening their ranges. The
table is therefore created with deletion vectors: a MERGE marks replaced
rows in the old file and writes only the batch's rows. Liquid clustering
or a sorted OPTIMIZE would also re-cluster, but they are extra writes with
their own conflicts and, in Delta 4.4, happen only on OPTIMIZE, after the
damage; deletion vectors keep every batch's write proportional to its
windows instead.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from state.delta import latest_version, table_exists, upsert_once
from state.errors import CheckpointMissing

WINDOW_COLUMNS = ("window_start", "window_end")
TABLE_PROPERTIES = {"delta.enableDeletionVectors": "true"}
"""Set when the state table is created; see the module docstring."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class WindowState:
    """The ``state_windows`` table of a checkpoint, keyed by ``key_columns`` + window."""

    def __init__(
        self, spark: SparkSession, path: str, txn_app_id: str, key_columns: tuple[str, ...]
    ) -> None:
        self.spark = spark
        self.path = path
        self.txn_app_id = txn_app_id
        self.identity = (*key_columns, *WINDOW_COLUMNS)

    def read(self, version: int | None) -> DataFrame | None:
        """State as of ``version`` (None: no state written yet); CheckpointMissing if gone."""
        if version is None:
            return None
        try:
            return self.spark.read.format("delta").option("versionAsOf", version).load(self.path)
        except AnalysisException as exc:
            first = str(exc).strip().splitlines()[0]
            raise CheckpointMissing(
                f"state table {self.path} cannot be read as of version {version}, which the "
                f"commit log recorded ({first}): restore it from backup, or move the "
                "checkpoint away to start over"
            ) from exc

    def touched(self, state: DataFrame, windows: DataFrame) -> DataFrame:
        """Rows of ``state`` whose (key, window) appears in ``windows``."""
        lo, hi = _span(windows, "window_start", "window_start")
        if lo is None or hi is None:
            return state.limit(0)
        pruned = state.where(F.col("window_start").between(timestamp_at(lo), timestamp_at(hi)))
        keys = windows.select(*self.identity)
        return pruned.join(keys, null_safe_match(pruned, keys, self.identity), "left_semi")

    def overlapping(self, state: DataFrame, windows: DataFrame, keys: tuple[str, ...]) -> DataFrame:
        """Rows of ``state`` of ``windows``' ``keys`` that overlap the time ``windows`` span.

        The span is [min window_start, max window_end); a stored window that
        ends at or before it, or starts at or after it, overlaps none of them.
        """
        lo, hi = _span(windows, "window_start", "window_end")
        if lo is None or hi is None:
            return state.limit(0)
        pruned = state.where(
            (F.col("window_start") < timestamp_at(hi)) & (F.col("window_end") > timestamp_at(lo))
        )
        touched_keys = windows.select(*keys).distinct()
        return pruned.join(touched_keys, null_safe_match(pruned, touched_keys, keys), "left_semi")

    def apply(self, upserts: DataFrame, deletes: DataFrame, batch_id: int) -> int | None:
        """Upsert ``upserts`` (full state rows), delete ``deletes`` (identity columns) once.

        Both are computed once (persisted) for one summary job and the MERGE.
        Returns the state version after the batch (None if there never was state).
        """
        upserts = upserts.persist(StorageLevel.MEMORY_AND_DISK)
        deletes = deletes.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            changed = upserts.select("window_start").unionByName(deletes.select("window_start"))
            lo, hi = _span(changed, "window_start", "window_start")
            if lo is None or hi is None:
                return latest_version(self.spark, self.path) if self._exists() else None
            # Every target row a change matches has the change's window_start.
            within = F.col("t.window_start").between(timestamp_at(lo), timestamp_at(hi))
            upsert_once(
                self.spark,
                self.path,
                upserts,
                deletes,
                self.identity,
                self.txn_app_id,
                batch_id,
                target_filter=within,
                properties=TABLE_PROPERTIES,
            )
            return latest_version(self.spark, self.path)
        finally:
            upserts.unpersist()
            deletes.unpersist()

    def _exists(self) -> bool:
        return table_exists(self.spark, self.path)


def null_safe_match(left: DataFrame, right: DataFrame, columns: tuple[str, ...]) -> Column:
    """Join condition: ``left`` and ``right`` agree on ``columns`` (nulls equal nulls)."""
    cond = F.lit(True)
    for c in columns:
        cond = cond & left[c].eqNullSafe(right[c])
    return cond


def timestamp_at(micros: int) -> Column:
    """The timestamp ``micros`` after the epoch as a literal Delta's file statistics prune on.

    Built from a UTC-aware datetime, so neither the session nor the Python
    time zone (nor a DST fold) can shift it.
    """
    return F.lit(_EPOCH + timedelta(microseconds=micros))


def _span(df: DataFrame, start: str, end: str) -> tuple[int | None, int | None]:
    """(min ``start``, max ``end``) of ``df`` in epoch microseconds; Nones when empty."""
    row = df.agg(F.min(F.unix_micros(start)), F.max(F.unix_micros(end))).first()
    assert row is not None
    return row[0], row[1]
