"""Mergeable aggregates: how each aggregate is kept as partial columns in window
state, merged across batches, and finished into an output column.

Partial columns are named ``<output>__<part>`` in the state table.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

from batches.windows import Aggregate, UserAggregate


@dataclass(frozen=True)
class AggregatePlan:
    """One aggregate as partial → merge → finish Spark expressions.

    ``partials``: (state column, aggregate over input rows);
    ``merges``: (state column, aggregate over rows of partials);
    ``finish``: (output column, scalar expression over state columns).
    """

    partials: tuple[tuple[str, Column], ...]
    merges: tuple[tuple[str, Column], ...]
    finish: tuple[str, Column]


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
    return AggregatePlan(((part, partial),), ((part, merge),), (out, finish))
