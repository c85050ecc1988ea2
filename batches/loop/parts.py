"""The parts a pipeline's batches run with, built in one place.

``build_parts`` gives a runner (``lowmark.batches.loop.microbatch``) and ``lowmark
skip-batch`` everything they work with: the checkpoint (opened, or created),
the source, the event-time stage, the sink, the Spark work, the read-ahead
and the planner. ``read_only_planner`` gives a read-only question (``lowmark
status``, ``lowmark plan``, a sensor tick) the planner alone, and never
creates a checkpoint for it (but see ``Planner.next_batch`` on a start that
moves). Building parts starts no Spark: each part asks ``spark`` for the
session when it first needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from lowmark.batches.clock import Clock, SystemClock
from lowmark.batches.event_time.stage import WindowedStage
from lowmark.batches.loop.dimensions import Dimensions
from lowmark.batches.loop.plan import Planner
from lowmark.batches.loop.steps import WINDOWS, Steps
from lowmark.batches.sources import build_source
from lowmark.state import catalog
from lowmark.state.checkpoint import Checkpoint

# The parts only batches run with (the Spark work, the sinks) are imported by what builds
# them: a read-only question (``lowmark status``, ``plan``) needs the planner alone and must
# not import PySpark (docs/cli.md, "Fast commands").
if TYPE_CHECKING:
    from lowmark.batches.loop.batch_work import BatchWork
    from lowmark.batches.loop.catch_up import ReadAhead
    from lowmark.batches.pipeline import Pipeline
    from lowmark.batches.sinks import Sink, WindowedSink
    from lowmark.batches.sources.base import Source
    from lowmark.state.session import SparkLike


@dataclass(frozen=True)
class BatchParts:
    """What the batches of one pipeline run with."""

    checkpoint: Checkpoint
    source: Source
    stage: WindowedStage | None
    """Windowed pipelines' event-time stage (None: a stateless pipeline)."""
    sink: Sink | WindowedSink
    work: BatchWork
    read_ahead: ReadAhead | None
    """Windowed pipelines' catch-up read-ahead (``lowmark.batches.loop.catch_up``)."""
    planner: Planner


def build_parts(
    spark: SparkLike,
    pipeline: Pipeline,
    data_root: Path,
    clock: Clock | None = None,
    source: Source | None = None,
) -> BatchParts:
    """The parts of ``pipeline``'s batches, over its checkpoint (created if there is none,
    and started over if the definition changed before its first batch committed:
    ``lowmark.batches.loop.start_over``).

    ``clock``: what "now" is read from (default: the wall clock); ``source``:
    the runtime source to read through (default: the one its configuration
    builds, ``build_source``).

    Where its tables are is recorded in the data root's catalog (``lowmark.state.catalog``).
    """
    from lowmark.batches.loop.start_over import start_over

    checkpoint = Checkpoint(pipeline.checkpoint_location(data_root), pipeline.name)
    catalog.remember(data_root, pipeline.catalog_entry(data_root))
    parts = _parts(spark, pipeline, data_root, checkpoint, clock or SystemClock(), source)
    new = start_over(pipeline, parts.planner, parts.work, data_root)
    if new is None:
        return parts
    return _parts(spark, pipeline, data_root, new, clock or SystemClock(), source)


def _parts(
    spark: SparkLike,
    pipeline: Pipeline,
    data_root: Path,
    checkpoint: Checkpoint,
    clock: Clock,
    source: Source | None,
) -> BatchParts:
    from lowmark.batches.loop import faults
    from lowmark.batches.loop.batch_work import BatchWork
    from lowmark.batches.loop.catch_up import ReadAhead
    from lowmark.batches.sinks import build_sink
    from lowmark.state.session import provider

    session = provider(spark)
    source = source or build_source(spark, pipeline, data_root, checkpoint, clock)
    steps = Steps.build(pipeline, checkpoint, source)
    stage = steps.of(WINDOWS)
    app_id = checkpoint.txn_app_id("sink")
    staged = partial(faults.reached, "before_sink_commit")
    sink = build_sink(spark, pipeline, data_root, app_id, staged)
    dimensions = Dimensions(pipeline, data_root)
    work = BatchWork(session, pipeline, checkpoint, source, sink, steps, dimensions)
    # A batch of a step that reads what the batches before it wrote (``StepKind.looks_ahead``)
    # and a joining batch, which joins the dimensions' versions it is planned with, are not
    # looked at ahead.
    read_ahead = (
        ReadAhead(
            session, source, stage, work.unwatermarked, pipeline.read_ahead_batches, work.checks
        )
        if stage is not None and steps.look_ahead and not pipeline.joins
        else None
    )
    planner = Planner(pipeline, checkpoint, source, stage, clock, dimensions)
    return BatchParts(checkpoint, source, stage, sink, work, read_ahead, planner)


def read_only_planner(
    spark: SparkLike, pipeline: Pipeline, data_root: Path, clock: Clock | None = None
) -> Planner:
    """The planner of ``pipeline`` for a read-only question: over its checkpoint if it has
    one, else over the location, which planning creates only to fix a start that moves."""
    clock = clock or SystemClock()
    location = pipeline.checkpoint_location(data_root)
    dimensions = Dimensions(pipeline, data_root)
    if not Checkpoint.exists(location):
        source = build_source(spark, pipeline, data_root, location, clock)
        return Planner(pipeline, location, source, None, clock, dimensions)
    checkpoint = Checkpoint(location, pipeline.name)
    source = build_source(spark, pipeline, data_root, checkpoint, clock)
    stage = WINDOWS.build(pipeline, checkpoint)
    return Planner(pipeline, checkpoint, source, stage, clock, dimensions)
