"""A failing batch's first contact: `lowmark run` as a real process prints one short
paragraph naming the batch, its input and the fix; the details are in the log file, and
`--verbose` prints them. One Ctrl-C lets the batch commit and says so; twice is as short, and
loses nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.registry import get_pipeline
from lowmark.state.checkpoint import Checkpoint
from tests.faults.harness import LOWMARK, lowmark_env
from tests.helpers import FIRST_CONTACT_YAML, sink_ids

pytestmark = pytest.mark.slow

SHORT = 8
"""Lines a failure may print: a paragraph, not a log."""


def log_file(root: Path) -> Path:
    """Where the README says the CLI's details go."""
    return root / "_lowmark/_logs/lowmark.log"


def _root(tmp_path: Path, records: list[dict[str, object]]) -> Path:
    """A data root with the pipelines and one input file of ``records``."""
    root = tmp_path / "data"
    (root / "in").mkdir(parents=True)
    (root / "in/f000.json").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "pipelines.yaml").write_text(FIRST_CONTACT_YAML)
    return root


def _args(root: Path) -> list[str]:
    return [LOWMARK, "--pipelines", str(root.parent / "pipelines.yaml"), "--data-root", str(root)]


def _run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_args(root), *args], capture_output=True, text=True, env=lowmark_env(), timeout=600
    )


def _assert_short(stderr: str) -> None:
    lines = stderr.strip().splitlines()
    assert 0 < len(lines) <= SHORT, stderr[:5000]
    assert max(len(line) for line in lines) < 1000, "a log line, not a message"
    for noise in ("Traceback", "py4j", " ERROR ", "WARNING: Using incubator"):
        assert noise not in stderr, stderr[:5000]


@pytest.mark.integration
def test_a_record_that_breaks_the_transform_prints_the_batch_its_input_and_what_to_do(
    tmp_path: Path,
) -> None:
    root = _root(tmp_path, [{"id": 1, "ts": "2026-01-01T00:00:00Z"}, {"id": 2, "ts": "garbage"}])
    first = _run(root, "run", "times")
    assert first.returncode == 2
    _assert_short(first.stderr)
    for said in (
        "batch 0 of times",
        "f000.json",
        "CAST_INVALID_INPUT",
        "'garbage'",
        "attempt 1 of 3",
        "`lowmark run times` replays the batch",
        "lowmark skip-batch times 0",
        str(log_file(root)),
    ):
        assert said in first.stderr, said
    # The details are in the log file: Spark's executor log and the Python traceback.
    logged = log_file(root).read_text()
    assert "Aborting task" in logged and "Traceback" in logged
    assert "SparkDateTimeException" in logged
    # --verbose prints them as well (and this is the second attempt).
    verbose = _run(root, "--verbose", "run", "times")
    assert verbose.returncode == 2
    assert "attempt 2 of 3" in verbose.stderr
    assert "Traceback" in verbose.stderr and "CAST_INVALID_INPUT" in verbose.stderr


def test_a_sink_path_that_is_a_file_says_so_in_one_line_before_spark_starts(
    tmp_path: Path,
) -> None:
    root = _root(tmp_path, [{"id": 1, "ts": "x"}])
    (root / "a_file").write_text("not a table\n")
    done = _run(root, "run", "into_a_file")
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: sink {root / 'a_file'} of into_a_file is a file")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "point the pipeline's sink path at a folder" in done.stderr
    assert (root / "a_file").read_text() == "not a table\n"


@pytest.mark.integration
def test_a_string_event_time_column_prints_a_short_paragraph_not_a_log_line(
    tmp_path: Path,
) -> None:
    root = _root(tmp_path, [{"id": 1, "ts": "2026-01-01T00:00:00Z"}])
    done = _run(root, "run", "string_time")
    assert done.returncode == 2
    _assert_short(done.stderr)
    assert "batch 0 of string_time" in done.stderr
    assert '"ts" has the type "STRING"' in done.stderr
    # PySpark's JSON error blob went to the log file.
    assert '"logger": "DataFrameQueryContextLogger"' in log_file(root).read_text()


def _slow_run_in_batch_0(root: Path, *options: str) -> subprocess.Popen[str]:
    """`lowmark run slow` (with ``options``) started, once batch 0 is in its offset log (its
    data work then starts)."""
    process = subprocess.Popen(
        [*_args(root), "run", "slow", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=lowmark_env(),
    )
    location = str(root / "_lowmark/slow")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        if Checkpoint.exists(location) and Checkpoint(location, "slow").offsets.get_latest():
            return process
        time.sleep(0.5)
    raise AssertionError("batch 0 never started")


@pytest.mark.integration
def test_one_ctrl_c_lets_the_batch_in_progress_commit_and_says_so(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = _root(tmp_path, [{"id": i, "ts": "x"} for i in range(4)])
    process = _slow_run_in_batch_0(root, "--until-caught-up")
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[:5000]
    assert stderr.strip() == (
        "stopping after batch 0 commits (Ctrl-C again to cancel it; it is replayed on the next run)"
    )
    said = stdout.splitlines()
    assert said[0].startswith("batch 0 committed: 4 rows in, 4 out"), stdout
    assert said[1:] == ["slow: stopped by SIGINT after 1 batch"], stdout
    assert sink_ids(spark, root) == list(range(4))


@pytest.mark.integration
def test_ctrl_c_twice_prints_one_line_and_the_next_run_loses_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = _root(tmp_path, [{"id": i, "ts": "x"} for i in range(20)])
    process = _slow_run_in_batch_0(root)
    time.sleep(3)  # into the batch's Spark job (ten seconds of records)
    process.send_signal(signal.SIGINT)
    time.sleep(1)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2, stderr[:5000]
    _assert_short(stderr)
    assert "batch 0 of slow was interrupted before it committed" in stderr
    assert "`lowmark run slow` replays it" in stderr
    # Nothing lost, nothing twice: the next run replays batch 0 and it holds every record;
    # the interrupt was no failed attempt.
    pipeline = get_pipeline("slow", str(tmp_path / "pipelines.yaml"))
    runner = MicroBatchRunner(spark, pipeline, root)
    assert [(r.batch_id, r.replay) for r in runner.run(max_batches=None)] == [(0, True)]
    assert sink_ids(spark, root) == list(range(20))
    assert runner.checkpoint.failures.of(0) == []
