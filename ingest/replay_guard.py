"""One replay of an error table at a time: a marker created exclusively, with a heartbeat.

Two replays of one error table at once would both decode the same rows and both write them
(the exactly-once bookkeeping of :mod:`ingest.replay` assumes one run at a time). A replay
therefore first creates the marker ``.hoodie/.tidelake-replay/.hoodie/lock`` in the error
table, with the storage's exclusive create (``O_EXCL`` link on a file system, a conditional
``If-None-Match: *`` put on an object store): the engine's file-system lock
(:class:`engine.timeline.lock.FileSystemLock`) on that folder, so the marker follows the
lock's rules. It records its owner (host, pid, process start, a token); the replay renews
it every quarter of :data:`MARKER_EXPIRY_SECONDS` while it runs, and removes it when it
ends. A second replay that finds it refuses at once with :class:`ReplayRunningError`
naming the holder. A marker left by a killed replay is recovered: at once when its process
provably ended (same machine and pid namespace, the process gone), else once it has not
been renewed for :data:`MARKER_EXPIRY_SECONDS`; only one replay can break a given stale
marker (the lock's end claims).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from engine.errors import LockTimeoutError, TransientError, WriteConflictError
from engine.storage import Storage
from engine.table import Table
from engine.write.distributed import LOCK_FILE, FileSystemLock

__all__ = ["MARKER_EXPIRY_SECONDS", "MARKER_FOLDER", "ReplayRunningError", "one_replay"]

MARKER_FOLDER = ".hoodie/.tidelake-replay"
"""Where the marker lives, in the error table (its file: ``<folder>/.hoodie/lock``)."""
MARKER_EXPIRY_SECONDS = 60.0
"""A marker not renewed for this long belongs to a dead replay (renewed every 15 s)."""


class ReplayRunningError(TransientError):
    """Another replay of the same error table is running; try again once it ended."""


@contextmanager
def one_replay(errors: Table) -> Iterator[Callable[[], None]]:
    """Hold the replay marker of ``errors`` for the duration of the ``with`` block; raise
    :class:`ReplayRunningError` at once if another live replay holds it. The block gets a
    check to call right before each commit: it raises :class:`ReplayRunningError` if the
    marker is no longer this replay's (this process stalled past the expiry and another
    replay took it over)."""
    storage = errors.storage.child(MARKER_FOLDER)
    marker = FileSystemLock(storage, 0.0, MARKER_EXPIRY_SECONDS)
    try:
        marker.acquire()
    except LockTimeoutError:
        raise ReplayRunningError(
            f"another replay of {errors.path} is running ({_holder(storage)}; marker "
            f"{storage.full(LOCK_FILE)}): run one replay at a time. A marker left by a killed "
            f"replay is taken over once its process is gone (same machine) or after "
            f"{MARKER_EXPIRY_SECONDS:g} s without renewal") from None

    def still_held() -> None:
        try:
            marker.verify()
        except WriteConflictError:
            raise ReplayRunningError(
                f"the replay marker {storage.full(LOCK_FILE)} of {errors.path} was taken over "
                f"by another replay (this one was not renewed for {MARKER_EXPIRY_SECONDS:g} s "
                "and looked dead); this run commits nothing more") from None

    try:
        yield still_held
    finally:
        marker.release()


def _holder(storage: Storage) -> str:
    """Who holds the marker, as its owner record says."""
    try:
        record = json.loads(storage.read(LOCK_FILE))
    except (FileNotFoundError, ValueError):
        return "held by a replay that just ended"
    if not isinstance(record, dict):
        return "held by an unreadable record"
    return f"held by {record.get('host')} pid {record.get('pid')}"
