"""Sources lowmark can read, and the one function that builds them from config."""

from __future__ import annotations

from pathlib import Path

from batches.clock import Clock
from batches.errors import PipelineConfigInvalid
from batches.pipeline import (
    CustomSource,
    DeltaSource,
    FileSource,
    KafkaSource,
    Pipeline,
    SourceConfig,
    SyntheticSource,
    UnionSource,
    resolve,
)
from batches.sources.base import Source, SourceRead
from batches.sources.delta_table import DeltaStreamSource
from batches.sources.files import FileStreamSource
from batches.sources.kafka import KafkaStreamSource
from batches.sources.synthetic import SyntheticStreamSource
from batches.sources.union import UnionStreamSource
from state.checkpoint import Checkpoint
from state.manifest import FileManifest
from state.session import SparkLike
from state.source_schema import SourceSchema

__all__ = ["Source", "SourceRead", "build_source"]


def build_source(
    spark: SparkLike,
    pipeline: Pipeline,
    data_root: Path,
    checkpoint: Checkpoint | str,
    clock: Clock | None = None,
) -> Source:
    """The runtime source for ``pipeline``, keeping its tables in ``checkpoint``.

    A location instead of an open checkpoint (a pipeline that never ran)
    gives a source for read-only questions (its backlog). ``clock``: what a
    paced synthetic source reads "now" from.
    """

    def build(config: SourceConfig) -> Source:
        if isinstance(config, UnionSource):
            parts = {name: build(c) for name, c in config.sources.items()}
            return UnionStreamSource(parts, config.transforms)
        if isinstance(config, CustomSource):
            source = config.factory(spark, config.options, data_root)
            if not isinstance(source, Source):
                raise PipelineConfigInvalid(
                    f"pipeline {pipeline.name}: source factory {config.label} returned "
                    f"{type(source).__name__}, not a batches.sources.Source: return your "
                    "Source subclass (docs/sources.md)"
                )
            return source
        if isinstance(config, KafkaSource):
            group = config.consumer_group or f"lowmark-{pipeline.name}"
            return KafkaStreamSource(spark, config, group)
        if isinstance(config, DeltaSource):
            return DeltaStreamSource(spark, config, resolve(config.path, data_root))
        if isinstance(config, SyntheticSource):
            return SyntheticStreamSource(spark, config, clock)
        return _files(spark, config, data_root, checkpoint)

    return build(pipeline.source)


def _files(
    spark: SparkLike, config: FileSource, data_root: Path, checkpoint: Checkpoint | str
) -> FileStreamSource:
    if isinstance(checkpoint, str):
        manifest = FileManifest(f"{checkpoint}/files", ":files")
        schema = SourceSchema(f"{checkpoint}/schema", ":schema")
    else:
        manifest, schema = checkpoint.files, checkpoint.schema
    archive = resolve(config.archive_dir, data_root) if config.archive_dir else None
    return FileStreamSource(
        spark, config, resolve(config.path, data_root), manifest, schema, archive
    )
