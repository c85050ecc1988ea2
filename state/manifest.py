"""The file manifest: every file the file source ever discovered, in order.

Each discovered file gets the next sequence number ``seq`` of its source
partition, in (modification time, path) order; a batch's offsets are a
``seq`` range per partition, so "which files did batch N take" is a join of
``offsets`` with ``files`` and a replay reads exactly the same files.

Two tables, so that what planning and a sensor tick read does not grow with
the history: ``files`` keeps the files planning needs (every file of an
uncommitted batch, every file still in the source folder, and each
partition's last file, which its numbering continues after), and
``files_history`` the files maintenance retired from it (``retire``): their
batches committed and they left the folder (archived, deleted). A backfill,
which reads committed batches, reads both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from lowmark.state.table import DriverTable

SCHEMA = pa.schema(
    [
        pa.field("partition", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("modified_ms", pa.int64(), nullable=False),
        pa.field("discovered_for_batch", pa.int64(), nullable=False),
        # Added later: null in rows recorded before.
        pa.field("discovered_ms", pa.int64()),
    ]
)


@dataclass(frozen=True)
class ManifestFile:
    partition: str
    seq: int
    path: str
    size: int
    modified_ms: int
    retired: bool = False
    """Read from the history: the file left the folder (a file there by its name now is
    another one, recorded again under a new ``seq``)."""
    discovered_ms: int | None = None
    """When the planning that recorded it listed it: the file's ingestion time (None: not
    recorded yet, or recorded before lowmark kept it)."""


class FileManifest:
    """The ``files`` table of a checkpoint."""

    def __init__(self, path: str, txn_app_id: str) -> None:
        self.table = DriverTable(path, SCHEMA, "file manifest")
        self.history = DriverTable(f"{self.table.path}_history", SCHEMA, "file manifest history")
        self.path = self.table.path
        self.txn_app_id = txn_app_id

    def files(self, retired: bool = False) -> list[ManifestFile]:
        """The files the manifest keeps for planning (with ``retired``, every file ever
        recorded), by (partition, seq); empty before the first ``record``.

        A file is its (partition, seq), not its path: a name that left the folder
        may land again as a new file, recorded under a new ``seq`` beside the
        retired one.
        """
        if not self.table.exists():
            return []
        rows = self.table.read().to_pylist()
        found = {(r["partition"], r["seq"]): _file(r, retired=False) for r in rows}
        if retired and self.history.exists():
            # A retirement cut short leaves a row in both tables: the table's copy counts.
            old = (_file(r, retired=True) for r in self.history.read().to_pylist())
            found = {(f.partition, f.seq): f for f in old} | found
        return sorted(found.values(), key=lambda f: (f.partition, f.seq))

    def retire(self, below: dict[str, int], batch_id: int) -> None:
        """Move the rows of partition ``p`` with ``seq < below[p]`` to the history, at the
        maintenance after batch ``batch_id``.

        The caller retires only files of committed batches that left the
        folder, and never a partition's last file. Appended to the history
        first, then deleted: a crash in between leaves rows in both tables
        (and, retired again, twice in the history), which readers count once.
        """
        if not below:
            return
        where = " OR ".join(
            f'("partition" = {_quoted(p)} AND "seq" < {n})' for p, n in sorted(below.items())
        )
        rows = self.table.read(where)
        if not rows.num_rows:
            return
        self.history.append(rows)
        self.table.delete(where, batch_id)

    def record(self, found: list[ManifestFile], batch_id: int, listed_ms: int) -> bool:
        """Record the files of ``found`` the manifest lacks, numbered after the files it
        holds, while planning ``batch_id``, as listed at ``listed_ms``.

        Numbered and checked against the table's newest version as it is
        written (``DriverTable.insert_new_once``), never against a runner's
        copy of it, which may be stale: a path is never recorded twice, nor two
        files under one number, whichever runners record at whichever batch
        ids. Idempotent per planned batch: if discovery for ``batch_id``
        already landed (a crash before its offsets were written, or a racing
        runner), nothing is recorded and False returned. Either way the caller
        must then take the table's files, never its own list: offsets only
        ever cover recorded files.
        """

        def rows_for(current: pa.Table) -> pa.Table:
            known = [
                ManifestFile(r["partition"], r["seq"], r["path"], r["size"], r["modified_ms"])
                for r in current.select(
                    ["partition", "seq", "path", "size", "modified_ms"]
                ).to_pylist()
            ]
            paths = {f.path for f in known}
            new = numbered([f for f in found if f.path not in paths], known)
            rows = [
                {
                    "partition": f.partition,
                    "seq": f.seq,
                    "path": f.path,
                    "size": f.size,
                    "modified_ms": f.modified_ms,
                    "discovered_for_batch": batch_id,
                    "discovered_ms": listed_ms,
                }
                for f in new
            ]
            return pa.Table.from_pylist(rows, schema=SCHEMA)

        return self.table.insert_new_once(rows_for, "path", self.txn_app_id, batch_id)

    def record_as_read(self, files: list[ManifestFile], batch_id: int) -> None:
        """Record the size and modification time ``files`` have now, by path: batch
        ``batch_id``, which wrote nothing yet, reads them so (its replay must read the same)."""
        rows = pa.Table.from_pylist(
            [{"path": f.path, "size": f.size, "modified_ms": f.modified_ms} for f in files],
            schema=pa.schema([SCHEMA.field(n) for n in ("path", "size", "modified_ms")]),
        )
        self.table.update(rows, "path", batch_id)


def _file(row: dict[str, Any], retired: bool) -> ManifestFile:
    return ManifestFile(
        row["partition"],
        row["seq"],
        row["path"],
        row["size"],
        row["modified_ms"],
        retired,
        row.get("discovered_ms"),
    )


def numbered(new: list[ManifestFile], known: list[ManifestFile]) -> list[ManifestFile]:
    """``new`` files with the next sequence numbers of their partitions after ``known``."""
    next_seq: dict[str, int] = {}
    for f in known:
        next_seq[f.partition] = max(next_seq.get(f.partition, 0), f.seq + 1)
    out = []
    for f in new:
        seq = next_seq.get(f.partition, 0)
        next_seq[f.partition] = seq + 1
        out.append(replace(f, seq=seq))
    return out


def _quoted(text: str) -> str:
    """``text`` as an SQL string literal."""
    escaped = text.replace("'", "''")
    return f"'{escaped}'"
