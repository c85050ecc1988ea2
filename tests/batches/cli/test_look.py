"""`lowmark show` and `lowmark sql` over the tables of two small real pipelines, compared
with what Spark reads from the same Delta tables; and the labels of `list` and `status`
for a pipeline in update mode."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lowmark.batches.admin import tables
from lowmark.batches.demo import orders, write_sample_files
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.registry import load_pipelines
from lowmark.state import catalog
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.keyed_state import BUCKET, SLOT, SLOT_MIN_MS, STATE, TIMER_INDEX
from lowmark.state.offset_log import OffsetEntry
from lowmark.state.progress import ProgressEntry
from tests.helpers import delta_frame, json_lines_sink, lowmark

PIPELINES = """
from lowmark.batches.demo import orders, user_revenue

orders = orders.model_copy(  # every file in one batch: no more Spark than the tests need
    update={"source": orders.source.model_copy(update={"max_files_per_batch": 10})}
)

revenue_updates = user_revenue.model_copy(
    update={
        "name": "revenue_updates",
        "sink": user_revenue.sink.model_copy(update={"path": "demo/revenue_updates"}),
        "aggregation": user_revenue.aggregation.model_copy(update={"output_mode": "update"}),
    }
)
"""
"""The demo's pipelines and a copy of user_revenue in update mode (its own sink)."""


class Ran:
    """Where the pipelines ran: ``lowmark`` arguments naming them, their data root, and the
    update-mode sink's windows as Spark reads them."""

    def __init__(self, spark: SparkSession, root: Path, pipelines: Path) -> None:
        self.root = root
        self.pipelines = pipelines
        rows = self.sink(spark, "revenue_updates").select(
            "user", F.col("window_start").cast("long").alias("start"), "orders", "revenue"
        )
        windows = [
            (r["user"], r["start"], r["orders"], round(r["revenue"], 6)) for r in rows.collect()
        ]
        self.windows = sorted(windows, key=lambda w: (-w[1], w[0]))
        """(user, window start in epoch seconds, orders, revenue), newest first, then by user."""

    def args(self, *args: str) -> tuple[str, ...]:
        return ("--pipelines", str(self.pipelines), *args)

    def sink(self, spark: SparkSession, name: str) -> Any:
        return delta_frame(spark, str(self.root / "demo" / name))


@pytest.fixture(scope="module")
def ran(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    """orders and revenue_updates run until caught up over five small demo files (one with
    two malformed lines, one a straggler whose orders are late); user_revenue never ran."""
    folder = tmp_path_factory.mktemp("look")
    root = folder / "data"
    pipelines = folder / "look_pipelines.py"
    pipelines.write_text(PIPELINES)
    write_sample_files(root, files=5, rows_per_file=6, now=datetime.now(UTC))
    defined = load_pipelines(str(pipelines))
    for name in ("orders", "revenue_updates"):
        MicroBatchRunner(spark, defined[name], root).run(max_batches=None)
    yield Ran(spark, root, pipelines)


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def epoch_s(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp())


def windows(rows: list[dict[str, Any]]) -> list[tuple[str, int, int, float]]:
    """Windows as (user, start in epoch seconds, orders, revenue)."""
    return [
        (r["user"], epoch_s(r["window_start"]), r["orders"], round(r["revenue"], 6)) for r in rows
    ]


def test_show_json_lists_the_sink_newest_window_first_as_spark_reads_it(
    capsys: pytest.CaptureFixture[str], ran: Ran
) -> None:
    expected = ran.windows
    assert len(expected) > 3
    code, out, _ = lowmark(capsys, ran.root, *ran.args("show", "revenue_updates", "--json"))
    assert code == 0
    assert windows(json_lines(out)) == expected[: len(json_lines(out))]

    code, out, err = lowmark(
        capsys, ran.root, *ran.args("show", "revenue_updates", "--limit", "3", "--json")
    )
    assert windows(json_lines(out)) == expected[:3]
    assert err == ""  # JSON Lines only: nothing but rows


def test_show_for_people_has_iso_times_and_says_how_many_rows_matched(
    capsys: pytest.CaptureFixture[str], ran: Ran
) -> None:
    users = [w[0] for w in ran.windows]
    user = max(sorted(set(users)), key=users.count)
    expected = [w for w in ran.windows if w[0] == user]
    assert len(expected) > 1
    code, out, err = lowmark(
        capsys,
        ran.root,
        *ran.args("show", "revenue_updates", "--where", f"user = '{user}'", "--limit", "1"),
    )
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["user", "window_start", "window_end", "orders", "revenue"]
    start = datetime.fromtimestamp(expected[0][1], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert row.split()[:2] == [user, start]
    assert err.strip() == (
        f"revenue_updates.sink: 1 of {len(expected)} rows, ordered by window_start DESC, "
        '"user"; --limit shows more'
    )


def test_show_reads_the_checkpoint_tables_newest_batch_first(
    capsys: pytest.CaptureFixture[str], ran: Ran
) -> None:
    checkpoint = ran.root / "_lowmark" / "revenue_updates"
    for table, folder in (("progress", "progress"), ("late", "late"), ("bad", "bad_records")):
        stored = DeltaTable(str(checkpoint / folder)).to_pyarrow_table()
        _, out, _ = lowmark(
            capsys,
            ran.root,
            *ran.args("show", "revenue_updates", table, "--limit", "1000", "--json"),
        )
        shown = json_lines(out)
        assert len(shown) == stored.num_rows > 0, table
        batch_ids = [r["batch_id"] for r in shown]
        assert batch_ids == sorted(stored.column("batch_id").to_pylist(), reverse=True), table
    # Epoch-millisecond moments: numbers in JSON, ISO times for people.
    _, out, _ = lowmark(
        capsys, ran.root, *ran.args("show", "revenue_updates", "watermarks", "--json")
    )
    newest = json_lines(out)[0]
    _, out, _ = lowmark(capsys, ran.root, *ran.args("show", "revenue_updates", "watermarks"))
    header, first, *_ = out.splitlines()
    cells = dict(zip(header.split(), first.split(), strict=True))
    moment = datetime.fromtimestamp(newest["watermark_ms"] / 1000, UTC)
    assert datetime.fromisoformat(cells["watermark_ms"]) == moment


def keyed_checkpoint(root: Path, timer_ms: int) -> Path:
    """The demo's ``orders`` checkpoint under ``root``, with keyed state and one timer at
    ``timer_ms`` (as a keyed step writes them; no Spark)."""
    location = orders.checkpoint_location(root)
    Checkpoint(location, orders.name)
    timer = {"timer_ms": timer_ms, "key": '["u1"]', BUCKET: 0, "pending": True, "batch_id": 0}
    rows = pa.Table.from_pylist([timer | {SLOT: timer_ms // SLOT_MIN_MS}], TIMER_INDEX)
    write_deltalake(f"{location}/keyed_timers", rows)
    state = {"key": '["u1"]', "state": "s", "value": "1", "expires_ms": timer_ms}
    rows = pa.Table.from_pylist([state | {"batch_id": 0, BUCKET: 0}], STATE)
    write_deltalake(f"{location}/keyed_state", rows)
    return Path(location)


def test_show_reads_a_keyed_steps_timers_and_expiries_as_times_and_json_keeps_numbers(
    capsys: pytest.CaptureFixture[str], data_root: Path
) -> None:
    at = int(datetime(2026, 11, 28, 9, 30, 15, tzinfo=UTC).timestamp() * 1000)
    keyed_checkpoint(data_root, at)
    for table, column in (("keyed_timers", "timer_ms"), ("keyed_state", "expires_ms")):
        code, out, _ = lowmark(capsys, data_root, "show", "orders", table)
        assert code == 0
        header, row = out.splitlines()
        cells = dict(zip(header.split(), row.split(), strict=True))
        assert cells[column] == "2026-11-28T09:30:15Z", out
        _, out, _ = lowmark(capsys, data_root, "show", "orders", table, "--json")
        assert json_lines(out)[0][column] == at


def test_show_reads_each_partitions_ingestion_time_and_a_batchs_lag_and_durations_with_units(
    capsys: pytest.CaptureFixture[str], data_root: Path
) -> None:
    at = int(datetime(2026, 11, 28, 9, 30, 15, tzinfo=UTC).timestamp() * 1000)
    checkpoint = Checkpoint(orders.checkpoint_location(data_root), orders.name)
    ingestion_ms = {"0": at, "1": at + 1_500}
    offsets = OffsetEntry(
        batch_id=0,
        runner_id="r",
        start_offsets={},
        end_offsets={},
        pipeline_fingerprint="f",
        ingestion_ms=ingestion_ms,
    )
    checkpoint.offsets.add(offsets)
    checkpoint.progress.add(
        ProgressEntry(
            batch_id=0,
            runner_id="r",
            durations_ms={"plan": 840, "total": 4_250},
            rows_in=1,
            rows_out=1,
            rows_bad=0,
            lag_ms=1_656_300,
        )
    )
    shown = {}
    for table in ("offsets", "progress"):
        code, out, _ = lowmark(capsys, data_root, "show", "orders", table)
        assert code == 0
        shown[table] = out
    assert "0: 2026-11-28T09:30:15Z, 1: 2026-11-28T09:30:16.5Z" in shown["offsets"]
    assert "27 min 36 s" in shown["progress"]  # lag_ms
    assert "plan: 840 ms, total: 4.2 s" in shown["progress"]
    _, out, _ = lowmark(capsys, data_root, "show", "orders", "offsets", "--json")
    assert json.loads(json_lines(out)[0]["ingestion_ms"]) == ingestion_ms  # numbers, as stored


def test_every_epoch_millisecond_column_of_the_checkpoint_reads_as_a_time(tmp_path: Path) -> None:
    location = keyed_checkpoint(tmp_path, 0)
    milliseconds = {
        field.name
        for kind in tables.TABLES.values()
        if kind.folder is not None and (location / kind.folder).exists()
        for field in DeltaTable(str(location / kind.folder)).schema().fields
        if field.name.endswith("_ms") and getattr(field.type, "type", None) == "long"
    }
    durations = tables.DURATION_MS_COLUMNS
    assert milliseconds - durations == milliseconds & tables.EPOCH_MS_COLUMNS


def test_sql_joins_tables_of_two_pipelines_as_spark_does(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], ran: Ran
) -> None:
    query = (
        "SELECT o.user, count(*) AS orders, max(w.windows) AS windows FROM orders.sink o "
        "JOIN (SELECT user, count(*) AS windows FROM revenue_updates.sink GROUP BY user) w "
        "ON o.user = w.user GROUP BY o.user ORDER BY o.user"
    )
    code, out, _ = lowmark(capsys, ran.root, *ran.args("sql", query, "--json"))
    assert code == 0
    per_user = ran.sink(spark, "revenue_updates").groupBy("user").agg(F.count("*").alias("windows"))
    expected = (
        ran.sink(spark, "orders")
        .join(per_user, "user")
        .groupBy("user")
        .agg(F.count("*").alias("orders"), F.max("windows").alias("windows"))
        .orderBy("user")
        .collect()
    )
    assert json_lines(out) == [r.asDict() for r in expected]
    assert len(expected) > 1


CANNOT_SHOW = [
    (("show", "nope"), "no pipeline 'nope'"),
    (("show", "orders", "nope"), "no table 'nope' in a pipeline: choose one of sink, late"),
    (("show", "orders", "state"), "orders.state: pipeline orders has no window state"),
    (("show", "user_revenue"), "user_revenue.sink does not exist yet ("),
    (("show", "orders", "--where", "nope = 1"), "the query failed: Schema error: No field"),
    (("sql", "SELEC 1"), "the query failed: SQL error: ParserError"),
    (("sql", "SELECT * FROM orders.nope"), "no table orders.nope: a pipeline's tables are"),
    (
        ("sql", "SELECT * FROM revenue_updates.failures"),
        "revenue_updates.failures does not exist yet (",
    ),
]
"""What `show` and `sql` cannot show, and how the one line they print begins."""


def test_what_cannot_be_shown_is_one_line_naming_it_and_the_way_on(
    capsys: pytest.CaptureFixture[str], ran: Ran
) -> None:
    for args, message in CANNOT_SHOW:
        code, out, err = lowmark(capsys, ran.root, *ran.args(*args))
        assert code == 2 and out == "", args
        assert err.startswith(f"error: {message}") and len(err.strip().splitlines()) == 1, err


def test_a_custom_sink_has_no_table_to_show(ran: Ran) -> None:
    exporting = orders.model_copy(update={"sink": json_lines_sink()})
    with pytest.raises(
        PipelineConfigInvalid, match=r"writes a sink other than Delta .*lowmark show"
    ):
        tables.show(exporting.catalog_entry(ran.root), "sink", 10)
    # its checkpoint's are
    assert tables.show(exporting.catalog_entry(ran.root), "bad", 10).matching == 2


def test_show_finds_the_tables_where_the_last_run_recorded_them(
    capsys: pytest.CaptureFixture[str], ran: Ran
) -> None:
    defined = load_pipelines(str(ran.pipelines))
    recorded = catalog.entries(ran.root)
    assert recorded == {
        n: defined[n].catalog_entry(ran.root) for n in ("orders", "revenue_updates")
    }
    # Recorded: no definitions needed (these are nowhere).
    nowhere = ("--pipelines", str(ran.root / "nowhere.py"))
    code, out, _ = lowmark(capsys, ran.root, *nowhere, "show", "revenue_updates", "--json")
    assert code == 0 and len(json_lines(out)) == min(20, len(ran.windows))
    code, _, err = lowmark(capsys, ran.root, *nowhere, "show", "user_revenue")
    assert code == 2 and "cannot import pipelines from" in err  # never ran: not recorded
    # Not recorded (a run by a lowmark without the catalog): found by its definition, and
    # recorded for the next look.
    (catalog.catalog_dir(ran.root) / "orders.json").unlink()
    code, out, _ = lowmark(
        capsys, ran.root, *ran.args("sql", "SELECT count(*) AS n FROM orders.bad")
    )
    assert code == 0 and out.split()[-1] == "2"
    assert catalog.entries(ran.root) == recorded


def test_show_and_sql_start_no_spark(ran: Ran, tmp_path: Path) -> None:
    # No Delta jars: anything that started Spark would stop with JarsMissing.
    script = (
        "import sys\n"
        "from lowmark.orchestration.cli import main\n"
        "from pyspark import SparkContext\n"
        "for argv in (sys.argv[1:] + ['show', 'revenue_updates'],\n"
        "             sys.argv[1:] + ['sql', 'SELECT count(*) AS n FROM revenue_updates.late']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as stop:\n"
        "        assert not stop.code, stop.code\n"
        "assert SparkContext._active_spark_context is None\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "--data-root", str(ran.root), *ran.args()],
        env=os.environ | {"LOWMARK_JARS_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "revenue_updates.sink:" in proc.stderr and '{"n":' not in proc.stdout


def test_list_shows_the_mode_a_windowed_pipeline_writes_its_sink_with(
    capsys: pytest.CaptureFixture[str], ran: Ran
) -> None:
    _, out, _ = lowmark(capsys, ran.root, *ran.args("list"))
    listed = {line.split()[0]: line.split()[2:4] for line in out.splitlines()[1:]}
    assert listed["revenue_updates"] == ["delta:demo/revenue_updates", "(update)"]
    assert listed["user_revenue"] == ["delta:demo/user_revenue", "(append)"]
    _, out, _ = lowmark(capsys, ran.root, *ran.args("list", "--json"))
    sinks = {p["name"]: p["sink"] for p in json.loads(out)}
    assert sinks["revenue_updates"]["mode"] == "update"


def test_status_in_update_mode_says_open_windows_are_in_the_sink_too(
    capsys: pytest.CaptureFixture[str], ran: Ran
) -> None:
    _, out, _ = lowmark(capsys, ran.root, *ran.args("status", "revenue_updates"))
    shown = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())
    assert re.search(
        r"\+ \d+ in closed windows \(final in the sink\) \+ [1-9]\d* in open windows "
        r"\(the state; in the sink as they stand\)$",
        shown["all batches"],
    ), shown["all batches"]
