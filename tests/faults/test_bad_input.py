"""Bad input: files that vanish before their batch, and schema drift in each format."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow
import pytest
from pyarrow import parquet
from pyspark.sql import SparkSession

from lowmark.batches.cli.commands import main
from lowmark.batches.errors import SourceFileChanged, SourceFileUnreadable
from lowmark.batches.loop import faults
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import FileSource, Pipeline
from tests.faults.harness import run_to_completion, snapshot
from tests.faults.scenarios import FIXED_INPUT, plain_append, tumbling_append, write_input
from tests.helpers import delta_frame, pipeline, sink_ids

SCHEMA = "id LONG, amount LONG"


def land(root: Path, name: str, text: str, second: int) -> Path:
    path = root / "in" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (1_700_000_000 + second, 1_700_000_000 + second))
    return path


def sink_rows(spark: SparkSession, root: Path) -> list[tuple[int, int | None]]:
    rows = delta_frame(spark, str(root / "out")).collect()
    return sorted((r.id, r.amount) for r in rows)


def bad_raws(spark: SparkSession, runner: MicroBatchRunner) -> list[str]:
    bad = delta_frame(spark, runner.checkpoint.table("bad_records"))
    return sorted(r.raw for r in bad.collect())


def crashed_first_batch(spark: SparkSession, tmp_path: Path, step: str) -> Path:
    """The data root of ``plain_append`` over one input file, its batch 0 crashed at ``step``."""
    write_input(tmp_path / "input", FIXED_INPUT[:1])
    root = tmp_path / "run"
    with faults.crash_at(faults.KillPoint(step, 0)), pytest.raises(faults.InjectedCrash):
        MicroBatchRunner(spark, plain_append, root).run_batch()
    return root


@pytest.mark.integration
def test_a_file_removed_before_its_batch_is_replayed_is_one_line_naming_it(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = crashed_first_batch(spark, tmp_path, "after_offset_log")
    (tmp_path / "input" / "f000.json").unlink()

    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "--pipelines",
                "tests.faults.scenarios",
                "--data-root",
                str(root),
                "run",
                "plain_append",
            ]
        )

    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: batch 0 of plain_append (input: file:")
    assert (
        "stopped (attempt 1 of 3): file:" in err and "f000.json (taken by batch 0) is gone" in err
    )
    assert "put it back" in err and len(err.strip().splitlines()) == 1


@pytest.mark.integration
def test_a_file_changed_under_a_half_written_batch_is_refused_naming_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = crashed_first_batch(spark, tmp_path, "after_sink")
    sink = root / "out"
    before = delta_frame(spark, str(sink)).count()
    taken = tmp_path / "input" / "f000.json"
    taken.write_text(taken.read_text() + '{"user": "z", "ts": "2026-01-01T00:00:09Z"}\n')

    # The sink holds the first attempt's rows: reading other bytes would mix two inputs.
    with pytest.raises(SourceFileChanged, match=r"f000.json \(taken by batch 0\) changed"):
        MicroBatchRunner(spark, plain_append, root).run_batch()
    assert delta_frame(spark, str(sink)).count() == before


@pytest.mark.parametrize(
    ("scenario", "file", "crashed"),
    [
        pytest.param(plain_append, 0, 0, marks=pytest.mark.integration),
        pytest.param(tumbling_append, 2, 2, marks=pytest.mark.integration),
        pytest.param(tumbling_append, 6, 2, marks=pytest.mark.integration),
    ],
    ids=["changed_before_its_read", "changed_before_the_read_ahead", "landed_before_it"],
)
def test_input_changing_between_the_listing_and_the_read_is_read_once_as_it_is(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    scenario: Pipeline,
    file: int,
    crashed: int,
) -> None:
    """Batch 0 lists every file; then, before any is read (batch 0's offsets are written,
    its read and the catch-up read-ahead of the batches after it come next), the producer
    adds a line to file ``file`` or lands it anew. The batch that reads a changed file
    records it as it read it, so the replay of that batch, killed after its sink write,
    reads the same bytes. The result is that of a fault-free run over the input as it
    ends, landed in the same order."""
    final = [*FIXED_INPUT]
    if file < len(final):
        final[file] = [*final[file], ("z", 9, 1)]
    else:
        final.append([("z", 70, 1)])
    write_input(tmp_path / "input", FIXED_INPUT)
    write_input(tmp_path / "reference" / "input", final)
    name = f"f{file:03d}.json"
    reached = faults.reached
    acted: list[str] = []

    def producer_acts(step: str, batch_id: int) -> None:
        if (step, batch_id) == ("after_offset_log", 0) and not acted:
            (tmp_path / "input" / name).write_text(
                (tmp_path / "reference/input" / name).read_text()
            )
            acted.append(step)
        reached(step, batch_id)

    monkeypatch.setattr(faults, "reached", producer_acts)
    run = tmp_path / "run"
    kill = faults.KillPoint("after_sink", crashed)
    with faults.crash_at(kill), pytest.raises(faults.InjectedCrash):
        run_to_completion(spark, scenario, run)
    run_to_completion(spark, scenario, run)

    reference = tmp_path / "reference" / "run"
    run_to_completion(spark, scenario, reference)
    expected, actual = snapshot(scenario, reference), snapshot(scenario, run)
    assert acted and expected["sink"] and expected["sink"] == actual["sink"]
    assert expected["sink history"] == actual["sink history"]


def test_json_fields_are_matched_by_name_and_a_value_of_another_type_is_a_bad_record(
    spark: SparkSession, data_root: Path
) -> None:
    land(
        data_root,
        "a.json",
        '{"id": 1, "amount": 2, "new": "x"}\n{"id": 2}\n{"id": 3, "amount": "3"}\n'
        '{"id": 4, "amount": 4.5}\n',
        0,
    )
    runner = MicroBatchRunner(spark, pipeline(), data_root)
    runner.run_batch()
    assert sink_rows(spark, data_root) == [(1, 2), (2, None)]
    assert bad_raws(spark, runner) == ['{"id": 3, "amount": "3"}', '{"id": 4, "amount": 4.5}']


def test_a_csv_file_whose_header_names_other_columns_is_refused_until_rewritten(
    spark: SparkSession, data_root: Path
) -> None:
    land(data_root, "a.csv", "id,amount\n1,2\n3,4,5\n", 0)
    swapped = land(data_root, "b.csv", "amount,id\n20,10\n", 1)
    source = FileSource(path="in", format="csv", schema_ddl=SCHEMA, max_files_per_batch=1)
    runner = MicroBatchRunner(spark, pipeline(source=source), data_root)
    runner.run_batch()
    with pytest.raises(
        SourceFileUnreadable, match=r"b.csv \(taken by batch 1\) has the CSV header"
    ):
        runner.run_batch()

    swapped.write_text("id,amount\n10,20\n")
    result = MicroBatchRunner(spark, pipeline(source=source), data_root).run_batch()

    assert result is not None and (result.batch_id, result.replay) == (1, True)
    assert sink_rows(spark, data_root) == [(1, 2), (10, 20)]
    assert bad_raws(spark, runner) == ["3,4,5"]


def test_a_parquet_column_of_an_unreadable_type_is_refused_naming_file_and_column(
    spark: SparkSession, data_root: Path
) -> None:
    folder = data_root / "in"
    folder.mkdir()
    parquet.write_table(pyarrow.table({"id": [1], "amount": [2]}), folder / "a.parquet")
    changed = pyarrow.table({"id": [3], "amount": ["4"], "new": ["x"]})
    parquet.write_table(changed, folder / "b.parquet")
    os.utime(folder / "b.parquet", (2_000_000_000, 2_000_000_000))
    source = FileSource(path="in", format="parquet", schema_ddl=SCHEMA, max_files_per_batch=1)
    runner = MicroBatchRunner(spark, pipeline(source=source), data_root)
    runner.run_batch()
    with pytest.raises(SourceFileUnreadable, match=r"b.parquet \(taken by batch 1\).*\[amount\]"):
        runner.run_batch()
    assert sink_ids(spark, data_root) == [1]
