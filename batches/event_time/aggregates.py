"""Mergeable aggregates: how each aggregate is kept as partial columns in window
state, merged across batches, and finished into an output column.

Partial columns are named ``<output>__<part>`` in the state table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from lowmark.batches.windows import Aggregate, UserAggregate

if TYPE_CHECKING:
    from pyspark.sql import Column


@dataclass(frozen=True)
class AggregatePlan:
    """One aggregate as partial → merge → finish Spark expressions.

    ``partials``: (state column, aggregate over input rows);
    ``merges``: (state column, aggregate over rows of partials);
    ``finish``: (output column, scalar expression over state columns).

    ``count``, ``sum``, ``min``, ``max`` and ``avg`` can also merge and finish on
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


def plan_aggregate(agg: Aggregate | UserAggregate, event_time: str) -> AggregatePlan:
    """How ``agg`` is kept, merged and finished; ``event_time`` is the event-time column
    (``first`` and ``last`` keep the time of their value)."""
    from pyspark.sql import functions as F

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
    if agg.fn == "count_distinct":
        return _count_distinct(agg, col)
    part = f"{out}__{agg.fn}"
    partial, merge, finish = _one_partial(agg, col, F.col(part), F.col(event_time))
    driver = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}.get(agg.fn)
    return AggregatePlan(
        ((part, partial),),
        ((part, merge),),
        (out, finish),
        driver_merges=((part, driver),) if driver else None,
        driver_finish=(lambda t: t[part]) if driver else None,
    )


def _one_partial(
    agg: Aggregate, col: Column, part: Column, event_time: Column
) -> tuple[Column, Column, Column]:
    """(partial over input rows, merge over partials, finish) of an aggregate kept in one
    state column ``part``."""
    from pyspark.sql import functions as F

    match agg.fn:
        case "count":
            return F.count(col), F.sum(part), part
        case "sum":
            return F.sum(col), F.sum(part), part
        case "min":
            return F.min(col), F.min(part), part
        case "max":
            return F.max(col), F.max(part), part
        case "approx_count_distinct":
            # A HyperLogLog sketch (Apache DataSketches): unions of sketches are exact merges.
            return F.hll_sketch_agg(col), F.hll_union_agg(part), F.hll_sketch_estimate(part)
        case "approx_percentile":
            # A KLL sketch (Apache DataSketches) of the values as doubles; an empty one
            # (every value null) has no quantile.
            ranks = [F.lit(p) for p in agg.percentages]
            rank = ranks[0] if isinstance(agg.percentage, float) else F.array(*ranks)
            quantile = F.kll_sketch_get_quantile_double(part, rank)
            return (
                F.kll_sketch_agg_double(col.cast("double")),
                F.kll_merge_agg_double(part),
                F.when(F.kll_sketch_get_n_double(part) > 0, quantile),
            )
        case "first" | "last":
            # (event time, value) structs order by time, then value: ties at one event
            # time go to the smallest value (first) or the largest (last).
            at = F.struct(F.unix_micros(event_time).alias("time"), col.alias("value"))
            return _extreme(agg.fn == "first", F.when(col.isNotNull(), at), part)
        case "min_by" | "max_by":
            # Ordered by ``by``, then value: ties go to the smallest value (min_by) or the
            # largest (max_by). A row whose ``by`` is null is skipped, as Spark's min_by.
            by = F.col(str(agg.by))
            at = F.struct(by.alias("by"), col.alias("value"))
            return _extreme(agg.fn == "min_by", F.when(by.isNotNull(), at), part)
        case "collect_set":
            # The smallest distinct values: the smallest n of a union are the smallest n of
            # the smallest n of each part, however the input was split.
            return (
                _smallest(F.collect_set(col), agg),
                _smallest(_union(part), agg),
                part,
            )
    raise AssertionError(f"no partial for aggregate {agg.fn!r}")


def _extreme(smallest: bool, pick: Column, part: Column) -> tuple[Column, Column, Column]:
    """The value of the smallest (or largest) ``pick`` struct: kept as the struct, merged
    by min (max), finished as its ``value`` field."""
    from pyspark.sql import functions as F

    extreme = F.min if smallest else F.max
    return extreme(pick), extreme(part), part.getField("value")


def _union(part: Column) -> Column:
    """The distinct values of the ``part`` arrays of a group (an aggregate)."""
    from pyspark.sql import functions as F

    return F.array_distinct(F.flatten(F.collect_list(part)))


def _smallest(values: Column, agg: Aggregate) -> Column:
    """The ``max_items`` smallest of the array ``values``, sorted."""
    from pyspark.sql import functions as F

    return F.slice(F.array_sort(values), 1, int(agg.max_items or 0))


def _count_distinct(agg: Aggregate, col: Column) -> AggregatePlan:
    """Exact while a window holds at most ``max_items`` distinct values, as their set; past
    that the set is dropped (null) and the HLL sketch kept beside it gives the estimate.

    A window's set overflows in some batch exactly when the window's whole input holds
    more than ``max_items`` distinct values, so which of the two answers is given does
    not depend on the batching. The sketch counts a hash of each value (``xxhash64``), so
    any column type that has equality can be counted."""
    from pyspark.sql import functions as F

    out, limit = agg.output, int(agg.max_items or 0)
    values, sketch = f"{out}__set", f"{out}__hll"
    distinct = F.collect_set(col)
    union = _union(F.col(values))
    # A null set among the parts: some part overflowed, and so does the whole.
    complete = F.count(F.lit(1)) == F.count(values)
    return AggregatePlan(
        partials=(
            (values, F.when(F.size(distinct) <= limit, distinct)),
            (sketch, F.hll_sketch_agg(F.when(col.isNotNull(), F.xxhash64(col)))),
        ),
        merges=(
            (values, F.when(complete & (F.size(union) <= limit), union)),
            (sketch, F.hll_union_agg(sketch)),
        ),
        finish=(
            out,
            F.when(F.col(values).isNotNull(), F.size(values).cast("long")).otherwise(
                F.hll_sketch_estimate(sketch)
            ),
        ),
    )


def _average(total: pa.ChunkedArray, count: pa.ChunkedArray) -> pa.ChunkedArray:
    """``total / count`` as doubles; null where nothing was counted (as Spark's avg)."""
    counted = pc.if_else(
        pc.equal(count, 0), pa.scalar(None, pa.float64()), count.cast(pa.float64())
    )
    return pc.divide(total.cast(pa.float64()), counted)
