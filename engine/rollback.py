"""Rolling back writes that never completed.

A writer that crashed leaves its instant requested or inflight, and maybe some data
files named with that instant. Before every write, :func:`rollback_failed_writes` finds
such instants and, for each: records a rollback plan (``R.rollback.requested``), moves it
inflight, deletes the failed instant's base and log files (v8: files are named with the
instant that wrote them), completes the rollback (``R_C.rollback`` with
``HoodieRollbackMetadata``), deletes the instant's scratch folder (``.hoodie/.temp/<instant>``)
and finally the failed instant's timeline files.
Every step can be repeated: a crash during a rollback is finished by the next writer.

Single-writer assumption: tidelake does not run two writers on one table at once (a
streaming query is one writer), so any pending data instant seen here is a failed one.
"""

from __future__ import annotations

import time

from engine.commit_metadata import RollbackMetadata, read_avro_ocf
from engine.file_group import list_table_files
from engine.instant import Action, Instant, State
from engine.storage import TEMP_PREFIX, Storage
from engine.timeline import Timeline, temp_folder

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


def _delete_temp_files(storage: Storage) -> None:
    for folder, stats in storage.walk_files(""):
        for status in stats:
            if status.name.startswith(TEMP_PREFIX):
                storage.delete(f"{folder}/{status.name}" if folder else status.name)


def rollback_failed_writes(storage: Storage, timeline: Timeline) -> list[str]:
    """Roll back every pending write instant; returns the rolled-back instant times."""
    rolled: list[str] = []
    pending_rollbacks = [i for i in timeline.pending([Action.ROLLBACK])]
    targets_done: set[str] = set()
    for rb in pending_rollbacks:
        target = _rollback_target(storage, timeline, rb)
        pending_target = next((i for i in timeline.pending(WRITE_ACTIONS)
                               if i.requested_time == target), None)
        _finish(storage, timeline, rb, pending_target, target)
        if target:
            targets_done.add(target)
            rolled.append(target)
    for failed in timeline.pending(WRITE_ACTIONS):
        if failed.requested_time in targets_done:
            continue
        plan = RollbackMetadata("", ((failed.requested_time, failed.action.value),),
                                _files_of(storage, failed.requested_time))
        rb = timeline.create_requested(Action.ROLLBACK, content=plan.plan_avro_bytes())
        _finish(storage, timeline, rb, failed, failed.requested_time)
        rolled.append(failed.requested_time)
    if rolled:
        _delete_temp_files(storage)
    return rolled


def _rollback_target(storage: Storage, timeline: Timeline, rb: Instant) -> str:
    rel = f"{timeline.folder}/{rb.requested_time}.rollback.requested"
    try:
        plan = read_avro_ocf(storage.read(rel))
    except (FileNotFoundError, ValueError, OSError):
        return ""
    info = plan.get("instantToRollback") or {}
    return str(info.get("commitTime") or "")


def _finish(storage: Storage, timeline: Timeline, rb: Instant, failed: Instant | None,
            target: str) -> None:
    started = time.monotonic()
    if rb.state is State.REQUESTED:
        rb = timeline.transition_to_inflight(rb)
    deleted = _files_of(storage, target) if target else {}
    for paths in deleted.values():
        for path in paths:
            storage.delete(path)
    action = failed.action.value if failed is not None else Action.DELTA_COMMIT.value
    meta = RollbackMetadata(rb.requested_time, ((target, action),), deleted,
                            int((time.monotonic() - started) * 1000))
    timeline.complete(rb, meta.to_avro_bytes())
    if target:
        storage.delete_tree(temp_folder(target))
    if failed is not None:
        timeline.delete_instant_files(failed)
