"""A source the user writes: built by the factory its config names."""

from __future__ import annotations

from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.pipeline import CustomSource
from lowmark.batches.sources.base import Source
from lowmark.batches.sources.context import SourceContext


def from_factory(config: CustomSource, context: SourceContext) -> Source:
    """``config.factory(spark, options, data_root)``, checked to be a ``Source``."""
    source = config.factory(context.spark, config.options, context.data_root)
    if not isinstance(source, Source):
        raise PipelineConfigInvalid(
            f"pipeline {context.pipeline}: source factory {config.label} returned "
            f"{type(source).__name__}, not a lowmark.batches.sources.Source: return your "
            "Source subclass (docs/sources.md)"
        )
    return source
