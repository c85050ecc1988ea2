"""``lowmark show`` and ``lowmark sql``: a pipeline's tables without Spark or Python.

The rows come from ``lowmark.batches.admin.tables`` (delta-rs's query engine, on the
driver). For people, a table (``lowmark.batches.cli.display``) whose times read as ISO
8601 UTC, the checkpoint's epoch-millisecond moments included (each partition's, in a
JSON column of them), its millisecond durations with units (``27 min 36 s``), and a
line on stderr saying how many rows matched; with ``--json``, JSON Lines: one object
per row, timestamps as ISO 8601 strings, milliseconds as numbers (as every ``--json``
of lowmark), binary as base64.

Registered on the ``lowmark`` app of ``lowmark.batches.cli.commands`` when imported
(``lowmark.orchestration.cli``, the console entry point, does).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any

import typer

from lowmark.batches.admin.tables import (
    DURATION_MS_COLUMNS,
    EPOCH_MS_COLUMNS,
    JSON_DURATION_MS_COLUMNS,
    JSON_EPOCH_MS_COLUMNS,
    TABLES,
    Rows,
    locate,
    query,
    show,
)
from lowmark.batches.cli.commands import Context, app, err, out
from lowmark.batches.cli.display import duration, iso_time, print_json, print_table

DEFAULT_LIMIT = 20

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

JsonLines = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print each row as one line of JSON (JSON Lines; timestamps as ISO 8601 strings).",
    ),
]


@app.command("show")
def show_table(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name (see `lowmark list`).")],
    table: Annotated[
        str, typer.Argument(help=f"Which of its tables: {', '.join(TABLES)}.")
    ] = "sink",
    limit: Annotated[
        int, typer.Option(min=1, help=f"Show at most N rows (default {DEFAULT_LIMIT}).")
    ] = DEFAULT_LIMIT,
    where: Annotated[
        str | None,
        typer.Option(help="Only rows matching this SQL predicate, e.g. \"user = 'u1'\"."),
    ] = None,
    as_json: JsonLines = False,
) -> None:
    """Show rows of one of PIPELINE's tables: its sink (the default), late records, bad
    records, window state, or a checkpoint log, the newest first.

    Reads the Delta table on the driver (delta-rs and its SQL engine): no Spark is
    started. `lowmark sql` queries and joins them.
    """
    c: Context = ctx.obj
    shown = show(locate(pipeline, c.data_root, c.pipelines), table, limit, where)
    if as_json:
        _print_json_lines(shown.rows)
        return
    _print_rows(shown.rows)
    order = f", ordered by {shown.order_by}" if shown.order_by and shown.rows.num_rows else ""
    more = "; --limit shows more" if shown.matching > shown.rows.num_rows else ""
    err.print(
        f"{shown.name}: {shown.rows.num_rows} of {shown.matching} rows{order}{more}",
        highlight=False,
        soft_wrap=True,
    )


@app.command("sql")
def sql_query(
    ctx: typer.Context,
    statement: Annotated[
        str,
        typer.Argument(
            help="A SELECT over the pipelines' tables, named <pipeline>.<table> "
            "(e.g. user_revenue.sink, orders.late)."
        ),
    ],
    as_json: JsonLines = False,
) -> None:
    """Run a SQL query over the tables of every pipeline: sinks, late and bad records,
    window state, the checkpoint logs; joins across pipelines too.

    Each table is <pipeline>.<table>, the table one of: sink, late, bad, state, offsets,
    commits, progress, watermarks, files, failures (quote a pipeline name with capitals
    or a dash: "Page-Views".sink). Read only; no Spark is started (delta-rs's SQL engine,
    DataFusion's dialect).
    """
    c: Context = ctx.obj
    rows = query(c.data_root, statement, c.pipelines)
    if as_json:
        _print_json_lines(rows)
        return
    _print_rows(rows)
    err.print(f"{rows.num_rows} rows", highlight=False)


def _print_rows(rows: Rows) -> None:
    """``rows`` as a table for people (its times ISO 8601 UTC, its durations with units)."""
    kinds = [_milliseconds(name) for name in rows.column_names]
    cells = [[_cell(v, ms) for v, ms in zip(row, kinds, strict=True)] for row in _values(rows)]
    print_table(out, rows.column_names, cells)


def _values(rows: Rows) -> list[tuple[Any, ...]]:
    """``rows`` as Python values, a tuple a row."""
    return list(zip(*(column.to_pylist() for column in rows.columns), strict=True))


def _milliseconds(column: str) -> Callable[[int], str] | None:
    """How a checkpoint column of milliseconds reads (a moment, a duration); None: it holds
    none."""
    if column in EPOCH_MS_COLUMNS | JSON_EPOCH_MS_COLUMNS:
        return _moment
    if column in DURATION_MS_COLUMNS | JSON_DURATION_MS_COLUMNS:
        return duration
    return None


def _moment(ms: int) -> str:
    return iso_time(_EPOCH + timedelta(milliseconds=ms))


def _cell(value: Any, milliseconds: Callable[[int], str] | None) -> str:
    """One value in words: ISO times, durations with units (``milliseconds`` reads a
    column of them, or a JSON object of them by name: ``0: 2026-11-25T10:04:12Z, 1: …``),
    floats to the 15 digits a double holds, JSON for nested values, ``null`` for none."""
    if value is None:
        return "null"
    if milliseconds is not None and isinstance(value, int):
        return milliseconds(value)
    if milliseconds is not None and isinstance(value, str):
        named = json.loads(value)
        return ", ".join(f"{name}: {milliseconds(ms)}" for name, ms in named.items())
    if isinstance(value, datetime):
        return iso_time(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.15g}"  # what a double holds exactly: 220.08, not 220.07999999999998
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=_json_value, ensure_ascii=False)
    return str(value)


def _print_json_lines(rows: Rows) -> None:
    """``rows`` as JSON Lines."""
    for row in _values(rows):
        print_json(
            out, dict(zip(rows.column_names, row, strict=True)), indent=None, default=_json_value
        )


def _json_value(value: Any) -> Any:
    """A value JSON has no type for: timestamps and dates ISO 8601, binary base64,
    decimals as their exact text."""
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")
