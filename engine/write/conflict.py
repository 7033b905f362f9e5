"""Conflict checks at commit: Hudi's file-group rule for concurrent writers.

A writer that started from a snapshot of the timeline may complete its instant only if no
other instant that completed since that snapshot wrote to, or replaced, one of the file
groups it wrote, and no compaction or clustering scheduled since then covers one of them
(Hudi's ``SimpleConcurrentFileWritesConflictResolutionStrategy``;
docs/engine.md, "Several writers"). Under non-blocking concurrency control, writers of log
files never conflict with each other; only a replaced file group (clustering, insert
overwrite) or one planned for clustering does.

Compaction never conflicts with log files, in any mode: v8 log files carry their own
deltacommit's instant and join slices by completion time, so a log completing after a
compaction's instant C lands in slice C whether C is pending or completed (Hudi 1.x does
the same for log appends). A *base file* written into a group under a pending compaction
plan (whenever the plan was scheduled) or into a group a compaction rewrote meanwhile does
conflict: it would start a slice the plan does not know.

Called under the table lock, right before the commit point (:mod:`engine.write.write_client`).
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.errors import WriteConflictError
from engine.format.naming import parse_base_file
from engine.layout.plans import FileGroupId, planned_groups
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import WriteStat
from engine.timeline.instant import Action, Instant


def touched_groups(stats: Iterable[WriteStat]) -> set[FileGroupId]:
    """The file groups a set of write stats wrote to."""
    return {(s.partition_path, s.file_id) for s in stats}


def _written_by(timeline: Timeline, instant: Instant) -> tuple[set[FileGroupId],
                                                               set[FileGroupId]]:
    """(groups written, groups replaced) by a completed data instant."""
    meta = timeline.commit_metadata(instant)
    written = {(p, s.file_id) for p, stats in meta.partition_to_write_stats().items()
               for s in stats}
    replaced = {(p, fid) for p, ids in meta.partition_to_replace_file_ids.items()
                for fid in ids}
    return written, replaced


def _is_compaction(timeline: Timeline, instant: Instant) -> bool:
    """A completed compaction: a ``commit`` of a merge-on-read table (``compacted=true``)."""
    if instant.action is Action.COMPACTION:
        return True
    return (instant.action is Action.COMMIT and timeline.config.is_mor
            and timeline.commit_metadata(instant).compacted)


SERVICE_ACTIONS = (Action.COMPACTION, Action.CLUSTERING, Action.REPLACE_COMMIT,
                   Action.LOG_COMPACTION)


def check_conflicts(start: Timeline, now: Timeline, instant: Instant,
                    stats: Iterable[WriteStat], *, non_blocking: bool,
                    replaced_only: bool = False) -> None:
    """Raise :class:`WriteConflictError` if ``instant``'s writes overlap what others did
    since ``start`` (the timeline the writer planned from); ``now`` is reloaded under the
    lock. ``replaced_only`` (a single writer, whose table services may still run beside
    it): only a file group replaced meanwhile (a clustering) is a conflict.

    Log files never conflict with a compaction, pending or completed: they join the slice
    the compaction starts, by completion time. A pending clustering plan is no conflict
    (except for non-blocking writers of a bucket table, whose plans are bucket resizes): the
    clustering carries over what completes on its input groups before it commits
    (:mod:`engine.services.clustering`)."""
    stats = list(stats)
    ours = touched_groups(stats)
    if not ours:
        return
    with_base = {(s.partition_path, s.file_id) for s in stats
                 if parse_base_file(s.path.rsplit("/", 1)[-1]) is not None}
    seen = {i.requested_time for i in start.instants if i.is_completed}
    for other in now.completed_data_instants:
        if other.requested_time in seen or other.requested_time == instant.requested_time:
            continue
        written, replaced = _written_by(now, other)
        if non_blocking or replaced_only:
            overlap = ours & replaced
        elif _is_compaction(now, other):
            overlap = with_base & written  # logs join slice C by completion time
        else:
            overlap = ours & (written | replaced)
        if overlap:
            partition, file_id = sorted(overlap)[0]
            raise WriteConflictError(
                f"instant {instant.requested_time} conflicts with "
                f"{other.action.completed_action.value} {other.requested_time}, which "
                f"completed at {other.completion_time} while it was being written: both "
                f"wrote file group {file_id} of partition {partition!r}"
                f"{f' (and {len(overlap) - 1} more)' if len(overlap) > 1 else ''}; "
                "nothing was committed")
    if replaced_only:
        return
    pending_before = {i.requested_time for i in start.instants if not i.is_completed}
    for other in now.pending(SERVICE_ACTIONS):
        if other.action is Action.COMPACTION:
            # logs written during a compaction land in its slice; a base file does not
            overlap = with_base & planned_groups(now, other)
        elif other.requested_time in pending_before:
            continue
        elif other.action is Action.CLUSTERING and not non_blocking:
            continue  # the clustering carries this write over when it commits
        else:
            overlap = ours & planned_groups(now, other)
        if overlap:
            partition, file_id = sorted(overlap)[0]
            when = ("" if other.requested_time in pending_before
                    else ", scheduled while it was being written")
            raise WriteConflictError(
                f"instant {instant.requested_time} conflicts with the "
                f"{other.action.value} plan {other.requested_time} on file group {file_id} "
                f"of partition {partition!r}"
                f"{when}; nothing was committed")
