"""Keeping the metadata table in step with the data table: initialization, one deltacommit
per data action, taking a rolled-back data instant's entries back, compaction and cleaning.

The order is Hudi's (``hudi-metadata-table.md`` §3.6, pitfall 1): a data action's files are
written, then its MDT deltacommit completes **at the same instant time**, then the data
instant completes with a later completion time. The commit protocol
(:func:`engine.write.commit.commit_instant`) calls :func:`sync_instant` for every data action
that changes the listing, so no writer or service can complete one without it; they all hold
the table lock there, which serializes the MDT's writers. A crash between the two commits
leaves an MDT deltacommit that readers ignore (its data instant is not completed) and that
the data instant's rollback removes.

A writer that finds the MDT missing or missing a data action rebuilds it from storage
before it writes (:func:`rebuild`), never trusting a stale one.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import TYPE_CHECKING

from engine.config import P_VERSION
from engine.errors import UnsupportedTableError
from engine.metadata import index_defs
from engine.metadata.files import syncs
from engine.metadata.listing import base_boundary, missing_deltacommits
from engine.metadata.reader import validity
from engine.metadata.table import (
    BOOTSTRAP_PREFIX,
    FILES,
    METADATA_FOLDER,
    MetadataTable,
    completed_mdt_instants,
    declared_partitions,
    forget_metadata,
    is_metadata_storage,
    set_declared_partitions,
    snapshot_declared,
    snapshot_metadata_timeline,
    snapshot_properties,
)
from engine.metadata.update import MetadataUpdate
from engine.metadata.writer import (
    MAX_DELTA_COMMITS,
    clean,
    compact,
    initialize_partition,
    write_deltacommit,
)
from engine.storage import Storage
from engine.timeline.active import Timeline, completion_key
from engine.timeline.instant import Action, Instant

if TYPE_CHECKING:
    from engine.config import WriteConfig
    from engine.layout.view import TableView
    from engine.metadata.indexes import IndexPartition

_log = logging.getLogger(__name__)

_WRITING_ACTIONS = (Action.COMMIT, Action.DELTA_COMMIT, Action.REPLACE_COMMIT, Action.CLUSTERING)
"""Pending actions that write data files an index partition must know of."""



# -- initialization ------------------------------------------------------------------------

def initialize(storage: Storage, data_timeline: Timeline) -> MetadataTable:
    """Build the MDT's ``files`` partition from the committed data files (hold the lock;
    ``data_timeline`` loaded under it), then declare it in the data table's
    ``hoodie.properties``. Any MDT folder already there is dropped first."""
    from engine.config import WriteConfig
    from engine.layout.view import TableView
    from engine.metadata.index_partitions import FILES_PARTITION

    mdt = MetadataTable(storage, data_timeline.config)
    if declared_partitions(storage):
        set_declared_partitions(storage, ())
    mdt.delete()
    mdt.create()
    forget_metadata(data_timeline)  # no MDT declared now: the view lists storage
    view, config = TableView(storage, data_timeline), WriteConfig()
    initialize_partition(mdt, FILES, FILES_PARTITION.file_groups(view, config),
                         FILES_PARTITION.build(view, config))
    forget_metadata(data_timeline)
    return mdt


def rebuild(storage: Storage, data_timeline: Timeline,
            write_config: WriteConfig | None = None) -> MetadataTable:
    """Drop the MDT and build it anew from storage, with every index partition it declared
    and those ``write_config`` turns on (hold the lock; ``write_config``: the options the
    builders take, Hudi's defaults if None). A partition it did not declare waits while
    another writer's instant is in flight, as in :func:`prepare`: that instant planned
    without it and would complete without its entries."""
    from engine.config import WriteConfig
    from engine.layout.view import TableView
    from engine.metadata.index_partitions import INDEX_PARTITIONS, wanted_partitions

    had = set(declared_partitions(storage)) - {FILES}
    mdt = initialize(storage, data_timeline)
    # indexes tidelake does not keep (a Java secondary index) are not rebuilt: their
    # definitions go with them, as in _prepare
    index_defs.remove(storage, sorted(had - set(INDEX_PARTITIONS)))
    config = write_config or WriteConfig()
    wanted = wanted_partitions(config)
    view = TableView(storage, data_timeline)
    busy = [i.requested_time for i in data_timeline.pending(_WRITING_ACTIONS)]
    for name, partition in INDEX_PARTITIONS.items():
        # Writers in flight planned with the declared partitions: their completion writes
        # their entries into the rebuilt ones. A new one waits for them.
        kept = name in had and wanted.get(name) is not False
        added = name not in had and bool(wanted.get(name))
        if added and busy:
            _log.warning("the metadata table of %s: building %s waits for the instants in "
                         "flight (%s)", storage.base_path, name, ", ".join(busy[:5]))
            continue
        if not (kept or added):
            if name in had:
                index_defs.remove(storage, [name])
            continue
        _build_partition(mdt, partition, view, config)
    return mdt


def _build_partition(mdt: MetadataTable, partition: IndexPartition, view: TableView,
                     write_config: WriteConfig) -> None:
    """Build one index partition and declare it, then record its definition in
    ``.hoodie/.index_defs/index.json`` (:mod:`engine.metadata.index_defs`), as Java
    declares an index it builds."""
    initialize_partition(mdt, partition.name, partition.file_groups(view, write_config),
                         partition.build(view, write_config))
    definition = (partition.definition(view, write_config)
                  if partition.definition is not None else None)
    if definition is not None:
        index_defs.declare(mdt.data_storage, definition)


def _drop_partition(mdt: MetadataTable, name: str) -> None:
    """Undeclare one index partition, delete its folder and its definition (Java's
    ``deleteIndexDefinition``). Hold the lock."""
    storage = mdt.data_storage
    set_declared_partitions(storage, set(declared_partitions(storage)) - {name})
    mdt.storage.delete_tree(name)
    index_defs.remove(storage, [name])


def disable(storage: Storage) -> bool:
    """Undeclare and delete the MDT (``hoodie.metadata.enable=false``, as Hudi does: an MDT
    that writers stop keeping must not be trusted by readers). Hold the lock. Returns True
    if there was one."""
    declared = declared_partitions(storage)
    had = bool(declared) or storage.exists(METADATA_FOLDER)
    if declared:
        set_declared_partitions(storage, ())
    storage.delete_tree(METADATA_FOLDER)
    index_defs.remove(storage, declared)
    return had


def prepare(storage: Storage, data_timeline: Timeline, *, enabled: bool,
            write_config: WriteConfig | None = None) -> None:
    """A writer's start (hold the lock; ``data_timeline`` loaded under it): initialize the
    MDT if the writer keeps one and it is not there, delete it if the writer does not; then
    build the index partitions the writer wants (``write_config``) and the table lacks, and
    drop declared ones it does not want.

    Reads ``hoodie.properties`` and the MDT's timeline once, through ``data_timeline``
    (:func:`~engine.metadata.table.snapshot_properties`), so the plan made from that
    snapshot reads neither again; anything this changes drops them from it."""
    if is_metadata_storage(storage):
        return
    if snapshot_properties(data_timeline) is None:
        # (a table the streaming sink defines is written to storage with its first commit;
        # its next writer's start initializes the MDT from that commit's files)
        return
    if not data_timeline.config.table_version.keeps_metadata_table:
        # A table of this version keeps no MDT here (engine.timeline.version); one that
        # Java wrote goes, as with hoodie.metadata.enable=false, before it turns stale.
        if snapshot_declared(data_timeline) or storage.exists(METADATA_FOLDER):
            disable(storage)
            forget_metadata(data_timeline)
            _log.warning("table version %s: deleted the metadata table of %s (tidelake keeps "
                         "none on this version)", data_timeline.config.version,
                         storage.base_path)
        return
    try:
        changed = _prepare(storage, data_timeline, enabled=enabled,
                           write_config=write_config)
    except BaseException:
        forget_metadata(data_timeline)
        raise
    if changed:
        forget_metadata(data_timeline)


def _prepare(storage: Storage, data_timeline: Timeline, *, enabled: bool,
             write_config: WriteConfig | None) -> bool:
    """:func:`prepare`'s work; True if it changed the MDT or ``hoodie.properties``."""
    changed = False
    declared = FILES in snapshot_declared(data_timeline)
    if enabled and declared and _out_of_step(storage, data_timeline):
        # Never tag or write against a stale MDT (the record index would miss keys).
        rebuild(storage, data_timeline, write_config)
        changed = True
    if enabled and not declared:
        initialize(storage, data_timeline)
        changed = True
    elif not enabled and declared:
        disable(storage)
        _log.warning("hoodie.metadata.enable=false: deleted the metadata table of %s",
                     storage.base_path)
        return True
    if not enabled or write_config is None:
        return changed
    from engine.layout.view import TableView
    from engine.metadata.index_partitions import INDEX_PARTITIONS, wanted_partitions

    wanted = wanted_partitions(write_config)
    have = set(declared_partitions(storage) if changed
               else snapshot_declared(data_timeline)) - {FILES}
    mdt = MetadataTable(storage, data_timeline.config)
    for name in sorted(n for n in have if wanted.get(n) is False):
        _drop_partition(mdt, name)
        changed = True
        _log.warning("the metadata table of %s no longer keeps %s (disabled by this "
                     "writer's options)", storage.base_path, name)
    for name in sorted(n for n in have if n not in INDEX_PARTITIONS):
        # An index a Java writer built that tidelake does not maintain (secondary and
        # expression indexes): left declared, it would go stale with this writer's commits
        # and Java readers would answer from it wrongly. Its definition goes too (a Java
        # writer would otherwise rebuild a lone one at every write and never several:
        # docs/table-version-9.md §4); Java's CREATE INDEX makes it again.
        _drop_partition(mdt, name)
        changed = True
        _log.warning("the metadata table of %s: dropped %s, an index tidelake does not "
                     "maintain", storage.base_path, name)
    missing = [INDEX_PARTITIONS[n] for n, want in wanted.items() if want and n not in have]
    busy = [i.requested_time for i in data_timeline.pending(_WRITING_ACTIONS)]
    if missing and busy:
        # Another writer's instant planned without the new partition: its files would
        # complete without their entries (a record index missing keys writes them twice).
        # Built at a later start, once no other write is in flight.
        _log.warning("the metadata table of %s: building %s waits for the instants in flight "
                     "(%s)", storage.base_path, ", ".join(p.name for p in missing),
                     ", ".join(busy[:5]))
        return changed
    if missing:
        forget_metadata(data_timeline)  # the view below lists through the MDT
        view = TableView(storage, data_timeline)
        for partition in missing:
            _build_partition(mdt, partition, view, write_config)
        changed = True
    return changed


def _out_of_step(storage: Storage, data_timeline: Timeline) -> bool:
    """True if the declared MDT is missing, or misses a completed data action (logged).
    Reads the MDT's timeline through ``data_timeline`` (once per snapshot)."""
    mdt_timeline = snapshot_metadata_timeline(data_timeline)
    missing = (missing_deltacommits(mdt_timeline, data_timeline) if mdt_timeline is not None
               else ["(no metadata table)"])
    if missing:
        _log.warning("the metadata table of %s is out of step (missing %s): rebuilding it",
                     storage.base_path, ", ".join(missing[:5]))
    return bool(missing)


# -- one deltacommit per data action ----------------------------------------------------------

def sync_instant(data_timeline: Timeline, instant: Instant, content: bytes,
                 update: MetadataUpdate | None = None) -> str | None:
    """Write the MDT deltacommit of the data action ``instant`` (about to complete with
    ``content``; ``update``: what it adds to the index partitions) and return its
    completion time, or None when the table keeps no MDT. Called by the commit protocol
    (:func:`engine.write.commit.commit_instant`) under the table lock."""
    storage = data_timeline.storage
    if is_metadata_storage(storage) \
            or not data_timeline.config.table_version.keeps_metadata_table \
            or not syncs(instant):
        return None
    try:
        return _sync_instant(data_timeline, instant, content, update)
    finally:
        forget_metadata(data_timeline)  # the MDT has a new deltacommit (or was rebuilt)


def _sync_instant(data_timeline: Timeline, instant: Instant, content: bytes,
                  update: MetadataUpdate | None) -> str | None:
    """:func:`sync_instant`'s work: ``hoodie.properties`` read once and the MDT timeline
    listed once (through ``data_timeline``, loaded under the lock the caller holds), the MDT
    deltacommit completed without listing its timeline again."""
    storage = data_timeline.storage
    forget_metadata(data_timeline)  # read both under the lock held now
    _refuse_changed_version(data_timeline)
    declared = snapshot_declared(data_timeline)
    if FILES not in declared:
        return None
    mdt = MetadataTable(storage, data_timeline.config)
    in_step = not _out_of_step(storage, data_timeline)
    mdt_timeline = snapshot_metadata_timeline(data_timeline) if in_step else None
    if mdt_timeline is None:
        mdt = rebuild(storage, data_timeline)
        declared = declared_partitions(storage)
        mdt_timeline = mdt.timeline()
    t = instant.requested_time
    if mdt.remove_instant(mdt_timeline, t):  # a dead attempt's leftovers
        mdt_timeline = mdt.timeline()
    mdt_timeline = _drop_orphans(mdt, mdt_timeline, data_timeline)
    mdt_timeline = _drop_dead_compactions(mdt, mdt_timeline)
    behind = _layout_behind(mdt, mdt_timeline)
    if behind:  # a Java-upgraded table: its column stats are V2 from this commit on
        index_defs.align_versions(storage, data_timeline.config.table_version)
    mdt_timeline = _maybe_compact(mdt, mdt_timeline, data_timeline, force=behind)
    full = MetadataUpdate()
    if update is not None:
        full.extend(update)
    _sync_partitions(data_timeline, instant, content, full, declared)
    return write_deltacommit(mdt, mdt_timeline, t, full, declared=declared)


def _refuse_changed_version(data_timeline: Timeline) -> None:
    """Refuse to write MDT records of the version this writer opened the table at when
    ``hoodie.properties`` (read now, under the lock) records another: a Hudi 1.1 writer
    upgraded the table to version 9 meanwhile (``docs/table-version-9.md`` §8), whose MDT
    must not receive version-8 records. The data instant then stays uncompleted (rolled
    back later); reopening the table writes it at its new version."""
    stored = (snapshot_properties(data_timeline) or {}).get(P_VERSION)
    opened = data_timeline.config.version
    if stored is not None and stored.strip() != str(opened):
        raise UnsupportedTableError(
            f"hoodie.table.version is {stored.strip()} but this writer opened the table at "
            f"version {opened} (another writer upgraded it): reopen the table to write it")


def _sync_partitions(data_timeline: Timeline, instant: Instant, content: bytes,
                     full: MetadataUpdate, declared: Collection[str]) -> None:
    """Add what each declared partition, ``files`` first, derives from the action (its
    ``sync``)."""
    from engine.metadata.index_partitions import METADATA_PARTITIONS

    for partition in METADATA_PARTITIONS.values():
        if partition.sync is not None and partition.name in declared:
            more = partition.sync(data_timeline, instant, content, full)
            if more is not None:
                full.extend(more)


def rollback_instant(storage: Storage, data_config_timeline: Timeline, instant_time: str) -> None:
    """Take back the MDT entries of a data instant being rolled back, before its files go
    (so no MDT reader lists a deleted file). Hold the lock."""
    if is_metadata_storage(storage) \
            or not data_config_timeline.config.table_version.keeps_metadata_table:
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


def _drop_dead_compactions(mdt: MetadataTable, mdt_timeline: Timeline) -> Timeline:
    """Take back MDT compactions left pending: they run inline under the table lock, so a
    pending one belongs to a writer that died in it. Its plan is not kept (the next one
    covers the same slices and more)."""
    dead = [i.requested_time for i in mdt_timeline.instants
            if not i.is_completed and i.action in (Action.COMPACTION, Action.COMMIT)]
    for t in dead:
        mdt.remove_instant(mdt_timeline, t)
    if dead:
        _log.warning("metadata table of %s: took back the unfinished compaction(s) %s",
                     mdt.data_storage.base_path, ", ".join(dead))
        return mdt.timeline()
    return mdt_timeline


# -- compaction and cleaning ----------------------------------------------------------------

def _layout_behind(mdt: MetadataTable, mdt_timeline: Timeline) -> bool:
    """True when the table's version writes the MDT in Hudi 1.1's schema (version 9) but
    its last MDT commit recorded 1.0's: a v8 table a Java 1.1 writer upgraded. hudi-rs
    0.5.0 cannot read a file slice of the ``files`` partition whose files carry the two
    schemas ("reconcile child-count mismatch", docs/table-version-9.md §10), so the MDT is
    compacted into 1.1's schema before its first 1.1 log."""
    if not mdt.data_config.table_version.column_stats_value_types:
        return False
    done = completed_mdt_instants(mdt_timeline)
    if not done:
        return False
    return '"valueType"' not in (mdt_timeline.commit_metadata(done[-1]).schema or "")


def _maybe_compact(mdt: MetadataTable, mdt_timeline: Timeline,
                   data_timeline: Timeline, *, force: bool = False) -> Timeline:
    """Compact the MDT when ``MAX_DELTA_COMMITS`` deltacommits (or, ``force``, any number)
    completed since its last base, all of them for completed data instants (a deltacommit
    of a data instant still pending waits for its commit or rollback), then clean."""
    boundary = base_boundary(mdt_timeline)
    valid = validity(data_timeline)
    deltas = [i for i in completed_mdt_instants(mdt_timeline)
              if i.action is Action.DELTA_COMMIT and completion_key(i) > boundary
              and not i.requested_time.startswith(BOOTSTRAP_PREFIX)]
    if (len(deltas) < MAX_DELTA_COMMITS and not force) or not all(valid(i) for i in deltas):
        return mdt_timeline
    compact(mdt, mdt_timeline, data_timeline, valid)
    mdt_timeline = mdt.timeline()
    clean(mdt, mdt_timeline)
    return mdt.timeline()
