"""Per-pipeline jobs: drain micro-batches, and backfill event-time partitions.

Both are thin: the op builds the engine's objects and calls into ``batches``.
Every run is tagged ``lowmark/pipeline=<name>``; ``dagster.yaml`` allows one
run per tag value, so a pipeline's runs and backfills never overlap.
"""

# No `from __future__ import annotations`: Dagster reads op, check and sensor
# parameter annotations (config, resources) at definition time.

import time
from datetime import UTC, datetime

import dagster as dg
from pydantic import Field

from batches.backfill import backfill_partition
from batches.compaction import compact_checkpoint
from batches.errors import PartitionNotClosed
from batches.follow import follow
from batches.microbatch import BatchResult, MicroBatchRunner
from batches.pipeline import EventTimePartitions, Pipeline
from orchestration.assets import batch_materialization, evaluate_checks
from orchestration.resources import LowmarkResource, SparkResource

PIPELINE_TAG = "lowmark/pipeline"


class MicroBatchConfig(dg.Config):
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
        "start-up per batch). 0: end the run when caught up.",
    )
    poll_interval_seconds: float = Field(
        default=1, gt=0, description="While following: seconds between polls once caught up."
    )


class BackfillConfig(dg.Config):
    force: bool = Field(
        default=False,
        description="Backfill a partition the watermark has not closed yet (the stream may "
        "later write windows of it again).",
    )


def microbatch_job_name(pipeline: Pipeline) -> str:
    return f"{pipeline.name}_microbatches"


def backfill_job_name(pipeline: Pipeline) -> str:
    return f"{pipeline.name}_backfill"


def microbatch_job(pipeline: Pipeline) -> dg.JobDefinition:
    """Runs batches of ``pipeline`` until caught up or a limit; replays a pending batch first.

    With ``follow_seconds`` > 0, a run that drained to caught up then follows
    the source (``batches.follow``) that long, taking files as they land. A
    SIGINT or SIGTERM meanwhile (a terminate) ends it after the current batch.
    """

    @dg.op(
        name=f"{pipeline.name}_run_batches",
        description=f"Run micro-batches of {pipeline.name} until caught up or a limit.",
    )
    def run_batches(
        context: dg.OpExecutionContext,
        config: MicroBatchConfig,
        spark: SparkResource,
        lowmark: LowmarkResource,
    ) -> None:
        session = spark.session()
        runner = MicroBatchRunner(session, pipeline, lowmark.root())

        def record(r: BatchResult) -> None:
            context.log.info(
                f"batch {r.batch_id} {'replayed' if r.replay else 'committed'}: {r.rows_in} "
                f"in, {r.rows_out} out, {r.rows_late} late, offsets {r.start} -> {r.end}"
            )
            context.log_event(batch_materialization(pipeline, r))

        started = time.monotonic()
        results = runner.run(config.max_batches, config.max_seconds, on_batch=record)
        if not results:
            context.log.info(f"{pipeline.name}: caught up, no new data")
        # Follow only after a drain that ended caught up: a run stopped by a limit ends
        # as before, and the sensor asks for the next one.
        caught_up = (
            len(results) < config.max_batches and time.monotonic() - started < config.max_seconds
        )
        if config.follow_seconds > 0 and caught_up:
            followed = follow(
                runner,
                config.poll_interval_seconds,
                config.follow_seconds,
                on_batch=record,
            )
            context.log.info(f"{pipeline.name} followed the source: {followed.describe()}")
        for evaluation in evaluate_checks(session, pipeline, lowmark.root()):
            # log_event records check evaluations too; its annotation predates them.
            context.log_event(evaluation)  # type: ignore[arg-type]

    @dg.job(
        name=microbatch_job_name(pipeline),
        description=f"Micro-batches of lowmark pipeline {pipeline.name}. {pipeline.description}",
        tags={PIPELINE_TAG: pipeline.name},
        executor_def=dg.in_process_executor,  # one op: no step subprocess, one Spark start
    )
    def job() -> None:
        run_batches()

    return job


def backfill_partitions(config: EventTimePartitions) -> dg.TimeWindowPartitionsDefinition:
    """Dagster's hourly (``2026-01-01-00:00``) or daily (``2026-01-01``) partitions, UTC."""
    start = datetime.fromisoformat(config.start).replace(tzinfo=UTC)
    if config.granularity == "hourly":
        return dg.HourlyPartitionsDefinition(start_date=start, timezone="UTC")
    return dg.DailyPartitionsDefinition(start_date=start, timezone="UTC")


def backfill_job(pipeline: Pipeline, partitions: EventTimePartitions) -> dg.JobDefinition:
    """Recomputes the windows starting in one event-time partition; replaces that sink slice."""

    @dg.op(
        name=f"{pipeline.name}_backfill_partition",
        description=f"Recompute and replace one event-time partition of {pipeline.name}'s sink.",
    )
    def backfill(
        context: dg.OpExecutionContext,
        config: BackfillConfig,
        spark: SparkResource,
        lowmark: LowmarkResource,
    ) -> dg.Output[None]:
        window = context.partition_time_window
        try:
            result = backfill_partition(
                spark.session(), pipeline, lowmark.root(), window.start, window.end, config.force
            )
        except PartitionNotClosed as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from exc
        verb = "already backfilled from" if result.skipped else "replaced from"
        context.log.info(
            f"partition {context.partition_key}: {result.windows} windows {verb} the history "
            f"up to batch {result.based_on_batch} (sink version {result.sink_version})"
        )
        return dg.Output(
            None,
            metadata={
                "windows": result.windows,
                "based_on_batch": result.based_on_batch,
                "skipped": result.skipped,
                "sink_version": result.sink_version,
            },
        )

    @dg.job(
        name=backfill_job_name(pipeline),
        description=f"Backfill event-time partitions of {pipeline.name}'s sink.",
        tags={PIPELINE_TAG: pipeline.name},
        partitions_def=backfill_partitions(partitions),
        executor_def=dg.in_process_executor,
    )
    def job() -> None:
        backfill()

    return job


def compact_job_name(pipeline: Pipeline) -> str:
    return f"{pipeline.name}_compact"


def compact_job(pipeline: Pipeline) -> dg.JobDefinition:
    """Checkpoint maintenance of ``pipeline`` now (no Spark; safe beside its runs)."""

    @dg.op(
        name=f"{pipeline.name}_compact_checkpoint",
        description=f"Old log entries go, small files merge: {pipeline.name}'s checkpoint.",
    )
    def compact(
        context: dg.OpExecutionContext, spark: SparkResource, lowmark: LowmarkResource
    ) -> dg.Output[None]:
        done = compact_checkpoint(spark.session, pipeline, lowmark.root())
        if done is None:
            context.log.info(f"{pipeline.name}: no committed batch yet: nothing to compact")
            return dg.Output(None, metadata={"tables": 0})
        context.log.info(
            f"{pipeline.name}: compacted {done.tables} tables; the logs keep batches "
            f"{done.first_kept} to {done.last_committed}"
        )
        return dg.Output(
            None,
            metadata={
                "tables": done.tables,
                "first_kept_batch": done.first_kept,
                "last_committed_batch": done.last_committed,
            },
        )

    @dg.job(
        name=compact_job_name(pipeline),
        description=f"Checkpoint maintenance of {pipeline.name} (also runs every "
        f"{pipeline.maintenance.every_batches} batches by itself).",
        executor_def=dg.in_process_executor,
    )
    def job() -> None:
        compact()

    return job


def compact_schedule(pipeline: Pipeline, job: dg.JobDefinition) -> dg.ScheduleDefinition:
    """Daily at 03:17 UTC, on by default."""
    return dg.ScheduleDefinition(
        name=f"{pipeline.name}_daily_compact",
        job=job,
        cron_schedule="17 3 * * *",
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Daily checkpoint maintenance of {pipeline.name}.",
    )
