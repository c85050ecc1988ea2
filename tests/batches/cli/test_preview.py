"""`lowmark preview`: the next batch run on its planned input, nothing committed."""

from __future__ import annotations

import functools
import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from examples.keyed import ALERTS, SilenceAlert
from lowmark.batches.dedup import Dedup
from lowmark.batches.demo import clean_orders, orders, user_revenue, write_sample_files
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.pipeline import DeltaSink, Pipeline, resolve
from tests.faults.scenarios import SINK, VIEWS, stream_joined, write_clicks, write_input
from tests.helpers import FakeClock, lowmark


def on_disk(*folders: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folders``: its size and modification time."""
    return {
        str(f): (f.stat().st_size, f.stat().st_mtime_ns)
        for folder in folders
        for f in folder.rglob("*")
        if f.is_file()
    }


def delta_versions(*folders: Path) -> dict[str, int]:
    """The version of every Delta table under ``folders``."""
    return {
        str(log.parent): DeltaTable(str(log.parent)).version()
        for folder in folders
        for log in folder.rglob("_delta_log")
    }


def as_shown(row: dict[str, Any]) -> str:
    """A sink row as ``preview --json`` prints it (times in ISO 8601, UTC), comparable."""
    shown = {
        k: v.astimezone(UTC).isoformat().replace("+00:00", "Z") if isinstance(v, datetime) else v
        for k, v in row.items()
    }
    return json.dumps(shown, sort_keys=True)


def sink_rows(path: Path) -> Counter[str]:
    return Counter(as_shown(r) for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist())


def folders_of(p: Pipeline, root: Path) -> tuple[Path, Path]:
    """The checkpoint and sink folders of demo pipeline ``p``."""
    assert isinstance(p.sink, DeltaSink)  # the demo's pipelines write Delta tables
    return Path(p.checkpoint_location(root)), Path(resolve(p.sink.path, root))


DEDUPED = user_revenue.model_copy(
    update={
        "name": "deduped",
        "sink": DeltaSink(path="demo/deduped_revenue"),
        "dedup": Dedup(columns=("order_id",), within="1 hour"),
    }
)
"""The demo's revenue windows over orders deduplicated by id (``DEDUPED`` in the module the
tests write)."""


def orders_with_ts(df: DataFrame) -> DataFrame:
    """The demo's orders with their event time as ``ts`` too (what ``SilenceAlert`` reads)."""
    return clean_orders(df).withColumn("ts", F.col("event_time"))


KEYED = user_revenue.model_copy(
    update={
        "name": "alerts",
        "transform": orders_with_ts,
        "sink": DeltaSink(path="demo/alerts"),
        "aggregation": None,
        "keyed": Keyed(processor=SilenceAlert, keys=("user",), output_schema=ALERTS),
    }
)
"""An alert per user silent for 10 s over the demo's orders (``KEYED`` there): each of the
demo's files is 20 minutes of event time after the one before, so a batch's watermark has
passed the timers of every user of the batch before it, and its processor emits alerts."""
DEFINED = (
    "from lowmark.batches.demo import orders, user_revenue\n"
    "from tests.batches.cli.test_preview import DEDUPED as deduped\n"
    "from tests.batches.cli.test_preview import KEYED as alerts\n"
)
STREAM_JOINED = (
    "from tests.faults.scenarios import stream_joined\n"
    "joined = stream_joined.model_copy(update={'name': 'joined'})\n"
)


@pytest.mark.parametrize(
    "pipeline",
    # The windows alone in `make test-integration`: the deduplicated windows cover them.
    [orders, pytest.param(user_revenue, marks=pytest.mark.integration), DEDUPED, KEYED],
    ids=lambda p: p.name,
)
def test_preview_writes_nothing_and_the_next_run_writes_exactly_the_rows_it_showed(
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    data_root: Path,
    clock: FakeClock,
    pipeline: Pipeline,
) -> None:
    now = datetime.fromtimestamp(clock.now_ms() / 1000, UTC)
    write_sample_files(data_root, files=4, rows_per_file=10, now=now)
    defined = tmp_path / "defined.py"
    defined.write_text(DEFINED)
    name = pipeline.name
    checkpoint, sink = folders_of(pipeline, data_root)
    run = functools.partial(lowmark, capsys, data_root, "--pipelines", str(defined), clock=clock)

    # Before the first run there is no checkpoint, and the preview makes none.
    code, out, _ = run("preview", name, "--limit", "2")
    assert code == 0 and f"{name}: batch 0, previewed: nothing was written" in out
    assert not checkpoint.exists() and not sink.exists()

    code, _, _ = run("run", name)
    assert code == 0
    files, versions = on_disk(checkpoint, sink), delta_versions(checkpoint, sink)
    before = sink_rows(sink)

    code, out, _ = run("preview", name, "--json", "--limit", "1000")
    assert code == 0
    shown = json.loads(out)
    assert on_disk(checkpoint, sink) == files
    assert delta_versions(checkpoint, sink) == versions
    assert shown["plan"]["batch_id"] == 1 and shown["plan"]["input"] == "2 → 4 (+2)"
    batch = shown["batch"]

    code, out, _ = run("run", name, "--json")
    ran = json.loads(out)
    assert (ran["batch_id"], ran["input"]) == (1, "2 → 4 (+2)")
    counts = ("rows_in", "rows_out", "rows_bad", "rows_late", "violations")
    assert {k: batch[k] for k in counts} == {k: ran[k] for k in counts}
    assert batch["rows_bad"] == 2  # the third file's malformed lines
    written = sink_rows(sink) - before
    assert written.total() > 0
    if pipeline.keyed is None:  # a keyed batch's rows out are the records its processor got
        assert written.total() == batch["rows_out"]
    assert Counter(json.dumps(r, sort_keys=True) for r in batch["rows"]) == written
    if pipeline.aggregation is not None:
        assert batch["windows"]["emitted"] == batch["rows_out"]

    # An emit-only batch of windows the watermark closes is previewed too; once caught up,
    # one line.
    run("run", name, "--until-caught-up")
    code, out, _ = run("preview", name)
    assert code == 0 and out.strip() == f"{name}: nothing to do (0 new files (0 bytes) waiting)"


def test_preview_of_a_stream_join_writes_nothing_and_the_run_writes_the_pairs_it_showed(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path, data_root: Path
) -> None:
    # The scenario's batch 3 matches rows held since batch 2, emits a view no click can
    # match any more with nulls, and holds the rest: everything a join's batch writes.
    write_input(data_root / "../input", VIEWS)
    write_clicks(data_root / "../clicks")
    defined = tmp_path / "joined.py"
    defined.write_text(STREAM_JOINED)
    run = functools.partial(lowmark, capsys, data_root, "--pipelines", str(defined))
    joined = stream_joined.model_copy(update={"name": "joined"})
    checkpoint = Path(joined.checkpoint_location(data_root))
    sink = Path(resolve(SINK, data_root))
    code, _, err = run("run", "joined", "--max-batches", "3")
    assert code == 0, err
    files, versions = on_disk(checkpoint, sink), delta_versions(checkpoint, sink)
    before = sink_rows(sink)

    code, out, _ = run("preview", "joined", "--json", "--limit", "1000")
    assert code == 0
    batch = json.loads(out)["batch"]
    assert on_disk(checkpoint, sink) == files
    assert delta_versions(checkpoint, sink) == versions

    code, out, _ = run("run", "joined", "--json")
    ran = json.loads(out)
    assert ran["batch_id"] == 3
    counts = ("rows_in", "rows_out", "rows_bad", "rows_late")
    assert {k: batch[k] for k in counts} == {k: ran[k] for k in counts}
    written = sink_rows(sink) - before
    assert written.total() >= 2  # a match, and a view emitted with nulls
    assert Counter(json.dumps(r, sort_keys=True) for r in batch["rows"]) == written
