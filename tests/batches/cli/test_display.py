"""How the CLI shows times, durations and tables (batches/cli/display.py)."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
from rich.console import Console

from lowmark.batches.cli.display import age, duration, iso_utc, moment, print_fields, print_table
from tests.helpers import FakeClock

SECOND, MINUTE, HOUR, DAY = 1_000, 60_000, 3_600_000, 86_400_000


@pytest.mark.parametrize(
    ("ms", "shown"),
    [
        (0, "0 ms"),
        (840, "840 ms"),
        (999, "999 ms"),
        (1_000, "1.0 s"),
        (4_290, "4.2 s"),  # truncated, not rounded up
        (10_000, "10 s"),
        (59_999, "59 s"),
        (3 * MINUTE + 12 * SECOND, "3 min 12 s"),
        (5 * MINUTE, "5 min"),
        (HOUR, "1 h"),
        (2 * HOUR + 5 * MINUTE + 59 * SECOND, "2 h 5 min"),
        (3 * DAY + 4 * HOUR, "3 d 4 h"),
        (-(3 * MINUTE + 12 * SECOND), "-3 min 12 s"),
    ],
)
def test_a_duration_reads_in_at_most_two_units(ms: int, shown: str) -> None:
    assert duration(ms) == shown


def test_a_moment_is_iso_utc_with_its_age_on_the_clock() -> None:
    at = datetime(2026, 11, 25, 10, 4, 12, 345_000, tzinfo=UTC)
    at_ms = int(at.timestamp() * 1000)
    clock = FakeClock(now_ms=at_ms + 3 * MINUTE + 12 * SECOND)
    assert iso_utc(at_ms) == "2026-11-25T10:04:12Z"
    assert moment(at_ms, clock.now_ms()) == "2026-11-25T10:04:12Z (3 min 12 s ago)"
    clock.advance(HOUR)
    assert age(at_ms, clock.now_ms()) == "1 h 3 min ago"
    assert age(clock.now_ms() + 5 * SECOND, clock.now_ms()) == "in 5.0 s"  # from the future


ROWS = [
    ("orders", "files:demo/incoming", "Demo: order events (JSON files) → cleaned orders."),
    ("user_revenue", "files:x", "Orders and revenue per user per minute, in windows."),
]


def rendered(terminal: bool, width: int) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=terminal, width=width, color_system=None)
    print_table(console, ("pipeline", "source", "description"), ROWS)
    return buffer.getvalue()


def test_a_table_in_a_pipe_is_one_aligned_line_per_row_whatever_the_width() -> None:
    lines = rendered(terminal=False, width=40).splitlines()
    assert lines[0].split() == ["pipeline", "source", "description"]
    column = lines[0].index("description")
    for line, (name, source, description) in zip(lines[1:], ROWS, strict=True):
        assert line == f"{name:<12}  {source:<19}  {description}"
        assert line.index(description) == column


def test_a_terminal_wide_enough_gets_the_same_aligned_lines() -> None:
    assert rendered(terminal=True, width=120) == rendered(terminal=False, width=120)


def test_a_terminal_too_narrow_gets_one_block_per_row_with_every_cell_whole() -> None:
    text = rendered(terminal=True, width=60)
    blocks = text.split("\n\n")
    assert len(blocks) == len(ROWS)
    for block, (name, source, description) in zip(blocks, ROWS, strict=True):
        assert block.strip().splitlines() == [
            name,
            f"  source       {source}",
            f"  description  {description}",
        ]


def test_fields_align_their_values_and_continue_a_value_of_several_lines() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=20, color_system=None)
    print_fields(console, [("input", "0 → 2 (+2)"), ("inputs", "a.json\nb.json")])
    assert buffer.getvalue().splitlines() == [
        "input   0 → 2 (+2)",
        "inputs  a.json",
        "        b.json",
    ]
