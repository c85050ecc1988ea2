"""``lowmark rebuild``: a change that needs a rebuild is recomputed from the recorded history
beside the live tables and swapped in, exactly once across kills
(lowmark.batches.admin.rebuild)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.rebuild import rebuild
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, Pipeline
from lowmark.batches.windows import Tumbling
from lowmark.state.checkpoint import Checkpoint
from tests.helpers import delta_frame, event, windowed, write_json_lines

OLD = windowed(Tumbling(size="10 seconds"))
NEW = windowed(Tumbling(size="20 seconds"))  # window size: a rebuild change

FILES = [
    [event("a", 1, 1), event("b", 4, 2)],
    [event("a", 12, 3), event("a", 18, 4)],
    [event("b", 25, 5), event("a", 31, 6)],
    [event("a", 47, 7), event("b", 52, 8)],
    [event("a", 75, 9)],
]


def _drop(root: Path, index: int) -> None:
    write_json_lines(root / "in", f"b{index:03d}.json", FILES[index], 1_700_000_000 + index)


def _run(spark: SparkSession, p: Pipeline, root: Path) -> None:
    MicroBatchRunner(spark, p, root).run(max_batches=None)


def _fresh(p: Pipeline) -> Pipeline:
    """``p`` on a checkpoint and sink of its own: a fresh run over the same input."""
    fields: dict[str, Any] = {"checkpoint": "_lowmark/fresh", "sink": DeltaSink(path="fresh")}
    return p.model_copy(update=fields)


def test_a_rebuilt_sink_equals_a_fresh_run_of_the_new_definition_and_runs_go_on_under_it(
    spark: SparkSession, data_root: Path
) -> None:
    for i in range(3):
        _drop(data_root, i)
    _run(spark, OLD, data_root)
    live = Checkpoint(OLD.checkpoint_location(data_root), "w")
    last = live.commits.get_latest()
    assert last is not None

    done = rebuild(spark, NEW, data_root)

    assert done.nothing is None and done.last_batch == last.batch_id
    assert done.moved_to is not None and Checkpoint(done.moved_to, "w").pipeline_id == live.pipeline_id
    _run(spark, _fresh(NEW), data_root)
    assertDataFrameEqual(delta_frame(spark, data_root / "out"), delta_frame(spark, data_root / "fresh"))
    # The pipeline goes on under the new definition, from the shadow's checkpoint.
    for i in (3, 4):
        _drop(data_root, i)
    _run(spark, NEW, data_root)
    _run(spark, _fresh(NEW), data_root)
    assertDataFrameEqual(delta_frame(spark, data_root / "out"), delta_frame(spark, data_root / "fresh"))
    assert not (data_root / "out.rebuild").exists()
