"""The Dagster ``Definitions`` of every registered lowmark pipeline.

Loaded by ``workspace.yaml`` (``dagster dev -w workspace.yaml``). Pipelines
come from ``LOWMARK_PIPELINES`` (default: the demo), data from
``LOWMARK_DATA_ROOT``. Per pipeline: a micro-batch job, its sensor, the sink
asset with two health checks, a checkpoint-maintenance job with its daily
schedule, and — for windowed pipelines with ``backfill`` partitions — a
partitioned backfill job. This module only wires.
"""

from __future__ import annotations

import dagster as dg

from batches.registry import load_pipelines
from orchestration.assets import health_checks, sink_asset
from orchestration.jobs import backfill_job, compact_job, compact_schedule, microbatch_job
from orchestration.resources import LowmarkResource, SparkResource
from orchestration.sensors import pipeline_sensor


def build_definitions(location: str | None = None) -> dg.Definitions:
    """Definitions for the pipelines at ``location`` (default: ``LOWMARK_PIPELINES``)."""
    assets, checks, jobs, sensors, schedules = [], [], [], [], []
    for pipeline in load_pipelines(location).values():
        job = microbatch_job(pipeline)
        jobs.append(job)
        sensors.append(pipeline_sensor(pipeline, job))
        compact = compact_job(pipeline)
        jobs.append(compact)
        schedules.append(compact_schedule(pipeline, compact))
        assets.append(sink_asset(pipeline))
        checks += health_checks(pipeline)
        if pipeline.backfill is not None:
            jobs.append(backfill_job(pipeline, pipeline.backfill))
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=jobs,
        sensors=sensors,
        schedules=schedules,
        resources={"spark": SparkResource(), "lowmark": LowmarkResource()},
    )


defs = build_definitions()
