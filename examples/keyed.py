"""Stateful processors for keyed steps (docs/keyed.md), written against Spark's
``StatefulProcessor`` API: each runs under lowmark and under Structured Streaming's
``transformWithStateInPandas`` alike."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

INACTIVITY_MS = 30 * 60 * 1000
SESSIONS = (
    "user string, session_start timestamp, session_end timestamp, events long, ended_by string"
)


class Sessions(StatefulProcessor):
    """A user's session ends after 30 minutes of inactivity or at a ``logout`` event.

    State: the open session's start, last event time and event count. A timer at
    the last event + 30 minutes of event time closes a session nobody ended."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.open = handle.getValueState("open", "start_ms long, last_ms long, events long")

    def handleInputRows(
        self,
        key: Any,
        rows: Iterator[pd.DataFrame],
        timerValues: TimerValues,
    ) -> Iterator[pd.DataFrame]:
        held = self.open.get()
        start, last, events = held if held is not None else (None, None, 0)
        ended = []
        for batch in rows:
            for ts, action in zip(batch["ts"], batch["action"], strict=True):
                at = int(pd.Timestamp(ts).value // 1_000_000)
                if last is not None and at - last > INACTIVITY_MS:
                    ended.append((start, last, events, "inactivity"))
                    start, last, events = None, None, 0
                start = at if start is None else start
                last, events = at, events + 1
                if action == "logout":
                    ended.append((start, last, events, "logout"))
                    start, last, events = None, None, 0
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        if last is None:
            self.open.clear()
        else:
            self.open.update((start, last, events))
            self.handle.registerTimer(last + INACTIVITY_MS)
        if ended:
            yield self.rows(key[0], ended)

    def handleExpiredTimer(
        self,
        key: Any,
        timerValues: TimerValues,
        expiredTimerInfo: ExpiredTimerInfo,
    ) -> Iterator[pd.DataFrame]:
        held = self.open.get()
        if held is not None:
            self.open.clear()
            yield self.rows(key[0], [(*held, "inactivity")])

    def rows(self, user: str, ended: list[tuple[int, int, int, str]]) -> pd.DataFrame:
        """The output rows of ``user``'s ``ended`` sessions (start, last event, events, why)."""
        return _sessions(user, ended)

    def close(self) -> None:
        pass


CLOSED_SESSIONS = f"{SESSIONS}, closed_at timestamp"


class ClosedSessions(Sessions):
    """``Sessions``, each row also stamped with when its session closed (``closed_at``): at
    its logout, or 30 minutes after its last event. That is the event time a windowed
    aggregation after the keyed step counts sessions by (docs/keyed.md, "A keyed step
    before windows"): a session closed by its timer closes at the timer's time, which the
    watermark of the batch before had not reached, so its row lands in a window still
    open."""

    def rows(self, user: str, ended: list[tuple[int, int, int, str]]) -> pd.DataFrame:
        closed = [last if why == "logout" else last + INACTIVITY_MS for _, last, _, why in ended]
        return _sessions(user, ended).assign(closed_at=pd.to_datetime(closed, unit="ms", utc=True))


def _sessions(user: str, ended: list[tuple[int, int, int, str]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user": [user] * len(ended),
            "session_start": pd.to_datetime([s for s, _, _, _ in ended], unit="ms", utc=True),
            "session_end": pd.to_datetime([e for _, e, _, _ in ended], unit="ms", utc=True),
            "events": [n for _, _, n, _ in ended],
            "ended_by": [why for _, _, _, why in ended],
        }
    )


SILENCE_MS = 10 * 1000
ALERTS = "user string, silent_since timestamp, alerted_at timestamp"


class SilenceAlert(StatefulProcessor):
    """An alert row when a user has been silent for more than 10 seconds of event time.

    State: the user's last event time. A silence between two of its events raises the
    alert as the later one is read; a timer at the last event + 10 seconds raises it when
    the watermark passes that with no event since (a new event moves the timer). Either
    way the alert names when the silence began, whatever the batches."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.last = handle.getValueState("last", "last_ms long")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        held = self.last.get()
        last = held[0] if held is not None else None
        silences = []
        for batch in rows:
            for ts in batch["ts"]:
                at = int(pd.Timestamp(ts).value // 1_000_000)
                if last is not None and at - last > SILENCE_MS:
                    silences.append(last)
                last = at if last is None else max(last, at)
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        assert last is not None
        self.last.update((last,))
        self.handle.registerTimer(last + SILENCE_MS)
        if silences:
            yield _alerts(key[0], silences)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        held = self.last.get()
        self.last.clear()
        if held is not None:
            yield _alerts(key[0], [held[0]])

    def close(self) -> None:
        pass


def _alerts(user: str, silent_since: list[int]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user": [user] * len(silent_since),
            "silent_since": pd.to_datetime(silent_since, unit="ms", utc=True),
            "alerted_at": pd.to_datetime(
                [s + SILENCE_MS for s in silent_since], unit="ms", utc=True
            ),
        }
    )


DEVICE_STATUS = "device string, status string, since timestamp, readings long"


class LatestStatus(StatefulProcessor):
    """The latest status of each device and how many readings it sent, one row per device
    and batch that heard from it: upserted by device into a Delta table other pipelines
    read (``sink: {mode: merge, keys: [device]}``)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.seen = handle.getValueState("seen", "status string, since_ms long, readings long")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        held = self.seen.get()
        status, since, readings = held if held is not None else (None, None, 0)
        for batch in rows:
            for ts, now in zip(batch["ts"], batch["status"], strict=True):
                at = int(pd.Timestamp(ts).value // 1_000_000)
                if now != status:
                    status, since = now, at
                readings += 1
        self.seen.update((status, since, readings))
        yield pd.DataFrame(
            {
                "device": [key[0]],
                "status": [status],
                "since": pd.to_datetime([since], unit="ms", utc=True),
                "readings": [readings],
            }
        )

    def close(self) -> None:
        pass
