"""The `lowmark` command line, in process (sharing the test SparkSession) and as a real process."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from lowmark.batches.cli import commands
from lowmark.batches.cli.display import duration, moment
from lowmark.batches.demo import INCOMING, orders, user_revenue, write_sample_files
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.state.checkpoint import Checkpoint
from tests.helpers import FakeClock, delta_frame, lowmark

REPO = Path(__file__).resolve().parents[3]
LOWMARK = str(Path(sys.executable).parent / "lowmark")


ALL_FILES = slice(None)


def kept_orders(path: Path) -> list[dict[str, Any]]:
    """The orders of demo file ``path`` its transform keeps (valid JSON, a positive
    quantity), read straight from the file."""
    kept = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            order = json.loads(line)
            if order["quantity"] > 0:
                kept.append(order)
    return kept


def malformed_lines(path: Path) -> int:
    """Lines of ``path`` that are not JSON, counted straight from the file."""
    count = 0
    for line in path.read_text().splitlines():
        try:
            json.loads(line)
        except json.JSONDecodeError:
            count += 1
    return count


def expected_demo_orders(root: Path, files: slice = ALL_FILES) -> int:
    """Valid demo rows with a positive quantity, counted straight from the files."""
    return sum(len(kept_orders(path)) for path in sorted((root / INCOMING).iterdir())[files])


def test_list_shows_the_demo_pipeline(capsys: pytest.CaptureFixture[str], data_root: Path) -> None:
    code, out, _ = lowmark(capsys, data_root, "list")
    assert code == 0 and "orders" in out and "demo/incoming" in out
    code, out, _ = lowmark(capsys, data_root, "list", "--json")
    listed = {p["name"]: p for p in json.loads(out)}
    assert listed["orders"]["description"] == orders.description
    assert listed["user_revenue"]["sink"] == {
        "kind": "delta",
        "path": "demo/user_revenue",
        "mode": "append",
    }


DEMO_ROWS = [
    (p.name, f"files:{INCOMING}", f"delta:{p.sink.label}", p.description)
    for p in (orders, user_revenue)
]
"""What `lowmark list` must show of each demo pipeline, every cell whole."""


def in_terminal(tmp_path: Path, columns: int, *args: str) -> str:
    """What ``lowmark args`` prints to a real terminal (a pseudo-terminal) ``columns`` wide,
    its colours and carriage returns taken out."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    proc = subprocess.Popen(
        [LOWMARK, *args],
        stdin=follower,
        stdout=follower,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        env=env | {"TERM": "xterm-256color"},
    )
    os.close(follower)
    chunks = []
    with contextlib.suppress(OSError):  # EIO once the process has closed the terminal
        while chunk := os.read(leader, 65536):
            chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=120) == 0
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def test_list_in_a_pipe_is_one_aligned_line_per_pipeline_with_nothing_cut(tmp_path: Path) -> None:
    proc = subprocess.run(
        [LOWMARK, "list"], capture_output=True, text=True, cwd=tmp_path, timeout=120, check=True
    )
    header, *lines = proc.stdout.splitlines()
    assert header.split() == ["pipeline", "source", "sink", "description"]
    starts = [header.index(name) for name in ("source", "sink", "description")]
    assert len(lines) == len(DEMO_ROWS)
    for line, row in zip(lines, DEMO_ROWS, strict=True):
        assert [
            line[a:b].strip() for a, b in zip([0, *starts], [*starts, None], strict=True)
        ] == list(row)


def test_list_in_an_80_column_terminal_shows_each_pipeline_as_a_block_with_nothing_cut(
    tmp_path: Path,
) -> None:
    blocks = in_terminal(tmp_path, 80, "list").strip().split("\n\n")
    assert len(blocks) == len(DEMO_ROWS)
    for block, (name, source, sink, description) in zip(blocks, DEMO_ROWS, strict=True):
        assert [line.split(maxsplit=1) for line in block.splitlines()] == [
            [name],
            ["source", source],
            ["sink", sink],
            ["description", description],
        ]


def test_list_in_a_terminal_wide_enough_is_the_aligned_table(tmp_path: Path) -> None:
    wide = in_terminal(tmp_path, 200, "list")
    piped = subprocess.run(
        [LOWMARK, "list"], capture_output=True, text=True, cwd=tmp_path, timeout=120, check=True
    )
    assert wide == piped.stdout


def test_every_command_can_print_json() -> None:
    names = [c.name or c.callback.__name__ for c in commands.app.registered_commands if c.callback]
    assert {"list", "run", "status", "plan", "history", "demo", "ui"} <= set(names)
    for command in names:
        result = CliRunner().invoke(commands.app, [command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0 and "--json" in result.output, command


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

    # --json: one line of JSON per committed batch (the third file: 10 orders, 2 malformed).
    code, out, _ = lowmark(capsys, data_root, "run", "orders", "--until-caught-up", "--json")
    (line,) = out.splitlines()
    batch = json.loads(line)
    assert (batch["batch_id"], batch["rows_in"], batch["rows_bad"]) == (1, 12, 2)
    assert (batch["start"], batch["end"], batch["input"]) == ({"0": 2}, {"0": 3}, "2 → 3 (+1)")
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
    header, *rows = out.splitlines()
    assert header.split() == ["batch", "committed", "rows", "in", "out", "bad", "late", "took"]
    assert [r.split()[0] for r in rows] == ["0", "1"]
    assert all(str(h["rows_in"]) in r for h, r in zip(history, rows, strict=True))

    code, out, _ = lowmark(capsys, data_root, "compact", "orders", "--json")
    compacted = json.loads(out)
    assert compacted["compacted"] is True and compacted["last_committed"] == 1


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


@pytest.mark.integration
def test_demo_writes_samples_runs_both_pipelines_and_prints_the_sinks(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_root: Path
) -> None:
    code, out, err = lowmark(capsys, data_root, "demo")
    assert code == 0, err
    assert f"{expected_demo_orders(data_root)} rows; 2 bad records, 0 late records" in out
    # The straggler (last file) is ten minutes behind a watermark that allows
    # 30 s of disorder and 1 minute of lateness: every order in it is late.
    straggler = expected_demo_orders(data_root, slice(-1, None))
    assert f"2 bad records, {straggler} late records" in out
    windows = delta_frame(spark, str(data_root / "demo/user_revenue"))
    on_time = expected_demo_orders(data_root, slice(0, -1))
    assert 0 < windows.agg({"orders": "sum"}).first()[0] <= on_time  # type: ignore[index]

    # Again, as JSON: the files are there, the pipelines caught up.
    code, out, _ = lowmark(capsys, data_root, "demo", "--json")
    again = json.loads(out)
    assert code == 0 and again["sample_files_written"] == []
    assert [(p["pipeline"], p["batches"], p["rows_bad"]) for p in again["pipelines"]] == [
        ("orders", [], 2),
        ("user_revenue", [], 2),
    ]
    assert again["pipelines"][0]["sink_rows"] == expected_demo_orders(data_root)
    assert again["pipelines"][1]["rows_late"] == straggler
    assert len(again["first_windows"]) == 10


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "nope"], "error: no pipeline 'nope'"),
        (
            ["--pipelines", "missing.yaml", "list"],
            "error: pipeline file missing.yaml does not exist",
        ),
        (["--pipelines", "no_such_module_xyz", "list"], "error: cannot import pipelines"),
        (["run", "orders", "--conf", "spark.sql.shuffle.partitions"], "error: --conf 'spark."),
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


def test_status_accounts_for_every_record_read_by_counts_taken_from_the_files(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_root: Path, clock: FakeClock
) -> None:
    """The demo's six files, two per batch: the third has two malformed lines, the last is
    a straggler whose orders are all late (their windows closed long before it lands)."""
    files = write_sample_files(data_root, now=datetime.fromtimestamp(clock.now_ms() / 1000, UTC))
    lines = [len(f.read_text().splitlines()) for f in files]
    kept = [kept_orders(f) for f in files]
    bad = [malformed_lines(f) for f in files]
    runner = MicroBatchRunner(spark, user_revenue, data_root, clock)
    runner.run(max_batches=3)

    _, out, _ = lowmark(capsys, data_root, "status", "user_revenue", "--json", clock=clock)
    last = json.loads(out)["last_batch"]
    assert last["batch_id"] == 2 and last["input"] == "4 → 6 (+2)"
    assert last["accounting"] == {
        "read": lines[4] + lines[5],
        "bad": 0,
        "dropped_by_transform": lines[4] + lines[5] - len(kept[4]) - len(kept[5]),
        "late": len(kept[5]),
        "into_windows": len(kept[4]),
    }

    runner.run(max_batches=None)  # the watermark moved: a batch closes windows
    clock.advance(90_000)
    _, out, _ = lowmark(capsys, data_root, "status", "user_revenue", "--json", clock=clock)
    status = json.loads(out)
    sink = delta_frame(spark, str(data_root / "demo/user_revenue"))
    in_sink = sink.agg({"orders": "sum"}).first()[0]  # type: ignore[index]
    on_time = sum(len(k) for k in kept[:-1])
    assert status["accounting"] == {
        "read": sum(lines),
        "bad": sum(bad),
        "dropped_by_transform": sum(lines) - sum(bad) - sum(len(k) for k in kept),
        "late": len(kept[-1]),
        "in_closed_windows": in_sink,
        "in_open_windows": on_time - in_sink,
    }
    assert sum(bad) == 2 and 0 < in_sink < on_time
    newest = max(datetime.fromisoformat(o["ts"]) for k in kept for o in k)
    watermark = int((newest - timedelta(seconds=30)).timestamp() * 1000)
    assert status["watermark_ms"] == watermark
    assert status["event_time_lag_ms"] == clock.now_ms() - watermark

    _, out, _ = lowmark(capsys, data_root, "status", "user_revenue", clock=clock)
    shown = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())
    assert shown["watermark"] == moment(watermark, clock.now_ms())
    assert shown["event-time lag"] == duration(clock.now_ms() - watermark)
    assert shown["next batch"] == "none: caught up"
    assert shown["all batches"] == (
        f"read {sum(lines)} = {sum(bad)} bad + {status['accounting']['dropped_by_transform']} "
        f"dropped by the transform + {len(kept[-1])} late + {in_sink} in closed windows (the "
        f"sink) + {on_time - in_sink} in open windows (the state)"
    )
    batch = status["last_batch"]["batch_id"]
    assert shown[f"batch {batch}"].startswith("read 0 = 0 bad")  # it only closed windows


def test_a_run_with_nothing_to_do_starts_no_spark_and_one_with_input_says_why_it_stopped(
    tmp_path: Path,
) -> None:
    # Spark cannot start without Delta's jars: a run that never needs it still answers.
    no_jars = tmp_path / "no_jars"
    no_jars.mkdir()
    env = os.environ | {"LOWMARK_JARS_DIR": str(no_jars)}
    args = [LOWMARK, "run", "orders", "--until-caught-up"]

    (tmp_path / "data" / INCOMING).mkdir(parents=True)  # there, but empty
    idle = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert (idle.returncode, idle.stdout) == (0, "orders: caught up, no new data\n"), idle.stderr

    write_sample_files(tmp_path / "data", now=datetime.now(UTC))
    busy = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert busy.returncode == 2
    assert busy.stderr.startswith(f"error: Spark did not start: no Delta jars in {no_jars}")
    # No fault of the batch: it is left to replay, and not counted against it.
    checkpoint = Checkpoint(orders.checkpoint_location(tmp_path / "data"), orders.name)
    assert checkpoint.offsets.latest_batch_id() == 0
    assert checkpoint.commits.latest_batch_id() is None
    assert checkpoint.failures.of(0) == []
