"""Simple and global-simple index: find existing record keys by reading them.

The index joins incoming keys with the keys stored in the latest file slices (base files
and, for merge-on-read, log blocks merged by key, so deleted keys are not found). SIMPLE
looks in the partitions of the incoming records; GLOBAL_SIMPLE looks everywhere, so a
record whose partition value changed is found in its old partition. Cost grows with the
data read, which is why the bucket index exists.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.layout.file_group import FileSlice
from engine.merge.policy import ordering_sort_key
from engine.read.slice_reader import SliceReader
from engine.schema import RECORD_KEY

LOCATION_SCHEMA = pa.schema([
    pa.field("key", pa.string()),
    pa.field("loc_partition", pa.string()),
    pa.field("loc_file_id", pa.string()),
])
ORDERING = "loc_ordering"


def key_locations(reader: SliceReader, slices: Iterable[FileSlice],
                  partitions: set[str] | None) -> pa.Table:
    """(key, partition, file id[, stored ordering value]) of every live key.

    Only the given partitions are read (None = all). With an ordering field, its stored
    value comes along as ``loc_ordering`` so the writer can drop updates that would lose.
    """
    tables = [slice_locations(reader, slc) for slc in slices
              if partitions is None or slc.partition_path in partitions]
    return concat_locations(tables)


def slice_locations(reader: SliceReader, slc: FileSlice) -> pa.Table:
    """:func:`key_locations` of one file slice: its live keys (base file and log blocks
    merged), read as the record key column and the ordering field only."""
    columns = [RECORD_KEY]
    ordering = reader.config.precombine_field
    if ordering:
        columns.append(ordering)
    part = reader.read_slice(slc, columns=columns)
    n = part.num_rows
    if not n:
        return LOCATION_SCHEMA.empty_table()
    columns_out = {
        "key": part.column(RECORD_KEY).combine_chunks().cast(pa.string()),
        "loc_partition": pa.array([slc.partition_path] * n, pa.string()),
        "loc_file_id": pa.array([slc.file_id] * n, pa.string()),
    }
    if ordering and ordering in part.column_names:
        columns_out[ORDERING] = part.column(ordering).combine_chunks()
    return pa.table(columns_out)


def concat_locations(tables: Iterable[pa.Table]) -> pa.Table:
    """Location tables of several slices as one (:data:`LOCATION_SCHEMA`, plus
    ``loc_ordering`` when any carries it)."""
    found = [t for t in tables if t.num_rows]
    if not found:
        return LOCATION_SCHEMA.empty_table()
    return pa.concat_tables(found, promote_options="permissive")


def tag(keys: pa.Array, partitions: pa.Array, locations: pa.Table,
        *, global_index: bool) -> pa.Table:
    """Every location of every incoming row's key: one output row per (input row, location).

    Returns ``row`` (the input row's index, ascending), ``loc_partition``, ``loc_file_id``
    and, when the locations carry it, ``loc_ordering``. A row whose key is not found appears
    once with null locations. A key stored in several file groups (two inserts of one
    key, or a SIMPLE table whose key lives in two partitions looked up globally) yields one
    row per file group, as Hudi's simple indexes tag a record once per location found, so
    the caller updates or deletes every copy. Locations repeated within one file group
    count once (the greatest stored ordering value is kept).
    """
    n = len(keys)
    rows = pa.array(np.arange(n, dtype=np.int64))
    if not locations.num_rows or not n:
        return pa.table({"row": rows, "loc_partition": pa.nulls(n, pa.string()),
                         "loc_file_id": pa.nulls(n, pa.string())})
    locations = _unique_locations(locations)
    incoming = pa.table({"key": keys, "part": partitions, "row": rows})
    wanted = ["row", "loc_partition", "loc_file_id"]
    if ORDERING in locations.column_names:
        wanted.append(ORDERING)
    if global_index:
        joined = incoming.join(locations, "key", join_type="left outer")
    else:
        joined = incoming.join(locations, ["key", "part"], ["key", "loc_partition"],
                               join_type="left outer", use_threads=True)
        joined = joined.append_column("loc_partition",
                                      pc.if_else(pc.is_null(joined.column("loc_file_id")),
                                                 pa.scalar(None, pa.string()),
                                                 joined.column("part")))
    joined = joined.sort_by([("row", "ascending"), ("loc_file_id", "ascending")])
    return joined.select(wanted).combine_chunks()


def _unique_locations(locations: pa.Table) -> pa.Table:
    """One row per (key, partition, file id); the greatest stored ordering value wins, in
    Java's order (:func:`engine.merge.policy.ordering_sort_key`; Arrow's ``max`` skips
    NaN)."""
    if pc.count_distinct(locations.column("key")).as_py() == locations.num_rows:
        return locations
    group = ["key", "loc_partition", "loc_file_id"]
    if ORDERING not in locations.column_names:
        return locations.group_by(group, use_threads=False).aggregate([])
    # the first non-null value of each group once sorted greatest first (nulls last)
    order = ordering_sort_key(locations.column(ORDERING))
    ordered = locations.append_column("__order", order).sort_by([("__order", "descending")])
    unique = ordered.group_by(group, use_threads=False).aggregate([(ORDERING, "first")])
    return unique.select([*group, f"{ORDERING}_first"]).rename_columns([*group, ORDERING])
