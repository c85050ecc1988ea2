"""The asset checks of a pipeline's tables, over ``lowmark.batches.admin.health``.

Each check belongs to the table it is about: the sink has ``watermark_lag``
(event-time pipelines only: without event time there is no watermark to
check) and ``failing_batch``, and ``expectations`` (pipelines with
expectations: one check over all of them, each one's violations its
metadata); the late table ``late_fraction``; the bad-records table
``bad_fraction``. A micro-batch run evaluates them after
every batch it commits (a run that follows the source for an hour keeps the
catalog current; about 50 ms of driver reads), and once more when a batch
failed, so a failing batch shows as a failed check with its error; "Execute"
in the UI evaluates them alone (a run of the pipeline's asset op with only
checks selected: no batch runs).
"""

# No `from __future__ import annotations`: Dagster reads op, check and sensor
# parameter annotations (config, resources) at definition time.

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from lowmark.batches.admin import health
from lowmark.batches.pipeline import Pipeline
from lowmark.orchestration.keys import bad_records_key, late_key, sink_key


@dataclass(frozen=True)
class Check:
    name: str
    asset: Callable[[Pipeline], dg.AssetKey]
    evaluate: Callable[[Pipeline, Path], health.CheckOutcome]
    description: str
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.WARN
    needs_event_time: bool = False
    needs_expectations: bool = False


CHECKS = (
    Check(
        "watermark_lag",
        sink_key,
        health.watermark_lag,
        "Processing time minus the watermark after the newest batch, within "
        "checks.max_watermark_lag.",
        needs_event_time=True,
    ),
    Check(
        "failing_batch",
        sink_key,
        health.failing_batch,
        "The pending batch has not failed (fails with the error; a poison batch blocks runs).",
        severity=dg.AssetCheckSeverity.ERROR,
    ),
    Check(
        "late_fraction",
        late_key,
        health.late_fraction,
        "Late rows / input rows over the last checks.window_batches batches, within "
        "checks.max_late_fraction.",
        needs_event_time=True,
    ),
    Check(
        "bad_fraction",
        bad_records_key,
        health.bad_fraction,
        "Bad rows (that did not parse, or that drop expectations removed) / input rows over "
        "the last checks.window_batches batches, within checks.max_bad_fraction.",
    ),
    Check(
        "expectations",
        sink_key,
        health.expectations,
        "No record violated an expectation over the last checks.window_batches batches "
        "(the violations of each are its metadata).",
        needs_expectations=True,
    ),
)


def checks_of(pipeline: Pipeline) -> list[Check]:
    return [
        c
        for c in CHECKS
        if (pipeline.event_time is not None or not c.needs_event_time)
        and (pipeline.expectations or not c.needs_expectations)
    ]


def check_specs(pipeline: Pipeline) -> list[dg.AssetCheckSpec]:
    return [
        dg.AssetCheckSpec(c.name, asset=c.asset(pipeline), description=c.description)
        for c in checks_of(pipeline)
    ]


def check_keys(pipeline: Pipeline) -> list[dg.AssetCheckKey]:
    """Every check of ``pipeline``."""
    return [dg.AssetCheckKey(c.asset(pipeline), c.name) for c in checks_of(pipeline)]


def check_evaluations(
    pipeline: Pipeline, data_root: Path, selected: Iterable[dg.AssetCheckKey]
) -> Iterator[dg.AssetCheckEvaluation]:
    """The evaluation of every ``selected`` check of ``pipeline``, as a run logs it."""
    return (dg.AssetCheckEvaluation(**f) for f in _outcomes(pipeline, data_root, selected))


def check_results(
    pipeline: Pipeline, data_root: Path, selected: Iterable[dg.AssetCheckKey]
) -> Iterator[dg.AssetCheckResult]:
    """The same, as an op yields it."""
    return (dg.AssetCheckResult(**f) for f in _outcomes(pipeline, data_root, selected))


def _outcomes(
    pipeline: Pipeline, data_root: Path, selected: Iterable[dg.AssetCheckKey]
) -> Iterator[dict[str, Any]]:
    wanted = set(selected)
    for c, key in zip(checks_of(pipeline), check_keys(pipeline), strict=True):
        if key in wanted:
            outcome = c.evaluate(pipeline, data_root)
            yield {
                "asset_key": key.asset_key,
                "check_name": c.name,
                "passed": outcome.passed,
                "severity": c.severity,
                "description": outcome.description,
                "metadata": dict(outcome.metadata),
            }
