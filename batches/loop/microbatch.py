"""The micro-batch loop: plan, write ahead, read, transform, sink, commit.

``MicroBatchRunner._batch`` is one micro-batch, top to bottom, in numbered
steps 1-8. Its parts come from ``lowmark.batches.loop.parts``: the planner holds the
recovery rule (``lowmark.batches.loop.plan``), the Spark work of steps 3-5 is
``lowmark.batches.loop.batch_work``, and step 7 is the one commit path
(``lowmark.batches.loop.commit``). Listeners (``lowmark.batches.loop.listeners``) are told when a
batch starts (after step 1), commits (after step 8) or fails, and when the runner
stops (the end of its ``with`` block).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from types import TracebackType

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from lowmark.batches.clock import Clock, SystemClock
from lowmark.batches.errors import ExpectationsFailed, Interrupted, PoisonBatch
from lowmark.batches.event_time.stage import WindowedStage
from lowmark.batches.expectations import PARSABLE, bad_rows
from lowmark.batches.loop import faults
from lowmark.batches.loop.batch_work import Taken, explained, total
from lowmark.batches.loop.catch_up import Seen
from lowmark.batches.loop.commit import commit_batch
from lowmark.batches.loop.events import BatchFailure, BatchResult, BatchStarted, RunTerminated
from lowmark.batches.loop.listeners import Listeners, PipelineListener, configured_listeners
from lowmark.batches.loop.maintenance import maintain_after
from lowmark.batches.loop.parts import BatchParts, build_parts
from lowmark.batches.loop.plan import PlannedBatch, Planner
from lowmark.batches.loop.poison import TRANSIENT_PAUSES_S, failure_kind, failure_report
from lowmark.batches.loop.preflight import check_definition
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.sinks import Sink, WindowedSink
from lowmark.batches.sources import Source
from lowmark.batches.sources.base import PARTITION_COLUMN
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.commit_log import BatchCounts
from lowmark.state.errors import first_line
from lowmark.state.failures import FailureKind
from lowmark.state.log import EPOCH
from lowmark.state.offset_log import OffsetEntry, Offsets
from lowmark.state.progress import ProgressEntry
from lowmark.state.session import SparkLike, StartedOnUse, is_remote_session
from lowmark.state.window_state import ROWS

log = logging.getLogger(__name__)


class MicroBatchRunner:
    """Runs the micro-batches of one pipeline against its checkpoint.

    One runner per pipeline at a time; a second one is detected when it
    writes the offset log and stops with ConcurrentRunner. A runner whose
    checkpoint ``lowmark reset`` replaced stops with CheckpointReplaced.
    ``parts`` (default: ``build_parts`` over ``data_root``) are what it runs
    with: tests give their own (another source, say) instead of patching it.
    ``listeners`` are told of its batches (``lowmark.batches.loop.listeners``), after
    those the pipeline's ``listeners`` names; ``with runner:`` tells them when it
    stops.
    """

    def __init__(
        self,
        spark: SparkLike,
        pipeline: Pipeline,
        data_root: Path,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
        parts: BatchParts | None = None,
        listeners: Sequence[PipelineListener] = (),
    ) -> None:
        self.pipeline = pipeline
        self.clock = clock or SystemClock()
        self._spark = StartedOnUse(spark, self.clock.now_ms)
        """Spark, started by the first step that needs it (none: a run with nothing to do)."""
        self.sleep = sleep
        """Waits between tries of a batch after a transient error (tests: no real wait)."""
        self.parts = parts or build_parts(self._spark, pipeline, data_root, self.clock)
        self.data_root = data_root
        self._checked = False
        """Whether the definition was checked against the input and the sink (once, before
        the run's first Spark job: ``lowmark.batches.loop.preflight``)."""
        self.attempting: PlannedBatch | None = None
        """The batch the last ``run_batch`` was running when it raised (None: it did not)."""
        self._interrupted = False
        self.runner_id = str(uuid.uuid4())
        self.listeners = Listeners([*configured_listeners(pipeline), *listeners])

    def add_listener(self, listener: PipelineListener) -> None:
        """Tell ``listener`` of this runner's batches from now on."""
        self.listeners.add(listener)

    def remove_listener(self, listener: PipelineListener) -> None:
        self.listeners.remove(listener)

    def __enter__(self) -> MicroBatchRunner:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Tells the listeners the runner stopped, and why (the error, if any)."""
        error = first_line(exc) if exc is not None else None
        self.listeners.run_terminated(RunTerminated(self.pipeline.name, self.runner_id, error))

    @property
    def spark(self) -> SparkSession:
        """The session, started on first use."""
        return self._spark()

    # The parts by name: what callers (the CLI, Dagster, tests) look at.

    @property
    def checkpoint(self) -> Checkpoint:
        return self.parts.checkpoint

    @property
    def source(self) -> Source:
        return self.parts.source

    @property
    def stage(self) -> WindowedStage | None:
        return self.parts.stage

    @property
    def sink(self) -> Sink | WindowedSink:
        return self.parts.sink

    @property
    def planner(self) -> Planner:
        return self.parts.planner

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

    def run_batch(self, retry: bool = False) -> BatchResult | None:
        """Run (or replay) one micro-batch (``_batch``); None when there was nothing to run.

        A batch whose data work fails is recorded in the ``failures`` table;
        one that failed ``max_failed_attempts`` times is not run again
        (``PoisonBatch``, see ``lowmark.batches.loop.poison``) unless ``retry`` (its
        transform was fixed), or until it is set aside. The same holds for
        operational errors, counted apart. A transient error (a broker away, a
        lost write conflict) is not recorded: the batch is planned and run
        again after each pause of ``TRANSIENT_PAUSES_S`` (``sleep``), and the
        error raised once they are spent.
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
            self.parts.planner.forget()
            self.sleep(pause)

    def _attempt(self, retry: bool) -> BatchResult | None:
        """One try at the next batch (``_batch``); a failure of the data or operational kind,
        once the batch is planned, is recorded (``lowmark.batches.loop.poison``)."""
        self.attempting = None
        try:
            result = self._batch(retry)
        except Exception as exc:
            planned = self.attempting
            if planned is None:  # planning failed: no batch to count it against
                raise
            if self._interrupted:  # cancelled on purpose: no failure of the batch
                raise self.interrupted() from exc
            kind = failure_kind(exc)
            if kind == "data" or kind == "operational":
                self._record_failure(planned.batch_id, first_line(exc)[:1000], kind)
            if kind != "none":  # else the batch did not fail: the run stops (its end says why)
                failure = BatchFailure(self.pipeline.name, planned.batch_id, kind, first_line(exc))
                self.listeners.batch_failed(failure)
            raise
        self.attempting = None
        return result

    def _batch(self, retry: bool) -> BatchResult | None:
        """Steps 1-8 of the next batch, top to bottom; None when there is nothing to run.

        Step 1. Plan: the recovery rule picks the batch, its offsets and watermark
                (``Planner.next_batch``); a blocked batch is refused unless ``retry``.
        Step 2. Offset log: write batch N's offsets BEFORE processing (new batches only).
        Step 3. Read exactly [start, end) from the source and transform it (lazily).
        Step 4. Look at the batch in ONE Spark job: counts and max event time per
                partition, bad rows, each expectation's violations and dropped records
                and, for windows, late rows and partials; a batch that breaks its
                expectations fails here, before anything is written. A stateless batch
                that nothing found here could stop writes its sink in that job: the
                write observes it all (``lowmark.batches.loop.one_job``).
        Step 5. Event-time stage: the partials merged with the state rows they touch,
                read as of commit N-1 on the driver (one Spark job over local data).
        Step 6. Writes, each idempotent per batch: bad records (rows that did not parse,
                and those expectations dropped), state (window state, the ids
                deduplication let through), sink, late.
        Step 7. Commit log (with the next watermark), after the per-partition times.
        Step 8. Source commit (upstream may discard), maintenance every
                ``maintenance.every_batches`` batches, then the progress row.

        Only steps 3-5 (``lowmark.batches.loop.batch_work``) and a stateless sink's write
        run Spark jobs; every other read and write is a driver-side Delta
        operation (``lowmark.state.table``). Before planning, step 2, step 6 and step 7
        the runner checks that its checkpoint was not replaced meanwhile
        (``Checkpoint.fence``).
        """
        parts, ckpt = self.parts, self.parts.checkpoint
        timer = _StepTimer(self.clock, self._spark)

        # Step 1. Plan. Planning may record (a file source's discoveries, batch 0's start).
        ckpt.fence()
        nxt = parts.planner.next_batch(retry=retry)
        planned = nxt.planned
        if planned is None:
            return None
        batch_id = planned.batch_id
        timer.lap("plan")
        faults.reached("after_plan", batch_id)
        if not self._checked:
            # Before anything is written or Spark starts; no failed attempt is recorded:
            # the definition, not the batch, is at fault.
            inputs = parts.source.inputs(planned.start, planned.end)
            check_definition(self.pipeline, parts.source, inputs, self.data_root, batch_id)
            self._checked = True
        self.attempting = planned
        if nxt.blocked is not None:
            raise PoisonBatch(nxt.blocked)
        self.listeners.batch_started(
            BatchStarted(
                self.pipeline.name,
                batch_id,
                planned.replay,
                planned.watermark_ms,
                planned.planned_at_ms,
            )
        )

        # Step 2. Offset log (write-ahead). A replay reuses the entry already there.
        offsets = OffsetEntry(
            batch_id=batch_id,
            runner_id=self.runner_id,
            created_at=EPOCH + timedelta(milliseconds=planned.planned_at_ms),
            start_offsets=planned.start,
            end_offsets=planned.end,
            batch_watermark_ms=planned.watermark_ms,
            pipeline_fingerprint=parts.planner.fingerprint,
            pipeline_definition=parts.planner.definition,
            source_identity=planned.identity,
            input_skipped=planned.skipped.counts if planned.skipped else {},
            waiting_partitions=list(planned.waiting),
            ingestion_ms=planned.ingestion,
            window_watermark_ms=planned.window_watermark,
            dimension_versions=planned.dimension_versions,
        )
        if not planned.replay:
            if batch_id == 0:  # every sink (a fan-out: each) holds no other checkpoint's writes
                parts.sink.check_ours(self.pipeline, ckpt)
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
        # read-ahead (lowmark.batches.loop.catch_up) already looked at exactly this range. Spark
        # starts here, if no batch of this runner needed it before.
        self._spark()
        batch = planned.range
        parts.sink.begin(batch_id, planned.replay)  # before the sink can be written (step 4)
        seen = (
            parts.read_ahead.seen(
                batch, planned.watermark_ms, planned.planned_at_ms, planned.replay, planned.clocks
            )
            if parts.read_ahead is not None
            else None
        )
        taken: Taken | None = None
        written: tuple[Taken, Seen, int | None] | None = None
        if seen is None:
            # Step 4. The batch's one job over its records, then its input is confirmed
            # unchanged by the read. A stateless batch that nothing it finds can stop
            # has its sink written by that job (lowmark.batches.loop.one_job); otherwise
            # nothing is written yet.
            one_job = parts.work.in_one_job(planned)
            taken = parts.work.take(planned, one_job)
            if one_job:
                ckpt.fence()  # as before any write
                stateless = parts.sink
                assert isinstance(stateless, Sink)

                def write(rows: DataFrame) -> int | None:
                    return stateless.write(rows, batch_id)

                written = parts.work.write_looking(taken, planned, write)
            if written is not None:
                taken, seen, _ = written
            else:
                if one_job:  # a row that did not parse stopped it before its write landed
                    taken = parts.work.take(planned)
                seen = parts.work.look(taken, planned)
            parts.source.confirm(batch)
        # Then the expectations' verdict: a batch that breaks them fails here, before
        # anything is written (lowmark.batches.expectations).
        parsed_bad = seen.bad.num_rows if seen.bad is not None else 0
        dropped = seen.dropped.num_rows if seen.dropped is not None else 0
        rows_in, rows_bad = seen.rows_in + parsed_bad, parsed_bad + dropped
        violations = {PARSABLE: parsed_bad, **seen.violations}
        try:
            parts.work.checks.verdict(batch_id, rows_in, rows_bad, violations)
        except ExpectationsFailed:
            if taken is not None:
                taken.read.unpersist()
            raise
        timer.lap("read")
        faults.reached("after_read", batch_id)

        # Step 5. Event-time stage: merge with the state the batch touches (nothing written).
        changes = (
            parts.work.windows(seen.partials, taken, planned) if seen.partials is not None else None
        )
        join, joined = parts.work.join, None
        if join is not None:  # a join's records meet the rows it holds
            joined = parts.work.joined(seen, planned)
        rows_out = changes.output.num_rows if changes is not None else seen.rows_out
        if joined is not None:
            rows_out = joined.rows_out
        if seen.emitted is not None and changes is None:  # the sink gets the processor's rows
            rows_out = seen.emitted
        timer.lap("event_time")

        # Step 6. Writes: bad records, state, sink, late records.
        ckpt.fence()
        bad, late = bad_rows(seen.bad, seen.dropped, batch_id), seen.late
        if joined is not None and joined.late is not None:  # a join's rows below the watermark
            late = joined.late if late is None else pa.concat_tables([late, joined.late])
        if bad is not None:
            ckpt.bad_records.append_once(bad, ckpt.txn_app_id("bad_records"), batch_id)
        if parts.stage is not None and changes is not None:
            parts.stage.state.apply(changes.upserts, changes.deletes, batch_id)
        dedup = parts.work.dedup
        if dedup is not None and seen.judged is not None:
            if seen.judged.id_files:
                dedup.seen_ids.commit(seen.judged.id_files, batch_id)
            dedup.seen_ids.purge(planned.watermark_ms, batch_id)
        keyed, next_timer_ms = parts.work.keyed, None
        if keyed is not None and seen.keyed is not None:
            ran_at = keyed.ran_at(planned.watermark_ms, planned.planned_at_ms)
            keyed.tables.write(seen.keyed.files, batch_id, ran_at)
            next_timer_ms = keyed.tables.next_pending(ran_at)
        if join is not None and joined is not None:
            join.state.write(joined.state, batch_id, joined.evict_below)
        # The commit records every state table's version after the batch: what the next
        # batch's replay reads (lowmark.state.state_table).
        versions = {
            state.role: version
            for state in parts.work.state_tables
            if (version := state.version_after()) is not None
        }
        timer.lap("state")
        faults.reached("after_state", batch_id)
        sink = parts.sink
        if isinstance(sink, WindowedSink) and joined is not None:  # on the driver already
            sink_version = sink.write(joined.output, batch_id)
        elif isinstance(sink, WindowedSink):
            assert changes is not None  # a windowed batch always has its window changes
            assert self.pipeline.aggregation is not None
            update = self.pipeline.aggregation.output_mode == "update"
            retract = changes.retract if update else None
            sink_version = sink.write(changes.output, batch_id, retract)
        elif written is not None:  # in step 4
            sink_version = written[2]
        else:
            assert taken is not None  # a stateless batch always reads its input itself
            read = taken.read
            sink_rows = taken.out.drop(PARTITION_COLUMN)
            sink_version = explained(read, lambda: sink.write(sink_rows, batch_id))
        if sink_version is not None:
            versions["sink"] = sink_version
        timer.lap("sink")
        faults.reached("after_sink", batch_id)
        rows_late = late.num_rows if late is not None else 0
        duplicates = seen.judged.duplicates if seen.judged is not None else 0
        too_old = seen.judged.late.num_rows if seen.judged is not None else 0
        # Late rows are records set aside before the windows (too old for deduplication,
        # or for a keyed step) and rows the windows refused: records, or behind a keyed
        # step the processor's rows (``emitted``).
        behind = seen.keyed.late.num_rows if seen.keyed is not None else 0
        into_windows = seen.emitted if seen.emitted is not None else seen.rows_out
        if late is not None and rows_late:
            ckpt.late.append_once(late, ckpt.txn_app_id("late"), batch_id)
        if taken is not None:
            taken.read.unpersist()
        timer.lap("late")
        faults.reached("after_late", batch_id)

        # Step 7. Commit log, with the watermark the next batch starts from, after the
        # per-partition times (lowmark.batches.loop.commit).
        ckpt.fence()
        partitions, next_watermark = parts.planner.times_after(planned, seen.max_event_ms)
        counts = BatchCounts(
            rows_in=rows_in,
            rows_out=rows_out,
            rows_bad=rows_bad,
            rows_late=rows_late,
            rows_dropped=seen.rows_in - seen.rows_out - dropped - duplicates - too_old,
            violations=violations,
            rows_windowed=(
                into_windows - (rows_late - too_old - behind) if parts.stage is not None else 0
            ),
            rows_closed=total(changes.closed, ROWS) if changes is not None else 0,
            rows_duplicate=duplicates,
            rows_keyed=(
                seen.keyed.records
                if seen.keyed is not None
                else (joined.records if joined is not None else 0)
            ),
            rows_emitted=seen.emitted or 0,
        )
        commit = commit_batch(
            ckpt,
            self.pipeline,
            planned,
            self.runner_id,
            next_watermark,
            versions,
            partitions,
            counts,
            next_timer_ms,
        )
        parts.planner.committed(offsets, commit, partitions)
        timer.lap("commit")
        faults.reached("after_commit", batch_id)

        # Step 8. Source commit; every `every_batches` batches, checkpoint maintenance
        # (old log rows go, small files merge); then progress (descriptive only), which
        # the listeners are told of.
        lag_ms = planned.planned_at_ms - next_watermark if next_watermark is not None else None
        parts.source.commit(planned.end)
        timer.lap("source_commit")
        maintenance = self.pipeline.maintenance
        if (batch_id + 1) % maintenance.every_batches == 0:
            declared = self.pipeline.keyed
            expiry = declared.expiry(planned.planned_at_ms, next_watermark) if declared else None
            maintain_after(ckpt, parts.source, batch, maintenance, versions, expiry)
            timer.lap("maintenance")
        ckpt.progress.add(
            ProgressEntry(
                batch_id=batch_id,
                runner_id=self.runner_id,
                replayed=planned.replay,
                durations_ms=timer.durations,
                rows_in=counts.rows_in,
                rows_out=rows_out,
                rows_bad=rows_bad,
                rows_late=rows_late,
                rows_duplicate=duplicates if parts.work.dedup is not None else None,
                violations=violations,
                watermark_ms=planned.watermark_ms,
                lag_ms=lag_ms,
                input_skipped=planned.skipped.counts if planned.skipped else {},
            )
        )
        log.info("pipeline %s committed batch %d", self.pipeline.name, batch_id)
        result = BatchResult(
            self.pipeline.name,
            batch_id,
            planned.replay,
            planned.start,
            planned.end,
            counts.rows_in,
            rows_out,
            rows_bad,
            rows_late,
            next_watermark,
            lag_ms,
            timer.durations,
            violations,
            committed_at_ms=self.clock.now_ms(),
            backlog=self._backlog(planned.end) if self.listeners.want_backlog else None,
            rows_duplicate=duplicates if parts.work.dedup is not None else None,
            ingestion_ms=planned.ingestion,
        )
        self.listeners.batch_progress(result)
        return result

    def _backlog(self, end: Offsets) -> dict[str, int] | None:
        """What waits in the source past ``end`` (``Source.backlog``), for the listeners;
        None when the source cannot say now: a listener's number never fails a batch."""
        try:
            return self.parts.source.backlog(end)
        except Exception as exc:
            log.warning(
                "pipeline %s: the backlog after the batch is unknown: %s",
                self.pipeline.name,
                first_line(exc),
            )
            return None

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

    def failure_report(self, exc: Exception) -> str | None:
        """``exc``, which stopped this runner's batch, in one paragraph
        (``poison.failure_report``); None when it is no failure of a batch."""
        attempting = self.attempting.range if self.attempting is not None else None
        failures = self.checkpoint.failures
        return failure_report(self.pipeline, self.source, failures, attempting, exc)

    def interrupt(self) -> None:
        """Stop now (Ctrl-C), from another thread: the Spark jobs of the batch in progress
        are cancelled and it raises ``Interrupted``, not counted as a failure; ``run``
        starts no batch after it. The next run replays the batch with the same offsets
        (every write is idempotent: what it wrote is kept, never written twice)."""
        self._interrupted = True
        session = self._spark.session
        if session is None:  # no job runs: none to cancel
            return
        if is_remote_session(session):
            session.interruptAll()  # the session's operations on the Spark Connect server
        else:
            session.sparkContext.cancelAllJobs()

    def interrupted(self) -> Interrupted:
        """The error a run stops with after an interrupt (``interrupt``, or Ctrl-C)."""
        name = self.pipeline.name
        if self.attempting is None:
            return Interrupted(f"{name} was interrupted between batches: nothing is lost")
        return Interrupted(
            f"batch {self.attempting.batch_id} of {name} was interrupted before it committed; "
            f"nothing it wrote is lost: `lowmark run {name}` replays it"
        )


class _StepTimer:
    """Milliseconds spent in each named step, measured with the injected clock.

    Starting Spark, in whichever step first needed it, is a duration of its own
    (``start_spark``), not counted in that step.
    """

    def __init__(self, clock: Clock, spark: StartedOnUse) -> None:
        self.clock = clock
        self.spark = spark
        self.spark_started = spark.session is not None
        self.last = clock.now_ms()
        self.started = self.last
        self.durations: dict[str, int] = {}

    def lap(self, step: str) -> None:
        now = self.clock.now_ms()
        starting = 0
        if not self.spark_started and self.spark.session is not None:
            self.spark_started = True
            starting = self.spark.start_ms
            if starting:
                self.durations["start_spark"] = starting
        self.durations[step] = now - self.last - starting
        self.durations["total"] = now - self.started
        self.last = now
