"""Placement: the file group a record key goes to, under the bucket layouts.

One module for every writer — :class:`~engine.write.write_client.WriteClient` (``Table.upsert``
and friends), the streaming job's write tasks (:mod:`ingest.spark_write`) and its global-state
index (:mod:`ingest.global_index`) — so that they name the same file groups:

* **bucket index**: a key's bucket is Hudi's hash of it (:func:`record_buckets`); the bucket's
  file group in a partition is the live group whose id names the bucket, else a new id derived
  from (table, partition, bucket) (:func:`new_bucket_file_id`), the same for every writer, task
  attempt and replay (:func:`bucket_group`, :func:`bucket_file_ids`, :func:`place_buckets`);
* **generations**: a bucket group replaced by a clustering is never written again; the
  bucket's next group is the first generation never replaced (:func:`unreplaced_generation`);
* **tombstones** (deletes without a partition) go to their bucket in every partition holding
  it (:func:`spread_tombstones`);
* **consistent hashing**: the key's hash falls in a node of its partition's ring
  (:func:`routed`, :func:`ring_file_ids`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import InvalidRecordError
from engine.index.bucket import bucket_file_id, bucket_ids
from engine.index.consistent_hashing import HashingMetadata, ensure_initial_metadata, route
from engine.layout.view import LiveBuckets
from engine.schema import PARTITION_PATH, RECORD_KEY
from engine.storage import Storage


def new_bucket_file_id(table_name: str, partition: str, bucket: int,
                       generation: int = 0) -> str:
    """File id of a new bucket's file group, the same for every writer of that bucket.

    Derived from (table, partition, bucket) so that a retried task, or another executor,
    names the group identically; Hudi does the same for its non-blocking bucket ids.
    ``generation`` > 0 names the bucket's next group once a clustering replaced the
    previous one (a replaced file id is never written again).
    """
    name = f"tidelake:{table_name}:{partition}:{bucket}"
    seed = uuid.uuid5(uuid.NAMESPACE_URL, f"{name}:{generation}" if generation else name)
    return bucket_file_id(bucket, str(seed))


def bucket_group(live: LiveBuckets, table_name: str, partition: str, bucket: int,
                 generation: int = 0) -> str:
    """The file group of ``bucket`` in ``partition``: the live one, else the new id
    (``generation`` > 0: the bucket's next group, whatever is live)."""
    if generation:
        return new_bucket_file_id(table_name, partition, bucket, generation)
    return live.get((partition, bucket)) or new_bucket_file_id(table_name, partition, bucket)


def unreplaced_generation(group_of: Callable[[int], str],
                          is_replaced: Callable[[str], bool]) -> str:
    """The bucket's first group from generation 1 on that no clustering replaced
    (``group_of(generation)``: :func:`bucket_group` of that generation)."""
    generation = 1
    while is_replaced(group := group_of(generation)):
        generation += 1
    return group


def record_buckets(keys: pa.Array | pa.ChunkedArray, num_buckets: int) -> np.ndarray:
    """Bucket ids of record keys; a key Java's bucket index cannot parse is a bad record."""
    try:
        return bucket_ids(keys, num_buckets)
    except ValueError as exc:
        raise InvalidRecordError(f"bucket index: {exc}") from None


def bucket_file_ids(partitions: pa.Array, buckets: pa.Array, *, table_name: str,
                    live: LiveBuckets) -> pa.Array:
    """The file group (:func:`bucket_group`) of each (partition, bucket) row: one look-up
    per distinct pair, not per row."""
    labels = pc.binary_join_element_wise(partitions, buckets.cast(pa.string()),
                                         "/").dictionary_encode()
    distinct = [label.rsplit("/", 1) for label in labels.dictionary.to_pylist()]
    ids = [bucket_group(live, table_name, part, int(b)) for part, b in distinct]
    return pa.array(ids, pa.string()).take(labels.indices)


def place_buckets(records: pa.Table, *, table_name: str, num_buckets: int,
                  live: LiveBuckets) -> list[tuple[tuple[str, str], pa.Table]]:
    """Records (with :data:`~engine.schema.RECORD_KEY` and
    :data:`~engine.schema.PARTITION_PATH`) by the file group of their bucket, in input order
    within a group."""
    buckets = np.asarray(record_buckets(records.column(RECORD_KEY), num_buckets),
                         dtype=np.int64)
    encoded = records.column(PARTITION_PATH).combine_chunks().dictionary_encode()
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    group_code = codes * num_buckets + buckets
    if len(encoded.dictionary) * num_buckets <= 1 << 16:
        # numpy's stable sort of 16-bit integers is a radix sort: ~10x faster than int64's
        # merge sort on a 100,000-row batch (1 vs 10 ms), the same order.
        order = np.argsort(group_code.astype(np.uint16), kind="stable")
    else:
        order = np.argsort(group_code, kind="stable")
    ordered = records.take(order)
    sorted_codes = group_code[order]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
    ends = np.r_[starts[1:], len(order)]
    names = encoded.dictionary.to_pylist()
    placed = []
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        code = int(sorted_codes[start])
        part, bucket = names[code // num_buckets], code % num_buckets
        fid = bucket_group(live, table_name, part, bucket)
        placed.append(((part, fid), ordered.slice(start, end - start)))
    return placed


def spread_tombstones(rows: pa.Table, buckets: Sequence[int], live: LiveBuckets) -> pa.Table:
    """Rows without a :data:`~engine.schema.PARTITION_PATH` (deletes that carry only their
    key) copied to each partition holding their bucket (``buckets``: each row's) — live in
    ``live``, or written by the rows at hand — one copy per partition; the write of each
    group then deletes the key if it holds it (deleting an absent key changes nothing)."""
    parts = rows.column(PARTITION_PATH).combine_chunks()
    homeless = pc.is_null(parts).to_numpy(zero_copy_only=False)
    where: dict[int, set[str]] = {}
    for (part, bucket) in live:
        where.setdefault(int(bucket), set()).add(part)
    for part, bucket, lost in zip(parts.to_pylist(), buckets, homeless.tolist(), strict=True):
        if not lost:
            where.setdefault(int(bucket), set()).add(part)
    take: list[int] = []
    paths: list[str] = []
    for i in np.flatnonzero(homeless).tolist():
        for part in sorted(where.get(int(buckets[i]), ())):
            take.append(i)
            paths.append(part)
    copies = rows.take(pa.array(take, pa.int64()))
    copies = copies.set_column(copies.schema.get_field_index(PARTITION_PATH), PARTITION_PATH,
                               pa.array(paths, pa.string()))
    return pa.concat_tables([rows.filter(pa.array(~homeless)), copies])


def routed(data: pa.Table, ring_of: Callable[[str], HashingMetadata]
           ) -> list[tuple[str, str, np.ndarray]]:
    """Consistent hashing: rows by the file group their key's hash falls in
    (:func:`engine.index.consistent_hashing.route`); a key Java cannot parse is a bad
    record."""
    try:
        return route(data.column(RECORD_KEY), data.column(PARTITION_PATH), ring_of)
    except ValueError as exc:
        raise InvalidRecordError(f"consistent hashing bucket index: {exc}") from None


def ring_file_ids(partitions: pa.Array, ring_instants: pa.Array, nodes: pa.Array, *,
                  rings: Mapping[str, HashingMetadata], storage: Storage,
                  num_buckets: int) -> tuple[pa.Array, tuple[str, ...]]:
    """Consistent hashing, for rows whose node a task found earlier: the file group of each
    row's node (``nodes``) in the ring of the snapshot (``rings``; a partition without one
    gets its initial ring, written now unless the partition has metadata). A row whose
    ring (``ring_instants``) is not the snapshot's gets null; the partitions of such rows
    are returned too."""
    labels = pc.binary_join_element_wise(partitions, ring_instants,
                                         nodes.cast(pa.string()), "/")
    encoded = labels.dictionary_encode()
    ids: list[str | None] = []
    stale: set[str] = set()
    for part, instant, node in (label.rsplit("/", 2) for label in
                                encoded.dictionary.to_pylist()):
        ring = rings.get(part)
        if ring is None:
            ensure_initial_metadata(storage, part, num_buckets)
            ring = HashingMetadata.initial(part, num_buckets)
        if instant != ring.instant:
            stale.add(part)
            ids.append(None)
        else:
            ids.append(ring.nodes[int(node)].file_id)
    return pa.array(ids, pa.string()).take(encoded.indices), tuple(sorted(stale))
