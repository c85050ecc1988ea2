"""The post-aggregation step: the windows a batch emits, filtered or projected before the sink.

A windowed pipeline's ``post_aggregation`` (a ``SqlStep`` over ``windows``, or
a DataFrame → DataFrame function) sees exactly what the batch would write to
the sink: in append mode the windows it closes, in update mode the windows it
changed, with their final aggregate columns. The late and bad tables and the
window state are not affected: state keeps every window, so a window filtered
out now is still merged with the records later batches bring.

Where it runs: a batch's window changes are on the driver as Arrow tables
(``WindowChanges``), from the driver-side merge or collected from the Spark
merge, so the step runs once, here, for both. It runs in Spark SQL, the one
semantics the transform and expectations have too: the emitted windows become
a local relation (no job), the step's frame is analysed (no job), and
collected back (one Spark job, over the few emitted windows). A batch that
emits nothing runs no job (the step's output schema is known from analysis),
and a pipeline without the step pays nothing.

Update mode: the sink holds the latest value of every window that passed. A
window the step removes is deleted from the sink in the same MERGE that
upserts the others (it is added to the batch's retractions; deleting one the
sink never held changes nothing), so a window that passed, then stops
passing after an update, leaves the sink, and one that passes later is
written then: the sink equals the step over the whole input's aggregation.
For that the step must keep each window's identity (the keys,
``window_start``, ``window_end``) as it is and emit each window at most
once: it may filter windows and add, drop or change their other columns.
A step that breaks this fails the batch (nothing written), in one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pyarrow as pa
from pyspark.sql import SparkSession

from lowmark.batches.collect import empty_of, frame_of
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.event_time.driver_merge import WindowChanges
from lowmark.batches.pipeline import Pipeline


def post_aggregated(
    spark: Callable[[], SparkSession],
    pipeline: Pipeline,
    changes: WindowChanges,
    identity: Sequence[str],
) -> WindowChanges:
    """``changes`` with the pipeline's ``post_aggregation`` applied to their output; in
    update mode, the windows it removed retracted too. Unchanged (and Spark untouched)
    without the step."""
    if pipeline.post_aggregation is None:
        return changes
    out = pipeline.post_aggregated(frame_of(spark(), changes.output))
    update = pipeline.output_mode == "update"
    what = f"the post_aggregation of {pipeline.name}"
    missing = [c for c in identity if c not in out.columns]
    if update and missing:
        raise PipelineConfigInvalid(
            f"{what} drops {missing}: in update mode it must keep each window's keys, "
            "window_start and window_end (the sink is merged on them); filter windows and "
            "change their other columns only"
        )
    if not changes.output.num_rows:
        return dataclasses.replace(changes, output=empty_of(out))
    rows = out.toArrow()
    if not update:
        return dataclasses.replace(changes, output=rows)
    emitted = _identities(changes.output, identity)
    kept = _identities(rows, identity)
    if len(set(kept)) != len(kept) or not set(kept) <= set(emitted):
        raise PipelineConfigInvalid(
            f"{what} gave windows the batch did not emit, or one twice: in update mode it may "
            "filter windows and change their other columns, not add, split or rename windows"
        )
    held = set(kept)
    gone = changes.output.select(list(identity)).filter(pa.array([w not in held for w in emitted]))
    retract = pa.concat_tables([changes.retract, gone.cast(changes.retract.schema)])
    return dataclasses.replace(changes, output=rows, retract=retract)


def _identities(table: pa.Table, identity: Sequence[str]) -> list[tuple[object, ...]]:
    """Each row's identity, in order (nulls equal to nulls, as Spark's null-safe keys)."""
    return list(zip(*[table.column(c).to_pylist() for c in identity], strict=True))
