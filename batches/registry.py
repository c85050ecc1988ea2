"""Finding pipelines: a Python module (or .py file) or a YAML file.

A module contributes every module-level ``Pipeline`` object. A YAML file has
a ``pipelines:`` list of pipeline mappings, transforms given by import path.
The location comes from ``--pipelines`` or ``LOWMARK_PIPELINES``; the demo
pipelines (``lowmark.batches.demo``) are the default.

The definitions (pydantic, the pipeline models) are imported by the functions that load
them, not with this module: the commands that import it without loading any (`lowmark
show`, `sql`) do not pay for them (docs/cli.md, "Fast commands").
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lowmark.batches.errors import PipelineConfigInvalid, PipelineNotFound

if TYPE_CHECKING:
    from pydantic import ValidationError

    from lowmark.batches.config import UserConfig
    from lowmark.batches.pipeline import Pipeline

DEFAULT_LOCATION = "lowmark.batches.demo"


def default_location() -> str:
    return os.environ.get("LOWMARK_PIPELINES", DEFAULT_LOCATION)


def load_pipelines(location: str | None = None) -> dict[str, Pipeline]:
    """All pipelines at ``location``, by name; names must be unique."""
    location = location or default_location()
    if location.endswith((".yaml", ".yml")):
        pipelines = _from_yaml(Path(location))
    else:
        pipelines = _from_module(location)
    by_name: dict[str, Pipeline] = {}
    for p in pipelines:
        if p.name in by_name:
            raise PipelineConfigInvalid(f"{location}: two pipelines are named {p.name!r}")
        by_name[p.name] = p
    return by_name


def get_pipeline(name: str, location: str | None = None) -> Pipeline:
    pipelines = load_pipelines(location)
    if name not in pipelines:
        known = ", ".join(sorted(pipelines)) or "none"
        raise PipelineNotFound(
            f"no pipeline {name!r} in {location or default_location()} (known: {known}); "
            "see `lowmark list`"
        )
    return pipelines[name]


def _from_module(location: str) -> list[Pipeline]:
    from pydantic import ValidationError

    from lowmark.batches.pipeline import Pipeline

    try:
        if location.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(location).stem, location)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {location}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(location)
    except (ImportError, FileNotFoundError) as exc:
        raise PipelineConfigInvalid(
            f"cannot import pipelines from {location!r}: {exc}; pass a module, .py or .yaml path"
        ) from exc
    except ValidationError as exc:  # a model built at import: the model is the error's title
        model = _user_models().get(exc.title)
        unknown = None if model is None else _unknown_key(exc, model, exc.title)
        raise PipelineConfigInvalid(f"{location}: {unknown or _first_error(exc)}") from exc
    return [value for value in vars(module).values() if isinstance(value, Pipeline)]


def _from_yaml(path: Path) -> list[Pipeline]:
    import yaml  # 60 ms to import: only for a YAML file
    from pydantic import ValidationError

    from lowmark.batches.pipeline import Pipeline

    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise PipelineConfigInvalid(f"pipeline file {path} does not exist") from exc
    except yaml.YAMLError as exc:
        raise PipelineConfigInvalid(
            f"{path} is not valid YAML: {str(exc).splitlines()[0]}"
        ) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("pipelines"), list):
        raise PipelineConfigInvalid(f"{path}: expected a top-level `pipelines:` list")
    pipelines = []
    for i, item in enumerate(doc["pipelines"]):
        try:
            pipelines.append(Pipeline.model_validate(item))
        except ValidationError as exc:
            name = item.get("name") if isinstance(item, dict) else None
            unknown = _unknown_key(exc, Pipeline, f"pipeline {name or f'pipelines[{i}]'}")
            problem = unknown or f"pipelines[{i}].{_first_error(exc)}"
            raise PipelineConfigInvalid(f"{path}: {problem}") from exc
    return pipelines


def _unknown_key(exc: ValidationError, model: Any, where: str) -> str | None:
    """The first key of ``exc`` that ``model`` has no field for, in words: ``unknown key
    `sourc` in pipeline clicks (did you mean `source`?)``; None when every key is known.

    Pydantic lists a missing field before the unknown key that was its typo, and
    "source: Field required" hides the typo: the unknown key comes first.
    """
    for err in exc.errors():
        if err["type"] != "extra_forbidden":
            continue
        *parent, key = err["loc"]
        dotted = ".".join(str(part) for part in _without_kinds(list(err["loc"])))
        accepted = _accepted_keys(model, parent)
        close = difflib.get_close_matches(str(key), sorted(accepted), n=1)
        if close:
            return f"unknown key `{dotted}` in {where} (did you mean `{close[0]}`?)"
        there = f" (the keys there: {', '.join(sorted(accepted))})" if accepted else ""
        return f"unknown key `{dotted}` in {where}: remove it{there}"
    return None


def _user_models() -> dict[str, type[UserConfig]]:
    """Every model users write, by class name."""
    from lowmark.batches.config import UserConfig

    found: dict[str, type[UserConfig]] = {}
    todo = [UserConfig]
    while todo:
        model = todo.pop()
        found[model.__name__] = model
        todo += model.__subclasses__()
    return found


def _accepted_keys(annotation: Any, loc: Sequence[int | str]) -> set[str]:
    """The keys a mapping at ``loc`` (a validation error's path) below a value of type
    ``annotation`` may have; empty when the types do not tell."""
    from pydantic import BaseModel

    alternatives = _alternatives(annotation)
    models = [t for t in alternatives if isinstance(t, type) and issubclass(t, BaseModel)]
    if not loc:
        return {name for m in models for name in m.model_fields}
    part, rest = loc[0], loc[1:]
    for m in models:
        if isinstance(part, str) and part in m.model_fields:
            return _accepted_keys(m.model_fields[part].annotation, rest)
    for m in models:  # a tagged union: pydantic puts the tag (`kind`) in the path
        kind = m.model_fields.get("kind")
        if kind is not None and kind.default == part:
            return _accepted_keys(m, rest)
    for t in alternatives:  # a list's index or a mapping's key: on to the item's type
        args = [a for a in typing.get_args(t) if a is not Ellipsis]
        if typing.get_origin(t) in (list, tuple, dict) and args:
            return _accepted_keys(args[-1], rest)
    return set()


def _alternatives(annotation: Any) -> list[Any]:
    """The types ``annotation`` allows: through ``Annotated``, unions and ``Optional``."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _alternatives(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _alternatives(arg)]
    return [annotation]


def _without_kinds(parts: list[int | str]) -> list[int | str]:
    """A validation error's path without the sources' kinds, which pydantic puts in it
    (``source.files.format`` → ``source.format``; a union's ``source.sources.a.files.path``
    → ``source.sources.a.path``)."""
    from lowmark.batches.pipeline import SOURCE_KINDS

    def a_kind(i: int) -> bool:
        at_source = parts[i - 1] == "source" or (i > 1 and parts[i - 2] == "sources")
        return i > 0 and at_source and parts[i] in SOURCE_KINDS

    return [p for i, p in enumerate(parts) if not a_kind(i)]


def _first_error(exc: ValidationError) -> str:
    """``field.path: message`` of the first validation error, on one line (the source's
    kind, which pydantic puts in the path, left out: ``source.format``)."""
    err = exc.errors()[0]
    parts = [str(part) for part in _without_kinds(list(err["loc"]))]
    return f"{'.'.join(parts) or '(root)'}: {err['msg']}"
