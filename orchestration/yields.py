"""A following run that yields its pool slot, and the follow window the sensor resumes.

A run that follows the source holds its pipeline's one pool slot, so a run
queued behind it (a Materialize, a backfill) can only leave Dagster's queue
once it ends. It ends after its batch, and records on its own Dagster run that
it yielded (``Yielded.tags``): to which run, and when its follow window would
have ended. The sensor's next tick, once nothing of the pipeline is in flight,
resumes following for the rest of that window, new data or not
(``lowmark.orchestration.sensors``): a Materialize with nothing to do must not
end the following.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import dagster as dg

from lowmark.batches.cli.display import iso_utc
from lowmark.orchestration.keys import FOLLOW_UNTIL_TAG, YIELDED_TO_TAG


@dataclass(frozen=True)
class Yielded:
    """A following run stopped, after its batch, so ``to_run_id`` could take the slot; its
    follow window would have lasted until ``until_ms`` (epoch ms, UTC)."""

    to_run_id: str
    until_ms: int

    def tags(self) -> dict[str, str]:
        """The run tags that record the yield on the run that yielded."""
        return {YIELDED_TO_TAG: self.to_run_id, FOLLOW_UNTIL_TAG: iso_utc(self.until_ms)}

    @classmethod
    def of(cls, run: dg.DagsterRun) -> Yielded | None:
        """What ``run`` recorded when it yielded; None when it did not."""
        to_run_id, until = run.tags.get(YIELDED_TO_TAG), run.tags.get(FOLLOW_UNTIL_TAG)
        if to_run_id is None or until is None:
            return None
        return cls(to_run_id, round(datetime.fromisoformat(until).timestamp() * 1000))
