"""A keyed step's state values: checked against their declared schema, typed, and stored as JSON.

A processor gives and gets values as Spark's API does: a tuple per value (in
the schema's field order), a list of them for a list state, a dict of tuple →
tuple for a map state. ``Codec.check`` turns what it gives into the declared
Python types (timestamp → an aware UTC ``datetime`` (a naive one is taken as
UTC), date → ``date``, decimal → ``Decimal``, integral → ``int``, floating →
``float``, array → ``list``, map → ``dict``, a nested struct → a ``Row``),
or raises ``StateValueInvalid`` naming the state, the field and the fix.

The ``value`` column of ``keyed_state`` holds a value as a JSON object by
field name (``{"start": "2026-01-01T00:00:00Z", "n": 3}``), a list state's as
an array of them, a map state's as an array of ``{"key": ..., "value": ...}``
(``encode``), so ``get_json_object(value, '$.start')`` reads it; a list or map
state with a TTL keeps each element's expiry beside it (``StateCodec.encode``). Timestamps
and dates are ISO strings, decimals strings, binary base64. A field the stored
object lacks (it was added later) reads as its default (a pydantic field's) or
null. ``decode`` also reads the untyped form of checkpoints written before
states were typed (``{"value": [...]}``, ``{"list": [...]}``, ``{"map": [[k,
v], ...]}``, positional): each element as its field's type where it converts,
as stored where it does not.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from pyspark.sql import Row
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
    StructType,
    TimestampNTZType,
    TimestampType,
)

from lowmark.batches.errors import StateValueInvalid
from lowmark.batches.keyed.state_schema import StateSchema
from lowmark.state.keyed_state import Expiry

_INTEGRAL: dict[type[DataType], int] = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}


class Codec:
    """The values of one struct schema (``schema``) of state ``state``."""

    def __init__(self, state: str, schema: StructType) -> None:
        self.state = state
        self.schema = schema
        self._described = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema)

    def check(self, value: object) -> tuple[Any, ...]:
        """``value`` (a tuple of the schema's arity, in its order; or an instance of the
        pydantic model the state was declared with) with the declared types."""
        fields = self.schema.fields
        if isinstance(value, BaseModel):
            value = tuple(value.model_dump().values())
        if not isinstance(value, (tuple, list)) or len(value) != len(fields):
            got = f"a tuple of {len(value)}" if isinstance(value, (tuple, list)) else repr(value)
            raise StateValueInvalid(
                f"state {self.state!r} holds ({self._described}): got {got}; give a tuple "
                f"of {len(fields)} in that order"
            )
        return tuple(
            self._field(f.name, v, f.dataType, f.nullable)
            for f, v in zip(fields, value, strict=True)
        )

    def _field(self, name: str, value: Any, data_type: DataType, nullable: bool) -> Any:
        try:
            return _checked(value, data_type, nullable)
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise StateValueInvalid(
                f"state {self.state!r} field {name!r} ({data_type.simpleString()}): {exc}; "
                f"give a {_python_name(data_type)} (or None where the field may be null)"
            ) from None

    def dump(self, row: tuple[Any, ...]) -> dict[str, Any]:
        """A checked ``row`` as a JSON object by field name."""
        return {
            f.name: _dumped(v, f.dataType) for f, v in zip(self.schema.fields, row, strict=True)
        }

    def load(self, stored: dict[str, Any]) -> tuple[Any, ...]:
        """``dump``'s inverse; a field ``stored`` lacks reads as its default, or None."""
        return tuple(
            _loaded(stored[f.name], f.dataType)
            if f.name in stored
            else _loaded(f.metadata.get("default"), f.dataType)
            for f in self.schema.fields
        )

    def load_untyped(self, stored: list[Any]) -> tuple[Any, ...]:
        """A value stored before states were typed (positional, timestamps as strings): each
        element as its field's type where it converts, else as stored."""
        values = list(stored) + [None] * (len(self.schema.fields) - len(stored))
        types = [f.dataType for f in self.schema.fields] + [None] * len(stored)
        return tuple(_lenient(v, t) for v, t in zip(values, types, strict=False))


class StateCodec:
    """A declared state's values (``StateSchema``) as ``keyed_state`` stores them."""

    def __init__(self, schema: StateSchema) -> None:
        self.schema = schema
        self.value = Codec(schema.name, schema.value)
        self.key = Codec(schema.name, schema.key) if schema.key is not None else None

    def encode(self, held: Any) -> str:
        """A state as held (``runtime.StateValues``: a tuple; a list of (tuple, expiry); a
        dict of tuple → (tuple, expiry)) as the ``value`` column's JSON. With a TTL, each
        list element's and map entry's expiry is kept beside it: a list as ``{"items":
        [...], "expires_ms": [...]}``, a map entry with an ``expires_ms`` field."""
        kind, timed = self.schema.kind, self.schema.ttl_ms is not None
        stored: Any
        if kind == "value":
            stored = self.value.dump(held)
        elif kind == "list":
            stored = [self.value.dump(v) for v, _ in held]
            if timed:
                stored = {"items": stored, "expires_ms": [e for _, e in held]}
        else:
            assert self.key is not None
            stored = [
                {"key": self.key.dump(k), "value": self.value.dump(v)}
                | ({"expires_ms": e} if timed else {})
                for k, (v, e) in held.items()
            ]
        return json.dumps(stored, separators=(",", ":"), allow_nan=True)

    def decode(self, text: str, expires_ms: int | None = None) -> Any:
        """``encode``'s inverse, and the untyped form's reader (the module's docstring): a
        list element or map entry stored without an expiry of its own (written before
        expiries were kept per element) expires with its row (``expires_ms``)."""
        stored = json.loads(text)
        kind, value = self.schema.kind, self.value
        if kind == "value":
            if self._untyped_value(stored):
                return value.load_untyped(stored["value"])
            return value.load(stored)
        if kind == "list":
            if isinstance(stored, dict) and "list" in stored:
                return [(value.load_untyped(v), expires_ms) for v in stored["list"]]
            if isinstance(stored, dict):
                pairs = zip(stored["items"], stored["expires_ms"], strict=True)
                return [(value.load(v), e) for v, e in pairs]
            return [(value.load(v), expires_ms) for v in stored]
        key = self.key
        assert key is not None
        if isinstance(stored, dict):
            return {
                key.load_untyped(k): (value.load_untyped(v), expires_ms) for k, v in stored["map"]
            }
        return {
            key.load(e["key"]): (value.load(e["value"]), e.get("expires_ms", expires_ms))
            for e in stored
        }

    def _untyped_value(self, stored: Any) -> bool:
        """Whether ``stored`` is a value state's untyped form, ``{"value": [...]}``: only
        a schema whose one field is an array named ``value`` stores that form typed too,
        and it is taken as typed."""
        if not (isinstance(stored, dict) and set(stored) == {"value"}):
            return False
        if not isinstance(stored["value"], list):
            return False
        fields = self.value.schema.fields
        return not (len(fields) == 1 and fields[0].name == "value" and
                    isinstance(fields[0].dataType, ArrayType))  # fmt: skip


def held_values(
    rows: Iterable[tuple[str, str | None, int | None]],
    codecs: dict[str, StateCodec],
    expiry: Expiry,
) -> dict[str, Any]:
    """A key's states from its newest ``keyed_state`` rows (``state``, ``value``,
    ``expires_ms``), as of ``expiry``: cleared ones, expired ones and those no longer
    declared left out; of a list or map, the elements or entries expired."""
    held: dict[str, Any] = {}
    for name, text, expires_ms in rows:
        codec = codecs.get(name)
        if text is None or codec is None or expiry.expired(name, expires_ms):
            continue
        value = codec.decode(text, expires_ms)
        if codec.schema.kind == "list":
            value = [(v, e) for v, e in value if not expiry.expired(name, e)]
        elif codec.schema.kind == "map":
            value = {k: (v, e) for k, (v, e) in value.items() if not expiry.expired(name, e)}
        if codec.schema.kind == "value" or value:
            held[name] = value
    return held


def _python_name(data_type: DataType) -> str:
    """What a processor gives for a field of ``data_type``."""
    return _PYTHON_NAMES.get(type(data_type), "tuple")


_PYTHON_NAMES: dict[type[DataType], str] = {
    **dict.fromkeys(_INTEGRAL, "int"),
    TimestampType: "datetime",
    TimestampNTZType: "datetime",
    DateType: "date",
    DecimalType: "Decimal",
    FloatType: "float",
    DoubleType: "float",
    StringType: "str",
    BooleanType: "bool",
    BinaryType: "bytes",
    ArrayType: "list",
    MapType: "dict",
}


def _plain(value: Any) -> Any:
    """NumPy and pandas scalars as Python's (what a pandas frame's cells are)."""
    if hasattr(value, "to_pydatetime"):  # pandas.Timestamp
        return None if value != value else value.to_pydatetime()
    if hasattr(value, "dtype") and hasattr(value, "item") and not hasattr(value, "__len__"):
        return value.item()  # a NumPy scalar
    return value


def _checked(value: Any, data_type: DataType, nullable: bool = True) -> Any:
    """``value`` as ``data_type``'s Python type; raises TypeError/ValueError saying why not."""
    value = _plain(value)
    if value is None:
        if not nullable:
            raise ValueError("None in a field that is NOT NULL")
        return None
    kind = type(data_type)
    if kind in _INTEGRAL:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{value!r} is not an integer")
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{value!r} is not a whole number")
        bits = _INTEGRAL[kind]
        if not -(2 ** (bits - 1)) <= int(value) < 2 ** (bits - 1):
            raise ValueError(f"{value!r} is out of range")
        return int(value)
    if isinstance(data_type, (FloatType, DoubleType)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{value!r} is not a number")
        return float(value)
    if isinstance(data_type, BooleanType):
        if not isinstance(value, bool):
            raise TypeError(f"{value!r} is not a bool")
        return value
    if isinstance(data_type, StringType):
        if not isinstance(value, str):
            raise TypeError(f"{value!r} is not a str")
        return value
    if isinstance(data_type, BinaryType):
        if not isinstance(value, (bytes, bytearray)):
            raise TypeError(f"{value!r} is not bytes")
        return bytes(value)
    if isinstance(data_type, TimestampType):
        if not isinstance(value, dt.datetime):
            raise TypeError(f"{value!r} is not a datetime")
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return aware.astimezone(dt.UTC)
    if isinstance(data_type, TimestampNTZType):
        if not isinstance(value, dt.datetime):
            raise TypeError(f"{value!r} is not a datetime")
        return value if value.tzinfo is None else value.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(data_type, DateType):
        if not isinstance(value, dt.date):
            raise TypeError(f"{value!r} is not a date")
        return value.date() if isinstance(value, dt.datetime) else value
    if isinstance(data_type, DecimalType):
        return _decimal(value, data_type)
    if isinstance(data_type, ArrayType):
        if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
            raise TypeError(f"{value!r} is not a list")
        return [_checked(v, data_type.elementType, data_type.containsNull) for v in value]
    if isinstance(data_type, MapType):
        if not isinstance(value, dict):
            raise TypeError(f"{value!r} is not a dict")
        return {
            _checked(k, data_type.keyType, False): _checked(
                v, data_type.valueType, data_type.valueContainsNull
            )
            for k, v in value.items()
        }
    assert isinstance(data_type, StructType)
    names = data_type.names
    if isinstance(value, dict):
        value = tuple(value.get(n) for n in names)
    if not isinstance(value, (tuple, list)) or len(value) != len(names):
        raise TypeError(f"{value!r} is not a tuple of {len(names)} ({', '.join(names)})")
    checked = [
        _checked(v, f.dataType, f.nullable) for f, v in zip(data_type.fields, value, strict=True)
    ]
    return Row(*names)(*checked)


def _decimal(value: Any, data_type: DecimalType) -> decimal.Decimal:
    if isinstance(value, bool) or not isinstance(value, (decimal.Decimal, int)):
        raise TypeError(f"{value!r} is not a Decimal")
    exact = decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-data_type.scale))
    if len(exact.as_tuple().digits) > data_type.precision:
        raise ValueError(f"{value!r} has more than {data_type.precision} digits")
    return exact


def _dumped(value: Any, data_type: DataType) -> Any:
    """A checked value as JSON holds it."""
    if value is None:
        return None
    if isinstance(data_type, (TimestampType, TimestampNTZType)):
        text = value.isoformat()
        return text[: -len("+00:00")] + "Z" if text.endswith("+00:00") else text
    if isinstance(data_type, DateType):
        return value.isoformat()
    if isinstance(data_type, DecimalType):
        return str(value)
    if isinstance(data_type, BinaryType):
        return base64.b64encode(value).decode("ascii")
    if isinstance(data_type, ArrayType):
        return [_dumped(v, data_type.elementType) for v in value]
    if isinstance(data_type, MapType):
        pairs = [[_dumped(k, data_type.keyType), _dumped(v, data_type.valueType)]
                 for k, v in value.items()]  # fmt: skip
        if isinstance(data_type.keyType, StringType):
            return dict(pairs)
        return pairs
    if isinstance(data_type, StructType):
        return {
            f.name: _dumped(v, f.dataType) for f, v in zip(data_type.fields, value, strict=True)
        }
    return value


def _loaded(value: Any, data_type: DataType) -> Any:
    """``_dumped``'s inverse."""
    if value is None:
        return None
    if isinstance(data_type, TimestampType):
        at = dt.datetime.fromisoformat(value)
        return at.replace(tzinfo=dt.UTC) if at.tzinfo is None else at.astimezone(dt.UTC)
    if isinstance(data_type, TimestampNTZType):
        return dt.datetime.fromisoformat(value)
    if isinstance(data_type, DateType):
        return dt.date.fromisoformat(value)
    if isinstance(data_type, DecimalType):
        return decimal.Decimal(value)
    if isinstance(data_type, BinaryType):
        return base64.b64decode(value)
    if isinstance(data_type, (FloatType, DoubleType)):
        return float(value)
    if isinstance(data_type, ArrayType):
        return [_loaded(v, data_type.elementType) for v in value]
    if isinstance(data_type, MapType):
        pairs = value.items() if isinstance(value, dict) else value
        return {_loaded(k, data_type.keyType): _loaded(v, data_type.valueType) for k, v in pairs}
    if isinstance(data_type, StructType):
        fields = data_type.fields
        if isinstance(value, dict):
            loaded = [_loaded(value.get(f.name), f.dataType) for f in fields]
        else:
            loaded = [_loaded(v, f.dataType) for f, v in zip(fields, value, strict=False)]
        return Row(*data_type.names)(*loaded)
    return value


def _lenient(value: Any, data_type: DataType | None) -> Any:
    """An untyped value (``Codec.load_untyped``) as ``data_type`` where it converts."""
    if data_type is None or isinstance(value, (list, dict)):
        return value
    try:
        return _checked(_loaded(value, data_type), data_type)
    except (TypeError, ValueError, ArithmeticError):
        return value
