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


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        (
            "name: clicks\n  sourc: {path: i, format: csv}\n  sink: {path: o}\n",
            "unknown key `sourc` in pipeline clicks (did you mean `source`?)",
        ),
        (
            "name: clicks\n  source: {pth: i, format: csv}\n  sink: {path: o}\n",
            "unknown key `source.pth` in pipeline clicks (did you mean `path`?)",
        ),
        (
            "name: clicks\n  source: {kind: union, sources: {a: {path: i, format: csv, "
            "max_file_per_batch: 2}, b: {path: j, format: csv}}}\n  sink: {path: o}\n",
            "unknown key `source.sources.a.max_file_per_batch` in pipeline clicks (did you mean "
            "`max_files_per_batch`?)",
        ),
        (
            "source: {path: i, format: csv}\n  sink: {path: o}\n  event_time: {column: ts, "
            "max_out_of_ordernes: 5s}\n  name: late\n",
            "unknown key `event_time.max_out_of_ordernes` in pipeline late (did you mean "
            "`max_out_of_orderness`?)",
        ),
        (
            "sink: {path: o}\n  source: {path: i, format: csv}\n  zzz: 1\n",
            "unknown key `zzz` in pipeline pipelines[0]: remove it (the keys there: aggregation,",
        ),
    ],
)
def test_a_mistyped_key_is_named_first_with_the_key_it_was_likely_meant_to_be(
    tmp_path: Path, pipeline: str, message: str
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"pipelines:\n- {pipeline}")
    with pytest.raises(PipelineConfigInvalid) as info:
        load_pipelines(str(path))
    assert str(info.value).startswith(f"{path}: {message}"), str(info.value)
    assert "\n" not in str(info.value)


def test_a_mistyped_keyword_in_a_python_file_names_the_model_and_the_key(tmp_path: Path) -> None:
    module = tmp_path / "mine.py"
    module.write_text(
        "from lowmark.batches.pipeline import Pipeline, FileSource, DeltaSink\n"
        "a = Pipeline(name='a', source=FileSource(pth='i', format='csv'), "
        "sink=DeltaSink(path='o'))\n"
    )
    with pytest.raises(PipelineConfigInvalid) as info:
        load_pipelines(str(module))
    assert str(info.value) == f"{module}: unknown key `pth` in FileSource (did you mean `path`?)"


def test_an_unknown_pipeline_lists_the_known_ones() -> None:
    with pytest.raises(PipelineNotFound, match=r"known: .*orders"):
        get_pipeline("nope", "lowmark.batches.demo")
