"""Source kinds: each declared once, by its config model, and built from that declaration."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.pipeline import (
    ONE_SYSTEM_SOURCES,
    SOURCE_KINDS,
    SOURCE_MODELS,
    DeltaSink,
    DeltaSource,
    FileSource,
    KafkaSource,
    Pipeline,
    SyntheticSource,
    UnionSource,
    kind_of,
)
from lowmark.batches.registry import load_pipelines
from lowmark.batches.sources import build_source, runtime_builder
from lowmark.batches.sources.delta_table import DeltaStreamSource
from lowmark.batches.sources.files import FileStreamSource
from lowmark.batches.sources.kafka import KafkaStreamSource
from lowmark.batches.sources.synthetic import SyntheticStreamSource
from lowmark.batches.sources.union import UnionStreamSource


def _no_spark() -> SparkSession:
    raise AssertionError("building a source must not start Spark")


def test_the_kinds_a_pipeline_accepts_are_the_kinds_of_its_source_models() -> None:
    assert {"files", "kafka", "delta", "synthetic", "custom", "union"} == SOURCE_KINDS
    assert {kind_of(m) for m in SOURCE_MODELS} == SOURCE_KINDS
    assert UnionSource not in ONE_SYSTEM_SOURCES


@pytest.mark.parametrize("model", SOURCE_MODELS, ids=kind_of)
def test_every_source_kind_names_a_runtime_builder_that_exists(model: type) -> None:
    assert callable(runtime_builder(model))


def test_each_built_in_kind_is_built_as_its_stream_source(tmp_path: Path) -> None:
    synthetic = SyntheticSource(total_rows=5, rows_per_second=None)
    sources = {
        "files": FileSource(path="in", format="json"),
        "kafka": KafkaSource(bootstrap_servers="h:1", topics=("t",), value_format="raw"),
        "delta": DeltaSource(path="upstream"),
        "synthetic": synthetic,
        "union": UnionSource(sources={"a": synthetic, "b": FileSource(path="in", format="csv")}),
    }
    built = {
        kind: build_source(
            _no_spark,
            Pipeline(name="p", source=config, sink=DeltaSink(path="out")),
            tmp_path,
            str(tmp_path / "checkpoint"),
        )
        for kind, config in sources.items()
    }
    assert {kind: type(source) for kind, source in built.items()} == {
        "files": FileStreamSource,
        "kafka": KafkaStreamSource,
        "delta": DeltaStreamSource,
        "synthetic": SyntheticStreamSource,
        "union": UnionStreamSource,
    }
    kafka = built["kafka"]
    assert isinstance(kafka, KafkaStreamSource) and kafka.group == "lowmark-p"
    union = built["union"]
    assert isinstance(union, UnionStreamSource)
    assert [type(part) for part in union.parts.values()] == [
        SyntheticStreamSource,
        FileStreamSource,
    ]


@pytest.mark.parametrize(
    "source",
    [
        "{kind: kafak, bootstrap_servers: 'h:1', topics: [t]}",
        "{kind: union, sources: {a: {kind: kafak}, b: {kind: synthetic, total_rows: 1}}}",
    ],
)
def test_an_unknown_kind_is_refused_in_one_line_naming_the_kinds(
    tmp_path: Path, source: str
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"pipelines:\n- name: k\n  source: {source}\n  sink: {{path: o}}\n")
    with pytest.raises(PipelineConfigInvalid) as refused:
        load_pipelines(str(path))
    message = str(refused.value)
    assert "\n" not in message and "'kafak'" in message
    assert "'files', 'kafka', 'delta', 'synthetic', 'custom'" in message
