"""The generated fault matrix (``tests.faults.matrix``): each case kills a run of one
feature into one sink at one step, takes one operator action, runs to the end and
compares every contract table with the end state the action defines.

`make test` runs a covering slice (every feature, sink and action at least once);
`make test-integration` every other case.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.faults.matrix import Case, References, params, run_case

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="session")
def matrix_references(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> References:
    return References(spark, tmp_path_factory.mktemp("matrix_references"))


@pytest.mark.parametrize(("name", "case"), list(params()))
def test_a_killed_run_after_an_operator_action_ends_as_the_action_defines(
    spark: SparkSession,
    matrix_references: References,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
    case: Case,
) -> None:
    for server in case.sink.services:
        request.getfixturevalue(server)  # started, its client variables set
    found = run_case(spark, case, tmp_path, matrix_references, monkeypatch)
    assert not found, "\n".join(found)
