"""The ``kafka`` fixture is a real broker: records, end offsets and group commits round-trip."""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from tests.kafka_broker import KafkaBroker


def test_produce_lands_in_the_chosen_partition(kafka: KafkaBroker) -> None:
    kafka.create_topic("broker-produce", partitions=3)
    kafka.produce(
        "broker-produce", [b"a", "b", b"c"], partition=2, key="k", timestamp_ms=1_767_225_600_000
    )

    assert kafka.end_offsets("broker-produce") == {0: 0, 1: 0, 2: 3}
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "broker-produce-read"})
    try:
        consumer.assign([TopicPartition("broker-produce", 2, 0)])
        messages = consumer.consume(num_messages=3, timeout=10)
    finally:
        consumer.close()
    assert [(m.offset(), m.key(), m.value(), m.timestamp()[1]) for m in messages] == [
        (0, b"k", b"a", 1_767_225_600_000),
        (1, b"k", b"b", 1_767_225_600_000),
        (2, b"k", b"c", 1_767_225_600_000),
    ]


def test_a_group_commits_offsets_without_subscribing(kafka: KafkaBroker) -> None:
    """What the engine relies on: a consumer that never subscribes nor joins the group
    commits offsets for it synchronously, and a later client reads them back."""
    kafka.create_topic("broker-commit", partitions=3)
    kafka.produce("broker-commit", [b"x"] * 4, partition=2)

    assert kafka.committed("engine", "broker-commit") == {0: -1001, 1: -1001, 2: -1001}
    for offset in (4, 3):  # a later commit wins, even a lower one
        consumer = Consumer(
            {
                "bootstrap.servers": kafka.bootstrap,
                "group.id": "engine",
                "enable.auto.commit": False,
            }
        )
        try:
            result = consumer.commit(
                offsets=[TopicPartition("broker-commit", 2, offset)], asynchronous=False
            )
        finally:
            consumer.close()
        assert [(tp.partition, tp.offset, tp.error) for tp in result] == [(2, offset, None)]
        assert kafka.committed("engine", "broker-commit") == {0: -1001, 1: -1001, 2: offset}
    assert kafka.committed("someone-else", "broker-commit")[2] < 0
