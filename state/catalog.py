"""Where each pipeline's tables are, as its last run wrote them: what ``lowmark show`` and
``lowmark sql`` read instead of the pipeline definitions.

One JSON file per pipeline, ``<data root>/_lowmark/_catalog/<pipeline>.json``, written by
every run as it opens its checkpoint (``lowmark.batches.loop.parts``): the checkpoint's
location, the sink's, and what ordering the sink newest first needs. Knowing them, a
look at a table starts no Spark and imports neither the definitions (a user's Python
module, pydantic) nor pyarrow (docs/cli.md, "Fast commands").

The catalog holds where the data *is*: a definition edited since (a moved checkpoint)
is what the next run records. Pipeline names start with a letter or digit, so
``_catalog`` never collides with a checkpoint's folder. Each file is replaced whole
(written aside, renamed), so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class CatalogEntry:
    """Where one pipeline's tables are."""

    pipeline: str
    checkpoint: str
    """The checkpoint's location: its tables are folders in it (``lowmark.state.checkpoint``)."""
    sink: str | None
    """The Delta sink's location; None: a custom sink, no table lowmark can read."""
    sink_label: str
    """The sink in words (``Sink.label``), for the error about a custom one."""
    window_keys: tuple[str, ...] | None
    """A windowed pipeline's key columns; None: no windows (and no window state)."""
    event_time_column: str | None
    """The event-time column, if the pipeline has one."""


def catalog_dir(data_root: Path) -> Path:
    """The catalog's folder under ``data_root``."""
    return data_root / "_lowmark" / "_catalog"


def remember(data_root: Path, entry: CatalogEntry) -> None:
    """Record ``entry`` under ``data_root`` (nothing written if it is recorded already)."""
    path = catalog_dir(data_root) / f"{entry.pipeline}.json"
    text = json.dumps(asdict(entry), indent=2, sort_keys=True) + "\n"
    try:
        if path.read_text() == text:
            return
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.{os.getpid()}")
    aside.write_text(text)
    os.replace(aside, path)


def entries(data_root: Path) -> dict[str, CatalogEntry]:
    """Every pipeline recorded under ``data_root``, by name."""
    found: dict[str, CatalogEntry] = {}
    for path in sorted(catalog_dir(data_root).glob("*.json")):
        fields = json.loads(path.read_text())
        keys = fields["window_keys"]
        entry = CatalogEntry(**{**fields, "window_keys": None if keys is None else tuple(keys)})
        found[entry.pipeline] = entry
    return found
