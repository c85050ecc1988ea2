"""What a runner tells listeners (``lowmark.batches.loop.listeners``) about its batches.

Like Structured Streaming's listener events: typed, frozen, and each one
``to_json()`` (a dict of plain values) and ``json()`` (that dict as JSON text).
``BatchResult`` is the progress of one committed batch, what ``run`` returns
and ``lowmark run --json`` prints.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from lowmark.state.offset_log import Offsets


class _Json:
    """``to_json()`` and ``json()`` of a dataclass event: its fields, as plain values."""

    def to_json(self) -> dict[str, Any]:
        """The event's fields as a dict of JSON values."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def json(self) -> str:
        """The event as one line of JSON."""
        return json.dumps(self.to_json(), sort_keys=True)


@dataclass(frozen=True)
class BatchStarted(_Json):
    """A batch was planned and starts its work (after its offsets are known)."""

    pipeline: str
    batch_id: int
    replay: bool
    """True when it runs again an uncommitted batch, with its logged offsets."""
    watermark_ms: int | None
    """The watermark it runs with (the previous batch's next watermark)."""
    planned_at_ms: int
    """Processing time of its planning, epoch milliseconds."""


@dataclass(frozen=True)
class BatchResult(_Json):
    """What one committed batch did: its progress (the progress row, and more)."""

    pipeline: str
    batch_id: int
    replay: bool
    start: Offsets
    end: Offsets
    rows_in: int
    rows_out: int
    rows_bad: int
    rows_late: int
    watermark_ms: int | None
    """The watermark after the batch (the next batch runs with it)."""
    lag_ms: int | None
    """Planning time minus ``watermark_ms``: how far event time trails processing time."""
    durations_ms: dict[str, int] = field(default_factory=dict)
    """Milliseconds per step (``plan``, ``read``, ``sink``, ``commit``...) and ``total``."""
    violations: dict[str, int] = field(default_factory=dict)
    """Per expectation, the records that violated it (``parsable``: rows that did not
    parse); see ``lowmark.batches.expectations``."""
    committed_at_ms: int | None = None
    """Processing time when the progress row was written, epoch milliseconds."""
    backlog: dict[str, int] | None = None
    """What waits in the source past this batch's end, by unit (``files``, ``bytes``,
    ``records``, ``versions``): measured only when a listener asks for it
    (``PipelineListener.wants_backlog``), else None."""
    rows_duplicate: int | None = None
    """Records deduplication dropped as duplicates (None: the pipeline has no ``dedup``)."""
    ingestion_ms: dict[str, int] | None = None
    """With an ingestion-time watermark, per source partition, the source's ingestion time
    past the batch's end when it was planned (``watermark_ms`` is the minimum minus the
    maximum event-time lag); None otherwise."""


FailedKind = Literal["data", "operational", "transient", "definition"]
"""Why a batch failed: its data or transform (counted towards a poison batch), the
checkpoint or the system (counted apart), a passing error (tried again), or a definition
that cannot run (not counted: fix the definition)."""


@dataclass(frozen=True)
class BatchFailure(_Json):
    """A started batch failed before its commit; nothing it wrote is lost, and a later
    attempt (at once for a ``transient`` error, else the next run) replays it."""

    pipeline: str
    batch_id: int
    kind: FailedKind
    error: str
    """The error's first line."""


@dataclass(frozen=True)
class RunTerminated(_Json):
    """The runner stopped: its ``with`` block ended, normally or with an error."""

    pipeline: str
    runner_id: str
    error: str | None
    """The first line of the error it stopped with; None when it ended normally."""
