"""What the Kafka source's driver does to plan a micro-batch: ``_Cluster.ends()``, idle and
while a producer keeps sending.

    python bench/kafka_probe.py                       # embedded broker, 3 partitions, 3,000/s
    python bench/kafka_probe.py --rate 10000 --calls 5
    python bench/kafka_probe.py --bootstrap-servers 127.0.0.1:9092

A fresh topic gets ``--records`` records first; then ``ends()`` of a driver consumer (as
``latestOffset`` calls it, from each partition's current end) is called ``--calls`` times on
the idle topic, and again while a producer process sends ``--rate`` records/s. Per call: wall
seconds, the Fetch requests the driver sent and the bytes of record data their answers
carried (counted on kafka-python's one send path), and how many partitions' ends the broker
confirmed. Run it on the code before a change with ``PYTHONPATH=<old tree>``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections.abc import Iterator
from typing import Any

from common import REPO_ROOT, load_average, log, machine_info, machine_line, text_table

# This folder holds bench/ingest.py, which must not shadow the package `ingest`: drop it, so
# `ingest` comes from PYTHONPATH (the code before a change, say) or else this checkout.
sys.path.pop(0)
sys.path.append(str(REPO_ROOT))


def _produce_forever(bootstrap: str, topic: str, partitions: int, rate: float,
                     stop: Any) -> None:
    from ingest.kafka_produce import produce

    def endless() -> Iterator[tuple[bytes | None, bytes, int]]:
        sent = 0
        while not stop.is_set():
            yield None, b'{"n": %d, "pad": "%s"}' % (sent, b"x" * 40), sent % partitions
            sent += 1

    produce(bootstrap, topic, endless(), rate=rate, linger_ms=5)


def _count_fetches() -> dict[str, int]:
    """Count Fetch requests and the record bytes of their answers, process-wide."""
    from kafka.net.manager import KafkaConnectionManager
    from kafka.protocol.consumer import FetchRequest

    counts = {"requests": 0, "record_bytes": 0}
    original = KafkaConnectionManager.send

    def answered(response: Any) -> None:
        counts["record_bytes"] += sum(len(p.records or b"") for t in response.responses
                                      for p in t.partitions)

    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        future = original(self, request, *args, **kwargs)
        if isinstance(request, FetchRequest):
            counts["requests"] += 1
            future.add_callback(answered)
        return future

    KafkaConnectionManager.send = send
    return counts


def _calls(cluster: Any, tps: dict[Any, Any], floor: dict[Any, int], calls: int,
           counts: dict[str, int], label: str) -> list[list[str]]:
    rows = []
    for n in range(calls):
        counts["requests"] = counts["record_bytes"] = 0
        started = time.monotonic()
        ends = cluster.ends(tps, floor)
        seconds = time.monotonic() - started
        time.sleep(0.2)  # answers still in flight are counted to this call
        confirmed = sum(1 for e in ends.values() if e.confirmed)
        rows.append([label, str(n + 1), f"{seconds:.3f}", str(counts["requests"]),
                     f"{counts['record_bytes']:,}", f"{confirmed}/{len(tps)}"])
        floor = {tp: e.offset for tp, e in ends.items()}
        log(f"{label} call {n + 1}: {seconds:.3f} s, {counts['requests']} fetches, "
            f"{counts['record_bytes']:,} record bytes, {confirmed}/{len(tps)} confirmed")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-servers", default=None, help="a broker (default: embedded)")
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--records", type=int, default=30_000, help="records sent first")
    p.add_argument("--rate", type=float, default=3_000.0, help="records/s while probing")
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--isolation", default="read_committed",
                   choices=("read_committed", "read_uncommitted"))
    args = p.parse_args(argv)

    from ingest.broker import EmbeddedBroker
    from ingest.kafka_options import KafkaSourceOptions
    from ingest.kafka_produce import create_topic, produce
    from ingest.kafka_source import _Cluster

    print(machine_line(machine_info()))
    broker = None if args.bootstrap_servers else EmbeddedBroker()
    bootstrap = args.bootstrap_servers or broker.start()  # type: ignore[union-attr]
    topic = f"probe-{int(time.time())}"
    try:
        create_topic(bootstrap, topic, args.partitions)
        produce(bootstrap, topic, [(None, b"x" * 64, i % args.partitions)
                                   for i in range(args.records)])
        options = KafkaSourceOptions.from_options({
            "kafka.bootstrap.servers": bootstrap, "subscribe": topic,
            "kafka.isolation.level": args.isolation})
        cluster = _Cluster(options)
        tps = cluster.partitions((topic,))
        counts = _count_fetches()
        floor = {tp: 0 for tp in tps}
        rows = _calls(cluster, tps, floor, args.calls, counts, "idle")
        stop = multiprocessing.Event()
        producer = multiprocessing.Process(
            target=_produce_forever, args=(bootstrap, topic, args.partitions, args.rate, stop))
        producer.start()
        time.sleep(2.0)  # the producer reaches its rate
        floor = {tp: e.offset for tp, e in cluster.ends(tps, floor).items()}
        rows += _calls(cluster, tps, floor, args.calls, counts,
                       f"producer at {args.rate:,.0f}/s")
        stop.set()
        producer.join(timeout=60)
        cluster.close()
    finally:
        if broker is not None:
            broker.stop()
    print(f"load average {load_average()}; {args.partitions} partitions, {args.isolation}")
    print(text_table(["phase", "call", "seconds", "fetches", "record bytes", "confirmed"],
                     rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
