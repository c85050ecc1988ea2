"""The Postgres sinks (``kind: postgres``): a batch's rows and its id in one transaction,
exactly once (``lowmark.batches.sinks.postgres_db``).

- ``PostgresFrameSink``: a stateless pipeline's records, a DataFrame of any size.
  They are streamed from Spark to the driver one partition at a time
  (``toLocalIterator``) into one COPY of one transaction, so the driver
  holds one partition, never the batch. Why the driver and not the
  executors: the fence and the rows must commit in ONE transaction, which
  one connection holds; tasks COPYing into a staging table would need that
  table to survive their connections (an unlogged table per batch, cleaned
  up after crashes), the Postgres driver and the password on every executor,
  and a second pass to move the rows. A batch's rows cross the network once
  either way; the driver's one stream bounds the rate to one connection's
  COPY, which is what a serving table takes anyway.
- ``PostgresWindowSink``: a windowed pipeline's windows, Arrow rows on the driver
  already; update mode upserts them on keys + window and deletes the windows
  the batch retracts.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import TimestampType

from lowmark.batches.pipeline import Pipeline, PostgresSink
from lowmark.batches.sinks.base import Sink, SinkFence, WindowedSink
from lowmark.batches.sinks.postgres_db import PostgresTable, arrow_rows
from lowmark.state.checkpoint import Checkpoint


class PostgresFence(SinkFence):
    """A Postgres sink's fence: the rows of its fence table (``PostgresTable``)."""

    def __init__(self, config: PostgresSink, txn_app_id: str) -> None:
        self.table = PostgresTable(config, txn_app_id)

    def landed(self, batch_id: int) -> bool:
        return self.table.landed(batch_id)

    def last_landed(self) -> int:
        return self.table.last_landed()

    def check_ours(self, pipeline: Pipeline, checkpoint: Checkpoint) -> None:
        """The table's last writer in the fence is ours (``PostgresTable.check_ours``)."""
        self.table.check_ours(pipeline, checkpoint)


class PostgresFrameSink(PostgresFence, Sink):
    """A stateless pipeline's sink: each batch's records into a Postgres table (contract:
    ``Sink``, whose ``retract`` only windows have; not versioned: ``write`` returns None)."""

    def write(self, df: DataFrame, batch_id: int, retract: DataFrame | None = None) -> None:
        if self.table.landed(batch_id):  # a replay whose write landed: no Spark job
            return
        schema = to_arrow_schema(df.schema, timezone="UTC")
        instants = [
            i for i, f in enumerate(df.schema.fields) if isinstance(f.dataType, TimestampType)
        ]
        rows = (_as_utc(tuple(row), instants) for row in df.toLocalIterator())
        self.table.write(schema, batch_id, rows)


def _as_utc(row: tuple[Any, ...], instants: list[int]) -> tuple[Any, ...]:
    """``row`` with its instants (Spark's ``timestamp``, which PySpark hands over as naive
    local times) as aware UTC times, so Postgres stores the instant whatever its time zone."""
    if not instants:
        return row
    values = list(row)
    for i in instants:
        value: datetime | None = values[i]
        if value is not None and value.tzinfo is None:
            values[i] = value.astimezone(UTC)
    return tuple(values)


class PostgresWindowSink(PostgresFence, WindowedSink):
    """A windowed pipeline's sink: emitted windows appended, or upserted on keys + window with
    the retracted ones deleted (contract: ``WindowedSink``; not versioned)."""

    def write(self, rows: pa.Table, batch_id: int, retract: pa.Table | None = None) -> None:
        """Write batch ``batch_id``'s windows once. A batch without changes writes nothing
        but its fence row (and, the first time, the table: readers find it from the start)."""
        self.table.write(rows.schema, batch_id, arrow_rows(rows), retract)
