"""Rolling back writes that never completed.

A writer that crashed leaves its instant requested or inflight, and maybe some data files
named with that instant. :func:`rollback_failed_writes` finds such instants — pending
write instants that ``is_failed`` judges failed: with several writers, only those whose
heartbeat expired (:mod:`engine.timeline.heartbeat`); a live writer's instant is never
touched — and,
for each: records a rollback plan (``R.rollback.requested``), moves it inflight, deletes the
failed instant's base and log files (v8: files are named with the instant that wrote them)
and its temporary files, completes the rollback (``R_C.rollback`` with
``HoodieRollbackMetadata``), deletes the instant's scratch folder (``.hoodie/.temp/<instant>``),
its heartbeat, and finally the failed instant's timeline files. :func:`rollback_instant`
does the same for one instant a writer gives up itself (a refused or failed write).

Every step can be repeated: a rollback left pending by a crash is finished by the next
writer. Callers hold the table lock (:mod:`engine.timeline.lock`), so no rollback runs while an
instant completes.

No file of a rolled-back instant may survive: once archival moves the timeline's start past
an instant, every reader (Java's ``CompletionTimeQueryView.isArchived``, hudi-rs, ours)
takes an instant older than the active timeline and absent from the history as archived,
i.e. committed. Three rules keep it so. A writer whose instant another writer already rolled
back deletes its own files (:func:`rollback_instant`). A task that publishes a file checks
afterwards that its instant (or its service attempt) was not rolled back meanwhile, and
deletes the file if it was (:func:`~engine.timeline.rollback_plan.task_superseded`): the
rollback writes its plan before it lists the files, the task publishes before it reads the
timeline, so one of the two always sees the other. And :func:`remove_orphan_files`, run by
the cleaner and by archival before it moves the timeline's start, deletes data files whose
instant is neither on the active timeline nor in the history.

Every writer rolls back first, so this module sits in the write layer, below the services
that use it too (Hudi's rollback action executors are called by the write client,
``BaseHoodieWriteClient.rollbackFailedWrites``, as by its table services). Which instant a
rollback's plan targets, and whether an instant is being rolled back, is
:mod:`engine.timeline.rollback_plan`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.config import TableConfig
from engine.errors import CorruptTableError, WriteConflictError
from engine.format.log_block import HeaderKey, scan_frames
from engine.format.naming import parse_base_file, parse_log_file
from engine.layout.file_group import list_table_files
from engine.layout.markers import marked_files
from engine.storage import TEMP_PREFIX, Storage
from engine.timeline.active import HOODIE, Timeline, temp_folder
from engine.timeline.commit_metadata import RollbackMetadata
from engine.timeline.heartbeat import delete_heartbeat
from engine.timeline.instant import Action, Instant, State
from engine.timeline.rollback_plan import rollback_plan_target
from engine.timeline.version import TableVersion
from engine.write.commit import commit_instant

WRITE_ACTIONS = (Action.COMMIT, Action.DELTA_COMMIT, Action.REPLACE_COMMIT)


def _files_of(storage: Storage, instant_time: str,
              version: TableVersion) -> dict[str, list[str]]:
    """The data files ``instant_time`` wrote, by partition. When the instant has markers
    (:mod:`engine.layout.markers`: its tasks ran elsewhere, each marking its file before
    writing it), the files they name that exist — one listing of the marker folder, plus
    one of each partition they name (Java's marker-based rollback). Else the table is
    listed (Java's listing fallback): files named with the instant, and on a table whose
    log files are named by their slice (version 6) the log files of older slices whose
    every block it wrote (tidelake writes a new log file per write there; a file that also
    holds other instants' blocks stays, and readers skip the blocks of an instant that is
    not completed)."""
    marked = marked_files(storage, instant_time)
    if marked is not None:
        by_partition: dict[str, set[str]] = {}
        for path in marked:
            partition, _, name = path.rpartition("/")
            by_partition.setdefault(partition, set()).add(name)
        present: dict[str, list[str]] = {}
        for partition, names in sorted(by_partition.items()):
            for status in storage.list_dir(partition):
                if status.name in names:
                    present.setdefault(partition, []).append(
                        f"{partition}/{status.name}" if partition else status.name)
        return present
    files = list_table_files(storage)
    found: dict[str, list[str]] = {}
    for base in files.base_files:
        if base.instant_time == instant_time:
            found.setdefault(base.partition_path, []).append(base.path)
    for log in files.log_files:
        if log.instant_time == instant_time or (
                version.logs_named_by_slice and log.instant_time < instant_time
                and _only_blocks_of(storage, log.path, log.size, instant_time)):
            found.setdefault(log.partition_path, []).append(log.path)
    return found


def _only_blocks_of(storage: Storage, path: str, size: int, instant_time: str) -> bool:
    """Whether every block of the log file at ``path`` was written by ``instant_time``
    (read by block frames: headers only)."""
    with storage.open_input(path, whole=False) as source:
        def read_range(offset: int, length: int) -> bytes:
            source.seek(offset)
            return bytes(source.read(length))

        frames = scan_frames(size, read_range)
    return bool(frames) and all(frame.header.get(HeaderKey.INSTANT_TIME) == instant_time
                                for frame in frames or ())


def _instant_of_temp(name: str) -> str | None:
    """Instant of a data file's temporary name (``.tmp.<hex>.<data file name>``)."""
    final = name[len(TEMP_PREFIX):].split(".", 1)[-1]
    base = parse_base_file(final)
    if base is not None:
        return base.instant_time
    log = parse_log_file(final)
    return log.instant_time if log is not None else None


def _delete_temp_files(storage: Storage, instant_times: set[str]) -> None:
    """Temporary data files left by the rolled-back instants (never another writer's)."""
    for folder, stats in storage.walk_files("", skip=(HOODIE,)):
        for status in stats:
            if (status.name.startswith(TEMP_PREFIX)
                    and _instant_of_temp(status.name) in instant_times):
                storage.delete(f"{folder}/{status.name}" if folder else status.name)


def rollback_failed_writes(storage: Storage, timeline: Timeline,
                           is_failed: Callable[[Instant], bool], *,
                           service_reverts: bool = False) -> list[str]:
    """Finish pending rollbacks, then roll back every pending write instant that
    ``is_failed`` judges failed; returns the rolled-back instant times. Hold the lock.

    A pending rollback that reverts a compaction or clustering attempt is finished only
    with ``service_reverts`` — by that service's executor, after it checked no live attempt
    owns the plan (a writer finishing it could delete a live attempt's files)."""
    rolled: list[str] = []
    targets_done: set[str] = set()
    pending_services = {i.requested_time for i in timeline.pending(
        [Action.COMPACTION, Action.CLUSTERING, Action.LOG_COMPACTION])}
    for rb in timeline.pending([Action.ROLLBACK]):
        target, action = _rollback_target(storage, timeline, rb)
        if target in pending_services and not service_reverts:
            continue
        if target in timeline.completed_times:
            # A revert of a compaction or clustering attempt that died half-way, whose plan
            # was executed and completed since: its files are committed data now. The stale
            # rollback is dropped, never finished.
            timeline.delete_instant_files(rb)
            continue
        pending_target = next((i for i in timeline.pending(WRITE_ACTIONS)
                               if i.requested_time == target), None)
        _finish(storage, timeline, rb, pending_target, target, action)
        targets_done.add(target)
        rolled.append(target)
    for failed in timeline.pending(WRITE_ACTIONS):
        if failed.requested_time in targets_done or not is_failed(failed):
            continue
        _rollback(storage, timeline, failed)
        rolled.append(failed.requested_time)
    if rolled:
        _delete_temp_files(storage, set(rolled))
        remove_orphan_files(storage, timeline.config)
    return rolled


def rollback_instant(storage: Storage, timeline: Timeline, instant: Instant) -> None:
    """Roll back one pending write instant of the caller's own (hold the lock).

    A rollback of it that another writer left half-done is finished rather than begun
    anew. If another writer already rolled it back whole, the files this writer wrote
    after that (named with the instant) are deleted here: nobody else knows of them."""
    target = instant.requested_time
    for rb in timeline.pending([Action.ROLLBACK]):
        if _rollback_target(storage, timeline, rb)[0] == target:
            pending = timeline.find(target)
            _finish(storage, timeline, rb,
                    pending if pending is not None and not pending.is_completed else None,
                    target, instant.action.value)
            _delete_temp_files(storage, {target})
            return
    pending = next((i for i in timeline.pending(WRITE_ACTIONS)
                    if i.requested_time == target), None)
    if pending is None:
        if target not in timeline.active_times:  # rolled back by another writer
            for paths in _files_of(storage, target,
                                   timeline.config.table_version).values():
                for path in paths:
                    storage.delete(path)
            _delete_temp_files(storage, {target})
            storage.delete_tree(temp_folder(target))
        delete_heartbeat(storage, target)
        return
    _rollback(storage, timeline, pending)
    _delete_temp_files(storage, {target})


def _rollback(storage: Storage, timeline: Timeline, failed: Instant) -> None:
    plan = RollbackMetadata("", ((failed.requested_time, failed.action.value),),
                            _files_of(storage, failed.requested_time,
                                      timeline.config.table_version))
    rb = timeline.create_requested(Action.ROLLBACK, content=plan.plan_avro_bytes())
    _finish(storage, timeline, rb, failed, failed.requested_time, failed.action.value)


def _rollback_target(storage: Storage, timeline: Timeline, rb: Instant) -> tuple[str, str]:
    """(instant time, action) the plan of the pending rollback ``rb`` targets."""
    try:
        return rollback_plan_target(storage, timeline.folder, rb.requested_time)
    except FileNotFoundError:
        raise CorruptTableError(f"pending rollback {rb.requested_time} has no plan "
                                f"{timeline.folder}/{rb.requested_time}.rollback.requested; "
                                "it cannot be finished") from None


def _finish(storage: Storage, timeline: Timeline, rb: Instant, failed: Instant | None,
            target: str, action: str) -> None:
    started = time.monotonic()
    if rb.state is State.REQUESTED:
        rb = timeline.transition_to_inflight(rb)
    # The target's metadata-table deltacommit goes first: no MDT reader may list a file
    # that is about to be deleted.
    from engine.metadata.sync import rollback_instant as rollback_metadata

    rollback_metadata(storage, timeline, target)
    deleted = _files_of(storage, target, timeline.config.table_version)
    for paths in deleted.values():
        for path in paths:
            storage.delete(path)
    meta = RollbackMetadata(rb.requested_time, ((target, action),), deleted,
                            int((time.monotonic() - started) * 1000))
    commit_instant(timeline, rb, meta.to_avro_bytes())
    storage.delete_tree(temp_folder(target))
    delete_heartbeat(storage, target)
    if failed is not None:
        timeline.delete_instant_files(failed)


def revert_inflight_service(storage: Storage, timeline: Timeline, instant: Instant) -> None:
    """Undo a failed attempt at executing a compaction or clustering plan, keeping the plan
    (docs/engine.md, "Compaction" and "Clustering"): a rollback instant deletes the files the
    attempt wrote (named with the plan's instant), then the inflight file goes, so the instant is
    requested again and the same plan is executed anew. A plan is never dropped. Hold the
    lock; the caller checked that no live executor owns the attempt (its heartbeat)."""
    if instant.is_completed:
        raise ValueError(f"{instant} is completed; only a pending attempt can be reverted")
    if instant.state is State.INFLIGHT:
        plan = RollbackMetadata("", ((instant.requested_time, instant.action.value),),
                                _files_of(storage, instant.requested_time,
                                          timeline.config.table_version))
        rb = timeline.create_requested(Action.ROLLBACK, content=plan.plan_avro_bytes())
        _finish(storage, timeline, rb, None, instant.requested_time, instant.action.value)
        storage.delete(f"{timeline.folder}/{instant.file_name(timeline.config.timeline_layout)}")
    _delete_temp_files(storage, {instant.requested_time})



def drop_abandoned_compactions(storage: Storage, timeline: Timeline,
                               is_failed: Callable[[Instant], bool]) -> list[str]:
    """On a table whose compactions hold the table lock from plan to commit (table
    version 6, :attr:`~engine.timeline.version.TableVersion.compaction_holds_lock`), a
    writer about to begin finds a pending compaction only if its executor died (or lost the
    lock): no log was written into the slices it starts, so the plan is dropped whole (its
    files deleted by a rollback instant, then its timeline files) rather than executed
    after logs that it would hide are written. One whose executor may be alive is a
    conflict. Hold the lock; returns the instant times dropped."""
    dropped = []
    for instant in timeline.pending((Action.COMPACTION,)):
        if not is_failed(instant):
            raise WriteConflictError(
                f"compaction {instant.requested_time} is running on this version-"
                f"{timeline.config.version} table, whose writers wait for compactions; "
                "retry when it has completed")
        if instant.state is State.INFLIGHT:
            revert_inflight_service(storage, timeline, instant)
        timeline.delete_instant_files(instant)
        delete_heartbeat(storage, instant.requested_time)
        dropped.append(instant.requested_time)
    return dropped

# -- files no instant owns ---------------------------------------------------------------------


def remove_orphan_files(storage: Storage, config: TableConfig) -> list[str]:
    """Delete data files named with an instant that is neither on the active timeline nor
    in the archived history (a rolled-back or refused write whose files outlived it);
    returns their paths. Files older than every instant the timeline and history know are
    left alone (a table whose early history is not ours to judge). v8 tables only.

    Lists the files first and reads the timeline after: a file is written after its
    instant's requested file, so a live instant's file is never taken for an orphan.
    """
    if not config.table_version.lsm_history:  # (which instants were archived: unknown)
        return []
    files = list_table_files(storage)
    timeline = Timeline.load(storage, config)
    known = set(timeline.active_times)
    known |= {row.requested_time for row in timeline.archived()}
    if not known:
        return []
    oldest = min(known)
    named = [(f.instant_time, f.path) for f in files.base_files]
    named += [(f.instant_time, f.path) for f in files.log_files]
    removed = [path for instant_time, path in named
               if instant_time not in known and instant_time > oldest]
    for path in removed:
        storage.delete(path)
    return removed
