"""Finding pipelines in Python modules and YAML files."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowmark.batches.demo import clean_orders
from lowmark.batches.errors import PipelineConfigInvalid, PipelineNotFound
from lowmark.batches.pipeline import DeltaSink, KafkaSource
from lowmark.batches.registry import get_pipeline, load_pipelines

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_module_is_the_default_location(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOWMARK_PIPELINES", raising=False)
    assert "orders" in load_pipelines()


def test_the_example_yaml_resolves_its_transform_by_import_path() -> None:
    p = get_pipeline("latest_orders", str(REPO / "examples/pipelines.yaml"))
    assert p.transform is clean_orders
    assert isinstance(p.sink, DeltaSink)
    assert p.sink.mode == "merge" and p.sink.keys == ("order_id",)


def test_the_example_yaml_declares_a_pipeline_for_every_source_kind() -> None:
    pipelines = load_pipelines(str(REPO / "examples/pipelines.yaml"))
    kinds = {p.name: p.source.kind for p in pipelines.values()}
    assert kinds == {
        "latest_orders": "files",
        "synthetic_clicks": "synthetic",
        "kafka_orders": "kafka",
        "clicks_two_regions": "union",
        "clicks_per_hour": "delta",
        "busy_minutes_sql": "files",  # the SQL steps' example
        "unique_orders": "files",  # deduplication's example
        "sessions": "files",  # keyed steps' examples
        "device_status": "files",
        "sessions_per_window": "files",
        "revenue_per_segment": "files",  # stream-table joins' example
    }
    kafka = pipelines["kafka_orders"].source
    assert isinstance(kafka, KafkaSource) and kafka.topics == ("orders",)


def test_a_kafka_source_names_its_mistakes_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "pipelines:\n- name: k\n  source: {kind: kafka, bootstrap_servers: 'h:1', "
        "topics: [t], starting_offsets: yesterday, schema_ddl: 'a INT'}\n"
        "  sink: {kind: delta, path: o}\n"
    )
    with pytest.raises(PipelineConfigInvalid, match="'yesterday': write 'earliest', 'latest'"):
        load_pipelines(str(path))


def test_a_python_file_contributes_its_module_level_pipelines(tmp_path: Path) -> None:
    module = tmp_path / "mine.py"
    module.write_text(
        "from lowmark.batches.pipeline import Pipeline, FileSource, DeltaSink\n"
        "a = Pipeline(name='a', source=FileSource(path='i', format='csv'), "
        "sink=DeltaSink(path='o'))\n"
    )
    assert list(load_pipelines(str(module))) == ["a"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "pipelines:\n  - name: x\n    source: {path: i, format: xml}\n    sink: {path: o}\n",
            r"pipelines\[0\]\.source\.format: Input should be 'json', 'csv' or 'parquet'",
        ),
        (
            "pipelines:\n  - name: x\n    source: {path: i, format: csv}\n"
            "    sink: {path: o, mode: merge}\n",
            r"pipelines\[0\]\.sink.*mode 'merge' needs `keys`",
        ),
        (
            "pipelines:\n  - name: x\n    source: {path: i, format: csv}\n    sink: {path: o}\n"
            "    transform: no.such.module:f\n",
            r"pipelines\[0\]\.transform",
        ),
        (
            "pipelines:\n  - name: x\n    source: {path: i, format: csv}\n    sink: {path: o}\n"
            "    sinc: {}\n",
            r"pipelines\[0\]\.sinc: Extra inputs are not permitted",
        ),
        ("pipeline: []\n", "expected a top-level `pipelines:` list"),
        ("pipelines: [\n", "is not valid YAML"),
    ],
)
def test_bad_yaml_names_the_field_and_the_problem(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(body)
    with pytest.raises(PipelineConfigInvalid, match=message) as info:
        load_pipelines(str(path))
    assert "\n" not in str(info.value)


def test_an_unknown_pipeline_lists_the_known_ones() -> None:
    with pytest.raises(PipelineNotFound, match=r"known: .*orders"):
        get_pipeline("nope", "lowmark.batches.demo")
