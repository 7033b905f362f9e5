"""Reading the ``files`` partition: the table's file listing from the metadata table.

A reader also refuses an MDT that misses a data instant (a completed data action after the
MDT's last base without its deltacommit — written by a writer that did not keep the MDT):
:func:`missing_deltacommits` says so and the caller lists storage instead; writers repair
it (:mod:`engine.metadata.sync`).
"""

from __future__ import annotations

import logging

from engine.errors import CorruptTableError
from engine.layout.file_group import TableFiles
from engine.metadata.files import FILE_ID, Listing, syncs, table_files
from engine.metadata.reader import Validity, latest_group_slices, read_slice, validity
from engine.metadata.table import (
    BOOTSTRAP_PREFIX,
    FILES,
    MetadataTable,
    completed_mdt_instants,
    is_metadata_storage,
    snapshot_declared,
    snapshot_metadata_timeline,
)
from engine.storage import Storage
from engine.timeline.active import Timeline, completion_key
from engine.timeline.instant import Action

_log = logging.getLogger(__name__)


def base_boundary(mdt_timeline: Timeline) -> str:
    """Completion key of the newest MDT instant that wrote base files (an initialization
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


def read_files_partition(mdt: MetadataTable, mdt_timeline: Timeline,
                         valid: Validity) -> Listing:
    """The merged ``files`` partition (base HFile, then the logs of trusted deltacommits in
    completion order, by Hudi's merge rules): key → record, tombstones kept."""
    for piece in latest_group_slices(mdt, mdt_timeline, valid, FILES):
        if piece.file_id == FILE_ID:
            return read_slice(mdt.storage, piece)
    return {}


def metadata_listing(storage: Storage, data_timeline: Timeline) -> TableFiles | None:
    """The table's data files from the MDT, as ``data_timeline`` sees them; None when the
    MDT is not declared, missing, or misses a data action (then list storage)."""
    if is_metadata_storage(storage) \
            or not data_timeline.config.table_version.keeps_metadata_table:
        return None
    # hoodie.properties and the MDT timeline as read along with the snapshot (a writer's
    # start read them under the lock already)
    if FILES not in snapshot_declared(data_timeline):
        return None
    mdt = MetadataTable(storage, data_timeline.config)
    mdt_timeline = snapshot_metadata_timeline(data_timeline)
    if mdt_timeline is None:
        _log.warning("%s declares a metadata table but has none; listing storage",
                     storage.base_path)
        return None
    missing = missing_deltacommits(mdt_timeline, data_timeline)
    if missing:
        _log.warning("the metadata table of %s misses the data instants %s; listing storage "
                     "(the next writer repairs it)", storage.base_path, ", ".join(missing[:5]))
        return None
    try:
        return table_files(read_files_partition(mdt, mdt_timeline, validity(data_timeline)))
    except CorruptTableError as exc:
        _log.warning("%s; listing storage (rebuild it: tidelake table metadata rebuild %s)",
                     exc, storage.base_path)
        return None
