"""Keeping the metadata table in step with the data table: initialization, one deltacommit
per data action, taking a rolled-back data instant's entries back, compaction and cleaning.

The order is Hudi's (``hudi-metadata-table.md`` §3.6, pitfall 1): a data action's files are
written, then its MDT deltacommit completes **at the same instant time**, then the data
instant completes with a later completion time. :meth:`engine.timeline.active.Timeline.complete`
calls :func:`sync_instant` for every data action that changes the listing, so no writer or
service can complete one without it; they all hold the table lock there, which serializes
the MDT's writers. A crash between the two commits leaves an MDT deltacommit that readers
ignore (its data instant is not completed) and that the data instant's rollback removes.

A writer that finds the MDT missing or missing a data action rebuilds it from storage
before it writes (:func:`rebuild`), never trusting a stale one.
"""

from __future__ import annotations

import dataclasses
import logging

from engine.layout.file_group import list_table_files, visible_instants
from engine.layout.partition import write_partition_metadata
from engine.metadata.codec import base_file_bytes, init_log_file, log_file_bytes
from engine.metadata.files import FILE_ID, FilesChange, change_of, listing_of, live_files, syncs
from engine.metadata.keys import ALL_PARTITIONS_KEY
from engine.metadata.listing import (
    base_boundary,
    files_slices,
    missing_deltacommits,
    read_files_partition,
    validity,
)
from engine.metadata.records import FileInfo
from engine.metadata.schema import metadata_schema_without_meta_fields_json
from engine.metadata.table import (
    BOOTSTRAP_PREFIX,
    FILES,
    MetadataTable,
    completed_mdt_instants,
    declared_partitions,
    is_metadata_storage,
    set_declared_partitions,
)
from engine.services.compaction_plan import CompactionOperation, CompactionPlan
from engine.storage import Storage
from engine.timeline.active import Timeline, completion_key
from engine.timeline.commit_metadata import CommitMetadata, WriteStat
from engine.timeline.instant import Action, Instant, new_instant_time

_log = logging.getLogger(__name__)

INIT_INSTANT = f"{BOOTSTRAP_PREFIX}000"
WRITE_TOKEN = "0-0-0"
MAX_DELTA_COMMITS = 10
"""``hoodie.metadata.compact.max.delta.commits``: deltacommits after which the MDT is
compacted (Hudi's default)."""
RETAINED_SLICES = 2
"""File slices of each MDT file group kept by MDT cleaning: the newest and the one before
(a reader that loaded the MDT just before a compaction still finds its files)."""


# -- initialization ------------------------------------------------------------------------

def initialize(storage: Storage, data_timeline: Timeline) -> MetadataTable:
    """Build the MDT's ``files`` partition from the committed data files (hold the lock),
    then declare it in the data table's ``hoodie.properties``. Any MDT folder already there
    is dropped first. ``data_timeline`` is loaded under the lock."""
    mdt = MetadataTable(storage, data_timeline.config)
    if FILES in declared_partitions(storage):
        set_declared_partitions(storage, ())
    mdt.delete()
    mdt.create()
    visible = visible_instants(data_timeline)
    listed = list_table_files(storage)
    from engine.layout.file_group import TableFiles

    committed = TableFiles(
        tuple(f for f in listed.base_files if f.instant_time in visible),
        tuple(f for f in listed.log_files if f.instant_time in visible),
        listed.partitions)
    records = listing_of(committed)
    timeline = mdt.timeline()
    requested = timeline.create_requested(Action.DELTA_COMMIT, INIT_INSTANT)
    inflight = timeline.transition_to_inflight(requested)
    write_partition_metadata(mdt.storage, FILES, INIT_INSTANT)
    init_name = f".{FILE_ID}_{INIT_INSTANT}.log.1_{WRITE_TOKEN}"
    mdt.storage.write_new(f"{FILES}/{init_name}", init_log_file(INIT_INSTANT))
    base_name = f"{FILE_ID}_{WRITE_TOKEN}_{INIT_INSTANT}.hfile"
    data = base_file_bytes(records, base_name)
    mdt.storage.write_new(f"{FILES}/{base_name}", data)
    stat = WriteStat(file_id=FILE_ID, path=f"{FILES}/{base_name}", partition_path=FILES,
                     num_writes=len(records), num_inserts=len(records),
                     total_write_bytes=len(data), file_size_in_bytes=len(data))
    meta = CommitMetadata(write_stats=(stat,), operation_type="BULK_INSERT",
                          extra_metadata={"schema": metadata_schema_without_meta_fields_json()})
    timeline.complete(inflight, meta.to_avro_bytes())
    set_declared_partitions(storage, (FILES,))
    _log.info("initialized the metadata table of %s: %d partitions, %d files",
              storage.base_path, len(records) - 1,
              len(committed.base_files) + len(committed.log_files))
    return mdt


def rebuild(storage: Storage, data_timeline: Timeline) -> MetadataTable:
    """Drop the MDT and build it anew from storage (hold the lock)."""
    return initialize(storage, data_timeline)


def disable(storage: Storage) -> bool:
    """Undeclare and delete the MDT (``hoodie.metadata.enable=false``, as Hudi does: an MDT
    that writers stop keeping must not be trusted by readers). Hold the lock. Returns True
    if there was one."""
    from engine.config import TableConfig  # noqa: F401  (documented dependency)
    from engine.metadata.table import METADATA_FOLDER

    had = bool(declared_partitions(storage)) or storage.exists(METADATA_FOLDER)
    if declared_partitions(storage):
        set_declared_partitions(storage, ())
    storage.delete_tree(METADATA_FOLDER)
    return had


def prepare(storage: Storage, data_timeline: Timeline, *, enabled: bool) -> None:
    """A writer's start (hold the lock; ``data_timeline`` loaded under it): initialize the
    MDT if the writer keeps one and it is not there, delete it if the writer does not."""
    if is_metadata_storage(storage) or data_timeline.config.timeline_layout < 2:
        return
    declared = FILES in declared_partitions(storage)
    if enabled and not declared:
        initialize(storage, data_timeline)
    elif not enabled and declared:
        disable(storage)
        _log.warning("hoodie.metadata.enable=false: deleted the metadata table of %s",
                     storage.base_path)


# -- one deltacommit per data action ----------------------------------------------------------

def sync_instant(data_timeline: Timeline, instant: Instant, content: bytes) -> str | None:
    """Write the MDT deltacommit of the data action ``instant`` (about to complete with
    ``content``) and return its completion time, or None when the table keeps no MDT.
    Called by ``Timeline.complete`` under the table lock."""
    storage = data_timeline.storage
    if (is_metadata_storage(storage) or data_timeline.config.timeline_layout < 2
            or not syncs(instant) or FILES not in declared_partitions(storage)):
        return None
    mdt = MetadataTable(storage, data_timeline.config)
    mdt_timeline = mdt.timeline() if mdt.exists else None
    if mdt_timeline is None or missing_deltacommits(mdt_timeline, data_timeline):
        missing = (missing_deltacommits(mdt_timeline, data_timeline)
                   if mdt_timeline is not None else ["(no metadata table)"])
        _log.warning("the metadata table of %s is out of step (missing %s): rebuilding it",
                     storage.base_path, ", ".join(missing[:5]))
        mdt = rebuild(storage, data_timeline)
        mdt_timeline = mdt.timeline()
    t = instant.requested_time
    if mdt.remove_instant(mdt_timeline, t):  # a dead attempt's leftovers
        mdt_timeline = mdt.timeline()
    mdt_timeline = _drop_orphans(mdt, mdt_timeline, data_timeline)
    mdt_timeline = _maybe_compact(mdt, mdt_timeline, data_timeline)
    return write_deltacommit(mdt, mdt_timeline, t, change_of(instant, content))


def write_deltacommit(mdt: MetadataTable, mdt_timeline: Timeline, instant_time: str,
                      change: FilesChange) -> str:
    """One MDT deltacommit at ``instant_time``: a log file of the ``files`` group with one
    HFile block, then the completed deltacommit. Returns its completion time."""
    records = change.records()
    requested = mdt_timeline.create_requested(Action.DELTA_COMMIT, instant_time)
    inflight = mdt_timeline.transition_to_inflight(requested)
    name = f".{FILE_ID}_{instant_time}.log.1_{WRITE_TOKEN}"
    data = log_file_bytes(records, instant_time)
    mdt.storage.write_new(f"{FILES}/{name}", data)
    stat = WriteStat(file_id=FILE_ID, path=f"{FILES}/{name}", partition_path=FILES,
                     prev_commit=instant_time, num_writes=len(records),
                     num_update_writes=len(records), total_write_bytes=len(data),
                     file_size_in_bytes=len(data), base_file="", log_files=(name,),
                     total_log_blocks=1, total_log_records=len(records))
    meta = CommitMetadata(write_stats=(stat,), operation_type="UPSERT_PREPPED",
                          extra_metadata={"schema": metadata_schema_without_meta_fields_json()})
    done = mdt_timeline.complete(inflight, meta.to_avro_bytes())
    return done.completion_time or done.requested_time


def rollback_instant(storage: Storage, data_config_timeline: Timeline, instant_time: str) -> None:
    """Take back the MDT entries of a data instant being rolled back, before its files go
    (so no MDT reader lists a deleted file). Hold the lock."""
    if is_metadata_storage(storage) or data_config_timeline.config.timeline_layout < 2:
        return
    mdt = MetadataTable(storage, data_config_timeline.config)
    if not mdt.exists:
        return
    mdt.remove_instant(mdt.timeline(), instant_time)


def _drop_orphans(mdt: MetadataTable, mdt_timeline: Timeline,
                  data_timeline: Timeline) -> Timeline:
    """Remove MDT deltacommits whose data instant is gone from the data timeline (neither
    completed, pending nor archived): nothing will ever roll them back, and left alone they
    would block MDT compaction forever (apache/hudi#6056)."""
    valid = validity(data_timeline)
    active = data_timeline.active_times
    orphans = [i.requested_time for i in mdt_timeline.instants
               if i.action is Action.DELTA_COMMIT and not valid(i)
               and i.requested_time not in active]
    for t in orphans:
        mdt.remove_instant(mdt_timeline, t)
    return mdt.timeline() if orphans else mdt_timeline


# -- compaction and cleaning ----------------------------------------------------------------

def _maybe_compact(mdt: MetadataTable, mdt_timeline: Timeline,
                   data_timeline: Timeline) -> Timeline:
    """Compact the ``files`` partition when ``MAX_DELTA_COMMITS`` deltacommits completed
    since its last base, all of them for completed data instants (a deltacommit of a data
    instant still pending waits for its commit or rollback), then clean."""
    boundary = base_boundary(mdt_timeline)
    valid = validity(data_timeline)
    deltas = [i for i in completed_mdt_instants(mdt_timeline)
              if i.action is Action.DELTA_COMMIT and completion_key(i) > boundary]
    if len(deltas) < MAX_DELTA_COMMITS or not all(valid(i) for i in deltas):
        return mdt_timeline
    compact(mdt, mdt_timeline, data_timeline)
    mdt_timeline = mdt.timeline()
    clean(mdt, mdt_timeline)
    return mdt.timeline()


def compact(mdt: MetadataTable, mdt_timeline: Timeline, data_timeline: Timeline) -> str:
    """Fold the ``files`` group's latest slice into a new base HFile at a fresh MDT instant
    (``compaction.requested`` plan, inflight, base file, ``commit``). Hold the lock."""
    merged = read_files_partition(mdt, mdt_timeline, validity(data_timeline))
    live = [dataclasses.replace(record, payload={
        name: FileInfo(size) for name, size in live_files(record).items()})
        for key, record in sorted(merged.items())
        if key == ALL_PARTITIONS_KEY or live_files(record)]
    slices = files_slices(mdt, mdt_timeline, validity(data_timeline))
    latest = slices[-1] if slices else None
    c = new_instant_time(max(mdt_timeline.latest_instant_time(),
                             data_timeline.latest_instant_time()))
    op = CompactionOperation(
        partition_path=FILES, file_id=FILE_ID,
        base_instant=latest.base_instant if latest is not None else INIT_INSTANT,
        base_file=latest.base_file.name if latest is not None and latest.base_file else None,
        log_files=tuple(log.name for log in latest.log_files) if latest is not None else ())
    plan = CompactionPlan(operations=(op,))
    requested = mdt_timeline.create_requested(Action.COMPACTION, c, plan.to_avro_bytes())
    inflight = mdt_timeline.transition_to_inflight(requested)
    base_name = f"{FILE_ID}_{WRITE_TOKEN}_{c}.hfile"
    data = base_file_bytes(live, base_name)
    mdt.storage.write_new(f"{FILES}/{base_name}", data)
    stat = WriteStat(file_id=FILE_ID, path=f"{FILES}/{base_name}", partition_path=FILES,
                     prev_commit=op.base_instant, num_writes=len(live),
                     total_write_bytes=len(data), file_size_in_bytes=len(data),
                     total_log_files_compacted=len(op.log_files))
    meta = CommitMetadata(write_stats=(stat,), operation_type="COMPACT", compacted=True,
                          extra_metadata={"schema": metadata_schema_without_meta_fields_json()})
    mdt_timeline.complete(inflight, meta.to_avro_bytes())
    return c


def clean(mdt: MetadataTable, mdt_timeline: Timeline) -> int:
    """Delete the ``files`` group's slices older than the newest ``RETAINED_SLICES``, and the
    MDT timeline files of instants that no longer own a file. Returns files deleted."""
    slices = files_slices(mdt, mdt_timeline, lambda _i: True, latest_only=False)
    old = slices[:-RETAINED_SLICES] if len(slices) > RETAINED_SLICES else []
    deleted = 0
    for piece in old:
        paths = [log.path for log in piece.log_files]
        if piece.base_file is not None:
            paths.append(piece.base_file.path)
        for path in paths:
            mdt.storage.delete(path)
            deleted += 1
    if not old:
        return 0
    keep_from = slices[-RETAINED_SLICES].base_instant
    remaining = list_table_files(mdt.storage)
    owned = {f.instant_time for f in remaining.base_files}
    owned |= {f.instant_time for f in remaining.log_files}
    for instant in mdt_timeline.instants:
        t = instant.requested_time
        if t < keep_from and t not in owned and instant.is_completed:
            mdt_timeline.delete_instant_files(instant)
    return deleted
