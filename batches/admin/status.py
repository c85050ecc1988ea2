"""Read-only views of a pipeline's checkpoint: ``status``, ``plan`` and ``history``.

Nothing here writes: a pipeline that never ran has no checkpoint, and status
says so (with the backlog waiting for its first batch); planning is the
runner's own planner asked for a dry run (``lowmark.batches.loop.plan``). One
exception: a source whose start moves ("latest") has it fixed by the first
plan, a dry run's too, in a checkpoint created for it (as the first run would
create it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lowmark.batches.clock import Clock, SystemClock
from lowmark.batches.evolution import Change, classify
from lowmark.batches.loop.parts import read_only_planner
from lowmark.batches.loop.plan import NextBatch, Planner
from lowmark.batches.loop.preflight import find_problem
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.sources.base import describe_range
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.commit_log import COUNTS, CommitEntry
from lowmark.state.failures import FailureKind
from lowmark.state.offset_log import OffsetEntry, Offsets
from lowmark.state.session import SparkLike

if TYPE_CHECKING:
    from lowmark.state.keyed_state import Held


@dataclass(frozen=True)
class NextBatchStatus:
    """What a run would do now, by the runner's own planning rule (``Planner.next_batch``)."""

    batch_id: int
    replay: bool
    """An uncommitted batch, run again with exactly its offsets and watermark."""
    emit_only: bool
    """No new input, but the watermark moved and closes windows."""
    reason: str
    """Why, in words."""


@dataclass(frozen=True)
class PartitionStatus:
    """One source partition's event times as of the newest commit."""

    partition: str
    max_event_time_ms: int
    watermark_ms: int
    """Its watermark: max event time minus ``max_out_of_orderness``; with an ingestion-time
    watermark, its ingestion time minus ``max_event_time_lag``."""
    last_seen_ms: int
    ingestion_ms: int | None = None
    """With an ingestion-time watermark, the source's ingestion time past the committed end
    as the last commit's batch was planned (None otherwise)."""


@dataclass(frozen=True)
class LastBatch:
    """The newest committed batch."""

    batch_id: int
    committed_at_ms: int
    input: str
    """Its input range in words."""
    accounting: dict[str, int]
    """Where its records went (``_accounting``, of one batch)."""
    closed_windows_held: int | None
    """How many records the windows it closed held (None: no windows)."""
    violations: dict[str, int]
    """Per expectation, its records that violated it (``parsable``: rows that did not
    parse; ``lowmark.batches.expectations``)."""
    dimension_versions: dict[str, int] | None = None
    """With stream-table joins: the version of each joined table it joined with."""


@dataclass(frozen=True)
class LastFailure:
    """The next batch's latest failed attempt (``lowmark.batches.loop.poison``)."""

    kind: FailureKind
    error: str
    failed_at_ms: int
    attempts: dict[str, int]
    """Failed attempts so far, by kind: ``{data, operational}``."""


@dataclass(frozen=True)
class PipelineStatus:
    """A pipeline's position: committed batch, pending batch, next batch, offsets, backlog.

    Its fields are ``lowmark status --json``'s keys (``to_json``: stable,
    documented in the README).
    """

    pipeline: str
    checkpoint: str
    checkpoint_exists: bool
    pipeline_id: str | None
    as_of_ms: int
    """The processing time of this status: ages and the lag count from it."""
    last_committed_batch: int | None
    last_committed_at_ms: int | None
    pending_batch: int | None
    """The uncommitted batch a run replays first (None: none)."""
    next_batch: NextBatchStatus | None
    """None when there is nothing to do."""
    end_offsets: Offsets | None
    """Where the committed input ends (None before the first commit)."""
    watermark_ms: int | None
    event_time_lag_ms: int | None
    """``as_of_ms - watermark_ms``."""
    partitions: list[PartitionStatus]
    backlog: dict[str, int]
    """The source's counts of what waits past the committed end, e.g. ``{files, bytes}``."""
    backlog_described: str
    """``backlog`` in words."""
    totals: dict[str, int]
    """The commit counts summed over every committed batch (``CommitEntry.totals``)."""
    accounting: dict[str, int]
    """Where the records read went, over all batches (``_accounting``)."""
    violations: dict[str, int]
    """Per expectation, the records that violated it over all committed batches
    (``CommitEntry.violation_totals``)."""
    last_batch: LastBatch | None
    """None before the first commit."""
    blocked: str | None
    """Why the next batch is not run again by itself: a poison batch, or one that kept
    stopping on an operational error (``lowmark.batches.loop.poison``); else None."""
    last_failure: LastFailure | None
    """None when the next batch has not failed."""
    keyed: Held | None = None
    """A keyed step's keys held, timers pending and the next timer (None: no keyed step)."""
    join_held: dict[str, int] | None = None
    """A stream-stream join's rows held, per source name (None: no join)."""
    definitions: list[DefinitionRange] = dataclasses.field(default_factory=list)
    """The batches of the offset log (as far back as it keeps them) by the definition
    they were planned with, oldest first (empty before the first batch)."""
    pending_changes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The definition's changes since the latest batch was planned, each compatible at a
    batch boundary (``Change.to_json``): the next new batch runs under them (a change
    of another class stops the status with its error instead)."""

    def to_json(self) -> dict[str, Any]:
        """The status as JSON-ready data: ``lowmark status --json``, Dagster metadata."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class DefinitionRange:
    """Batches ``first_batch`` to ``last_batch`` (both included), planned under one
    definition (``Pipeline.fingerprint``)."""

    first_batch: int
    last_batch: int
    fingerprint: str
    changes: list[dict[str, Any]]
    """How the definition differs from the range's before, each change with its class
    (``lowmark.batches.evolution.Change.to_json``); empty for the first range, and when
    either entry predates recording definitions."""


def definition_ranges(checkpoint: Checkpoint) -> list[DefinitionRange]:
    """The offset log's batches by the definition they were planned with, oldest first.

    Reads each entry's batch id and fingerprint only (every entry parsed whole cost twice
    as much), and whole only the two entries on each side of a change of fingerprint."""
    offsets = checkpoint.offsets
    rows = offsets.table.query(
        'SELECT "batch_id", "pipeline_fingerprint" FROM t ORDER BY "batch_id"'
    ).to_pylist()
    ranges: list[DefinitionRange] = []
    for row in rows:
        batch_id, fingerprint = row["batch_id"], row["pipeline_fingerprint"]
        if ranges and fingerprint == ranges[-1].fingerprint:
            ranges[-1] = dataclasses.replace(ranges[-1], last_batch=batch_id)
            continue
        changes: Sequence[Change] = ()
        if ranges:
            before, entry = offsets.get(ranges[-1].last_batch), offsets.get(batch_id)
            old = before.pipeline_definition if before is not None else None
            new = entry.pipeline_definition if entry is not None else None
            changes = classify(old, new) if old is not None and new is not None else ()
        ranges.append(
            DefinitionRange(
                first_batch=batch_id,
                last_batch=batch_id,
                fingerprint=fingerprint,
                changes=[change.to_json() for change in changes],
            )
        )
    return ranges


def pipeline_status(
    spark: SparkLike,
    pipeline: Pipeline,
    data_root: Path,
    clock: Clock | None = None,
    definitions: bool = True,
) -> PipelineStatus:
    """The pipeline's position now (``PipelineStatus``), by the runner's own planner asked
    for a dry run.

    Reads the checkpoint on the driver only, a few rows of each log: the
    commit entry carries the running totals. ``spark`` may be a function
    that returns the session: it is called only if the source needs Spark
    (a folder on an object store), so a status of local folders starts none.
    ``definitions`` False leaves ``PipelineStatus.definitions`` empty: they read the
    whole offset log kept (a file per batch until maintenance compacts it, 60-100 ms at
    200 batches), which the sensor's tick does not show.
    """
    as_of = (clock or SystemClock()).now_ms()
    planner = read_only_planner(spark, pipeline, data_root, clock)
    nxt = planner.next_batch(dry_run=True)
    committed = planner.last_committed()
    source, checkpoint = planner.source, planner.checkpoint
    end = _committed_end(planner, committed)
    backlog = source.backlog(end)
    latest, done = planner.position()
    watermark = done.next_watermark_ms if done else None
    pending = latest and (done is None or latest.batch_id > done.batch_id)
    return PipelineStatus(
        pipeline=pipeline.name,
        checkpoint=pipeline.checkpoint_location(data_root),
        checkpoint_exists=checkpoint is not None,
        pipeline_id=checkpoint.pipeline_id if checkpoint else None,
        as_of_ms=as_of,
        last_committed_batch=done.batch_id if done else None,
        last_committed_at_ms=_epoch_ms(done.created_at) if done else None,
        pending_batch=latest.batch_id if latest and pending else None,
        next_batch=_next_batch(planner, nxt, backlog),
        end_offsets=end if done else None,
        watermark_ms=watermark,
        event_time_lag_ms=as_of - watermark if watermark is not None else None,
        partitions=_partitions(planner, done, committed),
        backlog=backlog,
        backlog_described=source.describe_backlog(backlog),
        totals=done.totals if done else dict.fromkeys(COUNTS, 0),
        accounting=_accounting(pipeline, done.totals if done else {}),
        violations=done.violation_totals if done else {},
        last_batch=_last_batch(pipeline, done, committed),
        blocked=nxt.blocked,
        last_failure=_last_failure(planner, nxt),
        keyed=_keyed_held(pipeline, checkpoint, as_of, watermark),
        join_held=_join_held(pipeline, checkpoint),
        definitions=(
            definition_ranges(checkpoint) if checkpoint is not None and definitions else []
        ),
        pending_changes=[change.to_json() for change in planner.pending],
    )


def _keyed_held(
    pipeline: Pipeline, checkpoint: Checkpoint | None, as_of_ms: int, watermark_ms: int | None
) -> Held | None:
    """A keyed step's keys held, timers pending and next timer (None: no keyed step, or no
    checkpoint yet)."""
    keyed = pipeline.keyed
    if keyed is None or checkpoint is None:
        return None
    from lowmark.state.keyed_state import held  # a keyed step's only: Arrow compute

    return held(
        f"{checkpoint.location}/keyed_state",
        f"{checkpoint.location}/keyed_timers",
        keyed.expiry(as_of_ms, watermark_ms),
    )


def _join_held(pipeline: Pipeline, checkpoint: Checkpoint | None) -> dict[str, int] | None:
    """The rows a stream-stream join holds, by the source names of its sides (None: no join)."""
    join = pipeline.stream_join
    if join is None:
        return None
    from lowmark.state.join_state import TABLE as JOIN_TABLE  # a join's only: Arrow compute
    from lowmark.state.join_state import rows_held

    held = rows_held(f"{checkpoint.location}/{JOIN_TABLE}") if checkpoint is not None else {}
    return {join.left: held.get("left", 0), join.right: held.get("right", 0)}


@dataclass(frozen=True)
class BatchPlan:
    """What the next batch would take, by the runner's own rule (``pipeline_plan``).

    Its fields are ``lowmark plan --json``'s keys (``to_json``: stable, documented
    in the docs). With nothing to do, ``batch_id`` and every field after
    ``emit_only`` are None (``inputs`` empty), and ``reason`` says why.
    """

    pipeline: str
    checkpoint: str
    checkpoint_exists: bool
    as_of_ms: int
    """The processing time the plan is made at."""
    reason: str
    """Why, in words (also when there is nothing to do)."""
    batch_id: int | None
    replay: bool
    """An uncommitted batch, run again with exactly the offsets and watermark of its
    offset-log entry."""
    emit_only: bool
    """No new input, but the watermark moved and closes windows."""
    start_offsets: Offsets | None
    end_offsets: Offsets | None
    """The batch's range ``[start, end)``."""
    input: str | None
    """That range in words."""
    inputs: list[str]
    """What the source names in it, one item each: files, offset ranges (``Source.inputs``)."""
    bytes: int | None
    """Their size, if the source knows it (``Source.input_bytes``)."""
    watermark_ms: int | None
    """The watermark the batch runs with: records with earlier event times are late."""
    planned_at_ms: int | None
    """The processing time it is planned at (a replay: when it was first planned)."""
    blocked: str | None
    """As in ``PipelineStatus.blocked``."""
    problem: str | None = None
    """Why a run would stop before Spark starts: the definition does not fit the batch's
    input or the sink (``lowmark.batches.loop.preflight``); None when nothing was found."""
    ingestion_ms: dict[str, int] | None = None
    """With an ingestion-time watermark: per source partition, the source's ingestion time
    past the batch's end (where the next batch's clock starts); None otherwise."""
    window_watermark_ms: int | None = None
    """With a keyed step before windows: the watermark the windows run with (the keyed
    step's of the batch before); None otherwise (they run with ``watermark_ms``)."""
    dimension_versions: dict[str, int] | None = None
    """With stream-table joins: the version of each joined table the batch joins with (a
    replay: those its offsets recorded); None otherwise."""
    changes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The definition's changes since the latest offset-log entry, each compatible at a
    batch boundary (``lowmark.batches.evolution.Change.to_json``): the next new batch runs
    under them (a replay is refused: ``problem``). Set however much there is to do."""

    def to_json(self) -> dict[str, Any]:
        """The plan as JSON-ready data (``lowmark plan --json``)."""
        return dataclasses.asdict(self)


def pipeline_plan(
    spark: SparkLike, pipeline: Pipeline, data_root: Path, clock: Clock | None = None
) -> BatchPlan:
    """What the next batch would take, by the runner's own rule, writing nothing (``lowmark
    plan``: a dry run, like ``spark-pipelines dry-run``)."""
    return planned_next(spark, pipeline, data_root, clock)[0]


def planned_next(
    spark: SparkLike, pipeline: Pipeline, data_root: Path, clock: Clock | None = None
) -> tuple[BatchPlan, Planner, NextBatch]:
    """``pipeline_plan``, with the read-only planner it asked and its answer: what ``lowmark
    preview`` runs the batch of, so that it runs exactly the batch ``lowmark plan`` shows."""
    as_of = (clock or SystemClock()).now_ms()
    planner = read_only_planner(spark, pipeline, data_root, clock)
    nxt = planner.next_batch(dry_run=True)
    planned, source = nxt.planned, planner.source
    backlog = source.backlog(_committed_end(planner, planner.last_committed()))
    nothing = BatchPlan(
        pipeline=pipeline.name,
        checkpoint=pipeline.checkpoint_location(data_root),
        checkpoint_exists=planner.checkpoint is not None,
        as_of_ms=as_of,
        reason=f"nothing to do ({source.describe_backlog(backlog)})",
        batch_id=None,
        replay=False,
        emit_only=False,
        start_offsets=None,
        end_offsets=None,
        input=None,
        inputs=[],
        bytes=None,
        watermark_ms=None,
        planned_at_ms=None,
        blocked=None,
        changes=[change.to_json() for change in planner.pending],
    )
    next_status = _next_batch(planner, nxt, backlog)
    if planned is None or next_status is None:
        return nothing, planner, nxt
    inputs = source.inputs(planned.start, planned.end)
    problem = planner.replay_refusal(planned) or find_problem(
        pipeline, source, inputs, data_root, planned.batch_id
    )
    found = dataclasses.replace(
        nothing,
        reason=next_status.reason,
        batch_id=next_status.batch_id,
        replay=next_status.replay,
        emit_only=next_status.emit_only,
        start_offsets=planned.start,
        end_offsets=planned.end,
        input=describe_range(planned.start, planned.end),
        inputs=inputs,
        bytes=source.input_bytes(planned.start, planned.end),
        watermark_ms=planned.watermark_ms,
        planned_at_ms=planned.planned_at_ms,
        blocked=nxt.blocked,
        problem=None if problem is None else str(problem),
        ingestion_ms=planned.ingestion,
        window_watermark_ms=planned.window_watermark,
        dimension_versions=planned.dimension_versions,
    )
    return found, planner, nxt


def _committed_end(planner: Planner, committed: OffsetEntry | None) -> Offsets:
    """Where the committed input ends: a new batch starts here (before the first commit,
    the source's start)."""
    return committed.end_offsets if committed else planner.start_offsets


def _last_failure(planner: Planner, nxt: NextBatch) -> LastFailure | None:
    """The planned batch's latest failed attempt, or None when it has not failed."""
    planned = nxt.planned
    if planner.checkpoint is None or planned is None:
        return None
    failures = planner.checkpoint.failures.of(planned.batch_id)
    if not failures:
        return None
    last = failures[-1]
    kinds: list[FailureKind] = ["data", "operational"]
    attempts: dict[str, int] = {k: sum(f.kind == k for f in failures) for k in kinds}
    return LastFailure(last.kind, last.error, _epoch_ms(last.failed_at), attempts)


def _next_batch(
    planner: Planner, nxt: NextBatch, backlog: dict[str, int]
) -> NextBatchStatus | None:
    """The planned batch in words (``backlog``: what waits past its start), or None."""
    planned = nxt.planned
    if planned is None:
        return None
    if planned.replay:
        reason = f"batch {planned.batch_id} is uncommitted: replay it"
    elif planned.emit_only and planner.pipeline.keyed is not None:
        reason = "a keyed step's timer is due, or its watermark closes windows: no new data"
        if planner.pipeline.aggregation is None:
            reason = "a keyed step's timer is due: it fires without new data"
    elif planned.emit_only and planner.pipeline.stream_join is not None:
        reason = "the watermark moved: the join lets held rows go without new data"
    elif planned.emit_only:
        reason = "the watermark moved: windows close without new data"
    else:
        reason = planner.source.describe_backlog(backlog)
    return NextBatchStatus(planned.batch_id, planned.replay, planned.emit_only, reason)


def _last_batch(
    pipeline: Pipeline, done: CommitEntry | None, offsets: OffsetEntry | None
) -> LastBatch | None:
    """The newest committed batch ``done`` (with its offset-log entry)."""
    if done is None or offsets is None:
        return None
    windowed = pipeline.aggregation is not None
    return LastBatch(
        batch_id=done.batch_id,
        committed_at_ms=_epoch_ms(done.created_at),
        input=describe_range(offsets.start_offsets, offsets.end_offsets),
        accounting=_accounting(pipeline, {k: getattr(done, k) for k in COUNTS}, total=False),
        closed_windows_held=done.rows_closed if windowed else None,
        violations=done.violations,
        dimension_versions=offsets.dimension_versions,
    )


def _accounting(pipeline: Pipeline, counts: dict[str, int], total: bool = True) -> dict[str, int]:
    """Where the records read went, from commit counts (``CommitEntry``): over all
    committed batches (``total``, the running totals) or of one batch.

    ``read = bad + dropped_by_transform + late`` (``bad``: rows that did not parse and
    records ``drop`` expectations removed; ``+ duplicates`` with ``dedup``) plus,
    stateless, ``in_sink``;
    windowed, in total, ``in_closed_windows + in_open_windows`` (the records
    in windows emitted as final, and in windows still in the state table);
    keyed, ``into_processor``; a stream-stream join, ``into_join`` (the records it took,
    held until the watermark passes them; the rows it emitted are ``rows_out``);
    a keyed step before windows, ``read +
    emitted_by_processor = bad + dropped_by_transform + late + into_processor`` plus
    the windows' counts (which then count the processor's rows);
    windowed, of one batch, ``into_windows`` (which of them are still open is
    not recorded per batch: the windows a batch closes hold records of earlier
    batches too).
    """
    went = {
        "read": counts.get("rows_in", 0),
        "bad": counts.get("rows_bad", 0),
        "dropped_by_transform": counts.get("rows_dropped", 0),
    }
    if pipeline.dedup is not None:
        went["duplicates"] = counts.get("rows_duplicate", 0)
    went["late"] = counts.get("rows_late", 0)
    if pipeline.stream_join is not None:  # the records it took (its rows out: `rows_out`)
        return went | {"into_join": counts.get("rows_keyed", 0)}
    if pipeline.keyed is not None:
        went["into_processor"] = counts.get("rows_keyed", 0)
        if pipeline.aggregation is None:
            return went
        # The windows take the processor's rows: those it emitted join the count of what
        # went somewhere (`late` holds records and emitted rows the windows refused).
        went["emitted_by_processor"] = counts.get("rows_emitted", 0)
    if pipeline.aggregation is None:
        return went | {"in_sink": counts.get("rows_out", 0)}
    windowed = counts.get("rows_windowed", 0)
    if not total:
        return went | {"into_windows": windowed}
    closed = counts.get("rows_closed", 0)
    return went | {"in_closed_windows": closed, "in_open_windows": windowed - closed}


def _partitions(
    planner: Planner, done: CommitEntry | None, committed: OffsetEntry | None
) -> list[PartitionStatus]:
    """Per source partition, its times as of the commit ``done`` (by partition), and when it
    follows an ingestion-time watermark its ingestion time as ``committed`` (``done``'s
    offsets) recorded it."""
    event_time = planner.pipeline.event_time
    if done is None or event_time is None:
        return []
    ingestion = (committed.ingestion_ms if committed else None) or {}
    times = sorted(planner.partition_times(done).values(), key=lambda t: t.partition)
    lags = [planner.lags.lag_of(t.partition) for t in times]
    return [
        PartitionStatus(
            t.partition,
            t.max_event_time_ms,
            t.watermark_ms(event_time)
            if lag is None or t.partition not in ingestion
            else ingestion[t.partition] - lag,
            t.last_seen_ms,
            ingestion.get(t.partition) if lag is not None else None,
        )
        for t, lag in zip(times, lags, strict=True)
    ]


def _epoch_ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def pipeline_history(
    pipeline: Pipeline, data_root: Path, last: int | None = None
) -> list[dict[str, Any]]:
    """Progress rows, oldest first (the newest ``last`` if given), as plain dicts."""
    location = pipeline.checkpoint_location(data_root)
    if not Checkpoint.exists(location):
        return []
    progress = Checkpoint(location, pipeline.name).progress
    newest = progress.latest_batch_id()
    start = None if last is None or newest is None else newest - last + 1
    entries = progress.get_range(start=start)
    if last is not None:
        entries = entries[-last:]
    return [e.model_dump(mode="json") for e in entries]


@dataclass(frozen=True)
class PendingWork:
    """The batch a run would start with, and why (what a Dagster sensor asks)."""

    batch_id: int
    replay: bool
    reason: str
    not_before_ms: int | None = None
    """No run should start before this time (epoch ms): the batch's last attempt stopped on
    an operational error; None: a run may start now."""


def pending_work(status: PipelineStatus, pause_ms: int = 0) -> PendingWork | None:
    """The next batch ``status`` (from ``pipeline_status``) calls for, or None when idle
    or blocked (a poison batch).

    A batch whose last attempt stopped on an operational error (a file gone,
    a damaged checkpoint: it stays so until someone acts) waits ``pause_ms``
    after the first such stop, twice that after the second, and so on, so
    the problem is not met by a new run (and a Spark start) every tick.
    """
    nxt = status.next_batch
    if nxt is None or status.blocked:
        return None
    failed = status.last_failure
    not_before = None
    if failed is not None and failed.kind == "operational":
        not_before = failed.failed_at_ms + pause_ms * 2 ** (failed.attempts["operational"] - 1)
    return PendingWork(nxt.batch_id, nxt.replay, nxt.reason, not_before)
