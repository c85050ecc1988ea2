"""Checkpoint maintenance of one pipeline on demand (``lowmark compact``, the daily Dagster
schedule): what a batch does by itself every ``maintenance.every_batches`` batches.

Starts no Spark, and is safe while the pipeline runs: it never drops the
latest log entries, and a table a batch is writing at that moment is left
for the next time (``state.maintenance``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from batches.pipeline import Maintenance, Pipeline
from state.checkpoint import Checkpoint
from state.maintenance import Retention, tidy
from state.table import DriverTable


@dataclass(frozen=True)
class Compaction:
    """What ``compact_checkpoint`` did: tables tidied, and the batches the logs keep."""

    tables: int
    first_kept: int
    last_committed: int


def compact_checkpoint(pipeline: Pipeline, data_root: Path) -> Compaction | None:
    """Tidy ``pipeline``'s checkpoint now; None when it has no committed batch yet."""
    location = pipeline.checkpoint_location(data_root)
    if not Checkpoint.exists(location):
        return None
    ckpt = Checkpoint(location, pipeline.name)
    done = ckpt.commits.get_latest()
    if done is None:
        return None
    upkeep = pipeline.maintenance
    state = DriverTable(ckpt.table("state_windows"), None, "window state table")
    tables = tidy_after(ckpt, done.batch_id, upkeep, state)
    return Compaction(tables, max(0, done.batch_id - upkeep.log_batches + 1), done.batch_id)


def tidy_after(
    checkpoint: Checkpoint, batch_id: int, upkeep: Maintenance, state: DriverTable | None
) -> int:
    """Tidy ``checkpoint`` after batch ``batch_id`` with ``upkeep``'s retention; tables tidied."""
    keep = Retention(upkeep.log_batches, upkeep.progress_batches)
    return tidy(checkpoint, batch_id, keep, state)
