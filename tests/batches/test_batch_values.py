"""Values kept out of Spark's generated code are the values given, of the type given."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lowmark.batches.batch_values import batch_long, batch_timestamp

MICROS = 1_767_225_600_123_457
"""2026-01-01T00:00:00.123457Z."""


def test_a_batch_long_and_a_batch_timestamp_hold_their_value_in_any_session_time_zone(
    spark: SparkSession,
) -> None:
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        frame = spark.range(3).select(
            (F.col("id") + batch_long(2**40)).alias("n"),
            F.unix_micros(batch_timestamp(MICROS)).alias("micros"),
            (F.col("id") < batch_long(1)).alias("first"),
        )
        rows = frame.collect()
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone or "UTC")
    assert dict(frame.dtypes) == {"n": "bigint", "micros": "bigint", "first": "boolean"}
    assert [(r.n, r.micros, r.first) for r in rows] == [
        (2**40 + i, MICROS, i == 0) for i in range(3)
    ]
