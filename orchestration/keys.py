"""Names Dagster knows a pipeline's objects by: asset keys, the run tag, the pool."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import dagster as dg

from lowmark.batches.pipeline import (
    DeltaSink,
    DeltaSource,
    OneSource,
    Pipeline,
    UnionSource,
    resolve,
)
from lowmark.batches.table_join import TableJoin

GROUP = "lowmark"
PIPELINE_TAG = "lowmark/pipeline"
"""Every run of a pipeline the sensor or a job launches carries ``lowmark/pipeline=<name>``."""
YIELDED_TO_TAG = "lowmark/yielded_to"
"""On a following run that stopped for a run of its pipeline queued behind it: that run's id."""
FOLLOW_UNTIL_TAG = "lowmark/follow_until"
"""Beside ``YIELDED_TO_TAG``: when the run's follow window would have ended (ISO 8601 UTC)."""


def sink_key(pipeline: Pipeline) -> dg.AssetKey:
    return dg.AssetKey([GROUP, pipeline.name])


def extra_sink_keys(pipeline: Pipeline) -> dict[str, dg.AssetKey]:
    """Each extra sink's asset (``Pipeline.extra_sinks``), by the sink's name."""
    return {n: dg.AssetKey([GROUP, f"{pipeline.name}_sink_{n}"]) for n in pipeline.extra_sinks}


def late_key(pipeline: Pipeline) -> dg.AssetKey:
    return dg.AssetKey([GROUP, f"{pipeline.name}_late"])


def bad_records_key(pipeline: Pipeline) -> dg.AssetKey:
    return dg.AssetKey([GROUP, f"{pipeline.name}_bad_records"])


def inputs(pipeline: Pipeline) -> list[OneSource]:
    """What ``pipeline`` reads: its source, or each source of a union."""
    source = pipeline.source
    return list(source.sources.values()) if isinstance(source, UnionSource) else [source]


Sinks = Mapping[str, dg.AssetKey]
"""Sink assets by the location of their table (``sink_locations``)."""


def sink_locations(pipelines: Iterable[Pipeline], data_root: Path) -> dict[str, dg.AssetKey]:
    """Each pipeline's sink asset, by where its table lives."""
    return {
        resolve(p.sink.path, data_root): sink_key(p)
        for p in pipelines
        if isinstance(p.sink, DeltaSink)
    }


def source_key(source: OneSource, data_root: Path, sinks: Sinks) -> dg.AssetKey:
    """An input: a Delta table another pipeline writes is that pipeline's sink asset (so
    the asset graph shows one pipeline feeding the next); any other input is named by its
    kind and what it reads (pipelines reading one input share it)."""
    if isinstance(source, DeltaSource):
        upstream = sinks.get(resolve(source.path, data_root))
        if upstream is not None:
            return upstream
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", source.label).strip("_")
    return dg.AssetKey([GROUP, "sources", f"{source.kind}_{slug}"])


def dimension_key(join: TableJoin, data_root: Path, sinks: Sinks) -> dg.AssetKey:
    """A table a pipeline joins its records with: another pipeline's sink asset if one
    writes it, else ``lowmark/dimensions/<table>``."""
    upstream = sinks.get(resolve(join.table, data_root))
    if upstream is not None:
        return upstream
    return dg.AssetKey([GROUP, "dimensions", re.sub(r"[^A-Za-z0-9_]+", "_", join.table).strip("_")])


def upstream_keys(pipeline: Pipeline, data_root: Path, sinks: Sinks) -> list[dg.AssetKey]:
    """What ``pipeline``'s tables are computed from: its inputs, then its joined tables."""
    keys = [source_key(source, data_root, sinks) for source in inputs(pipeline)]
    return keys + [dimension_key(join, data_root, sinks) for join in pipeline.joins]


def pool(pipeline: Pipeline) -> str:
    """The concurrency pool of every run that runs batches or backfills ``pipeline``:
    ``dagster.yaml`` gives each pool one slot, so they never overlap."""
    return f"lowmark_{pipeline.name}"


def batch_run_key(pipeline: Pipeline, pipeline_id: str | None, batch_id: int) -> str:
    """The sensor's ``run_key`` for a run that starts with batch ``batch_id`` of the
    checkpoint ``pipeline_id`` (None: there is none yet).

    Dagster launches one run per key, ever: the checkpoint's id makes batch 0 of a
    checkpoint ``lowmark reset`` created a key no earlier checkpoint used.
    """
    return f"{pipeline.name}:{pipeline_id or 'new'}:batch-{batch_id}"


def resume_run_key(pipeline: Pipeline, yielded_run_id: str) -> str:
    """The sensor's ``run_key`` for the run that follows the rest of the window of the run
    ``yielded_run_id``, which yielded its slot: one resuming run per yield."""
    return f"{pipeline.name}:resume-after-{yielded_run_id}"


def asset_op(pipeline: Pipeline) -> str:
    """The op of ``pipeline``'s assets: run config goes under ``ops: {<this>: {config: …}}``."""
    return f"{pipeline.name}_batches"
