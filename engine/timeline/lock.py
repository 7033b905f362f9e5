"""The table lock: mutual exclusion for the short critical sections of a commit.

Writers of one table hold it only briefly: to take an instant time and start an instant
(rolling back failed writes first), and to check conflicts and complete an instant (see
:mod:`engine.write.write_client`). ``hoodie.write.lock.provider`` picks the implementation:

* :class:`FileSystemLock` (Hudi's ``FileSystemBasedLockProvider``, the default): the lock
  is the file ``.hoodie/lock``, created with an exclusive link, so exactly one writer on
  the same local or shared file system holds it. The file records its owner (a random
  token, host, pid, thread, time). The holder renews the file's modification time every
  quarter of ``hoodie.write.lock.filesystem.expire`` from a daemon thread, as long as the
  file is still its own (when it is not, the renewer says so and stops, and ``verify``
  fails); a lock not renewed for the whole expiry belongs to a dead holder and is broken.
  Only one writer may remove a given lock file: the one that created its end claim
  (``.hoodie/lock.end.<digest of the file>``, exclusively), which then removes the file
  only if it is still that very file (and still stale); a holder releases its lock the same
  way. So two writers breaking one stale lock never remove the fresh lock one of them took,
  and a holder's lock is never removed unless it stopped renewing it.
  A lock whose holder provably ended is broken the same way without waiting for the
  expiry: the record names the machine's boot, the process's pid namespace and start time,
  and when those are this machine's and this namespace's and the process no longer exists
  (or the pid now belongs to a later process), the holder was killed (a writer killed
  while starting or committing an instant; its restart takes the lock at once). Holders on
  other machines or in other containers wait for the expiry. A writer that waits more
  than two seconds says whom it waits for.
  A holder re-checks that the lock is still its own right before its commit point
  (:meth:`TableLock.verify`). A release the store fails is tried again a few times, then
  given up with an error logged, never raised (the guarded work is done); the lock, no
  longer renewed, is broken once it expired.
* :class:`InProcessLock` (Hudi's ``InProcessLockProvider``): a lock per table path inside
  one Python process, for writers that are threads of one process.

On an object store the same protocol runs on the same :class:`~engine.storage.Storage`
calls: the lock file and its end claims are created with a conditional put
(``If-None-Match: *``), renewed by a put conditional on the ETag just read (``If-Match``),
so a renewal never overwrites a successor; staleness is judged by ``Last-Modified``. A
lock that never expires (``hoodie.write.lock.filesystem.expire=0``) is refused there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from engine.config import IN_PROCESS_LOCK_PROVIDER, WRITE_KEYS, WriteConfig
from engine.errors import InvalidOptionError, LockTimeoutError, WriteConflictError
from engine.storage import Storage
from engine.timeline.active import HOODIE
from engine.timeline.liveness import process_ended as _holder_gone
from engine.timeline.liveness import this_process as _this_process

LOCK_FILE = f"{HOODIE}/lock"
LOCK_EXPIRE_KEY = next(s.key for s in WRITE_KEYS if s.attr == "lock_expire_minutes")
WAIT_NOTICE_SECONDS = 2.0
"""A writer waiting this long for the lock logs whom it waits for."""
RELEASE_ATTEMPTS = 4
"""How often a holder tries to release its lock when the store fails it (0.1, 0.2, 0.4 s
apart) before it gives up and leaves the lock to expire."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LockHold:
    """One outermost hold of a table lock (or a wait that timed out), for a recorder
    installed with :func:`record_holds`."""

    table: str
    """Base path of the table."""
    waited: float
    """Seconds from ``acquire()`` until the lock was held (or the wait gave up)."""
    held: float
    """Seconds from then until the outermost release (0 for a timed-out wait)."""
    timed_out: bool
    callers: tuple[tuple[str, str, int, int], ...]
    """Who took it, innermost first, outside this module: (module, function qualname, line,
    the function's first line)."""


HoldRecorder = Callable[[LockHold], None]
_recorder: HoldRecorder | None = None
_CALLER_DEPTH = 6


def record_holds(recorder: HoldRecorder | None) -> None:
    """Install (or with None remove) a process-wide recorder of table lock holds, for
    benchmarks: called once per outermost release, from the releasing thread. Unused, it
    costs one check per outermost acquire and release."""
    global _recorder
    _recorder = recorder


def _callers() -> tuple[tuple[str, str, int, int], ...]:
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back  # type: ignore[assignment]
    found: list[tuple[str, str, int, int]] = []
    while frame is not None and len(found) < _CALLER_DEPTH:
        code = frame.f_code
        found.append((str(frame.f_globals.get("__name__")), code.co_qualname, frame.f_lineno,
                      code.co_firstlineno))
        frame = frame.f_back  # type: ignore[assignment]
    return tuple(found)


class TableLock:
    """A re-entrant table lock (re-entrant within the object that holds it)."""

    def __init__(self, storage: Storage, wait_seconds: float) -> None:
        self.storage = storage
        self.wait_seconds = wait_seconds
        self._depth = 0
        self._guard = threading.RLock()
        self._hold: tuple[float, float, tuple[tuple[str, str, int, int], ...]] | None = None

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
                started = time.monotonic()
                try:
                    self._acquire(started + self.wait_seconds)
                except LockTimeoutError:
                    if _recorder is not None:
                        _recorder(LockHold(self.storage.base_path, time.monotonic() - started,
                                           0.0, True, _callers()))
                    raise
                if _recorder is not None:
                    self._hold = (started, time.monotonic(), _callers())
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
                hold, self._hold = self._hold, None
                if hold is not None and _recorder is not None:
                    _recorder(LockHold(self.storage.base_path, hold[1] - hold[0],
                                       time.monotonic() - hold[1], False, hold[2]))
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


class FileSystemLock(TableLock):
    """``.hoodie/lock``, created exclusively, renewed while held, broken when stale.

    Every lock file is one *generation* (its content, unique to one acquisition). Only the
    writer that holds a generation's end claim (``.hoodie/lock.end.<generation>``, created
    exclusively) may remove that generation's file: a breaker that judged it stale, or its
    holder releasing it. The claimant re-reads the lock file after claiming and removes it
    only if it is still that generation (and, for a breaker, still stale); since nobody else
    can remove that generation meanwhile, the file removed is the one checked, never a fresh
    lock another writer took in between. Claims live for a few milliseconds; a claim whose
    writer provably ended, or older than the expiry, is taken over by a claim named after it.
    """

    def __init__(self, storage: Storage, wait_seconds: float, expire_seconds: float) -> None:
        super().__init__(storage, wait_seconds)
        self.expire_seconds = expire_seconds
        self._token = ""
        self._generation = ""
        self._lost = threading.Event()
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
        self._generation = _generation(record)
        self._lost.clear()
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
        """Touch the lock file every quarter of the expiry while it is this holder's; stop
        only when it is not (then :meth:`verify` fails). Other errors are retried."""
        path = self.storage.full(LOCK_FILE)
        while not self._stop.wait(self.expire_seconds / 4):
            try:
                if self.storage.touch_if(
                        LOCK_FILE, lambda content: _generation(content) == self._generation):
                    continue
                taken = "now held by another writer"
            except FileNotFoundError:
                taken = "gone"
            except OSError as exc:
                log.warning("could not renew the table lock %s (%s); trying again", path, exc)
                continue
            self._lost.set()
            log.warning("the table lock %s is %s: it was broken as stale while this writer "
                        "held it; its next commit point fails", path, taken)
            return

    def _read(self, rel: str) -> tuple[bytes, float] | None:
        """Content and modification time of one file, both of the same file; None if gone."""
        return self.storage.read_with_mtime(rel)

    def _stale(self, content: bytes, mtime: float) -> bool:
        """Not renewed for the whole expiry, or written by a process that provably ended."""
        expired = 0 < self.expire_seconds < time.time() - mtime
        return expired or _holder_gone(_owner_of(content))

    def _claim_end(self, generation: str) -> list[str] | None:
        """Claim the sole right to remove the lock file of ``generation``: the claim files to
        drop afterwards (the taken-over stale ones, then this writer's own), or None when
        another writer holds the claim now."""
        name = f"{LOCK_FILE}.end.{generation}"
        taken_over: list[str] = []
        for _ in range(8):
            try:
                self.storage.write_new(name, self._owner_record(), fsync=False)
                return [*taken_over, name]
            except FileExistsError:
                pass
            seen = self._read(name)
            if seen is None:
                continue  # dropped meanwhile: claim it again
            if _owner_of(seen[0]).get("owner") == self._token:
                return [*taken_over, name]  # this writer's own, left by a failed release
            if not self._stale(*seen):
                return None
            taken_over.append(name)  # its writer ended inside its few milliseconds
            name = f"{name}.{_generation(seen[0])[:12]}"
        return None

    def _drop_claim(self, claim: list[str]) -> None:
        for name in claim:
            self.storage.delete(name)

    def _break_if_stale(self) -> bool:
        """Break the lock if its holder stopped renewing it or provably ended; True if it
        was broken (or released meanwhile)."""
        seen = self._read(LOCK_FILE)
        if seen is None:
            return True  # released meanwhile: try again at once
        if not self._stale(*seen):
            return False
        generation = _generation(seen[0])
        claim = self._claim_end(generation)
        if claim is None:
            return False  # another writer is ending it right now
        try:
            now = self._read(LOCK_FILE)
            if now is None or _generation(now[0]) != generation:
                return True  # ended meanwhile; the file there now is another's, untouched
            if not self._stale(*now):
                return False  # renewed meanwhile
            self.storage.delete(LOCK_FILE)  # still that generation: nobody else removes it
            return True
        finally:
            self._drop_claim(claim)

    def _release(self) -> None:
        """End this holder's lock file. A store that fails the release (an error answer, no
        answer) is asked again, :data:`RELEASE_ATTEMPTS` times in all; then the holder gives
        up with an error in the log and without raising — the work the lock guarded is done
        and must not be reported failed. The lock is not renewed any more, so it is broken
        as stale once the expiry has passed (never with expiry 0: refused on object stores,
        :func:`table_lock`). Hudi's storage-based lock likewise must not keep a lock whose
        release failed (RFC-91: the lock file's validity bounds it)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
            self._renewer = None
        failure: OSError | None = None
        for attempt in range(RELEASE_ATTEMPTS):
            if attempt:
                time.sleep(0.1 * 2 ** (attempt - 1))
            try:
                self._end_own()
                return
            except OSError as exc:  # StorageError included; a missing file is no error here
                failure = exc
                if attempt + 1 < RELEASE_ATTEMPTS:
                    log.warning("releasing the table lock %s failed (%s); trying again",
                                self.storage.full(LOCK_FILE), exc)
        after = (f"another writer breaks it once it is {self.expire_seconds:g} s old "
                 "(hoodie.write.lock.filesystem.expire)" if self.expire_seconds > 0 else
                 "it is broken when this process has ended (by a writer on this machine; "
                 "elsewhere, remove it by hand)")
        log.error("could not release the table lock %s after %d attempts (%s); it is no "
                  "longer renewed: %s", self.storage.full(LOCK_FILE), RELEASE_ATTEMPTS,
                  failure, after)

    def _end_own(self) -> None:
        """Remove this holder's lock file if it is still this generation (under its end
        claim, as a breaker would)."""
        claim = self._claim_end(self._generation)
        if claim is None:
            return  # another writer is breaking it: not ours any more
        try:
            if self._owns():
                self.storage.delete(LOCK_FILE)
        finally:
            self._drop_claim(claim)

    def _owns(self) -> bool:
        seen = self._read(LOCK_FILE)
        return seen is not None and _generation(seen[0]) == self._generation

    def verify(self) -> None:
        if self._lost.is_set() or not self._owns():
            raise WriteConflictError(
                f"the table lock {self.storage.full(LOCK_FILE)} was broken by another writer "
                "(it looked stale); nothing was committed")


def _generation(content: bytes) -> str:
    """The name of one lock file's life: a digest of its record (unique: token, time)."""
    return hashlib.sha256(content).hexdigest()[:32]


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
    expire = write_config.lock_expire_minutes * 60.0
    if expire == 0 and not storage.is_local:
        # Writers of an object store share no machine to tell a dead holder by; Hudi's
        # storage-based lock has no lock without validity either (StorageBasedLockConfig).
        raise InvalidOptionError(
            LOCK_EXPIRE_KEY, f"0 (the lock never expires) is refused on an object store "
            f"({storage.base_path}): a writer that crashed or failed to release the lock "
            "would keep it from every other writer for good; use a number of minutes")
    return FileSystemLock(storage, wait, expire)
