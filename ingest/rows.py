"""Prepared rows: their columns and operations, and how they are packed for a shuffle.

Every micro-batch turns Kafka rows into *prepared* rows (:mod:`ingest.prepare`), one per Kafka
row, each carrying its operation (:data:`UPSERT`, :data:`DELETE`, :data:`ERROR`, :data:`SKIP`)
and the bookkeeping columns below beside the data columns. The later steps (the GLOBAL_STATE
index, the record index's tagging, the write tasks) read and write the same columns; this
module names them once.

*Packed* rows (:func:`pack_rows`) carry many prepared rows of one file group (or key shard)
as one Arrow IPC value, so that a shuffle moves a few large values instead of every record.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.merge.resolve import VersionColumns
from engine.schema import PARTITION_PATH, RECORD_KEY
from ingest.kafka_schema import KAFKA_ROW_SCHEMA
from ingest.state_index import key_shards

if TYPE_CHECKING:
    pass

__all__ = [
    "BUCKET",
    "DELETE",
    "ERROR",
    "LOCATED",
    "SKIP",
    "SUPERSEDED",
    "UPSERT",
    "VERSIONS",
    "group_rows",
    "is_prepared",
    "located_keys",
    "pack_by_shard",
    "pack_rows",
    "packed_schema",
    "shard_packed_schema",
    "unpack_blobs",
    "unpack_rows",
]

# Operations (column OP, int8).
UPSERT = 0
DELETE = 1
ERROR = 2
SKIP = 3
"""A row that writes nothing (it lost to a newer version); kept for its Kafka offset."""

OP = "_tl_op"
REASON = "_tl_error"
TOPIC = "_tl_topic"
KAFKA_PARTITION = "_tl_kafka_partition"
OFFSET = "_tl_offset"
TIMESTAMP = "_tl_timestamp"
KAFKA_KEY = "_tl_kafka_key"
VALUE = "_tl_value"
ORDERING = "_tl_ordering"
ORDERING_NULL = "_tl_ordering_null"
FILE_ID = "_tl_file_id"
BUCKET = "_tl_bucket"
RING = "_tl_ring"
"""Consistent hashing: the instant of the ring prepare placed the row's key with."""
SUPERSEDED = "_tl_superseded"
"""Error rows: the record key of a later record of the batch that was written, null if none
(or the row's key could not be told); :mod:`ingest.supersede`."""
ROWS = "_tl_rows"
"""Packed rows: an Arrow IPC stream of prepared rows of one file group (see :func:`pack_rows`)."""
VERSIONS = VersionColumns(op=OP, delete=DELETE, ordering=ORDERING, ordering_null=ORDERING_NULL)
"""Where prepared rows keep what the engine resolves versions by
(:func:`engine.merge.resolve.resolve`)."""
SPREAD = "_tl_spread"
SHARD = "_tl_shard"
"""Rows packed for the GLOBAL_STATE index's state operator: the shard of their keys
(:func:`ingest.state_index.key_shards`; null for error rows)."""
PACK_ROWS = 65_536
"""Prepared rows packed at a time, and at most per packed row."""
PACK_BYTES = 256 << 20
"""Prepared bytes packed at a time, at most (a packed column stays far below 2 GiB)."""
RESERVED_PREFIXES = ("_tl_", "_hoodie_")

KAFKA_COLUMNS = tuple(KAFKA_ROW_SCHEMA.names)
"""Columns of the source rows (:data:`ingest.kafka_schema.KAFKA_ROW_SCHEMA`; headers are
ignored)."""
LOCATED = "_tl_located"
"""Rows tagged by the record index (:mod:`ingest.record_index`): true for an upsert whose key
the lookup located in the row's file group (an update in place), false for every other row
(inserts, deletes, skipped versions, errors)."""


def located_keys(rows: pa.Table) -> pa.Array | None:
    """The keys of ``rows`` (tagged rows of one file group) that the lookup located in the
    group: what :meth:`engine.write.group_writer.GroupWriter.write` takes as
    ``located_keys``; None for rows that were not tagged (no :data:`LOCATED`). Executor
    side."""
    if LOCATED not in rows.column_names:
        return None
    located = pc.and_(pc.fill_null(rows.column(LOCATED), False),
                      pc.equal(rows.column(OP), UPSERT))
    return rows.column(RECORD_KEY).filter(located).combine_chunks().cast(pa.string())


def packed_schema(keys: Sequence[pa.Field] | None = None) -> pa.Schema:
    """Arrow schema of packed rows: what they are packed by — by default the file group's
    partition and bucket (null for error rows) —, a number spreading the packs of rows
    without a file group over tasks, the rows themselves."""
    if keys is None:
        keys = (pa.field(PARTITION_PATH, pa.string()), pa.field(BUCKET, pa.int32()))
    return pa.schema([*keys, pa.field(SPREAD, pa.int64()), pa.field(ROWS, pa.binary())])


def shard_packed_schema() -> pa.Schema:
    """Arrow schema of rows packed by key shard (:func:`pack_by_shard`)."""
    return packed_schema([pa.field(SHARD, pa.int32())])


def pack_rows(prepared: pa.Table, max_rows: int = PACK_ROWS, *,
              keys: Mapping[str, pa.Array] | None = None) -> pa.Table:
    """Rows packed by ``keys`` (name → one value per row; by default the rows' partition and
    :data:`BUCKET`, their file group): one row per distinct key and up to ``max_rows`` rows,
    holding them as an Arrow IPC stream.

    The shuffle to the write tasks then moves a few large values per file group instead of
    every record: Spark's per-row work (converting Arrow to its rows, serializing, converting
    back) is what dominated a micro-batch. Rows whose last key is null (no file group: errors)
    are packed together; :data:`SPREAD` (their first offset; null for rows without
    :data:`OFFSET`) spreads such packs over the write tasks. Row order within a pack is the
    input order. Executor side.
    """
    if keys is None:
        keys = {PARTITION_PATH: prepared.column(PARTITION_PATH),
                BUCKET: prepared.column(BUCKET)}
    names = list(keys)
    ordered, group_keys, sizes = group_rows(prepared, [keys[name] for name in names])
    values: list[list[Any]] = [[] for _ in names]
    spreads: list[int | None] = []
    ends = [0]
    offsets = ordered.column(OFFSET) if OFFSET in ordered.column_names else None
    sink = pa.BufferOutputStream()  # every pack back to back: one binary column, no copies
    first = 0
    for g, size in enumerate(sizes):
        last = group_keys[-1][g]
        for begin in range(first, first + size, max_rows):
            length = min(max_rows, first + size - begin)
            with pa.ipc.new_stream(sink, prepared.schema) as writer:
                writer.write_table(ordered.slice(begin, length))
            ends.append(sink.tell())
            for column, found in zip(values, group_keys, strict=True):
                column.append(found[g])
            spreads.append(None if last is not None or offsets is None
                           else offsets[begin].as_py())
        first += size
    if ends[-1] >= 2**31:
        raise ValueError(f"pack_rows: {ends[-1]} bytes do not fit one binary column")
    blobs = pa.Array.from_buffers(pa.binary(), len(spreads), [
        None, pa.py_buffer(np.asarray(ends, dtype=np.int32)), sink.getvalue()])
    schema = packed_schema([pa.field(name, keys[name].type) for name in names])
    return pa.table([*(pa.array(v, schema.field(i).type) for i, v in enumerate(values)),
                     pa.array(spreads, pa.int64()), blobs], schema=schema)


def group_rows(rows: pa.Table, keys: Sequence[pa.Array | pa.ChunkedArray]
               ) -> tuple[pa.Table, list[list[Any]], list[int]]:
    """``rows`` taken once, grouped by ``keys`` (one value per row each) and in input order
    within a group: the reordered rows, every group's key values (one list per key) and every
    group's row count — group *g* is the slice after the first *g* counts."""
    index = pa.table({**{f"k{i}": key for i, key in enumerate(keys)},
                      "i": pa.array(np.arange(rows.num_rows, dtype=np.int64))})
    grouped = index.group_by([f"k{i}" for i in range(len(keys))],
                             use_threads=False).aggregate([("i", "list")])
    lists = grouped.column("i_list").combine_chunks()
    sizes = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
    group_of = np.empty(rows.num_rows, dtype=np.int64)
    group_of[lists.flatten().to_numpy()] = np.repeat(np.arange(len(sizes)), sizes)
    ordered = rows.take(pa.array(np.argsort(group_of, kind="stable")))
    return (ordered, [grouped.column(f"k{i}").to_pylist() for i in range(len(keys))],
            sizes.tolist())


def pack_by_shard(prepared: pa.Table, shards: int, max_rows: int = PACK_ROWS) -> pa.Table:
    """Prepared rows packed by the shard of their key (error rows: by none), for the
    GLOBAL_STATE index's state operator (:mod:`ingest.global_index`). Executor side."""
    shard = key_shards(prepared.column(RECORD_KEY), shards)
    shard = pc.if_else(pc.equal(prepared.column(OP), ERROR), pa.scalar(None, pa.int32()), shard)
    return pack_rows(prepared, max_rows, keys={SHARD: shard})


def unpack_rows(packed: pa.Table) -> pa.Table:
    """The prepared rows of (at least one) packed row (:func:`pack_rows`), pack by pack.
    Executor side."""
    return unpack_blobs([chunk[i].as_buffer() for chunk in packed.column(ROWS).chunks
                         for i in range(len(chunk))])


def unpack_blobs(blobs: Sequence[bytes | pa.Buffer]) -> pa.Table:
    """The rows of (at least one) pack, given as its Arrow IPC bytes. Executor side."""
    if not blobs:
        raise ValueError("unpack_blobs: no packs")
    return pa.concat_tables([pa.ipc.open_stream(pa.py_buffer(b) if isinstance(b, bytes) else b)
                             .read_all() for b in blobs])


def is_prepared(columns: Sequence[str]) -> bool:
    """True for the columns of prepared (or packed) rows, False for Kafka rows."""
    return OP in columns or ROWS in columns


def release_task_memory() -> None:
    """Give the memory that a finished task's Arrow buffers freed back to the system.

    pyarrow's allocator (mimalloc here) keeps freed pages for reuse; a Spark Python worker
    sits idle between tasks with them still resident, and the job's workers each hold their
    own. Called where a task in a reused worker ends (:mod:`ingest.kafka_source`'s read tasks,
    :mod:`ingest.spark_write`'s write tasks); the next task takes fresh pages. The C heap
    (Python's objects, numpy's arrays) is trimmed too: glibc keeps the freed pages of a task's
    short-lived objects. Executor side."""
    pa.default_memory_pool().release_unused()
    _trim_c_heap()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    try:
        return cast("Callable[[int], int]", ctypes.CDLL(None).malloc_trim)
    except (OSError, AttributeError):
        return None


def _trim_c_heap() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
