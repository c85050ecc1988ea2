"""Listeners: Python objects a runner tells of its batches as they run.

Like Structured Streaming's ``StreamingQueryListener``: subclass
``PipelineListener``, override the hooks you need, and register an instance with
``MicroBatchRunner(listeners=[...])`` / ``runner.add_listener``, or name the class
in a pipeline's ``listeners`` (``pkg.mod:MyListener``, made with no arguments).
The runner calls the hooks in its own thread, at fixed points of a batch
(``MicroBatchRunner._batch``):

- ``on_batch_started(BatchStarted)``: after planning (step 1), before any write;
- ``on_batch_progress(BatchResult)``: after the commit and the progress row (step 8);
- ``on_batch_failed(BatchFailure)``: a started batch failed before its commit;
- ``on_run_terminated(RunTerminated)``: the runner's ``with`` block ended.

So each started batch is followed by exactly one progress or failure event,
unless the run stops in between (another runner, an interrupt: then the run's
termination says why). A listener that raises is logged and otherwise ignored:
it never fails a batch, and the other listeners are still called. A slow
listener slows the batch (hand slow work to a thread of your own).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, ClassVar, TypeAlias

from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.state.errors import first_line

if TYPE_CHECKING:
    from lowmark.batches.loop.events import BatchFailure, BatchResult, BatchStarted, RunTerminated
    from lowmark.batches.pipeline import Pipeline

    Event: TypeAlias = BatchStarted | BatchResult | BatchFailure | RunTerminated
    """Anything a listener is told."""

log = logging.getLogger(__name__)


class PipelineListener:
    """Hooks a runner calls with its batches' events; each does nothing unless overridden."""

    wants_backlog: ClassVar[bool] = False
    """True: the runner measures the source's backlog after each commit for this listener
    (``BatchResult.backlog``; a folder listing or a broker call per batch)."""

    def on_batch_started(self, event: BatchStarted) -> None:
        """A batch was planned and starts."""

    def on_batch_progress(self, progress: BatchResult) -> None:
        """A batch committed; ``progress`` is what it did."""

    def on_batch_failed(self, event: BatchFailure) -> None:
        """A started batch failed before its commit."""

    def on_run_terminated(self, event: RunTerminated) -> None:
        """The runner stopped."""


def configured_listeners(pipeline: Pipeline) -> list[PipelineListener]:
    """The listeners ``pipeline.listeners`` names, each made with no arguments; one that
    cannot be made, or is no ``PipelineListener``, is ``PipelineConfigInvalid``."""
    made: list[PipelineListener] = []
    for factory in pipeline.listeners:
        path = f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', factory)}"
        try:
            listener = factory()
        except Exception as exc:
            raise PipelineConfigInvalid(
                f"pipeline {pipeline.name}: listener {path} could not be made with no "
                f"arguments: {first_line(exc)}"
            ) from exc
        if not isinstance(listener, PipelineListener):
            raise PipelineConfigInvalid(
                f"pipeline {pipeline.name}: listener {path} made a {type(listener).__name__}, "
                "not a PipelineListener: name a subclass of "
                "lowmark.batches.loop.listeners.PipelineListener"
            )
        made.append(listener)
    return made


class Listeners:
    """The listeners of one runner, each told of every event in the order registered."""

    def __init__(self, listeners: Iterable[PipelineListener] = ()) -> None:
        self._listeners = list(listeners)

    def __iter__(self) -> Iterator[PipelineListener]:
        return iter(self._listeners)

    def add(self, listener: PipelineListener) -> None:
        self._listeners.append(listener)

    def remove(self, listener: PipelineListener) -> None:
        self._listeners.remove(listener)

    @property
    def want_backlog(self) -> bool:
        """Whether any listener asks for the source's backlog after each commit."""
        return any(getattr(listener, "wants_backlog", False) for listener in self._listeners)

    def batch_started(self, event: BatchStarted) -> None:
        self._tell("on_batch_started", event)

    def batch_progress(self, progress: BatchResult) -> None:
        self._tell("on_batch_progress", progress)

    def batch_failed(self, event: BatchFailure) -> None:
        self._tell("on_batch_failed", event)

    def run_terminated(self, event: RunTerminated) -> None:
        self._tell("on_run_terminated", event)

    def _tell(self, hook: str, event: Event) -> None:
        """Call ``hook`` of every listener that has it; one that raises is logged, as in
        Spark: a listener must not decide whether a batch commits."""
        for listener in self._listeners:
            call = getattr(listener, hook, None)
            if call is None:
                continue
            try:
                call(event)
            except Exception as exc:
                log.warning(
                    "pipeline %s: listener %s raised in %s (ignored): %s",
                    event.pipeline,
                    type(listener).__qualname__,
                    hook,
                    first_line(exc),
                    exc_info=True,
                )
