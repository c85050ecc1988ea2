"""Checkpoint maintenance of one pipeline on demand (``lowmark compact``, the daily Dagster
schedule): what a batch does by itself every ``maintenance.every_batches`` batches.

Starts no Spark over local folders, and is safe while the pipeline runs or waits for a replay:
it never drops the latest log entries, keeps the window state version the last commit recorded
(what a pending replay and a backfill read), and a table a batch is writing at that moment is
left for the next time (``lowmark.state.maintenance``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lowmark.batches.loop.steps import found_state_tables
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.sources import build_source
from lowmark.batches.sources.base import Range, Source
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.maintenance import KeptBatches, maintain
from lowmark.state.session import SparkLike


@dataclass(frozen=True)
class Maintained:
    """What ``maintain_checkpoint`` did: tables maintained, and the batches the logs keep."""

    tables: int
    first_kept: int
    last_committed: int


def maintain_checkpoint(spark: SparkLike, pipeline: Pipeline, data_root: Path) -> Maintained | None:
    """Run maintenance of ``pipeline``'s checkpoint now; None when it has no committed batch yet."""
    location = pipeline.checkpoint_location(data_root)
    if not Checkpoint.exists(location):
        return None
    ckpt = Checkpoint(location, pipeline.name)
    done = ckpt.commits.get_latest()
    if done is None:
        return None
    maintenance = pipeline.maintenance
    source = build_source(spark, pipeline, data_root, ckpt)
    offsets = ckpt.offsets.get(done.batch_id)
    assert offsets is not None, "a committed batch always has its offsets"
    batch = Range(done.batch_id, offsets.start_offsets, offsets.end_offsets)
    ran = (offsets.created_ms, done.next_watermark_ms)
    tables = maintain_after(ckpt, source, batch, pipeline, done.table_versions, ran)
    return Maintained(tables, max(0, done.batch_id - maintenance.log_batches + 1), done.batch_id)


def maintain_after(
    checkpoint: Checkpoint,
    source: Source,
    committed: Range,
    pipeline: Pipeline,
    recorded: dict[str, int],
    ran: tuple[int, int | None],
) -> int:
    """Maintain ``pipeline``'s ``checkpoint`` after batch ``committed`` as its
    ``maintenance`` sets: the source's bookkeeping first (``Source.retire``), then every
    table, keeping each state table at the version ``committed``'s commit recorded
    (``recorded``) and dropping the keyed states expired as of ``ran`` (the committed
    batch's processing time and the watermark it left); tables maintained."""
    maintenance, keyed = pipeline.maintenance, pipeline.keyed
    expiry = keyed.expiry(*ran) if keyed is not None else None
    source.retire(committed.end, committed.batch_id)
    keep = KeptBatches(maintenance.log_batches, maintenance.progress_batches)
    state = found_state_tables(checkpoint.location, checkpoint.pipeline_id)
    return maintain(checkpoint, committed.batch_id, keep, recorded, state, expiry)
