"""Bad state: a checkpoint table that is missing or unreadable stops the pipeline with
an error naming it, never a silent restart from zero."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.cli.commands import main
from tests.faults.conftest import Reference, References
from tests.faults.harness import run_to_completion

REFERENCE = "tumbling_two_partitions"
"""The pipeline whose fault-free run these tests start from."""


def damaged_copy(ref: Reference, name: str) -> Path:
    """A copy of the template (3 committed batches, windows open) to damage."""
    root = ref.folder / f"damaged_{name}"
    shutil.copytree(ref.folder / "template", root)
    return root


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("offsets", r"offsets is missing"),
        ("commits", r"commits is missing"),
        ("checkpoint", r"checkpoint is missing but .*offsets holds batches"),
        ("files", r"file manifest .*files is missing: restore it"),
        ("watermarks", r"checkpoint table .*watermarks is missing: restore it"),
        ("state_windows", r"state_windows is missing, but commit 2 wrote it"),
    ],
)
def test_a_missing_checkpoint_table_is_an_error_naming_it(
    spark: SparkSession, references: References, table: str, message: str
) -> None:
    ref = references[REFERENCE]
    root = damaged_copy(ref, table)
    shutil.rmtree(Path(ref.pipeline.checkpoint_location(root)) / table)
    with pytest.raises(Exception, match=message) as error:
        run_to_completion(spark, ref.pipeline, root)
    assert type(error.value).__name__ == "CheckpointMissing"


def test_an_unreadable_commit_log_is_one_line_naming_it(
    spark: SparkSession, references: References, capsys: pytest.CaptureFixture[str]
) -> None:
    ref = references[REFERENCE]
    root = damaged_copy(ref, "commit_json")
    log = Path(ref.pipeline.checkpoint_location(root)) / "commits" / "_delta_log"
    max(log.glob("*.json")).write_text("not a delta log entry\n")

    with pytest.raises(SystemExit) as exit_info:
        args = ["--pipelines", "tests.faults.scenarios", "--data-root", str(root)]
        main([*args, "run", ref.pipeline.name])

    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: checkpoint table ") and "commits cannot be read" in err
    assert "restore it from backup" in err and len(err.strip().splitlines()) == 1
