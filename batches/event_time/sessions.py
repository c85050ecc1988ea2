"""Session windows: a key's events closer than the gap form one session.

Every event is the interval ``[t, t + gap)``; intervals of a key that
overlap form one session (an island). ``SessionWindows`` builds the
sessions a batch's own events form (state-shaped rows: identity, then
partials) and merges them with the stored sessions they overlap: a new
session that bridges two stored ones merges all three, and the stored
sessions it replaces are returned so that their rows are deleted (and, in
``update`` mode, retracted from the sink). The stage picks the windows and
reads the stored sessions; nothing here reads or writes state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lowmark.batches.windows import Session
from lowmark.state.window_state import ROWS, WINDOW_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


@dataclass(frozen=True)
class SessionWindows:
    """The session windows of one stage: its window, keys and aggregates.

    ``partials``: the aggregates over input rows, as partial columns;
    ``merges``: over rows of partials, ``ROWS`` summed too; ``partial_names``:
    the partial columns in state order (``ROWS`` follows them).
    """

    window: Session
    keys: tuple[str, ...]
    partials: Sequence[Column]
    merges: Sequence[Column]
    partial_names: tuple[str, ...]

    @property
    def identity(self) -> tuple[str, ...]:
        return (*self.keys, *WINDOW_COLUMNS)

    def of_batch(self, accepted: DataFrame, event_ms: str) -> DataFrame:
        """Sessions the batch's own events form: every event is the interval
        [t, t + gap), and intervals of a key that overlap form one session.

        ``event_ms``: the column of ``accepted`` with the event time in epoch ms.
        """
        from pyspark.sql import functions as F

        events = accepted.withColumn("_s", F.col(event_ms)).withColumn(
            "_e", F.col(event_ms) + F.lit(self.window.gap)
        )
        sessions = (
            _islands(events, self.keys)
            .groupBy(*self.keys, "_island")
            .agg(
                F.min("_s").alias("_s"),
                F.max("_e").alias("_e"),
                *self.partials,
                F.count(F.lit(1)).alias(ROWS),
            )
            .drop("_island")
        )
        return self._as_windows(sessions)

    def merge(self, partials: DataFrame, nearby: DataFrame | None) -> tuple[DataFrame, DataFrame]:
        """The batch's sessions merged with the stored sessions they overlap.

        A new session that bridges two stored sessions merges them. Only
        islands holding a new session are returned: a stored session no new
        event reaches stays as it is (it may be final and purged by this very
        batch). Returns (merged sessions, identities of stored sessions
        replaced by a merged one).
        """
        from pyspark.sql import Window as SparkWindow
        from pyspark.sql import functions as F

        if nearby is None:
            return partials, partials.select(*self.identity).limit(0)
        keys = partials.select(*self.keys).distinct()
        current = nearby.drop("updated_batch")
        stored = current.join(keys, null_safe_match(current, keys, self.keys), "left_semi")

        def as_intervals(windows: DataFrame, fresh: int) -> DataFrame:
            return (
                windows.withColumn("_s", F.unix_millis("window_start"))
                .withColumn("_e", F.unix_millis("window_end"))
                .drop("window_start", "window_end")
                .withColumn("_fresh", F.lit(fresh))
            )

        islands = _islands(
            as_intervals(partials, 1).unionByName(as_intervals(stored, 0)), self.keys
        )
        changed = islands.withColumn(
            "_changed", F.max("_fresh").over(SparkWindow.partitionBy(*self.keys, "_island"))
        ).where(F.col("_changed") == 1)
        merged = self._as_windows(
            changed.groupBy(*self.keys, "_island")
            .agg(F.min("_s").alias("_s"), F.max("_e").alias("_e"), *self.merges)
            .drop("_island")
        )
        old = self._as_windows(changed.where(F.col("_fresh") == 0)).select(*self.identity)
        new = merged.select(*self.identity)
        return merged, old.join(new, null_safe_match(old, new, self.identity), "left_anti")

    def _as_windows(self, sessions: DataFrame) -> DataFrame:
        """Sessions with ``_s``/``_e`` (epoch ms) as state rows: identity, then partials."""
        from pyspark.sql import functions as F

        return sessions.withColumn("window_start", F.timestamp_millis("_s")).select(
            *self.keys,
            "window_start",
            F.timestamp_millis("_e").alias("window_end"),
            *self.partial_names,
            ROWS,
        )


def _islands(intervals: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Number the runs of overlapping ``[_s, _e)`` intervals per key as ``_island``."""
    from pyspark.sql import Window as SparkWindow
    from pyspark.sql import functions as F

    ordered = SparkWindow.partitionBy(*keys).orderBy("_s", "_e")
    reach = F.max("_e").over(ordered.rowsBetween(SparkWindow.unboundedPreceding, -1))
    starts = F.when(reach.isNull() | (F.col("_s") >= reach), 1).otherwise(0)
    return intervals.withColumn("_new", starts).withColumn(
        "_island", F.sum("_new").over(ordered.rowsBetween(SparkWindow.unboundedPreceding, 0))
    )


def null_safe_match(left: DataFrame, right: DataFrame, columns: tuple[str, ...]) -> Column:
    """Join condition: ``left`` and ``right`` agree on ``columns`` (nulls equal nulls).

    ``left`` and ``right`` must be the very frames joined: over Spark Connect a column is
    bound to its frame's plan, and one of a frame the join's side was derived from (a
    ``drop`` of it, say) does not resolve there."""
    from pyspark.sql import functions as F

    cond = F.lit(True)
    for c in columns:
        cond = cond & left[c].eqNullSafe(right[c])
    return cond
