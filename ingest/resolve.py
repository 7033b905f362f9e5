"""How the streaming sink resolves a micro-batch's versions: its delete policy and the order
versions arrived in.

The rule itself is the engine's (:mod:`engine.merge.resolve`, on the rules of
:mod:`engine.merge.policy`); the sink chooses *remembered deletes* (:data:`POLICY`,
``docs/ingest.md``, "Deletes") and fixes "earlier" and "later" as positions in arrival order
(:func:`arrival_order`): (topic, Kafka partition, offset) — the real order within a Kafka
partition, and the same order whenever a batch is replayed.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.merge.policy import DeletePolicy
from ingest.rows import KAFKA_PARTITION, OFFSET, TOPIC

__all__ = ["POLICY", "arrival_order", "arrival_positions"]

POLICY = DeletePolicy.REMEMBERED
"""The streaming sink's delete policy (:class:`engine.merge.policy.DeletePolicy`), for its write
tasks and its GLOBAL_STATE index alike: remembered deletes (the index keeps a deleted key's
ordering value, so that a late older version loses in a later batch too)."""


def arrival_order(rows: pa.Table) -> pa.Table:
    """``rows`` sorted by (topic, Kafka partition, offset): the order versions arrived in."""
    if rows.num_rows < 2:
        return rows
    return rows.take(pa.array(arrival_positions(rows)))


def arrival_positions(rows: pa.Table, groups: np.ndarray | None = None) -> np.ndarray:
    """The positions of ``rows`` in arrival order: by (topic, Kafka partition, offset), nulls
    last, rows that tie in their input order; with ``groups`` (an integer per row) by group
    first, in arrival order within each. Topics compare as strings (their order in the batch
    does not matter), Kafka partitions and offsets as numbers, all on numpy integers: one
    stable sort, no comparison of strings per row."""
    topics = rows.column(TOPIC).combine_chunks().dictionary_encode()
    ranks = pc.rank(topics.dictionary, sort_keys="ascending").to_numpy().astype(np.int64)
    codes = pc.fill_null(topics.indices, -1).to_numpy(zero_copy_only=False)
    topic = np.where(codes >= 0, ranks[np.maximum(codes, 0)] if len(ranks) else 0,
                     len(ranks) + 1)
    last = np.iinfo(np.int64).max
    partition, offset = (pc.fill_null(rows.column(name).combine_chunks().cast(pa.int64()), last)
                         .to_numpy(zero_copy_only=False) for name in (KAFKA_PARTITION, OFFSET))
    keys = (offset, partition, topic) if groups is None else (offset, partition, topic, groups)
    return np.lexsort(keys)
