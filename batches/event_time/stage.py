"""The event-time stage of a batch: lateness, windows, window state, emission.

Given the batch's records (already transformed), the batch watermark ``W``
recorded in the offset log, and the state version the previous commit
recorded, it computes — without writing anything — what the batch must write:

- late records: every window of the record is closed
  (``window_end + allowed_lateness <= W``), or, with an ingestion-time
  watermark, was closed when the record was ingested (``<= a - lag``, its own
  ingestion time ``a``: ``IngestionLags.own_clock``; so the verdict does not
  depend on which batch took it), it has no event time (null), or its event
  time is more than ``max_future`` after the batch's processing time (with an
  ingestion-time watermark: after its own ingestion time, ``future_of``); they
  go to the late table with the reason;
- state upserts: the (key, window) partials this batch touched, merged with
  their state as of the previous commit; each window also counts its
  records in ``_lowmark_rows`` (a record counts in the last window it
  belongs to, so a sliding record counts once), which is how the batch's
  accounting knows how many records the windows it closes hold;
- state deletes and output: in ``append`` mode the windows now final
  (``window_end + allowed_lateness <= W``) are emitted once and purged;
  in ``update`` mode every touched window is emitted and final ones are purged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import pyarrow as pa

from lowmark.batches.batch_values import batch_long, batch_timestamp
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.records import (
    INGESTED_COLUMN,
    INTERNAL_COLUMNS,
    PARTITION_COLUMN,
    UNTIMED,
    late_struct,
)
from lowmark.batches.windows import (
    EventTime,
    Session,
    Sliding,
    Tumbling,
    WindowedAggregation,
    assign_windows,
)
from lowmark.batches.windows import last_window_end_ms as last_end
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.table import UTC_MICROS
from lowmark.state.window_state import ROWS, WINDOW_COLUMNS, WindowState

# What only a batch computes with (Arrow compute, NumPy, the aggregates' Spark plans, the
# merges) is imported where it is used: a read-only question (``lowmark status``, ``plan``)
# builds the stage for ``would_emit`` alone (docs/cli.md, "Fast commands").
if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Observation

    from lowmark.batches.event_time.aggregates import AggregatePlan
    from lowmark.batches.event_time.driver_merge import WindowChanges
    from lowmark.batches.event_time.sessions import SessionWindows
    from lowmark.batches.event_time.watermarks import IngestionLags

_ET_MS = "_lowmark_event_ms"
_OWN_MS = "_lowmark_own_clock_ms"
"""A record's own clock (``IngestionLags.own_clock``; null: it has none)."""
CLOSED = "all windows closed: window_end + allowed_lateness <= watermark"
CLOSED_WHEN_INGESTED = (
    "all windows closed when it was ingested: "
    "window_end + allowed_lateness <= ingestion time - max_event_time_lag"
)
FUTURE = "event time more than max_future ahead of the batch's processing time"
FUTURE_WHEN_INGESTED = "event time more than max_future ahead of its ingestion time"
"""Reasons in the late table."""
REJECTED = "_lowmark_rejected"
"""True for a record that goes to the late table (``BatchFrames.flagged``)."""
RECORDS = "_lowmark_records"
VIOLATING = "_lowmark_violating"
_MAX_MS = "_lowmark_max_ms_"
LATE_RECORDS = "_lowmark_late"
"""The late records a job collects as it reads (observed, or per read-ahead group): each
its event time in epoch µs, reason and record as JSON (``LATE_RECORD``)."""
LATE_RECORD = pa.schema(
    [("event_us", pa.int64()), ("reason", pa.string()), ("record", pa.string())]
)


@dataclass(frozen=True)
class BatchFrames:
    """What the batch's records alone give, as lazy frames (no state, nothing written).

    ``accepted``: the records that go into windows, with their event time in
    epoch ms. ``partials``: state-shaped rows (identity + partial columns) of
    the accepted records, one per (key, window) — for sessions, per session
    the batch's own events form. ``late``: rows of the late table. ``seen``
    observes the records as the first job over ``accepted`` reads them:
    ``stats()`` then has their counts, and the late records themselves,
    without a job of its own. ``partials``, ``rejected`` and ``late`` are built
    on first use (building a frame costs driver time: Spark analyses it).
    """

    accepted: DataFrame
    events: DataFrame
    """Every record, observed: ``accepted`` and ``rejected`` are its two parts."""
    seen: Observation | None
    """None when the records are not observed (``batch_frames(..., observe=False)``)."""
    partitions: tuple[str, ...]
    """The source partitions the batch reads, in the order ``seen`` has their max event time."""
    stage: WindowedStage
    watermark_ms: int | None
    late_of: Callable[[DataFrame], DataFrame]
    timed: DataFrame
    """Every record, accepted or not, with its event time in epoch ms (not observed)."""
    rejected_if: Column
    """True for a record that goes to the late table."""
    late_record: Column
    """A record's ``LATE_RECORD`` struct (its reason judged under ``watermark_ms``)."""

    @cached_property
    def partials(self) -> DataFrame:
        return self.stage.partials_of(self.accepted, self.watermark_ms)

    @cached_property
    def rejected(self) -> DataFrame:
        return self.events.where(self.rejected_if)

    @cached_property
    def late(self) -> DataFrame:
        return self.late_of(self.rejected)

    def flagged(self, closed_under_ms: int | None) -> DataFrame:
        """Every record, accepted or not, flagged in ``REJECTED`` (the read-ahead's input),
        with its ``LATE_RECORDS`` struct when it is rejected or its windows are closed under
        the watermark ``closed_under_ms`` (null otherwise).

        A later batch's watermark is never below ``closed_under_ms`` (a watermark
        never goes back), so those records are late in whichever batch they are."""
        from pyspark.sql import functions as F

        late = self.rejected_if
        if closed_under_ms is not None:
            late = late | self.stage.closed_under(closed_under_ms)
        flagged = self.timed.withColumn(REJECTED, self.rejected_if)
        return flagged.withColumn(LATE_RECORDS, F.when(late, self.late_record))

    def closed_records(self, watermark: Column) -> DataFrame:
        """The ``LATE_RECORD``s (``LATE_RECORDS``) of the records not rejected whose windows
        are closed under ``watermark`` (a column: one per record), with every other column
        of ``timed`` (the batch tag among them): the read-ahead's late records of a batch
        whose windows closed under a watermark it did not look with."""
        closed = ~self.rejected_if & self.stage.closed_under(watermark)
        return self.timed.where(closed).withColumn(LATE_RECORDS, self.late_record)

    def stats(self) -> RecordStats | None:
        """Rows, late rows and max event time per partition, as the job over ``partials``
        observed them; None when Spark observed nothing (see ``collect.observed``)."""
        from lowmark.batches.collect import observed

        metrics = observed(self.seen) if self.seen is not None else None
        if metrics is None:
            return None
        max_ms = {p: metrics[f"max_ms_{i}"] for i, p in enumerate(self.partitions)}
        records = [r.asDict() for r in metrics[LATE_RECORDS]]
        return RecordStats(
            metrics["rows"],
            metrics["late"],
            {p: m for p, m in max_ms.items() if m is not None},
            pa.Table.from_pylist(records, schema=LATE_RECORD),
        )


@dataclass(frozen=True)
class RecordStats:
    """A batch's records at a glance (after the transform)."""

    rows: int
    late: int
    """Rows that go to the late table (closed windows, or no event time)."""
    max_ms: dict[str, int]
    """Max event time (epoch ms) per source partition that has a timed record."""
    late_records: pa.Table | None = None
    """The late rows' ``LATE_RECORD``s, when the job collected them (``late`` of them)."""
    violating: int = 0
    """Records flagged as violating an expectation (``partials_with_stats``' ``violated``)."""


STATE_SLOT_MIN_MS = 60_000
"""The narrowest partition of the window state (``window_state``): a minute."""


def window_state(checkpoint: Checkpoint, aggregation: WindowedAggregation) -> WindowState:
    """The window state table of ``checkpoint``, partitioned by window start in steps of
    one window period (a tumbling window's size, a slide, a session gap), at least
    ``STATE_SLOT_MIN_MS``: a stream's batch touches a few recent steps, and short windows
    share a step rather than each making a partition of a few rows."""
    window = aggregation.window
    period = (
        window.size
        if isinstance(window, Tumbling)
        else window.slide
        if isinstance(window, Sliding)
        else window.gap
    )
    return WindowState(
        checkpoint.table("state_windows"),
        checkpoint.txn_app_id("state"),
        aggregation.keys,
        slot_us=max(period, STATE_SLOT_MIN_MS) * 1000,
    )


def late_table(records: pa.Table, batch_id: int, watermark_ms: int | None) -> pa.Table:
    """Rows of the late table for ``LATE_RECORD`` ``records`` of batch ``batch_id``, rejected
    under ``watermark_ms`` (0 when there was none, as ``BatchFrames.late`` writes it)."""
    n = records.num_rows
    return pa.table(
        {
            "batch_id": pa.array([batch_id] * n, pa.int64()),
            "event_time": records.column("event_us").cast(pa.int64()).cast(UTC_MICROS),
            "watermark_ms": pa.array([watermark_ms or 0] * n, pa.int64()),
            "reason": records.column("reason").cast(pa.string()),
            "record": records.column("record").cast(pa.string()),
        }
    )


@dataclass(frozen=True)
class StageOutput:
    """What the batch must write, as lazy frames over local data."""

    output: DataFrame
    retract: DataFrame
    """Windows the sink must drop (update mode: sessions merged into a longer one)."""
    upserts: DataFrame
    deletes: DataFrame
    closed: DataFrame
    """The ``_lowmark_rows`` of the windows the batch closes (final, purged, not merged)."""


def split_stats(groups: pa.Table, partitions: tuple[str, ...]) -> tuple[pa.Table, RecordStats]:
    """Groups of ``WindowedStage.partials_with_stats`` (of one batch): the partials of its
    accepted records, and its records' stats (rejected: late, with no watermark; the
    late records: the rejected ones and those ``BatchFrames.flagged`` found closed)."""
    import numpy as np
    import pyarrow.compute as pc

    rejected = groups.column(REJECTED)
    timed = groups.filter(pc.invert(rejected))
    max_ms = {p: pc.max(timed.column(f"{_MAX_MS}{i}")).as_py() for i, p in enumerate(partitions)}
    # A late record's group is its own (as many as there are identical copies of it); the
    # partials of a window whose records are late are of no use (the window is closed).
    collected = pc.is_valid(groups.column(LATE_RECORDS))
    accepted = timed.filter(pc.is_null(timed.column(LATE_RECORDS)))
    copies = groups.filter(collected)
    each = np.repeat(np.arange(copies.num_rows), copies.column(RECORDS).to_numpy())
    late = copies.column(LATE_RECORDS).take(pa.array(each, pa.int64()))
    violating = VIOLATING in groups.column_names
    stats = RecordStats(
        pc.sum(groups.column(RECORDS)).as_py() or 0,
        pc.sum(groups.filter(rejected).column(RECORDS)).as_py() or 0,
        {p: m for p, m in max_ms.items() if m is not None},
        pa.table([pc.struct_field(late, f.name).cast(f.type) for f in LATE_RECORD], LATE_RECORD),
        (pc.sum(groups.column(VIOLATING)).as_py() or 0) if violating else 0,
    )
    extra = [REJECTED, RECORDS, LATE_RECORDS, *[f"{_MAX_MS}{i}" for i in range(len(partitions))]]
    extra += [VIOLATING] if violating else []
    return accepted.drop_columns(extra), stats


def partition_max_event_ms(records: DataFrame, event_time: EventTime, now_ms: int) -> DataFrame:
    """Per source partition: rows and max event time (epoch ms) of the records that may
    move the watermark (none from beyond ``max_future``), as a lazy frame."""
    from pyspark.sql import functions as F

    event_ms = _event_ms_of(records, event_time)
    future = future_of(event_ms, records.columns, now_ms, event_time)
    return records.groupBy(PARTITION_COLUMN).agg(
        F.count(F.lit(1)).alias("rows"),
        F.max(F.when(~future, event_ms)).alias("max_ms"),
    )


@dataclass(frozen=True)
class ObservedRecords:
    """``records`` observed as the first job over them reads them (``observe_records``)."""

    records: DataFrame
    seen: Observation
    partitions: tuple[str, ...]

    def counts(self) -> tuple[int, dict[str, int]] | None:
        """The records' count and, per source partition with a timed record, their max event
        time (as ``partition_max_event_ms`` gives them); None when Spark observed nothing
        (see ``collect.observed``)."""
        from lowmark.batches.collect import observed

        metrics = observed(self.seen)
        if metrics is None:
            return None
        max_ms = {p: metrics.get(f"max_ms_{i}") for i, p in enumerate(self.partitions)}
        return int(metrics["rows"]), {p: m for p, m in max_ms.items() if m is not None}


def observe_records(
    records: DataFrame, event_time: EventTime | None, partitions: tuple[str, ...], now_ms: int
) -> ObservedRecords:
    """``records`` with an observation of their count and (with ``event_time``) each of
    ``partitions``' max event time, of the records that may move the watermark: what
    ``partition_max_event_ms`` computes, taken by whichever job reads them."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    seen = Observation()
    metrics = [F.count(F.lit(1)).alias("rows")]
    if event_time is not None:
        event_ms = _event_ms_of(records, event_time)
        future = future_of(event_ms, records.columns, now_ms, event_time)
        metrics += _max_per_partition(partitions, event_ms, future)
    return ObservedRecords(records.observe(seen, *metrics), seen, partitions)


def future_of(
    event_ms: Column, columns: Sequence[str], now_ms: int, event_time: EventTime
) -> Column:
    """True for a record (of a frame with ``columns``) whose event time ``event_ms`` is more
    than ``max_future`` after the time it is judged at: its own ingestion time where it
    carries one (``INGESTED_COLUMN``, an ingestion-time watermark's: then the verdict is the
    input's, whichever batch takes it), else the batch's processing time ``now_ms``."""
    from pyspark.sql import functions as F

    judged_at = batch_long(now_ms)
    if INGESTED_COLUMN in columns:
        judged_at = F.coalesce(F.col(INGESTED_COLUMN), judged_at)
    return F.coalesce(event_ms > judged_at + F.lit(event_time.max_future), F.lit(False))


def future_reason(columns: Sequence[str]) -> Column:
    """The late table's reason for a record ``future_of`` sets aside."""
    from pyspark.sql import functions as F

    if INGESTED_COLUMN not in columns:
        return F.lit(FUTURE)
    ingested = F.col(INGESTED_COLUMN).isNotNull()
    return F.when(ingested, F.lit(FUTURE_WHEN_INGESTED)).otherwise(F.lit(FUTURE))


def _event_ms_of(records: DataFrame, event_time: EventTime) -> Column:
    """The event time of ``records`` in epoch ms; refused when the transform dropped the
    event-time column or the source partition."""
    from pyspark.sql import functions as F

    column = event_time.column
    if PARTITION_COLUMN not in records.columns or column not in records.columns:
        raise PipelineConfigInvalid(
            f"the records lack {column!r} or {PARTITION_COLUMN}: the transform must keep "
            "the event-time column and the source partition column"
        )
    return F.unix_millis(F.col(column))


def _max_per_partition(
    partitions: tuple[str, ...], event_ms: Column, future: Column
) -> list[Column]:
    """Aggregates ``max_ms_<i>``: the max ``event_ms`` of partition ``partitions[i]``'s
    records, leaving out those from the ``future``."""
    from pyspark.sql import functions as F

    partition = F.col(PARTITION_COLUMN)
    return [
        F.max(F.when((partition == F.lit(p)) & ~future, event_ms)).alias(f"max_ms_{i}")
        for i, p in enumerate(partitions)
    ]


class WindowedStage:
    """Windowed aggregation per key over tumbling, sliding or session windows.

    A batch runs in two Spark jobs: ``batch_frames`` over the records (with
    the batch's other results, collected at once), then ``merge`` over local
    data: the collected partials and the few state rows they touch, which
    ``state_rows`` reads from the state table on the driver.
    """

    def __init__(
        self,
        event_time: EventTime,
        aggregation: WindowedAggregation,
        state: WindowState,
        lags: IngestionLags | None = None,
    ):
        """``lags``: the partitions that follow an ingestion clock; their records are judged
        by their own clock too (``IngestionLags.own_clock``)."""
        self.event_time = event_time
        self.lags = lags
        self.aggregation = aggregation
        self.window = aggregation.window
        self.state = state
        self.keys = aggregation.keys
        self.identity = (*aggregation.keys, *WINDOW_COLUMNS)

    @cached_property
    def plans(self) -> list[AggregatePlan]:
        """The aggregates as Spark expressions: built on first use, as building one needs a
        running Spark, and planning (a sensor tick) does without."""
        from lowmark.batches.event_time.aggregates import plan_aggregate

        return [plan_aggregate(a, self.event_time.column) for a in self.aggregation.aggregates]

    @cached_property
    def _sessions(self) -> SessionWindows:
        """The session windows' merging (``sessions.py``), for a stage of session windows."""
        from lowmark.batches.event_time.sessions import SessionWindows

        assert isinstance(self.window, Session)
        names = tuple(n for p in self.plans for n, _ in p.partials)
        return SessionWindows(self.window, self.keys, self._partials(), self._merges(), names)

    def batch_frames(
        self,
        records: DataFrame,
        watermark_ms: int | None,
        batch_id: int,
        partitions: tuple[str, ...],
        now_ms: int,
        observe: bool = True,
    ) -> BatchFrames:
        """Late rows and the partials of the accepted records of one batch.

        ``partitions`` are the source partitions the records come from (their
        max event times are observed); ``now_ms`` is the batch's processing
        time (its planning time, the same in a replay). ``observe`` False:
        nothing is observed (the catch-up read-ahead computes the same counts
        in its aggregation, ``partials_with_stats``, at a fraction of the cost).
        """
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        column = self.event_time.column
        missing = {column, PARTITION_COLUMN, *self.keys} - set(records.columns)
        if missing:
            raise PipelineConfigInvalid(
                f"the records lack {sorted(missing)}: the transform must keep the event-time "
                f"column, the keys and {PARTITION_COLUMN}"
            )
        payload = [c for c in records.columns if c not in INTERNAL_COLUMNS]
        # A record without event time belongs to no window: it goes to the late table
        # with its reason, never into a window (nor silently nowhere).
        # A record from too far ahead is set aside the same way, and counts for no
        # watermark: one bad clock must not close every window early.
        timed = F.col(column).isNotNull()
        future = future_of(F.col(_ET_MS), records.columns, now_ms, self.event_time)
        own = self._closed_by_own_clock()
        closed = own if watermark_ms is None else self.closed_under(watermark_ms)
        rejected = ~timed | future | closed
        # Closed under its own clock first: in every batch that may take the record its
        # clock is at or past the batch's, so the reason is the record's, not the batch's.
        reason = (
            F.when(~timed, F.lit(UNTIMED))
            .when(future, future_reason(records.columns))
            .when(own, F.lit(CLOSED_WHEN_INGESTED))
            .otherwise(F.lit(CLOSED))
        )
        late_record = late_struct(F.unix_micros(F.col(column)), reason, payload)
        metrics = [
            F.count(F.lit(1)).alias("rows"),
            F.count(F.when(rejected, 1)).alias("late"),
            # The late records themselves ride along: the job that reads the batch
            # collects them, so late rows cost no second read of the input.
            F.collect_list(F.when(rejected, late_record)).alias(LATE_RECORDS),
            *_max_per_partition(partitions, F.col(_ET_MS), future),
        ]
        timed_ms = records.withColumn(_ET_MS, F.unix_millis(F.col(column)))
        own_clock = self.lags.own_clock() if self.lags is not None else None
        if own_clock is not None:
            # A transform that dropped the ingestion time leaves its records to the batch's.
            known = INGESTED_COLUMN in records.columns
            unknown = F.lit(None).cast("long")
            timed_ms = timed_ms.withColumn(_OWN_MS, own_clock if known else unknown)
        seen = Observation() if observe else None
        events = timed_ms.observe(seen, *metrics) if seen is not None else timed_ms

        def late_rows(late: DataFrame) -> DataFrame:
            return late.select(
                batch_long(batch_id).alias("batch_id"),
                F.col(column).alias("event_time"),
                batch_long(watermark_ms if watermark_ms is not None else 0).alias("watermark_ms"),
                reason.alias("reason"),
                F.to_json(F.struct(*payload)).alias("record"),
            )

        return BatchFrames(
            events.where(~rejected),
            events,
            seen,
            partitions,
            self,
            watermark_ms,
            late_rows,
            timed_ms,
            rejected,
            late_record,
        )

    def closed_under(self, watermark_ms: int | Column) -> Column:
        """True for a record (with ``_ET_MS``) whose every window is closed under
        ``watermark_ms`` (a number, or a column of one per record), or under its own clock
        when that is later: ``last window_end + allowed_lateness <= max(watermark, own)``."""
        from pyspark.sql import Column
        from pyspark.sql import functions as F

        last = self._last_end(F.col(_ET_MS))
        watermark = watermark_ms if isinstance(watermark_ms, Column) else batch_long(watermark_ms)
        closed = last + F.lit(self.event_time.allowed_lateness) <= watermark
        return closed | self._closed_by_own_clock()

    def _closed_by_own_clock(self) -> Column:
        """True for a record (of ``batch_frames``) whose every window was closed when it was
        ingested (``_OWN_MS``); False for one without its own clock."""
        from pyspark.sql import functions as F

        if self.lags is None or not self.lags.by_prefix:
            return F.lit(False)
        last = self._last_end(F.col(_ET_MS))
        own = last + F.lit(self.event_time.allowed_lateness) <= F.col(_OWN_MS)
        return F.coalesce(own, F.lit(False))

    def closed_records(self, records: pa.Table, watermark_ms: int) -> pa.Array:
        """``closed_under`` on the driver, for tumbling windows: True for each ``LATE_RECORD``
        of ``records`` set aside as ``CLOSED`` whose window is closed under
        ``watermark_ms`` (False for the other reasons)."""
        import pyarrow.compute as pc

        window = self.window
        assert isinstance(window, Tumbling), "only tumbling windows are read ahead"
        size, lateness = float(window.size), float(self.event_time.allowed_lateness)
        event_ms = pc.floor(pc.divide(records.column("event_us").cast(pa.float64()), 1000.0))
        windows = pc.floor(pc.divide(pc.subtract(event_ms, float(window.offset)), size))
        end = pc.add(pc.multiply(windows, size), float(window.offset) + size)
        closed = pc.less_equal(pc.add(end, lateness), float(watermark_ms))
        return pc.and_(pc.equal(records.column("reason"), CLOSED), pc.fill_null(closed, False))

    def partials_of(
        self, accepted: DataFrame, watermark_ms: int | None, by: tuple[str, ...] = ()
    ) -> DataFrame:
        """The partials of ``accepted`` records (of ``batch_frames``), per (key, window) —
        and per ``by`` columns too (the catch-up read-ahead's batch id)."""
        if isinstance(self.window, Session):
            return self._sessions.of_batch(accepted, _ET_MS)
        return self._batch_windows(accepted, self.window, watermark_ms, by)

    def partials_with_stats(
        self,
        flagged: DataFrame,
        partitions: tuple[str, ...],
        by: tuple[str, ...],
        violated: Column | None = None,
    ) -> DataFrame:
        """Tumbling/sliding windows with no watermark: the partials of ``flagged`` records
        (``BatchFrames.flagged``) per (``by``, ``REJECTED``, ``LATE_RECORDS``, key,
        window), each group with its records (``RECORDS``), those ``violated`` is true
        for (``VIOLATING``: an expectation's) and, per source partition of
        ``partitions``, their max event time;
        ``split_stats`` turns them into partials and ``RecordStats``.

        One aggregation then gives what observing the records would (an observation
        costs a pass over every record per metric)."""
        from pyspark.sql import functions as F

        assert not isinstance(self.window, Session), "sessions are not read ahead"
        partition = F.col(PARTITION_COLUMN)
        stats = [
            F.count(F.lit(1)).alias(RECORDS),
            *[
                F.max(F.when(partition == F.lit(p), F.col(_ET_MS))).alias(f"{_MAX_MS}{i}")
                for i, p in enumerate(partitions)
            ],
        ]
        if violated is not None:  # judged on the record as read, before the time is replaced
            flagged = flagged.withColumn(VIOLATING, violated)
            stats.append(F.count(F.when(F.col(VIOLATING), 1)).alias(VIOLATING))
        # Spark's window() drops records whose time is null: rejected records, whose
        # windows count for nothing, are counted in the window of the epoch instead.
        column = self.event_time.column
        counted = flagged.withColumn(
            column,
            F.when(
                F.col(REJECTED), F.timestamp_seconds(F.lit(0)).cast(flagged.schema[column].dataType)
            ).otherwise(F.col(column)),
        )
        # As a group key its fields must be nullable: Arrow refuses a null struct whose
        # field Spark declares non-nullable (the reason).
        late = F.col(LATE_RECORDS)
        fields = [late[name].alias(name) for name in LATE_RECORD.names]
        counted = counted.withColumn(LATE_RECORDS, F.when(late.isNotNull(), F.struct(*fields)))
        # Each late record is a group key of its own (null for the others), not a list
        # collected per group: collect_list would take the aggregation out of generated
        # code (ObjectHashAggregate), for every record, to gather the few late ones.
        return self._batch_windows(counted, self.window, None, (*by, REJECTED, LATE_RECORDS), stats)

    def state_rows(
        self, partials: pa.Table, state_version: int | None, watermark_ms: int | None
    ) -> tuple[pa.Table | None, pa.Table | None]:
        """(state rows the ``partials`` may merge with, state rows ``watermark_ms`` makes final).

        Read on the driver, bounded by the partials' time span and the
        watermark, so their cost follows the windows the batch touches.
        """
        import pyarrow.compute as pc

        nearby = None
        if partials.num_rows:
            starts = pc.min_max(partials.column("window_start").cast(pa.int64()))
            ends = pc.max(partials.column("window_end").cast(pa.int64()))
            lo, hi = starts["min"].as_py(), starts["max"].as_py()
            if isinstance(self.window, Session):
                nearby = self.state.overlapping(state_version, lo, ends.as_py())
            else:
                nearby = self.state.touched(state_version, lo, hi)
        final = None
        if watermark_ms is not None:
            final = self.state.ending_before(state_version, self.final_limit_us(watermark_ms))
        return nearby, final

    def merge(
        self,
        partials: DataFrame,
        nearby: DataFrame | None,
        final: DataFrame | None,
        batch_id: int,
    ) -> StageOutput:
        """The batch's changes: ``partials`` merged with ``nearby`` state; ``final`` emitted.

        ``nearby`` holds at least every stored window a partial can merge with;
        ``final`` every stored window the batch watermark makes final.
        """
        from lowmark.batches.event_time.sessions import null_safe_match

        if isinstance(self.window, Session):
            merged, replaced = self._sessions.merge(partials, nearby)
        else:
            merged, replaced = self._merge_windows(partials, nearby)
        upserts = merged.withColumn("updated_batch", batch_long(batch_id))
        if final is None:
            final = merged.limit(0)
        else:
            # A merged window is never final (it holds an accepted record), but a
            # final stored session that an accepted record bridged into a longer
            # one is replaced, not emitted.
            stored = final.drop("updated_batch")
            final = stored.join(
                replaced, null_safe_match(stored, replaced, self.identity), "left_anti"
            )
        emitted = final if self.aggregation.output_mode == "append" else merged
        output = self._finish(emitted)
        deletes = final.select(*self.identity).unionByName(replaced)
        return StageOutput(output, replaced, upserts, deletes, final.select(ROWS))

    def windows_of(self, records: DataFrame) -> DataFrame:
        """Every window of ``records``, finished, as one plain batch aggregation.

        No state, watermark or lateness: what a backfill writes for history
        that is complete. The windows and aggregates are the stream's own.
        """
        from pyspark.sql import functions as F

        events = records.withColumn(_ET_MS, F.unix_millis(F.col(self.event_time.column)))
        if isinstance(self.window, Session):
            merged = self._sessions.of_batch(events, _ET_MS)
        else:
            merged = self._batch_windows(events, self.window, None)
        return self._finish(merged)

    @property
    def merges_on_driver(self) -> bool:
        """True when ``merge_on_driver`` can do the merge: tumbling or sliding windows whose
        aggregates all merge without Spark (``AggregatePlan.driver_merges``)."""
        return not isinstance(self.window, Session) and all(
            p.driver_merges is not None for p in self.plans
        )

    def merge_on_driver(
        self, partials: pa.Table, nearby: pa.Table | None, final: pa.Table | None, batch_id: int
    ) -> WindowChanges:
        """``merge`` over Arrow tables on the driver: no Spark job (see ``merges_on_driver``).

        Gives the tables ``merge`` gives (no retract: tumbling and sliding
        windows keep their identity).
        """
        from lowmark.batches.event_time.driver_merge import DriverMerge

        merge = DriverMerge(self.identity, self.plans, self.aggregation.output_mode)
        return merge.merge(partials, nearby, final, batch_id)

    def _finish(self, windows: DataFrame) -> DataFrame:
        """Output rows (keys, window, one column per aggregate) of state-shaped ``windows``."""
        return windows.select(*self.identity, *[expr.alias(n) for n, expr in self._finishes()])

    def _last_end(self, event_ms: Column) -> Column:
        """End of the last window a record at ``event_ms`` can belong to.

        For a session window, the session the record alone would open.
        """
        from pyspark.sql import functions as F

        if isinstance(self.window, Session):
            return event_ms + F.lit(self.window.gap)
        return last_end(self.window, event_ms)

    def _batch_windows(
        self,
        accepted: DataFrame,
        window: Tumbling | Sliding,
        watermark_ms: int | None,
        by: tuple[str, ...] = (),
        extra: Sequence[Column] = (),
    ) -> DataFrame:
        """Tumbling/sliding: the batch's partials per (``by``, key, window), and the
        ``extra`` aggregates."""
        from pyspark.sql import functions as F

        assigned = accepted.withColumn("_w", assign_windows(window, F.col(self.event_time.column)))
        if watermark_ms is not None:  # a sliding record may still feed its open windows only
            assigned = assigned.where(~self._final(F.col("_w.end"), watermark_ms))
        if isinstance(window, Sliding) and _OWN_MS in accepted.columns:
            # ... those open when it was ingested (a tumbling record's one window is judged
            # with the record)
            lateness = F.lit(self.event_time.allowed_lateness)
            closed = F.unix_millis(F.col("_w.end")) + lateness <= F.col(_OWN_MS)
            assigned = assigned.where(~F.coalesce(closed, F.lit(False)))
        in_last = F.unix_millis(F.col("_w.end")) == last_end(window, F.col(_ET_MS))
        return assigned.groupBy(
            *by,
            *self.keys,
            F.col("_w.start").alias("window_start"),
            F.col("_w.end").alias("window_end"),
        ).agg(*self._partials(), F.count(F.when(in_last, 1)).alias(ROWS), *extra)

    def _merge_windows(
        self, partials: DataFrame, nearby: DataFrame | None
    ) -> tuple[DataFrame, DataFrame]:
        """Tumbling/sliding: batch partials merged with those windows' state.

        Returns (merged state rows, replaced identities: none, windows keep their identity).
        """
        from lowmark.batches.event_time.sessions import null_safe_match

        none = partials.select(*self.identity).limit(0)
        if nearby is None:
            return partials, none
        keys = partials.select(*self.identity)
        current = nearby.drop("updated_batch")
        touched = current.join(keys, null_safe_match(current, keys, self.identity), "left_semi")
        merged = partials.unionByName(touched).groupBy(*self.identity).agg(*self._merges())
        return merged, none

    def _partials(self) -> list[Column]:
        return [expr.alias(name) for p in self.plans for name, expr in p.partials]

    def _merges(self) -> list[Column]:
        from pyspark.sql import functions as F

        merged = [expr.alias(name) for p in self.plans for name, expr in p.merges]
        return [*merged, F.sum(ROWS).alias(ROWS)]

    def would_emit(self, state_version: int | None, watermark_ms: int) -> bool:
        """True when state holds windows that ``watermark_ms`` makes final."""
        final = self.state.ending_before(state_version, self.final_limit_us(watermark_ms))
        return final is not None and final.num_rows > 0

    def final_limit_us(self, watermark_ms: int) -> int:
        """Windows ending before this (epoch µs) are final under ``watermark_ms``."""
        return (watermark_ms - self.event_time.allowed_lateness + 1) * 1000

    def _final(self, window_end: Column, watermark_ms: int) -> Column:
        """``window_end + allowed_lateness <= watermark`` (ms), as a bound on the column
        (``< limit + 1 ms`` keeps sub-millisecond ends exact)."""
        return window_end < batch_timestamp(self.final_limit_us(watermark_ms))

    def _finishes(self) -> list[tuple[str, Column]]:
        return [p.finish for p in self.plans]
