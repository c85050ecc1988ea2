"""A running pipeline's definition changed: compatible changes take effect at the next new
batch, recorded in its offset-log entry; the others are refused naming their class
(lowmark.batches.evolution, and the planner that applies it)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from functools import reduce
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.skip_batch import set_aside
from lowmark.batches.evolution import ChangeClass, DefinitionChanged
from lowmark.batches.expectations import Expectation
from lowmark.batches.loop.backfill import backfill_partition
from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, EventTimePartitions, FileSource, Pipeline
from lowmark.batches.sql import SqlStep
from lowmark.batches.windows import Aggregate, Tumbling
from lowmark.state.checkpoint import Checkpoint
from tests.helpers import (
    SCHEMA,
    T0,
    delta_frame,
    drop_batches,
    event,
    lowmark,
    per_window,
    windowed,
    write_json_lines,
)

OLD_SCHEMA = "id LONG, amount INT"


def _pipeline(schema: str = OLD_SCHEMA, **fields: Any) -> Pipeline:
    source = FileSource(path="in", format="json", schema_ddl=schema, max_files_per_batch=1)
    return Pipeline(name="e", source=source, sink=DeltaSink(path="out"), **fields)


def _drop(root: Path, index: int) -> Path:
    """File ``index``: ids index*10 .. index*10+2, amounts 0..2, a ``note`` field."""
    rows = [{"id": index * 10 + i, "amount": i, "note": f"n{i}"} for i in range(3)]
    return write_json_lines(root / "in", f"f{index}.json", rows, 1_700_000_000 + index)


def _drop_events(root: Path, index: int, events: list[dict[str, Any]]) -> Path:
    return write_json_lines(root / "in", f"b{index}.json", events, 1_700_000_000 + index)


def _read(spark: SparkSession, schema: str, file: Path) -> DataFrame:
    return spark.read.schema(schema).json(str(file))


def _plain(spark: SparkSession, file: Path) -> DataFrame:
    return _read(spark, OLD_SCHEMA, file)


WITH_NOTE = f"{OLD_SCHEMA}, note STRING"
TENFOLD = SqlStep(sql="SELECT id, amount * 10 AS amount, note FROM input")
SMALL = Expectation(name="small", condition="amount < 20", on_violation="drop")
COPY = {"copy": DeltaSink(path="copy")}

CHAIN = [
    # Each definition is the one before with one compatible change more.
    _pipeline(),
    _pipeline(schema=WITH_NOTE),  # a nullable source column added
    _pipeline(schema=WITH_NOTE, transform=TENFOLD),  # a SQL step added
    _pipeline(schema=WITH_NOTE, transform=TENFOLD, expectations=[SMALL]),  # a drop expectation
    _pipeline(schema=WITH_NOTE, transform=TENFOLD, expectations=[SMALL], extra_sinks=COPY),
]


def _computed(spark: SparkSession, step: int, file: Path) -> DataFrame:
    """What definition ``CHAIN[step]`` computes from ``file``, by plain Spark."""
    if step == 0:
        return _plain(spark, file).selectExpr("*", "CAST(NULL AS STRING) AS note")
    rows = _read(spark, WITH_NOTE, file)
    if step >= 2:
        rows = rows.selectExpr("id", "amount * 10 AS amount", "note")
    return rows.where("amount < 20") if step >= 3 else rows


def test_each_compatible_change_takes_effect_at_the_next_batch_and_is_recorded_there(
    spark: SparkSession, data_root: Path
) -> None:
    files = []
    for step, defined in enumerate(CHAIN):
        files.append(_drop(data_root, step))
        done = MicroBatchRunner(spark, defined, data_root).run_batch()
        assert done is not None and (done.batch_id, done.replay) == (step, False)

    # The sink is each definition's output over the file of the batch it ran, in turn: a
    # new column null before its boundary; the extra sink holds the batches from its own.
    expected = [_computed(spark, step, file) for step, file in enumerate(files)]
    assertDataFrameEqual(delta_frame(spark, data_root / "out"), reduce(DataFrame.union, expected))
    assertDataFrameEqual(delta_frame(spark, data_root / "copy"), expected[-1])
    # The offset log says which definition each batch ran under.
    offsets = Checkpoint(CHAIN[0].checkpoint_location(data_root), "e").offsets
    recorded = [entry.pipeline_definition for entry in offsets.get_range()]
    assert recorded == [defined.definition() for defined in CHAIN]


def test_a_change_that_needs_a_rebuild_is_refused_naming_its_class_and_the_way_on(
    spark: SparkSession, data_root: Path
) -> None:
    _drop(data_root, 0)
    MicroBatchRunner(spark, _pipeline(schema="id LONG, amount LONG"), data_root).run_batch()
    _drop(data_root, 1)
    narrowed = _pipeline(schema="id LONG, amount INT", transform=SqlStep(sql="SELECT * FROM input"))
    with pytest.raises(DefinitionChanged) as refused:
        MicroBatchRunner(spark, narrowed, data_root).run_batch()
    message = str(refused.value)
    assert "\n" not in message
    assert 'source.schema_ddl.amount: "bigint" -> "int" (rebuild: ' in message
    assert message.endswith("`lowmark reset e --truncate-sink`")
    # Every change is classified, the compatible one too, but only the rebuild blocks.
    classes = {c.field: c.change_class for c in refused.value.changes}
    assert classes == {
        "source.schema_ddl.amount": ChangeClass.REBUILD,
        "transform": ChangeClass.COMPATIBLE,
    }


def test_a_kill_after_the_change_replays_its_batch_once_under_the_new_definition(
    spark: SparkSession, data_root: Path
) -> None:
    old = _pipeline()
    new = _pipeline(transform=SqlStep(sql="SELECT id, amount * 10 AS amount FROM input"))
    before = _drop(data_root, 0)
    MicroBatchRunner(spark, old, data_root).run_batch()
    after = _drop(data_root, 1)
    with pytest.raises(InjectedCrash), crash_at(KillPoint("after_sink", 1)):
        MicroBatchRunner(spark, new, data_root).run_batch()
    done = MicroBatchRunner(spark, new, data_root).run_batch()
    assert done is not None and (done.batch_id, done.replay) == (1, True)
    assert MicroBatchRunner(spark, new, data_root).run_batch() is None

    expected = _plain(spark, before).unionByName(
        _plain(spark, after).selectExpr("id", "amount * 10 AS amount")
    )
    assertDataFrameEqual(delta_frame(spark, data_root / "out"), expected)


def test_a_batch_planned_before_the_change_is_not_replayed_under_it(
    spark: SparkSession, data_root: Path
) -> None:
    old = _pipeline()
    new = _pipeline(transform=SqlStep(sql="SELECT id, amount * 10 AS amount FROM input"))
    _drop(data_root, 0)
    MicroBatchRunner(spark, old, data_root).run_batch()
    _drop(data_root, 1)
    with pytest.raises(InjectedCrash), crash_at(KillPoint("after_sink", 1)):
        MicroBatchRunner(spark, old, data_root).run_batch()
    with pytest.raises(DefinitionChanged) as refused:
        MicroBatchRunner(spark, new, data_root).run_batch()
    message = str(refused.value)
    assert "\n" not in message
    assert "uncommitted batch 1 was planned under the definition before these changes" in message
    assert "restore the old definition and run once to finish batch 1" in message

    # Finished under the old definition, the change takes effect from batch 2.
    done = MicroBatchRunner(spark, old, data_root).run_batch()
    assert done is not None and (done.batch_id, done.replay) == (1, True)
    _drop(data_root, 2)
    done = MicroBatchRunner(spark, new, data_root).run_batch()
    assert done is not None and (done.batch_id, done.replay) == (2, False)
    amounts = sorted(r["amount"] for r in delta_frame(spark, data_root / "out").collect())
    assert amounts == [0, 0, 0, 1, 1, 2, 2, 10, 20]


def test_a_backfill_under_a_definition_that_needs_a_rebuild_is_refused(
    spark: SparkSession, data_root: Path
) -> None:
    window = Tumbling(size="10 seconds")
    partitions = {"backfill": EventTimePartitions(granularity="hourly", start="2026-01-01")}
    drop_batches(data_root, [[event("a", 1, 1)]])
    MicroBatchRunner(spark, windowed(window).model_copy(update=partitions), data_root).run_batch()
    wider = windowed(Tumbling(size="20 seconds")).model_copy(update=partitions)
    with pytest.raises(
        DefinitionChanged, match=r"aggregation\.window\.size: 10000 -> 20000 \(rebuild"
    ):
        backfill_partition(spark, wider, data_root, T0, T0 + timedelta(hours=1), force=True)


def test_a_widened_source_column_takes_effect_at_the_next_batch_of_a_windowed_pipeline(
    spark: SparkSession, data_root: Path
) -> None:
    window = Tumbling(size="10 seconds")
    count_and_sum = (Aggregate(fn="count"), Aggregate(fn="sum", column="amount"))
    old = windowed(window, aggregates=count_and_sum, schema="user STRING, ts TIMESTAMP, amount INT")
    new = windowed(window, aggregates=count_and_sum)  # amount LONG
    before = _drop_events(data_root, 0, [event("a", 1, 1), event("b", 5, 2)])
    MicroBatchRunner(spark, old, data_root).run_batch()
    big = 2**40
    after = _drop_events(data_root, 1, [event("a", 8, big), event("a", 12, 4)])
    _drop_events(data_root, 2, [event("a", 40, 8)])
    MicroBatchRunner(spark, new, data_root).run(max_batches=None)

    # Windows [0, 10) and [10, 20) are closed: what a plain batch of each definition reads
    # of its own file, aggregated as one.
    read = _read(spark, "user STRING, ts TIMESTAMP, amount INT", before).unionByName(
        _read(spark, SCHEMA, after)
    )
    expected = per_window(
        read,
        "user",
        F.window("ts", "10 seconds"),
        F.count(F.lit(1)).alias("count"),
        F.sum("amount").alias("sum_amount"),
    )
    assertDataFrameEqual(delta_frame(spark, data_root / "out"), expected)
    assert big + 1 in {r["sum_amount"] for r in expected.collect()}


def _defined(root: Path, **fields: Any) -> Path:
    """``pipelines.yaml`` under ``root`` with pipeline ``e`` (as ``_pipeline``) and ``fields``."""
    source = {"path": "in", "format": "json", "schema_ddl": OLD_SCHEMA, "max_files_per_batch": 1}
    defined = {"name": "e", "source": source, "sink": {"kind": "delta", "path": "out"}}
    path = root / "pipelines.yaml"
    path.write_text(yaml.safe_dump({"pipelines": [defined | fields]}))
    return path


def test_plan_shows_a_pending_change_with_its_class_and_status_the_definition_per_batch_range(
    capsys: pytest.CaptureFixture[str], spark: SparkSession, data_root: Path
) -> None:
    _drop(data_root, 0)
    defined = _defined(data_root)
    assert lowmark(capsys, data_root, "--pipelines", str(defined), "run", "e")[0] == 0
    _drop(data_root, 1)

    sql = {"transform": {"sql": "SELECT id, amount * 10 AS amount FROM input"}}
    _defined(data_root, **sql)
    code, out, _ = lowmark(capsys, data_root, "--pipelines", str(defined), "plan", "e", "--json")
    assert code == 0
    [change] = json.loads(out)["changes"]
    assert (change["field"], change["class"]) == ("transform", "compatible")
    code, out, _ = lowmark(capsys, data_root, "--pipelines", str(defined), "plan", "e")
    assert code == 0 and re.search(r"^\s+changes\s+transform \(compatible: ", out, re.MULTILINE)

    # A change that needs a rebuild: the plan names it with its class, and stops.
    _defined(data_root, **sql, sink={"kind": "delta", "path": "elsewhere"})
    code, out, err = lowmark(capsys, data_root, "--pipelines", str(defined), "plan", "e")
    assert code == 2
    assert "sink.path (rebuild: " in out and "transform (compatible: " in out
    assert "error:" in err and "(rebuild: sink changed" in err

    _defined(data_root, **sql)
    assert lowmark(capsys, data_root, "--pipelines", str(defined), "run", "e")[0] == 0
    code, out, _ = lowmark(capsys, data_root, "--pipelines", str(defined), "status", "e", "--json")
    first, second = json.loads(out)["definitions"]
    assert (first["first_batch"], first["last_batch"], first["changes"]) == (0, 0, [])
    assert (second["first_batch"], second["last_batch"]) == (1, 1)
    assert [c["field"] for c in second["changes"]] == ["transform"]


def test_a_batch_planned_before_the_change_can_be_set_aside_under_it(
    spark: SparkSession, data_root: Path
) -> None:
    new = _pipeline(transform=SqlStep(sql="SELECT id, amount * 10 AS amount FROM input"))
    _drop(data_root, 0)
    _drop(data_root, 1)
    with pytest.raises(InjectedCrash), crash_at(KillPoint("after_offset_log", 1)):
        MicroBatchRunner(spark, _pipeline(), data_root).run(max_batches=None)
    # The batch the old definition planned (a poison batch the change was meant to fix).
    set_aside(spark, new, data_root, 1, "the old transform failed on it")
    after = _drop(data_root, 2)
    done = MicroBatchRunner(spark, new, data_root).run_batch()
    assert done is not None and (done.batch_id, done.replay) == (2, False)
    expected = _plain(spark, data_root / "in" / "f0.json").unionByName(
        _plain(spark, after).selectExpr("id", "amount * 10 AS amount")
    )
    assertDataFrameEqual(delta_frame(spark, data_root / "out"), expected)


def test_a_rescued_data_column_added_keeps_the_fields_the_schema_does_not_name_from_its_batch(
    spark: SparkSession, data_root: Path
) -> None:
    before = _drop(data_root, 0)
    assert MicroBatchRunner(spark, _pipeline(), data_root).run_batch() is not None
    after = _drop(data_root, 1)
    with after.open("a") as f:  # a blank line is passed over; a line that is no JSON is bad
        f.write('\n{"id": 99, "amount": 1, "note": {"deep": [1, 2.5]}, "more": null}\nnot json\n')
    plain_source = _pipeline().source
    rescued = plain_source.model_copy(update={"rescued_data_column": "_rescued"})
    rescuing = _pipeline().model_copy(update={"source": rescued})
    done = MicroBatchRunner(spark, rescuing, data_root).run_batch()

    assert done is not None and (done.batch_id, done.rows_bad) == (1, 1)
    # Rows of the batch before have none; from the boundary, each record's unknown fields as
    # JSON, values as they were (a plain read of the same lines, by hand).
    kept = {r["id"]: r["_rescued"] for r in delta_frame(spark, data_root / "out").collect()}
    plain: dict[int, str | None] = {r["id"]: None for r in _plain(spark, before).collect()}
    plain |= {10 + i: json.dumps({"note": f"n{i}"}, separators=(",", ":")) for i in range(3)}
    plain[99] = '{"note":{"deep":[1,2.5]},"more":null}'  # in the record's order
    assert kept == plain
