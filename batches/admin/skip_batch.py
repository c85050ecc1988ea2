"""``lowmark skip-batch``: commit a poison batch without its input, on purpose.

The batch's input is recorded in ``bad_records`` (one row per input item,
with the reason), its window state is put back as the commit before it left
it, and an empty commit (the one commit path, ``lowmark.batches.loop.commit``) lets
the pipeline go on. Nothing is dropped silently: the rows say which input
was set aside and why, to be reprocessed once the transform is fixed
(``lowmark.batches.loop.poison``, docs/guarantees.md).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from lowmark.batches.clock import Clock
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.event_time.stage import WindowedStage
from lowmark.batches.loop.commit import commit_batch
from lowmark.batches.loop.parts import build_parts
from lowmark.batches.loop.plan import PlannedBatch
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.sinks.fan_out import landed_in
from lowmark.state import quarantine
from lowmark.state.commit_log import BatchCounts
from lowmark.state.errors import CheckpointCorrupt
from lowmark.state.session import SparkLike
from lowmark.state.storage import open_table


@dataclass(frozen=True)
class SetAside:
    """What ``set_aside`` did."""

    batch_id: int
    inputs: list[str]
    state_restored_to: int | None
    """The window state version put back (None: the batch wrote no state)."""


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
    restored = _restore_state(parts.stage, planned)
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
    ckpt.bad_records.append_once(table, ckpt.txn_app_id("skipped"), batch_id)
    previous = planned.previous
    versions = dict(previous.table_versions) if previous else {}
    if parts.stage is not None and parts.stage.state.table.exists():
        versions["state"] = parts.stage.state.table.version()
    # The partition times stay as the batch before left them: it saw no event time.
    times = (
        parts.planner.partition_times(previous)
        if previous is not None and pipeline.event_time is not None
        else None
    )
    runner_id = str(uuid.uuid4())
    commit_batch(
        ckpt, pipeline, planned, runner_id, planned.watermark_ms, versions, times, BatchCounts()
    )
    return SetAside(batch_id, inputs, restored)


def _restore_state(stage: WindowedStage | None, planned: PlannedBatch) -> int | None:
    """Put the window state back as commit N-1 left it, if batch N's state write landed."""
    if stage is None or not stage.state.table.landed(stage.state.txn_app_id, planned.batch_id):
        return None
    recorded = planned.previous.table_versions.get("state") if planned.previous else None
    table = open_table(stage.state.path)
    if recorded is None:  # no state before this batch: it held no windows
        table.delete()
        return None
    try:
        table.restore(recorded)
    except Exception as exc:  # delta-rs raises plain exceptions for a log or files gone
        raise CheckpointCorrupt(
            f"window state table {stage.state.path} no longer has version {recorded}, the "
            f"state batch {planned.batch_id} is set aside to (a VACUUM with a retention shorter "
            "than the time since the crash removed its files): restore them from backup, or "
            "start over with `lowmark reset`"
        ) from exc
    return recorded
