"""The file manifest records a path once, whichever runners record it, in whatever order."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lowmark.state.manifest import SCHEMA, FileManifest, ManifestFile
from lowmark.state.table import DriverTable


def _file(name: str) -> ManifestFile:
    return ManifestFile("0", -1, f"file:/in/{name}", 10, 1_700_000_000_000)


def test_a_runner_committing_on_a_stale_snapshot_never_records_a_path_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "files")
    mine, theirs = FileManifest(path, "p:files"), FileManifest(path, "p:files")
    mine.record([_file("a")], 0, 1)
    stale = DeltaTable(path)  # what this runner's next commit is planned on
    theirs.record([_file("b")], 5, 2)  # meanwhile another runner records b for batch 5
    # This runner records b and c for batch 6 on the snapshot from before b landed:
    # its commit conflicts with theirs and is redone on the newest version.
    opened: list[DeltaTable] = [stale]
    real_open = DriverTable.open

    def open_stale_first(self: DriverTable, version: int | None = None) -> DeltaTable:
        return opened.pop() if opened and self.path == mine.path else real_open(self, version)

    monkeypatch.setattr(DriverTable, "open", open_stale_first)
    mine.record([_file("b"), _file("c")], 6, 3)
    rows = sorted((f.seq, f.path.rsplit("/", 1)[1]) for f in mine.files())
    assert rows == [(0, "a"), (1, "b"), (2, "c")]


def test_a_manifest_from_before_listing_times_were_kept_records_them_for_new_files(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "files")
    old = SCHEMA.remove(SCHEMA.get_field_index("discovered_ms"))
    row = {"partition": "0", "seq": 0, "path": "file:/in/a", "size": 10}
    write_deltalake(
        path, pa.Table.from_pylist([row | {"modified_ms": 1, "discovered_for_batch": 0}], old)
    )
    manifest = FileManifest(path, "p:files")
    manifest.record([_file("b")], 1, 1_700_000_000_500)
    assert [(f.seq, f.discovered_ms) for f in manifest.files()] == [
        (0, None),
        (1, 1_700_000_000_500),
    ]
