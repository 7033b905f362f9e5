"""Archival: moving old instants from the active timeline into the LSM history
(docs/engine.md, "Archival"; Java ``TimelineArchiverV2``, ``ArchivalUtils``).

:func:`run_archive` runs entirely under the table lock (it only moves small timeline files):

1. **When**: the completed commits (commit, deltacommit, replacecommit) on the active
   timeline number more than ``hoodie.keep.max.commits``; the oldest are archived down to
   ``hoodie.keep.min.commits``. Both are raised when the latest clean's
   ``earliestCommitToRetain`` (ECR) needs more: min becomes (commits after ECR) + 2 and max
   rises as much.
2. **Never archived** (:func:`archivable_commits`): commits at or after the *cut-off*, the
   earliest of: the newest completed commit before the earliest pending write or table
   service instant (or that instant); the oldest commit that *completed* after that
   instant was requested — a commit older by requested time that completed while the
   instant was in flight is what its conflict check (:mod:`engine.write.conflict`) and a
   clustering's carry-over look for on the active timeline (Java archives by requested
   time only and has this gap; we close it); on MERGE_ON_READ with the NUM_COMMITS /
   NUM_AND_TIME compaction trigger, the deltacommits the next compaction trigger counts
   (``CompactionUtils.getEarliestInstantToRetainForCompaction``); the first replacecommit or
   clustering not completed before the latest clean's ECR (no clean yet: the first one), so
   replaced file groups are cleaned before their replacecommit leaves the active timeline
   (:func:`_replace_cutoff`: by completion time, the cleaner's own test). Commits at
   or after the first savepoint stay too (``hoodie.archive.beyond.savepoint=true``: only the
   savepointed commits stay). Savepoints, pending instants and restores are never archived.
   Nor is a deltacommit whose log files still exist, nor anything after it
   (docs/engine.md, "Archival"): Java needs the completion time of every log on
   storage from the active timeline or the history, and hudi-rs 0.5.0 — which reads no
   history — drops versions of such logs when later logs of the same file slice are active
   (found with two concurrent writers). The cleaner removes old logs once a compaction
   rewrote them; their deltacommits are archived after that. (Our reader would cope: the
   history row written first carries the completion time, :mod:`engine.layout.file_group`.)
3. Completed cleans and rollbacks older than the newest archived commit go along.
4. **Order**: the history rows are written and published (parquet, manifest, ``_version_``)
   before any active file is deleted; then all requested files, all inflight files, and the
   completed files oldest first. Then the history's LSM levels are merged and old manifests
   cleaned.

Crash behaviour: rows already in the history are not written again (a run that crashed
while deleting active files is finished by the next run, which only deletes); a parquet file
written but not yet in a manifest is deleted and rewritten (or cleaned up).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import CompactionTrigger, TableConfig, WriteConfig
from engine.errors import CorruptTableError
from engine.layout.view import TableView
from engine.services.base import ServiceRun
from engine.storage import Storage
from engine.timeline.active import Timeline, completion_key
from engine.timeline.commit_metadata import read_avro_ocf
from engine.timeline.history import ArchivedInstant, LSMHistory
from engine.timeline.instant import Action, Instant, State
from engine.write.rollback import remove_orphan_files
from engine.write.write_client import WriteClient

SERVICE = "archive"


@dataclass(frozen=True)
class LatestClean:
    """The latest completed clean: its requested time and ``earliestCommitToRetain``."""

    requested_time: str
    earliest_commit_to_retain: str


def latest_clean(timeline: Timeline) -> LatestClean | None:
    """The latest completed clean on the active timeline, with the ECR read from its
    ``T_C.clean`` (``HoodieCleanMetadata.earliestCommitToRetain``; '' when none)."""
    cleans = [i for i in timeline.instants if i.action is Action.CLEAN and i.is_completed]
    if not cleans:
        return None
    clean = cleans[-1]
    rel = f"{timeline.folder}/{clean.file_name(timeline.config.timeline_layout)}"
    try:
        record = read_avro_ocf(timeline.storage.read(rel))
    except FileNotFoundError:
        raise CorruptTableError(f"completed clean {rel} vanished") from None
    except (ValueError, OSError, EOFError, StopIteration) as exc:
        raise CorruptTableError(f"clean metadata {rel} cannot be read: {exc}") from exc
    return LatestClean(clean.requested_time, str(record.get("earliestCommitToRetain") or ""))


def keep_limits(timeline: Timeline, write_config: WriteConfig,
                clean: LatestClean | None) -> tuple[int, int]:
    """(min, max) completed commits to keep, raised when the cleaner's ECR needs more."""
    low, high = write_config.keep_min_commits, write_config.keep_max_commits
    if clean is not None and clean.earliest_commit_to_retain:
        after = sum(1 for i in timeline.completed_data_instants
                    if i.requested_time > clean.earliest_commit_to_retain)
        extra = max(0, after + 2 - low)
        low, high = low + extra, high + extra
    return low, high


def _compaction_cutoff(timeline: Timeline, max_delta_commits: int) -> str | None:
    """Java ``getEarliestInstantToRetainForCompaction``: keep the deltacommits since the
    last compaction that the next NUM_COMMITS trigger counts."""
    compactions = [i.requested_time for i in timeline.instants
                   if i.is_completed and i.action.completed_action is Action.COMMIT]
    last = compactions[-1] if compactions else None
    deltas = [i.requested_time for i in timeline.instants
              if i.action is Action.DELTA_COMMIT and (last is None or i.requested_time > last)]
    if not deltas:
        return None
    if len(deltas) >= max_delta_commits:
        return deltas[len(deltas) - max_delta_commits]
    return last if last is not None else deltas[0]


def _replace_cutoff(timeline: Timeline, clean: LatestClean | None) -> str | None:
    """The first replacecommit/clustering the cleaner has not passed yet: pending, or
    completed at or after the latest clean's ECR (its own time under
    KEEP_LATEST_FILE_VERSIONS), or any without a clean.

    The cleaner deletes the groups a replacecommit replaced once it *completed* before the
    ECR (:func:`engine.services.clean.plan_clean`: views from the ECR on must not need
    them), so archival waits for exactly that. Java compares requested times here
    (``ClusteringUtils.getEarliestInstantToRetainForClustering``) and would archive a
    clustering requested before the ECR but completed after it while its replaced groups
    are still on storage; under KEEP_LATEST_FILE_VERSIONS that is Java's open HUDI-6352 (a
    replacecommit pending while the cleaner ran).
    """
    replaces = [i for i in timeline.instants
                if i.action in (Action.REPLACE_COMMIT, Action.CLUSTERING)]
    if clean is not None:
        bound = clean.earliest_commit_to_retain or clean.requested_time
        replaces = [i for i in replaces if not i.is_completed or completion_key(i) >= bound]
    return min((i.requested_time for i in replaces), default=None)


def archive_cutoff(timeline: Timeline, config: TableConfig,
                   write_config: WriteConfig, clean: LatestClean | None,
                   log_instants: frozenset[str] = frozenset()) -> str | None:
    """Requested time before which commits may be archived (None: no limit), as Java's
    ``TimelineArchiverV2``; ``log_instants``: the instants of the log files on storage."""
    commits = sorted(i.requested_time for i in timeline.completed_data_instants)
    candidates: list[str] = []
    pending = [i.requested_time for i in timeline.instants
               if not i.is_completed and i.action.writes_data]
    if pending:
        first_pending = min(pending)
        before = [t for t in commits if t < first_pending]
        candidates.append(before[-1] if before else first_pending)
        # A pending writer checks conflicts (and a clustering carries writes over) against
        # the active timeline only: every commit that completed after it started must stay.
        late = [i.requested_time for i in timeline.completed_data_instants
                if completion_key(i) > first_pending]
        if late:
            candidates.append(min(late))
    if config.is_mor and write_config.compact_trigger in (CompactionTrigger.NUM_COMMITS,
                                                          CompactionTrigger.NUM_AND_TIME):
        found = _compaction_cutoff(timeline, write_config.compact_max_delta_commits)
        if found is not None:
            candidates.append(found)
    replace = _replace_cutoff(timeline, clean)
    if replace is not None:
        candidates.append(replace)
    if log_instants:
        live = [i.requested_time for i in timeline.completed_data_instants
                if i.action.completed_action is Action.DELTA_COMMIT
                and i.requested_time in log_instants]
        if live:
            candidates.append(min(live))
    return min(candidates) if candidates else None


def archivable_commits(timeline: Timeline, config: TableConfig,
                       write_config: WriteConfig) -> list[Instant]:
    """The completed commits one archival run archives (oldest first; [] if not due)."""
    clean = latest_clean(timeline)
    low, high = keep_limits(timeline, write_config, clean)
    commits = sorted(timeline.completed_data_instants, key=lambda i: i.requested_time)
    if len(commits) <= high:
        return []
    logs = frozenset(f.instant_time for f in TableView(timeline.storage, timeline)
                     .list_table_files().log_files) if config.is_mor else frozenset()
    cutoff = archive_cutoff(timeline, config, write_config, clean, logs)
    savepoints = timeline.savepointed_times
    first_savepoint = min(savepoints, default=None)
    chosen = []
    for commit in commits:
        t = commit.requested_time
        if write_config.archive_beyond_savepoint:
            if t in savepoints:
                continue
        elif first_savepoint is not None and t >= first_savepoint:
            continue
        if cutoff is not None and t >= cutoff:
            continue
        chosen.append(commit)
    return chosen[:max(0, len(commits) - low)]


def instants_to_archive(timeline: Timeline, config: TableConfig,
                        write_config: WriteConfig) -> list[Instant]:
    """Commits to archive plus the completed cleans and rollbacks older than the newest of
    them, by requested time."""
    commits = archivable_commits(timeline, config, write_config)
    if not commits:
        return []
    newest = commits[-1].requested_time
    others = [i for i in timeline.instants
              if i.is_completed and i.action in (Action.CLEAN, Action.ROLLBACK)
              and i.requested_time < newest]
    return sorted([*commits, *others], key=lambda i: i.requested_time)


def _timeline_files(storage: Storage, folder: str) -> dict[str, list[tuple[Instant, str]]]:
    files: dict[str, list[tuple[Instant, str]]] = {}
    for status in storage.list_dir(folder):
        parsed = Instant.parse(status.name)
        if parsed is not None:
            files.setdefault(parsed.requested_time, []).append((parsed, status.name))
    return files


def history_row(storage: Storage, folder: str,
                files: list[tuple[Instant, str]]) -> ArchivedInstant:
    """The ``HoodieLSMTimelineInstant`` row of one completed action from its timeline files
    (as Java's ``LSMTimelineWriter``: metadata = completed file bytes; plan = requested bytes for
    compaction, logcompaction and clean; for replacecommit/clustering the inflight bytes if any,
    else the requested bytes)."""
    completed = next(i for i, _ in files if i.state is State.COMPLETED)
    data = {i.state: storage.read(f"{folder}/{name}") for i, name in files}
    pending_action = next((i.action for i, _ in files if i.state is not State.COMPLETED),
                          completed.action)
    plan: bytes | None = None
    if pending_action in (Action.COMPACTION, Action.LOG_COMPACTION, Action.CLEAN):
        plan = data.get(State.REQUESTED)
    elif pending_action in (Action.REPLACE_COMMIT, Action.CLUSTERING):
        plan = data.get(State.INFLIGHT) or data.get(State.REQUESTED)
    return ArchivedInstant(completed.requested_time, completed.completion_time,
                           completed.action.completed_action.value,
                           data.get(State.COMPLETED) or None, plan or None)


def archives_automatically(config: TableConfig, write_config: WriteConfig) -> bool:
    """Whether writers archive after their commits (``hoodie.archive.automatic``): never on
    a table whose archived timeline tidelake does not write (version 6: its instants stay
    on the active timeline, :mod:`engine.timeline.version`)."""
    return write_config.archive_automatic and config.table_version.lsm_history


def run_archive(client: WriteClient, *, seen: Timeline | None = None) -> ServiceRun:
    """Archive old instants into the LSM history if due (under the table lock).

    ``completed`` lists the requested times of the instants archived (removed from the
    active timeline); ``details``: ``instants_archived``, ``commits_archived``,
    ``history_rows_written``, ``history_merges``. ``seen``: a recent snapshot to judge
    whether archival is due from (the timeline is listed if None); what is archived is
    chosen under the lock from the timeline as it is then.
    """
    storage, config = client.storage, client.config
    if not config.table_version.lsm_history:
        from engine.errors import UnsupportedTableError
        raise UnsupportedTableError(
            f"archival writes the LSM history of table version 8; table {config.name!r} is "
            f"version {config.version}, whose archived timeline (.hoodie/archived) tidelake "
            "does not write: its instants stay on the active timeline")
    active_commits = (seen or Timeline.load(storage, config)).completed_data_instants
    if len(active_commits) <= client.write_config.keep_max_commits:
        return ServiceRun(SERVICE)  # not due: no lock taken (the common case after a write)
    with client.lock:
        timeline = Timeline.load(storage, config)
        chosen = instants_to_archive(timeline, config, client.write_config)
        if not chosen:
            return ServiceRun(SERVICE)
        # Once the timeline's start passes an instant, readers take its files as committed:
        # files of instants that never completed must be gone first.
        orphans = remove_orphan_files(storage, config)
        history = LSMHistory(storage, timeline.history_folder,
                             compression=_history_codec(client.write_config.compression))
        archived = timeline.archived()
        files = _timeline_files(storage, timeline.folder)
        rows = [history_row(storage, timeline.folder, files[i.requested_time])
                for i in chosen if i.requested_time not in archived]
        if rows:
            history.append(rows)
        client.lock.verify()
        _delete_active_files(storage, timeline.folder,
                             [files.get(i.requested_time, []) for i in chosen])
        merges = history.compact_and_clean(client.write_config.timeline_compaction_batch_size)
    commits = sum(1 for i in chosen if i.action.writes_data)
    return ServiceRun(SERVICE, completed=tuple(i.requested_time for i in chosen),
                      details={"instants_archived": len(chosen), "commits_archived": commits,
                               "history_rows_written": len(rows), "history_merges": merges,
                               "orphan_files_deleted": len(orphans)})


def _delete_active_files(storage: Storage, folder: str,
                         actions: list[list[tuple[Instant, str]]]) -> None:
    """Requested files, then inflight files, then completed files oldest first (deleting a
    completed file first would make its instant look pending)."""
    for state in (State.REQUESTED, State.INFLIGHT, State.COMPLETED):
        for files in actions:
            for instant, name in files:
                if instant.state is state:
                    storage.delete(f"{folder}/{name}")


def _history_codec(codec: str) -> str:
    """pyarrow's name for the base files' parquet codec (history files use the same)."""
    name = codec.lower()
    return "none" if name in ("uncompressed", "none", "") else name
