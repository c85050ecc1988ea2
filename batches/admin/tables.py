"""A pipeline's tables under SQL names, queried on the driver: ``lowmark show`` and
``lowmark sql``.

Every table a pipeline has is a Delta table: its sink (a ``kind: delta`` one)
and the tables of its checkpoint (``lowmark.state.checkpoint``). They are read with
delta-rs's own query engine (DataFusion, ``deltalake.QueryBuilder``): no
Spark, no JVM; a query of the demo's tables takes milliseconds. Read only:
DataFusion cannot write through these tables.

SQL names: ``<pipeline>.<table>``, the pipeline a schema and each of
``TABLES`` a table in it (``user_revenue.sink``, ``orders.late``). SQL folds
unquoted names to lower case, so a pipeline named with capitals or a dash is
quoted: ``"Page-Views".sink``. A query may join the tables of any pipelines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from lowmark.batches.errors import QueryFailed, TableNotFound
from lowmark.batches.pipeline import Pipeline, resolve
from lowmark.state.errors import first_line
from lowmark.state.table import query_rows


@dataclass(frozen=True)
class Table:
    """One kind of table every pipeline may have."""

    name: str
    """Its SQL name within the pipeline's schema (and ``lowmark show``'s argument)."""
    folder: str | None
    """Its folder in the checkpoint (``lowmark.state.checkpoint``); None: the sink."""
    order_by: str
    """How ``lowmark show`` orders it: newest first where rows have an age."""
    created: str
    """When it comes to exist, for the error about one that does not yet."""


_WITH_CHECKPOINT = "the first `lowmark run` creates it with the checkpoint"
_WINDOW_STATE = "state_windows"

TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        Table("sink", None, "", "the first batch that writes output creates it"),
        Table("late", "late", "batch_id DESC, event_time DESC", _WITH_CHECKPOINT),
        Table("bad", "bad_records", "batch_id DESC", _WITH_CHECKPOINT),
        Table(
            "state",
            _WINDOW_STATE,
            "window_start DESC",
            "the first batch of a windowed pipeline creates it",
        ),
        Table("offsets", "offsets", "batch_id DESC", _WITH_CHECKPOINT),
        Table("commits", "commits", "batch_id DESC", _WITH_CHECKPOINT),
        Table("progress", "progress", "batch_id DESC", _WITH_CHECKPOINT),
        Table("watermarks", "watermarks", "batch_id DESC, partition", _WITH_CHECKPOINT),
        Table("files", "files", "discovered_for_batch DESC, partition, seq DESC", _WITH_CHECKPOINT),
        Table(
            "failures",
            "failures",
            "failed_at DESC",
            "the first failed attempt at a batch creates it (none has failed)",
        ),
    )
}
"""The tables of a pipeline, by SQL name (the sink first)."""

EPOCH_MS_COLUMNS = frozenset(
    (
        "watermark_ms",
        "batch_watermark_ms",
        "next_watermark_ms",
        "max_event_time_ms",
        "last_seen_ms",
        "modified_ms",
    )
)
"""The checkpoint's columns that hold a moment as epoch milliseconds (the others named
``*_ms``, such as ``lag_ms``, are durations): what a view for people shows as a time."""

_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def schema_name(pipeline: str) -> str:
    """The SQL schema of ``pipeline``'s tables, quoted when SQL would fold or split it."""
    return pipeline if _PLAIN_NAME.fullmatch(pipeline) else f'"{pipeline}"'


def sql_name(pipeline: str, table: str) -> str:
    """``<pipeline>.<table>``, as a query names it."""
    return f"{schema_name(pipeline)}.{table}"


def table_path(pipeline: Pipeline, table: Table, data_root: Path) -> str:
    """Where ``table`` of ``pipeline`` lives; for a custom sink, ``PipelineConfigInvalid``."""
    if table.folder is not None:
        return f"{pipeline.checkpoint_location(data_root)}/{table.folder}"
    sink = pipeline.delta_sink(
        "`lowmark show`",
        "look at it with its own system's tools (the checkpoint's tables can still be shown)",
    )
    return resolve(sink.path, data_root)


@dataclass(frozen=True)
class Shown:
    """The rows ``show`` picked."""

    name: str
    """The table's SQL name."""
    rows: pa.Table
    matching: int
    """How many rows match the filter in all (``rows`` holds at most the limit)."""
    order_by: str
    """How ``rows`` are ordered ('' : as stored)."""


def show(
    pipeline: Pipeline, table: str, data_root: Path, limit: int, where: str | None = None
) -> Shown:
    """The first ``limit`` rows of ``pipeline``'s ``table`` (one of ``TABLES``) that match
    the SQL predicate ``where``, newest first where rows have an age (``Table.order_by``;
    a windowed sink: the newest windows; a sink with the event-time column: the newest
    events)."""
    if table not in TABLES:
        raise TableNotFound(f"no table {table!r} in a pipeline: choose one of {', '.join(TABLES)}")
    kind = TABLES[table]
    name = sql_name(pipeline.name, table)
    if kind.folder == _WINDOW_STATE and pipeline.aggregation is None:
        raise TableNotFound(
            f"{name}: pipeline {pipeline.name} has no window state (it has no `aggregation`): "
            f"show one of its other tables"
        )
    opened = _open(pipeline, kind, data_root)
    engine = _engine({name: opened})
    order_by = kind.order_by if kind.folder is not None else _sink_order(pipeline, opened)
    filtered = f"FROM {name}" + (f" WHERE ({where})" if where else "")
    ordered = f" ORDER BY {order_by}" if order_by else ""
    fix = "fix --where"
    rows = _run(engine, f"SELECT * {filtered}{ordered} LIMIT {limit}", fix)
    matching = _run(engine, f"SELECT count(*) AS n {filtered}", fix).column("n")[0].as_py()
    return Shown(name, rows, int(matching), order_by)


def query(pipelines: Mapping[str, Pipeline], data_root: Path, sql: str) -> pa.Table:
    """The result of the SQL query ``sql`` over the tables of ``pipelines`` (their SQL
    names: the module doc). Tables not created yet are not there to query; naming one is
    ``TableNotFound`` saying so."""
    found: dict[str, DeltaTable] = {}
    waiting: dict[str, str] = {}
    for pipeline in pipelines.values():
        for kind in TABLES.values():
            if kind.folder is None and pipeline.sink.kind != "delta":
                continue  # a custom sink has no table
            name = sql_name(pipeline.name, kind.name)
            path = table_path(pipeline, kind, data_root)
            if DeltaTable.is_deltatable(path):
                found[name] = DeltaTable(path)
            else:
                waiting[_unquoted(name)] = f"{name} does not exist yet ({path}): {kind.created}"
    return _run(_engine(found), sql, "fix the query", waiting)


def _open(pipeline: Pipeline, kind: Table, data_root: Path) -> DeltaTable:
    """``kind`` of ``pipeline``; ``TableNotFound`` if it does not exist yet."""
    path = table_path(pipeline, kind, data_root)
    if not DeltaTable.is_deltatable(path):
        raise TableNotFound(
            f"{sql_name(pipeline.name, kind.name)} does not exist yet ({path}): {kind.created}"
        )
    return DeltaTable(path)


def _sink_order(pipeline: Pipeline, sink: DeltaTable) -> str:
    """The newest first: a windowed sink's windows by start (then key), a sink holding the
    event-time column by event time; else as stored."""
    if pipeline.aggregation is not None:
        keys = "".join(f', "{k}"' for k in pipeline.aggregation.keys)
        return f"window_start DESC{keys}"
    columns = {field.name for field in sink.schema().fields}
    if pipeline.event_time is not None and pipeline.event_time.column in columns:
        return f'"{pipeline.event_time.column}" DESC'
    return ""


def _engine(tables: Mapping[str, DeltaTable]) -> QueryBuilder:
    """A DataFusion session with ``tables`` registered by SQL name, their schemas made."""
    engine = QueryBuilder({"datafusion.catalog.information_schema": "true"})
    for schema in sorted({name.rsplit(".", 1)[0] for name in tables}):
        engine.execute(f"CREATE SCHEMA {schema}").read_all()
    for name, table in tables.items():
        engine.register(name, table)
    return engine


_NOT_FOUND = re.compile(r"table '(?:datafusion\.)?(?:public\.)?([^']+)' not found")


def _run(
    engine: QueryBuilder, sql: str, fix: str, waiting: Mapping[str, str] | None = None
) -> pa.Table:
    """The rows of ``sql``; a table it names that is not there is ``TableNotFound`` (with
    ``waiting``'s reason, by unquoted name, for one not created yet), any other failure
    ``QueryFailed`` saying ``fix``."""
    try:
        return query_rows(engine.execute(sql))
    except Exception as exc:  # DataFusion raises one error type for every failure
        message = first_line(exc)
        missing = _NOT_FOUND.search(message)
        if missing is None:
            raise QueryFailed(f"the query failed: {message}: {fix} (`{_short(sql)}`)") from exc
        name = missing.group(1)
        if waiting and name in waiting:
            raise TableNotFound(waiting[name]) from exc
        raise TableNotFound(
            f"no table {name}: a pipeline's tables are <pipeline>.<table>, the table one of "
            f"{', '.join(TABLES)} (`lowmark list` names the pipelines; quote a name with "
            'capitals or a dash: "Page-Views".sink)'
        ) from exc


def _unquoted(name: str) -> str:
    """A SQL name as DataFusion's errors spell it: without quotes."""
    return name.replace('"', "")


def _short(sql: str, most: int = 80) -> str:
    """``sql`` on one line, cut to ``most`` characters."""
    line = " ".join(sql.split())
    return line if len(line) <= most else line[: most - 1] + "…"
