"""``lowmark rebuild``: a change that needs a rebuild is recomputed from the recorded history
beside the live tables and swapped in, exactly once across kills
(lowmark.batches.admin.rebuild).

Every test starts from one live history, made once (``history``): the live pipeline
``OLD`` has run over three files, and a fresh run of ``NEW`` over the same files (and over
one more) says what a rebuild must write.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.rebuild import ShadowBatch, in_progress, rebuild
from lowmark.batches.admin.reset import reset
from lowmark.batches.errors import RebuildRefused, SinkHeldElsewhere
from lowmark.batches.evolution import DefinitionChanged
from lowmark.batches.loop.faults import REBUILD_STEPS, InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.maintenance import maintain_checkpoint
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, FileSource, Pipeline, PostgresSink
from lowmark.batches.windows import Tumbling
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.errors import CheckpointReplaced
from tests.helpers import (
    SCHEMA,
    T0,
    delta_frame,
    event,
    lowmark,
    reference_of,
    windowed,
    write_json_lines,
)

FILES = [
    [event("a", 1, 1), event("b", 4, 2)],
    [event("a", 12, 3), event("a", 18, 4)],
    [event("b", 25, 5), event("a", 31, 6)],
    [event("a", 47, 7), event("b", 52, 8)],
    [event("a", 75, 9)],
    [event("b", 98, 10)],
]
"""One file a batch; the live history takes the first four."""


NEW_SIZE = Tumbling(size="20 seconds")


def _windowed(size: Tumbling, inputs: Path) -> Pipeline:
    """``windowed`` over ``inputs``: the folder every copy of the live history reads (the
    file manifest names its files by their paths)."""
    p = windowed(size)
    return p.model_copy(update={"source": p.source.model_copy(update={"path": str(inputs)})})


def _run(spark: SparkSession, p: Pipeline, root: Path, batches: int | None = None) -> None:
    MicroBatchRunner(spark, p, root).run(max_batches=batches)


@dataclass(frozen=True)
class History:
    old: Pipeline
    new: Pipeline
    """``old`` with another window size: a change that needs a rebuild."""
    root: Path
    """A data root where ``old`` ran over ``FILES[:4]``: copy it, never change it."""
    live_last: int
    """The live's last committed batch."""
    before: list[Row]
    """What its sink holds."""
    fresh: list[Row]
    """What a fresh run of ``new`` writes over ``FILES[:4]`` with the live's batching."""
    files: list[Path]


def _closed(spark: SparkSession, files: list[Path], watermark_s: int) -> list[Row]:
    """The 20-second windows of ``files`` a watermark at ``watermark_s`` has closed (append
    mode writes each once, when closed), as one plain Spark batch computes them."""
    windows = reference_of(spark.read.schema(SCHEMA).json([str(f) for f in files]), NEW_SIZE)
    closed = windows.where(F.col("window_end") <= F.lit(T0 + timedelta(seconds=watermark_s)))
    return closed.collect()


@pytest.fixture(scope="module")
def history(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> History:
    inputs = tmp_path_factory.mktemp("inputs")
    files = [
        write_json_lines(inputs, f"b{i:03d}.json", rows, 1_700_000_000 + i)
        for i, rows in enumerate(FILES)
    ]
    old, new = _windowed(Tumbling(size="10 seconds"), inputs), _windowed(NEW_SIZE, inputs)
    root = tmp_path_factory.mktemp("live")
    _run(spark, old, root, 4)
    done = Checkpoint(old.checkpoint_location(root), "w").commits.get_latest()
    assert done is not None
    # Batch 3 runs with the watermark batch 2 leaves (its newest event, 31 s): the windows
    # ending by then are written.
    fresh = _closed(spark, files[:4], 31)
    before = delta_frame(spark, root / "out").collect()
    assert fresh and before and sorted(before) != sorted(fresh)
    return History(old, new, root, done.batch_id, before, fresh, files)


@pytest.fixture
def live(history: History, data_root: Path) -> Path:
    """A copy of the live history, for one test."""
    shutil.copytree(history.root, data_root, dirs_exist_ok=True)
    return data_root


def _sink(spark: SparkSession, root: Path) -> list[Row]:
    return sorted(delta_frame(spark, root / "out").collect())


def _writer(commit: dict[str, Any]) -> str:
    """The checkpoint a sink commit names as its writer (``lowmark.state.ownership``)."""
    return str(json.loads(commit["userMetadata"])["lowmark"]["app_id"]).split(":")[0]


def test_a_rebuild_while_the_live_pipeline_commits_swaps_in_a_fresh_runs_output_in_one_commit(
    spark: SparkSession, live: Path, history: History
) -> None:
    with pytest.raises(DefinitionChanged, match=r"with `lowmark rebuild w` \(beside"):
        MicroBatchRunner(spark, history.new, live).run_batch()
    still_running = MicroBatchRunner(spark, history.old, live)
    live_id = still_running.checkpoint.pipeline_id
    told: list[ShadowBatch] = []

    def live_commits_meanwhile(b: ShadowBatch) -> None:
        told.append(b)
        if b.shadow_batch == 0:
            assert still_running.run_batch() is not None  # the fifth file, batch 4

    done = rebuild(spark, history.new, live, live_commits_meanwhile)

    # Every live batch rebuilt once, the one committed meanwhile too (its watermark, the
    # newest event before it, 52 s, closes what it closes).
    assert done.nothing is None and done.last_batch == history.live_last + 1
    assert [b.live_batch for b in told] == list(range(history.live_last + 2))
    assertDataFrameEqual(delta_frame(spark, live / "out"), _closed(spark, history.files[:5], 52))
    # One commit replaced the old output, naming the checkpoint swapped in as its writer.
    swapped, written = DeltaTable(str(live / "out")).history(2)
    now = Checkpoint(history.new.checkpoint_location(live), "w").pipeline_id
    assert (_writer(swapped), _writer(written)) == (now, live_id)
    assert done.moved_to is not None and Checkpoint(done.moved_to, "w").pipeline_id == live_id
    assert not (live / "out.rebuild").exists() and in_progress(history.new, live) is None
    # The live runner, still on the checkpoint the swap moved aside, stops before writing;
    # runs go on under the new definition, from the checkpoint swapped in.
    with pytest.raises(CheckpointReplaced):
        still_running.run_batch()
    _run(spark, history.new, live)
    assertDataFrameEqual(delta_frame(spark, live / "out"), _closed(spark, history.files, 98))


KILLS = [
    KillPoint("rebuild_after_manifest", 0),
    KillPoint("after_offset_log", 1),
    KillPoint("after_sink", 2),
    KillPoint("after_commit", 3),
    KillPoint("swap_after_record", 3),
    KillPoint("swap_after_move", 3),
    KillPoint("swap_after_catch_up", 3),
    KillPoint("swap_after_sink", 3),
    KillPoint("swap_after_move_shadow", 3),
]
"""A step of each shadow batch, then every step of the swap (the shadow's last batch is 3)."""


def test_a_rebuild_killed_at_each_step_and_run_again_writes_what_an_unbroken_one_does(
    spark: SparkSession, live: Path, history: History
) -> None:
    assert history.live_last == 3 and set(REBUILD_STEPS) <= {p.step for p in KILLS}
    for point in KILLS:
        with crash_at(point), pytest.raises(InjectedCrash):
            rebuild(spark, history.new, live)
        # A reader sees the old table or the new one, at every step.
        assert _sink(spark, live) in (sorted(history.before), sorted(history.fresh)), point
        if point.step in ("swap_after_move", "swap_after_sink"):
            # A run while the shadow is not in place yet refuses before writing.
            with pytest.raises(SinkHeldElsewhere):
                MicroBatchRunner(spark, history.new, live).run_batch()
    assert rebuild(spark, history.new, live).nothing is None
    assertDataFrameEqual(delta_frame(spark, live / "out"), history.fresh)
    assert in_progress(history.new, live) is None
    assert rebuild(spark, history.new, live).nothing is not None
    # The checkpoint swapped in can be rebuilt in turn (here: back to the old windows).
    with crash_at(KillPoint("rebuild_after_manifest", 0)), pytest.raises(InjectedCrash):
        rebuild(spark, history.old, live)


def test_a_rebuild_after_maintenance_trimmed_the_offset_log_reads_the_boundaries_it_retired(
    spark: SparkSession, live: Path, history: History
) -> None:
    trimmed = history.old.model_copy(
        update={"maintenance": history.old.maintenance.model_copy(update={"log_batches": 1})}
    )
    offsets = Checkpoint(history.old.checkpoint_location(live), "w").offsets
    offsets.retire(2)  # a maintenance cut short after its retirement: batches 0-1 twice
    maintained = maintain_checkpoint(spark, trimmed, live)

    assert maintained is not None and maintained.first_kept == history.live_last
    assert [e.batch_id for e in offsets.get_range()] == [history.live_last]
    assert [e.batch_id for e in offsets.recorded(0, history.live_last)] == [0, 1, 2, 3]
    done = rebuild(spark, history.new, live)
    assert done.nothing is None and done.last_batch == history.live_last
    assertDataFrameEqual(delta_frame(spark, live / "out"), history.fresh)


def test_a_reset_while_a_rebuild_is_under_way_drops_its_shadow_at_the_next_rebuild(
    spark: SparkSession, live: Path, history: History
) -> None:
    with crash_at(KillPoint("after_commit", 0)), pytest.raises(InjectedCrash):
        rebuild(spark, history.new, live)
    under_way = in_progress(history.new, live)
    assert under_way is not None and (under_way.shadow_has, under_way.live_last) == (0, 3)
    assert "has the live's batch 0 of batch 3" in under_way.describe()

    reset(spark, history.old, live, "truncate")  # a new live checkpoint, no batch yet

    assert rebuild(spark, history.new, live).nothing is not None
    assert in_progress(history.new, live) is None
    assert list(live.glob("_lowmark/w.rebuild.dropped-*")) != []
    assert list(live.glob("out.rebuild.dropped-*")) != []


def test_a_rebuild_with_no_change_pending_does_nothing(
    spark: SparkSession, live: Path, history: History
) -> None:
    done = rebuild(spark, history.old, live)
    assert done.nothing is not None and "no change" in done.nothing
    assert not (live / "_lowmark" / "w.rebuild").exists()


def test_a_rebuild_of_a_postgres_sink_is_refused_naming_the_way_on(
    spark: SparkSession, data_root: Path
) -> None:
    p = windowed(NEW_SIZE).model_copy(update={"sink": PostgresSink(table="windows")})
    with pytest.raises(RebuildRefused, match=r"not a Delta table.*`lowmark reset w --truncate"):
        rebuild(spark, p, data_root)


def _plain(schema: str) -> Pipeline:
    """A stateless pipeline over ``in``, one file a batch."""
    source = FileSource(path="in", format="json", schema_ddl=schema, max_files_per_batch=1)
    fields: dict[str, Any] = {"name": "s", "source": source, "sink": DeltaSink(path="out")}
    return Pipeline(**fields)


def _notes(root: Path, count: int) -> None:
    for i in range(count):
        rows = [{"id": i, "note": "n"}]
        write_json_lines(root / "in", f"f{i}.json", rows, 1_700_000_000 + i)


def test_lowmark_rebuild_of_a_stateless_sink_without_a_removed_column_gives_it_the_new_schema(
    capsys: pytest.CaptureFixture[str], spark: SparkSession, data_root: Path
) -> None:
    _notes(data_root, 1)
    _run(spark, _plain("id LONG, note STRING"), data_root)
    source = {"path": "in", "format": "json", "schema_ddl": "id LONG", "max_files_per_batch": 1}
    defined = {"name": "s", "source": source, "sink": {"kind": "delta", "path": "out"}}
    pipelines = data_root / "pipelines.yaml"
    pipelines.write_text(yaml.safe_dump({"pipelines": [defined]}))  # a source column removed

    code, printed, _ = lowmark(capsys, data_root, "--pipelines", str(pipelines), "rebuild", "s")

    assert code == 0, printed
    assert "s: shadow batch 0 committed (live batch 0 of 0): 1 rows out" in printed
    assert "s: rebuilt through live batch 0 and swapped in (shadow batches run now: 1)" in printed
    assertDataFrameEqual(delta_frame(spark, data_root / "out"), [Row(id=0)])


def test_a_rebuild_is_refused_before_writing_when_the_source_lost_recorded_input(
    spark: SparkSession, data_root: Path
) -> None:
    _notes(data_root, 1)
    _run(spark, _plain("id LONG, note STRING"), data_root)
    (data_root / "in" / "f0.json").unlink()

    with pytest.raises(RebuildRefused, match=r"no longer holds .*/f0\.json"):
        rebuild(spark, _plain("id LONG"), data_root)
    assert not (data_root / "_lowmark" / "s.rebuild").exists()
