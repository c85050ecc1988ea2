"""What a change of a running pipeline's definition means: one classification.

Each offset-log entry records the definition its batch was planned with
(``Pipeline.definition``). When the pipeline's definition now differs from the
latest entry's, ``classify`` lists the changes, each of one registered kind
(``KINDS``) and so of one class:

- *free*: not in the definition at all (admission limits, connection settings,
  descriptions, ...): a running checkpoint takes it as it is;
- *compatible*: takes effect at a batch boundary: the next new batch runs under
  the new definition and its offset-log entry records it; output already
  written stays as the old definition wrote it;
- *rebuild*: output already written would have to change (or the state the
  next batch reads was written by another computation): refused on the running
  checkpoint, the way on is to start over (``lowmark reset --truncate-sink``);
- *refused*: the state held can no longer be read under the new definition.

A change of no registered kind is *rebuild*: what lowmark does not recognise,
it does not assume compatible. The docs' table of change kinds is
``render_table`` (a test keeps the two equal).

Pure Python over the definitions' JSON: the planner classifies before Spark
starts (only a keyed step's state schemas are read with PySpark's types).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from lowmark.state.errors import FingerprintMismatch


class ChangeClass(StrEnum):
    """What a change of one kind means for a running checkpoint (module doc)."""

    FREE = "free"
    COMPATIBLE = "compatible"
    REBUILD = "rebuild"
    REFUSED = "refused"


@dataclass(frozen=True, kw_only=True)
class ChangeKind:
    """One kind of definition change: its class and why, as the docs' table shows it."""

    name: str
    """The kind, in a few words (a row of the docs' table)."""
    change_class: ChangeClass
    why: str
    """Why it is of its class, in one line."""


FREE = ChangeKind(
    name="operational setting (admission limits, connection settings, file clean-up, "
    "descriptions, health checks, maintenance, read-ahead, listeners, sink table properties, "
    "`warn`/`fail` expectations)",
    change_class=ChangeClass.FREE,
    why="not part of the definition: decides when or how a batch runs, not what it computes",
)
COLUMN_ADDED = ChangeKind(
    name="source column added (nullable)",
    change_class=ChangeClass.COMPATIBLE,
    why="batches from the boundary read it (null where a record lacks it); a Delta "
    "sink written by appends gains the column, null in rows written before",
)
COLUMN_WIDENED = ChangeKind(
    name="source column widened (byte -> short -> int -> long, float -> double)",
    change_class=ChangeClass.COMPATIBLE,
    why="every value read before still reads, unchanged, as the wider type; a sink column "
    "of the narrower type is not widened (Delta's type widening makes a table unreadable to "
    "delta-rs): aggregate it, or cast it in the transform",
)
RESCUED_DATA_ADDED = ChangeKind(
    name="rescued-data column added to a JSON file source",
    change_class=ChangeClass.COMPATIBLE,
    why="batches from the boundary keep the fields the schema does not name in it, as "
    "JSON (null where a record has none); a Delta sink written by appends gains the "
    "column, null in rows written before",
)
COLUMN_REQUIRED = ChangeKind(
    name="source column added NOT NULL",
    change_class=ChangeClass.REBUILD,
    why="records read before lack it: only a rebuild gives every row one",
)
COLUMN_REMOVED = ChangeKind(
    name="source column removed",
    change_class=ChangeClass.REBUILD,
    why="rows written before hold values the new definition no longer reads",
)
COLUMN_RETYPED = ChangeKind(
    name="source column narrowed or retyped",
    change_class=ChangeClass.REBUILD,
    why="values written before may not fit the new type",
)
SOURCE_CHANGED = ChangeKind(
    name="source changed otherwise (path, format, topic, options, schema inferred or declared)",
    change_class=ChangeClass.REBUILD,
    why="the offsets recorded point into what the old source read",
)
STEP_CHANGED = ChangeKind(
    name="transform or post-aggregation step added, changed or removed (a SQL step's query, "
    "a function's import path)",
    change_class=ChangeClass.COMPATIBLE,
    why="batches from the boundary run the new step; a function's body is not in the "
    "definition: editing it is free, and takes effect when the runner restarts",
)
EXPECTATIONS_CHANGED = ChangeKind(
    name="`drop` expectation added, changed or removed",
    change_class=ChangeClass.COMPATIBLE,
    why="batches from the boundary drop by the new conditions; rows written before stay",
)
SINK_ADDED = ChangeKind(
    name="extra sink added",
    change_class=ChangeClass.COMPATIBLE,
    why="it receives the batches from the boundary on; earlier output is not copied to it",
)
SINK_REMOVED = ChangeKind(
    name="extra sink removed",
    change_class=ChangeClass.COMPATIBLE,
    why="it receives no batch from the boundary on and keeps what it holds",
)
SINK_CHANGED = ChangeKind(
    name="sink changed (table, mode, keys, kind)",
    change_class=ChangeClass.REBUILD,
    why="the new sink lacks, or is written otherwise than, the output already written",
)
AGGREGATE_ADDED = ChangeKind(
    name="aggregate added to a windowed aggregation",
    change_class=ChangeClass.REBUILD,
    why="the window state holds one column per aggregate and its table's schema does not "
    "evolve yet: windows open at the boundary would have no value for it",
)
WINDOWING_CHANGED = ChangeKind(
    name="window size or kind, grouping keys, an aggregate changed or removed, output mode",
    change_class=ChangeClass.REBUILD,
    why="windows already written and held in state were computed otherwise",
)
EVENT_TIME_CHANGED = ChangeKind(
    name="event-time column, allowed lateness, watermark",
    change_class=ChangeClass.REBUILD,
    why="they decide which window a record falls in and when it closes: the state held "
    "and the windows written follow the old ones",
)
DEDUP_CHANGED = ChangeKind(
    name="deduplication key or horizon",
    change_class=ChangeClass.REBUILD,
    why="the ids held were recorded under the old key and horizon",
)
KEYED_STATE_EVOLVED = ChangeKind(
    name="keyed state schema: field added with a default or nullable, field removed",
    change_class=ChangeClass.COMPATIBLE,
    why="state written before reads under the new schema (the new field's default)",
)
KEYED_STATE_UNREADABLE = ChangeKind(
    name="keyed state schema: field retyped, or added without a default",
    change_class=ChangeClass.REFUSED,
    why="the values held no longer read under the new schema",
)
KEYED_CHANGED = ChangeKind(
    name="keyed step's processor, keys or timers",
    change_class=ChangeClass.REBUILD,
    why="the state held and the timers set were written by the old step",
)
UNRECOGNISED = ChangeKind(
    name="any other change (joins, stream-stream join, a field lowmark does not know)",
    change_class=ChangeClass.REBUILD,
    why="not known to be compatible: lowmark assumes the output already written must change",
)

KINDS: tuple[ChangeKind, ...] = (
    FREE,
    COLUMN_ADDED,
    COLUMN_WIDENED,
    RESCUED_DATA_ADDED,
    COLUMN_REQUIRED,
    COLUMN_REMOVED,
    COLUMN_RETYPED,
    SOURCE_CHANGED,
    STEP_CHANGED,
    EXPECTATIONS_CHANGED,
    SINK_ADDED,
    SINK_REMOVED,
    SINK_CHANGED,
    AGGREGATE_ADDED,
    WINDOWING_CHANGED,
    EVENT_TIME_CHANGED,
    DEDUP_CHANGED,
    KEYED_STATE_EVOLVED,
    KEYED_STATE_UNREADABLE,
    KEYED_CHANGED,
    UNRECOGNISED,
)
"""Every kind of change, in the docs' order: the one registration."""


@dataclass(frozen=True, kw_only=True)
class Change:
    """One change between a recorded definition and the pipeline's now."""

    kind: ChangeKind
    field: str
    """Where in the definition, as a dotted path (a column: ``source.schema_ddl.<name>``)."""
    old: object
    new: object
    detail: str | None = None
    """What the kind's ``why`` leaves out for this change (a state's refusal)."""

    @property
    def change_class(self) -> ChangeClass:
        return self.kind.change_class

    def describe(self) -> str:
        """``field: old -> new (class: kind)``, in one line."""
        why = self.detail or self.kind.name
        return (
            f"{self.field}: {json.dumps(self.old)} -> {json.dumps(self.new)} "
            f"({self.change_class}: {why})"
        )

    def to_json(self) -> dict[str, Any]:
        """The change as JSON-ready data (``lowmark plan --json``'s ``changes``)."""
        return {
            "field": self.field,
            "old": self.old,
            "new": self.new,
            "class": str(self.change_class),
            "kind": self.kind.name,
            "why": self.detail or self.kind.why,
        }


class DefinitionChanged(FingerprintMismatch):
    """A definition changed in a way a running checkpoint cannot take as it is."""

    def __init__(self, message: str, changes: tuple[Change, ...]) -> None:
        super().__init__(message)
        self.changes = changes


def classify(old: dict[str, Any], new: dict[str, Any]) -> tuple[Change, ...]:
    """The changes from definition ``old`` (an offset-log entry's) to ``new``
    (``Pipeline.definition``), by section in key order; empty when they are equal."""
    changes: list[Change] = []
    for section in sorted(old.keys() | new.keys()):
        before, after = old.get(section), new.get(section)
        if before != after:
            classifier = _SECTIONS.get(section, _unrecognised)
            changes.extend(classifier(section, before, after))
    return tuple(changes)


def blocking(changes: tuple[Change, ...]) -> tuple[Change, ...]:
    """The ``changes`` a running checkpoint cannot take at a batch boundary."""
    return tuple(c for c in changes if c.change_class is not ChangeClass.COMPATIBLE)


def render_table() -> str:
    """The docs' table of change kinds (docs/operations.md, "Changing a pipeline")."""
    rows = ["| Change | Class | Why |", "| --- | --- | --- |"]
    rows += [f"| {k.name} | {k.change_class} | {k.why} |" for k in KINDS]
    return "\n".join(rows) + "\n"


def _leaves(at: str, old: object, new: object) -> list[tuple[str, object, object]]:
    """Each differing leaf of two JSON values, with its dotted path (lists are leaves)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            leaf
            for key in sorted(old.keys() | new.keys())
            for leaf in _leaves(f"{at}.{key}", old.get(key), new.get(key))
        ]
    return [] if old == new else [(at, old, new)]


Classifier = Callable[[str, object, object], list[Change]]
"""Classifies the changes of one section of a definition (its name, old and new value)."""


def _one(kind: ChangeKind) -> Classifier:
    """A section classifier giving each differing leaf of the section ``kind``."""

    def classify_section(at: str, old: object, new: object) -> list[Change]:
        return [Change(kind=kind, field=f, old=o, new=n) for f, o, n in _leaves(at, old, new)]

    return classify_section


def _whole(kind: ChangeKind) -> Classifier:
    """A section classifier giving the section, changed as a whole, as one ``kind``."""

    def classify_section(at: str, old: object, new: object) -> list[Change]:
        return [Change(kind=kind, field=at, old=old, new=new)]

    return classify_section


_unrecognised = _one(UNRECOGNISED)


def _source(at: str, old: object, new: object) -> list[Change]:
    """A source's schema changes column by column (a union's sources' too), and a
    rescued-data column it gains is ``RESCUED_DATA_ADDED``; any other source change is
    ``SOURCE_CHANGED``."""
    changes: list[Change] = []
    for field, before, after in _leaves(at, old, new):
        if field.endswith(".schema_ddl") and isinstance(before, str) and isinstance(after, str):
            changes.extend(_columns(field, before, after))
        elif field.endswith(".rescued_data_column") and before is None:
            changes.append(Change(kind=RESCUED_DATA_ADDED, field=field, old=before, new=after))
        else:
            changes.append(Change(kind=SOURCE_CHANGED, field=field, old=before, new=after))
    return changes


def _sinks(at: str, old: object, new: object) -> list[Change]:
    """Extra sinks by name: added, removed, or changed."""
    before = old if isinstance(old, dict) else {}
    after = new if isinstance(new, dict) else {}
    changes: list[Change] = []
    for name in sorted(before.keys() | after.keys()):
        if name not in before:
            kind = SINK_ADDED
        elif name not in after:
            kind = SINK_REMOVED
        elif before[name] != after[name]:
            kind = SINK_CHANGED
        else:
            continue
        field = f"{at}.{name}"
        changes.append(Change(kind=kind, field=field, old=before.get(name), new=after.get(name)))
    return changes


def _aggregation(at: str, old: object, new: object) -> list[Change]:
    """Aggregates appended to the same windowing are ``AGGREGATE_ADDED``; any other
    difference is ``WINDOWING_CHANGED``."""
    before = old.get("aggregates") if isinstance(old, dict) else None
    after = new.get("aggregates") if isinstance(new, dict) else None
    appended = (
        isinstance(before, list)
        and isinstance(after, list)
        and len(after) > len(before)
        and after[: len(before)] == before
    )
    aggregates = f"{at}.aggregates"
    return [
        Change(
            kind=AGGREGATE_ADDED if appended and f == aggregates else WINDOWING_CHANGED,
            field=f,
            old=o,
            new=n,
        )
        for f, o, n in _leaves(at, old, new)
    ]


def _keyed(at: str, old: object, new: object) -> list[Change]:
    """A keyed step's state schemas are compatible while the values held still read
    (``state_schema.refusal``), refused otherwise; any other change is ``KEYED_CHANGED``."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return _whole(KEYED_CHANGED)(at, old, new)
    rest = [k for k in sorted(old.keys() | new.keys()) if k != "states"]
    changes = [
        Change(kind=KEYED_CHANGED, field=f, old=o, new=n)
        for key in rest
        for f, o, n in _leaves(f"{at}.{key}", old.get(key), new.get(key))
    ]
    if old.get("states") != new.get("states"):
        from lowmark.batches.keyed.state_schema import refusal  # PySpark types

        problem = refusal(old.get("states"), new.get("states") or {})
        kind = KEYED_STATE_EVOLVED if problem is None else KEYED_STATE_UNREADABLE
        field = f"{at}.states"
        changes.append(
            Change(
                kind=kind, field=field, old=old.get("states"), new=new.get("states"), detail=problem
            )
        )
    return changes


_SECTIONS: dict[str, Classifier] = {
    "source": _source,
    "transform": _whole(STEP_CHANGED),
    "post_aggregation": _whole(STEP_CHANGED),
    "expectations": _whole(EXPECTATIONS_CHANGED),
    "extra_sinks": _sinks,
    "sink": _one(SINK_CHANGED),
    "aggregation": _aggregation,
    "event_time": _one(EVENT_TIME_CHANGED),
    "dedup": _one(DEDUP_CHANGED),
    "keyed": _keyed,
}
"""How each section of a definition is classified; any other section is unrecognised."""


# Source schemas: Spark DDL, read without Spark (the planner starts none).

_ALIASES = {
    "long": "bigint",
    "integer": "int",
    "short": "smallint",
    "byte": "tinyint",
    "real": "float",
}
_WIDER = {
    "tinyint": ("smallint", "int", "bigint"),
    "smallint": ("int", "bigint"),
    "int": ("bigint",),
    "float": ("double",),
}
"""Each type and the types that read every one of its values unchanged."""


@dataclass(frozen=True)
class _Column:
    type: str
    nullable: bool


def _columns(at: str, old_ddl: str, new_ddl: str) -> list[Change]:
    """The column changes from schema ``old_ddl`` to ``new_ddl`` (Spark DDL); a schema
    that does not parse is ``SOURCE_CHANGED`` as a whole."""
    try:
        before, after = _parse(old_ddl), _parse(new_ddl)
    except ValueError:
        return [Change(kind=SOURCE_CHANGED, field=at, old=old_ddl, new=new_ddl)]
    changes: list[Change] = []
    for name in [*before, *(n for n in after if n not in before)]:
        was, now = before.get(name), after.get(name)
        if was == now:
            continue
        if was is None:
            assert now is not None
            kind = COLUMN_ADDED if now.nullable else COLUMN_REQUIRED
        elif now is None:
            kind = COLUMN_REMOVED
        elif now.type in _WIDER.get(was.type, ()) and (now.nullable or not was.nullable):
            kind = COLUMN_WIDENED
        elif now.type == was.type and now.nullable:
            kind = COLUMN_WIDENED  # NOT NULL dropped: every value read before still reads
        else:
            kind = COLUMN_RETYPED
        changes.append(
            Change(kind=kind, field=f"{at}.{name}", old=_spelled(was), new=_spelled(now))
        )
    return changes


def _spelled(column: _Column | None) -> str | None:
    if column is None:
        return None
    return column.type if column.nullable else f"{column.type} not null"


def _parse(ddl: str) -> dict[str, _Column]:
    """A DDL schema's top-level columns by lower-cased name (``ValueError`` if unreadable)."""
    columns: dict[str, _Column] = {}
    for part in _top_level(ddl):
        match = re.fullmatch(r"\s*(`[^`]+`|\w+)\s*:?\s*(.+?)\s*", part, re.DOTALL)
        if match is None:
            raise ValueError(part)
        name, rest = match.group(1).strip("`").lower(), match.group(2)
        rest = re.sub(r"\s+comment\s+'.*'$", "", rest, flags=re.IGNORECASE | re.DOTALL)
        not_null = re.search(r"\s+not\s+null$", rest, re.IGNORECASE) is not None
        spelled = re.sub(r"\s+not\s+null$", "", rest, flags=re.IGNORECASE)
        type_ = re.sub(r"\s+", "", spelled).lower()
        columns[name] = _Column(_ALIASES.get(type_, type_), not not_null)
    return columns


def _top_level(ddl: str) -> list[str]:
    """``ddl`` split at the commas outside ``<>``, ``()`` and quotes."""
    parts, depth, start, quote = [], 0, 0, ""
    for i, char in enumerate(ddl):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"`":
            quote = char
        elif char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(ddl[start:i])
            start = i + 1
    parts.append(ddl[start:])
    return [p for p in parts if p.strip()]
