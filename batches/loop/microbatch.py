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
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from lowmark.batches.clock import Clock, SystemClock
from lowmark.batches.errors import ExpectationsFailed, Interrupted, PoisonBatch
from lowmark.batches.loop import faults
from lowmark.batches.loop.commit import commit_batch
from lowmark.batches.loop.events import BatchFailure, BatchResult, BatchStarted, RunTerminated
from lowmark.batches.loop.listeners import Listeners, PipelineListener, configured_listeners
from lowmark.batches.loop.parts import BatchParts, build_parts
from lowmark.batches.loop.plan import PlannedBatch, Planner
from lowmark.batches.loop.poison import TRANSIENT_PAUSES_S, failure_kind, failure_report
from lowmark.batches.loop.preflight import check_definition
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.sinks import Sink, WindowedSink
from lowmark.batches.sources import Source
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.commit_log import BatchCounts
from lowmark.state.errors import first_line
from lowmark.state.failures import FailureKind
from lowmark.state.offset_log import Offsets
from lowmark.state.progress import ProgressEntry
from lowmark.state.session import SparkLike, StartedOnUse, is_remote_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lowmark.batches.event_time.stage import WindowedStage

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
        should_stop: Callable[[], bool] | None = None,
    ) -> list[BatchResult]:
        """Run batches until caught up, ``max_batches`` ran, ``max_seconds`` passed, or
        ``should_stop`` (asked before each batch) says so.

        ``max_batches=None`` means no limit (drain until caught up). ``retry``:
        the first batch runs even if it is a poison batch (``run_batch``).
        """
        started = self.clock.now_ms()
        results: list[BatchResult] = []
        while (max_batches is None or len(results) < max_batches) and not self._interrupted:
            if max_seconds is not None and self.clock.now_ms() - started >= max_seconds * 1000:
                break
            if should_stop is not None and should_stop():
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
                and those expectations dropped), every state table
                (``lowmark.state.state_table``; ``Steps.write``), sink, late.
        Step 7. Commit log (with the next watermark), after the per-partition times.
        Step 8. Source commit (upstream may discard), maintenance every
                ``maintenance.every_batches`` batches, then the progress row.

        What steps 3-5 computed is an ``Outcome`` (``lowmark.batches.loop.outcome``).
        Only steps 3-5 (``lowmark.batches.loop.batch_work``) and a stateless sink's write
        run Spark jobs; every other read and write is a driver-side Delta
        operation (``lowmark.state.table``). Before planning, step 2, step 6 and step 7
        the runner checks that its checkpoint was not replaced meanwhile
        (``Checkpoint.fence``).
        """
        parts, ckpt, name = self.parts, self.parts.checkpoint, self.pipeline.name
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
        # What only a batch runs with is built (and PySpark imported) now: a sink the
        # definition cannot make is its fault too, not the batch's.
        from lowmark.batches.loop.outcome import Input, look_at, with_event_time

        work = parts.work
        self.attempting = planned
        if nxt.blocked is not None:
            raise PoisonBatch(nxt.blocked)
        self.listeners.batch_started(
            BatchStarted(
                name, batch_id, planned.replay, planned.watermark_ms, planned.planned_at_ms
            )
        )

        # Step 2. Offset log (write-ahead). A replay reuses the entry already there.
        offsets = planned.offset_entry(
            self.runner_id, parts.planner.fingerprint, parts.planner.definition
        )
        if not planned.replay:
            if batch_id == 0:  # every sink (a fan-out: each) holds no other checkpoint's writes
                parts.sink.check_ours(self.pipeline, ckpt)
            ckpt.fence()
            ckpt.offsets.claim(offsets)
            _warn_of_lost_input(name, planned)
        timer.lap("offset_log")
        faults.reached("after_offset_log", batch_id)

        # Steps 3-4. Read and transform, then look at the batch in ONE Spark job — unless
        # the catch-up read-ahead (lowmark.batches.loop.catch_up) already looked at exactly
        # this range. Spark starts here, if no batch of this runner needed it before. Then
        # the expectations' verdict: a batch that breaks them fails before anything is
        # written (lowmark.batches.expectations).
        self._spark()
        parts.sink.begin(batch_id, planned.replay)  # before the sink can be written (step 4)
        outcome = look_at(work, parts.read_ahead, planned)
        judged = Input.of(outcome.seen)
        try:
            work.checks.verdict(batch_id, judged.rows_in, judged.rows_bad, judged.violations)
        except ExpectationsFailed:
            outcome.release()
            raise
        timer.lap("read")
        faults.reached("after_read", batch_id)

        # Step 5. Event-time stage: merge with the state the batch touches (nothing written).
        outcome = with_event_time(outcome, work, planned)
        timer.lap("event_time")

        # Step 6. Writes, each idempotent per batch: bad records, every state table, sink,
        # late records. The commit records every state table's version after the batch:
        # what the next batch's replay reads (lowmark.state.state_table).
        ckpt.fence()
        bad = outcome.bad(batch_id)
        if bad is not None:
            ckpt.bad_records.append_once(bad, ckpt.txn_app_id("bad_records"), batch_id)
        next_timer_ms = work.steps.write(outcome, planned)
        versions = work.steps.versions_after()
        timer.lap("state")
        faults.reached("after_state", batch_id)
        sink_version = outcome.write_sink(work, batch_id)
        if sink_version is not None:
            versions["sink"] = sink_version
        timer.lap("sink")
        faults.reached("after_sink", batch_id)
        late = outcome.late
        if late is not None and late.num_rows:
            ckpt.late.append_once(late, ckpt.txn_app_id("late"), batch_id)
        outcome.release()
        timer.lap("late")
        faults.reached("after_late", batch_id)

        # Step 7. Commit log, with the watermark the next batch starts from, after the
        # per-partition times (lowmark.batches.loop.commit).
        ckpt.fence()
        partitions, next_watermark = parts.planner.times_after(planned, outcome.seen.max_event_ms)
        counts = outcome.counts(windowed=parts.stage is not None)
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
        parts.source.commit(planned.end)
        timer.lap("source_commit")
        maintenance = self.pipeline.maintenance
        if (batch_id + 1) % maintenance.every_batches == 0:
            from lowmark.batches.loop.maintenance import maintain_after  # Arrow compute

            ran = (planned.planned_at_ms, next_watermark)
            maintain_after(ckpt, parts.source, planned.range, self.pipeline, versions, ran)
            timer.lap("maintenance")
        return self._progress(planned, counts, next_watermark, timer.durations)

    def _progress(
        self,
        planned: PlannedBatch,
        counts: BatchCounts,
        next_watermark: int | None,
        durations: dict[str, int],
    ) -> BatchResult:
        """Step 8's end: the batch's progress row, and its result, which the listeners are
        told of."""
        lag_ms = planned.planned_at_ms - next_watermark if next_watermark is not None else None
        duplicates = counts.rows_duplicate if self.parts.work.dedup is not None else None
        self.checkpoint.progress.add(
            ProgressEntry(
                batch_id=planned.batch_id,
                runner_id=self.runner_id,
                replayed=planned.replay,
                durations_ms=durations,
                rows_in=counts.rows_in,
                rows_out=counts.rows_out,
                rows_bad=counts.rows_bad,
                rows_late=counts.rows_late,
                rows_duplicate=duplicates,
                violations=counts.violations,
                watermark_ms=planned.watermark_ms,
                lag_ms=lag_ms,
                input_skipped=planned.skipped.counts if planned.skipped else {},
            )
        )
        log.info("pipeline %s committed batch %d", self.pipeline.name, planned.batch_id)
        result = BatchResult(
            self.pipeline.name,
            planned.batch_id,
            planned.replay,
            planned.start,
            planned.end,
            counts.rows_in,
            counts.rows_out,
            counts.rows_bad,
            counts.rows_late,
            next_watermark,
            lag_ms,
            durations,
            counts.violations,
            committed_at_ms=self.clock.now_ms(),
            backlog=self._backlog(planned.end) if self.listeners.want_backlog else None,
            rows_duplicate=duplicates,
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


def _warn_of_lost_input(name: str, planned: PlannedBatch) -> None:
    """Say that batch ``planned`` passes over input lost before it was read (``on_data_loss:
    skip``), if it does."""
    if planned.skipped is not None:
        log.warning(
            "pipeline %s batch %d passes over input lost before it was read "
            "(on_data_loss: skip): %s (%s)",
            name,
            planned.batch_id,
            planned.skipped.what,
            ", ".join(f"{n} {unit}" for unit, n in planned.skipped.counts.items()),
        )
