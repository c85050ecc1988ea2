"""Whose writes a sink holds: a new checkpoint must not write a sink another one wrote.

Every sink write records its writer (a Delta sink: ``lowmark.state.ownership``; a
Postgres sink: its fence rows); before a checkpoint's first batch
(``Sink.check_ours``), and before ``lowmark reset`` adopts a sink, the last
writer is looked up among the checkpoints beside this one. A checkpoint's own
writes, and those of the checkpoint it continues (``Checkpoint.adopted_from``,
set by ``lowmark reset --after-sink``), are ours.
"""

from __future__ import annotations

import os

from lowmark.batches.errors import SinkHeldElsewhere, SinkNotATable
from lowmark.batches.pipeline import Pipeline
from lowmark.state import storage
from lowmark.state.checkpoint import Checkpoint, Found, find_checkpoint
from lowmark.state.ownership import last_writer


def is_ours(checkpoint: Checkpoint, pipeline_id: str) -> bool:
    """Whether writes of checkpoint ``pipeline_id`` are ``checkpoint``'s to go on after: its
    own, or the checkpoint's it continues (``lowmark reset --after-sink``)."""
    return pipeline_id in {checkpoint.pipeline_id, checkpoint.adopted_from}


def check_sink_is_ours(pipeline: Pipeline, checkpoint: Checkpoint, sink: str) -> None:
    """Before ``checkpoint``'s first batch: its Delta ``sink`` must be a folder (or nothing
    yet), and must not hold another checkpoint's writes, or the source, read from the start
    again, would land in it twice."""
    if (not_a_table := sink_not_a_table(pipeline, sink)) is not None:
        raise not_a_table
    writer = last_writer(sink)
    if writer is None or is_ours(checkpoint, writer.pipeline_id):
        return
    location = checkpoint.location
    raise held_elsewhere(pipeline, location, sink, writer.pipeline_id, writer.batch_id)


def sink_not_a_table(pipeline: Pipeline, sink: str) -> SinkNotATable | None:
    """Why ``sink`` cannot hold ``pipeline``'s Delta table (it is a file), or None."""
    from pyarrow.fs import FileType  # not at the top: `lowmark status` imports this module

    store, path = storage.filesystem(sink)
    if store.get_file_info(path).type != FileType.File:
        return None
    return SinkNotATable(
        f"sink {sink} of {pipeline.name} is a file, not a folder a Delta table can live "
        "in: point the pipeline's sink path at a folder, or move the file away"
    )


def sink_holder(location: str, pipeline_id: str) -> Found | None:
    """The checkpoint ``pipeline_id`` when it is beside the checkpoint ``location`` (every
    pipeline's, and the ones ``lowmark reset`` moved aside, are by default)."""
    return find_checkpoint(os.path.dirname(location.rstrip("/")), pipeline_id)


def held_elsewhere(
    pipeline: Pipeline,
    location: str,
    sink: str,
    writer: str,
    batch_id: int,
    own: str = "a sink path of its own",
) -> SinkHeldElsewhere:
    """Why ``pipeline`` (checkpoint ``location``) may not write ``sink`` (as messages
    name it), whose last lowmark writer is another checkpoint, ``writer`` (up to its batch
    ``batch_id``), and the ways on; ``own`` is what to give ``pipeline`` instead.

    The advice never empties another pipeline's data: a reset of this
    pipeline only when the writer is one of its own old checkpoints; another
    pipeline's sink wants ``own``.
    """
    found = sink_holder(location, writer)
    name = pipeline.name
    held = f"up to its batch {batch_id}"
    if found is not None and found.pipeline_name != name:
        return SinkHeldElsewhere(
            f"sink {sink} is pipeline {found.pipeline_name}'s (checkpoint {found.location}, "
            f"{held}): {name} must not write it too; give {name} {own}"
        )
    if found is not None:
        return SinkHeldElsewhere(
            f"sink {sink} holds the writes of {name}'s old checkpoint {found.location} "
            f"({held}), and this new checkpoint would write its input again: run `lowmark "
            f"reset {name} --after-sink` to go on after the sink's data, or `lowmark reset "
            f"{name} --truncate-sink` to empty it and start from the beginning"
        )
    return SinkHeldElsewhere(
        f"sink {sink} holds the writes of checkpoint {writer} ({held}), found nowhere "
        f"beside {location}: if it was {name}'s, put it back at {location} and run `lowmark "
        f"reset {name} --after-sink` to go on after the sink's data; if another pipeline "
        f"writes this sink, give {name} {own}"
    )
