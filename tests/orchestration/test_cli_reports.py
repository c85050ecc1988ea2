"""Batches run from the CLI appear in the assets' history when a Dagster instance is set:
their materializations, the partitions they made final and every check's evaluation."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from dagster._core.instance.ref import InstanceRef
from pyspark.sql import SparkSession

from lowmark.orchestration.checks import check_keys
from lowmark.orchestration.cli import main
from tests.helpers import drop_order_files, tick
from tests.orchestration.from_data import ticks_from_data

SINK = dg.AssetKey(["lowmark", "ticks_from_data"])


def test_cli_batches_are_reported_to_the_instance_in_dagster_home(
    spark: SparkSession, data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "dagster_home"  # not there yet: the CLI makes it an instance
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    # Batch 0 moves the watermark to 1 h 1 min 40 s; batch 1 runs with it (emitting the
    # closed windows), and hour 0 is final from 1 h 20 s (10 s windows, 10 s lateness).
    # The partitions start at the sink's first window, which is not there when the
    # command starts (as with `lowmark demo`): hour 0 is reported all the same.
    drop_order_files(data_root, 0, [tick("a", 1, 1), tick("a", 3700, 2)])
    argv = ["--pipelines", "tests.orchestration.from_data", "--data-root", str(data_root)]
    with pytest.raises(SystemExit) as done:
        main([*argv, "run", "ticks_from_data", "--until-caught-up"])
    assert done.value.code in (None, 0)

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        records = instance.fetch_materializations(SINK, limit=10).records
        partitions = instance.get_materialized_partitions(SINK)
        checks = {
            key.name: instance.get_latest_asset_check_evaluation_record(key)
            for key in check_keys(ticks_from_data)
        }
    batches = [r for r in reversed(records) if r.partition_key is None]
    assert [r.asset_materialization.metadata["batch"].value for r in batches] == ["0", "1"]  # type: ignore[union-attr]
    assert all(r.run_id == "" for r in records)  # runless: no Dagster run ran them
    assert partitions == {"2026-01-01-00:00"}
    # Every check evaluated after the last batch, so none reads "not executed".
    assert checks.keys() == {"watermark_lag", "failing_batch", "late_fraction", "bad_fraction"}
    assert all(r is not None and r.event is not None for r in checks.values())
    failing = checks["failing_batch"]
    assert failing is not None and failing.event is not None
    evaluation = failing.event.asset_check_evaluation
    assert evaluation is not None and evaluation.passed
    assert "batch 1 committed" in (evaluation.description or "")
