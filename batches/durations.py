"""Durations as users write them: ``"10 seconds"``, ``"5m"``, ``"1 hour"``, a
``timedelta``, or a bare number of seconds (as pydantic reads timedeltas).

Held as whole milliseconds (event time in the engine is epoch millis).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import BeforeValidator

_UNITS_MS = {
    "ms": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1_000, "sec": 1_000, "second": 1_000, "seconds": 1_000,
    "m": 60_000, "min": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}  # fmt: skip
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")


def parse_duration_ms(value: object) -> int:
    """``"10 seconds"`` → 10000; a bare number is seconds. ValueError lists the forms."""
    if isinstance(value, bool):
        raise ValueError("a duration, not a boolean")
    if isinstance(value, timedelta):
        return round(value.total_seconds() * 1000)
    if isinstance(value, int | float):
        return round(value * 1000)
    if isinstance(value, str):
        match = _PATTERN.match(value.lower())
        if match and match.group(2) in _UNITS_MS:
            return round(float(match.group(1)) * _UNITS_MS[match.group(2)])
    raise ValueError(
        f"{value!r} is not a duration: write e.g. '500 ms', '10 seconds', '5 minutes', '1 hour'"
    )


DurationMs = Annotated[int, BeforeValidator(parse_duration_ms)]
"""A non-negative duration in milliseconds, parsed from a string or seconds."""
