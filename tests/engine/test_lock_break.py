"""Breaking a stale table lock while other writers race for it.

Three writers find one stale lock (its holder provably ended). The interleaving is forced by
hooks that exist only here: writer C, having judged the stale lock breakable, is held until
writer B has broken it and taken a fresh lock of its own; whatever C then does to the lock
file, a fourth writer D tries the lock right after C moved or removed it. The property: while
B holds the lock (and keeps renewing it), nobody else gets it and B's ``verify()`` passes.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.errors import LockTimeoutError, WriteConflictError
from engine.storage import Storage
from engine.timeline import lock as lock_module
from engine.timeline.lock import LOCK_FILE, FileSystemLock

EXPIRE = 0.4
"""Lock expiry of the racing writers (renewed every 0.1 s)."""


def _ended_record(owner: str) -> bytes:
    """A lock record of a process that provably ended (this boot and pid namespace, its pid
    free again)."""
    with subprocess.Popen(["true"]) as gone:
        pass
    return json.dumps({
        "owner": owner, "host": "h", "pid": gone.pid, "started": "1",
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "pid_ns": os.readlink("/proc/self/ns/pid")}).encode()


def _forge_ended_holder(path: Path) -> None:
    """A lock left by a process that provably ended, dated in the future so that only the
    holder's end, never the expiry, makes it stale."""
    (path / ".hoodie").mkdir(exist_ok=True)
    lock = path / LOCK_FILE
    lock.write_bytes(_ended_record("dead"))
    future = time.time() + 3600
    os.utime(lock, (future, future))


class _Race:
    """Runs B and C against a stale lock with C held between judging it stale and acting."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 in_window: Callable[[], None]) -> None:
        self.storage = Storage(str(tmp_path))
        self.lock_path = self.storage.full(LOCK_FILE)
        self.in_window = in_window
        self.c_judged = threading.Event()
        self.b_holds = threading.Event()
        self.b_done = threading.Event()
        self.window_opened = False
        self.outcomes: dict[str, object] = {}
        real_gone = lock_module._holder_gone
        real_rename, real_unlink = os.rename, os.unlink

        def holder_gone(info: dict[str, object]) -> bool:
            gone = real_gone(info)
            if threading.current_thread().name == "C" and not self.c_judged.is_set():
                self.c_judged.set()  # C judged the stale lock; it acts once B holds a fresh one
                assert self.b_holds.wait(10)
            return gone

        def window_after(real: Callable[..., Any]) -> Callable[..., Any]:
            def op(src: Any, *rest: Any, **kw: Any) -> Any:
                result = real(src, *rest, **kw)
                if (threading.current_thread().name == "C" and not self.window_opened
                        and os.fspath(src) == self.lock_path):
                    self.window_opened = True  # C took the lock file away: D tries now
                    self.in_window()
                return result
            return op

        monkeypatch.setattr(lock_module, "_holder_gone", holder_gone)
        monkeypatch.setattr(os, "rename", window_after(real_rename))
        monkeypatch.setattr(os, "unlink", window_after(real_unlink))

    def b(self) -> None:
        assert self.c_judged.wait(10)
        lock = FileSystemLock(self.storage, wait_seconds=5, expire_seconds=EXPIRE)
        with lock:
            self.b_holds.set()
            assert self.b_done.wait(20)
            try:
                lock.verify()
                self.outcomes["B"] = "holds"
            except WriteConflictError as exc:
                self.outcomes["B"] = f"lost: {exc}"

    def c(self) -> None:
        lock = FileSystemLock(self.storage, wait_seconds=1, expire_seconds=EXPIRE)
        try:
            lock.acquire()
            self.outcomes["C"] = "acquired"  # kept: a second holder
        except LockTimeoutError:
            self.outcomes["C"] = "timed out"

    def run(self, after_c: Callable[[], None]) -> None:
        threads = [threading.Thread(target=self.b, name="B"),
                   threading.Thread(target=self.c, name="C")]
        for t in threads:
            t.start()
        threads[1].join(30)
        try:
            after_c()
        finally:
            self.b_done.set()
            threads[0].join(30)


def _try_lock(storage: Storage, wait_seconds: float, outcomes: dict[str, object],
              name: str) -> None:
    """Another writer tries the lock (in its own thread); a writer that gets it keeps it."""
    def attempt() -> None:
        try:
            FileSystemLock(storage, wait_seconds=wait_seconds, expire_seconds=EXPIRE).acquire()
            outcomes[name] = "acquired"
        except LockTimeoutError:
            outcomes[name] = "timed out"
    thread = threading.Thread(target=attempt, name=name)
    thread.start()
    thread.join(30)


def test_lock_break_racing_a_fresh_holder_fourth_writer_never_gets_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _forge_ended_holder(tmp_path)
    race: _Race

    def fourth_writer() -> None:
        _try_lock(race.storage, 0.3, race.outcomes, "D")

    race = _Race(tmp_path, monkeypatch, fourth_writer)
    race.run(after_c=lambda: fourth_writer() if "D" not in race.outcomes else None)
    assert race.outcomes == {"B": "holds", "C": "timed out", "D": "timed out"}
    assert list((tmp_path / ".hoodie").iterdir()) == []  # no lock or claim left behind


def test_lock_break_racing_a_fresh_holder_renewal_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _forge_ended_holder(tmp_path)
    race = _Race(tmp_path, monkeypatch, lambda: time.sleep(3 * EXPIRE / 4))
    # C gave up after 1 s; D waits three expiries: a lock still renewed is never broken.
    race.run(after_c=lambda: _try_lock(race.storage, 3 * EXPIRE, race.outcomes, "D"))
    assert race.outcomes == {"B": "holds", "C": "timed out", "D": "timed out"}
    assert list((tmp_path / ".hoodie").iterdir()) == []  # no lock or claim left behind


def test_lock_threads_breaking_abandoned_locks_one_holder_at_a_time(tmp_path: Path) -> None:
    """Seeded stress: threads take the lock in turn and now and then abandon it (stop renewing,
    never release, as a process that was killed); the others break it after the expiry. At no
    time do two live holders overlap, and no lock or claim file is left behind."""
    storage = Storage(str(tmp_path))
    rng = random.Random(22)
    plan = [[rng.random() < 0.25 for _ in range(7)] + [False] for _ in range(4)]
    inside: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    guard = threading.Lock()

    def work(i: int) -> None:
        for round_, abandon in enumerate(plan[i]):
            lock = FileSystemLock(storage, wait_seconds=30, expire_seconds=0.2)
            lock.acquire()
            me = f"{i}.{round_}"
            with guard:
                inside.append(me)
                if len(inside) > 1:
                    overlaps.append(tuple(inside))
            time.sleep(0.003)
            with guard:
                inside.remove(me)
            if abandon:
                lock._stop.set()  # killed while holding it: never renewed, never released
            else:
                lock.release()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert overlaps == []
    assert list((tmp_path / ".hoodie").iterdir()) == []


def test_lock_break_claim_left_by_an_ended_breaker_taken_over(tmp_path: Path) -> None:
    """A breaker killed between claiming a stale lock's end and removing it leaves its claim;
    the next writer takes that claim over instead of waiting for ever."""
    _forge_ended_holder(tmp_path)
    generation = lock_module._generation((tmp_path / LOCK_FILE).read_bytes())
    (tmp_path / f"{LOCK_FILE}.end.{generation}").write_bytes(_ended_record("breaker"))
    storage = Storage(str(tmp_path))
    with FileSystemLock(storage, wait_seconds=2, expire_seconds=60) as lock:
        lock.verify()
    assert list((tmp_path / ".hoodie").iterdir()) == []


def test_lock_holder_whose_lock_was_broken_knows_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A holder judged stale (here: by a writer with a far shorter expiry, as a holder paused
    past the expiry is judged) loses the lock: its renewer says so and stops, verify() fails."""
    storage = Storage(str(tmp_path))
    holder = FileSystemLock(storage, wait_seconds=1, expire_seconds=EXPIRE)
    with caplog.at_level("WARNING", logger="engine.timeline.lock"):
        holder.acquire()
        with FileSystemLock(storage, wait_seconds=5, expire_seconds=0.05) as breaker:
            deadline = time.monotonic() + 10
            while not holder._lost.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)
            breaker.verify()
            with pytest.raises(WriteConflictError, match="broken by another writer"):
                holder.verify()
        holder.release()  # not its lock any more: removes nothing
    # "now held by another writer", or "gone" where the renewer looked between the breaker's
    # removal of the stale file and its own claim (seen on a loaded machine, CI-size run)
    assert any(("now held by another writer" in r.getMessage() or " is gone: " in r.getMessage())
               and "broken as stale while this writer held it" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert list((tmp_path / ".hoodie").iterdir()) == []


def test_lock_hold_recorder_reports_outermost_holds_and_timed_out_waits(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path))
    holds: list[lock_module.LockHold] = []
    lock_module.record_holds(holds.append)
    try:
        lock = FileSystemLock(storage, wait_seconds=1, expire_seconds=60)
        with lock, lock, pytest.raises(LockTimeoutError):  # re-entered: still one hold
            FileSystemLock(storage, wait_seconds=0.1, expire_seconds=60).acquire()
    finally:
        lock_module.record_holds(None)
    assert [h.timed_out for h in holds] == [True, False]
    assert all(h.table == storage.base_path for h in holds)
    here = "test_lock_hold_recorder_reports_outermost_holds_and_timed_out_waits"
    assert all(h.callers[0][:2] == (__name__, here) for h in holds)
    assert holds[0].waited >= 0.1 and holds[1].held >= holds[0].waited
