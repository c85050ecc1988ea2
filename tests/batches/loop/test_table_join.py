"""Stream-table joins (``joins``): each batch's records joined with a Delta table as of the
version its offset-log entry records.

Results are compared with plain Spark batch joins of each batch's file against the
dimension's version in effect for that batch (time travel), so an update of the dimension
is seen from the next batch, and a replay after a crash joins the version its first
attempt recorded, not a newer one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.loop.dimensions import Dimensions
from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, EventTimePartitions, FileSource, Pipeline
from lowmark.batches.table_join import TableJoin
from lowmark.batches.windows import Aggregate, EventTime, Tumbling, WindowedAggregation
from lowmark.state.checkpoint import Checkpoint
from tests.helpers import REPO, FakeClock, event, lowmark, per_window, sink, write_json_lines

SCHEMA = "device_id STRING, ts TIMESTAMP, amount LONG"


def _reading(device: str | None, second: int, amount: int) -> dict[str, Any]:
    record = event("-", second, amount)
    return {"device_id": device, "ts": record["ts"], "amount": amount}


BATCHES = [
    [_reading("d1", 1, 1), _reading("d2", 2, 2), _reading("d9", 3, 3), _reading(None, 4, 4)],
    [_reading("d1", 11, 5), _reading("d3", 12, 6), _reading("d9", 13, 7)],
    [_reading("d2", 21, 8), _reading("d3", 22, 9), _reading("d4", 23, 10)],
]
"""One file a batch; d9 is never in the dimension, a null key matches nothing."""

DEVICES = [
    {"device_id": ["d1", "d2"], "region": ["north", "south"], "model": ["m1", "m2"]},
    {
        "device_id": ["d1", "d2", "d3"],
        "region": ["east", "south", "north"],
        "model": ["a", "b", "c"],
    },
    {"device_id": ["d2", "d3", "d4"], "region": ["west", "west", "east"], "model": ["x", "y", "z"]},
]
"""The dimension's successive contents: d1 moves, d3 and d4 appear, d1 goes."""


def _devices(root: Path, version: int) -> None:
    """Write the dimension's contents ``version`` as its next version (``version``, when
    called for 0, 1, 2 in order)."""
    # A whole new content each time, as a refresh writes it.
    write_deltalake(str(root / "devices"), pa.table(DEVICES[version]), mode="overwrite")


def _batch_file(root: Path, index: int) -> None:
    write_json_lines(root / "in", f"b{index:03d}.json", BATCHES[index], 1_700_000_000 + index)


def _joining(how: str = "inner", **fields: Any) -> Pipeline:
    defined: dict[str, Any] = {
        "name": "enriched",
        "source": FileSource(path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=1),
        "sink": DeltaSink(path="out"),
        "joins": (TableJoin(table="devices", keys=("device_id",), how=how, columns=("region",)),),
    }
    return Pipeline(**{**defined, **fields})


def _reference(spark: SparkSession, root: Path, how: str, versions: list[int]) -> DataFrame:
    """Batch ``i``'s file joined with the dimension as of ``versions[i]`` (read by delta-rs,
    an independent reader), as plain Spark batches, unioned."""
    joined = [
        spark.read.schema(SCHEMA)
        .json(str(root / "in" / f"b{i:03d}.json"))
        .join(
            spark.createDataFrame(
                DeltaTable(str(root / "devices"), version=v).to_pyarrow_table()
            ).select("device_id", "region"),
            "device_id",
            how,
        )
        for i, v in enumerate(versions)
    ]
    out = joined[0]
    for more in joined[1:]:
        out = out.unionByName(more)
    return out


def _run(spark: SparkSession, pipeline: Pipeline, root: Path) -> None:
    MicroBatchRunner(spark, pipeline, root, FakeClock()).run(max_batches=None)


def test_a_replay_joins_the_version_its_offsets_recorded_not_a_newer_one(
    spark: SparkSession, tmp_path: Path
) -> None:
    _devices(tmp_path, 0)
    _batch_file(tmp_path, 0)
    _run(spark, _joining("left"), tmp_path)
    _devices(tmp_path, 1)
    _batch_file(tmp_path, 1)
    with crash_at(KillPoint("after_offset_log", 1)), pytest.raises(InjectedCrash):
        _run(spark, _joining("left"), tmp_path)
    _devices(tmp_path, 2)  # after batch 1 was planned: for batch 2, not its replay
    _run(spark, _joining("left"), tmp_path)
    _batch_file(tmp_path, 2)
    _run(spark, _joining("left"), tmp_path)

    assertDataFrameEqual(sink(spark, tmp_path), _reference(spark, tmp_path, "left", [0, 1, 2]))
    ckpt = Checkpoint(str(tmp_path / "_lowmark" / "enriched"), "enriched")
    recorded = [ckpt.offsets.get(b) for b in (0, 1, 2)]
    assert [e.dimension_versions for e in recorded if e is not None] == [
        {"devices": 0},
        {"devices": 1},
        {"devices": 2},
    ]
    last = pipeline_status(spark, _joining("left"), tmp_path, FakeClock()).last_batch
    assert last is not None and last.dimension_versions == {"devices": 2}


def test_windows_group_by_a_column_the_join_brought(spark: SparkSession, tmp_path: Path) -> None:
    aggregation = WindowedAggregation(
        keys=("region",),
        window=Tumbling(size="10 seconds"),
        aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
        output_mode="update",
    )
    windowed = _joining("inner", event_time=EventTime(column="ts"), aggregation=aggregation)
    _devices(tmp_path, 0)
    _batch_file(tmp_path, 0)
    _run(spark, windowed, tmp_path)
    _devices(tmp_path, 1)
    for index in (1, 2):
        _batch_file(tmp_path, index)
    _run(spark, windowed, tmp_path)

    joined = _reference(spark, tmp_path, "inner", [0, 1, 1])
    expected = per_window(
        joined,
        "region",
        F.window("ts", "10 seconds"),
        F.count(F.lit(1)).alias("count"),
        F.sum("amount").alias("sum_amount"),
    )
    assertDataFrameEqual(sink(spark, tmp_path), expected)
    # An inner join's unmatched records count among those the transform dropped, so the
    # accounting identity holds: rows_in = rows_bad + rows_dropped + rows_late + rows_windowed.
    ckpt = Checkpoint(str(tmp_path / "_lowmark" / "enriched"), "enriched")
    commits = [c for c in (ckpt.commits.get(b) for b in (0, 1, 2)) if c is not None]
    assert [c.rows_dropped for c in commits] == [2, 1, 1]
    assert all(
        c.rows_in == c.rows_bad + c.rows_dropped + c.rows_late + c.rows_windowed for c in commits
    )


def test_a_small_dimension_is_broadcast_and_a_large_one_shuffled(
    spark: SparkSession, tmp_path: Path
) -> None:
    _devices(tmp_path, 0)
    records = spark.createDataFrame([("d1", 1)], "device_id STRING, amount LONG")

    def plan(broadcast: str) -> str:
        join = TableJoin(table="devices", keys=("device_id",), broadcast=broadcast)
        dimensions = Dimensions(_joining(joins=(join,)), tmp_path)
        joined = dimensions.joined(spark, records, {"devices": 0})
        return str(joined._jdf.queryExecution().executedPlan().toString())

    assert "BroadcastHashJoin" in plan("auto")
    assert "SortMergeJoin" in plan("false")


def test_a_join_changes_the_fingerprint_only_when_there_is_one() -> None:
    plain = _joining(joins=())
    assert "joins" not in plain.definition()
    assert _joining().fingerprint() != plain.fingerprint()
    assert _joining("left").fingerprint() != _joining().fingerprint()
    broadcast = TableJoin(table="devices", keys=("device_id",), columns=("region",), broadcast=True)
    assert _joining(joins=(broadcast,)).fingerprint() == _joining().fingerprint()


@pytest.mark.parametrize(
    ("join", "error"),
    [
        ({"table": "t", "keys": ["k"], "how": "outer"}, "how"),
        ({"table": "t", "keys": []}, "keys"),
        ({"table": "t", "keys": ["k"], "columns": ["k"]}, "leave them out of `columns`"),
    ],
)
def test_a_join_that_cannot_be_is_refused_when_defined(join: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        TableJoin.model_validate(join)


def test_yaml_booleans_set_broadcast_and_a_joining_pipeline_is_not_backfilled() -> None:
    join = TableJoin.model_validate({"table": "t", "keys": ["k"], "broadcast": True})
    assert join.broadcast == "true"
    aggregation = WindowedAggregation(
        keys=("region",), window=Tumbling(size="10 seconds"), aggregates=(Aggregate(fn="count"),)
    )
    windowed: dict[str, Any] = {"event_time": EventTime(column="ts"), "aggregation": aggregation}
    assert _joining(**windowed).backfill is None
    with pytest.raises(ValueError, match="remove `backfill`"):
        _joining(**windowed, backfill=EventTimePartitions())


def test_a_missing_dimension_stops_planning_with_one_line_naming_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    _batch_file(tmp_path, 0)
    with pytest.raises(PipelineConfigInvalid, match=r"joins devices, but .* create it"):
        _run(spark, _joining(), tmp_path)
    assert not DeltaTable.is_deltatable(str(tmp_path / "out"))


def test_a_key_the_records_lack_fails_the_batch_with_one_line(
    spark: SparkSession, tmp_path: Path
) -> None:
    _devices(tmp_path, 0)
    _batch_file(tmp_path, 0)
    join = TableJoin(table="devices", keys=("device",))
    with pytest.raises(PipelineConfigInvalid, match=r"the table has no column \['device'\]"):
        _run(spark, _joining(joins=(join,)), tmp_path)


def test_plan_and_list_name_each_join_and_the_version_a_batch_would_join(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    examples = str(REPO / "examples" / "pipelines.yaml")
    for segment in ("gold", "silver"):
        rows = pa.table({"user": ["u1"], "segment": [segment]})
        write_deltalake(str(tmp_path / "users" / "current"), rows, mode="overwrite")
    order = {"order_id": "o1", "user": "u1", "amount": 5, "ts": "2026-01-01T00:00:01Z"}
    write_json_lines(tmp_path / "orders" / "incoming", "a.json", [order], 1_700_000_000)

    code, out, _ = lowmark(capsys, tmp_path, "--pipelines", examples, "plan", "revenue_per_segment")
    assert code == 0
    assert "joins      left join users/current on user (version 1)" in out
    code, out, _ = lowmark(capsys, tmp_path, "--pipelines", examples, "list")
    assert "files:orders/incoming, left join users/current on user" in out
