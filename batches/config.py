"""The base of every model users write (pipelines, sources, sinks, windows), and how a
model's fields read in words.

``UserConfig`` models are frozen and refuse keys they do not know; a field's
description is its ``Field(description=...)`` or its attribute docstring
(``descriptions``). Each model's ``__doc__`` (what ``help()``, IDEs and notebooks show)
is its docstring as written followed by its fields, each with its type, default and
description; its signature lists the keys and defaults without pydantic's annotations.
The configuration reference (``scripts/config_reference.py``) reads the same words.

The attribute docstrings, and the ``__doc__`` made of them, are read when first asked
for (``help()``, the reference), from each module's source parsed once: not as each
model class is defined, as pydantic's ``use_attribute_docstrings`` does (it parses every
class's source apart), which was half the time the pipeline models take to define,
paid by every command that loads pipelines (docs/cli.md, "Fast commands").
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap
import types
from collections.abc import Callable
from itertools import pairwise
from typing import Annotated, Any, Literal, Union, cast, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ConfigDict
from pydantic._internal._model_construction import ModelMetaclass
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
    return inspect.cleandoc(model.__dict__.get("__doc__") or "")


def _docstrings_in(body: list[ast.stmt]) -> dict[str, str]:
    """The string literal under each annotated name in a class body."""
    return {
        node.target.id: inspect.cleandoc(after.value.value)
        for node, after in pairwise(body)
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    }


@functools.cache
def _module_docstrings(module: str) -> dict[str, dict[str, str]]:
    """Per class of ``module`` (by qualified name, outside functions), its attribute
    docstrings: the module's source parsed once for all its models."""
    try:
        tree = ast.parse(inspect.getsource(sys.modules[module]))
    except (KeyError, OSError, TypeError):
        return {}
    found: dict[str, dict[str, str]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                found[prefix + node.name] = _docstrings_in(node.body)
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return found


def _attribute_docstrings(cls: type) -> dict[str, str]:
    """The attribute docstrings in ``cls``'s own body ({}: its source cannot be read)."""
    found = _module_docstrings(cls.__module__).get(cls.__qualname__)
    if found is not None:
        return found
    try:  # a class defined in a function
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    return _docstrings_in(
        next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)).body
    )


def descriptions(model: type[BaseModel]) -> dict[str, str]:
    """Each field's description: its ``Field(description=...)``, else its attribute
    docstring in the class that declares it or a base ("": neither)."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if issubclass(cls, BaseModel):
            docs.update(_attribute_docstrings(cls))
    return {
        name: field.description or docs.get(name, "") for name, field in model.model_fields.items()
    }


def fields_text(model: type[BaseModel]) -> str:
    """A model's fields, one entry each: ``name (type, default): description``."""
    entries = []
    described = descriptions(model)
    for name, field in model.model_fields.items():
        kind = type_text(field.annotation, field.metadata)
        if bounds := bounds_text(field.metadata):
            kind = f"{kind}, {bounds}"
        default = default_text(field).replace("**", "")
        default = default if default == "required" else f"default {default}"
        entry = f"{name} ({kind}; {default}): {' '.join(described[name].split())}"
        entries.append(textwrap.fill(entry, 88, initial_indent="    ", subsequent_indent=" " * 8))
    return "\n".join(entries)


class _Documented(ModelMetaclass):
    """A model's ``__doc__`` (``help()``, IDEs): its docstring as written, then its fields
    (``fields_text``), made when read. A property of the metaclass, as ``pydoc`` reads a
    class's own ``__doc__`` past any descriptor in the class's namespace."""

    @property
    def __doc__(cls) -> str:  # type: ignore[override]
        model = cast("type[BaseModel]", cls)
        doc = written_doc(model)
        return f"{doc}\n\nFields:\n{fields_text(model)}\n" if model.model_fields else doc


class UserConfig(BaseModel, metaclass=_Documented):
    """A model users write: frozen, strict about keys, documented from its fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
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
