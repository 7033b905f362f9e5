"""Compaction of merge-on-read tables: fold each file slice's log files into a new base file.

docs/engine.md, "Compaction". Three steps, each callable on its own:

1. :func:`compaction_due` — Hudi's trigger strategies (``hoodie.compact.inline.trigger.*``).
2. :func:`schedule_compaction` — under the table lock, pick a new instant C newer than
   everything on the timeline and write ``C.compaction.requested``: a
   ``HoodieCompactionPlan`` (version 2, file *names*) with one operation per file group whose
   latest slice has log files (all of them completed before C), except groups already in a
   pending compaction or clustering plan.
3. :func:`run_compaction` — execute pending plans, oldest first: ``C.compaction.inflight``
   (0 bytes) under the lock with the instant's heartbeat, one picklable
   :class:`CompactionTask` per operation run by a :data:`~engine.services.base.TaskRunner`
   (:func:`execute_compaction_task` merges base file + logs exactly as the reader does and
   writes one new base file ``F_<token>_C.parquet``), then ``C_<completion>.commit``
   (``compacted=true``, ``operationType=COMPACT``) under the lock.

A plan is never abandoned: an attempt that fails is reverted at once (its files deleted by a
rollback instant, the inflight file removed) and the same plan runs again next time; an
attempt whose executor died (heartbeat expired or missing, or its process provably ended) is
reverted by the next executor, and a stalled attempt that wakes up after that commits
nothing and deletes only its own files (:mod:`engine.services.attempt`).
Writers keep appending logs meanwhile; v8 slicing by completion time puts logs completing
after C into slice C (:mod:`engine.layout.file_group`), so none is lost. On a version-6
table, whose logs carry their slice's base instant, steps 2 and 3 run within one hold of
the table lock instead, only when no write is in flight, and writers drop a plan whose
executor died before they begin (:mod:`engine.timeline.version`).
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import CompactionTrigger, TableConfig, WriteConfig
from engine.errors import (
    CorruptTableError,
    TidelakeError,
    TransientError,
    UnsupportedTableError,
)
from engine.format.base_file import read_base_file, write_base_file
from engine.format.naming import BaseFileName, parse_log_file
from engine.layout.file_group import BaseFile, FileSlice, LogFile
from engine.layout.view import TableView
from engine.merge.record_merger import DataLayer, DeleteLayer, merge_layers
from engine.metadata import bloom_filters
from engine.metadata.update import collect_updates
from engine.read.slice_reader import SliceReader
from engine.schema import (
    FILE_NAME,
    LOW_CARDINALITY_META,
    RECORD_KEY,
    arrow_from_avro_json,
    commit_schema,
    conform,
    evolve_columns,
)
from engine.services.attempt import AttemptSupersededError, ServiceAttempt, start_attempt
from engine.services.base import ServiceRun, TaskRunner, local_runner
from engine.storage import Storage
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import (
    CommitMetadata,
    WriteStat,
)
from engine.timeline.compaction_plan import CompactionOperation, CompactionPlan, read_plan
from engine.timeline.instant import Action, new_instant_time, parse_instant_time
from engine.timeline.rollback_plan import discard_if_superseded
from engine.write.commit import commit_instant
from engine.write.write_client import WriteClient

COMPACT = "COMPACT"
_log = logging.getLogger(__name__)
_MB = 1024 * 1024


class CompactionError(TransientError):
    """A compaction attempt failed; it was reverted and its plan runs again next time."""


# -- triggers ---------------------------------------------------------------------------


def compaction_due(timeline: Timeline, write_config: WriteConfig,
                   now: _dt.datetime | None = None) -> bool:
    """Whether ``hoodie.compact.inline.trigger.strategy`` says a compaction is due.

    As Hudi's ``ScheduleCompactionActionExecutor``: NUM_COMMITS counts completed deltacommits
    after the last *completed* compaction, NUM_COMMITS_AFTER_LAST_REQUEST after the last
    compaction requested (pending or completed); TIME_ELAPSED measures from the last
    compaction (or the first deltacommit when there was none). Always False for
    copy-on-write tables.
    """
    if not timeline.config.is_mor:
        return False
    trigger = write_config.compact_trigger
    completed = [i.requested_time for i in timeline.instants
                 if i.is_completed and i.action in (Action.COMMIT, Action.COMPACTION)]
    requested = completed + [i.requested_time for i in timeline.pending([Action.COMPACTION])]
    last_done = max(completed, default=None)
    last_any = max(requested, default=None)
    since = last_any if trigger is CompactionTrigger.NUM_COMMITS_AFTER_LAST_REQUEST \
        else last_done
    deltas = sorted(i.requested_time for i in timeline.instants
                    if i.is_completed and i.action is Action.DELTA_COMMIT)
    num = len([t for t in deltas if since is None or t > since])
    enough = num >= write_config.compact_max_delta_commits
    start = last_done or (deltas[0] if deltas else None)
    if start is None:
        elapsed = False
    else:
        moment = now or _dt.datetime.now(_dt.timezone.utc)
        age = (moment - parse_instant_time(start)).total_seconds()
        elapsed = age >= write_config.compact_max_delta_seconds
    if trigger in (CompactionTrigger.NUM_COMMITS,
                   CompactionTrigger.NUM_COMMITS_AFTER_LAST_REQUEST):
        return enough
    if trigger is CompactionTrigger.TIME_ELAPSED:
        return elapsed
    if trigger is CompactionTrigger.NUM_AND_TIME:
        return enough and elapsed
    return enough or elapsed


# -- scheduling -------------------------------------------------------------------------


def _require_mor(config: TableConfig) -> None:
    if not config.is_mor:
        raise UnsupportedTableError(
            f"table {config.name!r} is {config.table_type.value}: only MERGE_ON_READ tables "
            "have log files to compact")
    if not config.populate_meta_fields:
        raise UnsupportedTableError(
            f"table {config.name!r} stores no meta fields (hoodie.populate.meta.fields="
            "false): its records have no keys to merge by, so it cannot be compacted")


def _operation(slc: FileSlice, write_config: WriteConfig) -> CompactionOperation:
    log_bytes = sum(log.size for log in slc.log_files)
    base_bytes = slc.base_file.size if slc.base_file else 0
    # Hudi's metrics (CompactionStrategy.captureMetrics): whole MB, as Java's long division.
    read_mb = float((base_bytes + log_bytes) // _MB)
    write_mb = float((base_bytes or write_config.max_file_size) // _MB)
    return CompactionOperation(
        partition_path=slc.partition_path, file_id=slc.file_id,
        base_instant=slc.base_instant,
        base_file=slc.base_file.name if slc.base_file else None,
        log_files=tuple(log.name for log in slc.log_files),
        metrics={"TOTAL_LOG_FILES": float(len(slc.log_files)),
                 "TOTAL_LOG_FILES_SIZE": float(log_bytes),
                 "TOTAL_IO_READ_MB": read_mb, "TOTAL_IO_WRITE_MB": write_mb,
                 "TOTAL_IO_MB": read_mb + write_mb})


def _apply_strategy(ops: list[CompactionOperation],
                    write_config: WriteConfig) -> list[CompactionOperation]:
    ops = [op for op in ops
           if op.metrics["TOTAL_LOG_FILES_SIZE"] >= write_config.compaction_log_size_threshold
           and len(op.log_files) >= write_config.compaction_log_num_threshold]
    if write_config.compaction_strategy != "LogFileSizeBasedCompactionStrategy":
        return ops
    # Hudi's BoundedIOCompactionStrategy: largest logs first, until the I/O budget is spent
    # (the operation that crosses it is still taken).
    ops.sort(key=lambda op: -op.metrics["TOTAL_LOG_FILES_SIZE"])
    taken: list[CompactionOperation] = []
    remaining = float(write_config.compaction_target_io_mb)
    for op in ops:
        taken.append(op)
        remaining -= op.metrics["TOTAL_IO_MB"]
        if remaining <= 0:
            break
    return taken


def schedule_compaction(client: WriteClient, *,
                        runner: TaskRunner = local_runner) -> str | None:
    """See :func:`_schedule` (the plan's instant)."""
    return _schedule(client, runner)[0]


def _schedule(client: WriteClient,
              runner: TaskRunner) -> tuple[str | None, tuple[str, int, int] | None]:
    """Write a compaction plan for every file group whose latest slice has log files;
    returns its instant, or None when there is nothing to compact (nothing is written),
    and, when it was executed at once (below), its completion time, groups and rows.

    Does not consult the trigger (see :func:`compaction_due`). Under the table lock, from a
    timeline reloaded under it: C is newer than everything on the timeline, so every log
    of a completed deltacommit completed before C, and logs completing later fall into
    slice C. Groups in a pending compaction, log compaction or clustering plan are left out
    (one pending plan per file group).

    On a table whose compactions hold the lock (version 6,
    :attr:`~engine.timeline.version.TableVersion.compaction_holds_lock`) the plan is made
    only when no write is in flight, and executed at once (tasks through ``runner``)
    within the same hold of the lock: no log lands in a slice while it is being compacted.
    """
    _require_mor(client.config)
    with client.lock:
        timeline = Timeline.load(client.storage, client.config)
        holds_lock = client.config.table_version.compaction_holds_lock
        if holds_lock and timeline.pending((Action.DELTA_COMMIT, Action.COMPACTION)):
            _log.info("%s: compaction waits for the writes in flight (table version %s)",
                      client.storage.base_path, client.config.version)
            return None, None
        view = TableView(client.storage, timeline)
        busy = view.pending_service_groups()
        slices = view.latest_file_slices()
        ops = [_operation(s, client.write_config) for s in slices
               if s.log_files and (s.partition_path, s.file_id) not in busy]
        ops = _apply_strategy(ops, client.write_config)
        if not ops:
            return None, None
        ops.sort(key=lambda op: (op.partition_path, op.file_id))
        instant_time = new_instant_time(timeline.latest_instant_time())
        plan = CompactionPlan(tuple(ops))
        client.lock.verify()
        timeline.create_requested(Action.COMPACTION, instant_time, plan.to_avro_bytes())
        executed = _execute(client, instant_time, runner) if holds_lock else None
    return instant_time, executed


# -- execution: tasks -------------------------------------------------------------------


@dataclass(frozen=True)
class CompactionTask:
    """One operation of a plan, with everything an executor needs (picklable)."""

    storage: Storage
    instant_time: str
    config: TableConfig
    schema_json: str  # the table's Avro data schema
    operation: CompactionOperation
    log_completion_times: tuple[str, ...]  # of operation.log_files, for their order
    task_partition: int
    compression: str = "snappy"
    write_bloom_filter: bool = True
    stage: int = 0
    """The attempt's stage id (:mod:`engine.services.attempt`): no two attempts of one plan
    share a file name."""
    floor: str = ""
    """The timeline's latest time when the attempt started: a rollback of the plan
    requested after it means the attempt was taken over."""
    metadata_partitions: tuple[str, ...] = ()
    """The MDT index partitions the table keeps (the stat's ``metadata`` feeds them)."""
    block_instants: tuple[str, ...] = ()
    """The completed instants whose log blocks count, where log files are named by their
    slice and may hold blocks of instants that never completed (version 6)."""


_DICT = pa.dictionary(pa.int32(), pa.string())


def _write_schema(schema_json: str) -> pa.Schema:
    """Meta fields (the low-cardinality ones dictionary-encoded) + data fields."""
    plain = arrow_from_avro_json(schema_json)
    return pa.schema([pa.field(f.name, _DICT) if f.name in LOW_CARDINALITY_META else f
                      for f in plain])


def _rel(partition: str, name: str) -> str:
    return f"{partition}/{name}" if partition else name


def execute_compaction_task(task: CompactionTask) -> WriteStat:
    """Merge one file group's base file and planned logs into a new base file at the plan's
    instant; returns its write stat. Executor side; never touches the timeline.

    The merge is the reader's (:meth:`SliceReader.log_layers` and
    :func:`~engine.merge.record_merger.merge_layers` under the table's merge mode): deletes applied,
    each surviving key keeps the meta fields of its winning version, ``_hoodie_file_name``
    becomes the new name. A group whose rows were all deleted gets an empty base file, so the
    old slice's rows never show again. The file is published whole and fsynced (a task may
    run on another machine, whose files the driver cannot flush); a retried task writes
    under the next attempt number, and the committer removes files no stat names.
    """
    op = task.operation
    storage = task.storage
    config = task.config
    plain = arrow_from_avro_json(task.schema_json)
    schema = _write_schema(task.schema_json)
    base_file = None
    if op.base_file:
        base_file = BaseFile(op.partition_path, op.file_id, op.base_instant, op.base_file,
                             0)
    logs = [LogFile(op.partition_path, op.file_id, "", 0, "", name, 0, completion)
            for name, completion in zip(op.log_files, task.log_completion_times, strict=True)]
    slc = FileSlice(op.partition_path, op.file_id, op.base_instant, base_file, logs)
    reader = SliceReader(storage, Timeline(storage, config, ()),
                         {t: t for t in task.block_instants}, plain)
    base = None
    if base_file is not None:
        with storage.open_input(base_file.path) as source:
            base = read_base_file(source, dictionary_columns=LOW_CARDINALITY_META)
        base = evolve_columns(base, schema)  # rows of an older schema: nulls, widened types
    layers = reader.log_layers(slc, base.schema if base is not None else plain)
    merged = merge_layers(base, layers, mode=config.merge_mode,
                          ordering_field=config.precombine_field,
                          schema=base.schema if base is not None else plain)
    merged = conform(merged, schema)
    attempt = 0
    while True:
        name = BaseFileName(op.file_id, f"{task.task_partition}-{task.stage}-{attempt}",
                            task.instant_time).name
        file_names = pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(merged.num_rows, np.int32)), pa.array([name], pa.string()))
        out = merged.set_column(schema.get_field_index(FILE_NAME), schema.field(FILE_NAME),
                                file_names)
        try:
            result = write_base_file(_rel(op.partition_path, name), out,
                                     bloom=task.write_bloom_filter,
                                     compression=task.compression, fsync=True,
                                     storage=storage)
            break
        except FileExistsError:
            attempt += 1  # an earlier try of this task left its file: the next name
    if task.floor:  # taken over while running (a stalled attempt's late task)?
        discard_if_superseded(storage, Timeline.folder_for(config), task.instant_time,
                              [_rel(op.partition_path, name)], task.floor)
    # Stats as Hudi's compactor records them (Java ``HoodieCompactor``).
    base_keys = (base.column(RECORD_KEY).combine_chunks() if base is not None
                 else pa.array([], pa.string()))
    out_keys = out.column(RECORD_KEY).combine_chunks()
    log_keys: list[pa.Array] = []
    log_records = 0
    for layer in layers:
        if isinstance(layer, DataLayer):
            log_keys.append(layer.table.column(RECORD_KEY).combine_chunks())
            log_records += layer.table.num_rows
        elif isinstance(layer, DeleteLayer):
            log_keys.append(layer.keys)
            log_records += len(layer.keys)
    touched = (pc.unique(pa.concat_arrays([k.cast(pa.string()) for k in log_keys]))
               if log_keys else pa.array([], pa.string()))
    in_base = pc.is_in(out_keys, value_set=base_keys)
    updated = pc.and_(in_base, pc.is_in(out_keys, value_set=touched))
    num_updates = int(pc.sum(updated).as_py() or 0)
    num_deletes = int(pc.sum(pc.invert(pc.is_in(base_keys, value_set=out_keys))).as_py() or 0)
    return WriteStat(
        file_id=op.file_id, path=_rel(op.partition_path, name),
        partition_path=op.partition_path,
        prev_commit=op.base_instant, num_writes=out.num_rows, num_deletes=num_deletes,
        num_update_writes=num_updates, num_inserts=out.num_rows - num_updates,
        total_write_bytes=result.file_size, file_size_in_bytes=result.file_size,
        total_log_records=log_records, total_log_blocks=len(layers),
        prev_base_file=op.base_file, total_log_files_compacted=len(op.log_files),
        total_log_size_compacted=int(op.metrics.get("TOTAL_LOG_FILES_SIZE", 0)),
        total_updated_records_compacted=len(touched),
        metadata=bloom_filters.file_update(task.metadata_partitions, op.partition_path, name,
                                           task.instant_time, result))


# -- execution: driver ------------------------------------------------------------------


def _tasks(client: WriteClient, timeline: Timeline, instant_time: str,
           plan: CompactionPlan, schema_json: str, *, stage: int = 0,
           floor: str = "") -> list[CompactionTask]:
    tasks = []
    blocks = (tuple(sorted(timeline.completed_times))
              if client.config.table_version.logs_named_by_slice else ())
    for index, op in enumerate(plan.operations):
        completions = []
        for name in op.log_files:
            parsed = parse_log_file(name)
            deltacommit = parsed.instant_time if parsed is not None else name
            completion = timeline.completion_time_of(deltacommit)
            if completion is None:
                raise CorruptTableError(
                    f"compaction plan {instant_time} names log file {name} of partition "
                    f"{op.partition_path!r}, whose deltacommit {deltacommit} is not "
                    "completed on the timeline")
            completions.append(completion)
        tasks.append(CompactionTask(
            storage=client.storage, instant_time=instant_time,
            config=client.config, schema_json=schema_json, operation=op,
            log_completion_times=tuple(completions), task_partition=index,
            compression=client.write_config.compression,
            write_bloom_filter=client.write_config.write_bloom_filter,
            stage=stage, floor=floor,
            metadata_partitions=client.metadata_index_partitions(),
            block_instants=blocks))
    return tasks


def _remove_strays(attempt: ServiceAttempt, stats: Sequence[WriteStat]) -> None:
    """Delete this attempt's base files that no stat names (failed task tries)."""
    attempt.remove_strays(s.path for s in stats)


def _execute(client: WriteClient, instant_time: str,
             runner: TaskRunner) -> tuple[str, int, int] | None:
    """Execute one plan to completion; (completion time, groups, rows) or None if skipped."""
    attempt = start_attempt(client, instant_time, Action.COMPACTION)
    if attempt is None:
        return None
    timeline = attempt.timeline
    try:
        plan = read_plan(timeline, instant_time)
        schema_json = timeline.latest_schema()
        if not schema_json:
            raise CorruptTableError(f"compaction {instant_time}: no commit records the "
                                    "table schema")
        tasks = _tasks(client, timeline, instant_time, plan, schema_json,
                       stage=attempt.stage, floor=attempt.floor)
        stats: list[WriteStat] = list(runner(execute_compaction_task, tasks)) if tasks else []
        _remove_strays(attempt, stats)
        client.storage.sync()  # every base file durable before the commit point
        with client.lock:
            now = Timeline.load(client.storage, client.config)
            attempt.check_owner(now)
            extra = {**plan.extra_metadata,
                     **now.rolling_metadata(client.write_config.rolling_metadata_keys),
                     "schema": commit_schema(now.latest_schema(), schema_json,
                                             client.config.name)}
            meta = CommitMetadata(write_stats=tuple(stats), operation_type=COMPACT,
                                  extra_metadata=extra, compacted=True)
            done = commit_instant(now, attempt.instant,
                                  meta.encode(client.config.table_version),
                                  collect_updates(stats))
    except BaseException as exc:
        owned = attempt.abandon()
        if isinstance(exc, AttemptSupersededError):
            raise CompactionError(str(exc)) from exc
        if isinstance(exc, TidelakeError) or not isinstance(exc, Exception):
            raise
        raise CompactionError(attempt.failure(exc, owned)) from exc
    attempt.heartbeat.stop()
    return done.completion_time or "", len(stats), sum(s.num_writes for s in stats)


def run_compaction(client: WriteClient, instant: str | None = None, *,
                   runner: TaskRunner = local_runner) -> ServiceRun:
    """Execute every pending compaction plan, oldest first (or only ``instant``).

    A plan whose heartbeat is alive belongs to another executor and is skipped; an attempt
    whose executor died is reverted (:func:`revert_inflight_service`) and executed again.
    Tasks run through ``runner`` (this process by default; a Spark job in the streaming
    job). Raises :class:`CompactionError` if an attempt fails (after reverting it), and
    ``ValueError`` if ``instant`` is not a compaction on the timeline.
    """
    _require_mor(client.config)
    timeline = Timeline.load(client.storage, client.config)
    pending = sorted(i.requested_time for i in timeline.pending([Action.COMPACTION]))
    if instant is not None:
        found = timeline.find(instant)
        if found is None or found.action not in (Action.COMPACTION, Action.COMMIT):
            raise ValueError(f"instant: {instant} is not a compaction on the timeline")
        pending = [instant] if instant in pending else []
    completed: list[str] = []
    groups = rows = 0
    for instant_time in pending:
        result = _execute(client, instant_time, runner)
        if result is None:
            continue
        completed.append(instant_time)
        groups += result[1]
        rows += result[2]
    return ServiceRun("compaction", None, tuple(completed),
                      {"file_groups": groups, "rows": rows})


def compact(client: WriteClient, *, schedule_only: bool = False, instant: str | None = None,
            runner: TaskRunner | None = None) -> ServiceRun:
    """On-demand compaction (``Table.compact``): schedule a plan if any slice has logs
    (whatever the trigger says) unless ``instant`` is given, then execute pending plans."""
    _require_mor(client.config)
    scheduled, executed = (_schedule(client, runner or local_runner) if instant is None
                           else (None, None))
    if executed is not None and scheduled is not None:  # (compactions holding the lock)
        return ServiceRun("compaction", scheduled, (scheduled,),
                          {"file_groups": executed[1], "rows": executed[2]})
    if schedule_only:
        return ServiceRun("compaction", scheduled)
    run = run_compaction(client, instant, runner=runner or local_runner)
    return ServiceRun("compaction", scheduled, run.completed, run.details)
