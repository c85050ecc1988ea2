"""Names Dagster knows a pipeline's objects by: asset keys, the run tag, the pool."""

from __future__ import annotations

import re

import dagster as dg

from batches.pipeline import OneSource, Pipeline, UnionSource

GROUP = "lowmark"
PIPELINE_TAG = "lowmark/pipeline"
"""Every run of a pipeline the sensor or a job launches carries ``lowmark/pipeline=<name>``."""


def sink_key(pipeline: Pipeline) -> dg.AssetKey:
    return dg.AssetKey([GROUP, pipeline.name])


def late_key(pipeline: Pipeline) -> dg.AssetKey:
    return dg.AssetKey([GROUP, f"{pipeline.name}_late"])


def bad_records_key(pipeline: Pipeline) -> dg.AssetKey:
    return dg.AssetKey([GROUP, f"{pipeline.name}_bad_records"])


def inputs(pipeline: Pipeline) -> list[OneSource]:
    """What ``pipeline`` reads: its source, or each source of a union."""
    source = pipeline.source
    return list(source.sources.values()) if isinstance(source, UnionSource) else [source]


def source_key(source: OneSource) -> dg.AssetKey:
    """An input, named by its kind and what it reads (pipelines reading one input share it)."""
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", source.label).strip("_")
    return dg.AssetKey([GROUP, "sources", f"{source.kind}_{slug}"])


def pool(pipeline: Pipeline) -> str:
    """The concurrency pool of every run that runs batches or backfills ``pipeline``:
    ``dagster.yaml`` gives each pool one slot, so they never overlap."""
    return f"lowmark_{pipeline.name}"


def asset_op(pipeline: Pipeline) -> str:
    """The op of ``pipeline``'s assets: run config goes under ``ops: {<this>: {config: …}}``."""
    return f"{pipeline.name}_batches"
