"""The input assets as lowmark observes them: what waits for each pipeline.

An input (``lowmark/sources/<kind>_<path>``) is written by others, so Dagster
never materializes it. What waits there for a pipeline — the source's backlog
(files, records, versions) past its committed batch — is recorded as an
observation of each of the pipeline's inputs:

- by the pipeline's run after each batch it commits (``lowmark.orchestration.reporting``),
  so it is current while a run follows the source;
- by each sensor tick that reads the pipeline's position (no run in flight;
  ``lowmark.batches.admin.status``, no Spark), when it differs from the newest
  observation of the pipeline recorded for that input (``changed_observations``):
  files that landed after the last run ended;
- by the input's Observe button (the inputs are observable sources:
  ``observable_inputs``), on demand.

A tick also observes the pipeline's sink when the definition changes its next batch takes
(compatible ones, ``lowmark.batches.evolution``) differ from the newest it recorded
(``definition_observations``).

Pipelines reading one input each observe it under their own name, as the backlog is per
checkpoint (``<pipeline>/waiting_<unit>``, plotted).
"""

# No `from __future__ import annotations`: Dagster reads the observation function's
# annotations at definition time to find its resources.
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import dagster as dg

from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.pipeline import Pipeline, UnionSource
from lowmark.orchestration.keys import GROUP, Sinks, sink_key, source_key
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


OBSERVATIONS_LOOKED_AT = 20
"""A tick looks for the newest observation of the pipeline among this many of an input's
newest observations (the others are of the pipelines reading the same input)."""


def changed_observations(
    instance: dg.DagsterInstance, pipeline: Pipeline, observations: Sequence[dg.AssetObservation]
) -> list[dg.AssetObservation]:
    """Those of ``observations`` (``input_observations``) whose numbers differ from the
    newest observation of ``pipeline`` recorded for that input (by a tick, a run's batch or
    Observe): a tick every 5 s would otherwise record 17,280 a day of the same numbers."""
    return [o for o in observations if _newest(instance, pipeline, o.asset_key) != o.metadata]


def _newest(
    instance: dg.DagsterInstance, pipeline: Pipeline, key: dg.AssetKey
) -> dict[str, dg.MetadataValue] | None:
    """The numbers of the newest observation of ``key`` recorded for ``pipeline``."""
    prefix = f"{pipeline.name}/waiting_"
    for record in instance.fetch_observations(key, limit=OBSERVATIONS_LOOKED_AT).records:
        observation = record.asset_observation
        if observation is None:  # typed optional; an observation record always has one
            continue
        mine = {k: v for k, v in observation.metadata.items() if k.startswith(prefix)}
        if mine:
            return mine
    return None


PENDING_CHANGE = "pending_definition_change"
"""The metadata key of a sink observation naming the definition changes the pipeline's next
batch takes (``definition_observations``)."""


def definition_observations(
    instance: dg.DagsterInstance, pipeline: Pipeline, pending: Sequence[Mapping[str, object]]
) -> list[dg.AssetObservation]:
    """An observation of ``pipeline``'s sink naming the ``pending`` definition changes
    (``PipelineStatus.pending_changes``: compatible ones, which its next batch takes), or
    ``none`` once a batch took them, when that differs from the newest one recorded: the
    asset shows a change waiting for its boundary, and each only once."""
    said = "; ".join(f"{c['field']} ({c['class']}: {c['kind']})" for c in pending) or "none"
    key = sink_key(pipeline)
    newest = None
    for record in instance.fetch_observations(key, limit=OBSERVATIONS_LOOKED_AT).records:
        observation = record.asset_observation
        if observation is not None and PENDING_CHANGE in observation.metadata:
            newest = observation.metadata[PENDING_CHANGE].value
            break
    if newest == said or (newest is None and not pending):
        return []
    described = (
        f"{pipeline.name}: definition changes its next batch takes"
        if pending
        else (f"{pipeline.name}: no definition change pending")
    )
    return [dg.AssetObservation(key, description=described, metadata={PENDING_CHANGE: said})]


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
            status = pipeline_status(spark.session, pipeline, lowmark.root(), definitions=False)
            for event in input_observations(
                pipeline, selected, status.backlog, status.backlog_described
            ):
                metadata.setdefault(event.asset_key, {}).update(event.metadata)
        for key, values in metadata.items():
            yield dg.ObserveResult(asset_key=key, metadata=values)

    return _observe
