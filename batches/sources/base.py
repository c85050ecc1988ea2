"""The source contract.

Offsets are ``{source partition: position}`` with an EXCLUSIVE position: a
batch with start ``{"0": 5}`` and end ``{"0": 9}`` takes positions 5, 6, 7, 8
of partition "0". The start of batch N is the end of batch N-1; batch 0
starts at ``initial_offsets()``.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeAlias

from lowmark.batches.errors import SourceReplaced

# A source's own columns, named here too: a custom source imports them from this module.
from lowmark.batches.records import BATCH_COLUMN
from lowmark.batches.records import PARTITION_COLUMN as PARTITION_COLUMN
from lowmark.state.errors import LowmarkError
from lowmark.state.offset_log import Identity, Offsets

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Observation

ONE_TASK_BYTES = 4 * 1024 * 1024
"""Input a batch reads in one task (``SourceRead.in_one_task``): up to it, one task costs no
more than Spark's own split of the input and the shuffle after it (2 cores, windowed
batches, JSON files: 3.3 MB in 10 files 0.38-0.40 s a batch in one task against 0.40-0.44 s;
2 MB in one file 0.30-0.31 s against 0.31-0.33 s; 3,000 Kafka records in 3 partitions
0.30-0.37 s against 0.34-0.47 s)."""

Clocks: TypeAlias = Mapping[str, int]
"""Per source partition, its watermark input in epoch millis (aligned admission): the lowest
is admitted first."""


@dataclass(frozen=True)
class Range:
    """One batch's input: its id and offsets ``[start, end)``."""

    batch_id: int
    start: Offsets
    end: Offsets


@dataclass(frozen=True)
class Skipped:
    """Input upstream lost before lowmark read it, passed over (``on_data_loss: skip``)."""

    start: Offsets
    """Where the batch starts instead: the first position upstream still holds."""
    counts: dict[str, int]
    """What was passed over, by unit (``{"records": 10}``, ``{"versions": 3}``)."""
    what: str
    """The lost input, as an operator names it."""


def describe_range(start: Offsets, end: Offsets) -> str:
    """``[start, end)`` as a person reads it: ``partition: first → end (+count)`` for each
    partition that moved (a single partition by its positions alone)."""
    moved = [(p, start.get(p, 0), end[p]) for p in sorted(end) if end[p] != start.get(p, 0)]
    if not moved:
        return "no new input"
    if len(end) == 1:
        ((_, s, e),) = moved
        return f"{s} → {e} (+{e - s})"
    return ", ".join(f"{p}: {s} → {e} (+{e - s})" for p, s, e in moved)


def check_identity(recorded: Identity, now: Identity, read_up_to: str, pipeline: str) -> None:
    """Raise ``SourceReplaced`` if something recorded with the offsets ``read_up_to`` names
    (``batch 7``) has another identity (``Source.identity``) now. What was not recorded (an
    entry written before identities were, a source without one) is not compared."""
    for key in sorted(recorded.keys() & now.keys()):
        if recorded[key] != now[key]:
            raise SourceReplaced(
                f"{key} was replaced (deleted and created again) after {pipeline} read it up "
                f"to {read_up_to} (id {recorded[key]} -> {now[key]}); the checkpoint's offsets "
                "point into the old one: put the old one back, or read the new one from its "
                f"start with `lowmark reset {pipeline} --truncate-sink`"
            )


def fair_share(waiting: dict[str, int], limit: int) -> dict[str, int]:
    """How many of each partition's ``waiting`` records one batch takes under ``limit``.

    Every partition gets an equal share; what a partition does not need goes
    to the others (partitions with less waiting are served first, ties by
    name), so a batch takes ``min(limit, total waiting)`` and no partition
    starves another. Deterministic: the same backlog gives the same split.
    """
    taken: dict[str, int] = {}
    left = limit
    order = sorted(waiting, key=lambda p: (waiting[p], p))
    for i, partition in enumerate(order):
        take = min(max(waiting[partition], 0), left // (len(order) - i))
        taken[partition] = take
        left -= take
    return taken


Ingested: TypeAlias = Callable[[list[str], int], dict[str, int]]
"""Asked partitions and a time in epoch millis, how many of each one's waiting records (from
the start ``plan`` was given) were ingested at or before that time, by the source's own
ingestion clock (a Kafka record's append time, a file's listing time)."""


def aligned_share(
    waiting: dict[str, int], limit: int, clocks: Clocks | None, ingested: Ingested | None = None
) -> dict[str, int]:
    """``fair_share`` in order of the partitions' ``clocks`` (aligned admission): the
    partitions with the lowest clock take what they have waiting first, then the next
    lowest, and so on, until ``limit``; partitions with equal clocks share fairly. A
    partition with no clock (none known yet) comes first, as the lowest may be there.
    Without ``clocks``, ``fair_share``. Deterministic, as ``fair_share``.

    With ``ingested`` (the ``clocks`` are the source's ingestion clock), admission caps at
    the next clock: the lowest tier takes only its records ingested at or before the next
    tier's clock; what the limit leaves, the two tiers share, capped at the clock after
    that, and so on; the last tier's clock caps nothing. So no partition runs ahead of a
    lower one's clock while that one has records to take, and a batch takes as many
    records as without the cap (never none when some wait)."""
    if clocks is None:
        return fair_share(waiting, limit)
    rank = clock_rank(clocks)
    tiers: dict[tuple[bool, int], list[str]] = {}
    for partition in sorted(waiting):
        tiers.setdefault(rank(partition), []).append(partition)
    order = sorted(tiers)
    taken = dict.fromkeys(waiting, 0)
    left = limit
    group: list[str] = []
    for i, tier in enumerate(order):
        group += tiers[tier]
        room = {p: waiting[p] for p in group}
        if ingested is not None and i + 1 < len(order):
            # The group catches up to the next tier's clock, not past it.
            by_then = ingested(group, order[i + 1][1])
            room = {p: min(max(by_then.get(p, n), 0), n) for p, n in room.items()}
        share = fair_share({p: max(room[p] - taken[p], 0) for p in group}, left)
        for partition, n in share.items():
            taken[partition] += n
        left -= sum(share.values())
        if left <= 0:
            break
    return taken


def clock_rank(clocks: Clocks | None) -> Callable[[str], tuple[bool, int]]:
    """A sort key of partitions for aligned admission (``aligned_share``): lowest clock
    first, a partition with no clock before any; all equal without ``clocks``."""
    if clocks is None:
        return lambda _: (False, 0)

    def rank(partition: str) -> tuple[bool, int]:
        clock = clocks.get(partition)
        return (clock is not None, clock or 0)

    return rank


def capped_rank(
    clocks: Clocks | None, partitions: Collection[str]
) -> Callable[[str, int], tuple[bool, int]]:
    """A sort key of records for aligned admission capped at the next clock, as
    ``aligned_share`` with ``ingested`` caps it: a record of ``partition`` ingested at
    ``ms`` (epoch millis) is taken at the step of the highest clock of ``partitions`` below
    ``ms`` (whose cap, the next clock, reaches it), or of its partition's own clock if that
    is higher; records by these keys in order are the steps' order."""
    rank = clock_rank(clocks)
    tiers = sorted({rank(p) for p in partitions})

    def stage(partition: str, ms: int) -> tuple[bool, int]:
        below = [t for t in tiers if t[0] and t[1] < ms]
        return max(rank(partition), below[-1] if below else tiers[0])

    return stage


def plan_in_clock_order(
    source: Source,
    start: Offsets,
    batch_id: int,
    clocks: Clocks | None,
    record: bool = True,
    discover: bool = True,
) -> Offsets:
    """``source.plan(...)`` with ``clocks`` (aligned admission) when given and the source's
    ``plan`` takes them (a ``clocks`` parameter); without them otherwise, so a source
    written before aligned admission plans as it always did."""
    plan: Callable[..., Offsets] = source.plan
    if clocks is not None and "clocks" in inspect.signature(plan).parameters:
        return plan(start, batch_id, record, discover, clocks=clocks)
    return plan(start, batch_id, record, discover)


def read_counts(tagged: bool, good: Column | None) -> list[Column]:
    """A read's ``counts`` metrics (see ``Source``): of one batch's read, ``rows`` and,
    when ``good`` tells good rows from bad, ``bad``; of several batches' (``tagged``),
    ``untagged`` and, with ``good``, ``bad_from`` and ``bad_to``: the first and the last
    batch with bad rows (plain aggregates: a set of batches would cost a pass of its
    own)."""
    from pyspark.sql import functions as F

    if tagged:
        batch = F.col(BATCH_COLUMN)
        untagged = F.count(F.when(batch.isNull(), 1)).alias("untagged")
        if good is None:
            return [untagged]
        bad = F.when(~good, batch)
        return [untagged, F.min(bad).alias("bad_from"), F.max(bad).alias("bad_to")]
    if good is None:
        return [F.count(F.lit(1)).alias("rows")]
    return [F.count(F.when(good, 1)).alias("rows"), F.count(F.when(~good, 1)).alias("bad")]


@dataclass(frozen=True)
class SourceRead:
    """What ``read`` returns: parsed records and the rows that would not parse.

    Both are lazy: the batch computes them in its jobs over the input.
    ``bad`` has the columns of ``lowmark.state.quarantine.SCHEMA`` (or is None when the
    format cannot hold malformed rows). ``counts`` observes the input as the
    first job over ``records`` reads it: ``rows`` (records) and ``bad`` (bad
    rows; absent when the format has none); a union of reads has one
    observation per read, which ``lowmark.batches.collect.observed`` adds up.
    ``cached`` are frames the source persisted (``read(..., cache=True)``);
    the caller unpersists them when the batch is done.
    """

    records: DataFrame
    bad: DataFrame | None
    counts: Observation | tuple[Observation, ...]
    cached: tuple[DataFrame, ...] = ()
    explain: Callable[[Exception], LowmarkError | None] = lambda _: None
    """Turns a Spark failure of a job over these frames into the user's error, if it is one
    (a file that cannot be read with the source schema)."""
    size_bytes: int | None = None
    """How much input the batch takes, if the source knows or can estimate it (it sizes the
    batch's shuffles, and a small input is read in one task: ``in_one_task``)."""

    @property
    def small(self) -> bool:
        """True when the input is known to be at most ``ONE_TASK_BYTES``."""
        return self.size_bytes is not None and self.size_bytes <= ONE_TASK_BYTES

    def in_one_task(self) -> SourceRead:
        """This read with its records in one partition when it is ``small``: a small windowed
        batch then runs its job in one stage of one task (an aggregation over one partition
        needs no shuffle), where each stage and task is a fixed cost larger than its share
        of the work. Any other read as it is.

        Used for reads that are not cached (windowed batches), the case measured
        (``ONE_TASK_BYTES``). A stateless batch's one job reads its cached parse twice (its
        records, and beside them the rows that did not parse), a deduplication already
        judges a small batch in one task, and a keyed step shuffles by bucket anyway."""
        return replace(self, records=self.records.coalesce(1)) if self.small else self

    def unpersist(self) -> None:
        """Drop whatever ``read`` cached for this batch."""
        for df in self.cached:
            df.unpersist()


class Source(ABC):
    """A replayable source of records.

    Contract:
    - ``plan(start, batch_id)`` returns the end offsets of the next batch,
      honouring the per-batch admission limit; ``end == start`` means no new
      data. It may record what it discovered (idempotently per ``batch_id``),
      unless ``record`` is False (a dry run: the same answer, nothing written).
      With ``discover`` False it plans over what it recorded before only (a
      later batch planned ahead, whose input must be readable now).
      A ``plan`` may take one more, optional parameter, ``clocks`` (aligned
      admission, ``event_time.admission: aligned``): each partition's current
      watermark input (its max event time, or its ingestion time), by which it
      admits the lowest-clock partitions first when its limit cannot take
      everything waiting (``aligned_share``). A ``plan`` without it is asked
      without it (``plan_in_clock_order``) and admits as it always did.
    - ``read(start, end, batch_id, cache, strict)`` is deterministic: the same
      range gives the same records every time, which is what makes a replay
      exact (and lets a batch read its input twice). ``cache`` persists the
      parse for a batch that runs several jobs over it. ``strict`` (a replay
      some of whose writes landed) refuses input that changed since the batch
      first read it, naming it, rather than read other records; otherwise the
      source records the input as it reads it now, so that a replay reads the
      same. Records
      carry their source partition in ``PARTITION_COLUMN`` (per-partition
      watermarks need it; ``partitions(start, end)`` names those a range
      takes, by default the offsets' keys that moved); lowmark drops it
      before the sink. ``waiting_partitions(end)`` names those with records
      past a planned ``end``.
    - ``read_batches(batches)`` (optional) reads consecutive batches in one
      scan, each record tagged with its batch in ``BATCH_COLUMN``; ``counts``
      then observes ``untagged``, the records it could not tag (the read is
      then of no use), and ``bad_from`` and ``bad_to``, the first and last
      batch with bad rows, if any (the caller counts each batch's records in
      its own aggregation: a metric per batch costs a pass over every record).
    - ``missing(start, end)`` says what of ``[start, end)`` the source no longer
      holds (a backfill reads the whole committed history again): None by
      default, for input that cannot be lost or whose ``read`` refuses what is
      gone before any job runs.
    - ``confirm(batch)``, called after a read's jobs, raises when the input
      changed while it was read. Nothing is written from the read before it,
      but a stateless batch whose sink write is its one job
      (``lowmark.batches.loop.one_job``): that write comes first. Optional; a
      no-op by default (input that cannot change).
    - ``commit(end)`` tells upstream everything before ``end`` is durably
      processed and may be discarded: the resumption frontier. Optional; a no-op by default.
    - ``retire(committed_end, batch_id)``, run by checkpoint maintenance,
      keeps what planning reads bounded. Optional; a no-op by default.
    - ``past_lost(start)`` (optional) is what a source configured to go on
      past lost history (``on_data_loss: skip``) passes over: None when
      upstream still holds ``start``, else where the next batch starts
      instead and what it skips there (the runner records both). A source
      configured to fail reports the loss from ``plan`` or ``read``.
    - ``identity()`` names what the offsets point into (a Kafka topic's id, a
      Delta table's id). The runner records it with each batch's offsets and
      stops when it changes: a source deleted and created again under the
      same name is another source. Optional; none by default (a folder of
      files has no id).
    - ``reader()`` is the source whose reads give the records: itself, or the one a
      wrapper reads through (``lowmark rebuild``'s recorded ranges); a step that needs
      what a kind of source knows of its reads (a stream-stream join: the union's sides)
      asks it.
    """

    @abstractmethod
    def initial_offsets(self) -> Offsets: ...

    def reader(self) -> Source:
        return self

    def start_moves(self) -> bool:
        """True when ``initial_offsets()`` depends on when it is asked ("latest", a time
        that records may still arrive after): the runner fixes batch 0's start at the
        first plan, a dry run's included, by recording it in the checkpoint. False by
        default (a beginning that stays put, recorded by the first run)."""
        return False

    @abstractmethod
    def plan(
        self, start: Offsets, batch_id: int, record: bool = True, discover: bool = True
    ) -> Offsets: ...

    @abstractmethod
    def read(
        self,
        start: Offsets,
        end: Offsets,
        batch_id: int,
        cache: bool = False,
        strict: bool = False,
    ) -> SourceRead: ...

    @abstractmethod
    def backlog(self, committed_end: Offsets) -> dict[str, int]:
        """What is waiting past ``committed_end``, without recording anything: counts by
        unit, the first one the headline (``files``, ``records``, ``versions``), 0 when
        nothing waits."""

    def describe_backlog(self, backlog: dict[str, int]) -> str:
        """``backlog`` in words, e.g. ``120 records waiting``."""
        return ", ".join(f"{n} {unit}" for unit, n in backlog.items()) + " waiting"

    def read_batches(self, batches: Sequence[Range]) -> SourceRead | None:
        """Consecutive ``batches`` in one read, records tagged with their batch; None when
        this source cannot (each batch is then read on its own)."""
        return None

    def partitions(self, start: Offsets, end: Offsets) -> tuple[str, ...]:
        """The source partitions records of ``[start, end)`` name in ``PARTITION_COLUMN``
        (each has its own watermark), sorted; by default the offsets' partitions that
        moved."""
        return tuple(sorted(p for p, n in end.items() if start.get(p) != n))

    def waiting_partitions(self, end: Offsets) -> tuple[str, ...]:
        """The source partitions with records past ``end``, sorted, as the ``plan`` that
        returned ``end`` saw the source (or later): those its admission limit left for
        later batches (a dry run's plan included; nothing is recorded). Their watermarks
        count however long a batch takes: a partition with records waiting is never idle.
        By default none: right for a source whose plan takes records from every partition
        that has some waiting."""
        return ()

    def ingestion_times(self, position: Offsets, observed_ms: int) -> dict[str, int] | None:
        """Per source partition, the exclusive minimum ingestion time of the records at or
        past ``position`` (an offset ``plan`` returned, or the start it was given), as the
        source stood when ``plan`` looked at ``observed_ms``: the ingestion time of the
        first record there, or ``observed_ms`` when nothing is there (whatever comes is
        written after). Recorded ingestion times only, so a replay gets the same answer.
        None (the default): this source has no ingestion clock.

        Each record ``read`` returns may carry its own ingestion time in
        ``INGESTED_COLUMN`` (epoch ms): at or after its partition's answer here while it is
        not taken, the same on every read. A record is then judged by it, whatever batch
        takes it; one without (null, or no column) by its batch's clock."""
        return None

    def inputs(self, start: Offsets, end: Offsets) -> list[str]:
        """What the range ``[start, end)`` holds, one item a line, as an operator would name
        it (a file; by default, the offsets): of any range ``plan`` returned, a dry run's
        (``record=False``) included."""
        return [f"offsets {start} -> {end}"]

    def input_bytes(self, start: Offsets, end: Offsets) -> int | None:
        """How many bytes ``[start, end)`` holds, if the source knows without reading it (of
        any range ``plan`` returned, a dry run's included); None by default."""
        return None

    def missing(self, start: Offsets, end: Offsets) -> str | None:
        """What of ``[start, end)`` the source no longer holds, in words naming the source,
        what is gone and the setting that keeps it longer; None when it holds all of it."""
        return None

    def past_lost(self, start: Offsets) -> Skipped | None:
        """What a batch starting at ``start`` passes over because upstream no longer holds
        it, when this source goes on past lost history; None by default."""
        return None

    def identity(self) -> Identity:
        """What the offsets point into now, by a readable name of each thing read (its
        partitions' positions mean nothing in another one); what cannot be found now
        (a deleted topic) is left out, for ``plan`` to report. Empty by default."""
        return {}

    def confirm(self, batch: Range) -> None:  # noqa: B027 - optional hook, no-op by default
        """Raises when ``batch``'s input changed since ``read`` read it."""

    def commit(self, end: Offsets) -> None:  # noqa: B027 - optional hook, no-op by default
        """Upstream may discard everything before ``end``."""

    def retire(self, committed_end: Offsets, batch_id: int) -> None:  # noqa: B027 - optional
        """Maintenance after batch ``batch_id`` committed up to ``committed_end``: what the
        source keeps of input that upstream no longer holds may leave what planning reads."""
