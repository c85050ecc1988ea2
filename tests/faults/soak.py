"""`make soak`: seeded random crash schedules with real kills, far more than `make test` runs.

Each schedule draws a pipeline of ``tests.faults.scenarios``, a random input
and a few kill points, runs the input fault-free in this process for
reference, then drives `lowmark run --until-caught-up` subprocesses that are
SIGKILLed at each kill point in turn, finishes in this process and compares
every table with the reference. A case is one kill and the recovery from
it. Prints one line per schedule and finally ``cases: N, differences: D``;
exits 1 if D > 0.

    python -m tests.faults.soak --schedules 40 --seed 7
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
from pathlib import Path

from lowmark.state.session import SparkSettings, get_spark
from tests.faults.harness import (
    differences,
    random_schedule,
    run_to_completion,
    run_with_crashes,
    snapshot,
    subprocess_crash,
)
from tests.faults.scenarios import FOLDER_PIPELINES, PIPELINES, random_input, write_input


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Random crash schedules with real kills.")
    parser.add_argument("--schedules", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--files", type=int, default=5, help="input files per schedule")
    parser.add_argument("--kills", type=int, default=3, help="kill points per schedule")
    args = parser.parse_args(argv)

    spark = get_spark(SparkSettings(master="local[2]", confs={"spark.sql.shuffle.partitions": "2"}))
    cases = found = 0
    for n in range(args.schedules):
        rng = random.Random(f"soak-{args.seed}-{n}")
        pipeline = PIPELINES[rng.choice(sorted(FOLDER_PIPELINES))]
        folder = Path(tempfile.mkdtemp(prefix=f"lowmark-soak-{n}-"))
        try:
            write_input(folder / "input", random_input(rng, args.files), pipeline)
            batches = len(run_to_completion(spark, pipeline, folder / "reference"))
            schedule = random_schedule(rng, batches, args.kills)
            crashes = run_with_crashes(
                spark, pipeline, folder / "run", schedule, subprocess_crash(pipeline)
            )
            diff = differences(
                snapshot(pipeline, folder / "reference"),
                snapshot(pipeline, folder / "run"),
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        cases += crashes
        found += len(diff)
        kills = ", ".join(str(p) for p in schedule)
        print(
            f"schedule {n}: {pipeline.name}, {batches} batches, kills at {kills}: "
            f"{crashes} killed, {len(diff)} differences",
            flush=True,
        )
        for line in diff:
            print(f"  {line}", flush=True)
    print(f"cases: {cases}, differences: {found}", flush=True)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
