"""In-batch resolution: one version per record key, upserts and deletes together.

A micro-batch may hold several versions of a key — updates, marker deletes, tombstones. As
Hudi's in-batch combine does, only one version per key is written: the winner under the
table's merge mode, with the rules :mod:`engine.merge` applies between writes:

* event-time ordering: the greatest ordering value wins, the later one on a tie; a delete
  with an ordering value competes like any version; a delete without one (a tombstone) is a
  *natural-order* delete: it supersedes every earlier version of the batch, and any later
  version wins over it;
* commit-time ordering: the last version wins.

"Earlier" and "later" are positions in arrival order, which the caller fixes by sorting on
(topic, Kafka partition, offset) — the real order within a Kafka partition, and the same
order whenever a batch is replayed. The winner is then merged with the stored version by the
write handle under the same rules.

:func:`resolve` is vectorized (write tasks); :func:`winner_index` is the same rule for the few
versions of one key (the state operator). Both are pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.schema import RECORD_KEY
from ingest.prepare import DELETE, KAFKA_PARTITION, OFFSET, OP, ORDERING, ORDERING_NULL, TOPIC

__all__ = ["Resolved", "arrival_order", "resolve", "winner_index"]


@dataclass(frozen=True)
class Resolved:
    """The winning version of every key: data rows to write and deletes to write."""

    upserts: pa.Table
    deletes: pa.Table


def arrival_order(rows: pa.Table) -> pa.Table:
    """``rows`` sorted by (topic, Kafka partition, offset): the order versions arrived in."""
    if rows.num_rows < 2:
        return rows
    return rows.sort_by([(TOPIC, "ascending"), (KAFKA_PARTITION, "ascending"),
                         (OFFSET, "ascending")])


def resolve(rows: pa.Table, *, event_time: bool) -> Resolved:
    """Split ``rows`` (in arrival order; ops UPSERT and DELETE) into the winners per key.

    With ``event_time`` the rows need :data:`~ingest.prepare.ORDERING` and
    :data:`~ingest.prepare.ORDERING_NULL`.
    """
    n = rows.num_rows
    is_delete = pc.equal(rows.column(OP), DELETE).to_numpy(zero_copy_only=False)
    if n < 2:
        return _split(rows, is_delete)
    seq = np.arange(n, dtype=np.int64)
    keys = rows.column(RECORD_KEY).combine_chunks()
    if not event_time:
        last = pa.table({"k": keys, "s": seq}).group_by("k", use_threads=False) \
            .aggregate([("s", "max")]).column("s_max").to_numpy()
        picked = np.sort(last)
        return _split(rows.take(pa.array(picked)), is_delete[picked])
    natural = is_delete & rows.column(ORDERING_NULL).to_numpy(zero_copy_only=False)
    versions = pa.table({"k": keys, "o": rows.column(ORDERING).combine_chunks(), "s": seq,
                         "rank": pa.array(~natural)})
    if natural.any():
        # Versions before a key's last natural-order delete are superseded by it.
        resets = versions.filter(pa.array(natural)).group_by("k", use_threads=False) \
            .aggregate([("s", "max")]).rename_columns(["k", "reset"])
        joined = versions.join(resets, "k", join_type="left outer", use_threads=False)
        reset = pc.fill_null(joined.column("reset"), -1)
        versions = joined.filter(pc.greater_equal(joined.column("s"), reset)) \
            .drop_columns(["reset"])
    ordered = versions.sort_by([("k", "ascending"), ("rank", "ascending"), ("o", "ascending"),
                                ("s", "ascending")])
    ks = ordered.column("k").combine_chunks()
    m = ordered.num_rows
    last_of_key = np.ones(m, dtype=bool)
    if m > 1:
        last_of_key[:-1] = pc.not_equal(ks.slice(0, m - 1), ks.slice(1)).to_numpy(
            zero_copy_only=False)
    picked = np.sort(ordered.column("s").to_numpy()[last_of_key])
    return _split(rows.take(pa.array(picked)), is_delete[picked])


def _split(rows: pa.Table, is_delete: np.ndarray) -> Resolved:
    mask = pa.array(np.asarray(is_delete, dtype=bool))
    return Resolved(rows.filter(pc.invert(mask)), rows.filter(mask))


def winner_index(ops: Sequence[int], orderings: Sequence[Any], ordering_null: Sequence[bool],
                 *, event_time: bool) -> int:
    """Index of the winning version among one key's versions (in arrival order).

    The scalar form of :func:`resolve`: a natural-order version (every version without event
    time; a delete without ordering value with it) resets the contest; after it, any version
    with an ordering value wins over it, and the greatest ordering value wins, the later on a
    tie.
    """
    if not ops:
        raise ValueError("winner_index: no versions given")
    winner = -1
    winner_natural = False
    for i, op in enumerate(ops):
        if not event_time or (op == DELETE and bool(ordering_null[i])):
            winner, winner_natural = i, True
        elif winner < 0 or winner_natural or orderings[i] >= orderings[winner]:
            winner, winner_natural = i, False
    return winner
