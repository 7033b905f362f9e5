"""The table lock: mutual exclusion for the short critical sections of a commit.

Writers of one table hold it only briefly: to take an instant time and start an instant
(rolling back failed writes first), and to check conflicts and complete an instant (see
:mod:`engine.write.write_client`). ``hoodie.write.lock.provider`` picks the implementation:

* :class:`FileSystemLock` (Hudi's ``FileSystemBasedLockProvider``, the default): the lock
  is the file ``.hoodie/lock``, created with an exclusive link, so exactly one writer on
  the same local or shared file system holds it. The file records its owner (a random
  token, host, pid, thread, time). The holder renews the file's modification time every
  quarter of ``hoodie.write.lock.filesystem.expire`` from a daemon thread; a lock not
  renewed for the whole expiry belongs to a dead holder and is broken: renamed to a unique
  name, checked to still be the stale lock that was observed (else put back), deleted.
  A lock whose holder provably ended is broken the same way without waiting for the
  expiry: the record names the machine's boot, the process's pid namespace and start time,
  and when those are this machine's and this namespace's and the process no longer exists
  (or the pid now belongs to a later process), the holder was killed (a writer killed
  while starting or committing an instant; its restart takes the lock at once). Holders on
  other machines or in other containers wait for the expiry. A writer that waits more
  than two seconds says whom it waits for.
  A holder re-checks that the lock is still its own right before its commit point
  (:meth:`TableLock.verify`).
* :class:`InProcessLock` (Hudi's ``InProcessLockProvider``): a lock per table path inside
  one Python process, for writers that are threads of one process.

An object-store lock (a conditional put, ``If-None-Match: *``, of the same lock file, with
the renewal and breaking done by ETag-conditional writes) fits the same interface.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from types import TracebackType

from engine.config import IN_PROCESS_LOCK_PROVIDER, WriteConfig
from engine.errors import LockTimeoutError, WriteConflictError
from engine.storage import Storage
from engine.timeline.active import HOODIE

LOCK_FILE = f"{HOODIE}/lock"
WAIT_NOTICE_SECONDS = 2.0
"""A writer waiting this long for the lock logs whom it waits for."""

log = logging.getLogger(__name__)


class TableLock:
    """A re-entrant table lock (re-entrant within the object that holds it)."""

    def __init__(self, storage: Storage, wait_seconds: float) -> None:
        self.storage = storage
        self.wait_seconds = wait_seconds
        self._depth = 0
        self._guard = threading.RLock()

    # -- the interface ----------------------------------------------------------------------

    def _acquire(self, deadline: float) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        raise NotImplementedError

    def verify(self) -> None:
        """Raise :class:`WriteConflictError` if this object no longer holds the lock."""

    # -- re-entrancy and the context manager ------------------------------------------------

    def acquire(self) -> None:
        """Take the lock, waiting up to ``wait_seconds``; :class:`LockTimeoutError` else."""
        self._guard.acquire()
        try:
            if self._depth == 0:
                self._acquire(time.monotonic() + self.wait_seconds)
            self._depth += 1
        except BaseException:
            self._guard.release()
            raise

    def release(self) -> None:
        """Give the lock back (the outermost release frees it)."""
        try:
            self._depth -= 1
            if self._depth == 0:
                self._release()
        finally:
            self._guard.release()

    def __enter__(self) -> TableLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _pause(attempt: int) -> None:
    time.sleep(min(0.2, 0.005 * (2 ** min(attempt, 6))) * (0.5 + random.random()))


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _process_state(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of process ``pid`` from
    ``/proc/<pid>/stat`` (fields 3 and 22); None when it cannot be read."""
    stat = _read_text(f"/proc/{pid}/stat")
    fields = stat[stat.rfind(")") + 2:].split() if ")" in stat else []
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _where() -> dict[str, str]:
    """This machine's boot and this process's pid namespace (empty off Linux)."""
    return {"boot_id": _read_text("/proc/sys/kernel/random/boot_id"),
            "pid_ns": _pid_namespace()}


def _this_process() -> dict[str, object]:
    """What identifies this process for :func:`_holder_gone` (empty values off Linux)."""
    state = _process_state(os.getpid())
    return {**_where(), "started": state[1] if state else ""}


def _holder_gone(info: dict[str, object]) -> bool:
    """True only when the process that took the lock provably ended: it ran on this boot of
    this machine, in this pid namespace, and its pid is free, a zombie, or now a process
    started later. Anything unknown (another machine or container, no ``/proc``, another
    user's process whose start time cannot be read) counts as alive."""
    here = _where()
    pid, started = info.get("pid"), info.get("started")
    if not (here["boot_id"] and here["pid_ns"] and isinstance(pid, int) and pid > 0
            and started and all(info.get(k) == v for k, v in here.items())):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # exists, another user's
    except OSError:
        return False
    state = _process_state(pid)
    return state is not None and (state[0] in ("Z", "X") or state[1] != started)


class FileSystemLock(TableLock):
    """``.hoodie/lock``, created exclusively, renewed while held, broken when stale."""

    def __init__(self, storage: Storage, wait_seconds: float, expire_seconds: float) -> None:
        super().__init__(storage, wait_seconds)
        self.expire_seconds = expire_seconds
        self._token = ""
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _owner_record(self) -> bytes:
        return json.dumps({
            "owner": self._token, "host": socket.gethostname(), "pid": os.getpid(),
            "thread": threading.current_thread().name,
            "acquired_at_ms": int(time.time() * 1000), **_this_process(),
        }).encode()

    def _acquire(self, deadline: float) -> None:
        self.storage.makedirs(HOODIE)
        self._token = uuid.uuid4().hex
        record = self._owner_record()
        attempt = 0
        notice_at = time.monotonic() + WAIT_NOTICE_SECONDS
        while True:
            try:
                self.storage.write_new(LOCK_FILE, record)
                break
            except FileExistsError:
                pass
            if self._break_if_stale():
                continue
            if notice_at and time.monotonic() >= notice_at:
                notice_at = 0.0
                expiry = (f"broken if not renewed for {self.expire_seconds:g} s"
                          if self.expire_seconds > 0 else "never expires")
                log.warning("waiting for the table lock %s, held by %s (%s; giving up after "
                            "%g s)", self.storage.full(LOCK_FILE), self._holder(), expiry,
                            self.wait_seconds)
            if time.monotonic() >= deadline:
                raise LockTimeoutError(
                    f"the table lock {self.storage.full(LOCK_FILE)} was not free within "
                    f"{self.wait_seconds:g} s (held by {self._holder()}); raise "
                    "hoodie.write.lock.wait_time_ms or check for a stuck writer")
            attempt += 1
            _pause(attempt)
        if self.expire_seconds > 0:
            self._stop.clear()
            self._renewer = threading.Thread(target=self._renew, daemon=True,
                                             name="tidelake-lock-renewer")
            self._renewer.start()

    def _holder(self) -> str:
        try:
            info = _owner_of(self.storage.read(LOCK_FILE))
        except FileNotFoundError:
            return "nobody now"
        return f"{info.get('host')} pid {info.get('pid')}" if info else "an unreadable record"

    def _renew(self) -> None:
        path = self.storage.full(LOCK_FILE)
        while not self._stop.wait(self.expire_seconds / 4):
            try:
                os.utime(path)
            except FileNotFoundError:
                return  # lost; verify() reports it before any commit point

    def _break_if_stale(self) -> bool:
        """Break the lock if its holder stopped renewing it or provably ended; True if it
        was broken (or released meanwhile)."""
        path = self.storage.full(LOCK_FILE)
        try:
            seen = os.stat(path)
            with open(path, "rb") as fh:
                content = fh.read()
        except FileNotFoundError:
            return True  # released meanwhile: try again at once
        expired = 0 < self.expire_seconds < time.time() - seen.st_mtime
        if not expired and not _holder_gone(_owner_of(content)):
            return False
        # Move it aside under a unique name (atomic), then make sure what was moved is the
        # stale lock observed, not a fresh one taken in between; put a fresh one back.
        aside = f"{path}.stale.{uuid.uuid4().hex}"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return True
        with open(aside, "rb") as fh:
            moved = fh.read()
        if moved == content and os.stat(aside).st_mtime == seen.st_mtime:
            os.unlink(aside)
            return True
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)  # if this fails its holder lost it: verify() says so
        os.unlink(aside)
        return False

    def _release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
            self._renewer = None
        if self._owns():
            self.storage.delete(LOCK_FILE)

    def _owns(self) -> bool:
        try:
            info = _owner_of(self.storage.read(LOCK_FILE))
        except FileNotFoundError:
            return False
        return bool(info.get("owner") == self._token)

    def verify(self) -> None:
        if not self._owns():
            raise WriteConflictError(
                f"the table lock {self.storage.full(LOCK_FILE)} was broken by another writer "
                "(it looked stale); nothing was committed")


def _owner_of(content: bytes) -> dict[str, object]:
    """The owner record of a lock file ({} for one that is not a JSON object)."""
    try:
        info = json.loads(content)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


_IN_PROCESS: dict[str, threading.Lock] = {}
_IN_PROCESS_GUARD = threading.Lock()


class InProcessLock(TableLock):
    """A lock per table path shared by the threads of this Python process."""

    def _lock(self) -> threading.Lock:
        with _IN_PROCESS_GUARD:
            return _IN_PROCESS.setdefault(self.storage.base_path, threading.Lock())

    def _acquire(self, deadline: float) -> None:
        if not self._lock().acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise LockTimeoutError(
                f"the in-process lock of {self.storage.base_path} was not free within "
                f"{self.wait_seconds:g} s")

    def _release(self) -> None:
        self._lock().release()


def table_lock(storage: Storage, write_config: WriteConfig) -> TableLock:
    """The lock ``hoodie.write.lock.provider`` names, for the table at ``storage``."""
    wait = write_config.lock_wait_ms / 1000.0
    if write_config.lock_provider == IN_PROCESS_LOCK_PROVIDER:
        return InProcessLock(storage, wait)
    return FileSystemLock(storage, wait, write_config.lock_expire_minutes * 60.0)
