"""The write path: prepare → plan (tag, place) → execute in tasks → commit.

:class:`WriteClient` is the driver side; it holds a writer's options and the instant's
lifecycle, and each step is a unit of its own:

* **prepare** (:mod:`engine.write.prepare`): input validated before anything is written
  (missing keys or ordering values raise :class:`~engine.errors.InvalidRecordError`),
  conformed to the table's schema, keyed, duplicates combined;
* **plan** (:mod:`engine.write.planner`): records and deletes tagged with the index
  (:mod:`engine.index.tagging`), inserts placed, one
  :class:`~engine.write.write_task.WriteTask` per file group (its kind and a Spark write
  task's work on one file group are :mod:`engine.write.group_writer`'s);
* **execute**: :func:`engine.write.write_handle.execute` runs the tasks (here in the calling
  process, :meth:`WriteClient.execute_local`; under Spark inside executor tasks);
* **commit**: :meth:`WriteClient.finish` checks, under the lock, that the instant may still
  complete, then the commit protocol (:func:`engine.write.commit.commit_instant`) completes
  it with the tasks' stats — the only step that touches the timeline after the instant
  started (:meth:`WriteClient.begin`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pyarrow as pa

from engine.config import ConcurrencyMode, IndexType, TableConfig, WriteConfig
from engine.errors import InvalidOptionError, WriteConflictError
from engine.format.bloom import BloomSizing
from engine.format.delete_block import ordering_kind
from engine.format.naming import parse_base_file
from engine.index.tagging import TaggedRecords, Tagger
from engine.layout import markers
from engine.layout.file_group import FileSlice
from engine.layout.view import TableView
from engine.merge.policy import DeletePolicy
from engine.merge.resolve import VersionColumns
from engine.metadata import sync as metadata
from engine.metadata.indexes import build_runner
from engine.metadata.table import FILES, declared_partitions, snapshot_declared
from engine.metadata.update import collect_updates
from engine.read.slice_reader import SliceReader
from engine.schema import avro_data_schema, avro_full_schema, commit_schema
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
from engine.write.partitioner import InsertBucket
from engine.write.planner import Planner
from engine.write.planner import WritePlan as WritePlan
from engine.write.prepare import prepare_deletes, prepare_records, records_as_of
from engine.write.rollback import (
    drop_abandoned_compactions,
    rollback_failed_writes,
    rollback_instant,
)
from engine.write.write_handle import execute
from engine.write.write_task import WriteContext


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

    # -- planning --------------------------------------------------------------------------

    @property
    def tagger(self) -> Tagger:
        """This writer's tagging (:mod:`engine.index.tagging`), under its delete policy."""
        return Tagger(self.config, self.write_config, self.delete_policy,
                      bloom_metadata=self.write_config.bloom_use_metadata and self.keeps_metadata)

    @property
    def planner(self) -> Planner:
        """This writer's planning (:mod:`engine.write.planner`)."""
        return Planner(self.storage, self.config, self.write_config, self.tagger, self.task_rule)

    def prepare(self, data: pa.Table, timeline: Timeline, *,
                dedupe: bool) -> tuple[pa.Table, pa.Table | None]:
        """Validate, key and combine a batch: ``(records, deletes)``
        (:func:`engine.write.prepare.prepare_records`)."""
        return prepare_records(data, timeline, self.config, self.write_config, dedupe=dedupe)

    def prepare_deletes(self, data: pa.Table, timeline: Timeline) -> pa.Table:
        """Keys (and partition paths / ordering values when given) of records to delete
        (:func:`engine.write.prepare.prepare_deletes`)."""
        return prepare_deletes(data, timeline, self.config)

    def plan(self, timeline: Timeline, instant: Instant, operation: str,
             records: pa.Table | None, deletes: pa.Table | None,
             extra_metadata: Mapping[str, str] | None = None) -> WritePlan:
        """Tag and place every record and delete; one task per touched file group
        (:meth:`engine.write.planner.Planner.tasks`)."""
        view = TableView(self.storage, timeline)
        records, data_schema = records_as_of(timeline, records, self.write_config)
        tasks = self.planner.tasks(timeline, view, operation, records, deletes)
        return WritePlan(instant, self.write_context(instant, data_schema, timeline), tasks,
                         operation, self.commit_extra(data_schema, extra_metadata or {}))

    def insert_buckets(self, timeline: Timeline, view: TableView, operation: str,
                       counts: Mapping[str, int]) -> dict[str, list[InsertBucket]]:
        """Where each partition's ``counts`` inserts go
        (:meth:`engine.write.planner.Planner.insert_buckets`; the streaming job's
        record-index batches ask it with their counts)."""
        return self.planner.insert_buckets(timeline, view, operation, counts)

    def tag_located(self, records: pa.Table, reader: SliceReader, slices: list[FileSlice],
                    locations: pa.Table) -> TaggedRecords:
        """A global index's tagging with the key ``locations`` already looked up
        (:meth:`engine.index.tagging.Tagger.tag_located`). Executor-safe."""
        return self.tagger.tag_located(records, reader, slices, locations)

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
