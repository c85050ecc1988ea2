"""The crash tests' Kafka sink runs: a topic of its own per data root, copied with its fence
as a run's folder is copied, and read back as a ``read_committed`` consumer sees it.

Each run (reference, template, crash case) writes a topic named after its data root,
as it writes Delta tables and a Postgres database of its own; the topic is not part of
the pipeline's fingerprint, so copies of one checkpoint write their own topics. A
`lowmark run` subprocess finds its topic in ``KAFKA_SINK_ENV`` and the broker in
``KAFKA_ENV`` (``tests.faults.scenarios``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from lowmark.batches.pipeline import KafkaSink, Pipeline
from lowmark.batches.sinks.kafka_topic import fence_group
from lowmark.state.checkpoint import Checkpoint
from tests.faults.scenarios import KAFKA_ENV, KAFKA_SINK_ENV
from tests.kafka_broker import CLIENT_TIMEOUT_S, read_records

PARTITIONS = 2
"""Partitions of each run's topic: records keyed by user spread over both."""


def topic_of(root: Path) -> str:
    """The topic of the run under data root ``root``."""
    return "run_" + hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:20]


def kafka_sink_env(root: Path, pipeline: Pipeline) -> dict[str, str]:
    """A `lowmark run` subprocess's topic for ``root``, if ``pipeline``'s sink is Kafka."""
    return {KAFKA_SINK_ENV: topic_of(root)} if isinstance(pipeline.sink, KafkaSink) else {}


def at_root(pipeline: Pipeline, root: Path) -> Pipeline:
    """``pipeline`` as a run under ``root`` runs it: a Kafka sink writes ``root``'s topic (on
    the test broker, created if missing); any other pipeline as it is."""
    if not isinstance(pipeline.sink, KafkaSink):
        return pipeline
    bootstrap = os.environ[KAFKA_ENV]
    topic = topic_of(root)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=CLIENT_TIMEOUT_S).topics:
        created = admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
        created[topic].result(timeout=CLIENT_TIMEOUT_S)
    sink = pipeline.sink.model_copy(update={"topic": topic, "bootstrap_servers": bootstrap})
    return pipeline.model_copy(update={"sink": sink})


def _fence(pipeline: Pipeline, root: Path, topic: str) -> TopicPartition:
    """The fence of the checkpoint under ``root`` for ``topic``: its committed offset and
    metadata (offset negative when none)."""
    app_id = Checkpoint(pipeline.checkpoint_location(root), pipeline.name).txn_app_id("sink")
    consumer = Consumer(
        {"bootstrap.servers": os.environ[KAFKA_ENV], "group.id": fence_group(app_id)}
    )
    try:
        (fence,) = consumer.committed([TopicPartition(topic, 0)], CLIENT_TIMEOUT_S)
        return fence
    finally:
        consumer.close()


def copy_topic(source: Path, target: Path, pipeline: Pipeline) -> None:
    """``source``'s topic's committed records, and its fence, copied to ``target``'s topic
    (``target``'s folder is a copy of ``source``'s: the same checkpoint, the same fence
    group), as a run's folder is copied."""
    at_root(pipeline, target)  # the topic
    bootstrap = os.environ[KAFKA_ENV]
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for partition, key, value in read_records(bootstrap, topic_of(source)):
        producer.produce(topic_of(target), value=value, key=key, partition=partition)
    if producer.flush(CLIENT_TIMEOUT_S):
        raise RuntimeError(f"copying {topic_of(source)}: records not delivered")
    fence = _fence(pipeline, source, topic_of(source))
    if fence.offset < 0:
        return
    app_id = Checkpoint(pipeline.checkpoint_location(target), pipeline.name).txn_app_id("sink")
    group = Consumer({"bootstrap.servers": bootstrap, "group.id": fence_group(app_id)})
    try:
        copied = TopicPartition(topic_of(target), 0, fence.offset, fence.metadata)
        for done in group.commit(offsets=[copied], asynchronous=False) or ():
            if done.error is not None:
                raise KafkaException(done.error)
    finally:
        group.close()


def kafka_tables(pipeline: Pipeline, root: Path) -> dict[str, list[dict[str, Any]]]:
    """A Kafka sink's records as a ``read_committed`` consumer reads them, and its fence."""
    topic = topic_of(root)
    records = [
        {"partition": p, "key": k, "value": v}
        for p, k, v in read_records(os.environ[KAFKA_ENV], topic)
    ]
    fence = _fence(pipeline, root, topic)
    return {"sink": records, "sink fence": [{"offset": fence.offset, "metadata": fence.metadata}]}
