"""Follow mode: keep one runner (one Spark session) and take files as they land.

Like Structured Streaming's processing-time trigger: while the source has
work, batches run back to back; once caught up, the loop sleeps the poll
interval and asks again. A stop request (SIGINT, SIGTERM or ``should_stop``)
is honoured only between batches, so a batch that has started always
finishes and commits before the loop returns.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Literal, Protocol

from lowmark.batches.clock import Clock, SystemClock
from lowmark.batches.loop.microbatch import BatchResult

log = logging.getLogger(__name__)

StopReason = Literal["max_seconds", "signal", "should_stop"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_STOP_CHECK_S = 0.2
"""Longest single sleep: a stop request while caught up is seen within this time."""


class BatchRunner(Protocol):
    """What follow needs of a runner (``MicroBatchRunner`` is one)."""

    def run_batch(self) -> BatchResult | None:
        """Run and commit the next batch; None when there is nothing to do now."""
        ...


@dataclass
class FollowResult:
    """The batches a follow loop committed, in order, and why it returned."""

    batches: list[BatchResult] = field(default_factory=list)
    stopped_by: StopReason = "max_seconds"
    signal_name: str | None = None
    """``"SIGINT"`` or ``"SIGTERM"`` when ``stopped_by == "signal"``."""

    def describe(self) -> str:
        """One line: how many batches ran and why the loop stopped."""
        n = len(self.batches)
        ran = f"{n} batch{'' if n == 1 else 'es'}"
        if self.stopped_by == "signal":
            return f"stopped by {self.signal_name} after {ran}"
        if self.stopped_by == "should_stop":
            return f"stopped on request after {ran}"
        return f"stopped after {ran}: time limit reached"


class _StopFlag:
    """Set by a signal handler or by ``should_stop``; read between batches and sleeps."""

    def __init__(self, should_stop: Callable[[], bool] | None) -> None:
        self.should_stop = should_stop
        self.signal_name: str | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        # A signal handler only records the request: the batch in progress goes on.
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            log.info("%s received: stopping after the current batch", self.signal_name)

    def reason(self) -> StopReason | None:
        if self.signal_name is not None:
            return "signal"
        if self.should_stop is not None and self.should_stop():
            return "should_stop"
        return None


@contextmanager
def _stop_on_signals(flag: _StopFlag, install: bool) -> Iterator[None]:
    """Route SIGINT and SIGTERM to ``flag`` while following; restore the old handlers after.

    Python lets only the main thread install handlers; elsewhere (or with
    ``install=False``) the loop relies on ``should_stop`` alone.
    """
    if not install or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, flag.handle)
        yield
    finally:
        for sig, handler in previous.items():
            # None: the old handler was not installed from Python; the default is closest.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def follow(
    runner: BatchRunner,
    poll_interval_s: float,
    max_seconds: float | None = None,
    on_batch: Callable[[BatchResult], None] | None = None,
    clock: Clock | None = None,
    sleep: Callable[[float], None] = time.sleep,
    should_stop: Callable[[], bool] | None = None,
    handle_signals: bool = True,
) -> FollowResult:
    """Run ``runner``'s batches as files land, until ``max_seconds`` or a stop request.

    Contract:

    - While ``runner.run_batch()`` returns a result, the next batch starts
      right away (catch-up runs back to back). When it returns None (caught
      up), the loop sleeps ``poll_interval_s`` and polls again.
    - ``max_seconds`` (None = forever) is measured with ``clock`` from the
      call: no batch starts after it, and a poll sleep never runs past it.
      A batch running when it passes finishes first.
    - Stop requests are honoured only between batches: SIGINT and SIGTERM
      (when ``handle_signals`` and called from the main thread) and
      ``should_stop()`` returning True. A batch in progress finishes and
      commits, then the loop returns; during a poll sleep the request is
      seen within 0.2 s. The signal handlers are installed only for the
      duration of the call and the previous ones are restored afterwards
      (PySpark's SIGINT handler, which cancels jobs mid-batch, included).
    - ``on_batch`` is called after each committed batch. An exception from
      a batch propagates (what it committed stays committed; an uncommitted
      batch is replayed by the next runner).
    - Time is injected: ``clock`` reads now, ``sleep`` waits, so tests use a
      fake clock and never sleep.
    """
    if poll_interval_s <= 0:
        raise ValueError(f"poll_interval_s must be > 0, not {poll_interval_s}")
    clock = clock or SystemClock()
    started_ms = clock.now_ms()
    deadline_ms = None if max_seconds is None else started_ms + round(max_seconds * 1000)
    flag = _StopFlag(should_stop)
    result = FollowResult()

    def out_of_time() -> bool:
        return deadline_ms is not None and clock.now_ms() >= deadline_ms

    with _stop_on_signals(flag, handle_signals):
        while True:
            reason = flag.reason()
            if reason is not None:
                result.stopped_by, result.signal_name = reason, flag.signal_name
                break
            if out_of_time():
                result.stopped_by = "max_seconds"
                break
            batch = runner.run_batch()
            if batch is not None:
                result.batches.append(batch)
                if on_batch is not None:
                    on_batch(batch)
                continue
            _poll_sleep(poll_interval_s, clock, sleep, flag, deadline_ms)
    log.info("follow: %s", result.describe())
    return result


def _poll_sleep(
    interval_s: float,
    clock: Clock,
    sleep: Callable[[float], None],
    flag: _StopFlag,
    deadline_ms: int | None,
) -> None:
    """Sleep ``interval_s`` (at most until the deadline) in short slices, waking on a stop.

    Python resumes ``time.sleep`` after a signal handler returns, so one long
    sleep would delay a Ctrl-C by up to the poll interval.
    """
    wake_ms = clock.now_ms() + round(interval_s * 1000)
    if deadline_ms is not None:
        wake_ms = min(wake_ms, deadline_ms)
    while flag.reason() is None:
        left_ms = wake_ms - clock.now_ms()
        if left_ms <= 0:
            return
        sleep(min(left_ms / 1000, _STOP_CHECK_S))
