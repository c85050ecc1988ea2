"""The definitions wire one job, sensor, sink asset and checks per pipeline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml
from pyspark.sql import SparkSession

from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import EventTimePartitions
from lowmark.orchestration.definitions import build_definitions
from lowmark.orchestration.partitions import event_time_partitions
from tests.batches.sinks.test_several_sinks import ORDERS_SERVED
from tests.helpers import lowmark, write_json_lines
from tests.orchestration.pipelines import ticks

REPO = Path(__file__).resolve().parents[2]


def test_every_pipeline_gets_its_assets_jobs_a_sensor_and_checks_that_apply_to_it(
    defs: dg.Definitions,
) -> None:
    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert {"ticks_microbatches", "slow_microbatches", "ticks_backfill"} <= jobs
    assert "slow_backfill" not in jobs  # not windowed: nothing to backfill by partition
    sensor = defs.resolve_sensor_def("ticks_sensor")
    assert sensor.job_name == "ticks_microbatches"
    graph = defs.resolve_asset_graph()
    keys = {"/".join(k.path) for k in graph.get_all_asset_keys()}
    assert {
        "lowmark/ticks", "lowmark/ticks_late", "lowmark/ticks_bad_records",
        "lowmark/slow", "lowmark/slow_bad_records",
        "lowmark/sources/files_ticks_in", "lowmark/sources/files_slow_in",
    } <= keys  # fmt: skip
    assert "lowmark/slow_late" not in keys  # no event time: nothing is late
    sink = dg.AssetKey(["lowmark", "ticks"])
    assert graph.get(sink).parent_keys == {dg.AssetKey(["lowmark", "sources", "files_ticks_in"])}
    checks = {(k.asset_key.path[-1], k.name) for k in graph.asset_check_keys}
    assert {
        ("ticks", "watermark_lag"), ("ticks", "failing_batch"),
        ("ticks_late", "late_fraction"), ("ticks_bad_records", "bad_fraction"),
    } <= checks  # fmt: skip
    # Without event time there is no watermark: no lag check rather than one that passes.
    assert {name for asset, name in checks if asset.startswith("slow")} == {
        "failing_batch",
        "bad_fraction",
    }
    partitions = graph.get(sink).partitions_def
    assert partitions is not None and partitions.get_first_partition_key() == "2026-01-01-00:00"
    # Stale after no batch for the sensor interval (5 s) + the watermark lag the pipeline
    # accepts (15 min) + how long a window stays open (10 s + 10 s allowed lateness).
    policy = graph.get(sink).freshness_policy_or_from_metadata
    assert policy == dg.FreshnessPolicy.time_window(fail_window=timedelta(seconds=5 + 900 + 20))


def test_partitions_start_at_the_first_window_in_the_sink_unless_configured(
    spark: SparkSession, data_root: Path
) -> None:
    unset = ticks.model_copy(update={"backfill": EventTimePartitions(granularity="hourly")})
    before = event_time_partitions(unset, data_root)
    assert before is not None  # no sink yet: from the hour it loads (none has ended yet)
    assert before.start >= datetime.now(UTC) - timedelta(hours=1)
    write_json_lines(
        data_root / "ticks/in",
        "f0.json",
        [
            {"user": "a", "ts": "2026-03-04T05:06:07Z", "amount": 1},
            {"user": "a", "ts": "2026-03-04T07:00:00Z", "amount": 1},  # closes the first
        ],
        1,
    )
    MicroBatchRunner(spark, unset, data_root).run(max_batches=None)
    after = event_time_partitions(unset, data_root)
    assert after is not None and after.get_first_partition_key() == "2026-03-04-05:00"
    daily = unset.model_copy(update={"backfill": EventTimePartitions(granularity="daily")})
    assert event_time_partitions(daily, data_root).get_first_partition_key() == "2026-03-04"  # type: ignore[union-attr]
    fixed = unset.model_copy(update={"backfill": EventTimePartitions(start="2026-01-01")})
    assert event_time_partitions(fixed, data_root).get_first_partition_key() == "2026-01-01"  # type: ignore[union-attr]


def test_the_default_definitions_load_the_demo_pipelines_and_workspace_yaml_points_at_them() -> (
    None
):
    demo = build_definitions()
    assert {"orders_microbatches", "user_revenue_microbatches", "user_revenue_backfill"} <= {
        j.name for j in demo.resolve_all_job_defs()
    }
    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())
    assert (
        workspace["load_from"][0]["python_module"]["module_name"]
        == "lowmark.orchestration.definitions"
    )


def test_a_pipelines_runs_share_one_pool_slot_so_they_never_overlap(
    defs: dg.Definitions,
) -> None:
    assert defs.resolve_job_def("ticks_microbatches").tags["lowmark/pipeline"] == "ticks"
    assert defs.resolve_job_def("ticks_backfill").tags["lowmark/pipeline"] == "ticks"
    # Materialize in the UI runs the same op as the jobs: the pool is on the op.
    assets = defs.resolve_assets_def(dg.AssetKey(["lowmark", "ticks"]))
    assert {node.pool for node in assets.node_def.iterate_op_defs()} == {"lowmark_ticks"}
    pools = yaml.safe_load((REPO / "dagster.yaml").read_text())["concurrency"]["pools"]
    assert pools == {"default_limit": 1, "granularity": "run"}


def test_each_source_kind_loads_and_each_source_of_a_union_is_an_upstream_asset() -> None:
    defs = build_definitions(str(REPO / "examples/pipelines.yaml"))
    graph = defs.resolve_asset_graph()
    parents = {
        name: {"/".join(k.path) for k in graph.get(dg.AssetKey(["lowmark", name])).parent_keys}
        for name in (
            "kafka_orders",
            "synthetic_clicks",
            "clicks_two_regions",
            "clicks_per_hour",
            "revenue_per_segment",
        )
    }
    # A Delta source that is another pipeline's sink is that sink's asset, not a source.
    assert not any(k.path[-1].startswith("delta_") for k in graph.get_all_asset_keys())
    assert parents == {
        "clicks_per_hour": {"lowmark/synthetic_clicks"},
        "kafka_orders": {"lowmark/sources/kafka_orders"},
        "synthetic_clicks": {"lowmark/sources/synthetic_seed_7"},
        "clicks_two_regions": {
            "lowmark/sources/synthetic_seed_1",
            "lowmark/sources/synthetic_seed_2",
        },
        # A joined table is upstream too (an external asset, not observed).
        "revenue_per_segment": {
            "lowmark/sources/files_orders_incoming",
            "lowmark/dimensions/users_current",
        },
    }
    assert {"kafka_orders_sensor", "clicks_two_regions_sensor"} <= {
        s.name for s in defs.sensors or ()
    }


def test_a_custom_sink_is_an_asset_that_names_its_factory_and_no_table(tmp_path: Path) -> None:
    pipelines = tmp_path / "pipelines.yaml"
    pipelines.write_text(
        yaml.safe_dump(
            {
                "pipelines": [
                    {
                        "name": "exported",
                        "source": {"kind": "synthetic", "total_rows": 10},
                        "sink": {
                            "kind": "custom",
                            "factory": "examples.json_lines_sink:build",
                            "options": {"folder": "exported"},
                        },
                    }
                ]
            }
        )
    )
    defs = build_definitions(str(pipelines))
    sink = defs.resolve_asset_graph().get(dg.AssetKey(["lowmark", "exported"]))
    assert sink.metadata == {"factory": "examples.json_lines_sink.build"}
    assert sink.kinds == {"spark"}
    assert "exported_microbatches" in {j.name for j in defs.resolve_all_job_defs()}


@pytest.mark.parametrize(
    ("sink", "metadata", "listed"),
    [
        (
            {"kind": "postgres", "table": "serving.orders", "mode": "upsert", "keys": ["id"]},
            {"table": "serving.orders", "mode": "upsert"},
            "postgres:serving.orders (upsert)",
        ),
        (
            {"kind": "kafka", "topic": "orders-out", "bootstrap_servers": "kafka:9092"},
            {"topic": "orders-out"},
            "kafka:orders-out",
        ),
    ],
    ids=["postgres", "kafka"],
)
def test_a_database_or_topic_sink_is_an_asset_of_its_kind_and_listed_by_name(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sink: dict[str, object],
    metadata: dict[str, str],
    listed: str,
) -> None:
    pipelines = tmp_path / "pipelines.yaml"
    source = {"kind": "synthetic", "total_rows": 10}
    pipelines.write_text(
        yaml.safe_dump({"pipelines": [{"name": "served", "source": source, "sink": sink}]})
    )
    defs = build_definitions(str(pipelines))
    asset = defs.resolve_asset_graph().get(dg.AssetKey(["lowmark", "served"]))
    assert asset.metadata == metadata
    assert asset.kinds == {str(sink["kind"]), "spark"}
    code, out, _ = lowmark(capsys, tmp_path, "--pipelines", str(pipelines), "list")
    assert code == 0 and listed in out


def test_each_extra_sink_is_an_asset_beside_the_sink_with_the_same_inputs(tmp_path: Path) -> None:
    pipelines = tmp_path / "pipelines.yaml"
    pipelines.write_text(yaml.safe_dump({"pipelines": [ORDERS_SERVED]}))
    graph = build_definitions(str(pipelines)).resolve_asset_graph()
    sink = graph.get(dg.AssetKey(["lowmark", "orders"]))
    serving = graph.get(dg.AssetKey(["lowmark", "orders_sink_serving"]))
    assert serving.metadata == {"table": "orders_now", "mode": "upsert"}
    assert serving.kinds == {"postgres", "spark"} and sink.kinds == {"delta", "spark"}
    assert serving.parent_keys == sink.parent_keys != set()


def test_a_table_another_pipeline_writes_is_joined_as_that_pipelines_sink_asset(
    tmp_path: Path,
) -> None:
    pipelines = tmp_path / "pipelines.yaml"
    source = {"kind": "synthetic", "total_rows": 10}
    join = {"table": "keys/regions", "keys": ["key"], "how": "left"}
    defined = [
        {"name": "regions", "source": source, "sink": {"path": "keys/regions"}},
        {"name": "enriched", "source": source, "sink": {"path": "out"}, "joins": [join]},
    ]
    pipelines.write_text(yaml.safe_dump({"pipelines": defined}))
    graph = build_definitions(str(pipelines)).resolve_asset_graph()
    parents = graph.get(dg.AssetKey(["lowmark", "enriched"])).parent_keys
    assert {"/".join(k.path) for k in parents} == {
        "lowmark/sources/synthetic_seed_0",
        "lowmark/regions",
    }
    assert not any("dimensions" in k.path for k in graph.get_all_asset_keys())
