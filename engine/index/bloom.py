"""Bloom and global-bloom index: the simple index's lookup, reading only files that may hold
an incoming key.

BLOOM looks in the partitions of the incoming records, GLOBAL_BLOOM everywhere, as SIMPLE and
GLOBAL_SIMPLE do (:mod:`engine.index.simple`); what a key's location then means (an update in
place, or a move to another partition) is the write client's, the same for both families.

For the batch's keys, every file slice in scope that is a base file alone is pruned by its
footer (Java ``HoodieBloomIndex``): the min/max record key range (in Java ``String`` order,
``hoodie.bloom.index.prune.by.ranges``), then the bloom filter. A slice left with candidate
keys is read as the simple index reads it (record key column, plus the ordering field when
the table has one) and its keys are matched exactly, so false positives cost a read, never a
wrong location. A slice with log files is read whole, as the simple index reads it: its log
blocks may hold keys (updates, deletes, inserts into log-only file groups) that the base
file's footer does not describe. A footer without min/max keys or a filter, or one that
cannot be read, rules nothing out.

So the locations are exactly those the simple index finds for these keys, and tagging
gives the same result for any input; only slices that cannot hold a key are left unread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.format.base_file import FooterKeys, read_footer_keys
from engine.index.simple import concat_locations, slice_locations
from engine.layout.file_group import FileSlice
from engine.read.reader import SliceReader

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BloomLookup:
    """What one lookup found and how much it read.

    ``locations`` is :func:`engine.index.simple.key_locations`'s table restricted to the
    looked-up keys. Of the ``slices`` in scope, ``with_logs`` were read whole; of the others,
    ``pruned_by_range`` were ruled out by their min/max keys, ``pruned_by_bloom`` by their
    bloom filter, and ``read`` were read to check their candidate keys.
    """

    locations: pa.Table
    slices: int
    with_logs: int
    pruned_by_range: int
    pruned_by_bloom: int
    read: int


def key_locations(reader: SliceReader, slices: Iterable[FileSlice],
                  partitions: set[str] | None, keys: pa.Array, *,
                  prune_by_ranges: bool = True) -> BloomLookup:
    """(key, partition, file id[, stored ordering value]) of every live copy of ``keys``.

    Only slices in the given partitions are considered (None = all). ``keys`` are record
    key strings (duplicates and order do not matter).
    """
    wanted = pc.unique(keys.cast(pa.string()))
    java_order = _needs_java_order(wanted)
    utf16 = ([k.encode("utf-16-be", errors="surrogatepass") for k in wanted.to_pylist()]
             if java_order else None)
    tables = []
    counts = {"slices": 0, "with_logs": 0, "pruned_by_range": 0, "pruned_by_bloom": 0,
              "read": 0}
    for slc in slices:
        if partitions is not None and slc.partition_path not in partitions:
            continue
        counts["slices"] += 1
        if slc.log_files or slc.base_file is None:
            counts["with_logs"] += 1
            tables.append(_matching(slice_locations(reader, slc), wanted))
            continue
        try:
            footer = read_footer_keys(reader.storage.full(slc.base_file.path))
        except (OSError, ValueError):
            footer = FooterKeys(None, None, None)
        candidates = wanted
        if prune_by_ranges and footer.min_key is not None and footer.max_key is not None:
            inside = _within(wanted, utf16, footer.min_key, footer.max_key)
            if not inside.any():
                counts["pruned_by_range"] += 1
                continue
            candidates = wanted.filter(pa.array(inside))
        if footer.bloom is not None:
            maybe = footer.bloom.might_contain_many(candidates)
            if not maybe.any():
                counts["pruned_by_bloom"] += 1
                continue
            candidates = candidates.filter(pa.array(maybe))
        counts["read"] += 1
        tables.append(_matching(slice_locations(reader, slc), candidates))
    lookup = BloomLookup(concat_locations(tables), **counts)
    _log.debug("bloom index: %d keys, %d slices in scope: %d with logs read whole, "
               "%d pruned by key range, %d by bloom filter, %d base files read",
               len(wanted), lookup.slices, lookup.with_logs, lookup.pruned_by_range,
               lookup.pruned_by_bloom, lookup.read)
    return lookup


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
