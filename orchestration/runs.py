"""What a pipeline's Dagster run does: micro-batches (then following the source), or a backfill.

Thin: builds the engine's objects and calls ``batches``. Each committed batch
is logged as one readable line and reported as materializations
(``lowmark.orchestration.metadata``): of the sink, of the late and bad-records tables
when it appended to them, and of every event-time partition that became final
with it; and as an observation of what still waits in each input
(``lowmark.orchestration.observations``).

A run that follows the source holds the pipeline's pool slot; as soon as
another run of the pipeline is queued — a backfill, a Materialize — it ends
after the batch in progress so that one runs next, and records on its own
Dagster run that it yielded, to which run and until when it would have
followed (``lowmark.orchestration.yields``). The sensor's next tick after the
queued run resumes following for the rest of that window, new data or not. A
run that ends for any other reason (a terminate, a failure, its time limit,
its window's end) records nothing and is not resumed.
"""

# No `from __future__ import annotations`: Dagster reads op, check and sensor
# parameter annotations (config, resources) at definition time.

import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path

import dagster as dg
from dagster._core.errors import DagsterExecutionInterruptedError
from pydantic import Field
from pyspark.sql import SparkSession

from lowmark.batches.cli.display import iso_utc
from lowmark.batches.clock import SystemClock
from lowmark.batches.errors import BackfillHistoryLost, PartitionNotClosed
from lowmark.batches.loop.backfill import backfill_partition
from lowmark.batches.loop.follow import FollowResult, follow
from lowmark.batches.loop.metrics import exported_metrics, textfile_dir_from_env
from lowmark.batches.loop.microbatch import BatchResult, MicroBatchRunner
from lowmark.batches.loop.preflight import check_source_folders
from lowmark.batches.pipeline import Pipeline
from lowmark.orchestration.keys import PIPELINE_TAG, bad_records_key, late_key, sink_key
from lowmark.orchestration.metadata import batch_line
from lowmark.orchestration.reporting import BatchReports
from lowmark.orchestration.tables import ROW_COUNT
from lowmark.orchestration.turns import TakingTurns
from lowmark.orchestration.yields import Yielded


class RunConfig(dg.Config):
    """How much one run drains before it ends (a run amortises Spark's start-up)."""

    max_batches: int = Field(default=10, ge=1, description="Stop after this many batches.")
    max_seconds: float = Field(
        default=600, gt=0, description="Start no new batch after this many seconds."
    )
    follow_seconds: float = Field(
        default=0,
        ge=0,
        description="Once caught up, keep following the source this many more seconds (new "
        "files are taken as they land, in the same Spark session, so a run does not pay Spark's "
        "start-up per batch). 0: end the run when caught up. Runs the sensor launches follow "
        "for LOWMARK_FOLLOW_SECONDS.",
    )
    poll_interval_seconds: float = Field(
        default=1, gt=0, description="While following: seconds between polls once caught up."
    )
    force: bool = Field(
        default=False,
        description="Backfill only: replace a partition the watermark has not closed yet (the "
        "stream may later write windows of it again).",
    )


IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]

QUEUE_CHECK_S = 2.0
"""How often the following runs of a process read the run queue (``QueuedRuns``)."""


class RunStops:
    """Stop requests for the runs this process executes in threads of its own (the runner's:
    no signal reaches a thread). A following run reads them between batches and polls,
    and ends after its batch in progress, as a run process does on SIGTERM."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: set[str] = set()
        self._all = False

    def request(self, run_id: str | None = None) -> None:
        """Stop run ``run_id`` (None: every run, now and later)."""
        with self._lock:
            if run_id is None:
                self._all = True
            else:
                self._runs.add(run_id)

    def requested(self, run_id: str) -> bool:
        """Whether run ``run_id`` is to stop (on its own, or with every run)."""
        with self._lock:
            return self._all or run_id in self._runs

    def terminated(self, run_id: str) -> bool:
        """Whether run ``run_id`` itself is to stop (a terminate), not every run."""
        with self._lock:
            return run_id in self._runs


RUN_STOPS = RunStops()
"""This process's stop requests."""


def runs_of(
    instance: dg.DagsterInstance,
    pipeline: Pipeline,
    statuses: list[dg.DagsterRunStatus],
    among: int | None = None,
) -> list[dg.DagsterRun]:
    """Runs with ``statuses`` (among the newest ``among`` of them) that run ``pipeline``:
    tagged with it (sensor, jobs) or materializing its assets (the UI's Materialize),
    newest first."""
    records = instance.get_run_records(dg.RunsFilter(statuses=statuses), limit=among)
    return _running(pipeline, [r.dagster_run for r in records])


def _running(pipeline: Pipeline, runs: list[dg.DagsterRun]) -> list[dg.DagsterRun]:
    """Those of ``runs`` that run ``pipeline`` (``runs_of``)."""
    keys = {sink_key(pipeline), late_key(pipeline), bad_records_key(pipeline)}
    return [
        run
        for run in runs
        if run.tags.get(PIPELINE_TAG) == pipeline.name or keys & set(run.asset_selection or ())
    ]


class QueuedRuns:
    """The queued runs of an instance, read at most every ``QUEUE_CHECK_S`` for all the
    following runs of this process: the warm runner's twenty followers make one read, not
    twenty."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read: weakref.WeakKeyDictionary[
            dg.DagsterInstance, tuple[float, list[dg.DagsterRun]]
        ] = weakref.WeakKeyDictionary()

    def of(self, instance: dg.DagsterInstance, pipeline: Pipeline) -> list[dg.DagsterRun]:
        """The queued runs of ``pipeline`` as of a read at most ``QUEUE_CHECK_S`` old, newest
        first."""
        with self._lock:
            read_at, queued = self._read.get(instance, (-QUEUE_CHECK_S, []))
            if time.monotonic() - read_at >= QUEUE_CHECK_S:
                statuses = dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED])
                queued = [r.dagster_run for r in instance.get_run_records(statuses)]
                self._read[instance] = (time.monotonic(), queued)
        return _running(pipeline, queued)


QUEUED_RUNS = QueuedRuns()
"""This process's reads of the run queue."""


def run_batches(
    context: dg.AssetExecutionContext,
    pipeline: Pipeline,
    session: SparkSession,
    data_root: Path,
    config: RunConfig,
    after_batch: Callable[[], None],
    inputs: Mapping[str, dg.AssetKey],
) -> int:
    """Batches until caught up or a limit, replaying a pending batch first; then, with
    ``follow_seconds``, follow the source that long (``lowmark.batches.loop.follow``). Each
    batch is reported with what still waits in ``inputs`` (input assets by source name:
    ``observations.observed_inputs``). Calls ``after_batch`` after each batch is reported;
    returns how many batches committed. Its batches take this process's turns on Spark
    (``lowmark.orchestration.turns``), shared with the other runs the warm runner executes.
    With ``LOWMARK_METRICS_TEXTFILE_DIR`` set, the run's metrics are written there for
    node_exporter's textfile collector (``lowmark.batches.loop.metrics``)."""
    check_source_folders(pipeline, data_root)  # as `lowmark run`: before a checkpoint is made

    def waited(seconds: float) -> None:
        context.log.info(f"{pipeline.name}: the batch waited {seconds:.1f} s for its turn on Spark")

    runner = TakingTurns(session, pipeline, data_root, waited=waited)  # one Spark, many runs
    with runner, exported_metrics(runner, textfile_dir=textfile_dir_from_env()):
        partitions = context.assets_def.specs_by_key[sink_key(pipeline)].partitions_def
        reports = BatchReports(
            context.instance, pipeline, runner, data_root, lambda: partitions, inputs
        )
        return _drain_then_follow(context, pipeline, runner, reports, config, after_batch)


def _drain_then_follow(
    context: dg.AssetExecutionContext,
    pipeline: Pipeline,
    runner: MicroBatchRunner,
    reports: BatchReports,
    config: RunConfig,
    after_batch: Callable[[], None],
) -> int:
    """``run_batches``' batches with ``runner``, reported by ``reports``."""

    def record(r: BatchResult) -> None:
        context.log.info(batch_line(pipeline, r))
        for event in reports.of(r):
            context.log_event(event)
        after_batch()

    started = time.monotonic()
    results = runner.run(config.max_batches, config.max_seconds, on_batch=record)
    if not results:
        context.log.info(f"{pipeline.name}: caught up, no new data")
    # Follow only after a drain that ended caught up: a run stopped by a limit ends,
    # and the sensor asks for the next one.
    caught_up = (
        len(results) < config.max_batches and time.monotonic() - started < config.max_seconds
    )
    if config.follow_seconds > 0 and caught_up:
        return len(results) + len(_follow(context, pipeline, runner, config, record).batches)
    return len(results)


def _follow(
    context: dg.AssetExecutionContext,
    pipeline: Pipeline,
    runner: MicroBatchRunner,
    config: RunConfig,
    on_batch: Callable[[BatchResult], None],
) -> FollowResult:
    """Follow the source for ``config.follow_seconds``, or until a run of ``pipeline`` is
    queued behind this one: then the run records that it yielded, to which run and until
    when it would have followed, for the sensor to resume (``lowmark.orchestration.yields``)."""
    queued_behind = QueuedBehind(context.instance, pipeline, context.run.run_id)
    until_ms = SystemClock().now_ms() + round(config.follow_seconds * 1000)
    run_id = context.run.run_id
    followed = follow(
        runner,
        config.poll_interval_seconds,
        config.follow_seconds,
        on_batch=on_batch,
        should_stop=lambda: RUN_STOPS.requested(run_id) or queued_behind(),
    )
    context.log.info(f"{pipeline.name} followed the source: {followed.describe()}")
    if RUN_STOPS.terminated(run_id):  # as a run process's interrupt: the run is canceled
        raise DagsterExecutionInterruptedError(f"run {run_id} terminated after its batch")
    yielded_to = None if RUN_STOPS.requested(run_id) else queued_behind.run_id
    if followed.stopped_by == "should_stop" and yielded_to is not None:
        yielded = Yielded(yielded_to, until_ms)
        context.instance.add_run_tags(context.run.run_id, yielded.tags())
        context.log.info(
            f"{pipeline.name} yielded to run {yielded.to_run_id}: the sensor resumes following "
            f"after it, until {iso_utc(until_ms)}"
        )
    return followed


class QueuedBehind:
    """A following run's ``should_stop``: another run of its pipeline is queued.

    ``follow`` asks every 0.2 s while idle; the answer is from the run queue as
    ``QUEUED_RUNS`` last read it, at most ``QUEUE_CHECK_S`` ago. ``run_id`` is the
    queued run found by the last answer (the oldest, which leaves the queue
    first), or None.
    """

    def __init__(self, instance: dg.DagsterInstance, pipeline: Pipeline, own_run_id: str) -> None:
        self.instance, self.pipeline, self.own_run_id = instance, pipeline, own_run_id
        self.run_id: str | None = None

    def __call__(self) -> bool:
        queued = QUEUED_RUNS.of(self.instance, self.pipeline)
        others = [r.run_id for r in queued if r.run_id != self.own_run_id]
        self.run_id = others[-1] if others else None
        return self.run_id is not None


def backfill(
    context: dg.AssetExecutionContext,
    pipeline: Pipeline,
    session: SparkSession,
    data_root: Path,
    force: bool,
) -> None:
    """Recompute and replace the sink's slice of each event-time partition of the run (one,
    or a range: ``lowmark.orchestration.partitions.backfill_policy``), oldest first, each
    reported as that partition's materialization. A partition the engine refuses (still
    open, history lost) is named and the others still backfilled; the run then fails,
    naming every refused one."""
    partitions = context.assets_def.specs_by_key[sink_key(pipeline)].partitions_def
    assert isinstance(partitions, dg.TimeWindowPartitionsDefinition)  # set with `backfill`
    refused: list[str] = []
    for key in context.partition_keys:
        window = partitions.time_window_for_partition_key(key)
        try:
            result = backfill_partition(
                session, pipeline, data_root, window.start, window.end, force
            )
        except (PartitionNotClosed, BackfillHistoryLost) as exc:
            context.log.error(f"partition {key}: {exc}")
            refused.append(f"{key}: {exc}")
            continue
        verb = "already backfilled from" if result.skipped else "replaced from"
        context.log.info(
            f"partition {key}: {result.windows} windows {verb} the history up to batch "
            f"{result.based_on_batch} (sink version {result.sink_version})"
        )
        # Logged, not an output: a run over a range materializes each partition with its own
        # numbers, which one output (the whole range's) cannot carry.
        context.log_event(
            dg.AssetMaterialization(
                sink_key(pipeline),
                partition=key,
                description=f"backfill of {key}",
                metadata={
                    "written_by": "backfill",
                    "windows": result.windows,
                    ROW_COUNT: result.windows,  # the partition's rows, as the stream reports
                    "based_on_batch": dg.MetadataValue.text(str(result.based_on_batch)),
                    "skipped": result.skipped,
                    "sink_version": dg.MetadataValue.text(str(result.sink_version)),
                },
            )
        )
    if refused:
        raise dg.Failure(
            description=f"{len(refused)} of {len(context.partition_keys)} partitions refused: "
            + "; ".join(refused),
            allow_retries=False,
        )
