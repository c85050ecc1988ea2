"""How the CLI shows times, durations and tables, so every command reads alike.

- A moment is ISO 8601 UTC to the second plus its age against a given "now"
  (the caller reads it from its clock once): ``2026-11-25T10:04:12Z (3 min 12 s
  ago)``.
- A duration has at most two units, the smaller one truncated: ``840 ms``,
  ``4.2 s``, ``42 s``, ``3 min 12 s``, ``2 h 5 min``, ``3 d 4 h``.
- A table never truncates a cell or wraps one into a narrow column: aligned
  columns, one line per row, in a pipe or a file the last column running on
  (so ``grep`` and ``cut`` work); a terminal too narrow for the whole table
  gets one block per row instead: its first cell, then ``field  value`` lines.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1_000))


def iso_utc(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC to the second: ``2026-11-25T10:04:12Z``."""
    return datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_time(moment: datetime) -> str:
    """A timestamp as ISO 8601 to the second, the fraction only when it has one (trailing
    zeros cut): ``2026-11-25T10:04:12Z``, ``2026-11-25T10:04:12.25Z``; UTC with ``Z``, a
    timestamp without a time zone without."""
    zone = "" if moment.tzinfo is None else "Z"
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    fraction = f".{moment.microsecond:06d}".rstrip("0") if moment.microsecond else ""
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + fraction + zone


def duration(ms: int) -> str:
    """``ms`` milliseconds in at most two units, the smaller truncated (never rounded up:
    59 999 ms is ``59 s``, not ``60 s``); a negative duration gets a minus sign."""
    if ms < 0:
        return "-" + duration(-ms)
    if ms < 1_000:
        return f"{ms} ms"
    if ms < 10_000:
        return f"{ms // 100 / 10:.1f} s"
    for i, (unit, size) in enumerate(_UNITS[:-1]):
        if ms >= size:
            smaller, smaller_size = _UNITS[i + 1]
            rest = ms % size // smaller_size
            return f"{ms // size} {unit}" + (f" {rest} {smaller}" if rest else "")
    return f"{ms // 1_000} s"


def age(ms: int, now_ms: int) -> str:
    """How long before ``now_ms`` the moment ``ms`` was: ``3 min 12 s ago``, or ``in 5 s``
    for a moment after it (an event time from the future)."""
    if ms > now_ms:
        return f"in {duration(ms - now_ms)}"
    return f"{duration(now_ms - ms)} ago"


def moment(ms: int, now_ms: int) -> str:
    """``2026-11-25T10:04:12Z (3 min 12 s ago)``."""
    return f"{iso_utc(ms)} ({age(ms, now_ms)})"


def print_json(
    console: Console,
    value: Any,
    indent: int | None = 2,
    default: Callable[[Any], Any] | None = None,
) -> None:
    """``value`` as JSON, exactly (no highlighting, wrapping or markup); ``indent=None``:
    one line (a line of JSON Lines); ``default`` turns what JSON has no type for into
    what it has (as ``json.dumps``'s)."""
    text = json.dumps(value, indent=indent, ensure_ascii=False, default=default)
    console.out(text, highlight=False)


def print_fields(console: Console, fields: Sequence[tuple[str, str]]) -> None:
    """``label  value`` lines, the values aligned; a value runs on (the terminal wraps it)
    and a value of several lines continues under itself."""
    width = max((cell_len(label) for label, _ in fields), default=0)
    for label, value in fields:
        first, *rest = value.split("\n")
        pad = " " * (width - cell_len(label) + 2)
        console.print(Text(label + pad + first), soft_wrap=True)
        for line in rest:
            console.print(Text(" " * (width + 2) + line), soft_wrap=True)


def print_table(console: Console, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """``rows`` under ``headers``, every cell whole (the layouts: see the module doc)."""
    widths = [max([cell_len(h)] + [cell_len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    if console.is_terminal and sum(widths) + 2 * (len(widths) - 1) > console.width:
        for i, r in enumerate(rows):
            if i:
                console.print()
            console.print(Text(r[0], style="bold"), soft_wrap=True)
            print_fields(
                console, [(f"  {h}", cell) for h, cell in zip(headers[1:], r[1:], strict=True)]
            )
        return
    for i, r in enumerate([headers, *rows]):
        cells = [cell + " " * (w - cell_len(cell)) for cell, w in zip(r[:-1], widths, strict=False)]
        console.print(
            Text("  ".join([*cells, r[-1]]), style="bold" if i == 0 else ""), soft_wrap=True
        )
