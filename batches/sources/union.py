"""Several sources as one stream (``UnionSource``): their records, unioned.

Offsets of source ``name``'s partition ``p`` are kept as ``"name/p"``, so the
offset log records each source's offsets and every partition of every source
has its own watermark (records carry ``name/p`` in ``PARTITION_COLUMN``): the
pipeline watermark is the minimum over all of them, and an idle source is
left out of it like any idle partition. Every call is passed to each source
with its own offsets; admission is each source's own limit (with aligned
admission, each source orders its own partitions by their clocks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import reduce
from typing import TYPE_CHECKING

from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.pipeline import UnionSource
from lowmark.batches.records import INTERNAL_COLUMNS
from lowmark.batches.sources.base import (
    PARTITION_COLUMN,
    Clocks,
    Range,
    Skipped,
    Source,
    SourceRead,
    plan_in_clock_order,
)
from lowmark.batches.sources.context import SourceContext
from lowmark.state.errors import LowmarkError
from lowmark.state.offset_log import Identity, Offsets

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation
    from pyspark.sql.types import StructType

SEPARATOR = "/"


def own(offsets: Mapping[str, int], name: str) -> Offsets:
    """Source ``name``'s part of union ``offsets`` (or clocks), in its own partition names."""
    prefix = name + SEPARATOR
    return {k[len(prefix) :]: v for k, v in offsets.items() if k.startswith(prefix)}


def named(offsets: Offsets, name: str) -> Offsets:
    """A source's ``offsets`` as the union names them."""
    return {f"{name}{SEPARATOR}{k}": v for k, v in offsets.items()}


class UnionStreamSource(Source):
    """``parts`` by name; ``transforms`` (by name) run on a part's records before the union."""

    def __init__(
        self,
        parts: Mapping[str, Source],
        transforms: Mapping[str, Callable[[DataFrame], DataFrame]],
    ) -> None:
        self.parts = dict(parts)
        self.transforms = dict(transforms)
        self.joined = False
        """Read for a stream-stream join (``join_sides``): the sources may differ in columns."""
        self.schemas: dict[str, StructType] = {}
        """Joined: each source's columns (after its transform), as the last read gave them."""

    def join_sides(self) -> None:
        """Read from now on for a stream-stream join: every source is read (a source with
        nothing new gives no records, but its columns: ``schemas``), and the records are
        unioned with the other sources' columns null."""
        self.joined = True

    @classmethod
    def from_config(cls, config: UnionSource, context: SourceContext) -> UnionStreamSource:
        """Each named source of ``config``, built in the same context."""
        parts = {
            name: context.build(part, context.ingestion_clock or name in config.watermarks)
            for name, part in config.sources.items()
        }
        return cls(parts, config.transforms)

    def _each(self, offsets: Offsets, ask: Callable[[str, Source, Offsets], Offsets]) -> Offsets:
        """``ask(name, source, its own offsets)`` of each source, named as the union names
        them."""
        merged: Offsets = {}
        for name, part in self.parts.items():
            merged |= named(ask(name, part, own(offsets, name)), name)
        return merged

    def initial_offsets(self) -> Offsets:
        return self._each({}, lambda _, part, __: part.initial_offsets())

    def start_moves(self) -> bool:
        return any(part.start_moves() for part in self.parts.values())

    def plan(
        self,
        start: Offsets,
        batch_id: int,
        record: bool = True,
        discover: bool = True,
        clocks: Clocks | None = None,
    ) -> Offsets:
        """Each source's plan under its own limit, with its partitions' ``clocks``."""

        def ask(name: str, part: Source, mine: Offsets) -> Offsets:
            theirs = None if clocks is None else own(clocks, name)
            return plan_in_clock_order(part, mine, batch_id, theirs, record, discover)

        return self._each(start, ask)

    def read(
        self,
        start: Offsets,
        end: Offsets,
        batch_id: int,
        cache: bool = False,
        strict: bool = False,
    ) -> SourceRead:
        """The reads of the sources whose part of ``[start, end)`` moved (the first source's
        alone when none did), unioned by column name."""
        from pyspark.sql import DataFrame

        moved = [n for n in self.parts if own(start, n) != own(end, n)] or list(self.parts)[:1]
        if self.joined:
            moved = list(self.parts)
        reads = {
            name: self.parts[name].read(own(start, name), own(end, name), batch_id, cache, strict)
            for name in moved
        }
        frames = [self._records(name, read) for name, read in reads.items()]
        # A source with an ingestion clock adds its records' ingestion time; another does not.
        columns = {
            name: sorted(c for c in df.columns if c not in INTERNAL_COLUMNS)
            for name, df in zip(reads, frames, strict=True)
        }
        if self.joined:
            self.schemas = {name: df.schema for name, df in zip(reads, frames, strict=True)}
        elif len({tuple(c) for c in columns.values()}) > 1:
            shapes = "; ".join(f"{n}: {', '.join(c)}" for n, c in columns.items())
            raise PipelineConfigInvalid(
                f"the union's sources give different columns ({shapes}): give each a transform "
                "(`transforms`) that makes them the same"
            )
        bads = [r.bad for r in reads.values() if r.bad is not None]
        sizes = [r.size_bytes for r in reads.values()]

        def explain(exc: Exception) -> LowmarkError | None:
            return next((e for r in reads.values() if (e := r.explain(exc)) is not None), None)

        return SourceRead(
            records=reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames),
            bad=reduce(DataFrame.unionByName, bads) if bads else None,
            counts=tuple(o for r in reads.values() for o in _observations(r)),
            cached=tuple(df for r in reads.values() for df in r.cached),
            explain=explain,
            size_bytes=None if None in sizes else sum(s for s in sizes if s is not None),
        )

    def _records(self, name: str, read: SourceRead) -> DataFrame:
        from pyspark.sql import functions as F

        records = read.records
        if name in self.transforms:
            records = self.transforms[name](records)
        prefix = F.lit(name + SEPARATOR)
        return records.withColumn(PARTITION_COLUMN, F.concat(prefix, F.col(PARTITION_COLUMN)))

    def ingestion_times(self, position: Offsets, observed_ms: int) -> dict[str, int] | None:
        """Each source's ingestion times, named as the union names its partitions: the clock
        is the minimum over every partition of every source. None when a source keeps no
        ingestion clock."""
        times: dict[str, int] = {}
        for name, part in self.parts.items():
            found = part.ingestion_times(own(position, name), observed_ms)
            if found is None:
                return None
            times |= named(found, name)
        return times

    def partitions(self, start: Offsets, end: Offsets) -> tuple[str, ...]:
        return tuple(
            sorted(
                f"{name}{SEPARATOR}{p}"
                for name, part in self.parts.items()
                for p in part.partitions(own(start, name), own(end, name))
            )
        )

    def waiting_partitions(self, end: Offsets) -> tuple[str, ...]:
        return tuple(
            sorted(
                f"{name}{SEPARATOR}{p}"
                for name, part in self.parts.items()
                for p in part.waiting_partitions(own(end, name))
            )
        )

    def inputs(self, start: Offsets, end: Offsets) -> list[str]:
        return [
            f"{name}: {line}"
            for name, part in self.parts.items()
            for line in part.inputs(own(start, name), own(end, name))
        ]

    def input_bytes(self, start: Offsets, end: Offsets) -> int | None:
        sizes = [part.input_bytes(own(start, n), own(end, n)) for n, part in self.parts.items()]
        return None if None in sizes else sum(s for s in sizes if s is not None)

    def missing(self, start: Offsets, end: Offsets) -> str | None:
        gone = [
            f"{name}: {lost}"
            for name, part in self.parts.items()
            if (lost := part.missing(own(start, name), own(end, name))) is not None
        ]
        return "; ".join(gone) or None

    def past_lost(self, start: Offsets) -> Skipped | None:
        """What each source passes over, its units named ``<source>.<unit>`` (as in the
        backlog)."""
        lost = {
            name: skipped
            for name, part in self.parts.items()
            if (skipped := part.past_lost(own(start, name))) is not None
        }
        if not lost:
            return None
        moved = dict(start)
        for name, skipped in lost.items():
            moved |= named(skipped.start, name)
        return Skipped(
            moved,
            {f"{n}.{unit}": count for n, s in lost.items() for unit, count in s.counts.items()},
            "; ".join(f"{n}: {s.what}" for n, s in lost.items()),
        )

    def identity(self) -> Identity:
        """Each source's identity, its keys named ``<source>/<key>``."""
        return {
            f"{name}{SEPARATOR}{key}": value
            for name, part in self.parts.items()
            for key, value in part.identity().items()
        }

    def confirm(self, batch: Range) -> None:
        for name, part in self.parts.items():
            part.confirm(Range(batch.batch_id, own(batch.start, name), own(batch.end, name)))

    def commit(self, end: Offsets) -> None:
        for name, part in self.parts.items():
            part.commit(own(end, name))

    def retire(self, committed_end: Offsets, batch_id: int) -> None:
        for name, part in self.parts.items():
            part.retire(own(committed_end, name), batch_id)

    def backlog(self, committed_end: Offsets) -> dict[str, int]:
        """Each source's backlog, its units named ``<source>.<unit>``."""
        return {
            f"{name}.{unit}": n
            for name, part in self.parts.items()
            for unit, n in part.backlog(own(committed_end, name)).items()
        }

    def describe_backlog(self, backlog: dict[str, int]) -> str:
        described = []
        for name, part in self.parts.items():
            prefix = name + "."
            mine = {k[len(prefix) :]: n for k, n in backlog.items() if k.startswith(prefix)}
            described.append(f"{name}: {part.describe_backlog(mine)}")
        return "; ".join(described)


def _observations(read: SourceRead) -> tuple[Observation, ...]:
    return read.counts if isinstance(read.counts, tuple) else (read.counts,)
