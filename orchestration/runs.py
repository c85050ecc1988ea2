"""What a pipeline's Dagster run does: micro-batches (then following the source), or a backfill.

Thin: builds the engine's objects and calls ``batches``. Each committed batch
is logged as one readable line and reported as materializations
(``lowmark.orchestration.metadata``): of the sink, of the late and bad-records tables
when it appended to them, and of every event-time partition that became final
with it.

A run that follows the source holds the pipeline's pool slot; it stops
following (after the batch in progress) as soon as another run of the
pipeline is queued — a backfill, a Materialize — so that one runs next, and
the sensor starts a new follower after it.
"""

# No `from __future__ import annotations`: Dagster reads op, check and sensor
# parameter annotations (config, resources) at definition time.

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
from pydantic import Field
from pyspark.sql import SparkSession

from lowmark.batches.errors import BackfillHistoryLost, PartitionNotClosed
from lowmark.batches.loop.backfill import backfill_partition
from lowmark.batches.loop.follow import follow
from lowmark.batches.loop.metrics import exported_metrics, textfile_dir_from_env
from lowmark.batches.loop.microbatch import BatchResult, MicroBatchRunner
from lowmark.batches.pipeline import Pipeline
from lowmark.orchestration.keys import PIPELINE_TAG, bad_records_key, late_key, sink_key
from lowmark.orchestration.metadata import batch_line
from lowmark.orchestration.reporting import BatchReports
from lowmark.orchestration.tables import ROW_COUNT


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
"""A following run looks for queued runs of its pipeline this often."""


def runs_of(
    instance: dg.DagsterInstance,
    pipeline: Pipeline,
    statuses: list[dg.DagsterRunStatus],
    among: int | None = None,
) -> list[dg.DagsterRun]:
    """Runs with ``statuses`` (among the newest ``among`` of them) that run ``pipeline``:
    tagged with it (sensor, jobs) or materializing its assets (the UI's Materialize),
    newest first."""
    keys = {sink_key(pipeline), late_key(pipeline), bad_records_key(pipeline)}
    records = instance.get_run_records(dg.RunsFilter(statuses=statuses), limit=among)
    return [
        r.dagster_run
        for r in records
        if r.dagster_run.tags.get(PIPELINE_TAG) == pipeline.name
        or keys & set(r.dagster_run.asset_selection or ())
    ]


def run_batches(
    context: dg.AssetExecutionContext,
    pipeline: Pipeline,
    session: SparkSession,
    data_root: Path,
    config: RunConfig,
    after_batch: Callable[[], None],
) -> int:
    """Batches until caught up or a limit, replaying a pending batch first; then, with
    ``follow_seconds``, follow the source that long (``lowmark.batches.loop.follow``). Calls
    ``after_batch`` after each batch is reported; returns how many batches committed.
    With ``LOWMARK_METRICS_TEXTFILE_DIR`` set, the run's metrics are written there for
    node_exporter's textfile collector (``lowmark.batches.loop.metrics``)."""
    runner = MicroBatchRunner(session, pipeline, data_root)
    with runner, exported_metrics(runner, textfile_dir=textfile_dir_from_env()):
        partitions = context.assets_def.specs_by_key[sink_key(pipeline)].partitions_def
        reports = BatchReports(context.instance, pipeline, runner, data_root, lambda: partitions)
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
        run_id = context.run.run_id
        last = {"at": 0.0, "queued": False}

        def queued_behind() -> bool:
            # follow asks every 0.2 s while idle: read the run queue every few seconds, and
            # give the last answer between reads (follow asks again before it stops).
            if time.monotonic() - last["at"] >= QUEUE_CHECK_S:
                last["at"] = time.monotonic()
                queued = runs_of(context.instance, pipeline, [dg.DagsterRunStatus.QUEUED])
                last["queued"] = any(r.run_id != run_id for r in queued)
            return bool(last["queued"])

        followed = follow(
            runner,
            config.poll_interval_seconds,
            config.follow_seconds,
            on_batch=record,
            should_stop=queued_behind,
        )
        context.log.info(f"{pipeline.name} followed the source: {followed.describe()}")
        return len(results) + len(followed.batches)
    return len(results)


def backfill(
    context: dg.AssetExecutionContext,
    pipeline: Pipeline,
    session: SparkSession,
    data_root: Path,
    force: bool,
) -> Iterator[dg.MaterializeResult]:
    """Recompute and replace the sink's slice of the run's one event-time partition."""
    window = context.partition_time_window
    try:
        result = backfill_partition(session, pipeline, data_root, window.start, window.end, force)
    except (PartitionNotClosed, BackfillHistoryLost) as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    verb = "already backfilled from" if result.skipped else "replaced from"
    context.log.info(
        f"partition {context.partition_key}: {result.windows} windows {verb} the history "
        f"up to batch {result.based_on_batch} (sink version {result.sink_version})"
    )
    yield dg.MaterializeResult(
        asset_key=sink_key(pipeline),
        metadata={
            "written_by": "backfill",
            "windows": result.windows,
            ROW_COUNT: result.windows,  # the partition's rows, as the stream reports them
            "based_on_batch": dg.MetadataValue.text(str(result.based_on_batch)),
            "skipped": result.skipped,
            "sink_version": dg.MetadataValue.text(str(result.sink_version)),
        },
    )
