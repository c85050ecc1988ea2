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

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING

from lowmark.batches.clock import Clock, SystemClock
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
    from lowmark.batches.event_time.stage import WindowedStage
    from lowmark.batches.loop.batch_work import BatchWork
    from lowmark.batches.loop.catch_up import ReadAhead
    from lowmark.batches.pipeline import Pipeline
    from lowmark.batches.sinks import Sink, WindowedSink
    from lowmark.batches.sources.base import Source
    from lowmark.state.session import SparkLike


@dataclass(frozen=True)
class BatchParts:
    """What the batches of one pipeline run with. What only a batch runs with (the sink, the
    Spark work, the read-ahead) is built when first asked for, so that a run with nothing to
    do plans and ends without importing PySpark."""

    checkpoint: Checkpoint
    source: Source
    stage: WindowedStage | None
    """Windowed pipelines' event-time stage (None: a stateless pipeline)."""
    planner: Planner
    built: Callable[[], SparkParts]
    """Builds the rest (``sink``, ``work``, ``read_ahead``), once."""

    @cached_property
    def _spark_parts(self) -> SparkParts:
        return self.built()

    @property
    def sink(self) -> Sink | WindowedSink:
        return self._spark_parts.sink

    @property
    def work(self) -> BatchWork:
        return self._spark_parts.work

    @property
    def read_ahead(self) -> ReadAhead | None:
        """Windowed pipelines' catch-up read-ahead (``lowmark.batches.loop.catch_up``)."""
        return self._spark_parts.read_ahead


@dataclass(frozen=True)
class SparkParts:
    """The parts only a batch runs with (``BatchParts``)."""

    sink: Sink | WindowedSink
    work: BatchWork
    read_ahead: ReadAhead | None


def build_parts(
    spark: SparkLike,
    pipeline: Pipeline,
    data_root: Path,
    clock: Clock | None = None,
    source: Source | None = None,
    records_as: Pipeline | None = None,
) -> BatchParts:
    """The parts of ``pipeline``'s batches, over its checkpoint (created if there is none,
    and started over if the definition changed before its first batch committed:
    ``lowmark.batches.loop.start_over``).

    ``clock``: what "now" is read from (default: the wall clock); ``source``:
    the runtime source to read through (default: the one its configuration
    builds, ``build_source``); ``records_as``: the pipeline whose definition the batches
    record (``Planner``; a rebuild's shadow).

    Where its tables are is recorded in the data root's catalog (``lowmark.state.catalog``),
    but for a shadow (``records_as``): the catalog names the live tables.
    """
    from lowmark.batches.loop.start_over import start_over

    checkpoint = Checkpoint(pipeline.checkpoint_location(data_root), pipeline.name)
    if records_as is None:
        catalog.remember(data_root, pipeline.catalog_entry(data_root))
    clock = clock or SystemClock()
    parts = _parts(spark, pipeline, data_root, checkpoint, clock, source, records_as)
    new = start_over(pipeline, parts.planner, lambda: parts.work, data_root)
    if new is None:
        return parts
    return _parts(spark, pipeline, data_root, new, clock, source, records_as)


def _parts(
    spark: SparkLike,
    pipeline: Pipeline,
    data_root: Path,
    checkpoint: Checkpoint,
    clock: Clock,
    source: Source | None,
    records_as: Pipeline | None = None,
) -> BatchParts:
    the_source = source or build_source(spark, pipeline, data_root, checkpoint, clock)
    stage = WINDOWS.build(pipeline, checkpoint)
    dimensions = Dimensions(pipeline, data_root)

    def built() -> SparkParts:
        from lowmark.batches.loop import faults
        from lowmark.batches.loop.batch_work import BatchWork
        from lowmark.batches.loop.catch_up import ReadAhead
        from lowmark.batches.sinks import build_sink
        from lowmark.state.session import provider

        session = provider(spark)
        steps = Steps.build(pipeline, checkpoint, the_source, {WINDOWS: stage})
        staged = partial(faults.reached, "before_sink_commit")
        sink = build_sink(spark, pipeline, data_root, checkpoint.txn_app_id("sink"), staged)
        work = BatchWork(session, pipeline, checkpoint, the_source, sink, steps, dimensions)
        # A batch of a step that reads what the batches before it wrote
        # (``StepKind.looks_ahead``) and a joining batch, which joins the dimensions'
        # versions it is planned with, are not looked at ahead.
        read_ahead = (
            ReadAhead(
                session,
                the_source,
                stage,
                work.unwatermarked,
                pipeline.read_ahead_batches,
                work.checks,
            )
            if stage is not None and steps.look_ahead and not pipeline.joins
            else None
        )
        return SparkParts(sink, work, read_ahead)

    planner = Planner(pipeline, checkpoint, the_source, stage, clock, dimensions, records_as)
    return BatchParts(checkpoint, the_source, stage, planner, built)


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
