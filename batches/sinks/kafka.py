"""The Kafka sink (``kind: kafka``): a batch's records in one producer transaction with the
batch's fence, exactly once for ``read_committed`` consumers
(``lowmark.batches.sinks.kafka_topic``).

Records are made by Spark (key and value columns: ``to_json`` for a row as JSON)
and streamed to the driver one partition at a time (``toLocalIterator``) into
the driver's one producer: the transaction, like a Postgres sink's, is one
client's, so the driver holds one partition, never the batch. A windowed
pipeline's windows reach it as a small local DataFrame
(``lowmark.batches.sinks.custom.WindowsAsFrames``); in update mode each changed
window is a record keyed by its keys and bounds (a JSON object), so a compacted
topic keeps each window's latest, and each window the batch retracts is a
tombstone (a null value) under its key, written before the changed ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType

from lowmark.batches.pipeline import KafkaSink
from lowmark.batches.sinks.base import Sink, SinkFence
from lowmark.batches.sinks.kafka_topic import KafkaTopic, Record


class KafkaFence(SinkFence):
    """A Kafka sink's fence: the offset its batches' transactions commit for the fence group
    (``lowmark.batches.sinks.kafka_topic``)."""

    def __init__(
        self,
        config: KafkaSink,
        txn_app_id: str,
        staged: Callable[[int], None] = lambda _batch_id: None,
    ) -> None:
        self.config = config
        self.topic = KafkaTopic(config, txn_app_id, staged)

    def landed(self, batch_id: int) -> bool:
        return self.topic.landed(batch_id)

    def last_landed(self) -> int:
        return self.topic.last_landed()


class KafkaFrameSink(KafkaFence, Sink):
    """A pipeline's output into a Kafka topic, a transaction per batch (contract: ``Sink``;
    not versioned: ``write`` returns None). ``identity``: the columns that key an
    update-mode window (its keys and bounds), None for records and append-mode windows;
    ``staged``: as ``KafkaTopic``'s."""

    def __init__(
        self,
        config: KafkaSink,
        txn_app_id: str,
        identity: tuple[str, ...] | None = None,
        staged: Callable[[int], None] = lambda _batch_id: None,
    ) -> None:
        super().__init__(config, txn_app_id, staged)
        self.identity = identity

    def write(self, df: DataFrame, batch_id: int, retract: DataFrame | None = None) -> None:
        # Lazy: no Spark job runs before the topic knows the batch is not landed yet.
        gone = _records(retract.select(self._key(retract), F.lit(None))) if retract else ()
        changed = _records(df.select(self._key(df), self._value(df)))
        self.topic.write(batch_id, chain(gone, changed))

    def _key(self, df: DataFrame) -> Column:
        if self.identity is not None:
            return F.to_json(F.struct(*self.identity))
        if self.config.key is None:
            return F.lit(None)
        return _bytes_or_text(df, self.config.key)

    def _value(self, df: DataFrame) -> Column:
        if self.config.value == "json":
            return F.to_json(F.struct(*df.columns))
        return _bytes_or_text(df, self.config.value)


def _bytes_or_text(df: DataFrame, column_or_expression: str) -> Column:
    """A column of ``df`` by name, else a SQL expression over it: binary as is, anything else
    cast to a string."""
    column = (
        F.col(f"`{column_or_expression}`")
        if column_or_expression in df.columns
        else F.expr(column_or_expression)
    )
    typed = df.select(column).schema.fields[0].dataType
    return column if isinstance(typed, BinaryType) else column.cast("string")


def _records(df: DataFrame) -> Iterator[Record]:
    """``df``'s (key, value) rows as bytes, a partition on the driver at a time."""
    for key, value in df.toLocalIterator():
        yield _encoded(key), _encoded(value)


def _encoded(value: str | bytes | bytearray | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return value.encode() if isinstance(value, str) else bytes(value)
