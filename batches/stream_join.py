"""The stream-stream join a pipeline declares (``stream_join``): two sources of a union, joined.

The two sides are two named sources of a ``kind: union`` source; each batch
joins their new records with each other and with the records of earlier
batches held in the checkpoint (``lowmark.batches.event_time.interval_join``),
as Structured Streaming's stream-stream join with watermarks does, or Flink's
interval join: ``left.<keys> = right.<keys> AND right.<time.right> BETWEEN
left.<time.left> + time.lower AND left.<time.left> + time.upper``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from lowmark.batches.config import UserConfig
from lowmark.batches.durations import DurationMs, duration_text


class JoinTime(UserConfig):
    """The event-time bound of a join: ``right.<right> BETWEEN left.<left> + lower AND
    left.<left> + upper`` (both ends included)."""

    left: str = Field(description="The left side's event-time column (a timestamp).")
    right: str = Field(description="The right side's event-time column (a timestamp).")
    lower: DurationMs = Field(
        default=0,
        description="How long after the left row's time the right row's may be, at least "
        "(a negative duration, `-10 minutes`, lets it come before).",
    )
    upper: DurationMs = Field(
        description="How long after the left row's time the right row's may be, at most."
    )

    @model_validator(mode="after")
    def _lower_below_upper(self) -> JoinTime:
        if self.lower > self.upper:
            raise ValueError(
                f"`time.lower` ({self.lower} ms) is after `time.upper` ({self.upper} ms): no "
                "row could ever match; swap them"
            )
        return self


class StreamJoin(UserConfig):
    """Join the records of the union's source ``left`` with those of ``right``.

    ``keys`` names equality keys both sides have (not ``on``: YAML reads a bare
    ``on`` as true); ``time`` bounds the right row's event time by the left
    row's. ``how``: ``inner`` (matched pairs only),
    ``left`` or ``right`` (outer: a row of that side that never matched is
    emitted once, with nulls for the other side, when the watermark shows it
    can no longer match). Each side's rows are held in the checkpoint's
    ``join_state`` table until then. Output rows: the keys once, then the
    left side's other columns, then the right side's; two sides with another
    column of the same name are refused (rename one in the union's
    ``transforms``).
    """

    left: str = Field(description="The union's source whose records are the left side.")
    right: str = Field(description="The union's source whose records are the right side.")
    keys: tuple[str, ...] = Field(min_length=1, description="Equality keys: columns of both sides.")
    how: Literal["inner", "left", "right"] = Field(
        default="inner", description="`inner`, or outer: `left` or `right`."
    )
    time: JoinTime = Field(description="The event-time bound (`left`, `right`, `lower`, `upper`).")

    @model_validator(mode="after")
    def _two_sides(self) -> StreamJoin:
        if self.left == self.right:
            raise ValueError(f"`left` and `right` are both {self.left!r}: name two sources")
        return self


def describe_join(join: StreamJoin) -> str:
    """``join`` in one line, for ``lowmark plan``."""
    time = join.time
    return (
        f"{join.how} join of {join.left} and {join.right} on {', '.join(join.keys)}, "
        f"{join.right}.{time.right} between {join.left}.{time.left} + {duration_text(time.lower)} "
        f"and + {duration_text(time.upper)}"
    )
