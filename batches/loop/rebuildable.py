"""Whether ``lowmark rebuild`` can recompute a pipeline's output from its recorded history,
in one place: the rebuild refuses by it (``lowmark.batches.admin.rebuild``), and a run
refusing a change names the rebuild as a way on only where it applies (``Planner``)."""

from __future__ import annotations

from collections.abc import Iterable

from lowmark.batches.evolution import SOURCE_CHANGED, Change, ChangeClass
from lowmark.batches.pipeline import DeltaSink, Pipeline


def refusal(pipeline: Pipeline, changes: Iterable[Change] = ()) -> str | None:
    """Why a rebuild cannot recompute ``pipeline``'s output under ``changes`` (from the
    definition its batches ran under), whatever its checkpoint holds; None: it can.

    A rebuild replays each batch's recorded input range under the new definition into a
    shadow sink, then swaps each sink's content in one Delta commit: a sink lowmark cannot
    swap so (Postgres, Kafka, your own) would leave its readers a mix; a table join reads
    the versions each batch was planned with, which a replay of ranges does not give (a
    stream-stream join's held rows are the shadow's own, built from batch 0 as a fresh
    run builds them); another source, or a refused change, leaves the recorded offsets or
    state unreadable.
    """
    for name, sink in pipeline.sinks().items():
        if not isinstance(sink, DeltaSink):
            return (
                f"its sink {name} ({sink.label}) is not a Delta table, whose content a rebuild "
                "swaps in one commit (its readers would see old and new rows mixed)"
            )
    if pipeline.joins:
        return "it joins tables at the versions each batch was planned with"
    stops = [
        c for c in changes if c.kind is SOURCE_CHANGED or c.change_class is ChangeClass.REFUSED
    ]
    if stops:
        what = "; ".join(c.describe() for c in stops)
        return f"{what}: the offsets and state the batches recorded do not read under it"
    return None
