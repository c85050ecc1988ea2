"""Sources lowmark can read, and the one function that builds them from config."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from lowmark.batches.clock import Clock
from lowmark.batches.pipeline import Pipeline, SourceKind
from lowmark.batches.sources.base import Source, SourceRead
from lowmark.batches.sources.context import SourceContext
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.session import SparkLike

__all__ = ["Source", "SourceContext", "SourceRead", "build_source", "runtime_builder"]


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
    paced synthetic source reads "now" from. Each kind is built by the
    function its config model names (``SourceKind.RUNTIME``).
    """

    def build(config: SourceKind, ingestion_clock: bool) -> Source:
        own = replace(context, ingestion_clock=ingestion_clock)
        source: Source = runtime_builder(type(config))(config, own)
        return source

    context = SourceContext(spark, pipeline.name, data_root, checkpoint, clock, build)
    event_time = pipeline.event_time
    return build(pipeline.source, event_time is not None and event_time.watermark is not None)


def runtime_builder(model: type[SourceKind]) -> Callable[[Any, SourceContext], Source]:
    """The function ``model.RUNTIME`` names (``module:qualname``)."""
    module, _, qualname = model.RUNTIME.partition(":")
    found: Any = importlib.import_module(module)
    for name in qualname.split("."):
        found = getattr(found, name)
    builder: Callable[[Any, SourceContext], Source] = found
    return builder
