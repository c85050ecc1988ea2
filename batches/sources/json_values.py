"""JSON text values parsed into records, with the ones that do not parse as bad records.

Shared by sources whose records arrive as JSON text (Kafka values, a user's
outbox table): every value is parsed with the source schema in PERMISSIVE
mode; a value that does not parse, does not match the schema or is missing
becomes a bad record with its text, where it came from and the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lowmark.batches.batch_values import batch_long
from lowmark.batches.records import INGESTED_COLUMN
from lowmark.batches.sources.base import PARTITION_COLUMN, SourceRead, read_counts
from lowmark.state.errors import LowmarkError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

CORRUPT = "_corrupt_record"


def parse_json_values(
    values: DataFrame,
    schema_ddl: str,
    batch_id: int,
    origin: Column,
    cache: bool = False,
    explain: Callable[[Exception], LowmarkError | None] = lambda _: None,
) -> SourceRead:
    """A read of ``values``: a ``value`` column (JSON text, or null) and ``PARTITION_COLUMN``
    (and ``INGESTED_COLUMN`` when the source adds it: the records carry it on).

    ``origin`` names where each value came from (``bad_records.source_file``,
    e.g. ``topic:0@12``). ``cache`` persists the parse for a batch that runs
    several jobs over it.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType.fromDDL(schema_ddl)
    assert isinstance(schema, StructType), "a schema DDL is a struct"
    with_corrupt = StructType([*schema.fields, StructField(CORRUPT, StringType(), True)])
    text = F.col("value").cast("string")
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    carried = [c for c in (PARTITION_COLUMN, INGESTED_COLUMN) if c in values.columns]
    parsed = values.select(
        F.from_json(text, with_corrupt, options).alias("r"),
        text.alias("_raw"),
        *carried,
        origin.alias("_origin"),
    )
    good = F.col("_raw").isNotNull() & F.col(f"r.{CORRUPT}").isNull()
    counts = Observation()
    parsed = parsed.withColumn("_good", good)
    if cache:
        parsed = parsed.persist()
    observed = parsed.observe(counts, *read_counts(False, good))
    # The bad rows come from the parse unobserved: a job that reads them beside the records
    # (a stateless batch's one job) may compute a cached parse twice, in two tasks on two
    # executors, and must count it once.
    bad = parsed.where(~F.col("_good")).select(
        batch_long(batch_id).alias("batch_id"),
        F.col("_origin").alias("source_file"),
        F.col("_raw").alias("raw"),
        F.when(F.col("_raw").isNull(), F.lit("a record with no value"))
        .otherwise(F.lit("malformed JSON or not matching the source schema"))
        .alias("reason"),
    )
    records = observed.where(F.col("_good")).select(
        *[F.col(f"r.`{n}`").alias(n) for n in schema.fieldNames()], *carried
    )
    return SourceRead(records, bad, counts, (parsed,) if cache else (), explain)
