"""Looking record keys up in the metadata table's ``record_index`` partition: the read side
of the record-level index (RFC-08), below the table view; :mod:`engine.metadata.record_index`
maintains the partition beside the write client.

The ``RECORD_INDEX`` index (:func:`lookup_locations`) routes a batch's keys to the MDT file
groups they hash to and reads only those groups (:func:`engine.metadata.reader.lookup_values`:
the base HFile through its block index). :func:`group_slices` and :func:`lookup_in_groups`
are the same lookup split for executor tasks (the slices listed on the driver, the groups
read in the task). Key-equality filters of a snapshot read ask it through
:func:`engine.read.skipping.groups_holding`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from engine.errors import CorruptTableError
from engine.metadata.keys import RECORD_INDEX as RECORD_INDEX_TYPE
from engine.metadata.reader import GroupSlice, latest_group_slices, lookup_values, route, validity
from engine.metadata.records import RecordIndexInfo, decode_metadata_value
from engine.metadata.table import MetadataTable, declared_partitions, snapshot_metadata_timeline
from engine.storage import Storage

if TYPE_CHECKING:
    from engine.config import TableConfig
    from engine.timeline.active import Timeline

RECORD_INDEX = RECORD_INDEX_TYPE.name

LOCATION_SCHEMA = pa.schema([
    pa.field("key", pa.string()),
    pa.field("loc_partition", pa.string()),
    pa.field("loc_file_id", pa.string()),
])
"""What a lookup returns: the simple index's location table
(:data:`engine.index.simple.LOCATION_SCHEMA`)."""



def record_keys(values: pa.Array | pa.ChunkedArray) -> set[str]:
    """The distinct keys of a key column (dictionary-encoded or chunked alike)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.cast(pa.string())
    return set(values.to_pylist())


# -- looking keys up -------------------------------------------------------------------------

def is_kept(storage: Storage) -> bool:
    """Whether the table declares the partition complete (lookups may trust it)."""
    return RECORD_INDEX in declared_partitions(storage)


def group_slices(storage: Storage, data_timeline: Timeline) -> list[GroupSlice]:
    """The latest slice of every record_index file group trusted against ``data_timeline``,
    in file id order (their count is the routing modulus). Driver side; picklable."""
    mdt_timeline = snapshot_metadata_timeline(data_timeline)
    if mdt_timeline is None:
        return []
    mdt = MetadataTable(storage, data_timeline.config)
    return latest_group_slices(mdt, mdt_timeline, validity(data_timeline), RECORD_INDEX)


def lookup_group(mdt_storage: Storage, piece: GroupSlice, keys: Iterable[str], *,
                 cache_bytes: int = 0) -> pa.Table:
    """Locations of ``keys`` (all routed to ``piece``'s group) found in that group.
    Executor-safe: ``mdt_storage`` is rooted at ``.hoodie/metadata``.

    Entries are read as value bytes (:func:`~engine.metadata.reader.lookup_values`) and each
    distinct value is decoded once: every key of one data file group shares its value.
    ``cache_bytes``: the HFile key indexes the process may keep for the next lookup
    (``tidelake.metadata.record.index.cache.bytes``; 0: none, every block read afresh)."""
    found = lookup_values(mdt_storage, piece, sorted({k.encode("utf-8") for k in keys}),
                          cache_bytes=cache_bytes)
    where: dict[bytes, tuple[str, str]] = {}
    rows, parts, files = [], [], []
    for row, value in found.items():
        if value is None:
            continue
        location = where.get(value)
        if location is None:
            info = decode_metadata_value(row, value).payload
            if not isinstance(info, RecordIndexInfo):
                raise CorruptTableError(f"record_index group {piece.file_id} holds a "
                                        f"{type(info).__name__} entry for {row!r}")
            location = where[value] = (info.partition_name or "", info.location_file_id)
        rows.append(row)
        parts.append(location[0])
        files.append(location[1])
    return pa.table([pa.array(rows, pa.binary()).cast(pa.string()),
                     pa.array(parts, pa.string()), pa.array(files, pa.string())],
                    schema=LOCATION_SCHEMA)


@dataclass(frozen=True)
class Lookup:
    """What one lookup found, and which record_index file groups it read."""

    locations: pa.Table
    groups_read: tuple[str, ...]
    groups: int


def lookup_locations(storage: Storage, data_timeline: Timeline,
                     keys: pa.Array | pa.ChunkedArray, *, cache_bytes: int = 0) -> Lookup:
    """Where each of ``keys`` lives, per the record_index trusted against ``data_timeline``:
    only the file groups the keys hash to are read (``cache_bytes``: :func:`lookup_group`).
    Driver side (:func:`lookup_in_groups` over :func:`group_slices`)."""
    return lookup_in_groups(storage, data_timeline.config,
                            group_slices(storage, data_timeline), keys, cache_bytes=cache_bytes)


def lookup_in_groups(storage: Storage, config: TableConfig, pieces: Sequence[GroupSlice],
                     keys: pa.Array | pa.ChunkedArray, *, cache_bytes: int = 0) -> Lookup:
    """Where each of ``keys`` lives among the record_index file groups ``pieces`` (all of
    the partition's, :func:`group_slices`: their count is the routing modulus): each key is
    routed to its group and only the groups keys hash to are read, by :func:`lookup_group`.
    Executor-safe (the streaming job's tagging tasks call it with the driver's ``pieces``)."""
    wanted = sorted(record_keys(keys))
    if not pieces or not wanted:
        return Lookup(LOCATION_SCHEMA.empty_table(), (), len(pieces))
    mdt_storage = MetadataTable(storage, config).storage
    tables = []
    read = []
    for index, group_keys in sorted(route(wanted, len(pieces)).items()):
        piece = pieces[index]
        read.append(piece.file_id)
        tables.append(lookup_group(mdt_storage, piece, group_keys, cache_bytes=cache_bytes))
    return Lookup(pa.concat_tables(tables), tuple(read), len(pieces))
