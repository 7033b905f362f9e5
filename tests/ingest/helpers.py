"""Helpers of the sink tests: Kafka events and their rows, the oracle fed with them, reading the
table back (ours and hudi-rs's), and micro-batches through Spark.

The events table: ``id`` (record key), ``ts`` (ordering field), ``city`` (partition), ``fare``.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from engine import Table
from ingest.decode import JsonDecoder
from ingest.kafka_schema import KAFKA_ROW_SCHEMA
from ingest.sink import HudiStreamingSink, start_ingest
from tests.engine.helpers import SCHEMA, random_batch
from tests.helpers import Oracle, hudi_rs_read, rows_by_key

DDL = "id STRING, ts BIGINT, city STRING, fare DOUBLE, _hoodie_is_deleted BOOLEAN"
CITIES = ("oslo", "rome", "lima")
KAFKA = KAFKA_ROW_SCHEMA
"""Kafka rows as the sink reads them (:data:`ingest.rows.KAFKA_ROW_SCHEMA`)."""
DAY_MS = 1_700_000_000_000  # 2023-11-14 UTC
ROW = ("city", "ts", "fare")
"""The columns of a key's row, as :func:`table_rows` and :attr:`EventOracle.rows` give them."""


# --- events, Kafka rows and the oracle ----------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One Kafka record: an upsert, a marker delete, a tombstone, or raw (malformed) bytes."""

    id: str
    ts: int = 0
    city: str = ""
    fare: float = 0.0
    delete: bool = False
    tombstone: bool = False
    raw: bytes | None = None
    kafka_partition: int = 0

    def value(self) -> bytes | None:
        if self.raw is not None:
            return self.raw
        if self.tombstone:
            return None
        record: dict[str, Any] = {"id": self.id, "ts": self.ts, "city": self.city,
                                  "fare": self.fare}
        if self.delete:
            record["_hoodie_is_deleted"] = True
        return json.dumps(record).encode()


def kafka_rows(events: Sequence[Event], topic: str, next_offsets: dict[int, int]) -> pa.Table:
    """Kafka-shaped rows; offsets continue from ``next_offsets`` (updated in place)."""
    offsets = []
    for e in events:
        offsets.append(next_offsets.get(e.kafka_partition, 0))
        next_offsets[e.kafka_partition] = offsets[-1] + 1
    return pa.table({
        "key": [e.id.encode() if e.id else None for e in events],
        "value": [e.value() for e in events],
        "topic": [topic] * len(events),
        "partition": [e.kafka_partition for e in events],
        "offset": offsets,
        "timestamp": [DAY_MS * 1000 + i for i in range(len(events))],
    }, schema=KAFKA)


class EventOracle:
    """Live records by key: :class:`tests.helpers.Oracle` (key ``id``, event-time ordering on
    ``ts``) fed each event in arrival order: an upsert, a marker delete at its ``ts``, a
    tombstone (a delete without ordering); malformed records change nothing."""

    def __init__(self) -> None:
        self.oracle = Oracle(key="id", ordering="ts")

    def apply(self, events: Sequence[Event]) -> None:
        for e in sorted(events, key=lambda e: e.kafka_partition):  # Kafka order per partition
            if e.raw is not None:
                continue
            if e.tombstone:
                self.oracle.delete([e.id])
            elif e.delete:
                self.oracle.delete([e.id], e.ts)
            else:
                self.oracle.upsert([{"id": e.id, "city": e.city, "ts": e.ts, "fare": e.fare}])

    @property
    def rows(self) -> dict[str, tuple[str, int, float]]:
        """id → (city, ts, fare) of every live record."""
        return rows_by_key(self.oracle.snapshot(), "id", ROW)


def random_batches(rng: random.Random, batches: int, size: int, *, moves: bool,
                   tombstones: bool, clock: list[int]) -> Iterator[list[Event]]:
    """Batches of inserts, updates (moving partition if ``moves``), deletes and late versions.

    Timestamps are unique and mostly increasing; a *late* version (lower ts than its key's
    version earlier in the same batch) must lose. No late version follows a delete.
    """
    live: dict[str, str] = {}
    next_id = 0
    for _ in range(batches):
        events: list[Event] = []
        deleted: set[str] = set()
        for _ in range(size):
            clock[0] += 10
            r = rng.random()
            if live and r < 0.2:
                key = rng.choice(sorted(live))
                if tombstones and rng.random() < 0.5:
                    events.append(Event(key, tombstone=True))
                else:
                    events.append(Event(key, clock[0], live[key], delete=True))
                live.pop(key)
                deleted.add(key)
                continue
            if live and r < 0.55:
                key = rng.choice(sorted(live))
                city = rng.choice(CITIES) if moves and rng.random() < 0.4 else live[key]
            else:
                next_id += 1
                key, city = f"k{next_id:04d}", rng.choice(CITIES)
            live[key] = city
            events.append(Event(key, clock[0], city, round(rng.uniform(1, 99), 2)))
        for e in list(events):
            if not e.delete and not e.tombstone and e.id not in deleted and rng.random() < 0.15:
                events.append(Event(e.id, e.ts - 5, e.city, -1.0))  # late: must lose
        yield events


def decoder() -> JsonDecoder:
    return JsonDecoder(DDL)


# --- reading the table back ---------------------------------------------------------------------


def table_rows(path: str | Path) -> dict[str, tuple[str, int, float]]:
    """tidelake's snapshot read: id → (city, ts, fare); fails if a key is stored twice."""
    data = Table.open(str(path)).read(columns=["id", *ROW])
    return rows_by_key(data, "id", ROW, once=True)


def hudi_rs_rows(path: str | Path) -> dict[str, tuple[str, int, float]]:
    """hudi-rs's snapshot read: id → (city, ts, fare)."""
    return rows_by_key(hudi_rs_read(path), "id", ROW)


# --- micro-batches through Spark ----------------------------------------------------------------


def data_frame(spark: Any, rows: pa.Table) -> Any:
    """A static DataFrame of ``rows``, for ``process_batch``."""
    return spark.createDataFrame(rows)


class ParquetStream:
    """A folder of Kafka-shaped parquet files read as a stream, one file per micro-batch."""

    def __init__(self, root: Path, topic: str) -> None:
        self.dir = root / "source"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.topic = topic
        self.offsets: dict[int, int] = {}
        self.count = 0

    def add(self, events: Sequence[Event]) -> None:
        path = self.dir / f"batch-{self.count:05d}.parquet"
        pq.write_table(kafka_rows(events, self.topic, self.offsets), path)
        stamp = 1_700_000_000 + self.count  # the file source takes files oldest first
        os.utime(path, (stamp, stamp))
        self.count += 1

    def frame(self, spark: Any) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        return (spark.readStream.schema(from_arrow_schema(KAFKA))
                .option("maxFilesPerTrigger", 1).parquet(str(self.dir)))


def run_stream(spark: Any, stream: ParquetStream, sink: HudiStreamingSink,
               checkpoint: Path) -> None:
    """Ingest every file of ``stream`` (trigger availableNow); a failed query raises."""
    query = start_ingest(spark, stream.frame(spark), sink, str(checkpoint),
                         trigger={"availableNow": True})
    try:
        query.awaitTermination(600)
    except Exception as exc:  # StreamingQueryException: the query failed
        raise RuntimeError(str(exc)) from exc
    finally:
        query.stop()


# --- tables the Spark read tests query --------------------------------------------------------


def all_rows(data: pa.Table) -> list[dict[str, Any]]:
    """Every column of every row (dictionary columns, such as meta columns, as plain values;
    NaN as ``"NaN"``, so that rows compare equal), in a fixed order (by the meta fields when
    present, then every value)."""
    plain = data.cast(pa.schema([pa.field(f.name, f.type.value_type)
                                 if pa.types.is_dictionary(f.type) else f
                                 for f in data.schema]))
    rows = [{k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
            for r in plain.to_pylist()]
    return sorted(rows, key=lambda r: (
        str(r.get("_hoodie_record_key")), str(r.get("_hoodie_partition_path")),
        [repr(v) for v in r.values()]))


def build_read_table(path: Path, table_type: str, partitioned: bool, seed: int
                     ) -> tuple[Table, Oracle, list[str]]:
    """A random table of tests/engine/helpers.py's rows: 4 upsert batches, a delete, a
    compaction (MOR) or a clustering (COW), one more upsert. Returns it, its oracle and its
    commits' instant times."""
    rng = random.Random(seed)
    options = {"hoodie.metadata.index.column.stats.enable": "true",
               "hoodie.clustering.plan.strategy.small.file.limit": str(10 * 1024 * 1024),
               "hoodie.clustering.plan.strategy.sort.columns": "ts"}
    table = Table.create(str(path), name="trips", table_type=table_type, record_key="key",
                         precombine="ts", partition_by=["region"] if partitioned else None,
                         options=options)
    oracle, counter, instants = Oracle(), [0], []
    for size in (30, 20, 20, 15):
        batch = same_partition(random_batch(rng, oracle, counter, size), oracle)
        instant = table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
        oracle.upsert(batch, instant)
        instants.append(instant)
    victims = rng.sample(sorted(oracle.rows), 4)
    held = {k: oracle.rows[k]["region"] for k in victims}
    instant = table.delete(pa.table({"key": victims, "region": [held[k] for k in victims]}))
    oracle.delete(victims, instant=instant)
    instants.append(instant)
    service = table.compact() if table_type == "MERGE_ON_READ" else table.cluster()
    assert service.completed, f"no {service.service} ran"
    batch = same_partition(random_batch(rng, oracle, counter, 10), oracle)
    instant = table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
    oracle.upsert(batch, instant)
    instants.append(instant)
    return table, oracle, instants


def same_partition(batch: list[dict[str, Any]], oracle: Oracle) -> list[dict[str, Any]]:
    """Updates keep their key's partition (only a global index moves a key)."""
    for row in batch:
        if row["key"] in oracle.rows:
            row["region"] = oracle.rows[row["key"]]["region"]
    return batch
