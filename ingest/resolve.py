"""In-batch resolution: one version per record key, upserts and deletes together.

A micro-batch may hold several versions of a key — updates, marker deletes, tombstones. As
Hudi's in-batch combine does, only one version per key is written. The rule is the engine's,
:mod:`engine.merge.policy`, under the sink's delete policy :data:`POLICY` — *remembered
deletes* (``docs/ingest.md``, "Deletes"; ``docs/engine.md``, "Delete policies") — applied to the
versions in arrival order, starting from what the table holds for the key (live at ordering
value *o*, deleted at *o*, or absent):

* an upsert with ordering value *r* wins unless *r* < *o* (it is then late and dropped);
  the key is live at *r*;
* a marker delete (``_hoodie_is_deleted``) with ordering value *d* wins unless *d* < *o*;
  the key is deleted at *d*;
* a tombstone (no ordering value) deletes the key if it is live, *at its ordering value o*;
  otherwise it changes nothing.

So a tombstone is written as a delete carrying the ordering value of the version it removes,
never as a natural-order delete: a later version older than the deleted one loses to it in
every reader (Java, hudi-rs and ours agree on ordered deletes, while they read natural-order
deletes differently depending on which versions sit in base and log files), and the result
does not depend on where micro-batches are cut. Without event time (commit-time ordering)
every version is *natural*: the last one wins, and a delete of a key that is not live
changes nothing.

"Earlier" and "later" are positions in arrival order, which the caller fixes by sorting on
(topic, Kafka partition, offset) — the real order within a Kafka partition, and the same
order whenever a batch is replayed.

:func:`resolve` combines the keys without tombstones as the engine combines a batch
(:func:`engine.merge.record_merger.dedupe_batch`, vectorized) and calls
:func:`engine.merge.policy.resolve_key` for the keys with tombstones. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import MergeMode
from engine.merge.policy import LIVE, DeletePolicy, KeyState, resolve_key
from engine.merge.record_merger import dedupe_batch
from engine.schema import RECORD_KEY
from ingest.prepare import DELETE, KAFKA_PARTITION, OFFSET, OP, ORDERING, ORDERING_NULL, TOPIC

__all__ = ["POLICY", "Resolved", "arrival_order", "resolve"]

POLICY = DeletePolicy.REMEMBERED
"""The streaming sink's delete policy (:class:`engine.merge.policy.DeletePolicy`), for its write
tasks and its GLOBAL_STATE index alike: remembered deletes (the index keeps a deleted key's
ordering value, so that a late older version loses in a later batch too)."""


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


def resolve(rows: pa.Table, *, event_time: bool, stored: dict[str, Any] | None = None,
            decided: bool = False) -> Resolved:
    """Split ``rows`` (in arrival order; ops UPSERT and DELETE) into the winners per key.

    With ``event_time`` the rows need :data:`~ingest.prepare.ORDERING` and
    :data:`~ingest.prepare.ORDERING_NULL`. ``stored`` maps record keys to the ordering value
    of their live stored version (event time) or to None (live, commit time); it is needed
    for keys with tombstones only (a key with a tombstone and not in ``stored`` is taken as
    absent). A tombstone that deletes comes out with the deleted version's ordering value and
    ``ORDERING_NULL`` false. ``decided``: the rows were tagged by the global-state index,
    which applied these rules already (one row per key and file group); deletes are then
    written as given.
    """
    if not rows.num_rows:
        return _split(rows, np.zeros(0, bool))
    if decided:  # one row per key: its op says what to write
        return _split(rows, pc.equal(rows.column(OP), DELETE).to_numpy(zero_copy_only=False))
    is_delete = pc.equal(rows.column(OP), DELETE).to_numpy(zero_copy_only=False)
    if event_time:
        tomb = is_delete & rows.column(ORDERING_NULL).to_numpy(zero_copy_only=False)
    else:
        tomb = is_delete
    if not tomb.any():
        return _resolve_vectorized(rows, event_time=event_time)
    keys = rows.column(RECORD_KEY).combine_chunks()
    tomb_keys = pc.unique(keys.filter(pa.array(tomb)))
    in_tomb = pc.is_in(keys, value_set=tomb_keys).to_numpy(zero_copy_only=False)
    plain = _resolve_vectorized(rows.filter(pa.array(~in_tomb)), event_time=event_time)
    special = rows.filter(pa.array(in_tomb))
    picked, overrides = _resolve_per_key(special, event_time=event_time, stored=stored or {})
    chosen = special.take(pa.array(picked, pa.int64()))
    chosen_delete = pc.equal(chosen.column(OP), DELETE).to_numpy(zero_copy_only=False)
    if event_time and len(picked):
        ordering = chosen.column(ORDERING).combine_chunks()
        values = [overrides.get(i) for i in range(len(picked))]
        fixed = pa.array([v if v is not None else o for v, o in
                          zip(values, ordering.to_pylist(), strict=True)], ordering.type)
        chosen = chosen.set_column(chosen.schema.get_field_index(ORDERING), ORDERING, fixed)
        nulls = chosen.column(ORDERING_NULL).combine_chunks().to_pylist()
        chosen = chosen.set_column(
            chosen.schema.get_field_index(ORDERING_NULL), ORDERING_NULL,
            pa.array([n and values[i] is None for i, n in enumerate(nulls)], pa.bool_()))
    extra = _split(chosen, chosen_delete)
    return Resolved(pa.concat_tables([plain.upserts, extra.upserts]),
                    pa.concat_tables([plain.deletes, extra.deletes]))


def _resolve_per_key(rows: pa.Table, *, event_time: bool, stored: dict[str, Any]
                     ) -> tuple[list[int], dict[int, Any]]:
    """Winning row indices (and, by position in the result, tombstone orderings)."""
    keys = rows.column(RECORD_KEY).to_pylist()
    ops = rows.column(OP).to_pylist()
    orderings = rows.column(ORDERING).to_pylist() if event_time else [None] * len(ops)
    nulls = rows.column(ORDERING_NULL).to_pylist() if event_time else [True] * len(ops)
    by_key: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        by_key.setdefault(key, []).append(i)
    picked: list[tuple[int, Any]] = []
    for key, idx in by_key.items():
        state = KeyState(LIVE, stored[key]) if key in stored else KeyState()
        out = resolve_key([ops[i] == DELETE for i in idx], [orderings[i] for i in idx],
                          [nulls[i] for i in idx], event_time=event_time, policy=POLICY,
                          stored=state)
        if out.winner >= 0:
            picked.append((idx[out.winner], out.ordering))
    picked.sort(key=lambda p: p[0])
    return ([i for i, _ in picked],
            {n: o for n, (_, o) in enumerate(picked) if o is not None})


def _resolve_vectorized(rows: pa.Table, *, event_time: bool) -> Resolved:
    """Winners of keys without tombstones: the engine's in-batch combine
    (:func:`engine.merge.record_merger.dedupe_batch`) on :data:`~ingest.prepare.ORDERING` — the
    greatest (ordering, arrival) — or, without event time, the last."""
    if rows.num_rows > 1:
        mode = MergeMode.EVENT_TIME_ORDERING if event_time else MergeMode.COMMIT_TIME_ORDERING
        rows = dedupe_batch(rows, mode=mode, ordering_field=ORDERING if event_time else None)
    return _split(rows, pc.equal(rows.column(OP), DELETE).to_numpy(zero_copy_only=False))


def _split(rows: pa.Table, is_delete: np.ndarray) -> Resolved:
    mask = pa.array(np.asarray(is_delete, dtype=bool))
    return Resolved(rows.filter(pc.invert(mask)), rows.filter(mask))
