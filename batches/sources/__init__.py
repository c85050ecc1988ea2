"""Sources lowmark can read, and the one function that builds them from config."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from batches.pipeline import Pipeline, resolve
from batches.sources.base import Source, SourceRead
from batches.sources.files import FileStreamSource
from state.manifest import FileManifest
from state.source_schema import SourceSchema

__all__ = ["Source", "SourceRead", "build_source"]


def build_source(
    spark: SparkSession, pipeline: Pipeline, data_root: Path, checkpoint: str, pipeline_id: str
) -> Source:
    """The runtime source for ``pipeline`` whose checkpoint is at ``checkpoint``."""
    config = pipeline.source
    return FileStreamSource(
        spark,
        config,
        resolve(config.path, data_root),
        FileManifest(spark, f"{checkpoint}/files", f"{pipeline_id}:files"),
        SourceSchema(spark, f"{checkpoint}/schema", f"{pipeline_id}:schema"),
    )
