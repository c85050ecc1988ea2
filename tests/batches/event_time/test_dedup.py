"""Deduplication's seen ids never pass through the driver: the tasks write the ids they let
through as data files of the seen-ids table, and the job brings back only those files'
descriptors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import SparkSession

from lowmark.batches.collect import observed
from lowmark.batches.dedup import Dedup
from lowmark.batches.event_time.dedup import DedupStep
from lowmark.state.seen_ids import SeenIds

IDS = 400
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_batchs_new_ids_reach_the_driver_as_a_few_file_descriptors_whatever_their_number(
    spark: SparkSession, tmp_path: Path
) -> None:
    seen_ids = SeenIds(str(tmp_path / "dedup_ids"), "p:dedup", 3_600_000_000)
    seen_ids.create()
    step = DedupStep(Dedup(columns=("id",), within="1 hour"), "ts", seen_ids)
    rows = [(f"e{n}", T0 + timedelta(seconds=n)) for n in range(IDS)]
    twins = rows[:10]
    records = spark.createDataFrame(rows + twins, "id string, ts timestamp")

    judged = step.judged(records, None, seen_ids.contract.read_version({}, False, 0), 0)
    kept = sorted(r.id for r in judged.kept.collect())
    metrics = observed(judged.seen)
    assert metrics is not None
    collected = [v for v in metrics.values() if isinstance(v, list)]
    # 400 ids let through, 2 tasks, ids within one slot: a file per task, no more.
    assert sum(len(v) for v in collected) <= 2
    seen = judged.observed(metrics)
    assert kept == sorted(id_ for id_, _ in rows)
    assert seen.duplicates == len(twins)
    seen_ids.commit(seen.id_files, 0)
    version = seen_ids.table.version()
    seen_ids.commit(seen.id_files, 0)  # a replay's commit of the same batch adds nothing
    assert seen_ids.table.version() == version

    held = seen_ids.table.read()
    assert sorted(held.column("id").to_pylist()) == sorted(f'{{"id":"{i}"}}' for i, _ in rows)
    # The next batch judges against them: every record of it is a duplicate.
    again = step.judged(records, None, seen_ids.contract.read_version({}, False, 1), 1)
    assert again.kept.collect() == []
    assert (judged_again := observed(again.seen)) is not None
    assert again.observed(judged_again).duplicates == len(rows) + len(twins)


def test_copies_behind_the_horizon_are_each_late_and_make_no_copy_within_it_a_duplicate(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Ids held for a minute behind a watermark at T0 + 110 s: the horizon is T0 + 50 s.
    seen_ids = SeenIds(str(tmp_path / "dedup_ids"), "p:dedup", 60_000_000)
    seen_ids.create()
    step = DedupStep(Dedup(columns=("id",), within="1 minute"), "ts", seen_ids)
    rows = [("a", 0), ("a", 1), ("b", 0), ("b", 100)]
    records = spark.createDataFrame(
        [(i, T0 + timedelta(seconds=s)) for i, s in rows], "id string, ts timestamp"
    )
    watermark_ms = int(T0.timestamp() * 1000) + 110_000

    judged = step.judged(records, watermark_ms, seen_ids.contract.read_version({}, False, 0), 0)
    kept = [r.id for r in judged.kept.collect()]
    metrics = observed(judged.seen)
    assert metrics is not None
    seen = judged.observed(metrics)
    # Both copies of a are late, not one late and one its duplicate; b's copy within the
    # horizon is let through, as its only other copy was set aside, never let through.
    assert kept == ["b"]
    assert (seen.late.num_rows, seen.duplicates) == (3, 0)
    assert sorted(seen.late.column("event_us").to_pylist())[-1] < watermark_ms * 1000 - 60e6
