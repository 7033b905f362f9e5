"""How the streaming sink resolves a micro-batch's versions: its delete policy and the order
versions arrived in.

The rule itself is the engine's (:mod:`engine.merge.resolve`, on the rules of
:mod:`engine.merge.policy`); the sink chooses *remembered deletes* (:data:`POLICY`,
``docs/ingest.md``, "Deletes") and fixes "earlier" and "later" as positions in arrival order
(:func:`arrival_order`): (topic, Kafka partition, offset) — the real order within a Kafka
partition, and the same order whenever a batch is replayed.
"""

from __future__ import annotations

import pyarrow as pa

from engine.merge.policy import DeletePolicy
from ingest.rows import KAFKA_PARTITION, OFFSET, TOPIC

__all__ = ["POLICY", "arrival_order"]

POLICY = DeletePolicy.REMEMBERED
"""The streaming sink's delete policy (:class:`engine.merge.policy.DeletePolicy`), for its write
tasks and its GLOBAL_STATE index alike: remembered deletes (the index keeps a deleted key's
ordering value, so that a late older version loses in a later batch too)."""


def arrival_order(rows: pa.Table) -> pa.Table:
    """``rows`` sorted by (topic, Kafka partition, offset): the order versions arrived in."""
    if rows.num_rows < 2:
        return rows
    return rows.sort_by([(TOPIC, "ascending"), (KAFKA_PARTITION, "ascending"),
                         (OFFSET, "ascending")])
