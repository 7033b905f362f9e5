"""A write run as distributed tasks: what a Spark job (``ingest/``) calls, driver and executor.

Hudi's Spark datasource writes through the write client (``startCommit`` → the tasks' write
handles → ``commit``) and asks the table's index where keys live; pypaimon's Ray sink
through ``new_write`` / ``new_commit``. This module is that surface for tidelake's streaming
job, so that the Spark glue restates no rule of the table:

- **driver**: :class:`InstantWrite` — one instant from ``begin`` to ``finish`` (or
  ``abort``): its timeline snapshot and view (broadcast to the tasks), the picklable
  :class:`WriteTask` its tasks run (:class:`Placement` and the group writer), the insert
  buckets of the upsert partitioner and the record index's groups for the tagging tasks;
- **executor**: :class:`Placement` — where a row goes (bucket, consistent-hashing ring,
  tombstones spread over partitions: :mod:`engine.write.placement`); :class:`WriteTask` —
  placement and the write of one file group (:class:`~engine.write.group_writer.GroupWriter`);
  :class:`RecordIndexTask` — the record index's lookup of a task's keys and the write
  client's tagging of them; the GLOBAL_STATE index's reads
  (:func:`slice_key_locations`, :class:`Relocations`) and placement of new keys
  (:func:`bucket_group`, :func:`unreplaced_generation`).

The key columns a task computes before any index (record keys, partition paths, buckets,
ring nodes) are :mod:`engine.layout.incoming`'s, apart so that the read tasks that compute them
do not import the write client. The types and rules this module names without defining them
(``Timeline``, ``TableView``, ``WriteStat``, ``WriteClient``, ``Relocations``,
``HashingMetadata``, ``InsertBucket`` and ``insert_file_ids``, ``bucket_group``,
``unreplaced_generation``, ``check_conflicts``, ``FileSystemLock``) are the engine's own,
named here because this surface hands them out or the glue calls them as the engine does.
Every object a task receives is picklable.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import IndexType, TableConfig, WriteConfig
from engine.index.consistent_hashing import HashingMetadata
from engine.index.record_index import attach_orderings, locations, moving
from engine.index.relocation import Relocations
from engine.index.simple import LOCATION_SCHEMA, key_locations, tag
from engine.index.simple import ORDERING as STORED_ORDERING
from engine.index.tagging import TaggedRecords
from engine.layout.view import TableView, live_buckets
from engine.merge.policy import update_partition_path
from engine.metadata.keys import file_group_indexes
from engine.metadata.reader import GroupSlice
from engine.metadata.record_index_lookup import group_slices, is_kept, lookup_in_groups
from engine.storage import Storage
from engine.timeline.active import DATA_ACTION_NAMES, Timeline, temp_folder
from engine.timeline.commit_metadata import CommitMetadata, WriteStat
from engine.timeline.instant import Action, Instant
from engine.timeline.lock import LOCK_FILE, FileSystemLock
from engine.write.conflict import check_conflicts
from engine.write.group_writer import GroupWriter
from engine.write.partitioner import InsertBucket, insert_file_ids
from engine.write.placement import (
    bucket_file_ids,
    bucket_group,
    record_buckets,
    ring_file_ids,
    spread_tombstones,
    unreplaced_generation,
)
from engine.write.prepare import DELETE_MARKER
from engine.write.write_client import UPSERT, WriteClient

if TYPE_CHECKING:
    from engine.merge.policy import DeletePolicy
    from engine.merge.resolve import VersionColumns
    from engine.tasks import TaskRunner

__all__ = [
    "DELETE_MARKER",
    "LOCK_FILE",
    "STORED_ORDERING",
    "UPSERT",
    "FileSystemLock",
    "HashingMetadata",
    "InsertBucket",
    "InstantWrite",
    "Placement",
    "RecordIndexTask",
    "Relocations",
    "TableView",
    "Timeline",
    "WriteClient",
    "WriteStat",
    "WriteTask",
    "bucket_count",
    "bucket_group",
    "check_conflicts",
    "clustered",
    "data_commits",
    "insert_file_ids",
    "live_bucket_groups",
    "slice_key_locations",
    "unreplaced_generation",
    "write_pending",
]


# --- rules of a table's layout the glue asks ------------------------------------------------


def bucket_count(config: TableConfig, write_config: WriteConfig) -> int:
    """Buckets per partition a writer places keys by: the count the table records, else the
    writer's ``hoodie.bucket.index.num.buckets`` (a table that records none)."""
    return config.num_buckets or write_config.num_buckets


def clustered(write_config: WriteConfig) -> bool:
    """Whether a clustering may rewrite the table's file groups into new ones, so that an
    index kept outside the table must follow the keys it moved: unless the writer places keys
    by bucket (``hoodie.index.type=BUCKET``: :func:`~engine.services.clustering.
    schedule_clustering` never rewrites those groups, which :func:`~engine.write.placement.
    live_buckets` tells by the same index). A consistent-hashing table's resizes do move keys,
    but its rings place every key: no index is kept outside such a table."""
    return write_config.index_type is not IndexType.BUCKET


def data_commits(timeline: Timeline) -> list[tuple[str, Callable[[], CommitMetadata]]]:
    """Every completed data commit of ``timeline``, archived ones included, oldest first: its
    instant time and how to read its commit metadata (read on demand: the archived ones
    come from the LSM history)."""
    history = [(row.requested_time, functools.partial(timeline.archived_commit_metadata, row))
               for row in timeline.archived() if row.action in DATA_ACTION_NAMES]
    active = [(i.requested_time, functools.partial(timeline.commit_metadata, i))
              for i in timeline.completed_data_instants]
    return sorted(history + active, key=lambda item: item[0])


def write_pending(timeline: Timeline) -> bool:
    """Whether a data instant (commit or deltacommit) of ``timeline`` is requested or inflight:
    a write that has not completed (or failed and is not rolled back yet)."""
    return bool(timeline.pending((Action.COMMIT, Action.DELTA_COMMIT)))


def live_bucket_groups(view: TableView, write_config: WriteConfig) -> dict[tuple[str, int], str]:
    """(partition, bucket) → file id of the live bucket groups keys are placed in
    (:func:`~engine.layout.view.live_buckets`, under the writer's index). Driver side."""
    return dict(live_buckets(view, write_config.index_type))


def slice_key_locations(view: TableView, indexes: Iterable[int]) -> Iterator[pa.Table]:
    """Per slice of ``indexes`` (into the view's latest file slices): every live key with
    its location (``key``, ``loc_partition``, ``loc_file_id``, and the stored ordering
    value, :data:`STORED_ORDERING`, when the table has one). What a bootstrap task of an
    index kept outside the table reads. Executor side."""
    reader = view.slice_reader()
    slices = view.latest_file_slices()
    for index in indexes:
        yield key_locations(reader, [slices[index]], None)


# --- the write tasks (executor side) ----------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where a write task's rows go (picklable): the file group of a key's bucket or of its
    node in a consistent-hashing ring, as the write client places keys
    (:mod:`engine.write.placement`)."""

    table_name: str
    num_buckets: int
    index: IndexType
    """The writer's ``hoodie.index.type``: whether live groups are bucket groups."""
    storage: Storage
    """The table (a partition without a ring gets its initial one written)."""

    def record_buckets(self, keys: pa.Array | pa.ChunkedArray) -> pa.Array:
        """The bucket of each record key (a key Java's bucket index cannot parse is a bad
        record: :class:`~engine.errors.InvalidRecordError`)."""
        return pa.array(record_buckets(keys, self.num_buckets), pa.int32())

    def spread_tombstones(self, view: TableView, rows: pa.Table, buckets: Sequence[int]
                          ) -> pa.Table:
        """Deletes without a partition copied to their bucket in every partition holding it
        (:func:`~engine.write.placement.spread_tombstones`)."""
        return spread_tombstones(rows, buckets, live_buckets(view, self.index))

    def bucket_groups(self, view: TableView, partitions: pa.Array, buckets: pa.Array
                      ) -> pa.Array:
        """The file group of each (partition, bucket): the live one of the view, else the
        bucket's new id (:func:`~engine.write.placement.bucket_file_ids`)."""
        return bucket_file_ids(partitions, buckets, table_name=self.table_name,
                               live=live_buckets(view, self.index))

    def ring_groups(self, partitions: pa.Array, ring_instants: pa.Array, nodes: pa.Array,
                    rings: Mapping[str, HashingMetadata]) -> tuple[pa.Array, tuple[str, ...]]:
        """Consistent hashing: the file group of each row's node in the snapshot's ring
        (``rings``: the view's), and the partitions whose ring is not the one the node was
        found in (:func:`~engine.write.placement.ring_file_ids`)."""
        return ring_file_ids(partitions, ring_instants, nodes, rings=rings,
                             storage=self.storage, num_buckets=self.num_buckets)


@dataclass(frozen=True)
class WriteTask:
    """What every write task of an instant runs (picklable, built by
    :meth:`InstantWrite.write_task`): placement of its rows and the write of each file
    group, as the write client plans and writes them."""

    placement: Placement
    writer: GroupWriter

    def write(self, view: TableView, partition: str, file_id: str, rows: pa.Table, *,
              decided: bool = False, located_keys: pa.Array | None = None,
              task_partition: int = 0, stage: int = 0, attempt: int = 0) -> WriteStat | None:
        """Write one file group's rows (:meth:`~engine.write.group_writer.GroupWriter.write`)."""
        return self.writer.write(view, partition, file_id, rows, decided=decided,
                                 located_keys=located_keys, task_partition=task_partition,
                                 stage=stage, attempt=attempt)


# --- the record index's tagging tasks (executor side) -----------------------------------------


@dataclass(frozen=True)
class RecordIndexTask:
    """What a record-index tagging task needs (picklable, built by
    :meth:`InstantWrite.record_index_task`): the record_index's latest file group slices
    (their count is the routing modulus; empty when the partition is not complete — the
    lookup then reads the table, as GLOBAL_SIMPLE)."""

    storage: Storage
    config: TableConfig
    write_config: WriteConfig
    pieces: tuple[GroupSlice, ...] = field(default=())

    @property
    def groups(self) -> int:
        return len(self.pieces)

    def group_indexes(self, keys: Sequence[str]) -> np.ndarray:
        """The record_index file group each key hashes to (routing of the tasks)."""
        return file_group_indexes(list(keys), self.groups)

    def lookup(self, view: TableView, keys: pa.Array, *, upsert_keys: pa.Array,
               upsert_partitions: pa.Array, tombstoned: pa.Array
               ) -> tuple[pa.Table, tuple[str, ...]]:
        """Locations of ``keys`` (distinct) in the live groups of ``view`` and the
        record_index file groups read: only those the keys hash to. Under event time the
        stored ordering value comes along for the locations the batch compares with: those
        an upsert (``upsert_keys`` in ``upsert_partitions``) moves away from, and those of
        ``tombstoned`` keys (a delete without an ordering value deletes at the stored one);
        an update in place is written uncompared (if it loses, every merge keeps the stored
        version)."""
        reader = view.slice_reader(use_threads=False)
        slices = view.latest_file_slices()
        if not slices or not len(keys):
            return LOCATION_SCHEMA.empty_table(), ()
        read: tuple[str, ...] = ()
        if not self.pieces:  # not complete: the engine's fallback (reads the table)
            found = locations(reader, slices, keys)
        else:
            lookup = lookup_in_groups(self.storage, self.config, self.pieces, keys,
                                      cache_bytes=self.write_config.record_index_cache_bytes)
            found, read = lookup.locations, lookup.groups_read
        live = {(s.partition_path, s.file_id): s for s in slices}
        compared = None
        if self.config.orders_by_event_time:
            if STORED_ORDERING in found.column_names:  # the fallback read every value
                compared = pa.array(np.zeros(found.num_rows, dtype=bool))
            else:
                moves = moving(found, upsert_keys, upsert_partitions,
                               update_partition_path=update_partition_path(self.write_config))
                compared = pc.or_(moves, pc.is_in(found.column("key"), value_set=tombstoned))
        return attach_orderings(reader, live, found, read=compared), read

    def tag_upserts(self, view: TableView, records: pa.Table, found: pa.Table
                    ) -> TaggedRecords:
        """Which records update which group, which old copies a move deletes, which are new
        (:meth:`~engine.write.write_client.WriteClient.tag_located`)."""
        client = WriteClient(self.storage, self.config, self.write_config)
        return client.tag_located(records, view.slice_reader(use_threads=False),
                                  view.latest_file_slices(), found)

    @staticmethod
    def delete_locations(keys: pa.Array, found: pa.Table) -> pa.Table:
        """Every location of every delete's key (one row per key and location; ``row``:
        the delete's position), as the global index deletes a key wherever it is stored."""
        return tag(keys, pa.nulls(len(keys), pa.string()), found, global_index=True)


# --- the driver's instant -------------------------------------------------------------------


@dataclass
class InstantWrite:
    """One instant written by distributed tasks, from :meth:`start` to :meth:`finish` or
    :meth:`abort`. Driver only (its :attr:`view` and :meth:`write_task` go to the tasks)."""

    client: WriteClient
    timeline: Timeline
    """The snapshot the instant began with."""
    instant: Instant
    view: TableView
    """The table view of :attr:`timeline`, listed once (broadcast to the write tasks)."""

    @classmethod
    def start(cls, storage: Storage, config: TableConfig, write_config: WriteConfig, *,
              runner: TaskRunner | None = None) -> InstantWrite:
        """Roll back failed writes, start an inflight instant (its heartbeat beats until
        :meth:`finish` or :meth:`abort`) and list the view of its snapshot. ``runner``: where
        a metadata-table index built at the start runs its tasks."""
        client = WriteClient(storage, config, write_config)
        if runner is not None:
            client.task_runner = runner
        timeline, instant = client.begin()
        view = TableView(storage, timeline)
        view.materialize()
        return cls(client, timeline, instant, view)

    @property
    def instant_time(self) -> str:
        return self.instant.requested_time

    @property
    def scratch_folder(self) -> str:
        """Absolute path of the instant's scratch folder (deleted by its commit or rollback)."""
        return self.client.scratch_folder(self.instant)

    def scratch_path(self, name: str) -> str:
        """A folder of the instant's scratch space, relative to the table (tasks stage files
        there; the commit or the rollback deletes them)."""
        return f"{temp_folder(self.instant_time)}/{name}"

    def write_task(self, data_schema: pa.Schema, *, columns: VersionColumns, event_time: bool,
                   policy: DeletePolicy) -> WriteTask:
        """What the instant's write tasks run (the write client's group writer)."""
        client = self.client
        writer = client.group_writer(self.instant, data_schema, columns=columns,
                                     event_time=event_time, policy=policy,
                                     timeline=self.timeline)
        placement = Placement(client.config.name,
                              bucket_count(client.config, client.write_config),
                              client.write_config.index_type, client.storage)
        return WriteTask(placement, writer)

    def record_index_task(self) -> RecordIndexTask:
        """What the instant's record-index tagging tasks need."""
        storage = self.client.storage
        pieces = tuple(group_slices(storage, self.timeline)) if is_kept(storage) else ()
        return RecordIndexTask(storage, self.client.config, self.client.write_config, pieces)

    def insert_buckets(self, counts: Mapping[str, int]) -> dict[str, list[InsertBucket]]:
        """Where the inserts of each partition go (the upsert partitioner: small file groups
        first, then new ones; :meth:`~engine.write.write_client.WriteClient.insert_buckets`)."""
        return self.client.insert_buckets(self.timeline, self.view, UPSERT, counts)

    def finish(self, stats: Sequence[WriteStat], data_schema: pa.Schema,
               extra_metadata: Mapping[str, str]) -> str:
        """Complete the instant with the tasks' stats (the commit point); its time."""
        extra = self.client.commit_extra(data_schema, extra_metadata)
        done = self.client.finish(self.timeline, self.instant, stats, UPSERT, extra)
        return done.requested_time

    def abort(self) -> None:
        """Roll the instant back now, rather than at the next write."""
        self.client.abort(self.instant)
