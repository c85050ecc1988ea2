"""A user-written source: an append-only outbox table in SQLite (docs/sources.md).

The transactional-outbox pattern: an application writes each event into a
table ``outbox(id INTEGER PRIMARY KEY AUTOINCREMENT, payload TEXT)`` in the
same transaction as its own change. Ids only grow, and a row is never updated
once committed, so "rows with ``start <= id < end``" names the same rows every
time: that is all a lowmark source needs for exact replays.

Use it from YAML::

    source:
      kind: custom
      factory: examples.outbox_source:build
      options: {database: app.db, table: outbox, schema_ddl: "...", max_rows_per_batch: 1000}
      operational: [max_rows_per_batch]

Offsets: ``{"<table>": next id}``, one source partition. The driver reads the
rows of a batch (fine for the thousands of rows an outbox holds per batch);
upstream may delete rows below the committed frontier, which ``commit``
does when ``delete_committed`` is set.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from lowmark.batches.pipeline import resolve
from lowmark.batches.sources import Source, SourceRead
from lowmark.batches.sources.base import PARTITION_COLUMN
from lowmark.batches.sources.json_values import parse_json_values
from lowmark.state.offset_log import Offsets
from lowmark.state.session import SparkLike, provider


class OutboxSource(Source):
    """Rows of ``table`` in the SQLite file ``database``, by increasing ``id``."""

    def __init__(self, spark: SparkLike, options: dict[str, Any], data_root: Path) -> None:
        self._spark = provider(spark)
        self.database = resolve(str(options["database"]), data_root)
        self.table = str(options.get("table", "outbox"))
        self.schema_ddl = str(options["schema_ddl"])
        self.limit = int(options.get("max_rows_per_batch", 1000))
        self.delete_committed = bool(options.get("delete_committed", False))

    def _query(self, sql: str, *args: int) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.database) as db:
            return db.execute(sql, args).fetchall()

    def _next_id(self) -> int:
        """One past the newest committed id (0 for an empty table)."""
        [(newest,)] = self._query(f"SELECT MAX(id) FROM {self.table}")
        return 0 if newest is None else int(newest) + 1

    def initial_offsets(self) -> Offsets:
        return {self.table: 0}

    def plan(
        self, start: Offsets, batch_id: int, record: bool = True, discover: bool = True
    ) -> Offsets:
        """Up to ``max_rows_per_batch`` ids past ``start`` (ids may have gaps: fewer rows;
        a table emptied by ``delete_committed`` keeps the end where it was)."""
        begin = start.get(self.table, 0)
        return {self.table: max(begin, min(self._next_id(), begin + self.limit))}

    def read(
        self,
        start: Offsets,
        end: Offsets,
        batch_id: int,
        cache: bool = False,
        strict: bool = False,
    ) -> SourceRead:
        """The rows with ``start <= id < end``, their payloads parsed as JSON."""
        rows = self._query(
            f"SELECT id, payload FROM {self.table} WHERE id >= ? AND id < ? ORDER BY id",
            start.get(self.table, 0),
            end.get(self.table, 0),
        )
        values = self._spark().createDataFrame(rows, "id LONG, value STRING")
        values = values.withColumn(PARTITION_COLUMN, F.lit(self.table))
        origin = F.format_string(f"{self.table}@%d", "id")
        return parse_json_values(values, self.schema_ddl, batch_id, origin, cache=cache)

    def backlog(self, committed_end: Offsets) -> dict[str, int]:
        [(waiting,)] = self._query(
            f"SELECT COUNT(*) FROM {self.table} WHERE id >= ?", committed_end.get(self.table, 0)
        )
        return {"rows": int(waiting)}

    def commit(self, end: Offsets) -> None:
        """With ``delete_committed``: the application may forget what lowmark committed."""
        if self.delete_committed:
            with sqlite3.connect(self.database) as db:
                db.execute(f"DELETE FROM {self.table} WHERE id < ?", (end[self.table],))


def build(spark: SparkLike, options: dict[str, Any], data_root: Path) -> OutboxSource:
    """The factory a pipeline names: ``factory: examples.outbox_source:build``."""
    return OutboxSource(spark, options, data_root)
