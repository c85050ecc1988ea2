"""A keyed step before windows: the sessions a keyed processor closes, counted per 10-minute
tumbling window of when they closed, batch by batch through the loop, equal the counts the
sessions rule gives over the whole input; the window stage runs with the keyed step's
watermark of the batch before, so rows below it are late (counted, in the late table), and
an idle stream still closes its last windows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from examples.keyed import CLOSED_SESSIONS, INACTIVITY_MS, SESSIONS, ClosedSessions, Sessions
from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.loop.faults import STEPS, KillPoint
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, FileSource, Pipeline
from lowmark.batches.windows import Aggregate, EventTime, Tumbling, WindowedAggregation
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.commit_log import CommitEntry
from tests.batches.keyed.sessions import events, sessions
from tests.faults.harness import differences, in_process_crash, run_to_completion, snapshot
from tests.helpers import FakeClock, delta_frame, lowmark, write_json_lines

SCHEMA = "user STRING, ts TIMESTAMP, action STRING"
WINDOW_MS = 10 * 60_000


def _pipeline(source: str = "in", **keyed: Any) -> Pipeline:
    step = {
        "processor": ClosedSessions,
        "keys": ("user",),
        "output_schema": CLOSED_SESSIONS,
        "output_event_time": "closed_at",
    }
    return Pipeline(
        name="closed_sessions",
        source=FileSource(path=source, format="json", schema_ddl=SCHEMA, max_files_per_batch=1),
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
    got = pd.DataFrame(delta_frame(spark, root / "out").toPandas())
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


def test_sessions_counted_per_window_equal_the_counts_over_the_whole_input_and_all_close(
    spark: SparkSession, tmp_path: Path
) -> None:
    stream = events(5)[:24]
    _drop(tmp_path, stream, [11])
    # A last record, of another user, far on: every session before it closes, and so does
    # every window they are counted in, once the watermark reaches it.
    end = stream["ts"].max() + pd.Timedelta(hours=3)
    last = [{"user": "zz", "ts": end.isoformat(), "action": "view"}]
    write_json_lines(tmp_path / "in", "f999.json", last, 1_700_000_999)

    pipeline = _pipeline()
    results = MicroBatchRunner(spark, pipeline, tmp_path, FakeClock()).run(max_batches=None)

    # The rule over the whole input: every session closes at its logout or 30 minutes after
    # its last event; sessions are counted per way they ended and 10-minute window of that.
    counted: dict[tuple[str, int], int] = {}
    for _, _, last, _, why in sessions(stream):
        closed = last if why == "logout" else last + INACTIVITY_MS
        window = (why, closed // WINDOW_MS * WINDOW_MS)
        counted[window] = counted.get(window, 0) + 1
    expected = sorted((why, start, n) for (why, start), n in counted.items())
    assert {"logout", "inactivity"} == {why for why, _ in counted}
    # No input is left after the files: the last windows closed in batches of their own.
    assert any(r.rows_in == 0 for r in results), "no batch ran without input"
    assert _windows(spark, tmp_path) == expected
    commits = _commits(tmp_path)
    assert all(_balanced(c) for c in commits)
    assert sum(c.rows_late for c in commits) == 0
    assert sum(c.rows_emitted for c in commits) == len(sessions(stream))
    assert sum(c.rows_keyed for c in commits) == len(stream) + 1
    went = pipeline_status(spark, pipeline, tmp_path, FakeClock()).accounting
    assert (
        went["read"] + went["emitted_by_processor"]
        == sum(went[k] for k in ("bad", "dropped_by_transform", "late", "into_processor"))
        + went["in_closed_windows"]
        + went["in_open_windows"]
    )
    assert went["in_open_windows"] == 0


MINUTE = 60_000
FILES = [  # one batch each: user, minute of event time
    [("a", 0)],  # a's session: last event at 0, its timer at 30
    [("b", 5), ("e", 12), ("b", 40)],  # b's first session (5) ends at the gap: window [0, 10)
    [("c", 42)],  # the keyed step runs with 40: a's timer fires, its session joins [0, 10)
    [("d", 50)],  # the keyed step 42, the windows 40: e's timer fires, [10, 20) is closed
]


def _by_last_event(source: Path) -> Pipeline:
    """Sessions counted by their last event (``session_end``): a session its timer closes
    ends 30 minutes before the timer, below the watermark the windows run with then."""
    return _pipeline(
        str(source), processor=Sessions, output_schema=SESSIONS, output_event_time="session_end"
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``FILES`` in a folder each run reads (the files table records their paths)."""
    folder, at = tmp_path_factory.mktemp("in"), pd.Timestamp(0, unit="ms", tz="UTC")
    for i, rows in enumerate(FILES):
        records = [
            {"user": u, "ts": (at + pd.Timedelta(m * MINUTE, unit="ms")).isoformat(), "action": ""}
            for u, m in rows
        ]
        write_json_lines(folder, f"f{i:03d}.json", records, 1_700_000_000 + i)
    return folder


def _run(spark: SparkSession, files: Path, root: Path, crash: KillPoint | None = None) -> None:
    """``files`` through ``_by_last_event``; with ``crash``, a run dies there first. On the
    wall clock, as the crash harness runs (a batch's times are recorded in its logs)."""
    pipeline = _by_last_event(files)
    if crash is not None:
        assert in_process_crash(spark, pipeline)(root, crash), "the crash was not reached"
    run_to_completion(spark, pipeline, root)


@pytest.fixture(scope="module")
def clean(spark: SparkSession, files: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``files`` run with no fault."""
    root = tmp_path_factory.mktemp("clean")
    _run(spark, files, root)
    return root


def test_a_row_emitted_below_the_window_watermark_is_late_not_lost(
    spark: SparkSession, clean: Path
) -> None:
    late = pd.DataFrame(
        delta_frame(spark, clean / "_lowmark" / "closed_sessions" / "late").toPandas()
    )
    # e's timer (at 42) fires in the batch whose keyed step runs with 42; the windows run
    # with 40, which closed e's window [10, 20): e's session is late there, not lost.
    refused = [
        (r.reason.startswith("all windows closed"), r.watermark_ms) for r in late.itertuples()
    ]
    assert refused == [(True, 40 * MINUTE)]
    assert '"user":"e"' in late["record"][0]
    commits = _commits(clean)
    assert all(_balanced(c) for c in commits)
    assert [c.rows_late for c in commits] == [0, 0, 0, 1]
    # b's first session and a's, whose timer fired with the keyed step at 40, are counted.
    assert _windows(spark, clean) == [("inactivity", 0, 2)]


def test_status_counts_the_processor_s_rows_beside_the_records_read(
    capsys: pytest.CaptureFixture[str], files: Path, clean: Path, tmp_path: Path
) -> None:
    defined = tmp_path / "pipelines.yaml"  # JSON is YAML
    defined.write_text(json.dumps({"pipelines": [_by_last_event(files).model_dump(mode="json")]}))
    code, out, _ = lowmark(capsys, clean, "--pipelines", str(defined), "status", "closed_sessions")
    assert code == 0
    # 6 records read, 3 sessions emitted: 1 late (e's), 2 counted in the window [0, 10).
    assert (
        "all batches read 6 + 3 emitted by the keyed processor = 0 bad + 0 dropped by the "
        "transform + 1 late + 6 into the keyed processor + 2 in closed windows (the sink) + 0 "
        "in open windows (the state)"
    ) in " ".join(out.split())


IN_MAKE_TEST = ("after_state",)
"""Steps whose crash runs in `make test`; the others run in `make test-integration`."""


@pytest.mark.parametrize(
    "step",
    [pytest.param(s, marks=[] if s in IN_MAKE_TEST else [pytest.mark.integration]) for s in STEPS],
)
def test_a_crash_at_any_step_replays_to_the_same_sink_late_rows_and_state(
    spark: SparkSession, files: Path, clean: Path, tmp_path: Path, step: str
) -> None:
    """The batch that fires a timer, sets a row aside as late, takes input and closes a
    window dies at ``step``; its replay leaves every table as the run never killed."""
    _run(spark, files, tmp_path, KillPoint(step, 3))
    pipeline = _by_last_event(files)
    assert differences(snapshot(pipeline, clean), snapshot(pipeline, tmp_path)) == []


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
