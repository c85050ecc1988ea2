"""``python -m lowmark.state.smoke``: prove Spark + Delta work here (write, read back, time travel).

Run by ``make setup`` after the jars are fetched, so a missing jar fails the
set-up with a clear message instead of failing the first pipeline.
"""

from __future__ import annotations

import sys
import tempfile

from lowmark.state.errors import LowmarkError
from lowmark.state.session import get_spark


def main() -> int:
    try:
        spark = get_spark()
    except LowmarkError as exc:
        print(f"smoke check failed: {exc}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/smoke"
        spark.range(3).write.format("delta").save(path)
        spark.range(3, 5).write.format("delta").mode("append").save(path)
        now = spark.read.format("delta").load(path).count()
        then = spark.read.format("delta").option("versionAsOf", 0).load(path).count()
    spark.stop()
    if (now, then) != (5, 3):
        print(f"smoke check failed: read back {now} rows (v1) and {then} (v0)", file=sys.stderr)
        return 1
    print("smoke check: Delta write, read and time travel work")
    return 0


if __name__ == "__main__":
    sys.exit(main())
