"""The definitions wire one job, sensor, sink asset and checks per pipeline."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import yaml

from orchestration.definitions import build_definitions

REPO = Path(__file__).resolve().parents[2]


def test_every_pipeline_gets_a_job_a_sensor_a_sink_asset_and_two_checks(
    defs: dg.Definitions,
) -> None:
    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert {"ticks_microbatches", "slow_microbatches", "ticks_backfill"} <= jobs
    assert "slow_backfill" not in jobs  # not windowed: nothing to backfill by partition
    sensor = defs.resolve_sensor_def("ticks_sensor")
    assert sensor.job_name == "ticks_microbatches"
    graph = defs.resolve_asset_graph()
    assert {dg.AssetKey(["lowmark", "ticks"]), dg.AssetKey(["lowmark", "slow"])} <= set(
        graph.get_all_asset_keys()
    )
    checks = {k.name for k in graph.asset_check_keys if k.asset_key.path[-1] == "ticks"}
    assert checks == {"watermark_lag", "late_fraction"}
    partitions = defs.resolve_job_def("ticks_backfill").partitions_def
    assert partitions is not None and "2026-01-01-00:00" in partitions.get_partition_keys()[:1]


def test_the_default_definitions_load_the_demo_pipelines_and_workspace_yaml_points_at_them() -> (
    None
):
    demo = build_definitions()
    assert {"orders_microbatches", "user_revenue_microbatches", "user_revenue_backfill"} <= {
        j.name for j in demo.resolve_all_job_defs()
    }
    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())
    assert workspace["load_from"][0]["python_module"]["module_name"] == "orchestration.definitions"


def test_runs_are_tagged_with_their_pipeline_so_the_instance_runs_one_at_a_time(
    defs: dg.Definitions,
) -> None:
    assert defs.resolve_job_def("ticks_microbatches").tags["lowmark/pipeline"] == "ticks"
    assert defs.resolve_job_def("ticks_backfill").tags["lowmark/pipeline"] == "ticks"
    limits = yaml.safe_load((REPO / "dagster.yaml").read_text())["concurrency"]["runs"]
    assert limits["tag_concurrency_limits"] == [
        {"key": "lowmark/pipeline", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
    ]
