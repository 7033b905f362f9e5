"""What the cleaner left readable, and what a read says when a file it planned is gone.

:func:`earliest_readable_instant` is the newest earliest-commit-to-retain (ECR) of the completed
cleans (for KEEP_LATEST_FILE_VERSIONS, which has no ECR, the oldest instant whose view the clean
left whole, recorded in the clean's ``extraMetadata``); :func:`check_readable` raises
:class:`~engine.errors.InstantNotReadableError` for a time-travel or incremental read that starts
before it. (They live here, below the services, because readers need them; the cleaner,
:mod:`engine.services.clean`, writes what they read.)

A planned read (:class:`engine.read.scan.Scan`) names its files; the cleaner may delete some of
them between the plan and the read (a stream planning a micro-batch just before a clean
completes). :func:`missing_file_error` turns the ``FileNotFoundError`` into the table's own
error: :class:`~engine.errors.InstantNotReadableError` when the instant the read needs is now
outside what the cleaner keeps, else :class:`~engine.errors.CorruptTableError` — a committed
file the cleaner keeps is missing, deleted by something other than the table's services. Hudi's
Spark incremental source does the first half (``IncrementalRelation`` turns the not-found error
into ``HoodieIncrementalPathNotFoundException``, HUDI-2711: "likely ... deleted by the
cleaner"); tidelake also reloads the timeline once and plans again first
(:meth:`engine.read.scan.Scan.to_table`), and tells the two causes apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.config import TableConfig
from engine.errors import CorruptTableError, InstantNotReadableError
from engine.storage import Storage
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import read_avro_ocf
from engine.timeline.instant import Action, Instant

__all__ = ["EARLIEST_READABLE", "check_readable", "earliest_readable_instant",
           "missing_file_error", "savepoint_metadata", "savepointed_files", "savepoints"]

EARLIEST_READABLE = "tidelake.clean.earliest.readable.instant"
"""extraMetadata key (plan and metadata): the oldest instant whose time-travel view this
clean leaves whole. Hudi has no such key; it is what KEEP_LATEST_FILE_VERSIONS lacks."""


def savepoints(timeline: Timeline) -> list[str]:
    """Instant times of the completed savepoints, oldest first."""
    return sorted(i.requested_time for i in timeline.instants
                  if i.action is Action.SAVEPOINT and i.is_completed)


def savepoint_metadata(timeline: Timeline, instant_time: str) -> dict[str, object]:
    """The decoded ``HoodieSavepointMetadata`` of a completed savepoint."""
    found = next((i for i in timeline.instants if i.action is Action.SAVEPOINT
                  and i.is_completed and i.requested_time == instant_time), None)
    if found is None:
        raise ValueError(f"instant: no savepoint at {instant_time}")
    rel = f"{timeline.folder}/{found.file_name(timeline.config.timeline_layout)}"
    try:
        return read_avro_ocf(timeline.storage.read(rel))
    except FileNotFoundError:
        raise CorruptTableError(f"savepoint file {rel} vanished") from None
    except (ValueError, OSError, EOFError) as exc:
        raise CorruptTableError(f"savepoint file {rel} cannot be read: {exc}") from exc


def savepointed_files(timeline: Timeline) -> dict[str, frozenset[str]]:
    """Savepoint time → the data file names it keeps."""
    found: dict[str, frozenset[str]] = {}
    for t in savepoints(timeline):
        meta = savepoint_metadata(timeline, t)
        parts = meta.get("partitionMetadata") or {}
        names: set[str] = set()
        if isinstance(parts, Mapping):
            for item in parts.values():
                names.update(str(n) for n in (item or {}).get("savepointDataFile") or ())
        found[t] = frozenset(names)
    return found


def _clean_metadata(timeline: Timeline, instant: Instant) -> dict[str, Any]:
    rel = f"{timeline.folder}/{instant.file_name(timeline.config.timeline_layout)}"
    try:
        return read_avro_ocf(timeline.storage.read(rel))
    except FileNotFoundError:
        return {}  # archived meanwhile
    except (ValueError, OSError, EOFError) as exc:
        raise CorruptTableError(f"clean metadata {rel} cannot be read: {exc}") from exc


def earliest_readable_instant(timeline: Timeline) -> str | None:
    """The oldest instant a time-travel or incremental read may start at (None: no clean
    limits reads): the newest earliest-commit-to-retain of the completed cleans."""
    earliest = ""
    for inst in timeline.instants:
        if inst.action is not Action.CLEAN or not inst.is_completed:
            continue
        meta = _clean_metadata(timeline, inst)
        extra = meta.get("extraMetadata") or {}
        earliest = max(earliest, str(meta.get("earliestCommitToRetain") or ""),
                       str(extra.get(EARLIEST_READABLE) or ""))
    return earliest or None


def check_readable(timeline: Timeline, *, as_of: str | None = None,
                   start: str | None = None) -> None:
    """Raise :class:`~engine.errors.InstantNotReadableError` if a read as of ``as_of`` (or
    incremental from ``start``) reaches before what the cleaner kept; a savepoint S keeps
    time travel to S (and to any time before the next commit after S) readable."""
    point = as_of if as_of is not None else start
    if point is None:
        return
    earliest = earliest_readable_instant(timeline)
    if earliest is None or point >= earliest:
        return
    if as_of is not None:
        requested = sorted(i.requested_time for i in timeline.completed_data_instants)
        for sp in savepoints(timeline):
            if sp <= as_of and not any(sp < t <= as_of for t in requested):
                return
    kind = "time travel as of" if as_of is not None else "an incremental read from"
    raise InstantNotReadableError(
        f"{kind} {point} is not possible: the cleaner deleted files older than the earliest "
        f"readable instant {earliest} (hoodie.cleaner.* options set the retention)", earliest)


def missing_file_error(storage: Storage, config: TableConfig, path: str, *,
                       as_of: str | None = None, start: str | None = None
                       ) -> InstantNotReadableError | CorruptTableError:
    """The error for a read that found ``path`` (a file it planned) gone, judged on the
    timeline as it is now: :class:`~engine.errors.InstantNotReadableError` if the read's
    instant (``as_of``: the view it reads, ``start``: an incremental read's start) is outside
    what the cleaner keeps now, else :class:`~engine.errors.CorruptTableError` naming the
    file (a committed file the cleaner keeps was deleted by something else)."""
    timeline = Timeline.load(storage, config)
    point = (f"as of {as_of}" if as_of is not None
             else f"from {start}" if start is not None else "of the latest snapshot")
    try:
        check_readable(timeline, as_of=as_of, start=start)
    except InstantNotReadableError as exc:
        return InstantNotReadableError(
            f"the read {point} cannot complete: {path}, which it planned, is gone: the "
            f"cleaner has since deleted files older than the earliest readable instant "
            f"{exc.earliest} (hoodie.cleaner.* options set the retention); plan the read "
            "again from a later instant", exc.earliest)
    earliest = earliest_readable_instant(timeline)
    return CorruptTableError(
        f"{path}: a committed file of the read {point} is missing although the cleaner "
        f"keeps it (earliest readable instant: {earliest or 'no clean yet'}); it was deleted "
        "by something other than the table's services")
