"""A stateful processor run batch by batch (``KeyedRun``) gives what the documented semantics
give over the whole input: sessions that end after 30 minutes of inactivity or at a logout
(``examples.keyed.Sessions``), against a plain pandas computation; timers fire once each,
in a batch with input or in one without."""

from __future__ import annotations

import random
from typing import Any

import pandas as pd
import pytest

from examples.keyed import INACTIVITY_MS, Sessions
from lowmark.batches.keyed.runtime import DELETED, Key, KeyedRun
from tests.batches.keyed.sessions import events, sessions


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sessions_batch_by_batch_equal_sessions_over_the_whole_input(seed: int) -> None:
    stream = events(seed)
    cuts = sorted(random.Random(seed).sample(range(1, len(stream)), 6))
    states: dict[Key, dict[str, Any]] = {}
    timers: dict[Key, set[int]] = {}
    watermark = None
    out, fired = [], 0
    batches = [stream.iloc[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    for batch in [*batches, stream.iloc[0:0]]:  # the last batch: no input, a watermark far on
        if not len(batch):
            watermark = int(stream["ts_ms"].max()) + 2 * INACTIVITY_MS
        records = {(u,): rows.reset_index(drop=True) for u, rows in batch.groupby("user")}
        due = {k: t for k, t in timers.items() if k in records or min(t, default=None) is not None}
        run = KeyedRun(Sessions, "event_time", watermark, processing_ms=0)
        outcome = run.run(records, {k: states.get(k, {}) for k in records | due}, due)
        out.extend(outcome.output)
        fired += outcome.fired
        for key, changes in outcome.changes.items():
            for name, value in changes.states.items():
                if value is DELETED:
                    states.get(key, {}).pop(name, None)
                else:
                    states.setdefault(key, {})[name] = value
            timers[key] = (timers.get(key, set()) | changes.timers_set) - changes.timers_deleted
        if len(batch):
            watermark = int(batch["ts_ms"].max())
    emitted = pd.concat(out)
    got = sorted(
        (u, s.value // 1_000_000, e.value // 1_000_000, n, why)
        for u, s, e, n, why in emitted.itertuples(index=False)
    )
    assert got == sessions(stream)
    assert not any(timers.values()) and not any(states.values())
    # A session still open when its user's stream end closes only by its timer.
    last = stream.sort_values("ts_ms").groupby("user")["action"].last()
    assert fired >= int((last != "logout").sum()) > 0
