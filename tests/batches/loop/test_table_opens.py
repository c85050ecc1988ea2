"""Delta tables a batch opens with delta-rs: a count, not a time, so it can be asserted on any
machine.

Opening a table reads its log from the last checkpoint (4-12 ms on a checkpoint table); a
handle kept from the batch before is brought up to date by listing the log and reading the
commits since (about 1 ms). So a batch opens only the tables another engine wrote since it
last looked (the Spark-written sink, once, for its version), whatever its number of
bookkeeping reads and writes, and brings a handle up to date only when a commit landed
after its version.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import deltalake
import pytest
from pyspark.sql import SparkSession

from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.windows import Tumbling
from tests.helpers import FakeClock, drop_batches, event, timed, windowed

OPENS_LIMIT = 1
"""The sink's version after Spark wrote it (Spark's commit moved the table under any handle)."""


@contextmanager
def counting_opens(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The path of every delta-rs table opened inside the block."""
    opened: list[str] = []
    original = deltalake.DeltaTable.__init__

    def counted(self: deltalake.DeltaTable, table_uri: Any, *args: Any, **kwargs: Any) -> None:
        opened.append(str(table_uri))
        original(self, table_uri, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(deltalake.DeltaTable, "__init__", counted)
        yield opened


@contextmanager
def counting_calls(monkeypatch: pytest.MonkeyPatch, method: str) -> Iterator[list[str]]:
    """The table of every call of ``deltalake.DeltaTable.<method>`` inside the block."""
    called: list[str] = []
    original = getattr(deltalake.DeltaTable, method)

    def counted(self: deltalake.DeltaTable, *args: Any, **kwargs: Any) -> Any:
        called.append(self.table_uri)
        return original(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(deltalake.DeltaTable, method, counted)
        yield called


@pytest.mark.parametrize(
    "p",
    [timed(), windowed(Tumbling(size="10 seconds"), max_out_of_orderness="5 seconds")],
    ids=["stateless", "tumbling"],
)
def test_a_batch_after_the_first_opens_no_table_it_opened_before_and_updates_only_handles_behind(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch, p: Pipeline
) -> None:
    """The third batch (the second is the first with window state to merge and windows to
    emit) opens at most the Spark-written sink. A commit of files written beside a table
    leaves its handle at the version before, and Spark moves the sink without one: those
    are the only handles it brings up to date."""
    drop_batches(
        data_root,
        [
            [event("a", 10 * i, 1), event("b", 10 * i + 2, 2), event("a", 10 * i + 9, 3)]
            for i in range(3)
        ],
    )
    runner = MicroBatchRunner(spark, p, data_root, FakeClock())
    runner.run_batch()
    runner.run_batch()
    with (
        counting_opens(monkeypatch) as opened,
        counting_calls(monkeypatch, "update_incremental") as updates,
        counting_calls(monkeypatch, "create_write_transaction") as commits,
    ):
        assert runner.run_batch() is not None
    print(f"{p.name}: {len(opened)} opens {opened}; {len(updates)} updates {updates}")
    assert len(opened) <= OPENS_LIMIT, opened
    assert len(commits) >= 3  # the offset log, the commit log, the progress row at least
    assert len(updates) <= len(commits) + OPENS_LIMIT, updates
