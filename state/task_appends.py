"""Task-written appends: a batch's rows written as data files by the Spark tasks that made
them, straight into a checkpoint table's folder, then added by ONE driver commit.

The rows a batch appends to a table of per-key bookkeeping (keyed state and
timers, seen ids) are as many as the keys it touched. They never pass
through the driver:

1. On an executor, a task writes its rows with ``write_files``: one Parquet
   file per partition of the table (``<column>=<value>/``), named after the
   batch and a random uuid, so no two attempts share a name. It gives back
   only each file's ``WrittenFile`` (path, size, partition values, row count
   and Delta statistics), a few hundred bytes, which reach the driver
   through the job's observation.
2. The driver commits the batch's files to the table in ONE Delta
   transaction (``DriverTable.commit_files``), carrying the batch's
   application transaction, unless that transaction landed: the same
   idempotency rule as every driver write.

Delta reads only the files a committed log entry adds. The files of an
attempt that never committed (a crash, a task retried, a job run twice) are
orphans that no reader opens; a replay writes new files, and commits them
only if the earlier attempt's commit did not land. The files' statistics
(row count, min and max of number, timestamp and short string columns, null
counts) let delta-rs and Spark skip files by the columns reads filter on.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from lowmark.state import storage

NULL_FOLDER = "__HIVE_DEFAULT_PARTITION__"
"""The folder of a partition column's null value, as Spark and delta-rs name it."""
STATS_STRING_CHARS = 32
"""A string column's min and max go into the statistics only if no longer (Spark keeps 32
characters of them; longer values, such as serialized states, would only bloat the log)."""


@dataclass(frozen=True)
class WrittenFile:
    """A data file a task wrote into a table's folder, as the driver's commit adds it."""

    path: str
    """Relative to the table's root, as the Delta log names it."""
    size: int
    partition_values: Mapping[str, str | None]
    rows: int
    stats: str
    """Delta's per-file statistics (JSON: ``numRecords``, ``minValues``, ``maxValues``,
    ``nullCount``)."""
    modified_ms: int

    def as_dict(self) -> dict[str, Any]:
        """The descriptor as a task gives it back, JSON-able (``of``'s inverse)."""
        return {
            "path": self.path,
            "size": self.size,
            "partition_values": dict(self.partition_values),
            "rows": self.rows,
            "stats": self.stats,
            "modified_ms": self.modified_ms,
        }

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> WrittenFile:
        return cls(**fields)

    def action(self) -> AddAction:
        """The Delta add action of this file."""
        return AddAction(
            self.path, self.size, dict(self.partition_values), self.modified_ms, True, self.stats
        )


def write_files(
    table_path: str, rows: pa.Table, partition_by: tuple[str, ...], batch_id: int
) -> list[WrittenFile]:
    """Write ``rows`` (in the table's schema, partition columns included) into the table at
    ``table_path`` as one new Parquet file per partition, for batch ``batch_id``; nothing
    is committed. Runs where the rows are (a Spark task), with no Delta log read."""
    if not rows.num_rows:
        return []
    filesystem, root = storage.filesystem(table_path)
    groups: list[tuple[tuple[tuple[str, str | None], ...], pa.Table]] = [((), rows)]
    for column in partition_by:
        groups = [
            ((*values, (column, _partition_value(value))), part.filter(_equal(part, column, value)))
            for values, part in groups
            for value in pc.unique(part.column(column)).to_pylist()
        ]
    written = []
    for partition, part in groups:
        folder = "/".join(f"{c}={NULL_FOLDER if v is None else v}" for c, v in partition)
        name = f"part-{batch_id:08d}-{uuid.uuid4()}.snappy.parquet"
        relative = f"{folder}/{name}" if folder else name
        data = part.drop_columns(list(partition_by))
        buffer = pa.BufferOutputStream()
        pq.write_table(data, buffer, compression="snappy")
        content = buffer.getvalue()
        filesystem.create_dir(f"{root}/{folder}" if folder else root, recursive=True)
        with filesystem.open_output_stream(f"{root}/{relative}") as out:
            out.write(content)
        written.append(
            WrittenFile(
                relative,
                content.size,
                dict(partition),
                data.num_rows,
                stats(data),
                int(time.time() * 1000),
            )
        )
    return written


class FileWriter:
    """A Spark ``mapInArrow`` function (it runs in the tasks): each task writes its rows into
    the table at ``table_path`` as one data file in ``schema`` (``write_files``, the table
    unpartitioned) and gives back the file's descriptor (``WrittenFile.as_dict``, JSON) as
    its one row, in column ``DESCRIBED``; a task without rows gives back nothing. A task
    holds its rows as Arrow while it writes them, as the Python tasks before it (a
    deduplication's verdicts, a keyed step's processor) hold theirs."""

    DESCRIBED = "file"

    def __init__(self, table_path: str, schema: pa.Schema, batch_id: int) -> None:
        self.table_path = table_path
        self.schema = schema
        self.batch_id = batch_id

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        given = [b for b in batches if b.num_rows]
        if not given:
            return
        rows = pa.Table.from_batches(given)
        written = write_files(self.table_path, rows.cast(self.schema), (), self.batch_id)
        described = [json.dumps(f.as_dict()) for f in written]
        yield pa.record_batch({self.DESCRIBED: pa.array(described, pa.string())})


def _partition_value(value: Any) -> str | None:
    """A partition column's value as the Delta log writes it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _equal(rows: pa.Table, column: str, value: Any) -> pa.ChunkedArray:
    """Which of ``rows`` hold ``value`` (None: null) in ``column``."""
    values = rows.column(column)
    return pc.is_null(values) if value is None else pc.equal(values, value)


def stats(data: pa.Table) -> str:
    """Delta's statistics of a data file holding ``data`` (partition columns left out).

    Min and max are kept for integer, floating, date, UTC timestamp and string
    columns (strings of at most ``STATS_STRING_CHARS``), null counts for every column
    but a struct, list or map; timestamps to the
    millisecond, as Delta keeps them: the min rounded down, the max up, so each
    stays a bound whatever a reader does with the lost microseconds.
    """
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for field in data.schema:
        values = data.column(field.name)
        kind = field.type
        if pa.types.is_nested(kind):  # Delta nests a struct's counts per field: none kept
            continue
        nulls[field.name] = values.null_count
        if values.null_count == len(values):
            continue
        if pa.types.is_timestamp(kind) and kind.tz is not None:
            micros = pc.cast(values, pa.timestamp("us", kind.tz), safe=False).cast(pa.int64())
            least, most = (v.as_py() for v in pc.min_max(micros).values())
            low[field.name], high[field.name] = _iso_ms(least // 1000), _iso_ms(-(-most // 1000))
            continue
        bounded = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_date(kind)
        if not (bounded or pa.types.is_string(kind)):
            continue
        least, most = (v.as_py() for v in pc.min_max(values).values())
        if pa.types.is_string(kind) and max(len(least), len(most)) > STATS_STRING_CHARS:
            continue
        if pa.types.is_floating(kind) and not (math.isfinite(least) and math.isfinite(most)):
            continue
        if pa.types.is_date(kind):
            least, most = least.isoformat(), most.isoformat()
        low[field.name], high[field.name] = least, most
    return json.dumps(
        {"numRecords": data.num_rows, "minValues": low, "maxValues": high, "nullCount": nulls}
    )


def _iso_ms(millis: int) -> str:
    """Epoch ``millis`` as Delta's statistics write a timestamp: ISO 8601, UTC, to the ms."""
    at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=millis)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
