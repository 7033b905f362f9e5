"""A batch's versions of keys against what the table stores: one version per record key,
upserts and deletes together, under a delete policy.

A micro-batch may hold several versions of a key — updates, marker deletes, tombstones. As
Hudi's in-batch combine does, only one version per key is written. The rule is
:mod:`engine.merge.policy`'s, under a :class:`~engine.merge.policy.DeletePolicy` (the streaming
sink's is *remembered deletes*: ``docs/ingest.md``, "Deletes"; ``docs/engine.md``, "Delete
policies"), applied to the versions in arrival order, starting from what the table holds for
the key (live at ordering value *o*, deleted at *o*, or absent):

* an upsert with ordering value *r* wins unless *r* < *o* (it is then late and dropped);
  the key is live at *r*;
* a marker delete (``_hoodie_is_deleted``) with ordering value *d* wins unless *d* < *o*;
  the key is deleted at *d*;
* a tombstone (no ordering value) deletes the key if it is live, *at its ordering value o*
  (remembered deletes); otherwise it changes nothing.

So a tombstone is written as a delete carrying the ordering value of the version it removes,
never as a natural-order delete: a later version older than the deleted one loses to it in
every reader (Java, hudi-rs and ours agree on ordered deletes, while they read natural-order
deletes differently depending on which versions sit in base and log files), and the result
does not depend on where micro-batches are cut. Without event time (commit-time ordering)
every version is *natural*: the last one wins, and a delete of a key that is not live
changes nothing.

"Earlier" and "later" are positions in arrival order, which the caller fixes (the streaming
sink sorts on topic, Kafka partition and offset — the real order within a Kafka partition,
and the same order whenever a batch is replayed).

The versions are rows with the columns a :class:`VersionColumns` names: the record key, an
operation code (upsert or delete), an ordering value in its comparable form
(:func:`ordering_column`: timestamps and dates as integers) and whether the version has
none. :func:`resolve` combines the keys without tombstones as the engine combines a batch
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

__all__ = ["Resolved", "VersionColumns", "field_ordering", "ordering_column",
           "ordering_column_type", "resolve", "tombstone_keys"]


# --- ordering values in their comparable form ------------------------------------------------


def ordering_column_type(arrow_type: pa.DataType) -> pa.DataType:
    """Type of the comparable ordering column for an ordering field of ``arrow_type``
    (timestamps and dates as int64)."""
    if pa.types.is_timestamp(arrow_type) or pa.types.is_date(arrow_type):
        return pa.int64()
    return arrow_type


def ordering_column(values: pa.Array, arrow_type: pa.DataType) -> pa.Array:
    """Ordering field values (of ``arrow_type``) in their comparable form: timestamps as
    microseconds, dates as days (int64), other types as they are."""
    if pa.types.is_timestamp(arrow_type):
        return values.cast(arrow_type).cast(pa.timestamp("us", tz=arrow_type.tz)) \
            .cast(pa.int64())
    if pa.types.is_date(arrow_type):
        return values.cast(arrow_type).cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
    return values.cast(arrow_type)


def field_ordering(values: pa.Array, arrow_type: pa.DataType) -> pa.Array:
    """Comparable ordering values back as the ordering field's type (inverse of
    :func:`ordering_column`)."""
    if pa.types.is_timestamp(arrow_type):
        return values.cast(pa.int64()).cast(pa.timestamp("us", tz=arrow_type.tz)) \
            .cast(arrow_type)
    if pa.types.is_date(arrow_type):
        return values.cast(pa.int32()).cast(pa.date32()).cast(arrow_type)
    return values if values.type.equals(arrow_type) else values.cast(arrow_type)


# --- versions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class VersionColumns:
    """Where a table of versions keeps what :func:`resolve` reads (besides the record key,
    :data:`engine.schema.RECORD_KEY`); picklable."""

    op: str
    """Operation code column: :attr:`delete` for a delete, anything else an upsert (rows that
    are neither must be left out)."""
    delete: int
    ordering: str
    """The ordering value in its comparable form (:func:`ordering_column`); used with event
    time only."""
    ordering_null: str
    """True where the version has no ordering value (a tombstone, when a delete)."""


@dataclass(frozen=True)
class Resolved:
    """The winning version of every key: data rows to write and deletes to write."""

    upserts: pa.Table
    deletes: pa.Table


def _tombstones(rows: pa.Table, columns: VersionColumns, event_time: bool) -> pa.Array:
    """Where a row is a delete without an ordering value (every delete without event time)."""
    deletes = pc.equal(rows.column(columns.op), columns.delete)
    if event_time:
        deletes = pc.and_(deletes, rows.column(columns.ordering_null))
    return deletes


def tombstone_keys(rows: pa.Table, columns: VersionColumns, *, event_time: bool) -> pa.Array:
    """Record keys of the deletes without an ordering value (tombstones) among ``rows``: the
    keys :func:`resolve` needs the stored state of."""
    tomb = _tombstones(rows, columns, event_time)
    return pc.unique(rows.column(RECORD_KEY).filter(tomb).combine_chunks())


def resolve(rows: pa.Table, *, columns: VersionColumns, event_time: bool,
            policy: DeletePolicy, stored: dict[str, Any] | None = None,
            decided: bool = False) -> Resolved:
    """Split ``rows`` (in arrival order; ops upsert and delete) into the winners per key.

    With ``event_time`` the rows need the ordering and ordering-null columns. ``stored`` maps
    record keys to the ordering value of their live stored version (event time, in the
    comparable form) or to None (live, commit time); it is needed for keys with tombstones
    only (a key with a tombstone and not in ``stored`` is taken as absent). A tombstone that
    deletes comes out with the ordering value ``policy`` gives it and ordering-null false
    when that is a value. ``decided``: an index applied these rules already (one row per key
    and file group); deletes are then written as given.
    """
    op = columns.op
    if not rows.num_rows:
        return _split(rows, np.zeros(0, bool))
    if decided:  # one row per key: its op says what to write
        return _split(rows, pc.equal(rows.column(op), columns.delete)
                      .to_numpy(zero_copy_only=False))
    is_delete = pc.equal(rows.column(op), columns.delete).to_numpy(zero_copy_only=False)
    if event_time:
        tomb = is_delete & rows.column(columns.ordering_null).to_numpy(zero_copy_only=False)
    else:
        tomb = is_delete
    if not tomb.any():
        return _resolve_vectorized(rows, columns=columns, event_time=event_time)
    keys = rows.column(RECORD_KEY).combine_chunks()
    tomb_keys = pc.unique(keys.filter(pa.array(tomb)))
    in_tomb = pc.is_in(keys, value_set=tomb_keys).to_numpy(zero_copy_only=False)
    plain = _resolve_vectorized(rows.filter(pa.array(~in_tomb)), columns=columns,
                                event_time=event_time)
    special = rows.filter(pa.array(in_tomb))
    picked, overrides = _resolve_per_key(special, columns=columns, event_time=event_time,
                                         policy=policy, stored=stored or {})
    chosen = special.take(pa.array(picked, pa.int64()))
    chosen_delete = pc.equal(chosen.column(op), columns.delete).to_numpy(zero_copy_only=False)
    if event_time and len(picked):
        ordering_name, null_name = columns.ordering, columns.ordering_null
        ordering = chosen.column(ordering_name).combine_chunks()
        values = [overrides.get(i) for i in range(len(picked))]
        fixed = pa.array([v if v is not None else o for v, o in
                          zip(values, ordering.to_pylist(), strict=True)], ordering.type)
        chosen = chosen.set_column(chosen.schema.get_field_index(ordering_name), ordering_name,
                                   fixed)
        nulls = chosen.column(null_name).combine_chunks().to_pylist()
        chosen = chosen.set_column(
            chosen.schema.get_field_index(null_name), null_name,
            pa.array([n and values[i] is None for i, n in enumerate(nulls)], pa.bool_()))
    extra = _split(chosen, chosen_delete)
    return Resolved(pa.concat_tables([plain.upserts, extra.upserts]),
                    pa.concat_tables([plain.deletes, extra.deletes]))


def _resolve_per_key(rows: pa.Table, *, columns: VersionColumns, event_time: bool,
                     policy: DeletePolicy, stored: dict[str, Any]
                     ) -> tuple[list[int], dict[int, Any]]:
    """Winning row indices (and, by position in the result, tombstone orderings)."""
    keys = rows.column(RECORD_KEY).to_pylist()
    ops = rows.column(columns.op).to_pylist()
    orderings = (rows.column(columns.ordering).to_pylist() if event_time
                 else [None] * len(ops))
    nulls = (rows.column(columns.ordering_null).to_pylist() if event_time
             else [True] * len(ops))
    by_key: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        by_key.setdefault(key, []).append(i)
    picked: list[tuple[int, Any]] = []
    for key, idx in by_key.items():
        state = KeyState(LIVE, stored[key]) if key in stored else KeyState()
        out = resolve_key([ops[i] == columns.delete for i in idx], [orderings[i] for i in idx],
                          [nulls[i] for i in idx], event_time=event_time, policy=policy,
                          stored=state)
        if out.winner >= 0:
            picked.append((idx[out.winner], out.ordering))
    picked.sort(key=lambda p: p[0])
    return ([i for i, _ in picked],
            {n: o for n, (_, o) in enumerate(picked) if o is not None})


def _resolve_vectorized(rows: pa.Table, *, columns: VersionColumns, event_time: bool
                        ) -> Resolved:
    """Winners of keys without tombstones: the engine's in-batch combine
    (:func:`engine.merge.record_merger.dedupe_batch`) on the ordering column — the greatest
    (ordering, arrival) — or, without event time, the last."""
    if rows.num_rows > 1:
        mode = MergeMode.EVENT_TIME_ORDERING if event_time else MergeMode.COMMIT_TIME_ORDERING
        rows = dedupe_batch(rows, mode=mode,
                            ordering_field=columns.ordering if event_time else None)
    return _split(rows, pc.equal(rows.column(columns.op), columns.delete)
                  .to_numpy(zero_copy_only=False))


def _split(rows: pa.Table, is_delete: np.ndarray) -> Resolved:
    mask = pa.array(np.asarray(is_delete, dtype=bool))
    return Resolved(rows.filter(pc.invert(mask)), rows.filter(mask))
