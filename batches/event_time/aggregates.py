"""Mergeable aggregates: how each aggregate is kept as partial columns in window
state, merged across batches, and finished into an output column.

Partial columns are named ``<output>__<part>`` in the state table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column
from pyspark.sql import functions as F

from batches.windows import Aggregate, UserAggregate


@dataclass(frozen=True)
class AggregatePlan:
    """One aggregate as partial → merge → finish Spark expressions.

    ``partials``: (state column, aggregate over input rows);
    ``merges``: (state column, aggregate over rows of partials);
    ``finish``: (output column, scalar expression over state columns).

    A built-in aggregate that is not a sketch can also merge and finish on
    the driver, over the few windows a batch touches, without a Spark job:
    ``driver_merges`` names Arrow's hash aggregate for each state column
    (``sum``, ``min``, ``max``) and ``driver_finish`` computes the output
    column from a table of state columns. Both are None otherwise.
    """

    partials: tuple[tuple[str, Column], ...]
    merges: tuple[tuple[str, Column], ...]
    finish: tuple[str, Column]
    driver_merges: tuple[tuple[str, str], ...] | None = None
    driver_finish: Callable[[pa.Table], pa.ChunkedArray] | None = None


def plan_aggregate(agg: Aggregate | UserAggregate) -> AggregatePlan:
    if isinstance(agg, UserAggregate):
        part = f"{agg.name}__partial"
        return AggregatePlan(
            partials=((part, agg.partial(F.col(agg.column))),),
            merges=((part, agg.merge(F.col(part))),),
            finish=(agg.name, agg.finish(F.col(part))),
        )
    out = agg.output
    col = F.col(agg.column) if agg.column else F.lit(1)
    if agg.fn == "avg":
        total, count = f"{out}__sum", f"{out}__count"
        return AggregatePlan(
            partials=((total, F.sum(col.cast("double"))), (count, F.count(col))),
            merges=((total, F.sum(total)), (count, F.sum(count))),
            finish=(out, F.col(total) / F.col(count)),
            driver_merges=((total, "sum"), (count, "sum")),
            driver_finish=lambda t: _average(t[total], t[count]),
        )
    part = f"{out}__{agg.fn}"
    partial, merge, finish = {
        "count": (F.count(col), F.sum(part), F.col(part)),
        "sum": (F.sum(col), F.sum(part), F.col(part)),
        "min": (F.min(col), F.min(part), F.col(part)),
        "max": (F.max(col), F.max(part), F.col(part)),
        # A HyperLogLog sketch (Apache DataSketches): unions of sketches are exact merges.
        "approx_count_distinct": (
            F.hll_sketch_agg(col),
            F.hll_union_agg(part),
            F.hll_sketch_estimate(part),
        ),
    }[agg.fn]
    driver = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}.get(agg.fn)
    return AggregatePlan(
        ((part, partial),),
        ((part, merge),),
        (out, finish),
        driver_merges=((part, driver),) if driver else None,
        driver_finish=(lambda t: t[part]) if driver else None,
    )


def _average(total: pa.ChunkedArray, count: pa.ChunkedArray) -> pa.ChunkedArray:
    """``total / count`` as doubles; null where nothing was counted (as Spark's avg)."""
    counted = pc.if_else(
        pc.equal(count, 0), pa.scalar(None, pa.float64()), count.cast(pa.float64())
    )
    return pc.divide(total.cast(pa.float64()), counted)
