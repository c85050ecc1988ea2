"""Seeded random crash schedules over every batch, in process.

Each schedule crashes a pipeline again and again at random steps of random
batches (replays crash too), restarting a new runner after each crash, then
runs to completion and compares every table with the fault-free run. The
crashes are ``lowmark.batches.loop.faults.crash_at`` exceptions, not kills, so they
are cheap; the kill matrix proves the same recovery under SIGKILL and
`make soak` runs random schedules of real kills.
"""

from __future__ import annotations

import random

import pytest
from pyspark.sql import SparkSession

from tests.faults.conftest import MATRIX, References
from tests.faults.harness import (
    differences,
    in_process_crash,
    random_schedule,
    run_with_crashes,
    snapshot,
)

CRASHES = 16
"""Per pipeline: 16 crash-and-recover cases over tumbling windows in `make test`, 128 more
over the other pipelines of MATRIX in `make test-integration`."""
IN_MAKE_TEST = "tumbling_two_partitions"


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(p.name, marks=[] if p.name == IN_MAKE_TEST else [pytest.mark.integration])
        for p in MATRIX
    ],
)
def test_seeded_random_crashes_at_any_step_of_any_batch_change_no_table(
    spark: SparkSession, references: References, name: str
) -> None:
    ref = references[name]
    schedule = random_schedule(random.Random(f"lowmark-{name}"), ref.batches, CRASHES)
    root = ref.folder / "random"

    crashes = run_with_crashes(
        spark, ref.pipeline, root, schedule, in_process_crash(spark, ref.pipeline)
    )

    assert crashes == CRASHES, f"only {crashes} of {schedule} were reached"
    assert differences(ref.tables, snapshot(ref.pipeline, root)) == []
