"""Mistakes caught before Spark starts (``lowmark.batches.loop.preflight``): ``lowmark run`` stops
on them with one line before its first Spark job and before anything is written, and
``lowmark plan`` reports the same line.

The runners here are given a Spark that fails the test when asked for: every check runs
on the driver. What the checks must not refuse (a transform's columns, an inferred JSON
schema, a string event time Spark may cast) is checked too.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from lowmark.batches.admin.status import pipeline_plan
from lowmark.batches.errors import DefinitionMismatch, SinkNotATable, SourceFileUnreadable
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.loop.preflight import check_source_folders, ddl_types, spark_type_name
from lowmark.batches.pipeline import DeltaSink, DeltaSource, FileSource, Pipeline, UnionSource
from lowmark.batches.sources.delta_table import CHANGE_FIELDS
from lowmark.batches.sources.kafka import RAW_SCHEMA
from lowmark.batches.windows import Aggregate, EventTime, Tumbling, WindowedAggregation
from lowmark.state.checkpoint import Checkpoint
from tests.helpers import double_amount, lowmark, pipeline, write_json_lines

ROWS = [{"id": 1, "ts": "2026-01-01T00:00:00Z", "amount": 3}]


def no_spark() -> SparkSession:
    pytest.fail("Spark was asked for: the check must run before Spark starts")


def run_fails(p: Pipeline, root: Path) -> str:
    """Run ``p`` once over ``root``; the error's message, with how long it took checked."""
    started = time.perf_counter()
    with pytest.raises((DefinitionMismatch, SourceFileUnreadable, SinkNotATable)) as caught:
        MicroBatchRunner(no_spark, p, root).run()
    took = time.perf_counter() - started
    assert took < 5, f"the check took {took:.2f} s"  # the runner's set-up included
    assert Checkpoint(p.checkpoint_location(root), p.name).offsets.get_latest() is None  # unwritten
    plan = pipeline_plan(no_spark, p, root)
    assert plan.batch_id == 0 and plan.problem == str(caught.value)  # plan says the same
    return str(caught.value)


def json_source(**fields: Any) -> FileSource:
    return FileSource(path="in", format="json", **fields)


def with_event_time(column: str, source: FileSource, **fields: Any) -> Pipeline:
    return pipeline(source=source, event_time=EventTime(column=column), **fields)


def _mistyped_folder(folder: Path) -> Path:
    """A definitions file whose pipeline ``clicks`` reads the folder ``incomin`` (a typo)."""
    definitions = folder / "p.yaml"
    definitions.write_text(
        "pipelines:\n- name: clicks\n  source: {path: incomin, format: json}\n  sink: {path: out}\n"
    )
    return definitions


@pytest.mark.parametrize("command", ["run", "plan"])
def test_a_source_folder_that_does_not_exist_fails_in_one_line_and_creates_no_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    root, definitions = tmp_path / "data", _mistyped_folder(tmp_path)
    code, out, err = lowmark(capsys, root, "--pipelines", str(definitions), command, "clicks")
    assert code == 2 and out == "", out
    assert err.strip() == (
        f"error: folder {root / 'incomin'} of the file source of pipeline clicks does not exist: "
        "create the folder, or correct `source.path` ('incomin'; a relative path is under the "
        f"data root {root})"
    )
    assert not Checkpoint.exists(str(root / "_lowmark/clicks"))
    # There but empty: nothing to do yet, and said so.
    (root / "incomin").mkdir()
    code, out, _ = lowmark(capsys, root, "--pipelines", str(definitions), "run", "clicks")
    assert code == 0 and out.strip() == "clicks: caught up, no new data"


def test_a_union_names_its_member_whose_folder_is_missing(tmp_path: Path) -> None:
    sources = {"a": DeltaSource(path="events"), "b": FileSource(path="bb", format="json")}
    union = pipeline(source=UnionSource(sources=sources))
    with pytest.raises(DefinitionMismatch) as caught:
        check_source_folders(union, tmp_path)
    assert f"folder {tmp_path / 'bb'} of source b of pipeline t does not exist" in str(caught.value)
    assert "correct `source.sources.b.path` ('bb';" in str(caught.value)


def test_only_local_source_folders_are_checked(tmp_path: Path) -> None:
    for remote in ("s3a://bucket/incoming", "gs://bucket/incoming"):
        check_source_folders(pipeline(source=FileSource(path=remote, format="json")), tmp_path)
    with pytest.raises(DefinitionMismatch, match="does not exist"):
        check_source_folders(
            pipeline(source=FileSource(path=f"file:{tmp_path}/x", format="json")), tmp_path
        )


def test_json_format_on_csv_files_names_the_file_and_the_format(tmp_path: Path) -> None:
    csv = tmp_path / "in" / "orders.csv"
    csv.parent.mkdir()
    csv.write_text("id,ts,amount\n1,2026-01-01T00:00:00Z,3\n")
    message = run_fails(pipeline(source=json_source()), tmp_path)
    assert str(csv) in message and "set `format: csv`" in message, message
    # Fixed, the same file is planned again, with no problem.
    fixed = pipeline(source=FileSource(path="in", format="csv"))
    plan = pipeline_plan(no_spark, fixed, tmp_path)
    assert plan.batch_id == 0 and plan.inputs == [f"file:{csv}"] and plan.problem is None


def test_csv_format_on_json_lines_and_parquet_format_on_text_are_refused(tmp_path: Path) -> None:
    write_json_lines(tmp_path / "in", "a.json", ROWS, 1_700_000_000)
    message = run_fails(pipeline(source=FileSource(path="in", format="csv")), tmp_path)
    assert "reads as JSON" in message and "set `format: json`" in message, message
    message = run_fails(pipeline(source=FileSource(path="in", format="parquet")), tmp_path)
    assert "is not PARQUET" in message and "set `format: json`" in message, message


def test_an_event_time_column_the_source_lacks_is_named_with_the_columns_it_has(
    tmp_path: Path,
) -> None:
    write_json_lines(tmp_path / "in", "a.json", ROWS, 1_700_000_000)
    source = json_source(schema_ddl="id LONG, ts TIMESTAMP, amount LONG")
    message = run_fails(with_event_time("event_time", source), tmp_path)
    assert message.startswith("event-time column 'event_time' of pipeline t is not among "), message
    assert "id, ts, amount; set `event_time.column`" in message, message


def test_an_epoch_number_as_event_time_is_refused_with_its_type(tmp_path: Path) -> None:
    write_json_lines(tmp_path / "in", "a.json", [{"id": 1, "ts": 1_700_000_000_000}], 1)
    source = json_source(schema_ddl="id LONG, ts LONG")
    message = run_fails(with_event_time("ts", source), tmp_path)
    assert "is LONG in the source schema (`schema_ddl`)" in message, message
    assert "timestamp_millis()" in message, message


def test_an_inferred_json_string_as_event_time_is_refused(tmp_path: Path) -> None:
    write_json_lines(tmp_path / "in", "a.json", ROWS, 1)
    message = run_fails(with_event_time("ts", json_source()), tmp_path)
    assert "'ts' of pipeline t is STRING in " in message and "a.json's records" in message


def test_a_string_as_event_time_is_refused_as_spark_would(tmp_path: Path) -> None:
    # Spark's unix_millis, which reads event time, casts no string to a timestamp.
    csv = tmp_path / "in" / "a.csv"
    csv.parent.mkdir()
    csv.write_text("id,ts\n1,2026-01-01T00:00:00Z\n")
    source = FileSource(path="in", format="csv")  # no inferSchema: every column a string
    message = run_fails(with_event_time("ts", source), tmp_path)
    assert f"is STRING in {csv}'s CSV header" in message, message


def test_keys_and_aggregated_columns_the_source_lacks_are_named(tmp_path: Path) -> None:
    write_json_lines(tmp_path / "in", "a.json", ROWS, 1_700_000_000)
    source = json_source(schema_ddl="id LONG, ts TIMESTAMP, amount LONG")
    aggregation = WindowedAggregation(
        keys=("user",),
        window=Tumbling(size=60_000),
        aggregates=(Aggregate(fn="sum", column="price"),),
    )
    message = run_fails(with_event_time("ts", source, aggregation=aggregation), tmp_path)
    assert "groups or aggregates user, price, not among" in message, message


def test_a_parquet_files_own_types_tell_event_time(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [1], "ts": [1_700_000_000_000]}), tmp_path / "in" / "a.parquet")
    source = FileSource(path="in", format="parquet")
    message = run_fails(with_event_time("ts", source), tmp_path)
    assert "is BIGINT in" in message and "a.parquet's columns" in message, message


def test_a_delta_source_tables_own_schema_tells_event_time(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path / "upstream"), pa.table({"id": [1], "ts": [1_700_000_000]}))
    p = pipeline(source=DeltaSource(path="upstream"), event_time=EventTime(column="ts"))
    message = run_fails(p, tmp_path)
    assert f"is BIGINT in the Delta table {tmp_path / 'upstream'}" in message, message


def test_a_csv_header_other_than_the_schema_names_the_file_and_columns(tmp_path: Path) -> None:
    csv = tmp_path / "in" / "a.csv"
    csv.parent.mkdir()
    csv.write_text("amount,id\n3,1\n")
    source = FileSource(path="in", format="csv", schema_ddl="id LONG, amount LONG")
    message = run_fails(pipeline(source=source), tmp_path)
    assert f"{csv} (taken by batch 0) has the CSV header 'amount,id'" in message, message


def test_json_records_with_none_of_the_schema_columns_name_both(tmp_path: Path) -> None:
    write_json_lines(tmp_path / "in", "a.json", [{"order": 1, "when": "x"}], 1)
    message = run_fails(pipeline(source=json_source(schema_ddl="id LONG, amount LONG")), tmp_path)
    assert "has the columns order, when and none of the source schema" in message, message


def test_a_sink_below_a_file_or_a_file_itself_is_refused(tmp_path: Path) -> None:
    write_json_lines(tmp_path / "in", "a.json", ROWS, 1)
    (tmp_path / "blocker").write_text("")
    message = run_fails(pipeline(sink=DeltaSink(path="blocker/out")), tmp_path)
    assert f"{tmp_path / 'blocker'} is a file" in message, message
    message = run_fails(pipeline(sink=DeltaSink(path="blocker")), tmp_path)
    assert "is a file, not a folder a Delta table can live in" in message, message


def test_an_existing_sink_table_without_the_window_columns_is_refused(tmp_path: Path) -> None:
    write_json_lines(tmp_path / "in", "a.json", ROWS, 1)
    write_deltalake(str(tmp_path / "out"), pa.table({"id": [1], "total": [2]}))
    source = json_source(schema_ddl="id LONG, ts TIMESTAMP, amount LONG")
    aggregation = WindowedAggregation(
        keys=("id",), window=Tumbling(size=60_000), aggregates=(Aggregate(fn="count"),)
    )
    message = run_fails(with_event_time("ts", source, aggregation=aggregation), tmp_path)
    assert "has no column window_start, window_end, count, which the pipeline" in message


@pytest.mark.parametrize(
    "fields",
    [
        # after a transform the columns are the transform's
        {"transform": double_amount, "event_time": EventTime(column="made_by_it")},
        # an inferred JSON schema is all the records' fields, not a sample's
        {"source": json_source(), "event_time": EventTime(column="later_field")},
        # ... and with `inferTimestamp` its strings may be timestamps
        {
            "source": json_source(options={"inferTimestamp": "true"}),
            "event_time": EventTime(column="ts"),
        },
        # names are matched without case, as Spark does
        {
            "source": json_source(schema_ddl="id LONG, ts TIMESTAMP"),
            "event_time": EventTime(column="TS"),
        },
        {
            "source": json_source(schema_ddl="id LONG, `t s` TIMESTAMP"),
            "event_time": EventTime(column="t s"),
        },
    ],
)
def test_what_spark_may_run_is_not_refused(tmp_path: Path, fields: dict[str, Any]) -> None:
    write_json_lines(tmp_path / "in", "a.json", ROWS, 1)
    plan = pipeline_plan(no_spark, pipeline(**fields), tmp_path)
    assert plan.batch_id == 0 and plan.problem is None


def test_a_stray_file_among_the_batchs_files_is_left_to_the_bad_records(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text("id,amount\n1,2\n")  # its rows: bad rows
    write_json_lines(tmp_path / "in", "b.json", ROWS, 1)
    plan = pipeline_plan(no_spark, pipeline(source=json_source()), tmp_path)
    assert len(plan.inputs) == 2 and plan.problem is None


def test_ddl_columns_are_read_at_the_top_level_only() -> None:
    ddl = (
        "id LONG, `a, b` STRUCT<x: INT, y: ARRAY<STRING>>, d DECIMAL(10, 2) NOT NULL, "
        "m: MAP<STRING, INT>"
    )
    assert ddl_types(ddl) == {
        "id": "long",
        "a, b": "struct<x: int, y: array<string>>",
        "d": "decimal(10, 2) not null",
        "m": "map<string, int>",
    }


def test_a_spark_schemas_json_names_its_types_as_spark_does() -> None:
    """A schema fixed for the checkpoint, a Delta table's and Kafka's raw records are read
    from their JSON form without PySpark: each type is named as ``simpleString`` names it."""
    nested = T.ArrayType(T.StructType([T.StructField("b", T.IntegerType())]))
    schema = T.StructType(
        [
            T.StructField("a", nested),
            T.StructField("m", T.MapType(T.StringType(), T.DecimalType(3, 1))),
            *(T.StructField(f"t{i}", t) for i, t in enumerate(SIMPLE_TYPES)),
            *RAW_SCHEMA.fields,
            *CHANGE_FIELDS,
        ]
    )
    for field in schema.fields:
        assert spark_type_name(field.jsonValue()["type"]) == field.dataType.simpleString()


SIMPLE_TYPES = [
    T.ByteType(),
    T.ShortType(),
    T.IntegerType(),
    T.LongType(),
    T.DecimalType(),
    T.NullType(),
    T.VarcharType(3),
    T.TimestampNTZType(),
    T.DayTimeIntervalType(),
]
