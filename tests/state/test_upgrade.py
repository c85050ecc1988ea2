"""Upgrading lowmark: a checkpoint an older lowmark wrote goes on under this one, and one of a
newer format is refused.

The older checkpoints are ``tests/data/upgrade_checkpoints.tar.gz``, which
``tests/data/make_upgrade_checkpoints.py`` made with an older commit (tests/data/README.md): its
two pipelines, each with batches 0 and 1 committed and batch 2 planned but never run.
"""

from __future__ import annotations

import fcntl
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.skip_batch import set_aside
from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.event_time.watermarks import IngestionLags
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.state.checkpoint import ID_FILE, Checkpoint
from lowmark.state.errors import (
    ReplayRuleChanged,
    UnsupportedCheckpointFormat,
    UnsupportedLogFormat,
)
from lowmark.state.log import FORMAT_VERSION
from lowmark.state.offset_log import OffsetEntry, OffsetLog
from tests.data.make_upgrade_checkpoints import PIPELINES, ROOT, WINDOW
from tests.helpers import drop_batches, entry, event, reference, sink

ARCHIVE = Path(__file__).parents[1] / "data" / "upgrade_checkpoints.tar.gz"


@pytest.fixture
def older_root() -> Iterator[Path]:
    """The archive's data root, unpacked where it was made: one place per machine, so a test of
    another checkout that wants it waits for this one."""
    with open(f"{ROOT}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(ROOT, ignore_errors=True)
        with tarfile.open(ARCHIVE) as tar:
            tar.extractall(ROOT.parent, filter="data")
        yield ROOT
        shutil.rmtree(ROOT, ignore_errors=True)


def files_of(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``, by path: its size and modification time (ns)."""
    return {
        str(f.relative_to(root)): (f.stat().st_size, f.stat().st_mtime_ns)
        for f in root.rglob("*")
        if f.is_file()
    }


def test_a_checkpoint_an_older_lowmark_left_with_a_planned_batch_ends_as_a_plain_batch_job(
    spark: SparkSession, older_root: Path
) -> None:
    # Batch 2 replayed as planned, then batch 3 takes the last file (in update mode the sink
    # then holds every window).
    results = MicroBatchRunner(spark, PIPELINES["w"], older_root).run(max_batches=2)

    assert [(r.batch_id, r.replay) for r in results] == [(2, True), (3, False)]
    assertDataFrameEqual(sink(spark, older_root), reference(spark, older_root, WINDOW))
    checkpoint = Checkpoint(str(older_root / "_lowmark" / "w"), "w")
    rules = [e.late_rule for e in checkpoint.offsets.get_range()]
    assert rules == ["batch_clock", "batch_clock", "batch_clock", "own_horizon"]
    assert checkpoint.late.read().num_rows == 0

    # The lowmark that made the archive reads format 1 (``LogEntry.from_row``): it still reads
    # the rows it wrote, and refuses batch 3's, whose late rule it does not know, in one line.
    class FormatOneEntry(OffsetEntry):
        FORMAT_VERSION = 1

    path = str(older_root / "_lowmark" / "w" / "offsets")
    format_one = OffsetLog(path, FormatOneEntry, "older lowmark")
    assert [format_one.get(batch) is not None for batch in (0, 1, 2)] == [True] * 3
    with pytest.raises(UnsupportedLogFormat) as refused:
        format_one.get(3)
    assert str(refused.value) == (
        f"{path} batch 3 has format {FORMAT_VERSION}, this lowmark reads up to 1: upgrade lowmark"
    )


def test_a_batch_an_older_lowmark_planned_by_its_batch_clock_is_not_replayed_by_the_records_own(
    spark: SparkSession, older_root: Path
) -> None:
    before = files_of(older_root)

    # What `lowmark status` shows and the sensor's tick skips with.
    assert (pipeline_status(spark, PIPELINES["wi"], older_root).blocked or "").startswith(
        "batch 2 of wi was planned by an older lowmark"
    )
    with pytest.raises(ReplayRuleChanged) as refused:
        MicroBatchRunner(spark, PIPELINES["wi"], older_root).run(max_batches=None)

    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("batch 2 of wi was planned by an older lowmark")
    assert "finish that batch with the lowmark that planned it, then upgrade" in message
    assert message.endswith("or set its input aside with `lowmark skip-batch wi 2 --reason ...`")
    # No table changed; the runner's first fence wrote the file that repeats the checkpoint's
    # id (``checkpoint.ID_FILE``), as any runner's does.
    after = files_of(older_root)
    assert after.pop(f"_lowmark/wi/{ID_FILE}")
    assert after == before

    # The way on that needs no older lowmark: its input set aside, the next batches run.
    set_aside(spark, PIPELINES["wi"], older_root, 2, "planned before the upgrade")
    results = MicroBatchRunner(spark, PIPELINES["wi"], older_root).run(max_batches=None)
    assert results and results[0].batch_id == 3


def test_a_checkpoint_of_a_newer_format_is_refused_in_one_line_and_nothing_is_written(
    spark: SparkSession, data_root: Path
) -> None:
    drop_batches(data_root, [[event("a", 1, 1)]])
    location = str(data_root / "_lowmark" / "w")
    metadata = Checkpoint(location, "w").metadata
    [row] = metadata.read().to_pylist()
    assert row["format_version"] == FORMAT_VERSION
    newer = {"pipeline_id": row["pipeline_id"], "format_version": FORMAT_VERSION + 1}
    schema = pa.schema([("pipeline_id", pa.string()), ("format_version", pa.int32())])
    metadata.update(pa.Table.from_pylist([newer], schema=schema), "pipeline_id", 0)
    before = files_of(data_root)

    with pytest.raises(UnsupportedCheckpointFormat) as refused:
        MicroBatchRunner(spark, PIPELINES["w"], data_root).run(max_batches=None)

    assert str(refused.value) == (
        f"checkpoint {location} has format {FORMAT_VERSION + 1}, this lowmark reads up to "
        f"{FORMAT_VERSION}: upgrade lowmark to a release that reads format {FORMAT_VERSION + 1}"
    )
    assert files_of(data_root) == before


@pytest.mark.parametrize(
    ("by_prefix", "deduplicates", "refused"),
    [({}, False, False), ({}, True, True), ({"": 5_000}, False, True)],
    ids=["event time", "event time, dedup", "ingestion time"],
)
def test_a_batch_planned_under_the_windows_own_clock_rule_is_replayed_unless_ids_or_clocks_judge(
    by_prefix: dict[str, int], deduplicates: bool, refused: bool
) -> None:
    """``own_clock`` judged deduplication by the batch's clock and an id's copies in event-time
    order: a replay of a deduplicating batch or one under an ingestion clock may contradict
    what its first attempt wrote; windows alone under event time judge alike."""
    planned = entry(3).model_copy(update={"late_rule": "own_clock"})
    said = IngestionLags(by_prefix).replay_refusal(planned, "p", deduplicates)
    assert (said is not None) == refused
    if said is not None:
        assert "own_clock rule, this one by own_horizon" in said and "skip-batch p 3" in said
