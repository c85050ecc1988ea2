"""Expectations: named conditions on a batch's records that warn, drop or fail the batch.

A ``drop`` expectation's records go to ``bad_records`` with its name and never
reach the sink, which must be what a plain Spark batch over the whole input,
filtered by the condition, gives; ``warn`` counts and keeps. A batch that
breaks a threshold or a ``fail`` expectation fails before anything is written
and, once the threshold is loosened, replays with the same offsets and lands
once. Counts are per batch and in total, in the commit, progress and status;
a windowed batch counts them in its one Spark job, and the catch-up
read-ahead gives what each batch's own job gives.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin import health
from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.errors import ExpectationsFailed
from lowmark.batches.expectations import Expectation, Quality
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import FileSource, Pipeline
from lowmark.batches.windows import Tumbling
from lowmark.orchestration.checks import check_specs
from lowmark.state.commit_log import COUNTS
from tests.helpers import (
    counted_batch,
    counted_per_window,
    delta_frame,
    drop_batches,
    event,
    lowmark,
    pipeline,
    reference,
    sink,
    sink_ids,
    windowed,
)

VALID_AMOUNT = Expectation(name="valid_amount", condition="amount >= 0", on_violation="drop")
SMALL_ID = Expectation(name="small_id", condition="id < 100")  # warn


def _files(root: Path, files: list[list[Any]]) -> None:
    """One file per batch; a str is a line as written, a dict a JSON record."""
    for i, rows in enumerate(files):
        path = root / "in" / f"f{i:03d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def _one_file_a_batch(**fields: Any) -> Pipeline:
    source = FileSource(
        path="in", format="json", schema_ddl="id LONG, amount LONG", max_files_per_batch=1
    )
    return pipeline(source=source, **fields)


def test_drop_sends_records_to_bad_records_by_name_and_warn_counts_them_but_keeps_them(
    spark: SparkSession, data_root: Path
) -> None:
    files: list[list[Any]] = [
        [{"id": 1, "amount": 5}, {"id": 2, "amount": -1}, {"id": 3}],  # no amount: violates
        [{"id": 4, "amount": 0}, {"id": 300, "amount": 7}, "{not json"],
    ]
    _files(data_root, files)
    p = _one_file_a_batch(expectations=(VALID_AMOUNT, SMALL_ID))
    results = MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    assert [r.violations for r in results] == [
        {"parsable": 0, "valid_amount": 2, "small_id": 0},
        {"parsable": 1, "valid_amount": 0, "small_id": 1},
    ]
    # The sink is the whole input, filtered by the drop expectation's condition.
    whole = spark.read.schema("id LONG, amount LONG").json(str(data_root / "in")).dropna("all")
    assertDataFrameEqual(
        sink(spark, data_root), whole.where(F.coalesce(F.expr("amount >= 0"), F.lit(False)))
    )
    runner = MicroBatchRunner(spark, p, data_root)
    bad = delta_frame(spark, runner.checkpoint.table("bad_records")).collect()
    dropped = sorted(
        (r.batch_id, r.reason, r.raw, r.source_file) for r in bad if r.reason == "valid_amount"
    )
    # A transformed record has no one source file (documented): source_file is null.
    assert dropped == [
        (0, "valid_amount", '{"id":2,"amount":-1}', None),
        (0, "valid_amount", '{"id":3}', None),
    ]
    [unparsed] = [r for r in bad if r.reason != "valid_amount"]
    assert unparsed.source_file.endswith(".json")  # the line that did not parse names its file
    # Per batch and in total: commit, progress, status; the accounting identity holds.
    commits = runner.checkpoint.commits.get_range()
    for c in commits:
        assert c.rows_in == c.rows_bad + c.rows_dropped + c.rows_out, c
    assert [(c.rows_in, c.rows_bad, c.rows_out) for c in commits] == [(3, 2, 1), (3, 1, 2)]
    totals = {"parsable": 1, "valid_amount": 2, "small_id": 1}
    assert commits[-1].violation_totals == totals
    progress = runner.checkpoint.progress.get_range()
    assert [e.violations for e in progress] == [r.violations for r in results]
    status = pipeline_status(spark, p, data_root)
    assert status.violations == totals and status.last_batch is not None
    assert status.last_batch.violations == results[-1].violations
    assert status.accounting == {"read": 6, "bad": 3, "dropped_by_transform": 0, "late": 0} | {
        "in_sink": 3
    }
    # The Dagster check: one over all expectations, each one's violations its numbers.
    outcome = health.expectations(p, data_root)
    assert not outcome.passed and "valid_amount (drop) 2" in outcome.description
    assert outcome.metadata == {"violations_valid_amount": 2, "violations_small_id": 1}
    assert [s.name for s in check_specs(p)][-1] == "expectations"
    assert "expectations" not in [s.name for s in check_specs(pipeline())]


def test_a_failing_expectation_fails_the_batch_before_any_write_and_a_warn_replays_it_once(
    spark: SparkSession, data_root: Path
) -> None:
    _files(data_root, [[{"id": 1, "amount": 1}], [{"id": 2, "amount": 500}, {"id": 3}]])
    small = Expectation(name="small_amount", condition="amount < 100", on_violation="fail")
    p = _one_file_a_batch(expectations=(small,))
    runner = MicroBatchRunner(spark, p, data_root)
    assert runner.run_batch() is not None
    with pytest.raises(ExpectationsFailed) as failed:
        runner.run_batch()
    message = str(failed.value)
    assert "\n" not in message
    assert "expectation small_amount (amount < 100) violated by 2 of 2 rows" in message
    assert "nothing was written" in message
    ckpt = runner.checkpoint
    assert (ckpt.offsets.latest_batch_id(), ckpt.commits.latest_batch_id()) == (1, 0)
    assert [f.kind for f in ckpt.failures.of(1)] == ["data"]
    assert sink_ids(spark, data_root) == [1]
    # Made a warning (changeable on a running checkpoint), the batch replays exactly.
    warned = p.model_copy(
        update={"expectations": (small.model_copy(update={"on_violation": "warn"}),)}
    )
    assert warned.fingerprint() == p.fingerprint()
    offsets = ckpt.offsets.get(1)
    assert offsets is not None
    replayed = MicroBatchRunner(spark, warned, data_root).run(max_batches=None)
    assert [(r.batch_id, r.replay, r.end) for r in replayed] == [(1, True, offsets.end_offsets)]
    assert replayed[0].violations == {"parsable": 0, "small_amount": 2}
    assert sink_ids(spark, data_root) == [1, 2, 3]
    assert MicroBatchRunner(spark, warned, data_root).run(max_batches=None) == []


ALL_BAD = _one_file_a_batch(name="all_bad")
"""The pipeline of the CLI test (found by ``--pipelines`` in this module)."""


def test_a_batch_over_max_bad_fraction_exits_non_zero_and_lands_once_when_loosened(
    spark: SparkSession, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Batch 1's records hold text where the schema says numbers: every row bad (the default
    # threshold is 0.9).
    wrong_types = ['{"id": "two", "amount": 5}', '{"id": 3, "amount": "six"}', '{"id": "x"}']
    _files(data_root, [[{"id": 1, "amount": 1}], wrong_types])
    code, _, err = lowmark(
        capsys, data_root, "--pipelines", __name__, "run", "all_bad", "--until-caught-up"
    )
    said = " ".join(err.split())
    assert code != 0
    assert "batch 1 of all_bad broke its expectations: 3 of 3 rows bad (100%)" in said, said
    assert "quality.max_bad_fraction 0.9" in said and "attempt 1 of 3" in said
    runner = MicroBatchRunner(spark, ALL_BAD, data_root)
    ckpt = runner.checkpoint
    assert (ckpt.offsets.latest_batch_id(), ckpt.commits.latest_batch_id()) == (1, 0)
    bad_table = delta_frame(spark, ckpt.table("bad_records"))
    assert bad_table.count() == 0  # nothing written
    assert sink_ids(spark, data_root) == [1]
    loosened = ALL_BAD.model_copy(update={"quality": Quality(max_bad_fraction=1.0)})
    assert loosened.fingerprint() == ALL_BAD.fingerprint()
    results = MicroBatchRunner(spark, loosened, data_root).run(max_batches=None)
    assert [(r.batch_id, r.replay, r.rows_bad) for r in results] == [(1, True, 3)]
    assert MicroBatchRunner(spark, loosened, data_root).run(max_batches=None) == []
    bad = delta_frame(spark, ckpt.table("bad_records")).collect()
    assert sorted(r.raw for r in bad) == sorted(wrong_types)
    assert sink_ids(spark, data_root) == [1]


DROP_NEGATIVE = Expectation(name="valid_amount", condition="amount >= 0", on_violation="drop")
NOT_C = Expectation(name="not_c", condition="user != 'c'")  # warn
BACKLOG = [
    [event("a", 1, 1), event("b", 2, 2)],
    [event("a", 12, -3), event("c", 14, 1)],  # a drop and a warning
    [event("a", 22, 10), event("b", 23, 4)],
    [event("b", 31, -4), event("a", 33, 2)],  # a drop
    [event("a", 45, 6), event("b", 46, 7)],
]


def test_a_windowed_pipeline_evaluates_expectations_in_its_one_job_and_reading_ahead(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = Tumbling(size="10 seconds")
    # Update mode: every window a batch changes is in the sink, open ones too.
    base = windowed(window, "update").model_copy(update={"expectations": (DROP_NEGATIVE, NOT_C)})
    runs = {}
    for read_ahead in (1, 10):
        root = tmp_path / f"ahead{read_ahead}"
        drop_batches(root, BACKLOG)
        p = base.model_copy(update={"read_ahead_batches": read_ahead})
        runner = MicroBatchRunner(spark, p, root)
        jobs = []
        while runner.planner.next_batch(dry_run=True).planned is not None:
            _, counter = counted_batch(spark, runner, monkeypatch)
            jobs.append(counter.jobs())
        bad = delta_frame(spark, runner.checkpoint.table("bad_records"))
        runs[read_ahead] = (
            [
                {k: getattr(c, k) for k in (*COUNTS, "violations", "next_watermark_ms")}
                for c in runner.checkpoint.commits.get_range()
            ],
            sorted(tuple(r) for r in bad.select("batch_id", "reason", "raw").collect()),
            jobs,
        )
        # The sink is a plain Spark batch's windows over the input the expectation keeps.
        kept = tmp_path / f"kept{read_ahead}"
        drop_batches(kept, [[e for e in b if e["amount"] >= 0] for b in BACKLOG])
        assertDataFrameEqual(sink(spark, root), reference(spark, kept, window))
    own, ahead = runs[1], runs[10]
    for own_commit, ahead_commit in zip(own[0], ahead[0], strict=True):
        assert own_commit == ahead_commit
    assert own[1] == ahead[1]
    assert [c["violations"] for c in own[0]] == [
        {"parsable": 0, "valid_amount": v, "not_c": w}
        for v, w in [(0, 0), (1, 1), (0, 0), (1, 0), (0, 0), (0, 0)]
    ]
    assert [(b, reason) for b, reason, _ in own[1]] == [(1, "valid_amount"), (3, "valid_amount")]
    assert own[2][:5] == [1, 1, 1, 1, 1]  # each batch's own job: the expectations ride on it
    # Read ahead: one job for all, and batches 1 and 3 (violations) run their own.
    assert ahead[2][:5] == [1, 1, 0, 1, 0]


def test_only_drop_expectations_change_the_fingerprint() -> None:
    # Fingerprints from before expectations existed: their checkpoints keep working.
    assert pipeline().fingerprint() == "13f96c9935f8362c"
    assert counted_per_window().fingerprint() == "1763bd137fcdeec4"
    fail = Expectation(name="small", condition="amount < 100", on_violation="fail")
    operational = pipeline(
        expectations=(SMALL_ID, fail), quality=Quality(max_bad_fraction=0.1, fail_on=("small_id",))
    )
    assert operational.fingerprint() == "13f96c9935f8362c"
    assert pipeline(expectations=(VALID_AMOUNT,)).fingerprint() != "13f96c9935f8362c"
    other = VALID_AMOUNT.model_copy(update={"condition": "amount > 0"})
    assert (
        pipeline(expectations=(other,)).fingerprint()
        != pipeline(expectations=(VALID_AMOUNT,)).fingerprint()
    )


def test_expectation_names_are_checked_when_the_pipeline_is_defined() -> None:
    with pytest.raises(ValueError, match="named twice"):
        pipeline(expectations=(SMALL_ID, SMALL_ID))
    with pytest.raises(ValueError, match="built-in"):
        pipeline(expectations=(Expectation(name="parsable", condition="true"),))
    with pytest.raises(ValueError, match="no expectations"):
        pipeline(quality=Quality(fail_on=("nope",)))
    assert pipeline(quality=Quality(fail_on=("parsable",))).quality.fail_on == ("parsable",)
