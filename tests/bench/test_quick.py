"""The streaming benchmark's smoke run fills every row of its table (no timing asserted).

In `make test-integration` (100 s): it keeps the benchmark from rotting, and proves nothing
about the engine that the suite does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.streaming import value_differences

REPO = Path(__file__).resolve().parents[2]

MEASURED_BY = {
    "a_median": ("lowmark", "sss"),
    "a_p95": ("lowmark", "sss"),
    "b_rate": ("lowmark", "sss", "plain"),
    "b_seconds": ("lowmark", "sss", "plain"),
    "b_wide_rate": ("lowmark", "sss"),
    "b_wide_seconds": ("lowmark", "sss"),
    "c_scaling": ("lowmark", "sss"),
    "c_scaling_maintained": ("lowmark",),
    "d_p50": ("lowmark",),
    "d_p95": ("lowmark",),
    "d_batch": ("lowmark",),
    "e_rss": ("lowmark", "sss", "plain"),
    "e_rss_follow": ("lowmark",),
}
RATIOS = ("a", "b_sss", "b_wide", "b_plain", "c", "c_maintained", "d")


@pytest.mark.slow
@pytest.mark.integration
def test_the_quick_streaming_benchmark_fills_every_row_of_its_table(tmp_path: Path) -> None:
    report, table = tmp_path / "RESULTS.md", tmp_path / "results.json"
    args = ["--quick", "--results", str(report), "--json", str(table)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.streaming", *args, "--work-dir", str(tmp_path / "work")],
        cwd=REPO,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            # Short-lived JVMs (one per engine) start faster without C2 (timing is not asserted).
            "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        },
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    results = json.loads(table.read_text())
    measured = {m["key"]: m for m in results["measurements"]}
    assert set(measured) == set(MEASURED_BY)
    for key, engines in MEASURED_BY.items():
        for engine in engines:
            value = measured[key][engine]
            assert value is not None and value > 0, f"{key} {engine}: {value}"
    ratios = {r["key"]: r for r in results["ratios"]}
    assert set(ratios) == set(RATIOS)
    assert all(r["value"] is not None and r["value"] > 0 for r in ratios.values()), ratios
    text = report.read_text()
    assert "| measure | lowmark | Structured Streaming | plain batch |" in text
    assert all(m["label"] in text for m in results["measurements"])
    assert "ratio" in proc.stdout and "stopped by SIGINT" in proc.stdout
    assert "- catchup:" in text and "differ" not in text.split("Same output check")[1]


def test_the_output_check_names_a_window_whose_value_differs_between_engines() -> None:
    window = ["u1", "2026-01-01 00:00:00", 3, 1.5]
    other = ["u2", "2026-01-01 00:00:00", 2, 4.0]
    same = {"values": [window, other]}
    assert value_differences({"lowmark": same, "sss": same, "plain": same}) == []
    changed = {"values": [window, [*other[:3], 4.000001]]}
    assert value_differences({"lowmark": same, "sss": changed}) == [
        "lowmark and SSS differ in 2 window values"
    ]
    # The plain job also writes windows still open: only the streams' windows are compared.
    more = {"values": [window, other, ["u3", "2026-01-01 01:00:00", 1, 2.0]]}
    assert value_differences({"lowmark": same, "plain": more}) == []
    assert value_differences({"sss": same, "plain": {"values": [window]}}) == [
        "sss and the plain job differ in 1 windows"
    ]
