"""Read-only views of a pipeline's checkpoint: ``status`` and ``history``.

Nothing here writes: a pipeline that never ran has no checkpoint, and status
says so (with the backlog waiting for its first batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from batches.pipeline import Pipeline
from batches.sources import build_source
from state.checkpoint import Checkpoint
from state.watermarks import WatermarkTable


def pipeline_status(spark: SparkSession, pipeline: Pipeline, data_root: Path) -> dict[str, Any]:
    """The pipeline's position: committed batch, pending batch, offsets, backlog.

    Keys (stable, documented in the README): pipeline, checkpoint,
    checkpoint_exists, pipeline_id, last_committed_batch, pending_batch,
    end_offsets, watermark_ms, partitions [{partition, max_event_time_ms,
    watermark_ms, last_seen_ms}], backlog {files, bytes}, totals {rows_in,
    rows_out, rows_bad, rows_late}.
    """
    location = pipeline.checkpoint_location(data_root)
    status: dict[str, Any] = {
        "pipeline": pipeline.name,
        "checkpoint": location,
        "checkpoint_exists": False,
        "pipeline_id": None,
        "last_committed_batch": None,
        "pending_batch": None,
        "end_offsets": None,
        "watermark_ms": None,
        "partitions": [],
        "backlog": None,
        "totals": {"rows_in": 0, "rows_out": 0, "rows_bad": 0, "rows_late": 0},
    }
    if not Checkpoint.exists(spark, location):
        source = build_source(spark, pipeline, data_root, location, "")
        status["backlog"] = source.backlog(source.initial_offsets())
        return status
    ckpt = Checkpoint(spark, location, pipeline.name)
    latest = ckpt.offsets.get_latest()
    commits = ckpt.commits.get_range()
    done = commits[-1] if commits else None
    source = build_source(spark, pipeline, data_root, location, ckpt.pipeline_id)
    committed_entry = ckpt.offsets.get(done.batch_id) if done else None
    committed_end = committed_entry.end_offsets if committed_entry else source.initial_offsets()
    status.update(
        checkpoint_exists=True,
        pipeline_id=ckpt.pipeline_id,
        last_committed_batch=done.batch_id if done else None,
        pending_batch=(
            latest.batch_id
            if latest and (done is None or latest.batch_id > done.batch_id)
            else None
        ),
        end_offsets=committed_end if done else None,
        watermark_ms=done.next_watermark_ms if done else None,
        partitions=[
            dict(
                zip(
                    ("partition", "max_event_time_ms", "watermark_ms", "last_seen_ms"),
                    row,
                    strict=True,
                )
            )
            for row in (
                WatermarkTable(spark, ckpt.table("watermarks"), "").as_of(done.batch_id)
                if done
                else []
            )
        ],
        backlog=source.backlog(committed_end),
        totals={
            key: sum(getattr(c, key) for c in commits)
            for key in ("rows_in", "rows_out", "rows_bad", "rows_late")
        },
    )
    return status


def pipeline_history(
    spark: SparkSession, pipeline: Pipeline, data_root: Path, last: int | None = None
) -> list[dict[str, Any]]:
    """Progress rows, oldest first (the newest ``last`` if given), as plain dicts."""
    location = pipeline.checkpoint_location(data_root)
    if not Checkpoint.exists(spark, location):
        return []
    entries = Checkpoint(spark, location, pipeline.name).progress.get_range()
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
    """The next batch ``status`` (from ``pipeline_status``) calls for, or None when idle.

    An uncommitted batch is replayed first; otherwise a batch is due when files
    wait past the committed end.
    """
    pending = status["pending_batch"]
    if pending is not None:
        return PendingWork(pending, True, f"batch {pending} is uncommitted: replay it")
    backlog = status["backlog"] or {"files": 0, "bytes": 0}
    if backlog["files"]:
        last = status["last_committed_batch"]
        batch_id = 0 if last is None else last + 1
        return PendingWork(
            batch_id, False, f"{backlog['files']} new files ({backlog['bytes']} bytes) waiting"
        )
    return None
