"""Pipeline definitions: what users write, in Python or YAML.

These are plain, frozen pydantic models; the runtime pieces they describe
(sources, sinks, the batch loop) are built from them elsewhere. Relative paths
are resolved against the data root (``LOWMARK_DATA_ROOT``, default ``./data``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ImportString, model_validator
from pyspark.sql import DataFrame

from batches.durations import DurationMs
from batches.windows import MAX_FUTURE_MS, EventTime, WindowedAggregation

Transform = Callable[[DataFrame], DataFrame]


class _Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FileSource(_Config):
    """A folder that new files keep landing in (like Spark's file stream source).

    New files are taken in (modification time, path) order. Files must not
    change after they land: write them under a hidden name (``.x``, ``_x``,
    which are ignored) and rename them, or set ``min_file_age``.
    """

    kind: Literal["files"] = "files"
    path: str = Field(description="Folder to watch, relative to the data root or absolute.")
    format: Literal["json", "csv", "parquet"] = Field(description="File format.")
    schema_ddl: str | None = Field(
        default=None,
        description="Schema as Spark DDL ('id LONG, ts STRING'); inferred once if absent.",
    )
    options: dict[str, str] = Field(
        default_factory=dict, description="Spark reader options, e.g. {'header': 'true'}."
    )
    partition_by_folder: bool = Field(
        default=False,
        description="Each subfolder of `path` is a source partition with its own watermark.",
    )
    max_files_per_batch: int = Field(default=1000, ge=1, description="Admission limit: files.")
    max_bytes_per_batch: int | None = Field(
        default=None, ge=1, description="Admission limit: bytes (a batch takes at least one file)."
    )
    min_file_age: DurationMs = Field(
        default=0,
        ge=0,
        description=(
            "A file is taken once its modification time is at least this old: set it above "
            "the longest pause of a producer that writes files in place (default 0: files "
            "must land whole, written under a hidden name and renamed)."
        ),
    )
    processed_files: Literal["keep", "archive", "delete"] = Field(
        default="keep",
        description=(
            "What becomes of a file once the batch that took it committed: kept (default), "
            "moved under `archive_dir` (with its path below `path`), or deleted. Backfills "
            "read archived files; a pipeline that deletes them cannot be backfilled."
        ),
    )
    archive_dir: str | None = Field(
        default=None,
        description="Where `processed_files: archive` moves files (relative to the data root "
        "or absolute; not inside `path`).",
    )

    @model_validator(mode="after")
    def _archive_dir_with_archive(self) -> FileSource:
        if (self.processed_files == "archive") != (self.archive_dir is not None):
            raise ValueError("`archive_dir` goes with `processed_files: archive`, and only with it")
        return self


class DeltaSink(_Config):
    """A Delta table written exactly once per batch."""

    kind: Literal["delta"] = "delta"
    path: str = Field(description="Table folder, relative to the data root or absolute.")
    mode: Literal["append", "merge"] = Field(
        default="append", description="append rows, or MERGE (upsert) on `keys`."
    )
    keys: tuple[str, ...] = Field(default=(), description="Merge keys (mode=merge only).")

    @model_validator(mode="after")
    def _keys_match_mode(self) -> DeltaSink:
        if self.mode == "merge" and not self.keys:
            raise ValueError("mode 'merge' needs `keys`: the columns that identify a row")
        if self.mode == "append" and self.keys:
            raise ValueError("`keys` only apply to mode 'merge'")
        return self


class HealthChecks(_Config):
    """Bounds the Dagster asset checks hold a pipeline to (they warn, never stop a run).

    ``max_watermark_lag``: processing time of the newest committed batch minus
    its next watermark. ``max_late_fraction`` and ``max_bad_fraction``: late
    and malformed rows / input rows over the newest ``window_batches``
    committed batches.
    """

    max_watermark_lag: DurationMs = Field(
        default=15 * 60_000, gt=0, description="Largest acceptable watermark lag."
    )
    max_late_fraction: float = Field(
        default=0.05, ge=0, le=1, description="Largest acceptable share of late rows."
    )
    max_bad_fraction: float = Field(
        default=0.01, ge=0, le=1, description="Largest acceptable share of malformed rows."
    )
    window_batches: int = Field(
        default=10, ge=1, description="Batches the late and malformed shares are over."
    )


class EventTimePartitions(_Config):
    """Event-time partitions a windowed pipeline can be backfilled by (one per day or hour).

    A backfill of partition P recomputes every window that STARTS in P from the
    source's committed history and replaces exactly that slice of the sink.
    """

    granularity: Literal["daily", "hourly"] = Field(default="daily", description="Partition size.")
    start: str | None = Field(
        default=None,
        pattern=r"^\d{4}-\d{2}-\d{2}( \d{2}:\d{2})?$",
        description="First partition, UTC: 'YYYY-MM-DD' (hourly: 'YYYY-MM-DD HH:MM' allowed). "
        "Default: the first window in the sink when Dagster loads the pipeline (else that day).",
    )


class Maintenance(_Config):
    """How the runner keeps the checkpoint small over a long life (``state.maintenance``)."""

    every_batches: int = Field(
        default=100, ge=1, description="Tidy the checkpoint after every this many batches."
    )
    log_batches: int = Field(
        default=100,
        ge=1,
        description="Batches whose offsets, commits and watermarks are kept (the latest ones).",
    )
    progress_batches: int = Field(
        default=10_000, ge=1, description="Batches whose progress rows are kept (lowmark history)."
    )


class Pipeline(_Config):
    """One streaming pipeline: source → transform → sink, with its checkpoint.

    ``transform`` is a function DataFrame → DataFrame, or in YAML its import
    path (``package.module:function``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_\-]*$", description="Unique name.")
    description: str = Field(default="", description="Shown by `lowmark list` and in Dagster.")
    source: FileSource
    transform: ImportString[Transform] | None = Field(
        default=None, description="DataFrame → DataFrame applied to each batch."
    )
    sink: DeltaSink
    event_time: EventTime | None = Field(
        default=None, description="Event-time column, out-of-orderness, idleness, lateness."
    )
    aggregation: WindowedAggregation | None = Field(
        default=None, description="Windowed aggregation per key (needs event_time)."
    )
    checkpoint: str | None = Field(
        default=None, description="Checkpoint folder; default <data root>/_lowmark/<name>."
    )
    checks: HealthChecks = Field(
        default_factory=HealthChecks, description="Bounds of the Dagster asset checks."
    )
    backfill: EventTimePartitions | None = Field(
        default=None, description="Event-time partitions for backfills (windowed pipelines)."
    )
    maintenance: Maintenance = Field(
        default_factory=Maintenance, description="Log retention and compaction of the checkpoint."
    )
    max_failed_attempts: int = Field(
        default=3,
        ge=1,
        description=(
            "Failed attempts at one batch before runs stop at it (a poison batch; "
            "`lowmark run --retry` or `lowmark skip-batch`)."
        ),
    )
    read_ahead_batches: int = Field(
        default=10,
        ge=1,
        description=(
            "Catch-up: how many batches one Spark job reads ahead when input waits "
            "(tumbling windows; 1 turns it off)."
        ),
    )

    @model_validator(mode="after")
    def _aggregation_needs_event_time(self) -> Pipeline:
        if self.aggregation is not None:
            if self.event_time is None:
                raise ValueError("`aggregation` needs `event_time` (which column holds event time)")
            if self.sink.mode != "append":
                raise ValueError(
                    "a windowed pipeline sets how the sink is written through "
                    "`aggregation.output_mode`; leave `sink.mode` at append"
                )
        elif self.backfill is not None:
            raise ValueError(
                "`backfill` recomputes event-time windows: it needs `aggregation`; remove it"
            )
        return self

    def sink_config(self) -> DeltaSink:
        """The sink as written: update-mode aggregations MERGE on keys + window."""
        if self.aggregation is not None and self.aggregation.output_mode == "update":
            keys = (*self.aggregation.keys, "window_start", "window_end")
            return self.sink.model_copy(update={"mode": "merge", "keys": keys})
        return self.sink

    def fingerprint(self) -> str:
        """Hash of everything that changes what a batch computes.

        Admission limits, what becomes of processed files, descriptions, health-check
        bounds, backfill partitions, maintenance, read-ahead and failed attempts are left
        out: changing them on a running checkpoint is safe.
        The transform counts by its import path, so editing its body is allowed
        (as in Spark), renaming it is not.
        """
        semantics = {
            "source": self.source.model_dump(
                exclude={
                    "max_files_per_batch",
                    "max_bytes_per_batch",
                    "min_file_age",
                    "processed_files",
                    "archive_dir",
                }
            ),
            "transform": self.transform,
            "sink": self.sink.model_dump(),
            "event_time": _event_time_semantics(self.event_time),
            "aggregation": self.aggregation.model_dump() if self.aggregation else None,
        }
        blob = json.dumps(semantics, sort_keys=True, default=_import_path).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def checkpoint_location(self, data_root: Path) -> str:
        return resolve(self.checkpoint or f"_lowmark/{self.name}", data_root)


def _event_time_semantics(event_time: EventTime | None) -> dict[str, object] | None:
    """``event_time`` as fingerprinted: ``max_future`` only when set to other than its
    default, so checkpoints written before it existed keep their fingerprint."""
    if event_time is None:
        return None
    dump = event_time.model_dump()
    if dump["max_future"] == MAX_FUTURE_MS:
        del dump["max_future"]
    return dump


def _import_path(value: object) -> str:
    """Functions count by where they live (``module:qualname``), not by their code."""
    return f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', repr(value))}"


def resolve(path: str, data_root: Path) -> str:
    """``path`` if it is absolute or a URL (s3a://...), else under ``data_root``."""
    if "://" in path or Path(path).is_absolute():
        return path
    return str((data_root / path).resolve())
