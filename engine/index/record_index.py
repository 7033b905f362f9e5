"""Record index (``hoodie.index.type=RECORD_INDEX``, RFC-08): a global index whose key
locations come from the metadata table's ``record_index`` partition
(:mod:`engine.metadata.record_index`) instead of reading the data.

The lookup is the only part of its own: the batch's keys are routed to the record_index file
groups they hash to, and only those groups are read (a base HFile through its block index,
the group's logs whole). The result is the simple index's location table, so what a location
means — an update in place, a move to another partition, an insert — is the write client's,
the same code as GLOBAL_SIMPLE (:meth:`engine.index.tagging.Tagger.tag_updates`).

Under event-time ordering a key that moves to another partition is compared with its stored
version before its old copy is deleted (a move that loses writes nothing), which needs the
stored ordering value: the file groups the index located are read for those keys only (key
and ordering columns), as Hudi's global indexes read the located records of a partition
update (``mergeForPartitionUpdatesIfNeeded``). An update in place is written without
reading the stored record: if it loses, every merge keeps the stored version (its row and
commit time whole), as with a bucket index, so its cost does not grow with the table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.index.simple import ORDERING, concat_locations, key_locations
from engine.layout.file_group import FileSlice
from engine.merge.policy import stays_in_place
from engine.metadata import record_index_lookup as rli
from engine.read.slice_reader import SliceReader
from engine.schema import RECORD_KEY

_log = logging.getLogger(__name__)


def locations(reader: SliceReader, slices: Iterable[FileSlice], keys: pa.Array, *,
              partitions: pa.Array | None = None,
              update_partition_path: bool = True, cache_bytes: int = 0) -> pa.Table:
    """(key, partition, file id[, stored ordering value]) of every key of ``keys`` the table
    holds, among the live ``slices``. With ``partitions`` (event time: the partition each
    key is written to, aligned with ``keys``), the stored ordering value comes along for the
    keys that move to another partition (:func:`moving`, under ``update_partition_path``). A
    table that does not declare the
    partition complete (being rebuilt) is searched as GLOBAL_SIMPLE searches it.
    ``cache_bytes``: the record_index key indexes the process may keep
    (:func:`engine.metadata.record_index_lookup.lookup_group`)."""
    live = {(s.partition_path, s.file_id): s for s in slices}
    storage = reader.storage
    if not rli.is_kept(storage):
        _log.warning("%s: the record_index partition is not complete; looking keys up by "
                     "reading the table (GLOBAL_SIMPLE)", storage.base_path)
        found = key_locations(reader, live.values(), None)
        return found.filter(pc.is_in(found.column("key"), value_set=keys.cast(pa.string())))
    found = rli.lookup_locations(storage, reader.timeline, keys,
                                 cache_bytes=cache_bytes).locations
    read = (moving(found, keys, partitions, update_partition_path=update_partition_path)
            if partitions is not None else None)
    return attach_orderings(reader, live, found, read=read)


def moving(found: pa.Table, keys: pa.Array, partitions: pa.Array, *,
           update_partition_path: bool = True) -> pa.Array:
    """Where a location of ``found`` is left by its key: one of its incoming versions
    (``keys`` with their ``partitions``) is written to another partition
    (:func:`engine.merge.policy.stays_in_place`; never when the index keeps keys where they
    are, ``update_partition_path`` false)."""
    n = found.num_rows
    if not n:
        return pa.array([], pa.bool_())
    located = pa.table({"key": found.column("key"), "_from": found.column("loc_partition"),
                        "_row": pa.array(np.arange(n, dtype=np.int64))})
    incoming = pa.table({"key": keys.cast(pa.string()), "_to": partitions.cast(pa.string())})
    joined = located.join(incoming, "key")
    leaves = pc.invert(stays_in_place(joined.column("_from"), joined.column("_to"),
                                      update_partition_path=update_partition_path))
    mask = np.zeros(n, dtype=bool)
    mask[joined.column("_row").filter(leaves).to_numpy(zero_copy_only=False)] = True
    return pa.array(mask)


def attach_orderings(reader: SliceReader, live: dict[tuple[str, str], FileSlice],
                     found: pa.Table, *, read: pa.Array | None) -> pa.Table:
    """``found`` (record_index locations) restricted to the live groups, with
    ``loc_ordering`` read from them where ``read`` (a mask over ``found``) holds; the rows
    read come back only if their slice still holds the key. ``read`` None or no ordering
    field: nothing is read."""
    if not found.num_rows:
        return found
    groups = list(zip(found.column("loc_partition").to_pylist(),
                      found.column("loc_file_id").to_pylist(), strict=True))
    known = pa.array([g in live for g in groups])
    if not pc.all(known).as_py():
        stray = groups[known.to_pylist().index(False)]
        _log.warning("record_index points keys at file group %s/%s, which the table does not "
                     "have: they are treated as new", *stray)
        found = found.filter(known)
        if read is not None:
            read = read.filter(known)
    ordering = reader.config.precombine_field
    if read is None or not ordering or not found.num_rows or not pc.any(read).as_py():
        return found
    wanted = found.filter(read)
    tables = [found.filter(pc.invert(read))]
    by_group: dict[tuple[str, str], list[str]] = {}
    for key, part, fid in zip(wanted.column("key").to_pylist(),
                              wanted.column("loc_partition").to_pylist(),
                              wanted.column("loc_file_id").to_pylist(), strict=True):
        by_group.setdefault((part, fid), []).append(key)
    for group, keys in sorted(by_group.items()):
        part = reader.read_slice(live[group], columns=[RECORD_KEY, ordering],
                                 keys=pa.array(keys, pa.string()))
        if not part.num_rows or ordering not in part.column_names:
            continue
        n = part.num_rows
        tables.append(pa.table({
            "key": part.column(RECORD_KEY).combine_chunks().cast(pa.string()),
            "loc_partition": pa.array([group[0]] * n, pa.string()),
            "loc_file_id": pa.array([group[1]] * n, pa.string()),
            ORDERING: part.column(ordering).combine_chunks()}))
    return concat_locations(tables)
