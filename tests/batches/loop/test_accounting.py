"""Property: every record read is accounted for, in every batch and in total.

Random batches of records, some malformed, some without event time, some at
extreme times (1900, 1970, year 9999, beyond ``max_future``), some the
transform drops, cut into files at random. Per batch the commit must say
``rows_in = bad + dropped + late + windowed``; in total, the records in closed
windows must be what the sink's counts add up to, those in open windows what
the state's row counts add up to, and ``rows_in`` the lines written. Each is
checked against the tables themselves, not against the engine's own sums.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.expectations import Quality
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import FileSource
from lowmark.batches.windows import Sliding, Tumbling
from tests.helpers import SPARK_EXAMPLES, FakeClock, delta_frame, windowed

TIMES = st.one_of(
    st.integers(0, 120).map(lambda s: f"2026-01-01T00:{s // 60:02d}:{s % 60:02d}Z"),
    st.sampled_from(["1900-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "9999-12-31T23:59:59Z"]),
    st.none(),
)
LINES = st.one_of(
    st.builds(
        lambda user, ts, amount: json.dumps(
            {"user": user, "amount": amount} | ({"ts": ts} if ts else {})
        ),
        st.sampled_from("abc"),
        TIMES,
        st.integers(0, 5),
    ),
    st.just("{not json"),
)


def drop_zero_amounts(records: DataFrame) -> DataFrame:
    """The transform: records of amount 0 are dropped."""
    return records.where(F.col("amount") != 0)


@settings(SPARK_EXAMPLES, max_examples=5)
@given(
    files=st.lists(st.lists(LINES, min_size=1, max_size=8), min_size=1, max_size=4),
    window=st.sampled_from(
        [Tumbling(size="10 seconds"), Sliding(size="20 seconds", slide="10 seconds")]
    ),
)
def test_every_record_read_is_bad_dropped_late_or_in_a_closed_or_open_window(
    spark: SparkSession, files: list[list[str]], window: Tumbling | Sliding
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "in").mkdir()
        for i, lines in enumerate(files):
            path = root / "in" / f"f{i:03d}.json"
            path.write_text("".join(line + "\n" for line in lines))
            os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
        base = windowed(window, max_future="1 hour")
        assert isinstance(base.source, FileSource)
        p = base.model_copy(
            update={
                "transform": drop_zero_amounts,
                # A file of bad lines only is a batch of bad rows only: accounted, not failed.
                "quality": Quality(max_bad_fraction=1.0),
                "source": FileSource(
                    path="in",
                    format="json",
                    schema_ddl=base.source.schema_ddl,
                    max_files_per_batch=1,
                ),
            }
        )
        runner = MicroBatchRunner(spark, p, root, clock=FakeClock())
        results = runner.run(max_batches=None)
        assert results
        commits = runner.checkpoint.commits.get_range()
        for c in commits:
            assert c.rows_in == c.rows_bad + c.rows_dropped + c.rows_late + c.rows_windowed, c
        totals = commits[-1].totals
        assert totals["rows_in"] == sum(len(lines) for lines in files)
        if isinstance(window, Tumbling):  # a sliding record is counted in several windows
            assert totals["rows_closed"] == _sum(spark, str(root / "out"), "count")
        open_rows = _sum(spark, runner.checkpoint.table("state_windows"), "_lowmark_rows")
        assert totals["rows_windowed"] - totals["rows_closed"] == open_rows
        accounting = pipeline_status(spark, p, root).accounting
        assert accounting["read"] == sum(v for k, v in accounting.items() if k != "read")


def _sum(spark: SparkSession, table: str, column: str) -> int:
    """Sum of ``column`` over the Delta table at ``table`` (0 if it was never written)."""
    if not (Path(table) / "_delta_log").exists():
        return 0
    row = delta_frame(spark, table).agg(F.sum(column)).first()
    return int((row[0] if row else None) or 0)
