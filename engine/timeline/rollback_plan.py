"""A rollback's plan on the timeline (``R.rollback.requested``, Hudi's ``HoodieRollbackPlan``)
and the questions asked of it: which instant it targets, and whether an instant is being
rolled back.

The rollback itself (:mod:`engine.write.rollback`) writes its plan before it lists and
deletes the target's files. Two kinds of readers ask the plans: a writer or a service
attempt at its commit point, under the table lock (:func:`reverted_since`), and a task that
published a file, on an executor, without the lock (:func:`task_superseded`): the task
publishes before it reads the timeline, so either it sees the plan or the rollback sees its
file. Both read a plan's target by :func:`rollback_plan_target`, and take a plan they cannot
read for a rollback of their instant.
"""

from __future__ import annotations

from engine.errors import CorruptTableError, WriteConflictError
from engine.storage import Storage
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import read_avro_ocf
from engine.timeline.instant import Action, Instant


def rollback_plan_target(storage: Storage, timeline_folder: str,
                         rollback_time: str) -> tuple[str, str]:
    """(instant time, action) the plan of the rollback requested at ``rollback_time``
    targets (its ``instantToRollback``). Raises :class:`FileNotFoundError` if the plan is
    gone (a completed rollback archived), :class:`~engine.errors.CorruptTableError` if it
    cannot be read or names no instant."""
    rel = f"{timeline_folder}/{rollback_time}.rollback.requested"
    try:
        plan = read_avro_ocf(storage.read(rel))
    except FileNotFoundError:
        raise
    except (ValueError, OSError, EOFError) as exc:
        raise CorruptTableError(f"rollback plan {rel} cannot be read: {exc}") from exc
    info = plan.get("instantToRollback") or {}
    target = str(info.get("commitTime") or "") if isinstance(info, dict) else ""
    if not target:
        raise CorruptTableError(f"rollback plan {rel} names no instant to roll back")
    action = str(info.get("action") or "") or Action.DELTA_COMMIT.value
    return target, action


def rollback_targets(timeline: Timeline, after: str = "") -> dict[str, str]:
    """Rollback instant time → the instant time it targets, for every rollback on the
    timeline (any state) requested after ``after``. A plan that cannot be read maps to
    '' (callers then assume the worst)."""
    found: dict[str, str] = {}
    for rb in timeline.instants:
        if rb.action is not Action.ROLLBACK or rb.requested_time <= after:
            continue
        try:
            found[rb.requested_time] = rollback_plan_target(
                timeline.storage, timeline.folder, rb.requested_time)[0]
        except (FileNotFoundError, CorruptTableError):
            found[rb.requested_time] = ""
    return found


def reverted_since(timeline: Timeline, instant_time: str, floor: str) -> bool:
    """True if a rollback requested after ``floor`` targets ``instant_time`` (or cannot
    be read): a service attempt that started at ``floor`` was taken over, a writer's
    instant is being rolled back."""
    return any(target in (instant_time, "")
               for target in rollback_targets(timeline, floor).values())


def task_superseded(storage: Storage, timeline_folder: str, instant_time: str,
                    floor: str | None = None) -> bool:
    """Executor side, after a task published a file of ``instant_time``: True if the
    instant was rolled back meanwhile (no timeline file of it is left, or a rollback of it
    requested after ``floor`` — a service attempt's start; the instant itself for a
    writer — is on the timeline). The task must then delete what it published."""
    listed = [Instant.parse(s.name) for s in storage.list_dir(timeline_folder)]
    instants = [i for i in listed if i is not None]
    if not any(i.requested_time == instant_time and i.action is not Action.ROLLBACK
               for i in instants):
        return True
    since = floor or instant_time
    rollbacks = {i.requested_time for i in instants
                 if i.action is Action.ROLLBACK and i.requested_time > since}
    for rb_time in sorted(rollbacks):
        try:
            target, _ = rollback_plan_target(storage, timeline_folder, rb_time)
        except FileNotFoundError:
            continue  # completed and archived meanwhile: not a rollback of a live instant
        except CorruptTableError:
            return True  # cannot tell: never leave a file behind a rollback
        if target == instant_time:
            return True
    return False


def discard_if_superseded(storage: Storage, timeline_folder: str, instant_time: str,
                          paths: list[str], floor: str | None = None) -> None:
    """Executor side: delete the files a task just published and raise
    :class:`~engine.errors.WriteConflictError` if their instant was rolled back meanwhile
    (:func:`task_superseded`)."""
    if not task_superseded(storage, timeline_folder, instant_time, floor):
        return
    for path in paths:
        storage.delete(path)
    raise WriteConflictError(
        f"instant {instant_time} was rolled back while this task ran (another writer judged "
        f"it dead, or its writer gave up); the task removed its {len(paths)} file(s)")
