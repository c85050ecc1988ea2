"""The bad-records table: input rows that could not be parsed, kept verbatim.

A malformed row never stops a batch and is never dropped silently: it lands
here with the raw text, the file it came from and the reason. Written through
``state.delta.BatchAppendTable`` (once per batch).
"""

from __future__ import annotations

from pyspark.sql.types import LongType, StringType, StructField, StructType

SCHEMA = StructType(
    [
        StructField("batch_id", LongType(), False),
        StructField("source_file", StringType(), True),
        StructField("raw", StringType(), True),
        StructField("reason", StringType(), False),
    ]
)
