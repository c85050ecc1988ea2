"""The `lowmark` command line, in process (sharing the test SparkSession) and as a real process."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from batches.demo import INCOMING, orders, user_revenue, write_sample_files
from batches.microbatch import MicroBatchRunner
from orchestration.cli import main

REPO = Path(__file__).resolve().parents[2]
LOWMARK = str(Path(sys.executable).parent / "lowmark")


def lowmark(capsys: pytest.CaptureFixture[str], root: Path, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["--data-root", str(root), *args])
    captured = capsys.readouterr()
    return int(exit_info.value.code or 0), captured.out, captured.err


ALL_FILES = slice(None)


def expected_demo_orders(root: Path, files: slice = ALL_FILES) -> int:
    """Valid demo rows with a positive quantity, counted straight from the files."""
    count = 0
    for path in sorted((root / INCOMING).iterdir())[files]:
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                count += json.loads(line)["quantity"] > 0
    return count


def test_list_shows_the_demo_pipeline(capsys: pytest.CaptureFixture[str], data_root: Path) -> None:
    code, out, _ = lowmark(capsys, data_root, "list")
    assert code == 0 and "orders" in out and "demo/incoming" in out


def test_run_status_and_history_report_the_same_committed_batches(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_root: Path
) -> None:
    write_sample_files(data_root, files=3, rows_per_file=10)
    code, out, _ = lowmark(capsys, data_root, "run", "orders")
    assert code == 0 and "batch 0 committed" in out and "batch 1" not in out

    code, out, _ = lowmark(capsys, data_root, "status", "orders", "--json")
    status = json.loads(out)
    assert status["last_committed_batch"] == 0 and status["pending_batch"] is None
    assert status["end_offsets"] == {"0": 2}
    assert status["backlog"]["files"] == 1

    code, out, _ = lowmark(capsys, data_root, "run", "orders", "--until-caught-up")
    assert "batch 1 committed" in out
    code, out, _ = lowmark(capsys, data_root, "run", "orders", "--until-caught-up")
    assert "caught up, no new data" in out

    code, out, _ = lowmark(capsys, data_root, "status", "orders", "--json")
    status = json.loads(out)
    assert status["last_committed_batch"] == 1 and status["backlog"] == {"files": 0, "bytes": 0}
    assert status["totals"]["rows_bad"] == 2 and status["totals"]["rows_in"] == 32

    code, out, _ = lowmark(capsys, data_root, "history", "orders", "--json")
    history = json.loads(out)
    assert [h["batch_id"] for h in history] == [0, 1]
    assert sum(h["rows_out"] for h in history) == expected_demo_orders(data_root)
    code, out, _ = lowmark(capsys, data_root, "history", "orders")
    assert code == 0 and "rows in" in out


def test_status_of_a_pipeline_that_never_ran_shows_its_backlog(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_root: Path
) -> None:
    write_sample_files(data_root, files=2, rows_per_file=5)
    _, out, _ = lowmark(capsys, data_root, "status", "orders", "--json")
    status = json.loads(out)
    assert status["checkpoint_exists"] is False and status["backlog"]["files"] == 2
    assert not (data_root / "_lowmark").exists()


def test_status_of_a_windowed_pipeline_reads_its_checkpoint_without_starting_spark(
    spark: SparkSession, data_root: Path
) -> None:
    write_sample_files(data_root, files=3, rows_per_file=5)
    MicroBatchRunner(spark, user_revenue, data_root).run(max_batches=1)
    # No Delta jars: a `lowmark` that tried to start Spark would stop with JarsMissing.
    command = str(Path(sys.executable).parent / "lowmark")
    proc = subprocess.run(
        [command, "--data-root", str(data_root), "status", "user_revenue", "--json"],
        env={**os.environ, "LOWMARK_JARS_DIR": str(data_root / "no-jars")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert status["last_committed_batch"] == 0
    assert status["next_batch"]["batch_id"] == 1 and status["backlog"]["files"] == 1


def test_demo_writes_samples_runs_both_pipelines_and_prints_the_sinks(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_root: Path
) -> None:
    code, out, _ = lowmark(capsys, data_root, "demo")
    assert code == 0
    assert f"{expected_demo_orders(data_root)} rows; 2 bad records, 0 late records" in out
    # The straggler (last file) is ten minutes behind a watermark that allows
    # 30 s of disorder and 1 minute of lateness: every order in it is late.
    straggler = expected_demo_orders(data_root, slice(-1, None))
    assert f"2 bad records, {straggler} late records" in out
    windows = spark.read.format("delta").load(str(data_root / "demo/user_revenue"))
    on_time = expected_demo_orders(data_root, slice(0, -1))
    assert 0 < windows.agg({"orders": "sum"}).first()[0] <= on_time  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "nope"], "error: no pipeline 'nope'"),
        (
            ["--pipelines", "missing.yaml", "list"],
            "error: pipeline file missing.yaml does not exist",
        ),
        (["--pipelines", "no_such_module_xyz", "list"], "error: cannot import pipelines"),
    ],
)
def test_user_errors_are_one_line_without_a_stack_trace(
    tmp_path: Path, args: list[str], message: str
) -> None:
    proc = subprocess.run(
        [LOWMARK, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(message)
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_help_explains_every_command() -> None:
    proc = subprocess.run([LOWMARK, "--help"], capture_output=True, text=True, timeout=120)
    for command in ("list", "run", "status", "history", "demo"):
        assert command in proc.stdout


def test_compact_keeps_the_latest_log_entries_and_merges_small_files(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_root: Path
) -> None:
    code, out, _ = lowmark(capsys, data_root, "compact", "orders")
    assert code == 0 and "nothing to compact" in out
    write_sample_files(data_root, files=3, rows_per_file=10)
    one_file = orders.source.model_copy(update={"max_files_per_batch": 1})
    runner = MicroBatchRunner(spark, orders.model_copy(update={"source": one_file}), data_root)
    assert len(runner.run(max_batches=None)) == 3
    offsets = runner.checkpoint.offsets.table
    assert offsets.files() == 3

    code, out, _ = lowmark(capsys, data_root, "compact", "orders")
    assert code == 0 and "compacted" in out
    assert offsets.files() == 1
    assert sorted(offsets.read().column("batch_id").to_pylist()) == [0, 1, 2]  # within 100
    code, out, _ = lowmark(capsys, data_root, "status", "orders", "--json")
    assert json.loads(out)["last_committed_batch"] == 2
