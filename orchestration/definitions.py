"""The Dagster ``Definitions`` of every registered lowmark pipeline.

Loaded by ``workspace.yaml`` (``dagster dev -w workspace.yaml``). Pipelines
come from ``LOWMARK_PIPELINES`` (default: the demo), data from
``LOWMARK_DATA_ROOT``. Per pipeline: its assets and checks (sink, late and
bad-records tables, and their source; ``lowmark.orchestration.assets``), the
micro-batch job and its sensor (which observes the inputs), a
checkpoint-maintenance job with its daily schedule, for windowed pipelines with
``backfill`` partitions a backfill job, and for pipelines whose sinks a rebuild can swap
(Delta tables) a rebuild job (``lowmark rebuild`` as a run). This module only wires.
"""

from __future__ import annotations

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition,
)

from lowmark.batches.loop.rebuildable import refusal
from lowmark.batches.registry import load_pipelines
from lowmark.orchestration.assets import dimension_specs, pipeline_assets, source_specs
from lowmark.orchestration.jobs import (
    backfill_job,
    maintenance_job,
    maintenance_schedule,
    microbatch_job,
    rebuild_job,
)
from lowmark.orchestration.keys import sink_locations
from lowmark.orchestration.observations import observable_inputs, observed_inputs
from lowmark.orchestration.resources import LowmarkResource, SparkResource
from lowmark.orchestration.sensors import pipeline_sensor


def build_definitions(location: str | None = None) -> dg.Definitions:
    """Definitions for the pipelines at ``location`` (default: ``LOWMARK_PIPELINES``)."""
    lowmark = LowmarkResource()
    assets: list[dg.AssetsDefinition] = []
    sources: dict[dg.AssetKey, dg.AssetSpec] = {}
    dimensions: dict[dg.AssetKey, dg.AssetSpec] = {}
    jobs: list[dg.JobDefinition | UnresolvedAssetJobDefinition] = []
    sensors, schedules = [], []
    pipelines = load_pipelines(location).values()
    sinks = sink_locations(pipelines, lowmark.root())
    for pipeline in pipelines:
        tables = pipeline_assets(pipeline, lowmark.root(), sinks)
        assets.append(tables)
        for source in source_specs(pipeline, lowmark.root(), sinks):
            sources[source.key] = source  # pipelines reading one input share its asset
        for dimension in dimension_specs(pipeline, lowmark.root(), sinks):
            dimensions[dimension.key] = dimension
        job = microbatch_job(pipeline, tables)
        jobs.append(job)
        inputs = observed_inputs(pipeline, lowmark.root(), sinks)
        sensors.append(pipeline_sensor(pipeline, job, inputs))
        maintenance = maintenance_job(pipeline)
        jobs.append(maintenance)
        schedules.append(maintenance_schedule(pipeline, maintenance))
        if pipeline.backfill is not None:
            jobs.append(backfill_job(pipeline))
        if refusal(pipeline) is None:  # its sinks can be rebuilt and swapped in
            jobs.append(rebuild_job(pipeline))
    inputs_asset = observable_inputs(list(sources.values()), list(pipelines), lowmark.root(), sinks)
    return dg.Definitions(
        assets=[*assets, *([inputs_asset] if sources else []), *dimensions.values()],
        jobs=jobs,
        sensors=sensors,
        schedules=schedules,
        resources={"spark": SparkResource(), "lowmark": lowmark},
    )


defs = build_definitions()
