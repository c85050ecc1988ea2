"""Stream-stream join: lowmark's ``stream_join`` next to Structured Streaming's stream-stream
join with watermarks, on the same data, in the same run.

Ad impressions and their clicks, joined on the ad and a time range:

    click.ad_id = impression.ad_id
    AND click_time BETWEEN imp_time AND imp_time + INTERVAL 10 MINUTES

The data is generated from a seed. Input file ``i`` of each side holds what
arrived in minute ``i``: impressions ``{imp_id, ad_id, imp_time}`` whose event
time lags their arrival by up to 2 minutes, and the clicks ``{click_id, ad_id,
click_time}`` that a share (30 %) of them get, 0-10 minutes after the
impression (most within a minute or two: an exponential delay of mean 1
minute, capped at 10), arriving up to 2 minutes after their event time (so clicks come
out of order, and a click often arrives minutes after its impression's
batch). Ads are drawn from a pool four times a file's impressions, so a click
matches its own impression and, on average, two or three others of the same
ad (an inner join: every pair within the range). A click file that would be
empty gets one click of an ad no impression has (it matches nothing), so
every file of both sides is one file. Nothing is ever behind either engine's
watermark (5 minutes behind the newest event time, more than the 2 minutes
of disorder), so neither drops a record.

- lowmark: a ``kind: union`` source of the impressions' JSON files (``files``,
  ``max_files_per_batch``) and the clicks' Delta table (``delta``, one version
  of one file per click file, ``max_versions_per_batch``), ``stream_join``
  inner on ``ad_id``, ``time: {left: imp_time, right: click_time, lower: 0
  s, upper: 10 minutes}``, ``event_time`` with 5 minutes of
  ``max_out_of_orderness`` → Delta sink; run batch by batch with
  ``MicroBatchRunner``. (A union reads one ``files`` source at most, so the
  clicks are a Delta table, for both engines.)
- Structured Streaming (SSS): ``readStream.json(impressions)
  .withWatermark("imp_time", "5 minutes")`` joined with
  ``readStream.format("delta").load(clicks).withWatermark("click_time",
  "5 minutes")`` on the same condition, ``maxFilesPerTrigger`` = lowmark's
  per-batch limit on each side, Delta sink with a checkpoint,
  ``trigger(availableNow=True)``, the default (HDFS-backed) state store. Its
  global watermark is the minimum of the two sides', as lowmark's.

So each batch of both engines takes the same file of impressions and the
same file of clicks. Both engines run in this one process's Spark session,
one after the other, each first warmed the same way (an unreported run over
a small warm-up dataset). Scenarios:

(a) small batches: one impressions file (300 impressions) and one clicks file
    (about 90 clicks) per batch; seconds per batch, median and p95 (lowmark:
    wall time of ``run_batch``; SSS: each batch's
    ``durationMs.triggerExecution``); batches that read no input left out.
(b) catch-up: 200 000 impressions (and about 60 000 clicks) in 40 files a
    side, 10 files a side per batch; events (impressions + clicks) per second
    from "start the stream" to "caught up".

Checked in the run (raises if not): each engine read every record; both
sinks hold exactly the same joined rows, and exactly those of a plain Spark
batch join over the whole input with the same condition. Prints a table and
the ratios lowmark / SSS against their targets, and writes them to
``--results`` if given. Timings are wall-clock on whatever else the machine
is doing; run it on a quiet box. No other assertions.

    .venv/bin/python -m bench.stream_join            # the full run (make bench)
    .venv/bin/python -m bench.stream_join --quick    # a smoke run with tiny sizes
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.side_by_side import (
    Run,
    iso_ms,
    lowmark_batches,
    main_of_two_scenarios,
    parser,
)
from bench.streaming import (
    T0_S,
    _say,
    land,
    run_sss,
)
from lowmark.batches.pipeline import DeltaSink, DeltaSource, FileSource, Pipeline, UnionSource
from lowmark.batches.stream_join import JoinTime, StreamJoin
from lowmark.batches.windows import EventTime

IMPRESSIONS = "imp_id STRING, ad_id STRING, imp_time TIMESTAMP"
CLICKS = pa.schema(
    [("click_id", pa.string()), ("ad_id", pa.string()), ("click_time", pa.timestamp("us", "UTC"))]
)
DELAY = "5 minutes"
"""Both engines' watermark delay (lowmark's ``max_out_of_orderness``)."""
RANGE_S = 600
"""A click matches the impressions of its ad up to this long before it."""
CONDITION = (
    "c.ad_id = i.ad_id AND c.click_time BETWEEN i.imp_time AND i.imp_time + INTERVAL 10 MINUTES"
)
FILE_SPAN_S = 60
"""Arrival time each file of a side covers."""
DISORDER_S = 120
"""Records arrive up to this long after their event time (below ``DELAY``: none is late)."""
CLICK_SHARE = 0.3
"""Of the impressions, the share that get a click."""
CLICK_DELAY_S = 60
"""A click follows its impression by an exponential delay of this mean, capped at
``RANGE_S``."""
ADS_PER_IMPRESSION = 4
"""Ads in the pool per impression of a file: a click matches about ten files' impressions
of its ad divided by this (plus its own)."""
T0_MS = T0_S * 1000
COLUMNS = ("ad_id", "imp_id", "imp_time", "click_id", "click_time")
"""The joined rows as lowmark writes them: the key, then each side's other columns."""


@dataclass(frozen=True)
class Sizes:
    warmup_files: int
    small_batches: int
    impressions_per_small_file: int
    catchup_impressions: int
    catchup_files: int
    files_per_batch: int


FULL = Sizes(5, 30, 300, 200_000, 40, 10)
QUICK = Sizes(2, 5, 300, 3_000, 10, 5)


@dataclass(frozen=True)
class Dataset:
    """Generated input: the impressions' folder, the clicks' table, records of each."""

    impressions: Path
    clicks: Path
    impression_count: int
    click_count: int

    @property
    def events(self) -> int:
        return self.impression_count + self.click_count


# ---------------------------------------------------------------- data


def generate(folder: Path, seed: int, dataset: str, files: int, impressions: int) -> Dataset:
    """``files`` files of impressions holding ``impressions`` in all, and as many versions
    of the clicks table (see the module docstring). Deterministic given the seed."""
    rng = random.Random(f"{seed}/{dataset}")
    ads = max(1, ADS_PER_IMPRESSION * impressions // files)
    span_ms, end_ms = FILE_SPAN_S * 1000, files * FILE_SPAN_S * 1000
    imp_files: list[list[str]] = [[] for _ in range(files)]
    click_files: list[list[tuple[str, str, int]]] = [[] for _ in range(files)]
    for n in range(impressions):
        arrival = min(n * end_ms // impressions + rng.randrange(span_ms // 2), end_ms - 1)
        imp_ms = arrival - rng.randrange(DISORDER_S * 1000)
        ad = f"ad{rng.randrange(ads)}"
        imp_files[arrival // span_ms].append(
            f'{{"imp_id": "i{n}", "ad_id": "{ad}", "imp_time": "{iso_ms(T0_MS + imp_ms)}"}}\n'
        )
        if rng.random() < CLICK_SHARE:
            delay_ms = min(round(rng.expovariate(1 / CLICK_DELAY_S) * 1000), RANGE_S * 1000)
            click_ms = imp_ms + delay_ms
            click_arrival = max(0, click_ms + rng.randrange(DISORDER_S * 1000))
            if click_arrival < end_ms:  # clicks after the input's end: none
                click_files[click_arrival // span_ms].append((f"c{n}", ad, T0_MS + click_ms))
    first_mtime = time.time() - 3600
    imp_folder, table = folder / "impressions", folder / "clicks"
    for i, lines in enumerate(imp_files):
        land(imp_folder, f"f{i:05d}.json", "".join(lines), first_mtime + i)
    clicks = 0
    for i, rows in enumerate(click_files):
        # A click file that would be empty holds a click no impression matches, so every
        # version of the table is one file.
        rows = rows or [(f"stray{i}", "ad-none", T0_MS + i * span_ms)]
        clicks += len(rows)
        ids, ads_of, times = zip(*rows, strict=True)
        micros = pa.array([ms * 1000 for ms in times], CLICKS.field("click_time").type)
        write_deltalake(
            str(table), pa.table([list(ids), list(ads_of), micros], CLICKS), mode="append"
        )
    return Dataset(imp_folder, table, impressions, clicks)


def datasets(folder: Path, seed: int, sizes: Sizes) -> dict[str, Dataset]:
    """The warm-up, small-batch and catch-up inputs, each in its folder below ``folder``."""
    per_small = sizes.impressions_per_small_file
    shapes = {  # files, impressions
        "warmup": (sizes.warmup_files, sizes.warmup_files * per_small),
        "small": (sizes.small_batches, sizes.small_batches * per_small),
        "catchup": (sizes.catchup_files, sizes.catchup_impressions),
    }
    return {
        name: generate(folder / name, seed, name, files, impressions)
        for name, (files, impressions) in shapes.items()
    }


# ---------------------------------------------------------------- engines


def joining_pipeline(name: str, data: Dataset, files_per_batch: int) -> Pipeline:
    """The benchmark's lowmark pipeline: impressions joined with their ad's clicks within
    10 minutes, into the Delta table ``out``."""
    return Pipeline(
        name=name,
        description="bench/stream_join.py: impressions with their ads' clicks",
        source=UnionSource(
            sources={
                "impressions": FileSource(
                    path=str(data.impressions),
                    format="json",
                    schema_ddl=IMPRESSIONS,
                    max_files_per_batch=files_per_batch,
                ),
                "clicks": DeltaSource(
                    path=str(data.clicks), max_versions_per_batch=files_per_batch
                ),
            }
        ),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="imp_time", max_out_of_orderness=DELAY),
        stream_join=StreamJoin(
            left="impressions",
            right="clicks",
            keys=("ad_id",),
            time=JoinTime(left="imp_time", right="click_time", upper=f"{RANGE_S} seconds"),
        ),
    )


def run_lowmark(
    spark: SparkSession, data: Dataset, root: Path, name: str, files_per_batch: int
) -> Run:
    """lowmark over ``data``, batch by batch until caught up; the sink is ``root/out``."""
    started = time.perf_counter()
    pipeline = joining_pipeline(f"join_{name}", data, files_per_batch)
    results, seconds = lowmark_batches(spark, pipeline, root, name)
    total = time.perf_counter() - started
    rows_in = sum(r.rows_in for r in results)
    set_aside = sum(r.rows_bad + r.rows_late for r in results)
    if rows_in != data.events or set_aside:
        raise RuntimeError(
            f"lowmark {name}: read {rows_in} of {data.events} records, set {set_aside} aside "
            "as bad or late"
        )
    return Run([s for r, s in zip(results, seconds, strict=True) if r.rows_in], total)


def run_structured_streaming(
    spark: SparkSession, data: Dataset, root: Path, name: str, files_per_batch: int
) -> Run:
    """SSS's stream-stream join over ``data``, available-now; the sink is ``root/out``."""
    started = time.perf_counter()
    impressions = (
        spark.readStream.schema(IMPRESSIONS)
        .option("maxFilesPerTrigger", files_per_batch)
        .json(str(data.impressions))
        .withWatermark("imp_time", DELAY)
    )
    clicks = (
        spark.readStream.format("delta")
        .option("maxFilesPerTrigger", files_per_batch)
        .load(str(data.clicks))
        .withWatermark("click_time", DELAY)
    )
    joined = _joined(impressions, clicks)
    progress = run_sss(joined, root / "checkpoint", root / "out", name, shape=lambda j: j)
    total = time.perf_counter() - started
    rows_in = sum(int(p["numInputRows"]) for p in progress)
    if rows_in != data.events:
        raise RuntimeError(f"SSS {name}: read {rows_in} of {data.events} records")
    return Run([p["durationMs"]["triggerExecution"] / 1000 for p in progress], total)


def _joined(impressions: DataFrame, clicks: DataFrame) -> DataFrame:
    """The inner join of the two sides, as lowmark writes its rows (``COLUMNS``)."""
    pairs = impressions.alias("i").join(clicks.alias("c"), F.expr(CONDITION), "inner")
    return pairs.select("i.ad_id", "i.imp_id", "i.imp_time", "c.click_id", "c.click_time")


def check_sinks(spark: SparkSession, name: str, data: Dataset, sinks: dict[str, Path]) -> None:
    """Raise unless every sink holds exactly the rows of one plain batch join over the whole
    input (as multisets: no row lost, none twice)."""
    impressions = spark.read.schema(IMPRESSIONS).json(str(data.impressions))
    expected = _joined(impressions, spark.read.format("delta").load(str(data.clicks)))
    expected = expected.cache()
    count = expected.count()
    for engine, table in sinks.items():
        got = spark.read.format("delta").load(str(table)).select(*COLUMNS)
        lost, extra = expected.exceptAll(got).count(), got.exceptAll(expected).count()
        if lost or extra:
            raise RuntimeError(
                f"{name}: {engine}'s sink lacks {lost} and has {extra} extra of the "
                f"{count} rows of a plain batch join over the whole input"
            )
    expected.unpersist()
    _say(f"  {name}: both sinks hold the {count:,} rows of a plain batch join, each once")


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    sizes = QUICK if args.quick else FULL
    overrides = {
        "small_batches": args.small_batches,
        "catchup_impressions": args.catchup_impressions,
    }
    sizes = dataclasses.replace(sizes, **{k: v for k, v in overrides.items() if v})
    main_of_two_scenarios(
        args,
        sizes,
        "bench.stream_join",
        lambda folder: datasets(folder, args.seed, sizes),
        lambda d: (
            f"{d.impression_count:,} impressions, {d.click_count:,} clicks, "
            f"{len(list(d.impressions.iterdir()))} files a side"
        ),
        {"lowmark": run_lowmark, "sss": run_structured_streaming},
        check_sinks,
        lambda d: d.events,
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parsing = parser("python -m bench.stream_join", __doc__, FULL, QUICK)
    parsing.add_argument("--small-batches", type=int, help="(a) one-file batches")
    parsing.add_argument("--catchup-impressions", type=int, help="(b) impressions in all")
    return parsing.parse_args(argv)


if __name__ == "__main__":
    main()
