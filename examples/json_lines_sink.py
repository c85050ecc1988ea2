"""A user-written sink: one JSON-lines file per batch in a folder (``kind: custom``).

Exactly once because its write is idempotent per batch: batch N of a checkpoint
lands as ``<txn_app_id>-<N>.jsonl``, written under a hidden name and renamed, so a
replay of N (after a crash before its commit) finds the file and writes
nothing, and a crash in the middle of a write leaves only a hidden file the
replay writes again. ``txn_app_id`` names the checkpoint, so a pipeline started
over on a new checkpoint writes its batches anew. A windowed pipeline in
update mode also hands it the windows a batch retracts: those lines carry
``"_retract": true``.

Use it from YAML::

    sink:
      kind: custom
      factory: examples.json_lines_sink:build
      options: {folder: exports/orders}
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from lowmark.batches.pipeline import resolve
from lowmark.batches.sinks import Sink
from lowmark.state.session import SparkLike


class JsonLinesSink(Sink):
    """Batches of one checkpoint (``txn_app_id``) as JSON-lines files in ``folder``."""

    def __init__(self, options: dict[str, Any], data_root: Path, txn_app_id: str) -> None:
        self.folder = Path(resolve(str(options["folder"]), data_root))
        self.prefix = txn_app_id.replace(":", "-")

    def path(self, batch_id: int) -> Path:
        """Where batch ``batch_id`` lands."""
        return self.folder / f"{self.prefix}-{batch_id:010d}.jsonl"

    def write(self, df: DataFrame, batch_id: int, retract: DataFrame | None = None) -> None:
        done = self.path(batch_id)
        if done.exists():  # a replay: this batch's rows are here already
            return None
        lines = [_line(row) for row in df.toArrow().to_pylist()]
        if retract is not None:
            lines += [_line(row | {"_retract": True}) for row in retract.toArrow().to_pylist()]
        self.folder.mkdir(parents=True, exist_ok=True)
        hidden = self.folder / f".{done.name}"
        hidden.write_text("".join(lines))
        os.replace(hidden, done)
        return None

    def landed(self, batch_id: int) -> bool:
        return self.path(batch_id).exists()


def _line(row: dict[str, Any]) -> str:
    return json.dumps(row, default=_iso, sort_keys=True) + "\n"


def _iso(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def build(
    spark: SparkLike, options: dict[str, Any], data_root: Path, txn_app_id: str
) -> JsonLinesSink:
    """The factory a pipeline names: ``factory: examples.json_lines_sink:build``."""
    return JsonLinesSink(options, data_root, txn_app_id)
