"""A runner's metrics in the Prometheus text format: a listener, an endpoint, a textfile.

``PrometheusMetrics`` is a ``PipelineListener`` that keeps one pipeline's
metrics in a registry of its own (``prometheus_client.CollectorRegistry``, never
the process-wide default: several runners in one process, or tests, do not
collide). ``serve_metrics`` exposes a registry on an HTTP endpoint for
Prometheus to scrape (``lowmark run --follow --metrics-port``); with
``textfile`` the listener also writes the registry after every event to a file
for node_exporter's textfile collector (written whole under a temporary name,
then renamed: a scrape never reads half a file), which suits short-lived runs
(Dagster's). The metric names and labels are the table in docs/metrics.md.

prometheus_client is imported where a registry is made or served, not with this module:
importing it (http.server, ssl) costs 0.1 s that the commands that only read, which import
this module with the CLI, must not pay (docs/cli.md, "Fast commands").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from lowmark.batches.loop.listeners import PipelineListener

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry, Counter, Gauge

    from lowmark.batches.loop.events import (
        BatchFailure,
        BatchResult,
        BatchStarted,
        FailedKind,
        RunTerminated,
    )
    from lowmark.batches.loop.microbatch import MicroBatchRunner

log = logging.getLogger(__name__)

ROW_KINDS = ("in", "out", "bad", "late", "duplicate")
"""The ``kind`` label of the row metrics: read, written to the sink, bad, late, and dropped
as duplicates (``dedup``)."""

FAILED_KINDS: tuple[FailedKind, ...] = ("data", "operational", "transient", "definition")

DURATION_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
"""Batch step durations span milliseconds (a driver-side write) to minutes (a catch-up)."""

TEXTFILE_ENV = "LOWMARK_METRICS_TEXTFILE_DIR"
"""A folder: runs write ``lowmark_<pipeline>.prom`` there for node_exporter's textfile
collector (``lowmark run --metrics-textfile-dir``, Dagster runs)."""


def textfile_path(folder: Path, pipeline: str) -> Path:
    """The metrics file of ``pipeline`` in ``folder``: one per pipeline, so runs of several
    pipelines never overwrite each other's (the collector reads every ``*.prom``)."""
    return folder / f"lowmark_{pipeline}.prom"


class PrometheusMetrics(PipelineListener):
    """One pipeline's batch metrics, updated from its runner's events.

    Counters count this runner's batches from 0 (a new process starts them again,
    which Prometheus's ``rate`` and ``increase`` read as a counter reset); gauges hold
    the newest committed batch. Every series is labelled ``pipeline``.
    """

    wants_backlog = True

    def __init__(self, pipeline: str, textfile: Path | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.pipeline = pipeline
        self.textfile = textfile
        self.registry = CollectorRegistry()
        r = self.registry

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, ("pipeline", *labels), registry=r)

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(name, doc, ("pipeline", *labels), registry=r)

        self.committed = counter(
            "lowmark_batches_committed", "Batches committed (replays included)."
        )
        self.replayed = counter(
            "lowmark_batches_replayed",
            "Committed batches that were replays of an uncommitted batch.",
        )
        self.failures = counter(
            "lowmark_batch_failures",
            "Batch attempts that failed before their commit, by kind (data, operational, "
            "transient).",
            "kind",
        )
        self.rows = counter(
            "lowmark_batch_rows",
            "Rows of committed batches by kind: in (read), out (to the sink), bad, late.",
            "kind",
        )
        self.last_rows = gauge(
            "lowmark_last_batch_rows", "Rows of the newest committed batch, by kind.", "kind"
        )
        self.duration = Histogram(
            "lowmark_batch_duration_seconds",
            "Time committed batches spent per step (plan, read, sink, commit, ..., total).",
            ("pipeline", "step"),
            buckets=DURATION_BUCKETS_S,
            registry=r,
        )
        self.last_batch = gauge("lowmark_last_batch_id", "Id of the newest committed batch.")
        self.last_commit = gauge(
            "lowmark_last_commit_timestamp_seconds", "When the newest batch committed (Unix time)."
        )
        self.watermark = gauge(
            "lowmark_watermark_timestamp_seconds",
            "Event-time watermark after the newest committed batch (Unix time).",
        )
        self.lag = gauge(
            "lowmark_event_time_lag_seconds",
            "Processing time minus the watermark, as of the newest committed batch.",
        )
        self.backlog = gauge(
            "lowmark_source_backlog",
            "What waits in the source past the newest committed batch, by unit (files, "
            "bytes, records, versions: the source's own).",
            "unit",
        )
        self.in_progress = gauge("lowmark_batch_in_progress", "1 while a batch runs, else 0.")
        # Every series that exists from the start reads 0 at once (rate() needs a start).
        for batches in (self.committed, self.replayed):
            batches.labels(pipeline)
        for failed in FAILED_KINDS:
            self.failures.labels(pipeline, failed)
        for kind in ROW_KINDS:
            self.rows.labels(pipeline, kind)
        self.in_progress.labels(pipeline).set(0)
        self._write()

    def on_batch_started(self, event: BatchStarted) -> None:
        self.in_progress.labels(self.pipeline).set(1)
        self._write()

    def on_batch_progress(self, progress: BatchResult) -> None:
        p = self.pipeline
        self.committed.labels(p).inc()
        if progress.replay:
            self.replayed.labels(p).inc()
        rows = (
            progress.rows_in,
            progress.rows_out,
            progress.rows_bad,
            progress.rows_late,
            progress.rows_duplicate or 0,
        )
        for kind, n in zip(ROW_KINDS, rows, strict=True):
            self.rows.labels(p, kind).inc(n)
            self.last_rows.labels(p, kind).set(n)
        for step, ms in progress.durations_ms.items():
            self.duration.labels(p, step).observe(ms / 1000)
        self.last_batch.labels(p).set(progress.batch_id)
        if progress.committed_at_ms is not None:
            self.last_commit.labels(p).set(progress.committed_at_ms / 1000)
        if progress.watermark_ms is not None:
            self.watermark.labels(p).set(progress.watermark_ms / 1000)
        if progress.lag_ms is not None:
            self.lag.labels(p).set(progress.lag_ms / 1000)
        for unit, n in (progress.backlog or {}).items():
            self.backlog.labels(p, unit).set(n)
        self.in_progress.labels(p).set(0)
        self._write()

    def on_batch_failed(self, event: BatchFailure) -> None:
        self.failures.labels(self.pipeline, event.kind).inc()
        self.in_progress.labels(self.pipeline).set(0)
        self._write()

    def on_run_terminated(self, event: RunTerminated) -> None:
        self.in_progress.labels(self.pipeline).set(0)
        self._write()

    def _write(self) -> None:
        """The registry to ``textfile``, whole (``write_to_textfile`` writes a temporary
        file beside it and renames it over the old one)."""
        if self.textfile is not None:
            from prometheus_client import write_to_textfile

            self.textfile.parent.mkdir(parents=True, exist_ok=True)
            write_to_textfile(str(self.textfile), self.registry)


@contextmanager
def serve_metrics(
    registry: CollectorRegistry, port: int, host: str = "127.0.0.1"
) -> Iterator[WSGIServer]:
    """``registry`` on ``http://host:port/metrics`` (any path answers) while the block runs,
    from a daemon thread; port 0 takes a free port (``server.server_port``)."""
    from prometheus_client.exposition import start_http_server

    server, thread = start_http_server(port, host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", host, server.server_port)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def textfile_dir_from_env() -> Path | None:
    """The folder ``LOWMARK_METRICS_TEXTFILE_DIR`` names, or None (no textfile)."""
    folder = os.environ.get(TEXTFILE_ENV)
    return Path(folder) if folder else None


@contextmanager
def exported_metrics(
    runner: MicroBatchRunner,
    port: int | None = None,
    host: str = "127.0.0.1",
    textfile_dir: Path | None = None,
) -> Iterator[int | None]:
    """``runner``'s metrics (a ``PrometheusMetrics`` listener) on ``http://host:port/metrics``
    while the block runs, and/or in ``textfile_dir``'s file for the pipeline; yields the
    port listened on (port 0: a free one), None without an endpoint. Neither: nothing."""
    if port is None and textfile_dir is None:
        yield None
        return
    name = runner.pipeline.name
    textfile = textfile_path(textfile_dir, name) if textfile_dir is not None else None
    metrics = PrometheusMetrics(name, textfile)
    # It stays registered: the runner's end (``with runner``), after this block, is news too.
    runner.add_listener(metrics)
    if port is None:
        yield None
        return
    with serve_metrics(metrics.registry, port, host) as server:
        yield server.server_port
