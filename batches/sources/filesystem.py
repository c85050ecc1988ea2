"""The file system under the file source: where its folder and archive are, what the
folder holds, and setting processed files aside.

A path is a plain local path, a ``file:`` URL or any URI Hadoop has a file
system for (an object store: ``s3a://bucket/in``). Local paths are listed,
statted, read, moved and deleted with ``os`` calls, without a JVM round trip
per file; every other path goes through Hadoop's ``FileSystem``, which needs
Spark (started on first use only). Hadoop's path strings are not
URL-escaped: ``#`` or a space is part of a file name. Nothing here knows
offsets or batches: a listed file has no seq yet (-1); the manifest numbers it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.state.errors import LowmarkError
from lowmark.state.manifest import ManifestFile
from lowmark.state.session import is_remote_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_PLAIN_PATH = re.compile(r"[A-Za-z0-9/._:=-]*")
_GLOB_CHARACTER = re.compile(r"([\\\[\]{}*?])")


def literal(path: str) -> str:
    """``path`` as Spark's file readers take it literally. They expand Hadoop glob patterns
    in the paths they are given, so a file named ``a[1].json`` would be read as the pattern
    ``a[1].json`` (which matches ``a1.json``, not itself): its glob characters
    (``[ ] { } * ? \\``) are escaped with a backslash."""
    return _GLOB_CHARACTER.sub(r"\\\1", path)


class SourceFolder:
    """The file source's ``folder``, and the ``archive`` its processed files go to.

    ``partition``: the source partition of every file of the folder; None when
    every visible subfolder is a partition of its own (``partition_by_folder``).
    """

    def __init__(
        self,
        spark: Callable[[], SparkSession],
        folder: str,
        archive: str | None,
        partition: str | None,
    ) -> None:
        self._spark = spark
        self.folder = folder
        self.archive = archive
        """Where processed files go (``processed_files: archive``)."""
        if archive is not None and _below(_path_part(archive), _path_part(folder)) is not None:
            raise PipelineConfigInvalid(
                f"source archive_dir {archive} is inside the source folder {folder}: archived "
                "files would be read again; put it beside the folder"
            )
        self.partition = partition

    def set_aside(self, f: ManifestFile, delete: bool) -> None:
        """Delete ``f``, or move it to its place under the archive (``archived``): below
        ``_reused/<seq>/`` when an earlier file of its name is archived already, never over
        it, so that every batch's files stay readable."""
        path = f.path
        local = local_path(path)
        if delete:
            if local is not None:
                os.remove(local)
            else:
                fs, hpath = self._hadoop_path(path)
                fs.delete(hpath, False)
            return
        target = self.archived(path)
        if self.stat(target) is not None:
            target = self.archived(path, reused=f.seq)
        target_local = local_path(target)
        if local is not None and target_local is not None:
            os.makedirs(os.path.dirname(target_local), exist_ok=True)
            os.replace(local, target_local)
            return
        fs, hpath = self._hadoop_path(path)
        _, htarget = self._hadoop_path(target)
        fs.mkdirs(htarget.getParent())
        if not fs.rename(hpath, htarget):
            raise LowmarkError(f"could not move processed file {path} to {target}")

    def archived(self, path: str, reused: int | None = None) -> str:
        """Where ``processed_files: archive`` moves ``path``: its path below the source
        folder, below ``archive_dir`` (and below ``_reused/<seq>/`` for the file of ``seq``
        ``reused`` whose name an earlier archived file has: a name that landed again)."""
        assert self.archive is not None
        below = _below(_path_part(path), _path_part(self.folder))
        assert below is not None, f"{path} is not in {self.folder}"
        again = "" if reused is None else f"_reused/{reused}/"
        return f"{self.archive.rstrip('/')}/{again}{below}"

    def first_line(self, path: str) -> str:
        local = local_path(path)
        if local is not None:
            with open(local, encoding="utf-8", errors="replace") as f:
                return f.readline()
        fs, hpath = self._hadoop_path(path)
        jvm: Any = self._spark().sparkContext._jvm
        stream = jvm.java.io.BufferedReader(jvm.java.io.InputStreamReader(fs.open(hpath)))
        try:
            return str(stream.readLine() or "")
        finally:
            stream.close()

    def listing(self) -> list[ManifestFile]:
        """The visible files of the folder (or of its subfolders, one partition each)."""
        if self.partition is not None:
            return self._list_files(self.folder, self.partition)
        local = local_path(self.folder)
        if local is not None:
            if not os.path.isdir(local):
                return []
            files = []
            for entry in os.scandir(local):
                if entry.is_dir() and not entry.name.startswith((".", "_")):
                    files += self._list_files(entry.path, entry.name)
            return files
        fs, hpath = self._hadoop_path(self.folder)
        if not fs.exists(hpath):
            return []
        files = []
        for status in fs.listStatus(hpath):
            name = status.getPath().getName()
            if status.isDirectory() and not name.startswith((".", "_")):
                files += self._list_files(status.getPath().toString(), name)
        return files

    def _list_files(self, folder: str, partition: str) -> list[ManifestFile]:
        local = local_path(folder)
        if local is not None:  # a plain directory listing: no JVM round trip per file
            if not os.path.isdir(local):
                return []
            return [
                ManifestFile(
                    partition,
                    -1,
                    f"file:{os.path.abspath(entry.path)}",
                    stat.st_size,
                    stat.st_mtime_ns // 1_000_000,
                )
                for entry in os.scandir(local)
                if entry.is_file() and not entry.name.startswith((".", "_"))
                for stat in [entry.stat()]
            ]
        fs, hpath = self._hadoop_path(folder)
        if not fs.exists(hpath):
            return []
        return [
            ManifestFile(
                partition,
                -1,
                status.getPath().toString(),
                status.getLen(),
                status.getModificationTime(),
            )
            for status in fs.listStatus(hpath)
            if status.isFile() and not status.getPath().getName().startswith((".", "_"))
        ]

    def stat(self, path: str) -> tuple[int, int] | None:
        """(size, modification time in ms) of ``path`` as a listing records them; None if
        it is gone."""
        local = local_path(path)
        if local is not None:
            try:
                st = os.stat(local)
            except FileNotFoundError:
                return None
            return st.st_size, st.st_mtime_ns // 1_000_000
        fs, hpath = self._hadoop_path(path)
        if not fs.exists(hpath):
            return None
        status = fs.getFileStatus(hpath)
        return int(status.getLen()), int(status.getModificationTime())

    def _hadoop_path(self, path: str) -> tuple[Any, Any]:
        """(FileSystem, Path) of ``path``: works for local folders and object stores alike.
        Not over Spark Connect, whose client has no JVM: there the folder must be a path
        the client sees (a local or mounted folder)."""
        spark = self._spark()
        if is_remote_session(spark):
            raise PipelineConfigInvalid(
                f"file source path {path}: over Spark Connect the file source lists and moves "
                "files from lowmark's process, without Hadoop: give a local or mounted folder"
            )
        sc = spark.sparkContext
        jvm: Any = sc._jvm
        hpath = jvm.org.apache.hadoop.fs.Path(path)
        return hpath.getFileSystem(sc._jsc.hadoopConfiguration()), hpath

    def uri(self, path: str) -> str:
        """``path`` as Spark names a record's file (``_metadata.file_path``): its URI, which
        Hadoop computes in the JVM. Not asked over Spark Connect, whose client has none: the
        read-ahead that tags records with their file's batch does not run there
        (``BatchWork.unwatermarked``)."""
        if _PLAIN_PATH.fullmatch(path):
            return path  # nothing a URI escapes
        jvm: Any = self._spark().sparkContext._jvm
        return str(jvm.org.apache.hadoop.fs.Path(path).toUri().toString())


def _path_part(path: str) -> str:
    """``path`` without its scheme and authority (``s3a://b/in/x`` → ``/in/x``)."""
    local = local_path(path)
    if local is not None:
        return os.path.abspath(local)
    return _without_authority(path.partition(":")[2])


def _below(path: str, folder: str) -> str | None:
    """``path`` relative to ``folder`` when it is inside it, else None."""
    folder = folder.rstrip("/") + "/"
    return path[len(folder) :] if path.startswith(folder) else None


def local_path(path: str) -> str | None:
    """The local file system path of ``path`` (a plain path or a file: URL), else None.

    Hadoop's path strings are not URL-escaped: in ``file:/in/a b#1.json`` the
    ``#`` is part of the file name, not a URL fragment.
    """
    scheme, colon, rest = path.partition(":")
    if not colon or "/" in scheme or (len(scheme) == 1 and os.name == "nt"):
        return path
    return _without_authority(rest) if scheme == "file" else None


def _without_authority(rest: str) -> str:
    """What follows a URI's scheme, as a path: ``//host/x``, ``///x`` or ``/x`` → ``/x``."""
    if rest.startswith("//"):
        rest = rest[2:]
        rest = rest[rest.find("/") :] if "/" in rest else "/"
    return rest
