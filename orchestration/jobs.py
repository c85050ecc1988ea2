"""Per-pipeline jobs: drain micro-batches, and backfill event-time partitions.

Both are thin: the op builds the engine's objects and calls into ``batches``.
Every run is tagged ``lowmark/pipeline=<name>``; ``dagster.yaml`` allows one
run per tag value, so a pipeline's runs and backfills never overlap.
"""

# No `from __future__ import annotations`: Dagster reads op, check and sensor
# parameter annotations (config, resources) at definition time.

from datetime import UTC, datetime

import dagster as dg
from pydantic import Field

from batches.backfill import backfill_partition
from batches.errors import PartitionNotClosed
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
    """Runs batches of ``pipeline`` until caught up or a limit; replays a pending batch first."""

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

        results = runner.run(config.max_batches, config.max_seconds, on_batch=record)
        if not results:
            context.log.info(f"{pipeline.name}: caught up, no new data")
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
