"""The input assets as the sensors observe them: what waits for each pipeline.

An input (``lowmark/sources/<kind>_<path>``) is written by others, so Dagster
never materializes it; each sensor tick that reads the pipeline's position
(``lowmark.batches.admin.status``, no Spark) records an observation of each of the
pipeline's inputs when what waits there changed since the last one it
recorded: the source's backlog (files, records, versions) past the committed
batch. The inputs are observable sources (``observable_inputs``): their page's Observe
button records the same on demand. Pipelines reading one input each observe it under their
own name, as the backlog is per checkpoint (``<pipeline>/waiting_<unit>``, plotted).
"""

# No `from __future__ import annotations`: Dagster reads the observation function's
# annotations at definition time to find its resources.
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import dagster as dg

from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.pipeline import Pipeline, UnionSource
from lowmark.orchestration.keys import GROUP, Sinks, source_key
from lowmark.orchestration.resources import LowmarkResource, SparkResource

ONLY = ""
"""The name of a pipeline's source when it is not a union."""


def observed_inputs(pipeline: Pipeline, data_root: Path, sinks: Sinks) -> dict[str, dg.AssetKey]:
    """The input assets of ``pipeline`` the sensor observes, by source name in a union
    (``ONLY`` for a single source); another pipeline's sink is that pipeline's to report."""
    source = pipeline.source
    named = source.sources if isinstance(source, UnionSource) else {ONLY: source}
    keys = {name: source_key(one, data_root, sinks) for name, one in named.items()}
    return {name: key for name, key in keys.items() if key not in sinks.values()}


def input_observations(
    pipeline: Pipeline,
    inputs: Mapping[str, dg.AssetKey],
    backlog: dict[str, int],
    described: str,
) -> list[dg.AssetObservation]:
    """One observation per input in ``inputs`` of what waits there for ``pipeline``
    (``backlog``: ``Source.backlog``, a union's units named ``<source>.<unit>``;
    ``described``: it in words)."""
    events = []
    for name, key in inputs.items():
        prefix = f"{name}." if name != ONLY else ""
        mine = {u[len(prefix) :]: n for u, n in backlog.items() if u.startswith(prefix)}
        metadata: dict[str, dg.RawMetadataValue] = {
            f"{pipeline.name}/waiting_{unit}": n for unit, n in mine.items()
        }
        events.append(
            dg.AssetObservation(
                key, description=f"for {pipeline.name}: {described}", metadata=metadata
            )
        )
    return events


def backlog_cursor(backlog: dict[str, int]) -> str:
    """The sensor's cursor: the backlog last observed, to record an observation only when
    it changed (a tick every 30 s would otherwise record 2,880 a day)."""
    return json.dumps(backlog, sort_keys=True)


def observable_inputs(
    specs: Sequence[dg.AssetSpec], pipelines: Sequence[Pipeline], data_root: Path, sinks: Sinks
) -> dg.AssetsDefinition:
    """The input assets ``specs`` as observable sources: their Observe button in the UI (or
    any run of them) records what waits in each selected input for each of ``pipelines``
    reading it, as the sensor's ticks do; their pages then show when they were last
    observed. Reads positions only: no Spark starts."""
    readers = [(p, observed_inputs(p, data_root, sinks)) for p in pipelines]

    @dg.multi_observable_source_asset(
        specs=list(specs),
        name="lowmark_inputs",
        description="What waits in each input of the lowmark pipelines.",
        can_subset=True,
        group_name=GROUP,
    )
    def _observe(
        context: dg.AssetExecutionContext, spark: SparkResource, lowmark: LowmarkResource
    ) -> Iterator[dg.ObserveResult]:
        metadata: dict[dg.AssetKey, dict[str, dg.RawMetadataValue]] = {}
        for pipeline, inputs in readers:
            selected = {n: k for n, k in inputs.items() if k in context.selected_asset_keys}
            if not selected:
                continue
            status = pipeline_status(spark.session, pipeline, lowmark.root())
            for event in input_observations(
                pipeline, selected, status.backlog, status.backlog_described
            ):
                metadata.setdefault(event.asset_key, {}).update(event.metadata)
        for key, values in metadata.items():
            yield dg.ObserveResult(asset_key=key, metadata=values)

    return _observe
