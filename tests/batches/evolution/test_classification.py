"""Each kind of definition change has one class (lowmark.batches.evolution), and the docs'
table of change kinds is the classification's own rendering. No Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lowmark.batches.evolution import (
    AGGREGATE_ADDED,
    KINDS,
    SINK_CHANGED,
    UNRECOGNISED,
    ChangeClass,
    ChangeKind,
    classify,
    render_table,
)
from lowmark.batches.pipeline import DeltaSink, EventTime, FileSource, Pipeline
from lowmark.batches.windows import Aggregate, Tumbling, WindowedAggregation

OPERATIONS = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
BEGIN = "<!-- change kinds: generated from lowmark.batches.evolution.render_table -->\n"
END = "<!-- end of change kinds -->"


def test_the_docs_table_of_change_kinds_is_the_classifications_own() -> None:
    page = OPERATIONS.read_text()
    table = page.split(BEGIN, 1)[1].split(END, 1)[0]
    assert table == render_table(), (
        "docs/operations.md's table of change kinds is stale: paste "
        "`lowmark.batches.evolution.render_table()` between its markers"
    )


def _source(schema: str) -> dict[str, Any]:
    return {"source": {"kind": "files", "path": "in", "schema_ddl": schema}}


@pytest.mark.parametrize(
    ("old", "new", "field", "kind"),
    [
        ("id LONG", "id LONG, note STRING", "note", "source column added (nullable)"),
        ("id LONG", "id LONG, n INT NOT NULL", "n", "source column added NOT NULL"),
        ("id INT, x FLOAT", "id BIGINT, x FLOAT", "id", "source column widened"),
        ("id LONG, x FLOAT", "id LONG, x DOUBLE", "x", "source column widened"),
        ("id LONG, x DOUBLE", "id LONG, x FLOAT", "x", "source column narrowed or retyped"),
        ("id LONG, x STRING", "id LONG, x INT", "x", "source column narrowed or retyped"),
        ("id LONG, note STRING", "id LONG", "note", "source column removed"),
        ("id LONG, s STRUCT<a: INT, b: INT>", "id LONG, s STRUCT<a: INT>", "s", "source column"),
    ],
)
def test_a_source_schema_change_is_classified_column_by_column(
    old: str, new: str, field: str, kind: str
) -> None:
    (change,) = classify(_source(old), _source(new))
    assert change.field == f"source.schema_ddl.{field}"
    assert change.kind.name.startswith(kind)


def test_a_rescued_data_column_added_is_compatible_and_one_removed_needs_a_rebuild() -> None:
    plain = {"source": {"kind": "files", "path": "in", "rescued_data_column": None}}
    rescuing = {"source": {"kind": "files", "path": "in", "rescued_data_column": "_rescued"}}
    [added] = classify(plain, rescuing)
    [removed] = classify(rescuing, plain)
    assert (added.kind.name, added.change_class) == (
        "rescued-data column added to a JSON file source",
        ChangeClass.COMPATIBLE,
    )
    assert removed.change_class is ChangeClass.REBUILD


def test_spelling_a_schema_otherwise_is_no_change() -> None:
    old = _source("id LONG, `Note` STRING COMMENT 'x, y'")
    assert classify(old, _source("id   bigint,note string")) == ()


def _windowed(*aggregates: Aggregate, size: str = "1 minute") -> dict[str, Any]:
    return Pipeline(
        name="w",
        source=FileSource(path="in", format="json", schema_ddl="u STRING, ts TIMESTAMP, n LONG"),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts"),
        aggregation=WindowedAggregation(
            window=Tumbling(size=size), keys=("u",), aggregates=aggregates
        ),
    ).definition()


COUNT = Aggregate(fn="count", name="n")
TOTAL = Aggregate(fn="sum", column="n", name="total")


@pytest.mark.parametrize(
    ("old", "new", "kind"),
    [
        (_windowed(COUNT), _windowed(COUNT, TOTAL), AGGREGATE_ADDED),
        (_windowed(COUNT, TOTAL), _windowed(COUNT), None),
        (_windowed(COUNT), _windowed(COUNT, size="2 minutes"), None),
        ({"stream_join": {"on": "a"}}, {"stream_join": {"on": "b"}}, UNRECOGNISED),
        ({"sink": {"path": "out"}}, {"sink": {"path": "out2"}}, SINK_CHANGED),
        ({}, {"a_field_of_tomorrow": 1}, UNRECOGNISED),
    ],
)
def test_what_changes_output_already_written_needs_a_rebuild(
    old: dict[str, Any], new: dict[str, Any], kind: ChangeKind | None
) -> None:
    changes = classify(old, new)
    assert changes and {c.change_class for c in changes} == {ChangeClass.REBUILD}
    if kind is not None:
        assert {c.kind for c in changes} == {kind}


def test_every_kind_has_one_line_and_a_class() -> None:
    assert len({k.name for k in KINDS}) == len(KINDS)
    assert all("\n" not in k.name + k.why and "|" not in k.name + k.why for k in KINDS)
    assert {k.change_class for k in KINDS} == set(ChangeClass)


@pytest.mark.parametrize(
    ("source", "options"),
    [("csv", {}), ("json", {"multiLine": "true"})],
    ids=["csv", "multi-line json"],
)
def test_a_rescued_data_column_reads_json_lines_only(source: str, options: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="`rescued_data_column` reads JSON lines"):
        FileSource(path="in", format=source, options=options, rescued_data_column="_rescued")
