"""Heartbeats of pending instants: how a writer says "this instant is still being written".

As Hudi's ``HoodieHeartbeatClient``: while an instant is pending its writer keeps
``.hoodie/.heartbeat/<instant>`` fresh, rewriting it every
``hoodie.client.heartbeat.interval_in_ms`` from a daemon thread. Another writer judges a
pending instant *abandoned* — and may roll it back — when its heartbeat is older than
interval x ``hoodie.client.heartbeat.tolerable.misses`` (Hudi's rule), or missing, or
when the heartbeat names a writer process that provably ended (this machine's boot and pid
namespace, the pid gone or reused: :mod:`engine.timeline.liveness`), so a job killed and
restarted rolls its predecessor's instants back at once instead of after the expiry.

The writer holds itself to the same rule (Java's ``HeartbeatUtils.abortIfHeartbeatExpired``):
a heartbeat that could not beat for longer than the expiry — the process stalled in a GC
pause, on slow storage, in a paused container — stops for good (:attr:`Heartbeat.alive`
turns false), because another writer may have judged the instant dead meanwhile; its
commit is then refused (:meth:`Heartbeat.check`).

The heartbeat file is written before the instant's requested file, under the table lock
(:mod:`engine.write.write_client`), so a pending instant without a heartbeat is one whose
writer died before writing anything, or one written before heartbeats existed. The file is deleted
after the instant completes or is rolled back. Age is the file's modification time against this
machine's clock: writers of one table need clocks in sync (as Hudi's do).
"""

from __future__ import annotations

import json
import socket
import threading
import time

from engine.errors import WriteConflictError
from engine.storage import Storage
from engine.timeline.active import HOODIE
from engine.timeline.liveness import process_ended, this_process

HEARTBEAT_FOLDER = f"{HOODIE}/.heartbeat"


def heartbeat_path(instant_time: str) -> str:
    """Path of an instant's heartbeat file, relative to the table's base path."""
    return f"{HEARTBEAT_FOLDER}/{instant_time}"


def heartbeat_age(storage: Storage, instant_time: str) -> float | None:
    """Seconds since the instant's heartbeat was last refreshed; None if it has none."""
    modified = storage.modified(heartbeat_path(instant_time))
    if modified is None:
        return None
    return max(0.0, time.time() - modified)


def is_expired(storage: Storage, instant_time: str, expiry_seconds: float) -> bool:
    """True if the instant's writer stopped beating (or never did)."""
    age = heartbeat_age(storage, instant_time)
    return age is None or age > expiry_seconds


def owner_ended(storage: Storage, instant_time: str) -> bool:
    """True if the instant's heartbeat names a writer process that provably ended."""
    try:
        record = json.loads(storage.read(heartbeat_path(instant_time)))
    except (FileNotFoundError, ValueError):
        return False  # none (is_expired says so), or written by an older version
    return isinstance(record, dict) and process_ended(record)


def is_abandoned(storage: Storage, instant_time: str, expiry_seconds: float) -> bool:
    """True if the instant may be rolled back (or a service attempt taken over): its
    heartbeat expired or is missing, or its writer provably ended."""
    return (is_expired(storage, instant_time, expiry_seconds)
            or owner_ended(storage, instant_time))


def delete_heartbeat(storage: Storage, instant_time: str) -> None:
    """Remove an instant's heartbeat file (after it completed or was rolled back)."""
    storage.delete(heartbeat_path(instant_time))


class Heartbeat:
    """The heartbeat of one pending instant of this process; stop it when the instant ends.

    :meth:`start` writes the file at once; a daemon thread rewrites it every
    ``interval_seconds`` until :meth:`stop`, which also deletes it. A heartbeat that could
    not beat within ``expiry_seconds`` (default: two intervals, Hudi's default tolerable
    misses; at least one and a half) of its last beat stops beating and is no longer
    :attr:`alive`. Driver side
    only: a Spark job's executors never beat, its driver does.
    """

    def __init__(self, storage: Storage, instant_time: str, interval_seconds: float,
                 expiry_seconds: float | None = None) -> None:
        self.storage = storage
        self.instant_time = instant_time
        self.interval_seconds = interval_seconds
        # Never within half an interval of the beat itself: with tolerable.misses=1 every
        # beat would land "late" by the time it takes (the rollback check at commit still
        # guards that setting: engine.write.write_client).
        self.expiry_seconds = max(expiry_seconds or 2 * interval_seconds,
                                  1.5 * interval_seconds)
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_beat = time.monotonic()
        self._lost: str | None = None
        self._record = {**this_process(), "host": socket.gethostname()}

    def beat(self) -> None:
        """Refresh the heartbeat file now (a JSON record of the writer process)."""
        self.storage.makedirs(HEARTBEAT_FOLDER)
        record = {**self._record, "beat_at_ms": int(time.time() * 1000)}
        self.storage.write_replace(heartbeat_path(self.instant_time),
                                   json.dumps(record).encode())

    def start(self) -> Heartbeat:
        """Write the heartbeat and keep it fresh from a daemon thread."""
        self.beat()
        self._last_beat = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"tidelake-heartbeat-{self.instant_time}")
        self._thread.start()
        return self

    def _missed(self) -> str | None:
        since = time.monotonic() - self._last_beat
        if since > self.expiry_seconds:
            return (f"the heartbeat of instant {self.instant_time} was last refreshed "
                    f"{since:.1f} s ago, more than its expiry of {self.expiry_seconds:g} s "
                    "(hoodie.client.heartbeat.interval_in_ms x tolerable.misses): another "
                    "writer may have judged the instant dead")
        return None

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_seconds):
            missed = self._missed()
            if missed is not None:
                self._lost = missed  # never beat again: the instant may be taken over
                return
            try:
                self.beat()
            except OSError:
                # A missed beat is tolerated (tolerable.misses); the next one retries.
                continue
            landed = self._missed()  # a beat that came too late left a gap all the same
            if landed is not None:
                self._lost = landed
                return
            self._last_beat = time.monotonic()

    @property
    def alive(self) -> bool:
        """False once the heartbeat missed its expiry (it then never beats again)."""
        if self._lost is None:
            self._lost = self._missed()
        return self._lost is None

    def check(self) -> None:
        """Raise :class:`~engine.errors.WriteConflictError` unless the heartbeat is alive
        and its file on storage is this writer's and fresh: a writer calls it under the
        table lock right before its commit point."""
        if not self.alive:
            raise WriteConflictError(f"{self._lost}; nothing was committed")
        age = heartbeat_age(self.storage, self.instant_time)
        if age is None or age > self.expiry_seconds:
            found = "is gone" if age is None else f"is {age:.1f} s old"
            raise WriteConflictError(
                f"the heartbeat file of instant {self.instant_time} {found} (expiry "
                f"{self.expiry_seconds:g} s): another writer may have judged the instant "
                "dead; nothing was committed")

    def stop(self, *, delete: bool = True) -> None:
        """Stop beating and (by default) delete the heartbeat file."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if delete:
            delete_heartbeat(self.storage, self.instant_time)
