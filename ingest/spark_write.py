"""One instant of one table, written by Spark tasks: executors write, the driver commits.

The driver starts the instant (:func:`start_instant`: roll back failed writes, requested →
inflight) and takes the :class:`~engine.layout.view.TableView` of its snapshot. Executor tasks
then place rows in file groups (:func:`place_rows`: the record key's bucket, by
:mod:`engine.write.placement`, unless the row already names its file group), the rows are
repartitioned by file group, and one write handle per file group runs inside a task
(:func:`write_rows`, ``mapInArrow``), as the write client decides it
(:class:`~engine.write.group_writer.TaskRule`); each returns a small picklable
:class:`~engine.timeline.commit_metadata.WriteStat` and where it ran. Only the driver touches
the timeline again: :meth:`InstantPlan.finish` deletes files of failed task attempts and
completes the instant with the stats.

What crosses to executors — the :class:`~engine.write.group_writer.GroupWriter`, the view
(broadcast), flags — is picklable and read-only; nothing in a task relies on driver state, so
the same code runs on a cluster with separate executor processes. A retried task writes under
a new write token (its attempt number); files of the failed attempt are never referenced by a
stat and are deleted before the instant completes, found by the markers each task writes before
its files (:mod:`engine.layout.markers`: one listing, whatever the partitions written).
Speculative execution must stay off (Spark's default; :func:`check_spark_conf` refuses
``spark.speculation=true``): a speculative duplicate still writing when the instant completes
would leave a file no commit references.

Durability: each write task fsyncs the files it publishes before it reports them
(:meth:`~engine.write.group_writer.GroupWriter.write`), so a committed instant never
references a file that only sits in the page cache of an executor's host (the driver's
``Storage.sync`` reaches its own host only).
"""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import InvalidOptionError
from engine.schema import PARTITION_PATH, RECORD_KEY
from engine.write.distributed import (
    HashingMetadata,
    InstantWrite,
    Placement,
    TableView,
    Timeline,
    WriteStat,
    WriteTask,
)
from ingest.ddl import spark_schema
from ingest.error_table import ErrorStaging
from ingest.resolve import POLICY, arrival_positions
from ingest.rows import (
    BUCKET,
    DELETE,
    ERROR,
    FILE_ID,
    KAFKA_PARTITION,
    OFFSET,
    OP,
    REASON,
    RING,
    ROWS,
    SPREAD,
    TOPIC,
    UPSERT,
    VERSIONS,
    group_rows,
    located_keys,
    release_task_memory,
    unpack_rows,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from engine.table import Table

__all__ = [
    "FirstError",
    "InstantPlan",
    "SourceCount",
    "TaskReport",
    "WriteOutcome",
    "WriteResult",
    "check_spark_conf",
    "place_on_rings",
    "place_rows",
    "start_instant",
    "write_rows",
    "write_task_rows",
]

RESULT_SCHEMA = pa.schema([pa.field("result", pa.binary())])
"""One row per write task: its pickled :class:`TaskResult`."""

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
    write: InstantWrite
    """The engine's instant (:class:`engine.write.distributed.InstantWrite`)."""
    data_schema: pa.Schema

    @property
    def view(self) -> TableView:
        """The snapshot the instant writes on (broadcast to the write tasks)."""
        return self.write.view

    @property
    def timeline(self) -> Timeline:
        return self.write.timeline

    @property
    def instant_time(self) -> str:
        return self.write.instant_time

    def finish(self, stats: Sequence[WriteStat], tasks: Sequence[TaskReport],
               extra_metadata: Mapping[str, str]) -> WriteOutcome:
        """Complete the instant (driver only): the commit point."""
        done = self.write.finish(stats, self.data_schema, extra_metadata)
        return WriteOutcome(done, tuple(stats), tuple(tasks))

    @property
    def scratch_folder(self) -> str:
        """Absolute path of the instant's scratch folder (deleted by its commit or rollback)."""
        return self.write.scratch_folder

    def abort(self) -> None:
        """Roll the instant back now (driver only), rather than at the next write."""
        self.write.abort()


def check_spark_conf(spark: SparkSession) -> None:
    """Refuse Spark settings under which the write tasks are unsafe (driver side).

    ``spark.speculation=true``: a speculative copy of a write task may still be writing a file
    when the instant completes, a file no commit references and no rollback finds.
    """
    value = spark.sparkContext.getConf().get("spark.speculation", "false") or "false"
    if value.strip().lower() != "false":
        raise InvalidOptionError(
            "spark.speculation", f"is {value!r}; tidelake's write tasks need it off (false, "
            "Spark's default): a speculative duplicate could leave files no commit references")


def start_instant(table: Table, data_schema: pa.Schema) -> InstantPlan:
    """Roll back failed writes, start an inflight instant (its heartbeat beats until
    :meth:`InstantPlan.finish` or :meth:`InstantPlan.abort`), take the view of its snapshot
    (listed now). Driver only."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    runner = None
    if spark is not None:  # a metadata-table index built at the start runs in Spark tasks
        from ingest.services import spark_runner

        runner = spark_runner(spark, spark.sparkContext.defaultParallelism)
    write = InstantWrite.start(table.storage, table.config, table.write_config, runner=runner)
    return InstantPlan(table, write, data_schema)


# --- placement (executor side) --------------------------------------------------------------


def place_rows(rows: pa.Table, placement: Placement, view: TableView) -> pa.Table:
    """Fill :data:`~ingest.rows.FILE_ID` of upserts/deletes that lack one: the file group
    of the key's bucket (:meth:`engine.write.distributed.Placement.bucket_groups`, as the
    write client places keys).

    The bucket is the row's :data:`~ingest.rows.BUCKET` when prepare computed it, else the
    record key's. Rows that already name a file group (the global-state index decided) keep
    it; other rows (errors, skipped versions) are dropped. A delete without a partition (a
    tombstone on a partitioned BUCKET table) is copied to the key's bucket in every partition
    that has it (:meth:`engine.write.distributed.Placement.spread_tombstones`); the caller
    must hand over all rows of a bucket at once (``write_rows(..., by_bucket=True)``).
    Executor side.
    """
    ops = rows.column(OP).combine_chunks()
    writes = pc.or_(pc.equal(ops, UPSERT), pc.equal(ops, DELETE))
    if writes.null_count or not pc.all(writes).as_py():  # copy every row only if some go
        rows = rows.filter(writes)
    if rows.column(PARTITION_PATH).null_count:
        rows = placement.spread_tombstones(view, rows, _buckets(rows, placement).to_pylist())
    fids = rows.column(FILE_ID).combine_chunks()
    if not rows.num_rows or not fids.null_count:
        return rows
    placed = placement.bucket_groups(view, rows.column(PARTITION_PATH).combine_chunks(),
                                     _buckets(rows, placement))
    return rows.set_column(rows.schema.get_field_index(FILE_ID), FILE_ID,
                           pc.coalesce(fids, placed))


def _buckets(rows: pa.Table, placement: Placement) -> pa.Array:
    """Each row's bucket: prepare's :data:`~ingest.rows.BUCKET`, else the key's."""
    if BUCKET in rows.column_names and not rows.column(BUCKET).null_count:
        return rows.column(BUCKET).combine_chunks().cast(pa.int32())
    return placement.record_buckets(rows.column(RECORD_KEY))


def place_on_rings(rows: pa.Table, placement: Placement, rings: Mapping[str, HashingMetadata]
                   ) -> tuple[pa.Table, tuple[str, ...]]:
    """Consistent hashing: fill :data:`~ingest.rows.FILE_ID` of upserts/deletes from the
    node prepare found (:data:`~ingest.rows.BUCKET`) in the ring of the instant's snapshot
    (:meth:`engine.write.distributed.Placement.ring_groups`).

    Prepare read the rings itself (:data:`~ingest.rows.RING` names the one it used), and
    the rows of one file group reach one task only if it used the snapshot's ring: rows of a
    partition whose ring differs (a resize committed in between) are left out, and their
    partitions returned — the instant must then be written again (the driver raises a
    :class:`~engine.errors.WriteConflictError`, and the sink replans). Executor side.
    """
    ops = rows.column(OP).combine_chunks()
    rows = rows.filter(pc.or_(pc.equal(ops, UPSERT), pc.equal(ops, DELETE)))
    if not rows.num_rows:
        return rows, ()
    placed, stale = placement.ring_groups(
        rows.column(PARTITION_PATH).combine_chunks(), rows.column(RING).combine_chunks(),
        rows.column(BUCKET).combine_chunks().cast(pa.int32()), rings)
    rows = rows.set_column(rows.schema.get_field_index(FILE_ID), FILE_ID,
                           pc.coalesce(rows.column(FILE_ID).combine_chunks(), placed))
    return rows.filter(pc.is_valid(rows.column(FILE_ID))), stale


# --- writing (executor side) ----------------------------------------------------------------


@dataclass(frozen=True)
class WriteSpec:
    """What a write task needs besides its rows (picklable)."""

    task: WriteTask
    """Placement and each file group's write, as the write client decides them."""
    errors: ErrorStaging | None = None
    """Set when the batch's error rows must be staged for the error table."""
    decided: bool = False
    """An index applied the rules already (one row per key and file group): the record
    index (:mod:`ingest.record_index`) and the global-state index."""


@dataclass(frozen=True)
class SourceCount:
    """One Kafka partition's rows in one batch (or the part of them one task saw)."""

    records: int
    errors: int
    writes: int
    max_offset: int

    def __add__(self, other: SourceCount) -> SourceCount:
        return SourceCount(self.records + other.records, self.errors + other.errors,
                           self.writes + other.writes, max(self.max_offset, other.max_offset))


@dataclass(frozen=True)
class FirstError:
    """The earliest bad record a task saw: its Kafka coordinates and why it is bad."""

    topic: str
    partition: int
    offset: int
    reason: str


@dataclass(frozen=True)
class TaskResult:
    """What one write task returns to the driver (pickled into one result row)."""

    stats: tuple[WriteStat, ...]
    groups: tuple[str, ...]
    """``partition/file id`` of each stat."""
    task: tuple[int, int, int, int, int, str]
    """Spark partition, stage, attempt, task attempt id, pid, host."""
    sources: Mapping[tuple[str, int], SourceCount]
    staged: str | None
    first_error: FirstError | None
    reasons: tuple[tuple[str, int], ...] = ()
    """Error rows by kind of reason (:func:`reason_histogram`), most common first."""
    stale_rings: tuple[str, ...] = ()
    """Partitions whose rows prepare placed with another ring than the snapshot's
    (:func:`place_on_rings`): not written."""


@dataclass(frozen=True)
class WriteResult:
    """Everything the write tasks of one instant returned, merged (driver side)."""

    stats: tuple[WriteStat, ...] = ()
    tasks: tuple[TaskReport, ...] = ()
    sources: Mapping[tuple[str, int], SourceCount] = field(default_factory=dict)
    """Per Kafka (topic, partition): rows, errors, writes and the highest offset."""
    staged: tuple[str, ...] = ()
    """Files of staged error rows (see :class:`~ingest.error_table.ErrorStaging`)."""
    first_error: FirstError | None = None
    reasons: Mapping[str, int] = field(default_factory=dict)
    """Error rows by kind of reason (:func:`reason_histogram`), over all tasks."""
    stale_rings: tuple[str, ...] = ()
    """Partitions some task could not write (:func:`place_on_rings`): the instant must not
    commit."""

    @property
    def most_common_reason(self) -> tuple[str, int] | None:
        """The kind of reason most error rows share, and how many share it."""
        if not self.reasons:
            return None
        return max(self.reasons.items(), key=lambda item: (item[1], item[0]))

    @property
    def records(self) -> int:
        return sum(c.records for c in self.sources.values())

    @property
    def errors(self) -> int:
        return sum(c.errors for c in self.sources.values())

    @property
    def writes(self) -> int:
        return sum(c.writes for c in self.sources.values())

    @property
    def max_offsets(self) -> dict[tuple[str, int], int]:
        return {tp: c.max_offset for tp, c in self.sources.items()}

    @classmethod
    def merge(cls, results: Sequence[TaskResult]) -> WriteResult:
        stats: list[WriteStat] = []
        tasks: list[TaskReport] = []
        sources: dict[tuple[str, int], SourceCount] = {}
        errors: list[FirstError] = []
        reasons: dict[str, int] = {}
        for r in results:
            for kind, n in r.reasons:
                reasons[kind] = reasons.get(kind, 0) + n
            stats += r.stats
            tasks += [TaskReport(group, *r.task) for group in r.groups]
            for tp, count in r.sources.items():
                sources[tp] = sources[tp] + count if tp in sources else count
            if r.first_error is not None:
                errors.append(r.first_error)
        first = min(errors, key=lambda e: (e.topic, e.partition, e.offset), default=None)
        stale = tuple(sorted({p for r in results for p in r.stale_rings}))
        return cls(tuple(stats), tuple(tasks), sources,
                   tuple(r.staged for r in results if r.staged), first, reasons, stale)


def write_group(spec: WriteSpec, view: TableView, partition: str, file_id: str,
                rows: pa.Table, token: tuple[int, int, int]) -> WriteStat | None:
    """Write one file group's rows — which the caller hands over in arrival order
    (:func:`_groups`) unless an index decided every key already —, as the engine resolves
    and writes a group
    (:meth:`engine.write.group_writer.GroupWriter.write`; rows the record index tagged tell
    it the keys their lookup located in the group: :func:`ingest.rows.located_keys`);
    None if nothing to write."""
    task_partition, stage, attempt = token
    return spec.task.write(view, partition, file_id, rows, decided=spec.decided,
                           located_keys=located_keys(rows),
                           task_partition=task_partition, stage=stage, attempt=attempt)


def source_counts(rows: pa.Table) -> tuple[dict[tuple[str, int], SourceCount],
                                           FirstError | None]:
    """Per Kafka partition: rows, error rows, rows to write, highest offset; and the
    earliest error row. Rows without Kafka coordinates are not counted."""
    if not {TOPIC, KAFKA_PARTITION, OFFSET} <= set(rows.column_names):
        return {}, None
    op = rows.column(OP).combine_chunks()
    is_error = pc.equal(op, ERROR)
    table = pa.table({
        "t": rows.column(TOPIC), "p": rows.column(KAFKA_PARTITION),
        "o": rows.column(OFFSET),
        "e": is_error.cast(pa.int64()),
        "w": pc.is_in(op, pa.array([UPSERT, DELETE], op.type)).cast(pa.int64()),
    }).filter(pc.and_(pc.is_valid(rows.column(TOPIC)), pc.is_valid(rows.column(KAFKA_PARTITION))))
    grouped = table.group_by(["t", "p"], use_threads=False).aggregate(
        [("o", "max"), ("o", "count"), ("e", "sum"), ("w", "sum")])
    counts = {(t, int(p)): SourceCount(int(n), int(e), int(w), int(o))
              for t, p, o, n, e, w in zip(*(grouped.column(c).to_pylist() for c in (
                  "t", "p", "o_max", "o_count", "e_sum", "w_sum")), strict=True)}
    first = None
    if pc.any(is_error).as_py():
        bad = rows.filter(is_error).select([TOPIC, KAFKA_PARTITION, OFFSET, REASON])
        bad = bad.sort_by([(TOPIC, "ascending"), (KAFKA_PARTITION, "ascending"),
                           (OFFSET, "ascending")]).slice(0, 1).to_pylist()[0]
        first = FirstError(str(bad[TOPIC]), int(bad[KAFKA_PARTITION]), int(bad[OFFSET]),
                           str(bad[REASON]))
    return counts, first


REASON_KINDS = 20
"""Kinds of reason a write task reports at most (the most common ones)."""


def reason_histogram(rows: pa.Table) -> tuple[tuple[str, int], ...]:
    """Error rows counted by kind of reason, most common first (at most
    :data:`REASON_KINDS`). The kind is the reason without the offending value and with
    numbers blanked (``field 'ts': expected BIGINT, got 'x'`` → ``field 'ts': expected
    BIGINT``), so that one cause counts once however many values show it."""
    if OP not in rows.column_names or REASON not in rows.column_names:
        return ()
    bad = rows.column(REASON).filter(pc.equal(rows.column(OP), ERROR))
    if not len(bad):
        return ()
    kinds = pc.replace_substring_regex(bad, pattern=r", got .*$", replacement="")
    kinds = pc.replace_substring_regex(kinds, pattern=r"([ (])[0-9]+", replacement=r"\1N")
    counts = pc.value_counts(pc.fill_null(kinds, "(no reason)"))
    pairs = sorted(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(),
                       strict=True), key=lambda item: (-item[1], item[0]))
    return tuple((str(kind), int(n)) for kind, n in pairs[:REASON_KINDS])


def write_task_rows(spec: WriteSpec, view: TableView, rows: pa.Table,
                    token: tuple[int, int, int], task_attempt_id: int = 0) -> TaskResult:
    """What one write task does with its rows (prepared, packed or error-table rows): count
    them per Kafka partition, stage the error rows, place the rest in file groups and write
    each group once (:func:`write_group`). ``token``: the task's (Spark partition, stage,
    attempt), which names its files; ``task_attempt_id``: Spark's, for the report. Executor
    side."""
    if ROWS in rows.column_names:
        rows = unpack_rows(rows)
    sources, first_error = source_counts(rows)
    staged = (spec.errors.stage(rows, token)
              if spec.errors is not None and first_error is not None else None)
    stale: tuple[str, ...] = ()
    if view.config.consistent_hashing:
        placed, stale = place_on_rings(rows, spec.task.placement, view.rings())
    else:
        placed = place_rows(rows, spec.task.placement, view)
    stats: list[WriteStat] = []
    groups: list[str] = []
    for (partition, file_id), group in _groups(placed, arrival=not spec.decided):
        stat = write_group(spec, view, partition, file_id, group, token)
        if stat is not None:
            stats.append(stat)
            groups.append(f"{partition}/{file_id}")
    return TaskResult(tuple(stats), tuple(groups),
                      (*token, task_attempt_id, os.getpid(), socket.gethostname()),
                      sources, staged, first_error,
                      reason_histogram(rows) if first_error is not None else (), stale)


def _write_partition(spec: WriteSpec, view_of: Callable[[], TableView]
                     ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        collected = [b for b in batches if b.num_rows]
        if not collected:
            return
        ctx = TaskContext.get()
        if ctx is None:  # only ever called by Spark inside a task
            raise RuntimeError("write tasks must run inside a Spark task")
        token = (ctx.partitionId(), ctx.stageId(), ctx.attemptNumber())
        result = write_task_rows(spec, view_of(), pa.Table.from_batches(collected), token,
                                 ctx.taskAttemptId())
        del collected
        release_task_memory()  # the worker idles, reused, until its next task
        yield pa.RecordBatch.from_pylist([{"result": pickle.dumps(result)}],
                                         schema=RESULT_SCHEMA)
    return run


def _groups(rows: pa.Table, *, arrival: bool = False
            ) -> Iterator[tuple[tuple[str, str], pa.Table]]:
    """``rows`` by file group, one take, then slices: within a group in arrival order
    (:func:`ingest.resolve.arrival_positions`) with ``arrival``, else in input order."""
    if not rows.num_rows:
        return
    numbers = pa.table({"i": pa.array(np.arange(rows.num_rows, dtype=np.int64))})
    grouped, (parts, fids), sizes = group_rows(
        numbers, [rows.column(PARTITION_PATH), rows.column(FILE_ID)])
    positions = grouped.column("i").to_numpy()
    if arrival:
        groups = np.repeat(np.arange(len(sizes)), sizes)
        versions = rows.select([TOPIC, KAFKA_PARTITION, OFFSET]).take(pa.array(positions))
        positions = positions[arrival_positions(versions, groups)]
    ordered = rows.take(pa.array(positions))
    first = 0
    for part, fid, size in zip(parts, fids, sizes, strict=True):
        yield (part, fid), ordered.slice(first, size)
        first += size


def shuffle_keys(columns: Sequence[str], *, by_bucket: bool = False) -> list[Column]:
    """What rows are repartitioned by: their file group — (partition, file id) as the
    global-state index tagged it, or (partition, bucket) — and, for error rows (no file
    group), their offset, which spreads them over the tasks. Packed rows name their file
    group the same way (BUCKET index: partition and bucket; global-state index: partition and
    file id). With ``by_bucket`` rows go by their bucket alone, so that
    one task holds every partition's rows of a bucket (tombstones on partitioned BUCKET
    tables, see :func:`place_rows`)."""
    from pyspark.sql import functions as F

    if ROWS in columns:  # packed rows: one per file group, or error rows spread
        if FILE_ID in columns:  # tagged by the global-state index
            return [F.col(PARTITION_PATH), F.col(FILE_ID), F.col(SPREAD)]
        if by_bucket:
            return [F.col(BUCKET), F.col(SPREAD)]
        return [F.col(PARTITION_PATH), F.col(BUCKET), F.col(SPREAD)]
    if by_bucket and BUCKET in columns:
        keys = [F.col(BUCKET)]
        if OFFSET in columns:
            keys.append(F.when(F.col(OP) == ERROR, F.col(OFFSET)))
        return keys
    keys = [F.col(PARTITION_PATH), F.col(FILE_ID)]
    if BUCKET in columns:
        keys.append(F.col(BUCKET))
    if OFFSET in columns:
        keys.append(F.when(F.col(OP) == ERROR, F.col(OFFSET)))
    return keys


def write_rows(rows: DataFrame, plan: InstantPlan, *, event_time: bool, parallelism: int,
               errors: ErrorStaging | None = None,
               by_bucket: bool = False, decided: bool = False) -> WriteResult:
    """Repartition rows by file group and write each group in a task: one Spark job.

    ``rows`` are prepared rows (:mod:`ingest.prepare`), or error-table rows; every row is
    read once (``decided``: tagged by the record index, :mod:`ingest.record_index`). The
    tasks place rows in file groups, run the write handles, count the rows per Kafka partition
    and, with ``errors``, stage the error rows. Driver side: broadcasts the view and collects
    one small result per task.
    """
    spark = rows.sparkSession
    broadcast = spark.sparkContext.broadcast(plan.view)
    task = plan.write.write_task(plan.data_schema, columns=VERSIONS, event_time=event_time,
                                 policy=POLICY)
    spec = WriteSpec(task, errors, decided)
    try:
        shuffled = rows.repartition(parallelism, *shuffle_keys(rows.columns,
                                                               by_bucket=by_bucket))
        results = shuffled.mapInArrow(_write_partition(spec, lambda: broadcast.value),
                                      spark_schema(RESULT_SCHEMA)).toArrow()
    finally:
        broadcast.unpersist()
    return WriteResult.merge([pickle.loads(r) for r in results.column("result").to_pylist()])
