"""Metrics in the Prometheus text format: scraped from the endpoint and read from the
textfile while batches run in process, compared with the checkpoint's progress table."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import prometheus_client
import pytest
from pyspark.sql import SparkSession

from lowmark.batches.demo import write_sample_files
from lowmark.batches.loop.metrics import exported_metrics, textfile_path
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.windows import Tumbling
from tests.helpers import FakeClock, drop_batches, event, lowmark, samples, value, windowed


def test_the_endpoint_and_the_textfile_give_the_numbers_the_progress_table_has(
    spark: SparkSession, data_root: Path, clock: FakeClock, tmp_path: Path
) -> None:
    bad_amount = event("x", 34, 0) | {"amount": "many"}
    drop_batches(
        data_root,
        [
            [event("a", 1, 10), event("b", 2, 20)],
            # ... and a bad record: its amount is no number.
            [event("a", 31, 1), event("b", 32, 2), event("c", 33, 3), bad_amount],
            [event("a", 3, 5), event("c", 41, 4)],  # a's is late: [0, 10) closed at 31 s
            [event("b", 51, 6)],  # left waiting: three batches run
        ],
    )
    waiting_bytes = (data_root / "in" / "b003.json").stat().st_size
    textfile_dir = tmp_path / "textfiles"
    runner = MicroBatchRunner(spark, windowed(Tumbling(size="10 seconds")), data_root, clock)
    inodes = []
    with runner, exported_metrics(runner, 0, "127.0.0.1", textfile_dir) as port:
        textfile = textfile_path(textfile_dir, "w")
        for _ in range(3):
            assert runner.run_batch() is not None
            inodes.append(textfile.stat().st_ino)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            scraped = answer.read().decode()
        written = textfile.read_text()

    progress = runner.checkpoint.progress.get_range()
    last = progress[-1]
    commit = runner.checkpoint.commits.get_latest()
    assert commit is not None and [p.batch_id for p in progress] == [0, 1, 2]
    assert sum(p.rows_bad for p in progress) == 1 and sum(p.rows_late for p in progress) == 1
    found = samples(scraped, "w")
    # The file is the registry the endpoint serves, replaced whole after each batch
    # (a new file renamed over the old one: a new inode every time), no temporary left.
    assert samples(written, "w") == found
    assert len(set(inodes)) == 3 and [p.name for p in textfile_dir.iterdir()] == ["lowmark_w.prom"]

    assert value(found, "lowmark_batches_committed_total") == 3
    assert value(found, "lowmark_batches_replayed_total") == 0
    for kind, column in (("in", "rows_in"), ("out", "rows_out"), ("bad", "rows_bad")):
        total = sum(getattr(p, column) for p in progress)
        assert value(found, "lowmark_batch_rows_total", kind=kind) == total, kind
        assert value(found, "lowmark_last_batch_rows", kind=kind) == getattr(last, column)
    assert value(found, "lowmark_batch_rows_total", kind="late") == 1
    for kind in ("data", "operational", "transient"):
        assert value(found, "lowmark_batch_failures_total", kind=kind) == 0
    steps = {step for p in progress for step in p.durations_ms}
    assert {"plan", "read", "sink", "commit", "total"} <= steps
    for step in steps:
        took = [p.durations_ms[step] / 1000 for p in progress if step in p.durations_ms]
        assert value(found, "lowmark_batch_duration_seconds_count", step=step) == len(took)
        assert value(found, "lowmark_batch_duration_seconds_sum", step=step) == pytest.approx(
            sum(took)
        )
    assert value(found, "lowmark_last_batch_id") == 2
    assert value(found, "lowmark_last_commit_timestamp_seconds") == clock.now / 1000
    assert commit.next_watermark_ms is not None and last.lag_ms is not None
    assert value(found, "lowmark_watermark_timestamp_seconds") == commit.next_watermark_ms / 1000
    assert value(found, "lowmark_event_time_lag_seconds") == last.lag_ms / 1000
    assert value(found, "lowmark_source_backlog", unit="files") == 1
    assert value(found, "lowmark_source_backlog", unit="bytes") == waiting_bytes
    assert value(found, "lowmark_batch_in_progress") == 0
    # A registry of the runner's own: nothing lands in the process-wide default one.
    default = prometheus_client.REGISTRY
    assert default.get_sample_value("lowmark_batches_committed_total", {"pipeline": "w"}) is None


def test_lowmark_run_writes_the_metrics_textfile_into_the_folder_given(
    capsys: pytest.CaptureFixture[str], data_root: Path, tmp_path: Path
) -> None:
    write_sample_files(data_root, files=1, rows_per_file=5)
    folder = tmp_path / "prom"
    textfile = ("--metrics-textfile-dir", str(folder))
    code, _, err = lowmark(capsys, data_root, "run", "orders", "--max-batches", "1", *textfile)
    assert code == 0, err
    found = samples(textfile_path(folder, "orders").read_text(), "orders")
    assert value(found, "lowmark_batches_committed_total") == 1
    assert value(found, "lowmark_last_batch_id") == 0
