"""`lowmark plan`: what the next batch would take, and proof that asking writes nothing."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from lowmark.batches import demo
from lowmark.batches.admin.skip_batch import set_aside
from lowmark.batches.cli.display import moment
from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.loop.parts import read_only_planner
from lowmark.batches.loop.plan import NextKind
from tests.helpers import (
    SPARK_ERRORS,
    FakeClock,
    at,
    dividing,
    drop,
    event,
    lowmark,
    partitioned,
    write_json_lines,
)

idle_partitions = partitioned(idle_timeout="30 seconds")
"""A windowed pipeline (named ``p``) whose silent partitions stop holding the watermark."""
HERE = __name__
POISON = "tests.batches.loop.test_poison"
"""Where ``dividing`` is defined: a pipeline whose transform fails on a zero amount."""


def snapshot(root: Path) -> dict[str, object]:
    """Every file under ``root`` (size and modification time) and the version of every Delta
    table: what a write of any kind would change."""
    files = {
        str(f.relative_to(root)): (f.stat().st_size, f.stat().st_mtime_ns)
        for f in sorted(root.rglob("*"))
        if f.is_file()
    }
    tables = {
        str(log.parent.relative_to(root)): DeltaTable(str(log.parent)).version()
        for log in sorted(root.rglob("_delta_log"))
    }
    return {"files": files, "tables": tables}


def plan_json(
    capsys: pytest.CaptureFixture[str], root: Path, *args: str, clock: FakeClock | None = None
) -> dict[str, Any]:
    """``lowmark ... --json``'s output, read."""
    code, out, err = lowmark(capsys, root, *args, "--json", clock=clock)
    assert code == 0, err
    parsed: dict[str, Any] = json.loads(out)
    return parsed


def positive_orders(path: Path) -> list[dict[str, object]]:
    """The demo orders of file ``path`` the transform keeps (valid JSON, quantity > 0)."""
    kept = []
    for line in path.read_text().splitlines():
        try:
            order = json.loads(line)
        except json.JSONDecodeError:
            continue
        if order["quantity"] > 0:
            kept.append(order)
    return kept


def test_the_plan_of_a_pipeline_that_never_ran_is_batch_0_and_creates_nothing(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_root: Path
) -> None:
    demo.write_sample_files(data_root, files=3, rows_per_file=5)
    before = snapshot(data_root)
    plan = plan_json(capsys, data_root, "plan", "user_revenue")
    assert (plan["batch_id"], plan["replay"], plan["emit_only"]) == (0, False, False)
    # max_files_per_batch=2: the first two of the three files.
    assert (plan["start_offsets"], plan["end_offsets"]) == ({"0": 0}, {"0": 2})
    size = sum(f.stat().st_size for f in (data_root / demo.INCOMING).iterdir())
    assert plan["input"] == "0 → 2 (+2)"
    assert "3 new files" in plan["reason"] and f"{size} bytes" in plan["reason"]
    assert plan["checkpoint_exists"] is False and plan["watermark_ms"] is None
    first_two = sorted((data_root / demo.INCOMING).iterdir())[:2]
    assert [Path(i).name for i in plan["inputs"]] == [f.name for f in first_two]
    assert plan["bytes"] == sum(f.stat().st_size for f in first_two)
    assert snapshot(data_root) == before
    assert not (data_root / "_lowmark").exists()


def test_the_plan_names_the_files_and_the_watermark_of_the_next_batch_and_writes_nothing(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_root: Path, clock: FakeClock
) -> None:
    now = datetime.fromtimestamp(clock.now_ms() / 1000, UTC)
    files = demo.write_sample_files(data_root, files=6, rows_per_file=10, now=now)
    MicroBatchRunner(spark, demo.user_revenue, data_root, clock).run(max_batches=1)
    # Batch 0 took files 0 and 1; the watermark after it is their newest kept order's
    # event time less the 30 s of out-of-orderness user_revenue allows.
    newest = max(
        datetime.fromisoformat(str(o["ts"])) for f in files[:2] for o in positive_orders(f)
    )
    watermark_ms = int((newest - timedelta(seconds=30)).timestamp() * 1000)
    # A file batch 0's planning did not see: a plan that recorded it would write the manifest.
    demo.write_sample_files(data_root, files=7, rows_per_file=10, now=now)
    before = snapshot(data_root)

    plan = plan_json(capsys, data_root, "plan", "user_revenue", clock=clock)
    assert (plan["batch_id"], plan["replay"], plan["emit_only"]) == (1, False, False)
    assert (plan["start_offsets"], plan["end_offsets"]) == ({"0": 2}, {"0": 4})
    # The source names a file by its path (as a URI for a local folder).
    assert len(plan["inputs"]) == 2
    assert all(i.endswith(str(f)) for i, f in zip(plan["inputs"], files[2:4], strict=True))
    assert plan["bytes"] == sum(f.stat().st_size for f in files[2:4])
    assert plan["watermark_ms"] == watermark_ms

    code, out, _ = lowmark(capsys, data_root, "plan", "user_revenue", clock=clock)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("user_revenue: batch 1 takes new input (5 new files")
    assert lines[1].split() == ["input", "2", "→", "4", "(+2)"]
    assert lines[2].split() == ["inputs", plan["inputs"][0]]
    assert lines[3].strip() == plan["inputs"][1]
    assert lines[4].split() == ["bytes", f"{plan['bytes']:,}"]
    assert lines[5].split(maxsplit=1) == ["watermark", moment(watermark_ms, clock.now_ms())]
    assert snapshot(data_root) == before


def test_the_plan_of_an_uncommitted_batch_is_its_replay_with_the_offset_log_entry(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_root: Path, clock: FakeClock
) -> None:
    now = datetime.fromtimestamp(clock.now_ms() / 1000, UTC)
    demo.write_sample_files(data_root, files=4, rows_per_file=5, now=now)
    runner = MicroBatchRunner(spark, demo.user_revenue, data_root, clock)
    runner.run(max_batches=1)
    clock.advance(5_000)
    with crash_at(KillPoint("after_offset_log", 1)), pytest.raises(InjectedCrash):
        MicroBatchRunner(spark, demo.user_revenue, data_root, clock).run_batch()
    entry = runner.checkpoint.offsets.get(1)
    assert entry is not None
    clock.advance(60_000)
    before = snapshot(data_root)

    plan = plan_json(capsys, data_root, "plan", "user_revenue", clock=clock)
    assert (plan["batch_id"], plan["replay"], plan["emit_only"]) == (1, True, False)
    assert (plan["start_offsets"], plan["end_offsets"]) == (entry.start_offsets, entry.end_offsets)
    assert entry.batch_watermark_ms is not None
    assert plan["watermark_ms"] == entry.batch_watermark_ms
    assert plan["planned_at_ms"] == clock.now_ms() - 60_000  # when batch 1 was planned
    assert plan["blocked"] is None
    _, out, _ = lowmark(capsys, data_root, "plan", "user_revenue", clock=clock)
    assert out.startswith("user_revenue: batch 1 replays: it is uncommitted")
    assert "(planned " + moment(clock.now_ms() - 60_000, clock.now_ms()) + ")" in out
    _, out, _ = lowmark(capsys, data_root, "status", "user_revenue", clock=clock)
    shown = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())
    assert shown["pending batch"] == "batch 1 (uncommitted: a run replays it)"
    assert shown["next batch"] == "batch 1, the replay of the uncommitted batch"
    assert snapshot(data_root) == before


def test_the_plan_of_an_emit_only_batch_takes_no_input_and_says_so(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_root: Path, clock: FakeClock
) -> None:
    drop(data_root, "p0", "a.json", [event("a", 5, 1), event("a", 40, 1)], 0)
    drop(data_root, "p1", "a.json", [event("b", 3, 1)], 1)
    MicroBatchRunner(spark, idle_partitions, data_root, clock).run_batch()
    before = snapshot(data_root)
    plan = plan_json(capsys, data_root, "--pipelines", HERE, "plan", "p", clock=clock)
    # The watermark is min(40 s, 3 s) = 3 s: no window [0, 10) is closed yet.
    assert plan["batch_id"] is None and plan["reason"].startswith("nothing to do")
    _, out, _ = lowmark(capsys, data_root, "--pipelines", HERE, "plan", "p", clock=clock)
    assert out.startswith("p: nothing to do (0 new files")

    clock.advance(60_000)  # both partitions silent past idle_timeout: the max, 40 s, is used
    plan = plan_json(capsys, data_root, "--pipelines", HERE, "plan", "p", clock=clock)
    assert (plan["batch_id"], plan["replay"], plan["emit_only"]) == (1, False, True)
    assert plan["start_offsets"] == plan["end_offsets"] and plan["inputs"] == []
    assert plan["watermark_ms"] == at(40)
    _, out, _ = lowmark(capsys, data_root, "--pipelines", HERE, "plan", "p", clock=clock)
    assert out.startswith("p: batch 1 takes no input: the watermark moved: windows close")
    assert snapshot(data_root) == before


def test_the_plan_of_a_poison_batch_says_why_it_is_blocked_until_skip_batch_sets_it_aside(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_root: Path
) -> None:
    for i, amount in enumerate([1, 0, 3]):  # file 1's zero amount fails the transform
        rows = [{"id": i, "amount": amount}]
        write_json_lines(data_root / "in", f"f{i:03d}.json", rows, 1_700_000_000 + i)
    MicroBatchRunner(spark, dividing, data_root).run_batch()
    for _ in range(dividing.max_failed_attempts):
        with pytest.raises(SPARK_ERRORS):
            MicroBatchRunner(spark, dividing, data_root).run_batch()
    before = snapshot(data_root)
    plan = plan_json(capsys, data_root, "--pipelines", POISON, "plan", "dividing")
    assert (plan["batch_id"], plan["replay"]) == (1, True)
    assert f"failed {dividing.max_failed_attempts} times" in plan["blocked"]
    assert len(plan["inputs"]) == 1 and plan["inputs"][0].endswith("f001.json")
    assert snapshot(data_root) == before

    code, out, err = lowmark(
        capsys, data_root, "--pipelines", POISON, "skip-batch", "dividing", "1", "--reason",
        "a zero amount", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out) == {
        "pipeline": "dividing",
        "batch_id": 1,
        "inputs": plan["inputs"],
        "restored": {},
        "next_batch": 2,
    }
    plan = plan_json(capsys, data_root, "--pipelines", POISON, "plan", "dividing")
    assert (plan["batch_id"], plan["replay"], plan["blocked"]) == (2, False, None)
    assert plan["inputs"][0].endswith("f002.json")


def test_the_planner_answers_new_replay_blocked_or_nothing_and_a_retry_unblocks(
    spark: SparkSession, data_root: Path
) -> None:
    for i, amount in enumerate([1, 0]):  # file 1's zero amount fails the transform
        rows = [{"id": i, "amount": amount}]
        write_json_lines(data_root / "in", f"f{i:03d}.json", rows, 1_700_000_000 + i)

    def kind(retry: bool = False) -> NextKind:
        planner = read_only_planner(spark, dividing, data_root)
        return planner.next_batch(dry_run=True, retry=retry).kind

    assert kind() == "new"
    assert not (data_root / "_lowmark").exists()  # a dry run of a fixed start creates nothing
    MicroBatchRunner(spark, dividing, data_root).run_batch()
    assert kind() == "new"
    for _ in range(dividing.max_failed_attempts - 1):
        with pytest.raises(SPARK_ERRORS):
            MicroBatchRunner(spark, dividing, data_root).run_batch()
        assert kind() == "replay"
    with pytest.raises(SPARK_ERRORS):
        MicroBatchRunner(spark, dividing, data_root).run_batch()
    assert (kind(), kind(retry=True)) == ("blocked", "replay")
    set_aside(spark, dividing, data_root, 1, "a zero amount")
    assert kind() == "nothing"
