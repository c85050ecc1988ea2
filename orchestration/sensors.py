"""Per-pipeline sensors: keep a run of the pipeline going while there is work.

A tick is read-only and starts no Spark. It skips while a run of the
pipeline is queued or in progress (a following run takes new files itself);
otherwise it asks ``lowmark.batches.admin.status`` what is pending: an uncommitted batch
(replayed first) or files past the committed end. The run it requests drains
the backlog and then follows the source for ``LOWMARK_FOLLOW_SECONDS``, so
files landing meanwhile are in the sink within a poll and a batch, with no
Spark start each. A follower that made way for a run queued behind it (a
Materialize, a backfill) recorded that it yielded
(``lowmark.orchestration.yields``): once that run is over, a tick with no new
data requests a run that follows for the rest of the yielded run's window
(``keys.resume_run_key`` names the yielded run, so each yield is resumed
once); with new data the usual run follows for ``LOWMARK_FOLLOW_SECONDS``.
The usual run's ``run_key`` carries the checkpoint's pipeline id and the
batch id (``keys.batch_run_key``), so Dagster launches one run per batch no
matter how many ticks see it, and again after ``lowmark reset``; a replay's
key also names the run that left the batch behind, so each failure gets its
own retry, until the batch failed ``max_failed_attempts`` times: then the
tick skips, saying why and what to do (``lowmark.batches.loop.poison``).
A batch whose last run stopped on an
operational error (a file gone, a damaged checkpoint) is not relaunched on
every tick: the tick waits one interval after the first stop, two after the
second, and so on (``lowmark.batches.admin.status.pending_work``), until it is blocked.
Each tick that reads the pipeline's position also observes its input assets
when what waits there differs from their newest observation of the pipeline,
which a run records after each batch, and its sink when the definition changes its
next batch takes differ from the newest it recorded (``lowmark.orchestration.observations``).
"""

# No `from __future__ import annotations`: Dagster reads op, check and sensor
# parameter annotations (config, resources) at definition time.

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import dagster as dg

from lowmark.batches.admin.status import PipelineStatus, pending_work, pipeline_status
from lowmark.batches.cli.display import iso_utc
from lowmark.batches.errors import DefinitionMismatch
from lowmark.batches.loop.preflight import check_source_folders
from lowmark.batches.pipeline import Pipeline
from lowmark.orchestration.jobs import microbatch_job_name
from lowmark.orchestration.keys import PIPELINE_TAG, asset_op, batch_run_key, resume_run_key
from lowmark.orchestration.observations import (
    changed_observations,
    definition_observations,
    input_observations,
)
from lowmark.orchestration.resources import LowmarkResource, SparkResource
from lowmark.orchestration.runs import IN_FLIGHT, runs_of
from lowmark.orchestration.yields import Yielded

FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]

FOLLOWERS_LOOKED_AT = 20
"""A tick looks for the newest run that was to follow among this many finished runs of the
micro-batch job (the others, launched by hand without ``follow_seconds``, are few)."""

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import (
        UnresolvedAssetJobDefinition,
    )


SENSOR_INTERVAL_S = 5
"""The default seconds between ticks: a file landing while no run follows waits at most
this for its run, so it is in the sink within about 10 s of landing once Spark is warm. A
tick starts no Spark: one that skips (a run follows) reads the run table; one that plans
costs about 43 ms of the code server's CPU (docs/dagster.md, "The sensor's interval")."""


def sensor_interval_seconds() -> int:
    """Seconds between ticks: ``LOWMARK_SENSOR_INTERVAL_SECONDS``, default
    ``SENSOR_INTERVAL_S``."""
    return int(os.environ.get("LOWMARK_SENSOR_INTERVAL_SECONDS", str(SENSOR_INTERVAL_S)))


def follow_seconds() -> float:
    """How long a run the sensor launches follows the source once caught up:
    ``LOWMARK_FOLLOW_SECONDS``, default 3600 (0: runs end when caught up)."""
    return float(os.environ.get("LOWMARK_FOLLOW_SECONDS", "3600"))


def sensor_default_status() -> dg.DefaultSensorStatus:
    """Sensors start running unless ``LOWMARK_SENSORS=stopped``."""
    stopped = os.environ.get("LOWMARK_SENSORS", "running") == "stopped"
    return dg.DefaultSensorStatus.STOPPED if stopped else dg.DefaultSensorStatus.RUNNING


def pipeline_sensor(
    pipeline: Pipeline,
    job: "UnresolvedAssetJobDefinition",
    inputs: Mapping[str, dg.AssetKey] | None = None,
) -> dg.SensorDefinition:
    """The sensor of ``pipeline``, requesting ``job`` runs; it observes ``inputs`` (input
    assets by source name: ``lowmark.orchestration.observations``) whenever what waits there
    differs from their newest observation of ``pipeline``."""

    @dg.sensor(
        name=f"{pipeline.name}_sensor",
        job=job,
        minimum_interval_seconds=sensor_interval_seconds(),
        default_status=sensor_default_status(),
        description=f"Requests a {microbatch_job_name(pipeline)} run when {pipeline.name} has "
        "new data or an uncommitted batch and no run of it is in flight; the run then follows "
        "the source (LOWMARK_FOLLOW_SECONDS).",
    )
    def _sensor(
        context: dg.SensorEvaluationContext, spark: SparkResource, lowmark: LowmarkResource
    ) -> dg.SensorResult | dg.SkipReason:
        running = runs_of(context.instance, pipeline, IN_FLIGHT)
        if running:
            run = running[0]
            return dg.SkipReason(f"run {run.run_id} of {pipeline.name} is {run.status.value}")
        try:  # a source folder that is not there is a mistake to name, not "caught up"
            check_source_folders(pipeline, lowmark.root())
        except DefinitionMismatch as exc:
            return dg.SkipReason(str(exc))
        # The session method, not a session: a tick over local folders starts no Spark.
        status = pipeline_status(spark.session, pipeline, lowmark.root(), definitions=False)
        observed = changed_observations(
            context.instance,
            pipeline,
            input_observations(pipeline, inputs or {}, status.backlog, status.backlog_described),
        ) + definition_observations(context.instance, pipeline, status.pending_changes)
        answer = _decide(context, pipeline, status)
        return dg.SensorResult(
            run_requests=[answer] if isinstance(answer, dg.RunRequest) else None,
            skip_reason=answer if isinstance(answer, dg.SkipReason) else None,
            asset_events=observed,
        )

    return _sensor


def _decide(
    context: dg.SensorEvaluationContext, pipeline: Pipeline, status: PipelineStatus
) -> dg.RunRequest | dg.SkipReason:
    """The tick's answer for ``pipeline`` at ``status``: a run, or why not."""
    if status.blocked:
        return dg.SkipReason(status.blocked)
    work = pending_work(status, sensor_interval_seconds() * 1000)
    if work is None:
        resume = _open_yield(context.instance, pipeline, status.as_of_ms)
        if resume is not None:
            run, yielded = resume
            seconds = (yielded.until_ms - status.as_of_ms) / 1000
            context.log.info(
                f"{pipeline.name} resumes following for {seconds:.0f} s after run {run.run_id} "
                f"yielded to run {yielded.to_run_id}"
            )
            return _follow_request(pipeline, resume_run_key(pipeline, run.run_id), seconds)
        at = status.last_committed_batch
        return dg.SkipReason(
            f"{pipeline.name} is caught up (last committed batch {at}): no new data"
        )
    failed = status.last_failure
    if work.not_before_ms is not None and failed and status.as_of_ms < work.not_before_ms:
        return dg.SkipReason(
            f"batch {work.batch_id} of {pipeline.name} stopped "
            f"{failed.attempts['operational']} times (last: {failed.error}): no run "
            f"before {iso_utc(work.not_before_ms)}, the wait doubling with each stop; "
            f"or run `lowmark run {pipeline.name}` once it is fixed"
        )
    run_key = batch_run_key(pipeline, status.pipeline_id, work.batch_id)
    if work.replay:
        finished = runs_of(context.instance, pipeline, FINISHED, among=50)
        after = finished[0].run_id if finished else "none"
        run_key += f":replay-after-{after}"
    context.log.info(f"{pipeline.name}: {work.reason}")
    return _follow_request(pipeline, run_key, follow_seconds())


def _follow_request(pipeline: Pipeline, run_key: str, seconds: float) -> dg.RunRequest:
    """A run of ``pipeline`` that drains, then follows the source ``seconds``."""
    return dg.RunRequest(
        run_key=run_key,
        tags={PIPELINE_TAG: pipeline.name},
        run_config={"ops": {asset_op(pipeline): {"config": {"follow_seconds": seconds}}}},
    )


def _open_yield(
    instance: dg.DagsterInstance, pipeline: Pipeline, now_ms: int
) -> tuple[dg.DagsterRun, Yielded] | None:
    """The yield to resume at ``now_ms``: that of the newest finished run of ``pipeline``
    that was to follow the source (``follow_seconds`` > 0), when it succeeded after yielding
    and its window is still open. None otherwise: a run that ended by a terminate, a
    failure, its time limit or its window's end is not resumed, nor an older yield behind
    it."""
    records = instance.get_run_records(
        dg.RunsFilter(job_name=microbatch_job_name(pipeline), statuses=FINISHED),
        limit=FOLLOWERS_LOOKED_AT,
    )
    follower = next((r.dagster_run for r in records if _follows(r.dagster_run, pipeline)), None)
    if follower is None or follower.status != dg.DagsterRunStatus.SUCCESS:
        return None
    yielded = Yielded.of(follower)
    if yielded is None or yielded.until_ms <= now_ms:
        return None
    return follower, yielded


def _follows(run: dg.DagsterRun, pipeline: Pipeline) -> bool:
    """Whether ``run`` was configured to follow the source once caught up."""
    run_config: Mapping[str, Any] = run.run_config
    op = run_config.get("ops", {}).get(asset_op(pipeline), {})
    return bool(op.get("config", {}).get("follow_seconds", 0) > 0)
