"""The file source: a folder of JSON, CSV or Parquet files.

Discovery assigns each new file the next sequence number of its partition in
the manifest (``lowmark.state.manifest``); offsets are ``{partition: next seq}``. One
partition ("0") by default; with ``partition_by_folder`` every subfolder is a
source partition (with its own watermark), like a Kafka partition. Malformed JSON/CSV rows
become bad records with the raw text and the file, and the batch goes on.
The folder itself (listing it, a file's size and time, setting processed
files aside) is ``filesystem.SourceFolder``.

Schema drift, against the schema fixed for the checkpoint: JSON fields are
matched by name, so a new field is ignored, a missing one is null and a
value that does not parse as its field's type makes its row a bad record.
CSV columns are matched by position, so a file whose header names other
columns (added, reordered, renamed) is refused with SourceFileUnreadable,
and a row with more values than columns is a bad record. Parquet columns are
matched by name: a new column is ignored, a type Spark cannot read as the
schema's (STRING for LONG) is refused with SourceFileUnreadable.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from lowmark.batches.batch_values import batch_long
from lowmark.batches.clock import Clock, SystemClock
from lowmark.batches.errors import (
    SourceFileChanged,
    SourceFileMissing,
    SourceFileUnreadable,
)
from lowmark.batches.pipeline import FileSource, resolve
from lowmark.batches.records import INGESTED_COLUMN
from lowmark.batches.sources.base import (
    BATCH_COLUMN,
    PARTITION_COLUMN,
    Clocks,
    Range,
    Source,
    SourceRead,
    capped_rank,
    clock_rank,
    read_counts,
)
from lowmark.batches.sources.context import SourceContext
from lowmark.batches.sources.filesystem import SourceFolder, literal
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.errors import CheckpointMissing, LowmarkError
from lowmark.state.manifest import FileManifest, ManifestFile, numbered
from lowmark.state.offset_log import Offsets
from lowmark.state.session import SparkLike, provider
from lowmark.state.source_schema import SourceSchema

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

PARTITION = "0"
CORRUPT = "_corrupt_record"
_NAME = "_source_name"
"""A parsed record's file name (``FileStreamSource._file_keys``)."""
_DEFAULT_OPTIONS = {"csv": {"header": "true"}}


def _by_file(values: dict[str, int | None]) -> Column:
    """A map literal of ``values`` (a file's key: a number), for a record to look its file
    up in. One JSON literal, which Spark's optimizer folds into the map before any record
    is read (tested): a literal per key and value would cost a round trip to the JVM each,
    40-100 ms for a read-ahead of 100 files."""
    from pyspark.sql import functions as F

    return F.from_json(F.lit(json.dumps(values)), "map<string,bigint>")


class FileStreamSource(Source):
    """Reads new files of ``folder`` batch by batch; see FileSource for the config."""

    def __init__(
        self,
        spark: SparkLike,
        config: FileSource,
        folder: str,
        manifest: FileManifest,
        schema_store: SourceSchema,
        archive: str | None = None,
        clock: Clock | None = None,
        ingestion_clock: bool = False,
    ) -> None:
        """``clock``: what a discovered file's listing time (its ingestion time) is read
        from; the system clock by default. ``ingestion_clock``: the pipeline's watermark
        follows the files' ingestion times, so aligned admission's clocks are those."""
        self._spark = provider(spark)
        self.ingestion_clock = ingestion_clock
        self.clock = clock or SystemClock()
        self.config = config
        self.storage = SourceFolder(
            self._spark, folder, archive, None if config.partition_by_folder else PARTITION
        )
        """The folder and the archive on their file system."""
        self.manifest = manifest
        self.schema_store = schema_store
        self.options = {**_DEFAULT_OPTIONS.get(config.format, {}), **config.options}
        self._fixed_schema: StructType | None = None
        self._known: list[ManifestFile] | None = None
        """The manifest as this source last read or wrote it: one read per runner."""
        self._unrecorded: list[ManifestFile] = []
        """Files a dry-run ``plan`` found and numbered without recording them."""

    @classmethod
    def from_config(cls, config: FileSource, context: SourceContext) -> FileStreamSource:
        """The folder of ``config``, with the file manifest and schema of the checkpoint."""
        checkpoint, data_root = context.checkpoint, context.data_root
        if isinstance(checkpoint, Checkpoint):
            manifest, schema = checkpoint.files, checkpoint.schema
        else:
            manifest = FileManifest(f"{checkpoint}/files", ":files")
            schema = SourceSchema(f"{checkpoint}/schema", ":schema")
        archive = resolve(config.archive_dir, data_root) if config.archive_dir else None
        folder = resolve(config.path, data_root)
        return cls(
            context.spark,
            config,
            folder,
            manifest,
            schema,
            archive,
            context.clock,
            context.ingestion_clock,
        )

    @property
    def spark(self) -> SparkSession:
        return self._spark()

    def _manifest(self, refresh: bool = False) -> list[ManifestFile]:
        if self._known is None or refresh:
            self._known = self.manifest.files()
        return self._known

    def initial_offsets(self) -> Offsets:
        # Folder partitions appear as they are discovered; a missing one is at 0.
        return {} if self.config.partition_by_folder else {PARTITION: 0}

    def plan(
        self,
        start: Offsets,
        batch_id: int,
        record: bool = True,
        discover: bool = True,
        clocks: Clocks | None = None,
    ) -> Offsets:
        """The next batch's end: the pending files ``_admit`` takes (lowest ``clocks``
        first, when given, capped at the next clock when they are the files' ingestion
        times: ``capped_rank``), newly listed files recorded first (unless ``record`` is
        False)."""
        known = self._manifest()
        if not known and any(start.values()):
            raise CheckpointMissing(
                f"file manifest {self.manifest.path} is missing or empty, but the checkpoint "
                f"has read up to {start}: restore it from backup, or start over with "
                "`lowmark reset`"
            )
        found = self._unseen(known) if discover else []
        if found and not record:
            self._unrecorded = numbered(found, known)
            known = known + self._unrecorded
        elif found:
            # Recorded against the table's newest version (this runner's copy may be
            # stale: another runner may have recorded some of them), then the table's
            # files are taken, never this list: offsets cover recorded files only.
            self.manifest.record(found, batch_id, self.clock.now_ms())
            known = self._manifest(refresh=True)
        pending = [f for f in known if f.seq >= start.get(f.partition, 0)]
        end = dict(start)
        rank, stage = clock_rank(clocks), capped_rank(clocks, {f.partition for f in pending})
        recorded, now = {f.path for f in self._manifest()}, self.clock.now_ms()

        def key(f: ManifestFile) -> tuple[bool, int]:
            if self.ingestion_clock and clocks:
                return stage(f.partition, self._ingested(f, recorded, now))
            return rank(f.partition)

        for f in self._admit(pending, key):
            end[f.partition] = f.seq + 1
        return end

    def read(
        self,
        start: Offsets,
        end: Offsets,
        batch_id: int,
        cache: bool = False,
        strict: bool = False,
    ) -> SourceRead:
        """The files of [start, end) as lazy frames over one parse (persisted if ``cache``).

        The manifest is the one the batch was planned with (re-read only when
        it lacks the range: a replay in a new process, or files recorded by
        another runner). Every column is parsed whatever a job selects, so a
        row is bad for the same reason in every job over the batch. ``strict``:
        a file whose size or modification time differs from the manifest's is
        refused; otherwise the manifest records it as it is now, before the read
        (a batch that wrote nothing reads files as they are now, so an
        unreadable file can be rewritten in place). ``confirm`` after the read.
        """
        return self._read(self._files(Range(batch_id, start, end), strict), batch_id, cache)

    def read_batches(self, batches: Sequence[Range]) -> SourceRead:
        """Consecutive ``batches`` in one scan: a record's batch is its file's."""
        files: list[ManifestFile] = []
        tags: dict[str, int] = {}
        for batch in batches:
            mine = self._files(batch, strict=False)
            files += mine
            tags.update((f.path, batch.batch_id) for f in mine)
        return self._read(files, batches[0].batch_id, False, tags)

    def _files(self, batch: Range, strict: bool) -> list[ManifestFile]:
        """The files of ``batch`` as it reads them: where they are (the folder, or the
        archive), with the size and modification time they have now.

        A file that differs from the manifest is refused if ``strict`` (part of
        the batch was written from the file as the manifest records it).
        Otherwise nothing of the batch is written yet, and the manifest records
        the file as it is now, before it is read: a replay then reads what this
        read does, or refuses the file.
        """
        taken = self._taken(batch)
        found = [self._found(f, batch.batch_id) for f in taken]
        changed = [(f, now) for f, now in zip(taken, found, strict=True) if _differs(f, now)]
        if changed and strict:
            f, now = changed[0]
            raise SourceFileChanged(
                f"{f.path} (taken by batch {batch.batch_id}) changed since the batch read it "
                f"({_change(f, now)}): what was written from it would not match; "
                "put the original back, or start over with `lowmark reset`"
            )
        if changed:
            as_read = {
                f.path: dataclasses.replace(f, size=now.size, modified_ms=now.modified_ms)
                for f, now in changed
            }
            self.manifest.record_as_read(list(as_read.values()), batch.batch_id)
            self._known = [as_read.get(f.path, f) for f in self._manifest()]
        return found

    def confirm(self, batch: Range) -> None:
        """Every file of ``batch`` is still as the manifest records it, i.e. as the batch
        read it; else SourceFileChanged (it changed while it was read)."""
        for f in self._taken(batch):
            now = self._found(f, batch.batch_id)
            if _differs(f, now):
                raise SourceFileChanged(
                    f"{f.path} (taken by batch {batch.batch_id}) changed while the batch read "
                    f"it ({_change(f, now)}): the batch stopped before its commit; run again "
                    "(if its sink write landed, the replay refuses the file: put the original "
                    "back, or start over with `lowmark reset`), and have the producer write "
                    "under a hidden name and rename, or set source.min_file_age"
                )

    def _taken(self, batch: Range) -> list[ManifestFile]:
        """The manifest's files of ``batch`` (re-read once if it lacks some), and those a
        dry-run ``plan`` numbered (``lowmark preview`` reads them, recording nothing)."""
        start, end = batch.start, batch.end
        expected = sum(n - start.get(p, 0) for p, n in end.items())

        def in_range(known: list[ManifestFile]) -> list[ManifestFile]:
            return [
                f for f in known if start.get(f.partition, 0) <= f.seq < end.get(f.partition, 0)
            ]

        files = in_range(self._planned(refresh=False))
        if len(files) != expected:
            files = in_range(self._planned(refresh=True))
        if len(files) != expected:  # a committed batch's, retired by maintenance
            files = in_range(self.manifest.files(retired=True))
        if len(files) != expected:
            raise CheckpointMissing(
                f"manifest {self.manifest.path} lacks files of batch {batch.batch_id} "
                f"(offsets {start} -> {end}): restore it from backup"
            )
        return files

    def missing(self, start: Offsets, end: Offsets) -> str | None:
        """The files of ``[start, end)`` (retired ones too) in neither the folder nor the
        archive, the first named: known before a batch reads them (a backfill or a rebuild
        reads committed batches again)."""
        gone = []
        for f in self._taken(Range(-1, start, end)):
            try:
                self._found(f, -1)
            except SourceFileMissing:
                gone.append(f.path)
        if not gone:
            return None
        if self.config.processed_files == "delete":
            why = "each was deleted once its batch committed (source processed_files: delete)"
        else:
            why = "each was taken by a committed batch and is gone since"
        return (
            f"{len(gone)} file(s) of {self.storage.folder}, e.g. {gone[0]}: {why}; reading "
            "committed batches again needs processed files kept or archived"
        )

    def commit(self, end: Offsets) -> None:
        """With ``processed_files`` set, every file in the folder whose batch committed (its
        seq below ``end``) is archived or deleted. The folder is listed, so a file a crash
        left behind after its commit goes with the next commit."""
        if self.config.processed_files == "keep":
            return
        known = {f.path: f for f in self._manifest()}
        for listed in self.storage.listing():
            f = known.get(listed.path)
            if f is not None and f.seq < end.get(f.partition, 0):
                self.storage.set_aside(f, delete=self.config.processed_files == "delete")

    def retire(self, committed_end: Offsets, batch_id: int) -> None:
        """Retire from the manifest planning reads (``FileManifest.retire``) each
        partition's longest run of first files whose batches committed and that left the
        folder, but its last file."""
        present = {f.path for f in self.storage.listing()}
        by_partition: dict[str, list[ManifestFile]] = {}
        for f in self._manifest(refresh=True):
            by_partition.setdefault(f.partition, []).append(f)
        below = {}
        for partition, files in by_partition.items():
            done = committed_end.get(partition, 0)
            gone = 0
            for f in files[:-1]:
                if f.seq >= done or f.path in present:
                    break
                gone = f.seq + 1
            if gone:
                below[partition] = gone
        self.manifest.retire(below, batch_id)
        self._known = None

    def _found(self, f: ManifestFile, batch_id: int) -> ManifestFile:
        """``f`` where it is now, with the size and modification time it has now: in the
        folder or, once archived, in the archive (a backfill reads committed batches);
        SourceFileMissing when it is in neither. A retired file left the folder: a file of
        its name there now is another one."""
        now = None if f.retired else self.storage.stat(f.path)
        if now is None and self.config.processed_files == "archive":
            for archived in (
                self.storage.archived(f.path, reused=f.seq),
                self.storage.archived(f.path),
            ):
                now = self.storage.stat(archived)
                if now is not None:
                    f = dataclasses.replace(f, path=archived)
                    break
        if now is None and self.config.processed_files == "delete":
            raise SourceFileMissing(
                f"{f.path} (taken by batch {batch_id}) was deleted once its batch "
                "committed (source processed_files: delete): reading committed batches again, "
                "as a backfill does, needs processed files kept or archived"
            )
        if now is None:
            raise SourceFileMissing(
                f"{f.path} (taken by batch {batch_id}) is gone: put it back, or start "
                "over with `lowmark reset`"
            )
        return dataclasses.replace(f, size=now[0], modified_ms=now[1])

    def _read(
        self,
        files: list[ManifestFile],
        batch_id: int,
        cache: bool,
        tags: dict[str, int] | None = None,
    ) -> SourceRead:
        """``files`` parsed; with ``tags`` (path: batch id), records carry their batch."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F
        from pyspark.sql.types import StringType, StructField, StructType
        from pyspark.storagelevel import StorageLevel

        paths = [f.path for f in files]
        schema = self._schema(paths)
        counts = Observation()
        file_path = F.col("_metadata.file_path")
        batch_of = ingested_at = None
        mapped = bool(tags) or (self.ingestion_clock and bool(files))
        by_name, key = self._file_keys(files) if mapped else (False, {})
        if tags:
            batch_of = _by_file({key[path]: b for path, b in tags.items()})
        if self.ingestion_clock and files:
            ingested_at = _by_file({key[f.path]: self._own_time(f) for f in files})

        def carried(frame: DataFrame, path: Column, name: Column) -> DataFrame:
            """``frame`` with each record's batch and ingestion time, found by its file's
            ``path`` or ``name`` (``_file_keys``)."""
            file = name if by_name else path
            if batch_of is not None:
                frame = frame.withColumn(BATCH_COLUMN, F.element_at(batch_of, file))
            if ingested_at is not None:
                frame = frame.withColumn(INGESTED_COLUMN, F.element_at(ingested_at, file))
            return frame

        tagged = batch_of is not None
        size = sum(f.size for f in files)
        if self.config.format == "parquet":
            records = carried(
                self.spark.read.schema(schema).parquet(*map(literal, paths)),
                file_path,
                F.col("_metadata.file_name"),
            )
            records = records.withColumn(PARTITION_COLUMN, self._partition_of(file_path)).observe(
                counts, *read_counts(tagged, None)
            )
            if cache:
                records = records.persist(StorageLevel.MEMORY_AND_DISK)
            cached = (records,) if cache else ()
            return SourceRead(records, None, counts, cached, self._unreadable(batch_id), size)
        if self.config.format == "csv" and self.options.get("header") == "true":
            self.check_headers(paths, schema.fieldNames(), batch_id)
        with_corrupt = StructType([*schema.fields, StructField(CORRUPT, StringType(), True)])
        # Referencing every column makes every job parse every column: Spark parses only
        # the columns a query needs, so a bad value in an unparsed column would leave its
        # row good in one job and bad in another (and a query of the corrupt-record column
        # alone would be refused). A null test per column is the cheapest reference
        # (a whole-row hash cost 15 % of a catch-up job).
        nulls = [F.col(f"`{n}`").isNull() for n in schema.fieldNames()]
        every_column = F.max(F.greatest(F.lit(False), *nulls))
        parsed = carried(
            self._parsed(paths, with_corrupt, by_name), F.col("_source_file"), F.col(_NAME)
        )
        if cache:
            parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)
        observed = parsed.observe(
            counts,
            *read_counts(tagged, F.col(CORRUPT).isNull()),
            every_column.alias("_every_column"),
        )
        # The bad rows come from the parse unobserved: a job that reads them beside the
        # records (a stateless batch's one job) may compute the cached parse twice, in two
        # tasks on two executors, and must count it once. Their filter references every
        # column (always true), as the observation does, for the parse without the cache.
        bad = parsed.where(F.col(CORRUPT).isNotNull() & F.greatest(F.lit(True), *nulls)).select(
            batch_long(batch_id).alias("batch_id"),
            F.col("_source_file").alias("source_file"),
            F.col(CORRUPT).alias("raw"),
            F.lit(f"malformed {self.config.format} or not matching the source schema").alias(
                "reason"
            ),
        )
        records = (
            observed.where(F.col(CORRUPT).isNull())
            .withColumn(PARTITION_COLUMN, self._partition_of(F.col("_source_file")))
            .drop(CORRUPT, "_source_file", *([_NAME] if by_name else []))
        )
        cached = (parsed,) if cache else ()
        return SourceRead(records, bad, counts, cached, self._unreadable(batch_id), size)

    def _file_keys(self, files: list[ManifestFile]) -> tuple[bool, dict[str, str]]:
        """How a record's file is found in a map over ``files`` (its batch, its ingestion
        time): by the file's name (``_metadata.file_name``) when no two of ``files`` share
        one, else by its URI (``_metadata.file_path``); whether by name, and each path's key.

        Spark looks a key up in a map by comparing it with the map's keys one by one, for
        every record: the short names, which the scan need not carry a path for, made a
        read-ahead's scan of 100 files about a fifth cheaper (docs/benchmarks.md). Spark
        names a file by its URI ("a b.json" is "a%20b.json"), its name by the URI's last
        part."""
        uris = {f.path: self.storage.uri(f.path) for f in files}
        names = {path: uri.rsplit("/", 1)[-1] for path, uri in uris.items()}
        unique = len(set(names.values())) == len(names)
        return unique, names if unique else uris

    def _parsed(self, paths: list[str], with_corrupt: StructType, with_name: bool) -> DataFrame:
        """The records of the JSON or CSV files ``paths`` parsed by ``with_corrupt`` (a line
        that does not parse, or does not match it, whole in ``CORRUPT``), each with the URI
        of its file in ``_source_file`` (and, ``with_name``, its name in ``_NAME``). With a
        rescued-data column (JSON lines only), the lines are parsed one by one (``from_json``,
        the reader's options), and the fields a record has that ``with_corrupt`` does not
        name are kept in that column as a JSON object, their values as they were (null when
        there are none, or the line does not parse); blank lines are passed over, as the
        JSON reader does."""
        from pyspark.sql import functions as F

        reading = {**self.options, "mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
        located = [literal(p) for p in paths]
        rescued = self.config.rescued_data_column
        if rescued is None:
            parsed = (
                self.spark.read.format(self.config.format)
                .options(**reading)
                .schema(with_corrupt)
                .load(located)
                .withColumn("_source_file", F.col("_metadata.file_path"))
            )
            return parsed.withColumn(_NAME, F.col("_metadata.file_name")) if with_name else parsed
        lines = self.spark.read.format("text").load(located).where(F.trim("value") != "")
        named = F.array(*[F.lit(n) for n in with_corrupt.fieldNames()])
        fields = F.from_json("value", "map<string,variant>")
        unknown = F.map_filter(fields, lambda name, _: ~F.array_contains(named, name))
        record = F.from_json("value", with_corrupt, reading)
        return lines.select(
            *[record[n].alias(n) for n in with_corrupt.fieldNames()],
            F.when(record[CORRUPT].isNull() & (F.size(unknown) > 0), F.to_json(unknown)).alias(
                rescued
            ),
            F.col("_metadata.file_path").alias("_source_file"),
            *([F.col("_metadata.file_name").alias(_NAME)] if with_name else []),
        )

    def inputs(self, start: Offsets, end: Offsets) -> list[str]:
        """The paths of the files of ``[start, end)``."""
        return [f.path for f in self._in_range(start, end)]

    def input_bytes(self, start: Offsets, end: Offsets) -> int:
        return sum(f.size for f in self._in_range(start, end))

    def ingestion_times(self, position: Offsets, observed_ms: int) -> dict[str, int]:
        """A file's ingestion time is when the planning that recorded it listed it (the
        manifest's ``discovered_ms``), or with ``ingestion_time: modified`` its
        modification time: per partition, the earliest of its files at or past
        ``position``, else ``observed_ms`` (a file not listed yet is listed later). A file
        recorded before lowmark kept the listing time counts as listed at time 0: it holds
        its partition's clock back until a batch takes it. A dry run's unrecorded files
        count as listed at ``observed_ms``."""
        times = {p: observed_ms for p in self.initial_offsets()}
        recorded = {f.path for f in self._manifest()}
        for f in self._planned(refresh=False):
            times.setdefault(f.partition, observed_ms)
            if f.seq < position.get(f.partition, 0):
                continue
            times[f.partition] = min(times[f.partition], self._ingested(f, recorded, observed_ms))
        return times

    def _ingested(self, f: ManifestFile, recorded: set[str], observed_ms: int) -> int:
        """``f``'s ingestion time (``ingestion_times``): its modification time, or when the
        planning that recorded it listed it; ``observed_ms`` when it is not ``recorded``."""
        if self.config.ingestion_time == "modified":
            return f.modified_ms
        if f.path not in recorded:
            return observed_ms
        return f.discovered_ms if f.discovered_ms is not None else 0

    def _own_time(self, f: ManifestFile) -> int | None:
        """The ingestion time ``f``'s records carry (``INGESTED_COLUMN``): as
        ``ingestion_times`` counts it for a recorded file; None for one recorded before
        lowmark kept the listing time (its records are judged by the batch's clock)."""
        if self.config.ingestion_time == "modified":
            return f.modified_ms
        return f.discovered_ms

    def waiting_partitions(self, end: Offsets) -> tuple[str, ...]:
        """The partitions with files past ``end`` that the last ``plan`` found."""
        files = self._planned(refresh=False)
        return tuple(sorted({f.partition for f in files if f.seq >= end.get(f.partition, 0)}))

    def _in_range(self, start: Offsets, end: Offsets) -> list[ManifestFile]:
        """The files of ``[start, end)``."""
        files = self._planned(refresh=True)
        return [f for f in files if start.get(f.partition, 0) <= f.seq < end.get(f.partition, 0)]

    def _planned(self, refresh: bool) -> list[ManifestFile]:
        """The files ``plan`` can have taken: recorded, or numbered by a dry-run ``plan``."""
        known = self._manifest(refresh)
        recorded = {f.path for f in known}
        return known + [f for f in self._unrecorded if f.path not in recorded]

    @staticmethod
    def _unreadable(batch_id: int) -> Callable[[Exception], LowmarkError | None]:
        """Names the file Spark could not read when a job over this batch's input failed."""

        def explain(exc: Exception) -> LowmarkError | None:
            failed = _failed_read(exc)
            if failed is None:
                return None
            parameters: Any = failed.getMessageParameters() or {}
            path = dict(parameters).get("path", "a file")
            reason = str(failed.getMessage()).strip().splitlines()[0]
            return SourceFileUnreadable(
                f"{path} (taken by batch {batch_id}) cannot be read with the source schema "
                f"({reason}): rewrite it in place in the source's schema, or start over with "
                "`lowmark reset`"
            )

        return explain

    def check_headers(self, paths: list[str], names: list[str], batch_id: int) -> None:
        """CSV columns are read by position: a header naming other columns than ``names``
        (the source schema's) is refused.

        Spark would otherwise put a reordered or renamed column's values into
        whichever field sits at its position, silently.
        """
        sep = self.options.get("sep", self.options.get("delimiter", ","))
        wanted = [name.lower() for name in names]
        for path in paths:
            line = self.storage.first_line(path)
            header = [name.strip().strip('"').lower() for name in line.split(sep)]
            if header != wanted:
                raise SourceFileUnreadable(
                    f"{path} (taken by batch {batch_id}) has the CSV header {line.strip()!r} "
                    f"but the source schema is {', '.join(names)}: CSV columns "
                    "are read by position; rewrite the file in place with the source's "
                    "columns, or start over with `lowmark reset`"
                )

    def backlog(self, committed_end: Offsets) -> dict[str, int]:
        known = self._manifest(refresh=True)
        waiting = [f for f in known if f.seq >= committed_end.get(f.partition, 0)]
        waiting += self._unseen(known)
        return {"files": len(waiting), "bytes": sum(f.size for f in waiting)}

    def describe_backlog(self, backlog: dict[str, int]) -> str:
        return f"{backlog['files']} new files ({backlog['bytes']} bytes) waiting"

    def _admit(
        self, pending: list[ManifestFile], rank: Callable[[ManifestFile], tuple[bool, int]]
    ) -> list[ManifestFile]:
        """Oldest pending files within the limits (at least one file), the files that
        ``rank`` puts first (of the lowest clock, with aligned admission) before the others.

        Partitions whose next files rank equal are interleaved by (modification
        time, path) of their next file, and each partition is taken in ``seq``
        order, so a batch's files are a ``seq`` prefix of every partition:
        exactly what offsets express.
        """
        queues: dict[str, list[ManifestFile]] = {}
        for f in sorted(pending, key=lambda f: f.seq, reverse=True):
            queues.setdefault(f.partition, []).append(f)
        heads = [(rank(q[-1]), q[-1].modified_ms, q[-1].path, p) for p, q in queues.items()]
        heapq.heapify(heads)
        taken: list[ManifestFile] = []
        total = 0
        limit = self.config.max_bytes_per_batch
        while heads and len(taken) < self.config.max_files_per_batch:
            _, _, _, partition = heapq.heappop(heads)
            f = queues[partition].pop()
            if taken and limit is not None and total + f.size > limit:
                break
            taken.append(f)
            total += f.size
            if queues[partition]:
                nxt = queues[partition][-1]
                heapq.heappush(heads, (rank(nxt), nxt.modified_ms, nxt.path, partition))
        return taken

    def _unseen(self, known: list[ManifestFile]) -> list[ManifestFile]:
        """Files in the folder not in the manifest (seq unset: -1), oldest first; a file
        modified less than ``min_file_age`` ago is left for a later listing (it may still
        be being written)."""
        seen = {f.path for f in known}
        fresh = [f for f in self.storage.listing() if f.path not in seen]
        if self.config.min_file_age:  # unset: even a file stamped ahead of this clock is taken
            settled = time.time() * 1000 - self.config.min_file_age
            fresh = [f for f in fresh if f.modified_ms <= settled]
        return sorted(fresh, key=lambda f: (f.modified_ms, f.path))

    def _partition_of(self, file_path: Column) -> Column:
        """The source partition of a record from its file: the folder, or the one partition."""
        from pyspark.sql import functions as F

        if not self.config.partition_by_folder:
            return F.lit(PARTITION)
        return F.element_at(F.split(file_path, "/"), -2)

    def _schema(self, paths: list[str]) -> StructType:
        """The configured schema, else the stored one, else inferred from ``paths`` and stored."""
        from pyspark.sql.types import StructType

        if self._fixed_schema is None:
            if self.config.schema_ddl:
                ddl = StructType.fromDDL(self.config.schema_ddl)
                assert isinstance(ddl, StructType)
                self._fixed_schema = ddl
            else:
                stored = self.schema_store.get() or self._infer(paths)
                self._fixed_schema = StructType.fromJson(json.loads(stored))
        return self._fixed_schema

    def _infer(self, paths: list[str]) -> str:
        from pyspark.sql.types import StructType

        reader = self.spark.read.format(self.config.format).options(**self.options)
        inferred = reader.load([literal(p) for p in paths])
        fields = [f for f in inferred.schema.fields if f.name != CORRUPT]
        return self.schema_store.fix(StructType(fields).json())


def _differs(recorded: ManifestFile, now: ManifestFile) -> bool:
    return (recorded.size, recorded.modified_ms) != (now.size, now.modified_ms)


def _change(recorded: ManifestFile, now: ManifestFile) -> str:
    """How ``now`` differs from ``recorded``: sizes, and modification times as UTC times."""

    def at(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")

    return (
        f"{recorded.size} -> {now.size} bytes, modified {at(recorded.modified_ms)} -> "
        f"{at(now.modified_ms)}"
    )


def _failed_read(exc: Exception) -> Any:
    """The JVM error of condition FAILED_READ_FILE.* behind ``exc`` (its cause chain), or None.

    Arrow collects wrap the job's failure in their own exception, so the
    condition may be some causes down.
    """
    from py4j.java_gateway import is_instance_of
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    cause: Any = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    while cause is not None and gateway is not None:
        throwable = is_instance_of(gateway, cause, "org.apache.spark.SparkThrowable")
        if throwable and str(cause.getCondition() or "").startswith("FAILED_READ_FILE"):
            return cause
        cause = cause.getCause()
    return None
