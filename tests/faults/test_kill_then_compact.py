"""The kill matrix with checkpoint maintenance between a kill and its replay.

`lowmark run` of sessions in update mode, and of a stream-stream join, is
SIGKILLed at a few steps of batch ``KILL_BATCH`` (before its state write, after
it, and after every write but the commit); an hour later (log files past their
retention, removed data files past maintenance's), `lowmark compact` runs, and
only then the replay. The tables must equal the fault-free run's: the replay
reads the window state, or the join's held rows, as of the version the last
commit recorded, which the compaction must have kept readable (the join's
killed batch deleted the slots the watermark passed: maintenance may vacuum
their files only once no recorded version needs them).
"""

from __future__ import annotations

import shutil

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.loop.faults import KillPoint
from tests.faults.conftest import KILL_BATCH, References
from tests.faults.harness import (
    KILLED,
    Snapshot,
    an_hour_passes,
    differences,
    kill_run,
    lowmark_compact,
    run_to_completion,
    snapshot,
)
from tests.faults.scenarios import session_update, stream_joined

pytestmark = [pytest.mark.slow, pytest.mark.integration]
"""All in `make test-integration`: `make test` compacts between a kill after the state write
and its replay in the fault matrix's slice (``tumbling-delta-compact-after_state``, the same
maintenance of the same state table, after an in-process crash; `lowmark compact` itself is
``tests/batches/cli/test_commands.py``'s)."""

STEPS = ("after_offset_log", "after_state", "before_commit")
COMPACTED_AT = [
    pytest.param(step, p.name, id=f"{step}-{p.name}")
    for p in (session_update, stream_joined)
    for step in STEPS
]


CHANGED_BY_MAINTENANCE = ("commits", "state_windows history", "join_state history")
"""What a compaction rightly changes: its OPTIMIZE commits are versions of the state table,
so the state versions the commits record move too. Every row of every table stays."""


def _rows(tables: Snapshot) -> Snapshot:
    return {name: rows for name, rows in tables.items() if name not in CHANGED_BY_MAINTENANCE}


@pytest.mark.parametrize(("step", "name"), COMPACTED_AT)
def test_a_checkpoint_compacted_between_a_kill_and_its_replay_ends_like_a_run_never_killed(
    spark: SparkSession,
    references: References,
    monkeypatch: pytest.MonkeyPatch,
    step: str,
    name: str,
) -> None:
    ref = references[name]
    root = ref.folder / f"compacted_{step}"
    shutil.copytree(ref.folder / "template", root)
    killed = kill_run(root, ref.pipeline, KillPoint(step, KILL_BATCH), jvm=spark)
    assert killed.returncode == KILLED, killed.stderr[-3000:]

    an_hour_passes(ref.pipeline.checkpoint_location(root), monkeypatch)
    lowmark_compact(root, ref.pipeline)
    results = run_to_completion(spark, ref.pipeline, root)

    assert [r.batch_id for r in results if r.replay] == [KILL_BATCH]
    found = differences(_rows(ref.tables), _rows(snapshot(ref.pipeline, root)))
    assert found == []
