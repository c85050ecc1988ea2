"""Watermark arithmetic: per-partition watermarks, the pipeline watermark as their
minimum (a low watermark over its inputs), idle partitions left out; or, with an
ingestion-time watermark, the source's ingestion clock minus the maximum event-time
lag.

Pure functions over plain values, so a replay that feeds the same inputs
(the batch's recorded offsets and planning time) gets the same watermark.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from lowmark.batches.windows import EventTime


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
    marks = {p: t.watermark_ms(config) for p, t in parts.items()}
    active = [
        marks[p]
        for p, t in parts.items()
        if p in waiting
        or config.idle_timeout is None
        or now_ms - t.last_seen_ms < config.idle_timeout
    ]
    candidate = min(active) if active else max(marks.values())
    return candidate if previous is None else max(previous, candidate)


def ingestion_watermark(times: dict[str, int], lag_ms: int, previous: int | None) -> int | None:
    """The event-time clock of an ingestion-time watermark: the minimum over the source's
    partitions of their ingestion times (``Source.ingestion_times``: nothing ingested
    before it is still to come) minus ``lag_ms`` (how long after its event time a record
    may be written at most). Never below ``previous``; ``previous`` when no partition is
    known yet."""
    if not times:
        return previous
    candidate = min(times.values()) - lag_ms
    return candidate if previous is None else max(previous, candidate)
