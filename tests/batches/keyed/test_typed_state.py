"""Typed keyed state, batch by batch through the runtime (``KeyedRun``) and the storage form
of ``keyed_state`` (``KeyedRun.stored``, ``held_values``): values come back with the types
their declared schema gives; values stored before states were typed still read; a value the
schema does not hold fails in one line; a state with a TTL reads as absent once it expired
by the batch's processing time."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pandas as pd
import pytest
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import TimerValues

from lowmark.batches.errors import StateValueInvalid
from lowmark.batches.keyed.runtime import Key, KeyedRun
from lowmark.batches.keyed.state_values import held_values

VISIT = "at timestamp, day date, amount decimal(10,2), tags array<struct<name: string, n: long>>"

Stored = dict[Key, dict[str, tuple[str | None, int | None]]]
"""A ``keyed_state`` table in short: per key, each state's newest ``value`` and ``expires_ms``."""


class _Typed(StatefulProcessor):
    """Keeps each record in a value state (the last), a list state (all) and a map state
    (amount by day); yields, per key and batch, what it held before the batch."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.last = handle.getValueState("last", VISIT)
        self.all = handle.getListState("all", VISIT)
        self.by_day = handle.getMapState("by_day", "day date", "amount decimal(10,2)")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        held = (self.last.get(), list(self.all.get()), dict(self.by_day.iterator()))
        for frame in rows:
            for r in frame.itertuples():
                visit = (r.at, r.day, r.amount, r.tags)
                self.last.update(visit)
                self.all.appendValue(visit)
                self.by_day.updateValue((r.day,), (r.amount,))
        yield pd.DataFrame({"held": [held]})

    def close(self) -> None:
        pass


def _batches(
    factory: Any, batches: list[tuple[dict[Key, pd.DataFrame], int]], stored: Stored
) -> list[Any]:
    """Run ``factory``'s processor over ``batches`` (records by key, processing time), each
    starting from ``stored`` as a batch reads ``keyed_state`` and writing its changes back
    as a batch appends them; the ``held`` each batch yielded."""
    out = []
    for records, now in batches:
        run = KeyedRun(factory, "processing_time", None, now)
        states = {
            k: held_values(
                [(n, v, e) for n, (v, e) in stored.get(k, {}).items()], run.codecs, run.expiry
            )
            for k in records
        }
        outcome = run.run(records, states, {k: set() for k in records})
        out += [h for frame in outcome.output for h in frame["held"]]
        for key, changes in outcome.changes.items():
            for name, value, expires_ms in run.stored(changes):
                stored.setdefault(key, {})[name] = (value, expires_ms)
    return out


def _visits(*visits: tuple[Any, ...]) -> pd.DataFrame:
    return pd.DataFrame(visits, columns=["at", "day", "amount", "tags"])


def test_typed_values_come_back_across_batches_as_they_were_put_with_their_types() -> None:
    at = pd.Timestamp("2026-01-01 10:00:00.123456", tz="UTC")
    day = dt.date(2026, 1, 1)
    first = (at, day, Decimal("1.50"), [("x", 1), ("y", 2)])
    second: tuple[Any, ...] = (at + pd.Timedelta(hours=1), dt.date(2026, 1, 2), Decimal("2.25"), [])
    stored: Stored = {}
    held = _batches(_Typed, [({("a",): _visits(first)}, 0), ({("a",): _visits(second)}, 1)], stored)

    put = (at.to_pydatetime(), day, Decimal("1.50"), [("x", 1), ("y", 2)])
    assert held[0] == (None, [], {})
    last, every, by_day = held[1]
    assert last == put and every == [put] and by_day == {(day,): (Decimal("1.50"),)}
    assert [type(v) for v in last] == [dt.datetime, dt.date, Decimal, list]
    assert last[0].tzinfo == dt.UTC and type(last[3][0][1]) is int
    # The table holds JSON objects by field name that SQL's get_json_object reads.
    [value, _] = stored[("a",)]["last"]
    assert value is not None and json.loads(value)["at"] == "2026-01-01T11:00:00.123456Z"
    assert json.loads(value)["tags"] == []


def test_values_stored_before_states_were_typed_still_read_with_their_types() -> None:
    # As keyed_state held them before: positional lists, timestamps and decimals as str().
    untyped: Stored = {
        ("a",): {
            "last": ('{"value": ["2026-01-01 10:00:00+00:00", "2026-01-01", "1.50", []]}', None),
            "all": ('{"list": [["2026-01-01 10:00:00+00:00", "2026-01-01", "1.50", []]]}', None),
            "by_day": ('{"map": [[["2026-01-01"], ["1.50"]]]}', None),
        }
    }
    [held, _] = _batches(
        _Typed,
        [({("a",): _visits()}, 0), ({("a",): _visits()}, 1)],
        untyped,
    )
    put: tuple[Any, ...] = (
        dt.datetime(2026, 1, 1, 10, tzinfo=dt.UTC),
        dt.date(2026, 1, 1),
        Decimal("1.50"),
        [],
    )
    assert held == (put, [put], {(dt.date(2026, 1, 1),): (Decimal("1.50"),)})


class _Writes(StatefulProcessor):
    """Writes the first record's ``value`` column, as it is, to a value state."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("window", "start timestamp, n long")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        self.state.update(next(rows)["value"].iloc[0])
        return iter(())

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ((dt.datetime(2026, 1, 1, tzinfo=dt.UTC),), "got a tuple of 1; give a tuple of 2"),
        (("2026-01-01", 3), "field 'start' (timestamp): '2026-01-01' is not a datetime"),
        ((dt.datetime(2026, 1, 1, tzinfo=dt.UTC), 2.5), "field 'n' (bigint): 2.5 is not a whole"),
    ],
)
def test_a_value_the_schema_does_not_hold_fails_in_one_line_naming_the_state_and_field(
    value: tuple[Any, ...], named: str
) -> None:
    records = {("a",): pd.DataFrame({"value": [value]})}
    with pytest.raises(StateValueInvalid) as raised:
        KeyedRun(_Writes, "processing_time", None, 0).run(records, {}, {})
    message = str(raised.value)
    assert "\n" not in message and message.startswith("state 'window'") and named in message


class _Counts(StatefulProcessor):
    """Counts each key's records in a value state that expires a second after its last
    write; yields the count it held before the batch (None: none held)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "n long", ttlDurationMs=1000)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        held = self.count.get()
        n = held[0] if held is not None else 0
        self.count.update((n + sum(len(f) for f in rows),))
        yield pd.DataFrame({"held": [held]})

    def close(self) -> None:
        pass


def test_a_state_with_a_ttl_reads_as_absent_once_its_ttl_passed_since_its_last_write() -> None:
    one = {("a",): pd.DataFrame({"x": [1]})}
    stored: Stored = {}
    # Written at 0 (expires at 1000), read at 999 and rewritten (expires at 1999), read at
    # 1998; at 2998 its TTL has passed since that write.
    held = _batches(_Counts, [(one, 0), (one, 999), (one, 1998), (one, 2998)], stored)
    assert held == [None, (1,), (2,), None]
    assert stored[("a",)]["count"] == ('{"n":1}', 3998)

    # A replay of the last batch (the table as the batch before left it, the processing
    # time recorded for it) sees what the first attempt saw.
    def before() -> Stored:
        return {("a",): {"count": ('{"n":3}', 2998)}}

    assert _batches(_Counts, [(one, 2998)], before()) == [None]
    assert _batches(_Counts, [(one, 2997)], before()) == [(3,)]


class _Seen(StatefulProcessor):
    """Appends each record's ``x`` to a list state and sets it as an entry of a map state,
    both with a TTL of a second; ``put`` replaces the list when ``x`` is 0. Yields what it
    held before the batch."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.seen = handle.getListState("seen", "x long", ttlDurationMs=1000)
        self.by_x = handle.getMapState("by_x", "x long", "n long", ttlDurationMs=1000)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        held = ([x for (x,) in self.seen.get()], sorted(k for (k,), _ in self.by_x.iterator()))
        for frame in rows:
            for x in frame["x"]:
                if x == 0:
                    self.seen.put([(int(x),)])
                else:
                    self.seen.appendValue((int(x),))
                self.by_x.updateValue((int(x),), (1,))
        yield pd.DataFrame({"held": [held]})

    def close(self) -> None:
        pass


def test_list_elements_and_map_entries_expire_one_by_one_from_the_write_that_put_each() -> None:
    def x(value: int) -> dict[Key, pd.DataFrame]:
        return {("a",): pd.DataFrame({"x": [value]})}

    stored: Stored = {}
    # 1 is put at 0 (expires at 1000), 2 at 500 (1500), 3 at 1200 (2200); each is gone
    # once its own second passed. 0 at 1600 by `put`, which replaces the list's elements
    # but not the map's entries.
    held = _batches(
        _Seen, [(x(1), 0), (x(2), 500), (x(3), 1200), (x(0), 1600), (x(4), 2100)], stored
    )
    assert held == [([], []), ([1], [1]), ([2], [2]), ([3], [3]), ([0], [0, 3])]
    # A row expires with the last of its elements (what maintenance and `keys_held` go by).
    assert stored[("a",)]["seen"][1] == stored[("a",)]["by_x"][1] == 3100

    # A list or map stored before expiries were kept per element expires with its row.
    def before() -> Stored:
        entry = '[{"key":{"x":7},"value":{"n":1}}]'
        return {("a",): {"seen": ('[{"x":7}]', 1000), "by_x": (entry, 1000)}}

    assert _batches(_Seen, [(x(1), 999)], before()) == [([7], [7])]
    assert _batches(_Seen, [(x(1), 1000)], before()) == [([], [])]
