"""Read-only views of a pipeline's checkpoint: ``status`` and ``history``.

Nothing here writes: a pipeline that never ran has no checkpoint, and status
says so (with the backlog waiting for its first batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batches.clock import Clock
from batches.microbatch import MicroBatchRunner
from batches.pipeline import Pipeline
from batches.poison import blocked
from batches.sources import build_source
from batches.sources.base import waiting
from state.checkpoint import Checkpoint
from state.commit_log import CommitEntry
from state.session import SparkLike


def pipeline_status(
    spark: SparkLike, pipeline: Pipeline, data_root: Path, clock: Clock | None = None
) -> dict[str, Any]:
    """The pipeline's position: committed batch, pending batch, next batch, offsets, backlog.

    Keys (stable, documented in the README): pipeline, checkpoint,
    checkpoint_exists, pipeline_id, last_committed_batch, pending_batch,
    next_batch {batch_id, replay, emit_only, reason} (what a run would do
    now, by the runner's own planning rule; None when there is nothing to
    do), end_offsets, watermark_ms, partitions [{partition,
    max_event_time_ms, watermark_ms, last_seen_ms}], backlog {files, bytes},
    totals {rows_in, rows_out, rows_bad, rows_late, ...}, accounting (where
    the records read went, see ``_accounting``), blocked (why the pending
    batch is not run again by itself: a poison batch, ``batches.poison``; else
    None).

    Reads the checkpoint on the driver only, a few rows of each log: the
    commit entry carries the running totals. ``spark`` may be a function
    that returns the session: it is called only if the source needs Spark
    (a folder on an object store), so a status of local folders starts none.
    """
    location = pipeline.checkpoint_location(data_root)
    status: dict[str, Any] = {
        "pipeline": pipeline.name,
        "checkpoint": location,
        "checkpoint_exists": False,
        "pipeline_id": None,
        "last_committed_batch": None,
        "pending_batch": None,
        "next_batch": None,
        "end_offsets": None,
        "watermark_ms": None,
        "partitions": [],
        "backlog": None,
        "totals": {"rows_in": 0, "rows_out": 0, "rows_bad": 0, "rows_late": 0},
        "accounting": _accounting(pipeline, {}),
        "blocked": None,
    }
    if not Checkpoint.exists(location):
        source = build_source(spark, pipeline, data_root, location, clock)
        backlog = source.backlog(source.initial_offsets())
        status["backlog"] = backlog
        if waiting(backlog):
            status["next_batch"] = _next(0, False, False, source.describe_backlog(backlog))
        return status
    runner = MicroBatchRunner(spark, pipeline, data_root, clock)
    ckpt = runner.checkpoint
    planned = runner.plan_next_batch(dry_run=True)
    latest, done = runner.position()
    if done is None:
        committed_entry = None
    elif latest is not None and latest.batch_id == done.batch_id:
        committed_entry = latest  # the usual case: nothing pending, no second read
    else:
        committed_entry = ckpt.offsets.get(done.batch_id)
    committed_end = committed_entry.end_offsets if committed_entry else runner.start_offsets
    backlog = runner.source.backlog(committed_end)
    if planned is None:
        next_batch = None
    elif planned.replay:
        next_batch = _next(
            planned.batch_id, True, False, f"batch {planned.batch_id} is uncommitted: replay it"
        )
    elif planned.end == planned.start:
        next_batch = _next(
            planned.batch_id, False, True, "the watermark moved: windows close without new data"
        )
    else:
        next_batch = _next(planned.batch_id, False, False, runner.source.describe_backlog(backlog))
    status.update(
        checkpoint_exists=True,
        pipeline_id=ckpt.pipeline_id,
        last_committed_batch=done.batch_id if done else None,
        pending_batch=(
            latest.batch_id
            if latest and (done is None or latest.batch_id > done.batch_id)
            else None
        ),
        next_batch=next_batch,
        end_offsets=committed_end if done else None,
        watermark_ms=done.next_watermark_ms if done else None,
        partitions=_partitions(runner, done),
        backlog=backlog,
        totals=done.totals if done else status["totals"],
        accounting=_accounting(pipeline, done.totals if done else {}),
        blocked=blocked(runner, planned) if planned is not None and planned.replay else None,
    )
    return status


def _accounting(pipeline: Pipeline, totals: dict[str, int]) -> dict[str, int]:
    """Where the records read went, over all committed batches.

    ``read = bad + dropped_by_transform + late + in_closed_windows +
    in_open_windows`` (windowed) or ``... + late + in_sink`` (stateless).
    """
    counts = {
        "read": totals.get("rows_in", 0),
        "bad": totals.get("rows_bad", 0),
        "dropped_by_transform": totals.get("rows_dropped", 0),
        "late": totals.get("rows_late", 0),
    }
    if pipeline.aggregation is None:
        return counts | {"in_sink": totals.get("rows_out", 0)}
    closed = totals.get("rows_closed", 0)
    return counts | {
        "in_closed_windows": closed,
        "in_open_windows": totals.get("rows_windowed", 0) - closed,
    }


def _partitions(runner: MicroBatchRunner, done: CommitEntry | None) -> list[dict[str, Any]]:
    """Per source partition, its times as of the commit ``done`` (by partition)."""
    event_time = runner.pipeline.event_time
    if done is None or event_time is None:
        return []
    times = sorted(runner.partition_times(done).values(), key=lambda t: t.partition)
    return [
        {
            "partition": t.partition,
            "max_event_time_ms": t.max_event_time_ms,
            "watermark_ms": t.watermark_ms(event_time),
            "last_seen_ms": t.last_seen_ms,
        }
        for t in times
    ]


def _next(batch_id: int, replay: bool, emit_only: bool, reason: str) -> dict[str, Any]:
    return {"batch_id": batch_id, "replay": replay, "emit_only": emit_only, "reason": reason}


def pipeline_history(
    pipeline: Pipeline, data_root: Path, last: int | None = None
) -> list[dict[str, Any]]:
    """Progress rows, oldest first (the newest ``last`` if given), as plain dicts."""
    location = pipeline.checkpoint_location(data_root)
    if not Checkpoint.exists(location):
        return []
    progress = Checkpoint(location, pipeline.name).progress
    newest = progress.latest_batch_id()
    start = None if last is None or newest is None else newest - last + 1
    entries = progress.get_range(start=start)
    if last is not None:
        entries = entries[-last:]
    return [e.model_dump(mode="json") for e in entries]


@dataclass(frozen=True)
class PendingWork:
    """The batch a run would start with, and why (what a Dagster sensor asks)."""

    batch_id: int
    replay: bool
    reason: str


def pending_work(status: dict[str, Any]) -> PendingWork | None:
    """The next batch ``status`` (from ``pipeline_status``) calls for, or None when idle
    or blocked (a poison batch)."""
    nxt = status["next_batch"]
    if nxt is None or status["blocked"]:
        return None
    return PendingWork(nxt["batch_id"], nxt["replay"], nxt["reason"])
