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
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.event_time.stage import WindowedStage, window_state
from lowmark.batches.loop.dimensions import Dimensions
from lowmark.batches.loop.plan import Planner
from lowmark.batches.sources import build_source
from lowmark.state import catalog
from lowmark.state.checkpoint import Checkpoint

# The parts only batches run with (the Spark work, the sinks, the keyed, dedup and join
# steps) are imported by what builds them: a read-only question (``lowmark status``,
# ``plan``) needs the planner alone and must not import PySpark (docs/cli.md, "Fast commands").
if TYPE_CHECKING:
    from lowmark.batches.event_time.dedup import DedupStep
    from lowmark.batches.event_time.interval_join import IntervalJoin
    from lowmark.batches.keyed.step import KeyedStep
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
    stage = _stage(pipeline, checkpoint)
    app_id = checkpoint.txn_app_id("sink")
    staged = partial(faults.reached, "before_sink_commit")
    sink = build_sink(spark, pipeline, data_root, app_id, staged)
    dimensions = Dimensions(pipeline, data_root)
    work = BatchWork(
        session,
        pipeline,
        checkpoint,
        source,
        stage,
        sink,
        _dedup(pipeline, checkpoint),
        _keyed(pipeline, checkpoint),
        dimensions,
        _join(pipeline, checkpoint, source),
    )
    # A deduplicating batch judges its records against what the batches before it let
    # through, a keyed step runs on the state the batches before it left, and a joining
    # batch joins the dimensions' versions it is planned with: none is looked at ahead.
    # (Nor is a stream-stream join's, which has no windows.)
    read_ahead = (
        ReadAhead(
            session, source, stage, work.unwatermarked, pipeline.read_ahead_batches, work.checks
        )
        if stage is not None
        and pipeline.dedup is None
        and pipeline.keyed is None
        and not pipeline.joins
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
    stage = _stage(pipeline, checkpoint)
    return Planner(pipeline, checkpoint, source, stage, clock, dimensions)


def _stage(pipeline: Pipeline, checkpoint: Checkpoint) -> WindowedStage | None:
    """The event-time stage of a windowed pipeline, its state in ``checkpoint``. Behind a
    keyed step it windows the step's output rows, by their event-time column
    (``Keyed.output_event_time``)."""
    event_time = pipeline.event_time
    if pipeline.aggregation is None or event_time is None:
        return None
    if pipeline.keyed is not None and pipeline.keyed.output_event_time is not None:
        event_time = event_time.model_copy(update={"column": pipeline.keyed.output_event_time})
    return WindowedStage(
        event_time, pipeline.aggregation, window_state(checkpoint, pipeline.aggregation)
    )


def _dedup(pipeline: Pipeline, checkpoint: Checkpoint) -> DedupStep | None:
    """The deduplication of a pipeline with ``dedup``, its seen ids in ``checkpoint``."""
    from lowmark.batches.event_time.dedup import DedupStep
    from lowmark.state.seen_ids import SeenIds

    if pipeline.dedup is None or pipeline.event_time is None:
        return None
    seen_ids = SeenIds(
        checkpoint.table("dedup_ids"), checkpoint.txn_app_id("dedup"), pipeline.dedup.within * 1000
    )
    seen_ids.create()
    return DedupStep(pipeline.dedup, pipeline.event_time.column, seen_ids)


def _keyed(pipeline: Pipeline, checkpoint: Checkpoint) -> KeyedStep | None:
    """The keyed step of a pipeline with ``keyed``, its state and timers in ``checkpoint``."""
    from lowmark.batches.keyed.step import KeyedStep
    from lowmark.state.keyed_state import KeyedTables

    if pipeline.keyed is None or pipeline.event_time is None:
        return None
    tables = KeyedTables(
        checkpoint.table("keyed_state"),
        checkpoint.table("keyed_timers"),
        checkpoint.pipeline_id,
        slot_ms=pipeline.event_time.max_out_of_orderness,
    )
    tables.create()
    return KeyedStep(pipeline.keyed, pipeline.event_time.column, tables)


def _join(pipeline: Pipeline, checkpoint: Checkpoint, source: Source) -> IntervalJoin | None:
    """The stream-stream join of a pipeline with ``stream_join``, its held rows in
    ``checkpoint`` (partitioned by event time in steps of the out-of-orderness)."""
    from lowmark.batches.event_time.interval_join import IntervalJoin
    from lowmark.batches.sources.union import UnionStreamSource
    from lowmark.state.join_state import TABLE as JOIN_TABLE
    from lowmark.state.join_state import JoinState

    if pipeline.stream_join is None or pipeline.event_time is None:
        return None
    if not isinstance(source, UnionStreamSource):
        raise PipelineConfigInvalid(
            f"pipeline {pipeline.name} joins two sources of a union, but runs with a "
            f"{type(source).__name__}: give it the union's sources"
        )
    state = JoinState(
        checkpoint.table(JOIN_TABLE),
        checkpoint.txn_app_id(JOIN_TABLE),
        slot_ms=pipeline.event_time.max_out_of_orderness,
    )
    state.create()
    return IntervalJoin(pipeline.stream_join, pipeline.event_time, source, state)
