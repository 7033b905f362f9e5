"""One instant of one table, written by Spark tasks: executors write, the driver commits.

The driver starts the instant (:func:`start_instant`: roll back failed writes, requested →
inflight) and takes a :class:`TableLayout` of the live file groups. Executor tasks then
place rows in file groups (:func:`place_rows`: the record key's bucket, unless the row already
names its file group), the rows are repartitioned by file group, and one write handle per
file group runs inside a task (:func:`write_rows`, ``mapInArrow``); each returns a small
picklable :class:`~engine.commit_metadata.WriteStat` and where it ran. Only the driver touches
the timeline again: :meth:`InstantPlan.finish` deletes files of failed task attempts and
completes the instant with the stats.

What crosses to executors — the :class:`~engine.write_handle.WriteContext`, the layout
(broadcast), flags — is picklable and read-only; nothing in a task relies on driver state, so
the same code runs on a cluster with separate executor processes. A retried task writes under
a new write token (its attempt number); files of the failed attempt are never referenced by a
stat and are deleted before the instant completes. Speculative execution must stay off
(Spark's default): a speculative duplicate still writing when the instant completes would
leave a file no commit references (harmless to readers, but never cleaned up).
"""

from __future__ import annotations

import json
import os
import pickle
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.commit_metadata import WriteStat
from engine.file_group import FileSlice, build_file_slices, list_table_files, visible_instants
from engine.index.bucket import bucket_from_file_id, bucket_ids
from engine.instant import Instant
from engine.schema import PARTITION_PATH, RECORD_KEY, avro_data_schema, avro_full_schema
from engine.timeline import Timeline
from engine.write_client import UPSERT as UPSERT_OPERATION
from engine.write_client import WriteClient, new_bucket_file_id
from engine.write_handle import APPEND, CREATE, MERGE, WriteContext, WriteTask, execute
from ingest.prepare import DELETE, FILE_ID, OP, ORDERING, ORDERING_NULL, UPSERT
from ingest.resolve import arrival_order, resolve

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from engine.table import Table

__all__ = [
    "InstantPlan",
    "TableLayout",
    "TaskReport",
    "WriteOutcome",
    "place_rows",
    "start_instant",
    "write_rows",
]

RESULT_SCHEMA = pa.schema([
    pa.field("stat", pa.binary()),
    pa.field("file_group", pa.string()),
    pa.field("partition_id", pa.int32()),
    pa.field("stage_id", pa.int32()),
    pa.field("attempt", pa.int32()),
    pa.field("task_attempt_id", pa.int64()),
    pa.field("pid", pa.int64()),
    pa.field("host", pa.string()),
])
"""One row per file group written: the pickled stat and the task that wrote it."""

# Avro types of ordering fields the engine writes into delete blocks (as WriteClient.plan).
_AVRO_ORDERING = {
    pa.int64(): "long", pa.int32(): "int", pa.float64(): "double", pa.float32(): "float",
    pa.string(): "string", pa.bool_(): "boolean",
}


@dataclass(frozen=True)
class TableLayout:
    """The live file groups when an instant starts (picklable; broadcast to tasks)."""

    groups: Mapping[tuple[str, str], tuple[str | None, str]]
    """(partition, file id) → (base file path or None, base instant) of its latest slice."""
    buckets: Mapping[tuple[str, int], str]
    """(partition, bucket) → file id, for live groups whose id names a bucket."""

    @classmethod
    def of(cls, slices: Sequence[FileSlice], *, bucketed: bool) -> TableLayout:
        """Layout of the latest slices; ``bucketed``: the table uses the bucket layout."""
        groups: dict[tuple[str, str], tuple[str | None, str]] = {}
        buckets: dict[tuple[str, int], str] = {}
        for s in slices:
            groups[(s.partition_path, s.file_id)] = (
                s.base_file.path if s.base_file else None, s.base_instant)
            if bucketed:
                try:
                    buckets.setdefault((s.partition_path, bucket_from_file_id(s.file_id)),
                                       s.file_id)
                except ValueError:
                    continue
        return cls(groups, buckets)


@dataclass(frozen=True)
class TaskReport:
    """Where one file group's write handle ran (for logs, progress and tests)."""

    file_group: str
    partition_id: int
    stage_id: int
    attempt: int
    task_attempt_id: int
    pid: int
    host: str


@dataclass(frozen=True)
class WriteOutcome:
    """A completed instant: its time, the stats it committed, the tasks that wrote them."""

    instant_time: str
    stats: tuple[WriteStat, ...] = ()
    tasks: tuple[TaskReport, ...] = ()


@dataclass
class InstantPlan:
    """Driver-side state of one instant between :func:`start_instant` and :meth:`finish`."""

    table: Table
    client: WriteClient
    timeline: Timeline
    instant: Instant
    layout: TableLayout
    context: WriteContext
    data_schema: pa.Schema

    def finish(self, stats: Sequence[WriteStat], tasks: Sequence[TaskReport],
               extra_metadata: Mapping[str, str]) -> WriteOutcome:
        """Complete the instant (driver only): the commit point."""
        extra = {"schema": json.dumps(avro_data_schema(self.data_schema,
                                                       self.table.config.name),
                                      separators=(",", ":"))}
        extra.update(extra_metadata)
        done = self.client.finish(self.timeline, self.instant, stats, UPSERT_OPERATION, extra)
        return WriteOutcome(done.requested_time, tuple(stats), tuple(tasks))


def start_instant(table: Table, data_schema: pa.Schema) -> InstantPlan:
    """Roll back failed writes, start an inflight instant, snapshot the layout. Driver only."""
    client = WriteClient(table.storage, table.config, table.write_config)
    timeline, instant = client.begin()
    slices = build_file_slices(list_table_files(table.storage), timeline,
                               visible_instants(timeline))
    bucketed = table.config.num_buckets is not None
    layout = TableLayout.of(slices, bucketed=bucketed)
    return InstantPlan(table, client, timeline, instant, layout,
                       write_context(table, instant, data_schema), data_schema)


def write_context(table: Table, instant: Instant, data_schema: pa.Schema) -> WriteContext:
    """The context every write handle of ``instant`` shares (as ``WriteClient.plan`` builds)."""
    config, write_config = table.config, table.write_config
    ordering = config.precombine_field
    ordering_type = None
    if ordering and ordering in data_schema.names:
        ordering_type = _AVRO_ORDERING.get(data_schema.field(ordering).type)
    return WriteContext(
        base_path=table.storage.base_path, instant_time=instant.requested_time,
        table_name=config.name, data_schema=data_schema,
        avro_schema_with_meta=avro_full_schema(data_schema, config.name),
        merge_mode=config.merge_mode, ordering_field=ordering,
        ordering_avro_type=ordering_type, log_block_format=write_config.log_block_format,
        compression=write_config.compression,
        write_bloom_filter=write_config.write_bloom_filter)


# --- placement (executor side) --------------------------------------------------------------


def place_rows(rows: pa.Table, *, table_name: str, num_buckets: int,
               live: Mapping[tuple[str, int], str]) -> pa.Table:
    """Fill :data:`~ingest.prepare.FILE_ID` of upserts/deletes that lack one: the key's bucket.

    The file group of a (partition, bucket) is the live group's, else the deterministic new id
    (:func:`~engine.write_client.new_bucket_file_id`), so a retried task or a replayed batch
    agrees. Rows that already name a file group (the global-state index decided) keep it;
    other rows (errors, skipped versions) are dropped. Executor side.
    """
    ops = rows.column(OP).combine_chunks()
    rows = rows.filter(pc.or_(pc.equal(ops, UPSERT), pc.equal(ops, DELETE)))
    fids = rows.column(FILE_ID).combine_chunks()
    if not rows.num_rows or not fids.null_count:
        return rows
    buckets = pa.array(bucket_ids(rows.column(RECORD_KEY), num_buckets), pa.int32())
    parts = rows.column(PARTITION_PATH).combine_chunks()
    # One look-up per distinct (partition, bucket), not per row.
    labels = pc.binary_join_element_wise(parts, buckets.cast(pa.string()), "/").dictionary_encode()
    distinct = [label.rsplit("/", 1) for label in labels.dictionary.to_pylist()]
    ids = [live.get((part, int(b))) or new_bucket_file_id(table_name, part, int(b))
           for part, b in distinct]
    placed = pa.array(ids, pa.string()).take(labels.indices)
    return rows.set_column(rows.schema.get_field_index(FILE_ID), FILE_ID,
                           pc.coalesce(fids, placed))


# --- writing (executor side) ----------------------------------------------------------------


@dataclass(frozen=True)
class WriteSpec:
    """What a write task needs besides its rows (picklable)."""

    context: WriteContext
    is_mor: bool
    event_time: bool


def _deletes(rows: pa.Table, spec: WriteSpec) -> pa.Table:
    """Delete entries for the engine: key, partition and, under event time, the ordering value
    (null for natural-order deletes).

    Merge-on-read delete blocks carry ordering values only for the Avro primitive types the
    engine encodes (``_AVRO_ORDERING``); for other ordering types (timestamp, date, decimal)
    deletes are written natural-order, as ``Table.delete`` would.
    """
    ordering_field = spec.context.ordering_field
    columns: dict[str, pa.Array] = {
        RECORD_KEY: rows.column(RECORD_KEY).combine_chunks(),
        PARTITION_PATH: rows.column(PARTITION_PATH).combine_chunks(),
    }
    encodable = not spec.is_mor or spec.context.ordering_avro_type is not None
    if ordering_field and spec.event_time and encodable and ORDERING in rows.column_names:
        ordering = rows.column(ORDERING).combine_chunks()
        wanted = spec.context.data_schema.field(ordering_field).type
        ordering = ordering if ordering.type.equals(wanted) else ordering.cast(wanted)
        columns[ordering_field] = pc.if_else(rows.column(ORDERING_NULL).combine_chunks(),
                                             pa.nulls(len(ordering), ordering.type), ordering)
    return pa.table(columns)


def write_group(spec: WriteSpec, layout: TableLayout, partition: str, file_id: str,
                rows: pa.Table, token: tuple[int, int, int]) -> WriteStat | None:
    """Resolve one file group's rows and run its write handle; None if nothing to write."""
    ctx = spec.context
    resolved = resolve(arrival_order(rows), event_time=spec.event_time)
    existing = layout.groups.get((partition, file_id))
    kind = CREATE if existing is None else (APPEND if spec.is_mor else MERGE)
    data_names = [f.name for f in ctx.data_schema] + [RECORD_KEY, PARTITION_PATH]
    records = resolved.upserts.select(data_names) if resolved.upserts.num_rows else None
    deletes = (_deletes(resolved.deletes, spec)
               if resolved.deletes.num_rows and kind != CREATE else None)
    if records is None and deletes is None:
        return None
    task_partition, stage, attempt = token
    base_file, base_instant = existing if existing is not None else (None, None)
    task = WriteTask(kind=kind, partition_path=partition, file_id=file_id, records=records,
                     deletes=deletes, base_file=base_file, base_instant=base_instant,
                     task_partition=task_partition, stage=stage, attempt=attempt)
    return execute(ctx, task)


def _write_partition(spec: WriteSpec, layout_of: Callable[[], TableLayout]
                     ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        collected = [b for b in batches if b.num_rows]
        if not collected:
            return
        rows = pa.Table.from_batches(collected)
        ctx = TaskContext.get()
        if ctx is None:  # only ever called by Spark inside a task
            raise RuntimeError("write tasks must run inside a Spark task")
        token = (ctx.partitionId(), ctx.stageId(), ctx.attemptNumber())
        task_info = (ctx.partitionId(), ctx.stageId(), ctx.attemptNumber(),
                     ctx.taskAttemptId(), os.getpid(), socket.gethostname())
        layout = layout_of()
        out: list[dict[str, Any]] = []
        for (partition, file_id), group in _groups(rows):
            stat = write_group(spec, layout, partition, file_id, group, token)
            if stat is not None:
                out.append(dict(zip(RESULT_SCHEMA.names,
                                    (pickle.dumps(stat), f"{partition}/{file_id}", *task_info),
                                    strict=True)))
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=RESULT_SCHEMA)
    return run


def _groups(rows: pa.Table) -> Iterator[tuple[tuple[str, str], pa.Table]]:
    index = pa.table({"p": rows.column(PARTITION_PATH), "f": rows.column(FILE_ID),
                      "i": pa.array(np.arange(rows.num_rows))})
    grouped = index.group_by(["p", "f"], use_threads=False).aggregate([("i", "list")])
    for part, fid, idx in zip(grouped.column("p").to_pylist(), grouped.column("f").to_pylist(),
                              grouped.column("i_list").to_pylist(), strict=True):
        yield (part, fid), rows.take(pa.array(sorted(idx)))


def write_rows(rows: DataFrame, plan: InstantPlan, *, event_time: bool,
               parallelism: int) -> tuple[list[WriteStat], list[TaskReport]]:
    """Place rows in file groups, repartition by file group, write each group in a task.

    Driver side: broadcasts the layout, launches one Spark job and collects its small
    results (one pickled stat per file group written).
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    spark = rows.sparkSession
    broadcast = spark.sparkContext.broadcast(plan.layout)
    config = plan.table.config
    num_buckets = config.num_buckets or plan.table.write_config.num_buckets
    spec = WriteSpec(plan.context, config.is_mor, event_time)
    try:
        placed = rows.mapInArrow(
            _placement(config.name, num_buckets, lambda: broadcast.value), rows.schema)
        shuffled = placed.repartition(parallelism, PARTITION_PATH, FILE_ID)
        results = shuffled.mapInArrow(_write_partition(spec, lambda: broadcast.value),
                                      from_arrow_schema(RESULT_SCHEMA)).toArrow()
    finally:
        broadcast.unpersist()
    stats = [pickle.loads(s) for s in results.column("stat").to_pylist()]
    tasks = [TaskReport(*row) for row in zip(*(results.column(n).to_pylist()
                                               for n in RESULT_SCHEMA.names[1:]), strict=True)]
    return stats, tasks


def _placement(table_name: str, num_buckets: int, layout_of: Callable[[], TableLayout]
               ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``mapInArrow`` function running :func:`place_rows` over each batch (executor side)."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        live = layout_of().buckets
        for batch in batches:
            placed = place_rows(pa.Table.from_batches([batch]), table_name=table_name,
                                num_buckets=num_buckets, live=live)
            if placed.num_rows:
                yield from placed.to_batches()
    return run
