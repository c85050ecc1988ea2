"""A Delta table's commits, read on the driver from its transaction log (no Spark job).

Version ``v`` of a table is the commit file ``_delta_log/<v, 20 digits>.json``:
one JSON action a line (``add``, ``remove``, ``cdc``, ``metaData``,
``commitInfo``...). Reading the commits of the versions a batch takes costs
what those versions hold, not what the table holds. The table's metadata
(schema, partition columns, configuration) at a version is the newest
``metaData`` action at or before it: found in the commits since the last
checkpoint, or, when none of them changed it, read once with delta-rs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from pyarrow import fs
from pyspark.sql.types import StructType

from lowmark.batches.errors import SourceDataLost
from lowmark.state.storage import open_table

LOG = "_delta_log"
KEPT_COMMITS = 256
"""Parsed commits a log keeps in memory (the newest ones asked for)."""


@dataclass(frozen=True)
class DataFile:
    """A file a commit added (or, for the change feed, removed or wrote as change data)."""

    path: str
    """As the log names it: relative to the table (URI-escaped) or an absolute URI."""
    partition_values: tuple[tuple[str, str | None], ...]
    size: int
    rows: int | None
    """``numRecords`` of the file's statistics, when the writer recorded them."""


@dataclass(frozen=True)
class Metadata:
    """What a ``metaData`` action says of the table."""

    schema: StructType
    partition_columns: tuple[str, ...]
    configuration: dict[str, str]

    @property
    def change_feed(self) -> bool:
        return self.configuration.get("delta.enableChangeDataFeed", "false").lower() == "true"

    @property
    def column_mapping(self) -> str:
        return self.configuration.get("delta.columnMapping.mode", "none")


@dataclass(frozen=True)
class Commit:
    """One version of the table, as the source reads it."""

    version: int
    operation: str
    added: tuple[DataFile, ...]
    """Files added with ``dataChange``, sorted by path: the rows the version appended."""
    changes_rows: bool
    """The version removed or rewrote rows (UPDATE, DELETE, MERGE, an overwrite): a file
    removed with ``dataChange``, or one added with a deletion vector."""
    change_files: tuple[DataFile, ...]
    """What the change feed reads of the version: its change-data files if it wrote any,
    else the files it added and removed with ``dataChange``."""
    metadata: Metadata | None
    timestamp_ms: int | None = None
    """When it was committed: its in-commit timestamp where the table has them, else the
    writer's ``commitInfo.timestamp`` (None: the commit records neither)."""


def _data_file(action: dict[str, Any]) -> DataFile:
    stats = action.get("stats")
    rows = json.loads(stats).get("numRecords") if stats else None
    values = tuple(sorted((action.get("partitionValues") or {}).items()))
    return DataFile(action["path"], values, int(action.get("size") or 0), rows)


def _metadata(action: dict[str, Any]) -> Metadata:
    schema = StructType.fromJson(json.loads(action["schemaString"]))
    return Metadata(
        schema, tuple(action.get("partitionColumns") or ()), dict(action.get("configuration") or {})
    )


def parse_commit(version: int, lines: list[str]) -> Commit:
    """A commit file's lines as a ``Commit``."""
    actions = [json.loads(line) for line in lines if line.strip()]
    added, removed, cdc = [], [], []
    metadata = None
    operation = "?"
    timestamp = None
    rewrites = False
    for action in actions:
        if "add" in action and action["add"].get("dataChange", True):
            added.append(_data_file(action["add"]))
            rewrites |= action["add"].get("deletionVector") is not None
        elif "remove" in action and action["remove"].get("dataChange", True):
            removed.append(_data_file(action["remove"]))
        elif "cdc" in action:
            cdc.append(_data_file(action["cdc"]))
        elif "metaData" in action:
            metadata = _metadata(action["metaData"])
        elif "commitInfo" in action:
            info = action["commitInfo"]
            operation = str(info.get("operation", "?"))
            timestamp = info.get("inCommitTimestamp", info.get("timestamp"))
    added.sort(key=lambda f: f.path)
    return Commit(
        version,
        operation,
        tuple(added),
        bool(removed) or rewrites,
        tuple(cdc) if cdc else tuple(added + removed),
        metadata,
        int(timestamp) if timestamp is not None else None,
    )


class DeltaLog:
    """The log of the table at ``table`` (a local path or a URI pyarrow can open)."""

    def __init__(self, table: str) -> None:
        self.table = table.rstrip("/")
        if "://" in self.table and not self.table.startswith("file:"):
            self._fs, self._root = fs.FileSystem.from_uri(self.table)
        else:
            self._fs, self._root = fs.LocalFileSystem(), _strip_file_scheme(self.table)
        self._commits: dict[int, Commit] = {}
        self._metadata: dict[int, Metadata] = {}

    def _log_file(self, name: str) -> str:
        return f"{self._root}/{LOG}/{name}"

    def _read(self, name: str) -> str | None:
        try:
            with self._fs.open_input_stream(self._log_file(name)) as f:
                return bytes(f.read()).decode()
        except FileNotFoundError:
            return None

    def exists(self) -> bool:
        info = self._fs.get_file_info(f"{self._root}/{LOG}")
        return bool(info.type == fs.FileType.Directory)

    def table_id(self) -> str:
        """The table's id (``metaData.id``), read now: a table dropped and created again at
        the same path has a new one. Version 0's commit file holds it (one small read);
        once log retention removed that, delta-rs reads it from the newest checkpoint."""
        text = self._read(f"{0:020d}.json")
        for line in (text or "").splitlines():
            action = json.loads(line) if line.strip() else {}
            if "metaData" in action:
                return str(action["metaData"]["id"])
        return str(open_table(self.table).metadata().id)

    def cleaned_up(self, version: int) -> bool:
        """Whether log retention removed ``version``'s commit (it is at or below the newest
        checkpoint, and its commit file is gone)."""
        return version <= self.last_checkpoint() and not self._is_file(f"{version:020d}.json")

    def _is_file(self, name: str) -> bool:
        return bool(self._fs.get_file_info(self._log_file(name)).type == fs.FileType.File)

    def reached(self, version: int) -> bool:
        """Whether the table has reached ``version``, asked of storage now (never of the
        commits kept in memory, which a table created again at this path would
        contradict): its commit file is there, or a checkpoint at or past it."""
        return version <= self.last_checkpoint() or self._is_file(f"{version:020d}.json")

    def commit(self, version: int) -> Commit | None:
        """Version ``version``; None when the table has not reached it. Raises
        ``SourceDataLost`` when the log no longer holds it (log retention). The newest
        versions read are kept in memory (a version never changes)."""
        if version in self._commits:
            return self._commits[version]
        text = self._read(f"{version:020d}.json")
        if text is None:
            if version <= self.last_checkpoint():
                raise SourceDataLost(
                    f"Delta table {self.table}: the log of version {version} was cleaned up "
                    f"(log retention) before lowmark read it; the oldest version kept is "
                    f"{self.oldest_version()}: raise the table's delta.logRetentionDuration; to "
                    "go on without it, set the source's `on_data_loss: skip` (the versions "
                    "passed over are counted), or, for a batch already planned over it, set "
                    "its input aside with `lowmark skip-batch`"
                )
            return None
        commit = parse_commit(version, text.splitlines())
        if len(self._commits) >= KEPT_COMMITS:
            del self._commits[min(self._commits)]
        self._commits[version] = commit
        return commit

    def last_checkpoint(self) -> int:
        """The version of the table's newest checkpoint (``_last_checkpoint``), or -1."""
        text = self._read("_last_checkpoint")
        return int(json.loads(text)["version"]) if text else -1

    def oldest_version(self) -> int | None:
        """The oldest version whose commit file is kept (a listing of the log)."""
        selector = fs.FileSelector(f"{self._root}/{LOG}", allow_not_found=True)
        versions = [
            int(name[:-5])
            for info in self._fs.get_file_info(selector)
            if (name := os.path.basename(info.path)).endswith(".json") and name[:-5].isdigit()
        ]
        return min(versions, default=None)

    def latest_version(self, at_least: int) -> int:
        """The table's newest version, looked for from ``max(at_least, last checkpoint)``
        onwards; ``at_least - 1`` when that version does not exist yet."""
        version = max(at_least, self.last_checkpoint())
        while self.commit(version) is not None:
            version += 1
        return version - 1

    def metadata_at(self, version: int) -> Metadata:
        """The table's metadata as of ``version``: the newest ``metaData`` at or before it."""
        checkpoint = self.last_checkpoint()
        found = None
        at = version
        while at >= 0 and at not in self._metadata:
            commit = self.commit(at) if at > checkpoint else None
            if commit is None:
                break
            if commit.metadata is not None:
                found = commit.metadata
                break
            at -= 1
        if found is None:
            found = self._metadata.get(at) or self._loaded_metadata(at)
        self._metadata[version] = found
        return found

    def _loaded_metadata(self, version: int) -> Metadata:
        """The metadata at ``version`` as delta-rs reads it (from a checkpoint)."""
        table = open_table(self.table, version=version)
        meta = table.metadata()
        return Metadata(
            StructType.fromJson(json.loads(table.schema().to_json())),
            tuple(meta.partition_columns),
            dict(meta.configuration),
        )

    def holds(self, path: str) -> bool:
        """Whether the data file ``path`` (as the log names it) is still in storage (VACUUM
        deletes files)."""
        if "://" in path:
            filesystem, where = fs.FileSystem.from_uri(unquote(path))
        else:
            filesystem, where = self._fs, f"{self._root}/{unquote(path)}"
        return bool(filesystem.get_file_info(where).type != fs.FileType.NotFound)

    def file_uri(self, path: str) -> str:
        """A data file's location as Spark reads it."""
        if "://" in path:
            return unquote(path)
        return f"{self.table}/{unquote(path)}"


def _strip_file_scheme(path: str) -> str:
    if path.startswith("file://"):
        return path[len("file://") :]
    if path.startswith("file:"):
        return path[len("file:") :]
    return path
