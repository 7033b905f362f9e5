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
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.errors import CorruptTableError
from engine.format.naming import parse_base_file, parse_log_file
from engine.layout.file_group import list_table_files
from engine.storage import TEMP_PREFIX, Storage
from engine.timeline.active import HOODIE, Timeline, temp_folder
from engine.timeline.commit_metadata import RollbackMetadata, read_avro_ocf
from engine.timeline.heartbeat import delete_heartbeat
from engine.timeline.instant import Action, Instant, State

WRITE_ACTIONS = (Action.COMMIT, Action.DELTA_COMMIT, Action.REPLACE_COMMIT)


def _files_of(storage: Storage, instant_time: str) -> dict[str, list[str]]:
    files = list_table_files(storage)
    found: dict[str, list[str]] = {}
    for base in files.base_files:
        if base.instant_time == instant_time:
            found.setdefault(base.partition_path, []).append(base.path)
    for log in files.log_files:
        if log.instant_time == instant_time:
            found.setdefault(log.partition_path, []).append(log.path)
    return found


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
        target = _rollback_target(storage, timeline, rb)
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
        _finish(storage, timeline, rb, pending_target, target)
        targets_done.add(target)
        rolled.append(target)
    for failed in timeline.pending(WRITE_ACTIONS):
        if failed.requested_time in targets_done or not is_failed(failed):
            continue
        _rollback(storage, timeline, failed)
        rolled.append(failed.requested_time)
    if rolled:
        _delete_temp_files(storage, set(rolled))
    return rolled


def rollback_instant(storage: Storage, timeline: Timeline, instant: Instant) -> None:
    """Roll back one pending write instant of the caller's own (hold the lock)."""
    pending = next((i for i in timeline.pending(WRITE_ACTIONS)
                    if i.requested_time == instant.requested_time), None)
    if pending is None:
        delete_heartbeat(storage, instant.requested_time)
        return  # already rolled back, or never started
    _rollback(storage, timeline, pending)
    _delete_temp_files(storage, {instant.requested_time})


def _rollback(storage: Storage, timeline: Timeline, failed: Instant) -> None:
    plan = RollbackMetadata("", ((failed.requested_time, failed.action.value),),
                            _files_of(storage, failed.requested_time))
    rb = timeline.create_requested(Action.ROLLBACK, content=plan.plan_avro_bytes())
    _finish(storage, timeline, rb, failed, failed.requested_time)


def _rollback_target(storage: Storage, timeline: Timeline, rb: Instant) -> str:
    rel = f"{timeline.folder}/{rb.requested_time}.rollback.requested"
    try:
        plan = read_avro_ocf(storage.read(rel))
    except FileNotFoundError:
        raise CorruptTableError(f"pending rollback {rb.requested_time} has no plan {rel}; "
                                "it cannot be finished") from None
    except (ValueError, OSError, EOFError) as exc:
        raise CorruptTableError(f"rollback plan {rel} cannot be read: {exc}") from exc
    info = plan.get("instantToRollback") or {}
    target = str(info.get("commitTime") or "") if isinstance(info, dict) else ""
    if not target:
        raise CorruptTableError(f"rollback plan {rel} names no instant to roll back")
    return target


def _finish(storage: Storage, timeline: Timeline, rb: Instant, failed: Instant | None,
            target: str) -> None:
    started = time.monotonic()
    if rb.state is State.REQUESTED:
        rb = timeline.transition_to_inflight(rb)
    deleted = _files_of(storage, target)
    for paths in deleted.values():
        for path in paths:
            storage.delete(path)
    action = failed.action.value if failed is not None else Action.DELTA_COMMIT.value
    meta = RollbackMetadata(rb.requested_time, ((target, action),), deleted,
                            int((time.monotonic() - started) * 1000))
    timeline.complete(rb, meta.to_avro_bytes())
    storage.delete_tree(temp_folder(target))
    delete_heartbeat(storage, target)
    if failed is not None:
        timeline.delete_instant_files(failed)


def revert_inflight_service(storage: Storage, timeline: Timeline, instant: Instant) -> None:
    """Undo a failed attempt at executing a compaction or clustering plan, keeping the plan
    (``hudi-table-services.md`` §3.2, §4.2): a rollback instant deletes the files the attempt
    wrote (named with the plan's instant), then the inflight file goes, so the instant is
    requested again and the same plan is executed anew. A plan is never dropped. Hold the
    lock; the caller checked that no live executor owns the attempt (its heartbeat)."""
    if instant.is_completed:
        raise ValueError(f"{instant} is completed; only a pending attempt can be reverted")
    if instant.state is State.INFLIGHT:
        plan = RollbackMetadata("", ((instant.requested_time, instant.action.value),),
                                _files_of(storage, instant.requested_time))
        rb = timeline.create_requested(Action.ROLLBACK, content=plan.plan_avro_bytes())
        _finish(storage, timeline, rb, None, instant.requested_time)
        storage.delete(f"{timeline.folder}/{instant.file_name(timeline.config.timeline_layout)}")
    _delete_temp_files(storage, {instant.requested_time})
