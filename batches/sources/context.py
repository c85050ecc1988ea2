"""What building a runtime source may need besides its config."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lowmark.batches.clock import Clock
from lowmark.batches.pipeline import SourceKind
from lowmark.batches.sources.base import Source
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.session import SparkLike


@dataclass(frozen=True)
class SourceContext:
    """The pipeline a source is built for, and where its tables live.

    A source kind's ``RUNTIME`` builder is called as ``builder(config, context)``.
    """

    spark: SparkLike
    pipeline: str
    """The pipeline's name."""
    data_root: Path
    """What relative paths are resolved against."""
    checkpoint: Checkpoint | str
    """The open checkpoint, or only its location (a pipeline that never ran: the source
    answers read-only questions, such as its backlog)."""
    clock: Clock | None
    """What a paced source reads "now" from (None: the system clock)."""
    build: Callable[[SourceKind, bool], Source]
    """Builds another source of the same pipeline (a union's parts), and whether the
    watermark follows its ingestion clock (``ingestion_clock``)."""
    ingestion_clock: bool = False
    """The pipeline's watermark follows this source's ingestion clock (an ingestion-time
    watermark): aligned admission's clocks are its ingestion times."""
