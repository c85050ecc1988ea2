"""Catch-up read-ahead: step 4 of the next several batches in ONE Spark job.

A windowed batch's one job reads its input and collects its window partials
(``MicroBatchRunner._look``). When a batch finds more input waiting than it
may take, the jobs of the batches after it would each pay a job's fixed cost
(scheduling, a scan per file split, a shuffle) for a fraction of the data.
The read-ahead builds each of those batches' frames exactly as its own job
would, unions them (every partial row tagged with its batch id) and runs them
as one job. Each batch then still plans, writes ahead, merges with state,
writes and commits on its own, in order; its step 4 takes what the read-ahead
saw of exactly its range instead of running a job.

What a batch takes is what its own job would have given, or it runs its own:

- Same input: only a new batch whose planned ``[start, end)`` is the range
  read ahead takes it (a replay, or a range that new files made longer, runs
  its own job).
- Same transform: each batch's frames are built from its own read, so a
  transform sees one batch's records at a time, as always.
- Same watermark: a batch's watermark is known only once the batch before it
  committed, so the read-ahead looks with none. For tumbling windows that is
  exact: a record is late exactly when its window is closed, which the batch
  checks on its partial rows against its own watermark; records without an
  event time, from beyond ``max_future`` (judged at the read-ahead's earlier
  processing time), bad rows, or a closed window send the batch to its own
  job, which collects those rows. Sliding windows (a record's lateness is not
  a property of one window) and aggregates merged in Spark do not read ahead.

Nothing here is written anywhere: a crash loses only the read-ahead, and the
replay of a batch that used it runs its own job over the same offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from batches.collect import collect, observed, session_confs, shuffle_partitions
from batches.event_time import BatchFrames, WindowedStage
from batches.sources.base import Source, SourceRead
from batches.windows import Tumbling
from state.offset_log import Offsets

log = logging.getLogger(__name__)

BATCH_COLUMN = "_lowmark_batch"
MAX_BYTES = 1024 * 1024 * 1024
"""Input one read-ahead takes at most (its batches' partials are held on the driver)."""
JOB_CONFS = {
    "spark.sql.files.minPartitionNum": "1",
    "spark.sql.codegen.useIdInClassName": "false",
}
"""The read-ahead job's settings. Each batch's scan in as few splits as its size allows
(the union of the batches' scans is the job's parallelism, and a task per small file
split is most of its time); generated code named without its stage id, so the batches'
scans, alike but for their files, compile once."""


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


@dataclass(frozen=True)
class Range:
    """One batch of a read-ahead: its id and input range."""

    batch_id: int
    start: Offsets
    end: Offsets


@dataclass(frozen=True)
class _Looked:
    """One batch as the read-ahead's job saw it, with no watermark."""

    range: Range
    looked_at_ms: int
    rows_in: int
    bad: int
    rows_out: int
    untimed_or_future: int
    """Records the job set aside as late with no watermark: no event time, or from beyond
    ``max_future``."""
    max_event_ms: dict[str, int]
    partials: pa.Table


Frames = Callable[[Range, int], tuple[SourceRead, BatchFrames]]
"""One batch's read and stage frames, built exactly as its own job builds them, with no
watermark: ``frames(batch, now_ms)``."""


class ReadAhead:
    """The read-ahead of one runner: batches looked at, waiting for their turn."""

    def __init__(
        self,
        spark: Callable[[], SparkSession],
        source: Source,
        stage: WindowedStage,
        frames: Frames,
        batches: int,
    ) -> None:
        self._spark = spark
        self.source = source
        self.stage = stage
        self.frames = frames
        self.batches = batches
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
        self, batch: Range, watermark_ms: int | None, planned_at_ms: int, replay: bool
    ) -> Seen | None:
        """What the read-ahead saw of ``batch``, if it is exactly what the batch's own job
        would see under ``watermark_ms``; else None (the batch runs its own job).

        A new batch with input that no read-ahead looked at starts one, over
        itself and the batches after it, as far as the source has input.
        """
        if replay or not self.applies or batch.start == batch.end:
            self._looked.clear()
            return None
        looked = self._looked.pop(batch.batch_id, None)
        for stale in [b for b in self._looked if b < batch.batch_id]:
            del self._looked[stale]
        if looked is None and not self._looked:
            self._look(batch, planned_at_ms)
            looked = self._looked.pop(batch.batch_id, None)
        if (
            looked is None
            or looked.range != batch
            or planned_at_ms < looked.looked_at_ms
            or looked.bad
            or looked.untimed_or_future
            or self._closes_any(looked.partials, watermark_ms)
        ):
            return None
        return Seen(
            looked.rows_in, None, None, looked.max_event_ms, looked.rows_out, looked.partials
        )

    def _look(self, first: Range, now_ms: int) -> None:
        """One job over ``first`` and the batches after it that the source has input for."""
        ranges = [first]
        while len(ranges) < self.batches:
            last = ranges[-1]
            end = self.source.plan(last.end, last.batch_id + 1, record=False)
            if end == last.end:
                break
            ranges.append(Range(last.batch_id + 1, last.end, end))
        if len(ranges) < 2:
            return
        built: list[tuple[Range, SourceRead, BatchFrames]] = []
        total = 0
        for r in ranges:
            read, frames = self.frames(r, now_ms)
            total += read.size_bytes or 0
            if built and total > MAX_BYTES:
                break
            built.append((r, read, frames))
        # The batches' accepted records, each tagged with its batch, in one aggregation:
        # one shuffle and one compiled plan for the partials of all of them.
        tagged = [f.accepted.withColumn(BATCH_COLUMN, F.lit(r.batch_id)) for r, _, f in built]
        union = tagged[0]
        for accepted in tagged[1:]:
            union = union.unionByName(accepted)
        partials = self.stage.partials_of(union, None, by=(BATCH_COLUMN,))
        spark = self._spark()
        try:
            with shuffle_partitions(spark, total), session_confs(spark, JOB_CONFS):
                table = collect({"partials": partials})["partials"]
        except (Py4JJavaError, PySparkException) as exc:
            # Each batch's own job fails the same way, and names its bad input.
            log.info("read-ahead from batch %d failed: %s", first.batch_id, exc)
            return
        tags = table.column(BATCH_COLUMN)
        for r, read, frames in built:
            counts, stats = observed(read.counts), frames.stats()
            if counts is None or stats is None:
                continue
            mine = table.filter(pc.equal(tags, r.batch_id)).drop_columns([BATCH_COLUMN])
            self._looked[r.batch_id] = _Looked(
                r,
                now_ms,
                counts["rows"],
                counts.get("bad", 0),
                stats.rows,
                stats.late,
                stats.max_ms,
                mine,
            )
        log.info("read ahead batches %d..%d in one job", first.batch_id, built[-1][0].batch_id)

    def _closes_any(self, partials: pa.Table, watermark_ms: int | None) -> bool:
        """True when a partial row's (tumbling) window is closed under ``watermark_ms``:
        its records are late rows, which only the batch's own job collects."""
        if watermark_ms is None or not partials.num_rows:
            return False
        limit = self.stage.final_limit_us(watermark_ms)
        ends = partials.column("window_end").cast(pa.int64())
        return bool(pc.any(pc.less(ends, limit)).as_py())
