"""The ``files`` partition of the metadata table: what one data action changes in the
table's file listing, and the listing itself.

Keys (``hudi-metadata-table.md`` §4.1): ``__all_partitions__`` (type 1) maps every partition
identifier to ``(0, deleted)``; each partition identifier (type 2; ``""`` is ``"."``) maps
file names to ``(size, deleted)``. A data action adds the files its write stats name and
tombstones (size 0, deleted) the files a clean or rollback removed. Replaced file groups
stay listed until cleaned, as in Hudi.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.errors import CorruptTableError
from engine.format.naming import parse_base_file, parse_log_file
from engine.layout.file_group import BaseFile, LogFile, TableFiles
from engine.layout.partition import is_safe_partition_path
from engine.metadata.keys import ALL_PARTITIONS_KEY, NON_PARTITIONED, partition_identifier
from engine.metadata.records import (
    FileInfo,
    MetadataRecord,
    all_partitions_record,
    partition_files_record,
)
from engine.timeline.commit_metadata import read_avro_ocf
from engine.timeline.instant import Action, Instant

FILE_ID = "files-0000-0"

SYNCED_ACTIONS = frozenset({Action.COMMIT, Action.DELTA_COMMIT, Action.REPLACE_COMMIT,
                            Action.CLEAN, Action.ROLLBACK, Action.RESTORE})
"""Completed data-table actions that change the file listing: each gets an MDT deltacommit
at its own instant before it completes."""

Listing = dict[str, MetadataRecord]
"""A merged ``files`` partition: MDT key → its record (tombstones kept)."""


def partition_of(identifier: str) -> str:
    """The data partition path of an MDT partition identifier."""
    return "" if identifier == NON_PARTITIONED else identifier


def syncs(instant: Instant) -> bool:
    """True if completing ``instant`` on the data timeline writes an MDT deltacommit."""
    return instant.action.completed_action in SYNCED_ACTIONS


@dataclass
class FilesChange:
    """What one data action changes in the listing: files added (with sizes) and removed,
    per data partition."""

    added: dict[str, dict[str, int]] = field(default_factory=dict)
    removed: dict[str, set[str]] = field(default_factory=dict)

    def add(self, partition: str, name: str, size: int) -> None:
        """List ``name`` in ``partition`` with its size (the larger of two sizes wins)."""
        if size <= 0:
            raise CorruptTableError(
                f"file {partition}/{name} has size {size}: the metadata table lists only "
                "files with a size > 0 (Hudi refuses others)")
        files = self.added.setdefault(partition, {})
        files[name] = max(size, files.get(name, 0))

    def remove(self, partition: str, name: str) -> None:
        """Tombstone ``name`` in ``partition``."""
        self.removed.setdefault(partition, set()).add(name)

    def records(self) -> list[MetadataRecord]:
        """The change as ``files`` records, sorted by key: one per touched partition, and
        ``__all_partitions__`` naming them all."""
        touched = sorted(set(self.added) | set(self.removed))
        out = []
        for p in touched:
            added = self.added.get(p, {})
            out.append(partition_files_record(
                p, added, sorted(self.removed.get(p, set()) - set(added))))
        out.append(all_partitions_record(touched))
        return sorted(out, key=lambda r: r.key.encode("utf-8"))


def change_of(instant: Instant, content: bytes) -> FilesChange:
    """The listing change of a data action from its completed instant's content (commit
    metadata, clean metadata or rollback metadata)."""
    change = FilesChange()
    action = instant.action.completed_action
    if action not in SYNCED_ACTIONS or not content:
        return change
    record = read_avro_ocf(content)
    if action in (Action.CLEAN, Action.ROLLBACK):
        _removed_files(change, record.get("partitionMetadata") or {})
    elif action is Action.RESTORE:
        for metas in (record.get("hoodieRestoreMetadata") or {}).values():
            for meta in metas or ():
                _removed_files(change, meta.get("partitionMetadata") or {})
    else:
        for partition, stats in (record.get("partitionToWriteStats") or {}).items():
            for stat in stats or ():
                path = str(stat.get("path") or "")
                if path:
                    change.add(partition or "", path.rsplit("/", 1)[-1],
                               int(stat.get("fileSizeInBytes") or 0))
    return change


def _removed_files(change: FilesChange, partitions: Mapping[str, Any]) -> None:
    for partition, meta in partitions.items():
        for path in (meta or {}).get("successDeleteFiles") or ():
            change.remove(partition or "", str(path).rsplit("/", 1)[-1])


def live_files(record: MetadataRecord) -> dict[str, int]:
    """File name → size of a partition record, tombstones dropped."""
    payload = record.payload
    assert isinstance(payload, Mapping)
    return {name: info.size for name, info in payload.items()
            if isinstance(info, FileInfo) and not info.is_deleted}


def table_files(listing: Mapping[str, MetadataRecord]) -> TableFiles:
    """The data files a merged ``files`` partition lists (tombstones dropped), in the form
    a storage listing returns; partitions with no live file are left out, as a listing
    would."""
    bases: list[BaseFile] = []
    logs: list[LogFile] = []
    partitions: list[str] = []
    for key, record in listing.items():
        if key == ALL_PARTITIONS_KEY:
            continue
        partition = partition_of(key)
        if not is_safe_partition_path(partition):
            raise CorruptTableError(f"metadata table: the files partition lists the partition "
                                    f"{partition!r}, which is not a folder of the table")
        found = False
        for name, size in live_files(record).items():
            if "/" in name or "\\" in name or "\x00" in name:
                raise CorruptTableError(f"metadata table: the files partition lists {name!r} "
                                        f"in {partition!r}, which is not a file name")
            base = parse_base_file(name)
            if base is not None:
                bases.append(BaseFile(partition, base.file_id, base.instant_time, name, size))
                found = True
                continue
            log = parse_log_file(name)
            if log is not None:
                logs.append(LogFile(partition, log.file_id, log.instant_time, log.version,
                                    log.write_token, name, size))
                found = True
        if found:
            partitions.append(partition)
    bases.sort(key=lambda f: (f.partition_path, f.name))
    logs.sort(key=lambda f: (f.partition_path, f.name))
    return TableFiles(tuple(bases), tuple(logs), tuple(sorted(partitions)))


def listing_of(files: TableFiles) -> list[MetadataRecord]:
    """The ``files`` records that list ``files`` (initialization, validation)."""
    change = FilesChange()
    for base in files.base_files:
        change.add(base.partition_path, base.name, base.size)
    for log in files.log_files:
        change.add(log.partition_path, log.name, log.size)
    return change.records()


__all__ = [
    "FILE_ID",
    "SYNCED_ACTIONS",
    "FilesChange",
    "Listing",
    "change_of",
    "listing_of",
    "live_files",
    "partition_identifier",
    "partition_of",
    "syncs",
    "table_files",
]
