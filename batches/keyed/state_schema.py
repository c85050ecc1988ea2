"""The schemas of a keyed step's states: what a processor declares, as the pipeline records it.

A processor declares each state in ``init`` (``getValueState(name, schema, ttlDurationMs)``,
``getListState``, ``getMapState(name, userKeySchema, valueSchema, ttlDurationMs)``). A
schema is what Spark accepts there: a ``StructType`` or a DDL string (``"start
timestamp, n long"``), read here without Spark (``parse_ddl``), or, beyond Spark, a
pydantic model class (its fields in order; ``Optional`` ones nullable).

``lowmark.batches.keyed.runtime.declared_states`` runs a processor's ``init`` against
the runtime's handle, on the driver and without Spark, so the schemas are known
before any Spark work: the pipeline's fingerprint holds them (``semantics``), and a
changed schema on a running checkpoint is judged by ``refusal``: a new state, a new
nullable field (or one with a pydantic default), or a field made nullable reads what
the checkpoint holds (a field it lacks reads as its default, or null); a state's
kind, a field's type or a map's key schema changed, a field removed or a new field
that may not be null is refused. A TTL's length is left out: changing it is safe
(values keep the expiry they were written with); its clock is not (a state given or
losing event-time TTL is refused: the expiries held are in the other clock).
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from lowmark.batches.errors import PipelineConfigInvalid

StateKind = Literal["value", "list", "map"]
TtlClock = Literal["processing_time", "event_time"]
"""What a state's TTL is counted by: the batches' processing time (Spark's TTL) or event
time (the time of the write: the key's newest record, or the timer that fired; expired
once the watermark passes it plus the TTL)."""


@dataclass(frozen=True)
class StateSchema:
    """One declared state: its kind, the schema of its values (of a map's values), a map's
    key schema, its TTL (None: its values never expire) and the clock the TTL runs by."""

    name: str
    kind: StateKind
    value: StructType
    key: StructType | None = None
    ttl_ms: int | None = None
    ttl_clock: TtlClock = "processing_time"

    def semantics(self) -> dict[str, Any]:
        """What the pipeline's fingerprint holds of this state (as JSON values): its kind and
        schemas and, for event-time TTL, the clock (the expiries it holds are in that clock;
        left out otherwise, so the fingerprints of states recorded before stay)."""
        held: dict[str, Any] = {"kind": self.kind, "value": self.value.jsonValue()}
        if self.key is not None:
            held["key"] = self.key.jsonValue()
        if self.ttl_ms is not None and self.ttl_clock == "event_time":
            held["ttl_clock"] = self.ttl_clock
        return held


def as_struct(schema: object, state: str) -> StructType:
    """``schema`` as a ``StructType``: one, a DDL string or a pydantic model class."""
    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        return parse_ddl(schema, f"state {state!r}")
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return _from_model(schema, state)
    raise PipelineConfigInvalid(
        f"state {state!r}: schema {schema!r} is not a StructType, a DDL string or a "
        "pydantic model class: declare it as one of those"
    )


def refusal(old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """Why states recorded as ``old`` (``semantics`` by name; None: recorded before state
    schemas were) cannot be read as declared now (``new``): one line naming the state, the
    field and the way on; None when they can (see the module's docstring)."""
    if old is None:
        return None
    for name, was in sorted(old.items()):
        now = new.get(name)
        if now is None:
            continue  # a state no longer declared: its values are never read
        if was["kind"] != now["kind"]:
            return f"state {name!r} changed from {was['kind']} state to {now['kind']} state"
        if was.get("key") != now.get("key"):
            return f"state {name!r}: its map key schema changed"
        if was.get("ttl_clock") != now.get("ttl_clock"):
            return (
                f"state {name!r}: its TTL changed clock (the expiries it holds are in the "
                "other one): declare the state under a new name"
            )
        problem = _field_refusal(was["value"]["fields"], now["value"]["fields"])
        if problem is not None:
            return f"state {name!r}: {problem}"
    return None


def _field_refusal(was: list[dict[str, Any]], now: list[dict[str, Any]]) -> str | None:
    fields = {f["name"]: f for f in now}
    for old in was:
        new = fields.get(old["name"])
        if new is None:
            return f"field {old['name']!r} was removed"
        if new["type"] != old["type"]:
            return (
                f"field {old['name']!r} changed type "
                f"{_type_name(old['type'])} -> {_type_name(new['type'])}"
            )
        if old["nullable"] and not new["nullable"]:
            return f"field {old['name']!r} may no longer be null"
    known = {f["name"] for f in was}
    for new in now:
        if new["name"] not in known and not new["nullable"]:
            return f"new field {new['name']!r} is NOT NULL (values held lack it): make it nullable"
    return None


def _type_name(json_type: Any) -> str:
    return str(_type_from_json(json_type).simpleString())


def _type_from_json(json_type: Any) -> DataType:
    field = {"name": "x", "type": json_type, "nullable": True, "metadata": {}}
    return StructField.fromJson(field).dataType


# A DDL reader without Spark: ``name type [NOT NULL] [COMMENT '...']`` fields, as
# Spark's ``StructType.fromDDL`` reads them (``name: type`` too).

_SIMPLE: dict[str, DataType] = {
    "boolean": BooleanType(),
    "tinyint": ByteType(),
    "byte": ByteType(),
    "smallint": ShortType(),
    "short": ShortType(),
    "int": IntegerType(),
    "integer": IntegerType(),
    "bigint": LongType(),
    "long": LongType(),
    "float": FloatType(),
    "real": FloatType(),
    "double": DoubleType(),
    "string": StringType(),
    "binary": BinaryType(),
    "date": DateType(),
    "timestamp": TimestampType(),
    "timestamp_ltz": TimestampType(),
    "timestamp_ntz": TimestampNTZType(),
}
_TOKEN = re.compile(r"\s*(`(?:[^`]|``)*`|'(?:[^'\\]|\\.)*'|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")


def parse_ddl(ddl: str, what: str) -> StructType:
    """The ``StructType`` of DDL ``ddl`` (``"a long, b array<struct<c: date>>"``); one that
    does not read raises ``PipelineConfigInvalid`` naming ``what``."""
    tokens = _tokens(ddl, what)
    try:
        struct = _fields(tokens, end=None)
        if tokens.peek() is not None:
            raise ValueError(f"unexpected {tokens.peek()!r}")
    except ValueError as exc:
        raise PipelineConfigInvalid(
            f"{what}: schema {ddl!r} does not read as DDL ({exc}): write it as "
            "'name type, ...' (e.g. 'start timestamp, n long')"
        ) from exc
    return struct


class _Tokens:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.at = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token.lower() != expected):
            raise ValueError(f"expected {expected or 'more'}, found {token or 'the end'}")
        self.at += 1
        return token


def _tokens(ddl: str, what: str) -> _Tokens:
    found: list[str] = []
    at = 0
    while at < len(ddl.rstrip()):
        match = _TOKEN.match(ddl, at)
        if match is None:
            raise PipelineConfigInvalid(
                f"{what}: schema {ddl!r} does not read as DDL at {ddl[at:]!r}: write it as "
                "'name type, ...' (e.g. 'start timestamp, n long')"
            )
        found.append(match.group(1))
        at = match.end()
    return _Tokens(found)


def _fields(tokens: _Tokens, end: str | None) -> StructType:
    fields: list[StructField] = []
    while tokens.peek() != end:
        if fields:
            tokens.take(",")
        name = tokens.take()
        if name.startswith("`"):
            name = name[1:-1].replace("``", "`")
        if tokens.peek() == ":":
            tokens.take()
        data_type = _type(tokens)
        nullable = True
        if (tokens.peek() or "").lower() == "not":
            tokens.take()
            tokens.take("null")
            nullable = False
        metadata = {}
        if (tokens.peek() or "").lower() == "comment":
            tokens.take()
            quoted = tokens.take()
            metadata["comment"] = re.sub(r"\\(.)", r"\1", quoted[1:-1])
        fields.append(StructField(name, data_type, nullable, metadata))
    return StructType(fields)


def _type(tokens: _Tokens) -> DataType:
    name = tokens.take().lower()
    if name in ("decimal", "dec", "numeric"):
        precision, scale = 10, 0
        if tokens.peek() == "(":
            tokens.take()
            precision = int(tokens.take())
            if tokens.peek() == ",":
                tokens.take()
                scale = int(tokens.take())
            tokens.take(")")
        return DecimalType(precision, scale)
    if name == "array":
        tokens.take("<")
        element = _type(tokens)
        tokens.take(">")
        return ArrayType(element)
    if name == "map":
        tokens.take("<")
        key = _type(tokens)
        tokens.take(",")
        value = _type(tokens)
        tokens.take(">")
        return MapType(key, value)
    if name == "struct":
        tokens.take("<")
        struct = _fields(tokens, end=">")
        tokens.take(">")
        return struct
    if name in _SIMPLE:
        return _SIMPLE[name]
    raise ValueError(f"unknown type {name!r}")


# Pydantic models: each field's annotation as a Spark type.

_PYTHON: dict[type, DataType] = {
    bool: BooleanType(),
    int: LongType(),
    float: DoubleType(),
    str: StringType(),
    bytes: BinaryType(),
    dt.datetime: TimestampType(),
    dt.date: DateType(),
    decimal.Decimal: DecimalType(38, 18),
}


def _from_model(model: type[BaseModel], state: str) -> StructType:
    fields = []
    for name, info in model.model_fields.items():
        data_type, optional = _annotated(info.annotation, f"state {state!r} field {name!r}")
        # A field's default is what a value written before the field existed reads as.
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        metadata = {"default": _jsonable(default)} if default is not None else {}
        fields.append(StructField(name, data_type, optional or not info.is_required(), metadata))
    return StructType(fields)


def _annotated(annotation: Any, what: str) -> tuple[DataType, bool]:
    """The Spark type of ``annotation`` and whether it admits None."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _annotated(args[0], what)[0], True
    if origin in (list, tuple) and args:
        return ArrayType(_annotated(args[0], what)[0]), False
    if origin is dict and len(args) == 2:
        return MapType(_annotated(args[0], what)[0], _annotated(args[1], what)[0]), False
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _from_model(annotation, what), False
    if annotation in _PYTHON:
        return _PYTHON[annotation], False
    raise PipelineConfigInvalid(
        f"{what}: type {annotation!r} has no Spark type: use bool, int, float, str, bytes, "
        "datetime, date, Decimal, a list, a dict or a nested model"
    )


def _jsonable(value: Any) -> Any:
    """A default as the field's metadata holds it (JSON)."""
    if isinstance(value, (dt.date, decimal.Decimal)):
        return value.isoformat() if isinstance(value, dt.date) else str(value)
    return value
