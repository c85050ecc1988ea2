"""The driver-side merge: a batch's window changes computed over Arrow tables on the
driver, without a Spark job.

For tumbling and sliding windows whose aggregates all merge in Arrow (count,
sum, min, max, avg: Arrow's hash aggregates take no sketches, arrays or structs;
``WindowedStage.merges_on_driver``), the few
windows a batch touches are merged here with their stored state, giving what
``WindowedStage.merge`` gives once collected: the same ``WindowChanges``.
Nothing is read or written: the stage reads the state rows, the batch writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from lowmark.batches.event_time.aggregates import AggregatePlan
from lowmark.state.window_state import ROWS

_FRESH = "_lowmark_fresh"


@dataclass(frozen=True)
class WindowChanges:
    """What a batch's windows change, as Arrow tables on the driver (``StageOutput``,
    collected; or the driver merge's own)."""

    output: pa.Table
    """The rows the sink gets."""
    retract: pa.Table
    """Windows the sink must drop (update mode: sessions merged into a longer one)."""
    upserts: pa.Table
    """State rows to write (the windows the batch touched, merged)."""
    deletes: pa.Table
    """State rows to remove (the windows the batch closed)."""
    closed: pa.Table
    """The ``_lowmark_rows`` of the windows the batch closes (final, purged, not merged)."""


@dataclass(frozen=True)
class DriverMerge:
    """The merge of one stage's windows: their identity (keys, window), aggregates and
    output mode."""

    identity: tuple[str, ...]
    plans: Sequence[AggregatePlan]
    output_mode: Literal["append", "update"]

    def merge(
        self, partials: pa.Table, nearby: pa.Table | None, final: pa.Table | None, batch_id: int
    ) -> WindowChanges:
        """The batch's changes: ``partials`` merged with ``nearby`` state; ``final`` emitted.

        Gives the tables ``WindowedStage.merge`` gives (no retract: tumbling
        and sliding windows keep their identity).
        """
        identity = list(self.identity)
        columns = partials.column_names
        schema = _nullable(partials.schema)
        merges = [(c, fn) for p in self.plans for c, fn in p.driver_merges or ()]
        merges.append((ROWS, "sum"))
        fresh = partials.append_column(_FRESH, pa.array([1] * partials.num_rows, pa.int8()))
        if nearby is not None and nearby.num_rows:
            stored = nearby.select(columns).cast(schema)
            stored = stored.append_column(_FRESH, pa.array([0] * stored.num_rows, pa.int8()))
            fresh = pa.concat_tables([fresh.cast(stored.schema), stored])
        # Group by identity (nulls form one group, as Spark's null-safe keys), keeping
        # only windows the batch touched: merged state the batch must upsert.
        grouped = fresh.group_by(identity, use_threads=False).aggregate([*merges, (_FRESH, "max")])
        grouped = grouped.filter(pc.equal(grouped[f"{_FRESH}_max"], 1))
        merged_by = dict(merges)
        merged = pa.table(
            [grouped[c] if c in identity else grouped[f"{c}_{merged_by[c]}"] for c in columns],
            names=columns,
        ).cast(schema)
        stored_final = (
            final.select(columns).cast(schema) if final is not None else schema.empty_table()
        )
        emitted = stored_final if self.output_mode == "append" else merged
        finishes = [(p.finish[0], p.driver_finish) for p in self.plans if p.driver_finish]
        output = pa.table(
            [emitted[c] for c in identity] + [finish(emitted) for _, finish in finishes],
            names=[*identity, *[name for name, _ in finishes]],
        )
        batches = pa.array([batch_id] * merged.num_rows, pa.int64())
        return WindowChanges(
            output=output.cast(_nullable(output.schema)),
            retract=stored_final.select(identity).slice(0, 0),
            upserts=merged.append_column("updated_batch", batches),
            deletes=stored_final.select(identity),
            closed=stored_final.select([ROWS]),
        )


def _nullable(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field nullable, as the frames Spark collects have them."""
    return pa.schema([f.with_nullable(True) for f in schema])
