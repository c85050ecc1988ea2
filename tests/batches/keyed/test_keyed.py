"""A keyed step end to end: the sessions example (``examples.keyed.Sessions``) over files in
batches, through lowmark's batch loop into a Delta sink, equals the sessions its rule gives over
the whole input; timers fire in batches with no new input; every record is accounted for."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from examples.keyed import ALERTS, SESSIONS, SILENCE_MS, Sessions, SilenceAlert
from lowmark.batches.admin.status import pipeline_plan, pipeline_status
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.loop.batch_work import BatchWork
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, FileSource, Maintenance, Pipeline
from lowmark.batches.registry import get_pipeline
from lowmark.batches.windows import EventTime
from lowmark.state.checkpoint import Checkpoint
from tests.batches.keyed.sessions import events, sessions
from tests.helpers import REPO, FakeClock, delta_frame, write_json_lines

SCHEMA = "user STRING, ts TIMESTAMP, action STRING"


def _pipeline() -> Pipeline:
    return Pipeline(
        name="sessions",
        source=FileSource(path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=1),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts"),
        keyed=Keyed(processor=Sessions, keys=("user",), output_schema=SESSIONS),
        # Maintenance every other batch: state compacted and old timer slots gone between
        # batches, the results unchanged.
        maintenance=Maintenance(every_batches=2),
    )


def _write_sessions(root: Path, stream: pd.DataFrame, files: int) -> None:
    """``stream`` in ``files`` files under ``root/in``, and a last record, of another user, far
    on: every session before it is over."""
    cuts = sorted(random.Random(5).sample(range(1, len(stream)), files - 1))
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(stream)], strict=True)):
        rows = [
            {"user": r.user, "ts": r.ts.isoformat(), "action": r.action}
            for r in stream.iloc[a:b].itertuples()
        ]
        write_json_lines(root / "in", f"f{i:03d}.json", rows, 1_700_000_000 + i)
    end = stream["ts"].max() + pd.Timedelta(hours=3)
    last = [{"user": "zz", "ts": end.isoformat(), "action": "view"}]
    write_json_lines(root / "in", "f999.json", last, 1_700_000_999)


def test_sessions_through_the_batch_loop_equal_sessions_over_the_whole_input(
    spark: SparkSession, tmp_path: Path
) -> None:
    stream = events(5)[:60]
    _write_sessions(tmp_path, stream, 5)

    results = MicroBatchRunner(spark, _pipeline(), tmp_path, FakeClock()).run(max_batches=None)

    got = pd.DataFrame(delta_frame(spark, tmp_path / "out").toPandas())
    found = sorted(
        (
            r.user,
            r.session_start.value // 1_000_000,
            r.session_end.value // 1_000_000,
            r.events,
            r.ended_by,
        )
        for r in got.itertuples()
    )
    assert found == sessions(stream)
    assert any(r.rows_in == 0 and r.rows_out > 0 for r in results), "no batch fired timers alone"
    commits = Checkpoint(str(tmp_path / "_lowmark" / "sessions"), "sessions").commits.get_range()
    for c in commits:
        assert (
            c.rows_in == c.rows_bad + c.rows_dropped + c.rows_duplicate + c.rows_late + c.rows_keyed
        )
    assert sum(c.rows_keyed for c in commits) == len(stream) + 1


def test_silence_alerts_equal_the_silences_over_the_whole_input_and_status_shows_what_is_held(
    spark: SparkSession, tmp_path: Path
) -> None:
    rng = random.Random(11)
    now, events = 0, []
    for _ in range(40):
        now += rng.choice([1, 2, 4, 9, 12, 30]) * 1000
        events.append((rng.choice("abc"), now))
    cuts = sorted(rng.sample(range(1, len(events)), 5))
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(events)], strict=True)):
        rows = [{"user": u, "ts": _at(ms), "amount": 1} for u, ms in events[a:b]]
        write_json_lines(tmp_path / "in", f"f{i:03d}.json", rows, 1_700_000_000 + i)
    pipeline = Pipeline(
        name="alerts",
        source=FileSource(
            path="in",
            format="json",
            schema_ddl="user STRING, ts TIMESTAMP, amount LONG",
            max_files_per_batch=1,
        ),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts"),
        keyed=Keyed(processor=SilenceAlert, keys=("user",), output_schema=ALERTS),
    )
    MicroBatchRunner(spark, pipeline, tmp_path, FakeClock()).run(max_batches=None)

    # The rule over the whole input: every silence of more than 10 s between two events
    # of a user, and each user's last silence once the watermark (the newest event) is
    # 10 s past it.
    watermark, expected = events[-1][1], []
    for user in "abc":
        times = [ms for u, ms in events if u == user]
        expected += [(user, a) for a, b in itertools.pairwise(times) if b - a > SILENCE_MS]
        if times and times[-1] + SILENCE_MS <= watermark:
            expected.append((user, times[-1]))
    got = pd.DataFrame(delta_frame(spark, tmp_path / "out").toPandas())
    since = sorted((r.user, r.silent_since.value // 1_000_000 - _T0_MS) for r in got.itertuples())
    assert since == sorted(expected)
    assert all(
        r.alerted_at.value // 1_000_000 == r.silent_since.value // 1_000_000 + SILENCE_MS
        for r in got.itertuples()
    )
    status = pipeline_status(spark, pipeline, tmp_path)
    still = [u for u in "abc" if (u, max(ms for v, ms in events if v == u)) not in expected]
    assert status.keyed is not None
    assert (status.keyed.keys, status.keyed.timers) == (len(still), len(still))
    assert status.accounting["into_processor"] == len(events)


def test_timers_fired_on_the_driver_leave_the_sink_state_and_timers_a_run_in_spark_leaves(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch without input runs its keyed step on the driver (``KeyedStep.fired``): the
    same sessions, state rows, timer rows and commits as the same batches with the step in
    Spark."""
    stream = events(7)[:30]
    # No maintenance: the tables keep every batch's change rows, not only the newest.
    whole = _pipeline().model_copy(update={"maintenance": Maintenance(every_batches=1000)})
    left = {}
    for run in ("driver", "spark"):
        _write_sessions(tmp_path / run, stream, 3)
        with monkeypatch.context() as patched:
            if run == "spark":
                patched.setattr(BatchWork, "fires_on_driver", lambda _self, _batch: False)
            MicroBatchRunner(spark, whole, tmp_path / run, FakeClock()).run(max_batches=None)
        left[run] = _left_behind(tmp_path / run)

    commits = left["driver"]["commits"]
    assert any(c[1] == 0 and c[2] > 0 for c in commits), "no batch fired timers alone"
    assert {name: len(rows) for name, rows in left["driver"].items()} == {
        name: len(rows) for name, rows in left["spark"].items()
    }
    assert left["driver"] == left["spark"]


def _left_behind(root: Path) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of the sessions pipeline's sink, keyed state and timer tables under ``root``,
    and each commit's batch, counts, next watermark and next timer."""
    location = root / "_lowmark" / "sessions"
    tables = {"sink": root / "out", **{t: location / t for t in ("keyed_state", "keyed_timers")}}
    left = {
        name: sorted(
            (tuple(r.values()) for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist()),
            key=repr,
        )
        for name, path in tables.items()
    }
    left["commits"] = [
        (c.batch_id, c.rows_in, c.rows_out, c.rows_keyed, c.next_watermark_ms, c.next_timer_ms)
        for c in Checkpoint(str(location), "sessions").commits.get_range()
    ]
    return left


class _Reminder(StatefulProcessor):
    """A row for each key one second of processing time after it was last seen."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1000)
        return iter(())

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        yield pd.DataFrame({"user": [key[0]], "due_ms": [expiredTimerInfo.getExpiryTimeInMs()]})

    def close(self) -> None:
        pass


def test_processing_time_timers_fire_by_the_clock_in_a_batch_without_input(
    spark: SparkSession, tmp_path: Path
) -> None:
    clock = FakeClock()
    write_json_lines(tmp_path / "in", "f0.json", [{"user": "a", "ts": _at(0), "action": "x"}], 1)
    pipeline = _pipeline().model_copy(
        update={
            "keyed": Keyed(
                processor=_Reminder,
                keys=("user",),
                output_schema="user string, due_ms long",
                time_mode="processing_time",
            )
        }
    )
    runner = MicroBatchRunner(spark, pipeline, tmp_path, clock)
    planned_at = clock.now
    assert [r.rows_out for r in runner.run(max_batches=None)] == [0]
    clock.advance(999)
    assert runner.run(max_batches=None) == []  # not due yet: no batch
    clock.advance(1)
    plan = pipeline_plan(spark, pipeline, tmp_path, clock)
    assert (
        plan.emit_only and plan.reason == "a keyed step's timer is due: it fires without new data"
    )
    [fired] = runner.run(max_batches=None)
    assert (fired.rows_in, fired.rows_out) == (0, 1)
    got = delta_frame(spark, tmp_path / "out").collect()
    assert [(r.user, r.due_ms) for r in got] == [("a", planned_at + 1000)]
    assert runner.run(max_batches=None) == []  # fired once


_T0_MS = int(pd.Timestamp("2026-01-01", tz="UTC").timestamp() * 1000)


def _at(ms: int) -> str:
    return (pd.Timestamp("2026-01-01", tz="UTC") + pd.Timedelta(milliseconds=ms)).isoformat()


def test_the_latest_status_per_device_declared_in_yaml_is_upserted_one_row_per_device(
    spark: SparkSession, tmp_path: Path
) -> None:
    readings = [
        [("d1", 0, "ok"), ("d2", 1, "ok"), ("d1", 2, "hot")],
        [("d1", 3, "hot"), ("d3", 4, "off")],
        [("d2", 5, "off"), ("d1", 6, "ok"), ("d2", 7, "off")],
    ]
    for i, batch in enumerate(readings):
        rows = [{"device": d, "ts": _at(s * 1000), "status": st} for d, s, st in batch]
        write_json_lines(tmp_path / "devices" / "readings", f"f{i}.json", rows, 1_700_000_000 + i)
    pipeline = get_pipeline("device_status", str(REPO / "examples" / "pipelines.yaml"))
    MicroBatchRunner(spark, pipeline, tmp_path, FakeClock()).run(max_batches=None)

    # Per device over all readings: its last status, since when it has had it, how many.
    expected = {}
    for device in ("d1", "d2", "d3"):
        mine = [(s, st) for batch in readings for d, s, st in batch if d == device]
        since = mine[-1][0]
        for s, st in reversed(mine):
            if st != mine[-1][1]:
                break
            since = s
        expected[device] = (mine[-1][1], since * 1000, len(mine))
    got = delta_frame(spark, tmp_path / "devices" / "status").collect()
    assert {
        r.device: (r.status, int(r.since.timestamp() * 1000) - _T0_MS, r.readings) for r in got
    } == expected
