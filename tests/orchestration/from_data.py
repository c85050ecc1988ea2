"""A pipeline whose event-time partitions start where its sink's data starts (no
``backfill.start``), as the demo's do: loaded by ``--pipelines tests.orchestration.from_data``."""

from __future__ import annotations

import tests.orchestration.pipelines as base
from lowmark.batches.pipeline import EventTimePartitions

ticks_from_data = base.ticks.model_copy(
    update={"name": "ticks_from_data", "backfill": EventTimePartitions(granularity="hourly")}
)
