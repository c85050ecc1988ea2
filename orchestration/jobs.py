"""Per-pipeline jobs: micro-batches and backfills (asset jobs over the pipeline's assets),
checkpoint maintenance with its daily schedule, and ``lowmark rebuild`` as a run.

Micro-batch and backfill runs execute the pipeline's asset op, which holds
the pipeline's pool (``lowmark.orchestration.keys.pool``): ``dagster.yaml`` gives a
pool one slot, so a pipeline's runs — however launched — never overlap.
"""

# No `from __future__ import annotations`: Dagster reads op, check and sensor
# parameter annotations (config, resources) at definition time.

from typing import TYPE_CHECKING

import dagster as dg

from lowmark.batches.admin.rebuild import ShadowBatch, rebuild
from lowmark.batches.loop.maintenance import maintain_checkpoint
from lowmark.batches.pipeline import Pipeline
from lowmark.orchestration.keys import PIPELINE_TAG, sink_key
from lowmark.orchestration.resources import LowmarkResource, SparkResource

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import (
        UnresolvedAssetJobDefinition,
    )


def microbatch_job_name(pipeline: Pipeline) -> str:
    return f"{pipeline.name}_microbatches"


def microbatch_job(
    pipeline: Pipeline, assets: dg.AssetsDefinition
) -> "UnresolvedAssetJobDefinition":
    """Runs batches of ``pipeline`` until caught up or a limit; replays a pending batch first.

    With ``follow_seconds`` > 0, a run that drained to caught up then follows
    the source that long, taking files as they land. A SIGINT or SIGTERM
    meanwhile (a terminate) ends it after the current batch.
    """
    return dg.define_asset_job(
        microbatch_job_name(pipeline),
        selection=dg.AssetSelection.assets(*assets.keys),
        description=f"Micro-batches of lowmark pipeline {pipeline.name}. {pipeline.description}",
        tags={PIPELINE_TAG: pipeline.name},
        executor_def=dg.in_process_executor,  # one op: no step subprocess, one Spark start
    )


def backfill_job_name(pipeline: Pipeline) -> str:
    return f"{pipeline.name}_backfill"


def backfill_job(pipeline: Pipeline) -> "UnresolvedAssetJobDefinition":
    """Recomputes the windows starting in one event-time partition; replaces that sink slice."""
    return dg.define_asset_job(
        backfill_job_name(pipeline),
        selection=dg.AssetSelection.assets(sink_key(pipeline)),
        description=f"Backfill event-time partitions of {pipeline.name}'s sink.",
        tags={PIPELINE_TAG: pipeline.name},
        executor_def=dg.in_process_executor,
    )


def maintenance_job_name(pipeline: Pipeline) -> str:
    return f"{pipeline.name}_compact"


def maintenance_job(pipeline: Pipeline) -> dg.JobDefinition:
    """Checkpoint maintenance of ``pipeline`` now (no Spark; safe beside its runs)."""

    @dg.op(
        name=f"{pipeline.name}_checkpoint_maintenance",
        description=f"Old log entries go, small files merge: {pipeline.name}'s checkpoint.",
    )
    def maintain(
        context: dg.OpExecutionContext, spark: SparkResource, lowmark: LowmarkResource
    ) -> dg.Output[None]:
        done = maintain_checkpoint(spark.session, pipeline, lowmark.root())
        if done is None:
            context.log.info(f"{pipeline.name}: no committed batch yet: nothing to maintain")
            return dg.Output(None, metadata={"tables": 0})
        context.log.info(
            f"{pipeline.name}: maintained {done.tables} tables; the logs keep batches "
            f"{done.first_kept} to {done.last_committed}"
        )
        return dg.Output(
            None,
            metadata={
                "tables": done.tables,
                "first_kept_batch": dg.MetadataValue.text(str(done.first_kept)),
                "last_committed_batch": dg.MetadataValue.text(str(done.last_committed)),
            },
        )

    @dg.job(
        name=maintenance_job_name(pipeline),
        description=f"Checkpoint maintenance of {pipeline.name} (also runs every "
        f"{pipeline.maintenance.every_batches} batches by itself).",
        executor_def=dg.in_process_executor,
    )
    def job() -> None:
        maintain()

    return job


def maintenance_schedule(pipeline: Pipeline, job: dg.JobDefinition) -> dg.ScheduleDefinition:
    """Daily at 03:17 UTC, on by default."""
    return dg.ScheduleDefinition(
        name=f"{pipeline.name}_daily_compact",
        job=job,
        cron_schedule="17 3 * * *",
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Daily checkpoint maintenance of {pipeline.name}.",
    )


def rebuild_job_name(pipeline: Pipeline) -> str:
    return f"{pipeline.name}_rebuild"


def rebuild_job(pipeline: Pipeline) -> dg.JobDefinition:
    """``lowmark rebuild`` of ``pipeline`` (``lowmark.batches.admin.rebuild``) as a run: each
    shadow batch a line of its log, what it did its metadata. It holds no pool slot: the
    pipeline's micro-batch runs go on meanwhile, until the swap moves their checkpoint (a
    run then in flight stops with ``CheckpointReplaced``; the next one goes on under the
    new definition)."""

    @dg.op(
        name=f"{pipeline.name}_rebuild_and_swap",
        description=f"Recompute {pipeline.name}'s output under its definition now beside the "
        "live tables, then swap it in.",
    )
    def rebuild_output(
        context: dg.OpExecutionContext, spark: SparkResource, lowmark: LowmarkResource
    ) -> dg.Output[None]:
        def told(b: ShadowBatch) -> None:
            context.log.info(
                f"{pipeline.name}: shadow batch {b.shadow_batch} committed (live batch "
                f"{b.live_batch} of {b.live_last}): {b.rows_out} rows out"
            )

        done = rebuild(spark.session, pipeline, lowmark.root(), told)
        if done.nothing is not None:
            context.log.info(f"{pipeline.name}: nothing rebuilt: {done.nothing}")
            return dg.Output(None, metadata={"rebuilt": False, "why": done.nothing})
        context.log.info(
            f"{pipeline.name}: rebuilt through live batch {done.last_batch} and swapped in; "
            f"old checkpoint moved to {done.moved_to}"
        )
        return dg.Output(
            None,
            metadata={
                "rebuilt": True,
                "shadow_batches": done.batches,
                "last_batch": dg.MetadataValue.text(str(done.last_batch)),
                "moved_to": dg.MetadataValue.path(str(done.moved_to)),
                "sinks": dg.MetadataValue.text(", ".join(done.sinks)),
            },
        )

    @dg.job(
        name=rebuild_job_name(pipeline),
        description=f"Rebuild {pipeline.name}'s output after a change that needs it "
        "(`lowmark rebuild`), then swap it in.",
        executor_def=dg.in_process_executor,
    )
    def job() -> None:
        rebuild_output()

    return job
