"""A keyed step, as users declare it: a stateful processor over the records of each key.

```yaml
keyed:
  processor: examples.keyed:Sessions     # a pyspark StatefulProcessor subclass
  keys: [user]
  output_schema: "user string, session_start timestamp, ..."
  time_mode: event_time                   # timers fire as the watermark passes them
  output_event_time: session_end          # with an aggregation after it: the rows' event time
```

What a batch does with it is ``lowmark.batches.keyed.step``; how the processor is
run, ``lowmark.batches.keyed.runtime``; where its state lives,
``lowmark.state.keyed_state``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field, ImportString

from lowmark.batches.config import UserConfig

if TYPE_CHECKING:
    from lowmark.state.keyed_state import Expiry


class Keyed(UserConfig):
    """Run ``processor`` over each key's records, with its own state and timers.

    ``processor`` is a ``pyspark.sql.streaming.StatefulProcessor`` subclass (the
    API of Structured Streaming's ``transformWithStateInPandas``): per batch and
    key, ``handleInputRows`` gets the key's new records (in event-time order),
    then ``handleExpiredTimer`` each due timer; what they yield (pandas
    DataFrames of ``output_schema``) goes to the sink, or, when the pipeline has an
    ``aggregation`` too, into its windows, by the event time in ``output_event_time``
    (the window stage runs with the watermark the keyed step had one batch before:
    ``lowmark.batches.loop.plan``). Needs ``event_time``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    processor: ImportString[Any] = Field(
        description="Import path of the processor class (`package.module:Class`)."
    )
    keys: tuple[str, ...] = Field(min_length=1, description="Columns the records are keyed by.")
    output_schema: str = Field(description="DDL of the rows the processor yields.")
    time_mode: Literal["event_time", "processing_time"] = Field(
        default="event_time",
        description="What timers follow: the watermark (event_time) or the batch's "
        "processing time.",
    )
    output_event_time: str | None = Field(
        default=None,
        description="With an `aggregation` after the keyed step: the column of the output "
        "rows that holds their event time (default: the pipeline's `event_time.column`).",
    )

    def semantics(self) -> dict[str, Any]:
        """What the pipeline's fingerprint holds of this step: its fields and, under
        ``states``, each state its processor's ``init`` declares (``StateSchema.semantics``;
        run here, on the driver, without Spark)."""
        # Imported here: the runtime needs pandas and PySpark, which reading a definition
        # that has no keyed step (`lowmark list`, `show`) must not import.
        from lowmark.batches.keyed.runtime import declared_states

        states = declared_states(self.processor)
        # Absent when unset, so keyed steps declared before it keep their fingerprint.
        return self.model_dump(exclude_none=True) | {
            "states": {name: state.semantics() for name, state in sorted(states.items())}
        }

    def expiry(self, processing_ms: int, watermark_ms: int | None) -> Expiry:
        """What this step's states have expired by at processing time ``processing_ms`` and
        watermark ``watermark_ms`` (``lowmark.state.keyed_state.Expiry``)."""
        from lowmark.batches.keyed.runtime import by_event_time, declared_states
        from lowmark.state.keyed_state import Expiry

        return Expiry(processing_ms, watermark_ms, by_event_time(declared_states(self.processor)))
