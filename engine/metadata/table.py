"""The metadata table (MDT) as a table: where it lives, its ``hoodie.properties``, its
timeline, and which of its partitions the data table declares.

The MDT is a MERGE_ON_READ Hudi table at ``.hoodie/metadata`` with HFile base files, no meta
fields and the record key ``key`` (``hudi-metadata-table.md`` §3). Readers trust it only
through the data table's ``hoodie.table.metadata.partitions``: a partition is listed there
once it is complete, and the MDT is used for listing only while ``files`` is listed.

Everything here runs on the driver, under the table lock when it writes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from engine.config import (
    P_CHECKSUM,
    MergeMode,
    TableConfig,
    TableType,
)
from engine.layout.properties import dumps, loads
from engine.storage import Storage
from engine.timeline.active import HOODIE, Timeline
from engine.timeline.instant import Action, Instant, State

_log = logging.getLogger(__name__)

METADATA_FOLDER = f"{HOODIE}/metadata"
"""The MDT's base path, relative to the data table's."""
PROPERTIES = f"{HOODIE}/hoodie.properties"

P_PARTITIONS = "hoodie.table.metadata.partitions"
P_PARTITIONS_INFLIGHT = "hoodie.table.metadata.partitions.inflight"

FILES = "files"
BOOTSTRAP_PREFIX = "00000000000000"
"""MDT-only instants (initialization of a partition) start with this; Java treats them as
valid whatever the data timeline says (``getValidInstantTimestamps``)."""

METADATA_PAYLOAD = "org.apache.hudi.metadata.HoodieMetadataPayload"
CUSTOM_STRATEGY_ID = "00000000-0000-0000-0000-000000000000"


def is_metadata_storage(storage: Storage) -> bool:
    """True if ``storage`` is rooted at a metadata table (its own timeline completes without
    an MDT of its own)."""
    return storage.base_path.rstrip("/").endswith(f"/{METADATA_FOLDER}")


def read_data_properties(storage: Storage) -> dict[str, str]:
    """The data table's ``hoodie.properties`` as stored now (read fresh: another writer may
    have declared or dropped MDT partitions since this process opened the table)."""
    return loads(storage.read(PROPERTIES).decode("latin-1"))


def declared_partitions(storage: Storage) -> tuple[str, ...]:
    """The MDT partitions the data table declares complete
    (``hoodie.table.metadata.partitions``)."""
    try:
        props = read_data_properties(storage)
    except FileNotFoundError:
        return ()
    return _declared(props)


def _declared(props: dict[str, str]) -> tuple[str, ...]:
    return tuple(p for p in props.get(P_PARTITIONS, "").split(",") if p)


# -- what one data-timeline snapshot reads of the MDT, once ----------------------------------

_PROPERTIES_MEMO = "data_properties"
_MDT_TIMELINE_MEMO = "metadata_timeline"


def snapshot_properties(data_timeline: Timeline) -> dict[str, str] | None:
    """The data table's ``hoodie.properties`` as read along with ``data_timeline`` (one
    ``GET`` per snapshot, :attr:`Timeline.memo`); None if the file is missing."""
    memo = data_timeline.memo
    if _PROPERTIES_MEMO not in memo:
        try:
            memo[_PROPERTIES_MEMO] = read_data_properties(data_timeline.storage)
        except FileNotFoundError:
            memo[_PROPERTIES_MEMO] = None
    props: dict[str, str] | None = memo[_PROPERTIES_MEMO]
    return props


def snapshot_declared(data_timeline: Timeline) -> tuple[str, ...]:
    """:func:`declared_partitions` as read along with ``data_timeline`` (once per
    snapshot)."""
    return _declared(snapshot_properties(data_timeline) or {})


def snapshot_metadata_timeline(data_timeline: Timeline) -> Timeline | None:
    """The MDT's timeline, loaded after ``data_timeline`` and kept with it (one ``HEAD`` of
    the MDT's ``hoodie.properties`` and one listing per snapshot); None if the MDT is
    missing. Valid as long as nobody writes the MDT through this snapshot
    (:func:`forget_metadata`)."""
    memo = data_timeline.memo
    if _MDT_TIMELINE_MEMO not in memo:
        mdt = MetadataTable(data_timeline.storage, data_timeline.config)
        memo[_MDT_TIMELINE_MEMO] = mdt.timeline() if mdt.exists else None
    found: Timeline | None = memo[_MDT_TIMELINE_MEMO]
    return found


def forget_metadata(data_timeline: Timeline) -> None:
    """Drop what ``data_timeline`` kept of ``hoodie.properties`` and the MDT: the caller
    changed them (initialized, rebuilt, synced or dropped the MDT)."""
    data_timeline.memo.pop(_PROPERTIES_MEMO, None)
    data_timeline.memo.pop(_MDT_TIMELINE_MEMO, None)


def set_declared_partitions(storage: Storage, partitions: Iterable[str],
                            inflight: Iterable[str] = ()) -> None:
    """Rewrite the data table's ``hoodie.properties`` with these MDT partitions (sorted,
    comma-joined, as Java writes them; both keys always present). Hold the lock."""
    props = read_data_properties(storage)
    props[P_PARTITIONS] = ",".join(sorted(set(partitions)))
    props[P_PARTITIONS_INFLIGHT] = ",".join(sorted(set(inflight)))
    text = dumps(props, last_key=P_CHECKSUM)
    storage.write_replace(PROPERTIES, text.encode("latin-1"))


def metadata_version(data_config: TableConfig) -> int:
    """The MDT's table version: the data table's (8 or 9; Hudi upgrades both together, the
    MDT first). Its own ``hoodie.properties`` keeps the payload and CUSTOM merge keys on
    version 9 too (Hudi 1.1.1's, ``docs/table-version-9.md`` §2)."""
    return max(8, data_config.version)


def metadata_properties(data_config: TableConfig) -> dict[str, str]:
    """The MDT's own ``hoodie.properties`` (``hudi-metadata-table.md`` §3.2; hudi-rs returns
    no rows, silently, without ``populate.meta.fields=false`` and ``recordkey.fields=key``)."""
    from engine.config import table_checksum

    name = f"{data_config.name}_metadata"
    version = str(metadata_version(data_config))
    return {
        "hoodie.table.name": name,
        "hoodie.table.type": TableType.MERGE_ON_READ.value,
        "hoodie.table.version": version,
        "hoodie.table.initial.version": version,
        "hoodie.timeline.layout.version": "2",
        "hoodie.timeline.path": "timeline",
        "hoodie.timeline.history.path": "history",
        "hoodie.archivelog.folder": "history",
        "hoodie.table.base.file.format": "HFILE",
        "hoodie.table.recordkey.fields": "key",
        "hoodie.populate.meta.fields": "false",
        "hoodie.table.keygenerator.type": "HOODIE_TABLE_METADATA",
        "hoodie.compaction.payload.class": METADATA_PAYLOAD,
        "hoodie.record.merge.mode": "CUSTOM",
        "hoodie.record.merge.strategy.id": CUSTOM_STRATEGY_ID,
        "hoodie.datasource.write.drop.partition.columns": "false",
        P_CHECKSUM: str(table_checksum("", name)),
    }


class MetadataTable:
    """The MDT of one data table: its storage (rooted at ``.hoodie/metadata``), config and
    timeline. Cheap to build; reads nothing until asked."""

    def __init__(self, data_storage: Storage, data_config: TableConfig) -> None:
        self.data_storage = data_storage
        self.data_config = data_config
        self.storage = data_storage.child(METADATA_FOLDER)
        self.config = TableConfig(
            name=f"{data_config.name}_metadata", table_type=TableType.MERGE_ON_READ,
            version=metadata_version(data_config), record_key_fields=("key",),
            partition_fields=(),
            precombine_field=None, merge_mode=MergeMode.COMMIT_TIME_ORDERING,
            hive_style=False, url_encode=False, populate_meta_fields=False,
            create_schema=None)

    @property
    def exists(self) -> bool:
        """True once the MDT's ``hoodie.properties`` is written."""
        return self.storage.exists(PROPERTIES)

    def create(self) -> None:
        """Write the MDT's folders and ``hoodie.properties`` (hold the lock)."""
        for folder in (HOODIE, f"{HOODIE}/timeline", f"{HOODIE}/timeline/history",
                       f"{HOODIE}/.temp", f"{HOODIE}/.heartbeat"):
            self.storage.makedirs(folder)
        text = dumps(metadata_properties(self.data_config), last_key=P_CHECKSUM)
        self.storage.write_replace(PROPERTIES, text.encode("latin-1"))

    def timeline(self) -> Timeline:
        """The MDT's timeline as it is now."""
        return Timeline.load(self.storage, self.config)

    def delete(self) -> None:
        """Remove the whole MDT folder (the data table must no longer declare it)."""
        self.data_storage.delete_tree(METADATA_FOLDER)

    def remove_instant(self, timeline: Timeline, instant_time: str) -> bool:
        """Take an MDT instant back whole: its completed file first (readers stop trusting
        it), then the files it wrote and its pending timeline files. Returns True if
        anything was removed. Hold the lock.

        An instant absent from the timeline owns no file: every MDT writer creates its
        requested file before any file, and this removes files before timeline files. So the
        common call — a data instant's sync, before its deltacommit exists — lists nothing."""
        found = [i for i in timeline.instants if i.requested_time == instant_time]
        if not found:
            return False
        for instant in found:
            if instant.is_completed:
                self.storage.delete(
                    f"{timeline.folder}/{instant.file_name(self.config.timeline_layout)}")
        self._remove_files_of(instant_time)
        for instant in found:
            timeline.delete_instant_files(instant)
        return True

    def _remove_files_of(self, instant_time: str) -> bool:
        from engine.layout.file_group import list_table_files

        removed = False
        files = list_table_files(self.storage)
        paths = [f.path for f in files.base_files if f.instant_time == instant_time]
        paths += [f.path for f in files.log_files if f.instant_time == instant_time]
        for path in paths:
            self.storage.delete(path)
            removed = True
        return removed


def completed_mdt_instants(timeline: Timeline) -> list[Instant]:
    """The MDT's completed deltacommits and compaction commits, by completion."""
    return sorted((i for i in timeline.instants
                   if i.state is State.COMPLETED
                   and i.action in (Action.DELTA_COMMIT, Action.COMMIT, Action.COMPACTION)),
                  key=lambda i: i.completion_time or i.requested_time)
