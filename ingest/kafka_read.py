"""The Kafka source's read task: what runs in executor tasks, one per (topic, partition, offset
range) of a micro-batch (:class:`~ingest.kafka_partition.KafkaInputPartition`, planned by the
driver in :mod:`ingest.kafka_source`).

:func:`read_range` reads exactly ``[start, end)`` with a consumer of this Python worker's pool
(:class:`_ConsumerPool`, ``assign()`` + ``seek()``, no consumer group) and hands the records on
as Arrow batches of :data:`ARROW_SCHEMA`. Nothing here runs on the driver or imports Spark;
:mod:`ingest.kafka_source` imports this module only inside a read task, so that the processes
Spark starts to plan a query never load it. Warnings keep the source's logger name.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from engine.errors import TransientError
from ingest.kafka_offsets import check_offset_range, report_data_loss
from ingest.kafka_options import KafkaSourceOptions
from ingest.kafka_partition import KafkaInputPartition
from ingest.kafka_records import (
    RecordChunk,
    offset_hole,
    refuse_offset_holes,
    use_record_chunks,
)
from ingest.kafka_schema import ARROW_SCHEMA

__all__ = [
    "ARROW_SCHEMA",
    "BATCH_ROWS",
    "TASK_CONSUMERS",
    "KafkaInputPartition",
    "KafkaReadTimeoutError",
    "read_range",
]

# Read-task warnings keep the source's logger name, so logging set up for it still applies.
log = logging.getLogger("ingest.kafka_source")

BATCH_ROWS = 10_000
"""Rows a read task hands on at most per Arrow batch."""


class KafkaReadTimeoutError(TransientError):
    """A task saw no progress within ``kafkaConsumer.pollTimeoutMs`` on offsets that exist."""


class _ConsumerPool:
    """Idle task consumers of this Python worker, reused by its next read tasks.

    Spark keeps Python workers between tasks; a consumer kept with them skips the connection,
    version probe and metadata look-up every new one pays (as Spark's own Kafka source keeps
    its consumers). A consumer goes back only after a read that ended normally; one idle for
    :attr:`IDLE_SECONDS` is closed instead of reused.
    """

    IDLE_SECONDS = 300.0
    PER_CONFIG = 2

    def __init__(self) -> None:
        self._idle: dict[str, list[tuple[float, Any]]] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def borrow(self, options: KafkaSourceOptions) -> Iterator[Any]:
        config = options.consumer_config(auto_offset_reset="none",
                                         max_partition_fetch_bytes=8 << 20,
                                         fetch_max_wait_ms=100)
        key = repr(sorted((k, repr(v)) for k, v in config.items())) + repr(options.fast_decode)
        consumer, stale = None, []
        now = time.monotonic()
        with self._lock:
            idle = self._idle.get(key, [])
            while idle and consumer is None:
                since, candidate = idle.pop()
                if now - since > self.IDLE_SECONDS:
                    stale.append(candidate)
                else:
                    consumer = candidate
        for old in stale:
            old.close()
        if consumer is None:
            from kafka import KafkaConsumer

            consumer = KafkaConsumer(**config)
            if options.fast_decode:
                use_record_chunks(consumer)
        try:
            yield consumer
        except BaseException:
            consumer.close()
            raise
        consumer.unsubscribe()
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.PER_CONFIG:
                idle.append((time.monotonic(), consumer))
                return
        consumer.close()

    def clear(self) -> None:
        """Close every idle consumer."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for consumers in idle.values():
            for _, consumer in consumers:
                consumer.close()


TASK_CONSUMERS = _ConsumerPool()
atexit.register(TASK_CONSUMERS.clear)


def read_range(options: KafkaSourceOptions,
               part: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
    """Read exactly the records with offsets in ``[part.start, part.end)`` (executor side).

    Offsets may be missing inside the range: transaction markers and, on compacted topics,
    compaction. The loop follows the consumer's position, which moves past them, and stops at
    ``end``. On a topic that is not compacted a hole is data not visible yet
    (:func:`ingest.kafka_records.refuse_offset_holes`): the position stops there and the task
    fetches again until it shows, up to ``kafkaConsumer.pollTimeoutMs``.

    Whether the log ended before ``end`` is decided from a fresh ListOffsets and from fetch
    answers this task asked for, never from fetch state a pooled consumer carried over from
    its previous task. It ended (data loss: raised, or logged and the read stopped under
    ``failOnDataLoss=false``) when the listed end is at or below the position and the leader
    either answered OFFSET_OUT_OF_RANGE or its high watermark is at or below the position too.
    Every way of waiting ends within the poll timeout. Fetched record batches are decoded
    whole (:mod:`ingest.kafka_records`) unless kafka-python's internals look unfamiliar.
    """
    from kafka import TopicPartition
    from kafka.errors import OffsetOutOfRangeError

    _warn_if_crc_in_python()
    tp = TopicPartition(part.topic, part.partition)
    fail = options.fail_on_data_loss
    where = f"topic '{part.topic}' partition {part.partition}"
    with TASK_CONSUMERS.borrow(options) as consumer:
        consumer.assign([tp])
        compacted = _COMPACTED.get((_cluster_key(options), part.topic))
        refuse_offset_holes(consumer, set() if compacted else {part.topic})
        position = check_offset_range(part.topic, part.partition, part.start, part.end,
                                      int(consumer.beginning_offsets([tp])[tp]), fail)
        if position >= part.end:
            return
        consumer.seek(tp, position)
        pending = _Pending()
        idle_since = time.monotonic()
        own_state = False  # partition state renewed by this task since its last progress
        while position < part.end:
            out_of_range = False
            try:
                fetched = consumer.poll(timeout_ms=500, max_records=BATCH_ROWS).get(tp, [])
            except OffsetOutOfRangeError:
                fetched, out_of_range = [], True
            for item in fetched:
                if not pending.add(item, part.end):
                    break
            while len(pending) >= BATCH_ROWS:
                yield pending.take(part.topic, part.partition, BATCH_ROWS)
            new_position = max(int(consumer.position(tp)), position)
            if fetched and fetched[-1].offset >= part.end:
                new_position = part.end
            if new_position > position:
                position, idle_since, own_state = new_position, time.monotonic(), False
                continue
            earliest, listed = (int(o[tp]) for o in (consumer.beginning_offsets([tp]),
                                                     consumer.end_offsets([tp])))
            if earliest > position:  # retention overtook us while reading
                position = check_offset_range(part.topic, part.partition, position, part.end,
                                              earliest, fail)
                consumer.seek(tp, position)
                idle_since, own_state = time.monotonic(), False
                continue
            highwater = consumer.highwater(tp) if own_state else None
            if listed <= position and (out_of_range or (
                    highwater is not None and highwater <= position)):
                report_data_loss(
                    f"{where} ends at {listed if out_of_range else highwater} but offsets up "
                    f"to {part.end} were planned (offsets {position} to {part.end - 1} are gone:"
                    " the topic was recreated or truncated)", fail)
                break
            hole = offset_hole(consumer, tp)
            if hole is not None and hole[0] == position and compacted is None:
                compacted = _is_compacted(options, part.topic)
                if compacted:  # a compacted topic's holes are records compacted away
                    refuse_offset_holes(consumer, set())
                    consumer.seek(tp, position)
                    continue
            if not own_state:  # from now on the high watermark answers this task's fetches
                consumer.unsubscribe()
                consumer.assign([tp])
                consumer.seek(tp, position)
                own_state = True
            if (time.monotonic() - idle_since) * 1000 > options.poll_timeout_ms:
                why = f"; the broker lists its end at {listed}"
                if hole is not None and hole[0] == position:
                    why = (f"; offset {hole[0]} is not visible yet while {hole[1]} is (an offset "
                           "hole in a topic that is not compacted)")
                raise KafkaReadTimeoutError(
                    f"no records from {where} between offsets {position} and {part.end} "
                    f"within {options.poll_timeout_ms} ms{why}")
        if len(pending):
            yield pending.take(part.topic, part.partition, len(pending))


_COMPACTED: dict[tuple[str, str], bool] = {}
"""(cluster, topic) -> compacted, per Python worker: looked up once, at the first hole."""


def _cluster_key(options: KafkaSourceOptions) -> str:
    return repr(options.client_config.get("bootstrap_servers"))


def _is_compacted(options: KafkaSourceOptions, topic: str) -> bool:
    """True if ``topic``'s ``cleanup.policy`` includes ``compact`` (its offsets may have holes).

    A broker that cannot say (an error) gets the topic counted as compacted, the behaviour
    before holes were waited for; an answer without the key means Kafka's default, ``delete``
    (Tansu answers so).
    """
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    key = (_cluster_key(options), topic)
    if key in _COMPACTED:
        return _COMPACTED[key]
    config = {k: v for k, v in options.client_config.items()
              if k in KafkaAdminClient.DEFAULT_CONFIG}  # the consumer's own settings are not
    try:
        admin = KafkaAdminClient(**config)
        try:
            found = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        finally:
            admin.close()
        policy = found.get("topic", {}).get(topic, {}).get("cleanup.policy")
        value = policy.get("value") if isinstance(policy, dict) else policy
        compacted = bool(value) and "compact" in str(value)
    except Exception as exc:  # any client or broker failure: skip holes, as before
        log.warning("cannot read cleanup.policy of topic '%s' (%s): its offset holes are "
                    "skipped as on a compacted topic", topic, exc)
        compacted = True
    _COMPACTED[key] = compacted
    return compacted


class _Pending:
    """Records read but not yet handed on: the chunks as decoded, and the records of a
    consumer that yields kafka-python's ``ConsumerRecord`` objects (collected into a chunk
    before the next chunk or batch)."""

    def __init__(self) -> None:
        self.chunks: list[RecordChunk] = []
        self.loose: list[tuple[int, int, bytes | None, bytes | None, Any]] = []
        self.rows = 0

    def __len__(self) -> int:
        return self.rows

    def add(self, item: Any, end: int) -> bool:
        """Add a :class:`RecordChunk` or a kafka-python ``ConsumerRecord``, up to offset
        ``end`` (exclusive); False once ``end`` is reached."""
        if isinstance(item, RecordChunk):
            self._gather()
            chunk = item.before(end)
            if len(chunk):
                self.chunks.append(chunk)
                self.rows += len(chunk)
            return len(chunk) == len(item)
        if item.offset >= end:
            return False
        self.loose.append((item.offset, item.timestamp, item.key, item.value, item.headers))
        self.rows += 1
        return True

    def _gather(self) -> None:
        if self.loose:
            self.chunks.append(RecordChunk.of_records(self.loose))
            self.loose = []

    def take(self, topic: str, partition: int, n: int) -> pa.RecordBatch:
        """The first ``n`` records as one batch of :data:`ARROW_SCHEMA`."""
        self._gather()
        taken: list[RecordChunk] = []
        need = n
        while need:
            chunk = self.chunks[0]
            if len(chunk) <= need:
                taken.append(self.chunks.pop(0))
                need -= len(chunk)
            else:
                taken.append(chunk._slice(0, need))
                self.chunks[0] = chunk._slice(need, len(chunk))
                need = 0
        self.rows -= n
        return _to_batch(topic, partition, taken)


@functools.cache
def _warn_if_crc_in_python() -> None:
    from kafka.record import util

    if getattr(util, "crc32c_c", True) is None:
        log.warning("kafka-python checks record CRCs in pure Python, which cuts read throughput "
                    "about 4x: install the 'crc32c' package (kafka-python[crc32c])")


def _to_batch(topic: str, partition: int, chunks: list[RecordChunk]) -> pa.RecordBatch:
    """Consecutive chunks as one batch of :data:`ARROW_SCHEMA` (timestamps in milliseconds)."""
    n = sum(len(c) for c in chunks)
    header_type = ARROW_SCHEMA.field("headers").type
    if any(c.headers is not None for c in chunks):
        header_array = pa.concat_arrays([pa.nulls(len(c), header_type) if c.headers is None
                                         else c.headers for c in chunks])
    else:
        header_array = pa.nulls(n, header_type)
    millis = np.concatenate([c.timestamps for c in chunks])
    return pa.RecordBatch.from_arrays([
        pa.concat_arrays([c.keys for c in chunks]),
        pa.concat_arrays([c.values for c in chunks]),
        pa.array([topic] * n, pa.string()),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(np.concatenate([c.offsets for c in chunks])),
        pa.array(millis * 1000, pa.timestamp("us", tz="UTC")),
        header_array,
    ], schema=ARROW_SCHEMA)
