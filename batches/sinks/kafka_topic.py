"""The broker side of the Kafka sink: the producer's settings, the batch fence, and one
batch's records written in one producer transaction.

Exactly once, for a ``read_committed`` consumer, rests on one transaction per
batch that holds the batch's records AND a fence: an offset committed, with
``send_offsets_to_transaction``, to the consumer group ``lowmark.<app id>`` for
partition 0 of the output topic, equal to the batch id + 1 (its metadata names
the batch). The group is never consumed with; its committed offset is only a
number the broker stores atomically with the records (it need not be an offset
the topic holds). Both become visible when the transaction commits, or neither
does. A batch landed when that offset is past its id.

The transactional id, ``lowmark.<app id>.<topic>``, is the checkpoint's and the
topic's: ``init_transactions`` under it aborts a transaction a crashed attempt
left open and fences that attempt's producer, should it still be alive (its
commit then fails). Only after it does the sink read the fence, so no earlier
attempt can commit behind the reading.

Brokers away (unreachable, restarting, a partition without a leader or with
too few in-sync replicas, a call timing out: ``_retriable``) raise
``SinkUnavailable``: the transaction is aborted, or never began, and the
runner tries the batch again; a transaction whose commit the broker took
before the connection broke fenced the batch, which the next attempt finds.

What the fence cannot hold: the broker deletes a group's committed offsets
``offsets.retention.minutes`` (7 days by default) after the group's last commit.
A batch whose transaction committed, whose lowmark commit never came, and whose
replay waited longer than that writes its records a second time.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from lowmark.batches.errors import (
    PipelineConfigInvalid,
    SinkUnavailable,
    SinkUnreachable,
    SinkWriteFailed,
)
from lowmark.batches.pipeline import KafkaSink

TIMEOUT_S = 30.0
"""How long one call to the broker (metadata, init, commit, offsets) may take, in seconds."""

TRANSACTION_TIMEOUT_MS = "600000"
"""A transaction left open longer than this is aborted by the broker (unless ``producer``
sets ``transaction.timeout.ms``): a batch must stream its records within it. A crashed
attempt's open transaction holds ``read_committed`` consumers back until the next run
aborts it, or until this passes."""

Record = tuple[bytes | None, bytes | None]
"""A record's key and value (None: no key; a tombstone)."""


def fence_group(txn_app_id: str) -> str:
    """The consumer group whose committed offsets fence ``txn_app_id``'s batches."""
    return f"lowmark.{txn_app_id}"


def client_settings(config: KafkaSink) -> dict[str, Any]:
    """The settings every client of ``config`` connects with: the brokers, ``producer``'s
    settings, and the secret ones from the environment variables ``secret_env`` names."""
    settings: dict[str, Any] = {"bootstrap.servers": config.bootstrap_servers, **config.producer}
    for name, variable in config.secret_env.items():
        value = os.environ.get(variable)
        if value is None:
            raise PipelineConfigInvalid(
                f"sink kafka {config.topic}: environment variable {variable} (`secret_env` of "
                f"{name}) is not set: export it"
            )
        settings[name] = value
    return settings


class KafkaTopic:
    """A Kafka sink's topic, written by ``txn_app_id`` (the checkpoint's idempotency key).

    ``staged`` is called with the batch id once a batch's records are all on the broker,
    before its transaction commits (the batch loop's crash point ``before_sink_commit``).
    """

    def __init__(
        self,
        config: KafkaSink,
        txn_app_id: str,
        staged: Callable[[int], None] = lambda _batch_id: None,
    ) -> None:
        self.config = config
        self.txn_app_id = txn_app_id
        self.staged = staged
        self._producer: Producer | None = None

    def _fail(self, what: str, exc: KafkaException) -> str:
        return f"sink kafka {self.config.topic}: {what} ({_reason(exc)})"

    def _unavailable(self, exc: KafkaException) -> SinkUnavailable:
        return SinkUnavailable(f"sink kafka {self.config.topic}", _reason(exc))

    def check(self) -> None:
        """The brokers answer and hold the topic: a bad setting fails here, in one line,
        before the first batch."""
        admin = AdminClient(client_settings(self.config))
        try:
            found = admin.list_topics(topic=self.config.topic, timeout=TIMEOUT_S)
        except KafkaException as exc:
            raise SinkUnreachable(
                self._fail(f"cannot reach {self.config.bootstrap_servers}", exc)
                + "; fix `bootstrap_servers` or the `producer` settings"
            ) from exc
        topic = found.topics.get(self.config.topic)
        if topic is None or topic.error is not None:
            raise SinkWriteFailed(
                f"sink kafka {self.config.topic}: no such topic on "
                f"{self.config.bootstrap_servers}: create it (compacted, for update-mode "
                "windows)"
            )

    def landed(self, batch_id: int) -> bool:
        """Whether batch ``batch_id``'s transaction committed (the fence is past it)."""
        return self.last_landed() >= batch_id

    def last_landed(self) -> int:
        """The newest batch whose transaction committed (the fence less one); -1 when none
        did (no fence: the broker reports an invalid, negative offset)."""
        consumer = Consumer(
            client_settings(self.config)
            | {
                "group.id": fence_group(self.txn_app_id),
                "enable.auto.commit": False,
                # Waits out a fence of a transaction still being completed.
                "isolation.level": "read_committed",
            }
        )
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while True:
                try:
                    (fence,) = consumer.committed([TopicPartition(self.config.topic, 0)], TIMEOUT_S)
                    return max(int(fence.offset), 0) - 1
                except KafkaException as exc:
                    # The group's coordinator moving or loading, say: asked again.
                    if not _retriable(exc):
                        raise SinkUnreachable(
                            self._fail("cannot read the batch fence", exc)
                        ) from exc
                    if time.monotonic() > deadline:
                        raise self._unavailable(exc) from exc
                    time.sleep(0.1)
        finally:
            consumer.close()

    def write(self, batch_id: int, records: Iterable[Record]) -> bool:
        """Write batch ``batch_id``'s ``records`` (streamed: never all in memory at once) in
        one transaction with its fence. False (and nothing written) when the batch landed
        already."""
        producer = self._transactional()
        try:
            landed = self.landed(batch_id)
        except SinkUnavailable:
            self._producer = None  # it lost its brokers too (see below)
            raise
        if landed:
            return False
        topic = self.config.topic
        try:
            producer.begin_transaction()
            for key, value in records:
                _produce(producer, topic, key, value)
            producer.flush(TIMEOUT_S)  # on the broker, uncommitted: what `staged` sees
            self.staged(batch_id)
            fence = TopicPartition(topic, 0, batch_id + 1, f"lowmark batch {batch_id}")
            metadata = _group_metadata(self.config, self.txn_app_id)
            _bounded(lambda: producer.send_offsets_to_transaction([fence], metadata, TIMEOUT_S))
            producer.commit_transaction(TIMEOUT_S)
        except KafkaException as exc:
            if _retriable(exc):
                # A producer that lost its brokers can hang in its next transactional call
                # once they are back: it is dropped, not asked to abort; the next attempt's
                # new one aborts what it left open (``init_transactions``).
                self._producer = None
                raise self._unavailable(exc) from exc
            self._end(exc)
            raise SinkWriteFailed(
                self._fail(f"batch {batch_id}'s transaction failed", exc)
                + "; nothing of it is visible to read_committed consumers"
            ) from exc
        except Exception:
            self._end(None)
            raise
        return True

    def _transactional(self) -> Producer:
        """This sink's producer, its transactions initialised: the first call aborts what a
        crashed attempt left open and fences its producer."""
        if self._producer is None:
            settings = {"transaction.timeout.ms": TRANSACTION_TIMEOUT_MS}
            settings |= client_settings(self.config)
            settings |= {"transactional.id": f"lowmark.{self.txn_app_id}.{self.config.topic}"}
            producer = Producer(settings)
            try:
                producer.init_transactions(TIMEOUT_S)
            except KafkaException as exc:
                if _retriable(exc):  # `check` reached the brokers: they went away since
                    raise self._unavailable(exc) from exc
                raise SinkUnreachable(
                    self._fail("cannot start its transactions", exc)
                    + "; fix `bootstrap_servers` or the `producer` settings"
                ) from exc
            self._producer = producer
        return self._producer

    def _end(self, exc: KafkaException | None) -> None:
        """After a failed transaction: abort it, or, if the producer can no longer be used
        (fenced by a newer attempt, a fatal error), drop it for a new one next time."""
        assert self._producer is not None
        error = exc.args[0] if exc is not None and exc.args else None
        if isinstance(error, KafkaError) and error.fatal():
            self._producer = None
            return
        try:
            self._producer.abort_transaction(TIMEOUT_S)
        except KafkaException:
            self._producer = None


def _retriable(exc: KafkaException) -> bool:
    """Whether ``exc`` is the brokers briefly away, not a refusal: an error the client
    calls retriable, or one of ``_UNAVAILABLE``."""
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and (error.retriable() or error.code() in _UNAVAILABLE)


def _bounded(call: Callable[[], None]) -> None:
    """``call`` (a transactional call given ``TIMEOUT_S``), given up on after ``TIMEOUT_S``
    and a second more with a retriable timeout: librdkafka does not always keep to the
    timeout it is given (``send_offsets_to_transaction`` with the group's coordinator away
    blocks until the transaction times out, confluentinc/librdkafka#5456). The call goes on
    in its thread; its producer is dropped, and the next one's ``init_transactions``
    fences it."""
    done: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            done.append(None)
        except BaseException as exc:  # handed to the caller below
            done.append(exc)

    worker = threading.Thread(target=run, name="lowmark-kafka-call", daemon=True)
    worker.start()
    worker.join(TIMEOUT_S + 1)
    if not done:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"no answer in {TIMEOUT_S:g} s"))
    if done[0] is not None:
        raise done[0]


def _reason(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else exc
    return error.str() if isinstance(error, KafkaError) else str(error)


_COORDINATOR_ERRORS = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
    }
)
"""Errors of a group's coordinator being found or loaded: passing, asked again."""

_UNAVAILABLE = _COORDINATOR_ERRORS | {
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._MSG_TIMED_OUT,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError.BROKER_NOT_AVAILABLE,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.REQUEST_TIMED_OUT,
}
"""Errors of brokers away (down, restarting, electing a leader, short of in-sync replicas)
or of a call that timed out: a later try may not meet them, whatever the client's
``retriable`` says of them."""


def _produce(producer: Producer, topic: str, key: bytes | None, value: bytes | None) -> None:
    """Queue one record; while the producer's queue is full, serve it until there is room."""
    while True:
        try:
            producer.produce(topic, value=value, key=key)
            return
        except BufferError:
            producer.poll(0.1)


def _group_metadata(config: KafkaSink, txn_app_id: str) -> object:
    """The fence group's metadata, as ``send_offsets_to_transaction`` takes it (of a consumer
    that never joins the group)."""
    consumer = Consumer(client_settings(config) | {"group.id": fence_group(txn_app_id)})
    try:
        return consumer.consumer_group_metadata()
    finally:
        consumer.close()
