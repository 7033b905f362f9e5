"""Reading the ``files`` partition: the table's file listing from the metadata table.

Which MDT instants a reader trusts (Java ``getValidInstantTimestamps``): MDT-only instants
(initialization ``00000000000000…``, MDT compactions) and deltacommits whose data instant is
completed on the data timeline the reader loaded, or archived from it. A deltacommit written
for a data instant that has not completed (its writer died between the two commits, or it
completed after the reader loaded its timeline) is ignored, so a view sees exactly its own
snapshot.

A reader also refuses an MDT that misses a data instant (a completed data action after the
MDT's last base without its deltacommit — written by a writer that did not keep the MDT):
:func:`consistent` says so and the caller lists storage instead; writers repair it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from engine.layout.file_group import FileSlice, TableFiles, build_file_slices, list_table_files
from engine.metadata.codec import read_base_file, read_log_file
from engine.metadata.files import FILE_ID, Listing, syncs, table_files
from engine.metadata.records import merge_records
from engine.metadata.table import (
    BOOTSTRAP_PREFIX,
    FILES,
    MetadataTable,
    completed_mdt_instants,
    declared_partitions,
    is_metadata_storage,
)
from engine.storage import Storage
from engine.timeline.active import Timeline, completion_key
from engine.timeline.instant import Action, Instant

_log = logging.getLogger(__name__)


def base_boundary(mdt_timeline: Timeline) -> str:
    """Completion key of the newest MDT instant that wrote base files (the initialization
    or a compaction): every data action completed after it has its own deltacommit."""
    bases = [completion_key(i) for i in completed_mdt_instants(mdt_timeline)
             if i.requested_time.startswith(BOOTSTRAP_PREFIX)
             or i.action is not Action.DELTA_COMMIT]
    return max(bases, default="")


def missing_deltacommits(mdt_timeline: Timeline, data_timeline: Timeline) -> list[str]:
    """Completed data actions (after the MDT's last base) that have no completed MDT
    deltacommit: the MDT does not know their files."""
    done = {i.requested_time for i in completed_mdt_instants(mdt_timeline)}
    boundary = base_boundary(mdt_timeline)
    if not boundary:
        return ["(no initialization)"]
    return [i.requested_time for i in data_timeline.instants
            if i.is_completed and syncs(i) and completion_key(i) > boundary
            and i.requested_time not in done]


def validity(data_timeline: Timeline) -> Callable[[Instant], bool]:
    """Whether an MDT instant is trusted against ``data_timeline`` (module docstring)."""
    completed = {i.requested_time for i in data_timeline.instants if i.is_completed}
    active = data_timeline.active_times
    boundary = data_timeline.archived_boundary

    def valid(instant: Instant) -> bool:
        t = instant.requested_time
        if t.startswith(BOOTSTRAP_PREFIX) or instant.action is not Action.DELTA_COMMIT:
            return True
        if t in completed:
            return True
        return t not in active and boundary is not None and t < boundary

    return valid


def files_slices(mdt: MetadataTable, mdt_timeline: Timeline,
                 valid: Callable[[Instant], bool], *, latest_only: bool = True) -> list[FileSlice]:
    """The slices of the ``files`` file group, oldest first, over the trusted MDT instants."""
    visible: Mapping[str, str] = {
        i.requested_time: completion_key(i)
        for i in completed_mdt_instants(mdt_timeline) if valid(i)}
    listed = list_table_files(mdt.storage)
    files = TableFiles(tuple(f for f in listed.base_files if f.partition_path == FILES),
                       tuple(f for f in listed.log_files if f.partition_path == FILES),
                       (FILES,))
    return [piece for piece in build_file_slices(files, mdt_timeline, visible,
                                                 latest_only=latest_only)
            if piece.file_id == FILE_ID]


def read_files_partition(mdt: MetadataTable, mdt_timeline: Timeline,
                         valid: Callable[[Instant], bool]) -> Listing:
    """Merge the ``files`` partition's latest slice (base HFile, then the logs of trusted
    deltacommits in completion order) by Hudi's merge rules: key → record, tombstones kept."""
    merged: Listing = {}
    for piece in files_slices(mdt, mdt_timeline, valid):
        if piece.base_file is not None:
            for record in read_base_file(mdt.storage.read(piece.base_file.path)):
                merged[record.key] = record
        for log in piece.log_files:
            for key, newer in read_log_file(mdt.storage.read(log.path)):
                result = merge_records(merged.get(key), newer)
                if result is None:
                    merged.pop(key, None)
                else:
                    merged[key] = result
    return merged


def metadata_listing(storage: Storage, data_timeline: Timeline) -> TableFiles | None:
    """The table's data files from the MDT, as ``data_timeline`` sees them; None when the
    MDT is not declared, missing, or misses a data action (then list storage)."""
    if is_metadata_storage(storage) or data_timeline.config.timeline_layout < 2:
        return None
    if FILES not in declared_partitions(storage):
        return None
    mdt = MetadataTable(storage, data_timeline.config)
    if not mdt.exists:
        _log.warning("%s declares a metadata table but has none; listing storage",
                     storage.base_path)
        return None
    mdt_timeline = mdt.timeline()
    missing = missing_deltacommits(mdt_timeline, data_timeline)
    if missing:
        _log.warning("the metadata table of %s misses the data instants %s; listing storage "
                     "(the next writer repairs it)", storage.base_path, ", ".join(missing[:5]))
        return None
    return table_files(read_files_partition(mdt, mdt_timeline, validity(data_timeline)))
