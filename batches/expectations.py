"""Expectations: named conditions a batch's records must meet, and when a batch fails.

As Delta Live Tables / Spark Declarative Pipelines users know them
(``expect``, ``expect_or_drop``, ``expect_or_fail``): each expectation is a
name, a SQL boolean ``condition`` over the transformed records, and what a
record that violates it does (``on_violation``):

- ``warn``: the record goes on; it is counted;
- ``drop``: the record goes to the ``bad_records`` table with the
  expectation's name as its reason, never to windows or the sink; counted;
- ``fail``: the batch fails.

A record meets a condition only when it is true: false and null (``amount >=
0`` of a record without ``amount``) violate it. The bad-record rule every
source applies (a row that does not parse goes to ``bad_records``) is the
built-in expectation ``parsable``, a ``drop`` one: it is counted beside the
others and may be named in ``quality.fail_on``.

``quality`` (``Quality``) says when a batch fails instead of committing:
more bad rows (``parsable`` and ``drop`` violations) than ``max_bad_fraction``
of its rows, or any violation of an expectation named in ``fail_on`` or set to
``fail``. A batch that fails does so after its one Spark job looked at it and
before anything is written: its offset-log entry stays, so once the input,
the transform or the threshold is fixed, ``lowmark run`` replays it with the
same offsets. It counts as a failed attempt of the ``data`` kind
(``lowmark.batches.loop.poison``).

What is in the pipeline fingerprint (``fingerprint_semantics``): the
``drop`` expectations (name and condition), as they decide which records
reach the sink. ``warn`` and ``fail`` expectations and the thresholds are
not: a batch either commits exactly what it would without them or does not
commit at all, so they may change on a running checkpoint ("loosen the
threshold, or make a ``fail`` a ``warn``, and run again"). A pipeline without
``drop`` expectations keeps the fingerprint it had before expectations
existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from lowmark.batches.config import UserConfig
from lowmark.batches.errors import ExpectationsFailed, PipelineConfigInvalid
from lowmark.state.errors import first_line

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

PARSABLE = "parsable"
"""The built-in expectation: the source could parse the row (its violations are the
source's bad rows)."""
DEFAULT_MAX_BAD_FRACTION = 0.9
Action = Literal["warn", "drop", "fail"]


class Expectation(UserConfig):
    """A named condition every record of a batch should meet (after the transform)."""

    name: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Names the expectation in counts, `bad_records` reasons and errors.",
    )
    condition: str = Field(
        min_length=1,
        description="SQL boolean expression over the transformed records, e.g. "
        "`amount >= 0`; a record meets it only when it is true (null violates it).",
    )
    on_violation: Action = Field(
        default="warn",
        description="warn: keep the record, count it; drop: send it to `bad_records` "
        "(reason: the name), count it; fail: fail the batch before anything is written.",
    )


class Quality(UserConfig):
    """When a batch fails instead of committing (thresholds: changeable on a running
    checkpoint, so "loosen the threshold and run again" replays the failed batch)."""

    max_bad_fraction: float = Field(
        default=DEFAULT_MAX_BAD_FRACTION,
        ge=0,
        le=1,
        description="A batch with more bad rows (that do not parse, or that a `drop` "
        "expectation removed) than this share of its rows fails. 1 turns it off.",
    )
    fail_on: tuple[str, ...] = Field(
        default=(),
        description="Expectations (or `parsable`) any violation of which fails the batch, "
        "whatever their `on_violation`.",
    )


def check_names(expectations: Sequence[Expectation], quality: Quality) -> None:
    """Raise ``ValueError`` (a pydantic validation error of the pipeline) when two
    expectations share a name, one is named ``parsable``, or ``fail_on`` names none."""
    names = [e.name for e in expectations]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"expectations {twice} are named twice: give each its own name")
    if PARSABLE in names:
        raise ValueError(f"`{PARSABLE}` is the built-in expectation: name yours otherwise")
    unknown = sorted(set(quality.fail_on) - {*names, PARSABLE})
    if unknown:
        raise ValueError(
            f"`quality.fail_on` names {unknown}, which are no expectations "
            f"(there are {[*names, PARSABLE]})"
        )


def fingerprint_semantics(expectations: Sequence[Expectation]) -> list[list[str]] | None:
    """What the fingerprint hashes of ``expectations``: the ``drop`` ones' names and
    conditions, in order (None when there are none: the fingerprint is as before)."""
    drops = [[e.name, e.condition] for e in expectations if e.on_violation == "drop"]
    return drops or None


VIOLATION = "_lowmark_violated_"
"""Prefix of a metric: how many records violated expectation ``i`` (by position: names
are the user's, metric names Spark's)."""
DROPPED = "_lowmark_dropped"
"""The dropped records a job collects as it reads them: ``raw`` (the record as JSON)
and ``reason`` (the names of the ``drop`` expectations it violated)."""


class Checks:
    """A pipeline's expectations as Spark columns over its transformed records.

    PySpark is imported by the methods that build columns, not with the module: reading a
    definition (``lowmark list``, ``show``) must not import it."""

    def __init__(self, pipeline_name: str, expectations: Sequence[Expectation], quality: Quality):
        self.pipeline = pipeline_name
        self.expectations = tuple(expectations)
        self.quality = quality

    def __bool__(self) -> bool:
        return bool(self.expectations)

    def _violated(self, e: Expectation) -> Column:
        from pyspark.errors import PySparkException
        from pyspark.sql import functions as F

        try:
            condition = F.expr(e.condition)
        except PySparkException as exc:
            raise PipelineConfigInvalid(
                f"expectation {e.name} of {self.pipeline}: {e.condition!r} is no SQL "
                f"expression ({first_line(exc)}): correct its condition"
            ) from exc
        return ~F.coalesce(condition, F.lit(False))

    @property
    def drops(self) -> tuple[Expectation, ...]:
        return tuple(e for e in self.expectations if e.on_violation == "drop")

    def dropped(self) -> Column:
        """True for a record a ``drop`` expectation removes."""
        from pyspark.sql import functions as F

        flags = [self._violated(e) for e in self.drops]
        return F.lit(False) if not flags else _any(flags)

    def counts(self) -> list[Column]:
        """Aggregates: per expectation, the records that violate it (``VIOLATION<i>``)."""
        from pyspark.sql import functions as F

        return [
            F.count(F.when(self._violated(e), 1)).alias(f"{VIOLATION}{i}")
            for i, e in enumerate(self.expectations)
        ]

    def violated_any(self) -> Column:
        """True for a record that violates any expectation."""
        return _any([self._violated(e) for e in self.expectations])

    def dropped_record(self, payload: Sequence[str]) -> Column:
        """A dropped record as ``bad_records`` keeps it: its ``payload`` columns as JSON
        (``raw``) and the names of the ``drop`` expectations it violates (``reason``)."""
        from pyspark.sql import functions as F

        names = [F.when(self._violated(e), F.lit(e.name)) for e in self.drops]
        return F.struct(
            F.to_json(F.struct(*[F.col(f"`{c}`") for c in payload])).alias("raw"),
            F.concat_ws(", ", *names).alias("reason"),
        )

    def dropped_rows(self, records: DataFrame, payload: Sequence[str]) -> DataFrame:
        """The ``records`` a ``drop`` expectation removes, as ``DROPPED`` structs' fields."""
        return (
            records.where(self.dropped())
            .select(self.dropped_record(payload).alias("d"))
            .select("d.*")
        )

    def violations(self, metrics: dict[str, Any]) -> dict[str, int]:
        """Per expectation name, its violations, from ``counts``' metrics."""
        return {
            e.name: int(metrics.get(f"{VIOLATION}{i}") or 0)
            for i, e in enumerate(self.expectations)
        }

    def verdict(
        self, batch_id: int, rows_in: int, rows_bad: int, violations: dict[str, int]
    ) -> None:
        """Raise ``ExpectationsFailed`` when batch ``batch_id`` (``rows_in`` rows, bad ones
        included; ``rows_bad`` of them set aside; ``violations`` per expectation, ``parsable``
        included) may not commit; the message names what failed, the counts and the fix."""
        fails = (e.name for e in self.expectations if e.on_violation == "fail")
        failing = {*self.quality.fail_on, *fails}
        broken = [n for n, v in violations.items() if v and n in failing]
        limit = self.quality.max_bad_fraction
        too_bad = rows_in > 0 and rows_bad > limit * rows_in
        if not broken and not too_bad:
            return
        conditions = {e.name: e.condition for e in self.expectations}
        said = [
            f"expectation {n} ({conditions.get(n, 'the source can parse the row')}) violated by "
            f"{violations[n]} of {rows_in} rows"
            for n in broken
        ]
        if too_bad:
            said.append(
                f"{rows_bad} of {rows_in} rows bad ({rows_bad / rows_in:.0%}), over "
                f"quality.max_bad_fraction {limit:g}"
            )
        raise ExpectationsFailed(
            f"batch {batch_id} of {self.pipeline} broke its expectations: {'; '.join(said)}; "
            "nothing was written: fix the input or the transform, or loosen "
            "quality.max_bad_fraction / quality.fail_on / on_violation, then `lowmark run "
            f"{self.pipeline}` replays the batch with the same offsets"
        )


def _any(flags: list[Column]) -> Column:
    out = flags[0]
    for flag in flags[1:]:
        out = out | flag
    return out
