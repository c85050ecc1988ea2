"""The same pipelines on a real Spark standalone cluster (``tests.spark_cluster``: a master and
two one-core workers on loopback): `lowmark --master spark://…` runs them as a driver whose
executors are the workers' JVMs, SIGKILLed after batch 3's sink write and run again to
completion on the cluster; every table equals the fault-free local run's (the kill matrix's
reference, ``tests.faults.conftest``). The executors write the sink and the state to the
folders the driver reads, as a cluster's workers write a shared file system."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lowmark.batches.loop.faults import KILL_AT_ENV, KillPoint
from tests.faults.conftest import KILL_BATCH, References
from tests.faults.harness import ENGINE_CLI, KILLED, REPO, differences, lowmark_env, snapshot
from tests.helpers import INTERPRETED
from tests.spark_cluster import SparkCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    started = SparkCluster.start(tmp_path_factory.mktemp("spark_cluster"))
    yield started
    started.stop()


def _run_on(
    cluster: SparkCluster, root: Path, name: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """`lowmark --master <cluster> run name --until-caught-up`: a driver with a JVM of its own."""
    confs = INTERPRETED | SparkCluster.driver_confs()
    args = [
        *ENGINE_CLI,
        *("--pipelines", "tests.faults.scenarios", "--data-root", str(root)),
        *("--master", cluster.master_url, "run", name, "--until-caught-up"),
    ]
    driver_env = lowmark_env(
        None,
        PYSPARK_SUBMIT_ARGS=" ".join(
            [*(f"--conf {k}={v}" for k, v in confs.items()), "pyspark-shell"]
        ),
        # The executors run this interpreter (pandas, pyarrow and lowmark for a keyed step).
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        **env,
    )
    return subprocess.run(
        args, env=driver_env, cwd=REPO, capture_output=True, text=True, timeout=900
    )


@pytest.mark.parametrize("name", ["tumbling_two_partitions", "keyed_alerts", "dedup_append"])
def test_a_pipeline_on_a_standalone_cluster_killed_and_run_again_ends_like_a_local_run(
    references: References, cluster: SparkCluster, name: str
) -> None:
    ref = references[name]
    root = ref.folder / "on_cluster"  # beside the shared input folder
    point = KillPoint("after_sink", KILL_BATCH)
    before = cluster.applications()
    killed = _run_on(cluster, root, name, **{KILL_AT_ENV: str(point)})
    assert killed.returncode == KILLED, killed.stderr[-3000:]
    done = _run_on(cluster, root, name)
    assert done.returncode == 0, done.stderr[-3000:]
    assert cluster.applications() == before + 2  # each driver ran on the cluster

    assert differences(ref.tables, snapshot(ref.pipeline, root)) == []
