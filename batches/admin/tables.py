"""A pipeline's tables under SQL names, queried on the driver: ``lowmark show`` and
``lowmark sql``.

Every table a pipeline has is a Delta table: its sink (a ``kind: delta`` one)
and the tables of its checkpoint (``lowmark.state.checkpoint``). Where they are is what
the pipeline's last run recorded in the data root's catalog (``lowmark.state.catalog``);
the definitions are loaded only for a pipeline the catalog does not hold (``locate``).
They are read with delta-rs's own query engine (DataFusion, ``deltalake.QueryBuilder``)
into arro3 tables: no Spark, no JVM, no pyarrow; a query of the demo's tables takes
milliseconds. Read only: DataFusion cannot write through these tables.

SQL names: ``<pipeline>.<table>``, the pipeline a schema and each of
``TABLES`` a table in it (``user_revenue.sink``, ``orders.late``). SQL folds
unquoted names to lower case, so a pipeline named with capitals or a dash is
quoted: ``"Page-Views".sink``. A query may join the tables of any pipelines.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from arro3.core import RecordBatchReader
from arro3.core import Table as Rows
from deltalake import DeltaTable, QueryBuilder

from lowmark.batches.errors import PipelineConfigInvalid, QueryFailed, TableNotFound
from lowmark.state import catalog
from lowmark.state.catalog import CatalogEntry
from lowmark.state.errors import LowmarkError, first_line
from lowmark.state.storage import is_table, open_table


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
        Table(
            "dedup_ids",
            "dedup_ids",
            "event_time DESC",
            "a pipeline with `dedup` creates it when it first runs",
        ),
        Table(
            "keyed_state",
            "keyed_state",
            "batch_id DESC",
            "a pipeline with `keyed` creates it when it first runs",
        ),
        Table(
            "keyed_timers",
            "keyed_timers",
            "timer_ms",
            "a pipeline with `keyed` creates it when it first runs",
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
        "window_watermark_ms",
        "max_event_time_ms",
        "last_seen_ms",
        "modified_ms",
        "discovered_ms",
        "next_timer_ms",
        "timer_ms",
        "expires_ms",
    )
)
"""The checkpoint's columns that hold a moment as epoch milliseconds (the others named
``*_ms``, such as ``lag_ms``, are durations): what a view for people shows as a time."""
DURATION_MS_COLUMNS = frozenset(("lag_ms",))
"""The checkpoint's columns that hold a duration in milliseconds: shown with its units."""
JSON_EPOCH_MS_COLUMNS = frozenset(("ingestion_ms",))
"""JSON columns of moments in epoch milliseconds by name (``ingestion_ms``: by source
partition): a view for people shows each as a time."""
JSON_DURATION_MS_COLUMNS = frozenset(("durations_ms",))
"""JSON columns of durations in milliseconds by name (``durations_ms``: by step)."""

_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def schema_name(pipeline: str) -> str:
    """The SQL schema of ``pipeline``'s tables, quoted when SQL would fold or split it."""
    return pipeline if _PLAIN_NAME.fullmatch(pipeline) else f'"{pipeline}"'


def sql_name(pipeline: str, table: str) -> str:
    """``<pipeline>.<table>``, as a query names it."""
    return f"{schema_name(pipeline)}.{table}"


def locate(pipeline: str, data_root: Path, definitions: str | None) -> CatalogEntry:
    """Where ``pipeline``'s tables are under ``data_root``: as its last run recorded them
    (the catalog), else as its definition in ``definitions`` (``lowmark.batches.registry``)
    says: a pipeline not run yet, or last run by a lowmark without the catalog (recorded
    now, so the next look is fast). Defined nowhere: ``PipelineNotFound``."""
    recorded = catalog.entries(data_root).get(pipeline)
    if recorded is not None:
        return recorded
    from lowmark.batches.registry import get_pipeline

    return _record(get_pipeline(pipeline, definitions).catalog_entry(data_root), data_root)


def table_path(entry: CatalogEntry, table: Table) -> str:
    """Where ``table`` of ``entry``'s pipeline lives; for a sink other than Delta,
    ``PipelineConfigInvalid``."""
    if table.folder is not None:
        return f"{entry.checkpoint}/{table.folder}"
    if entry.sink is None:
        raise PipelineConfigInvalid(
            f"pipeline {entry.pipeline} writes a sink other than Delta ({entry.sink_label}): "
            "`lowmark show` reads the sink's table, so it needs a `kind: delta` sink; look at it "
            "with its own system's tools (the checkpoint's tables can still be shown)"
        )
    return entry.sink


@dataclass(frozen=True)
class Shown:
    """The rows ``show`` picked."""

    name: str
    """The table's SQL name."""
    rows: Rows
    matching: int
    """How many rows match the filter in all (``rows`` holds at most the limit)."""
    order_by: str
    """How ``rows`` are ordered ('' : as stored)."""


def show(entry: CatalogEntry, table: str, limit: int, where: str | None = None) -> Shown:
    """The first ``limit`` rows of the ``table`` (one of ``TABLES``) of ``entry``'s
    pipeline that match the SQL predicate ``where``, newest first where rows have an age
    (``Table.order_by``; a windowed sink: the newest windows; a sink with the event-time
    column: the newest events)."""
    if table not in TABLES:
        raise TableNotFound(f"no table {table!r} in a pipeline: choose one of {', '.join(TABLES)}")
    kind = TABLES[table]
    name = sql_name(entry.pipeline, table)
    if kind.folder == _WINDOW_STATE and entry.window_keys is None:
        raise TableNotFound(
            f"{name}: pipeline {entry.pipeline} has no window state (it has no `aggregation`): "
            f"show one of its other tables"
        )
    opened = _open(entry, kind)
    engine = _engine({name: opened})
    order_by = kind.order_by if kind.folder is not None else _sink_order(entry, opened)
    filtered = f"FROM {name}" + (f" WHERE ({where})" if where else "")
    ordered = f" ORDER BY {order_by}" if order_by else ""
    fix = "fix --where"
    rows = _run(engine, f"SELECT * {filtered}{ordered} LIMIT {limit}", fix)
    matching = _run(engine, f"SELECT count(*) AS n {filtered}", fix).column("n").to_pylist()[0]
    return Shown(name, rows, int(matching), order_by)


def query(data_root: Path, sql: str, definitions: str | None) -> Rows:
    """The result of the SQL query ``sql`` over the tables of the pipelines under
    ``data_root`` (their SQL names: the module doc): those the catalog records, and, if
    the query names a table none of them has, those ``definitions`` define too (as
    ``locate``). Tables not created yet are not there to query; naming one is
    ``TableNotFound`` saying so."""
    recorded = catalog.entries(data_root)
    try:
        return _query(recorded, sql)
    except TableNotFound as missing:
        from lowmark.batches.registry import load_pipelines

        try:
            defined = load_pipelines(definitions)
        except LowmarkError:
            raise missing from None
        more = {
            name: _record(p.catalog_entry(data_root), data_root)
            for name, p in defined.items()
            if name not in recorded
        }
        if not more:
            raise
    return _query({**recorded, **more}, sql)


def _record(entry: CatalogEntry, data_root: Path) -> CatalogEntry:
    """``entry``, recorded in the catalog if its checkpoint exists (its pipeline has run) and
    the data root may be written (a look from a read-only one finds it the same way again)."""
    if is_table(f"{entry.checkpoint}/offsets"):
        with contextlib.suppress(OSError):
            catalog.remember(data_root, entry)
    return entry


def _query(entries: Mapping[str, CatalogEntry], sql: str) -> Rows:
    """``sql`` over the tables of ``entries`` that exist."""
    found: dict[str, DeltaTable] = {}
    waiting: dict[str, str] = {}
    for entry in entries.values():
        for kind in TABLES.values():
            if kind.folder is None and entry.sink is None:
                continue  # a custom sink has no table
            name = sql_name(entry.pipeline, kind.name)
            path = table_path(entry, kind)
            if is_table(path):
                found[name] = open_table(path)
            else:
                waiting[_unquoted(name)] = f"{name} does not exist yet ({path}): {kind.created}"
    return _run(_engine(found), sql, "fix the query", waiting)


def _open(entry: CatalogEntry, kind: Table) -> DeltaTable:
    """``kind`` of ``entry``'s pipeline; ``TableNotFound`` if it does not exist yet."""
    path = table_path(entry, kind)
    if not is_table(path):
        raise TableNotFound(
            f"{sql_name(entry.pipeline, kind.name)} does not exist yet ({path}): {kind.created}"
        )
    return open_table(path)


def _sink_order(entry: CatalogEntry, sink: DeltaTable) -> str:
    """The newest first: a windowed sink's windows by start (then key), a sink holding the
    event-time column by event time; else as stored."""
    if entry.window_keys is not None:
        keys = "".join(f', "{k}"' for k in entry.window_keys)
        return f"window_start DESC{keys}"
    columns = {field.name for field in sink.schema().fields}
    if entry.event_time_column is not None and entry.event_time_column in columns:
        return f'"{entry.event_time_column}" DESC'
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
) -> Rows:
    """The rows of ``sql``; a table it names that is not there is ``TableNotFound`` (with
    ``waiting``'s reason, by unquoted name, for one not created yet), any other failure
    ``QueryFailed`` saying ``fix``."""
    try:
        return RecordBatchReader.from_arrow(engine.execute(sql)).read_all()
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
