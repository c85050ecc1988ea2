"""Append rows to a Delta table with Spark, in a JVM of this process's own with S3A and
lowmark's Delta log store for S3 (``lowmark.state.storage``, from the environment):

    python -m tests.faults.spark_append s3a://bucket/table 1 2 3
"""

from __future__ import annotations

import sys

from lowmark.state.session import get_spark


def main(table: str, values: list[int]) -> None:
    spark = get_spark()
    rows = spark.createDataFrame([(v,) for v in values], "x LONG")
    rows.write.format("delta").mode("append").save(table)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], [int(v) for v in sys.argv[2:]])
