"""What a materialization says of a pipeline's tables, read on the driver from their Delta logs.

No Spark: delta-rs reads the logs (and DataFusion, for a partition's rows and the
window state's open windows), a few milliseconds on small tables. Each table
asset's materialization carries Dagster's standard ``dagster/row_count`` and
``dagster/column_schema`` (column types as Spark SQL names them: ``bigint``,
``timestamp``); the windowed sink's also the window state: how many windows are
open and which closes next.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, QueryBuilder

from lowmark.batches.loop.preflight import spark_type_name
from lowmark.batches.pipeline import Pipeline
from lowmark.state.keyed_state import Expiry, held
from lowmark.state.storage import is_table, open_table
from lowmark.state.table import query_rows

ROW_COUNT = "dagster/row_count"
COLUMN_SCHEMA = "dagster/column_schema"


def _open(path: str) -> DeltaTable | None:
    """The table at ``path``, or None when there is none yet (the first batch makes it)."""
    return open_table(path) if is_table(path) else None


def table_metadata(path: str) -> dict[str, dg.RawMetadataValue]:
    """``dagster/row_count`` and ``dagster/column_schema`` of the Delta table at ``path``
    (nothing when it does not exist yet). The row count is the log's: the sum of each live
    file's record count, less the rows its deletion vector removed; no data is read."""
    table = _open(path)
    if table is None:
        return {}
    actions = pa.table(table.get_add_actions(flatten=True))
    rows = _sum(actions, "num_records") - _sum(actions, "deletionVector.cardinality")
    columns = [
        dg.TableColumn(f["name"], spark_type_name(f["type"]), constraints=_nullable(f))
        for f in json.loads(table.schema().to_json())["fields"]
    ]
    return {
        ROW_COUNT: dg.MetadataValue.int(rows),
        COLUMN_SCHEMA: dg.MetadataValue.table_schema(dg.TableSchema(columns=columns)),
    }


def _query(table: DeltaTable, sql: str) -> pa.Table:
    """``sql`` over ``table``, named ``t``, with delta-rs's query engine."""
    return query_rows(QueryBuilder().register("t", table).execute(sql))


def _sum(actions: pa.Table, column: str) -> int:
    if column not in actions.column_names:
        return 0
    total = pc.sum(actions.column(column)).as_py()
    return int(total or 0)


def _nullable(field: dict[str, Any]) -> dg.TableColumnConstraints | None:
    """A column's constraint, from its Delta schema field (Spark's JSON form)."""
    return None if field["nullable"] else dg.TableColumnConstraints(nullable=False)


def partition_rows(path: str, start: datetime, end: datetime) -> int:
    """Rows of the windowed sink at ``path`` whose window starts in ``[start, end)``: the
    windows of one event-time partition."""
    table = _open(path)
    if table is None:
        return 0
    found = _query(
        table,
        "SELECT count(*) AS n FROM t WHERE window_start >= "
        f"TIMESTAMP '{start.isoformat()}' AND window_start < TIMESTAMP '{end.isoformat()}'",
    )
    return int(found.column("n")[0].as_py())


def open_windows(pipeline: Pipeline, state_path: str) -> dict[str, dg.RawMetadataValue]:
    """What the window state of windowed ``pipeline`` holds (at ``state_path``): the
    windows still open (``open_windows``, a count), and the oldest of them — the next to
    close — with the watermark that makes it final (``next_window_final_at``: its end +
    ``allowed_lateness``), so a batch writing no rows says how long until it does."""
    assert pipeline.event_time is not None  # a windowed pipeline has event time
    table = _open(state_path)
    if table is None:
        return {"open_windows": 0}
    count = _query(table, "SELECT count(*) AS n FROM t").column("n")[0].as_py()
    metadata: dict[str, dg.RawMetadataValue] = {"open_windows": int(count)}
    if count:
        # Final once the watermark reaches window_end + allowed_lateness: the smallest end
        # closes first (a session's start says nothing of when it closes).
        [oldest] = _query(
            table, "SELECT window_start, window_end FROM t ORDER BY window_end LIMIT 1"
        ).to_pylist()
        start, end = _aware(oldest["window_start"]), _aware(oldest["window_end"])
        final_at = end.timestamp() + pipeline.event_time.allowed_lateness / 1000
        metadata["next_window_final_at"] = dg.MetadataValue.timestamp(final_at)
        metadata["oldest_open_window"] = dg.MetadataValue.text(f"{_utc(start)} → {_utc(end)}")
    return metadata


def keyed_held(
    state_path: str, timers_path: str, expiry: Expiry | None = None
) -> dict[str, dg.RawMetadataValue]:
    """What a keyed step holds (``lowmark.state.keyed_state.held``) as of ``expiry``:
    ``keys_held``, ``timers_pending`` and, if any, ``next_timer_at``."""
    now = held(state_path, timers_path, expiry)
    metadata: dict[str, dg.RawMetadataValue] = {
        "keys_held": now.keys,
        "timers_pending": now.timers,
    }
    if now.next_timer_ms is not None:
        metadata["next_timer_at"] = dg.MetadataValue.timestamp(now.next_timer_ms / 1000)
    return metadata


def _aware(moment: datetime) -> datetime:
    """``moment`` in UTC: lowmark's timestamps are UTC, with or without a time zone."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _utc(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")
