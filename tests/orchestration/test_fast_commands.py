"""The commands that only read (``--help``, ``list``, ``show``, ``sql``) import neither
Dagster nor PySpark: importing them costs seconds, the commands' own work milliseconds. Nor
pandas (0.7 s; pyarrow imports it when asked whether something is a DataFrame) or
prometheus_client (0.1 s). And ``show`` and ``sql`` of a pipeline that has run (its tables
in the data root's catalog) import neither the pipeline definitions nor pydantic nor
pyarrow (0.6 s together).

One Python subprocess (the suite's own process has them all imported) runs the console
entry point the ``lowmark`` script runs, for each command in turn, then names what it
imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from lowmark.state import catalog
from lowmark.state.catalog import CatalogEntry

RUN_COMMANDS = """
import json, sys
from lowmark.orchestration.cli import main

for argv in json.loads(sys.argv[1]):
    try:
        main(argv)
    except SystemExit as exc:
        assert not exc.code, (argv, exc.code)
heavy = {"dagster", "pyspark", "pandas", "prometheus_client", "pydantic", "pyarrow"}
imported = {m.split(".")[0] for m in sys.modules} & heavy
imported |= {"lowmark.batches.pipeline"} & sys.modules.keys()
print(json.dumps(sorted(imported)))
"""


def run_commands(commands: list[list[str]], folder: Path) -> list[str]:
    """Run ``commands`` in one new Python process in ``folder``: its output's lines, the
    last naming which of those packages it imported."""
    done = subprocess.run(
        [sys.executable, "-c", RUN_COMMANDS, json.dumps(commands)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_help_list_show_and_sql_import_neither_dagster_nor_pyspark_nor_pandas(
    tmp_path: Path,
) -> None:
    # The demo's `orders` pipeline with a sink of two rows (written with delta-rs).
    orders = pa.table({"order_id": ["o1", "o2"], "quantity": [1, 2]})
    write_deltalake(str(tmp_path / "demo" / "orders"), orders)
    root = ["--data-root", str(tmp_path)]
    commands = [
        [*root, "--help"],
        [*root, "list"],
        [*root, "show", "orders", "--json"],
        [*root, "sql", "SELECT count(*) AS n FROM orders.sink"],
    ]
    shown = run_commands(commands, tmp_path)
    rows = [json.loads(line) for line in shown if line.startswith('{"order_id"')]
    assert sorted(r["order_id"] for r in rows) == ["o1", "o2"]  # `show` did its work
    assert not {"dagster", "pyspark", "pandas", "prometheus_client"} & set(json.loads(shown[-1]))


def test_show_and_sql_of_a_pipeline_that_has_run_load_no_definitions_nor_pyarrow(
    tmp_path: Path,
) -> None:
    write_deltalake(str(tmp_path / "sink"), pa.table({"order_id": ["o1", "o2"]}))
    ran = CatalogEntry(
        "orders", str(tmp_path / "checkpoint"), str(tmp_path / "sink"), "", None, None
    )
    catalog.remember(tmp_path, ran)  # as its run records it (tests/batches/cli/test_look.py)
    root = ["--data-root", str(tmp_path), "--pipelines", "no.such.module"]
    commands = [
        [*root, "show", "orders", "--json"],
        [*root, "sql", "SELECT count(*) AS n FROM orders.sink"],
    ]
    shown = run_commands(commands, tmp_path)
    rows = [json.loads(line) for line in shown if line.startswith('{"order_id"')]
    assert sorted(r["order_id"] for r in rows) == ["o1", "o2"]  # `show` did its work
    assert shown[-2].strip() == "2"  # and `sql` its
    assert json.loads(shown[-1]) == [], f"imported {shown[-1]}"


def test_the_check_sees_an_import_of_pyspark(tmp_path: Path) -> None:
    """The subprocess's report is not blind: a pipelines module that imports PySpark at its
    top brings it in for a command that loads the definitions (``list``)."""
    module = tmp_path / "spark_at_top.py"
    module.write_text(
        "from pyspark.sql import functions as F  # noqa: F401\n"
        "from lowmark.batches.demo import orders  # noqa: F401\n"
    )
    commands = [["--data-root", str(tmp_path), "--pipelines", str(module), "list"]]
    assert "pyspark" in json.loads(run_commands(commands, tmp_path)[-1])
