"""Fault injection: die at a named step of a batch, to prove recovery.

A batch (``MicroBatchRunner._batch``; ``before_commit``: ``commit_batch``)
calls ``reached(step, batch_id)`` once at each step below. With
``LOWMARK_KILL_AT=<step>@<batch_id>`` (e.g. ``after_sink@3``) in the
environment, reaching that step of that batch sends SIGKILL to the
Spark JVM and to the process itself: no cleanup, no ``finally``, as if the
machine died there. Unset (always, outside crash tests), a call costs one
environment lookup. A replay reaches the same steps, so it can be killed too.

Steps, in the order a batch reaches them:

- ``after_plan``: planned (discovery may have recorded new files); no offsets yet
- ``after_offset_log``: ``offsets[N]`` written, nothing processed
- ``after_read``: input read and counted, nothing written
- ``after_state``: bad records and window state written
- ``after_sink``: the sink written
- ``after_late``: late records written
- ``before_commit``: watermarks written, the commit log not yet
- ``after_commit``: committed; the source commit and progress row not yet

A transactional sink adds one step inside ``after_state`` .. ``after_sink``
(``SINK_STEPS``), reached only by pipelines with such a sink:

- ``before_sink_commit``: the batch's records are in the sink's open transaction,
  which is not committed yet (a Kafka sink)

In-process tests may use ``crash_at`` instead, which raises ``InjectedCrash``
at the step. That is cheaper than a process per crash but kinder than a kill:
``finally`` blocks run and the Spark session lives on, so the real-kill tests
stay the proof and the raising mode only multiplies the schedules tried.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from lowmark.batches.errors import FaultSpecInvalid

KILL_AT_ENV = "LOWMARK_KILL_AT"

STEPS = (
    "after_plan",
    "after_offset_log",
    "after_read",
    "after_state",
    "after_sink",
    "after_late",
    "before_commit",
    "after_commit",
)


SINK_STEPS = ("before_sink_commit",)
"""Steps inside a transactional sink's write (not every pipeline reaches them)."""

REBUILD_STEPS = (
    "rebuild_after_manifest",
    "swap_after_record",
    "swap_after_move",
    "swap_after_catch_up",
    "swap_after_sink",
    "swap_after_move_shadow",
)
"""Steps of ``lowmark rebuild`` between its shadow batches (which reach the batch steps
above) and of its swap (``lowmark.batches.admin.rebuild``): the shadow's file manifest
extended before the shadow batch of live batch N (``@N``), then, at the shadow's last
batch N, the swap recorded, the live checkpoint moved aside, the shadow caught up, each
sink's content replaced, the shadow checkpoint moved into place."""


class KillPoint(NamedTuple):
    """A step of one batch."""

    step: str
    batch_id: int

    def __str__(self) -> str:
        return f"{self.step}@{self.batch_id}"

    @classmethod
    def parse(cls, spec: str) -> KillPoint:
        """``"after_sink@3"`` → KillPoint("after_sink", 3)."""
        step, _, batch = spec.strip().partition("@")
        if step not in (*STEPS, *SINK_STEPS, *REBUILD_STEPS) or not batch.isdigit():
            steps = ", ".join((*STEPS, *SINK_STEPS, *REBUILD_STEPS))
            raise FaultSpecInvalid(
                f"{KILL_AT_ENV}={spec!r} is not <step>@<batch id>: steps are {steps}"
            )
        return cls(step, int(batch))


class InjectedCrash(BaseException):
    """Raised by ``crash_at`` at its step; a BaseException so no ``except Exception`` eats it."""


_crash_at: KillPoint | None = None


def reached(step: str, batch_id: int) -> None:
    """Called by the batch loop at ``step`` of ``batch_id``; dies there if told to."""
    here = KillPoint(step, batch_id)
    if here == _crash_at:
        raise InjectedCrash(f"injected crash at {here}")
    spec = os.environ.get(KILL_AT_ENV)
    if spec and KillPoint.parse(spec) == here:
        _kill()


@contextmanager
def crash_at(point: KillPoint) -> Iterator[None]:
    """Within this block, reaching ``point`` raises InjectedCrash (in-process tests)."""
    global _crash_at
    _crash_at = point
    try:
        yield
    finally:
        _crash_at = None


def _kill() -> None:
    # The JVM first: left alone it would notice its parent's death and shut
    # down politely, which is more than a crashed machine gets.
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    jvm = getattr(gateway, "proc", None) if gateway is not None else None
    if jvm is not None:
        os.kill(jvm.pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
