"""Operator actions over every state table (``lowmark.state.state_table``).

A batch that died after its state writes and is then set aside (``lowmark
skip-batch``) must leave every state table as the batch before it left it: the
windows, the ids deduplication let through, a keyed step's state and timers, a
stream-stream join's held rows. Otherwise re-fed records are judged against the
set-aside batch's ids or state (dropped as duplicates, counted twice).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.admin.skip_batch import set_aside
from lowmark.batches.loop import faults
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.loop.parts import build_parts
from tests.faults.conftest import with_input
from tests.faults.scenarios import (
    PIPELINES,
    clock_of,
    dedup_tumbling,
    keyed_alerts,
    stream_joined,
)

pytestmark = [pytest.mark.slow]

SET_ASIDE = 3
"""The batch that dies after its state writes and is set aside."""


@pytest.mark.parametrize("name", [p.name for p in (dedup_tumbling, keyed_alerts, stream_joined)])
def test_skip_batch_puts_every_state_table_back_as_the_batch_before_left_it(
    spark: SparkSession, tmp_path: Path, request: pytest.FixtureRequest, name: str
) -> None:
    root = tmp_path / "run"
    root.mkdir()
    pipeline = with_input(PIPELINES[name], tmp_path, request)
    clock = clock_of(pipeline)
    crash = faults.KillPoint("after_state", SET_ASIDE)
    with pytest.raises(faults.InjectedCrash), faults.crash_at(crash):
        MicroBatchRunner(spark, pipeline, root, clock).run(max_batches=None)

    parts = build_parts(spark, pipeline, root, clock)
    before = parts.checkpoint.commits.get(SET_ASIDE - 1)
    assert before is not None
    tables = parts.work.steps.tables
    assert tables, f"{name} has state tables"
    changed = [t.role for t in tables if t.version_after() != t.recorded(before.table_versions)]
    assert changed, "the dead batch changed some state table"

    done = set_aside(spark, pipeline, root, SET_ASIDE, "test", clock)

    assert set(done.restored) >= set(changed)
    for table in tables:
        as_before = table.table.read(None, table.recorded(before.table_versions))
        now = table.table.read()
        assert sorted(map(str, now.to_pylist())) == sorted(map(str, as_before.to_pylist())), (
            f"{table.role} of {name} is not as batch {SET_ASIDE - 1} left it"
        )
    committed = parts.checkpoint.commits.get(SET_ASIDE)
    assert committed is not None
    assert committed.next_timer_ms == before.next_timer_ms
    # The pipeline goes on from there: the next batch reads the tables as put back (the
    # batches after it read what it wrote, as in any run).
    [next_batch] = MicroBatchRunner(spark, pipeline, root, clock).run(max_batches=1)
    assert next_batch.batch_id == SET_ASIDE + 1
