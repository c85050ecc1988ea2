"""The test pipelines as a code location loaded in process, as a workspace loads one (by
module and attribute), and the GraphQL the UI sends to launch a backfill."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.test_utils import instance_for_test
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

from lowmark.orchestration.definitions import build_definitions

defs = build_definitions("tests.orchestration.pipelines")
"""Its resources read ``LOWMARK_DATA_ROOT`` when a run uses them."""

LAUNCH_BACKFILL = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""
"""The mutation the UI's *Launch backfill* sends for an asset's partitions."""


def backfill_params(key: dg.AssetKey, partitions: list[str]) -> dict[str, Any]:
    """``LAUNCH_BACKFILL``'s variables for ``partitions`` of the asset ``key``, as the UI's."""
    params = {
        "assetSelection": [{"path": list(key.path)}],
        "partitionNames": partitions,
        "fromFailure": False,
        "tags": [],
    }
    return {"backfillParams": params}


def partition_range(run: dg.DagsterRun) -> tuple[str, str]:
    """The first and last partition a backfill's run backfilled (its range tags)."""
    return run.tags["dagster/asset_partition_range_start"], run.tags[
        "dagster/asset_partition_range_end"
    ]


@contextmanager
def in_process_workspace() -> Iterator[WorkspaceProcessContext]:
    """This module's ``defs`` as the one code location of a workspace over a temporary
    instance (files in a temporary ``DAGSTER_HOME``, as the daemon needs) whose runs are
    not queued but run in this process, each as it is submitted."""
    overrides = {
        "run_coordinator": {
            "module": "dagster._core.run_coordinator",
            "class": "DefaultRunCoordinator",
        },
        "run_launcher": {
            "module": "dagster._core.launcher.sync_in_memory_run_launcher",
            "class": "SyncInMemoryRunLauncher",
        },
    }
    origin = InProcessCodeLocationOrigin(
        # The project folder: the runs' step processes import this module from there.
        LoadableTargetOrigin(
            module_name=__name__,
            attribute="defs",
            working_directory=str(Path(__file__).resolve().parents[2]),
        ),
        location_name="lowmark",
    )
    with (
        instance_for_test(overrides=overrides) as instance,
        WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as context,
    ):
        yield context
