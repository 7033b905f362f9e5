"""Planning one instant's write: every record and delete tagged and placed, one write task per
touched file group.

:meth:`Planner.tasks` is the plan step of :meth:`engine.write.write_client.WriteClient.plan`:
deletes go to the file groups holding their keys (:meth:`Planner.locate`: a bucket index
computes them, other indexes look them up, :meth:`engine.index.tagging.Tagger.locate`);
records go to their bucket's group (bucket indexes, :mod:`engine.write.placement`), or
updates to the groups the index finds their keys in and inserts to small groups first, then
new ones (:meth:`Planner.insert_buckets`, Hudi's upsert partitioner); each touched group's
task is the :class:`~engine.write.group_writer.TaskRule`'s. Nothing is written here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from engine.config import IndexType, TableConfig, WriteConfig
from engine.index.consistent_hashing import HashingMetadata, load_or_create_metadata
from engine.index.tagging import Groups, Tagger, split_by_columns
from engine.layout.file_group import FileSlice
from engine.layout.view import TableView, live_buckets
from engine.read.slice_reader import SliceReader
from engine.schema import PARTITION_PATH, RECORD_KEY
from engine.storage import Storage
from engine.timeline.active import Timeline
from engine.timeline.instant import Instant
from engine.write.group_writer import BULK_INSERT, UPSERT, TaskRule
from engine.write.partitioner import InsertBucket, assign_inserts, average_record_size
from engine.write.placement import (
    bucket_group,
    place_buckets,
    record_buckets,
    routed,
)
from engine.write.write_task import WriteContext, WriteTask


@dataclass
class WritePlan:
    """An instant's tasks, ready to execute, and the context they share."""

    instant: Instant
    context: WriteContext
    tasks: list[WriteTask]
    operation: str
    extra_metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Planner:
    """One writer's planning: its table, options, tagging and task rule."""

    storage: Storage
    config: TableConfig
    write_config: WriteConfig
    tagger: Tagger
    rule: TaskRule

    def tasks(self, timeline: Timeline, view: TableView, operation: str,
              records: pa.Table | None, deletes: pa.Table | None) -> list[WriteTask]:
        """Tag and place every record and delete of ``view`` (the snapshot ``timeline``);
        one task per touched file group."""
        reader = view.slice_reader()
        group_records: Groups = {}
        group_deletes: Groups = {}
        group_updates: dict[tuple[str, str], list[pa.Array]] = {}
        index = self.write_config.index_type
        # An upsert tagged by a key lookup knows, per group, which keys it updates in place
        # (the rest enter the group): its appends then keep the record_index unread.
        tagged = operation == UPSERT and index is not IndexType.BUCKET

        rings: dict[str, HashingMetadata] = {}

        def ring_of(partition: str) -> HashingMetadata:
            if partition not in rings:
                rings[partition] = view.ring(partition) or load_or_create_metadata(
                    self.storage, timeline, partition, self.write_config.num_buckets)
            return rings[partition]

        if deletes is not None and deletes.num_rows:
            located = self.locate(deletes, reader, view, ring_of)
            for group, part in _split_by_group(located):
                # Non-blocking: a delete may address a bucket group not created yet (locate).
                if view.latest_slice(*group) is not None or self.rule.log_only_inserts:
                    group_deletes.setdefault(group, []).append(part)

        if records is not None and records.num_rows:
            if index is IndexType.BUCKET and self.config.consistent_hashing:
                for part, fid, rows in routed(records, ring_of):
                    group_records.setdefault((part, fid), []).append(
                        records.take(pa.array(rows)))
            elif index is IndexType.BUCKET:
                for group, rows in place_buckets(records, table_name=self.config.name,
                                                 num_buckets=self.write_config.num_buckets,
                                                 live=live_buckets(view, index)):
                    group_records.setdefault(group, []).append(rows)
            else:
                self._place_simple(timeline, operation, records, reader, view,
                                   group_records, group_deletes, group_updates)

        tasks: list[WriteTask] = []
        for group in sorted(set(group_records) | set(group_deletes)):
            updated = group_updates.get(group, [])
            task = self.rule.task(view, *group, _concat(group_records.get(group)),
                                  _concat(group_deletes.get(group)), operation=operation,
                                  task_partition=len(tasks),
                                  num_updates=sum(len(keys) for keys in updated),
                                  located_keys=(pa.concat_arrays(updated) if updated
                                                else pa.array([], pa.string()))
                                  if tagged else None)
            if task is not None:
                tasks.append(task)
        return tasks

    def locate(self, deletes: pa.Table, reader: SliceReader, view: TableView,
               ring_of: Callable[[str], HashingMetadata]) -> pa.Table:
        """Deletes with the partition and file group their key lives in (found ones only).

        Non-blocking mode, BUCKET index, partition known: a delete whose bucket has no file
        group in the snapshot goes to the group the bucket's first insert creates
        (:func:`engine.write.placement.new_bucket_file_id`), as Java's NBCC bucket writers
        address an unknown bucket by its fixed id (``BucketIdentifier.newBucketFileIdForNBCC``).
        A concurrent writer may create that group before either commits; the delete, a log
        block ordered by event time like the insert, then deletes the key whichever commits
        first.
        """
        known_partition = PARTITION_PATH in deletes.column_names
        if (self.write_config.index_type is IndexType.BUCKET and known_partition
                and self.config.consistent_hashing):
            groups: list[str | None] = [None] * deletes.num_rows
            for _, group_id, rows in routed(deletes, ring_of):
                for i in rows.tolist():
                    groups[i] = group_id
            return deletes.append_column("_file_id", pa.array(groups, pa.string()))
        if (self.write_config.index_type is IndexType.BUCKET and known_partition):
            buckets = record_buckets(deletes.column(RECORD_KEY), self.write_config.num_buckets)
            live = live_buckets(view, self.write_config.index_type)
            file_ids = []
            for part, b in zip(deletes.column(PARTITION_PATH).to_pylist(), buckets.tolist(),
                               strict=True):
                # Only non-blocking writers address a bucket group not created yet.
                file_ids.append(bucket_group(live, self.config.name, part, b)
                                if self.rule.log_only_inserts else live.get((part, b)))
            located = deletes.append_column("_file_id", pa.array(file_ids, pa.string()))
            return located.filter(pc.is_valid(located.column("_file_id")))
        return self.tagger.locate(deletes, reader, view.latest_file_slices())

    def _place_simple(self, timeline: Timeline, operation: str, records: pa.Table,
                      reader: SliceReader, view: TableView, group_records: Groups,
                      group_deletes: Groups,
                      group_updates: dict[tuple[str, str], list[pa.Array]]) -> None:
        global_index = self.write_config.index_type.is_global
        inserts = records
        slices = view.latest_file_slices()
        if operation == UPSERT and slices:
            inserts = self.tagger.tag_updates(records, reader, slices, global_index,
                                              group_records, group_deletes, group_updates)
        if not inserts.num_rows:
            return
        parts = inserts.column(PARTITION_PATH).combine_chunks()
        rows_of = {part: inserts.filter(pc.equal(parts, part))
                   for part in parts.unique().to_pylist()}
        placements = self.insert_buckets(timeline, view, operation,
                                         {part: rows.num_rows for part, rows in rows_of.items()})
        for part, part_rows in rows_of.items():
            offset = 0
            for bucket in placements[part]:
                group_records.setdefault((part, bucket.file_id), []).append(
                    part_rows.slice(offset, bucket.count))
                offset += bucket.count

    def insert_buckets(self, timeline: Timeline, view: TableView, operation: str,
                       counts: Mapping[str, int]) -> dict[str, list[InsertBucket]]:
        """Where each partition's ``counts`` inserts go (Hudi's upsert partitioner,
        :func:`engine.write.partitioner.assign_inserts`): small file groups first — never
        one a pending compaction or clustering will rewrite, none for bulk_insert —, then new
        ones. The streaming job's record-index batches ask the same with their counts."""
        record_size = average_record_size(timeline, self.write_config)
        # Inserts never go to file groups a pending compaction or clustering will rewrite.
        planned = view.pending_rewrite_groups()
        out: dict[str, list[InsertBucket]] = {}
        for part, count in counts.items():
            if operation == BULK_INSERT:
                candidates: list[FileSlice] = []
            else:
                candidates = [s for s in view.latest_in_partition(part)
                              if (s.partition_path, s.file_id) not in planned]
            out[part] = assign_inserts(part, count, candidates, self.write_config, record_size)
        return out


def _concat(tables: list[pa.Table] | None) -> pa.Table | None:
    if not tables:
        return None
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def _split_by_group(located: pa.Table) -> list[tuple[tuple[str, str], pa.Table]]:
    parts = split_by_columns(located, PARTITION_PATH, "_file_id")
    return [(g, t.drop_columns(["_file_id"])) for g, t in parts]
