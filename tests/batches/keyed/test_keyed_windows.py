"""A keyed step before windows: the sessions a keyed processor closes, counted per 10-minute
tumbling window of when they closed, batch by batch through the loop, equal the counts the
sessions rule gives over the whole input; the window stage runs with the keyed step's
watermark of the batch before, so rows below it are late (counted, in the late table), and
an idle stream still closes its last windows."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from examples.keyed import CLOSED_SESSIONS, INACTIVITY_MS, SESSIONS, ClosedSessions, Sessions
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, FileSource, Pipeline
from lowmark.batches.windows import Aggregate, EventTime, Tumbling, WindowedAggregation
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.commit_log import CommitEntry
from tests.batches.keyed.sessions import events, sessions
from tests.helpers import FakeClock, delta_frame, write_json_lines

SCHEMA = "user STRING, ts TIMESTAMP, action STRING"
WINDOW_MS = 10 * 60_000


def _pipeline(**keyed: Any) -> Pipeline:
    step = {
        "processor": ClosedSessions,
        "keys": ("user",),
        "output_schema": CLOSED_SESSIONS,
        "output_event_time": "closed_at",
    }
    return Pipeline(
        name="closed_sessions",
        source=FileSource(path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=1),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts"),
        keyed=Keyed(**(step | keyed)),
        aggregation=WindowedAggregation(
            keys=("ended_by",),
            window=Tumbling(size="10 minutes"),
            aggregates=(Aggregate(fn="count", name="sessions"),),
        ),
    )


def _drop(root: Path, stream: pd.DataFrame, cuts: list[int]) -> None:
    """``stream`` in files split at ``cuts``, one batch each."""
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(stream)], strict=True)):
        rows = [
            {"user": r.user, "ts": r.ts.isoformat(), "action": r.action}
            for r in stream.iloc[a:b].itertuples()
        ]
        write_json_lines(root / "in", f"f{i:03d}.json", rows, 1_700_000_000 + i)


def _windows(spark: SparkSession, root: Path) -> list[tuple[str, int, int]]:
    got = delta_frame(spark, root / "out").toPandas()
    return sorted(
        (r.ended_by, r.window_start.value // 1_000_000, r.sessions) for r in got.itertuples()
    )


def _commits(root: Path) -> list[CommitEntry]:
    ckpt = Checkpoint(str(root / "_lowmark" / "closed_sessions"), "closed_sessions")
    return ckpt.commits.get_range()


def _balanced(commit: CommitEntry) -> bool:
    """The accounting identity of a keyed step before windows (``CommitEntry.totals``)."""
    c = commit
    went = c.rows_bad + c.rows_dropped + c.rows_duplicate + c.rows_late + c.rows_keyed
    return c.rows_in + c.rows_emitted == went + c.rows_windowed


def test_sessions_counted_per_window_equal_the_counts_over_the_whole_input(
    spark: SparkSession, tmp_path: Path
) -> None:
    stream = events(5)[:40]
    _drop(tmp_path, stream, sorted(random.Random(5).sample(range(1, len(stream)), 2)))
    # A last record, of another user, far on: every session before it closes, and so does
    # every window they are counted in, once the watermark reaches it.
    end = stream["ts"].max() + pd.Timedelta(hours=3)
    last = [{"user": "zz", "ts": end.isoformat(), "action": "view"}]
    write_json_lines(tmp_path / "in", "f999.json", last, 1_700_000_999)

    results = MicroBatchRunner(spark, _pipeline(), tmp_path, FakeClock()).run(max_batches=None)
    print([(r.batch_id, r.rows_in, r.rows_out, r.durations_ms.get("total")) for r in results])

    # The rule over the whole input: every session closes at its logout or 30 minutes after
    # its last event; sessions are counted per way they ended and 10-minute window of that.
    counted: dict[tuple[str, int], int] = {}
    for _, _, last, _, why in sessions(stream):
        closed = last if why == "logout" else last + INACTIVITY_MS
        window = (why, closed // WINDOW_MS * WINDOW_MS)
        counted[window] = counted.get(window, 0) + 1
    expected = sorted((why, start, n) for (why, start), n in counted.items())
    # No input is left after the files: the last windows closed in batches of their own.
    assert any(r.rows_in == 0 for r in results), "no batch ran without input"
    assert _windows(spark, tmp_path) == expected
    commits = _commits(tmp_path)
    assert all(_balanced(c) for c in commits)
    assert sum(c.rows_late for c in commits) == 0
    assert sum(c.rows_emitted for c in commits) == len(sessions(stream))
    assert sum(c.rows_keyed for c in commits) == len(stream) + 1


def test_a_row_emitted_below_the_window_watermark_is_late_not_lost(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Sessions counted by their last event (``session_end``): a session its timer closes
    # ends 30 minutes before the timer, below the watermark the windows run with then.
    minute = 60_000
    at = pd.Timestamp(0, unit="ms", tz="UTC")
    batches = [
        [("a", 0)],  # a's session: last event at 0, its timer at 30 minutes
        [("b", 15 * minute)],  # the keyed step's watermark next: 15 minutes
        [("b", 60 * minute)],  # closes b's first session; a's timer fires in the next batch
    ]
    for i, rows in enumerate(batches):
        records = [
            {"user": u, "ts": (at + pd.Timedelta(ms, unit="ms")).isoformat(), "action": "view"}
            for u, ms in rows
        ]
        write_json_lines(tmp_path / "in", f"f{i:03d}.json", records, 1_700_000_000 + i)
    pipeline = _pipeline(
        processor=Sessions, output_schema=SESSIONS, output_event_time="session_end"
    )
    MicroBatchRunner(spark, pipeline, tmp_path, FakeClock()).run(max_batches=None)

    late = delta_frame(spark, tmp_path / "_lowmark" / "closed_sessions" / "late").toPandas()
    # a's timer fires with the keyed step's watermark at 60 minutes; the windows run with
    # 15 minutes, which closed a's window [0, 10 minutes).
    refused = [(r.reason.startswith("all windows closed"), r.watermark_ms) for r in late.itertuples()]
    assert refused == [(True, 15 * minute)]
    assert '"user":"a"' in late["record"][0]
    commits = _commits(tmp_path)
    assert all(_balanced(c) for c in commits)
    assert sum(c.rows_late for c in commits) == 1
    # b's first session (15 to 15 minutes), closed by the gap before its next event: counted.
    assert _windows(spark, tmp_path) == [("inactivity", 10 * minute, 1)]


def test_a_keyed_step_before_windows_needs_their_event_time_and_keys_in_its_output() -> None:
    with pytest.raises((ValueError, PipelineConfigInvalid), match="lacks \\['closed_at'\\]"):
        _pipeline(output_schema=SESSIONS)
    with pytest.raises(ValueError, match="output_event_time"):
        Pipeline(
            name="t",
            source=FileSource(path="in", format="json", schema_ddl=SCHEMA),
            sink=DeltaSink(path="out"),
            event_time=EventTime(column="ts"),
            keyed=Keyed(
                processor=Sessions,
                keys=("user",),
                output_schema=SESSIONS,
                output_event_time="session_end",
            ),
        )
