"""The late table (default dead-letter): records that came after their windows closed.

Nothing is dropped silently: each late record lands here with its event
time, the watermark that rejected it, the reason and the batch. Written
through ``state.delta.BatchAppendTable`` (once per batch).
"""

from __future__ import annotations

from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

SCHEMA = StructType(
    [
        StructField("batch_id", LongType(), False),
        StructField("event_time", TimestampType(), True),
        StructField("watermark_ms", LongType(), False),
        StructField("reason", StringType(), False),
        StructField("record", StringType(), False),
    ]
)
