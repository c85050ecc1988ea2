"""Deduplication by record id: a record whose id was let through within the horizon is
dropped, across batches and across replays.

A pipeline's ``dedup`` (``lowmark.batches.dedup``) in a batch's Spark work
(``DedupStep.judged``). Per batch:

1. Each record's id is its id columns as a JSON object (nulls compare equal,
   as in ``dropDuplicates``); the records are shuffled by id, so every
   record of one id meets in one task. A small batch (``SourceRead.small``) is
   not shuffled: its records meet in one task, a stage fewer (more input
   keeps its scan's parallelism).
2. In each task (``_judge``, on the executors) the records of one id are
   judged one after another, in the order they were ingested (with an
   ingestion-time watermark: their own ingestion time; ties, and records
   without one, by event time, then by a hash of the whole record). Each
   record has its horizon: ``watermark - within``, or, judged by its own
   ingestion time, ``max(watermark, ingestion time - max_event_time_lag) -
   within``. A record without event time, or older than its horizon (its id
   may have been purged), goes to the late table, before it can be a
   duplicate. Any other record is a duplicate when its id was let through at
   or after its horizon: held in the seen-ids table (``lowmark.state.seen_ids``,
   read by the task with delta-rs as of the version the driver pinned), or
   by a record judged before it; else it is let through, and its id is new.
   The task writes its new ids as data files of the seen-ids table
   (``write_ids``: nothing committed) and hands back their descriptors on its
   first record let through.
3. The job that reads the batch observes the duplicates' count, the files'
   descriptors and the late records as it runs (``DedupSeen``); the driver
   commits the files in the batch's state step, once, and purges slots below
   the horizon.

The order and the horizons in step 2 depend only on the records (and the
watermark the offset log recorded), so a replay keeps the same record of a
group of twins, and a duplicate is dropped exactly once whatever the kill
point. Under an ingestion-time watermark a record's own horizon is its
verdict's whatever the batch (the batch's clock is at or before its own), so
a live run and a backlog cut into batches of any size give the same
verdicts, as long as the records' batches follow their ingestion order.

No id reaches the driver: only the descriptors of the files that hold them,
a few per task.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ByteType, StringType, StructField, StructType

from lowmark.batches.dedup import Dedup
from lowmark.batches.errors import BackfillHistoryLost, PipelineConfigInvalid
from lowmark.batches.event_time.stage import UNTIMED as NO_EVENT_TIME
from lowmark.batches.event_time.stage import late_struct
from lowmark.batches.records import INGESTED_COLUMN, INTERNAL_COLUMNS
from lowmark.state.seen_ids import SeenIds, held_ids, write_ids
from lowmark.state.task_appends import WrittenFile

if TYPE_CHECKING:
    from lowmark.batches.event_time.watermarks import IngestionLags

KEY = "_lowmark_id"
EVENT_US = "_lowmark_id_event_us"
ORDER = "_lowmark_id_order"
ARRIVED = "_lowmark_id_arrived_ms"
"""A record's own ingestion time (epoch ms) where it is judged by it (the order an id's
records are judged in); null otherwise."""
OWN_FROM = "_lowmark_id_own_from_us"
"""A record's own horizon: its own clock (``IngestionLags.own_clock``) minus ``within``, in
epoch µs; null without one."""
VERDICT = "_lowmark_verdict"
WRITTEN = "_lowmark_written_ids"
"""On a task's first record let through: the descriptors of the files its new ids went to
(JSON); null on every other record."""
NEW, DUPLICATE, UNTIMED, OLD, OLD_WHEN_INGESTED = 0, 1, 2, 3, 4
"""Verdicts: let through; a duplicate; late: no event time; late: older than the horizon;
late: older than its own horizon (so in every batch that may take it)."""
ID_FILES, DUPLICATES, LATE_RECORDS = "_lowmark_id_files", "_lowmark_duplicates", "_lowmark_id_late"
BEFORE_HORIZON = "event time before the deduplication horizon: watermark - dedup.within"
BEFORE_HORIZON_WHEN_INGESTED = (
    "event time before the deduplication horizon when it was ingested: "
    "ingestion time - max_event_time_lag - dedup.within"
)


@dataclass(frozen=True)
class DedupSeen:
    """What the job that read a batch observed of its deduplication."""

    duplicates: int
    id_files: list[WrittenFile]
    """The data files the tasks wrote the ids of the records let through to
    (``SeenIds.commit`` adds them)."""
    late: pa.Table
    """``event_us``, ``reason`` and ``record`` (JSON) of each record sent to the late table."""


@dataclass(frozen=True)
class Judged:
    """A batch's records after deduplication, lazily, and the observation of the verdicts."""

    kept: DataFrame
    seen: Observation

    def observed(self, metrics: dict[str, object]) -> DedupSeen:
        """The verdicts from the observation's ``metrics`` (``collect.observed``)."""
        described: list[str] = metrics[ID_FILES]  # type: ignore[assignment]
        files = [WrittenFile.of(f) for d in described for f in json.loads(d)]
        late = [r.asDict() for r in metrics[LATE_RECORDS]]  # type: ignore[attr-defined]
        return DedupSeen(
            int(metrics[DUPLICATES]),  # type: ignore[call-overload]
            files,
            pa.Table.from_pylist(late, schema=_LATE),
        )


_LATE = pa.schema([("event_us", pa.int64()), ("reason", pa.string()), ("record", pa.string())])


class DedupStep:
    """The deduplication of one pipeline's batches, over its seen-ids table."""

    def __init__(
        self,
        dedup: Dedup,
        event_time_column: str,
        seen_ids: SeenIds,
        lags: IngestionLags | None = None,
        writes: bool = True,
    ) -> None:
        self.dedup = dedup
        self.column = event_time_column
        self.seen_ids = seen_ids
        self.lags = lags
        """The partitions whose records are judged by their own ingestion time (None: none)."""
        self.writes = writes
        """False: the tasks write no files of the ids they let through (``previewing``)."""

    def previewing(self) -> DedupStep:
        """This step judging as it does, its tasks writing nothing (``lowmark preview``: the
        verdicts without the files a commit would add)."""
        return DedupStep(self.dedup, self.column, self.seen_ids, self.lags, writes=False)

    def judged(
        self,
        records: DataFrame,
        watermark_ms: int | None,
        version: int | None,
        batch_id: int,
        one_task: bool = False,
    ) -> Judged:
        """``records`` of batch ``batch_id`` without duplicates and late ones, judged against
        the ids held as of ``version``, under ``watermark_ms``; lazy, observed as the first
        job reads it. ``one_task``: the batch is small (``SourceRead.small``): its records
        are judged in one task, as they are read, instead of shuffled by id."""
        missing = {*self.dedup.columns, self.column} - set(records.columns)
        if missing:
            raise PipelineConfigInvalid(
                f"the records lack {sorted(missing)}: the transform must keep the "
                "dedup.columns and the event-time column"
            )
        payload = [c for c in records.columns if c not in INTERNAL_COLUMNS]
        own = self.lags.own_clock() if self.lags is not None else None
        arrived = own_from = F.lit(None).cast("long")
        if own is not None and INGESTED_COLUMN in records.columns:
            # A transform that dropped the ingestion time leaves its records to the batch's.
            arrived = F.when(own.isNotNull(), F.col(INGESTED_COLUMN))
            own_from = own * 1000 - F.lit(self.seen_ids.within_us)
        keyed = (
            records.withColumn(KEY, F.to_json(F.struct(*[F.col(c) for c in self.dedup.columns])))
            .withColumn(EVENT_US, F.unix_micros(F.col(self.column)))
            # A hash of the whole record (maps have no hash of their own: JSON has one).
            .withColumn(ORDER, F.xxhash64(F.to_json(F.struct(*payload))))
            .withColumn(ARRIVED, arrived.cast("long"))
            .withColumn(OWN_FROM, own_from.cast("long"))
        )
        schema = StructType(
            [
                *keyed.schema.fields,
                StructField(VERDICT, ByteType(), False),
                StructField(WRITTEN, StringType()),
            ]
        )
        ids = self.seen_ids
        judge = functools.partial(
            _judge,
            ids.path,
            ids.slot_us,
            version,
            ids.live_from_us(watermark_ms),
            batch_id,
            self.writes,
        )
        by_id = keyed.coalesce(1) if one_task else keyed.repartition(KEY)
        verdicts = by_id.mapInArrow(judge, schema)
        verdict = F.col(VERDICT)
        seen = Observation()
        observed = verdicts.observe(
            seen,
            F.count(F.when(verdict == DUPLICATE, 1)).alias(DUPLICATES),
            F.collect_list(F.col(WRITTEN)).alias(ID_FILES),
            F.collect_list(F.when(verdict >= UNTIMED, self._late_record(payload))).alias(
                LATE_RECORDS
            ),
        )
        kept = observed.where(verdict == NEW).drop(
            KEY, EVENT_US, ORDER, ARRIVED, OWN_FROM, VERDICT, WRITTEN
        )
        return Judged(kept, seen)

    @staticmethod
    def _late_record(payload: list[str]) -> Column:
        reason = (
            F.when(F.col(VERDICT) == UNTIMED, F.lit(NO_EVENT_TIME))
            .when(F.col(VERDICT) == OLD_WHEN_INGESTED, F.lit(BEFORE_HORIZON_WHEN_INGESTED))
            .otherwise(F.lit(BEFORE_HORIZON))
        )
        return late_struct(F.col(EVENT_US), reason, payload)


def as_let_through(records: DataFrame, dedup: Dedup, column: str, ids: pa.Table) -> DataFrame:
    """Of a whole history of ``records`` at once (a backfill), the ones the stream's batches
    let through: ``ids`` (``id``, ``event_time``: ``lowmark.state.seen_ids.let_through``)
    names each by id and event time, and of the copies with both, a batch let through the
    first in its order (``_judge``). Raises ``BackfillHistoryLost`` when such copies differ
    (they came in different batches or one: the ids cannot tell)."""
    payload = [c for c in records.columns if c not in INTERNAL_COLUMNS]
    verdicts = records.sparkSession.createDataFrame(ids).select(
        F.col("id").alias(KEY), F.unix_micros("event_time").alias(EVENT_US)
    )
    keyed = (
        records.withColumn(KEY, F.to_json(F.struct(*[F.col(c) for c in dedup.columns])))
        .withColumn(EVENT_US, F.unix_micros(F.col(column)))
        .withColumn(ORDER, F.xxhash64(F.to_json(F.struct(*payload))))
        .join(F.broadcast(verdicts), [KEY, EVENT_US])
    )
    differing = (
        keyed.groupBy(KEY, EVENT_US)
        .agg(F.count_distinct(ORDER).alias(VERDICT))
        .where(F.col(VERDICT) > 1)
        .head()
    )
    if differing is not None:
        at = datetime.fromtimestamp(differing[EVENT_US] / 1e6, UTC).isoformat()
        raise BackfillHistoryLost(
            f"id {differing[KEY]} at {at} has {differing[VERDICT]} different records in the "
            "history and the seen-ids table names only the id and event time of the one a "
            "batch let through, so a backfill cannot tell which: the windows the stream "
            "wrote stay as they are"
        )
    first = F.row_number().over(Window.partitionBy(KEY, EVENT_US).orderBy(ORDER))
    kept = keyed.withColumn(VERDICT, first).where(F.col(VERDICT) == 1)
    return kept.drop(KEY, EVENT_US, ORDER, VERDICT)


_NOTHING_HELD = np.iinfo(np.int64).min
_NO_HORIZON = _NOTHING_HELD + 1
"""In ``_judge``'s arrays: an id let through by nothing so far, and a record with no horizon
(no watermark yet, no clock of its own): ``held >= horizon`` is then False, and True for
any id held."""


def _judge(
    path: str,
    slot_us: int,
    version: int | None,
    live_from_us: int | None,
    batch_id: int,
    writes: bool,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """One task's verdicts (see the module's step 2): its records, each with ``VERDICT``,
    judged against the ids the seen-ids table at ``path`` held as of ``version`` from
    ``live_from_us`` (the batch's horizon) on; with ``writes``, the ids of those let through
    written as data files of that table, described in ``WRITTEN``."""
    parts = [b for b in batches if b.num_rows]
    if not parts:
        return
    records = pa.Table.from_batches(parts)
    order = [KEY, ARRIVED, EVENT_US, ORDER]
    records = records.sort_by([(c, "ascending") for c in order])  # nulls last
    ids, event_us = records.column(KEY).combine_chunks(), records.column(EVENT_US).combine_chunks()
    first = np.concatenate([[True], pc.not_equal(ids[1:], ids[:-1]).to_numpy(False)])
    timed = pc.is_valid(event_us).to_numpy(False)
    event = pc.fill_null(event_us, 0).to_numpy(False)
    own = pc.fill_null(records.column(OWN_FROM), _NO_HORIZON).to_numpy().astype(np.int64)
    horizon = own if live_from_us is None else np.maximum(own, live_from_us)
    held = held_ids(path, slot_us, version, live_from_us, pc.unique(ids))
    newest = pc.take(held.column("event_us"), pc.index_in(ids, value_set=held.column("id")))
    newest_held = pc.fill_null(newest, _NOTHING_HELD).to_numpy(False)
    old = timed & (event < horizon)
    # Behind its own horizon first: the reason is then the record's, not its batch's.
    verdicts = np.select(
        [~timed, old & (event < own), old, newest_held >= horizon],
        [UNTIMED, OLD_WHEN_INGESTED, OLD, DUPLICATE],
        NEW,
    ).astype(np.int8)
    # Of an id with two or more records to judge, each depends on those judged before it.
    group = np.cumsum(first) - 1
    judged = timed & ~old
    several = judged & (np.bincount(group, weights=judged)[group] > 1)
    _judge_in_order(verdicts, np.flatnonzero(several), group, event, horizon, newest_held)
    let_through = np.flatnonzero(verdicts == NEW)
    written: list[str | None] = [None] * len(verdicts)
    if writes and len(let_through):
        chosen = pa.array(let_through)
        files = write_ids(path, slot_us, ids.take(chosen), event_us.take(chosen), batch_id)
        written[let_through[0]] = json.dumps([f.as_dict() for f in files])
    records = records.append_column(VERDICT, pa.array(verdicts))
    yield from records.append_column(WRITTEN, pa.array(written, pa.string())).to_batches()


def _judge_in_order(
    verdicts: np.ndarray,
    rows: np.ndarray,
    group: np.ndarray,
    event: np.ndarray,
    horizon: np.ndarray,
    newest_held: np.ndarray,
) -> None:
    """Set the ``verdicts`` of ``rows`` (ascending: each id's records to judge, in the order
    they are judged; ``group``: their id's number) one after another: a duplicate when the
    newest event time its id was let through at, held or by a row before it, is at or after
    its ``horizon``, else new."""
    current, newest = -1, _NOTHING_HELD
    for i, g, e, h, held in zip(
        rows.tolist(),
        group[rows].tolist(),
        event[rows].tolist(),
        horizon[rows].tolist(),
        newest_held[rows].tolist(),
        strict=True,
    ):
        if g != current:
            current, newest = g, held
        if newest >= h:
            verdicts[i] = DUPLICATE
        else:
            verdicts[i] = NEW
            newest = max(newest, e)
