"""The stateful steps of a pipeline's batches, registered in one place.

A stateful step (windows, deduplication, a keyed step with timers, a stream-stream join)
keeps what it holds between batches in state tables of the checkpoint, each under the one
exactly-once contract of ``lowmark.state.state_table``. ``STEPS`` registers every kind:
the tables it holds (``TableSpec``), how a pipeline's step is built over its checkpoint,
the ``StateTable`` handles a built step writes through, how a batch's outcome writes them
(step 6), and whether the catch-up read-ahead may look at its batches ahead.

Everything that goes over state goes through ``STEPS``: the batches (``Steps``: their
replays' pins, their writes, the versions their commits record), ``lowmark skip-batch``
(restore), ``lowmark reset --after-sink`` (carry over), maintenance (keep the recorded
version readable) and the fault matrix (compare every state table). A new stateful feature
is its own modules plus one entry here; one that changes the records a batch's sink gets
also takes its place in ``BatchWork._take``'s chain.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, cast

from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.event_time.stage import WindowedStage, window_state
from lowmark.batches.event_time.watermarks import IngestionLags
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.state_table import StateTable, TableSpec, existing

# The steps a batch runs with only are imported by what builds them: a read-only question
# (``lowmark status``, ``plan``) builds the windows alone and must not import PySpark
# (docs/cli.md, "Fast commands").
if TYPE_CHECKING:
    from lowmark.batches.event_time.dedup import DedupStep
    from lowmark.batches.event_time.driver_merge import WindowChanges
    from lowmark.batches.event_time.interval_join import IntervalJoin, Joined
    from lowmark.batches.keyed.step import KeyedStep
    from lowmark.batches.loop.catch_up import Seen
    from lowmark.batches.loop.plan import PlannedBatch
    from lowmark.batches.pipeline import Pipeline
    from lowmark.batches.sources.base import Source

S = TypeVar("S")


class Outcome(Protocol):
    """What a batch computed before its writes, as the steps' writes read it
    (``lowmark.batches.loop.outcome.Outcome``, which imports the batch's Spark work)."""

    @property
    def seen(self) -> Seen: ...

    @property
    def changes(self) -> WindowChanges | None: ...

    @property
    def joined(self) -> Joined | None: ...


class StepKind(ABC, Generic[S]):
    """One kind of stateful step (``S``: its runtime step), registered in ``STEPS``."""

    tables: ClassVar[tuple[TableSpec, ...]]
    """The state tables its steps hold (what maintenance and reset find in a checkpoint)."""
    looks_ahead: ClassVar[bool] = False
    """Whether the catch-up read-ahead may look at its batches before the batches ahead of
    them commit: not when a batch reads what the batches before it wrote."""

    @abstractmethod
    def build(self, pipeline: Pipeline, checkpoint: Checkpoint, source: Source) -> S | None:
        """The step of ``pipeline`` over ``checkpoint`` (its tables made if a batch's replay
        reads a first version of them), None when the pipeline has none."""

    @abstractmethod
    def contracts(self, step: S) -> tuple[StateTable, ...]:
        """The handles ``step`` reads and writes its ``tables`` through."""

    @abstractmethod
    def write(self, step: S, outcome: Outcome, planned: PlannedBatch) -> int | None:
        """Step 6's write of ``planned``'s changes to ``step``'s tables, idempotent per batch;
        when a batch is next due with no input for it (a timer; None: never)."""


class Windows(StepKind[WindowedStage]):
    """Windows and their aggregates (``lowmark.batches.event_time.stage``)."""

    tables = (TableSpec("state_windows", "state", None),)
    looks_ahead = True  # a batch's partials do not depend on the state before it

    def build(
        self, pipeline: Pipeline, checkpoint: Checkpoint, source: Source | None = None
    ) -> WindowedStage | None:
        """Behind a keyed step it windows the step's output rows, by their event-time column
        (``Keyed.output_event_time``)."""
        event_time = pipeline.event_time
        if pipeline.aggregation is None or event_time is None:
            return None
        if pipeline.keyed is not None and pipeline.keyed.output_event_time is not None:
            event_time = event_time.model_copy(update={"column": pipeline.keyed.output_event_time})
        state = window_state(checkpoint, pipeline.aggregation)
        lags = IngestionLags.of_pipeline(pipeline)
        return WindowedStage(event_time, pipeline.aggregation, state, lags)

    def contracts(self, step: WindowedStage) -> tuple[StateTable, ...]:
        return (step.state.contract,)

    def write(self, step: WindowedStage, outcome: Outcome, planned: PlannedBatch) -> int | None:
        changes = outcome.changes
        if changes is not None:
            step.state.apply(changes.upserts, changes.deletes, planned.batch_id)
        return None


class Dedup(StepKind["DedupStep"]):
    """Deduplication within a time (``lowmark.batches.event_time.dedup``)."""

    tables = (TableSpec("dedup_ids", "dedup", 0),)

    def build(self, pipeline: Pipeline, checkpoint: Checkpoint, source: Source) -> DedupStep | None:
        from lowmark.batches.event_time.dedup import DedupStep
        from lowmark.state.seen_ids import SeenIds

        if pipeline.dedup is None or pipeline.event_time is None:
            return None
        [spec] = self.tables
        within_us = pipeline.dedup.within * 1000
        ids = SeenIds(checkpoint.table(spec.folder), checkpoint.txn_app_id(spec.role), within_us)
        ids.create()
        lags = IngestionLags.of_pipeline(pipeline)
        return DedupStep(pipeline.dedup, pipeline.event_time.column, ids, lags)

    def contracts(self, step: DedupStep) -> tuple[StateTable, ...]:
        return (step.seen_ids.contract,)

    def write(self, step: DedupStep, outcome: Outcome, planned: PlannedBatch) -> int | None:
        """The ids the batch let through, then the ids the watermark passed."""
        judged = outcome.seen.judged
        if judged is None:
            return None
        if judged.id_files:
            step.seen_ids.commit(judged.id_files, planned.batch_id)
        step.seen_ids.purge(planned.watermark_ms, planned.batch_id)
        return None


class Keyed(StepKind["KeyedStep"]):
    """A keyed processor's state and timers (``lowmark.batches.keyed``)."""

    tables = (
        TableSpec("keyed_state", "keyed_state", 0),
        TableSpec("keyed_timers", "keyed_timers", 0),
    )

    def build(self, pipeline: Pipeline, checkpoint: Checkpoint, source: Source) -> KeyedStep | None:
        from lowmark.batches.keyed.step import KeyedStep
        from lowmark.state.keyed_state import KeyedTables

        if pipeline.keyed is None or pipeline.event_time is None:
            return None
        state, timers = (checkpoint.table(spec.folder) for spec in self.tables)
        slot_ms = pipeline.event_time.max_out_of_orderness
        tables = KeyedTables(state, timers, checkpoint.pipeline_id, slot_ms=slot_ms)
        tables.create()
        lags = IngestionLags.of_pipeline(pipeline).by_prefix
        return KeyedStep(pipeline.keyed, pipeline.event_time.column, tables, lags)

    def contracts(self, step: KeyedStep) -> tuple[StateTable, ...]:
        return tuple(step.tables.contracts.values())

    def write(self, step: KeyedStep, outcome: Outcome, planned: PlannedBatch) -> int | None:
        """The state and timers the batch's tasks wrote; the next pending timer after the
        time the batch ran at."""
        keyed = outcome.seen.keyed
        if keyed is None:
            return None
        ran_at = step.ran_at(planned.watermark_ms, planned.planned_at_ms)
        step.tables.write(keyed.files, planned.batch_id, ran_at)
        return step.tables.next_pending(ran_at)


class StreamJoin(StepKind["IntervalJoin"]):
    """A stream-stream join's held rows (``lowmark.batches.event_time.interval_join``)."""

    tables = (TableSpec("join_state", "join_state", 0),)

    def build(
        self, pipeline: Pipeline, checkpoint: Checkpoint, source: Source
    ) -> IntervalJoin | None:
        """Its rows are partitioned by event time in steps of the out-of-orderness."""
        from lowmark.batches.event_time.interval_join import IntervalJoin
        from lowmark.batches.sources.union import UnionStreamSource
        from lowmark.state.join_state import JoinState

        if pipeline.stream_join is None or pipeline.event_time is None:
            return None
        union = source.reader()
        if not isinstance(union, UnionStreamSource):
            raise PipelineConfigInvalid(
                f"pipeline {pipeline.name} joins two sources of a union, but runs with a "
                f"{type(union).__name__}: give it the union's sources"
            )
        [spec] = self.tables
        slot_ms = pipeline.event_time.max_out_of_orderness
        app_id = checkpoint.txn_app_id(spec.role)
        state = JoinState(checkpoint.table(spec.folder), app_id, slot_ms=slot_ms)
        state.create()
        lags = IngestionLags.of_pipeline(pipeline).by_prefix
        return IntervalJoin(pipeline.stream_join, pipeline.event_time, union, state, lags)

    def contracts(self, step: IntervalJoin) -> tuple[StateTable, ...]:
        return (step.state.contract,)

    def write(self, step: IntervalJoin, outcome: Outcome, planned: PlannedBatch) -> int | None:
        joined = outcome.joined
        if joined is not None:
            step.state.write(joined.state, planned.batch_id, joined.evict_below)
        return None


WINDOWS, DEDUP, KEYED, STREAM_JOIN = Windows(), Dedup(), Keyed(), StreamJoin()
STEPS: tuple[StepKind[Any], ...] = (WINDOWS, DEDUP, KEYED, STREAM_JOIN)
"""Every kind of stateful step, in the order a batch writes their tables."""
STATE_TABLES: tuple[TableSpec, ...] = tuple(spec for kind in STEPS for spec in kind.tables)
"""Every state table a checkpoint may hold."""


def found_state_tables(location: str, pipeline_id: str) -> list[StateTable]:
    """The state tables the checkpoint at ``location`` (of ``pipeline_id``) holds, whatever
    step wrote them: what maintenance and ``lowmark reset --after-sink`` go through."""
    return existing(location, pipeline_id, STATE_TABLES)


@dataclass(frozen=True)
class Steps:
    """The stateful steps of one pipeline's batches (of the kinds in ``STEPS``)."""

    built: Mapping[StepKind[Any], object]
    """Each kind the pipeline has, and its step."""

    @classmethod
    def build(
        cls,
        pipeline: Pipeline,
        checkpoint: Checkpoint,
        source: Source,
        given: Mapping[StepKind[Any], object | None] | None = None,
    ) -> Steps:
        """The steps ``pipeline`` has, over ``checkpoint``; those ``given`` (already built:
        the windows a planner plans with) are taken as they are."""
        given = given or {}
        built = {
            kind: given[kind] if kind in given else kind.build(pipeline, checkpoint, source)
            for kind in STEPS
        }
        return cls({kind: step for kind, step in built.items() if step is not None})

    def of(self, kind: StepKind[S]) -> S | None:
        """The step of ``kind`` (None: the pipeline has none)."""
        return cast("S | None", self.built.get(kind))

    @property
    def tables(self) -> tuple[StateTable, ...]:
        """Every state table the batches write."""
        return tuple(t for kind, step in self.built.items() for t in kind.contracts(step))

    def versions_after(self) -> dict[str, int]:
        """Every state table's version now, by role (a table not made yet has none): what a
        batch's commit records (``StateTable.version_after``)."""
        versions = ((t.role, t.version_after()) for t in self.tables)
        return {role: version for role, version in versions if version is not None}

    @property
    def look_ahead(self) -> bool:
        """Whether the catch-up read-ahead may look at batches ahead (every step allows)."""
        return all(kind.looks_ahead for kind in self.built)

    def write(self, outcome: Outcome, planned: PlannedBatch) -> int | None:
        """Step 6's state writes of ``planned``, each idempotent per batch; when a batch is
        next due with no input (the earliest any step asks for; None: none asks)."""
        due = [kind.write(step, outcome, planned) for kind, step in self.built.items()]
        return min((at for at in due if at is not None), default=None)
