"""Mistakes caught before Spark starts: the definition checked against the input and the sink.

Before the first Spark job of a run (``MicroBatchRunner``), and in ``lowmark
plan``, the planned batch is checked on the driver, in milliseconds: no
Spark, at most the first 64 KiB of each of the batch's first three files
(local folders), a Parquet footer, a Delta table's schema through delta-rs.
A problem stops the run with one line naming the thing and the fix, before
the offset log is written: nothing of the batch is written, and once the
definition is fixed the next run plans it again (a definition may change
freely until the first batch commits, ``lowmark.batches.loop.start_over``).

What is checked, where it can be known without Spark:

- before ``lowmark run`` opens or creates the checkpoint (``check_source_folders``): a
  file source's folder (a union's too) exists, when it is a local path (a typo would
  otherwise read as a folder with no new files, forever);
- the input matches ``format``: a JSON source whose files do not start with a
  JSON object, a CSV source of JSON lines, a Parquet source of text (every
  record would be a bad record);
- the source schema against the sample: a CSV header naming other columns
  (read by position), JSON records or a Parquet file with none of the
  schema's columns;
- with no ``transform`` and no ``joins`` (after them, the columns are theirs to
  make): the event-time column, the keys and the aggregated columns are
  among the source's columns, and event time is not a string, a number, a
  boolean, binary or nested data, which Spark would refuse in the batch's
  read. The source's columns: the declared schema (``schema_ddl``), else the
  one fixed for the checkpoint, else a Parquet file's or a CSV header's; a
  Delta table's; Kafka's (its JSON values' declared schema, or its raw
  columns). An inferred JSON schema is all the records' fields, so a sample
  tells only the types of the fields it has: strings (JSON has no timestamp;
  unless the reader's ``inferTimestamp`` is on);
- the sink: not a file, its folder can be created, and a Delta table already
  there has the columns a windowed pipeline writes (the merge keys of a
  merging sink); a Postgres sink can be connected to with its settings and
  password, and its fence table is there (created if missing).

Each check passes what it cannot know (a remote folder, a custom source or
sink, a type it does not know): it never refuses what Spark would run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from lowmark.batches.errors import (
    DefinitionMismatch,
    PipelineConfigInvalid,
    SinkNotATable,
    SinkUnreachable,
    SourceFileUnreadable,
)
from lowmark.batches.pipeline import (
    DeltaSink,
    DeltaSource,
    FileSource,
    KafkaSink,
    KafkaSource,
    Pipeline,
    PostgresSink,
    SinkKind,
    UnionSource,
    resolve,
)
from lowmark.batches.sinks.owner import sink_not_a_table
from lowmark.batches.sources.base import Source
from lowmark.batches.sources.files import FileStreamSource
from lowmark.batches.sources.filesystem import local_path
from lowmark.batches.windows import Aggregate

SAMPLE_FILES = 3
"""How many of a batch's files are looked at."""
SAMPLE_BYTES = 65_536
"""How much of each: enough for some records, little enough to take a millisecond."""

_TIME_TYPES = frozenset({"timestamp", "timestamp_ltz", "timestamp_ntz", "date"})
_NOT_TIME_TYPES = frozenset(
    {"tinyint", "byte", "smallint", "short", "int", "integer", "bigint", "long"}
    | {"float", "real", "double", "decimal", "dec", "numeric", "boolean", "binary"}
    | {"array", "map", "struct", "variant", "string", "varchar", "char"}
)
"""Types Spark's ``unix_millis``, which every batch reads event time with, refuses (Spark
4 casts none of them to a timestamp by itself, strings included)."""


@dataclass(frozen=True)
class SourceColumns:
    """The columns a source's records have, as far as known without Spark."""

    types: dict[str, str]
    """Column name → its Spark type name (``bigint``, ``timestamp``, ``array<string>``)."""
    where: str
    """Where they come from, in words: "the source schema (`schema_ddl`)"."""
    complete: bool = True
    """Whether a column not in ``types`` is known to be missing (a sample of JSON records
    does not know: a later record may have it)."""

    def type_of(self, name: str) -> str | None:
        """The type of column ``name`` (matched without case, as Spark does), or None."""
        found = {n.lower(): t for n, t in self.types.items()}
        return found.get(name.lower())


def check_source_folders(pipeline: Pipeline, data_root: Path) -> None:
    """Raise ``DefinitionMismatch`` when a file source of ``pipeline`` (the source, or a
    member of its union) names a local folder that does not exist.

    Only local paths are checked (a plain path or a ``file:`` URL): an
    object-store path (``s3a://bucket/in``) passes, as a prefix there exists
    once a file lands under it. A folder that exists but is empty passes: there
    is nothing to do yet.
    """
    config = pipeline.source
    members = config.sources if isinstance(config, UnionSource) else {"": config}
    for member, source in members.items():
        if not isinstance(source, FileSource):
            continue
        local = local_path(resolve(source.path, data_root))
        if local is None or os.path.isdir(local):
            continue
        of = f"source {member}" if member else "the file source"
        key = f"source.sources.{member}.path" if member else "source.path"
        what = "is a file" if os.path.exists(local) else "does not exist"
        raise DefinitionMismatch(
            f"folder {local} of {of} of pipeline {pipeline.name} {what}: create the folder, or "
            f"correct `{key}` ({source.path!r}; a relative path is under the data root "
            f"{data_root})"
        )


def check_definition(
    pipeline: Pipeline, source: Source, inputs: list[str], data_root: Path, batch_id: int
) -> None:
    """Raise ``DefinitionMismatch`` (or the error the read would raise later:
    ``SourceFileUnreadable`` for a CSV header, ``SinkNotATable``) when ``pipeline``'s
    definition does not fit batch ``batch_id``'s input (``inputs``, as ``source`` names them)
    or its sink; see the module doc for what is checked."""
    problem = find_problem(pipeline, source, inputs, data_root, batch_id)
    if problem is not None:
        raise problem


def find_problem(
    pipeline: Pipeline, source: Source, inputs: list[str], data_root: Path, batch_id: int
) -> Exception | None:
    """What ``check_definition`` would raise, or None (``lowmark plan`` reports it)."""
    try:
        columns = _source_columns(pipeline, source, inputs, data_root, batch_id)
        # A transform or a join makes columns of its own: then the records' are not known.
        if columns is not None and pipeline.transform is None and not pipeline.joins:
            _check_columns(pipeline, columns)
        _check_sinks(pipeline, data_root)
    # A CSV header, a sink that is a file and a Postgres sink's settings raise the errors a
    # later step would.
    except (
        DefinitionMismatch,
        SourceFileUnreadable,
        SinkNotATable,
        SinkUnreachable,
        PipelineConfigInvalid,
    ) as exc:
        return exc
    return None


def _source_columns(
    pipeline: Pipeline, source: Source, inputs: list[str], data_root: Path, batch_id: int
) -> SourceColumns | None:
    config = pipeline.source
    if isinstance(config, FileSource) and isinstance(source, FileStreamSource):
        return _file_columns(pipeline.name, config, source, inputs, batch_id)
    if isinstance(config, KafkaSource):
        if config.schema_ddl is None:
            from lowmark.batches.sources.kafka import RAW_SCHEMA  # a Spark schema

            raw = RAW_SCHEMA.jsonValue()
            return _spark_columns(raw, "Kafka's raw records (`value_format: raw`)")
        return SourceColumns(ddl_types(config.schema_ddl), "the source schema (`schema_ddl`)")
    if isinstance(config, DeltaSource):
        return _delta_source_columns(config, resolve(config.path, data_root))
    return None


def _file_columns(
    name: str, config: FileSource, source: FileStreamSource, inputs: list[str], batch_id: int
) -> SourceColumns | None:
    """The file source's columns: declared, else fixed for the checkpoint, else from the
    sample; and the sample checked against the format and those columns."""
    declared: SourceColumns | None = None
    if config.schema_ddl:
        declared = SourceColumns(ddl_types(config.schema_ddl), "the source schema (`schema_ddl`)")
    elif (fixed := source.schema_store.get()) is not None:
        declared = _spark_columns(json.loads(fixed), "the schema fixed for the checkpoint")
    heads = _heads(inputs[:SAMPLE_FILES])
    _check_format(name, config.format, heads)
    sampled: SourceColumns | None = None
    for path, (local, head) in heads.items():
        if _looks_like(head) != config.format:  # a stray file: its rows will be bad rows
            continue
        sampled = _columns_of(config.format, source.options, local, head) or sampled
        if declared is None:
            continue
        if config.format == "csv" and source.options.get("header") == "true":
            source.check_headers([path], list(declared.types), batch_id)
        elif sampled is not None and not _shared(declared.types, sampled.types):
            raise DefinitionMismatch(
                f"{local} has the columns {', '.join(sampled.types)} and none of "
                f"{declared.where}'s {', '.join(declared.types)}: correct `schema_ddl` of "
                f"pipeline {name}'s source (or its `format`)"
            )
    if declared is not None or sampled is None or config.format != "json":
        return declared or sampled
    # An inferred JSON schema is all the records' fields: a sample tells only some, and
    # their types are strings unless Spark is asked to infer timestamps.
    if source.options.get("inferTimestamp") == "true":
        return None
    return dataclasses.replace(sampled, complete=False)


def _heads(paths: list[str]) -> dict[str, tuple[str, bytes]]:
    """Per path of a local file that holds more than blanks: its local path and its first
    ``SAMPLE_BYTES``."""
    heads = {}
    for path in paths:
        local = local_path(path)
        if local is None or not os.path.isfile(local):
            continue
        with open(local, "rb") as f:
            head = f.read(SAMPLE_BYTES)
        if head.strip():
            heads[path] = (local, head)
    return heads


def _check_format(name: str, format: str, heads: dict[str, tuple[str, bytes]]) -> None:
    """Raise ``DefinitionMismatch`` when no sampled file reads as ``format`` (one stray
    file among others is the bad-records table's: its rows are bad rows)."""
    seen = {path: _looks_like(head) for path, (_, head) in heads.items()}
    if not seen or format in seen.values():
        return
    path, looks = next(iter(seen.items()))
    local, head = heads[path]
    first = head.lstrip().split(b"\n", 1)[0][:80].decode("utf-8", "replace").strip()
    reads = "Parquet data" if looks == "parquet" else f"{looks.upper()}: {first!r}"
    raise DefinitionMismatch(
        f"{local} is not {format.upper()} (it reads as {reads}): set `format: {looks}` in "
        f"pipeline {name}'s source, or point its `path` at {format} files"
    )


def _columns_of(
    format: str, options: dict[str, str], path: str, head: bytes
) -> SourceColumns | None:
    """The columns of the file at ``path`` (starting with ``head``) read with Spark reader
    ``options``; None when its start does not tell them."""
    if format == "parquet":
        import pyarrow.parquet as pq  # a Parquet source's only (20 ms)

        try:
            schema = pq.read_schema(path)
        except (pa.ArrowException, OSError):  # a broken file: the read names it
            return None
        return SourceColumns({f.name: _arrow_type(f.type) for f in schema}, f"{path}'s columns")
    if format == "json":
        fields: dict[str, str] = {}
        lines = head.splitlines()
        for line in lines[:-1] if len(head) == SAMPLE_BYTES else lines:  # the last: cut off
            record = _json_object(line) or {}
            fields.update({k: _json_type(v) for k, v in record.items() if v is not None})
        return SourceColumns(fields, f"{path}'s records") if fields else None
    if options.get("header") != "true":
        return None
    header = head.split(b"\n", 1)[0].decode("utf-8", "replace")
    sep = options.get("sep", options.get("delimiter", ","))
    names = [n.strip().strip('"') for n in header.rstrip("\r").split(sep)]
    # Without `inferSchema` Spark reads every CSV column as a string.
    kind = "" if options.get("inferSchema") == "true" else "string"
    return SourceColumns(dict.fromkeys(names, kind), f"{path}'s CSV header")


def _looks_like(head: bytes) -> str:
    """What the start of a file reads as: parquet, json (a JSON object or array first) or
    csv (other text)."""
    if head.startswith(b"PAR1"):
        return "parquet"
    return "json" if head.lstrip().startswith((b"{", b"[")) else "csv"


def _json_type(value: object) -> str:
    """The Spark type a JSON value is inferred as (no timestamps: JSON has none)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "struct"
    return "array" if isinstance(value, list) else "string"


def _json_object(line: bytes) -> dict[str, object] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _delta_source_columns(config: DeltaSource, table: str) -> SourceColumns | None:
    local = local_path(table)
    if local is None or not os.path.isdir(os.path.join(local, "_delta_log")):
        return None
    schema = json.loads(DeltaTable(local).schema().to_json())
    if config.read == "changes":
        from lowmark.batches.sources.delta_table import CHANGE_FIELDS  # Spark fields

        schema["fields"] = [*schema["fields"], *(f.jsonValue() for f in CHANGE_FIELDS)]
    return _spark_columns(schema, f"the Delta table {local}")


def _spark_columns(schema: dict[str, Any], where: str) -> SourceColumns:
    """The columns of a Spark schema in its JSON form (``StructType.jsonValue``)."""
    return SourceColumns({f["name"]: spark_type_name(f["type"]) for f in schema["fields"]}, where)


_JSON_NAMES = {
    "byte": "tinyint",
    "short": "smallint",
    "integer": "int",
    "long": "bigint",
    "decimal": "decimal(10,0)",
}
"""Spark types whose JSON name is not their SQL name."""


def spark_type_name(data_type: str | dict[str, Any]) -> str:
    """A Spark type in its JSON form as its SQL name (``DataType.simpleString``:
    ``bigint``, ``array<string>``, ``struct<a:int>``), read without PySpark."""
    if isinstance(data_type, str):
        return _JSON_NAMES.get(data_type, data_type)
    kind = data_type["type"]
    if kind == "array":
        return f"array<{spark_type_name(data_type['elementType'])}>"
    if kind == "map":
        key, value = data_type["keyType"], data_type["valueType"]
        return f"map<{spark_type_name(key)},{spark_type_name(value)}>"
    if kind == "struct":
        fields = (f"{f['name']}:{spark_type_name(f['type'])}" for f in data_type["fields"])
        return f"struct<{','.join(fields)}>"
    return str(kind)


def _arrow_type(data_type: pa.DataType) -> str:
    """An Arrow type as the Spark type it is read as, as far as telling time from not-time
    goes (``timestamp``, ``date``, else Arrow's own name)."""
    if pa.types.is_timestamp(data_type):
        return "timestamp"
    if pa.types.is_date(data_type):
        return "date"
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "string"
    return "binary" if pa.types.is_binary(data_type) else _arrow_kind(data_type)


def _arrow_kind(data_type: pa.DataType) -> str:
    if pa.types.is_integer(data_type):
        return "bigint"
    if pa.types.is_floating(data_type) or pa.types.is_decimal(data_type):
        return "double"
    if pa.types.is_boolean(data_type):
        return "boolean"
    if pa.types.is_nested(data_type):
        return "struct"
    return str(data_type)


def ddl_types(ddl: str) -> dict[str, str]:
    """The top-level columns of a Spark DDL schema (``id LONG, ts TIMESTAMP, tags
    ARRAY<STRING>``) and their types in lower case, read without Spark; a column whose
    declaration does not read as ``name type`` is left out."""
    columns: dict[str, str] = {}
    for part in _top_level(ddl):
        found = re.match(r"\s*(`(?:[^`]|``)+`|[^\s:`]+)\s*:?\s*(.+)", part, re.DOTALL)
        if found is None:
            continue
        name = found.group(1)
        if name.startswith("`"):
            name = name[1:-1].replace("``", "`")
        columns[name] = found.group(2).strip().lower()
    return columns


def _top_level(ddl: str) -> Iterable[str]:
    """``ddl`` split at the commas outside ``<>``, ``()`` and backquotes."""
    depth, quoted, start = 0, False, 0
    for i, char in enumerate(ddl):
        if char == "`":
            quoted = not quoted
        elif not quoted and char in "<(":
            depth += 1
        elif not quoted and char in ">)":
            depth -= 1
        elif not quoted and depth == 0 and char == ",":
            yield ddl[start:i]
            start = i + 1
    yield ddl[start:]


def _shared(declared: dict[str, str], sampled: dict[str, str]) -> bool:
    return bool({n.lower() for n in declared} & {n.lower() for n in sampled})


def _check_columns(pipeline: Pipeline, columns: SourceColumns) -> None:
    """With no transform, the source's columns are the records': the event-time column,
    the keys and the aggregated columns must be among them, event time of a fitting type."""
    event_time = pipeline.event_time
    if event_time is None:
        return
    name, known = pipeline.name, ", ".join(columns.types)
    kind = columns.type_of(event_time.column)
    if kind is None and not columns.complete:
        return
    if kind is None:
        raise DefinitionMismatch(
            f"event-time column {event_time.column!r} of pipeline {name} is not among "
            f"{columns.where}: {known}; set `event_time.column` to one of them, or add a "
            "`transform` that makes it"
        )
    if kind.split("<", 1)[0].split("(", 1)[0].strip() in _NOT_TIME_TYPES:
        raise DefinitionMismatch(
            f"event-time column {event_time.column!r} of pipeline {name} is {kind.upper()} in "
            f"{columns.where}; event time must be a TIMESTAMP: declare it TIMESTAMP in the "
            "source schema, or convert it in a `transform` (timestamp_millis(), "
            "to_timestamp())"
        )
    aggregation = pipeline.aggregation
    # Behind a keyed step the windows take its output rows, whose columns the pipeline's
    # definition checked against `keyed.output_schema`.
    if aggregation is None or not columns.complete or pipeline.keyed is not None:
        return
    used = [*aggregation.keys, *(a.column for a in aggregation.aggregates if a.column)]
    missing = [c for c in dict.fromkeys(used) if columns.type_of(c) is None]
    if missing:
        raise DefinitionMismatch(
            f"pipeline {name} groups or aggregates {', '.join(missing)}, not among "
            f"{columns.where}: {known}; correct `aggregation`, or add a `transform` that makes "
            "them"
        )


def _check_sinks(pipeline: Pipeline, data_root: Path) -> None:
    for config in pipeline.sinks().values():
        _check_sink(pipeline, config, data_root)


def _check_sink(pipeline: Pipeline, config: SinkKind, data_root: Path) -> None:
    # A Postgres or Kafka sink's client (psycopg, confluent_kafka) is imported by the
    # pipelines that have one: the others' `lowmark status` and `plan` must not pay for it
    # (docs/cli.md, "Fast commands").
    if isinstance(config, PostgresSink):
        from lowmark.batches.sinks.postgres_db import PostgresTable

        PostgresTable(config, txn_app_id="").check()
        return
    if isinstance(config, KafkaSink):
        from lowmark.batches.sinks.kafka_topic import KafkaTopic

        KafkaTopic(config, txn_app_id="").check()
        return
    if not isinstance(config, DeltaSink):
        return
    sink = resolve(config.path, data_root)
    if (not_a_table := sink_not_a_table(pipeline, sink)) is not None:
        raise not_a_table
    local = local_path(sink)
    if local is None:
        return
    if not os.path.exists(local):
        _check_creatable(pipeline, local)
        return
    if not os.path.isdir(os.path.join(local, "_delta_log")):
        return
    wanted = _sink_columns(pipeline, config)
    if not wanted:
        return
    has = {f.name.lower() for f in DeltaTable(local).schema().fields}
    missing = [c for c in wanted if c.lower() not in has]
    if missing:
        raise DefinitionMismatch(
            f"the Delta table at sink {local} of pipeline {pipeline.name} has no column "
            f"{', '.join(missing)}, which the pipeline writes: point the sink at a new path, "
            "or add the columns to the table (ALTER TABLE ... ADD COLUMNS)"
        )


def _sink_columns(pipeline: Pipeline, sink: DeltaSink) -> list[str]:
    """The columns every batch writes to ``sink``, where the definition says them: a
    windowed pipeline's (unless a post-aggregation step reshapes them), a merging sink's
    keys."""
    aggregation = pipeline.aggregation
    if aggregation is not None and pipeline.post_aggregation is None:
        outputs = [a.output if isinstance(a, Aggregate) else a.name for a in aggregation.aggregates]
        return [*aggregation.keys, "window_start", "window_end", *outputs]
    return list(sink.keys)


def _check_creatable(pipeline: Pipeline, folder: str) -> None:
    """A sink folder that is not there yet can be made: its nearest existing ancestor is a
    folder lowmark may write in."""
    parent = os.path.dirname(os.path.abspath(folder))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        why = "is a file" if not os.path.isdir(parent) else "is not writable"
        raise DefinitionMismatch(
            f"sink {folder} of pipeline {pipeline.name} cannot be created: {parent} {why}; "
            "point the sink's `path` at a folder lowmark may write, or fix the permissions"
        )
