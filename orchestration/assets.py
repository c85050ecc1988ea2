"""The sink of each pipeline as a Dagster asset, with its health checks.

The sink table is an external asset (lowmark's runs write it); every
committed batch records a materialization of it with numeric metadata, which
the asset page plots. Two asset checks (``batches.health``) can be run on
demand and are also evaluated by every micro-batch run.
"""

# No `from __future__ import annotations`: Dagster reads op, check and sensor
# parameter annotations (config, resources) at definition time.

from collections.abc import Callable
from pathlib import Path

import dagster as dg
from pyspark.sql import SparkSession

from batches import health
from batches.microbatch import BatchResult
from batches.pipeline import Pipeline
from orchestration.resources import LowmarkResource, SparkResource

GROUP = "lowmark"
HealthCheck = Callable[[SparkSession, Pipeline, Path], health.CheckOutcome]
CHECKS: dict[str, tuple[HealthCheck, str]] = {
    "watermark_lag": (health.watermark_lag, "Watermark lag within the pipeline's bound."),
    "late_fraction": (health.late_fraction, "Share of late rows within the pipeline's bound."),
}


def sink_asset_key(pipeline: Pipeline) -> dg.AssetKey:
    return dg.AssetKey([GROUP, pipeline.name])


def sink_asset(pipeline: Pipeline) -> dg.AssetSpec:
    return dg.AssetSpec(
        sink_asset_key(pipeline),
        description=f"Sink of lowmark pipeline {pipeline.name}: {pipeline.description}",
        group_name=GROUP,
        kinds={"delta", "spark"},
        metadata={"sink": pipeline.sink.path, "mode": pipeline.sink_config().mode},
        tags={"lowmark/pipeline": pipeline.name},
    )


def batch_materialization(pipeline: Pipeline, r: BatchResult) -> dg.AssetMaterialization:
    """A materialization of the sink for one committed batch; numbers only, so they plot."""
    metadata: dict[str, int] = {
        "batch_id": r.batch_id,
        "rows_in": r.rows_in,
        "rows_out": r.rows_out,
        "rows_bad": r.rows_bad,
        "rows_late": r.rows_late,
        "duration_ms": r.durations_ms.get("total", 0),
        "replayed": int(r.replay),
    }
    if r.watermark_ms is not None:
        metadata["watermark_ms"] = r.watermark_ms
    if r.lag_ms is not None:
        metadata["lag_ms"] = r.lag_ms
    return dg.AssetMaterialization(
        sink_asset_key(pipeline),
        description=f"batch {r.batch_id} {'replayed' if r.replay else 'committed'}",
        metadata=metadata,
    )


def evaluate_checks(
    spark: SparkSession, pipeline: Pipeline, data_root: Path
) -> list[dg.AssetCheckEvaluation]:
    """Every health check of ``pipeline`` as an evaluation a run can log."""
    evaluations = []
    for name, (check, _) in CHECKS.items():
        outcome = check(spark, pipeline, data_root)
        evaluations.append(
            dg.AssetCheckEvaluation(
                asset_key=sink_asset_key(pipeline),
                check_name=name,
                passed=outcome.passed,
                metadata=dict(outcome.metadata),
                severity=dg.AssetCheckSeverity.WARN,
                description=outcome.description,
            )
        )
    return evaluations


def health_checks(pipeline: Pipeline) -> list[dg.AssetChecksDefinition]:
    """The on-demand asset checks of ``pipeline``'s sink."""
    return [_health_check(pipeline, name, check, text) for name, (check, text) in CHECKS.items()]


def _health_check(
    pipeline: Pipeline, name: str, check: HealthCheck, text: str
) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=sink_asset_key(pipeline), name=name, description=text)
    def _check(spark: SparkResource, lowmark: LowmarkResource) -> dg.AssetCheckResult:
        outcome = check(spark.session(), pipeline, lowmark.root())
        return dg.AssetCheckResult(
            passed=outcome.passed,
            metadata=dict(outcome.metadata),
            severity=dg.AssetCheckSeverity.WARN,
            description=outcome.description,
        )

    return _check
