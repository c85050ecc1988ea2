"""Each pipeline's tables as Dagster assets, materialized by lowmark's runs.

Per pipeline, one multi-asset whose op is the pipeline's run
(``lowmark.orchestration.runs``):

- ``lowmark/<pipeline>`` — the sink. Materializing it runs micro-batches
  (the UI's Materialize, the micro-batch job, the sensor); for a pipeline
  with event-time partitions (``backfill``) it is partitioned by them, and
  materializing partitions backfills them. Every committed batch records a
  materialization with readable metadata (``lowmark.orchestration.metadata``). Its
  freshness policy (``freshness_policy``) follows from the pipeline's bounds.
- ``lowmark/<pipeline>_sink_<name>`` — each extra sink (``extra_sinks``), written by
  the same batches.
- ``lowmark/<pipeline>_late`` (event-time pipelines) and
  ``lowmark/<pipeline>_bad_records`` — the checkpoint's late and bad-records
  tables, materialized by every batch (with the rows it appended), so
  downstream assets can depend on them.
- ``lowmark/sources/<kind>_<path>`` — the input, an external asset upstream
  of all three, observed by the pipeline's runs after each batch and by its sensor
  (``lowmark.orchestration.observations``).
- ``lowmark/dimensions/<table>`` — each table the pipeline joins its records with
  (``joins``), an external asset upstream of all three, not observed (``dimension_specs``).

Checks: ``lowmark.orchestration.checks``. Batches run from the CLI are reported as
materializations too, when a Dagster instance is configured
(``lowmark.orchestration.cli``).
"""

# No `from __future__ import annotations`: Dagster reads op, check and sensor
# parameter annotations (config, resources) at definition time.

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg

from lowmark.batches.loop.backfill import final_at_ms
from lowmark.batches.pipeline import DeltaSink, KafkaSink, Pipeline, PostgresSink, SinkKind
from lowmark.orchestration.checks import check_evaluations, check_results, check_specs
from lowmark.orchestration.keys import (
    GROUP,
    PIPELINE_TAG,
    Sinks,
    asset_op,
    bad_records_key,
    dimension_key,
    extra_sink_keys,
    inputs,
    late_key,
    pool,
    sink_key,
    source_key,
    upstream_keys,
)
from lowmark.orchestration.observations import observed_inputs
from lowmark.orchestration.partitions import backfill_policy, event_time_partitions
from lowmark.orchestration.resources import LowmarkResource, SparkResource
from lowmark.orchestration.runs import RunConfig, backfill, run_batches
from lowmark.orchestration.sensors import sensor_interval_seconds


def source_specs(pipeline: Pipeline, data_root: Path, sinks: Sinks) -> list[dg.AssetSpec]:
    """Each input of ``pipeline`` (each source of a union) as an external asset, but for
    the sinks of other pipelines (``sinks``), which are assets already."""
    keys = [source_key(source, data_root, sinks) for source in inputs(pipeline)]
    return [
        dg.AssetSpec(
            key,
            description=f"Input of lowmark pipelines: {source.kind} {source.label} "
            "(written by others; lowmark reads it).",
            group_name=GROUP,
            kinds={source.kind},
        )
        for source, key in zip(inputs(pipeline), keys, strict=True)
        if key not in sinks.values()
    ]


def dimension_specs(pipeline: Pipeline, data_root: Path, sinks: Sinks) -> list[dg.AssetSpec]:
    """Each table ``pipeline`` joins its records with as an external asset, but for the
    sinks of other pipelines (``sinks``), which are assets already. They are not observed:
    a dimension's update starts no batch (the next batch joins it)."""
    return [
        dg.AssetSpec(
            key,
            description=f"Delta table lowmark pipelines join their records with: {join.table} "
            "(written by others; each batch reads the version it recorded).",
            group_name=GROUP,
            kinds={"delta"},
        )
        for join in pipeline.joins
        if (key := dimension_key(join, data_root, sinks)) not in sinks.values()
    ]


def _sink_metadata(pipeline: Pipeline, sink: SinkKind) -> dict[str, str]:
    """What a sink asset shows of its sink (``sink``, one of ``pipeline.sinks()``): its table
    and mode (a Delta table's path, a Postgres table's name), a Kafka sink's topic, or a
    custom sink's factory (lowmark cannot read such a sink: the asset records batches, not a
    table)."""
    sink = pipeline.written_as(sink)
    if isinstance(sink, DeltaSink):
        return {"path": sink.path, "mode": sink.mode}
    if isinstance(sink, PostgresSink):
        return {"table": sink.table, "mode": sink.mode}
    if isinstance(sink, KafkaSink):
        return {"topic": sink.topic}
    return {"factory": sink.label}


def _sink_kinds(sink: SinkKind) -> set[str]:
    """The systems a sink asset shows it in (Dagster's kind tags)."""
    if isinstance(sink, DeltaSink):
        return {"delta", "spark"}
    if isinstance(sink, PostgresSink):
        return {"postgres", "spark"}
    if isinstance(sink, KafkaSink):
        return {"kafka", "spark"}
    return {"spark"}


def freshness_policy(pipeline: Pipeline) -> dg.FreshnessPolicy:
    """How long the sink may go without a batch before Dagster calls it stale: the sensor
    interval (for a run to start), plus the watermark lag the pipeline accepts
    (``checks.max_watermark_lag``), plus for a windowed pipeline how long a window stays
    open past its start (span, or session gap, + allowed lateness); at least a minute,
    Dagster's least. Input that stops arriving makes it stale too: nothing new was
    processed."""
    due_ms = sensor_interval_seconds() * 1000 + pipeline.checks.max_watermark_lag
    if pipeline.aggregation is not None:
        due_ms += final_at_ms(pipeline, 0)
    return dg.FreshnessPolicy.time_window(fail_window=timedelta(milliseconds=max(due_ms, 60_000)))


def pipeline_assets(
    pipeline: Pipeline, data_root: Path, sinks: Sinks | None = None
) -> dg.AssetsDefinition:
    """The sink, late and bad-records assets of ``pipeline`` and their checks, computed by
    one op: a partition or a range of them selected (a backfill's runs:
    ``partitions.backfill_policy``) → backfill them; else run micro-batches, evaluating the
    selected checks after each; only checks selected → just those. ``sinks``: other
    pipelines' sink assets, upstream of a pipeline that reads their tables."""
    upstream = upstream_keys(pipeline, data_root, sinks or {})
    observed = observed_inputs(pipeline, data_root, sinks or {})
    name = pipeline.name
    specs = [
        dg.AssetSpec(
            sink_key(pipeline),
            description=f"Sink of lowmark pipeline {name}: {pipeline.description}",
            deps=upstream,
            kinds=_sink_kinds(pipeline.sink),
            metadata=_sink_metadata(pipeline, pipeline.sink),
            partitions_def=event_time_partitions(pipeline, data_root),
            freshness_policy=freshness_policy(pipeline),
            skippable=True,
        ),
        *(
            dg.AssetSpec(
                key,
                description=f"Sink {sink_name!r} of lowmark pipeline {name}, beside its sink: "
                f"{pipeline.description}",
                deps=upstream,
                kinds=_sink_kinds(pipeline.extra_sinks[sink_name]),
                metadata=_sink_metadata(pipeline, pipeline.extra_sinks[sink_name]),
                skippable=True,
            )
            for sink_name, key in extra_sink_keys(pipeline).items()
        ),
        dg.AssetSpec(
            bad_records_key(pipeline),
            description=f"Malformed input rows of {name}, with the raw text and the reason.",
            deps=upstream,
            kinds={"delta"},
            skippable=True,
        ),
    ]
    if pipeline.event_time is not None:
        specs.append(
            dg.AssetSpec(
                late_key(pipeline),
                description=f"Records of {name} set aside as late, or without an event time, "
                "with the reason.",
                deps=upstream,
                kinds={"delta"},
                skippable=True,
            )
        )

    @dg.multi_asset(
        name=asset_op(pipeline),
        specs=specs,
        check_specs=check_specs(pipeline),
        can_subset=True,
        group_name=GROUP,
        pool=pool(pipeline),
        backfill_policy=backfill_policy(pipeline),
        op_tags={PIPELINE_TAG: name},
        description=f"Micro-batches of lowmark pipeline {name}; with partitions, a backfill.",
    )
    def _assets(
        context: dg.AssetExecutionContext,
        config: RunConfig,
        spark: SparkResource,
        lowmark: LowmarkResource,
    ) -> Iterator[Any]:
        def evaluate_checks() -> None:
            selected = context.selected_asset_check_keys
            for evaluation in check_evaluations(pipeline, lowmark.root(), selected):
                context.log_event(evaluation)

        failed: Exception | None = None
        batches = 0
        try:
            if context.has_partition_key or context.has_partition_key_range:
                backfill(context, pipeline, spark.session(), lowmark.root(), config.force)
            elif context.selected_asset_keys:
                session = spark.session()
                batches = run_batches(
                    context, pipeline, session, lowmark.root(), config, evaluate_checks, observed
                )
        except Exception as exc:  # the checks still say what state it left
            failed = exc
        if failed is not None or not batches:
            # Yielded, not logged: events logged by an op that then raises are lost.
            yield from check_results(pipeline, lowmark.root(), context.selected_asset_check_keys)
        if failed is not None:
            raise failed

    return _assets
