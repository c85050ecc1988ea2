"""Pipeline definitions: what users write, in Python or YAML.

These are plain, frozen pydantic models; the runtime pieces they describe
(sources, sinks, the batch loop) are built from them elsewhere. Relative paths
are resolved against the data root (``LOWMARK_DATA_ROOT``, default ``./data``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeAlias, Union

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    ImportString,
    Tag,
    field_validator,
    model_validator,
)

from lowmark.batches.config import UserConfig
from lowmark.batches.dedup import Dedup
from lowmark.batches.durations import DurationMs
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.expectations import Expectation, Quality, check_names, fingerprint_semantics
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.sql import SqlStep, Transform, apply_step, step_semantics
from lowmark.batches.stream_join import StreamJoin
from lowmark.batches.table_join import TableJoin, check_tables_distinct
from lowmark.batches.windows import (
    MAX_FUTURE_MS,
    EventTime,
    IngestionWatermark,
    WindowedAggregation,
)
from lowmark.state.catalog import CatalogEntry

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class _Config(UserConfig):
    """A model of this module: frozen, strict about keys, its ``help()`` listing its fields
    with their descriptions (a ``Field(description=...)`` or an attribute docstring)."""


class SourceKind(_Config):
    """What every source config is: a ``kind`` (its tag in YAML) and the runtime it builds.

    A built-in kind is one such model with a ``kind`` literal and a ``RUNTIME``,
    entered in ``ONE_SYSTEM_SOURCES``; the kinds a pipeline accepts, their
    parsing and ``lowmark.batches.sources.build_source`` follow from there.
    """

    OPERATIONAL: ClassVar[frozenset[str]] = frozenset()
    """Fields a running checkpoint may change: left out of the pipeline's fingerprint."""
    RUNTIME: ClassVar[str]
    """Import path (``module:qualname``) of the function that builds the runtime source
    from this config and a ``lowmark.batches.sources.context.SourceContext``."""

    kind: str

    def semantics(self) -> dict[str, Any]:
        """What the pipeline's fingerprint hashes of this source."""
        return self.model_dump(exclude=set(self.OPERATIONAL))

    @property
    def label(self) -> str:
        """What the source reads, in a few words."""
        raise NotImplementedError(f"{type(self).__name__} names no label")


class FileSource(SourceKind):
    """A folder that new files keep landing in (like Spark's file stream source).

    New files are taken in (modification time, path) order. Files must not
    change after they land: write them under a hidden name (``.x``, ``_x``,
    which are ignored) and rename them, or set ``min_file_age``.
    """

    OPERATIONAL: ClassVar[frozenset[str]] = frozenset(
        {"max_files_per_batch", "max_bytes_per_batch", "min_file_age", "processed_files"}
        | {"archive_dir", "ingestion_time"}
    )
    """Fields a running checkpoint may change: left out of the pipeline's fingerprint."""

    RUNTIME: ClassVar[str] = "lowmark.batches.sources.files:FileStreamSource.from_config"

    kind: Literal["files"] = "files"
    """Picks this source (the default when `kind` is not given)."""
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
    ingestion_time: Literal["listed", "modified"] = Field(
        default="listed",
        description=(
            "A file's ingestion time, for an ingestion-time watermark: when lowmark first "
            "listed it (default), or its modification time (for producers that write in "
            "place; a file copied in with an older modification time makes its records "
            "late). Read only by `event_time.watermark: {strategy: ingestion_time}`."
        ),
    )

    rescued_data_column: str | None = Field(
        default=None,
        description=(
            "JSON only: a column that keeps, as a JSON object, each record's fields the schema "
            "does not name (null when it has none), so a field a producer adds is kept rather "
            "than dropped (Auto Loader's `_rescued_data`). None: unknown fields are dropped."
        ),
    )

    @model_validator(mode="after")
    def _archive_dir_with_archive(self) -> FileSource:
        if (self.processed_files == "archive") != (self.archive_dir is not None):
            raise ValueError("`archive_dir` goes with `processed_files: archive`, and only with it")
        return self

    def semantics(self) -> dict[str, Any]:
        """As every source's, ``rescued_data_column`` only when set (a source without it
        keeps the fingerprint it had before it existed)."""
        semantics = super().semantics()
        if self.rescued_data_column is None:
            del semantics["rescued_data_column"]
        return semantics

    @model_validator(mode="after")
    def _rescued_data_of_json_lines(self) -> FileSource:
        if self.rescued_data_column is None:
            return self
        if self.format != "json" or self.options.get("multiLine", "false").lower() == "true":
            raise ValueError(
                "`rescued_data_column` reads JSON lines: set it with `format: json` (and no "
                "`multiLine` option)"
            )
        return self

    @property
    def label(self) -> str:
        """What the source reads, in a few words (its folder)."""
        return self.path


def _start_position(value: str) -> str:
    """``earliest``, ``latest`` or an ISO time (naive = UTC), as written."""
    if value not in ("earliest", "latest"):
        try:
            datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(
                f"{value!r}: write 'earliest', 'latest' or a time such as "
                "'2026-11-24T10:00:00+00:00'"
            ) from None
    return value


def start_time_ms(value: str) -> int:
    """Epoch ms of a start position that is a time (see ``_start_position``)."""
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


class KafkaSource(SourceKind):
    """Kafka topics, read in exact offset ranges per topic partition.

    Each topic partition is a source partition (offsets, its own watermark).
    A batch reads ``[start, end)`` of every partition with Spark's Kafka batch
    reader, so a replay reads the same records. After each commit the
    committed frontier is committed to ``consumer_group``, so Kafka's own tools
    show the pipeline's lag (lowmark itself reads positions from its offset
    log only).
    """

    OPERATIONAL: ClassVar[frozenset[str]] = frozenset(
        {"bootstrap_servers", "max_offsets_per_batch", "consumer_group", "options"}
        | {"starting_offsets", "on_data_loss"}
    )
    """Fields a running checkpoint may change: left out of the pipeline's fingerprint."""

    RUNTIME: ClassVar[str] = "lowmark.batches.sources.kafka:KafkaStreamSource.from_config"

    kind: Literal["kafka"] = "kafka"
    """Picks this source."""
    bootstrap_servers: str = Field(description="host:port[,host:port...] of the brokers.")
    topics: tuple[str, ...] = Field(min_length=1, description="Topics to read.")
    starting_offsets: str = Field(
        default="earliest",
        description="Where batch 0 starts in each partition: 'earliest', 'latest' or a time "
        "(ISO, UTC if no offset given: the first record at or after it). Partitions that "
        "appear later start at their earliest offset.",
    )
    max_offsets_per_batch: int = Field(
        default=100_000,
        ge=1,
        description="Admission limit: records per batch, split fairly across partitions.",
    )
    value_format: Literal["json", "raw"] = Field(
        default="json",
        description="json: each value is a JSON object parsed with `schema_ddl` (values that "
        "do not parse go to bad_records); raw: records keep Kafka's columns (key, value as "
        "bytes, topic, partition, offset, timestamp) for the transform.",
    )
    schema_ddl: str | None = Field(
        default=None, description="Schema of the JSON values as Spark DDL (json only)."
    )
    consumer_group: str | None = Field(
        default=None,
        description="Group the committed frontier is committed to; default lowmark-<pipeline>.",
    )
    on_data_loss: Literal["fail", "skip"] = Field(
        default="fail",
        description="Records retention deleted before a batch read them: fail (stop, naming "
        "them), or skip (go on from the earliest offset kept, counting the records passed "
        "over in the log and the batch's progress row).",
    )
    options: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Kafka client settings (security, SASL...), e.g. "
        "{'security.protocol': 'SSL'}: given to Spark's reader and to lowmark's own client.",
    )

    _check_start = field_validator("starting_offsets")(_start_position)

    @model_validator(mode="after")
    def _schema_with_json(self) -> KafkaSource:
        if (self.value_format == "json") != (self.schema_ddl is not None):
            raise ValueError("`schema_ddl` goes with `value_format: json`, and only with it")
        return self

    @property
    def label(self) -> str:
        """What the source reads, in a few words (its topics)."""
        return ",".join(self.topics)


class DeltaSource(SourceKind):
    """A Delta table other jobs write (an upstream lowmark sink, say), read version by version.

    Offsets are the next version to read (``version``) and, inside a version
    too large for one batch, how many of its added files were taken
    (``index``). ``read: appends`` takes the rows each version appended; a
    version that updated or deleted rows fails the batch (``on_change: fail``,
    as Spark's Delta source does) or is passed over (``skip``); OPTIMIZE and
    other rewrites that change no rows are passed over. ``read: changes``
    takes each version's row changes from the table's change data feed
    (``_change_type``: insert, update_preimage, update_postimage, delete, with
    ``_commit_version`` and ``_commit_timestamp``), whole versions a batch.
    """

    OPERATIONAL: ClassVar[frozenset[str]] = frozenset(
        {"max_versions_per_batch", "max_files_per_batch", "max_rows_per_batch"}
        | {"starting_version", "on_data_loss"}
    )
    """Fields a running checkpoint may change: left out of the pipeline's fingerprint."""

    RUNTIME: ClassVar[str] = "lowmark.batches.sources.delta_table:DeltaStreamSource.from_config"

    kind: Literal["delta"] = "delta"
    """Picks this source."""
    path: str = Field(description="Table folder, relative to the data root or absolute.")
    read: Literal["appends", "changes"] = Field(
        default="appends",
        description="appends: the rows each version appended; changes: the change data feed "
        "(the table needs delta.enableChangeDataFeed from the first version read).",
    )
    on_change: Literal["fail", "skip"] = Field(
        default="fail",
        description="appends only: what a version that updated or deleted rows does: fail "
        "the batch (naming it), or skip it (its rows are not read).",
    )
    on_data_loss: Literal["fail", "skip"] = Field(
        default="fail",
        description="History lost before a batch read it (versions whose log was cleaned up; "
        "appends: files VACUUM removed): fail (stop, naming them), or skip (go on from the "
        "oldest version kept, without the removed files, counting what was passed over in "
        "the log and the batch's progress row).",
    )
    starting_version: int | Literal["earliest", "latest"] = Field(
        default="earliest",
        description="Where batch 0 starts: version 0 (earliest), the version after the "
        "newest one when the pipeline first runs (latest), or a version number.",
    )
    max_versions_per_batch: int | None = Field(
        default=None, ge=1, description="Admission limit: versions (None: no limit)."
    )
    max_files_per_batch: int = Field(
        default=1000,
        ge=1,
        description="Admission limit: data files (appends may split a version; the change "
        "feed takes whole versions).",
    )
    max_rows_per_batch: int | None = Field(
        default=None,
        ge=1,
        description="Admission limit: rows, from the files' statistics (None: no limit). "
        "A batch takes at least one file (appends) or one version (changes).",
    )

    @model_validator(mode="after")
    def _skip_with_appends(self) -> DeltaSource:
        if self.read == "changes" and self.on_change != "fail":
            raise ValueError("`on_change` applies to `read: appends` only")
        if isinstance(self.starting_version, int) and self.starting_version < 0:
            raise ValueError("`starting_version` is a version (0 or more), 'earliest' or 'latest'")
        return self

    @property
    def label(self) -> str:
        """What the source reads, in a few words (its table)."""
        return self.path


class SyntheticSource(SourceKind):
    """Deterministic events from a seed, for demos, tests and benchmarks.

    Partition ``p``'s record ``i`` is a pure function of the settings, ``p`` and
    ``i`` (offsets are event counts per partition), so a replay is exact. Its
    event time is ``start + i / rows_per_second`` shifted back by ``p *
    partition_skew`` and a random disorder of up to ``max_out_of_orderness``;
    a ``late_fraction`` of records are ``late_by`` older still. With
    ``rows_per_second`` the source offers what that rate has produced by now
    (event time = when it was produced); without it, all ``total_rows`` at once.
    Columns: ``key`` (``k0`` … ``k<keys-1>``), ``event_time``, ``value`` (1 to 100),
    ``seq`` (``i``) and ``source_partition`` (``p``); a ``null_fraction`` of
    records have no event time and a ``malformed_fraction`` are bad records.
    """

    OPERATIONAL: ClassVar[frozenset[str]] = frozenset({"max_rows_per_batch", "starting_offsets"})
    """Fields a running checkpoint may change: left out of the pipeline's fingerprint."""

    RUNTIME: ClassVar[str] = "lowmark.batches.sources.synthetic:SyntheticStreamSource.from_config"

    kind: Literal["synthetic"] = "synthetic"
    """Picks this source."""
    seed: int = Field(default=0, description="Same seed, same events.")
    partitions: int = Field(default=1, ge=1, le=1024, description="Source partitions.")
    keys: int = Field(default=100, ge=1, description="Distinct keys.")
    rows_per_second: float | None = Field(
        default=10,
        gt=0,
        description="Per partition, in event time and as offered; None: `total_rows` at once.",
    )
    total_rows: int | None = Field(
        default=None, ge=1, description="Records per partition in all (None: unbounded)."
    )
    start: str = Field(
        default="2026-01-01T00:00:00+00:00",
        description="Event time of each partition's record 0 (ISO; UTC if no offset given).",
    )
    starting_offsets: Literal["earliest", "latest"] = Field(
        default="latest",
        description="Batch 0 starts at record 0 (earliest) or at what the rate has produced "
        "by now (latest).",
    )
    max_rows_per_batch: int = Field(
        default=100_000, ge=1, description="Admission limit, split fairly across partitions."
    )
    max_out_of_orderness: DurationMs = Field(
        default=0, ge=0, description="Records are up to this much older than their slot."
    )
    late_fraction: float = Field(default=0, ge=0, le=1, description="Share of late records.")
    late_by: DurationMs = Field(default=3_600_000, ge=0, description="How late they are.")
    null_fraction: float = Field(
        default=0, ge=0, le=1, description="Share of records without an event time."
    )
    malformed_fraction: float = Field(
        default=0, ge=0, le=1, description="Share of records that are malformed (bad records)."
    )
    partition_skew: DurationMs = Field(
        default=0,
        ge=0,
        description="Partition p trails partition 0 in event time by p times this.",
    )

    _check_start = field_validator("start")(_start_position)

    @model_validator(mode="after")
    def _bounded_or_paced(self) -> SyntheticSource:
        if self.rows_per_second is None and self.total_rows is None:
            raise ValueError("without `rows_per_second`, set `total_rows`: the source is finite")
        if self.start in ("earliest", "latest"):
            raise ValueError("`start` is a time, e.g. '2026-01-01T00:00:00+00:00'")
        return self

    @property
    def label(self) -> str:
        """What the source reads, in a few words (its seed)."""
        return f"seed {self.seed}"


class CustomSource(SourceKind):
    """A source the user writes for their own system (docs/sources.md).

    ``factory`` is called as ``factory(spark, options, data_root)`` and
    returns a ``lowmark.batches.sources.Source``; ``options`` are its settings, part
    of the fingerprint except the keys named in ``operational``.
    """

    OPERATIONAL: ClassVar[frozenset[str]] = frozenset({"operational"})
    """Fields a running checkpoint may change: left out of the pipeline's fingerprint."""

    RUNTIME: ClassVar[str] = "lowmark.batches.sources.custom:from_factory"

    kind: Literal["custom"] = "custom"
    """Picks this source."""
    factory: ImportString[Callable[..., Any]] = Field(
        description="Import path of the function that builds the source (module:function)."
    )
    options: dict[str, Any] = Field(default_factory=dict, description="The source's settings.")
    operational: tuple[str, ...] = Field(
        default=(),
        description="Option keys a running checkpoint may change (admission limits, "
        "connection settings): left out of the fingerprint.",
    )

    @property
    def label(self) -> str:
        """What the source reads, in a few words (its factory)."""
        return f"{getattr(self.factory, '__module__', '?')}.{self.factory.__name__}"

    def semantics(self) -> dict[str, Any]:
        options = {k: v for k, v in self.options.items() if k not in self.operational}
        return super().semantics() | {"options": options}


ONE_SYSTEM_SOURCES: tuple[type[SourceKind], ...] = (
    FileSource,
    KafkaSource,
    DeltaSource,
    SyntheticSource,
    CustomSource,
)
"""The built-in kinds that read one system (what a union combines): the one place a kind
is entered."""


def kind_of(model: type[SourceKind]) -> str:
    """The ``kind`` tag of a source config model (its literal's default)."""
    return str(model.model_fields["kind"].default)


def _source_kind(value: Any) -> str:
    """A source's ``kind``; ``files`` when not given (what every source was before others)."""
    if isinstance(value, dict):
        return str(value.get("kind", "files"))
    return str(getattr(value, "kind", "files"))


def _told_apart_by_kind(models: tuple[type[SourceKind], ...]) -> Any:
    """The union of ``models``, parsed by ``kind`` (default ``files``)."""
    tagged = tuple(Annotated[model, Tag(kind_of(model))] for model in models)
    return Annotated[Union[tagged], Discriminator(_source_kind)]  # noqa: UP007


# mypy sees any source as the base model; pydantic parses the union of the kinds.
if TYPE_CHECKING:
    OneSource: TypeAlias = SourceKind
else:
    OneSource = _told_apart_by_kind(ONE_SYSTEM_SOURCES)
"""A source that reads one system."""


class UnionSource(SourceKind):
    """Several sources read as one stream (a union of their records).

    Each named source keeps its own offsets (``<name>/<partition>`` in the
    offset log), admission limit and partitions; the watermark is the minimum
    over every partition of every source, and a source gone idle is left out of
    it like any idle partition. ``transforms`` maps a source's name to a
    transform applied to its records before the union (so sources of
    different shapes can meet); after them, every source must have the same
    columns. At most one ``files`` source (the checkpoint has one file manifest).
    ``watermarks`` names the sources whose partitions follow their ingestion
    clock (each with its lag); the others follow the event times seen.
    """

    RUNTIME: ClassVar[str] = "lowmark.batches.sources.union:UnionStreamSource.from_config"

    kind: Literal["union"] = "union"
    """Picks this source."""
    sources: dict[str, OneSource] = Field(
        min_length=2, description="The sources, by a name of letters, digits and _."
    )
    transforms: dict[str, ImportString[Transform]] = Field(
        default_factory=dict, description="Per source name: DataFrame → DataFrame before the union."
    )
    watermarks: dict[str, IngestionWatermark] = Field(
        default_factory=dict,
        description="Per source name, `{strategy: ingestion_time, max_event_time_lag: ...}`: "
        "that source's partitions follow its ingestion clock; the others follow the event "
        "times seen (`event_time`). The watermark is the minimum over all of them.",
    )

    @model_validator(mode="after")
    def _names_and_one_folder(self) -> UnionSource:
        for name in self.sources:
            if not name or not all(c.isalnum() or c == "_" for c in name):
                raise ValueError(f"source name {name!r}: use letters, digits and _")
        for field in ("transforms", "watermarks"):
            unknown = set(getattr(self, field)) - set(self.sources)
            if unknown:
                raise ValueError(f"`{field}` names no source {sorted(unknown)}")
        if sum(isinstance(c, FileSource) for c in self.sources.values()) > 1:
            raise ValueError("a union reads at most one `files` source (one file manifest)")
        return self

    def semantics(self) -> dict[str, Any]:
        """The sources' semantics, the transforms and, only when set (a union without keeps
        the fingerprint it had before they existed), the per-source watermarks."""
        semantics: dict[str, Any] = {
            "kind": self.kind,
            "sources": {n: c.semantics() for n, c in sorted(self.sources.items())},
            "transforms": {n: _import_path(t) for n, t in sorted(self.transforms.items())},
        }
        if self.watermarks:
            semantics["watermarks"] = {
                n: w.model_dump() for n, w in sorted(self.watermarks.items())
            }
        return semantics

    @property
    def label(self) -> str:
        """What the source reads, in a few words (its sources)."""
        return "+".join(self.sources)


SOURCE_MODELS: tuple[type[SourceKind], ...] = (*ONE_SYSTEM_SOURCES, UnionSource)
"""Every source config model a pipeline accepts."""

SOURCE_KINDS = frozenset(kind_of(model) for model in SOURCE_MODELS)

if TYPE_CHECKING:
    SourceConfig: TypeAlias = SourceKind
else:
    SourceConfig = _told_apart_by_kind(SOURCE_MODELS)
"""Any source a pipeline can read, told apart by ``kind`` (default ``files``)."""


def _check_keys(mode: str, keys: tuple[str, ...], keyed: str, how: str = "") -> None:
    """A sink's ``keys`` are given exactly when its ``mode`` is the ``keyed`` one (which
    ``how`` writes, in words)."""
    if mode == keyed and not keys:
        raise ValueError(f"mode '{keyed}' needs `keys`: the columns that identify a row{how}")
    if mode != keyed and keys:
        raise ValueError(f"`keys` only apply to mode '{keyed}'")


class DeltaSink(_Config):
    """A Delta table written exactly once per batch."""

    OPERATIONAL: ClassVar[frozenset[str]] = frozenset({"properties"})
    """Left out of the fingerprint: properties apply when the sink is created, and change
    no batch's rows."""

    kind: Literal["delta"] = "delta"
    """Picks this sink (the only built-in one)."""
    path: str = Field(description="Table folder, relative to the data root or absolute.")
    mode: Literal["append", "merge"] = Field(
        default="append", description="append rows, or MERGE (upsert) on `keys`."
    )
    keys: tuple[str, ...] = Field(default=(), description="Merge keys (mode=merge only).")
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="Delta table properties the sink is created with (e.g. "
        "`delta.enableChangeDataFeed: 'true'`); unset ones keep Delta's defaults. Applied "
        "when lowmark creates the table only: change an existing sink's with ALTER TABLE.",
    )

    @field_validator("properties")
    @classmethod
    def _table_properties_only(cls, properties: dict[str, str]) -> dict[str, str]:
        # Spark takes only `delta.*` write options as table properties; others are options.
        other = sorted(k for k in properties if not k.startswith("delta."))
        if other:
            raise ValueError(f"{other} are not Delta table properties: name them `delta.*`")
        return properties

    @model_validator(mode="after")
    def _keys_match_mode(self) -> DeltaSink:
        _check_keys(self.mode, self.keys, "merge")
        return self

    @property
    def label(self) -> str:
        """Where the sink writes and how, in a few words."""
        return f"{self.path} ({self.mode})"


class CustomSink(_Config):
    """A sink the user writes for their own system (``lowmark.batches.sinks.base.Sink``).

    ``factory`` is called as ``factory(spark, options, data_root, app_id)`` and
    returns a ``lowmark.batches.sinks.base.Sink``, whose ``write(df, batch_id, retract)``
    the runner calls with each batch's output: a stateless pipeline's records, or
    a windowed pipeline's emitted windows (and, in update mode, ``retract``: the
    windows the batch supersedes) as a DataFrame built on the driver. A replay
    calls ``write`` again with the same batch id and rows: the pipeline is
    exactly-once if the sink is idempotent per ``(app_id, batch_id)``,
    at-least-once otherwise. ``app_id`` names the checkpoint (a new one after a
    start over), for a Delta table: ``txnAppId = app_id``, ``txnVersion = batch_id``.
    lowmark cannot read such a sink: backfills and ``lowmark reset`` need a Delta
    sink, and the check that no other checkpoint writes the sink is the sink's own.
    """

    OPERATIONAL: ClassVar[frozenset[str]] = frozenset({"options"})
    """Left out of the fingerprint: where and how the sink writes changes no batch's rows."""

    kind: Literal["custom"] = "custom"
    """Picks a sink of your own."""
    factory: ImportString[Callable[..., Any]] = Field(
        description="Import path of the function that builds the sink (module:function)."
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="The sink's settings (where and how it writes; left out of the "
        "fingerprint, as changing them changes no batch's rows).",
    )

    @property
    def label(self) -> str:
        """The sink, in a few words (its factory)."""
        return f"{getattr(self.factory, '__module__', '?')}.{self.factory.__name__}"


class ForeachBatchSink(_Config):
    """A function of the user's called with each batch's output, as Spark's ``foreachBatch``
    (``lowmark.batches.sinks.foreach_batch``).

    ``function(df, batch_id, replay)``: ``df`` the batch's output (a stateless pipeline's
    records, or a windowed pipeline's emitted windows, as a DataFrame), ``replay`` true
    when an earlier attempt of the same batch may have called it already (after a
    crash: same ``batch_id``, same rows). At least once, plainly; exactly once when the
    function makes its write idempotent per batch id (skip a batch id it has, or
    overwrite what that batch id wrote). Update-mode windows retract rows too: they need
    a ``kind: custom`` sink, whose ``write`` receives them.
    """

    OPERATIONAL: ClassVar[frozenset[str]] = frozenset()
    """Nothing left out of the fingerprint: the function counts by its import path."""

    kind: Literal["foreach_batch"] = "foreach_batch"
    """Picks a function of your own."""
    function: ImportString[Callable[..., Any]] = Field(
        description="Import path of the function called with each batch (module:function): "
        "function(df, batch_id, replay)."
    )

    @property
    def label(self) -> str:
        """The sink, in a few words (its function)."""
        return f"{getattr(self.function, '__module__', '?')}.{self.function.__name__}"


_TABLE_NAME = r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?$"


class PostgresSink(_Config):
    """A Postgres table written exactly once per batch (``lowmark.batches.sinks.postgres``).

    Each batch's rows and its batch id go in one database transaction: the id
    into the fence table ``lowmark_sink_batches`` of the table's schema, the
    rows into ``table`` (appended, or upserted on ``keys``). A replayed batch
    whose id is already fenced writes nothing. Where to connect: ``dsn`` and/or
    ``host``, ``port``, ``dbname``, ``user``; what is left out comes from libpq's
    own ``PG*`` environment variables. The password never goes in the YAML: it
    comes from the environment variable ``password_env`` names, else libpq's
    ``PGPASSWORD`` or ``~/.pgpass``.
    """

    OPERATIONAL: ClassVar[frozenset[str]] = frozenset(
        {"dsn", "host", "port", "dbname", "user", "password_env", "connect_timeout"}
    )
    """Where to connect: left out of the pipeline's fingerprint (no batch's rows change)."""

    kind: Literal["postgres"] = "postgres"
    """Picks this sink."""
    table: str = Field(
        pattern=_TABLE_NAME,
        description="Target table, `name` or `schema.name` (default schema: the "
        "connection's `search_path`); created from the output's columns if missing.",
    )
    mode: Literal["append", "upsert"] = Field(
        default="append",
        description="append rows, or upsert them on `keys` (INSERT ... ON CONFLICT (keys) "
        "DO UPDATE).",
    )
    keys: tuple[str, ...] = Field(default=(), description="Upsert keys (mode=upsert only).")
    dsn: str | None = Field(
        default=None,
        description="A libpq connection string or URI, without a password "
        "(`postgresql://app@db.internal:5432/serving`).",
    )
    host: str | None = Field(default=None, description="Server host (else libpq's PGHOST).")
    port: int | None = Field(
        default=None, ge=1, le=65535, description="Server port (else libpq's PGPORT)."
    )
    dbname: str | None = Field(default=None, description="Database (else libpq's PGDATABASE).")
    user: str | None = Field(default=None, description="User (else libpq's PGUSER).")
    password_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the environment variable holding the password (else libpq's "
        "PGPASSWORD or ~/.pgpass).",
    )
    connect_timeout: int = Field(
        default=10, ge=1, description="Seconds to wait for a connection before failing."
    )

    @field_validator("dsn")
    @classmethod
    def _no_password_in_dsn(cls, dsn: str | None) -> str | None:
        if dsn is not None and _holds_password(dsn):
            raise ValueError(
                "`dsn` holds a password: take it out and name the environment variable "
                "that holds it in `password_env` (or use PGPASSWORD or ~/.pgpass)"
            )
        return dsn

    @model_validator(mode="after")
    def _keys_match_mode(self) -> PostgresSink:
        _check_keys(self.mode, self.keys, "upsert", " (INSERT ... ON CONFLICT (keys))")
        return self

    @property
    def label(self) -> str:
        """Where the sink writes and how, in a few words."""
        return f"postgres {self.table} ({self.mode})"


_TOPIC_NAME = r"^[A-Za-z0-9._-]{1,249}$"

KAFKA_SET_BY_LOWMARK = frozenset(
    {"bootstrap.servers", "transactional.id", "enable.idempotence", "acks", "isolation.level"}
)
"""Producer settings the Kafka sink sets itself (its transactions need them as they are)."""


class KafkaSink(_Config):
    """A Kafka topic written in one producer transaction per batch
    (``lowmark.batches.sinks.kafka``).

    Each batch's records, and an offset naming the batch committed to the fence group
    ``lowmark.<app id>``, go in one Kafka transaction: a ``read_committed`` consumer sees a
    batch's records all at once, once, or not at all. A replayed batch whose transaction
    committed writes nothing. A record's key is the ``key`` column or expression (none by
    default), its value the row as JSON (``value: json``) or one column. Extra producer
    settings go in ``producer``; a secret one's value comes from the environment variable
    ``secret_env`` names for it, never from the YAML.
    """

    OPERATIONAL: ClassVar[frozenset[str]] = frozenset(
        {"bootstrap_servers", "topic", "producer", "secret_env"}
    )
    """Where and how to connect and write: left out of the pipeline's fingerprint (no batch's
    records change; a batch after a change of topic goes to the new topic)."""

    kind: Literal["kafka"] = "kafka"
    """Picks this sink."""
    topic: str = Field(
        pattern=_TOPIC_NAME,
        description="Topic written (it must exist; a compacted one for update-mode windows).",
    )
    bootstrap_servers: str = Field(description="host:port[,host:port...] of the brokers.")
    key: str | None = Field(
        default=None,
        description="Each record's key: a column, or a Spark SQL expression over the output's "
        "columns (a string as UTF-8, binary as is, anything else cast to a string); none by "
        "default. Update-mode windows are keyed by their keys and window instead.",
    )
    value: str = Field(
        default="json",
        min_length=1,
        description="Each record's value: `json` (the row as a JSON object), or a column (a "
        "string as UTF-8, binary as is, anything else cast to a string).",
    )
    producer: dict[str, str] = Field(
        default_factory=dict,
        description="Extra producer settings (librdkafka's names), e.g. "
        "{'security.protocol': 'SASL_SSL', 'sasl.mechanisms': 'PLAIN', 'sasl.username': "
        "'app'}; `transaction.timeout.ms` defaults to 600000.",
    )
    secret_env: dict[str, str] = Field(
        default_factory=dict,
        description="Secret producer settings, each mapped to the environment variable that "
        "holds its value, e.g. {'sasl.password': 'KAFKA_PASSWORD'}.",
    )

    @field_validator("producer")
    @classmethod
    def _no_secret_or_reserved_setting(cls, producer: dict[str, str]) -> dict[str, str]:
        reserved = sorted(KAFKA_SET_BY_LOWMARK & producer.keys())
        if reserved:
            raise ValueError(
                f"{reserved} are set by the sink (its transactions need them): remove them "
                "from `producer`"
            )
        secret = sorted(k for k in producer if "password" in k or "secret" in k)
        if secret:
            raise ValueError(
                f"{secret} in `producer` would put a secret in the pipeline's definition: map "
                "each to the environment variable holding it in `secret_env`"
            )
        return producer

    @field_validator("secret_env")
    @classmethod
    def _variable_names(cls, secret_env: dict[str, str]) -> dict[str, str]:
        bad = sorted(v for v in secret_env.values() if not re.fullmatch(r"[A-Za-z_]\w*", v))
        if bad:
            raise ValueError(f"{bad} are not environment variable names: name the variables")
        return secret_env

    @property
    def label(self) -> str:
        """Where the sink writes, in a few words."""
        return f"kafka {self.topic}"


def _holds_password(dsn: str) -> bool:
    """Whether libpq connection string ``dsn`` carries a password: ``password=`` (key/value
    or a URI's query), or a URI's ``user:password@``."""
    if "password=" in dsn.replace(" ", "").lower():
        return True
    scheme, _, rest = dsn.partition("://")
    userinfo, at, _ = rest.partition("@")
    return bool(scheme and at and ":" in userinfo)


def _sink_semantics(sink: SinkKind) -> dict[str, Any]:
    """A sink as fingerprinted: what changes no batch's rows left out (a Delta sink's
    properties, a custom sink's options, where a Postgres sink connects: its
    ``OPERATIONAL``)."""
    return sink.model_dump(exclude=set(sink.OPERATIONAL))


def _sink_place(sink: SinkKind) -> str | None:
    """What ``sink`` writes, where two sinks of one pipeline must not meet (a Delta path, a
    Postgres table, a Kafka topic), in words; None for a sink of the user's own."""
    if isinstance(sink, DeltaSink):
        return f"Delta table {sink.path}"
    if isinstance(sink, PostgresSink):
        server = (sink.dsn, sink.host, sink.port, sink.dbname)
        return f"Postgres table {sink.table}" + (f" of {server}" if any(server) else "")
    if isinstance(sink, KafkaSink):
        return f"Kafka topic {sink.topic} of {sink.bootstrap_servers}"
    return None


def _sink_kind(value: Any) -> str:
    """A sink's ``kind``; ``delta`` when not given (what every sink was before others)."""
    if isinstance(value, dict):
        return str(value.get("kind", "delta"))
    return str(getattr(value, "kind", "delta"))


SinkConfig = Annotated[
    Annotated[DeltaSink, Tag("delta")]
    | Annotated[CustomSink, Tag("custom")]
    | Annotated[PostgresSink, Tag("postgres")]
    | Annotated[KafkaSink, Tag("kafka")]
    | Annotated[ForeachBatchSink, Tag("foreach_batch")],
    Discriminator(_sink_kind),
]
"""Any sink a pipeline can write, told apart by ``kind`` (default ``delta``)."""
SinkKind: TypeAlias = DeltaSink | CustomSink | PostgresSink | KafkaSink | ForeachBatchSink
"""A sink's config model, once read."""
PRIMARY_SINK = "sink"
"""The name ``Pipeline.sinks`` gives ``sink`` (an extra sink may not take it)."""


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
    """How the runner keeps the checkpoint small over a long life
    (``lowmark.state.maintenance``)."""

    every_batches: int = Field(
        default=100, ge=1, description="Run maintenance after every this many batches."
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

    ``transform`` is a function DataFrame → DataFrame (in YAML its import path,
    ``package.module:function``), or a SQL query over the batch's records
    (``{sql: "SELECT ... FROM input"}``, a ``SqlStep``). A windowed pipeline's
    ``post_aggregation`` is either kind too, over the windows a batch emits
    (``FROM windows``): see docs/sql.md, ``lowmark.batches.sql`` and
    ``lowmark.batches.loop.post_aggregation``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_\-]*$", description="Unique name.")
    description: str = Field(default="", description="Shown by `lowmark list` and in Dagster.")
    source: SourceConfig
    """Where records come from; `kind` picks the source (default `files`)."""
    transform: ImportString[Transform] | SqlStep | None = Field(
        default=None,
        description="Applied to each batch's records: the import path of a DataFrame → "
        'DataFrame function, or `{sql: "SELECT ... FROM input"}`.',
    )
    joins: tuple[TableJoin, ...] = Field(
        default=(),
        description="Delta tables (dimensions) each batch's transformed records are joined "
        "with, in order, each read as of the version the batch's offset log records; see "
        "Stream-table joins.",
    )
    expectations: tuple[Expectation, ...] = Field(
        default=(),
        description="Named conditions on the transformed records (warn, drop or fail), "
        "counted per batch; see Expectations.",
    )
    quality: Quality = Field(
        default_factory=Quality,
        description="When a batch fails instead of committing: bad-row share, expectations "
        "that must hold.",
    )
    sink: SinkConfig
    """Where each batch's output goes (exactly once): a Delta table, a Postgres table, a Kafka
    topic, or a sink of your own."""
    extra_sinks: dict[str, SinkConfig] = Field(
        default_factory=dict,
        description="More sinks for the same output, by a name of letters, digits and _ "
        "(e.g. a Postgres table to serve beside a Delta table of history): each batch "
        "writes each of them after `sink`, before it commits, each exactly once as `sink` "
        "is; see Several sinks.",
    )
    event_time: EventTime | None = Field(
        default=None, description="Event-time column, out-of-orderness, idleness, lateness."
    )
    dedup: Dedup | None = Field(
        default=None,
        description="Drop records whose id was let through within a horizon of event time "
        "(needs event_time); see Deduplication.",
    )
    aggregation: WindowedAggregation | None = Field(
        default=None, description="Windowed aggregation per key (needs event_time)."
    )
    keyed: Keyed | None = Field(
        default=None,
        description="A stateful processor over each key's records, with state and timers "
        "(needs event_time; its output rows go to the sink, or into the windows of an "
        "`aggregation`); see Keyed state and timers.",
    )
    stream_join: StreamJoin | None = Field(
        default=None,
        description="Join two sources of a `kind: union` source within an event-time bound "
        "(needs event_time); see Joins.",
    )
    post_aggregation: ImportString[Transform] | SqlStep | None = Field(
        default=None,
        description="Applied to the windows each batch emits, before the sink (filter or "
        "project them, as HAVING would): the import path of a DataFrame → DataFrame "
        'function, or `{sql: "SELECT ... FROM windows WHERE ..."}`. In update mode it '
        "must keep the window's keys, `window_start` and `window_end`; a window it removes "
        "is deleted from the sink.",
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
        default_factory=Maintenance,
        description="Checkpoint maintenance: how often, and how many batches the logs keep.",
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
        default=100,
        ge=1,
        description=(
            "Catch-up: how many batches one Spark job reads ahead when input waits "
            "(tumbling windows; 1 turns it off)."
        ),
    )
    listeners: tuple[ImportString[Callable[[], Any]], ...] = Field(
        default=(),
        description=(
            "Import paths of listener classes (`package.module:Class`, subclasses of "
            "`PipelineListener`, made with no arguments) told of every batch as it starts, "
            "commits or fails; a listener that raises never fails a batch."
        ),
    )

    @model_validator(mode="after")
    def _expectations_named_once(self) -> Pipeline:
        check_names(self.expectations, self.quality)
        return self

    @model_validator(mode="after")
    def _each_table_joined_once(self) -> Pipeline:
        check_tables_distinct(self.joins)
        if self.joins and self.backfill is not None:
            raise ValueError(
                "`backfill` recomputes windows from the source's whole history at once, but "
                "each batch joined the dimensions' versions of its own time: remove `backfill`"
            )
        return self

    @model_validator(mode="after")
    def _keyed_needs_event_time(self) -> Pipeline:
        if self.keyed is not None:
            if self.event_time is None:
                raise ValueError(
                    "`keyed` orders each key's records and fires timers by event time: it "
                    "needs `event_time` (which column holds event time)"
                )
            if self.aggregation is not None:
                self._check_keyed_feeds_windows(self.keyed, self.aggregation, self.event_time)
                if self.backfill is not None:
                    raise ValueError(
                        "`backfill` recomputes windows from the source's records, but a keyed "
                        "step's output feeds these windows: remove `backfill`"
                    )
            elif self.keyed.output_event_time is not None:
                raise ValueError(
                    "`keyed.output_event_time` names the event time of the rows an "
                    "`aggregation` after the keyed step windows: add one, or remove it"
                )
        return self

    @staticmethod
    def _check_keyed_feeds_windows(
        keyed: Keyed, aggregation: WindowedAggregation, event_time: EventTime
    ) -> None:
        """A keyed step before windows: its output rows must hold the windows' event time
        and keys (checked here, before any batch)."""
        # Imported here: reading DDL needs PySpark's types, which fast commands do not load.
        from lowmark.batches.keyed.state_schema import parse_ddl

        fields = parse_ddl(keyed.output_schema, "`keyed.output_schema`").fieldNames()
        column = keyed.output_event_time or event_time.column
        used = [column, *aggregation.keys]
        used += [a.column for a in aggregation.aggregates if a.column]
        missing = [c for c in dict.fromkeys(used) if c not in fields]
        if missing:
            raise ValueError(
                f"the aggregation after the keyed step windows its output rows by {column!r} "
                f"and groups and aggregates them by their columns, but `keyed.output_schema` "
                f"lacks {missing}: add them, or set `keyed.output_event_time` to the output "
                "column that holds event time"
            )

    @model_validator(mode="after")
    def _stream_join_joins_two_sources(self) -> Pipeline:
        join = self.stream_join
        if join is None:
            return self
        if not isinstance(self.source, UnionSource):
            raise ValueError(
                "`stream_join` joins two sources of one pipeline: make `source` a "
                "`kind: union` with the two sources it names"
            )
        unknown = [n for n in (join.left, join.right) if n not in self.source.sources]
        if unknown:
            raise ValueError(
                f"`stream_join` names {unknown}, which the union's `sources` lack "
                f"({sorted(self.source.sources)})"
            )
        if self.event_time is None or self.event_time.column != join.time.left:
            raise ValueError(
                "`stream_join` holds rows until the watermark passes them: set `event_time` "
                f"with `column: {join.time.left}` (the left side's time; the right side's is "
                f"`{join.time.right}`)"
            )
        taken = [
            f"`{name}`"
            for name in ("transform", "dedup", "aggregation", "keyed", "backfill")
            if getattr(self, name) is not None
        ]
        if self.joins:
            taken.append("`joins`")
        if taken:
            raise ValueError(
                f"a pipeline with `stream_join` cannot have {', '.join(taken)} yet: transform "
                "each side in the union's `transforms`, and aggregate the joined rows in "
                "another pipeline reading the sink"
            )
        return self

    @model_validator(mode="after")
    def _source_watermarks_need_event_time(self) -> Pipeline:
        if isinstance(self.source, UnionSource) and self.source.watermarks:
            if self.event_time is None:
                raise ValueError(
                    "the union's `watermarks` set how far event time has come per source: "
                    "they need `event_time` (which column holds event time)"
                )
            if self.event_time.watermark is not None:
                raise ValueError(
                    "`event_time.watermark` already sets every source's strategy: remove it, "
                    "or the union's `watermarks`"
                )
        return self

    @model_validator(mode="after")
    def _dedup_needs_event_time(self) -> Pipeline:
        if self.dedup is not None and self.event_time is None:
            raise ValueError(
                "`dedup` holds ids for a horizon of event time: it needs `event_time` "
                "(which column holds event time)"
            )
        return self

    @model_validator(mode="after")
    def _extra_sinks_named_and_apart(self) -> Pipeline:
        for name in self.extra_sinks:
            if not name or not all(c.isalnum() or c == "_" for c in name):
                raise ValueError(f"extra sink name {name!r}: use letters, digits and _")
            if name == PRIMARY_SINK:
                raise ValueError(f"extra sink name {name!r} names `sink`: give it another name")
        where: dict[str, str] = {}
        for name, sink in self.sinks().items():
            place = _sink_place(sink)
            if place is not None and place in where:
                raise ValueError(
                    f"sinks {where[place]!r} and {name!r} both write {place}: give each a "
                    "table of its own"
                )
            if place is not None:
                where[place] = name
        return self

    @model_validator(mode="after")
    def _aggregation_needs_event_time(self) -> Pipeline:
        if self.aggregation is not None:
            if self.event_time is None:
                raise ValueError("`aggregation` needs `event_time` (which column holds event time)")
            for name, sink in self.sinks().items():
                field = "sink" if name == PRIMARY_SINK else f"extra_sinks.{name}"
                if isinstance(sink, DeltaSink | PostgresSink) and sink.mode != "append":
                    raise ValueError(
                        "a windowed pipeline sets how its sinks are written through "
                        f"`aggregation.output_mode`; leave `{field}.mode` at append"
                    )
                update = self.aggregation.output_mode == "update"
                if isinstance(sink, KafkaSink) and update and sink.key is not None:
                    raise ValueError(
                        "update-mode windows are keyed in Kafka by their keys and window (a "
                        f"compacted topic keeps each window's latest): leave `{field}.key` out"
                    )
                if isinstance(sink, ForeachBatchSink) and update:
                    raise ValueError(
                        f"update-mode windows retract rows, which `{field}`, a `foreach_batch` "
                        "function, is not given: use `output_mode: append`, or a `kind: "
                        "custom` sink (its `write` receives `retract`)"
                    )
        elif self.backfill is not None:
            raise ValueError(
                "`backfill` recomputes event-time windows: it needs `aggregation`; remove it"
            )
        elif self.post_aggregation is not None:
            raise ValueError(
                "`post_aggregation` runs on the windows an aggregation emits: it needs "
                "`aggregation`; use `transform` for the records"
            )
        if self.backfill is not None and not isinstance(self.sink, DeltaSink):
            raise ValueError(
                "`backfill` replaces a slice of the sink's Delta table: it needs a "
                "`kind: delta` sink; remove it"
            )
        return self

    def transformed(self, records: DataFrame) -> DataFrame:
        """``records`` after the pipeline's ``transform`` (a query sees them as ``input``)."""
        return apply_step(self.transform, records, "input", f"the transform of {self.name}")

    def post_aggregated(self, windows: DataFrame) -> DataFrame:
        """``windows`` after the pipeline's ``post_aggregation`` (a query sees them as
        ``windows``)."""
        what = f"the post_aggregation of {self.name}"
        return apply_step(self.post_aggregation, windows, "windows", what)

    def sink_config(self) -> SinkKind:
        """The sink as written (``written_as``)."""
        return self.written_as(self.sink)

    def sinks(self) -> dict[str, SinkKind]:
        """Every sink by name, ``sink`` first (named ``PRIMARY_SINK``), as configured."""
        return {PRIMARY_SINK: self.sink, **self.extra_sinks}

    def written_as(self, sink: SinkKind) -> SinkKind:
        """``sink`` (one of ``sinks``) as written: update-mode aggregations MERGE a Delta
        sink, or upsert a Postgres one, on keys + window."""
        keys = self.window_identity
        if keys is not None and isinstance(sink, DeltaSink | PostgresSink):
            mode = "merge" if isinstance(sink, DeltaSink) else "upsert"
            return sink.model_copy(update={"mode": mode, "keys": keys})
        return sink

    @property
    def window_identity(self) -> tuple[str, ...] | None:
        """What identifies an update-mode window in the sink (its keys and bounds: a sink
        upserts and retracts on them); None for other pipelines."""
        if self.aggregation is None or self.aggregation.output_mode != "update":
            return None
        return (*self.aggregation.keys, "window_start", "window_end")

    @property
    def output_mode(self) -> str | None:
        """How a batch writes the sink: a windowed pipeline's output mode (``append``: each
        window once, when final; ``update``: every window a batch changed, upserted), else a
        Delta or Postgres sink's ``mode`` (``append``, ``merge``, ``upsert``); None for a
        custom sink's records."""
        if self.aggregation is not None:
            return self.aggregation.output_mode
        return self.sink.mode if isinstance(self.sink, DeltaSink | PostgresSink) else None

    def delta_sink(self, needed_by: str, way_on: str) -> DeltaSink:
        """The pipeline's Delta sink, for ``needed_by`` (what reads the sink's table: a
        backfill, ``lowmark reset``); for another sink, ``PipelineConfigInvalid`` naming
        ``needed_by`` and ``way_on``."""
        if isinstance(self.sink, DeltaSink):
            return self.sink
        raise PipelineConfigInvalid(
            f"pipeline {self.name} writes a {self.sink.kind} sink ({self.sink.label}): {needed_by} "
            f"reads the sink's table, so it needs a `kind: delta` sink; {way_on}"
        )

    def fingerprint(self) -> str:
        """Hash of ``definition()``: everything that changes what a batch computes."""
        blob = json.dumps(self.definition(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def definition(self) -> dict[str, Any]:
        """What the fingerprint hashes, as JSON values (the offset log keeps it, so a
        changed definition can be named field by field: ``lowmark.batches.evolution``).

        The source's operational fields (``OPERATIONAL``: admission limits, what becomes
        of processed files, where to connect), descriptions, health-check bounds,
        backfill partitions, maintenance, read-ahead, failed attempts, listeners and the
        sink's table properties are left out:
        changing them on a running checkpoint is safe.
        The transform counts by its import path, so editing its body is allowed
        (as in Spark), renaming it is not; a SQL transform by its query (surrounding
        whitespace stripped). ``post_aggregation`` counts the same way, and only when
        set, so pipelines without it keep their fingerprint; ``dedup`` and ``joins`` (each
        join's table, keys, kind and columns, not whether it broadcasts) likewise. Of the
        expectations, only the ``drop`` ones count, and only when there are some
        (``lowmark.batches.expectations``): ``warn`` and ``fail`` ones and the ``quality``
        thresholds change no committed row. A keyed step counts with the schemas of the
        states its processor declares (``Keyed.semantics``): a compatible change of them is
        accepted on a running checkpoint (``Planner``), others are refused.
        """
        semantics: dict[str, Any] = {
            "source": self.source.semantics(),
            "transform": step_semantics(self.transform),
            # What changes no batch's rows: a Delta sink's properties, a custom sink's
            # options, where a Postgres sink connects (each sink's OPERATIONAL).
            "sink": _sink_semantics(self.sink),
            "event_time": _event_time_semantics(self.event_time),
            "aggregation": self.aggregation.model_dump() if self.aggregation else None,
        }
        if self.post_aggregation is not None:
            semantics["post_aggregation"] = step_semantics(self.post_aggregation)
        if self.joins:  # absent otherwise, as for post_aggregation
            semantics["joins"] = [join.semantics() for join in self.joins]
        if self.dedup is not None:  # absent otherwise, as for post_aggregation
            semantics["dedup"] = self.dedup.model_dump()
        if self.keyed is not None:
            semantics["keyed"] = self.keyed.semantics()
        if self.stream_join is not None:  # absent otherwise, as for dedup
            semantics["stream_join"] = self.stream_join.model_dump()
        if self.extra_sinks:  # absent otherwise, as for post_aggregation
            extra = sorted(self.extra_sinks.items())
            semantics["extra_sinks"] = {n: _sink_semantics(s) for n, s in extra}
        drops = fingerprint_semantics(self.expectations)
        if drops is not None:  # absent otherwise: checkpoints from before keep theirs
            semantics["expectations"] = drops
        defined: dict[str, Any] = json.loads(json.dumps(semantics, default=_import_path))
        return defined

    def checkpoint_location(self, data_root: Path) -> str:
        return resolve(self.checkpoint or f"_lowmark/{self.name}", data_root)

    def catalog_entry(self, data_root: Path) -> CatalogEntry:
        """Where this pipeline's tables are under ``data_root`` (``lowmark.state.catalog``)."""
        return CatalogEntry(
            pipeline=self.name,
            checkpoint=self.checkpoint_location(data_root),
            sink=resolve(self.sink.path, data_root) if isinstance(self.sink, DeltaSink) else None,
            sink_label=self.sink.label,
            window_keys=tuple(self.aggregation.keys) if self.aggregation is not None else None,
            event_time_column=self.event_time.column if self.event_time is not None else None,
        )


def _event_time_semantics(event_time: EventTime | None) -> dict[str, object] | None:
    """``event_time`` as fingerprinted: ``max_future`` only when set to other than its
    default, ``watermark`` only when set, so checkpoints written before they existed keep
    their fingerprint. ``admission`` is left out: like the admission limits, it only
    decides which batch takes a record."""
    if event_time is None:
        return None
    dump = event_time.model_dump(exclude={"admission"})
    if dump["max_future"] == MAX_FUTURE_MS:
        del dump["max_future"]
    if dump["watermark"] is None:
        del dump["watermark"]
    return dump


def _import_path(value: object) -> str:
    """Functions count by where they live (``module:qualname``), not by their code."""
    return f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', repr(value))}"


def resolve(path: str, data_root: Path) -> str:
    """``path`` if it is absolute or a URL (s3a://...), else under ``data_root``."""
    if "://" in path or Path(path).is_absolute():
        return path
    return str((data_root / path).resolve())
