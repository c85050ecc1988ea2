"""Whose writes a sink holds: a new checkpoint must not write a sink another one wrote.

Every sink write records its writer (``state.ownership``); before a
checkpoint's first batch, and before ``lowmark reset`` adopts a sink, the
last writer is looked up among the checkpoints beside this one.
"""

from __future__ import annotations

import os

from batches.pipeline import Pipeline
from state.checkpoint import Found, find_checkpoint
from state.ownership import Writer


def sink_holder(location: str, writer: Writer) -> Found | None:
    """The checkpoint of ``writer`` when it is beside the checkpoint ``location`` (every
    pipeline's, and the ones ``lowmark reset`` moved aside, are by default)."""
    return find_checkpoint(os.path.dirname(location.rstrip("/")), writer.pipeline_id)


def held_elsewhere(
    pipeline: Pipeline, location: str, sink: str, writer: Writer, found: Found | None
) -> str:
    """Why ``pipeline`` (checkpoint ``location``) may not write ``sink``, whose last
    lowmark writer is another checkpoint's, ``writer`` (at ``found``: ``sink_holder``),
    and the ways on.

    The advice never empties another pipeline's data: a reset of this
    pipeline only when the writer is one of its own old checkpoints; another
    pipeline's sink wants a sink path of its own.
    """
    name = pipeline.name
    held = f"up to its batch {writer.batch_id}"
    if found is not None and found.pipeline_name != name:
        return (
            f"sink {sink} is pipeline {found.pipeline_name}'s (checkpoint {found.location}, "
            f"{held}): {name} must not write it too; give {name} a sink path of its own"
        )
    if found is not None:
        return (
            f"sink {sink} holds the writes of {name}'s old checkpoint {found.location} "
            f"({held}), and this new checkpoint would write its input again: run `lowmark "
            f"reset {name} --after-sink` to go on after the sink's data, or `lowmark reset "
            f"{name} --truncate-sink` to empty it and start from the beginning"
        )
    return (
        f"sink {sink} holds the writes of checkpoint {writer.pipeline_id} ({held}), found "
        f"nowhere beside {location}: if it was {name}'s, put it back at {location} and run "
        f"`lowmark reset {name} --after-sink` to go on after the sink's data; if another "
        f"pipeline writes this sink, give {name} a sink path of its own"
    )
