"""Incoming records as a task turns them into rows to write, before any index looks at them.

A Spark task that prepares a micro-batch (``ingest/prepare.py``, in the Kafka read tasks)
decodes Avro values with the engine's codec (:mod:`engine.format.avro_codec`, the one the log
blocks use), turns data rows into record keys and partition paths (Hudi's key generator,
:mod:`engine.layout.keygen`) and, on a bucket table, each key's bucket
(:mod:`engine.index.bucket`, Java's hash bit for bit) or its node in the partition's
committed consistent-hashing ring (:mod:`engine.index.consistent_hashing`). This module is
that step's surface: the functions the write client uses itself (named here, not copied) and
the composition a task needs (:func:`key_buckets`, :func:`ring_nodes`). It is light to
import — neither the table view nor the write client — so the read tasks start fast.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engine.format.avro_codec import MalformedAvroError, avro_schema_to_arrow, decode_records
from engine.index.bucket import bucket_id, bucket_ids
from engine.index.consistent_hashing import committed_ring, locate_nodes
from engine.layout.keygen import check_field_types, partition_paths, record_keys
from engine.storage import Storage

__all__ = ["MalformedAvroError", "avro_schema_to_arrow", "bucket_id", "check_field_types",
           "decode_records", "key_buckets", "partition_paths", "record_keys", "ring_nodes"]


def key_buckets(keys: pa.Array | pa.ChunkedArray, num_buckets: int) -> pa.Array:
    """The bucket of each record key (int32; Hudi's bucket index hash,
    :func:`~engine.index.bucket.bucket_ids`)."""
    return pa.array(bucket_ids(keys, num_buckets), pa.int32())


def ring_nodes(keys: pa.Array | pa.ChunkedArray, partitions: pa.Array | pa.ChunkedArray,
               storage: Storage, num_buckets: int) -> tuple[pa.Array, pa.Array]:
    """Consistent hashing: the index of each key's node in its partition's ring as committed
    on ``storage`` now (:func:`~engine.index.consistent_hashing.committed_ring`; the initial
    ring of ``num_buckets`` nodes for a partition without one), and that ring's instant —
    which the write tasks compare with the ring of their instant's snapshot."""
    n = len(keys)
    nodes = np.zeros(n, np.int32)
    which = np.zeros(n, np.int32)  # index into `instants` of each row's ring
    instants: list[str] = []
    if n:
        for ring, rows, at in locate_nodes(
                keys, partitions, lambda part: committed_ring(storage, part, num_buckets)):
            nodes[rows] = at
            which[rows] = len(instants)
            instants.append(ring.instant)
    return (pa.array(nodes, pa.int32()),
            pa.array(instants, pa.string()).take(pa.array(which, pa.int32())))
