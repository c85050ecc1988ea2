"""Durations as users write them: ``"10 mins"``, ``"1.5h"``, ``"90s"``, ``"2 days"``,
``"1h30m"``, ``"500 ms"``, ISO 8601 (``"PT10M"``), a ``timedelta``, or a bare number of
seconds (as pydantic reads timedeltas).

Words and abbreviations are read by ``pytimeparse2``; ISO 8601 durations by pydantic's
own timedelta parser. Held as whole milliseconds (event time in the engine is epoch
millis): a duration enters a pipeline's fingerprint as that integer, so any spelling of
the same length gives the same fingerprint.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import pytimeparse2
from pydantic import BeforeValidator, PlainSerializer, TypeAdapter, ValidationError

FORMS = "e.g. '500 ms', '90s', '10 mins', '1.5h', '2 days', '1h30m' or ISO 8601 'PT10M'"
"""The forms a duration may take, for error messages."""

_ISO_8601 = TypeAdapter(timedelta)


def parse_duration_ms(value: object) -> int:
    """``"10 seconds"`` → 10000; a bare number is seconds. ValueError lists the forms.

    Case does not matter: ``"5M"`` is five minutes, as it always was (a month is
    ``"1 month"`` or ``"1mo"``: 30 days, a year 365, as ISO 8601's ``P1M`` and ``P1Y``).
    """
    if isinstance(value, bool):
        raise ValueError(f"a duration, not a boolean: write {FORMS}")
    if isinstance(value, timedelta):
        return round(value.total_seconds() * 1000)
    if isinstance(value, int | float):
        return round(value * 1000)
    if isinstance(value, str):
        seconds = _seconds(value.strip())
        if seconds is not None:
            return round(seconds * 1000)
    raise ValueError(f"{value!r} is not a duration: write {FORMS}")


def _seconds(text: str) -> float | None:
    """Seconds in ``text`` (ISO 8601 when it starts with ``P``), None when it is none."""
    if text[:1] in ("P", "p"):
        try:
            return _ISO_8601.validate_python(text.upper()).total_seconds()
        except ValidationError:
            return None
    seconds = pytimeparse2.parse(text.lower())
    return None if seconds is None else float(seconds)


def duration_text(ms: int) -> str:
    """``ms`` as a duration ``parse_duration_ms`` reads back exactly (``"1500 ms"``)."""
    return f"{ms} ms"


DurationMs = Annotated[
    int,
    BeforeValidator(parse_duration_ms),
    PlainSerializer(duration_text, return_type=str, when_used="json"),
]
"""A non-negative duration in milliseconds, parsed from a string or seconds.

``model_dump(mode="json")`` writes it as ``"<n> ms"``, so a dumped pipeline validates
back to the same one (a bare number would be read as seconds); ``model_dump()`` keeps
the integer, which is what a pipeline's fingerprint holds."""
