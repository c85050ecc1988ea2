"""Deduplication by record id, as users declare it: ``dedup: {columns: [event_id], within:
1 hour}``. What a batch does with it is ``lowmark.batches.event_time.dedup``."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from lowmark.batches.config import UserConfig
from lowmark.batches.durations import DurationMs


class Dedup(UserConfig):
    """Drop records whose id was already let through within ``within`` of event time.

    ``columns`` name the record id (after the transform); two records are the
    same record when every id column is equal (nulls equal nulls). The first
    in event time is kept. An id is held until the watermark passes its
    event time plus ``within``; a record older than that horizon cannot be
    told from a purged twin, so it goes to the late table, as does a record
    without event time. Needs ``event_time``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    columns: tuple[str, ...] = Field(min_length=1, description="Columns that identify a record.")
    within: DurationMs = Field(
        ge=0, description="How long (event time past the watermark) an id is remembered."
    )
