"""The base of every model users write (pipelines, sources, sinks, windows), and how a
model's fields read in words.

``UserConfig`` models are frozen and refuse keys they do not know; a field's
description is its ``Field(description=...)`` or its attribute docstring. Each
model's ``__doc__`` (what ``help()``, IDEs and notebooks show) is its docstring
as written followed by its fields, each with its type, default and description;
its signature lists the keys and defaults without pydantic's annotations. The
configuration reference (``scripts/config_reference.py``) reads the same words.
"""

from __future__ import annotations

import inspect
import textwrap
import types
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from lowmark.batches.durations import parse_duration_ms


def is_duration(metadata: list[Any]) -> bool:
    """Whether a field's metadata holds the duration parser (``DurationMs``)."""
    return any(getattr(m, "func", None) is parse_duration_ms for m in metadata)


def type_text(
    annotation: Any,
    metadata: list[Any] | tuple[Any, ...] = (),
    name_model: Callable[[type[BaseModel]], str] = lambda model: model.__name__,
) -> str:
    """An annotation as a reader of YAML thinks of it: ``string``, ``list of string``,
    ``duration``, ``one of `a`, `b```, a nested model as ``name_model`` names it."""
    metadata = list(metadata)
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *extra = get_args(annotation)
        return type_text(base, [*metadata, *extra], name_model)
    if is_duration(metadata):
        return "duration"
    if any(type(m).__name__ == "ImportString" for m in metadata):
        return "import path"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return name_model(annotation)
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        kept = [a for a in args if a is not type(None)]
        text = " or ".join(type_text(a, (), name_model) for a in kept)
        return f"{text} or null" if len(kept) < len(args) else text
    if origin is Literal:
        values = ", ".join(f"`{v}`" for v in get_args(annotation))
        return values if len(get_args(annotation)) == 1 else f"one of {values}"
    if origin is tuple:
        return f"list of {type_text(get_args(annotation)[0], (), name_model)}"
    if origin is dict:
        key, value = get_args(annotation)
        return f"map of {type_text(key, (), name_model)} to {type_text(value, (), name_model)}"
    if origin is not None and "Callable" in str(origin):
        return "function (Python only)"
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if annotation in names:
        return names[annotation]
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def bounds_text(metadata: list[Any]) -> str:
    """The field's constraints in words (``≥ 1``, ``at least 1 item``, a pattern)."""
    words: list[str] = []
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            words.append(f"≥ {item.ge}")
        elif isinstance(item, annotated_types.Gt):
            words.append(f"> {item.gt}")
        elif isinstance(item, annotated_types.Le):
            words.append(f"≤ {item.le}")
        elif isinstance(item, annotated_types.MinLen):
            words.append(f"at least {item.min_length}")
        elif getattr(item, "pattern", None):
            words.append(f"pattern `{item.pattern}`")
    return ", ".join(words)


def duration_text(ms: int) -> str:
    """Milliseconds as a duration a user would write (``"15 minutes"``); 0 as ``0``."""
    if ms == 0:
        return "0"
    for unit, size in (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000)):
        if ms % size == 0:
            count = ms // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{ms // 1000} seconds" if ms % 1000 == 0 else f"{ms} ms"


def default_text(field: FieldInfo) -> str:
    """The default as YAML would spell it, ``**required**`` without one; a nested model's
    default is its own defaults (its section)."""
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "its defaults"
    elif field.default is PydanticUndefined:
        return "**required**"
    else:
        value = field.default
    if value is None:
        return "null"
    if value == "":
        return '`""`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and is_duration(field.metadata):
        return f"`{duration_text(value)}`"
    if isinstance(value, dict | tuple) and not value:
        return "`{}`" if isinstance(value, dict) else "`[]`"
    return f"`{value}`"


def written_doc(model: type[BaseModel]) -> str:
    """A model's docstring as written in its class, without the fields ``__doc__`` adds."""
    return inspect.cleandoc(model.__dict__.get("__written_doc__") or "")


def fields_text(model: type[BaseModel]) -> str:
    """A model's fields, one entry each: ``name (type, default): description``."""
    entries = []
    for name, field in model.model_fields.items():
        kind = type_text(field.annotation, field.metadata)
        if bounds := bounds_text(field.metadata):
            kind = f"{kind}, {bounds}"
        default = default_text(field).replace("**", "")
        default = default if default == "required" else f"default {default}"
        entry = f"{name} ({kind}; {default}): {' '.join((field.description or '').split())}"
        entries.append(textwrap.fill(entry, 88, initial_indent="    ", subsequent_indent=" " * 8))
    return "\n".join(entries)


class UserConfig(BaseModel):
    """A model users write: frozen, strict about keys, documented from its fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    __written_doc__: ClassVar[str | None] = None

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        written = cls.__dict__.get("__doc__")
        cls.__written_doc__ = written
        doc = inspect.cleandoc(written or "")
        cls.__doc__ = f"{doc}\n\nFields:\n{fields_text(cls)}\n" if cls.model_fields else doc
        keys = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=inspect.Parameter.empty if field.is_required() else _Shown(field),
            )
            for name, field in cls.model_fields.items()
        ]
        cls.__signature__ = inspect.Signature(keys)


class _Shown:
    """A field's default as the signature shows it: what one would pass in Python (a
    duration as words, a nested model as its class called with no arguments)."""

    def __init__(self, field: FieldInfo) -> None:
        value = field.get_default(call_default_factory=True)
        if isinstance(value, BaseModel):
            self.text = f"{type(value).__name__}()"
        elif isinstance(value, int) and not isinstance(value, bool) and is_duration(field.metadata):
            self.text = repr(duration_text(value))
        else:
            self.text = repr(value)

    def __repr__(self) -> str:
        return self.text
