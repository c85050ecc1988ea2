"""Event-time windows and windowed aggregations: the user-facing config, and
how records are assigned to windows.

All windows are ``[start, end)`` and per key. Tumbling and sliding windows
follow Spark's ``window()`` exactly (so a plain Spark batch aggregation is the
reference); session windows are per-key runs of events less than ``gap``
apart, and merge across batches when a new event bridges two sessions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import ConfigDict, Field, model_validator

from lowmark.batches.config import UserConfig
from lowmark.batches.durations import DurationMs

if TYPE_CHECKING:
    from pyspark.sql import Column

    ColumnFunction: TypeAlias = Callable[[Column], Column]
else:
    # pydantic checks only that it is callable; so reading a definition never imports
    # PySpark, which only a batch needs.
    ColumnFunction = Callable[[Any], Any]


class _Config(UserConfig):
    """A model of this module: frozen, strict about keys, its ``help()`` listing its fields
    with their descriptions (a ``Field(description=...)`` or an attribute docstring)."""


MAX_FUTURE_MS = 86_400_000
"""Default ``max_future``: a day (clock skew and time-zone slips pass, a year ahead does not)."""


class IngestionWatermark(_Config):
    """An event-time clock the source drives: how far it has been written, minus a lag.

    The source says, per partition, the exclusive minimum ingestion time of
    anything still to come (a file's first listing; see docs/sources.md for
    each source); the clock is the minimum over partitions minus
    ``max_event_time_lag``, and a planning that finds nothing new still
    advances it. ``lowmark.batches.event_time.watermarks`` holds the rule.
    """

    strategy: Literal["ingestion_time"] = Field(
        description="`ingestion_time`: the source's clock of when records were written."
    )
    max_event_time_lag: DurationMs = Field(
        ge=0,
        description="How long after its event time a record may be written to the source "
        "at most: the clock is the source's ingestion watermark minus this.",
    )


class EventTime(_Config):
    """Where event time is and how far it may lag: per-partition watermarks, idleness, lateness.

    ``column`` is a timestamp column of the transformed records. A source
    partition's watermark is its max event time minus ``max_out_of_orderness``;
    the pipeline watermark is the min over partitions that saw data within
    ``idle_timeout`` (all idle: the max), and never goes back. A record
    stamped more than ``max_future`` after the processing time of its batch
    is set aside in the late table and counts for no watermark, so one bad
    clock cannot close every window early.
    """

    column: str = Field(description="Timestamp column holding event time.")
    max_out_of_orderness: DurationMs = Field(
        default=0, ge=0, description="How far behind the newest event a record may arrive."
    )
    idle_timeout: DurationMs | None = Field(
        default=None, gt=0, description="A partition silent this long stops holding time back."
    )
    allowed_lateness: DurationMs = Field(
        default=0, ge=0, description="How long past the watermark a window still takes records."
    )
    max_future: DurationMs = Field(
        default=MAX_FUTURE_MS,
        gt=0,
        description="Records stamped further ahead of processing time go to the late table "
        "with their reason and never move the watermark.",
    )
    watermark: IngestionWatermark | None = Field(
        default=None,
        description="Unset: the watermark follows the event times seen (max minus "
        "`max_out_of_orderness`, per partition). `{strategy: ingestion_time, "
        "max_event_time_lag: ...}`: it follows the source's ingestion clock instead.",
    )

    admission: Literal["fair", "aligned"] = Field(
        default="fair",
        description="When a batch cannot take everything waiting (the source's "
        "`max_*_per_batch`): `fair` splits it evenly over the partitions; `aligned` takes "
        "first from the partitions whose watermark input (max event time, or ingestion "
        "time) is lowest, so the pipeline watermark advances instead of one partition "
        "racing ahead.",
    )

    @model_validator(mode="after")
    def _one_strategy(self) -> EventTime:
        if self.watermark is not None and (self.max_out_of_orderness or self.idle_timeout):
            raise ValueError(
                "an ingestion-time watermark follows the source's clock, not the event times "
                "seen: remove `max_out_of_orderness` and `idle_timeout` (the clock's "
                "`max_event_time_lag` bounds lateness, and idle partitions hold nothing back)"
            )
        return self


class Tumbling(_Config):
    """Fixed windows of ``size`` that do not overlap: each record is in exactly one."""

    kind: Literal["tumbling"] = "tumbling"
    """Picks this window."""
    size: DurationMs = Field(gt=0)
    """Length of every window."""
    offset: DurationMs = Field(
        default=0, ge=0, description="Shift of window starts from the epoch."
    )

    @model_validator(mode="after")
    def _offset_below_size(self) -> Tumbling:
        if self.offset >= self.size:
            raise ValueError("offset must be smaller than size")
        return self


class Sliding(_Config):
    """Windows of ``size`` starting every ``slide``: each record is in ``size / slide`` of them."""

    kind: Literal["sliding"] = "sliding"
    """Picks this window."""
    size: DurationMs = Field(gt=0)
    """Length of every window."""
    slide: DurationMs = Field(gt=0)
    """Time between window starts; it must divide `size`."""

    @model_validator(mode="after")
    def _slide_divides_size(self) -> Sliding:
        if self.slide > self.size or self.size % self.slide:
            raise ValueError("slide must divide size (e.g. size 10 minutes, slide 5 minutes)")
        return self


class Session(_Config):
    """Per-key runs of events less than ``gap`` apart: ``[first event, last event + gap)``.

    A new event that bridges two stored sessions merges them.
    """

    kind: Literal["session"] = "session"
    """Picks this window."""
    gap: DurationMs = Field(gt=0, description="Events closer than this belong to one session.")


Window = Annotated[Tumbling | Sliding | Session, Field(discriminator="kind")]


AggregateFn = Literal[
    "count",
    "sum",
    "min",
    "max",
    "avg",
    "approx_count_distinct",
    "count_distinct",
    "approx_percentile",
    "first",
    "last",
    "min_by",
    "max_by",
    "collect_set",
]
"""The built-in aggregates; how each merges: docs/concepts.md#aggregates."""

DEFAULT_MAX_ITEMS = {"count_distinct": 1000, "collect_set": 100}
"""``max_items`` of the aggregates that keep an array, when not given."""


_NEEDED_BY = {
    "by": ("min_by", "max_by"),
    "max_items": tuple(DEFAULT_MAX_ITEMS),
    "percentage": ("approx_percentile",),
}
"""The aggregates that need (and alone take) each of the fields beyond fn, column, name."""


def _unset(value: object) -> bool:
    return value is None


class Aggregate(_Config):
    """A built-in mergeable aggregate over ``column`` (``count`` may omit it: rows).

    Each keeps partial columns in window state that merge across batches, so
    a window's result does not depend on how its records were split into
    batches (sketches: within their error). How each merges, and its bounds:
    [Concepts](../concepts.md#aggregates).
    """

    fn: AggregateFn
    """The aggregate function: ``count``, ``sum``, ``min``, ``max``, ``avg``;
    ``count_distinct`` (exact up to ``max_items`` distinct values, then the HLL estimate);
    ``approx_count_distinct`` (an HLL sketch; the column must be an integer, string or
    binary); ``approx_percentile`` (a KLL sketch, at ``percentage``); ``first`` / ``last``
    (the value at the earliest / latest event time); ``min_by`` / ``max_by`` (the value
    where ``by`` is smallest / largest); ``collect_set`` (the ``max_items`` smallest
    distinct values, sorted)."""
    column: str | None = None
    """Input column (``count`` without it counts rows)."""
    name: str | None = Field(default=None, description="Output column; default fn_column.")
    # The fields below count in the pipeline fingerprint only when set, so a definition
    # written before they existed keeps its fingerprint.
    by: str | None = Field(default=None, exclude_if=_unset)
    """``min_by`` / ``max_by`` only: the column whose smallest / largest value picks the row."""
    max_items: int | None = Field(default=None, gt=0, exclude_if=_unset)
    """``count_distinct`` (default 1000) and ``collect_set`` (default 100) only: how many
    distinct values a window keeps in state."""
    percentage: float | tuple[float, ...] | None = Field(default=None, exclude_if=_unset)
    """``approx_percentile`` only: a fraction in [0, 1] (output: a double), or a list of
    them (output: an array of doubles, in the same order)."""

    @model_validator(mode="before")
    @classmethod
    def _default_max_items(cls, data: object) -> object:
        # Filled in (not a field default) so that the value counts in the fingerprint.
        if isinstance(data, dict) and data.get("max_items") is None:
            default = DEFAULT_MAX_ITEMS.get(str(data.get("fn")))
            if default is not None:
                return {**data, "max_items": default}
        return data

    @model_validator(mode="after")
    def _fields_fit_fn(self) -> Aggregate:
        fn = self.fn
        if self.column is None and fn != "count":
            raise ValueError(f"aggregate {fn!r} needs a `column`")
        for field, fns in _NEEDED_BY.items():
            given = getattr(self, field) is not None
            if given != (fn in fns):
                raise ValueError(
                    f"aggregate {fn!r} needs `{field}`"
                    if not given
                    else f"`{field}` is for {' and '.join(fns)} only, not {fn!r}"
                )
        if any(not 0 <= p <= 1 for p in self.percentages):
            raise ValueError(f"`percentage` must be within [0, 1], not {self.percentage}")
        return self

    @property
    def percentages(self) -> tuple[float, ...]:
        """``percentage`` as a tuple (empty when not set)."""
        p = self.percentage
        return () if p is None else (p,) if isinstance(p, float | int) else tuple(p)

    @property
    def output(self) -> str:
        return self.name or (f"{self.fn}_{self.column}" if self.column else self.fn)


class UserAggregate(_Config):
    """A user aggregate as three Spark expressions (Python only).

    ``partial(col)`` aggregates input rows into a partial value,
    ``merge(col)`` aggregates partial values into one, ``finish(col)`` turns
    a partial value into the output. Example, distinct users as an array::

        UserAggregate(name="users", column="user",
                      partial=lambda c: F.collect_set(c),
                      merge=lambda c: F.array_distinct(F.flatten(F.collect_list(c))),
                      finish=lambda c: F.array_sort(c))
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str
    """Output column."""
    column: str
    """Input column."""
    partial: ColumnFunction
    """Input rows → one partial value (an aggregate expression)."""
    merge: ColumnFunction
    """Partial values → one partial value (an aggregate expression)."""
    finish: ColumnFunction
    """Partial value → output value."""


class WindowedAggregation(_Config):
    """Aggregate per key and event-time window; emit in ``append`` or ``update`` mode.

    ``append``: each window is written once, when the watermark passes
    ``window_end + allowed_lateness``. ``update``: every window a batch
    changes is upserted into the sink (MERGE on keys + window).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    keys: tuple[str, ...] = Field(description="Grouping columns.")
    window: Window
    """Window shape: `kind` is `tumbling`, `sliding` or `session`."""
    aggregates: tuple[Aggregate | UserAggregate, ...] = Field(min_length=1)
    """One output column each, all mergeable across batches."""
    output_mode: Literal["append", "update"] = "append"
    """append: each window once, when final; update: every changed window upserted."""

    @model_validator(mode="after")
    def _unique_outputs(self) -> WindowedAggregation:
        names = [a.output if isinstance(a, Aggregate) else a.name for a in self.aggregates]
        clash = {n for n in names if names.count(n) > 1} | (set(names) & set(self.keys))
        if clash:
            raise ValueError(f"output column names clash: {sorted(clash)}; set `name`")
        return self


def last_window_end_ms(window: Tumbling | Sliding, event_ms: Column) -> Column:
    """End (epoch ms) of the LAST window that contains ``event_ms``.

    A record is too late for every one of its windows iff this end plus the
    allowed lateness is not past the watermark.
    """
    from pyspark.sql import functions as F

    slide = window.size if isinstance(window, Tumbling) else window.slide
    offset = window.offset if isinstance(window, Tumbling) else 0
    last_start = F.floor((event_ms - F.lit(offset)) / F.lit(slide)) * F.lit(slide) + F.lit(offset)
    return last_start + F.lit(window.size)


def assign_windows(window: Tumbling | Sliding, event_time: Column) -> Column:
    """Spark's ``window()`` struct (start, end) for ``event_time``; sliding windows explode."""
    from pyspark.sql import functions as F

    size = f"{window.size} milliseconds"
    if isinstance(window, Tumbling):
        return F.window(event_time, size, startTime=f"{window.offset} milliseconds")
    return F.window(event_time, size, f"{window.slide} milliseconds")
