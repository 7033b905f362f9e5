"""Create topics and produce records: the one producer of the tests, the benchmarks and the demo.

Not used by the streaming job itself (it only reads Kafka); this is how records get *into* a
topic for a test, a benchmark or ``tidelake produce``. kafka-python is imported on first call,
so importing this module costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["PRODUCER_SETTINGS", "Record", "create_topic", "produce"]

Record = tuple[bytes | None, bytes | None, int | None]
"""(key, value, partition); partition None lets the producer's partitioner choose (by key)."""

PRODUCER_SETTINGS: dict[str, Any] = {"linger_ms": 50, "batch_size": 1 << 20, "acks": "all"}
"""Default KafkaProducer settings: records linger, so each produce request carries many records
per partition (the case where Tansu's ListOffsets goes wrong, see ``docs/ingest.md``)."""


def create_topic(bootstrap: str, name: str, partitions: int, *, exist_ok: bool = False,
                 timeout_s: float = 30.0) -> None:
    """Create ``name`` with ``partitions`` partitions; return once its metadata shows them.

    ``exist_ok``: a topic of that name already there is kept as it is (then it must already
    have at least ``partitions`` partitions, else this times out).
    """
    from kafka import KafkaAdminClient, KafkaConsumer
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="tidelake-produce")
    try:
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    except TopicAlreadyExistsError:
        if not exist_ok:
            raise
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


def produce(bootstrap: str, topic: str, records: Iterable[Record], *,
            headers: Sequence[tuple[str, bytes]] | None = None, rate: float | None = None,
            **settings: Any) -> list[int]:
    """Send ``records`` and wait for all acks; returns the offset of each record, in order.

    ``headers``, if given, go on every record. ``rate`` limits sending to that many records per
    second (None: as fast as the producer takes them). ``settings`` override
    :data:`PRODUCER_SETTINGS` (KafkaProducer's keyword arguments). The first failed send is
    raised once every record has been tried.
    """
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, **{**PRODUCER_SETTINGS, **settings})
    offsets: list[int] = []
    failures: list[BaseException] = []

    def acked(index: int) -> Any:
        return lambda metadata: offsets.__setitem__(index, int(metadata.offset))

    every = list(headers or [])
    started = time.monotonic()
    try:
        for index, (key, value, partition) in enumerate(records):
            offsets.append(-1)
            future = producer.send(topic, key=key, value=value, partition=partition,
                                   headers=every)
            future.add_callback(acked(index))
            future.add_errback(failures.append)
            if rate:
                ahead = (index + 1) / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        producer.flush(timeout=60)
    finally:
        producer.close()
    if failures:
        raise failures[0]
    if -1 in offsets:
        raise TimeoutError(f"topic {topic!r}: {offsets.count(-1)} records not acknowledged")
    return offsets
