"""What one data action writes to the metadata table's partitions, as a write stat carries it
from the file's writer to the commit.

A write handle (or a service's task) derives, where it writes a file, what the file adds to
the index partitions (its column stats, bloom filter, record-index entries) and puts it in
:attr:`~engine.timeline.commit_metadata.WriteStat.metadata`; the commit
(:func:`engine.write.commit.commit_instant`) merges the stats' updates and hands them to the
MDT deltacommit at the instant (:func:`engine.metadata.sync.sync_instant`). The field is
opaque to the timeline, which sits below the metadata table; :func:`carried` reads it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import pyarrow as pa

from engine.metadata.records import MetadataRecord
from engine.timeline.commit_metadata import WriteStat


@dataclass(frozen=True)
class SharedUpserts:
    """Upserts of many keys that each take the same record but for its key (the record-index
    entries of one written file: every key points at that file's group), kept as one Arrow
    array of the keys and the one record from the write task to the MDT log file, with no
    object per key (a bulk insert of a million rows is a million entries)."""

    keys: pa.Array
    """Distinct keys (``string`` or ``large_string``, no nulls), in any order."""
    record: MetadataRecord
    """What every key takes (its own ``key`` is not used)."""

    def records(self) -> list[MetadataRecord]:
        """One record per key (sharing this one's payload), in key array order."""
        make = functools.partial(tuple.__new__, MetadataRecord)
        record = self.record
        return list(map(make, zip(self.keys.to_pylist(), itertools.repeat(record.type),
                                  itertools.repeat(record.payload),
                                  itertools.repeat(record.file_name))))


@dataclass
class MetadataUpdate:
    """What one data action writes to the MDT: per MDT partition, records to upsert (one
    by one in ``upserts``, by shared record in ``shared``) and keys to delete."""

    upserts: dict[str, list[MetadataRecord]] = field(default_factory=dict)
    deletes: dict[str, list[str]] = field(default_factory=dict)
    shared: dict[str, list[SharedUpserts]] = field(default_factory=dict)

    def add(self, partition: str, records: Iterable[MetadataRecord]) -> None:
        """Upsert ``records`` into ``partition``."""
        self.upserts.setdefault(partition, []).extend(records)

    def add_shared(self, partition: str, keys: pa.Array, record: MetadataRecord) -> None:
        """Upsert every key of ``keys`` into ``partition`` as ``record`` (see
        :class:`SharedUpserts`)."""
        if len(keys):
            self.shared.setdefault(partition, []).append(SharedUpserts(keys, record))

    def records(self, partition: str) -> list[MetadataRecord]:
        """Every record upserted into ``partition``, one by one (the shared ones after)."""
        out = list(self.upserts.get(partition, ()))
        for chunk in self.shared.get(partition, ()):
            out += chunk.records()
        return out

    def delete(self, partition: str, keys: Iterable[str]) -> None:
        """Delete ``keys`` from ``partition``."""
        self.deletes.setdefault(partition, []).extend(keys)

    def partitions(self) -> list[str]:
        """The MDT partitions this update touches."""
        return sorted(set(self.upserts) | set(self.deletes) | set(self.shared))

    def extend(self, other: MetadataUpdate) -> None:
        """Add everything ``other`` holds."""
        for partition in other.partitions():
            self.add(partition, other.upserts.get(partition, ()))
            self.delete(partition, other.deletes.get(partition, ()))
            if other.shared.get(partition):
                self.shared.setdefault(partition, []).extend(other.shared[partition])


def merge_updates(*updates: MetadataUpdate | None) -> MetadataUpdate | None:
    """The updates given (None for none) as one; None if all are None."""
    present = [u for u in updates if u is not None]
    if len(present) <= 1:
        return present[0] if present else None
    merged = MetadataUpdate()
    for update in present:
        merged.extend(update)
    return merged


def carried(stat: WriteStat) -> MetadataUpdate | None:
    """The MDT update ``stat`` carries (None if none)."""
    update = stat.metadata
    if update is not None and not isinstance(update, MetadataUpdate):
        raise TypeError(f"write stat of {stat.path}: metadata holds a "
                        f"{type(update).__name__}, not a MetadataUpdate")
    return update


def with_update(stat: WriteStat, update: MetadataUpdate | None) -> WriteStat:
    """``stat`` carrying ``update`` besides what it carries already."""
    if update is None:
        return stat
    return replace(stat, metadata=merge_updates(carried(stat), update))


def collect_updates(stats: Iterable[WriteStat]) -> MetadataUpdate | None:
    """The MDT index records the write stats of one action carry, merged (None if none)."""
    merged: MetadataUpdate | None = None
    for stat in stats:
        update = carried(stat)
        if update is not None:
            if merged is None:
                merged = MetadataUpdate()
            merged.extend(update)
    return merged
