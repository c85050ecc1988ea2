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

import importlib
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

from lowmark.batches.errors import PipelineConfigInvalid, PipelineNotFound

if TYPE_CHECKING:
    from pydantic import ValidationError

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
    except ValidationError as exc:
        raise PipelineConfigInvalid(f"{location}: {_first_error(exc)}") from exc
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
            raise PipelineConfigInvalid(f"{path}: pipelines[{i}].{_first_error(exc)}") from exc
    return pipelines


def _first_error(exc: ValidationError) -> str:
    """``field.path: message`` of the first validation error, on one line (the source's
    kind, which pydantic puts in the path, left out: ``source.format``)."""
    from lowmark.batches.pipeline import SOURCE_KINDS

    err = exc.errors()[0]
    parts = [str(part) for part in err["loc"]]
    parts = [
        p for i, p in enumerate(parts) if not (i and parts[i - 1] == "source" and p in SOURCE_KINDS)
    ]
    return f"{'.'.join(parts) or '(root)'}: {err['msg']}"
