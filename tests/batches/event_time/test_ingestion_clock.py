"""An ingestion-time watermark judges each record by its own ingestion time: the same input
cut into batches any way (live, a backlog in small or large batches, aligned admission, a
run killed mid-backlog and replayed) writes the same windows, late records and state."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from examples.keyed import SESSIONS, Sessions
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import (
    DeltaSink,
    FileSource,
    KafkaSource,
    Pipeline,
    SyntheticSource,
    UnionSource,
)
from lowmark.batches.stream_join import JoinTime, StreamJoin
from lowmark.batches.windows import (
    Aggregate,
    EventTime,
    IngestionWatermark,
    Sliding,
    Tumbling,
    WindowedAggregation,
)
from tests.helpers import FakeClock, write_json_lines
from tests.kafka_broker import KafkaBroker

LAG = IngestionWatermark(strategy="ingestion_time", max_event_time_lag="5 seconds")
WINDOWS = WindowedAggregation(
    keys=("user",),
    window=Tumbling(size="1 second"),
    aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
)
AGES_S = {0: (0.2, 4.5, 8.0, 30.0), 1: (1.0, 7.0)}
"""Per partition, how long before it is appended each record of a burst happened: 8 s is
late by its own append time (its window closed 2 s before), but on time in a batch that
starts with the clock of a burst appended 3 s or more earlier."""


def _rows(path: Path, drop: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
    """The rows of the Delta table at ``path`` without the ``drop`` columns, sorted."""
    table = DeltaTable(str(path)).to_pyarrow_table()
    kept = table.drop_columns([c for c in drop if c in table.column_names])
    return sorted(tuple(r.values()) for r in kept.to_pylist())


def _results(root: Path) -> dict[str, list[tuple[Any, ...]]]:
    """What a run wrote that must not depend on its batches: the sink, the late records
    (not which batch set them aside, nor its watermark), the window state (if any)."""
    checkpoint = root / "_lowmark" / "clock"
    state = checkpoint / "state_windows"
    return {
        "windows": _rows(root / "out"),
        "late": _rows(checkpoint / "late", ("batch_id", "watermark_ms")),
        "state": _rows(state, ("updated_batch",)) if state.exists() else [],
    }


def _differences(one: dict[str, list[Any]], other: dict[str, list[Any]]) -> dict[str, int]:
    """Per result, how many rows only one of the runs wrote."""
    return {k: len(set(one[k]) ^ set(other[k])) for k in one}


# In `make test-integration` (28 s): the files below are the default suite's proof of the rule.
@pytest.mark.integration
def test_a_log_append_time_topic_read_live_as_a_backlog_or_aligned_and_replayed_gives_the_same(
    spark: SparkSession, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Three bursts on a LogAppendTime topic, 3 s or more apart, partition 1 silent after
    the first (longer than the lag): read live (a batch per burst), then as a backlog in
    batches of 4 and of 100 records, and with aligned admission killed after the sink
    write of its second batch and run again. Every run writes the same windows, late
    records and state: a record 8 s old when appended is late in every run, not only in
    the live one."""
    topic = f"t_{time.time_ns() % 10**10}"
    kafka.create_topic(topic, 2, {"message.timestamp.type": "LogAppendTime"})
    source = KafkaSource(
        bootstrap_servers=kafka.bootstrap,
        topics=(topic,),
        schema_ddl="user STRING, ts TIMESTAMP, amount LONG",
        max_offsets_per_batch=100,
    )
    pipeline = Pipeline(
        name="clock",
        source=source,
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts", watermark=LAG),
        aggregation=WINDOWS,
    )
    live = FakeClock()
    for burst in range(3):
        began = time.time()
        for partition, ages in AGES_S.items():
            if burst and partition:
                continue  # silent from the second burst on
            values = [_event(began - age, n) for n, age in enumerate(ages)]
            kafka.produce(topic, values, partition)
        live.now = int(time.time() * 1000)
        MicroBatchRunner(spark, pipeline, tmp_path / "live", live).run(max_batches=None)
        time.sleep(max(0.0, began + 3.0 - time.time()))  # the broker's clock must move
    live.advance(3_600_000)
    MicroBatchRunner(spark, pipeline, tmp_path / "live", live).run(max_batches=None)
    expected = _results(tmp_path / "live")
    assert len(expected["late"]) == 2 * 3 + 1  # 8 s and 30 s in each burst, 7 s once

    later = live.now + 3_600_000
    small = source.model_copy(update={"max_offsets_per_batch": 4})
    aligned = EventTime(column="ts", watermark=LAG, admission="aligned")
    runs = {
        "small": pipeline.model_copy(update={"source": small}),
        "large": pipeline,
    }
    for name, run in runs.items():
        MicroBatchRunner(spark, run, tmp_path / name, FakeClock(later)).run(max_batches=None)
    killed = pipeline.model_copy(update={"source": small, "event_time": aligned})
    with crash_at(KillPoint("after_sink", 1)), pytest.raises(InjectedCrash):
        MicroBatchRunner(spark, killed, tmp_path / "aligned", FakeClock(later)).run(
            max_batches=None
        )
    MicroBatchRunner(spark, killed, tmp_path / "aligned", FakeClock(later)).run(max_batches=None)
    for name in (*runs, "aligned"):
        differ = _differences(_results(tmp_path / name), expected)
        assert differ == dict.fromkeys(expected, 0), f"{name} differs from live: {differ}"


def _event(at_s: float, n: int) -> str:
    ts = datetime.fromtimestamp(at_s, UTC).isoformat()
    return json.dumps({"user": "ab"[n % 2], "ts": ts, "amount": n})


@pytest.mark.parametrize(("step", "late"), [("windows", 6), ("sliding", 3), ("keyed", 6)])
def test_the_same_files_taken_in_one_batch_or_in_many_set_aside_the_same_late_records(
    spark: SparkSession, tmp_path: Path, step: str, late: int
) -> None:
    """Files judged by their modification time: three files 10 s apart, each with records
    0.5 s, 5.5 s and 8 s older than its file. Taken a file a batch or all in one, tumbling
    and sliding windows and a keyed step set aside the same late records, each judged by
    its own file's time, and the windows are the same (a 5.5 s record feeds only the one
    of its two sliding windows still open when its file was written). A keyed step's
    timers fire at batch boundaries, so its output is not compared: see docs/keyed.md."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(3):
        modified = t0 + timedelta(seconds=10 * i)
        rows = [
            {
                "user": "a",
                "ts": (modified - timedelta(seconds=s)).isoformat(),
                "amount": i,
                "action": "view",
            }
            for s in (0.5, 5.5, 8.0)
        ]
        write_json_lines(tmp_path / "in", f"f{i}.json", rows, int(modified.timestamp()))
    files = FileSource(
        path=str(tmp_path / "in"),
        format="json",
        schema_ddl="user STRING, ts TIMESTAMP, amount LONG, action STRING",
        ingestion_time="modified",
    )
    sliding = WINDOWS.model_copy(update={"window": Sliding(size="2 seconds", slide="1 second")})
    steps: dict[str, dict[str, Any]] = {
        "windows": {"aggregation": WINDOWS},
        "sliding": {"aggregation": sliding},
        "keyed": {"keyed": Keyed(processor=Sessions, keys=("user",), output_schema=SESSIONS)},
    }
    pipeline = Pipeline(
        name="clock",
        source=files,
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts", watermark=LAG),
        **steps[step],
    )
    one_a_batch = pipeline.model_copy(
        update={"source": files.model_copy(update={"max_files_per_batch": 1})}
    )
    later = FakeClock(int(t0.timestamp() * 1000) + 3_600_000)
    for name, run in (("many", one_a_batch), ("one", pipeline)):
        MicroBatchRunner(spark, run, tmp_path / name, later).run(max_batches=None)
    many, one = _results(tmp_path / "many"), _results(tmp_path / "one")
    assert len(many["late"]) == late
    compared = ["late"] if step == "keyed" else many.keys()
    assert {k: len(set(many[k]) ^ set(one[k])) for k in compared} == dict.fromkeys(compared, 0)


def test_a_stream_join_taken_in_one_batch_or_in_many_joins_and_sets_aside_the_same_rows(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Views (files, judged by their modification times, 10 s apart) joined with clicks (a
    paced synthetic source: click i happens at second i and is ingested at second i + 1,
    a third of them 8 s late). Per file of views, one 0.5 s old and one 2 s old join the
    clicks up to 2 s after them, one 8 s old is behind its own clock; so are the late
    clicks. Taken a file and five clicks a batch, or all in one batch, the pairs, the
    views emitted alone and the records set aside are the same."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(3):
        viewed = t0 + timedelta(seconds=10 * (i + 1))
        views = [
            {"key": "k0", "ts": (viewed - timedelta(seconds=s)).isoformat(), "page": f"{i}-{s}"}
            for s in (0.5, 2.0, 8.0)
        ]
        write_json_lines(tmp_path / "views", f"v{i}.json", views, int(viewed.timestamp()))

    def joined(files: int, clicks: int) -> Pipeline:
        views = FileSource(
            path=str(tmp_path / "views"),
            format="json",
            schema_ddl="key STRING, ts TIMESTAMP, page STRING",
            ingestion_time="modified",
            max_files_per_batch=files,
        )
        paced = SyntheticSource(
            keys=1,
            rows_per_second=1,
            total_rows=30,
            start=t0.isoformat(),
            late_fraction=0.3,
            late_by="8 seconds",
            max_rows_per_batch=clicks,
            starting_offsets="earliest",
        )
        return Pipeline(
            name="clock",
            source=UnionSource(sources={"views": views, "clicks": paced}),
            sink=DeltaSink(path="out"),
            event_time=EventTime(column="ts", watermark=LAG),
            stream_join=StreamJoin(
                left="views",
                right="clicks",
                keys=("key",),
                how="left",
                time=JoinTime(left="ts", right="event_time", upper="2 seconds"),
            ),
        )

    later = FakeClock(int(t0.timestamp() * 1000) + 3_600_000)
    for name, run in (("many", joined(1, 5)), ("one", joined(100, 100))):
        MicroBatchRunner(spark, run, tmp_path / name, later).run(max_batches=None)
    many, one = _results(tmp_path / "many"), _results(tmp_path / "one")
    late = [json.loads(r[-1]) for r in many["late"]]
    assert {"page" in r for r in late} == {True, False}  # views and clicks set aside
    assert any(None not in r for r in many["windows"])  # pairs
    assert _differences(many, one) == dict.fromkeys(many, 0)


def test_a_record_beyond_max_future_of_its_own_ingestion_time_is_set_aside_live_and_later(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Three files 10 s apart, each with a record 40 minutes ahead of its file's time
    (max_future 30 minutes) and two on time. Read live (a batch as each file lands) and
    as a backlog an hour later (when 40 minutes ahead of the file is no longer 30 minutes
    ahead of the clock), the same records are set aside for the same reason, and the
    windows are the same."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    pipeline = Pipeline(
        name="clock",
        source=FileSource(
            path="in",
            format="json",
            schema_ddl="user STRING, ts TIMESTAMP, amount LONG",
            ingestion_time="modified",
            max_files_per_batch=1,
        ),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts", watermark=LAG, max_future="30 minutes"),
        aggregation=WINDOWS,
    )
    live = FakeClock(int(t0.timestamp() * 1000))
    runner = MicroBatchRunner(spark, pipeline, tmp_path / "live", live)
    for i in range(3):
        landed = t0 + timedelta(seconds=10 * i)
        rows = [
            {"user": "a", "ts": (landed + timedelta(seconds=s)).isoformat(), "amount": i}
            for s in (-0.5, -1.0, 2400.0)
        ]
        for root in ("live", "backlog"):
            write_json_lines(tmp_path / root / "in", f"f{i}.json", rows, int(landed.timestamp()))
        live.now = int(landed.timestamp() * 1000) + 1000
        runner.run(max_batches=None)
    later = FakeClock(int(t0.timestamp() * 1000) + 3_600_000)
    live.now = later.now  # the live run's last windows close as time goes on
    runner.run(max_batches=None)
    MicroBatchRunner(spark, pipeline, tmp_path / "backlog", later).run(max_batches=None)
    backlog, on_time = _results(tmp_path / "backlog"), _results(tmp_path / "live")
    reasons = [r[1] for r in backlog["late"]]
    assert reasons == ["event time more than max_future ahead of its ingestion time"] * 3
    assert _differences(on_time, backlog) == dict.fromkeys(on_time, 0)
