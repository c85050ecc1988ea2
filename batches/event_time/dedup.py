"""Deduplication by record id: a record whose id was let through within the horizon is
dropped, across batches and across replays.

A pipeline's ``dedup`` (``lowmark.batches.dedup``) in a batch's Spark work
(``DedupStep.judged``). Per batch:

1. Each record's id is its id columns as a JSON object (nulls compare equal,
   as in ``dropDuplicates``); the records are shuffled by id, so every
   record of one id meets in one task.
2. In each task (``_judge``, on the executors) the records of one id are
   ordered by event time, then by a hash of the whole record: the first is
   the candidate, the others are duplicates. A candidate whose id is held in
   the seen-ids table (``lowmark.state.seen_ids``, read by the task with
   delta-rs as of the version the driver pinned) is a duplicate too. Of the
   rest, one older than the horizon (event time below ``watermark - within``:
   its id may have been purged) or without event time goes to the late
   table; every other record is let through, and its id is new. The task
   writes its new ids as data files of the seen-ids table (``write_ids``:
   nothing committed) and hands back their descriptors on its first record
   let through.
3. The job that reads the batch observes the duplicates' count, the files'
   descriptors and the late records as it runs (``DedupSeen``); the driver
   commits the files in the batch's state step, once, and purges slots below
   the horizon.

The order in step 2 depends only on the records, so a replay keeps the same
record of a group of twins, and a duplicate is dropped exactly once whatever
the kill point. No id reaches the driver: only the descriptors of the files
that hold them, a few per task.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

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
from lowmark.batches.records import INTERNAL_COLUMNS
from lowmark.state.seen_ids import SeenIds, live_ids, write_ids
from lowmark.state.task_appends import WrittenFile

KEY = "_lowmark_id"
EVENT_US = "_lowmark_id_event_us"
ORDER = "_lowmark_id_order"
VERDICT = "_lowmark_verdict"
WRITTEN = "_lowmark_written_ids"
"""On a task's first record let through: the descriptors of the files its new ids went to
(JSON); null on every other record."""
NEW, DUPLICATE, UNTIMED, OLD = 0, 1, 2, 3
"""Verdicts: let through; a duplicate; late: no event time; late: older than the horizon."""
ID_FILES, DUPLICATES, LATE_RECORDS = "_lowmark_id_files", "_lowmark_duplicates", "_lowmark_id_late"
BEFORE_HORIZON = "event time before the deduplication horizon: watermark - dedup.within"


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
        self, dedup: Dedup, event_time_column: str, seen_ids: SeenIds, writes: bool = True
    ) -> None:
        self.dedup = dedup
        self.column = event_time_column
        self.seen_ids = seen_ids
        self.writes = writes
        """False: the tasks write no files of the ids they let through (``previewing``)."""

    def previewing(self) -> DedupStep:
        """This step judging as it does, its tasks writing nothing (``lowmark preview``: the
        verdicts without the files a commit would add)."""
        return DedupStep(self.dedup, self.column, self.seen_ids, writes=False)

    def judged(
        self, records: DataFrame, watermark_ms: int | None, version: int | None, batch_id: int
    ) -> Judged:
        """``records`` of batch ``batch_id`` without duplicates and late ones, judged against
        the ids held as of ``version``, under ``watermark_ms``; lazy, observed as the first
        job reads it."""
        missing = {*self.dedup.columns, self.column} - set(records.columns)
        if missing:
            raise PipelineConfigInvalid(
                f"the records lack {sorted(missing)}: the transform must keep the "
                "dedup.columns and the event-time column"
            )
        payload = [c for c in records.columns if c not in INTERNAL_COLUMNS]
        keyed = (
            records.withColumn(KEY, F.to_json(F.struct(*[F.col(c) for c in self.dedup.columns])))
            .withColumn(EVENT_US, F.unix_micros(F.col(self.column)))
            # A hash of the whole record (maps have no hash of their own: JSON has one).
            .withColumn(ORDER, F.xxhash64(F.to_json(F.struct(*payload))))
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
        verdicts = keyed.repartition(KEY).mapInArrow(judge, schema)
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
        kept = observed.where(verdict == NEW).drop(KEY, EVENT_US, ORDER, VERDICT, WRITTEN)
        return Judged(kept, seen)

    @staticmethod
    def _late_record(payload: list[str]) -> Column:
        reason = F.when(F.col(VERDICT) == UNTIMED, F.lit(NO_EVENT_TIME)).otherwise(
            F.lit(BEFORE_HORIZON)
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
    judged against the ids the seen-ids table at ``path`` held as of ``version``; with
    ``writes``, the ids of those let through written as data files of that table, described
    in ``WRITTEN``."""
    parts = [b for b in batches if b.num_rows]
    if not parts:
        return
    records = pa.Table.from_batches(parts)
    records = records.sort_by([(KEY, "ascending"), (EVENT_US, "ascending"), (ORDER, "ascending")])
    ids, event_us = records.column(KEY).combine_chunks(), records.column(EVENT_US).combine_chunks()
    # Untimed records sort last within their id: the first of each id is its earliest.
    first = np.concatenate([[True], pc.not_equal(ids[1:], ids[:-1]).to_numpy(False)])
    held = pc.is_in(ids, value_set=live_ids(path, slot_us, version, live_from_us))
    timed = pc.is_valid(event_us).to_numpy(False)
    old = (
        pc.fill_null(pc.less(event_us, live_from_us), False).to_numpy(False)
        if live_from_us is not None
        else np.zeros(len(ids), bool)
    )
    verdicts = np.select(
        [~timed, ~first | held.to_numpy(False), old], [UNTIMED, DUPLICATE, OLD], NEW
    ).astype(np.int8)
    let_through = np.flatnonzero(verdicts == NEW)
    written: list[str | None] = [None] * len(verdicts)
    if writes and len(let_through):
        chosen = pa.array(let_through)
        files = write_ids(path, slot_us, ids.take(chosen), event_us.take(chosen), batch_id)
        written[let_through[0]] = json.dumps([f.as_dict() for f in files])
    records = records.append_column(VERDICT, pa.array(verdicts))
    yield from records.append_column(WRITTEN, pa.array(written, pa.string())).to_batches()
