"""The benchmark's records: the engine benchmark's workload as keyed JSON Kafka values."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from common import (
    DATA_COLUMNS,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    STRING_COLUMNS,
    Workload,
    WorkloadSpec,
    generate_workload,
)

TARGET_BUCKET = 150_000.0  # records/s, MOR + bucket index, 2 cores (issue 36's goal)
FULL_RECORDS = 1_000_000
INDEXES = {"bucket": "BUCKET", "global": "GLOBAL_STATE", "consistent": "CONSISTENT_HASHING"}
"""--index names → the index a run uses (consistent: BUCKET with the consistent-hashing
engine, as many initial buckets as the simple run and no resize: the placement's cost)."""
SCHEMA_DDL = ", ".join(
    ["key STRING, ts BIGINT, partition STRING"]
    + [f"{c} BIGINT" for c in INT_COLUMNS] + [f"{c} DOUBLE" for c in FLOAT_COLUMNS]
    + [f"{c} STRING" for c in STRING_COLUMNS])
UPDATE_BATCHES = 5  # the stream: an initial quarter of new keys, then 5 mixed slices
WARMUP_RECORDS = 1_000
"""Records the latency phase sends before it measures (to start its table)."""
WARMUP_QUERY_RECORDS = 100_000
WARMUP_QUERY_BATCHES = 4
"""The untimed warm-up query: enough records and micro-batches that every Python worker the
runs use has imported its modules and the JVM has compiled the hot paths (a 1,000-record
warm-up left the first measured batches 2-3x slower than the rest)."""
WARMUP_KEY_BASE = 9_000_000_000  # warm-up keys never collide with the stream's


def stream_spec(records: int, seed: int) -> WorkloadSpec:
    """``records`` records, half of them updates: R/4 new keys, then 5 slices of 3R/20
    records, two thirds updates of random earlier keys (newer ``ts``), one third new keys."""
    initial = max(records // 4, 1)
    batch = max((records - initial) // UPDATE_BATCHES, 3)
    return WorkloadSpec(rows=initial, batches=UPDATE_BATCHES, batch_size=batch,
                        update_fraction=2 / 3, seed=seed)


@dataclass
class Stream:
    """The records in produce order, with their Kafka keys, JSON values and partitions."""

    workload: Workload
    table: pa.Table
    keys: list[bytes]
    values: list[bytes]
    partitions: np.ndarray
    records_asked: int

    @property
    def records(self) -> int:
        return self.table.num_rows

    @property
    def distinct_keys(self) -> int:
        return self.workload.spec.expected_rows

    def drop_values(self, keep: int = 1_000) -> None:
        """Forget the Kafka keys and values but the first ``keep`` (the run notes' value
        size): once produced, the topic holds them, and the driver's peak RSS is meant to be
        the job's, not ~140 MB of the bench's bytes per 400,000 records."""
        self.keys, self.values = self.keys[:keep], self.values[:keep]

    def per_partition(self, count: int) -> dict[int, int]:
        counts = np.bincount(self.partitions, minlength=count)
        return {p: int(n) for p, n in enumerate(counts)}


_HEAD = '{"key":"%s","ts":'
_TAIL = ('"partition":"%s",' + "".join(f'"{c}":%d,' for c in INT_COLUMNS)
         + "".join(f'"{c}":%r,' for c in FLOAT_COLUMNS)
         + ",".join(f'"{c}":"%s"' for c in STRING_COLUMNS) + "}")


def json_parts(table: pa.Table) -> tuple[list[bytes], list[bytes]]:
    """Per record ``{"key":"…","ts":`` and ``,"partition":…}``: the value is head + ts + tail.

    Keys, dates and the generator's words need no JSON escaping (``[a-z0-9-]``); floats print
    as Python's shortest round-trip repr, which JSON readers parse back to the same double.
    """
    for name in ("key", "partition", *STRING_COLUMNS):
        bad = pc.sum(pc.invert(pc.match_substring_regex(table.column(name), r"^[a-z0-9-]*$")))
        if bad.as_py():
            raise ValueError(f"column {name} holds characters that need JSON escaping")
    keys = table.column("key").to_pylist()
    rest = zip(*(table.column(c).to_pylist() for c in DATA_COLUMNS[2:]), strict=True)
    heads = [(_HEAD % k).encode() for k in keys]
    tails = [("," + _TAIL % r).encode() for r in rest]
    return heads, tails


def kafka_partitions(keys: Sequence[bytes], count: int) -> np.ndarray:
    """Kafka partition of each record: a hash of its key (a key always goes to one partition)."""
    return np.fromiter((zlib.crc32(k) % count for k in keys), dtype=np.int64, count=len(keys))


def build_stream(records: int, seed: int, partitions: int) -> Stream:
    workload = generate_workload(stream_spec(records, seed))
    table = pa.concat_tables([workload.initial, *workload.batches])
    heads, tails = json_parts(table)
    keys = [k.encode() for k in table.column("key").to_pylist()]
    ts = table.column("ts").to_pylist()
    values = [h + str(t).encode() + tl for h, t, tl in zip(heads, ts, tails, strict=True)]
    return Stream(workload, table, keys, values, kafka_partitions(keys, partitions),
                  records)
