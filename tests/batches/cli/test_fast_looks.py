"""The looks at a pipeline (``status``, ``show``, ``sql``, ``plan``, ``list``) and a run with
nothing to do import neither PySpark nor pandas nor Dagster: importing them costs seconds
(more where no bytecode is cached), the commands' own work a fraction of one. Nor the
clients of sinks the pipelines do not have (psycopg for Postgres, confluent_kafka for
Kafka): a tenth of a second each. The looks that read no checkpoint state (``list``,
``show``, ``sql``) import neither pyarrow nor numpy (with it), which loading the
pipeline definitions does not need. Those that read it (``status``, ``plan``, a run with
nothing to do) read a few rows of each table: they import neither Arrow's compute
functions nor its Parquet module (50-70 ms together), which only a batch's writes (and a
Parquet source's check) use.

Each command runs in a new Python process (the suite's own process has them all imported)
through the console entry point the ``lowmark`` script runs, over the checkpoint of a real
run of the demo's windowed pipeline; the process names the heavy packages it imported at
exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.demo import user_revenue, write_sample_files
from lowmark.batches.loop.microbatch import MicroBatchRunner

HEAVY = ("pyspark", "pandas", "dagster", "psycopg", "confluent_kafka")
ARROW = ("pyarrow", "numpy")
"""What reading a checkpoint's state tables on the driver takes (``status``, ``plan``)."""
ARROW_BEYOND_READING = ("pyarrow.compute", "pyarrow.parquet")
"""What only a batch's writes take: computing over Arrow tables, writing Parquet files."""

RUN_COMMAND = """
import json, sys
from lowmark.orchestration.cli import main

try:
    main(json.loads(sys.argv[1]))
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""

LOOKS = {
    "status": ["status", "user_revenue"],
    "status --json": ["status", "user_revenue", "--json"],
    "show": ["show", "user_revenue"],
    "sql": ["sql", "SELECT count(*) AS n FROM user_revenue.sink"],
    "plan": ["plan", "user_revenue"],
    "list": ["list"],
    "run, caught up": ["run", "user_revenue"],
}


def imported_by(
    argv: list[str], data_root: Path, heavy: tuple[str, ...] = HEAVY
) -> tuple[list[str], str]:
    """Run ``lowmark --data-root DATA_ROOT ARGV`` in a new Python process: which of the
    ``heavy`` packages or modules it imported, and what it printed."""
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}  # no reporting
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN_COMMAND,
            json.dumps(["--data-root", str(data_root), *argv]),
            json.dumps(heavy),
        ],
        cwd=data_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    *printed, imported = done.stdout.splitlines()
    return json.loads(imported), "\n".join(printed)


@pytest.fixture(scope="module")
def caught_up(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root where the demo's ``user_revenue`` ran until caught up."""
    root = tmp_path_factory.mktemp("looks")
    write_sample_files(root)
    MicroBatchRunner(spark, user_revenue, root).run(max_batches=None)
    return root


@pytest.mark.parametrize("look", list(LOOKS))
def test_a_look_at_a_pipeline_that_ran_imports_no_spark_pandas_dagster_or_unused_sink_client(
    caught_up: Path, look: str
) -> None:
    imported, printed = imported_by(LOOKS[look], caught_up)
    assert printed  # the command did its work
    assert imported == [], f"`lowmark {' '.join(LOOKS[look])}` imported {imported}"


@pytest.mark.parametrize("look", ["list", "show", "sql"])
def test_a_look_that_reads_no_state_imports_neither_pyarrow_nor_numpy(
    caught_up: Path, look: str
) -> None:
    imported, printed = imported_by(LOOKS[look], caught_up, ARROW)
    assert printed
    assert imported == [], f"`lowmark {' '.join(LOOKS[look])}` imported {imported}"


@pytest.mark.parametrize("look", ["status", "status --json", "plan", "run, caught up"])
def test_a_look_that_reads_state_imports_neither_arrow_compute_nor_parquet(
    caught_up: Path, look: str
) -> None:
    # A run reads its checkpoint's fence through Arrow's file systems; a look does not.
    heavy = ARROW_BEYOND_READING + (() if look.startswith("run") else ("pyarrow.fs",))
    imported, printed = imported_by(LOOKS[look], caught_up, heavy)
    assert printed
    assert imported == [], f"`lowmark {' '.join(LOOKS[look])}` imported {imported}"


def test_the_check_sees_pyspark_imported_by_a_pipelines_module_that_imports_it(
    caught_up: Path,
) -> None:
    """The subprocess's report is not blind: a pipelines module that imports PySpark at its
    top brings it in for every command (docs/cli.md, "Fast commands")."""
    module = caught_up / "spark_at_top.py"
    module.write_text(
        "from pyspark.sql import functions as F  # noqa: F401\n"
        "from lowmark.batches.demo import user_revenue  # noqa: F401\n"
    )
    imported, _ = imported_by(["--pipelines", str(module), "status", "user_revenue"], caught_up)
    assert "pyspark" in imported
