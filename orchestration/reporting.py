"""Each committed batch as the materializations Dagster records (see ``orchestration.metadata``).

One ``BatchReports`` per runner: it remembers the watermark each batch ran
with and the event-time partitions already reported, so every partition is
reported once, by the batch that made it final. Used by the pipeline's runs
(logged as run events) and by the CLI (reported to the instance in
``DAGSTER_HOME`` as runless events).
"""

from __future__ import annotations

import dagster as dg

from batches.loop.microbatch import BatchResult, MicroBatchRunner
from batches.pipeline import Pipeline
from orchestration.keys import sink_key
from orchestration.metadata import batch_materializations
from orchestration.partitions import final_partition_keys


class BatchReports:
    """The materializations of each batch ``runner`` commits, in order."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        pipeline: Pipeline,
        runner: MicroBatchRunner,
        partitions: dg.PartitionsDefinition | None,
    ) -> None:
        self.pipeline = pipeline
        self.source = runner.source
        self.partitions = (
            partitions if isinstance(partitions, dg.TimeWindowPartitionsDefinition) else None
        )
        _, done = runner.planner.position()
        self.ran_with_ms = done.next_watermark_ms if done else None
        self.reported = (
            set(instance.get_materialized_partitions(sink_key(pipeline)))
            if self.partitions is not None
            else set()
        )

    def of(self, r: BatchResult) -> list[dg.AssetMaterialization]:
        """Batch ``r``'s materializations: call once per committed batch, in order."""
        final: list[str] = []
        if self.partitions is not None:
            final = [
                key
                for key in final_partition_keys(self.pipeline, self.partitions, self.ran_with_ms)
                if key not in self.reported
            ]
            self.reported.update(final)
        self.ran_with_ms = r.watermark_ms
        return batch_materializations(self.pipeline, r, self.source.backlog(r.end), final)
