"""Turns on one Spark: the warm runner's runs run their batches a few at a time, first asked
first served, and a caught-up follower's poll takes no turn and starts no Spark job."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from pyspark.sql import SparkSession

from lowmark.batches.loop.events import BatchResult, BatchStarted
from lowmark.batches.loop.listeners import PipelineListener
from lowmark.batches.pipeline import DeltaSink, FileSource
from lowmark.orchestration.turns import TakingTurns, Turns
from tests.helpers import JobCounter, drop_file, pipeline


class Timed(PipelineListener):
    """When each batch started (planned, in its turn) and committed, by wall clock."""

    def __init__(self) -> None:
        self.started: dict[int, float] = {}
        self.committed: dict[int, float] = {}

    def on_batch_started(self, event: BatchStarted) -> None:
        self.started[event.batch_id] = time.monotonic()

    def on_batch_progress(self, progress: BatchResult) -> None:
        self.committed[progress.batch_id] = time.monotonic()


def test_turns_are_granted_in_the_order_they_were_asked_for_one_at_a_time() -> None:
    turns, order = Turns(1), []
    asking: list[threading.Thread] = []

    def ask(n: int) -> None:
        with turns.turn():
            order.append(n)

    with turns.turn():
        for n in range(5):
            asking.append(threading.Thread(target=ask, args=(n,)))
            asking[-1].start()
            while len(turns._waiting) <= n:  # each asks before the next
                time.sleep(0.001)
    for thread in asking:
        thread.join(5)
    assert order == [0, 1, 2, 3, 4]


def test_a_caught_up_follower_polls_without_a_turn_and_without_a_spark_job(
    spark: SparkSession, data_root: Path
) -> None:
    turns = Turns(1)
    drop_file(data_root, 0)
    runner = TakingTurns(spark, pipeline(), data_root, turns=turns)
    assert runner.run_batch() is not None
    released = threading.Event()

    def hold_the_only_turn() -> None:
        with turns.turn():
            released.wait(10)

    holder = threading.Thread(target=hold_the_only_turn)
    holder.start()
    counter = JobCounter(spark)
    spark.sparkContext.setJobGroup(counter.group, "idle polls")
    try:
        polled = time.monotonic()
        assert [runner.run_batch() for _ in range(20)] == [None] * 20
        polled_s = time.monotonic() - polled
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        released.set()
        holder.join()
    assert polled_s < 2  # asking for the held turn would have waited for the holder (10 s)
    assert counter.jobs() == 0


def test_two_pipelines_batches_do_not_overlap_when_the_runner_runs_one_at_a_time(
    spark: SparkSession, data_root: Path
) -> None:
    turns = Turns(1)
    runners, heard = [], []
    waits: list[list[float]] = []
    for name in ("a", "b"):
        source = FileSource(path=f"{name}/in", format="json", schema_ddl="id LONG, amount LONG")
        drop_file(data_root / name, 0)
        p = pipeline(name=name, source=source, sink=DeltaSink(path=f"{name}/out"))
        waits.append([])
        runners.append(
            TakingTurns(spark.newSession(), p, data_root, turns=turns, waited=waits[-1].append)
        )
        heard.append(Timed())
        runners[-1].add_listener(heard[-1])

    # Both at once: side by side, two batches of a second or more would overlap.
    threads = [threading.Thread(target=r.run_batch) for r in runners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    (a_start, a_end), (b_start, b_end) = [(h.started[0], h.committed[0]) for h in heard]
    assert a_end <= b_start or b_end <= a_start, "two batches ran at once on one turn"
    assert sorted(len(w) for w in waits) == [0, 1]  # the second was told it waited
