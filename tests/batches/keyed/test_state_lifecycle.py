"""A keyed state's lifecycle through the batch loop: its TTL runs by the batches' processing
time (a replay by the one recorded for it, however late it runs); a nullable field added to
its schema reads the values held as null; a field's type changed is refused before any
Spark work, in one line naming the state and the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import TimerValues

from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.keyed.runtime import Handle
from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.loop.parts import read_only_planner
from lowmark.batches.pipeline import DeltaSink, FileSource, Pipeline
from lowmark.batches.windows import EventTime
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.commit_log import CommitEntry
from lowmark.state.errors import FingerprintMismatch
from tests.helpers import FakeClock, delta_frame, entry, write_json_lines

TTL_MS = 60_000
OUTPUT = "user string, first timestamp, n long, seen long, last timestamp"


class _Visits(StatefulProcessor):
    """Per user: the first visit and the visits counted while the state lives (it expires
    a minute after its last write); yields what it counted and, with a ``last`` field in its
    schema, the last visit it held."""

    SCHEMA = "first timestamp, n long"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.visits = handle.getValueState("visits", self.SCHEMA, ttlDurationMs=TTL_MS)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        visits = pd.concat(list(rows))
        held = self.visits.get()
        first = held[0] if held is not None else visits["ts"].min().to_pydatetime()
        if key[0] == "wrong":  # a processor's mistake: a string where a timestamp goes
            first = first.isoformat()
        n = (held[1] if held is not None else 0) + len(visits)
        last = visits["ts"].max().to_pydatetime()
        self.visits.update((first, n, last)[: len(self.SCHEMA.split(","))])
        yield pd.DataFrame(
            {
                "user": [key[0]],
                "first": [first],
                "n": [n],
                "seen": [held[1] if held is not None else None],
                "last": [held[2] if held is not None and len(held) > 2 else None],
            }
        )

    def close(self) -> None:
        pass


def _pipeline(schema: str) -> Pipeline:
    # One import path whatever the schema: as when a user edits the class.
    return _visits(type("Visits", (_Visits,), {"SCHEMA": schema, "__module__": __name__}))


def _visits(processor: type[StatefulProcessor]) -> Pipeline:
    """Visits of users (``user``, ``ts``), one file a batch, through ``processor``."""
    return Pipeline(
        name="visits",
        source=FileSource(
            path="in", format="json", schema_ddl="user STRING, ts TIMESTAMP", max_files_per_batch=1
        ),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts"),
        keyed=Keyed(processor=processor, keys=("user",), output_schema=OUTPUT),
    )


def _visit(root: Path, i: int, user: str = "a") -> pd.Timestamp:
    at = pd.Timestamp("2026-01-01", tz="UTC") + pd.Timedelta(minutes=i)
    write_json_lines(root / "in", f"f{i}.json", [{"user": user, "ts": at.isoformat()}], 1000 + i)
    return at


def _s(moment: Any) -> float | None:
    """Epoch seconds of a timestamp Spark collected (None: null)."""
    return moment.timestamp() if moment is not None else None


def test_ttl_runs_by_recorded_processing_time_and_schema_changes_are_judged(
    spark: SparkSession, tmp_path: Path
) -> None:
    clock = FakeClock()
    v1 = _pipeline("first timestamp, n long")
    ts = [_visit(tmp_path, 0)]
    MicroBatchRunner(spark, v1, tmp_path, clock).run(max_batches=None)

    # Batch 1 dies after its state write, and is replayed ten minutes later: by its
    # recorded processing time the value batch 0 wrote has not expired.
    clock.advance(30_000)
    ts.append(_visit(tmp_path, 1))

    with crash_at(KillPoint("after_state", 1)), pytest.raises(InjectedCrash):
        MicroBatchRunner(spark, v1, tmp_path, clock).run(max_batches=None)
    clock.advance(600_000)
    [replayed] = MicroBatchRunner(spark, v1, tmp_path, clock).run(max_batches=None)
    assert replayed.replay

    # Batch 2, now: the value batch 1 wrote (at its processing time) expired a minute on.
    ts.append(_visit(tmp_path, 2))
    MicroBatchRunner(spark, v1, tmp_path, clock).run(max_batches=None)

    # A nullable field added: the value held reads with it null.
    v2 = _pipeline("first timestamp, n long, last timestamp")
    clock.advance(10_000)
    ts.append(_visit(tmp_path, 3))
    MicroBatchRunner(spark, v2, tmp_path, clock).run(max_batches=None)

    got = sorted(
        (_s(r.first), r.n, r.seen, _s(r.last))
        for r in delta_frame(spark, tmp_path / "out").collect()
    )
    at = [t.timestamp() for t in ts]
    assert got == sorted(
        [
            (at[0], 1, None, None),
            (at[0], 2, 1, None),  # the replay: batch 0's value still held
            (at[2], 1, None, None),  # expired: counting starts over
            (at[2], 2, 1, None),  # the new field reads as null
        ]
    )
    state = delta_frame(spark, tmp_path / "_lowmark" / "visits" / "keyed_state")
    [newest] = (
        state.where("batch_id = 3")
        .selectExpr("get_json_object(value, '$.last') AS last", "expires_ms")
        .collect()
    )
    assert newest.last == "2026-01-01T00:03:00Z"
    assert newest.expires_ms == clock.now + TTL_MS  # batch 3's processing time + TTL

    # A value the schema does not hold fails the batch, in one line naming state and field.
    _visit(tmp_path, 4, user="wrong")
    runner = MicroBatchRunner(spark, v2, tmp_path, clock)
    with pytest.raises(Exception) as failed:
        runner.run(max_batches=None)
    report = runner.failure_report(failed.value)
    assert report is not None and "\n" not in report
    assert "state 'visits' field 'first' (timestamp): '2026-01-01T00:04:00+00:00'" in report, report

    # A field's type changed: refused before Spark work, in one line.
    v3 = _pipeline("first string, n long, last timestamp")
    with pytest.raises(FingerprintMismatch) as refused:
        MicroBatchRunner(spark, v3, tmp_path, clock).run(max_batches=None)
    message = str(refused.value)
    assert "\n" not in message
    assert "state 'visits': field 'first' changed type timestamp -> string" in message
    assert "lowmark reset visits" in message
    assert delta_frame(spark, tmp_path / "out").count() == 4


def test_a_checkpoint_from_before_state_schemas_were_recorded_runs_on(
    spark: SparkSession, tmp_path: Path
) -> None:
    pipeline = _pipeline("first timestamp, n long")
    before = pipeline.definition()
    del before["keyed"]["states"]
    checkpoint = Checkpoint(pipeline.checkpoint_location(tmp_path), pipeline.name)
    recorded = entry(0).model_copy(
        update={"pipeline_fingerprint": "before-states", "pipeline_definition": before}
    )
    checkpoint.offsets.add(recorded)
    checkpoint.commits.add(CommitEntry(batch_id=0, runner_id="r1"))

    planner = read_only_planner(spark, pipeline, tmp_path)
    assert planner.next_batch(dry_run=True).planned is None  # no new input: nothing, no refusal


class _EventTimeVisits(StatefulProcessor):
    """Per user: the visits counted while the state lives; it expires a minute of event time
    after the newest visit that wrote it (``ttlClock="event_time"``)."""

    def init(self, handle: Handle) -> None:  # type: ignore[override]
        self.visits = handle.getValueState(
            "visits", "n long", ttlDurationMs=TTL_MS, ttlClock="event_time"
        )

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        visits = pd.concat(list(rows))
        held = self.visits.get()
        n = (held[0] if held is not None else 0) + len(visits)
        self.visits.update((n,))
        last = visits["ts"].max().to_pydatetime()
        yield pd.DataFrame(
            {"user": [key[0]], "first": [last], "n": [n], "seen": [None], "last": [last]}
        )

    def close(self) -> None:
        pass


def test_an_event_time_ttl_expires_as_the_watermark_passes_the_write_plus_the_ttl(
    spark: SparkSession, tmp_path: Path
) -> None:
    clock = FakeClock()  # processing time stands still: only event time expires the state
    pipeline = _visits(_EventTimeVisits)
    # Minutes of event time, one file (one batch) each: a's visit at 0 expires at 1:00; its
    # visit at 0:30 (watermark 0:00) renews it to 1:30; b's visit at 5:00 moves the
    # watermark past 1:30, so a's visit at 5:10 finds nothing held.
    for i, (user, minute) in enumerate([("a", 0), ("a", 0.5), ("b", 5), ("a", 5 + 1 / 6)]):
        at = pd.Timestamp("2026-01-01", tz="UTC") + pd.Timedelta(minutes=minute)
        write_json_lines(
            tmp_path / "in", f"f{i}.json", [{"user": user, "ts": at.isoformat()}], 1000 + i
        )
    MicroBatchRunner(spark, pipeline, tmp_path, clock).run(max_batches=None)

    got = [(r.user, r.n) for r in delta_frame(spark, tmp_path / "out").orderBy("last").collect()]
    assert got == [("a", 1), ("a", 2), ("b", 1), ("a", 1)]
    state = delta_frame(spark, tmp_path / "_lowmark" / "visits" / "keyed_state")
    expires = [r.expires_ms for r in state.where("state = 'visits'").orderBy("batch_id").collect()]
    start = int(pd.Timestamp("2026-01-01", tz="UTC").timestamp() * 1000)
    assert expires == [start + TTL_MS, start + 30_000 + TTL_MS, start + 300_000 + TTL_MS,
                       start + 310_000 + TTL_MS]  # fmt: skip
    # Status counts by the watermark too: at 5:10, a (expires 6:10) and b (6:00) are held.
    status = pipeline_status(spark, pipeline, tmp_path, clock)
    assert status.keyed is not None and status.keyed.keys == 2
