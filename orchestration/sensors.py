"""Per-pipeline sensors: request a run when there is work and no run in flight.

A tick is read-only. It skips while a run of the pipeline is queued or in
progress; otherwise it asks ``batches.status`` what is pending: an
uncommitted batch (replayed first) or files past the committed end. The
``run_key`` carries the batch id, so Dagster launches one run per batch no
matter how many ticks see it; a replay's key also names the run that left
the batch behind, so each failure gets its own retry, until the batch failed
``max_failed_attempts`` times: then the tick skips, saying why and what to do
(``batches.poison``).
"""

# No `from __future__ import annotations`: Dagster reads op, check and sensor
# parameter annotations (config, resources) at definition time.

import os

import dagster as dg

from batches.pipeline import Pipeline
from batches.status import pending_work, pipeline_status
from orchestration.jobs import PIPELINE_TAG, microbatch_job_name
from orchestration.resources import LowmarkResource, SparkResource

IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def sensor_interval_seconds() -> int:
    """Seconds between ticks: ``LOWMARK_SENSOR_INTERVAL_SECONDS``, default 30."""
    return int(os.environ.get("LOWMARK_SENSOR_INTERVAL_SECONDS", "30"))


def sensor_default_status() -> dg.DefaultSensorStatus:
    """Sensors start running unless ``LOWMARK_SENSORS=stopped``."""
    stopped = os.environ.get("LOWMARK_SENSORS", "running") == "stopped"
    return dg.DefaultSensorStatus.STOPPED if stopped else dg.DefaultSensorStatus.RUNNING


def pipeline_sensor(pipeline: Pipeline, job: dg.JobDefinition) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"{pipeline.name}_sensor",
        job=job,
        minimum_interval_seconds=sensor_interval_seconds(),
        default_status=sensor_default_status(),
        description=f"Requests a {microbatch_job_name(pipeline)} run when {pipeline.name} has "
        "new data or an uncommitted batch, and no run of it is in flight.",
    )
    def _sensor(
        context: dg.SensorEvaluationContext, spark: SparkResource, lowmark: LowmarkResource
    ) -> dg.RunRequest | dg.SkipReason:
        runs = context.instance.get_run_records(
            dg.RunsFilter(tags={PIPELINE_TAG: pipeline.name}, statuses=IN_FLIGHT), limit=1
        )
        if runs:
            run = runs[0].dagster_run
            return dg.SkipReason(f"run {run.run_id} of {pipeline.name} is {run.status.value}")
        # The session method, not a session: a tick over local folders starts no Spark.
        status = pipeline_status(spark.session, pipeline, lowmark.root())
        if status["blocked"]:
            return dg.SkipReason(status["blocked"])
        work = pending_work(status)
        if work is None:
            at = status["last_committed_batch"]
            return dg.SkipReason(
                f"{pipeline.name} is caught up (last committed batch {at}): no new data"
            )
        run_key = f"{pipeline.name}:batch-{work.batch_id}"
        if work.replay:
            finished = context.instance.get_run_records(
                dg.RunsFilter(tags={PIPELINE_TAG: pipeline.name}), limit=1
            )
            after = finished[0].dagster_run.run_id if finished else "none"
            run_key += f":replay-after-{after}"
        context.log.info(f"{pipeline.name}: {work.reason}")
        return dg.RunRequest(run_key=run_key, tags={PIPELINE_TAG: pipeline.name})

    return _sensor
