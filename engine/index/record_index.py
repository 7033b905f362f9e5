"""Record index (``hoodie.index.type=RECORD_INDEX``, RFC-08): a global index whose key
locations come from the metadata table's ``record_index`` partition
(:mod:`engine.metadata.record_index`) instead of reading the data.

The lookup is the only part of its own: the batch's keys are routed to the record_index file
groups they hash to, and only those groups are read (a base HFile through its block index,
the group's logs whole). The result is the simple index's location table, so what a location
means — an update in place, a move to another partition, an insert — is the write client's,
the same code as GLOBAL_SIMPLE (:meth:`engine.write.write_client.WriteClient._tag_updates`).

Under event-time ordering the write client drops updates that lose to the stored version,
which needs the stored ordering value: the file groups the index located are then read for
those keys only (key and ordering columns), as Hudi's global indexes read the located
records before a partition move.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from engine.index.simple import ORDERING, concat_locations, key_locations
from engine.layout.file_group import FileSlice
from engine.metadata import record_index as rli
from engine.read.reader import SliceReader
from engine.schema import RECORD_KEY

_log = logging.getLogger(__name__)


def locations(reader: SliceReader, slices: Iterable[FileSlice], keys: pa.Array, *,
              with_ordering: bool) -> pa.Table:
    """(key, partition, file id[, stored ordering value]) of every key of ``keys`` the table
    holds, among the live ``slices``. A table that does not declare the partition complete
    (being rebuilt) is searched as GLOBAL_SIMPLE searches it."""
    live = {(s.partition_path, s.file_id): s for s in slices}
    storage = reader.storage
    if not rli.is_kept(storage):
        _log.warning("%s: the record_index partition is not complete; looking keys up by "
                     "reading the table (GLOBAL_SIMPLE)", storage.base_path)
        found = key_locations(reader, live.values(), None)
        return found.filter(pc.is_in(found.column("key"), value_set=keys.cast(pa.string())))
    lookup = rli.lookup_locations(storage, reader.timeline, keys)
    return attach_orderings(reader, live, lookup.locations, with_ordering=with_ordering)


def attach_orderings(reader: SliceReader, live: dict[tuple[str, str], FileSlice],
                     found: pa.Table, *, with_ordering: bool) -> pa.Table:
    """``found`` (record_index locations) restricted to the live groups, with
    ``loc_ordering`` read from them when ``with_ordering``."""
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
    ordering = reader.config.precombine_field
    if not with_ordering or not ordering or not found.num_rows:
        return found
    tables = []
    by_group: dict[tuple[str, str], list[str]] = {}
    for key, part, fid in zip(found.column("key").to_pylist(),
                              found.column("loc_partition").to_pylist(),
                              found.column("loc_file_id").to_pylist(), strict=True):
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
