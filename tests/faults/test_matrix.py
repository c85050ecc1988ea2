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

from lowmark.batches.loop.parts import build_parts
from lowmark.batches.loop.steps import STEPS
from tests.faults.matrix import FEATURES, SINKS, Case, References, params, run_case

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


def test_every_registered_stateful_step_is_a_feature_of_the_matrix_and_writes_what_it_declares(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The matrix covers a new stateful step with no case written for it only if one of its
    features builds that step; and maintenance, reset and skip-batch find a step's tables by
    the folders, roles and bases it declares, so its handles must be exactly those."""
    built: set[str] = set()
    for feature in FEATURES:
        root = tmp_path / feature.name
        pipeline = SINKS[0].attach(feature.pipeline, feature, root)
        work = build_parts(spark, pipeline, root).work
        for kind, step in work.steps.built.items():
            built.add(type(kind).__name__)
            declared = {(s.folder, s.role, s.base) for s in kind.tables}
            handles = {
                (t.table.path.rsplit("/", 1)[-1], t.role, t.base) for t in kind.contracts(step)
            }
            assert handles == declared, type(kind).__name__
    assert built == {type(kind).__name__ for kind in STEPS}
