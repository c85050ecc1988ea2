"""Input for the sessions example (``examples.keyed.Sessions``) and the sessions its rule
gives over a whole input, computed plainly from the rule (the reference)."""

from __future__ import annotations

import random
from typing import Any

import pandas as pd

from examples.keyed import INACTIVITY_MS

MINUTE = 60_000


def events(seed: int) -> pd.DataFrame:
    rng = random.Random(seed)
    rows, now = [], 0
    for _ in range(120):
        now += rng.choice([1, 2, 5, 20, 31, 45]) * MINUTE
        rows.append(
            {
                "user": rng.choice("ab"),
                "ts_ms": now,
                "action": rng.choice(["view"] * 8 + ["logout"]),
            }
        )
    events = pd.DataFrame(rows)
    events["ts"] = pd.to_datetime(events["ts_ms"], unit="ms", utc=True)
    return events


def sessions(events: pd.DataFrame) -> list[tuple[Any, ...]]:
    """Sessions per user over the whole input, from the rule alone."""
    ended = []
    for user, mine in events.sort_values("ts_ms").groupby("user"):
        start = last = None
        count = 0
        for at, action in zip(mine["ts_ms"], mine["action"], strict=True):
            if last is not None and at - last > INACTIVITY_MS:
                ended.append((user, start, last, count, "inactivity"))
                start, count = None, 0
            start = at if start is None else start
            last, count = at, count + 1
            if action == "logout":
                ended.append((user, start, last, count, "logout"))
                start, last, count = None, None, 0
        if last is not None:
            ended.append((user, start, last, count, "inactivity"))
    return sorted(ended)
