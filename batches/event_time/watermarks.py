"""Watermark arithmetic: per-partition watermarks, the pipeline watermark as their
minimum (a low watermark over its inputs), idle partitions left out; or, with an
ingestion-time watermark, the source's ingestion clock minus the maximum event-time
lag; or, in a union whose sources each choose, both, each partition by its own
(``IngestionLags``).

Pure functions over plain values, so a replay that feeds the same inputs
(the batch's recorded offsets and planning time) gets the same watermark.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lowmark.batches.pipeline import Pipeline, UnionSource
from lowmark.batches.records import own_ingestion_clock
from lowmark.batches.sources.union import SEPARATOR
from lowmark.batches.windows import EventTime
from lowmark.state.offset_log import LATE_RULE, OffsetEntry

if TYPE_CHECKING:
    from pyspark.sql import Column


@dataclass(frozen=True)
class PartitionTime:
    """What one source partition has shown so far."""

    partition: str
    max_event_time_ms: int
    last_seen_ms: int
    """Processing time (planning time of the batch) it last had data."""

    def watermark_ms(self, config: EventTime) -> int:
        """This partition's watermark: its max event time minus the max out-of-orderness."""
        return self.max_event_time_ms - config.max_out_of_orderness


def observe(
    known: dict[str, PartitionTime], batch_max: dict[str, int], now_ms: int
) -> dict[str, PartitionTime]:
    """Fold one batch's per-partition max event time into ``known``."""
    merged = dict(known)
    for partition, event_ms in batch_max.items():
        before = known.get(partition)
        merged[partition] = PartitionTime(
            partition,
            max(event_ms, before.max_event_time_ms) if before else event_ms,
            now_ms,
        )
    return merged


def _active_marks(
    parts: dict[str, PartitionTime], config: EventTime, now_ms: int, waiting: Collection[str]
) -> list[int]:
    """The watermarks of the partitions of ``parts`` that are not idle (``pipeline_watermark``)."""
    return [
        t.watermark_ms(config)
        for p, t in parts.items()
        if p in waiting
        or config.idle_timeout is None
        or now_ms - t.last_seen_ms < config.idle_timeout
    ]


def pipeline_watermark(
    parts: dict[str, PartitionTime],
    config: EventTime,
    now_ms: int,
    previous: int | None,
    waiting: Collection[str],
) -> int | None:
    """min over active partitions of (max event time - max out-of-orderness).

    A partition without data for ``idle_timeout`` is idle and left out,
    unless it is one of ``waiting``: it has records waiting to be read (the
    batch's or past its end, as the source planned them), however long ago
    it was last read. If all are idle, the max is used. Never below
    ``previous``; None before any event was seen.
    """
    if not parts:
        return previous
    active = _active_marks(parts, config, now_ms, waiting)
    candidate = min(active) if active else max(t.watermark_ms(config) for t in parts.values())
    return candidate if previous is None else max(previous, candidate)


@dataclass(frozen=True)
class IngestionLags:
    """Which source partitions follow an ingestion-time watermark, and with what maximum
    event-time lag, by the prefix of their names: ``""`` for every partition (the pipeline's
    ``event_time.watermark``), ``"eu/"`` for a union's source ``eu`` (its ``watermarks``).
    The other partitions follow the event times seen."""

    by_prefix: dict[str, int]

    @classmethod
    def of_pipeline(cls, pipeline: Pipeline) -> IngestionLags:
        """The lags ``pipeline`` sets (none: every partition follows event time)."""
        event_time, source = pipeline.event_time, pipeline.source
        if event_time is not None and event_time.watermark is not None:
            return cls({"": event_time.watermark.max_event_time_lag})
        if event_time is not None and isinstance(source, UnionSource):
            return cls({n + SEPARATOR: w.max_event_time_lag for n, w in source.watermarks.items()})
        return cls({})

    @property
    def everywhere(self) -> bool:
        """Every partition follows ingestion time (the pipeline's strategy)."""
        return "" in self.by_prefix

    def lag_of(self, partition: str) -> int | None:
        """``partition``'s lag; None when it follows event time."""
        return next((n for p, n in self.by_prefix.items() if partition.startswith(p)), None)

    def own_clock(self) -> Column | None:
        """Per record, the clock it is judged by on its own (``own_ingestion_clock`` of these
        lags); None when no partition follows ingestion time."""
        return own_ingestion_clock(self.by_prefix)

    def replay_refusal(
        self, planned: OffsetEntry, pipeline: str, deduplicates: bool = False
    ) -> str | None:
        """Why the batch ``planned`` may not be replayed by this lowmark, or None: it was
        planned under another late rule (``OffsetEntry.late_rule``) and a partition follows
        an ingestion clock or the pipeline ``deduplicates``, so its first attempt may have
        written verdicts a replay under this rule would not repeat (a sink counting a record
        the late table then also holds). Under event time alone, without deduplication,
        the rules agree, so the replay goes on."""
        if planned.late_rule == LATE_RULE or not (self.by_prefix or deduplicates):
            return None
        return (
            f"batch {planned.batch_id} of {pipeline} was planned by an older lowmark that "
            f"judged late records by the {planned.late_rule} rule, this one by {LATE_RULE}: "
            "finish that batch with the lowmark that planned it, then upgrade, or set its "
            f"input aside with `lowmark skip-batch {pipeline} {planned.batch_id} --reason ...`"
        )

    def watermark(
        self,
        ingestion: dict[str, int],
        parts: dict[str, PartitionTime],
        config: EventTime,
        now_ms: int,
        previous: int | None,
        waiting: Collection[str],
    ) -> int | None:
        """The pipeline watermark over every partition, each by its own strategy: the
        minimum of the ingestion clocks of those that follow ingestion time (their
        ``ingestion`` times, ``Source.ingestion_times``: nothing ingested before it is still
        to come, minus their lag: how long after its event time a record may be written at
        most) and the event-time watermark (``pipeline_watermark``) of the others (their
        ``parts``); ``previous`` while no partition is known.

        With both kinds, an event-time partition idle for ``idle_timeout`` holds nothing
        back (the ingestion clock goes on), and one with records ``waiting`` that has shown
        no event time yet holds the watermark at ``previous``: its records may be the
        oldest. Never below ``previous``.
        """
        if not self.by_prefix:
            return pipeline_watermark(parts, config, now_ms, previous, waiting)
        clocks = [t - lag for p, t in ingestion.items() if (lag := self.lag_of(p)) is not None]
        candidates = [min(clocks)] if clocks else []
        if not self.everywhere:
            unclocked = {p: t for p, t in parts.items() if self.lag_of(p) is None}
            if any(self.lag_of(w) is None and w not in unclocked for w in waiting):
                return previous
            candidates += _active_marks(unclocked, config, now_ms, waiting)
        if not candidates:
            return previous
        candidate = min(candidates)
        return candidate if previous is None else max(previous, candidate)
