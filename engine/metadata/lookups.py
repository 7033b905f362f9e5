"""Lookups in the metadata table's index partitions, for readers and tagging: the merged
records of some keys in one partition, and the bloom filters ``bloom_filters`` holds for some
base files. The read side of the MDT (below the table view); what maintains those partitions
is :mod:`engine.metadata.bloom_filters` and its siblings, beside the write client."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from engine.format.bloom import BloomFilter
from engine.metadata import reader
from engine.metadata.keys import BLOOM_FILTERS, bloom_filter_key
from engine.metadata.records import BloomFilterInfo, MetadataRecord
from engine.metadata.table import MetadataTable
from engine.storage import Storage

if TYPE_CHECKING:
    from engine.timeline.active import Timeline


def lookup(storage: Storage, data_timeline: Timeline, partition: str,
           keys: Iterable[str]) -> tuple[dict[str, MetadataRecord], int]:
    """The merged records of ``keys`` in one index partition of the data table's MDT, as a
    reader of ``data_timeline`` sees it, and how many file groups were searched (each
    through :func:`engine.metadata.reader.lookup_slice`). Empty if the MDT is missing."""
    wanted = sorted(set(keys))
    mdt = MetadataTable(storage, data_timeline.config)
    if not wanted or not mdt.exists:
        return {}, 0
    slices = reader.latest_group_slices(mdt, mdt.timeline(), reader.validity(data_timeline),
                                        partition)
    if not slices:
        return {}, 0
    by_group = reader.route(wanted, len(slices))
    found: dict[str, MetadataRecord] = {}
    for index, group_keys in sorted(by_group.items()):
        # through the module, at call time (tests count the slices read)
        found.update(reader.lookup_slice(mdt.storage, slices[index], group_keys))
    return found, len(by_group)


def read_filters(storage: Storage, data_timeline: Timeline,
                 files: Iterable[tuple[str, str]]) -> tuple[dict[tuple[str, str], BloomFilter],
                                                            int]:
    """The bloom filters ``bloom_filters`` holds for ``files`` ((data partition, base file
    name) pairs) and the number of MDT file groups searched. Files without a live entry are
    left out (a caller reads their footers); a malformed entry counts as none."""
    wanted = {bloom_filter_key(p, name): (p, name) for p, name in files}
    records, groups = lookup(storage, data_timeline, BLOOM_FILTERS.name, wanted)
    out: dict[tuple[str, str], BloomFilter] = {}
    for key, record in records.items():
        info = record.payload
        if not isinstance(info, BloomFilterInfo) or info.is_deleted or not info.bloom_filter:
            continue
        try:
            out[wanted[key]] = BloomFilter.deserialize(info.bloom_filter.decode("ascii"),
                                                       info.type or None)
        except (ValueError, UnicodeDecodeError):
            continue
    return out, groups
