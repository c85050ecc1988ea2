"""Who wrote a table: every lowmark commit names its writer in Delta's ``userMetadata``.

Each idempotent write (delta-rs or Spark) carries ``userMetadata =
{"lowmark": {"app_id": "<pipeline_id>:<role>", "batch_id": N}}``, so
``DESCRIBE HISTORY`` of a sink shows which checkpoint and batch wrote each
commit. ``last_writer`` reads it back from the newest commits: a new
checkpoint uses it to refuse a sink that already holds another checkpoint's
writes (its files would be written again), and ``lowmark reset`` to learn
where the sink's data ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from lowmark.state.storage import is_table, open_table

HISTORY = 100
"""Commits ``last_writer`` looks back over (OPTIMIZE, VACUUM and others' writes name no
lowmark writer)."""


def writer_metadata(app_id: str, batch_id: int) -> str:
    """The ``userMetadata`` of a commit of batch ``batch_id`` under ``app_id``."""
    return json.dumps({"lowmark": {"app_id": app_id, "batch_id": batch_id}})


@dataclass(frozen=True)
class Writer:
    """The lowmark writer of a commit."""

    pipeline_id: str
    role: str
    batch_id: int
    version: int
    """The table version it committed."""


def last_writer(path: str) -> Writer | None:
    """The newest of the last ``HISTORY`` commits of the table at ``path`` that lowmark
    wrote; None if the table does not exist or none names a lowmark writer."""
    if not is_table(path):
        return None
    for commit in open_table(path).history(HISTORY):
        try:
            meta = json.loads(commit.get("userMetadata") or "{}").get("lowmark")
        except (json.JSONDecodeError, AttributeError):
            continue
        if not isinstance(meta, dict) or ":" not in str(meta.get("app_id", "")):
            continue
        pipeline_id, role = str(meta["app_id"]).split(":", 1)
        return Writer(pipeline_id, role, int(meta["batch_id"]), int(commit["version"]))
    return None
