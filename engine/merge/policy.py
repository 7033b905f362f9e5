"""A new version of a key against the version the table stores: which one wins, and what a
delete means (the delete policy).

Readers merge whatever versions a file slice holds (:mod:`engine.merge.record_merger`); a
writer decides before that what it writes at all. Two writers of this repository decide it
differently on purpose, and say which way by naming a :class:`DeletePolicy`:

* the engine API (``Table.upsert`` and ``Table.delete``, through ``WriteClient``) writes
  **natural deletes**, as Java's ``DefaultHoodieRecordPayload``: a delete without an ordering
  value is written as a natural-order delete, which wins over every version written before
  it, and a key moving partitions has its old copy deleted that way; nothing remembers a
  deleted key but the table;
* the streaming sink and its GLOBAL_STATE index (``engine/merge/resolve.py`` under
  ``ingest/resolve.py``'s ``POLICY``,
  ``ingest/global_index.py``) write **remembered deletes**: a delete without an ordering value
  (a Kafka tombstone) deletes the live version *at that version's ordering value*, a moved key's
  old copy is deleted at its stored ordering value, and the index keeps a deleted key's
  ordering value, so a late version older than the deleted one loses in a later batch as it
  would in the same one.

Under both, with event time, a version wins over the stored one unless its ordering value is
lower (:func:`loses_to_stored`), and a delete that carries an ordering value competes like a
version. Without event time the later write wins and a delete removes a live key. The policies
and why the sink needs the second are in ``docs/engine.md`` ("Delete policies").

The rule is stated once, key by key (:func:`resolve_key`); the column-wise forms are derived
from it and tested against it: :func:`resolve_single` (keys with one version each) and
:func:`deciding_rows` (which one of a key's versions decides the key alone).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import IndexType, WriteConfig

__all__ = [
    "ABSENT",
    "DELETED",
    "KIND_CODES",
    "LIVE",
    "DeletePolicy",
    "KeyOutcome",
    "KeyState",
    "SingleOutcomes",
    "deciding_rows",
    "loses_to_stored",
    "ordering_sort_key",
    "ordering_ties",
    "resolve_key",
    "resolve_single",
    "stays_in_place",
    "update_partition_path",
]


class DeletePolicy(enum.Enum):
    """What a delete without an ordering value means, and whether a deleted key's ordering
    value outlives the delete (see the module doc)."""

    NATURAL = "natural"
    """A natural-order delete (Java's ``DefaultHoodieRecordPayload``): it wins over every
    version written before it; the deleted key is forgotten (but for the table)."""
    REMEMBERED = "remembered"
    """A delete at the live version's ordering value (nothing if the key is not live); the
    deleted key keeps that ordering value, so an older version arriving later loses."""

    def delete_ordering(self, stored: Any) -> Any:
        """The ordering value a delete that names none is written at, the key's stored one
        being ``stored`` (a value or an Arrow array): None (natural order) or ``stored``."""
        return stored if self is DeletePolicy.REMEMBERED else None

    @property
    def remembers_deletes(self) -> bool:
        """True when an index that outlives a batch keeps a deleted key's ordering value
        (event time), so that an older version arriving later loses to the delete."""
        return self is DeletePolicy.REMEMBERED


def ordering_sort_key(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Ordering values as an array that compares and sorts as Java's ``compareTo`` orders
    them, the order Hudi merges by (``DefaultHoodieRecordPayload``, the file-group reader's
    ``shouldKeepNewerRecord``). Floating values (``Double.compareTo``, ``Float.compareTo``):
    -inf < ... < -0.0 < 0.0 < ... < +inf < NaN, every NaN equal whatever its sign or payload
    (``doubleToLongBits`` makes them one), given as integers (the IEEE bits, those of
    negative numbers flipped but for the sign); other types as they are, in one chunk. Nulls
    stay null. For comparing and sorting only: what is stored and written keeps its values.

    hudi-rs 0.5.0 sorts floats by arrow-rs's ``total_cmp``: the same order but for NaN,
    which it orders by sign and payload (a negative-sign NaN lowest); NaN from Python, Spark
    or Java's arithmetic has the positive sign."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not pa.types.is_floating(values.type):
        return values
    floats = pc.fill_null(values, 0).to_numpy(zero_copy_only=False)
    floats = np.where(np.isnan(floats), floats.dtype.type(np.nan), floats)  # NaN canonical
    bits = floats.view(f"i{floats.itemsize}")
    key = np.where(bits < 0, bits ^ np.iinfo(bits.dtype).max, bits)
    nulls = values.is_null().to_numpy(zero_copy_only=False) if values.null_count else None
    return pa.array(key, mask=nulls)


def loses_to_stored(incoming: pa.Array | pa.ChunkedArray,
                    stored: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Where a version with ordering value ``incoming`` loses to the stored version's
    ``stored`` (event time): ``incoming`` is lower in Java's order
    (:func:`ordering_sort_key`: -0.0 below 0.0, NaN greater than every number and tied with
    NaN). Null on either side
    never loses; a tie goes to the incoming version (the later write). Both arrays must have
    one type."""
    return pc.fill_null(pc.less(ordering_sort_key(incoming), ordering_sort_key(stored)), False)


def update_partition_path(write_config: WriteConfig) -> bool:
    """Whether the writer's global index moves a record whose partition value changed (Hudi's
    ``shouldUpdatePartitionPath``): the ``hoodie.*.index.update.partition.path`` option of its
    index type (``HoodieIndexConfig``: SIMPLE for GLOBAL_SIMPLE, BLOOM for GLOBAL_BLOOM,
    RECORD for RECORD_INDEX); a partition-scoped index never finds a key elsewhere (True).
    What :func:`stays_in_place` takes as ``update_partition_path``."""
    return {IndexType.GLOBAL_SIMPLE: write_config.simple_update_partition_path,
            IndexType.GLOBAL_BLOOM: write_config.bloom_update_partition_path,
            IndexType.RECORD_INDEX: write_config.record_update_partition_path,
            }.get(write_config.index_type, True)


def stays_in_place(stored_partition: Any, partition: Any, *,
                   update_partition_path: bool = True) -> Any:
    """Where a new version of a live key updates the stored copy where it is: in the same
    partition, or always when the index keeps keys where they are (``update_partition_path``
    false: :func:`update_partition_path` of the writer, or the GLOBAL_STATE index's own
    setting). Elsewhere the key moves: the
    old copy is deleted (at :meth:`DeletePolicy.delete_ordering`) and the new version inserted
    into its own partition. Python values, numpy arrays or Arrow arrays, element-wise (a null
    partition never matches)."""
    if isinstance(partition, (pa.Array, pa.ChunkedArray)):
        if not update_partition_path:
            return pa.array(np.ones(len(partition), dtype=bool))
        return pc.fill_null(pc.equal(stored_partition, partition), False)
    if not update_partition_path:
        return np.ones(np.shape(partition), dtype=bool) if np.ndim(partition) else True
    return stored_partition == partition


def _loses(incoming: Any, stored: Any) -> bool:
    """:func:`loses_to_stored` for one pair of Python values."""
    if incoming is None or stored is None:
        return False
    if isinstance(incoming, (float, np.floating)) or isinstance(stored, (float, np.floating)):
        return _java_float_order(float(incoming)) < _java_float_order(float(stored))
    return bool(incoming < stored)


def ordering_ties(first: Any, second: Any) -> bool:
    """Whether two ordering values (Python values, not null) tie in Java's order, the one
    :func:`loses_to_stored` decides by: neither loses to the other (-0.0 and 0.0 do not tie;
    NaN ties with NaN). Where Hudi gives a tie to the later arrival."""
    return not _loses(first, second) and not _loses(second, first)


def _java_float_order(value: float) -> tuple[bool, float, float]:
    """One float in the order :func:`ordering_sort_key` gives, as a tuple that Python
    compares in that order: NaN above every number (all NaN one), then the value, then its
    sign (-0.0 below 0.0). A tuple and not the bits :func:`ordering_sort_key` gives: it
    compares ~20x faster than numpy on two values, and :func:`resolve_key` runs per
    version."""
    if value != value:
        return (True, 0.0, 1.0)
    return (False, value, math.copysign(1.0, value))


LIVE = "live"
DELETED = "deleted"
ABSENT = "absent"


@dataclass(frozen=True)
class KeyState:
    """What the table holds for a key: ``LIVE`` or ``DELETED`` at ``ordering``, or ``ABSENT``.

    ``ordering`` is None without event time (or when unknown, or for a natural-order
    delete)."""

    kind: str = ABSENT
    ordering: Any = None


@dataclass(frozen=True)
class KeyOutcome:
    """The result of one key's versions (:func:`resolve_key`)."""

    winner: int
    """Index of the version to write, or -1 when nothing is to be written."""
    ordering: Any
    """Ordering value the winner is written with (for a delete without one: the policy's
    :meth:`DeletePolicy.delete_ordering`)."""
    state: KeyState
    """What the table holds for the key afterwards."""


def resolve_key(deletes: Sequence[bool], orderings: Sequence[Any],
                ordering_null: Sequence[bool], *, event_time: bool, policy: DeletePolicy,
                stored: KeyState = KeyState()) -> KeyOutcome:
    """Apply one key's versions (in arrival order; ``deletes[i]`` true for a delete) to its
    stored state under ``policy``; see the module doc.

    ``orderings`` must be comparable with each other and with ``stored.ordering``. The winner
    is -1 when the final state is the stored one, or when the key ends deleted but was not
    live (nothing stored to delete).
    """
    state = stored
    winner, win_ordering = -1, None
    for i, delete in enumerate(deletes):
        if delete:
            if event_time and not ordering_null[i]:
                d = orderings[i]
                if not _loses(d, state.ordering):
                    state, winner, win_ordering = KeyState(DELETED, d), i, d
            elif state.kind == LIVE:  # a delete without ordering value (or without event time)
                at = policy.delete_ordering(state.ordering)
                state, winner, win_ordering = KeyState(DELETED, at), i, at
        else:
            r = orderings[i] if event_time else None
            if not event_time or not _loses(r, state.ordering):
                state, winner, win_ordering = KeyState(LIVE, r), i, r
    if state.kind != LIVE and stored.kind != LIVE:
        winner = -1
    return KeyOutcome(winner, win_ordering, state)


KIND_CODES = {ABSENT: 0, LIVE: 1, DELETED: 2}
"""The kinds of :class:`KeyState` as the codes :func:`resolve_single` takes and gives."""
_LIVE, _DELETED = KIND_CODES[LIVE], KIND_CODES[DELETED]


@dataclass(frozen=True)
class SingleOutcomes:
    """:class:`KeyOutcome` of many keys at once (:func:`resolve_single`), one entry a key."""

    winner: np.ndarray
    """True where the key's version is written."""
    ordering: pa.Array | None
    """Ordering value the winner is written with (event time; None without)."""
    kind: np.ndarray
    """:data:`KIND_CODES` of the state afterwards."""
    state_ordering: pa.Array | None
    """Ordering value of the state afterwards (event time; None without)."""


def resolve_single(deletes: np.ndarray, orderings: pa.Array | None, ordering_null: np.ndarray,
                   stored_kind: np.ndarray, stored_ordering: pa.Array | None, *,
                   event_time: bool, policy: DeletePolicy) -> SingleOutcomes:
    """:func:`resolve_key` for keys that have one version each, vectorized.

    ``deletes`` (true for a delete), ``orderings`` and ``ordering_null`` are the versions;
    ``stored_kind`` (:data:`KIND_CODES`) and ``stored_ordering`` the keys' stored states
    (orderings are used with ``event_time`` only, and must then have one type). With event
    time an upsert must carry an ordering value (:func:`resolve_key` cannot compare a null
    one with a stored value either).
    """
    is_delete = np.asarray(deletes, dtype=bool)
    live = stored_kind == _LIVE
    if not event_time:  # every version is natural: an upsert wins; a delete of a live key
        winner = ~is_delete | live
        kind = np.where(is_delete, np.where(live, _DELETED, stored_kind), _LIVE)
        return SingleOutcomes(winner, None, kind.astype(np.int8), None)
    assert orderings is not None and stored_ordering is not None
    newer = pc.invert(loses_to_stored(orderings, stored_ordering)).to_numpy(
        zero_copy_only=False)
    upsert_wins = ~is_delete & newer
    ordered_wins = is_delete & ~ordering_null & newer
    unordered_hits = is_delete & ordering_null & live  # at the policy's ordering value
    kind = np.where(upsert_wins, _LIVE,
                    np.where(ordered_wins | unordered_hits, _DELETED, stored_kind))
    takes_own = pa.array(upsert_wins | ordered_wins)
    at = policy.delete_ordering(stored_ordering)
    if at is None:
        at = pa.nulls(len(stored_ordering), stored_ordering.type)
    return SingleOutcomes(
        upsert_wins | ((ordered_wins | unordered_hits) & live),
        pc.if_else(pa.array(unordered_hits), at, orderings),
        kind.astype(np.int8),
        pc.if_else(takes_own, orderings, pc.if_else(pa.array(unordered_hits), at,
                                                     stored_ordering)))


def deciding_rows(starts: np.ndarray, ends: np.ndarray, deletes: np.ndarray,
                  orderings: pa.Array | pa.ChunkedArray | None,
                  ordering_null: np.ndarray | None, *, event_time: bool) -> np.ndarray:
    """Per key, the one version that decides it alone, column-wise: :func:`resolve_key` of
    that version against any stored state gives what all the key's versions give (the same
    state, but that without event time a deleted key and an absent one are alike: nothing
    keeps it), and the same winner; -1 where no single version is known to, for
    :func:`resolve_key` to judge the key.

    The rows are versions in arrival order, each key's one run: rows ``starts[k]`` to
    ``ends[k] - 1`` (the runs cover the rows, in order). ``deletes`` is true for a delete;
    ``orderings`` (one Arrow type) and ``ordering_null`` (true where a version has no
    ordering value; None: only ``orderings``' nulls) are read under ``event_time`` only.

    What :func:`resolve_key`'s walk through a key's versions comes to:

    * without event time, every version is natural: the last version if it is an upsert (it
      wins over anything before it); else the first delete after the last upsert — it deletes
      what is live before it (the stored copy, or the batch's upsert, which is then never
      written) and the deletes after it find nothing live;
    * under event time, for keys whose versions are all upserts with an ordering value (not
      null: there :func:`loses_to_stored` is a total order, Java's, :func:`ordering_sort_key`):
      the last of those with the highest value — each version wins over the state unless
      lower, so the greatest wins over the others, ties to the later, and it alone wins over
      the stored version exactly when they all would. Keys with deletes or null ordering
      values: -1 (a delete without ordering value, remembered, leaves a state no single
      version gives; a null value never loses, and nothing loses to it, so the walk is not a
      maximum).
    """
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    is_delete = np.asarray(deletes, dtype=bool)
    sizes = ends - starts
    if not event_time:
        upserts = np.where(is_delete, -1, np.arange(len(is_delete)))
        last_upsert = np.maximum.reduceat(upserts, starts) if len(starts) else starts
        return np.where(last_upsert == ends - 1, last_upsert,
                        np.maximum(last_upsert + 1, starts))
    assert orderings is not None
    at = starts.copy()
    several = np.flatnonzero(sizes > 1)  # a single version decides its key
    if not len(several):
        return at
    rows = np.flatnonzero(np.repeat(sizes > 1, sizes))  # the rows of those keys, in order
    key = np.repeat(np.arange(len(several)), sizes[several])
    ordering = orderings.take(pa.array(rows))
    if isinstance(ordering, pa.ChunkedArray):
        ordering = ordering.combine_chunks()
    unfit = is_delete[rows]
    if ordering_null is not None:
        unfit = unfit | np.asarray(ordering_null, dtype=bool)[rows]
    unfit |= ordering.is_null().to_numpy(zero_copy_only=False)
    # the greatest (ordering value, arrival) of each key: the last of its run once sorted
    order = pa.table({"k": key, "o": ordering_sort_key(ordering), "r": rows}).sort_by(
        [("k", "ascending"), ("o", "ascending"), ("r", "ascending")])
    at[several] = order.column("r").to_numpy()[np.cumsum(sizes[several]) - 1]
    unfit_key = np.zeros(len(several), dtype=bool)
    np.logical_or.at(unfit_key, key, unfit)
    at[several[unfit_key]] = -1
    return at
