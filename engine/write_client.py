"""The write path: validate → tag → plan → (execute in tasks) → commit.

:class:`WriteClient` is the driver side. It validates input before anything is written
(missing keys or ordering values raise :class:`~engine.errors.InvalidRecordError`), tags
records with the index, places inserts, and turns the batch into one
:class:`~engine.write_handle.WriteTask` per file group. :func:`engine.write_handle.execute`
runs the tasks (here in the calling process; under Spark inside executor tasks), and
:meth:`WriteClient.commit` completes the instant with their stats — the only step that
touches the timeline after the instant started.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.commit_metadata import CommitMetadata, WriteStat
from engine.config import IndexType, MergeMode, TableConfig, WriteConfig
from engine.delete_block import ordering_kind
from engine.errors import InvalidRecordError
from engine.file_group import FileSlice, build_file_slices, list_table_files, visible_instants
from engine.index.bucket import bucket_file_id, bucket_from_file_id, bucket_ids
from engine.index.simple import key_locations, tag
from engine.instant import Action, Instant
from engine.keygen import key_batch, partition_paths, record_keys
from engine.merge import dedupe_batch
from engine.partitioner import assign_inserts, average_record_size
from engine.reader import SliceReader
from engine.rollback import rollback_failed_writes
from engine.schema import (
    PARTITION_PATH,
    RECORD_KEY,
    arrow_from_avro_json,
    avro_data_schema,
    avro_full_schema,
    data_schema_of,
    normalize_input_schema,
)
from engine.storage import Storage
from engine.timeline import Timeline, temp_folder
from engine.write_handle import APPEND, CREATE, MERGE, WriteContext, WriteTask, execute

UPSERT = "UPSERT"
INSERT = "INSERT"
BULK_INSERT = "BULK_INSERT"
DELETE = "DELETE"


@dataclass
class WritePlan:
    """An instant's tasks, ready to execute, and the context they share."""

    instant: Instant
    context: WriteContext
    tasks: list[WriteTask]
    operation: str
    extra_metadata: dict[str, str] = field(default_factory=dict)


class WriteClient:
    """Driver-side writer of one table (single writer at a time)."""

    def __init__(self, storage: Storage, config: TableConfig, write_config: WriteConfig) -> None:
        self.storage = storage
        self.config = config
        self.write_config = write_config

    # -- schema ----------------------------------------------------------------------------

    def _table_data_schema(self, timeline: Timeline) -> pa.Schema | None:
        schema_json = timeline.latest_schema()
        if not schema_json:
            return None
        return data_schema_of(arrow_from_avro_json(schema_json))

    def _conform_input(self, data: pa.Table, schema: pa.Schema | None) -> pa.Table:
        """Cast input to the table's data schema; new tables take the input's schema."""
        meta_cols = [c for c in data.column_names if c.startswith("_hoodie_")]
        if meta_cols:
            data = data.drop_columns(meta_cols)
        target = schema or normalize_input_schema(data.schema)
        missing = [f.name for f in target if f.name not in data.column_names]
        if missing:
            raise InvalidRecordError(f"input lacks column {missing[0]!r} of the table schema")
        extra = [c for c in data.column_names if c not in target.names]
        if extra:
            raise InvalidRecordError(
                f"input column {extra[0]!r} is not in the table schema "
                f"({', '.join(target.names)})")
        columns = []
        for f in target:
            col = data.column(f.name)
            if not col.type.equals(f.type):
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise InvalidRecordError(
                        f"column {f.name!r} of type {col.type} cannot be stored as "
                        f"{f.type}: {exc}") from None
            columns.append(col)
        return pa.Table.from_arrays(columns, schema=target)

    # -- planning --------------------------------------------------------------------------

    def prepare(self, data: pa.Table, timeline: Timeline, *, dedupe: bool) -> pa.Table:
        """Validate, compute keys/partition paths, and combine duplicates in the batch."""
        if not isinstance(data, pa.Table):
            raise TypeError(f"data: expected a pyarrow.Table, got {type(data).__name__}")
        schema = self._table_data_schema(timeline)
        data = self._conform_input(data, schema)
        keyed = key_batch(data, self.config)
        records = data.append_column(RECORD_KEY, keyed.record_keys).append_column(
            PARTITION_PATH, keyed.partition_paths)
        if dedupe and self.write_config.combine_before_upsert:
            records = dedupe_batch(records, mode=self.config.merge_mode,
                                   ordering_field=self.config.precombine_field)
        return records

    def prepare_deletes(self, data: pa.Table, timeline: Timeline) -> pa.Table:
        """Keys (and partition paths / ordering values when given) of records to delete."""
        if not isinstance(data, pa.Table):
            raise TypeError(f"data: expected a pyarrow.Table, got {type(data).__name__}")
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
            schema = self._table_data_schema(timeline)
            if schema is not None and ordering in schema.names:
                col = col.cast(schema.field(ordering).type)
            columns[ordering] = col
        table = pa.table(columns)
        # One delete per key: the last one given.
        return _last_per_key(table)

    def plan(self, timeline: Timeline, instant: Instant, operation: str,
             records: pa.Table | None, deletes: pa.Table | None,
             extra_metadata: Mapping[str, str] | None = None) -> WritePlan:
        """Tag and place every record and delete; one task per touched file group."""
        files = list_table_files(self.storage)
        visible = visible_instants(timeline)
        slices = build_file_slices(files, timeline, visible)
        by_group = {(s.partition_path, s.file_id): s for s in slices}
        by_partition: dict[str, list[FileSlice]] = {}
        for s in slices:
            by_partition.setdefault(s.partition_path, []).append(s)
        data_schema = self._table_data_schema(timeline)
        if data_schema is None and records is not None:
            data_schema = records.drop_columns([RECORD_KEY, PARTITION_PATH]).schema
        if data_schema is None:
            data_schema = pa.schema([])
        reader = SliceReader(self.storage, timeline, visible,
                             arrow_from_avro_json(timeline.latest_schema() or "")
                             if timeline.latest_schema() else None)

        group_records: dict[tuple[str, str], list[pa.Table]] = {}
        group_deletes: dict[tuple[str, str], list[pa.Table]] = {}
        group_updates: dict[tuple[str, str], int] = {}
        index = self.write_config.index_type

        if deletes is not None and deletes.num_rows:
            located = self._locate(deletes, reader, slices, by_partition)
            for group, part in _split_by_group(located):
                if group in by_group:
                    group_deletes.setdefault(group, []).append(part)

        if records is not None and records.num_rows:
            if index is IndexType.BUCKET:
                self._place_bucket(records, by_partition, group_records, group_updates)
            else:
                self._place_simple(timeline, operation, records, reader, slices,
                                   by_partition, group_records, group_deletes,
                                   group_updates)

        ordering_type = None
        if self.config.precombine_field and self.config.precombine_field in data_schema.names:
            ordering_type = ordering_kind(data_schema.field(self.config.precombine_field).type)
        context = WriteContext(
            base_path=self.storage.base_path, instant_time=instant.requested_time,
            table_name=self.config.name, data_schema=data_schema,
            avro_schema_with_meta=avro_full_schema(data_schema, self.config.name),
            merge_mode=self.config.merge_mode, ordering_field=self.config.precombine_field,
            ordering_avro_type=ordering_type,
            log_block_format=self.write_config.log_block_format,
            compression=self.write_config.compression,
            write_bloom_filter=self.write_config.write_bloom_filter,
        )
        tasks: list[WriteTask] = []
        for group in sorted(set(group_records) | set(group_deletes)):
            partition, file_id = group
            recs = _concat(group_records.get(group))
            dels = _concat(group_deletes.get(group))
            existing = by_group.get(group)
            if existing is None:
                if recs is None:
                    continue
                kind = CREATE
            elif self.config.is_mor:
                kind = APPEND
            else:
                kind = MERGE
            base_rel = existing.base_file.path if existing and existing.base_file else None
            tasks.append(WriteTask(
                kind=kind, partition_path=partition, file_id=file_id, records=recs,
                deletes=dels if kind != CREATE else None, base_file=base_rel,
                base_instant=existing.base_instant if existing else None,
                task_partition=len(tasks), num_updates=group_updates.get(group, 0)))
        extra = {"schema": json.dumps(avro_data_schema(data_schema, self.config.name),
                                      separators=(",", ":"))}
        extra.update(extra_metadata or {})
        return WritePlan(instant, context, tasks, operation, extra)

    def _locate(self, deletes: pa.Table, reader: SliceReader, slices: list[FileSlice],
                by_partition: Mapping[str, list[FileSlice]]) -> pa.Table:
        """Deletes with the partition and file group their key lives in (found ones only)."""
        known_partition = PARTITION_PATH in deletes.column_names
        if (self.write_config.index_type is IndexType.BUCKET and known_partition):
            buckets = bucket_ids(deletes.column(RECORD_KEY), self.write_config.num_buckets)
            file_ids = []
            for part, b in zip(deletes.column(PARTITION_PATH).to_pylist(), buckets.tolist(),
                               strict=True):
                fid = _bucket_group(by_partition.get(part, []), b)
                file_ids.append(fid)
            located = deletes.append_column("_file_id", pa.array(file_ids, pa.string()))
            return located.filter(pc.is_valid(located.column("_file_id")))
        global_lookup = (not known_partition
                         or self.write_config.index_type is IndexType.GLOBAL_SIMPLE)
        wanted = None if global_lookup else set(deletes.column(PARTITION_PATH).to_pylist())
        locations = key_locations(reader, slices, wanted)
        parts = (deletes.column(PARTITION_PATH).combine_chunks() if known_partition
                 else pa.nulls(deletes.num_rows, pa.string()))
        tagged = tag(deletes.column(RECORD_KEY).combine_chunks(), parts, locations,
                     global_index=global_lookup)
        located = deletes
        if PARTITION_PATH in located.column_names:
            located = located.drop_columns([PARTITION_PATH])
        located = located.append_column(PARTITION_PATH, tagged.column("loc_partition"))
        located = located.append_column("_file_id", tagged.column("loc_file_id"))
        return located.filter(pc.is_valid(located.column("_file_id")))

    def _place_bucket(self, records: pa.Table, by_partition: Mapping[str, list[FileSlice]],
                      group_records: dict[tuple[str, str], list[pa.Table]],
                      group_updates: dict[tuple[str, str], int]) -> None:
        buckets = np.asarray(bucket_ids(records.column(RECORD_KEY),
                                        self.write_config.num_buckets), dtype=np.int64)
        encoded = records.column(PARTITION_PATH).combine_chunks().dictionary_encode()
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        group_code = codes * self.write_config.num_buckets + buckets
        order = np.argsort(group_code, kind="stable")
        ordered = records.take(pa.array(order))
        sorted_codes = group_code[order]
        starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        ends = np.r_[starts[1:], len(order)]
        names = encoded.dictionary.to_pylist()
        n_buckets = self.write_config.num_buckets
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            code = int(sorted_codes[start])
            part, bucket = names[code // n_buckets], code % n_buckets
            fid = _bucket_group(by_partition.get(part, []), bucket) or new_bucket_file_id(
                self.config.name, part, bucket)
            group_records.setdefault((part, fid), []).append(ordered.slice(start, end - start))

    def _place_simple(self, timeline: Timeline, operation: str, records: pa.Table,
                      reader: SliceReader, slices: list[FileSlice],
                      by_partition: Mapping[str, list[FileSlice]],
                      group_records: dict[tuple[str, str], list[pa.Table]],
                      group_deletes: dict[tuple[str, str], list[pa.Table]],
                      group_updates: dict[tuple[str, str], int]) -> None:
        global_index = self.write_config.index_type is IndexType.GLOBAL_SIMPLE
        inserts = records
        if operation == UPSERT and slices:
            parts = records.column(PARTITION_PATH).combine_chunks()
            wanted = None if global_index else set(parts.unique().to_pylist())
            locations = key_locations(reader, slices, wanted)
            tagged = tag(records.column(RECORD_KEY).combine_chunks(), parts, locations,
                         global_index=global_index)
            loc_p = tagged.column("loc_partition").combine_chunks()
            loc_f = tagged.column("loc_file_id").combine_chunks()
            found = pc.is_valid(loc_f)
            losing = self._loses_to_stored(records, tagged, found)
            if losing is not None:
                # An update whose ordering value is below the stored one would lose on
                # every read: it is not written (so no reader's incremental view shows it).
                keep = pc.invert(losing)
                records, parts = records.filter(keep), parts.filter(keep)
                loc_p, loc_f, found = loc_p.filter(keep), loc_f.filter(keep), found.filter(keep)
            same_partition = pc.and_(found, pc.equal(loc_p, parts))
            moved = pc.and_(found, pc.invert(pc.fill_null(pc.equal(loc_p, parts), False)))
            updates = records.append_column("_p", loc_p).append_column("_f", loc_f) \
                .filter(same_partition)
            for (part, fid), piece in _split_by_columns(updates, "_p", "_f"):
                group_records.setdefault((part, fid), []).append(piece.drop_columns(["_p", "_f"]))
                group_updates[(part, fid)] = group_updates.get((part, fid), 0) + piece.num_rows
            if pc.any(moved).as_py():
                # Update-partition-path: delete the old copy, insert into the new partition.
                old = pa.table({RECORD_KEY: records.column(RECORD_KEY),
                                PARTITION_PATH: loc_p, "_p": loc_p, "_f": loc_f}).filter(moved)
                if self.config.precombine_field:
                    col = records.column(self.config.precombine_field).filter(moved)
                    old = old.append_column(self.config.precombine_field, col)
                for (part, fid), piece in _split_by_columns(old, "_p", "_f"):
                    group_deletes.setdefault((part, fid), []).append(
                        _natural_delete(piece.drop_columns(["_p", "_f"]),
                                        self.config.precombine_field))
            inserts = records.filter(pc.or_(pc.invert(found), moved))
        if not inserts.num_rows:
            return
        record_size = average_record_size(timeline, self.write_config)
        parts = inserts.column(PARTITION_PATH).combine_chunks()
        for part in parts.unique().to_pylist():
            mask = pc.equal(parts, part)
            part_rows = inserts.filter(mask)
            if operation == BULK_INSERT:
                candidates: list[FileSlice] = []
            else:
                candidates = list(by_partition.get(part, []))
            placement = assign_inserts(part, part_rows.num_rows, candidates,
                                       self.write_config, record_size)
            offset = 0
            for bucket in placement:
                group_records.setdefault((part, bucket.file_id), []).append(
                    part_rows.slice(offset, bucket.count))
                offset += bucket.count

    def _loses_to_stored(self, records: pa.Table, tagged: pa.Table,
                         found: pa.Array) -> pa.Array | None:
        """Rows whose ordering value is lower than the stored version's (event time)."""
        ordering = self.config.precombine_field
        if (self.config.merge_mode is not MergeMode.EVENT_TIME_ORDERING or not ordering
                or "loc_ordering" not in tagged.column_names):
            return None
        stored = tagged.column("loc_ordering").combine_chunks()
        incoming = records.column(ordering).combine_chunks()
        if not stored.type.equals(incoming.type):
            stored = stored.cast(incoming.type)
        lower = pc.fill_null(pc.less(incoming, stored), False)
        return pc.and_(found, lower)

    # -- executing and committing -----------------------------------------------------------

    def execute_local(self, plan: WritePlan) -> list[WriteStat]:
        """Run every task of the plan in this process (two threads: I/O and Arrow overlap)."""
        if len(plan.tasks) < 2:
            return [execute(plan.context, task) for task in plan.tasks]
        with ThreadPoolExecutor(max_workers=2) as pool:
            return list(pool.map(lambda task: execute(plan.context, task), plan.tasks))

    def commit(self, timeline: Timeline, plan: WritePlan, stats: Sequence[WriteStat]) -> Instant:
        """Complete the instant with the tasks' stats: the commit point."""
        return self.finish(timeline, plan.instant, stats, plan.operation, plan.extra_metadata)

    # -- the instant lifecycle, for writers that run tasks elsewhere (Spark) ----------------

    def begin(self) -> tuple[Timeline, Instant]:
        """Roll back failed writes, then start an instant (requested → inflight). Driver only."""
        timeline = Timeline.load(self.storage, self.config)
        if timeline.pending():
            rollback_failed_writes(self.storage, timeline)
            timeline = Timeline.load(self.storage, self.config)
        action = Action.DELTA_COMMIT if self.config.is_mor else Action.COMMIT
        requested = timeline.create_requested(action)
        return timeline, timeline.transition_to_inflight(requested)

    def finish(self, timeline: Timeline, instant: Instant, stats: Sequence[WriteStat],
               operation: str, extra_metadata: Mapping[str, str]) -> Instant:
        """Remove files of failed task attempts, then complete the instant. Driver only.

        A task attempt that died after writing a file, and was retried, leaves a file named
        with this instant that no stat mentions; it is deleted here, before the instant
        completes, so no reader ever sees it.
        """
        referenced = {stat.path for stat in stats}
        for base in list_table_files(self.storage).base_files:
            if base.instant_time == instant.requested_time and base.path not in referenced:
                self.storage.delete(base.path)
        for log in list_table_files(self.storage).log_files:
            if log.instant_time == instant.requested_time and log.path not in referenced:
                self.storage.delete(log.path)
        self.storage.sync()  # every data file durable before the commit point
        meta = CommitMetadata(write_stats=tuple(stats), operation_type=operation,
                              extra_metadata=extra_metadata)
        done = timeline.complete(instant, meta.to_avro_bytes())
        self.storage.delete_tree(temp_folder(instant.requested_time))
        return done

    def write(self, operation: str, records: pa.Table | None, deletes: pa.Table | None,
              *, extra_metadata: Mapping[str, str] | None = None,
              run: Callable[[WritePlan], list[WriteStat]] | None = None) -> str:
        """Roll back failed writes, then plan, execute and commit one instant."""
        timeline, inflight = self.begin()
        plan = self.plan(timeline, inflight, operation, records, deletes, extra_metadata)
        stats = (run or self.execute_local)(plan)
        done = self.commit(timeline, plan, stats)
        return done.requested_time


def new_bucket_file_id(table_name: str, partition: str, bucket: int) -> str:
    """File id of a new bucket's file group, the same for every writer of that bucket.

    Derived from (table, partition, bucket) so that a retried task, or another executor,
    names the group identically; Hudi does the same for its non-blocking bucket ids.
    """
    seed = uuid.uuid5(uuid.NAMESPACE_URL, f"tidelake:{table_name}:{partition}:{bucket}")
    return bucket_file_id(bucket, str(seed))


def _bucket_group(slices: Sequence[FileSlice], bucket: int) -> str | None:
    for slc in slices:
        try:
            if bucket_from_file_id(slc.file_id) == bucket:
                return slc.file_id
        except ValueError:
            continue
    return None


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
    last = t.group_by(RECORD_KEY).aggregate([("_i", "max")]).column("_i_max")
    return table.take(pa.array(np.sort(last.to_numpy())))


def _natural_delete(table: pa.Table, ordering: str | None) -> pa.Table:
    """A delete that wins regardless of ordering values: its ordering value is null."""
    if ordering and ordering in table.column_names:
        table = table.drop_columns([ordering])
    return table


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
