"""Sample trip events for the demo and the tests: inserts, updates, deletes, malformed.

Events are JSON objects ``{"trip_id", "ts", "city", "fare", "rider"}``; a delete carries
``"_hoodie_is_deleted": true``. ``ts`` (the ordering field) increases with every event, so
the expected table is simply "the last event of each key, unless it was a delete". A
deterministic seed makes a run reproducible; :class:`SampleEvents` keeps that expected
table (:attr:`expected`) and the malformed records it emitted (:attr:`malformed`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

SCHEMA_DDL = ("trip_id STRING, ts BIGINT, city STRING, fare DOUBLE, rider STRING, "
              "_hoodie_is_deleted BOOLEAN")
CITIES = ("amsterdam", "lisbon", "oslo", "tallinn", "são_paulo")


@dataclass
class SampleEvents:
    """A reproducible stream of ``count`` events with the given mix."""

    count: int
    update_ratio: float = 0.30
    delete_ratio: float = 0.05
    malformed_ratio: float = 0.01
    seed: int = 7
    start_ts: int = 1_700_000_000_000
    expected: dict[str, dict[str, Any]] = field(default_factory=dict)
    malformed: list[tuple[bytes, bytes]] = field(default_factory=list)
    produced: int = 0

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs; keeps :attr:`expected` and :attr:`malformed` up to date."""
        rng = random.Random(self.seed)
        next_id = 0
        live: list[str] = []
        for i in range(self.count):
            ts = self.start_ts + i
            roll = rng.random()
            if roll < self.malformed_ratio:
                key, value = _malformed(rng, i)
                self.malformed.append((key, value))
            elif live and roll < self.malformed_ratio + self.delete_ratio:
                victim = live.pop(rng.randrange(len(live)))
                row = dict(self.expected.pop(victim), ts=ts, _hoodie_is_deleted=True)
                key, value = victim.encode(), json.dumps(row).encode()
            elif live and roll < self.malformed_ratio + self.delete_ratio + self.update_ratio:
                target = live[rng.randrange(len(live))]
                row = dict(self.expected[target], ts=ts, fare=round(rng.uniform(5, 90), 2))
                self.expected[target] = row
                key, value = target.encode(), json.dumps(row).encode()
            else:
                next_id += 1
                trip = f"trip-{self.seed}-{next_id:07d}"
                row = {"trip_id": trip, "ts": ts, "city": rng.choice(CITIES),
                       "fare": round(rng.uniform(5, 90), 2),
                       "rider": f"rider-{rng.randint(1, 999)}"}
                self.expected[trip] = row
                live.append(trip)
                key, value = trip.encode(), json.dumps(row).encode()
            self.produced += 1
            yield key, value


def _malformed(rng: random.Random, i: int) -> tuple[bytes, bytes]:
    kind = rng.randrange(4)
    key = f"bad-{i}".encode()
    if kind == 0:
        return key, b'{"trip_id": "broken", "ts": '  # not JSON
    if kind == 1:
        return key, json.dumps({"ts": 1, "city": "oslo", "fare": 1.0}).encode()  # no key
    if kind == 2:
        return key, json.dumps({"trip_id": f"bad-{i}", "ts": "yesterday", "city": "oslo"}).encode()
    return key, json.dumps({"trip_id": f"bad-{i}", "ts": 5, "city": "x" * 400}).encode()


def produce(bootstrap_servers: str, topic: str, events: SampleEvents, *, partitions: int = 3,
            rate: float | None = None) -> int:
    """Create ``topic`` if needed and send every event (keyed: one key, one partition).

    ``rate`` limits sending to that many events per second (None: as fast as possible).
    """
    from ingest.kafka_produce import create_topic
    from ingest.kafka_produce import produce as produce_records

    create_topic(bootstrap_servers, topic, partitions, exist_ok=True)
    records = ((key, value, None) for key, value in events)
    return len(produce_records(bootstrap_servers, topic, records, rate=rate, linger_ms=5,
                               batch_size=256 * 1024, acks=1))
