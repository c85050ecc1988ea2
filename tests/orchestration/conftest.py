"""Fixtures for the Dagster tests: definitions of the test pipelines, resources, an instance."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from lowmark.orchestration.definitions import build_definitions
from lowmark.orchestration.resources import LowmarkResource, SparkResource

PIPELINES = "tests.orchestration.pipelines"


@pytest.fixture(scope="session")
def defs() -> dg.Definitions:
    return build_definitions(PIPELINES)


@pytest.fixture
def resources(spark: Any, data_root: Path) -> dict[str, Any]:
    """The definitions' resources pointed at this test's data root (sharing the test session)."""
    return {"spark": SparkResource(), "lowmark": LowmarkResource(data_root=str(data_root))}


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst
