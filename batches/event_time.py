"""The event-time stage of a batch: lateness, windows, window state, emission.

Given the batch's records (already transformed), the batch watermark ``W``
recorded in the offset log, and the state version the previous commit
recorded, it computes — without writing anything — what the batch must write:

- late records: every window of the record is closed
  (``window_end + allowed_lateness <= W``); they go to the late table;
- state upserts: the (key, window) partials this batch touched, merged with
  their state as of the previous commit;
- state deletes and output: in ``append`` mode the windows now final
  (``window_end + allowed_lateness <= W``) are emitted once and purged;
  in ``update`` mode every touched window is emitted and final ones are purged.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import Window as SparkWindow
from pyspark.sql import functions as F

from batches.aggregates import plan_aggregate
from batches.errors import PipelineConfigInvalid
from batches.sources.base import PARTITION_COLUMN
from batches.windows import (
    EventTime,
    Session,
    Sliding,
    Tumbling,
    WindowedAggregation,
    assign_windows,
)
from batches.windows import last_window_end_ms as last_end
from state.window_state import WINDOW_COLUMNS, WindowState, null_safe_match, timestamp_at

_ET_MS = "_lowmark_event_ms"


@dataclass(frozen=True)
class StageOutput:
    """What the batch must write, as lazy frames."""

    output: DataFrame
    retract: DataFrame
    """Windows the sink must drop (update mode: sessions merged into a longer one)."""
    late: DataFrame
    upserts: DataFrame
    deletes: DataFrame
    batch_max_event_ms: dict[str, int]


def partition_max_event_ms(records: DataFrame, column: str) -> dict[str, int]:
    """Max event time (epoch ms) per source partition in ``records``."""
    if PARTITION_COLUMN not in records.columns or column not in records.columns:
        raise PipelineConfigInvalid(
            f"the records lack {column!r} or {PARTITION_COLUMN}: the transform must keep "
            "the event-time column and the source partition column"
        )
    rows = records.groupBy(PARTITION_COLUMN).agg(F.max(F.unix_millis(F.col(column)))).collect()
    return {r[0]: r[1] for r in rows if r[1] is not None}


class WindowedStage:
    """Windowed aggregation per key over tumbling, sliding or session windows."""

    def __init__(self, event_time: EventTime, aggregation: WindowedAggregation, state: WindowState):
        self.event_time = event_time
        self.aggregation = aggregation
        self.window = aggregation.window
        self.state = state
        self.plans = [plan_aggregate(a) for a in aggregation.aggregates]
        self.keys = aggregation.keys
        self.identity = (*aggregation.keys, *WINDOW_COLUMNS)

    def process(
        self, records: DataFrame, watermark_ms: int | None, state_version: int | None, batch_id: int
    ) -> StageOutput:
        column = self.event_time.column
        missing = {column, PARTITION_COLUMN, *self.keys} - set(records.columns)
        if missing:
            raise PipelineConfigInvalid(
                f"the records lack {sorted(missing)}: the transform must keep the event-time "
                f"column, the keys and {PARTITION_COLUMN}"
            )
        events = records.withColumn(_ET_MS, F.unix_millis(F.col(column)))
        payload = [c for c in records.columns if c != PARTITION_COLUMN]
        if watermark_ms is None:
            accepted, late = events, events.limit(0)
        else:
            closed = self._last_end(F.col(_ET_MS)) + F.lit(
                self.event_time.allowed_lateness
            ) <= F.lit(watermark_ms)
            accepted, late = events.where(~closed), events.where(closed)
        late_rows = late.select(
            F.lit(batch_id).cast("long").alias("batch_id"),
            F.col(column).alias("event_time"),
            F.lit(watermark_ms if watermark_ms is not None else 0)
            .cast("long")
            .alias("watermark_ms"),
            F.lit("all windows closed: window_end + allowed_lateness <= watermark").alias("reason"),
            F.to_json(F.struct(*payload)).alias("record"),
        )
        state = self.state.read(state_version)
        if isinstance(self.window, Session):
            merged, replaced = self._merge_sessions(accepted, state, self.window)
        else:
            merged, replaced = self._merge_windows(accepted, state, self.window, watermark_ms)
        upserts = merged.withColumn("updated_batch", F.lit(batch_id).cast("long"))
        if state is None or watermark_ms is None:
            final = merged.limit(0)
        else:
            # A merged window is never final (it holds an accepted record), but a
            # final stored session that an accepted record bridged into a longer
            # one is replaced, not emitted.
            final = state.where(self._final(F.col("window_end"), watermark_ms))
            final = final.join(
                replaced, null_safe_match(final, replaced, self.identity), "left_anti"
            )
        emitted = final if self.aggregation.output_mode == "append" else merged
        output = self._finish(emitted)
        deletes = final.select(*self.identity).unionByName(replaced)
        return StageOutput(
            output,
            replaced,
            late_rows,
            upserts,
            deletes,
            partition_max_event_ms(records, column),
        )

    def windows_of(self, records: DataFrame) -> DataFrame:
        """Every window of ``records``, finished, as one plain batch aggregation.

        No state, watermark or lateness: what a backfill writes for history
        that is complete. The windows and aggregates are the stream's own.
        """
        events = records.withColumn(_ET_MS, F.unix_millis(F.col(self.event_time.column)))
        if isinstance(self.window, Session):
            merged, _ = self._merge_sessions(events, None, self.window)
        else:
            merged, _ = self._merge_windows(events, None, self.window, None)
        return self._finish(merged)

    def _finish(self, windows: DataFrame) -> DataFrame:
        """Output rows (keys, window, one column per aggregate) of state-shaped ``windows``."""
        return windows.select(*self.identity, *[expr.alias(n) for n, expr in self._finishes()])

    def _last_end(self, event_ms: Column) -> Column:
        """End of the last window a record at ``event_ms`` can belong to.

        For a session window, the session the record alone would open.
        """
        if isinstance(self.window, Session):
            return event_ms + F.lit(self.window.gap)
        return last_end(self.window, event_ms)

    def _merge_windows(
        self,
        accepted: DataFrame,
        state: DataFrame | None,
        window: Tumbling | Sliding,
        watermark_ms: int | None,
    ) -> tuple[DataFrame, DataFrame]:
        """Tumbling/sliding: batch partials per window, merged with those windows' state.

        Returns (merged state rows, replaced identities: none, windows keep their identity).
        """
        assigned = accepted.withColumn("_w", assign_windows(window, F.col(self.event_time.column)))
        if watermark_ms is not None:  # a sliding record may still feed its open windows only
            assigned = assigned.where(~self._final(F.col("_w.end"), watermark_ms))
        partials = assigned.groupBy(
            *self.keys,
            F.col("_w.start").alias("window_start"),
            F.col("_w.end").alias("window_end"),
        ).agg(*self._partials())
        if state is None:
            return partials, partials.select(*self.identity).limit(0)
        touched = self.state.touched(state, partials).drop("updated_batch")
        merged = partials.unionByName(touched).groupBy(*self.identity).agg(*self._merges())
        return merged, partials.select(*self.identity).limit(0)

    def _merge_sessions(
        self, accepted: DataFrame, state: DataFrame | None, window: Session
    ) -> tuple[DataFrame, DataFrame]:
        """Sessions: the batch's sessions merged with the open sessions they overlap.

        Every event is the interval [t, t + gap); intervals of a key that
        overlap form one session (gaps-and-islands), so a new event that
        bridges two stored sessions merges them. Only islands holding a new
        session are returned: a stored session no new event reaches stays as
        it is (it may be final and purged by this very batch). Returns
        (merged sessions, identities of stored sessions replaced by a merged one).
        """
        events = accepted.withColumn("_s", F.col(_ET_MS)).withColumn(
            "_e", F.col(_ET_MS) + F.lit(window.gap)
        )
        sessions = (
            _islands(events, self.keys)
            .groupBy(*self.keys, "_island")
            .agg(F.min("_s").alias("_s"), F.max("_e").alias("_e"), *self._partials())
            .drop("_island")
        )
        if state is None:
            merged = self._as_windows(sessions)
            return merged, merged.select(*self.identity).limit(0)
        stored = (
            self.state.overlapping(state, self._as_windows(sessions), self.keys)
            .drop("updated_batch")
            .withColumn("_s", F.unix_millis("window_start"))
            .withColumn("_e", F.unix_millis("window_end"))
        )
        islands = _islands(
            sessions.withColumn("_fresh", F.lit(1)).unionByName(
                stored.drop("window_start", "window_end").withColumn("_fresh", F.lit(0))
            ),
            self.keys,
        )
        changed = islands.withColumn(
            "_changed", F.max("_fresh").over(SparkWindow.partitionBy(*self.keys, "_island"))
        ).where(F.col("_changed") == 1)
        merged = self._as_windows(
            changed.groupBy(*self.keys, "_island")
            .agg(F.min("_s").alias("_s"), F.max("_e").alias("_e"), *self._merges())
            .drop("_island")
        )
        old = self._as_windows(changed.where(F.col("_fresh") == 0)).select(*self.identity)
        new = merged.select(*self.identity)
        return merged, old.join(new, null_safe_match(old, new, self.identity), "left_anti")

    def _as_windows(self, sessions: DataFrame) -> DataFrame:
        """Sessions with ``_s``/``_e`` (epoch ms) as state rows: identity, then partials."""
        return sessions.withColumn("window_start", F.timestamp_millis("_s")).select(
            *self.keys,
            "window_start",
            F.timestamp_millis("_e").alias("window_end"),
            *[n for p in self.plans for n, _ in p.partials],
        )

    def _partials(self) -> list[Column]:
        return [expr.alias(name) for p in self.plans for name, expr in p.partials]

    def _merges(self) -> list[Column]:
        return [expr.alias(name) for p in self.plans for name, expr in p.merges]

    def would_emit(self, state_version: int | None, watermark_ms: int) -> bool:
        """True when state holds windows that ``watermark_ms`` makes final."""
        state = self.state.read(state_version)
        return state is not None and bool(
            state.where(self._final(F.col("window_end"), watermark_ms)).take(1)
        )

    def _final(self, window_end: Column, watermark_ms: int) -> Column:
        """``window_end + allowed_lateness <= watermark`` (ms), as a bound on the column.

        The column stays bare so Delta can skip files by their window_end
        statistics; ``< limit + 1 ms`` keeps sub-millisecond ends exact.
        """
        limit_ms = watermark_ms - self.event_time.allowed_lateness
        return window_end < timestamp_at((limit_ms + 1) * 1000)

    def _finishes(self) -> list[tuple[str, Column]]:
        return [p.finish for p in self.plans]


def _islands(intervals: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Number the runs of overlapping ``[_s, _e)`` intervals per key as ``_island``."""
    ordered = SparkWindow.partitionBy(*keys).orderBy("_s", "_e")
    reach = F.max("_e").over(ordered.rowsBetween(SparkWindow.unboundedPreceding, -1))
    starts = F.when(reach.isNull() | (F.col("_s") >= reach), 1).otherwise(0)
    return intervals.withColumn("_new", starts).withColumn(
        "_island", F.sum("_new").over(ordered.rowsBetween(SparkWindow.unboundedPreceding, 0))
    )
