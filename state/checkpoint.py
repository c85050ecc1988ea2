"""A checkpoint: the folder of Delta tables that holds a pipeline's progress.

Layout under the checkpoint location (every table a ``DriverTable``,
written by delta-rs from the driver)::

    checkpoint/     one row: pipeline_id, pipeline name, created_at, format_version (written
                    last); after ``lowmark reset``: where it starts and whose sink it adopted
    offsets/        write-ahead offset log        (lowmark.state.offset_log)
    commits/        commit log                    (lowmark.state.commit_log)
    progress/       per-batch progress            (lowmark.state.progress)
    files/          file-source manifest          (lowmark.state.manifest)
    schema/         the source schema, fixed once (lowmark.state.source_schema)
    watermarks/     per-partition event times     (lowmark.state.watermarks)
    bad_records/    malformed input rows          (lowmark.state.quarantine)
    late/           records too late for windows  (lowmark.state.late_records)
    state_windows/  open windows (windowed pipelines; created by the first batch)
    dedup_ids/      ids deduplication let through (``dedup``; lowmark.state.seen_ids)
    keyed_state/    a keyed step's state and timers (``keyed``; lowmark.state.keyed_state)
    keyed_timers/
    failures/       failed attempts at batches (created by the first failure)
    pipeline_id     a file: the metadata table's pipeline_id, for ``Checkpoint.fence``

``pipeline_id`` is random per checkpoint (Spark's query id) and is part of
every idempotency key, so a new checkpoint never collides with an old one.
The checkpoint owns every table handle; all of them but ``state_windows``,
``dedup_ids``, ``keyed_*`` (created by the runner's parts) and ``failures`` are created
with the checkpoint, so a missing one is always an error.
"""

from __future__ import annotations

import functools
import json
import os
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lowmark.state import late_records, quarantine, storage
from lowmark.state.commit_log import CommitEntry, CommitLog
from lowmark.state.errors import (
    CheckpointMissing,
    CheckpointReplaced,
    LowmarkError,
    UnsupportedCheckpointFormat,
)
from lowmark.state.failures import FailureLog
from lowmark.state.log import FORMAT_VERSION, utc_now
from lowmark.state.manifest import FileManifest
from lowmark.state.offset_log import Identity, OffsetEntry, OffsetLog, Offsets
from lowmark.state.progress import ProgressEntry, ProgressLog
from lowmark.state.source_schema import SourceSchema
from lowmark.state.storage import is_object_store, not_on_object_storage
from lowmark.state.table import UTC_MICROS, DriverTable
from lowmark.state.watermarks import WatermarkTable

# pyarrow's file systems are imported where a folder is listed or the fence read: reading a
# checkpoint's tables (``lowmark status``, ``plan``) needs neither (docs/cli.md, "Fast
# commands").
if TYPE_CHECKING:
    from pyarrow.fs import FileSystem

_METADATA_SCHEMA = pa.schema(
    [
        pa.field("pipeline_id", pa.string(), nullable=False),
        pa.field("pipeline_name", pa.string(), nullable=False),
        pa.field("created_at", UTC_MICROS, nullable=False),
        pa.field("start_offsets", pa.string(), nullable=True),
        pa.field("adopted_from", pa.string(), nullable=True),
        pa.field("start_identity", pa.string(), nullable=True),
        pa.field("start_commit", pa.string(), nullable=True),
        pa.field("format_version", pa.int32(), nullable=True),
    ]
)
"""``start_offsets`` (JSON): where batch 0 starts, set by ``lowmark reset``
(``lowmark.batches.admin.reset``) or when batch 0 is first planned (a source's start may move:
Kafka's latest, retention; a backfill reads from here); ``adopted_from``: the pipeline id of the
checkpoint whose sink writes this one continues, set by ``lowmark reset``; ``start_identity``
(JSON): the identity of the source ``start_offsets`` were read from (``lowmark reset
--after-sink``), which batch 0 checks; ``start_commit`` (a ``CommitEntry`` of batch -1, JSON):
what batch 0 builds on after ``lowmark reset --after-sink`` (the state tables it carried over,
the watermark, the next timer); ``format_version``: the checkpoint's format
(``lowmark.state.log.FORMAT_VERSION``), written when it is created. Checkpoints written before
they existed have none of them (no ``format_version``: format 1)."""


ID_FILE = "pipeline_id"
"""The file beside the tables that repeats the metadata table's ``pipeline_id``: a runner
checks it before each step that writes (``Checkpoint.fence``), and reading one small file
costs a fraction of opening the metadata table (which reads its Delta log). The first fence
that finds none reads the metadata table instead and, finding its own id there, writes it:
looks at a checkpoint never write."""


class Checkpoint:
    """Opens (or creates) the checkpoint of one pipeline at ``location``."""

    def __init__(
        self,
        location: str,
        pipeline_name: str,
        start_offsets: Offsets | None = None,
        adopted_from: str | None = None,
        start_identity: Identity | None = None,
        start_commit: CommitEntry | None = None,
    ) -> None:
        """Open the checkpoint, or create it (``start_offsets``, ``adopted_from``,
        ``start_identity`` and ``start_commit`` are recorded only by a creation: see
        ``_METADATA_SCHEMA``)."""
        self.location = location.rstrip("/")
        self.pipeline_name = pipeline_name
        self.metadata = DriverTable(self.table("checkpoint"), _METADATA_SCHEMA)
        self.pipeline_id = ""
        self.start_offsets = start_offsets
        self.adopted_from = adopted_from
        self.start_identity = start_identity or {}
        self.start_commit = start_commit
        self._handles("")
        self.pipeline_id = self._open_or_create()
        self._handles(self.pipeline_id)

    def _handles(self, pipeline_id: str) -> None:
        """Every table handle, with idempotency keys of ``pipeline_id``."""

        def app(role: str) -> str:
            return f"{pipeline_id}:{role}"

        self.offsets = OffsetLog(self.table("offsets"), OffsetEntry, app("offsets"))
        self.commits = CommitLog(self.table("commits"), CommitEntry, app("commits"))
        self.progress = ProgressLog(self.table("progress"), ProgressEntry, app("progress"))
        self.files = FileManifest(self.table("files"), app("files"))
        self.schema = SourceSchema(self.table("schema"), app("schema"))
        self.watermarks = WatermarkTable(self.table("watermarks"), app("watermarks"))
        self.bad_records = DriverTable(self.table("bad_records"), quarantine.SCHEMA)
        self.late = DriverTable(self.table("late"), late_records.SCHEMA)
        self.failures = FailureLog(self.table("failures"))

    def table(self, name: str) -> str:
        """Path of the checkpoint table ``name``."""
        return f"{self.location}/{name}"

    def txn_app_id(self, role: str) -> str:
        """The Delta ``txnAppId`` for writes of ``role`` (a table's role in the pipeline)."""
        return f"{self.pipeline_id}:{role}"

    def _tables(self) -> list[DriverTable]:
        """The tables created with the checkpoint, the metadata table excluded."""
        return [
            self.offsets.table,
            self.commits.table,
            self.progress.table,
            self.files.table,
            self.files.history,
            self.schema.table,
            self.watermarks.table,
            self.bad_records,
            self.late,
        ]

    @staticmethod
    def exists(location: str) -> bool:
        return DriverTable(f"{location.rstrip('/')}/checkpoint", _METADATA_SCHEMA).exists()

    def _open_or_create(self) -> str:
        """Return the pipeline id, creating the checkpoint if there is none.

        The tables are created first and the metadata row last, so a crash
        during creation leaves a checkpoint that is simply created again. A
        metadata table next to missing tables (or logs without metadata that
        already hold batches) is refused: never a silent restart from zero.
        """
        if self.metadata.exists():
            row = self._metadata_row()
            self._check_format(row)  # before anything here is read further, or written
            for table in self._tables():
                if table is self.files.history and not table.exists() and self.files.table.exists():
                    # Added after checkpoints of older lowmark versions were made, which
                    # retired nothing: created empty. (One lost later leaves a backfill
                    # of retired files stopping with CheckpointMissing, never wrong.)
                    table.create()
                if not table.exists():
                    raise table.missing()
            return self._adopt(row)
        if self.offsets.exists() and self.offsets.table.read().num_rows:
            raise CheckpointMissing(
                f"checkpoint table {self.metadata.path} is missing but {self.offsets.path} holds "
                f"batches: restore it, or start over with `lowmark reset`"
            )
        for table in self._tables():
            table.create()
        row = {
            "pipeline_id": str(uuid.uuid4()),
            "pipeline_name": self.pipeline_name,
            "created_at": utc_now(),
            "start_offsets": json.dumps(self.start_offsets)
            if self.start_offsets is not None
            else None,
            "adopted_from": self.adopted_from,
            "start_identity": json.dumps(self.start_identity) if self.start_identity else None,
            "start_commit": (
                self.start_commit.model_dump_json() if self.start_commit is not None else None
            ),
            "format_version": FORMAT_VERSION,
        }
        # Two runners creating at once: transaction version 0 lets only the first row land.
        rows = pa.Table.from_pylist([row], schema=_METADATA_SCHEMA)
        self.metadata.append_once(rows, "lowmark:checkpoint", 0)
        return self._adopt(self._metadata_row())

    def record_start_offsets(self, offsets: Offsets) -> None:
        """Record where batch 0 starts when the source chose it (a position such as
        Kafka's latest moves while no batch ran): every run, and every backfill, then starts
        there."""
        row = {"pipeline_id": self.pipeline_id, "start_offsets": json.dumps(offsets)}
        schema = pa.schema([_METADATA_SCHEMA.field(c) for c in row])
        self.metadata.update(pa.Table.from_pylist([row], schema=schema), "pipeline_id", 0)
        self.start_offsets = offsets

    def fence(self) -> None:
        """Raise CheckpointReplaced unless ``location`` still holds the checkpoint this
        object opened (its ``pipeline_id``).

        ``lowmark reset`` moves a checkpoint aside and creates a new one at the
        same location (and may empty the sink), while a runner may still hold
        the old one open: every table handle names a path, so that runner's
        next writes would land in the new checkpoint and the emptied sink. A
        runner calls this before each step that writes, so it stops instead.
        It reads ``ID_FILE``, or where there is none (a checkpoint moved aside, one not
        yet fenced) the metadata table. No Spark.
        """
        current = self._fenced_id()
        if current is None:
            # A new handle: the open one follows the log of the table it first read.
            table = DriverTable(self.metadata.path, _METADATA_SCHEMA)
            ids = table.read().column("pipeline_id").to_pylist() if table.exists() else []
            current = str(ids[0]) if len(ids) == 1 else None
            if current == self.pipeline_id:
                self._write_id_file()
        if current != self.pipeline_id:
            now = f"holds checkpoint {current}" if current else "holds no checkpoint"
            raise CheckpointReplaced(
                f"{self.location} now {now}, not {self.pipeline_id} that this runner of "
                f"{self.pipeline_name} started on (`lowmark reset` ran meanwhile): it stopped "
                "before writing into it; run the pipeline again to go on from the new checkpoint"
            )

    @functools.cached_property
    def _id_file(self) -> tuple[FileSystem, str]:
        """The file system ``ID_FILE`` is on and its path there (made once: an S3 client
        for every fence of every batch would cost more than the read)."""
        return storage.filesystem(self.table(ID_FILE))

    def _fenced_id(self) -> str | None:
        """``ID_FILE``'s pipeline id; None where there is none (or it is empty)."""
        store, path = self._id_file
        try:
            with store.open_input_stream(path) as stream:
                found = stream.read().decode().strip()
        except FileNotFoundError:
            return None
        return found or None

    def _write_id_file(self) -> None:
        """Write ``ID_FILE`` whole: renamed into place locally, one PUT on object storage,
        so a fence never reads half of it."""
        store, path = self._id_file
        written = path if is_object_store(self.location) else f"{path}.{uuid.uuid4().hex}.tmp"
        with store.open_output_stream(written) as stream:
            stream.write(self.pipeline_id.encode())
        if written != path:
            store.move(written, path)

    def _metadata_row(self) -> dict[str, Any]:
        """The metadata table's one row."""
        rows = self.metadata.read().to_pylist()
        if len(rows) != 1:
            raise CheckpointMissing(
                f"checkpoint table {self.metadata.path} holds {len(rows)} rows, expected 1: "
                f"restore it, or start over with `lowmark reset`"
            )
        return rows[0]

    def _check_format(self, row: dict[str, Any]) -> None:
        """Raise UnsupportedCheckpointFormat when the metadata ``row`` records a newer format
        than this lowmark reads (none recorded: format 1)."""
        found = row.get("format_version") or 1  # no such column in older checkpoints
        if found > FORMAT_VERSION:
            raise UnsupportedCheckpointFormat(
                f"checkpoint {self.location} has format {found}, this lowmark reads up to "
                f"{FORMAT_VERSION}: upgrade lowmark to a release that reads format {found}"
            )

    def _adopt(self, row: dict[str, Any]) -> str:
        """Take what the metadata ``row`` records; return its pipeline id."""
        start = row.get("start_offsets")
        self.start_offsets = json.loads(start) if start else None
        self.adopted_from = row.get("adopted_from")
        identity = row.get("start_identity")  # no such column in older checkpoints
        self.start_identity = json.loads(identity) if identity else {}
        carried = row.get("start_commit")
        self.start_commit = CommitEntry.model_validate_json(carried) if carried else None
        return str(row["pipeline_id"])


def move_aside(location: str, why: str) -> str | None:
    """Rename the local checkpoint folder ``location`` to ``<location>.<why>-<UTC time>``
    (``time_stamp``), never deleting it; where it went (None: there was none). A runner still
    on it stops at its next ``Checkpoint.fence``. Not on object storage, which has no
    rename of a folder (``NotOnObjectStorage``)."""
    if is_object_store(location):
        raise not_on_object_storage(
            location,
            f"checkpoint {why}: lowmark moves a checkpoint aside by renaming its folder",
            "copy it elsewhere and delete it with the store's own tools, then run again",
        )
    if not os.path.exists(location):
        return None
    moved = f"{location}.{why}-{time_stamp()}"
    os.rename(location, moved)
    return moved


def time_stamp() -> str:
    """Now, UTC, as a name part that sorts by time (``20261126T151530123456Z``)."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")


@dataclass(frozen=True)
class Found:
    """A checkpoint ``find_checkpoint`` found."""

    location: str
    pipeline_name: str


def find_checkpoint(folder: str, pipeline_id: str) -> Found | None:
    """The checkpoint with ``pipeline_id`` among the folders in ``folder``, local or on
    object storage (checkpoints side by side, as every pipeline's under
    ``<data root>/_lowmark/``, and the ones ``lowmark reset`` moved aside there); None if
    none is.

    Reads only the metadata table of each: for telling whose writes a sink holds.
    """
    from pyarrow.fs import FileSelector, FileType

    store, root = storage.filesystem(folder)
    if store.get_file_info(root).type != FileType.Directory:
        return None
    base = folder.rstrip("/")
    for entry in sorted(store.get_file_info(FileSelector(root)), key=lambda e: e.base_name):
        location = f"{base}/{entry.base_name}"
        table = DriverTable(f"{location}/checkpoint", _METADATA_SCHEMA)
        if entry.type != FileType.Directory or not table.exists():
            continue
        try:
            rows = table.read().to_pylist()
        except LowmarkError:  # a damaged checkpoint beside it is not the one asked for
            continue
        for row in rows:
            if row["pipeline_id"] == pipeline_id:
                return Found(location, str(row["pipeline_name"]))
    return None
