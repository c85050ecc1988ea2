"""Turns on one Spark: the batches of the runs one process executes run a few at a time, in the
order they found work.

The warm runner (``lowmark.orchestration.runner``) executes every pipeline's runs as
threads of one process on one Spark. Twenty following runs whose files land at once
would otherwise start twenty batches side by side on a laptop's two cores, the first
file found no sooner in the sink than the last and every batch's memory held at once;
taking turns (``RUNNER_BATCHES`` at a time), the first found are the first done. A run
that is caught up takes no turn: it asks its planner, read-only (a listing of its source
and its checkpoint's latest entries; no Spark job), whether a batch waits, and only then
queues for a turn.

A turn is one try at one batch (``MicroBatchRunner``'s plan-to-commit), so a run
draining a backlog goes to the back of the line after each batch, and a batch pausing
after a transient error (a broker away) lets the others run meanwhile.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lowmark.batches.loop.microbatch import BatchResult, MicroBatchRunner
from lowmark.batches.pipeline import Pipeline
from lowmark.state.session import SparkLike

SLOTS_ENV = "LOWMARK_RUNNER_BATCHES"
RUNNER_BATCHES = 4
"""Measured with 20 followers in one process, a file landing in each at once, on 2 cores:
one batch at a time put the first file in the sink soonest (1.3-2.9 s) but the last
after 31-50 s, as each batch then waits on I/O alone; 4 at a time, the last after 17-18 s
and the first within 3-6 s; no limit, 12-13 s and 4-7 s, with every batch's memory at
once (docs/dagster.md, "One warm runner")."""


def runner_batches() -> int:
    """How many batches the runner's Spark runs at once: ``LOWMARK_RUNNER_BATCHES``,
    default ``RUNNER_BATCHES``."""
    slots = int(os.environ.get(SLOTS_ENV, str(RUNNER_BATCHES)))
    if slots < 1:
        raise ValueError(f"{SLOTS_ENV}={slots}: give 1 or more batches at once")
    return slots


class Turns:
    """At most ``slots`` turns held at once, granted in the order they were asked for."""

    def __init__(self, slots: int = 1) -> None:
        self.slots = slots
        self._changed = threading.Condition()
        self._waiting: deque[object] = deque()
        self._held = 0

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Wait for a turn (first asked, first served), hold it for the block."""
        me = object()
        with self._changed:
            self._waiting.append(me)
            self._changed.wait_for(lambda: self._waiting[0] is me and self._held < self.slots)
            self._waiting.popleft()
            self._held += 1
            self._changed.notify_all()  # the next in line may fit in a free slot too
        try:
            yield
        finally:
            with self._changed:
                self._held -= 1
                self._changed.notify_all()


TURNS = Turns()
"""This process's turns (the runner sets its slots as it starts: ``runner_batches``)."""


WAIT_TOLD_S = 0.1
"""A wait for a turn this long or longer is told (``TakingTurns.waited``)."""


class TakingTurns(MicroBatchRunner):
    """A ``MicroBatchRunner`` whose batches take ``turns``; one with nothing to run takes none.

    Nothing else changes: each batch is the runner's own, plan to commit, with the same
    exactly-once protocol; only when it starts is decided here. ``waited`` is told the
    seconds a batch waited for its turn, when ``WAIT_TOLD_S`` or more."""

    def __init__(
        self,
        spark: SparkLike,
        pipeline: Pipeline,
        data_root: Path,
        turns: Turns = TURNS,
        waited: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        super().__init__(spark, pipeline, data_root)
        self.turns, self.waited = turns, waited

    def _attempt(self, retry: bool) -> BatchResult | None:
        # Read-only, with no Spark job: what every poll of a caught-up follower costs.
        if self.planner.next_batch(dry_run=True, retry=retry).planned is None:
            return None
        asked = time.monotonic()
        with self.turns.turn():
            waited = time.monotonic() - asked
            if waited >= WAIT_TOLD_S:
                self.waited(waited)
            return super()._attempt(retry)
