"""Property: final results depend neither on how input was cut into batches nor
on arrival order within the out-of-orderness bound."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.windows import Session, Sliding, Tumbling
from tests.helpers import SPARK_EXAMPLES, drop_batches, event, reference, sink, windowed

BOUND_S = 5

events = st.lists(
    st.tuples(st.sampled_from("abc"), st.integers(0, 60), st.integers(0, 9), st.integers(0, 4)),
    min_size=1,
    max_size=25,
)


@settings(SPARK_EXAMPLES, max_examples=6)
@given(
    rows=events,
    cuts=st.lists(st.integers(1, 24), max_size=3, unique=True),
    window=st.sampled_from(
        [
            Tumbling(size="10 seconds"),
            Sliding(size="10 seconds", slide="5 seconds"),
            Session(gap="7 seconds"),
        ]
    ),
)
def test_update_mode_results_do_not_depend_on_batching_or_bounded_disorder(
    spark: SparkSession,
    rows: list[tuple[str, int, int, int]],
    cuts: list[int],
    window: Tumbling | Sliding | Session,
) -> None:
    # Arrival order: event time plus a jitter below the bound, so no record is
    # ever more than BOUND_S behind the newest one seen before it.
    arrival = sorted(rows, key=lambda r: (r[1] + r[3], r))
    bounds = [0, *sorted(c for c in cuts if c < len(arrival)), len(arrival)]
    batches = [
        [event(u, s, a) for u, s, a, _ in arrival[lo:hi]]
        for lo, hi in itertools.pairwise(bounds)
        if hi > lo
    ]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        drop_batches(root, batches)
        pipeline = windowed(window, mode="update", max_out_of_orderness=f"{BOUND_S} seconds")
        results = MicroBatchRunner(spark, pipeline, root).run(max_batches=None)
        assert sum(r.rows_late for r in results) == 0
        assertDataFrameEqual(sink(spark, root), reference(spark, root, window))
