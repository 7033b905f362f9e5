"""Savepoints: commits whose file slices the cleaner keeps (docs/engine.md).

A savepoint of the completed commit T is two timeline files that carry T itself (not a new
instant): ``T.savepoint.inflight`` (0 bytes), then ``T_C.savepoint``, a
``HoodieSavepointMetadata`` OCF listing, per partition, the file *names* (base and log) of the
latest slice as of T of every live file group. The cleaner never deletes a slice holding a
listed name, so a time-travel read as of T stays complete. Deleting a savepoint removes its
files (completed first, then inflight: a crash in between leaves an inflight savepoint, which
nothing counts and the next :func:`create_savepoint` of T completes). Restore is not
implemented.
"""

from __future__ import annotations

import getpass
import time

from engine.errors import CommitConflictError, InstantNotReadableError
from engine.layout.view import TableView
from engine.read.retention import (  # savepoints: re-exported, readers need it too
    earliest_readable_instant,
    savepoints,
)
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import write_avro_ocf
from engine.timeline.instant import Action, Instant, State, parse_instant_time
from engine.write.commit import commit_instant
from engine.write.write_client import WriteClient

SCHEMA = "HoodieSavepointMetadata"


def create_savepoint(client: WriteClient, instant: str | None = None, comment: str = "") -> str:
    """Savepoint a completed commit (default: the latest); returns its instant time.

    Raises ``ValueError`` if ``instant`` is not a completed commit or is savepointed already,
    :class:`~engine.errors.InstantNotReadableError` if it is older than the latest clean's
    earliest commit to retain (its files may be gone), and
    :class:`~engine.errors.CommitConflictError` if a pending clean would delete a file the
    savepoint needs (retry once the clean completed).
    """
    from engine.services.clean import pending_clean_deletes

    if instant is not None:
        try:
            parse_instant_time(instant)
        except (TypeError, ValueError):
            raise ValueError(f"instant: {instant!r} is not an instant time "
                             "yyyyMMddHHmmss[SSS]") from None
    with client.lock:
        timeline = Timeline.load(client.storage, client.config)
        commits = sorted(timeline.completed_data_instants, key=lambda i: i.requested_time)
        if not commits:
            raise ValueError("the table has no completed commit to savepoint")
        target = commits[-1] if instant is None else next(
            (i for i in commits if i.requested_time == instant), None)
        if target is None:
            raise ValueError(f"instant: {instant} is not a completed commit of the table")
        t = target.requested_time
        if t in savepoints(timeline):
            raise ValueError(f"instant: {t} is savepointed already")
        earliest = earliest_readable_instant(timeline)
        if earliest is not None and t < earliest:
            raise InstantNotReadableError(
                f"cannot savepoint {t}: the cleaner may have deleted its files; the earliest "
                f"instant still readable is {earliest}", earliest)
        slices = TableView(client.storage, timeline, as_of=t).latest_file_slices()
        partitions: dict[str, list[str]] = {}
        for slc in slices:
            names = partitions.setdefault(slc.partition_path, [])
            if slc.base_file is not None:
                names.append(slc.base_file.name)
            names.extend(log.name for log in slc.log_files)
        doomed = pending_clean_deletes(timeline)
        clash = sorted(n for names in partitions.values() for n in names if n in doomed)
        if clash:
            raise CommitConflictError(
                f"cannot savepoint {t} now: a pending clean deletes {clash[0]}, which the "
                "savepoint needs; retry after the clean completed")
        record = {
            "savepointedBy": _user(),
            "savepointedAt": int(time.time() * 1000),
            "comments": comment,
            "partitionMetadata": {p: {"partitionPath": p, "savepointDataFile": sorted(names)}
                                  for p, names in sorted(partitions.items())},
            "version": 1,
        }
        inflight = Instant(t, Action.SAVEPOINT, State.INFLIGHT)
        rel = f"{timeline.folder}/{inflight.file_name(timeline.config.timeline_layout)}"
        if not client.storage.exists(rel):
            client.storage.write_new(rel, b"")
        commit_instant(timeline, inflight, write_avro_ocf(SCHEMA, record))
    return t


def delete_savepoint(client: WriteClient, instant: str) -> None:
    """Remove the savepoint at ``instant`` (``ValueError`` if there is none)."""
    with client.lock:
        timeline = Timeline.load(client.storage, client.config)
        found = [i for i in timeline.instants
                 if i.action is Action.SAVEPOINT and i.requested_time == instant]
        if not any(i.is_completed for i in found):
            raise ValueError(f"instant: no savepoint at {instant}")
        layout = timeline.config.timeline_layout
        for done in found:  # completed file first: never a completed savepoint without plan
            client.storage.delete(f"{timeline.folder}/{done.file_name(layout)}")
        client.storage.delete(
            f"{timeline.folder}/{Instant(instant, Action.SAVEPOINT, State.INFLIGHT).file_name()}")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "tidelake"
