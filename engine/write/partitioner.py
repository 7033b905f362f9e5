"""Placing inserts: small file groups first, then new file groups at the target size.

This is Hudi's upsert-partitioner rule: the average record size comes from the last
commit that wrote base files (or ``hoodie.copyonwrite.record.size.estimate``); every file
group whose latest slice is smaller than ``hoodie.parquet.small.file.limit`` takes inserts
until it would reach ``hoodie.parquet.max.file.size``; the rest open new file groups that
each hold ``max.file.size / average record size`` records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from engine.config import WriteConfig
from engine.format.naming import new_file_id
from engine.layout.file_group import FileSlice
from engine.timeline.active import Timeline


@dataclass(frozen=True)
class InsertBucket:
    """``count`` inserts of one partition go to ``file_id`` (``existing`` = small file)."""

    partition_path: str
    file_id: str
    count: int
    existing: FileSlice | None


def average_record_size(timeline: Timeline, config: WriteConfig) -> int:
    """Bytes per record measured by the latest commit that wrote base files."""
    for instant in reversed(timeline.completed_data_instants):
        meta = timeline.commit_metadata(instant)
        total_bytes = 0
        total_records = 0
        for stat in meta.write_stats:
            if stat.path.endswith(".parquet") and stat.num_writes:
                total_bytes += stat.total_write_bytes
                total_records += stat.num_writes
        if total_records and total_bytes:
            return max(1, total_bytes // total_records)
    return config.record_size_estimate


def assign_inserts(partition: str, count: int, slices: list[FileSlice],
                   config: WriteConfig, record_size: int) -> list[InsertBucket]:
    """Split ``count`` inserts of one partition over small file groups and new ones."""
    buckets: list[InsertBucket] = []
    remaining = count
    small = sorted((s for s in slices if s.total_size() < config.small_file_limit),
                   key=FileSlice.total_size)
    for slc in small:
        if remaining <= 0:
            break
        capacity = (config.max_file_size - slc.total_size()) // record_size
        if capacity <= 0:
            continue
        take = min(capacity, remaining)
        buckets.append(InsertBucket(partition, slc.file_id, take, slc))
        remaining -= take
    per_group = max(1, config.max_file_size // record_size)
    while remaining > 0:
        take = min(per_group, remaining)
        buckets.append(InsertBucket(partition, new_file_id(), take, None))
        remaining -= take
    return buckets


def insert_file_ids(keys: pa.Array | pa.ChunkedArray, buckets: Sequence[InsertBucket]) -> pa.Array:
    """The file group of each insert of one partition, among its :func:`assign_inserts`
    ``buckets``, when the inserts are spread over tasks that cannot count them in turn: as
    Hudi's ``UpsertPartitioner.getPartition``, the key's MD5 hash modulo the partition's
    insert count falls in one bucket's share (buckets weighted by their counts). The same
    for every task attempt and replay; counts are then met on average, not exactly."""
    total = sum(b.count for b in buckets)
    if not buckets or total <= 0:
        raise ValueError("insert_file_ids: no insert buckets")
    bounds = np.cumsum([b.count for b in buckets])
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    slots = np.array([int.from_bytes(hashlib.md5(k.encode()).digest()[:8], "big", signed=True)
                      % total for k in keys.cast(pa.string()).to_pylist()], dtype=np.int64)
    which = np.searchsorted(bounds, slots, side="right")
    return pa.array([b.file_id for b in buckets], pa.string()).take(pa.array(which))
