"""A Delta table as a source: the versions other jobs commit, read exactly once.

Offsets are ``{"version": v}`` (everything before version ``v`` taken) or,
inside a version with more added files than one batch takes,
``{"version": v, "index": i}`` (its first ``i`` files, in path order, taken).
The table's history does not change, so a replay of a range reads the same
rows. Planning and the backlog read the commit files of the versions
involved on the driver (``lowmark.batches.sources.delta_log``): no Spark job, and no
cost that grows with the table.

- ``read: appends``: a batch reads exactly the data files its versions added,
  with Spark's Parquet reader (partition values from the log), so its cost is
  what was appended, not the table. A version that changed rows (UPDATE,
  DELETE, MERGE, an overwrite) fails the batch, naming it, or with
  ``on_change: skip`` is passed over; OPTIMIZE and other rewrites that
  change no rows contribute nothing.
- ``read: changes``: a batch reads its versions' change data feed with
  Spark's Delta reader (``readChangeFeed``, ``startingVersion`` to
  ``endingVersion``), whole versions at a time.
- Lost history: a version whose log was cleaned up, or whose files were
  vacuumed, before a batch read it stops with one line naming the table and
  versions, and the way out. With ``on_data_loss: skip`` the next batch
  starts at the oldest version kept instead (``past_lost``), and a batch
  reading appends passes over files VACUUM removed; what is passed over is
  counted in a log line (and, when planning, in the batch's progress row).
- A replaced table: its id (``metaData.id``) is the source's identity (the
  runner records it with the offsets and stops when it changes), and a table
  that has not reached a version already read stops planning
  (``SourceReplaced``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from functools import reduce
from pathlib import PurePosixPath
from urllib.parse import unquote

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from lowmark.batches.errors import PipelineConfigInvalid, SourceDataLost, SourceReplaced
from lowmark.batches.pipeline import DeltaSource, resolve
from lowmark.batches.records import INGESTED_COLUMN
from lowmark.batches.sources.base import PARTITION_COLUMN, Skipped, Source, SourceRead, read_counts
from lowmark.batches.sources.context import SourceContext
from lowmark.batches.sources.delta_log import Commit, DataFile, DeltaLog, Metadata
from lowmark.state.errors import LowmarkError, first_line
from lowmark.state.offset_log import Identity, Offsets
from lowmark.state.session import SparkLike, provider

log = logging.getLogger(__name__)

PARTITION = "table"
"""The one source partition (and watermark partition) of a table."""
CHANGE_FIELDS = (
    StructField("_change_type", StringType()),
    StructField("_commit_version", LongType()),
    StructField("_commit_timestamp", TimestampType()),
)
"""The columns the change feed adds to the table's."""


def position(offsets: Offsets) -> tuple[int, int]:
    """(version, index) of ``offsets``."""
    return offsets["version"], offsets.get("index", 0)


def offsets_at(version: int, index: int) -> Offsets:
    """The offsets of (version, index): ``index`` only when inside a version."""
    return {"version": version, "index": index} if index else {"version": version}


class DeltaStreamSource(Source):
    """The table at ``table`` (resolved path) as ``config`` reads it."""

    def __init__(
        self, spark: SparkLike, config: DeltaSource, table: str, ingestion_clock: bool = False
    ) -> None:
        """``ingestion_clock``: the pipeline's watermark follows this source's ingestion
        clock (``ingestion_times``), so each row carries its own (``INGESTED_COLUMN``)."""
        self._spark = provider(spark)
        self.config = config
        self.log = DeltaLog(table)
        self.ingestion_clock = ingestion_clock

    @classmethod
    def from_config(cls, config: DeltaSource, context: SourceContext) -> DeltaStreamSource:
        """The table of ``config``, its path resolved against the data root."""
        table = resolve(config.path, context.data_root)
        return cls(context.spark, config, table, context.ingestion_clock)

    # -- what each version holds for this source --------------------------------------

    def taken(self, commit: Commit) -> tuple[DataFile, ...]:
        """The files a batch reads of ``commit``; raises for a version this source cannot
        read (a change with ``on_change: fail``, a change feed that was off)."""
        if self.config.read == "changes":
            if not self.log.metadata_at(commit.version).change_feed:
                raise PipelineConfigInvalid(
                    f"Delta table {self.log.table} has no change data feed at version "
                    f"{commit.version}: set its property delta.enableChangeDataFeed = true "
                    "(it records changes from then on) and start after that version "
                    "(`starting_version`), or read `appends`"
                )
            return commit.change_files
        if commit.changes_rows:
            if self.config.on_change == "skip":
                return ()
            raise PipelineConfigInvalid(
                f"Delta table {self.log.table} version {commit.version} ({commit.operation}) "
                "changed existing rows, which reading appends cannot follow: set the source's "
                "`on_change: skip` to pass such versions over, or read the table's change "
                "feed (`read: changes`)"
            )
        return commit.added

    def _versions(self, start: Offsets, end: Offsets) -> Iterator[tuple[Commit, list[DataFile]]]:
        """Each version of ``[start, end)`` with the files of it the range takes."""
        version, index = position(start)
        last, upto = position(end)
        while version < last or (version == last and upto > 0):
            commit = self.log.commit(version)
            if commit is None:
                raise SourceDataLost(
                    f"Delta table {self.log.table} has no version {version}, which a batch "
                    "took: the table was replaced or its log deleted; `lowmark reset` the "
                    "pipeline"
                )
            files = self.taken(commit)
            yield commit, list(files[index : upto if version == last else len(files)])
            version, index = version + 1, 0

    # -- the contract ---------------------------------------------------------------------

    def initial_offsets(self) -> Offsets:
        """Batch 0's start: ``starting_version`` (``latest`` resolved now; the runner
        records it, so a later run starts from the same place)."""
        start = self.config.starting_version
        if start == "latest":
            return offsets_at(self._latest(0) + 1, 0)
        return offsets_at(0 if start == "earliest" else start, 0)

    def start_moves(self) -> bool:
        return self.config.starting_version == "latest"

    def _latest(self, at_least: int) -> int:
        """The table's newest version (``at_least - 1`` if it has not reached that one)."""
        self._check_exists()
        return self.log.latest_version(at_least)

    def _check_exists(self) -> None:
        if not self.log.exists():
            raise SourceDataLost(
                f"no Delta table at {self.log.table}: create it, or point the source's `path` at it"
            )

    def identity(self) -> Identity:
        """The table's id (``Delta table <path>``); none while there is no table (``plan``
        says so)."""
        if not self.log.exists():
            return {}
        return {f"Delta table {self.log.table}": self.log.table_id()}

    def past_lost(self, start: Offsets) -> Skipped | None:
        """With ``on_data_loss: skip``: when log retention removed the version ``start``
        is in, the oldest version kept."""
        version, _ = position(start)
        if self.config.on_data_loss != "skip" or not self.log.cleaned_up(version):
            return None
        oldest = self.log.oldest_version()
        if oldest is None:
            return None  # no commit left at all: planning reports the table
        versions = (
            f"version {version}" if oldest == version + 1 else f"versions {version} to {oldest - 1}"
        )
        return Skipped(
            offsets_at(oldest, 0), {"versions": oldest - version}, f"{self.log.table} {versions}"
        )

    def _check_not_behind(self, start: Offsets) -> None:
        """Refuse a table whose newest version is below what lowmark already read of it: it
        is not the history those offsets were read from (a table dropped and created
        again). A start the user chose (``starting_version``) may lie ahead."""
        version, index = position(start)
        chosen = self.config.starting_version
        if isinstance(chosen, int) and start == offsets_at(chosen, 0):
            return
        needed = version if index else version - 1
        if needed >= 0 and not self.log.reached(needed):
            raise SourceReplaced(
                f"Delta table {self.log.table} has no version {needed}, which lowmark already "
                "read: the table was dropped and created again, and the checkpoint's offsets "
                "point into the old one; read the new one from its start with `lowmark reset` "
                "(`--truncate-sink`)"
            )

    def plan(
        self, start: Offsets, batch_id: int, record: bool = True, discover: bool = True
    ) -> Offsets:
        """The next batch's end: whole versions (changes) or added files in path order
        (appends), up to the limits; a batch takes at least one file or version, and
        versions with nothing to read are passed over. Nothing is recorded."""
        self._check_exists()
        self._check_not_behind(start)
        version, index = position(start)
        files = rows = versions = 0
        whole = self.config.read == "changes"
        while (commit := self.log.commit(version)) is not None:
            left = list(self.taken(commit)[index:])
            if not left:
                version, index = version + 1, 0
                continue
            if whole:
                more = sum(f.rows or 0 for f in left)
                if versions and self._over(files + len(left), rows + more, versions + 1):
                    break
                files, rows = files + len(left), rows + more
                versions += 1
                version += 1
                continue
            if versions and self._full(files, rows, versions, None):
                break
            versions += 1
            for f in left:
                if files and self._full(files, rows, 0, f):
                    return offsets_at(version, index)
                files, rows, index = files + 1, rows + (f.rows or 0), index + 1
            version, index = version + 1, 0
        return offsets_at(version, index)

    def _over(self, files: int, rows: int, versions: int) -> bool:
        """Do ``files``, ``rows`` and ``versions`` pass a limit (whole versions, changes)?"""
        c = self.config
        return (
            files > c.max_files_per_batch
            or (c.max_versions_per_batch is not None and versions > c.max_versions_per_batch)
            or (c.max_rows_per_batch is not None and rows > c.max_rows_per_batch)
        )

    def _full(self, files: int, rows: int, versions: int, next_file: DataFile | None) -> bool:
        """Would one more version (``versions`` taken) or file (``next_file``) pass a limit?"""
        c = self.config
        if c.max_versions_per_batch is not None and versions >= c.max_versions_per_batch:
            return True
        if next_file is None:
            return files >= c.max_files_per_batch
        if files + 1 > c.max_files_per_batch:
            return True
        return (
            c.max_rows_per_batch is not None
            and rows + (next_file.rows if next_file.rows is not None else c.max_rows_per_batch)
            > c.max_rows_per_batch
        )

    def read(
        self,
        start: Offsets,
        end: Offsets,
        batch_id: int,
        cache: bool = False,
        strict: bool = False,
    ) -> SourceRead:
        """Exactly the rows of ``[start, end)``; ``strict`` changes nothing (a version
        never changes)."""
        read = [(c, files) for c, files in self._versions(start, end) if files]
        if self.config.on_data_loss == "skip" and self.config.read == "appends":
            read = self._held(read, batch_id)
        last, index = position(end)
        meta = self.log.metadata_at(max(last if index else last - 1, 0))
        explain = self._explain(start, end, batch_id)
        ingested = self._committed_at(read) if self.ingestion_clock else None
        if self.config.read == "changes":
            records = self._changes(meta.schema, position(start)[0], last - 1)
            if ingested is not None:
                records = records.withColumn(INGESTED_COLUMN, ingested)
        else:
            files = [f for _, files in read for f in files]
            records = self._appends(meta, files, explain, ingested)
        counts = Observation()
        records = records.withColumn(PARTITION_COLUMN, F.lit(PARTITION)).observe(
            counts, *read_counts(False, None)
        )
        if cache:
            records = records.persist()
        size = sum(f.size for _, files in read for f in files)  # input_bytes, read once
        return SourceRead(records, None, counts, (records,) if cache else (), explain, size)

    def _committed_at(self, read: list[tuple[Commit, list[DataFile]]]) -> Column:
        """A row's own ingestion time (``INGESTED_COLUMN``): its version's commit timestamp,
        as ``ingestion_times`` counts it; null for a version that records none. Appends
        find their version by their data file's name (unique in a table: writers name
        files by a UUID; Spark names a record's file by its escaped URI, its name is
        plain), the change feed by ``_commit_version``."""
        if self.config.read == "changes":
            at = {c.version: c.timestamp_ms for c, _ in read}
            pairs = [(F.lit(v), F.lit(ms).cast("long")) for v, ms in at.items()]
            key = F.col("_commit_version")
        else:
            named = {
                PurePosixPath(unquote(f.path)).name: c.timestamp_ms for c, fs in read for f in fs
            }
            pairs = [(F.lit(n), F.lit(ms).cast("long")) for n, ms in named.items()]
            key = F.substring_index(F.col("_metadata.file_path"), "/", -1)
        if not pairs:
            return F.lit(None).cast("long")
        return F.element_at(F.create_map(*[x for pair in pairs for x in pair]), key)

    def _held(
        self, read: list[tuple[Commit, list[DataFile]]], batch_id: int
    ) -> list[tuple[Commit, list[DataFile]]]:
        """``read`` without the files VACUUM removed, which are passed over and counted in a
        log line."""
        held = [(c, [f for f in files if self.log.holds(f.path)]) for c, files in read]
        gone = [
            (c.version, f)
            for (c, files), (_, kept) in zip(read, held, strict=True)
            for f in files
            if f not in kept
        ]
        if gone:
            log.warning(
                "batch %d passes over %d files (%s rows) of Delta table %s removed before it "
                "read them (on_data_loss: skip): %s",
                batch_id,
                len(gone),
                sum(f.rows or 0 for _, f in gone),
                self.log.table,
                ", ".join(f"version {v} {f.path}" for v, f in gone),
            )
        return [(c, files) for c, files in held if files]

    def _appends(
        self,
        meta: Metadata,
        files: list[DataFile],
        explain: Callable[[Exception], LowmarkError | None],
        ingested: Column | None = None,
    ) -> DataFrame:
        """The rows of ``files`` (added files), with the table's columns as ``meta`` says,
        and ``ingested`` as ``INGESTED_COLUMN`` (it may read a row's ``_metadata``);
        ``explain`` names a file that is gone."""
        if meta.column_mapping != "none":
            raise PipelineConfigInvalid(
                f"Delta table {self.log.table} uses column mapping ({meta.column_mapping}), "
                "whose data files name columns by physical name: read the table's change feed "
                "(`read: changes`) instead of its appends"
            )
        spark = self._spark()
        if not files:
            empty = spark.createDataFrame([], meta.schema)
            return empty if ingested is None else empty.withColumn(INGESTED_COLUMN, ingested)
        partitioned = set(meta.partition_columns)
        data_schema = StructType([f for f in meta.schema.fields if f.name not in partitioned])
        groups: dict[tuple[tuple[str, str | None], ...], list[str]] = {}
        for f in files:
            groups.setdefault(f.partition_values, []).append(self.log.file_uri(f.path))
        frames = []
        for values, uris in groups.items():
            given = dict(values)
            columns = [
                F.lit(given.get(f.name)).cast(f.dataType).alias(f.name)
                if f.name in partitioned
                else F.col(f"`{f.name}`")
                for f in meta.schema.fields
            ]
            if ingested is not None:
                columns.append(ingested.alias(INGESTED_COLUMN))
            try:
                frames.append(spark.read.schema(data_schema).parquet(*uris).select(*columns))
            except AnalysisException as exc:
                raise explain(exc) or exc from exc
        return reduce(DataFrame.union, frames)

    def _changes(self, schema: StructType, first: int, last: int) -> DataFrame:
        """The change feed of versions ``first`` to ``last`` (none when ``last < first``)."""
        spark = self._spark()
        if last < first:
            return spark.createDataFrame([], StructType([*schema.fields, *CHANGE_FIELDS]))
        return (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", first)
            .option("endingVersion", last)
            .load(self.log.table)
        )

    def _explain(
        self, start: Offsets, end: Offsets, batch_id: int
    ) -> Callable[[Exception], LowmarkError | None]:
        """A read of files vacuumed away, as the user's error."""
        # Reading appends, the source itself can pass over the removed files.
        skip = (
            ", or set the source's `on_data_loss: skip` and run again (they are counted)"
            if self.config.read == "appends"
            else ""
        )

        def explain(exc: Exception) -> LowmarkError | None:
            text = str(exc)
            if not any(s in text for s in ("FileNotFound", "FILE_NOT_EXIST", "PATH_NOT_FOUND")):
                return None
            first, (last, index) = position(start)[0], position(end)
            last = last if index else last - 1
            return SourceDataLost(
                f"Delta table {self.log.table}: files of {_versions(first, last)} were "
                f"removed (VACUUM) before lowmark read them ({first_line(exc)}): keep them "
                "longer (the table's delta.deletedFileRetentionDuration, or VACUUM's "
                f"RETAIN); to go on without them, set the batch's input aside with "
                f"`lowmark skip-batch` (batch {batch_id}){skip}"
            )

        return explain

    def missing(self, start: Offsets, end: Offsets) -> str | None:
        """Versions of ``[start, end)`` whose log was cleaned up, or whose files of the
        range were vacuumed."""
        first, (last, index) = position(start)[0], position(end)
        last = last if index else last - 1
        if last < first:
            return None
        kept = self.log.oldest_version()
        if kept is None or kept > first:
            cleaned = last if kept is None else min(kept - 1, last)
            return (
                f"Delta table {self.log.table} no longer holds the log of "
                f"{_versions(first, cleaned)} (log retention): keep it longer with the table's "
                "delta.logRetentionDuration"
            )
        vacuumed = [
            commit.version
            for commit, files in self._versions(start, end)
            if not all(self.log.holds(f.path) for f in files)
        ]
        if not vacuumed:
            return None
        return (
            f"Delta table {self.log.table} no longer holds files of "
            f"{_versions(vacuumed[0], vacuumed[-1])} (VACUUM): keep them longer with the table's "
            "delta.deletedFileRetentionDuration, or VACUUM's RETAIN"
        )

    def ingestion_times(self, position: Offsets, observed_ms: int) -> dict[str, int]:
        """A version's ingestion time is its commit timestamp (``Commit.timestamp_ms``): the
        earliest of the versions from ``position`` on (writers' clocks may disagree), else
        ``observed_ms`` (a version not committed yet is committed later). A version that
        records no timestamp counts as committed at time 0."""
        self._check_exists()
        version = position["version"]
        earliest = observed_ms
        while (commit := self.log.commit(version)) is not None:
            at = commit.timestamp_ms if commit.timestamp_ms is not None else 0
            earliest, version = min(earliest, at), version + 1
        return {PARTITION: earliest}

    def partitions(self, start: Offsets, end: Offsets) -> tuple[str, ...]:
        """The table is one partition: a range that moved reads it."""
        return (PARTITION,) if start != end else ()

    def inputs(self, start: Offsets, end: Offsets) -> list[str]:
        return [
            f"version {c.version} ({c.operation}): {len(files)} files"
            for c, files in self._versions(start, end)
            if files
        ]

    def input_bytes(self, start: Offsets, end: Offsets) -> int:
        return sum(f.size for _, files in self._versions(start, end) for f in files)

    def backlog(self, committed_end: Offsets) -> dict[str, int]:
        """Versions past ``committed_end`` (a version partly taken counts)."""
        version, _ = position(committed_end) if committed_end else (0, 0)
        latest = self._latest(version)
        return {"versions": max(latest - version + 1, 0)}

    def describe_backlog(self, backlog: dict[str, int]) -> str:
        return f"{backlog['versions']} Delta versions waiting"


def _versions(first: int, last: int) -> str:
    """``version 3``, or ``versions 3 to 5``."""
    return f"version {first}" if first == last else f"versions {first} to {last}"
