"""A real single-node Kafka broker for tests, and a small client library to feed it.

The broker is Apache Kafka itself (KRaft mode: one process is both broker and controller;
no ZooKeeper, no Docker), run with ``java`` from the jars ``make test-setup`` copies into
``jvm/kafka/lib`` (see ``jvm/kafka/pom.xml``). It listens on a free loopback port and keeps
all its data in the folder it is started in. The helpers talk to it with confluent-kafka
(librdkafka), the client the engine itself uses on the driver.

Typical use is the session-scoped ``kafka`` fixture in ``tests/conftest.py``::

    def test_something(kafka: KafkaBroker) -> None:
        kafka.create_topic("events", partitions=3)
        kafka.produce("events", [b"a", b"b"], partition=2)
        assert kafka.end_offsets("events") == {0: 0, 1: 0, 2: 2}

The broker is shared by a whole session: tests should use topic and group names of their
own (e.g. derived from the test's name) rather than clean up after each other.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

REPO = Path(__file__).resolve().parents[1]
KAFKA_LIB = REPO / "jvm" / "kafka" / "lib"
LOG4J_CONFIG = REPO / "jvm" / "kafka" / "log4j2.properties"

# Fast start-up over peak throughput: C1 only, the serial collector, a small heap.
JVM_OPTIONS = ["-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]

# How long one client call (create, delete, produce, offsets) may take, in seconds.
CLIENT_TIMEOUT_S = 30.0


@dataclass
class KafkaBroker:
    """A running broker: clients connect to ``bootstrap``; its data and ``log`` live in
    ``folder``; ``process`` is the JVM, leader of its own process group."""

    bootstrap: str
    process: subprocess.Popen[bytes]
    folder: Path
    log: Path

    @classmethod
    def start(cls, folder: Path, timeout_s: float = 60) -> KafkaBroker:
        """Format fresh storage in ``folder`` and start a broker on two free loopback ports
        (clients and controller). Returns once an admin client can list its topics.

        Raises RuntimeError if the jars are missing (run ``make test-setup``), or if the broker
        exits or is not ready within ``timeout_s`` (the message holds the last 30 lines of
        ``folder/broker.log``; the process is killed first).
        """
        classpath = _classpath()
        folder.mkdir(parents=True, exist_ok=True)
        port, controller_port = _free_ports(2)
        properties = folder / "server.properties"
        properties.write_text(_server_properties(port, controller_port, folder / "data"))
        log = folder / "broker.log"
        java = ["java", *JVM_OPTIONS, f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"]
        java += ["-cp", classpath]
        formatted = subprocess.run(
            [
                *java,
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                "--cluster-id",
                _random_cluster_id(),
                "--config",
                str(properties),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if formatted.returncode != 0:
            output = (formatted.stdout + formatted.stderr).splitlines()[-30:]
            raise RuntimeError("formatting Kafka storage failed:\n" + "\n".join(output))
        process = _launch(java, properties, log)
        broker = cls(bootstrap=f"127.0.0.1:{port}", process=process, folder=folder, log=log)
        try:
            broker._wait_ready(port, timeout_s)
        except BaseException:
            broker.stop()
            raise
        return broker

    def stop(self) -> None:
        """SIGTERM the broker's process group (a clean shutdown), SIGKILL it if it is still
        running 10 s later, and reap it. Idempotent."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def restart(self, timeout_s: float = 60) -> None:
        """Start the stopped broker again on its ports and data (as after a crash or an
        upgrade); returns once it answers."""
        assert self.process.poll() is not None, "restart() a stopped broker"
        java = ["java", *JVM_OPTIONS, f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"]
        java += ["-cp", _classpath()]
        self.process = _launch(java, self.folder / "server.properties", self.log)
        self._wait_ready(int(self.bootstrap.rpartition(":")[2]), timeout_s)

    def create_topic(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None
    ) -> None:
        """Create topic ``name`` (replication factor 1, topic-level ``config``); returns once
        the broker reports every partition with a leader. Raises KafkaException if the topic
        exists or the request fails."""
        admin = self._admin()
        topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})
        futures = admin.create_topics([topic], operation_timeout=CLIENT_TIMEOUT_S)
        futures[name].result(timeout=CLIENT_TIMEOUT_S)

        def ready() -> bool:
            metadata = admin.list_topics(topic=name, timeout=CLIENT_TIMEOUT_S).topics.get(name)
            return (
                metadata is not None
                and metadata.error is None
                and len(metadata.partitions) == partitions
                and all(p.leader >= 0 for p in metadata.partitions.values())
            )

        _wait_for(ready, f"topic {name!r} to be created")

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name``; returns once the broker no longer lists it. Raises
        KafkaException if it does not exist or the request fails."""
        admin = self._admin()
        futures = admin.delete_topics([name], operation_timeout=CLIENT_TIMEOUT_S)
        futures[name].result(timeout=CLIENT_TIMEOUT_S)
        _wait_for(
            lambda: name not in admin.list_topics(timeout=CLIENT_TIMEOUT_S).topics,
            f"topic {name!r} to be deleted",
        )

    def produce(
        self,
        topic: str,
        values: Sequence[bytes | str | None],
        partition: int | None = None,
        key: bytes | str | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Append ``values`` to ``topic`` in order: str is UTF-8 encoded, None is a record
        without a value (a tombstone). Every record gets the same ``key`` and
        ``timestamp_ms`` (None: the producer's clock). ``partition`` None lets the
        partitioner choose (by key; random without one). Synchronous: returns once every
        record is acknowledged by the broker (acks=all); raises RuntimeError on the first
        delivery error or if delivery does not finish in time."""
        errors: list[str] = []

        def delivered(error: KafkaError | None, _message: object) -> None:
            if error is not None:
                errors.append(str(error))

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "linger.ms": 0,
                "message.timeout.ms": int(CLIENT_TIMEOUT_S * 1000),
            }
        )
        for value in values:
            producer.produce(
                topic,
                value=None if value is None else _bytes(value),
                key=None if key is None else _bytes(key),
                partition=-1 if partition is None else partition,
                on_delivery=delivered,
                timestamp=0 if timestamp_ms is None else timestamp_ms,
            )
            producer.poll(0)
        pending = producer.flush(CLIENT_TIMEOUT_S)
        if errors:
            raise RuntimeError(f"producing to {topic!r} failed: {errors[0]}")
        if pending:
            raise RuntimeError(f"producing to {topic!r}: {pending} records not delivered")

    def produce_in_open_transaction(
        self, topic: str, values: Sequence[bytes | str], partition: int = 0
    ) -> Producer:
        """Append ``values`` to ``topic``'s ``partition`` in a transaction left open: they are
        on the broker (past the last stable offset) but not committed. Returns the
        transactional producer: ``commit_transaction()`` or ``abort_transaction()`` ends it."""
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": f"test-{os.getpid()}-{time.monotonic_ns()}",
                "linger.ms": 0,
                # Open until the test ends it, however slow the batches in between.
                "transaction.timeout.ms": 900_000,
            }
        )
        producer.init_transactions(CLIENT_TIMEOUT_S)
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value=_bytes(value), partition=partition)
        pending = producer.flush(CLIENT_TIMEOUT_S)
        if pending:
            raise RuntimeError(f"producing to {topic!r}: {pending} records not delivered")
        return producer

    def records(
        self, topic: str, committed_only: bool = True
    ) -> list[tuple[int, bytes | None, bytes | None]]:
        """``read_records`` of ``topic`` on this broker."""
        return read_records(self.bootstrap, topic, committed_only)

    def delete_records_before(self, topic: str, partition: int, offset: int) -> None:
        """What retention does: ``topic``'s ``partition`` starts at ``offset`` from now on
        (its records before it are deleted). Raises KafkaException on failure."""
        admin = self._admin()  # kept until the request is done
        futures = admin.delete_records([TopicPartition(topic, partition, offset)])
        for done in futures.values():
            done.result(timeout=CLIENT_TIMEOUT_S)

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Every partition of ``topic`` mapped to its high watermark: the offset the next
        record will get (0 for an empty partition). Raises KafkaException on failure."""
        admin = self._admin()
        request = {TopicPartition(topic, p): OffsetSpec.latest() for p in self._partitions(topic)}
        futures = admin.list_offsets(request, request_timeout=CLIENT_TIMEOUT_S)
        return {
            tp.partition: future.result(timeout=CLIENT_TIMEOUT_S).offset
            for tp, future in futures.items()
        }

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """Every partition of ``topic`` mapped to consumer group ``group``'s committed offset
        there: the next offset to read; negative (OFFSET_INVALID, -1001) where the group has
        committed nothing. Does not join the group. Raises KafkaException on failure."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
            }
        )
        try:
            partitions = [TopicPartition(topic, p) for p in self._partitions(topic)]
            offsets = consumer.committed(partitions, timeout=CLIENT_TIMEOUT_S)
        finally:
            consumer.close()
        for tp in offsets:
            if tp.error is not None:
                raise KafkaException(tp.error)
        return {tp.partition: tp.offset for tp in offsets}

    def _admin(self) -> AdminClient:
        # A client per call: none outlives the broker to log connection errors after stop().
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def _partitions(self, topic: str) -> list[int]:
        metadata = self._admin().list_topics(topic=topic, timeout=CLIENT_TIMEOUT_S)
        found = metadata.topics[topic]
        if found.error is not None:
            raise KafkaException(found.error)
        return sorted(found.partitions)

    def _wait_ready(self, port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._fail(f"exited with code {self.process.returncode}")
            # Connect first: librdkafka would log every refused connection to stderr.
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                metadata = self._admin().list_topics(timeout=2)
                if metadata.brokers:
                    return
            except (OSError, KafkaException):
                pass
            time.sleep(0.1)
        self._fail(f"not ready after {timeout_s:g} s")

    def _fail(self, why: str) -> None:
        lines = self.log.read_text(errors="replace").splitlines()[-30:] if self.log.exists() else []
        raise RuntimeError(f"Kafka broker in {self.folder} {why}; {self.log}:\n" + "\n".join(lines))


def read_records(
    bootstrap: str, topic: str, committed_only: bool = True
) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record of ``topic`` a consumer reads from the start to the end: (partition,
    key, value), in offset order per partition. ``committed_only``: as a
    ``read_committed`` consumer (aborted and still open transactions' records left out,
    reading stops at the first open one), else ``read_uncommitted``. Raises
    RuntimeError if the end is not reached in time."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{os.getpid()}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed" if committed_only else "read_uncommitted",
        }
    )
    metadata = consumer.list_topics(topic, timeout=CLIENT_TIMEOUT_S).topics[topic]
    partitions = sorted(metadata.partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    found: list[tuple[int, bytes | None, bytes | None]] = []
    ended: set[int] = set()
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    try:
        while len(ended) < len(partitions):
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out reading {topic!r} to its end")
            message = consumer.poll(0.2)
            if message is None:
                continue
            error, partition = message.error(), message.partition()
            assert partition is not None  # a record's, or a partition's end
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                ended.add(partition)
            elif error is not None:
                raise KafkaException(error)
            else:
                found.append((partition, message.key(), message.value()))
    finally:
        consumer.close()
    return found


def _launch(java: list[str], properties: Path, log: Path) -> subprocess.Popen[bytes]:
    """The broker's JVM with ``properties``, logging to ``log``, leader of its own process
    group (so ``stop`` reaches all of it)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [*java, "kafka.Kafka", str(properties)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=properties.parent,
            start_new_session=True,
        )


def _classpath() -> str:
    if not any(KAFKA_LIB.glob("kafka_2.13-*.jar")):
        raise RuntimeError(f"no Kafka broker jars in {KAFKA_LIB}: run `make test-setup`")
    return f"{KAFKA_LIB}/*"


def _free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _random_cluster_id() -> str:
    """What ``kafka-storage random-uuid`` prints (16 random bytes, URL-safe base64 without
    padding, never starting with '-'), without a JVM start-up."""
    while True:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _server_properties(port: int, controller_port: int, data: Path) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        # One node: internal topics with one replica and, for a quick first use, one partition.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.state.topic.num.partitions": "1",
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value
