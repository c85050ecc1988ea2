"""The input assets as the sensors observe them: what waits for each pipeline.

An input (``lowmark/sources/<kind>_<path>``) is written by others, so Dagster
never materializes it; each sensor tick that reads the pipeline's position
(``lowmark.batches.admin.status``, no Spark) records an observation of each of the
pipeline's inputs when what waits there changed since the last one it
recorded: the source's backlog (files, records, versions) past the committed
batch. Pipelines reading one input each observe it under their own name, as
the backlog is per checkpoint (``<pipeline>/waiting_<unit>``, plotted).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from lowmark.batches.pipeline import Pipeline, UnionSource
from lowmark.orchestration.keys import Sinks, source_key

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
