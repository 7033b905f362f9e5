"""Bloom and global-bloom index: the simple index's lookup, reading only files that may hold
an incoming key.

BLOOM looks in the partitions of the incoming records, GLOBAL_BLOOM everywhere, as SIMPLE and
GLOBAL_SIMPLE do (:mod:`engine.index.simple`); what a key's location then means (an update in
place, or a move to another partition) is the write client's, the same for both families.

For the batch's keys, every file slice in scope that is a base file alone is pruned (Java
``HoodieBloomIndex``): by its min/max record key range (``hoodie.bloom.index.prune.by.ranges``),
then by its bloom filter. A slice left with candidate keys is read as the simple index reads
it (record key column, plus the ordering field when the table has one) and its keys are
matched exactly, so false positives cost a read, never a wrong location. A slice with log
files is read whole, as the simple index reads it: its log blocks may hold keys (updates,
deletes, inserts into log-only file groups) that the base file's filter does not describe.
A file whose range or filter is unknown (no footer key, no index entry, unreadable) is not
ruled out by it.

Where ranges and filters come from (:class:`MetadataSource`, ``hoodie.bloom.index.use.metadata``):
the footers of the base files by default; the metadata table's ``bloom_filters`` partition
for the filters and its ``column_stats`` partition (``_hoodie_record_key`` min/max) for the
ranges when the table keeps them — then no footer is opened, except for a file the partition
has no entry for. Footer ranges are in Java ``String`` order (Hudi writes them so); column
stats bounds in UTF-8 byte order (Parquet's), trusted only where the two orders agree.

So the locations are exactly those the simple index finds for these keys, and tagging
gives the same result for any input; only slices that cannot hold a key are left unread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.format.base_file import FooterKeys, read_footer_keys
from engine.format.bloom import BloomFilter
from engine.index.simple import concat_locations, slice_locations
from engine.layout.file_group import BaseFile, FileSlice
from engine.read.slice_reader import SliceReader
from engine.schema import RECORD_KEY
from engine.storage import Storage
from engine.timeline.active import Timeline

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BloomLookup:
    """What one lookup found and how much it read.

    ``locations`` is :func:`engine.index.simple.key_locations`'s table restricted to the
    looked-up keys. Of the ``slices`` in scope, ``with_logs`` were read whole; of the others,
    ``pruned_by_range`` were ruled out by their min/max keys, ``pruned_by_bloom`` by their
    bloom filter, and ``read`` were read to check their candidate keys. ``footers`` base
    file footers were opened, ``metadata_groups`` metadata-table file groups searched.
    """

    locations: pa.Table
    slices: int
    with_logs: int
    pruned_by_range: int
    pruned_by_bloom: int
    read: int
    footers: int = 0
    metadata_groups: int = 0


@dataclass(frozen=True)
class MetadataSource:
    """The metadata-table index partitions a lookup reads instead of footers: the data
    table's storage, the timeline its view was loaded from (which MDT instants it trusts),
    and which of ``bloom_filters`` / ``column_stats`` the table declares."""

    storage: Storage
    timeline: Timeline
    bloom_filters: bool
    column_stats: bool

    @classmethod
    def of(cls, storage: Storage, timeline: Timeline) -> MetadataSource | None:
        """The source for a table, None when it keeps neither partition."""
        from engine.metadata.keys import BLOOM_FILTERS, COLUMN_STATS
        from engine.metadata.table import declared_partitions

        declared = set(declared_partitions(storage))
        blooms, stats = BLOOM_FILTERS.name in declared, COLUMN_STATS.name in declared
        return cls(storage, timeline, blooms, stats) if blooms or stats else None


@dataclass(frozen=True)
class KeyRange:
    """A base file's min/max record key; ``java_order``: the bounds are in Java ``String``
    order (footers), else in UTF-8 byte order (column stats)."""

    low: str
    high: str
    java_order: bool = True


@dataclass
class _Reads:
    """Footers read once per lookup (ranges and filters may both need one), counted."""

    reader: SliceReader
    footers: int = 0
    metadata_groups: int = 0
    cache: dict[tuple[str, bool], FooterKeys] = field(default_factory=dict)

    def footer(self, base: BaseFile, *, with_bloom: bool) -> FooterKeys:
        for key in ((base.path, True), (base.path, with_bloom)):
            if key in self.cache:
                return self.cache[key]
        self.footers += 1
        try:
            with self.reader.storage.open_input(base.path, whole=False) as source:
                keys = read_footer_keys(source, with_bloom=with_bloom)
        except (OSError, ValueError):
            keys = FooterKeys(None, None, None)
        self.cache[(base.path, with_bloom)] = keys
        return keys


def key_locations(reader: SliceReader, slices: Iterable[FileSlice],
                  partitions: set[str] | None, keys: pa.Array, *,
                  prune_by_ranges: bool = True,
                  metadata: MetadataSource | None = None) -> BloomLookup:
    """(key, partition, file id[, stored ordering value]) of every live copy of ``keys``.

    Only slices in the given partitions are considered (None = all). ``keys`` are record
    key strings (duplicates and order do not matter). ``metadata``: the metadata-table
    partitions to take ranges and filters from (None: footers only).
    """
    wanted = pc.unique(keys.cast(pa.string()))
    java_order = _needs_java_order(wanted)
    utf16 = ([k.encode("utf-16-be", errors="surrogatepass") for k in wanted.to_pylist()]
             if java_order else None)
    tables = []
    counts = {"slices": 0, "with_logs": 0, "pruned_by_range": 0, "pruned_by_bloom": 0,
              "read": 0}
    bases: list[FileSlice] = []
    for slc in slices:
        if partitions is not None and slc.partition_path not in partitions:
            continue
        counts["slices"] += 1
        if slc.log_files or slc.base_file is None:
            counts["with_logs"] += 1
            tables.append(_matching(slice_locations(reader, slc), wanted))
        else:
            bases.append(slc)
    reads = _Reads(reader)
    survivors: list[tuple[FileSlice, pa.Array]] = []
    ranges = (key_ranges(reads, [s.base_file for s in bases if s.base_file], metadata)
              if prune_by_ranges else [None] * len(bases))
    for slc, key_range in zip(bases, ranges, strict=True):
        candidates = wanted
        if key_range is not None:
            inside = _inside(wanted, utf16, java_order, key_range)
            if inside is not None:
                if not inside.any():
                    counts["pruned_by_range"] += 1
                    continue
                candidates = wanted.filter(pa.array(inside))
        survivors.append((slc, candidates))
    filters = bloom_filters_of(reads, [s.base_file for s, _ in survivors if s.base_file],
                               metadata)
    for (slc, candidates), bloom in zip(survivors, filters, strict=True):
        if bloom is not None:
            maybe = bloom.might_contain_many(candidates)
            if not maybe.any():
                counts["pruned_by_bloom"] += 1
                continue
            candidates = candidates.filter(pa.array(maybe))
        counts["read"] += 1
        tables.append(_matching(slice_locations(reader, slc), candidates))
    lookup = BloomLookup(concat_locations(tables), **counts, footers=reads.footers,
                         metadata_groups=reads.metadata_groups)
    _log.debug("bloom index: %d keys, %d slices in scope: %d with logs read whole, "
               "%d pruned by key range, %d by bloom filter, %d base files read "
               "(%d footers, %d metadata file groups)",
               len(wanted), lookup.slices, lookup.with_logs, lookup.pruned_by_range,
               lookup.pruned_by_bloom, lookup.read, lookup.footers, lookup.metadata_groups)
    return lookup


def key_ranges(reads: _Reads, files: Sequence[BaseFile],
               metadata: MetadataSource | None) -> list[KeyRange | None]:
    """The min/max record key of each base file (None: unknown): from the metadata table's
    ``column_stats`` (``_hoodie_record_key``) when ``metadata`` has it, else, and for a file
    it has no entry for, from the file's footer."""
    found: dict[str, KeyRange] = {}
    if metadata is not None and metadata.column_stats and files:
        found, groups = _column_stats_ranges(metadata, files)
        reads.metadata_groups += groups
    out: list[KeyRange | None] = []
    for base in files:
        key_range = found.get(base.path)
        if key_range is None:
            footer = reads.footer(base, with_bloom=metadata is None or not metadata.bloom_filters)
            if footer.min_key is not None and footer.max_key is not None:
                key_range = KeyRange(footer.min_key, footer.max_key)
        out.append(key_range)
    return out


def bloom_filters_of(reads: _Reads, files: Sequence[BaseFile],
                     metadata: MetadataSource | None) -> list[BloomFilter | None]:
    """The bloom filter of each base file (None: none known): from the metadata table's
    ``bloom_filters`` when ``metadata`` has it, else, and for a file it has no entry for,
    from the file's footer."""
    found: dict[tuple[str, str], BloomFilter] = {}
    if metadata is not None and metadata.bloom_filters and files:
        from engine.metadata import lookups

        found, groups = lookups.read_filters(
            metadata.storage, metadata.timeline, [(b.partition_path, b.name) for b in files])
        reads.metadata_groups += groups
    return [found.get((b.partition_path, b.name)) or reads.footer(b, with_bloom=True).bloom
            for b in files]


def _column_stats_ranges(metadata: MetadataSource,
                         files: Sequence[BaseFile]) -> tuple[dict[str, KeyRange], int]:
    """Record-key ranges from ``column_stats`` by base file path, and the MDT file groups
    searched; files without a live string entry are left out."""
    from engine.metadata import lookups
    from engine.metadata.keys import COLUMN_STATS, column_stats_key
    from engine.metadata.records import ColumnStats

    by_key = {column_stats_key(RECORD_KEY, b.partition_path, b.name): b.path for b in files}
    records, groups = lookups.lookup(metadata.storage, metadata.timeline,
                                     COLUMN_STATS.name, by_key)
    out: dict[str, KeyRange] = {}
    for key, record in records.items():
        stats = record.payload
        if (not isinstance(stats, ColumnStats) or stats.is_deleted or stats.min_value is None
                or stats.max_value is None or stats.min_value[0] != "StringWrapper"
                or stats.max_value[0] != "StringWrapper"):
            continue
        out[by_key[key]] = KeyRange(str(stats.min_value[1]), str(stats.max_value[1]),
                                    java_order=False)
    return out, groups


def _inside(keys: pa.Array, utf16: list[bytes] | None, java_order: bool,
            key_range: KeyRange) -> np.ndarray | None:
    """Which ``keys`` lie in the range (None: the range rules nothing out)."""
    if key_range.java_order:
        return _within(keys, utf16, key_range.low, key_range.high)
    # Byte-order bounds: exact where UTF-8 and UTF-16 orders agree; where they may not
    # (a character from U+E000 up on either side), whichever order the bounds were
    # computed in, they are not trusted.
    if java_order or max(key_range.low + key_range.high, default="\0") >= "\ue000":
        return None
    inside = pc.and_(pc.greater_equal(keys, key_range.low),
                     pc.less_equal(keys, key_range.high))
    return np.asarray(inside.to_numpy(zero_copy_only=False), dtype=bool)


def _matching(locations: pa.Table, keys: pa.Array) -> pa.Table:
    if not locations.num_rows:
        return locations
    return locations.filter(pc.is_in(locations.column("key"), value_set=keys))


def _needs_java_order(keys: pa.Array) -> bool:
    """Whether UTF-8 byte order may differ from Java's ``String`` order (UTF-16 code units)
    for these keys: only a character from U+E000 up (UTF-8 lead byte EE..F4) can make it."""
    data = keys.buffers()[2] if len(keys) else None
    return data is not None and bool(np.any(np.frombuffer(data, dtype=np.uint8) >= 0xEE))


def _within(keys: pa.Array, utf16: list[bytes] | None, low: str, high: str) -> np.ndarray:
    """Which ``keys`` lie in ``[low, high]`` in Java ``String`` order (``utf16``: the keys
    as UTF-16-BE bytes when UTF-8 order may differ, else None)."""
    if utf16 is None and max(low + high, default="\0") < "\ue000":
        inside = pc.and_(pc.greater_equal(keys, low), pc.less_equal(keys, high))
        return np.asarray(inside.to_numpy(zero_copy_only=False), dtype=bool)
    codes = utf16 if utf16 is not None else [
        k.encode("utf-16-be", errors="surrogatepass") for k in keys.to_pylist()]
    lo = low.encode("utf-16-be", errors="surrogatepass")
    hi = high.encode("utf-16-be", errors="surrogatepass")
    return np.fromiter((lo <= c <= hi for c in codes), dtype=bool, count=len(codes))
