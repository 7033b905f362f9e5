"""Kafka for the benchmark: the timed producer processes, the warm-up records, end offsets.

Topics are created and untimed records sent with :mod:`ingest.kafka_produce`, as the tests
and the demo do; the timed producers below are measuring instruments (parallel processes
started together, values stamped at send time), so they drive kafka-python directly.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from common import (
    WorkloadSpec,
    generate_workload,
    key_strings,
)

from ingest_parts.workload import (
    WARMUP_KEY_BASE,
    WARMUP_RECORDS,
    Stream,
    build_stream,
    json_parts,
    kafka_partitions,
    stream_spec,
)

PRODUCER_SETTINGS: dict[str, Any] = {
    "acks": 1, "linger_ms": 50, "batch_size": 1 << 20, "max_request_size": 16 << 20,
    "compression_type": None,
}
LATENCY_PRODUCER_SETTINGS: dict[str, Any] = {
    "acks": 1, "linger_ms": 5, "batch_size": 256 << 10, "max_request_size": 16 << 20,
    "compression_type": None,
}


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """High watermark of each partition, as the job's Kafka source finds it (its
    ``startingOffsets=latest`` look-up works around Tansu's short ListOffsets answer)."""
    from ingest.kafka_options import KafkaSourceOptions
    from ingest.kafka_source import KafkaStreamReader

    reader = KafkaStreamReader(KafkaSourceOptions.from_options({
        "kafka.bootstrap.servers": bootstrap, "subscribe": topic,
        "startingOffsets": "latest"}))
    try:
        latest = reader.initialOffset()[topic]
    finally:
        reader.stop()
    return {int(p): int(o) for p, o in latest.items()}


def _produce_part(bootstrap: str, topic: str, records: int, seed: int, partitions: int,
                  worker: int, workers: int, ready: Any, go: Any, results: Any) -> None:
    """Producer process: rebuild the stream (deterministic) and send the records of the
    partitions ``p % workers == worker`` once ``go`` is set."""
    from kafka import KafkaProducer

    stream = build_stream(records, seed, partitions)
    mine = np.flatnonzero(stream.partitions % workers == worker).tolist()
    keys, values = stream.keys, stream.values
    parts = stream.partitions.tolist()
    producer = KafkaProducer(bootstrap_servers=bootstrap, **PRODUCER_SETTINGS)
    ready.set()
    go.wait()
    started = time.perf_counter()
    send = producer.send
    for i in mine:
        send(topic, key=keys[i], value=values[i], partition=parts[i])
    producer.flush()
    results.put((worker, len(mine), time.perf_counter() - started))
    producer.close()


@dataclass
class ProduceResult:
    records: int
    seconds: float
    processes: int
    end: dict[int, int]

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("inf")


def produce_all(bootstrap: str, topic: str, stream: Stream, partitions: int,
                processes: int, seed: int) -> ProduceResult:
    """Send every record with ``processes`` kafka-python producer processes (each rebuilds
    the same records, then they start together); wait until the topic's end offsets show
    all of them. The time is from the common start to the last process's flush."""
    ctx = multiprocessing.get_context("spawn")  # no fork: the parent holds threads (lance, ...)
    results = ctx.Queue()
    go = ctx.Event()
    workers = max(1, min(processes, partitions))
    readies = [ctx.Event() for _ in range(workers)]
    procs = [ctx.Process(target=_produce_part, name=f"bench-producer-{w}",
                         args=(bootstrap, topic, stream.records_asked, seed, partitions, w,
                               workers, readies[w], go, results)) for w in range(workers)]
    try:
        for p in procs:
            p.start()
        for p, ready in zip(procs, readies, strict=True):
            while not ready.wait(1.0):
                if not p.is_alive():
                    raise RuntimeError(f"{p.name} failed before sending (exit {p.exitcode})")
        started = time.perf_counter()
        go.set()
        for p in procs:
            p.join()
        seconds = time.perf_counter() - started
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(10)
    failed = [p.name for p in procs if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"producer process(es) failed: {', '.join(failed)}")
    expected = stream.per_partition(partitions)
    deadline = time.monotonic() + 60
    while True:
        end = end_offsets(bootstrap, topic)
        if end == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if end != expected:
        raise RuntimeError(f"topic {topic}: end offsets {end}, expected {expected}")
    return ProduceResult(stream.records, seconds, workers, end)



TICK_S = 0.02
"""How often the latency phase's producer sends: each send costs ~1.3 ms of CPU beside ~4 µs a
record (kafka-python's request encoding and I/O loop), so 200 records a send at 10,000/s
(~10 µs a record in all) where a send every 5 ms would cost ~30."""


class BatchSender:
    """Sends records as pre-encoded Kafka record batches: per call, one record batch per
    partition (kafka-python's own batch encoder) and one Produce request per leader, acks=1,
    waited for. KafkaProducer.send costs ~36 µs of CPU per record in its calling thread alone
    (partitioner, future, accumulator, locks; measured on this machine, 50,000 records of
    270 bytes), which at the latency phase's 10,000 records/s made the producer the job's
    largest competitor for the 2 cores; appending to a batch costs ~4 µs. The measuring
    instrument, not the job, so it may talk to the broker's protocol directly, as
    ``ingest.kafka_probe`` does for the end probe."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.topic = topic
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap)
        deadline = time.monotonic() + 30
        while len(self._consumer.partitions_for_topic(topic) or ()) < partitions:
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {topic}: no metadata for {partitions} partitions")
            time.sleep(0.05)
        self._manager = self._consumer._manager
        cluster = self._manager.cluster
        self.leaders = {p: cluster.leader_for_partition(TopicPartition(topic, p))
                        for p in range(partitions)}

    def send(self, by_partition: dict[int, list[tuple[bytes, bytes]]], stamp_ms: int) -> None:
        """Send each partition's (key, value) records in one batch; raise on a broker error."""
        from kafka.protocol.producer import ProduceRequest
        from kafka.record.default_records import DefaultRecordBatchBuilder

        topic_type = ProduceRequest.TopicProduceData
        partition_type = topic_type.PartitionProduceData
        by_leader: dict[int, list[Any]] = {}
        for partition, records in by_partition.items():
            builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 30)
            append = builder.append
            for offset, (key, value) in enumerate(records):
                append(offset, stamp_ms, key, value, [])
            by_leader.setdefault(self.leaders[partition], []).append(
                partition_type(index=partition, records=bytes(builder.build())))
        requests = {leader: ProduceRequest(
            transactional_id=None, acks=1, timeout_ms=30_000,
            topic_data=[topic_type(name=self.topic, partition_data=parts)],
            min_version=3, max_version=9) for leader, parts in by_leader.items()}
        manager = self._manager

        async def send_all() -> list[Any]:
            sent = [manager.send(request, node_id=leader)
                    for leader, request in requests.items()]
            return [await future for future in sent]

        for response in manager.run(send_all):
            for topic_data in response.responses:
                for part in topic_data.partition_responses:
                    if part.error_code:
                        raise RuntimeError(f"produce to {self.topic} partition "
                                           f"{part.index}: error code {part.error_code}")

    def close(self) -> None:
        self._consumer.close()


def steady_producer(bootstrap: str, topic: str, partitions: int, rate: float, seconds: float,
                     seed: int, ready: Any, results: Any) -> None:
    """Producer process: ``rate`` records/s for ``seconds``; each value's ts = send time (ms).

    Every :data:`TICK_S` the records due by then are stamped with the time and sent
    together, one record batch per partition (:class:`BatchSender`), as a lingering producer
    would batch them. A record's ``ts`` is when its batch was built, so the latency measured
    from it stays the time from hand-over to the broker to visibility."""
    total = max(int(rate * seconds), 1)
    workload = generate_workload(stream_spec(total, seed))
    table = pa.concat_tables([workload.initial, *workload.batches])
    heads, tails = json_parts(table)
    keys = [k.encode() for k in table.column("key").to_pylist()]
    parts = kafka_partitions(keys, partitions).tolist()
    sender = BatchSender(bootstrap, topic, partitions)
    ready.set()
    now = time.time
    sent, behind = 0, 0
    started = time.monotonic()
    n = len(keys)
    while sent < n:
        elapsed = time.monotonic() - started
        due = min(int(elapsed * rate) + 1, n)
        if due - sent > rate * 0.1:  # more than 100 ms behind schedule
            behind += 1
        stamp_ms = int(now() * 1000)
        stamp = b"%d" % stamp_ms
        by_partition: dict[int, list[tuple[bytes, bytes]]] = {}
        for i in range(sent, due):
            by_partition.setdefault(parts[i], []).append((keys[i], heads[i] + stamp + tails[i]))
        sender.send(by_partition, stamp_ms)
        sent = due
        pause = max(sent / rate, elapsed + TICK_S) - (time.monotonic() - started)
        if pause > 0 and sent < n:
            time.sleep(pause)
    elapsed = time.monotonic() - started
    sender.close()
    counts = np.bincount(np.array(parts, dtype=np.int64), minlength=partitions)
    results.put({"sent": sent, "seconds": elapsed, "behind_ticks": behind,
                 "per_partition": {p: int(c) for p, c in enumerate(counts)},
                 "distinct": workload.spec.expected_rows})



def send_warmup(bootstrap: str, topic: str, partitions: int,
                records: int = WARMUP_RECORDS) -> dict[int, int]:
    """Send ``records`` warm-up records (keys apart from the stream's); records per partition."""
    from ingest.kafka_produce import produce

    numbers = np.arange(WARMUP_KEY_BASE, WARMUP_KEY_BASE + records, dtype=np.int64)
    workload = generate_workload(WorkloadSpec(rows=records, batches=0, batch_size=2,
                                              seed=3))
    table = workload.initial.set_column(0, "key", key_strings(numbers))
    heads, tails = json_parts(table)
    keys = [k.encode() for k in table.column("key").to_pylist()]
    parts = kafka_partitions(keys, partitions)
    stamp = b"%d" % int(time.time() * 1000)
    produce(bootstrap, topic, ((k, h + stamp + t, p) for k, h, t, p
                               in zip(keys, heads, tails, parts.tolist(), strict=True)),
            **LATENCY_PRODUCER_SETTINGS)
    return {p: int(c) for p, c in enumerate(np.bincount(parts, minlength=partitions))}
