"""Build ``upgrade_checkpoints.tar.gz``: checkpoints and sinks an older lowmark left behind.

Run it with an OLDER lowmark first on the path (tests/data/README.md names the commit):

    git -C /work/main worktree add --detach /tmp/lowmark-old <commit>
    cd /tmp/lowmark-old && ln -s /work/main/.venv .venv && ln -s /work/main/jvm/lib jvm/lib
    PYTHONPATH=/tmp/lowmark-old .venv/bin/python \\
        <this checkout>/tests/data/make_upgrade_checkpoints.py <out.tar.gz>

Under one data root (``ROOT``) it leaves two pipelines (``PIPELINES``) over the same four
files ``in/b000..b003.json`` (one file a batch), each with batches 0 and 1 committed and batch
2 planned (its offsets written) but never run. It imports only lowmark and the older commit's
``tests.helpers``; ``tests/state/test_upgrade.py`` imports ``ROOT`` and ``PIPELINES`` from it,
so the pipelines it continues are these.
"""

from __future__ import annotations

import shutil
import sys
import tarfile
from pathlib import Path

import pytest

from lowmark.batches.loop import faults
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, Pipeline
from lowmark.batches.windows import Tumbling
from lowmark.state.session import SparkSettings, get_spark
from tests.helpers import drop_batches, event, windowed

ROOT = Path("/tmp/lowmark-upgrade-data")
"""The data root, at a fixed place: the file manifest and the catalog record absolute paths,
so the test unpacks the archive here again."""
WINDOW = Tumbling(size="10 seconds")
INPUT = [
    [event("a", 1, 1), event("b", 2, 2), event("a", 4, 3)],
    [event("a", 11, 4), event("b", 13, 5), event("b", 15, 6)],
    [event("a", 21, 7), event("a", 24, 8), event("b", 27, 9)],
    [event("b", 31, 10), event("a", 38, 11), event("b", 45, 12)],
]
"""Per file, records in event-time order and within the watermark's bounds: no record is
late under any watermark or late rule."""
_LAG = {"strategy": "ingestion_time", "max_event_time_lag": "3650 days"}
PIPELINES: dict[str, Pipeline] = {
    "w": windowed(WINDOW, mode="update"),
    "wi": windowed(WINDOW, mode="update", watermark=_LAG).model_copy(
        update={"name": "wi", "sink": DeltaSink(path="out_i")}
    ),
}
"""Per user, ``tests.helpers.AGGREGATES`` in tumbling windows of 10 s, update mode: ``w`` with
an event-time watermark into ``out``; ``wi`` with an ingestion-time watermark into ``out_i``."""


def main(out: str) -> None:
    spark = get_spark(SparkSettings(master="local[2]", confs={"spark.sql.shuffle.partitions": "2"}))
    shutil.rmtree(ROOT, ignore_errors=True)
    drop_batches(ROOT, INPUT)
    for p in PIPELINES.values():
        MicroBatchRunner(spark, p, ROOT).run(max_batches=2)
        planned_only = faults.crash_at(faults.KillPoint("after_offset_log", 2))
        with planned_only, pytest.raises(faults.InjectedCrash):
            MicroBatchRunner(spark, p, ROOT).run(max_batches=1)
    with tarfile.open(out, "w:gz") as tar:
        tar.add(ROOT, arcname=ROOT.name)
    shutil.rmtree(ROOT)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
