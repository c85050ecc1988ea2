"""Health of a running pipeline, as the Dagster asset checks report it.

Checks over the checkpoint, with the bounds of the pipeline's ``checks``
(``HealthChecks``); each reads a few rows on the driver and starts no Spark:

- watermark lag (event-time pipelines): processing time of the newest
  committed batch minus the watermark after it — how far event time trails
  the wall clock; a watermark ahead of the wall clock (a negative lag) fails
  it too;
- late share (event-time pipelines): late rows / input rows over the newest
  ``window_batches`` batches — how much data arrives after its windows closed;
- bad share: bad rows (that did not parse, or that ``drop`` expectations
  removed) / input rows over the same batches;
- expectations (pipelines with some): no record violated one over the same
  batches; each expectation's violations are its numbers;
- failing batch: the pending batch has failed attempts (a poison batch once
  it has ``max_failed_attempts``): fails with the batch, its attempts and the
  last error.

A pipeline that committed nothing yet passes, with a description that says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lowmark.batches.admin.status import pipeline_history
from lowmark.batches.pipeline import Pipeline
from lowmark.state.checkpoint import Checkpoint


@dataclass(frozen=True)
class CheckOutcome:
    passed: bool
    description: str
    metadata: dict[str, float] = field(default_factory=dict)
    """Numbers in one unit each: seconds for lags, percent for shares, counts for rows."""


def watermark_lag(pipeline: Pipeline, data_root: Path) -> CheckOutcome:
    """Passes while the newest batch's watermark lag is within ``max_watermark_lag``."""
    bound_s = pipeline.checks.max_watermark_lag / 1000
    newest = pipeline_history(pipeline, data_root, last=1)
    if not newest:
        return CheckOutcome(True, "no batch committed yet")
    lag_ms = newest[0]["lag_ms"]
    if lag_ms is None:
        return CheckOutcome(True, "no event time seen yet: no watermark")
    lag_s = round(lag_ms / 1000, 1)
    numbers = {"lag_seconds": lag_s, "bound_seconds": bound_s}
    if lag_s < 0:
        return CheckOutcome(
            False,
            f"batch {newest[0]['batch_id']}: watermark {-lag_s:.0f} s AHEAD of processing "
            "time: event times from the future moved it (lower event_time.max_future, and "
            "find them in the late table)",
            numbers,
        )
    verdict = "within" if lag_s <= bound_s else "over"
    return CheckOutcome(
        lag_s <= bound_s,
        f"batch {newest[0]['batch_id']}: watermark lag {lag_s:.0f} s, {verdict} {bound_s:.0f} s",
        numbers,
    )


def late_fraction(pipeline: Pipeline, data_root: Path) -> CheckOutcome:
    """Passes while late rows / input rows over recent batches is within ``max_late_fraction``."""
    return _share(pipeline, data_root, "rows_late", "late", pipeline.checks.max_late_fraction)


def bad_fraction(pipeline: Pipeline, data_root: Path) -> CheckOutcome:
    """Passes while bad rows / input rows over recent batches is within
    ``max_bad_fraction``."""
    return _share(pipeline, data_root, "rows_bad", "bad", pipeline.checks.max_bad_fraction)


def expectations(pipeline: Pipeline, data_root: Path) -> CheckOutcome:
    """Passes while no record of the recent batches violated one of the pipeline's
    expectations (``lowmark.batches.expectations``); says how many did, per expectation."""
    recent = pipeline_history(pipeline, data_root, last=pipeline.checks.window_batches)
    if not recent:
        return CheckOutcome(True, "no batch committed yet")
    rows_in = sum(r["rows_in"] for r in recent)
    counts = {
        e.name: sum((r.get("violations") or {}).get(e.name, 0) for r in recent)
        for e in pipeline.expectations
    }
    said = ", ".join(f"{e.name} ({e.on_violation}) {counts[e.name]}" for e in pipeline.expectations)
    return CheckOutcome(
        not any(counts.values()),
        f"records of {rows_in} violating each expectation over the last {len(recent)} "
        f"batches: {said}",
        {f"violations_{name}": n for name, n in counts.items()},
    )


def _share(
    pipeline: Pipeline, data_root: Path, column: str, what: str, bound: float
) -> CheckOutcome:
    recent = pipeline_history(pipeline, data_root, last=pipeline.checks.window_batches)
    rows_in = sum(r["rows_in"] for r in recent)
    if not rows_in:
        return CheckOutcome(True, "no input rows committed yet")
    rows = sum(r[column] for r in recent)
    share = rows / rows_in
    verdict = "within" if share <= bound else "over"
    return CheckOutcome(
        share <= bound,
        f"{rows} of {rows_in} rows {what} over the last {len(recent)} batches ({share:.1%}), "
        f"{verdict} {bound:.1%}",
        {"percent": round(100 * share, 2), "bound_percent": round(100 * bound, 2), "rows": rows},
    )


def failing_batch(pipeline: Pipeline, data_root: Path) -> CheckOutcome:
    """Fails while the pending (uncommitted) batch has failed attempts; says why and what to do."""
    location = pipeline.checkpoint_location(data_root)
    if not Checkpoint.exists(location):
        return CheckOutcome(True, "no batch run yet")
    ckpt = Checkpoint(location, pipeline.name)
    latest, done = ckpt.offsets.get_latest(), ckpt.commits.get_latest()
    if latest is None or (done is not None and done.batch_id >= latest.batch_id):
        at = "no batch committed yet" if done is None else f"batch {done.batch_id} committed"
        return CheckOutcome(True, f"{at}; none pending", {"failed_attempts": 0})
    failures = ckpt.failures.of(latest.batch_id)
    if not failures:
        return CheckOutcome(
            True,
            f"batch {latest.batch_id} is pending (running, or interrupted: the next run "
            "replays it); it has not failed",
            {"failed_attempts": 0},
        )
    limit = pipeline.max_failed_attempts
    name = pipeline.name
    # Counted apart, as lowmark.batches.loop.poison blocks: a lasting operational error (a file or
    # history gone) is mended where its line says, a data error in the transform.
    stops = [f for f in failures if f.kind == "operational"]
    if len(stops) >= limit:
        then = f"runs stop before it: do what its error says, then `lowmark run {name} --retry`"
    elif len(failures) - len(stops) >= limit:
        then = (
            f"runs stop before it: fix the transform and run `lowmark run {name} --retry`, or "
            f"`lowmark skip-batch {name} {latest.batch_id} --reason ...`"
        )
    else:
        then = "the next run replays it"
    return CheckOutcome(
        False,
        f"batch {latest.batch_id} failed {len(failures)} of {limit} allowed times, last: "
        f"{failures[-1].error}; {then}",
        {"failed_attempts": len(failures)},
    )
