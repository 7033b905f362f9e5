"""The table view: what one timeline snapshot sees of the table's files.

:class:`TableView` is built once for a snapshot (a loaded :class:`~engine.timeline.active.Timeline`,
optionally ``as_of`` an instant or up to an ``end_completion``), as hudi-rs's
``FileSystemView`` is, and every writer, reader and table service asks it: which instants
are visible, the file slices (the latest of each live group, or every slice), lookups by
partition and by group, the (partition, bucket) → file id map of the bucket layout, the
consistent-hashing rings, the groups pending compactions and clusterings hold and the groups
replacecommits replaced, and a :class:`~engine.read.slice_reader.SliceReader` over the snapshot.

The data files are listed by one method, :meth:`TableView.list_table_files`, once per view;
everything else is derived from that listing and the timeline, computed on first use and
kept.

Picklable, so a Spark job broadcasts the view its instant planned from to the write tasks
(:mod:`ingest.spark_write`): pickling computes the parts tasks use (latest slices, the bucket
map, the rings of a consistent-hashing table, the table schema) and leaves the listing and
the timeline's caches behind, so a task never lists the table again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

import pyarrow as pa

from engine.config import IndexType, TableConfig
from engine.index.bucket import bucket_from_file_id
from engine.index.consistent_hashing import HashingMetadata, load_metadata
from engine.layout.file_group import (
    FileSlice,
    TableFiles,
    Visibility,
    build_file_slices,
    list_table_files,
    replaced_file_groups,
    visible_instants,
)
from engine.layout.plans import FileGroupId, planned_groups
from engine.metadata.listing import metadata_listing
from engine.read.slice_reader import SliceReader
from engine.schema import table_schema
from engine.storage import Storage
from engine.timeline.active import Timeline
from engine.timeline.instant import Action

_SERVICE_ACTIONS = (Action.COMPACTION, Action.LOG_COMPACTION, Action.CLUSTERING,
                    Action.REPLACE_COMMIT)
_REWRITE_ACTIONS = (Action.COMPACTION, Action.CLUSTERING)


class TableView:
    """The files of one table as one timeline snapshot sees them (see the module docstring).

    Built on the driver; methods that read storage do so once and keep the answer. Not
    thread-safe while parts are first computed.
    """

    def __init__(self, storage: Storage, timeline: Timeline, *, as_of: str | None = None,
                 end_completion: str | None = None) -> None:
        self.storage = storage
        self.timeline = timeline
        self.config: TableConfig = timeline.config
        self.visible: Visibility = visible_instants(timeline, as_of=as_of,
                                                    end_completion=end_completion)
        """Completed data instants this view sees: requested time → completion key."""
        self._files: TableFiles | None = None
        self._latest: list[FileSlice] | None = None
        self._by_group: dict[FileGroupId, FileSlice] | None = None
        self._by_partition: dict[str, list[FileSlice]] | None = None
        self._buckets: dict[tuple[str, int], str] | None = None
        self._rings: dict[str, HashingMetadata | None] = {}
        self._schema: tuple[pa.Schema | None] | None = None

    @classmethod
    def load(cls, storage: Storage, config: TableConfig, *, as_of: str | None = None,
             end_completion: str | None = None) -> TableView:
        """The view of the timeline as it is now in storage."""
        return cls(storage, Timeline.load(storage, config), as_of=as_of,
                   end_completion=end_completion)

    # -- the listing ----------------------------------------------------------------------

    def list_table_files(self) -> TableFiles:
        """Every data file of the table, no visibility applied: the one listing of the view
        (made on first use, then kept). From the metadata table's ``files`` partition when
        the table keeps one (only files of completed instants then), else a walk of the
        table folder."""
        if self._files is None:
            self._files = (metadata_listing(self.storage, self.timeline)
                           or list_table_files(self.storage))
        return self._files

    # -- file slices ----------------------------------------------------------------------

    def latest_file_slices(self) -> list[FileSlice]:
        """The latest slice of every live file group, by (partition, file id)."""
        if self._latest is None:
            self._latest = build_file_slices(self.list_table_files(), self.timeline,
                                             self.visible)
        return self._latest

    def all_file_slices(self, *, pending_slice_starts: Mapping[FileGroupId, str] | None = None,
                        include_replaced: bool = False) -> list[FileSlice]:
        """Every slice of every live file group, oldest first within a group
        (:func:`~engine.layout.file_group.build_file_slices` for ``pending_slice_starts`` and
        ``include_replaced``: the cleaner's view)."""
        return build_file_slices(self.list_table_files(), self.timeline, self.visible,
                                 latest_only=False, pending_slice_starts=pending_slice_starts,
                                 include_replaced=include_replaced)

    def latest_by_group(self) -> Mapping[FileGroupId, FileSlice]:
        """(partition, file id) → the group's latest slice."""
        if self._by_group is None:
            self._by_group = {(s.partition_path, s.file_id): s
                              for s in self.latest_file_slices()}
        return self._by_group

    def latest_slice(self, partition: str, file_id: str) -> FileSlice | None:
        """The latest slice of one file group; None if the group is not live."""
        return self.latest_by_group().get((partition, file_id))

    def latest_in_partition(self, partition: str) -> list[FileSlice]:
        """The latest slices of one partition's live groups, by file id."""
        if self._by_partition is None:
            by_partition: dict[str, list[FileSlice]] = {}
            for s in self.latest_file_slices():
                by_partition.setdefault(s.partition_path, []).append(s)
            self._by_partition = by_partition
        return self._by_partition.get(partition, [])

    def partitions(self) -> list[str]:
        """Partitions with a live file group, sorted."""
        return sorted({s.partition_path for s in self.latest_file_slices()})

    # -- bucket layout and rings ----------------------------------------------------------

    def bucket_groups(self) -> Mapping[tuple[str, int], str]:
        """(partition, bucket) → file id of the live groups whose id names a bucket (the
        first such group by file id, where two do). Whether keys live in them is
        :func:`live_buckets`'s rule."""
        if self._buckets is None:
            buckets: dict[tuple[str, int], str] = {}
            for s in self.latest_file_slices():
                try:
                    buckets.setdefault((s.partition_path, bucket_from_file_id(s.file_id)),
                                       s.file_id)
                except ValueError:
                    continue
            self._buckets = buckets
        return self._buckets

    def ring(self, partition: str) -> HashingMetadata | None:
        """Consistent hashing: the partition's committed ring as of this snapshot
        (:func:`~engine.index.consistent_hashing.load_metadata`); None without one."""
        if partition not in self._rings:
            self._rings[partition] = load_metadata(self.storage, self.timeline, partition)
        return self._rings[partition]

    def rings(self) -> dict[str, HashingMetadata]:
        """Consistent hashing: partition → ring, for the partitions with live groups that
        have one."""
        found = {p: self.ring(p) for p in self.partitions()}
        return {p: ring for p, ring in found.items() if ring is not None}

    # -- pending and replaced groups ------------------------------------------------------

    def pending_service_groups(self) -> set[FileGroupId]:
        """Groups a pending compaction, log compaction or clustering plan (or a pending
        replacecommit's plan) covers: a service plans a group only if no other plan holds
        it (compaction and clustering scheduling)."""
        return self._planned(_SERVICE_ACTIONS)

    def pending_rewrite_groups(self) -> set[FileGroupId]:
        """Groups a pending compaction or clustering will rewrite: the write client places
        no new inserts in them. Unlike :meth:`pending_service_groups`, a log compaction (it
        adds a log, the group keeps its slice) and a pending replacecommit do not count."""
        return self._planned(_REWRITE_ACTIONS)

    def _planned(self, actions: tuple[Action, ...]) -> set[FileGroupId]:
        groups: set[FileGroupId] = set()
        for pending in self.timeline.pending(actions):
            groups |= planned_groups(self.timeline, pending)
        return groups

    def replaced_groups(self) -> set[FileGroupId]:
        """Groups replaced by replacecommits this view sees (archived ones too once the view
        read an archived instant's files): never part of the view's slices."""
        self.latest_file_slices()  # the files first: they decide whether archived ones count
        return replaced_file_groups(self.timeline, self.visible)

    # -- reading --------------------------------------------------------------------------

    def table_schema(self) -> pa.Schema | None:
        """The table's Arrow schema (meta fields first) as of the snapshot
        (:func:`engine.schema.table_schema`); None if no commit recorded one."""
        if self._schema is None:
            self._schema = (table_schema(self.timeline),)
        return self._schema[0]

    def slice_reader(self, schema: pa.Schema | None = None, *,
                     use_threads: bool = True) -> SliceReader:
        """A reader of this view's slices (``schema``: the table's, by default): the slice
        reader sits below the view (:mod:`engine.read.slice_reader`), the view only hands out
        one built on its instants."""
        return SliceReader(self.storage, self.timeline, self.visible,
                           self.table_schema() if schema is None else schema,
                           use_threads=use_threads)

    # -- pickling -------------------------------------------------------------------------

    def materialize(self) -> TableView:
        """Compute now what write tasks use (the listing, the latest slices, the bucket map,
        the table schema, a consistent-hashing table's rings); returns the view."""
        self.latest_in_partition("")
        self.bucket_groups()
        self.table_schema()
        if self.config.consistent_hashing:
            self.rings()
        return self

    def __getstate__(self) -> dict[str, Any]:
        """:meth:`materialize`, then leave the listing and the timeline's caches behind (a
        task works from the slices; it never lists the table)."""
        self.materialize()
        state = dict(self.__dict__)
        state["_files"] = None
        lean = Timeline(self.storage, self.config, self.timeline.instants)
        visible = Visibility(lean, self.visible.active, as_of=self.visible.as_of,
                             end_completion=self.visible.end_completion)
        visible.used_archived = self.visible.used_archived
        state["timeline"], state["visible"] = lean, visible
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


LiveBuckets: TypeAlias = Mapping[tuple[str, int], str]
"""(partition, bucket) → file id of the live group (:meth:`TableView.bucket_groups`)."""


def live_buckets(view: TableView, index: IndexType | None) -> LiveBuckets:
    """The live bucket groups of ``view`` that keys are placed in, and so found in, under
    ``index`` (``hoodie.index.type``: for a writer, the one the table records or, on a table
    that records none, the writer's option; for a reader, the one the table records): the
    groups whose file id names a bucket (:meth:`TableView.bucket_groups`, the first 8
    characters as Hudi's ``BucketIdentifier.bucketIdFromFileId`` reads them) under the
    ``BUCKET`` index, none under any other (a UUID file id may start with 8 digits by
    chance). The write client, the streaming job's write tasks and its global-state index
    place keys by it (:mod:`engine.write.placement`); the reader's bucket pruning keeps, of
    these groups, those of the keys' buckets
    (:meth:`engine.read.reader.TableReader.plan`)."""
    return view.bucket_groups() if index is IndexType.BUCKET else {}
