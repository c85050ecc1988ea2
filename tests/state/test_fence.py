"""The write-ahead fence across processes: two runners claiming batch N, exactly one wins.

The offset log is written by delta-rs from the driver, whose local commits
are atomic put-if-absent across processes; a lost commit is re-read, and a
batch id another runner holds is ConcurrentRunner. No Spark here at all.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path

from lowmark.state.errors import ConcurrentRunner
from lowmark.state.offset_log import OffsetEntry, OffsetLog
from tests.helpers import entry

BATCHES = 12


def claim_each_batch(path: str, runner: str, barrier: Barrier, won: list[int]) -> None:
    """Claim batches 0..BATCHES-1 in step with the other runner; record which it won."""
    log = OffsetLog(path, OffsetEntry, "pid:offsets")
    for batch_id in range(BATCHES):
        barrier.wait()
        try:
            log.claim(entry(batch_id, runner=runner, end=batch_id))
            won.append(batch_id)
        except ConcurrentRunner:
            pass


def test_two_processes_claiming_the_same_batches_each_batch_has_exactly_one_winner(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "offsets")
    OffsetLog(path, OffsetEntry, "pid:offsets").create()
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        barrier = manager.Barrier(2)
        won = {name: manager.list() for name in ("first", "second")}
        processes = [
            context.Process(target=claim_each_batch, args=(path, name, barrier, won[name]))
            for name in won
        ]
        for p in processes:
            p.start()
        for p in processes:
            p.join(timeout=120)
        assert [p.exitcode for p in processes] == [0, 0]
        winners = {name: set(batches) for name, batches in won.items()}

    assert winners["first"] | winners["second"] == set(range(BATCHES))
    assert not winners["first"] & winners["second"]
    log = OffsetLog(path, OffsetEntry, "pid:offsets")
    stored = {e.batch_id: e.runner_id for e in log.get_range()}
    assert len(log.get_range()) == BATCHES  # one entry per batch: the loser wrote nothing
    for name, batches in winners.items():
        assert all(stored[b] == name for b in batches)
