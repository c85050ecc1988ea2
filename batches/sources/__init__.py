"""Sources lowmark can read, and the one function that builds them from config."""

from __future__ import annotations

from pathlib import Path

from batches.clock import Clock
from batches.pipeline import FileSource, KafkaSource, Pipeline, resolve
from batches.sources.base import Source, SourceRead
from batches.sources.files import FileStreamSource
from batches.sources.kafka import KafkaStreamSource
from batches.sources.synthetic import SyntheticStreamSource
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
    config = pipeline.source
    if isinstance(config, KafkaSource):
        return KafkaStreamSource(spark, config, config.consumer_group or f"lowmark-{pipeline.name}")
    if not isinstance(config, FileSource):
        return SyntheticStreamSource(spark, config, clock)
    if isinstance(checkpoint, str):
        manifest = FileManifest(f"{checkpoint}/files", ":files")
        schema = SourceSchema(f"{checkpoint}/schema", ":schema")
    else:
        manifest, schema = checkpoint.files, checkpoint.schema
    archive = resolve(config.archive_dir, data_root) if config.archive_dir else None
    return FileStreamSource(
        spark, config, resolve(config.path, data_root), manifest, schema, archive
    )
