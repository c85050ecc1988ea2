"""A long history costs what a short one does.

After maintenance, each log a batch or a sensor tick reads (offsets, commits,
watermarks) holds at most ``log_batches`` rows in one data file, and its
``_delta_log`` folder a handful of files, whether the pipeline ran 10 batches
or 10,000; so does the file manifest planning reads, once processed files
leave the folder (here: archived), its retired rows kept in the manifest
history for backfills. The 10,000 are synthetic: the real entries of a few
batches are copied to 10,000 batch ids, each taking one more file that has
since left the folder, in bulk appends plus a few hundred single commits
(each a Delta log file, as a batch writes), and the log files are then aged
past the log retention, as hours of running would.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.loop.maintenance import maintain_checkpoint
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import Maintenance, Pipeline
from lowmark.batches.windows import Tumbling
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.table import DriverTable
from tests.helpers import drop_batches, event, windowed, write_json_lines

MAINTENANCE = Maintenance(every_batches=100, log_batches=20, progress_batches=50)
SINGLE_COMMITS = 150
"""Synthetic batches written one commit each (the rest in bulk)."""
LOG_FILES = 12
"""At most this many files in a maintained table's ``_delta_log``: a checkpoint, its
pointer and the commits since (maintenance's own: delete, compact, vacuum)."""


def _pipeline() -> Pipeline:
    p = windowed(Tumbling(size="10 seconds"))
    source = p.source.model_copy(update={"processed_files": "archive", "archive_dir": "archived"})
    return p.model_copy(update={"maintenance": MAINTENANCE, "source": source})


def _logs(ckpt: Checkpoint) -> dict[str, DriverTable]:
    return {
        "offsets": ckpt.offsets.table,
        "commits": ckpt.commits.table,
        "watermarks": ckpt.watermarks.table,
        "progress": ckpt.progress.table,
    }


def _footprint(ckpt: Checkpoint) -> dict[str, tuple[int, int, int]]:
    """Per log and the file manifest: (rows, data files, files in its ``_delta_log``)."""
    return {
        name: (
            table.read().num_rows,
            table.files(),
            len(os.listdir(Path(table.path, "_delta_log"))),
        )
        for name, table in (_logs(ckpt) | {"manifest": ckpt.files.table}).items()
    }


def _synthesize(ckpt: Checkpoint, batches: int) -> int:
    """Copy the last committed batch's log rows to ``batches`` more batch ids; the last id."""
    done = ckpt.commits.get_latest()
    assert done is not None
    first = done.batch_id + 1
    ids = list(range(first, first + batches))
    bulk, singles = ids[:-SINGLE_COMMITS], ids[-SINGLE_COMMITS:]
    app_ids = {
        "offsets": ckpt.offsets.txn_app_id,
        "commits": ckpt.commits.txn_app_id,
        "watermarks": ckpt.watermarks.txn_app_id,
        "progress": ckpt.progress.txn_app_id,
    }
    taken = ckpt.files.table.read()
    first_seq = max(taken.column("seq").to_pylist()) + 1

    def took(i: int) -> dict[str, object]:
        """Synthetic batch ``i``'s file: the next in the folder, archived since."""
        seq = first_seq + i - first
        path = f"{taken.column('path')[0].as_py().rsplit('/', 1)[0]}/gone-{seq:05d}.json"
        return {"partition": "0", "seq": seq, "path": path, "size": 1, "modified_ms": seq}

    def offsets(i: int) -> dict[str, object]:
        """Synthetic batch ``i``'s offsets: its one file."""
        seq = first_seq + i - first
        return {"start_offsets": f'{{"0": {seq}}}', "end_offsets": f'{{"0": {seq + 1}}}'}

    for name, table in _logs(ckpt).items():
        last = table.read(f'"batch_id" = {done.batch_id}')
        ranged = "end_offsets" in last.column_names

        def rows_for(chunk: list[int], last: pa.Table = last, ranged: bool = ranged) -> pa.Table:
            rows = [
                r | {"batch_id": i} | (offsets(i) if ranged else {})
                for i in chunk
                for r in last.to_pylist()
            ]
            return pa.Table.from_pylist(rows, schema=last.schema)

        assert last.column_names[0] == "batch_id", name
        for start in range(0, len(bulk), 2_500):
            chunk = bulk[start : start + 2_500]
            table.append_once(rows_for(chunk), app_ids[name], chunk[-1])
        for i in singles:
            table.append_once(rows_for([i]), app_ids[name], i)
    files = [took(i) | {"discovered_for_batch": i} for i in ids]
    for start in range(0, len(files), 2_500):
        ckpt.files.table.append(pa.Table.from_pylist(files[start : start + 2_500], taken.schema))
    return ids[-1]


def _age_logs(ckpt: Checkpoint) -> None:
    """Make every log file look hours old (older than the log retention)."""
    hours_ago = time.time() - 6 * 3600
    for log_file in Path(ckpt.location).glob("*/_delta_log/*"):
        os.utime(log_file, (hours_ago, hours_ago))


@pytest.mark.integration
def test_after_10_000_batches_each_log_holds_what_it_held_after_10(
    spark: SparkSession, tmp_path: Path
) -> None:
    footprints = {}
    for history in (10, 10_000):
        root = tmp_path / str(history)
        drop_batches(
            root, [[event("a", 10 * i + 1, i), event("b", 10 * i + 5, i)] for i in range(3)]
        )
        runner = MicroBatchRunner(spark, _pipeline(), root)
        done = runner.run(max_batches=None)
        last = _synthesize(runner.checkpoint, history - len(done))
        _age_logs(runner.checkpoint)
        assert maintain_checkpoint(spark, _pipeline(), root) is not None
        footprints[history] = _footprint(runner.checkpoint)
        # Every file any batch took is still known (a backfill reads them all).
        entry = runner.checkpoint.offsets.get(last)
        assert entry is not None
        assert len(runner.checkpoint.files.files(retired=True)) == entry.end_offsets["0"]
        # A sensor tick after it: where the pipeline stands, nothing to run.
        status = pipeline_status(spark, _pipeline(), root)
        assert status.last_committed_batch == last and status.next_batch is None
        # Then a file lands: the next batch plans, takes it alone, and commits.
        write_json_lines(root / "in", "next.json", [event("a", 10 * history, 1)], 1_800_000_000)
        result = MicroBatchRunner(spark, _pipeline(), root).run_batch()
        assert result is not None and (result.batch_id, result.rows_in) == (last + 1, 1)

    short, long = footprints[10], footprints[10_000]
    assert long["manifest"][0] == short["manifest"][0] == 1  # a partition's last file
    for name in ("offsets", "commits", "watermarks"):
        assert long[name][0] == MAINTENANCE.log_batches * (short[name][0] // 10), (
            name,
            long,
            short,
        )
    assert long["progress"][0] == MAINTENANCE.progress_batches * (short["progress"][0] // 10)
    for name in long:
        for footprint in (short, long):
            _, files, log_files = footprint[name]
            assert files <= 1 and log_files <= LOG_FILES, (name, short, long)
