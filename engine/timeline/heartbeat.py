"""Heartbeats of pending instants: how a writer says "this instant is still being written".

As Hudi's ``HoodieHeartbeatClient``: while an instant is pending its writer keeps
``.hoodie/.heartbeat/<instant>`` fresh, rewriting it every
``hoodie.client.heartbeat.interval_in_ms`` from a daemon thread. Another writer judges a
pending instant *failed* — and may roll it back — only when its heartbeat is older than
interval x ``hoodie.client.heartbeat.tolerable.misses`` (Hudi's rule), or missing.

The heartbeat file is written before the instant's requested file, under the table lock
(:mod:`engine.write.write_client`), so a pending instant without a heartbeat is one whose
writer died before writing anything, or one written before heartbeats existed. The file is deleted
after the instant completes or is rolled back. Age is the file's modification time against this
machine's clock: writers of one table need clocks in sync (as Hudi's do).
"""

from __future__ import annotations

import threading
import time

from engine.storage import Storage
from engine.timeline.active import HOODIE

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
    """True if the instant's writer stopped beating (or never did): it may be rolled back."""
    age = heartbeat_age(storage, instant_time)
    return age is None or age > expiry_seconds


def delete_heartbeat(storage: Storage, instant_time: str) -> None:
    """Remove an instant's heartbeat file (after it completed or was rolled back)."""
    storage.delete(heartbeat_path(instant_time))


class Heartbeat:
    """The heartbeat of one pending instant of this process; stop it when the instant ends.

    :meth:`start` writes the file at once; a daemon thread rewrites it every
    ``interval_seconds`` until :meth:`stop`, which also deletes it. Driver side only: a
    Spark job's executors never beat, its driver does.
    """

    def __init__(self, storage: Storage, instant_time: str, interval_seconds: float) -> None:
        self.storage = storage
        self.instant_time = instant_time
        self.interval_seconds = interval_seconds
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Refresh the heartbeat file now."""
        self.storage.makedirs(HEARTBEAT_FOLDER)
        stamp = str(int(time.time() * 1000)).encode()
        self.storage.write_replace(heartbeat_path(self.instant_time), stamp)

    def start(self) -> Heartbeat:
        """Write the heartbeat and keep it fresh from a daemon thread."""
        self.beat()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"tidelake-heartbeat-{self.instant_time}")
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_seconds):
            try:
                self.beat()
            except OSError:
                # A missed beat is tolerated (tolerable.misses); the next one retries.
                continue

    def stop(self, *, delete: bool = True) -> None:
        """Stop beating and (by default) delete the heartbeat file."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if delete:
            delete_heartbeat(self.storage, self.instant_time)
