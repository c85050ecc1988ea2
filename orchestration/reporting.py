"""Each committed batch as the events Dagster records: materializations (see
``lowmark.orchestration.metadata``) and observations of what still waits in each
input (``lowmark.orchestration.observations``).

One ``BatchReports`` per runner: it remembers the watermark each batch ran
with and the event-time partitions already reported, so every partition is
reported once, by the batch that made it final; after each batch it reads
the pipeline's tables on the driver (``lowmark.orchestration.tables``: row counts,
schemas, open windows, a final partition's rows). Used by the pipeline's runs
(logged as run events) and by the CLI (reported to the instance in
``DAGSTER_HOME`` as runless events, with the checks: ``lowmark.orchestration.cli``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import dagster as dg

from lowmark.batches.admin.tables import TABLES, table_path
from lowmark.batches.loop.microbatch import BatchResult, MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, Pipeline
from lowmark.orchestration.keys import sink_key
from lowmark.orchestration.metadata import TablesRead, batch_materializations
from lowmark.orchestration.observations import input_observations
from lowmark.orchestration.partitions import final_partition_keys
from lowmark.orchestration.tables import (
    keyed_held,
    open_windows,
    partition_rows,
    table_metadata,
)

Partitions = Callable[[], dg.PartitionsDefinition | None]
"""The sink's partitions as of now: a run's are its asset's (what the UI shows); the CLI's
are derived from the sink after each batch, as the UI derives them when it loads."""


class BatchReports:
    """The events of each batch ``runner`` commits, in order; ``inputs``: the input assets
    observed after each batch, by source name (``observations.observed_inputs``)."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        pipeline: Pipeline,
        runner: MicroBatchRunner,
        data_root: Path,
        partitions: Partitions,
        inputs: Mapping[str, dg.AssetKey],
    ) -> None:
        self.pipeline = pipeline
        self.inputs = inputs
        self.source = runner.source
        self.data_root = data_root
        self.partitions = partitions
        _, done = runner.planner.position()
        self.ran_with_ms = done.next_watermark_ms if done else None
        self.reported = (
            set(instance.get_materialized_partitions(sink_key(pipeline)))
            if pipeline.backfill is not None
            else set()
        )

    def of(self, r: BatchResult) -> list[dg.AssetMaterialization | dg.AssetObservation]:
        """Batch ``r``'s materializations, then the observations of what waits in each input
        past it: call once per committed batch, in order."""
        tables = self._read(r)
        partitions = self.partitions()
        if isinstance(partitions, dg.TimeWindowPartitionsDefinition):
            sink = self._path("sink")
            for key in final_partition_keys(self.pipeline, partitions, self.ran_with_ms):
                if key not in self.reported:
                    window = partitions.time_window_for_partition_key(key)
                    tables.partitions[key] = partition_rows(sink, window.start, window.end)
                    self.reported.add(key)
        self.ran_with_ms = r.watermark_ms
        backlog = self.source.backlog(r.end)
        described = self.source.describe_backlog(backlog)
        return [
            *batch_materializations(self.pipeline, r, backlog, tables),
            *input_observations(self.pipeline, self.inputs, backlog, described),
        ]

    def _read(self, r: BatchResult) -> TablesRead:
        """The tables' metadata after batch ``r`` (what has expired by its commit's
        processing time and the watermark it leaves)."""
        pipeline = self.pipeline
        sink: dict[str, dg.RawMetadataValue] = {}
        if isinstance(pipeline.sink, DeltaSink):
            sink = table_metadata(self._path("sink"))
        if pipeline.aggregation is not None:
            sink |= open_windows(pipeline, self._path("state"))
        if pipeline.keyed is not None:
            expiry = (
                pipeline.keyed.expiry(r.committed_at_ms, r.watermark_ms)
                if r.committed_at_ms is not None
                else None
            )
            sink |= keyed_held(self._path("keyed_state"), self._path("keyed_timers"), expiry)
        late = table_metadata(self._path("late")) if pipeline.event_time is not None else {}
        return TablesRead(sink=sink, late=late, bad=table_metadata(self._path("bad")))

    def _path(self, table: str) -> str:
        return table_path(self.pipeline.catalog_entry(self.data_root), TABLES[table])
