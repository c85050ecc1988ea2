"""Durations as people write them, every form accepted before kept with its meaning, and
the fingerprints of existing pipelines unchanged."""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from lowmark.batches.durations import parse_duration_ms
from lowmark.batches.registry import load_pipelines
from lowmark.batches.windows import EventTime

REPO = Path(__file__).resolve().parents[2]

EARLIER_UNITS_MS = {
    "ms": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1_000, "sec": 1_000, "second": 1_000, "seconds": 1_000,
    "m": 60_000, "min": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}  # fmt: skip
"""Every unit durations took before they were read by a library, and its length."""


@pytest.mark.parametrize(
    ("number", "unit", "space"),
    itertools.product(("0", "1", "2.5", "10", "90", "0.001"), EARLIER_UNITS_MS, ("", " ")),
)
def test_every_form_accepted_before_keeps_its_meaning(number: str, unit: str, space: str) -> None:
    expected = round(float(number) * EARLIER_UNITS_MS[unit])
    assert parse_duration_ms(f"{number}{space}{unit}") == expected
    assert parse_duration_ms(f" {number}{space}{unit.upper()} ") == expected


@pytest.mark.parametrize(
    ("written", "ms"),
    [
        ("10 mins", 600_000),
        ("1.5h", 5_400_000),
        ("90s", 90_000),
        ("2 days", 172_800_000),
        ("1h30m", 5_400_000),
        ("1 hour 30 minutes", 5_400_000),
        ("2 hrs", 7_200_000),
        ("45 secs", 45_000),
        ("1 week", 604_800_000),
        ("PT10M", 600_000),
        ("pt10m", 600_000),
        ("PT1.5S", 1_500),
        ("P2D", 172_800_000),
        ("P1DT2H", 93_600_000),
        ("10", 10_000),
        (10, 10_000),
        (0.5, 500),
        (timedelta(minutes=2), 120_000),
    ],
)
def test_durations_read_as_people_write_them(written: object, ms: int) -> None:
    assert parse_duration_ms(written) == ms


@pytest.mark.parametrize("written", ["10 minz", "ten minutes", "", "PT", "P1X", "5 parsecs", True])
def test_a_bad_duration_is_one_line_naming_the_field_and_the_forms(written: object) -> None:
    with pytest.raises(ValidationError) as raised:
        EventTime(column="ts", max_out_of_orderness=written)
    [error] = raised.value.errors()
    assert error["loc"] == ("max_out_of_orderness",)
    message = error["msg"]
    assert "\n" not in message and "'10 mins'" in message and "'PT10M'" in message, message


def test_the_fingerprints_of_the_demo_and_example_pipelines_are_unchanged() -> None:
    """Durations enter the fingerprint as milliseconds: these were taken with the parser
    durations had before, and must not move (a checkpoint would refuse its pipeline). The
    demo's three were taken again when its transforms moved to ``lowmark.batches.demo``
    (a transform's import path is part of the definition)."""
    fingerprints = {
        name: p.fingerprint()
        for source in (None, str(REPO / "examples" / "pipelines.yaml"))
        for name, p in load_pipelines(source).items()
    }
    assert fingerprints == {
        "orders": "6b8f606c38c6011f",
        "user_revenue": "67a5e47260cbe322",
        "latest_orders": "521f08ff3aaa7ef9",
        "synthetic_clicks": "4407969415685b79",
        "kafka_orders": "ecf4971d500e9334",
        "clicks_two_regions": "f9100180d1d6ca37",
        "clicks_per_hour": "d151a882d50a754f",
        "busy_minutes_sql": "3bf2c6952cd0ee55",
        "unique_orders": "df4fe47e3a6d0293",  # taken when it was added
        # Taken again when state schemas entered a keyed step's definition (a checkpoint
        # from before runs on: ``Planner._check_states_evolved``).
        "sessions": "e64e0b4635c1fbba",
        "device_status": "d56fcda850ee460d",
        "sessions_per_window": "0cf3f4224bbf5877",  # taken when it was added
        "revenue_per_segment": "467319418370d802",  # taken when it was added
    }


def test_a_pipeline_dumped_as_json_validates_back_to_the_same_pipeline() -> None:
    """A bare number is read as seconds, so a dump that wrote durations as milliseconds
    would come back a thousand times longer."""
    for source in (None, str(REPO / "examples" / "pipelines.yaml")):
        for name, pipeline in load_pipelines(source).items():
            again = type(pipeline).model_validate(pipeline.model_dump(mode="json"))
            assert again.definition() == pipeline.definition(), name
            assert again.event_time == pipeline.event_time, name
