"""Deduplication under an ingestion-time watermark judges each record by its own ingestion
time: the same files read live, as a backlog in small or large batches, or killed
mid-backlog and replayed, let through the same copies, set aside the same late records and
count the same duplicates."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from lowmark.batches.dedup import Dedup
from lowmark.batches.event_time.dedup import BEFORE_HORIZON_WHEN_INGESTED as BEHIND
from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, FileSource, KafkaSource, Pipeline
from lowmark.batches.windows import EventTime, IngestionWatermark
from lowmark.state.checkpoint import Checkpoint
from tests.helpers import FakeClock, write_json_lines
from tests.kafka_broker import KafkaBroker

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FILES = [
    [("x", -1), ("w", -2), ("q", -3), ("q", -3)],
    [("w", -2), ("y", 8), ("z", 2)],
    [("x", 6), ("y", 7), ("v", 2), ("v", 3), ("z", 2)],
]
"""File i, modified at T0 + 10 i s, holds (id, event time in s from T0): with a lag of 5 s and
ids held for 10 s, a record of file i is judged from T0 + 10 i - 15 s on (its own horizon).
In file 2 (from T0 + 5 s on): x is new, as the x let through at -1 s is behind the horizon;
y is the duplicate, ingested after the y of file 1 (8 s), though earlier in event time; v
twice, both behind the horizon, is two late records, not one late and one duplicate; z is
late, though its id is held (at 2 s, behind the horizon)."""


def _pipeline(files_per_batch: int | None = None) -> Pipeline:
    source = FileSource(
        path="in",
        format="json",
        schema_ddl="id STRING, ts TIMESTAMP, file INT",
        ingestion_time="modified",
    )
    if files_per_batch is not None:
        source = source.model_copy(update={"max_files_per_batch": files_per_batch})
    lag = IngestionWatermark(strategy="ingestion_time", max_event_time_lag="5 seconds")
    return Pipeline(
        name="d",
        source=source,
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts", watermark=lag),
        dedup=Dedup(columns=("id",), within="10 seconds"),
    )


def _write(root: Path, upto: int) -> None:
    """Files 0 .. ``upto`` - 1 of ``FILES`` in ``root/in``."""
    for i, records in enumerate(FILES[:upto]):
        rows = [
            {"id": r, "ts": (T0 + timedelta(seconds=s)).isoformat(), "file": i} for r, s in records
        ]
        write_json_lines(root / "in", f"f{i}.json", rows, int(T0.timestamp()) + 10 * i)


def _rows(path: Path, drop: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
    table = DeltaTable(str(path)).to_pyarrow_table()
    return sorted(tuple(r.values()) for r in table.drop_columns(list(drop)).to_pylist())


def _results(root: Path) -> dict[str, Any]:
    """What must not depend on the batching: the sink, the late records (not which batch set
    them aside, nor its watermark) and how many duplicates were dropped."""
    checkpoint = Checkpoint(str(root / "_lowmark" / "d"), "d")
    return {
        "sink": _rows(root / "out"),
        "late": _rows(root / "_lowmark" / "d" / "late", ("batch_id", "watermark_ms")),
        "duplicates": sum(c.rows_duplicate for c in checkpoint.commits.get_range()),
    }


def _differences(one: dict[str, Any], other: dict[str, Any]) -> dict[str, int]:
    """Per result, how many rows only one of the runs wrote (duplicates: the difference)."""
    return {
        "sink": len(set(one["sink"]) ^ set(other["sink"])),
        "late": len(set(one["late"]) ^ set(other["late"])),
        "duplicates": abs(one["duplicates"] - other["duplicates"]),
    }


def test_files_deduplicated_live_as_a_backlog_or_killed_and_replayed_keep_the_same_copies(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Live: each file read as it lands, a second after its modification time.
    live, clock = tmp_path / "live", FakeClock()
    with MicroBatchRunner(spark, _pipeline(), live, clock) as runner:
        for i in range(len(FILES)):
            _write(live, i + 1)
            clock.now = int(T0.timestamp() * 1000) + 10_000 * i + 1_000
            runner.run(max_batches=None)
    expected = _results(live)
    kept = sorted((id_, file) for id_, _, file in expected["sink"])  # (id, its file)
    assert kept == [("q", 0), ("w", 0), ("x", 0), ("x", 2), ("y", 1), ("z", 1)]
    late = sorted((json.loads(record)["id"], why) for _, why, record in expected["late"])
    assert late == [("v", BEHIND), ("v", BEHIND), ("z", BEHIND)]
    assert expected["duplicates"] == 3  # the q twin, the w of file 1, the y of file 2

    # Backlogs, read an hour later: all at once, and two files a batch killed once batch
    # 1's ids were committed, before its sink write, and run again.
    later = FakeClock(int(T0.timestamp() * 1000) + 3_600_000)
    _write(tmp_path / "large", len(FILES))
    MicroBatchRunner(spark, _pipeline(), tmp_path / "large", later).run(max_batches=None)
    killed = tmp_path / "killed"
    _write(killed, len(FILES))
    with crash_at(KillPoint("after_state", 1)), pytest.raises(InjectedCrash):
        MicroBatchRunner(spark, _pipeline(2), killed, later).run(max_batches=None)
    MicroBatchRunner(spark, _pipeline(2), killed, later).run(max_batches=None)

    for name in ("large", "killed"):
        differ = _differences(_results(tmp_path / name), expected)
        assert differ == dict.fromkeys(differ, 0), f"{name} differs from live: {differ}"


# In `make test-integration` (24 s): the files above are the default suite's proof of the rule.
@pytest.mark.integration
def test_a_log_append_time_topic_deduplicated_live_as_a_backlog_or_aligned_keeps_the_same(
    spark: SparkSession, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Copies of one id in two partitions of a LogAppendTime topic, appended 50 ms apart in
    one burst, or a burst later: read live (a batch a burst), as a backlog in one batch,
    and as a backlog of 2 records a batch under aligned admission (which takes records in
    their append order across partitions), every run keeps the copy appended first, drops
    the same duplicates and sets aside the same late records (ids held for a minute: a
    copy a burst later is a duplicate however long the live batches take)."""
    topic = f"d_{time.time_ns() % 10**10}"
    kafka.create_topic(topic, 2, {"message.timestamp.type": "LogAppendTime"})
    source = KafkaSource(
        bootstrap_servers=kafka.bootstrap,
        topics=(topic,),
        schema_ddl="id STRING, ts TIMESTAMP, file INT",
        max_offsets_per_batch=100,
    )
    minute = Dedup(columns=("id",), within="60 seconds")
    pipeline = _pipeline().model_copy(update={"source": source, "dedup": minute})
    bursts = [  # per burst, per partition: (id, seconds before it is appended)
        {0: [("a", 0.2), ("b", 1.0), ("d", 100.0)], 1: [("a", 0.5), ("c", 8.0)]},
        {0: [("b", 0.3)], 1: [("e", 2.0), ("c", 1.0)]},
        {0: [("a", 80.0)], 1: [("f", 0.1)]},
    ]
    live = FakeClock()
    for n, burst in enumerate(bursts):
        began = time.time()
        for partition, records in burst.items():
            values = [
                json.dumps({"id": r, "ts": _iso(time.time() - age), "file": n})
                for r, age in records
            ]
            kafka.produce(topic, values, partition)
            time.sleep(0.05)  # partition 1's copies are appended after partition 0's
        live.now = int(time.time() * 1000)
        MicroBatchRunner(spark, pipeline, tmp_path / "live", live).run(max_batches=None)
        time.sleep(max(0.0, began + 3.0 - time.time()))  # the broker's clock must move
    expected = _results(tmp_path / "live")
    assert sorted(r[0] for r in expected["sink"]) == ["a", "b", "c", "e", "f"]
    assert expected["duplicates"] == 3  # a of partition 1, b of burst 1, c of burst 1
    assert len(expected["late"]) == 2  # d, and a of burst 2: behind their own horizons

    later = FakeClock(live.now + 3_600_000)
    small = source.model_copy(update={"max_offsets_per_batch": 2})
    assert pipeline.event_time is not None
    aligned = pipeline.model_copy(
        update={
            "source": small,
            "event_time": pipeline.event_time.model_copy(update={"admission": "aligned"}),
        }
    )
    for name, run in (("large", pipeline), ("aligned", aligned)):
        MicroBatchRunner(spark, run, tmp_path / name, later).run(max_batches=None)
        differ = _differences(_results(tmp_path / name), expected)
        assert differ == dict.fromkeys(differ, 0), f"{name} differs from live: {differ}"


def _iso(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).isoformat()
