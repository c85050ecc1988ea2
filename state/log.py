"""A generic, append-only metadata log kept as a Delta table: one row per batch.

Modelled on Spark's ``HDFSMetadataLog``: ``add``, ``get``, ``get_latest`` and
``get_range`` over typed, versioned entries. Each row carries the entry's
``format_version``; a reader refuses rows from a newer format instead of
misreading them. ``add`` is idempotent per batch (a Delta txn keyed on the
pipeline and the log's role); ``claim`` also detects another runner's entry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar, Generic, TypeVar

from py4j.protocol import Py4JJavaError
from pydantic import BaseModel, ConfigDict, Field
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from state.delta import append_once, create_if_absent, table_exists
from state.errors import (
    CheckpointCorrupt,
    CheckpointMissing,
    ConcurrentRunner,
    UnsupportedLogFormat,
)

BASE_FIELDS = [
    StructField("batch_id", LongType(), False),
    StructField("format_version", IntegerType(), False),
    StructField("runner_id", StringType(), False),
    StructField("created_at", TimestampType(), False),
]


def utc_now() -> datetime:
    """Wall-clock now, timezone-aware UTC."""
    return datetime.now(UTC)


class LogEntry(BaseModel):
    """One batch's row. Subclasses add fields and list their Spark columns.

    ``COLUMNS`` are the subclass's own columns, after the base ones; fields
    named in ``JSON_FIELDS`` are stored as JSON text (maps of offsets etc.).
    """

    model_config = ConfigDict(frozen=True)

    FORMAT_VERSION: ClassVar[int] = 1
    COLUMNS: ClassVar[list[StructField]] = []
    JSON_FIELDS: ClassVar[frozenset[str]] = frozenset()

    batch_id: int = Field(ge=0)
    runner_id: str
    created_at: datetime = Field(default_factory=utc_now)

    @classmethod
    def spark_schema(cls) -> StructType:
        return StructType(BASE_FIELDS + cls.COLUMNS)

    def to_row(self) -> tuple[Any, ...]:
        values = self.model_dump()
        values["format_version"] = self.FORMAT_VERSION
        for name in self.JSON_FIELDS:
            values[name] = json.dumps(values[name], sort_keys=True)
        return tuple(values[f.name] for f in self.spark_schema().fields)

    @classmethod
    def from_row(cls, row: Row, path: str) -> LogEntry:
        values = row.asDict()
        if values["format_version"] > cls.FORMAT_VERSION:
            raise UnsupportedLogFormat(
                f"{path} batch {values['batch_id']} has format {values['format_version']}, "
                f"this lowmark reads up to {cls.FORMAT_VERSION}: upgrade lowmark"
            )
        for name in cls.JSON_FIELDS:
            values[name] = json.loads(values[name])
        values["created_at"] = values["created_at"].astimezone(UTC)
        return cls.model_validate(values)


E = TypeVar("E", bound=LogEntry)


class MetadataLog(Generic[E]):
    """An append-only Delta table of ``entry_type`` rows, one per batch id."""

    def __init__(
        self, spark: SparkSession, path: str, entry_type: type[E], txn_app_id: str
    ) -> None:
        self.spark = spark
        self.path = path
        self.entry_type = entry_type
        self.txn_app_id = txn_app_id

    def create(self) -> None:
        create_if_absent(self.spark, self.path, self.entry_type.spark_schema())

    def exists(self) -> bool:
        return table_exists(self.spark, self.path)

    def add(self, entry: E) -> None:
        """Append ``entry`` once per batch id: if an entry for its id already landed, no-op.

        Two runners committing the same id at the same moment get ConcurrentRunner.
        """
        df = self.spark.createDataFrame([entry.to_row()], self.entry_type.spark_schema())
        append_once(df, self.path, self.txn_app_id, entry.batch_id)

    def claim(self, entry: E) -> None:
        """``add`` ``entry``, then make sure the stored entry for its id is this runner's.

        Delta skips an append whose batch already landed, so without reading
        back, a runner whose entry lost to another runner's would go on as if
        it had written it. Raises ConcurrentRunner naming the owner instead.
        """
        self.add(entry)
        stored = self.get(entry.batch_id)
        if stored is None or stored.runner_id != entry.runner_id:
            owner = stored.runner_id if stored else "nobody"
            raise ConcurrentRunner(
                f"batch {entry.batch_id} in {self.path} belongs to runner {owner}, not "
                f"{entry.runner_id}: another `lowmark run` of this pipeline is active; stop one"
            )

    def get(self, batch_id: int) -> E | None:
        rows = self._read(lambda df: df.where(F.col("batch_id") == batch_id))
        return rows[0] if rows else None

    def get_latest(self) -> E | None:
        rows = self._read(lambda df: df.orderBy(F.col("batch_id").desc()).limit(1))
        return rows[0] if rows else None

    def get_range(self, start: int | None = None, end: int | None = None) -> list[E]:
        """Entries with ``start <= batch_id <= end`` (either bound open), in batch order."""

        def in_range(df: DataFrame) -> DataFrame:
            if start is not None:
                df = df.where(F.col("batch_id") >= start)
            if end is not None:
                df = df.where(F.col("batch_id") <= end)
            return df.orderBy("batch_id")

        return self._read(in_range)

    def _read(self, query: Callable[[DataFrame], DataFrame]) -> list[E]:
        """Entries ``query`` selects; CheckpointCorrupt when the table or a row is unreadable."""
        if not self.exists():
            raise CheckpointMissing(
                f"checkpoint table {self.path} is missing: restore it from backup or "
                "start a new checkpoint (see `lowmark run --help`)"
            )
        try:
            rows = query(self.spark.read.format("delta").load(self.path)).collect()
            return [self.entry_type.from_row(r, self.path) for r in rows]  # type: ignore[misc]
        except (Py4JJavaError, PySparkException, ValueError, TypeError) as exc:
            raise CheckpointCorrupt(
                f"checkpoint table {self.path} cannot be read ({_first_line(exc)}): restore it "
                "from backup, or move the checkpoint away to start over"
            ) from exc


def _first_line(exc: Exception) -> str:
    """The cause in one line: for a JVM error, its Java exception's message."""
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
