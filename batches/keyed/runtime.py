"""Running a user's stateful processor over one task's keys: the executor side of a keyed step.

The processor is written against Spark's ``StatefulProcessor`` API
(``pyspark.sql.streaming.StatefulProcessor``: ``init(handle)``,
``handleInputRows(key, rows, timerValues)``, ``handleExpiredTimer(key,
timerValues, expiredTimerInfo)``, ``close()``), so one class runs under
Structured Streaming's ``transformWithStateInPandas`` and under lowmark. The
handle lowmark gives it (``Handle``) keeps each key's state and timers in
memory for the task: ``KeyedRun.run`` is handed what the state tables held
for the task's keys as of the batch's start, and returns what the batch
changed, which the caller writes (once per batch) to the state tables.

Per batch, per key, in key order (``KeyedRun.run``):

1. the key's new records, ordered by event time, go to ``handleInputRows``;
2. its timers that are due (event time: at or below the batch's watermark;
   processing time: at or below the batch's processing time) fire, in
   timestamp order, each through ``handleExpiredTimer``; a timer is deleted
   as it fires, so it fires once, and one a handler sets at or below the
   watermark fires in the same batch.

Everything a handler sees is what the batch started from plus what the
handlers before it changed, so a replay from the same start gives the same
outputs and the same changes.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    TimerValues,
)

from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.keyed.state_schema import StateKind, StateSchema, TtlClock, as_struct
from lowmark.batches.keyed.state_values import StateCodec
from lowmark.state.keyed_state import Expiry

TimeMode = Literal["event_time", "processing_time"]
TTL_CLOCKS: tuple[str, ...] = typing.get_args(TtlClock)
Key = tuple[Any, ...]
StateValues = dict[str, Any]
"""A key's states by name: a value state's tuple; a list state's list of (tuple, expiry)
pairs, a map state's dict of tuple → (tuple, expiry): each element or entry beside when it
expires (None: never), as Spark's TTL runs per list element and map entry (``Handle``)."""


@dataclass
class KeyChanges:
    """What a batch changed of one key: the states it wrote (a name → its new value, or
    ``DELETED``), when each expires (in ms of its TTL's clock; None: never), and its timers."""

    states: dict[str, Any] = field(default_factory=dict)
    expires: dict[str, int | None] = field(default_factory=dict)
    timers_set: set[int] = field(default_factory=set)
    timers_deleted: set[int] = field(default_factory=set)


DELETED = object()
"""A state's value once ``clear``ed (or ``deleteIfExists``)."""


@dataclass
class Outcome:
    """What ``KeyedRun.run`` gives back: the processor's output rows and, per key, the
    changes to write."""

    output: list[pd.DataFrame]
    changes: dict[Key, KeyChanges]
    fired: int
    """Timers that fired."""
    timers: dict[Key, set[int]]
    """Each key's pending timers after the batch (what its timers state is to hold)."""


class Handle:
    """lowmark's ``StatefulProcessorHandle``: the states and timers of the current key.

    A state's values are checked against the schema ``init`` declared for it, and kept
    with its declared Python types (``lowmark.batches.keyed.state_values``); a state
    with a TTL expires ``ttlDurationMs`` after the processing time of the batch that last
    wrote it (``processing_ms``) or, with ``ttlClock="event_time"``, after the event time
    of that write (``event_ms``: the key's newest record in ``handleInputRows``, the timer
    in ``handleExpiredTimer``). A list's elements and a map's entries expire one by one, as
    in Spark: each from the write that put it (``put`` renews all of a list's, an append
    only those it adds, ``updateValue`` only its entry)."""

    def __init__(self, processing_ms: int = 0) -> None:
        self.key: Key = ()
        self.event_ms: int | None = None
        """The event time of what the processor is handling now (``KeyedRun.run`` sets it)."""
        self.states: dict[Key, StateValues] = {}
        self.timers: dict[Key, set[int]] = {}
        self.changes: dict[Key, KeyChanges] = {}
        self.processing_ms = processing_ms
        self.declared: dict[str, StateSchema] = {}
        """The states ``init`` declared, by name."""
        self.codecs: dict[str, StateCodec] = {}
        """Their values' codecs, by name."""

    def _state(self, name: str) -> Any:
        value = self.states.get(self.key, {}).get(name, DELETED)
        return None if value is DELETED else value

    def _write(self, name: str, value: Any) -> None:
        self.states.setdefault(self.key, {})[name] = value
        changes = self.changes.setdefault(self.key, KeyChanges())
        changes.states[name] = value
        declared = self.declared.get(name)
        if value is DELETED or declared is None:
            changes.expires[name] = None
        elif declared.kind == "value":
            changes.expires[name] = self._expiry(declared)
        else:  # the row expires with the last of its elements
            expiries = [e for _, e in (value.values() if declared.kind == "map" else value)]
            changes.expires[name] = None if None in expiries else max(expiries, default=None)

    def _expires(self, name: str) -> int | None:
        """When an element that state ``name`` is given now expires (None: never)."""
        return self._expiry(self.declared[name])

    def _expiry(self, state: StateSchema) -> int | None:
        """When a write of ``state`` now expires, in its TTL's clock (None: never)."""
        if state.ttl_ms is None:
            return None
        if state.ttl_clock == "processing_time":
            return self.processing_ms + state.ttl_ms
        return None if self.event_ms is None else self.event_ms + state.ttl_ms

    def _declare(
        self,
        name: str,
        kind: StateKind,
        schema: object,
        ttl_ms: int | None,
        ttl_clock: str,
        key_schema: object = None,
    ) -> StateCodec:
        held = self.declared.get(name)
        if held is not None and held.kind != kind:
            raise PipelineConfigInvalid(
                f"state {name!r} is declared as {held.kind} state and as {kind} state: "
                "give each state one name"
            )
        if ttl_ms is not None and ttl_ms < 0:
            raise PipelineConfigInvalid(
                f"state {name!r}: ttlDurationMs {ttl_ms} is negative: give a positive TTL, "
                "or None for values that never expire"
            )
        if ttl_clock not in TTL_CLOCKS:
            raise PipelineConfigInvalid(
                f"state {name!r}: ttlClock {ttl_clock!r} is not a clock: give "
                f"{' or '.join(repr(c) for c in TTL_CLOCKS)}"
            )
        key = as_struct(key_schema, name) if key_schema is not None else None
        clock = typing.cast(TtlClock, ttl_clock)
        state = StateSchema(name, kind, as_struct(schema, name), key, ttl_ms or None, clock)
        self.declared[name] = state
        self.codecs[name] = StateCodec(state)
        return self.codecs[name]

    # The handle's API, named as Spark names it.

    def getValueState(
        self,
        stateName: str,
        schema: object,
        ttlDurationMs: int | None = None,
        ttlClock: str = "processing_time",
    ) -> ValueState:
        codec = self._declare(stateName, "value", schema, ttlDurationMs, ttlClock)
        return ValueState(self, stateName, codec)

    def getListState(
        self,
        stateName: str,
        schema: object,
        ttlDurationMs: int | None = None,
        ttlClock: str = "processing_time",
    ) -> ListState:
        codec = self._declare(stateName, "list", schema, ttlDurationMs, ttlClock)
        return ListState(self, stateName, codec)

    def getMapState(
        self,
        stateName: str,
        userKeySchema: object,
        valueSchema: object,
        ttlDurationMs: int | None = None,
        ttlClock: str = "processing_time",
    ) -> MapState:
        codec = self._declare(stateName, "map", valueSchema, ttlDurationMs, ttlClock, userKeySchema)
        return MapState(self, stateName, codec)

    def deleteIfExists(self, stateName: str) -> None:
        self._write(stateName, DELETED)

    def registerTimer(self, expiryTimestampMs: int) -> None:
        timers = self.timers.setdefault(self.key, set())
        if expiryTimestampMs not in timers:
            timers.add(expiryTimestampMs)
            changes = self.changes.setdefault(self.key, KeyChanges())
            changes.timers_set.add(expiryTimestampMs)
            changes.timers_deleted.discard(expiryTimestampMs)

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        timers = self.timers.get(self.key, set())
        if expiryTimestampMs in timers:
            timers.discard(expiryTimestampMs)
            changes = self.changes.setdefault(self.key, KeyChanges())
            changes.timers_deleted.add(expiryTimestampMs)
            changes.timers_set.discard(expiryTimestampMs)

    def listTimers(self) -> Iterator[int]:
        return iter(sorted(self.timers.get(self.key, set())))


class _State:
    """A declared state of the handle's current key."""

    def __init__(self, handle: Handle, name: str, codec: StateCodec) -> None:
        self._handle, self._name, self._codec = handle, name, codec

    def clear(self) -> None:
        self._handle._write(self._name, DELETED)


class ValueState(_State):
    """One value (a tuple) per key."""

    def exists(self) -> bool:
        return self._handle._state(self._name) is not None

    def get(self) -> tuple[Any, ...] | None:
        value = self._handle._state(self._name)
        return tuple(value) if value is not None else None

    def update(self, newValue: tuple[Any, ...]) -> None:
        self._handle._write(self._name, self._codec.value.check(newValue))


class ListState(_State):
    """A list of tuples per key."""

    def _held(self) -> list[tuple[tuple[Any, ...], int | None]]:
        return list(self._handle._state(self._name) or [])

    def _given(self, values: list[tuple[Any, ...]]) -> list[tuple[tuple[Any, ...], int | None]]:
        expires = self._handle._expires(self._name)
        return [(self._codec.value.check(v), expires) for v in values]

    def exists(self) -> bool:
        return bool(self._held())

    def get(self) -> Iterator[tuple[Any, ...]]:
        return iter([v for v, _ in self._held()])

    def put(self, newState: list[tuple[Any, ...]]) -> None:
        self._handle._write(self._name, self._given(newState))

    def appendValue(self, newState: tuple[Any, ...]) -> None:
        self.appendList([newState])

    def appendList(self, newState: list[tuple[Any, ...]]) -> None:
        self._handle._write(self._name, self._held() + self._given(newState))


class MapState(_State):
    """A map of tuple → tuple per key."""

    def _held(self) -> dict[tuple[Any, ...], tuple[tuple[Any, ...], int | None]]:
        return dict(self._handle._state(self._name) or {})

    def _key(self, key: tuple[Any, ...]) -> tuple[Any, ...]:
        assert self._codec.key is not None
        return self._codec.key.check(key)

    def exists(self) -> bool:
        return bool(self._held())

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        entry = self._held().get(self._key(key))
        return None if entry is None else entry[0]

    def containsKey(self, key: tuple[Any, ...]) -> bool:
        return self._key(key) in self._held()

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        held = self._held()
        held[self._key(key)] = (self._codec.value.check(value), self._handle._expires(self._name))
        self._handle._write(self._name, held)

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        entries = sorted(self._held().items(), key=lambda kv: json.dumps(kv[0], default=str))
        return iter([(k, v) for k, (v, _) in entries])

    def keys(self) -> Iterator[tuple[Any, ...]]:
        return (k for k, _ in self.iterator())

    def values(self) -> Iterator[tuple[Any, ...]]:
        return (v for _, v in self.iterator())

    def removeKey(self, key: tuple[Any, ...]) -> None:
        held = self._held()
        if held.pop(self._key(key), None) is not None:
            self._handle._write(self._name, held if held else DELETED)


class KeyedRun:
    """One task's run of a processor made by ``factory`` over its keys, for one batch."""

    def __init__(
        self,
        factory: Callable[[], StatefulProcessor],
        time_mode: TimeMode,
        watermark_ms: int | None,
        processing_ms: int,
    ) -> None:
        self.time_mode = time_mode
        self.watermark_ms = watermark_ms
        self.processing_ms = processing_ms
        self.handle = Handle(processing_ms)
        self.processor = factory()
        self.processor.init(self.handle)  # type: ignore[arg-type]
        self.codecs = self.handle.codecs
        """The declared states' codecs, by name: how the states read and written are
        stored (``lowmark.batches.keyed.state_values``)."""
        self.expiry = Expiry(processing_ms, watermark_ms, by_event_time(self.handle.declared))
        """What the states held have expired by in this batch."""

    def run(
        self,
        records: dict[Key, pd.DataFrame],
        states: dict[Key, StateValues],
        timers: dict[Key, set[int]],
        newest_ms: dict[Key, int] | None = None,
    ) -> Outcome:
        """Steps 1-2 of the module's docstring over ``records`` (each key's new records, in
        event-time order; ``newest_ms``: the event time of each key's newest, what a state
        with event-time TTL written from them counts from), starting from ``states`` (each
        key's states held and not expired, as ``state_values.held_values`` reads them) and
        ``timers`` (every pending timer of the keys that have records, and of those with a
        timer due). Once per run."""
        handle, processor = self.handle, self.processor
        handle.states = {k: dict(v) for k, v in states.items()}
        handle.timers = {k: set(v) for k, v in timers.items()}
        values = TimerValues(
            self.processing_ms, self.watermark_ms if self.watermark_ms is not None else -1
        )
        output: list[pd.DataFrame] = []
        fired = 0
        for key in sorted(records.keys() | timers.keys(), key=_order):
            handle.key = key
            if key in records:
                handle.event_ms = (newest_ms or {}).get(key)
                rows = processor.handleInputRows(key, iter([records[key]]), values)
                output.extend(_frames(rows))
            while (due := self._next_due(handle.timers.get(key, set()))) is not None:
                handle.deleteTimer(due)
                handle.event_ms = due
                fired += 1
                expired = processor.handleExpiredTimer(key, values, ExpiredTimerInfo(due))
                output.extend(_frames(expired))
        processor.close()
        return Outcome(output, handle.changes, fired, handle.timers)

    def stored(self, changes: KeyChanges) -> list[tuple[str, str | None, int | None]]:
        """A key's changed states as ``keyed_state`` rows hold them: (``state``, ``value``,
        ``expires_ms``), ``value`` None for a cleared one."""
        return [
            (
                name,
                None if value is DELETED else self.codecs[name].encode(value),
                changes.expires[name],
            )
            for name, value in changes.states.items()
        ]

    def _next_due(self, timers: set[int]) -> int | None:
        """The earliest of ``timers`` that is due now (None: none is)."""
        now = self.watermark_ms if self.time_mode == "event_time" else self.processing_ms
        if now is None or not timers:
            return None
        first = min(timers)
        return first if first <= now else None


def _frames(rows: Iterable[Any] | None) -> list[pd.DataFrame]:
    """A handler's output: pandas DataFrames (a handler that yields nothing may return None)."""
    return [r for r in rows or () if len(r)]


def _order(key: Key) -> str:
    """Keys in one order whatever their types (a replay visits them the same way)."""
    return json.dumps(key, default=str)


def by_event_time(declared: dict[str, StateSchema]) -> frozenset[str]:
    """The ``declared`` states whose TTL runs by event time (``Expiry.by_event_time``)."""
    return frozenset(
        name
        for name, state in declared.items()
        if state.ttl_ms is not None and state.ttl_clock == "event_time"
    )


def declared_states(factory: Callable[[], Any]) -> dict[str, StateSchema]:
    """The states the processor ``factory`` makes declares in its ``init`` (by name).

    A processor whose ``init`` fails, or declares a schema that does not read, raises
    ``PipelineConfigInvalid`` naming it."""
    handle = Handle()
    name = getattr(factory, "__qualname__", repr(factory))
    try:
        factory().init(handle)
    except PipelineConfigInvalid:
        raise
    except Exception as exc:
        raise PipelineConfigInvalid(
            f"keyed processor {name}: its init failed ({type(exc).__name__}: {exc}): "
            "init must only declare states (run it without Spark)"
        ) from exc
    return dict(handle.declared)
