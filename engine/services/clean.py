"""Cleaning: deleting file slices no reader within retention needs (docs/engine.md).

Planning (:func:`plan_clean`, driver, under the table lock):

1. The *earliest commit to retain* (ECR, :func:`earliest_commit_to_retain`) by
   ``hoodie.cleaner.policy``; never later than the earliest pending write, compaction or
   clustering.
2. Every slice of every file group, as Java slices them
   (:meth:`~engine.layout.view.TableView.all_file_slices`): logs by completion time; a
   pending compaction starts an empty slice at its instant for the groups in its plan.
3. Per group, Java's ``CleanPlanner`` rules: keep the latest slice, the latest slice before
   the ECR (commit and hour policies) or the V latest (file versions), every slice holding a
   savepointed file or an input of a pending clustering, every slice a pending compaction
   needs; delete the rest (commit and hour policies: only slices older than the ECR). Groups
   replaced by a replacecommit older than the ECR (file versions: any) are deleted whole.

Protocol (:func:`run_clean`): pending cleans are finished first (their plan is executed
again: deleting is idempotent, a missing file counts as deleted); then the plan is written as
``T.clean.requested`` (``HoodieCleanerPlan`` v2, full ``file:`` paths) — no instant when
there is nothing to delete —, ``T.clean.inflight`` (0 bytes, as Hudi 1.x), the files are
deleted (tasks per partition, through a :data:`~engine.services.base.TaskRunner`), and
``T_C.clean`` (``HoodieCleanMetadata``) is published under the lock, last. A crash anywhere
leaves a pending clean that the next run completes.

Reads into the cleaned range (:mod:`engine.read.retention`, re-exported here):
:func:`earliest_readable_instant` is the newest ECR of the completed cleans (for
KEEP_LATEST_FILE_VERSIONS, which has no ECR, the oldest instant whose view the clean left whole,
recorded in the clean's ``extraMetadata``); :func:`check_readable` raises
:class:`~engine.errors.InstantNotReadableError` for a time-travel or incremental read that starts
before it.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.config import CleanerPolicy, WriteConfig
from engine.errors import CorruptTableError
from engine.layout.file_group import FileSlice
from engine.layout.view import TableView
from engine.read.retention import (  # re-exported: the cleaner's side of what stays readable
    EARLIEST_READABLE,
    earliest_readable_instant,
    savepointed_files,
)
from engine.read.retention import check_readable as check_readable
from engine.services.base import ServiceRun, TaskRunner, local_runner
from engine.storage import Storage
from engine.timeline.active import Timeline, completion_key
from engine.timeline.commit_metadata import read_avro_ocf, write_avro_ocf
from engine.timeline.instant import Action, Instant, State, format_instant_time
from engine.write.commit import commit_instant
from engine.write.rollback import remove_orphan_files
from engine.write.write_client import WriteClient

PLAN_SCHEMA = "HoodieCleanerPlan"
METADATA_SCHEMA = "HoodieCleanMetadata"
PLAN_VERSION = 2
SAVEPOINTED_TIMESTAMPS = "savepointed_timestamps"

_PENDING_BOUND = (Action.COMMIT, Action.DELTA_COMMIT, Action.REPLACE_COMMIT, Action.COMPACTION,
                  Action.LOG_COMPACTION, Action.CLUSTERING)

Group = tuple[str, str]


# -- the plan on disk ------------------------------------------------------------------------

@dataclass(frozen=True)
class CleanerPlan:
    """A clean's plan (``HoodieCleanerPlan``); paths are relative to the base path here and
    full ``file:`` paths on disk (Java's ``CleanFileInfo.filePath``)."""

    policy: str
    earliest_commit_to_retain: Instant | None
    last_completed_commit: str
    files: Mapping[str, tuple[str, ...]]  # partition → relative paths to delete
    savepointed_timestamps: tuple[str, ...] = ()
    earliest_readable: str = ""
    extra_metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def file_count(self) -> int:
        """Number of files the plan deletes."""
        return sum(len(paths) for paths in self.files.values())

    def to_avro_bytes(self, storage: Storage) -> bytes:
        """``T.clean.requested`` content (plan version 2)."""
        ecr = self.earliest_commit_to_retain
        extra = {SAVEPOINTED_TIMESTAMPS: ",".join(self.savepointed_timestamps),
                 **self.extra_metadata}
        if self.earliest_readable:
            extra[EARLIEST_READABLE] = self.earliest_readable
        record: dict[str, Any] = {
            "earliestInstantToRetain": None if ecr is None else {
                "timestamp": ecr.requested_time,
                "action": ecr.action.completed_action.value, "state": "COMPLETED"},
            "lastCompletedCommitTimestamp": self.last_completed_commit,
            "policy": self.policy,
            "filesToBeDeletedPerPartition": None,
            "version": PLAN_VERSION,
            "filePathsToBeDeletedPerPartition": {
                p: [{"filePath": full_path(storage, rel), "isBootstrapBaseFile": False}
                    for rel in paths] for p, paths in self.files.items()},
            "partitionsToBeDeleted": [],
            "extraMetadata": extra,
        }
        return write_avro_ocf(PLAN_SCHEMA, record)

    @classmethod
    def from_bytes(cls, data: bytes, storage: Storage, where: str) -> CleanerPlan:
        """Parse a plan (v1 ``filesToBeDeletedPerPartition`` names or v2 paths)."""
        try:
            raw = read_avro_ocf(data)
        except (ValueError, OSError, EOFError) as exc:
            raise CorruptTableError(f"clean plan {where} cannot be read: {exc}") from exc
        files: dict[str, tuple[str, ...]] = {}
        for partition, infos in (raw.get("filePathsToBeDeletedPerPartition") or {}).items():
            files[partition] = tuple(relative_path(storage, str(i.get("filePath") or ""), where)
                                     for i in infos or () if i.get("filePath"))
        for partition, names in (raw.get("filesToBeDeletedPerPartition") or {}).items():
            if partition not in files:  # version 1: file names in the partition
                files[partition] = tuple(f"{partition}/{n}" if partition else str(n)
                                         for n in names or ())
        ecr_raw = raw.get("earliestInstantToRetain") or None
        ecr = None
        if ecr_raw and ecr_raw.get("timestamp"):
            try:
                action = Action(str(ecr_raw.get("action") or "commit"))
            except ValueError:
                action = Action.COMMIT
            ecr = Instant(str(ecr_raw["timestamp"]), action, State.COMPLETED)
        extra = dict(raw.get("extraMetadata") or {})
        stamps = tuple(t for t in str(extra.pop(SAVEPOINTED_TIMESTAMPS, "")).split(",") if t)
        return cls(policy=str(raw.get("policy") or ""), earliest_commit_to_retain=ecr,
                   last_completed_commit=str(raw.get("lastCompletedCommitTimestamp") or ""),
                   files=files, savepointed_timestamps=stamps,
                   earliest_readable=str(extra.pop(EARLIEST_READABLE, "")),
                   extra_metadata=extra)


def full_path(storage: Storage, rel: str) -> str:
    """What Java's ``StoragePath.toString()`` gives for a file of the table (``file:/…`` for
    a local table, the URI on an object store)."""
    return "file:" + storage.full(rel) if storage.is_local else storage.full(rel)


def relative_path(storage: Storage, path: str, where: str) -> str:
    """A plan's path (``file:/…``, ``file:///…``, a URI, absolute or relative) relative to
    the base path; :class:`~engine.errors.CorruptTableError` if it lies outside the table."""
    location = path
    if storage.is_local:
        location = path[len("file:"):] if path.startswith("file:") else path
        while location.startswith("//"):
            location = location[1:]
    try:
        return storage.relative(location)
    except ValueError:
        raise CorruptTableError(f"clean plan {where} names {path}, outside the table "
                                f"{storage.base_path}; refusing to delete it") from None


# -- planning --------------------------------------------------------------------------------

def earliest_commit_to_retain(timeline: Timeline, write_config: WriteConfig, *,
                              now: _dt.datetime | None = None) -> Instant | None:
    """The ECR by policy (Java ``CleanPlanner.getEarliestCommitToRetain``); None for
    KEEP_LATEST_FILE_VERSIONS or when not due yet.

    Never later than the last completed commit before the earliest pending write,
    compaction or clustering (Hudi applies that bound to KEEP_LATEST_COMMITS; it is applied
    to KEEP_LATEST_BY_HOURS here too, which only keeps more).
    """
    policy = write_config.cleaner_policy
    commits = sorted(timeline.completed_data_instants, key=lambda i: i.requested_time)
    candidate: Instant | None = None
    if policy is CleanerPolicy.KEEP_LATEST_COMMITS:
        retained = write_config.cleaner_commits_retained
        if len(commits) > retained:
            candidate = commits[len(commits) - retained]
    elif policy is CleanerPolicy.KEEP_LATEST_BY_HOURS:
        moment = now or _dt.datetime.now(_dt.timezone.utc)
        cutoff = format_instant_time(moment - _dt.timedelta(
            hours=write_config.cleaner_hours_retained))
        candidate = next((i for i in commits if i.requested_time >= cutoff), None)
    if candidate is None:
        return None
    pending = [i.requested_time for i in timeline.pending(_PENDING_BOUND)]
    if pending and min(pending) < candidate.requested_time:
        first_pending = min(pending)
        before = [i for i in commits if i.requested_time < first_pending]
        return before[-1] if before else None
    return candidate


@dataclass(frozen=True)
class _Pending:
    """What pending table services protect: compaction operations and clustering inputs."""

    compaction_base: Mapping[Group, str]  # group → base instant of its planned slice
    compaction_start: Mapping[Group, str]  # group → instant of a pending (major) compaction
    clustering_files: frozenset[str]  # file names read by pending clusterings


def _read_plan(timeline: Timeline, instant: Instant) -> dict[str, Any]:
    rel = f"{timeline.folder}/{instant.requested_time}.{instant.action.value}.requested"
    try:
        data = timeline.storage.read(rel)
    except FileNotFoundError:
        raise CorruptTableError(f"pending {instant.action.value} {instant.requested_time} "
                                f"has no plan {rel}") from None
    if not data:
        return {}
    try:
        return read_avro_ocf(data)
    except (ValueError, OSError, EOFError) as exc:
        raise CorruptTableError(f"plan {rel} cannot be read: {exc}") from exc


def _pending_services(timeline: Timeline) -> _Pending:
    """What pending services protect from the cleaner, read from their plans. Not
    :meth:`~engine.layout.view.TableView.pending_service_groups` (the groups a new plan must
    leave alone): the cleaner needs each compaction's base instant and start, and the files
    (not groups) a clustering reads; a pending replacecommit counts only as a clustering."""
    base: dict[Group, str] = {}
    start: dict[Group, str] = {}
    for inst in timeline.pending([Action.COMPACTION, Action.LOG_COMPACTION]):
        for op in _read_plan(timeline, inst).get("operations") or ():
            group = (str(op.get("partitionPath") or ""), str(op.get("fileId") or ""))
            base[group] = str(op.get("baseInstantTime") or inst.requested_time)
            if inst.action is Action.COMPACTION:
                start[group] = inst.requested_time
    names: set[str] = set()
    for inst in timeline.pending([Action.CLUSTERING, Action.REPLACE_COMMIT]):
        plan = _read_plan(timeline, inst)
        if inst.action is Action.REPLACE_COMMIT and plan.get("operationType") != "CLUSTER":
            continue
        for group in (plan.get("clusteringPlan") or {}).get("inputGroups") or ():
            for info in group.get("slices") or ():
                for path in [info.get("dataFilePath"), *(info.get("deltaFilePaths") or ())]:
                    if path:
                        names.add(str(path).rsplit("/", 1)[-1])
    return _Pending(base, start, frozenset(names))


def _replaced_groups(timeline: Timeline) -> dict[Group, str]:
    """Groups replaced by completed replacecommits → the (earliest) replacing instant's
    completion time: time travel sees a replacecommit only once it completed
    (:func:`~engine.layout.file_group.visible_instants`), so the groups it replaced serve
    every view before that. Not :meth:`~engine.layout.view.TableView.replaced_groups` (the
    groups a view hides): when each group was replaced, over the active timeline."""
    replaced: dict[Group, str] = {}
    for inst in timeline.completed_data_instants:
        if inst.action.completed_action is not Action.REPLACE_COMMIT:
            continue
        done = completion_key(inst)
        meta = timeline.commit_metadata(inst)
        for partition, ids in meta.partition_to_replace_file_ids.items():
            for fid in ids:
                key = (partition, fid)
                replaced[key] = min(replaced.get(key, done), done)
    return replaced


def _files_of(slc: FileSlice) -> list[str]:
    files = [slc.base_file.path] if slc.base_file is not None else []
    return files + [log.path for log in slc.log_files]


def _names_of(slc: FileSlice) -> set[str]:
    names = {slc.base_file.name} if slc.base_file is not None else set()
    return names | {log.name for log in slc.log_files}


def plan_clean(storage: Storage, timeline: Timeline, write_config: WriteConfig, *,
               now: _dt.datetime | None = None) -> CleanerPlan | None:
    """The files a clean would delete now (None: nothing is due). Reads only."""
    policy = write_config.cleaner_policy
    versions = policy is CleanerPolicy.KEEP_LATEST_FILE_VERSIONS
    ecr = earliest_commit_to_retain(timeline, write_config, now=now)
    if ecr is None and not versions:
        return None
    ecr_time = ecr.requested_time if ecr is not None else ""
    kept_by_savepoint = savepointed_files(timeline)
    protected = frozenset().union(*kept_by_savepoint.values()) if kept_by_savepoint \
        else frozenset()
    pending = _pending_services(timeline)
    protected = protected | pending.clustering_files
    replaced = _replaced_groups(timeline)
    slices = TableView(storage, timeline).all_file_slices(
        pending_slice_starts=pending.compaction_start, include_replaced=True)
    groups: dict[Group, list[FileSlice]] = {}
    for slc in slices:
        groups.setdefault((slc.partition_path, slc.file_id), []).append(slc)

    doomed: dict[str, list[str]] = {}
    readable = ""
    for group, ordered in sorted(groups.items()):
        newest_first = ordered[::-1]
        compaction_base = pending.compaction_base.get(group)

        def needed_by_compaction(slc: FileSlice, base: str | None = compaction_base) -> bool:
            return base is not None and slc.base_instant >= base

        delete: list[FileSlice] = []
        if group in replaced:
            # Java: replacecommit < ECR. Here it must have *completed* before the ECR was
            # requested, so that every view from the ECR on sees it (and not these groups);
            # archival keeps the replacecommit active until then (archive._replace_cutoff).
            if versions or replaced[group] < ecr_time:
                delete = [s for s in newest_first if not (_names_of(s) & protected)]
                if delete:
                    readable = max(readable, replaced[group])
        elif versions:
            keep = write_config.cleaner_fileversions_retained
            if compaction_base is not None:
                keep -= 1  # the slice under compaction counts as one version
            candidates = [s for s in newest_first if not needed_by_compaction(s)]
            delete = [s for s in candidates[max(keep, 0):] if not (_names_of(s) & protected)]
            if delete:
                readable = max(readable, _kept_suffix_start(newest_first, delete))
        else:
            last = newest_first[0]
            before = next((s for s in newest_first if s.base_instant < ecr_time), None)
            delete = [s for s in newest_first
                      if s is not last and s is not before and s.base_instant < ecr_time
                      and not (_names_of(s) & protected) and not needed_by_compaction(s)]
        for slc in delete:
            doomed.setdefault(group[0], []).extend(_files_of(slc))
    if not doomed:
        return None
    if not versions:
        readable = ecr_time
    commits = sorted(timeline.completed_data_instants, key=lambda i: i.requested_time)
    return CleanerPlan(
        policy=policy.value, earliest_commit_to_retain=ecr,
        last_completed_commit=commits[-1].requested_time if commits else "",
        files={p: tuple(sorted(paths)) for p, paths in sorted(doomed.items())},
        savepointed_timestamps=tuple(sorted(kept_by_savepoint)),
        earliest_readable=max(readable, earliest_readable_instant(timeline) or ""))


def _kept_suffix_start(newest_first: Sequence[FileSlice], delete: Sequence[FileSlice]) -> str:
    """Base instant of the oldest slice of the kept run of newest slices: time travel at or
    after it finds every file it needs."""
    doomed = {id(s) for s in delete}
    start = newest_first[0].base_instant
    for slc in newest_first:
        if id(slc) in doomed:
            break
        start = slc.base_instant
    return start


# -- executing -------------------------------------------------------------------------------

@dataclass(frozen=True)
class CleanTask:
    """The deletions of one partition (picklable; runs where the runner puts it)."""

    storage: Storage
    partition: str
    paths: tuple[str, ...]


@dataclass(frozen=True)
class CleanTaskResult:
    """File names deleted (or already gone) and those that could not be deleted."""

    partition: str
    deleted: tuple[str, ...]
    failed: tuple[str, ...]


def execute_clean_task(task: CleanTask) -> CleanTaskResult:
    """Delete one partition's files; a file already gone counts as deleted. Idempotent."""
    storage = task.storage
    deleted: list[str] = []
    failed: list[str] = []
    for rel in task.paths:
        name = rel.rsplit("/", 1)[-1]
        try:
            storage.delete(rel)
            deleted.append(name)
        except OSError:
            failed.append(name)
    return CleanTaskResult(task.partition, tuple(deleted), tuple(failed))


def _plan_file(timeline: Timeline, instant_time: str) -> str:
    return f"{timeline.folder}/{instant_time}.clean.requested"


def _execute(client: WriteClient, instant: Instant, runner: TaskRunner) -> int | None:
    """Run one pending clean to completion; returns files deleted (None: another process
    completed it first)."""
    started = time.monotonic()
    storage = client.storage
    timeline = Timeline.load(storage, client.config)
    where = _plan_file(timeline, instant.requested_time)
    try:
        data = storage.read(where)
    except FileNotFoundError:
        raise CorruptTableError(f"pending clean {instant.requested_time} has no plan "
                                f"{where}; it cannot be finished") from None
    plan = CleanerPlan.from_bytes(data, storage, where)
    if instant.state is State.REQUESTED:
        with client.lock:
            now = Timeline.load(storage, client.config)
            current = _find_clean(now, instant.requested_time)
            if current is None or current.is_completed:
                return None
            if current.state is State.REQUESTED:
                now.transition_to_inflight(current)
    tasks = [CleanTask(storage, p, paths) for p, paths in plan.files.items()]
    results: list[CleanTaskResult] = list(runner(execute_clean_task, tasks))
    storage.sync()
    policy = plan.policy
    ecr = plan.earliest_commit_to_retain
    extra = {SAVEPOINTED_TIMESTAMPS: ",".join(plan.savepointed_timestamps)}
    if plan.earliest_readable:
        extra[EARLIEST_READABLE] = plan.earliest_readable
    record = {
        "startCleanTime": instant.requested_time,
        "timeTakenInMillis": int((time.monotonic() - started) * 1000),
        "totalFilesDeleted": sum(len(r.deleted) for r in results),
        "earliestCommitToRetain": ecr.requested_time if ecr is not None else "",
        "lastCompletedCommitTimestamp": plan.last_completed_commit,
        "partitionMetadata": {
            r.partition: {"partitionPath": r.partition, "policy": policy,
                          "deletePathPatterns": [p.rsplit("/", 1)[-1]
                                                 for p in plan.files[r.partition]],
                          "successDeleteFiles": list(r.deleted),
                          "failedDeleteFiles": list(r.failed), "isPartitionDeleted": False}
            for r in results},
        "version": PLAN_VERSION,
        "bootstrapPartitionMetadata": None,
        "extraMetadata": extra,
    }
    content = write_avro_ocf(METADATA_SCHEMA, record)
    with client.lock:
        now = Timeline.load(storage, client.config)
        current = _find_clean(now, instant.requested_time)
        if current is None or current.is_completed:
            return None
        client.lock.verify()
        commit_instant(now, current, content)
    return sum(len(r.deleted) for r in results)


def _find_clean(timeline: Timeline, instant_time: str) -> Instant | None:
    return next((i for i in timeline.instants
                 if i.action is Action.CLEAN and i.requested_time == instant_time), None)


def run_clean(client: WriteClient, *, schedule_only: bool = False,
              runner: TaskRunner | None = None,
              now: _dt.datetime | None = None, seen: Timeline | None = None) -> ServiceRun:
    """Finish pending cleans, then plan a clean and (unless ``schedule_only``) execute it.

    Driver side. ``runner`` executes the per-partition deletions (default: this process).
    ``now``: the clock for KEEP_LATEST_BY_HOURS (tests). Safe to call concurrently: a plan is
    written only when no clean is pending, and a clean completes once. ``seen``: a recent
    snapshot (the write's own commit) to find pending cleans and rollbacks in and to judge
    whether a clean is due (the timeline is listed once if None). Nothing is planned, and
    the lock not taken, when that snapshot has no commit to retain yet (Java's early exit of
    ``CleanPlanner``) or, given ``seen``, when a plan made from it deletes nothing; a plan is
    written under the lock, made from the timeline as it is then (the plan made from
    ``seen`` when the timeline holds the same instants: the same plan).
    """
    run = runner or local_runner
    completed: list[str] = []
    deleted = 0
    timeline = seen or Timeline.load(client.storage, client.config)
    if not schedule_only:
        if _rolled_back_since_last_clean(timeline):
            deleted += len(remove_orphan_files(client.storage, client.config))
        for pending in timeline.pending([Action.CLEAN]):
            n = _execute(client, pending, run)
            if n is not None:
                completed.append(pending.requested_time)
                deleted += n
    nothing = ServiceRun("clean", None, (), {"files_deleted": deleted})
    if (not completed and client.write_config.cleaner_policy
            is not CleanerPolicy.KEEP_LATEST_FILE_VERSIONS
            and earliest_commit_to_retain(timeline, client.write_config, now=now) is None):
        return nothing
    early: CleanerPlan | None = None
    if seen is not None and not completed and not timeline.pending([Action.CLEAN]):
        early = plan_clean(client.storage, timeline, client.write_config, now=now)
        if early is None:
            return nothing
    scheduled: Instant | None = None
    with client.lock:
        latest = Timeline.load(client.storage, client.config)
        if not latest.pending([Action.CLEAN]):
            plan = (early if early is not None and latest.instants == timeline.instants
                    else plan_clean(client.storage, latest, client.write_config, now=now))
            if plan is not None:
                client.lock.verify()
                scheduled = latest.create_requested(
                    Action.CLEAN, content=plan.to_avro_bytes(client.storage))
    if scheduled is not None and not schedule_only:
        n = _execute(client, scheduled, run)
        if n is not None:
            completed.append(scheduled.requested_time)
            deleted += n
    return ServiceRun("clean", scheduled.requested_time if scheduled else None,
                      tuple(completed), {"files_deleted": deleted})


def _rolled_back_since_last_clean(timeline: Timeline) -> bool:
    """Whether a rollback completed since the latest completed clean: only a rolled-back or
    refused write leaves files no instant owns, so only then is the table listed for them
    (:func:`~engine.write.rollback.remove_orphan_files`)."""
    cleans = [i.requested_time for i in timeline.instants
              if i.action is Action.CLEAN and i.is_completed]
    last = cleans[-1] if cleans else ""
    return any(i.action is Action.ROLLBACK and i.requested_time > last
               for i in timeline.instants)


# -- what stays readable (engine.read.retention: readers need it) ------------------------

def pending_clean_deletes(timeline: Timeline) -> frozenset[str]:
    """File names that pending cleans will delete."""
    names: set[str] = set()
    for inst in timeline.pending([Action.CLEAN]):
        where = _plan_file(timeline, inst.requested_time)
        try:
            plan = CleanerPlan.from_bytes(timeline.storage.read(where), timeline.storage, where)
        except FileNotFoundError:
            continue
        for paths in plan.files.values():
            names.update(p.rsplit("/", 1)[-1] for p in paths)
    return frozenset(names)
