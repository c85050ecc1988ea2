"""The micro-batch loop: plan, write ahead, read, transform, sink, commit.

``MicroBatchRunner.run_batch`` is one micro-batch, top to bottom, in numbered
steps; ``plan_next_batch`` holds the recovery rule (Spark's offset log and commit log
algorithm, with an impossible log state an error rather than a warning).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from batches.clock import Clock, SystemClock
from batches.collect import collect, empty_of, observed, shuffle_partitions, to_frame
from batches.errors import Interrupted, PipelineConfigInvalid, SinkHeldElsewhere, SinkNotATable
from batches.event_time.stage import (
    BatchFrames,
    WindowedStage,
    late_table,
    partition_max_event_ms,
    window_state,
)
from batches.event_time.watermarks import PartitionTime, observe, pipeline_watermark
from batches.loop import faults
from batches.loop.catch_up import ReadAhead, Seen, row_by_row
from batches.loop.maintenance import maintain_after
from batches.loop.poison import TRANSIENT_PAUSES_S, failure_kind, refuse_poison
from batches.pipeline import Pipeline
from batches.sinks import Sink, WindowedSink, build_sink
from batches.sinks.delta import DeltaTableSink, DeltaWindowSink
from batches.sources import build_source
from batches.sources.base import PARTITION_COLUMN, Range, Skipped, SourceRead, check_identity
from state.checkpoint import Checkpoint, Found, find_checkpoint
from state.commit_log import CommitEntry
from state.errors import CheckpointCorrupt, CheckpointMissing, FingerprintMismatch, first_line
from state.failures import FailureKind
from state.offset_log import Identity, OffsetEntry, Offsets
from state.ownership import Writer, last_writer
from state.progress import ProgressEntry
from state.session import SparkLike, provider
from state.window_state import LATEST, ROWS

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class PlannedBatch:
    """The next batch to run: its id, input range, watermark and what it builds on."""

    batch_id: int
    start: Offsets
    end: Offsets
    watermark_ms: int | None
    replay: bool
    planned_at_ms: int
    """Processing time the batch was planned (recorded as the offsets' created_at)."""
    previous: CommitEntry | None
    """The commit of batch_id - 1 (its state version and partition times are this batch's input)."""
    identity: Identity = field(default_factory=dict)
    """What the source's offsets point into (``Source.identity``), recorded with them."""
    skipped: Skipped | None = None
    """Input upstream lost past the previous batch's end, which this batch (starting after
    it) passes over (``on_data_loss: skip``)."""
    waiting: tuple[str, ...] = ()
    """Source partitions with records past ``end`` when planned (recorded in the offset log)."""


@dataclass(frozen=True)
class BatchResult:
    """What one committed batch did."""

    batch_id: int
    replay: bool
    start: Offsets
    end: Offsets
    rows_in: int
    rows_out: int
    rows_bad: int
    rows_late: int
    watermark_ms: int | None
    """The watermark after the batch (the next batch runs with it)."""
    lag_ms: int | None
    """Planning time minus ``watermark_ms``: how far event time trails processing time."""
    durations_ms: dict[str, int] = field(default_factory=dict)


class MicroBatchRunner:
    """Runs the micro-batches of one pipeline against its checkpoint.

    One runner per pipeline at a time; a second one is detected when it
    writes the offset log and stops with ConcurrentRunner. A runner whose
    checkpoint ``lowmark reset`` replaced stops with CheckpointReplaced.
    """

    def __init__(
        self,
        spark: SparkLike,
        pipeline: Pipeline,
        data_root: Path,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._spark = provider(spark)
        self.pipeline = pipeline
        self.clock = clock or SystemClock()
        self.sleep = sleep
        """Waits between tries of a batch after a transient error (tests: no real wait)."""
        self.attempting: PlannedBatch | None = None
        """The batch the last ``run_batch`` was running when it raised (None: it did not)."""
        self._interrupted = False
        self.runner_id = str(uuid.uuid4())
        self.fingerprint = pipeline.fingerprint()
        self.checkpoint = Checkpoint(pipeline.checkpoint_location(data_root), pipeline.name)
        ckpt = self.checkpoint
        self.source = build_source(spark, pipeline, data_root, ckpt, self.clock)
        self.stage = (
            WindowedStage(
                pipeline.event_time,
                pipeline.aggregation,
                window_state(ckpt, pipeline.aggregation),
            )
            if pipeline.aggregation and pipeline.event_time
            else None
        )
        self.sink: Sink | WindowedSink = build_sink(
            spark, pipeline, data_root, ckpt.txn_app_id("sink")
        )
        self.read_ahead = (
            ReadAhead(
                self._spark,
                self.source,
                self.stage,
                self._unwatermarked,
                pipeline.read_ahead_batches,
            )
            if self.stage is not None
            else None
        )
        self._committed: tuple[OffsetEntry, CommitEntry] | None = None
        self._partitions: dict[str, PartitionTime] | None = None

    @property
    def spark(self) -> SparkSession:
        """The session; a runner that only plans (a dry run) never starts one."""
        return self._spark()

    @property
    def start_offsets(self) -> Offsets:
        """Where batch 0 starts: as the checkpoint recorded it (the first plan records it;
        ``lowmark reset`` may record another start), else the source's beginning now."""
        recorded = self.checkpoint.start_offsets
        return recorded if recorded is not None else self.source.initial_offsets()

    def plan_next_batch(self, dry_run: bool = False) -> PlannedBatch | None:
        """Decide which batch runs next, or None when there is nothing to do.

        ``dry_run`` writes nothing (the source records no discovery), except
        batch 0's start when it moves (``Source.start_moves``: "latest"), which
        the first plan fixes in the checkpoint: what ``lowmark status`` and the
        Dagster sensor ask, so they follow this one rule instead of a copy of it.

        The recovery rule, over the latest offset-log entry and the latest
        commit-log entry::

            latest = offsets.latest()          # may be None
            done   = commits.latest()          # may be None
            if latest is None:       plan batch 0 from the source's initial offsets
            elif done == latest:     plan batch latest+1 starting at offsets[latest].end
            elif done == latest - 1 or (done is None and latest == 0):
                                     REPLAY batch latest with exactly offsets[latest]
                                     and offsets[latest].batch_watermark_ms
            else:                    raise CheckpointCorrupt naming both ids

        A new batch is planned only if the source has data past the committed
        end, or if the watermark (re-evaluated now, so idle partitions stop
        holding it back) would close windows: an empty batch that emits. The
        pipeline fingerprint of the latest entry must match, and so must the
        source's identity it recorded (a replaced source stops the pipeline:
        its offsets point into the old one). ``position`` reads the two
        entries.
        """
        latest, done = self.position()
        done_id = done.batch_id if done else None
        if latest is None:
            if done is not None:
                raise CheckpointCorrupt(
                    f"commit log of {self.checkpoint.location} has batch {done_id} but the "
                    "offset log is empty: restore offsets/ or start over with `lowmark reset`"
                )
            start = self.start_offsets
            # A start that moves ("latest") is fixed by the first plan, a dry run's too:
            # asked anew by every plan, it would stay ahead of whatever lands in between.
            fixes = not dry_run or self.source.start_moves()
            if fixes and self.checkpoint.start_offsets is None:
                self.checkpoint.record_start_offsets(start)
            return self._plan_new(0, start, None, None, dry_run)
        if latest.pipeline_fingerprint != self.fingerprint:
            raise FingerprintMismatch(
                f"pipeline {self.pipeline.name} changed since its checkpoint "
                f"{self.checkpoint.location} was written (fingerprint "
                f"{latest.pipeline_fingerprint} -> {self.fingerprint}): restore the old "
                f"definition, or start over with `lowmark reset {self.pipeline.name} "
                "--truncate-sink`"
            )
        if done is not None and done.batch_id == latest.batch_id:
            return self._plan_new(latest.batch_id + 1, latest.end_offsets, latest, done, dry_run)
        if done_id == latest.batch_id - 1 or (done_id is None and latest.batch_id == 0):
            previous = done if done_id == latest.batch_id - 1 else None
            self._check_identity(latest)
            return PlannedBatch(
                latest.batch_id,
                latest.start_offsets,
                latest.end_offsets,
                latest.batch_watermark_ms,
                replay=True,
                planned_at_ms=_ms(latest.created_at),
                previous=previous,
                identity=latest.source_identity,
                skipped=_recorded_skip(latest),
                waiting=tuple(latest.waiting_partitions),
            )
        raise CheckpointCorrupt(
            f"checkpoint {self.checkpoint.location} is inconsistent: latest offsets batch "
            f"{latest.batch_id}, latest commit batch {done_id}; expected the commit to be "
            f"{latest.batch_id} or {latest.batch_id - 1}. Restore both logs from one backup, "
            "or start over with `lowmark reset`"
        )

    def _plan_new(
        self,
        batch_id: int,
        start: Offsets,
        latest: OffsetEntry | None,
        done: CommitEntry | None,
        dry_run: bool,
    ) -> PlannedBatch | None:
        identity = self._check_identity(latest)
        now = self.clock.now_ms()
        # Lost input is passed over by starting after it: the offset log shows the gap.
        skipped = self.source.past_lost(start)
        if skipped is not None:
            start = skipped.start
        end = self.source.plan(start, batch_id, record=not dry_run)
        waiting = self.source.waiting_partitions(end)
        watermark = done.next_watermark_ms if done else None
        if self.pipeline.event_time is not None and done is not None:
            parts = self.partition_times(done)
            active = self._with_records(Range(batch_id, start, end), waiting)
            watermark = pipeline_watermark(parts, self.pipeline.event_time, now, watermark, active)
        if end == start and skipped is None:
            previous_watermark = latest.batch_watermark_ms if latest else None
            if watermark is None or watermark == previous_watermark or self.stage is None:
                return None
            state_version = LATEST if done and "state" in done.table_versions else None
            if not self.stage.would_emit(state_version, watermark):
                return None
        return PlannedBatch(
            batch_id, start, end, watermark, False, now, done, identity, skipped, waiting
        )

    def _check_identity(self, latest: OffsetEntry | None) -> Identity:
        """The source's identity now, after checking it is the one ``latest`` recorded (or,
        before batch 0, the one the checkpoint's start offsets were read from)."""
        identity = self.source.identity()
        if latest is not None:
            read_up_to = f"batch {latest.batch_id}"
            check_identity(latest.source_identity, identity, read_up_to, self.pipeline.name)
        else:
            read_up_to = "the start offsets of this checkpoint (`lowmark reset --after-sink`)"
            check_identity(self.checkpoint.start_identity, identity, read_up_to, self.pipeline.name)
        return identity

    def position(self) -> tuple[OffsetEntry | None, CommitEntry | None]:
        """The latest offset-log and commit-log entries.

        Read once per runner: after its own commit (or a read where both are
        the same batch) a runner knows where it stands; a runner that raced
        it is still caught by the offset log.
        """
        if self._committed is not None:
            return self._committed
        latest = self.checkpoint.offsets.get_latest()
        done = self.checkpoint.commits.get_latest()
        self._check_tables_of(done)
        if latest is not None and done is not None and latest.batch_id == done.batch_id:
            self._committed = (latest, done)
        return latest, done

    def partition_times(self, committed: CommitEntry) -> dict[str, PartitionTime]:
        """Per-partition times as of ``committed``, which wrote them to the watermarks table."""
        if self._partitions is None:
            rows = (
                self.checkpoint.watermarks.at(committed.batch_id)
                if "watermarks" in committed.table_versions
                else []
            )
            self._partitions = {p: PartitionTime(p, max_ms, seen) for p, max_ms, _, seen in rows}
        return self._partitions

    def _check_tables_of(self, done: CommitEntry | None) -> None:
        """The state table the last commit wrote and the next batch reads must still be there.

        Without it the next batch would start from empty state: a silent
        restart from zero of what it holds.
        """
        if done is None or "state" not in done.table_versions or self.stage is None:
            return
        if not self.stage.state.table.exists():
            raise CheckpointMissing(
                f"window state table {self.stage.state.path} is missing, but commit "
                f"{done.batch_id} wrote it: restore it from backup, or start over with "
                "`lowmark reset`"
            )

    def run_batch(self, retry: bool = False) -> BatchResult | None:
        """Run (or replay) one micro-batch; None when there was nothing to run.

        Step 1. Plan: the recovery rule picks the batch, its offsets and watermark.
        Steps 2-8: ``_run``. A batch whose data work fails is recorded in the
        ``failures`` table; one that failed ``max_failed_attempts`` times is
        not run again (``PoisonBatch``, see ``batches.loop.poison``) unless
        ``retry`` (its transform was fixed), or until it is set aside. The
        same holds for operational errors, counted apart. A transient error
        (a broker away, a lost write conflict) is not recorded: the batch is
        planned and run again after each pause of ``TRANSIENT_PAUSES_S``
        (``sleep``), and the error raised once they are spent.
        """
        pauses = iter(TRANSIENT_PAUSES_S)
        while True:
            try:
                return self._attempt(retry)
            except Exception as exc:
                pause = next(pauses, None)
                if pause is None or failure_kind(exc) != "transient":
                    raise
                log.warning(
                    "pipeline %s: %s; trying the batch again in %g s",
                    self.pipeline.name,
                    first_line(exc),
                    pause,
                )
            # What this runner knew of the logs may be stale now: plan from them again
            # (a batch whose offsets were written is then replayed, exactly).
            self._committed, self._partitions = None, None
            self.sleep(pause)

    def _attempt(self, retry: bool) -> BatchResult | None:
        """One try at the next batch: plan, refuse a blocked one, run; a failure of the
        data or operational kind is recorded (``batches.loop.poison``)."""
        self.attempting = None
        timer = _StepTimer(self.clock)
        # Planning may record (a file source's discoveries, batch 0's start).
        self.checkpoint.fence()
        planned = self.plan_next_batch()
        if planned is None:
            return None
        timer.lap("plan")
        faults.reached("after_plan", planned.batch_id)
        self.attempting = planned
        if planned.replay and not retry:
            refuse_poison(self, planned)
        try:
            result = self._run(planned, timer)
        except Exception as exc:
            if self._interrupted:  # cancelled on purpose: no failure of the batch
                raise self.interrupted() from exc
            kind = failure_kind(exc)
            if kind == "data" or kind == "operational":
                self._record_failure(planned.batch_id, first_line(exc)[:1000], kind)
            raise
        self.attempting = None
        return result

    def _record_failure(self, batch_id: int, error: str, kind: FailureKind) -> None:
        """A row of the ``failures`` table, unless that table cannot take it (a damaged
        checkpoint may be why the batch failed): the batch's own error is what to raise."""
        try:
            self.checkpoint.failures.record(batch_id, self.runner_id, error, kind)
        except Exception as unrecorded:
            log.warning(
                "pipeline %s: the failure of batch %d was not recorded: %s",
                self.pipeline.name,
                batch_id,
                first_line(unrecorded),
            )

    def interrupt(self) -> None:
        """Stop now (Ctrl-C), from another thread: the Spark jobs of the batch in progress
        are cancelled and it raises ``Interrupted``, not counted as a failure; ``run``
        starts no batch after it. The next run replays the batch with the same offsets
        (every write is idempotent: what it wrote is kept, never written twice)."""
        self._interrupted = True
        self.spark.sparkContext.cancelAllJobs()

    def interrupted(self) -> Interrupted:
        """The error a run stops with after an interrupt (``interrupt``, or Ctrl-C)."""
        name = self.pipeline.name
        if self.attempting is None:
            return Interrupted(f"{name} was interrupted between batches: nothing is lost")
        return Interrupted(
            f"batch {self.attempting.batch_id} of {name} was interrupted before it committed; "
            f"nothing it wrote is lost: `lowmark run {name}` replays it"
        )

    def _run(self, planned: PlannedBatch, timer: _StepTimer) -> BatchResult:
        """Steps 2-8 of batch ``planned``, top to bottom.

        Step 2. Offset log: write batch N's offsets BEFORE processing (new batches only).
        Step 3. Read exactly [start, end) from the source and transform it (lazily).
        Step 4. Look at the batch in ONE Spark job: counts and max event time per
                partition, bad rows and, for windows, late rows and partials.
        Step 5. Event-time stage: the partials merged with the state rows they touch,
                read as of commit N-1 on the driver (one Spark job over local data).
        Step 6. Writes, each idempotent per batch: bad records, state, sink, late.
        Step 7. Commit log (with the next watermark), after the per-partition times.
        Step 8. Source commit (upstream may discard), maintenance every
                ``maintenance.every_batches`` batches, then the progress row.

        Only step 4, step 5 and a stateless sink's write run Spark jobs; every
        other read and write is a driver-side Delta operation (``state.table``).
        Before planning, step 2, step 6 and step 7 the runner checks that its
        checkpoint was not replaced meanwhile (``Checkpoint.fence``).
        """
        event_time = self.pipeline.event_time
        ckpt = self.checkpoint
        batch_id = planned.batch_id

        # Step 2. Offset log (write-ahead). A replay reuses the entry already there.
        offsets = OffsetEntry(
            batch_id=batch_id,
            runner_id=self.runner_id,
            created_at=_EPOCH + timedelta(milliseconds=planned.planned_at_ms),
            start_offsets=planned.start,
            end_offsets=planned.end,
            batch_watermark_ms=planned.watermark_ms,
            pipeline_fingerprint=self.fingerprint,
            source_identity=planned.identity,
            input_skipped=planned.skipped.counts if planned.skipped else {},
            waiting_partitions=list(planned.waiting),
        )
        if not planned.replay:
            if batch_id == 0:
                self._check_sink_is_ours()
            ckpt.fence()
            ckpt.offsets.claim(offsets)
            if planned.skipped is not None:
                log.warning(
                    "pipeline %s batch %d passes over input lost before it was read "
                    "(on_data_loss: skip): %s (%s)",
                    self.pipeline.name,
                    batch_id,
                    planned.skipped.what,
                    ", ".join(f"{n} {unit}" for unit, n in planned.skipped.counts.items()),
                )
        timer.lap("offset_log")
        faults.reached("after_offset_log", batch_id)

        # Step 3. Read and transform (lazy: nothing runs yet) — unless the catch-up
        # read-ahead (batches.loop.catch_up) already looked at exactly this range.
        batch = Range(batch_id, planned.start, planned.end)
        seen = (
            self.read_ahead.seen(batch, planned.watermark_ms, planned.planned_at_ms, planned.replay)
            if self.read_ahead is not None
            else None
        )
        taken: _Input | None = None
        if seen is None:
            # A stateless batch reads its input twice (counts, then the sink write):
            # the parse is cached for it.
            taken = self._input(
                batch,
                planned.watermark_ms,
                planned.planned_at_ms,
                cache=self.stage is None,
                strict=planned.replay and self._wrote_any(batch_id),
            )
            # Step 4. The batch's one job over its records, then its input is confirmed
            # unchanged by the read (nothing is written yet).
            seen = self._look(taken, planned)
            self.source.confirm(batch)
        timer.lap("read")
        faults.reached("after_read", batch_id)

        # Step 5. Event-time stage: merge with the state the batch touches (nothing written).
        previous_state = self._state_as_of(planned)
        changes: dict[str, pa.Table] = {}
        if seen.partials is not None:
            frames = taken.frames if taken is not None else None
            changes = self._windows(seen.partials, frames, planned, previous_state)
            rows_out = changes["output"].num_rows
        else:
            rows_out = seen.rows_out
        timer.lap("event_time")

        # Step 6. Writes: bad records, state, sink, late records.
        ckpt.fence()
        rows_in, bad, late = seen.rows_in, seen.bad, seen.late
        rows_bad = bad.num_rows if bad is not None else 0
        if bad is not None and rows_bad:
            ckpt.bad_records.append_once(bad, ckpt.txn_app_id("bad_records"), batch_id)
        versions: dict[str, int] = {}
        if self.stage is not None:
            state_version = self.stage.state.apply(changes["upserts"], changes["deletes"], batch_id)
            if state_version is not None:
                versions["state"] = state_version
        timer.lap("state")
        faults.reached("after_state", batch_id)
        sink = self.sink
        if isinstance(sink, WindowedSink):
            assert self.pipeline.aggregation is not None
            update = self.pipeline.aggregation.output_mode == "update"
            retract = changes["retract"] if update else None
            sink_version = sink.write(changes["output"], batch_id, retract)
        else:
            assert taken is not None  # a stateless batch always reads its input itself
            sink_rows, read = taken.out.drop(PARTITION_COLUMN), taken.read
            sink_version = _explained(read, lambda: sink.write(sink_rows, batch_id))
        if sink_version is not None:
            versions["sink"] = sink_version
        timer.lap("sink")
        faults.reached("after_sink", batch_id)
        rows_late = late.num_rows if late is not None else 0
        if late is not None and rows_late:
            ckpt.late.append_once(late, ckpt.txn_app_id("late"), batch_id)
        if taken is not None:
            taken.read.unpersist()
        timer.lap("late")
        faults.reached("after_late", batch_id)

        # Step 7. Commit log, with the watermark the next batch starts from.
        ckpt.fence()
        next_watermark = planned.watermark_ms
        partitions: dict[str, PartitionTime] = {}
        if event_time is not None:
            known = self.partition_times(planned.previous) if planned.previous else {}
            partitions = observe(known, seen.max_event_ms, planned.planned_at_ms)
            next_watermark = pipeline_watermark(
                partitions,
                event_time,
                planned.planned_at_ms,
                planned.watermark_ms,
                self._with_records(batch, planned.waiting),
            )
            versions["watermarks"] = ckpt.watermarks.write(
                batch_id,
                [
                    (
                        p,
                        t.max_event_time_ms,
                        t.watermark_ms(event_time),
                        t.last_seen_ms,
                    )
                    for p, t in sorted(partitions.items())
                ],
            )
        commit = CommitEntry(
            batch_id=batch_id,
            runner_id=self.runner_id,
            next_watermark_ms=next_watermark,
            table_versions=versions,
            rows_in=rows_in + rows_bad,
            rows_out=rows_out,
            rows_bad=rows_bad,
            rows_late=rows_late,
            rows_dropped=rows_in - seen.rows_out,
            rows_windowed=seen.rows_out - rows_late if self.stage is not None else 0,
            rows_closed=_total(changes["closed"], ROWS) if self.stage is not None else 0,
        ).plus_totals(planned.previous)
        faults.reached("before_commit", batch_id)
        ckpt.commits.claim(commit)
        self._committed = (offsets, commit)
        self._partitions = partitions if event_time is not None else None
        timer.lap("commit")
        faults.reached("after_commit", batch_id)

        # Step 8. Source commit; every `every_batches` batches, checkpoint maintenance
        # (old log rows go, small files merge); then progress (descriptive only).
        lag_ms = planned.planned_at_ms - next_watermark if next_watermark is not None else None
        self.source.commit(planned.end)
        timer.lap("source_commit")
        maintenance = self.pipeline.maintenance
        if (batch_id + 1) % maintenance.every_batches == 0:
            state = self.stage.state.table if self.stage else None
            maintain_after(ckpt, self.source, batch, maintenance, state, versions.get("state"))
            timer.lap("maintenance")
        ckpt.progress.add(
            ProgressEntry(
                batch_id=batch_id,
                runner_id=self.runner_id,
                replayed=planned.replay,
                durations_ms=timer.durations,
                rows_in=rows_in + rows_bad,
                rows_out=rows_out,
                rows_bad=rows_bad,
                rows_late=rows_late,
                watermark_ms=planned.watermark_ms,
                lag_ms=lag_ms,
                input_skipped=planned.skipped.counts if planned.skipped else {},
            )
        )
        log.info("pipeline %s committed batch %d", self.pipeline.name, batch_id)
        return BatchResult(
            batch_id,
            planned.replay,
            planned.start,
            planned.end,
            rows_in + rows_bad,
            rows_out,
            rows_bad,
            rows_late,
            next_watermark,
            lag_ms,
            timer.durations,
        )

    def _check_sink_is_ours(self) -> None:
        """Before a checkpoint's first batch: its sink must be a folder (or nothing yet), and
        must not hold another checkpoint's writes, or the source, read from the start again,
        would land in it twice. A custom sink's history is not lowmark's to read: the
        sink checks its own."""
        if not isinstance(self.sink, DeltaTableSink | DeltaWindowSink):
            return
        if Path(self.sink.path).is_file():
            raise SinkNotATable(
                f"sink {self.sink.path} of {self.pipeline.name} is a file, not a folder a "
                "Delta table can live in: point the pipeline's sink path at a folder, or move "
                "the file away"
            )
        writer = last_writer(self.sink.path)
        ours = {self.checkpoint.pipeline_id, self.checkpoint.adopted_from}
        if writer is None or writer.pipeline_id in ours:
            return
        location = self.checkpoint.location
        holder = sink_holder(location, writer)
        raise SinkHeldElsewhere(
            held_elsewhere(self.pipeline, location, self.sink.path, writer, holder)
        )

    def _state_as_of(self, planned: PlannedBatch) -> int | None:
        """The state version batch ``planned`` starts from: the newest (``LATEST``), or, for
        a replay whose own state write landed, the one commit N-1 recorded (None: no state
        yet). See ``state.window_state``."""
        recorded = planned.previous.table_versions.get("state") if planned.previous else None
        if recorded is None or self.stage is None:
            return None
        state = self.stage.state
        if planned.replay and state.table.landed(state.txn_app_id, planned.batch_id):
            return recorded
        return LATEST

    def _wrote_any(self, batch_id: int) -> bool:
        """True if a write of batch ``batch_id`` landed (its replay must read what it read)."""
        ckpt = self.checkpoint
        written = [
            (ckpt.bad_records, ckpt.txn_app_id("bad_records")),
            (ckpt.late, ckpt.txn_app_id("late")),
            (ckpt.watermarks.table, ckpt.txn_app_id("watermarks")),
        ]
        if self.stage is not None:
            written.append((self.stage.state.table, self.stage.state.txn_app_id))
        if any(table.landed(app_id, batch_id) for table, app_id in written):
            return True
        return self.sink.landed(batch_id) is not False  # a sink that cannot tell may have

    def _input(
        self,
        batch: Range,
        watermark_ms: int | None,
        now_ms: int,
        cache: bool = False,
        strict: bool = False,
        observe: bool = True,
    ) -> _Input:
        """Step 3 for ``batch``: its read, transformed records and (windowed) stage frames,
        all lazy (``observe``: see ``WindowedStage.batch_frames``)."""
        read = self.source.read(batch.start, batch.end, batch.batch_id, cache, strict)
        out = self._transformed(read, batch)
        frames = (
            self.stage.batch_frames(
                out, watermark_ms, batch.batch_id, self._partitions_of(batch), now_ms, observe
            )
            if self.stage is not None
            else None
        )
        return _Input(read, out, frames)

    def _transformed(self, read: SourceRead, batch: Range) -> DataFrame:
        """The records of ``read`` (of ``batch``'s range) after the pipeline's transform."""
        out = self.pipeline.transform(read.records) if self.pipeline.transform else read.records
        if PARTITION_COLUMN not in out.columns:
            # A transform that selected its columns dropped the partition; when the batch
            # reads one partition (or none: no records) there is nothing to lose by
            # putting it back.
            moved = self._partitions_of(batch)
            if len(moved) <= 1:
                partition = F.lit(moved[0] if moved else None).cast("string")
                out = out.withColumn(PARTITION_COLUMN, partition)
        return out

    def _partitions_of(self, batch: Range) -> tuple[str, ...]:
        """The source partitions ``batch`` takes records from."""
        return self.source.partitions(batch.start, batch.end)

    def _with_records(self, batch: Range, waiting: Sequence[str]) -> frozenset[str]:
        """The partitions that had records waiting when ``batch`` was planned: those it takes
        records from and those with records past its end (``waiting``). None of them is
        idle for its watermarks, however long ago it was last read."""
        return frozenset(self._partitions_of(batch)) | frozenset(waiting)

    def _unwatermarked(
        self, batches: Sequence[Range], now_ms: int
    ) -> tuple[SourceRead, BatchFrames] | None:
        """Step 3 with no watermark and nothing observed, as the catch-up read-ahead looks:
        of one batch, or of several in one read, each record tagged with its batch. None
        when the source cannot tag, or the transform may not keep the tag row by row
        (``catch_up.row_by_row``): each batch is then looked at on its own."""
        assert self.stage is not None
        if len(batches) == 1:
            taken = self._input(batches[0], None, now_ms, observe=False)
            assert taken.frames is not None
            return taken.read, taken.frames
        read = self.source.read_batches(batches)
        if read is None:
            return None
        whole = Range(batches[0].batch_id, batches[0].start, batches[-1].end)
        out = self._transformed(read, whole)
        if not row_by_row(out, read.records):
            return None
        frames = self.stage.batch_frames(
            out, None, whole.batch_id, self._partitions_of(whole), now_ms, observe=False
        )
        return read, frames

    def _look(self, taken: _Input, planned: PlannedBatch) -> Seen:
        """Step 4: what the batch's records give, in one Spark job when all is well.

        Windowed: the job computes the partials while Spark observes the
        input's counts, the late rows (collected as they are read) and each
        partition's max event time. Only when it saw bad rows (or could not
        observe: see ``collect.observed``) does a second job read the input
        again, cached, for those rows; it must find as many rows and late rows
        as the first saw (a transform must be deterministic). No input, no
        job. Stateless: one job over the cached input (the sink write reads it
        again).
        """
        read, frames = taken.read, taken.frames
        if frames is None:
            return self._counted(read, taken.out, None, planned)
        if planned.start == planned.end:
            return Seen(0, None, None, {}, 0, empty_of(frames.partials))
        with shuffle_partitions(self.spark, read.size_bytes):
            partials = _explained(read, lambda: collect({"partials": frames.partials}))
        counts, stats = observed(read.counts), frames.stats()
        if counts is not None and stats is not None and not counts.get("bad"):
            late = None
            if stats.late and stats.late_records is not None:
                late = late_table(stats.late_records, planned.batch_id, planned.watermark_ms)
            return Seen(counts["rows"], None, late, stats.max_ms, stats.rows, partials["partials"])
        again = self._input(
            Range(planned.batch_id, planned.start, planned.end),
            planned.watermark_ms,
            planned.planned_at_ms,
            cache=True,
        )
        assert again.frames is not None
        seen = self._counted(again.read, again.out, again.frames.late, planned)
        seen_late = seen.late.num_rows if seen.late is not None else 0
        if stats is not None and (seen.rows_out, seen_late) != (stats.rows, stats.late):
            raise PipelineConfigInvalid(
                f"the transform of {self.pipeline.name} gave batch {planned.batch_id} "
                f"{stats.rows} records ({stats.late} late) in one job and {seen.rows_out} "
                f"({seen_late} late) in another over the same input: make it deterministic "
                "(no rand(), no current time, no reads of changing tables)"
            )
        return dataclasses.replace(seen, partials=partials["partials"])

    def _counted(
        self, read: SourceRead, out: DataFrame, late: DataFrame | None, planned: PlannedBatch
    ) -> Seen:
        """One job over ``read`` (cached): counts, max event times, bad rows and ``late``."""
        event_time = self.pipeline.event_time
        parts: dict[str, DataFrame] = {
            "input": read.records.agg(F.count(F.lit(1)).alias("rows")),
            "output": (
                partition_max_event_ms(out, event_time, planned.planned_at_ms)
                if event_time is not None
                else out.agg(F.count(F.lit(1)).alias("rows"))
            ),
        }
        if read.bad is not None:
            parts["bad"] = read.bad
        if late is not None:
            parts["late"] = late
        try:
            with shuffle_partitions(self.spark, read.size_bytes):
                seen = _explained(read, lambda: collect(parts))
        finally:
            if late is not None:  # the windowed fallback: nothing else reads the cache
                read.unpersist()
        max_ms: dict[str, int] = {}
        if event_time is not None:
            stats = seen["output"].to_pylist()
            max_ms = {r[PARTITION_COLUMN]: r["max_ms"] for r in stats if r["max_ms"] is not None}
        return Seen(
            _total(seen["input"], "rows"),
            seen.get("bad"),
            seen.get("late"),
            max_ms,
            _total(seen["output"], "rows"),
            None,
        )

    def _windows(
        self,
        partials: pa.Table,
        frames: BatchFrames | None,
        planned: PlannedBatch,
        state_version: int | None,
    ) -> dict[str, pa.Table]:
        """The batch's window changes (upserts, deletes, output, retract, closed) as Arrow
        tables.

        The state rows the partials touch and those the watermark makes final
        are read on the driver as of ``state_version``; the merge runs there too
        when the aggregates allow, else as one Spark job over that local data.
        """
        assert self.stage is not None
        nearby, final = self.stage.state_rows(partials, state_version, planned.watermark_ms)
        if self.stage.merges_on_driver:
            return self.stage.merge_on_driver(partials, nearby, final, planned.batch_id)
        assert frames is not None  # batches merged in Spark never take a read-ahead
        schema = frames.partials.schema
        local = to_frame(self.spark, partials, schema)
        merged = self.stage.merge(
            local,
            to_frame(self.spark, nearby, schema) if nearby is not None else None,
            to_frame(self.spark, final, schema) if final is not None else None,
            planned.batch_id,
        )
        return collect(
            {
                "upserts": merged.upserts,
                "deletes": merged.deletes,
                "output": merged.output,
                "retract": merged.retract,
                "closed": merged.closed,
            }
        )

    def run(
        self,
        max_batches: int | None = 1,
        max_seconds: float | None = None,
        on_batch: Callable[[BatchResult], None] | None = None,
        retry: bool = False,
    ) -> list[BatchResult]:
        """Run batches until caught up, ``max_batches`` ran, or ``max_seconds`` passed.

        ``max_batches=None`` means no limit (drain until caught up). ``retry``:
        the first batch runs even if it is a poison batch (``run_batch``).
        """
        started = self.clock.now_ms()
        results: list[BatchResult] = []
        while (max_batches is None or len(results) < max_batches) and not self._interrupted:
            if max_seconds is not None and self.clock.now_ms() - started >= max_seconds * 1000:
                break
            result = self.run_batch(retry=retry and not results)
            if result is None:
                break
            results.append(result)
            if on_batch:
                on_batch(result)
        return results


def sink_holder(location: str, writer: Writer) -> Found | None:
    """The checkpoint of ``writer`` when it is beside the checkpoint ``location`` (every
    pipeline's, and the ones ``lowmark reset`` moved aside, are by default)."""
    return find_checkpoint(os.path.dirname(location.rstrip("/")), writer.pipeline_id)


def held_elsewhere(
    pipeline: Pipeline, location: str, sink: str, writer: Writer, found: Found | None
) -> str:
    """Why ``pipeline`` (checkpoint ``location``) may not write ``sink``, whose last
    lowmark writer is another checkpoint's, ``writer`` (at ``found``: ``sink_holder``),
    and the ways on.

    The advice never empties another pipeline's data: a reset of this
    pipeline only when the writer is one of its own old checkpoints; another
    pipeline's sink wants a sink path of its own.
    """
    name = pipeline.name
    held = f"up to its batch {writer.batch_id}"
    if found is not None and found.pipeline_name != name:
        return (
            f"sink {sink} is pipeline {found.pipeline_name}'s (checkpoint {found.location}, "
            f"{held}): {name} must not write it too; give {name} a sink path of its own"
        )
    if found is not None:
        return (
            f"sink {sink} holds the writes of {name}'s old checkpoint {found.location} "
            f"({held}), and this new checkpoint would write its input again: run `lowmark "
            f"reset {name} --after-sink` to go on after the sink's data, or `lowmark reset "
            f"{name} --truncate-sink` to empty it and start from the beginning"
        )
    return (
        f"sink {sink} holds the writes of checkpoint {writer.pipeline_id} ({held}), found "
        f"nowhere beside {location}: if it was {name}'s, put it back at {location} and run "
        f"`lowmark reset {name} --after-sink` to go on after the sink's data; if another "
        f"pipeline writes this sink, give {name} a sink path of its own"
    )


@dataclass(frozen=True)
class _Input:
    """Step 3 of a batch: lazy frames over its input."""

    read: SourceRead
    out: DataFrame
    """The transformed records."""
    frames: BatchFrames | None
    """Windowed: the stage's frames over ``out``."""


def _explained(read: SourceRead, job: Callable[[], T]) -> T:
    """Run a Spark ``job`` over the batch's input, naming the input file it could not read."""
    try:
        return job()
    except (Py4JJavaError, PySparkException) as exc:
        error = read.explain(exc)
        if error is None:
            raise
        read.unpersist()
        raise error from exc


def _recorded_skip(entry: OffsetEntry) -> Skipped | None:
    """The input batch ``entry`` passed over, as its offset-log entry recorded it."""
    if not entry.input_skipped:
        return None
    return Skipped(entry.start_offsets, entry.input_skipped, "as recorded in the offset log")


def _total(table: pa.Table, column: str) -> int:
    return int(sum(v for v in table.column(column).to_pylist() if v is not None))


def _ms(moment: datetime) -> int:
    """Epoch milliseconds of ``moment``, exactly (no float rounding: a replay must plan
    with the very processing time the batch was planned with)."""
    return (moment - _EPOCH) // timedelta(milliseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _StepTimer:
    """Milliseconds spent in each named step, measured with the injected clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.last = clock.now_ms()
        self.started = self.last
        self.durations: dict[str, int] = {}

    def lap(self, step: str) -> None:
        now = self.clock.now_ms()
        self.durations[step] = now - self.last
        self.durations["total"] = now - self.started
        self.last = now
