"""The write path: validate → tag → plan → (execute in tasks) → commit.

:class:`WriteClient` is the driver side. It validates input before anything is written
(missing keys or ordering values raise :class:`~engine.errors.InvalidRecordError`), tags
records with the index, places inserts, and turns the batch into one
:class:`~engine.write.write_handle.WriteTask` per file group.
:func:`engine.write.write_handle.execute` runs the tasks (here in the calling process; under Spark
inside executor tasks), and :meth:`WriteClient.commit` completes the instant with their stats — the
only step that touches the timeline after the instant started. Each task's kind and a Spark write
task's work on one file group are :mod:`engine.write.group_writer`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import ConcurrencyMode, IndexType, TableConfig, WriteConfig
from engine.errors import InvalidOptionError, InvalidRecordError, WriteConflictError
from engine.format.bloom import BloomSizing
from engine.format.delete_block import ordering_kind
from engine.format.naming import parse_base_file
from engine.index import bloom as bloom_index
from engine.index import record_index
from engine.index.consistent_hashing import HashingMetadata, load_or_create_metadata
from engine.index.simple import key_locations, tag
from engine.layout import markers
from engine.layout.file_group import FileSlice
from engine.layout.keygen import key_batch, partition_paths, record_keys
from engine.layout.view import TableView
from engine.merge.policy import (
    ABSENT,
    KIND_CODES,
    LIVE,
    DeletePolicy,
    resolve_single,
    stays_in_place,
    update_partition_path,
)
from engine.merge.record_merger import dedupe_batch
from engine.merge.resolve import VersionColumns
from engine.metadata import sync as metadata
from engine.metadata.indexes import build_runner
from engine.metadata.table import FILES, declared_partitions, snapshot_declared
from engine.metadata.update import collect_updates
from engine.read.reader import SliceReader
from engine.schema import (
    PARTITION_PATH,
    RECORD_KEY,
    arrow_from_avro_json,
    avro_data_schema,
    avro_full_schema,
    cast_column,
    commit_schema,
    data_schema_of,
    evolve_schema,
)
from engine.storage import Storage
from engine.tasks import TaskRunner
from engine.timeline.active import Timeline, temp_folder
from engine.timeline.commit_metadata import CommitMetadata, WriteStat
from engine.timeline.heartbeat import Heartbeat, is_abandoned
from engine.timeline.instant import Action, Instant, State, new_instant_time
from engine.timeline.lock import table_lock
from engine.timeline.rollback_plan import reverted_since
from engine.timeline.version import WRITE_TABLE_VERSION
from engine.write.commit import commit_instant
from engine.write.concurrency import check_begin
from engine.write.concurrency import concurrency_mode as concurrency_mode
from engine.write.conflict import check_conflicts
from engine.write.group_writer import BULK_INSERT as BULK_INSERT
from engine.write.group_writer import DELETE as DELETE
from engine.write.group_writer import INSERT as INSERT
from engine.write.group_writer import UPSERT as UPSERT
from engine.write.group_writer import GroupWriter, TaskRule
from engine.write.partitioner import InsertBucket, assign_inserts, average_record_size
from engine.write.placement import (
    bucket_group,
    live_buckets,
    place_buckets,
    record_buckets,
    routed,
)
from engine.write.rollback import (
    drop_abandoned_compactions,
    rollback_failed_writes,
    rollback_instant,
)
from engine.write.write_handle import WriteContext, WriteTask, execute


@dataclass
class WritePlan:
    """An instant's tasks, ready to execute, and the context they share."""

    instant: Instant
    context: WriteContext
    tasks: list[WriteTask]
    operation: str
    extra_metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TaggedRecords:
    """What a global index's tagging decided for a batch of records
    (:meth:`WriteClient.tag_located`)."""

    updates: dict[tuple[str, str], pa.Table]
    """(partition, file id) → the records that update that group."""
    moved_out: dict[tuple[str, str], pa.Table]
    """(partition, file id) → deletes of old copies of keys that move to another partition
    (key, partition and the ordering value the delete policy gives them)."""
    inserts: pa.Table
    """Records of new keys and of moved ones, to place (:meth:`WriteClient.insert_buckets`)."""


class WriteClient:
    """Driver-side writer of one table; any number of them may write the table at once.

    The commit protocol (``docs/engine.md``, "Several writers"): :meth:`begin` takes the
    table lock, rolls back failed writes (pending instants whose heartbeat expired), takes
    an instant time, starts the instant's heartbeat and writes the requested and inflight
    files; data files are then written without the lock; :meth:`finish` takes the lock
    again, checks that the instant is still inflight, checks conflicts with what completed
    meanwhile (optimistic mode) and completes it. A refused or failed write is rolled back
    at once (:meth:`abort`).
    """

    delete_policy = DeletePolicy.NATURAL
    """Natural deletes (:class:`engine.merge.policy.DeletePolicy`): a delete without an
    ordering value, and the delete of a moved key's old copy, win over every earlier version."""

    def __init__(self, storage: Storage, config: TableConfig, write_config: WriteConfig) -> None:
        self.storage = storage
        self.config = config
        self.write_config = write_config
        self.mode = concurrency_mode(config, write_config, storage)
        if not config.table_version.keeps_metadata_table:
            if write_config.metadata_enable:
                raise InvalidOptionError(
                    "hoodie.metadata.enable", f"a version-{config.version} table keeps no "
                    f"metadata table here ({WRITE_TABLE_VERSION}; docs/engine.md, \"Table "
                    "versions\"): leave the option out or set it to false")
            clustering = next((key for key, on in (
                ("hoodie.clustering.inline", write_config.clustering_inline),
                ("hoodie.clustering.schedule.inline", write_config.clustering_schedule_inline),
                ("hoodie.clustering.async.enabled", write_config.clustering_async)) if on), None)
            if clustering is not None and not config.table_version.clustering_action:
                raise InvalidOptionError(
                    clustering, f"tidelake clusters table version 8 only; this table is "
                    f"version {config.version} ({WRITE_TABLE_VERSION})")
            if write_config.index_type is IndexType.RECORD_INDEX:
                raise InvalidOptionError(
                    "hoodie.index.type", "RECORD_INDEX keeps its index in the metadata table, "
                    f"which a version-{config.version} table does not have here "
                    f"({WRITE_TABLE_VERSION})")
        if write_config.index_type is IndexType.RECORD_INDEX and not self.keeps_metadata:
            raise InvalidOptionError(
                "hoodie.metadata.enable", "hoodie.index.type=RECORD_INDEX keeps its index in "
                "the metadata table, which this writer would not keep")
        self.lock = table_lock(storage, write_config)
        self._heartbeats: dict[str, Heartbeat] = {}
        self.committed: Timeline | None = None
        """The timeline as this writer's last commit left it (loaded under the lock at its
        commit point, with the instant completed): what is due right after the commit
        (:func:`engine.services.table_services.run_inline`) is judged from it without
        listing the timeline again."""
        self.task_runner: TaskRunner | None = None
        """Runs the tasks of work this writer splits (building a metadata-table index over
        the table): Spark tasks when the streaming job drives it, this process if None."""

    @property
    def keeps_metadata(self) -> bool:
        """Whether this writer keeps the metadata table (``hoodie.metadata.enable``; by
        default yes, except in non-blocking mode, whose log-only file groups hudi-rs 0.5.0
        cannot see through an MDT)."""
        if not self.config.table_version.keeps_metadata_table:
            return False
        if self.write_config.metadata_enable is not None:
            return self.write_config.metadata_enable
        return not self.log_only_inserts

    @property
    def log_only_inserts(self) -> bool:
        """New file groups get a log file, not a base file (non-blocking mode): a base file
        would start a slice that hides a concurrent writer's logs of the same bucket."""
        return self.mode is ConcurrencyMode.NON_BLOCKING_CONCURRENCY_CONTROL

    # -- schema ----------------------------------------------------------------------------

    def _table_data_schema(self, timeline: Timeline) -> pa.Schema | None:
        schema_json = timeline.latest_schema()
        if not schema_json:
            return None
        return data_schema_of(arrow_from_avro_json(schema_json))

    def _conform_input(self, data: pa.Table, schema: pa.Schema | None) -> pa.Table:
        """The input as the table stores it after this write: its schema evolved by Hudi's
        rules (:func:`~engine.schema.evolve_schema`: new columns added, types widened,
        missing columns null with ``hoodie.write.set.null.for.missing.columns``, anything
        else refused naming the column), every column cast to its stored type.

        ``_hoodie_*`` columns are dropped unless the table's schema has them (a table
        written by Java may store ``_hoodie_is_deleted``).
        """
        meta_cols = [c for c in data.column_names if c.startswith("_hoodie_")
                     and (schema is None or c not in schema.names)]
        if meta_cols:
            data = data.drop_columns(meta_cols)
        target = evolve_schema(schema, data.schema,
                               set_null_for_missing=self.write_config.set_null_for_missing_columns)
        return _cast_to(data, target)

    # -- planning --------------------------------------------------------------------------

    def prepare(self, data: pa.Table, timeline: Timeline, *,
                dedupe: bool) -> tuple[pa.Table, pa.Table | None]:
        """Validate, compute keys/partition paths, and combine duplicates in the batch.

        Returns ``(records, deletes)``. Rows whose ``_hoodie_is_deleted`` is true are
        deletes, as Hudi treats them: they take part in the in-batch combine like any row
        (so a marker delete carries its row's ordering value and wins or loses by the merge
        mode), and the winners come back in ``deletes`` (key, partition path and ordering
        value, the shape :meth:`prepare_deletes` returns); ``deletes`` is None without any.
        In-batch duplicates combine on (key, partition path) with a non-global index and on
        the key alone with a global one, as Hudi's ``HoodieWriteHelper.deduplicateRecords``.
        """
        if not isinstance(data, pa.Table):
            raise TypeError(f"data: expected a pyarrow.Table, got {type(data).__name__}")
        schema = self._table_data_schema(timeline)
        marker = _delete_marker(data)
        data = self._conform_input(data, schema)
        keyed = key_batch(data, self.config)
        records = data.append_column(RECORD_KEY, keyed.record_keys).append_column(
            PARTITION_PATH, keyed.partition_paths)
        if marker is not None:
            records = records.append_column(_MARKED, marker)
        if dedupe and self.write_config.combine_before_upsert:
            global_index = self.write_config.index_type.is_global
            records = dedupe_batch(records, mode=self.config.merge_mode,
                                   ordering_field=self.config.precombine_field,
                                   partition_column=None if global_index else PARTITION_PATH)
        if marker is None:
            return records, None
        marked = records.column(_MARKED)
        doomed = records.filter(marked)
        records = records.filter(pc.invert(marked)).drop_columns([_MARKED])
        if not doomed.num_rows:
            return records, None
        columns = [RECORD_KEY, PARTITION_PATH]
        ordering = self.config.precombine_field
        if ordering and ordering in doomed.column_names:
            columns.append(ordering)
        return records, doomed.select(columns)

    def prepare_deletes(self, data: pa.Table, timeline: Timeline) -> pa.Table:
        """Keys (and partition paths / ordering values when given) of records to delete."""
        if not isinstance(data, pa.Table):
            raise TypeError(f"data: expected a pyarrow.Table, got {type(data).__name__}")
        schema = self._table_data_schema(timeline)
        data = _key_columns_as_stored(data, schema, self.config)
        keys = record_keys(data, self.config)
        columns = {RECORD_KEY: keys}
        have_partitions = all(f in data.column_names for f in self.config.partition_fields)
        if self.config.partition_fields and have_partitions:
            columns[PARTITION_PATH] = partition_paths(data, self.config)
        elif not self.config.partition_fields:
            columns[PARTITION_PATH] = pa.array([""] * len(keys), pa.string())
        ordering = self.config.precombine_field
        if ordering and ordering in data.column_names:
            col = data.column(ordering).combine_chunks()
            if schema is not None and ordering in schema.names:
                try:
                    col = cast_column(col, schema.field(ordering).type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    raise InvalidRecordError(
                        f"ordering column {ordering!r} of type {col.type} cannot be stored as "
                        f"{schema.field(ordering).type}") from None
            columns[ordering] = col
        table = pa.table(columns)
        # One delete per key (per key and partition when partitions are given): the last.
        return _last_per_key(table)

    def plan(self, timeline: Timeline, instant: Instant, operation: str,
             records: pa.Table | None, deletes: pa.Table | None,
             extra_metadata: Mapping[str, str] | None = None) -> WritePlan:
        """Tag and place every record and delete; one task per touched file group."""
        view = TableView(self.storage, timeline)
        data_schema = self._table_data_schema(timeline)
        if records is not None:
            # The schema as of this instant's start: another writer may have evolved it
            # since the records were prepared (checked again, still before any file).
            given = records.drop_columns([RECORD_KEY, PARTITION_PATH])
            data_schema = evolve_schema(
                data_schema, given.schema,
                set_null_for_missing=self.write_config.set_null_for_missing_columns)
            if not given.schema.equals(data_schema):
                records = _cast_to(given, data_schema).append_column(
                    RECORD_KEY, records.column(RECORD_KEY)).append_column(
                    PARTITION_PATH, records.column(PARTITION_PATH))
        if data_schema is None:
            data_schema = pa.schema([])
        reader = view.slice_reader()

        group_records: dict[tuple[str, str], list[pa.Table]] = {}
        group_deletes: dict[tuple[str, str], list[pa.Table]] = {}
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
            located = self._locate(deletes, reader, view, ring_of)
            for group, part in _split_by_group(located):
                # Non-blocking: a delete may address a bucket group not created yet (_locate).
                if view.latest_slice(*group) is not None or self.log_only_inserts:
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
        rule = self.task_rule
        for group in sorted(set(group_records) | set(group_deletes)):
            updated = group_updates.get(group, [])
            task = rule.task(view, *group, _concat(group_records.get(group)),
                             _concat(group_deletes.get(group)), operation=operation,
                             task_partition=len(tasks),
                             num_updates=sum(len(keys) for keys in updated),
                             located_keys=(pa.concat_arrays(updated) if updated
                                           else pa.array([], pa.string())) if tagged else None)
            if task is not None:
                tasks.append(task)
        return WritePlan(instant, self.write_context(instant, data_schema, timeline), tasks,
                         operation,
                         self.commit_extra(data_schema, extra_metadata or {}))

    # -- what one instant's tasks write (the Spark write tasks ask the same) ----------------

    @property
    def task_rule(self) -> TaskRule:
        """How this writer's tasks are decided (picklable: Spark tasks carry it)."""
        return TaskRule(is_mor=self.config.is_mor, log_only_inserts=self.log_only_inserts)

    def group_writer(self, instant: Instant, data_schema: pa.Schema, *,
                     columns: VersionColumns, event_time: bool,
                     policy: DeletePolicy, timeline: Timeline | None = None) -> GroupWriter:
        """The writer of one file group's versions in the write tasks of ``instant``, for the
        table's data schema (:meth:`write_context`, with the snapshot ``timeline`` the
        instant began with; picklable: Spark tasks carry it)."""
        return GroupWriter(self.write_context(instant, data_schema, timeline), self.task_rule,
                           columns, event_time, policy)

    def scratch_folder(self, instant: Instant) -> str:
        """Absolute path of ``instant``'s scratch folder (deleted by its commit or
        rollback)."""
        return self.storage.full(temp_folder(instant.requested_time))

    def write_context(self, instant: Instant, data_schema: pa.Schema,
                      timeline: Timeline | None = None) -> WriteContext:
        """The context every write task of ``instant`` shares, for the table's data schema
        (data columns only). ``timeline``: the snapshot the instant began with, whose
        ``hoodie.properties`` says which metadata-table partitions the table keeps (read
        anew if None)."""
        declared = (snapshot_declared(timeline) if timeline is not None
                    else declared_partitions(self.storage))
        ordering_type = None
        if self.config.precombine_field and self.config.precombine_field in data_schema.names:
            ordering_type = ordering_kind(data_schema.field(self.config.precombine_field).type)
        return WriteContext(
            storage=self.storage, instant_time=instant.requested_time,
            table_name=self.config.name, data_schema=data_schema,
            avro_schema_with_meta=avro_full_schema(data_schema, self.config.name),
            merge_mode=self.config.merge_mode, ordering_field=self.config.precombine_field,
            ordering_avro_type=ordering_type,
            log_block_format=self.write_config.log_block_format,
            compression=self.write_config.compression,
            write_bloom_filter=self.write_config.write_bloom_filter,
            bloom_sizing=BloomSizing(self.write_config.bloom_num_entries,
                                     self.write_config.bloom_fpp,
                                     self.write_config.bloom_max_entries),
            timeline_folder=Timeline.folder_for(self.config),
            metadata_partitions=self.metadata_index_partitions(declared),
            column_stats_columns=self._column_stats_columns(data_schema, declared),
            table_version=self.config.table_version, markers=True,
        )

    def metadata_index_partitions(self, declared: Sequence[str] | None = None,
                                  ) -> tuple[str, ...]:
        """The metadata table's index partitions the table declares (``declared``, read
        from ``hoodie.properties`` if None), when this writer keeps the MDT (what write
        tasks put in their stats' ``metadata``)."""
        if not self.keeps_metadata:
            return ()
        if declared is None:
            declared = declared_partitions(self.storage)
        return tuple(p for p in declared if p != FILES)

    def _column_stats_columns(self, data_schema: pa.Schema,
                              declared: Sequence[str]) -> tuple[str, ...]:
        """Columns a write task keeps stats of (none unless the table keeps column_stats)."""
        from engine.metadata.column_stats import COLUMN_STATS, configured_columns

        if not self.keeps_metadata or COLUMN_STATS not in declared:
            return ()
        return configured_columns(data_schema, self.write_config,
                                  self.config.populate_meta_fields)

    def commit_extra(self, data_schema: pa.Schema,
                     extra_metadata: Mapping[str, str]) -> dict[str, str]:
        """The commit's extra metadata: the data schema (as Hudi records it), then
        ``extra_metadata``."""
        extra = {"schema": json.dumps(avro_data_schema(data_schema, self.config.name),
                                      separators=(",", ":"))}
        extra.update(extra_metadata)
        return extra

    def _locate(self, deletes: pa.Table, reader: SliceReader, view: TableView,
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
                                if self.log_only_inserts else live.get((part, b)))
            located = deletes.append_column("_file_id", pa.array(file_ids, pa.string()))
            return located.filter(pc.is_valid(located.column("_file_id")))
        global_lookup = not known_partition or self.write_config.index_type.is_global
        wanted = None if global_lookup else set(deletes.column(PARTITION_PATH).to_pylist())
        locations = self._key_locations(reader, view.latest_file_slices(), wanted,
                                        deletes.column(RECORD_KEY))
        parts = (deletes.column(PARTITION_PATH).combine_chunks() if known_partition
                 else pa.nulls(deletes.num_rows, pa.string()))
        tagged = tag(deletes.column(RECORD_KEY).combine_chunks(), parts, locations,
                     global_index=global_lookup)
        # A key found in several file groups is deleted from every one of them.
        located = (deletes if tagged.num_rows == deletes.num_rows
                   else deletes.take(tagged.column("row")))
        if PARTITION_PATH in located.column_names:
            located = located.drop_columns([PARTITION_PATH])
        located = located.append_column(PARTITION_PATH, tagged.column("loc_partition"))
        located = located.append_column("_file_id", tagged.column("loc_file_id"))
        return located.filter(pc.is_valid(located.column("_file_id")))

    def _key_locations(self, reader: SliceReader, slices: list[FileSlice],
                       partitions: set[str] | None, keys: pa.ChunkedArray,
                       written_to: pa.Array | None = None) -> pa.Table:
        """Locations of the slices' live keys: all of them (SIMPLE), or those of ``keys`` in
        the files whose footers admit one (BLOOM: :mod:`engine.index.bloom`, same result), or
        those of ``keys`` the metadata table's record_index holds (RECORD_INDEX:
        :mod:`engine.index.record_index`, same result; under event time with the stored
        ordering value of the keys moving away from the partitions ``written_to``)."""
        if self.write_config.index_type is IndexType.RECORD_INDEX:
            moves = written_to if self.config.orders_by_event_time else None
            return record_index.locations(
                reader, slices, keys.combine_chunks(), partitions=moves,
                update_partition_path=update_partition_path(self.write_config))
        if not self.write_config.index_type.uses_bloom:
            return key_locations(reader, slices, partitions)
        metadata = (bloom_index.MetadataSource.of(reader.storage, reader.timeline)
                    if self.write_config.bloom_use_metadata and self.keeps_metadata else None)
        return bloom_index.key_locations(
            reader, slices, partitions, keys.combine_chunks(),
            prune_by_ranges=self.write_config.bloom_prune_by_ranges,
            metadata=metadata).locations

    def _place_simple(self, timeline: Timeline, operation: str, records: pa.Table,
                      reader: SliceReader, view: TableView,
                      group_records: dict[tuple[str, str], list[pa.Table]],
                      group_deletes: dict[tuple[str, str], list[pa.Table]],
                      group_updates: dict[tuple[str, str], list[pa.Array]]) -> None:
        global_index = self.write_config.index_type.is_global
        inserts = records
        slices = view.latest_file_slices()
        if operation == UPSERT and slices:
            inserts = self._tag_updates(records, reader, slices, global_index,
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

    def tag_located(self, records: pa.Table, reader: SliceReader, slices: list[FileSlice],
                    locations: pa.Table) -> TaggedRecords:
        """:meth:`_tag_updates` of a global index with the key ``locations`` already looked
        up (the streaming job's record-index tasks look them up in the record_index groups
        their keys hash to): which records update which file group, which old copies a move
        deletes, and the records to insert. Executor-safe."""
        group_records: dict[tuple[str, str], list[pa.Table]] = {}
        group_deletes: dict[tuple[str, str], list[pa.Table]] = {}
        inserts = self._tag_updates(records, reader, slices, True, group_records,
                                    group_deletes, {}, locations=locations)
        return TaggedRecords({g: pa.concat_tables(t) for g, t in group_records.items()},
                             {g: pa.concat_tables(t) for g, t in group_deletes.items()},
                             inserts)

    def _tag_updates(self, records: pa.Table, reader: SliceReader, slices: list[FileSlice],
                     global_index: bool,
                     group_records: dict[tuple[str, str], list[pa.Table]],
                     group_deletes: dict[tuple[str, str], list[pa.Table]],
                     group_updates: dict[tuple[str, str], list[pa.Array]], *,
                     locations: pa.Table | None = None) -> pa.Table:
        """Route records whose key exists to its file groups; returns the records to insert.

        As Hudi's simple indexes do, a record is tagged once per location of its key: a key
        stored in several file groups (two inserts of one key, or a key SIMPLE put in two
        partitions, looked up by GLOBAL_SIMPLE) is updated in every one of them. With a
        global index, copies in another partition are deleted and the record is inserted
        into its own partition unless a copy already lives there.
        """
        parts = records.column(PARTITION_PATH).combine_chunks()
        wanted = None if global_index else set(parts.unique().to_pylist())
        if locations is None:
            locations = self._key_locations(reader, slices, wanted, records.column(RECORD_KEY),
                                            parts)
        tagged = tag(records.column(RECORD_KEY).combine_chunks(), parts, locations,
                     global_index=global_index)
        rows = tagged.column("row").to_numpy(zero_copy_only=False)
        # Every row appears at least once (left join): as many rows means one location each.
        expanded = (records if tagged.num_rows == records.num_rows
                    else records.take(tagged.column("row")))
        loc_p = tagged.column("loc_partition").combine_chunks()
        loc_f = tagged.column("loc_file_id").combine_chunks()
        found = pc.is_valid(loc_f)
        exp_parts = expanded.column(PARTITION_PATH).combine_chunks()
        same = pc.and_(found, stays_in_place(
            loc_p, exp_parts, update_partition_path=update_partition_path(self.write_config)))
        moved = pc.and_(found, pc.invert(same))
        losing = self._loses_to_stored(expanded, tagged, found)
        if losing is not None:
            # An update whose ordering value is below the stored one would lose on every
            # read: it is not written (so no reader's incremental view shows it).
            same = pc.and_(same, pc.invert(losing))
            moved_kept = pc.and_(moved, pc.invert(losing))
        else:
            moved_kept = moved
        n = records.num_rows

        def per_row(mask: pa.Array) -> np.ndarray:
            out = np.zeros(n, dtype=bool)
            out[rows[np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)]] = True
            return out

        found_any = per_row(found)
        stays = per_row(pc.and_(found, pc.invert(moved)))  # a copy in its own partition
        lost = per_row(losing) if losing is not None else np.zeros(n, dtype=bool)
        has_moved = per_row(moved_kept)
        insert_mask = ~found_any | (has_moved & ~stays & ~lost)

        # An update is written where its key is stored: in place, its partition path is the
        # stored one (update.partition.path false: Java's createNewTaggedHoodieRecord).
        updates = expanded.set_column(expanded.schema.get_field_index(PARTITION_PATH),
                                      PARTITION_PATH, loc_p)
        updates = updates.append_column("_p", loc_p).append_column("_f", loc_f).filter(same)
        for (part, fid), piece in _split_by_columns(updates, "_p", "_f"):
            group_records.setdefault((part, fid), []).append(piece.drop_columns(["_p", "_f"]))
            group_updates.setdefault((part, fid), []).append(
                piece.column(RECORD_KEY).combine_chunks().cast(pa.string()))
        if pc.any(moved_kept).as_py():
            # Update-partition-path: delete the old copies, insert into the new partition.
            # The old copy's delete carries the ordering value the delete policy gives it
            # (natural deletes: none, so it wins over the copy whatever its value).
            columns = {RECORD_KEY: expanded.column(RECORD_KEY), PARTITION_PATH: loc_p}
            ordering = self.config.precombine_field
            at = (self.delete_policy.delete_ordering(tagged.column("loc_ordering"))
                  if "loc_ordering" in tagged.column_names else None)
            if at is not None and ordering:
                columns[ordering] = cast_column(at, expanded.schema.field(ordering).type)
            old = pa.table({**columns, "_p": loc_p, "_f": loc_f}).filter(moved_kept)
            for (part, fid), piece in _split_by_columns(old, "_p", "_f"):
                group_deletes.setdefault((part, fid), []).append(piece.drop_columns(["_p", "_f"]))
        return records.filter(pa.array(insert_mask))

    def _loses_to_stored(self, records: pa.Table, tagged: pa.Table,
                         found: pa.Array) -> pa.Array | None:
        """Rows that lose to the stored version of their key, by
        :func:`engine.merge.policy.resolve_single` under :attr:`delete_policy` (event time:
        their ordering value is lower); None without event time."""
        ordering = self.config.precombine_field
        if (not self.config.orders_by_event_time or not ordering
                or "loc_ordering" not in tagged.column_names):
            return None
        stored = tagged.column("loc_ordering").combine_chunks()
        incoming = records.column(ordering).combine_chunks()
        if not stored.type.equals(incoming.type):
            stored = cast_column(stored, incoming.type)
        is_found = found.to_numpy(zero_copy_only=False).astype(bool)
        outcome = resolve_single(
            np.zeros(len(incoming), dtype=bool), incoming,
            pc.is_null(incoming).to_numpy(zero_copy_only=False).astype(bool),
            np.where(is_found, KIND_CODES[LIVE], KIND_CODES[ABSENT]).astype(np.int8), stored,
            event_time=True, policy=self.delete_policy)
        return pa.array(is_found & ~outcome.winner)

    # -- executing and committing -----------------------------------------------------------

    def execute_local(self, plan: WritePlan) -> list[WriteStat]:
        """Run every task of the plan in this process (two threads: I/O and Arrow overlap).

        The tasks do not read the timeline after publishing (a Spark task does, since it may
        outlive its driver): this returns only once every task has ended, so the writer's
        own check under the lock before the commit point (:meth:`finish`) sees any rollback
        of the instant that a task's check would have seen, and the write is then rolled
        back with every file its tasks published (:meth:`abort`). Saves one timeline listing
        per task."""
        context = replace(plan.context, timeline_folder=None, markers=False)
        if len(plan.tasks) < 2:
            return [execute(context, task) for task in plan.tasks]
        with ThreadPoolExecutor(max_workers=2) as pool:
            return list(pool.map(lambda task: execute(context, task), plan.tasks))

    def commit(self, timeline: Timeline, plan: WritePlan, stats: Sequence[WriteStat], *,
               in_process: bool = True) -> Instant:
        """Complete the instant with the tasks' stats: the commit point.

        ``in_process``: the tasks ran in this process, each once (:meth:`execute_local`), so
        no failed task attempt left a file and nothing was staged in the instant's scratch
        folder: :meth:`finish` lists neither the written partitions nor that folder."""
        return self.finish(timeline, plan.instant, stats, plan.operation, plan.extra_metadata,
                           attempts=not in_process)

    # -- the instant lifecycle, for writers that run tasks elsewhere (Spark) ----------------

    def begin(self, *, seen: Timeline | None = None) -> tuple[Timeline, Instant]:
        """Start an instant (requested → inflight) under the table lock, after rolling back
        failed writes. Returns the timeline the write plans from, and the instant. Driver
        only; the instant's heartbeat beats until :meth:`finish` or :meth:`abort`.
        ``seen``: the snapshot the caller prepared the batch with (its parsed commit
        metadata is reused)."""
        action = Action.DELTA_COMMIT if self.config.is_mor else Action.COMMIT
        with self.lock:
            timeline = Timeline.load(self.storage, self.config, reuse=seen)
            if timeline.pending() and rollback_failed_writes(self.storage, timeline,
                                                             self._is_failed):
                timeline = Timeline.load(self.storage, self.config)
            if self.config.table_version.compaction_holds_lock \
                    and timeline.pending((Action.COMPACTION,)):
                drop_abandoned_compactions(self.storage, timeline, self._is_failed)
                timeline = Timeline.load(self.storage, self.config)
            check_begin(self.mode, self.keeps_metadata, self.write_config, timeline)
            with build_runner(self.task_runner):
                metadata.prepare(self.storage, timeline, enabled=self.keeps_metadata,
                                 write_config=self.write_config)
            instant_time = new_instant_time(timeline.latest_instant_time())
            heartbeat = Heartbeat(self.storage, instant_time,
                                  self.write_config.heartbeat_interval_ms / 1000.0,
                                  self.write_config.heartbeat_expiry_seconds).start()
            self._heartbeats[instant_time] = heartbeat
            try:
                requested = timeline.create_requested(action, instant_time)
                inflight = timeline.transition_to_inflight(requested)
            except BaseException:
                self.abort(Instant(instant_time, action, State.REQUESTED))
                raise
        return timeline, inflight

    def rollback_failed_writes(self) -> list[str]:
        """Roll back every pending write instant whose writer is gone — its heartbeat
        expired, or its process provably ended — as :meth:`begin` does first; returns the
        instant times rolled back. A restarted job calls it at once, so what its killed
        predecessor left pending does not wait for its next write to that table."""
        if not Timeline.load(self.storage, self.config).pending():
            return []
        with self.lock:
            timeline = Timeline.load(self.storage, self.config)
            return rollback_failed_writes(self.storage, timeline, self._is_failed)

    def _is_failed(self, instant: Instant) -> bool:
        """Whether another writer's pending instant is a failed one, to be rolled back."""
        if instant.requested_time in self._heartbeats:
            return False  # ours, and alive
        if self.mode is ConcurrencyMode.SINGLE_WRITER:
            return True  # Hudi's EAGER policy: no other writer can be alive
        return is_abandoned(self.storage, instant.requested_time,
                            self.write_config.heartbeat_expiry_seconds)

    def finish(self, timeline: Timeline, instant: Instant, stats: Sequence[WriteStat],
               operation: str, extra_metadata: Mapping[str, str], *,
               attempts: bool = True) -> Instant:
        """Remove files of failed task attempts, then complete the instant: the commit
        point. Driver only.

        A task attempt that died after beginning a file, and was retried, leaves a file
        named with this instant that no stat mentions; its marker names it, and it is
        deleted here, before the instant completes (:func:`engine.layout.markers.reconcile`;
        the marker folder goes after the commit point). Under the lock: the instant must
        still be inflight (not rolled back by another writer), and — optimistic mode — no instant
        that completed since ``timeline`` was loaded may have touched its file groups;
        otherwise the write is rolled back and :class:`~engine.errors.WriteConflictError`
        raised.

        ``attempts=False``: the tasks ran once each in this process (:meth:`commit`), so
        there is no such file and they wrote no markers; nor is the scratch folder deleted,
        which only tasks elsewhere fill.
        """
        if attempts:
            markers.reconcile(self.storage, instant.requested_time, (s.path for s in stats))
        self.storage.sync()  # every data file durable before the commit point
        meta = CommitMetadata(write_stats=tuple(stats), operation_type=operation,
                              extra_metadata=extra_metadata)
        content = meta.encode(self.config.table_version)
        try:
            with self.lock:
                now = Timeline.load(self.storage, self.config)
                _check_still_inflight(now, instant)
                schema = commit_schema(now.latest_schema(), extra_metadata.get("schema"),
                                       self.config.name)
                if schema != extra_metadata.get("schema", schema):
                    # another writer evolved the schema since this one started
                    meta = replace(meta, extra_metadata={**extra_metadata, "schema": schema})
                    content = meta.encode(self.config.table_version)
                self._check_own_heartbeat(now, instant)
                # A single writer still runs beside its own table services: a clustering
                # that replaced a group this write touched makes it a conflict too.
                check_conflicts(timeline, now, instant, stats, non_blocking=(
                    self.mode is ConcurrencyMode.NON_BLOCKING_CONCURRENCY_CONTROL
                    and not any(_is_base_file(stat.path) for stat in stats)),
                    replaced_only=self.mode is ConcurrencyMode.SINGLE_WRITER)
                self.lock.verify()
                done = commit_instant(now, instant, content, collect_updates(stats),
                                      listed=True)
                self.committed = now.after_completing(done)
        except WriteConflictError:
            self.abort(instant)
            raise
        self._stop_heartbeat(instant.requested_time)
        if attempts:
            self.storage.delete_tree(temp_folder(instant.requested_time))
        return done

    def _check_own_heartbeat(self, now: Timeline, instant: Instant) -> None:
        """Under the lock, before the commit point: refuse the commit if another writer may
        have judged this instant dead — a rollback of it is on the timeline (one that
        died half-way leaves the instant inflight with part of its files gone), or its
        heartbeat missed its expiry (Java's ``HeartbeatUtils.abortIfHeartbeatExpired``)."""
        if reverted_since(now, instant.requested_time, instant.requested_time):
            raise WriteConflictError(
                f"instant {instant.requested_time} is being rolled back by another writer, "
                "which judged it dead (its heartbeat had expired: raise "
                "hoodie.client.heartbeat.interval_in_ms or tolerable.misses if the writer "
                "was alive); nothing was committed")
        heartbeat = self._heartbeats.get(instant.requested_time)
        if heartbeat is not None:
            heartbeat.check()

    def abort(self, instant: Instant) -> None:
        """Roll back this writer's own pending instant now (its files, then its timeline
        files) and stop its heartbeat. Idempotent. Driver only."""
        try:
            with self.lock:
                rollback_instant(self.storage, Timeline.load(self.storage, self.config),
                                 instant)
        finally:
            self._stop_heartbeat(instant.requested_time)

    def _stop_heartbeat(self, instant_time: str) -> None:
        heartbeat = self._heartbeats.pop(instant_time, None)
        if heartbeat is not None:
            heartbeat.stop()

    def write(self, operation: str, records: pa.Table | None, deletes: pa.Table | None,
              *, extra_metadata: Mapping[str, str] | None = None,
              run: Callable[[WritePlan], list[WriteStat]] | None = None,
              seen: Timeline | None = None) -> str:
        """Plan, execute and commit one instant; on any failure it is rolled back at once.
        ``seen``: the snapshot the batch was prepared with (:meth:`begin`)."""
        timeline, inflight = self.begin(seen=seen)
        try:
            plan = self.plan(timeline, inflight, operation, records, deletes, extra_metadata)
            stats = (run or self.execute_local)(plan)
            done = self.commit(timeline, plan, stats, in_process=run is None)
        except BaseException:
            self.abort(inflight)
            raise
        return done.requested_time


def _is_base_file(path: str) -> bool:
    return parse_base_file(path.rsplit("/", 1)[-1]) is not None


def _check_still_inflight(timeline: Timeline, instant: Instant) -> None:
    """Raise if ``instant`` is no longer inflight on ``timeline`` (another writer judged it
    failed and rolled it back, or it completed already)."""
    found = timeline.find(instant.requested_time)
    if found is None or found.state is not State.INFLIGHT:
        state = "gone from the timeline" if found is None else found.state.value
        raise WriteConflictError(
            f"instant {instant.requested_time} is {state}, no longer inflight: another "
            "writer rolled it back (its heartbeat had expired: raise "
            "hoodie.client.heartbeat.interval_in_ms or tolerable.misses if the writer was "
            "alive); nothing was committed")


DELETE_MARKER = "_hoodie_is_deleted"
"""Hudi's delete marker column: a row whose value is true deletes its key."""
_MARKED = "__tidelake_marked_deleted"


def _delete_marker(data: pa.Table) -> pa.Array | None:
    """The rows whose ``_hoodie_is_deleted`` is true (None without such a column)."""
    if DELETE_MARKER not in data.column_names:
        return None
    column = data.column(DELETE_MARKER).combine_chunks()
    try:
        flags = column.cast(pa.bool_())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise InvalidRecordError(
            f"column {DELETE_MARKER!r} of type {column.type} is not a boolean") from None
    return pc.fill_null(flags, False)


def _concat(tables: list[pa.Table] | None) -> pa.Table | None:
    if not tables:
        return None
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def _last_per_key(table: pa.Table) -> pa.Table:
    n = table.num_rows
    if n < 2:
        return table
    idx = pa.array(np.arange(n))
    t = table.append_column("_i", idx)
    group = [RECORD_KEY] + ([PARTITION_PATH] if PARTITION_PATH in table.column_names else [])
    last = t.group_by(group, use_threads=False).aggregate([("_i", "max")]).column("_i_max")
    return table.take(pa.array(np.sort(last.to_numpy())))


def _key_columns_as_stored(data: pa.Table, schema: pa.Schema | None,
                           config: TableConfig) -> pa.Table:
    """Key and partition columns cast to the table's types, so they format as stored ones
    (a delete given ``2`` for a double key means the stored ``2.0``)."""
    if schema is None:
        return data
    for name in (*config.record_key_fields, *config.partition_fields):
        if name not in data.column_names or name not in schema.names:
            continue
        column, wanted = data.column(name), schema.field(name).type
        if column.type.equals(wanted):
            continue
        try:
            cast = cast_column(column, wanted)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise InvalidRecordError(
                f"column {name!r} of type {column.type} cannot be stored as {wanted}") from None
        data = data.set_column(data.column_names.index(name), pa.field(name, wanted), cast)
    return data


def _cast_to(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` with exactly ``schema``'s columns (those it lacks null), each cast to its
    type; a value that does not fit raises :class:`~engine.errors.InvalidRecordError`."""
    columns = []
    for f in schema:
        if f.name not in data.column_names:
            columns.append(pa.nulls(data.num_rows, f.type))
            continue
        col = data.column(f.name)
        if not col.type.equals(f.type):
            try:
                col = cast_column(col, f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InvalidRecordError(
                    f"column {f.name!r} of type {col.type} cannot be stored as "
                    f"{f.type}: {exc}") from None
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def _split_by_group(located: pa.Table) -> list[tuple[tuple[str, str], pa.Table]]:
    parts = _split_by_columns(located, PARTITION_PATH, "_file_id")
    return [(g, t.drop_columns(["_file_id"])) for g, t in parts]


def _split_by_columns(table: pa.Table, col_a: str,
                      col_b: str) -> list[tuple[tuple[str, str], pa.Table]]:
    if not table.num_rows:
        return []
    with_idx = table.append_column("__i", pa.array(np.arange(table.num_rows)))
    grouped = with_idx.group_by([col_a, col_b]).aggregate([("__i", "list")])
    out = []
    for a, b, idx in zip(grouped.column(col_a).to_pylist(), grouped.column(col_b).to_pylist(),
                         grouped.column("__i_list").to_pylist(), strict=True):
        out.append(((a, b), table.take(pa.array(sorted(idx)))))
    return out
