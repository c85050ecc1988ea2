"""``lowmark skip-batch``: commit a poison batch without its input, on purpose.

The batch's input is recorded in ``bad_records`` (one row per input item,
with the reason, in place of the rows its own attempts quarantined), every
state table (window state, seen ids, keyed state and timers, join state:
``lowmark.state.state_table``) is put back as the commit before it left it,
and an empty commit (the one commit path, ``lowmark.batches.loop.commit``)
lets the pipeline go on. Nothing is dropped silently: the rows say which
input was set aside and why, to be reprocessed once the transform is fixed
(``lowmark.batches.loop.poison``, docs/guarantees.md).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from lowmark.batches.clock import Clock
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.loop.commit import commit_batch
from lowmark.batches.loop.parts import build_parts
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.sinks.fan_out import landed_in
from lowmark.state import quarantine
from lowmark.state.commit_log import BatchCounts
from lowmark.state.session import SparkLike


@dataclass(frozen=True)
class SetAside:
    """What ``set_aside`` did."""

    batch_id: int
    inputs: list[str]
    restored: dict[str, int | None]
    """Each state table the batch had changed, by role, and the version put back (None:
    the table holds nothing now)."""


def set_aside(
    spark: SparkLike,
    pipeline: Pipeline,
    data_root: Path,
    batch_id: int,
    reason: str,
    clock: Clock | None = None,
) -> SetAside:
    """Commit ``pipeline``'s uncommitted batch ``batch_id`` without its input (see the
    module doc). Starts no Spark over local folders."""
    parts = build_parts(spark, pipeline, data_root, clock)
    planned = parts.planner.next_batch(dry_run=True).planned
    name = pipeline.name
    if planned is None or not planned.replay or planned.batch_id != batch_id:
        pending = f"batch {planned.batch_id}" if planned and planned.replay else "none"
        raise PipelineConfigInvalid(
            f"batch {batch_id} of {name} is not its uncommitted batch (uncommitted: {pending}): "
            "only a batch that was planned and never committed can be set aside"
        )
    ckpt = parts.checkpoint
    if landed := landed_in(parts.sink, batch_id):
        sinks = pipeline.sinks()
        held = ", ".join(f"{each} ({sinks[each].label})" for each in landed)
        raise PipelineConfigInvalid(
            f"batch {batch_id} of {name} already landed in {held}: set aside, its rows would "
            "stay there and land again when its input is fed anew; fix what stopped it and run "
            f"`lowmark run {name} --retry` to finish it"
        )
    recorded = planned.previous.table_versions if planned.previous else {}
    restored = {
        state.role: state.restore(recorded, batch_id)
        for state in parts.work.steps.tables
        if state.landed(batch_id) or state.version_after() != state.recorded(recorded)
    }
    inputs = parts.source.inputs(planned.start, planned.end)
    rows = [
        {
            "batch_id": batch_id,
            "source_file": item,
            "raw": None,
            "reason": f"set aside by lowmark skip-batch: {reason}",
        }
        for item in inputs
    ]
    table = pa.Table.from_pylist(rows, schema=quarantine.SCHEMA)
    skipped = ckpt.txn_app_id("skipped")
    if not ckpt.bad_records.landed(skipped, batch_id):
        # The rows the batch's own attempt quarantined go: its input is recorded whole
        # instead, and fed again it quarantines them anew.
        ckpt.bad_records.delete(f'"batch_id" = {batch_id}', batch_id)
    ckpt.bad_records.append_once(table, skipped, batch_id)
    previous = planned.previous
    versions = parts.work.steps.versions_after()
    # The partition times stay as the batch before left them: it saw no event time.
    times = (
        parts.planner.partition_times(previous)
        if previous is not None and pipeline.event_time is not None
        else None
    )
    runner_id = str(uuid.uuid4())
    # A keyed step's timers stay due as the batch before left them.
    next_timer = previous.next_timer_ms if previous is not None else None
    commit_batch(
        ckpt,
        pipeline,
        planned,
        runner_id,
        planned.watermark_ms,
        versions,
        times,
        BatchCounts(),
        next_timer,
    )
    return SetAside(batch_id, inputs, restored)
