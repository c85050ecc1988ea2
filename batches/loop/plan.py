"""The planner: what runs next, by the recovery rule, read-only.

One rule answers every "what now?": the runner before each batch, ``lowmark
status`` and ``lowmark plan`` (and through status the Dagster sensor), poison
handling and ``lowmark skip-batch``, before batch 0 too. Its answer
(``NextBatch``) is a new batch, the replay of an uncommitted one, an
emit-only batch, a blocked batch (a poison batch, or one that kept stopping
on an operational error: ``lowmark.batches.loop.poison``), or nothing.

Planning reads the two logs' latest entries and asks the source; it writes
nothing but, when a run plans (not a dry run), what the source records of
its discoveries, and batch 0's start when the source chose it (see
``Planner.next_batch``). It needs no Spark session for local folders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from lowmark.batches.clock import Clock
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.event_time.stage import WindowedStage
from lowmark.batches.event_time.watermarks import IngestionLags, PartitionTime, observe
from lowmark.batches.evolution import (
    KEYED_STATE_EVOLVED,
    Change,
    DefinitionChanged,
    blocking,
    classify,
)
from lowmark.batches.loop.dimensions import Dimensions
from lowmark.batches.loop.poison import blocked
from lowmark.batches.loop.rebuildable import refusal
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.sources.base import (
    Clocks,
    Range,
    Skipped,
    Source,
    check_identity,
    plan_in_clock_order,
)
from lowmark.batches.sources.union import SEPARATOR, UnionStreamSource, named, own
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.commit_log import CommitEntry
from lowmark.state.errors import (
    CheckpointCorrupt,
    CheckpointMissing,
    FingerprintMismatch,
    LowmarkError,
    ReplayRuleChanged,
)
from lowmark.state.log import EPOCH
from lowmark.state.offset_log import Identity, OffsetEntry, Offsets
from lowmark.state.window_state import LATEST


@dataclass(frozen=True)
class PlannedBatch:
    """The next batch to run: its id, input range, watermark and what it builds on."""

    batch_id: int
    start: Offsets
    end: Offsets
    watermark_ms: int | None
    replay: bool
    planned_at_ms: int
    """Processing time the batch was planned (recorded as the offsets' created_at)."""
    previous: CommitEntry | None
    """The commit of batch_id - 1 (its state version and partition times are this batch's input)."""
    identity: Identity = field(default_factory=dict)
    """What the source's offsets point into (``Source.identity``), recorded with them."""
    skipped: Skipped | None = None
    """Input upstream lost past the previous batch's end, which this batch (starting after
    it) passes over (``on_data_loss: skip``)."""
    waiting: tuple[str, ...] = ()
    """Source partitions with records past ``end`` when planned (recorded in the offset log)."""
    ingestion: dict[str, int] | None = None
    """With an ingestion-time watermark, each partition's ingestion time past ``end`` when
    planned (recorded in the offset log): where the next batch's clock starts."""
    clocks: Clocks | None = None
    """With aligned admission, the partitions' clocks ``end`` was planned by (``Planner``);
    the catch-up read-ahead plans the batches after it by them too."""
    window_watermark: int | None = None
    """With a keyed step before windows: the watermark the window stage runs with (recorded
    in the offset log): the keyed step's of the batch before (``Planner``)."""
    keyed_windows: bool = False
    """Whether a keyed step's output feeds the windows (then ``window_watermark_ms`` is
    ``window_watermark``)."""
    dimension_versions: dict[str, int] | None = None
    """With stream-table joins, the version of each joined table the batch joins with
    (recorded in the offset log): each table's newest when the batch was planned."""

    @property
    def window_watermark_ms(self) -> int | None:
        """The watermark the window stage judges lateness and closes windows by:
        ``watermark_ms``, or behind a keyed step the keyed step's of the batch before."""
        return self.window_watermark if self.keyed_windows else self.watermark_ms

    @property
    def range(self) -> Range:
        """The batch's input: its id and ``[start, end)``."""
        return Range(self.batch_id, self.start, self.end)

    @property
    def emit_only(self) -> bool:
        """A new batch with no input: the watermark moved and closes windows."""
        return not self.replay and self.end == self.start

    def offset_entry(
        self, runner_id: str, fingerprint: str, definition: dict[str, Any]
    ) -> OffsetEntry:
        """The batch's offset-log entry, written before anything is processed: everything
        a replay plans with (``Planner.next_batch``)."""
        return OffsetEntry(
            batch_id=self.batch_id,
            runner_id=runner_id,
            created_at=EPOCH + timedelta(milliseconds=self.planned_at_ms),
            start_offsets=self.start,
            end_offsets=self.end,
            batch_watermark_ms=self.watermark_ms,
            pipeline_fingerprint=fingerprint,
            pipeline_definition=definition,
            source_identity=self.identity,
            input_skipped=self.skipped.counts if self.skipped else {},
            waiting_partitions=list(self.waiting),
            ingestion_ms=self.ingestion,
            window_watermark_ms=self.window_watermark,
            dimension_versions=self.dimension_versions,
        )


NextKind = Literal["new", "replay", "emit_only", "blocked", "nothing"]


@dataclass(frozen=True)
class NextBatch:
    """The planner's answer: the batch that runs next, if any, and whether it is blocked."""

    planned: PlannedBatch | None
    """None: nothing to do."""
    blocked: str | None = None
    """Why ``planned`` (a replay) is not run again by itself (``poison.blocked``); None: it
    may run."""

    @property
    def kind(self) -> NextKind:
        """What runs next, in one word."""
        planned = self.planned
        if planned is None:
            return "nothing"
        if self.blocked is not None:
            return "blocked"
        if planned.replay:
            return "replay"
        return "emit_only" if planned.emit_only else "new"


class Planner:
    """Plans the batches of one pipeline from its checkpoint and source.

    ``checkpoint`` may be the location of a checkpoint that does not exist
    yet (a pipeline that never ran): the planner then plans batch 0 without
    creating it, unless the source's start moves (see ``next_batch``).
    ``dimensions``: the tables of the pipeline's stream-table joins, whose newest
    versions a new batch is planned with (None: a pipeline without joins).
    ``records_as``: the pipeline whose definition the offset log records and is compared
    with (default: ``pipeline``): a rebuild's shadow (``lowmark.batches.admin.rebuild``)
    writes beside the live tables but records the live definition, which its checkpoint
    goes on under once swapped in.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        checkpoint: Checkpoint | str,
        source: Source,
        stage: WindowedStage | None,
        clock: Clock,
        dimensions: Dimensions | None = None,
        records_as: Pipeline | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.dimensions = dimensions
        self.checkpoint = checkpoint if isinstance(checkpoint, Checkpoint) else None
        """None while the pipeline has no checkpoint."""
        self.location = checkpoint.location if isinstance(checkpoint, Checkpoint) else checkpoint
        self.source = source
        self.stage = stage
        self.clock = clock
        self.definition = (records_as or pipeline).definition()
        self.fingerprint = (records_as or pipeline).fingerprint()
        self.lags = IngestionLags.of_pipeline(pipeline)
        """Which partitions follow an ingestion-time watermark (the others, event time)."""
        self.pending: tuple[Change, ...] = ()
        """The definition's changes since the latest offset-log entry, as of the last plan:
        all compatible, taking effect with the next new batch (``_accepted_changes``)."""
        self._position: tuple[OffsetEntry, CommitEntry] | None = None
        self._partitions: dict[str, PartitionTime] | None = None

    @property
    def start_offsets(self) -> Offsets:
        """Where batch 0 starts: as the checkpoint recorded it (the first plan records it;
        ``lowmark reset`` may record another start), else the source's beginning now."""
        recorded = self.checkpoint.start_offsets if self.checkpoint else None
        return recorded if recorded is not None else self.source.initial_offsets()

    def next_batch(self, dry_run: bool = False, retry: bool = False) -> NextBatch:
        """Decide which batch runs next (``NextBatch``).

        ``dry_run`` writes nothing (the source records no discovery), except
        batch 0's start when it moves (``Source.start_moves``: "latest"), which
        the first plan fixes in the checkpoint (creating it if need be): what
        ``lowmark status`` and the Dagster sensor ask, so they follow this one
        rule instead of a copy of it. A replay that failed
        ``max_failed_attempts`` times is ``blocked`` unless ``retry``; one that may not run
        under this definition or this lowmark (``replay_refusal``) is ``blocked`` in a dry
        run and raises otherwise, ``retry`` or not.

        The recovery rule, over the latest offset-log entry and the latest
        commit-log entry::

            latest = offsets.latest()          # may be None
            done   = commits.latest()          # may be None
            if latest is None:       plan batch 0 from the source's initial offsets
            elif done == latest:     plan batch latest+1 starting at offsets[latest].end
            elif done == latest - 1 or (done is None and latest == 0):
                                     REPLAY batch latest with exactly offsets[latest]
                                     and offsets[latest].batch_watermark_ms
            else:                    raise CheckpointCorrupt naming both ids

        A new batch is planned only if the source has data past the committed
        end, or if the watermark (re-evaluated now, so idle partitions stop
        holding it back) would close windows: an empty batch that emits. The
        definition the latest entry recorded must be the pipeline's now, or
        differ from it only by changes compatible at a batch boundary
        (``lowmark.batches.evolution``; ``pending``): a new batch then runs
        under the new definition (its offset-log entry records it), a replay
        is refused (``replay_refusal``, above). The source's
        identity the entry recorded must match too (a replaced source stops
        the pipeline: its offsets point into the old one). ``position`` reads
        the two entries.
        """
        planned = self._plan(dry_run)
        if planned is None or not planned.replay or self.checkpoint is None:
            return NextBatch(planned)
        refusal = self.replay_refusal(planned)
        if refusal is not None:  # blocked, ``retry`` or not: a run stops on it
            if not dry_run:
                raise refusal
            return NextBatch(planned, str(refusal))
        if retry:
            return NextBatch(planned)
        failures = self.checkpoint.failures.of(planned.batch_id)
        return NextBatch(planned, blocked(self.pipeline, failures, self.source, planned.range))

    def _plan(self, dry_run: bool) -> PlannedBatch | None:
        """The recovery rule (``next_batch``)."""
        self.pending = ()
        latest, done = self.position()
        if done is None and self.checkpoint is not None:
            # After `lowmark reset --after-sink`: the state, watermark and timers it carried.
            done = self.checkpoint.start_commit
        done_id = done.batch_id if done else None
        if latest is None:
            if done is not None and done_id != -1:
                raise CheckpointCorrupt(
                    f"commit log of {self.location} has batch {done_id} but the "
                    "offset log is empty: restore offsets/ or start over with `lowmark reset`"
                )
            start = self.start_offsets
            # A start that moves ("latest") is fixed by the first plan, a dry run's too:
            # asked anew by every plan, it would stay ahead of whatever lands in between.
            fixes = not dry_run or self.source.start_moves()
            if fixes and (self.checkpoint is None or self.checkpoint.start_offsets is None):
                start = self._fix_start(start)
            return self._plan_new(0, start, None, done, dry_run)
        # Before the first commit a run starts a changed pipeline over
        # (``lowmark.batches.loop.start_over``): a dry run answers with the batch 0 it replaces.
        first = done is None and latest.batch_id == 0 and latest.pipeline_definition is not None
        if latest.pipeline_fingerprint != self.fingerprint and not (dry_run and first):
            self.pending = self._accepted_changes(latest)
        if done is not None and done.batch_id == latest.batch_id:
            return self._plan_new(latest.batch_id + 1, latest.end_offsets, latest, done, dry_run)
        if done_id == latest.batch_id - 1 or (done_id is None and latest.batch_id == 0):
            previous = done if done_id == latest.batch_id - 1 else None
            self._check_identity(latest)
            return PlannedBatch(
                latest.batch_id,
                latest.start_offsets,
                latest.end_offsets,
                latest.batch_watermark_ms,
                replay=True,
                planned_at_ms=latest.created_ms,
                previous=previous,
                identity=latest.source_identity,
                skipped=_recorded_skip(latest),
                waiting=tuple(latest.waiting_partitions),
                ingestion=latest.ingestion_ms,
                window_watermark=latest.window_watermark_ms,
                keyed_windows=self.keyed_windows,
                dimension_versions=latest.dimension_versions,
            )
        raise CheckpointCorrupt(
            f"checkpoint {self.location} is inconsistent: latest offsets batch "
            f"{latest.batch_id}, latest commit batch {done_id}; expected the commit to be "
            f"{latest.batch_id} or {latest.batch_id - 1}. Restore both logs from one backup, "
            "or start over with `lowmark reset`"
        )

    def _accepted_changes(self, latest: OffsetEntry) -> tuple[Change, ...]:
        """The changes (``evolution.classify``) from the definition ``latest`` was planned
        with to the pipeline's now, when every one is compatible at a batch boundary;
        ``DefinitionChanged`` naming the others, each with its class, otherwise (and
        ``FingerprintMismatch`` naming the fingerprints when ``latest`` predates recording
        definitions: nothing is known of what changed)."""
        recorded = latest.pipeline_definition
        name = self.pipeline.name
        way_on = (
            f"restore the old definition, or start over with `lowmark reset {name} --truncate-sink`"
        )
        if recorded is None:
            raise FingerprintMismatch(
                f"pipeline {name} changed since its checkpoint {self.location} was written "
                f"(fingerprint {latest.pipeline_fingerprint} -> {self.fingerprint}): {way_on}"
            )
        changes = classify(recorded, self.definition)
        stops = blocking(changes)
        if stops:
            what = "; ".join(change.describe() for change in stops)
            if refusal(self.pipeline, stops) is None:
                way_on = (
                    f"recompute its output under the new definition with `lowmark rebuild "
                    f"{name}` (beside the live tables, then swapped in), {way_on}"
                )
            raise DefinitionChanged(
                f"pipeline {name} changed since its checkpoint {self.location} was written, "
                f"in ways its checkpoint cannot take at a batch boundary ({what}): {way_on}",
                changes,
            )
        return changes

    def replay_refusal(self, planned: PlannedBatch) -> LowmarkError | None:
        """Why ``planned``, a replay, cannot run under the pipeline's definition now (None:
        it can). A replay must compute what its first attempt did (parts of it may have
        landed), but the runner holds only today's code: a Python transform is imported
        by its path, not kept with the batch. So a replay under a changed definition is
        refused (``DefinitionChanged``), even a compatible change, which takes effect from
        the next new batch; but a keyed state schema that evolved reads the state held as
        before, and the replay runs under it. A replay an older lowmark planned under
        another late rule is refused too (``ReplayRuleChanged``:
        ``IngestionLags.replay_refusal``)."""
        if not planned.replay:
            return None
        changed = tuple(c for c in self.pending if c.kind is not KEYED_STATE_EVOLVED)
        name, batch_id = self.pipeline.name, planned.batch_id
        if not changed:
            latest, _ = self.position()
            assert latest is not None  # a replay's
            deduplicates = self.pipeline.dedup is not None
            rule = self.lags.replay_refusal(latest, name, deduplicates)
            return ReplayRuleChanged(rule) if rule is not None else None
        what = "; ".join(change.describe() for change in changed)
        return DefinitionChanged(
            f"pipeline {name}: uncommitted batch {batch_id} was planned under the definition "
            f"before these changes ({what}) and its replay must compute what it did then: "
            f"restore the old definition and run once to finish batch {batch_id} (the change "
            f"then takes effect from batch {batch_id + 1}), or set the batch aside with "
            f"`lowmark skip-batch {name} {batch_id} --reason ...`",
            changed,
        )

    def _fix_start(self, start: Offsets) -> Offsets:
        """Record ``start`` as where batch 0 starts, in a checkpoint created for it if there
        is none; the start recorded (another planner may have been first)."""
        if self.checkpoint is None:
            self.checkpoint = Checkpoint(self.location, self.pipeline.name, start_offsets=start)
        if self.checkpoint.start_offsets is None:
            self.checkpoint.record_start_offsets(start)
        recorded = self.checkpoint.start_offsets
        assert recorded is not None
        return recorded

    def _plan_new(
        self,
        batch_id: int,
        start: Offsets,
        latest: OffsetEntry | None,
        done: CommitEntry | None,
        dry_run: bool,
    ) -> PlannedBatch | None:
        identity = self._check_identity(latest)
        now = self.clock.now_ms()
        # Lost input is passed over by starting after it: the offset log shows the gap.
        skipped = self.source.past_lost(start)
        if skipped is not None:
            start = skipped.start
        clocks = self._clocks(latest, done)
        end = plan_in_clock_order(self.source, start, batch_id, clocks, record=not dry_run)
        waiting = self.source.waiting_partitions(end)
        watermark = done.next_watermark_ms if done else None
        event_time, ingestion = self.pipeline.event_time, None
        if event_time is not None and (self.lags.by_prefix or done is not None):
            # A batch's records were all ingested at or after the clock at its start; the
            # clock at its end is where the next batch starts.
            parts = self.partition_times(done) if done and not self.lags.everywhere else {}
            active = self.with_records(Range(batch_id, start, end), waiting)
            at_start = self._ingestion_times(start, now)
            watermark = self.lags.watermark(at_start, parts, event_time, now, watermark, active)
            ingestion = self._ingestion_times(end, now) if self.lags.by_prefix else None
        # Behind a keyed step the window stage runs one batch behind: with the watermark
        # the keyed step had in the batch before (its timers' output, at or above that
        # watermark, then lands in windows still open).
        window_watermark = latest.batch_watermark_ms if latest else None
        idle = end == start and skipped is None and not self._timer_due(done, watermark, now)
        if idle and not self._would_emit(done, watermark, latest, window_watermark):
            return None
        # A dimension's update is seen from the next batch planned after it (never a reason
        # to plan one): its newest version now, recorded in the offset log.
        dimensions = self.dimensions.newest() if self.dimensions is not None else None
        return PlannedBatch(
            batch_id,
            start,
            end,
            watermark,
            False,
            now,
            done,
            identity,
            skipped,
            waiting,
            ingestion,
            clocks,
            window_watermark if self.keyed_windows else None,
            self.keyed_windows,
            dimensions,
        )

    def _clocks(self, latest: OffsetEntry | None, done: CommitEntry | None) -> Clocks | None:
        """With aligned admission (``event_time.admission: aligned``), each partition's
        watermark input as the committed batch left it, for the source to admit the lowest
        first: its max event time, or, with an ingestion-time watermark, its ingestion time
        past the batch's end (as that batch recorded it). Empty before the first commit (no
        clock known: a fair split); None with fair admission."""
        event_time = self.pipeline.event_time
        if event_time is None or event_time.admission != "aligned":
            return None
        if done is None:
            return {}
        parts = {} if self.lags.everywhere else self.partition_times(done)
        seen = {p: t.max_event_time_ms for p, t in parts.items() if self.lags.lag_of(p) is None}
        recorded = latest.ingestion_ms if latest is not None else None
        return seen | (recorded or {})

    @property
    def keyed_windows(self) -> bool:
        """Whether a keyed step's output feeds the pipeline's windows."""
        return self.pipeline.keyed is not None and self.pipeline.aggregation is not None

    def _would_emit(
        self,
        done: CommitEntry | None,
        watermark: int | None,
        latest: OffsetEntry | None,
        window_watermark: int | None,
    ) -> bool:
        """Whether a batch with no new input (and no timer due) closes windows, or lets a
        stream-stream join's held rows go: an emit-only batch. Behind a keyed step it closes
        those under ``window_watermark`` (the last batch's watermark); and when only
        ``watermark`` would close some, it runs
        to record ``watermark``, which the batch after it closes them with: an idle
        stream's last windows close one batch later than without a keyed step."""
        previous_watermark = latest.batch_watermark_ms if latest else None
        if self.pipeline.stream_join is not None:
            # As Structured Streaming's batch with no data: a watermark that moved lets a
            # join let go of held rows, and an outer join emit those that never matched.
            return watermark is not None and watermark != previous_watermark
        if self.stage is None:
            return False
        state_version = LATEST if done and "state" in done.table_versions else None
        behind = window_watermark if self.keyed_windows else None
        if behind is not None and self.stage.would_emit(state_version, behind):
            return True
        if watermark is None or watermark == previous_watermark:
            return False
        return self.stage.would_emit(state_version, watermark)

    def _ingestion_times(self, position: Offsets, now: int) -> dict[str, int]:
        """The ingestion times at ``position`` (``Source.ingestion_times``) of the partitions
        that follow ingestion time (``IngestionLags``): the source's, or those of the union's
        sources that set one."""
        if not self.lags.by_prefix:
            return {}
        if self.lags.everywhere:
            times = self.source.ingestion_times(position, now)
            if times is None:
                raise PipelineConfigInvalid(
                    f"pipeline {self.pipeline.name}: its {self.pipeline.source.kind} source "
                    "keeps no ingestion clock: remove `event_time.watermark` (the watermark "
                    "then follows the event times seen)"
                )
            return times
        union = self.source
        assert isinstance(union, UnionStreamSource)  # only a union sets lags per source
        found: dict[str, int] = {}
        for prefix in sorted(self.lags.by_prefix):
            name = prefix.removesuffix(SEPARATOR)
            times = union.parts[name].ingestion_times(own(position, name), now)
            if times is None:
                raise PipelineConfigInvalid(
                    f"pipeline {self.pipeline.name}: the union's source {name} keeps no "
                    f"ingestion clock: remove `{name}` from the union's `watermarks` (its "
                    "watermark then follows the event times seen)"
                )
            found |= named(times, name)
        return found

    def _timer_due(self, done: CommitEntry | None, watermark: int | None, now: int) -> bool:
        """Whether a keyed step's earliest pending timer is due: a batch then runs with no
        new input, to fire it."""
        keyed = self.pipeline.keyed
        if keyed is None or done is None or done.next_timer_ms is None:
            return False
        ran_at = watermark if keyed.time_mode == "event_time" else now
        return ran_at is not None and ran_at >= done.next_timer_ms

    def _check_identity(self, latest: OffsetEntry | None) -> Identity:
        """The source's identity now, after checking it is the one ``latest`` recorded (or,
        before batch 0, the one the checkpoint's start offsets were read from)."""
        identity = self.source.identity()
        name = self.pipeline.name
        if latest is not None:
            check_identity(latest.source_identity, identity, f"batch {latest.batch_id}", name)
        else:
            read_up_to = "the start offsets of this checkpoint (`lowmark reset --after-sink`)"
            recorded = self.checkpoint.start_identity if self.checkpoint else {}
            check_identity(recorded, identity, read_up_to, name)
        return identity

    def position(self) -> tuple[OffsetEntry | None, CommitEntry | None]:
        """The latest offset-log and commit-log entries (None, None: no checkpoint yet).

        Read once per planner: after its runner's commit (``committed``), or a
        read where both are the same batch, it knows where it stands; a runner
        that raced it is still caught by the offset log.
        """
        if self._position is not None:
            return self._position
        if self.checkpoint is None:
            return None, None
        latest = self.checkpoint.offsets.get_latest()
        done = self.checkpoint.commits.get_latest()
        self._check_tables_of(done)
        if latest is not None and done is not None and latest.batch_id == done.batch_id:
            self._position = (latest, done)
        return latest, done

    def last_committed(self) -> OffsetEntry | None:
        """The offset-log entry of the newest committed batch (None before the first commit)."""
        latest, done = self.position()
        if done is None:
            return None
        if latest is not None and latest.batch_id == done.batch_id:
            return latest  # the usual case: nothing pending, no second read
        assert self.checkpoint is not None
        return self.checkpoint.offsets.get(done.batch_id)

    def committed(
        self, offsets: OffsetEntry, commit: CommitEntry, partitions: dict[str, PartitionTime]
    ) -> None:
        """Batch ``offsets.batch_id`` committed (``commit``), leaving ``partitions``' times:
        where the next plan starts, with no read of the logs."""
        self._position = (offsets, commit)
        self._partitions = partitions if self.pipeline.event_time is not None else None

    def forget(self) -> None:
        """Read the logs again at the next plan (what this planner knew may be stale)."""
        self._position, self._partitions = None, None

    def partition_times(self, committed: CommitEntry) -> dict[str, PartitionTime]:
        """Per-partition times as of ``committed``, which wrote them to the watermarks table."""
        if self._partitions is None:
            rows = (
                self.checkpoint.watermarks.at(committed.batch_id)
                if self.checkpoint is not None and "watermarks" in committed.table_versions
                else []
            )
            self._partitions = {p: PartitionTime(p, max_ms, seen) for p, max_ms, _, seen in rows}
        return self._partitions

    def times_after(
        self, planned: PlannedBatch, max_event_ms: dict[str, int]
    ) -> tuple[dict[str, PartitionTime], int | None]:
        """Each partition's times after ``planned`` saw ``max_event_ms`` (its newest event
        time per partition), and the watermark the next batch starts from."""
        event_time = self.pipeline.event_time
        if event_time is None:
            return {}, planned.watermark_ms
        known = self.partition_times(planned.previous) if planned.previous else {}
        partitions = observe(known, max_event_ms, planned.planned_at_ms)
        watermark = self.lags.watermark(
            planned.ingestion or {},
            partitions,
            event_time,
            planned.planned_at_ms,
            planned.watermark_ms,
            self.with_records(planned.range, planned.waiting),
        )
        return partitions, watermark

    def with_records(self, batch: Range, waiting: Sequence[str]) -> frozenset[str]:
        """The partitions that had records waiting when ``batch`` was planned: those it takes
        records from and those with records past its end (``waiting``). None of them is
        idle for its watermarks, however long ago it was last read."""
        return frozenset(self.source.partitions(batch.start, batch.end)) | frozenset(waiting)

    def _check_tables_of(self, done: CommitEntry | None) -> None:
        """The state table the last commit wrote and the next batch reads must still be there.

        Without it the next batch would start from empty state: a silent
        restart from zero of what it holds.
        """
        if done is None or "state" not in done.table_versions or self.stage is None:
            return
        if not self.stage.state.table.exists():
            raise CheckpointMissing(
                f"window state table {self.stage.state.path} is missing, but commit "
                f"{done.batch_id} wrote it: restore it from backup, or start over with "
                "`lowmark reset`"
            )


def _recorded_skip(entry: OffsetEntry) -> Skipped | None:
    """The input batch ``entry`` passed over, as its offset-log entry recorded it."""
    if not entry.input_skipped:
        return None
    return Skipped(entry.start_offsets, entry.input_skipped, "as recorded in the offset log")
