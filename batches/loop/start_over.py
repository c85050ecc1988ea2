"""A definition may change freely until the first batch commits.

A pipeline's first batch that failed (a transform that breaks on the data, a
wrong event-time column) is written ahead in the offset log under the
definition it was planned with, and the recovery rule replays exactly that
batch: without this, the first fix of the definition would need
`lowmark reset`. Before anything has committed, and while batch 0 wrote
nothing anywhere, starting the checkpoint over is the same as never having run
it: the old checkpoint is moved aside (as ``lowmark reset`` does, never
deleted) and a new one starts where the old one started.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lowmark.batches.evolution import classify
from lowmark.batches.loop.plan import Planner
from lowmark.batches.pipeline import Pipeline, resolve
from lowmark.state.checkpoint import Checkpoint, move_aside
from lowmark.state.ownership import last_writer

if TYPE_CHECKING:
    from lowmark.batches.loop.batch_work import BatchWork

log = logging.getLogger(__name__)


def changed_before_first_commit(planner: Planner) -> list[str] | None:
    """The changes (``evolution.classify``, one line each) between the definition the
    checkpoint's uncommitted batch 0 was planned with and the pipeline's now; None when there
    is no such batch, the definition is unchanged, or the entry predates recording
    definitions."""
    latest, done = planner.position()
    if latest is None or done is not None or latest.batch_id != 0:
        return None
    if latest.pipeline_fingerprint == planner.fingerprint:
        return None
    if latest.pipeline_definition is None:
        return None
    changes = classify(latest.pipeline_definition, planner.definition)
    return [change.describe() for change in changes] or None


def start_over(
    pipeline: Pipeline, planner: Planner, work: Callable[[], BatchWork], data_root: Path
) -> Checkpoint | None:
    """A new checkpoint for ``pipeline`` if its definition changed before its first batch
    committed and that batch wrote nothing (its own tables, the sink now configured, and
    the sink it was planned with: ``work`` gives the batches' work, built only then); None
    otherwise (the planner then refuses the change).

    The new checkpoint keeps the old one's recorded start (and the source identity it was
    read from) when the source's definition is unchanged, so a start at "latest" does not
    move; a changed source starts where the new source starts.
    """
    changes = changed_before_first_commit(planner)
    if changes is None:  # the batches' work is not built (nor PySpark imported) for nothing
        return None
    batches = work()
    ckpt = batches.checkpoint
    if batches.wrote_any(0):
        return None
    latest, _ = planner.position()
    assert latest is not None and latest.pipeline_definition is not None
    old: dict[str, Any] = latest.pipeline_definition
    if _wrote_old_sink(old, ckpt.pipeline_id, data_root):
        return None
    same_source = old.get("source") == planner.definition.get("source")
    moved = move_aside(ckpt.location, "changed")
    log.warning(
        "pipeline %s changed before its first batch committed (%s): batch 0 starts over "
        "under the new definition; the old checkpoint is at %s",
        pipeline.name,
        "; ".join(changes),
        moved,
    )
    return Checkpoint(
        ckpt.location,
        pipeline.name,
        start_offsets=ckpt.start_offsets if same_source else None,
        start_identity=(ckpt.start_identity or latest.source_identity) if same_source else None,
    )


def _wrote_old_sink(old: dict[str, Any], pipeline_id: str, data_root: Path) -> bool:
    """True if the sink of definition ``old`` (a Delta table) holds a write of this
    checkpoint's."""
    path = (old.get("sink") or {}).get("path")
    if not isinstance(path, str):
        return False
    writer = last_writer(resolve(path, data_root))
    return writer is not None and writer.pipeline_id == pipeline_id
