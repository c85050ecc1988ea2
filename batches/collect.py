"""Several small results of one batch, computed by ONE Spark job and brought to the driver.

A batch needs a handful of small things from its records at once: counts and
max event time per source partition, the bad and the late rows, the window
partials. Each as its own action would cost a job and re-run the plan;
``collect`` unions them into one frame (each part's columns renamed to
positional names, so parts of any shapes fit), runs it once as Arrow, and
splits the result back into one Arrow table per part.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructField, StructType

KIND = "_lowmark_part"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
PARTITION_BYTES = 64 * 1024 * 1024
"""Input bytes per shuffle partition (Spark's advisory partition size under adaptive execution)."""


def collect(parts: dict[str, DataFrame]) -> dict[str, pa.Table]:
    """Every frame of ``parts`` as an Arrow table (same names and columns), in one Spark job.

    The result is only as large as the parts: give it aggregates, bad and
    late rows and partial windows, never a batch's raw records.
    """
    if not parts:
        return {}
    tagged = [
        df.select(
            F.lit(name).alias(KIND),
            *[F.col(f"`{c}`").alias(_column(name, i)) for i, c in enumerate(df.columns)],
        )
        for name, df in parts.items()
    ]
    union = tagged[0]
    for df in tagged[1:]:
        union = union.unionByName(df, allowMissingColumns=True)
    result = union.toArrow()
    tables = {}
    for name, df in parts.items():
        rows = result.filter(pc.equal(result.column(KIND), name))
        columns = [rows.column(_column(name, i)) for i in range(len(df.columns))]
        tables[name] = pa.table(columns, names=df.columns)
    return tables


def empty_of(df: DataFrame) -> pa.Table:
    """The Arrow table ``collect`` would give for ``df`` over no input, without a job."""
    return arrow_schema(df.sparkSession, df.schema).empty_table()


def arrow_schema(spark: SparkSession, schema: StructType) -> pa.Schema:
    """The Arrow schema ``collect`` gives a frame of ``schema``: timestamps in UTC, strings
    large when the session asks Arrow for large variable-width types."""
    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes") == "true"
    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=large)


def observed(
    observation: Observation | tuple[Observation, ...], wait_s: float = 2.0
) -> dict[str, Any] | None:
    """The metrics ``observation`` took in the job that just ran over it, or None; of
    several observations (a union's reads), each metric added up, or None if one has none.

    Spark hands an observation its metrics from a listener shortly after the
    job ends, and never when the optimizer removed the observed node (a plan
    it proved empty, such as a transform ending in ``limit(0)``), where
    ``Observation.get`` would wait forever. So this waits at most ``wait_s``
    and a caller treats None as "count another way".
    """
    if isinstance(observation, tuple):
        each = [observed(o, wait_s) for o in observation]
        if any(m is None for m in each):
            return None
        summed: dict[str, Any] = {}
        for metrics in each:
            for key, value in (metrics or {}).items():
                summed[key] = summed.get(key, 0) + (value or 0)
        return summed or None
    if not hasattr(observation, "_jo"):  # Spark Connect's: filled in by the action's reply
        return observation.get or None
    jo: Any = observation._jo  # the JVM observation: its future can be polled
    if jo is None:
        return None
    future = jo.future()
    deadline = time.monotonic() + wait_s
    while not future.isCompleted():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.001)
    try:
        return observation.get or None
    except Py4JJavaError:  # completed with no metrics
        return None


def to_frame(spark: SparkSession, table: pa.Table, schema: StructType) -> DataFrame:
    """``table`` (from ``collect`` or a driver-side read) as a local Spark frame of ``schema``.

    Columns are taken by ``schema``'s names, so a state table read back with
    its columns in another order fits the frame it merges with.
    """
    loose = StructType([StructField(f.name, f.dataType, True) for f in schema.fields])
    if not table.num_rows:  # Spark cannot take an Arrow column of no chunks
        return spark.createDataFrame([], schema=loose)
    return spark.createDataFrame(table.select(schema.fieldNames()), schema=loose)


def frame_of(spark: SparkSession, table: pa.Table) -> DataFrame:
    """``table`` as a local Spark frame of its own schema (a local relation: no job)."""
    if not table.num_rows:  # Spark cannot take an Arrow column of no chunks
        return spark.createDataFrame([], schema=from_arrow_schema(table.schema))
    return spark.createDataFrame(table)


@contextmanager
def shuffle_partitions(spark: SparkSession, input_bytes: int | None) -> Iterator[None]:
    """Within the block, shuffles have one partition per ``PARTITION_BYTES`` of input.

    The session's ``spark.sql.shuffle.partitions`` stays the upper bound (and
    is used when the size is unknown). A small batch's job then runs one task
    per stage instead of one per configured partition, which is most of its
    time; a large batch keeps its parallelism. (What adaptive execution would
    do, without its extra job per stage.)
    """
    configured = spark.conf.get(SHUFFLE_PARTITIONS)
    if input_bytes is None or configured is None:
        yield
        return
    wanted = max(1, min(int(configured), -(-input_bytes // PARTITION_BYTES)))
    with session_confs(spark, {SHUFFLE_PARTITIONS: str(wanted)}):
        yield


@contextmanager
def session_confs(spark: SparkSession, confs: dict[str, str]) -> Iterator[None]:
    """Within the block, the session has ``confs``; afterwards, what it had (set or unset)."""
    before: dict[str, str | None] = {key: spark.conf.get(key, None) for key in confs}
    for key, value in confs.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


def _column(part: str, index: int) -> str:
    return f"_lowmark_{part}_{index}"
