"""Catch-up read-ahead: step 4 of the next several batches in ONE Spark job.

A windowed batch's one job reads its input and collects its window partials
(``BatchWork.look``). When a batch finds more input waiting than it
may take, the jobs of the batches after it would each pay a job's fixed cost
(scheduling, a scan per file split, a shuffle) for a fraction of the data.
The read-ahead scans those batches' input once, every record tagged with
its batch by the source (``Source.read_batches``), and aggregates their
partials per batch in one job; the same aggregation counts each batch's
records and finds its newest event times (``partials_with_stats``), as
observing them per batch would cost a pass over every record per metric.
When the source cannot tag its records, or the transform does not turn
each record into one (``row_by_row``: a filter, a join, an aggregation,
``dropDuplicates``...), each batch's frames are built exactly as its own
job builds them and their records, tagged, are unioned into the one
aggregation instead. Each batch then still plans, writes ahead, merges with state,
writes and commits on its own, in order; its step 4 takes what the read-ahead
saw of exactly its range instead of running a job.

What a batch takes is what its own job would have given, or it runs its own:

- Same input: only a new batch whose planned ``[start, end)`` is the range
  read ahead takes it (a replay, or a range that new files made longer, runs
  its own job).
- Same transform: a transform sees one batch's records at a time, as always,
  or takes each record on its own (``row_by_row``), which gives the same
  records over several batches at once.
- Same watermark: a batch's watermark is known only once the batch before it
  committed, so the read-ahead looks with none. For tumbling windows that is
  exact: a record is late exactly when its window is closed, which the batch
  checks on its partial rows against its own watermark. Late rows come out of
  the read-ahead's job too: it collects the records without an event time and
  those whose window is closed under the watermark of the batch that started
  it, which no later batch's watermark is below; a batch takes them with its
  closed windows' partials dropped. The first batch with a window that closed
  only under a later watermark (its records were not collected) collects, in one
  more job, the records of such windows for itself and every batch after it
  that has some, each under the watermark it will have (``_collect_closed``);
  only one whose watermark outruns that guess collects again. A record from
  beyond ``max_future`` (judged at the read-ahead's earlier processing time)
  or bad rows runs its own job, which collects those rows; so does a batch with
  a record that violates an expectation (the read-ahead counts them per batch
  and drops none: its own job counts each expectation and drops). Sliding windows (a
  record's lateness is not a property of one window) and aggregates merged in
  Spark do not read ahead.

Nothing here is written anywhere: a crash loses only the read-ahead, and the
replay of a batch that used it runs its own job over the same offsets.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from lowmark.batches.collect import collect, observed, session_confs, shuffle_partitions
from lowmark.batches.event_time.dedup import DedupSeen
from lowmark.batches.event_time.stage import (
    CLOSED,
    FUTURE,
    LATE_RECORD,
    LATE_RECORDS,
    BatchFrames,
    WindowedStage,
    late_table,
    split_stats,
)
from lowmark.batches.expectations import Checks
from lowmark.batches.keyed.step import KeyedSeen
from lowmark.batches.sources.base import (
    BATCH_COLUMN,
    Clocks,
    Range,
    Source,
    SourceRead,
    plan_in_clock_order,
)
from lowmark.batches.windows import Tumbling
from lowmark.state.errors import LowmarkError
from lowmark.state.session import is_remote_session

log = logging.getLogger(__name__)

MAX_BYTES = 1024 * 1024 * 1024
"""Input one read-ahead takes at most (its batches' partials are held on the driver)."""
JOB_CONFS = {"spark.sql.codegen.useIdInClassName": "false"}
"""The read-ahead job's settings: generated code named without its stage id, so the
batches' scans, alike but for their files, compile once."""
SCAN_PER_BATCH_CONFS = {**JOB_CONFS, "spark.sql.files.minPartitionNum": "1"}
"""With a scan per batch, each in as few splits as its size allows: the union of the
batches' scans is the job's parallelism, and a task per small file split is most of its
time. One scan keeps Spark's default, a split per core at least: in one split, a wide
read-ahead parsed its input on one core while the others waited."""


@dataclass(frozen=True)
class Seen:
    """What step 4 learnt of a batch's records (its own job or the read-ahead)."""

    rows_in: int
    """Records read (bad rows not included)."""
    bad: pa.Table | None
    late: pa.Table | None
    max_event_ms: dict[str, int]
    """Max event time per source partition (partitions with a timed record)."""
    rows_out: int
    """Records after the transform."""
    partials: pa.Table | None
    """Windowed: the batch's window partials."""
    violations: dict[str, int] = field(default_factory=dict)
    """Per expectation, the records that violated it (``lowmark.batches.expectations``)."""
    dropped: pa.Table | None = None
    """The records ``drop`` expectations removed (``raw``, ``reason``)."""
    judged: DedupSeen | None = None
    """With ``dedup``: its verdicts (its late records are among ``late``)."""
    keyed: KeyedSeen | None = None
    """With ``keyed``: the keyed step's counts and changes (its late records are among
    ``late``)."""
    emitted: int | None = None
    """With ``keyed``: the processor's output rows (``rows_out`` counts its input)."""
    join_records: pa.Table | None = None
    """With ``stream_join``: the batch's records as the join takes them
    (``IntervalJoin.records``), collected by the same job."""


@dataclass(frozen=True)
class _Looked:
    """One batch as the read-ahead's job saw it, with no watermark."""

    range: Range
    looked_at_ms: int
    rows_in: int
    bad: int
    rows_out: int
    late_records: pa.Table
    """``LATE_RECORD``s of the records without an event time, from beyond ``max_future``,
    or in windows closed under ``closed_under_ms``."""
    closed_under_ms: int | None
    """The watermark of the batch that started the read-ahead."""
    max_event_ms: dict[str, int]
    partials: pa.Table
    violating: int
    """Records that violate an expectation."""


@dataclass(frozen=True)
class _Read:
    """The records of several batches in one frame, each tagged with its batch."""

    records: DataFrame
    looks: list[tuple[Range, SourceRead]]
    """The batches read (in order), each with the read it is in."""
    partitions: tuple[str, ...]
    size: int
    """Input bytes."""
    one_scan: bool
    """Read in one scan (the transform keeps each record), not a scan per batch."""

    @property
    def confs(self) -> dict[str, str]:
        """The session's settings for the job over these records."""
        return JOB_CONFS if self.one_scan else SCAN_PER_BATCH_CONFS


Frames = Callable[[Sequence[Range], int], tuple[SourceRead, BatchFrames] | None]
"""``frames(batches, now_ms)``: the read and stage frames of one batch, built exactly as
its own job builds them, with no watermark; or of several batches in one read, records
tagged with their batch (None when that cannot be: see ``row_by_row``)."""
_ROW_BY_ROW = {"Project", "SubqueryAlias", "CollectMetrics"}


def row_by_row(records: DataFrame, read: DataFrame) -> bool:
    """True when ``records`` keep ``BATCH_COLUMN`` and the transform that made them from
    the ``read`` records turns each record into one record: deterministic projections
    with no subquery, over the read alone.

    A transform like that gives several batches' records together what it
    gives each batch alone, so the read-ahead can scan them once, and a
    batch's records read are its records out (its aggregation counts them).
    Any other (a filter, a join, an aggregation, ``dropDuplicates``, a limit,
    a window function, an explode or table function, ``rand()``) is given one
    batch at a time. Over Spark Connect, whose client sees no analysed plan, every
    transform is given one batch at a time.
    """
    if BATCH_COLUMN not in records.columns or is_remote_session(records.sparkSession):
        return False
    plan = records._jdf.queryExecution().analyzed()
    source = read._jdf.queryExecution().analyzed()
    if not plan.deterministic():
        return False
    while not plan.equals(source):
        children = plan.children()
        if plan.nodeName() not in _ROW_BY_ROW or children.size() != 1:
            return False
        if not plan.subqueries().isEmpty():
            return False
        plan = children.apply(0)
    return True


class ReadAhead:
    """The read-ahead of one runner: batches looked at, waiting for their turn."""

    def __init__(
        self,
        spark: Callable[[], SparkSession],
        source: Source,
        stage: WindowedStage,
        frames: Frames,
        batches: int,
        checks: Checks,
    ) -> None:
        self._spark = spark
        self.source = source
        self.stage = stage
        self.frames = frames
        self.batches = batches
        self.checks = checks
        self._looked: dict[int, _Looked] = {}

    @property
    def applies(self) -> bool:
        """Tumbling windows merged on the driver, and more than one batch to look at."""
        return (
            self.batches > 1
            and isinstance(self.stage.window, Tumbling)
            and self.stage.merges_on_driver
        )

    def seen(
        self,
        batch: Range,
        watermark_ms: int | None,
        planned_at_ms: int,
        replay: bool,
        clocks: Clocks | None = None,
    ) -> Seen | None:
        """What the read-ahead saw of ``batch``, if it is exactly what the batch's own job
        would see under ``watermark_ms``; else None (the batch runs its own job).

        A new batch with input that no read-ahead looked at starts one, over
        itself and the batches after it, as far as the source has input. With
        aligned admission, the batches after it are planned by the ``clocks``
        ``batch`` was planned by (theirs are known only once it ran): one
        whose own plan, by its own clocks, differs runs its own job.
        """
        if replay or not self.applies or batch.start == batch.end:
            self._looked.clear()
            return None
        looked = self._looked.pop(batch.batch_id, None)
        for stale in [b for b in self._looked if b < batch.batch_id]:
            del self._looked[stale]
        if looked is None and not self._looked:
            self._look(batch, planned_at_ms, watermark_ms, clocks)
            looked = self._looked.pop(batch.batch_id, None)
        if (
            looked is None
            or looked.range != batch
            or planned_at_ms < looked.looked_at_ms
            or looked.bad
            or looked.violating
            or pc.any(pc.equal(looked.late_records.column("reason"), FUTURE)).as_py()
        ):
            return None
        if self._uncollected(looked, watermark_ms):
            looked = self._collect_closed(looked, watermark_ms)
            if self._uncollected(looked, watermark_ms):
                return None
        partials, late = self._split(looked, watermark_ms)
        return Seen(
            looked.rows_in,
            None,
            late_table(late, batch.batch_id, watermark_ms) if late.num_rows else None,
            looked.max_event_ms,
            looked.rows_out,
            partials,
            self.checks.violations({}),  # none violated (else the batch runs its own job)
        )

    def _look(
        self, first: Range, now_ms: int, watermark_ms: int | None, clocks: Clocks | None
    ) -> None:
        """One job over ``first`` (whose watermark is ``watermark_ms``) and the batches after
        it that the source has input for (planned by ``clocks``)."""
        ranges = [first]
        while len(ranges) < self.batches:
            last = ranges[-1]
            end = plan_in_clock_order(
                self.source, last.end, last.batch_id + 1, clocks, record=False, discover=False
            )
            if end == last.end:
                break
            ranges.append(Range(last.batch_id + 1, last.end, end))
        if len(ranges) < 2:
            return
        ahead = self._read(ranges, now_ms, lambda frames, _batch: frames.flagged(watermark_ms))
        flagged, looks, partitions, total = ahead.records, ahead.looks, ahead.partitions, ahead.size
        # One aggregation for the partials and the counts of all the batches: one shuffle,
        # one compiled plan, and no observation of the records (it costs a pass per metric).
        violated = self.checks.violated_any() if self.checks else None
        groups = self.stage.partials_with_stats(flagged, partitions, (BATCH_COLUMN,), violated)
        spark = self._spark()
        try:
            with shuffle_partitions(spark, total), session_confs(spark, ahead.confs):
                table = collect({"partials": groups})["partials"]
        except (Py4JJavaError, PySparkException) as exc:
            # Each batch's own job fails the same way, and names its bad input.
            log.info("read-ahead from batch %d failed: %s", first.batch_id, exc)
            return
        tags = table.column(BATCH_COLUMN)
        for r, read in looks:
            counts = observed(read.counts)
            if counts is None or counts.get("untagged") or self._changed(r):
                continue
            mine = table.filter(pc.equal(tags, r.batch_id)).drop_columns([BATCH_COLUMN])
            partials, stats = split_stats(mine, partitions)
            if ahead.one_scan:  # the transform keeps each record: records read = out
                # Bad rows somewhere from bad_from to bad_to: each of those batches runs
                # its own job, which counts them.
                low, high = counts.get("bad_from"), counts.get("bad_to")
                bad = int(low is not None and high is not None and low <= r.batch_id <= high)
                rows_in = stats.rows
            else:
                rows_in, bad = counts["rows"], counts.get("bad", 0)
            self._looked[r.batch_id] = _Looked(
                r,
                now_ms,
                rows_in,
                bad,
                stats.rows,
                stats.late_records if stats.late_records is not None else LATE_RECORD.empty_table(),
                watermark_ms,
                stats.max_ms,
                partials,
                stats.violating,
            )
        log.info(
            "read ahead batches %d..%d in one job (%s)",
            first.batch_id,
            looks[-1][0].batch_id,
            "one scan" if ahead.one_scan else "a scan per batch",
        )

    def _read(
        self,
        ranges: list[Range],
        now_ms: int,
        flag: Callable[[BatchFrames, Column], DataFrame],
    ) -> _Read:
        """The records of ``ranges`` (as many of them as ``MAX_BYTES`` allows, the first
        always) as ``flag`` makes them of each batch's frames (built at ``now_ms``, as its own
        job builds them; given the column of each record's batch id), tagged with their batch
        (``BATCH_COLUMN``): one scan when the source can tag them, else a scan per batch."""
        one_read = self.frames(ranges, now_ms) if len(ranges) > 1 else None  # else: untagged
        while one_read is not None and len(ranges) > 2 and _size(one_read[0]) > MAX_BYTES:
            ranges = ranges[: len(ranges) // 2]
            one_read = self.frames(ranges, now_ms)
        if one_read is not None:  # one scan, records tagged with their batch by the source
            read, frames = one_read
            flagged = flag(frames, F.col(BATCH_COLUMN))
            return _Read(flagged, [(r, read) for r in ranges], frames.partitions, _size(read), True)
        total = 0
        looks: list[tuple[Range, SourceRead]] = []
        tagged: list[DataFrame] = []
        found: set[str] = set()
        for r in ranges:
            built = self.frames([r], now_ms)
            assert built is not None
            total += _size(built[0])
            if looks and total > MAX_BYTES:
                break
            looks.append((r, built[0]))
            batch = F.lit(r.batch_id)
            tagged.append(flag(built[1], batch).withColumn(BATCH_COLUMN, batch))
            found.update(built[1].partitions)
        records = functools.reduce(DataFrame.unionByName, tagged)
        return _Read(records, looks, tuple(sorted(found)), total, False)

    def _changed(self, batch: Range) -> bool:
        """True when ``batch``'s input changed while the read-ahead read it (its own job
        reads it again)."""
        try:
            self.source.confirm(batch)
        except LowmarkError as exc:
            log.info("read-ahead of batch %d dropped: %s", batch.batch_id, exc)
            return True
        return False

    def _closed(self, looked: _Looked, watermark_ms: int | None) -> pa.Array | None:
        """Which partial rows of ``looked`` are of a window closed under ``watermark_ms``."""
        if watermark_ms is None or not looked.partials.num_rows:
            return None
        ends = looked.partials.column("window_end").cast(pa.int64())
        return pc.less(ends, self.stage.final_limit_us(watermark_ms))

    def _uncollected(self, looked: _Looked, watermark_ms: int | None) -> bool:
        """Whether a window of ``looked`` is closed under ``watermark_ms`` whose records the
        read-ahead did not collect (they were collected under ``closed_under_ms``)."""
        closed = self._closed(looked, watermark_ms)
        if closed is None or not pc.any(closed).as_py():
            return False
        collected = looked.closed_under_ms
        if collected is None:
            return True
        was_collected = self._closed(looked, collected)
        assert was_collected is not None  # the partials are not empty
        return bool(pc.any(pc.and_(closed, pc.invert(was_collected))).as_py())

    def _split(self, looked: _Looked, watermark_ms: int | None) -> tuple[pa.Table, pa.Table]:
        """The partial rows of ``looked`` whose window is open under the batch's
        ``watermark_ms``, and its late records: those rejected, and those of the windows
        closed under it (the read-ahead may have collected records of windows it closes
        only later)."""
        late = looked.late_records
        if watermark_ms is None:
            return looked.partials, late.filter(pc.not_equal(late.column("reason"), CLOSED))
        others = pc.not_equal(late.column("reason"), CLOSED)
        late = late.filter(pc.or_(others, self.stage.closed_records(late, watermark_ms)))
        closed = self._closed(looked, watermark_ms)
        partials = looked.partials if closed is None else looked.partials.filter(pc.invert(closed))
        return partials, late

    def _collect_closed(self, first: _Looked, watermark_ms: int | None) -> _Looked:
        """``first`` (whose watermark is ``watermark_ms``) and the batches looked at after
        it, each with the records of its windows closed under the watermark it will have,
        collected in one job over the batches that have such windows: a batch's watermark
        is known only when its turn comes, and each would otherwise read its input again.

        A later batch's watermark is taken to be what its single source partition's
        newest event time would make it (``max_out_of_orderness`` behind the newest event
        time read before it): at or above what several partitions, idle ones or an
        ingestion clock give, so its records are collected; one whose windows close further
        still finds them uncollected and collects them again, from its own turn."""
        assert watermark_ms is not None
        later = sorted(self._looked.values(), key=lambda looked: looked.range.batch_id)
        limits: dict[int, int] = {}
        limit = watermark_ms
        for looked in (first, *later):
            limits[looked.range.batch_id] = limit
            newest = max(looked.max_event_ms.values(), default=None)
            if newest is not None:
                limit = max(limit, newest - self.stage.event_time.max_out_of_orderness)
        wanted = [
            looked
            for looked in (first, *later)
            if self._uncollected(looked, limits[looked.range.batch_id])
        ]
        if not wanted:
            return first
        by_batch = F.create_map(*[F.lit(x) for b, w in limits.items() for x in (b, w)])
        read = self._read(
            [looked.range for looked in wanted],
            first.looked_at_ms,
            lambda frames, batch: frames.closed_records(F.element_at(by_batch, batch)),
        )
        spark = self._spark()
        try:
            with shuffle_partitions(spark, read.size), session_confs(spark, read.confs):
                late = read.records.select(BATCH_COLUMN, LATE_RECORDS)
                found = collect({"late": late})["late"]
        except (Py4JJavaError, PySparkException) as exc:
            log.info("collecting late records from batch %d failed: %s", first.range.batch_id, exc)
            return first
        tags = found.column(BATCH_COLUMN)
        records = found.column(LATE_RECORDS)
        covered = {r.batch_id for r, _ in read.looks}
        for looked in wanted:
            batch_id = looked.range.batch_id
            if batch_id not in covered:  # beyond the read's bound: collected at its turn
                continue
            mine = pc.filter(records, pc.equal(tags, batch_id))
            closed = pa.table(
                [pc.struct_field(mine, f.name).cast(f.type) for f in LATE_RECORD], LATE_RECORD
            )
            rejected = looked.late_records.filter(
                pc.not_equal(looked.late_records.column("reason"), CLOSED)
            )
            updated = replace(
                looked,
                late_records=pa.concat_tables([rejected, closed]),
                closed_under_ms=limits[batch_id],
            )
            if batch_id == first.range.batch_id:
                first = updated
            else:
                self._looked[batch_id] = updated
        log.info(
            "collected the late records of batches %s in one job",
            ", ".join(str(b) for b in sorted(covered)),
        )
        return first


def _size(read: SourceRead) -> int:
    return read.size_bytes or 0
