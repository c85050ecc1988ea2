"""Health of a running pipeline, as the Dagster asset checks report it.

Two checks over the checkpoint's ``progress`` table, with the bounds of the
pipeline's ``checks`` (``HealthChecks``):

- watermark lag: processing time of the newest committed batch minus the
  watermark after it — how far event time trails the wall clock; a
  watermark ahead of the wall clock (a negative lag) fails it too;
- late share: late rows / input rows over the newest ``window_batches``
  batches — how much data arrives after its windows closed.

A pipeline that committed nothing yet (or has no event time, for the lag)
passes, with a description that says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from batches.pipeline import Pipeline
from batches.status import pipeline_history


@dataclass(frozen=True)
class CheckOutcome:
    passed: bool
    description: str
    metadata: dict[str, float] = field(default_factory=dict)


def watermark_lag(spark: SparkSession, pipeline: Pipeline, data_root: Path) -> CheckOutcome:
    """Passes while the newest batch's watermark lag is within ``max_watermark_lag``."""
    bound_s = pipeline.checks.max_watermark_lag / 1000
    newest = pipeline_history(spark, pipeline, data_root, last=1)
    if not newest:
        return CheckOutcome(True, "no batch committed yet")
    lag_ms = newest[0]["lag_ms"]
    if lag_ms is None:
        return CheckOutcome(True, "no watermark (no event time, or no event seen yet)")
    lag_s = lag_ms / 1000
    if lag_s < 0:
        return CheckOutcome(
            False,
            f"batch {newest[0]['batch_id']}: watermark {-lag_s:.0f} s AHEAD of processing "
            "time: event times from the future moved it (lower event_time.max_future, and "
            "find them in the late table)",
            {"lag_seconds": lag_s, "bound_seconds": bound_s},
        )
    verdict = "within" if lag_s <= bound_s else "over"
    return CheckOutcome(
        lag_s <= bound_s,
        f"batch {newest[0]['batch_id']}: watermark lag {lag_s:.0f} s, {verdict} {bound_s:.0f} s",
        {"lag_seconds": lag_s, "bound_seconds": bound_s},
    )


def late_fraction(spark: SparkSession, pipeline: Pipeline, data_root: Path) -> CheckOutcome:
    """Passes while late rows / input rows over recent batches is within ``max_late_fraction``."""
    bound = pipeline.checks.max_late_fraction
    recent = pipeline_history(spark, pipeline, data_root, last=pipeline.checks.window_batches)
    rows_in = sum(r["rows_in"] for r in recent)
    if not rows_in:
        return CheckOutcome(True, "no input rows committed yet")
    late = sum(r["rows_late"] for r in recent)
    share = late / rows_in
    verdict = "within" if share <= bound else "over"
    return CheckOutcome(
        share <= bound,
        f"{late} of {rows_in} rows late over {len(recent)} batches ({share:.1%}), "
        f"{verdict} {bound:.1%}",
        {"late_fraction": share, "late_rows": float(late), "bound": bound},
    )
