"""Who may delete which file, and when; which instant a reader may treat as committed.

Each test races two or three writers or service attempts (threads in this process, or a
killed child process) through the interleaving a stalled process meets in a long-lived
table — a GC pause, slow storage, a paused container — long enough for another writer to
judge it dead. The oracle is what each actor was told (committed or refused), never the
table; hudi-rs reads every end state too.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table, WriteConflictError
from engine.errors import TidelakeError
from engine.layout.file_group import list_table_files
from engine.services.base import local_runner
from engine.storage import Storage
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import read_avro_ocf
from engine.timeline.heartbeat import Heartbeat, heartbeat_path
from engine.write.write_client import UPSERT, WriteClient
from tests.helpers import hudi_rs_read, rows_by_key

ROOT = Path(__file__).resolve().parents[2]
FAST = {"hoodie.client.heartbeat.interval_in_ms": "200",
        "hoodie.client.heartbeat.tolerable.misses": "3"}


def _batch(keys: Sequence[str], v: int, ts: int = 1) -> pa.Table:
    return pa.table({"key": list(keys), "ts": [ts] * len(keys),
                     "part": [f"p{int(k[1:]) % 3}" if k[1:].isdigit() else "p0" for k in keys],
                     "v": [v] * len(keys)})


def _client(table: Table, **options: str) -> WriteClient:
    opened = Table.open(table.path, {**FAST, **options})
    return WriteClient(opened.storage, opened.config, opened.write_config)


def _stall_heartbeat(client: WriteClient, instant_time: str) -> None:
    """The writer stalls: its heartbeat stops and its file ages past the expiry."""
    client._heartbeats[instant_time].stop(delete=False)
    _age_heartbeat(client.storage, instant_time)


def _age_heartbeat(storage: Storage, instant_time: str) -> None:
    old = time.time() - 600
    path = storage.full(heartbeat_path(instant_time))
    if os.path.exists(path):
        os.utime(path, (old, old))


def _orphans(table: Table) -> list[str]:
    """Data files named with an instant neither on the active timeline nor archived."""
    timeline = Timeline.load(table.storage, table.config)
    known = set(timeline.active_times) | {r.requested_time for r in timeline.archived()}
    files = list_table_files(table.storage)
    found = [(f.instant_time, f.path) for f in files.base_files]
    found += [(f.instant_time, f.path) for f in files.log_files]
    return sorted(path for instant_time, path in found if instant_time not in known)


def _check(table: Table, expected: dict[str, int]) -> None:
    ours = rows_by_key(Table.open(table.path).read(), "key", "v", once=True)
    assert ours == expected
    assert rows_by_key(hudi_rs_read(table.path), "key", "v", once=True) == expected
    assert _orphans(table) == []


# -- item 1: files of a rolled-back write ---------------------------------------------------


def test_refused_writer_files_removed_never_read_after_archival(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="own", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by=["part"],
                         options={"hoodie.index.type": "SIMPLE", "hoodie.keep.min.commits": "2",
                                  "hoodie.keep.max.commits": "3",
                                  "hoodie.cleaner.commits.retained": "1"})
    table.upsert(_batch(["k0", "k1"], 1))
    stalled = _client(table)
    timeline, inflight = stalled.begin()
    _stall_heartbeat(stalled, inflight.requested_time)
    other = _client(table)
    other.write(UPSERT, *other.prepare(_batch(["k2"], 2), timeline, dedupe=True))  # rolls back
    # the stalled writer wakes up and writes its files after its instant was rolled back
    records, deletes = stalled.prepare(_batch(["z"], 9), timeline, dedupe=True)
    plan = stalled.plan(timeline, inflight, UPSERT, records, deletes)
    with pytest.raises(WriteConflictError):
        stalled.commit(timeline, plan, stalled.execute_local(plan))
    stalled.abort(inflight)  # as WriteClient.write does on any failure
    assert not [p for p in _orphans(table) if inflight.requested_time in p]
    expected = {"k0": 1, "k1": 1, "k2": 2}
    for i in range(6):
        table.upsert(_batch([f"k{3 + i}"], 3 + i))
        expected[f"k{3 + i}"] = 3 + i
    assert table.archive().completed or Table.open(table.path).archive() is not None
    _check(table, expected)


def test_late_task_output_after_rollback_removed_by_its_task(tmp_path: Path) -> None:
    """A task still running when its instant was rolled back (a Spark task the abort did
    not stop) publishes its file after the rollback listed the instant's files: the task
    itself deletes it, so nothing of the rolled-back instant survives."""
    from engine.write.write_handle import execute
    table = Table.create(str(tmp_path / "t"), name="own", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by=["part"],
                         options={"hoodie.index.type": "BUCKET",
                                  "hoodie.bucket.index.num.buckets": "2"})
    table.upsert(_batch(["k0"], 1))
    writer = _client(table)
    timeline, inflight = writer.begin()
    records, deletes = writer.prepare(_batch(["k1", "k2"], 2), timeline, dedupe=True)
    plan = writer.plan(timeline, inflight, UPSERT, records, deletes)
    writer.abort(inflight)  # the driver gave up (a failed Spark job) ...
    for task in plan.tasks:  # ... while its tasks still ran
        with pytest.raises(WriteConflictError, match="rolled back"):
            execute(plan.context, task)
    _check(table, {"k0": 1})


def test_cleaner_removes_files_of_instants_neither_active_nor_archived(
        tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="own", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by=["part"],
                         options={"hoodie.index.type": "SIMPLE",
                                  "hoodie.cleaner.commits.retained": "1"})
    for i in range(3):
        table.upsert(_batch([f"k{i}"], i))
    # a file of an instant no timeline knows (a writer that died between a rollback's
    # listing and its own publish, on an older version of tidelake)
    first = min(e.instant_time for e in table.timeline())
    stray_instant = str(int(first) + 1)  # inside the range the timeline knows
    assert stray_instant not in {e.instant_time for e in table.timeline()}
    src = next(f for f in list_table_files(table.storage).base_files)
    name = src.name.replace(src.instant_time, stray_instant).replace(
        src.file_id, "00000000-0000-0000-0000-000000000000-0")
    os.link(table.storage.full(src.path), table.storage.full(f"{src.partition_path}/{name}"))
    assert _orphans(table)
    writer = _client(table)  # a write that fails leaves a rollback instant behind
    _, inflight = writer.begin()
    writer.abort(inflight)
    table.upsert(_batch(["k9"], 9))  # cleans after the write: a rollback since the last clean
    _check(table, {"k0": 0, "k1": 1, "k2": 2, "k9": 9})


# -- item 2: two runs of one clustering plan --------------------------------------------------


class _Gate:
    """A task runner that runs the tasks, then blocks until released (a stalled driver)."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        out = local_runner(fn, tasks)
        self.reached.set()
        assert self.release.wait(30)
        return out


def _run(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []

    def body() -> None:
        try:
            result.append(target())
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, result


def _stall_service(storage: Storage, instant_time: str) -> None:
    """Stop every heartbeat thread of this instant (the stalled attempt's) and age it."""
    for thread in threading.enumerate():
        if thread.name == f"tidelake-heartbeat-{instant_time}":
            beat = getattr(getattr(thread, "_target", None), "__self__", None)
            if isinstance(beat, Heartbeat):
                beat.stop(delete=False)
    _age_heartbeat(storage, instant_time)


def _stale_and_takeover(table: Table, scheduled: str,
                        execute: Callable[[Table, _Gate], Any]) -> tuple[Any, Any]:
    """Two attempts at one plan: the first stalls after its tasks wrote their files (its
    heartbeat stops and ages), the second takes the plan over and stalls there too; then
    the first wakes up and tries to commit, then the second. Returns what each returned
    or raised."""
    first, second = _Gate(), _Gate()
    # The default heartbeat (a minute, two misses): the first attempt is judged dead by its
    # stopped and aged heartbeat, not by the clock, so the second never misses its own
    # expiry however loaded the machine (with FAST's 200 ms x 3 it did, now and then, and
    # was refused: test_stale_compaction_attempt_never_deletes_takeover_files at load 7-11)
    t1, r1 = _run(lambda: execute(Table.open(table.path), first))
    assert first.reached.wait(30)
    _stall_service(table.storage, scheduled)
    t2, r2 = _run(lambda: execute(Table.open(table.path), second))
    assert second.reached.wait(30)
    first.release.set()  # the stale attempt wakes up and tries to commit
    t1.join(30)
    second.release.set()
    t2.join(30)
    return r1[0], r2[0]


def _small_groups_table(tmp_path: Path) -> tuple[Table, dict[str, int]]:
    table = Table.create(str(tmp_path / "t"), name="own", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by=["part"],
                         options={"hoodie.index.type": "SIMPLE",
                                  **FAST})
    expected: dict[str, int] = {}
    for i in range(5):  # 5 small file groups of 3 rows in one partition
        keys = [f"a{i}{j}" for j in range(3)]
        table.bulk_insert(pa.table({"key": keys, "ts": [1] * 3, "part": ["p0"] * 3,
                                    "v": [i] * 3}))
        expected.update({k: i for k in keys})
    return table, expected


def test_stale_clustering_attempt_refused_takeover_commits(tmp_path: Path) -> None:
    table, expected = _small_groups_table(tmp_path)
    scheduled = Table.open(table.path, FAST).cluster(schedule_only=True).scheduled
    assert scheduled
    r1, r2 = _stale_and_takeover(table, scheduled, lambda t, runner: t.cluster(
        instant=scheduled, runner=runner))
    assert isinstance(r1, TidelakeError), r1
    assert r2.completed == (scheduled,), r2
    _check(table, expected)
    _stats_exist(table)


# -- item 3: compaction takeover --------------------------------------------------------------


def _stats_exist(table: Table) -> None:
    """Every file a completed commit names exists (a reader trusting write stats)."""
    timeline = Timeline.load(table.storage, table.config)
    for instant in timeline.completed_data_instants:
        for stat in timeline.commit_metadata(instant).write_stats:
            assert table.storage.exists(stat.path), (instant, stat.path)


def test_stale_compaction_attempt_never_deletes_takeover_files(tmp_path: Path) -> None:
    table, expected = _bucket_mor_table(tmp_path)
    scheduled = Table.open(table.path, FAST).compact(schedule_only=True).scheduled
    assert scheduled
    r1, r2 = _stale_and_takeover(table, scheduled, lambda t, runner: t.compact(
        instant=scheduled, runner=runner))
    assert isinstance(r1, TidelakeError), r1
    assert r2.completed == (scheduled,), r2
    _stats_exist(table)
    _check(table, expected)


def _bucket_mor_table(tmp_path: Path) -> tuple[Table, dict[str, int]]:
    table = Table.create(str(tmp_path / "t"), name="own", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by=["part"],
                         options={"hoodie.index.type": "BUCKET",
                                  "hoodie.bucket.index.num.buckets": "2", **FAST})
    keys = [f"k{i}" for i in range(12)]
    table.upsert(_batch(keys, 1))
    table.upsert(_batch(keys[:6], 2, ts=2))
    return table, {k: (2 if i < 6 else 1) for i, k in enumerate(keys)}


@pytest.mark.parametrize("service", ["compaction", "clustering"])
def test_service_attempt_finishes_a_half_done_revert_before_taking_the_plan(
        tmp_path: Path, service: str) -> None:
    """Hudi's rule, for both services (``engine/services/attempt.py``): a rollback left
    half-done by a dead executor is finished before any new attempt starts. Attempt 1 stalls
    after its tasks wrote; executor 2 judges it dead and dies half-way through reverting it;
    executor 3 finishes that rollback, then runs the plan; attempt 1 commits nothing.

    Attempt 1 is judged dead by its heartbeat file, stopped and aged by ten minutes, not by
    the clock: every attempt keeps the default heartbeat (a minute, two misses), so executor
    3, which must commit, never misses its own expiry however loaded the machine (with 200 ms
    x 3 it did, now and then, and was refused)."""
    table, expected = (_bucket_mor_table(tmp_path) if service == "compaction"
                       else _small_groups_table(tmp_path))

    def run(t: Table, runner: Any = None) -> Any:
        if service == "compaction":
            return t.compact(instant=scheduled, runner=runner)
        return t.cluster(instant=scheduled, runner=runner)

    opened = Table.open(table.path)
    scheduled = (opened.compact(schedule_only=True) if service == "compaction"
                 else opened.cluster(schedule_only=True)).scheduled
    assert scheduled
    gate = _Gate()
    t1, r1 = _run(lambda: run(Table.open(table.path), gate))
    assert gate.reached.wait(30)
    _stall_service(table.storage, scheduled)
    killer = Table.open(table.path)
    real_delete = killer.storage.delete

    def dying_delete(rel: str) -> bool:
        if scheduled in rel and not rel.startswith(".hoodie"):
            raise KeyboardInterrupt("killed half-way through the revert")
        return real_delete(rel)

    killer.storage.delete = dying_delete  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        run(killer)
    timeline = Timeline.load(table.storage, table.config)
    assert [i.action.value for i in timeline.pending()] == [service, "rollback"]
    done = run(Table.open(table.path))
    assert done.completed == (scheduled,), done
    timeline = Timeline.load(table.storage, table.config)
    assert timeline.pending() == []  # the half-done rollback was finished, not left behind
    gate.release.set()  # the stalled attempt wakes up and tries to commit
    t1.join(30)
    assert isinstance(r1[0], TidelakeError), r1
    _stats_exist(table)
    _check(table, expected)


# -- item 4: a writer checks its own heartbeat --------------------------------------------------


def test_commit_refused_after_half_done_rollback_of_its_instant(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="own", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by=["part"],
                         options={"hoodie.index.type": "SIMPLE"})
    table.upsert(_batch(["k0"], 0))
    stalled = _client(table)
    timeline, inflight = stalled.begin()
    records, deletes = stalled.prepare(_batch(["x1", "y2"], 1), timeline, dedupe=True)
    plan = stalled.plan(timeline, inflight, UPSERT, records, deletes)
    stats = stalled.execute_local(plan)
    _stall_heartbeat(stalled, inflight.requested_time)
    # another writer judges it dead and starts rolling it back, but dies after deleting
    # the first of its files (a rollback deletes the target's timeline files last)
    killer = _client(table)
    real_delete = killer.storage.delete
    calls = {"n": 0}

    def dying_delete(rel: str) -> bool:
        if inflight.requested_time in rel and not rel.startswith(".hoodie"):
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt("killed half-way through the rollback")
        return real_delete(rel)

    killer.storage.delete = dying_delete  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        killer.begin()
    killer.lock.release() if killer.lock._depth else None
    # the stalled writer wakes up: its commit must be refused, not published half
    with pytest.raises(WriteConflictError):
        stalled.commit(timeline, plan, stats)
    Table.open(table.path).upsert(_batch(["k5"], 5))  # finishes the rollback
    _check(table, {"k0": 0, "k5": 5})


def test_heartbeat_that_missed_its_beat_stops_and_reports_it(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path))
    beat = Heartbeat(storage, "20260101000000000", 0.05, expiry_seconds=0.15)
    real = beat.beat
    stalls = {"n": 0}

    def slow_beat() -> None:
        stalls["n"] += 1
        if stalls["n"] == 3:
            time.sleep(0.4)  # the process stalls longer than the expiry
        real()

    beat.beat = slow_beat  # type: ignore[method-assign]
    beat.start()
    assert beat.alive
    deadline = time.monotonic() + 5
    while beat.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not beat.alive
    time.sleep(0.6)  # the beat that was under way when it missed lands, then no other
    modified = storage.modified(heartbeat_path("20260101000000000"))
    time.sleep(0.3)
    assert storage.modified(heartbeat_path("20260101000000000")) == modified  # stopped
    beat.stop()


# -- item 10: a killed writer's instant is rolled back at once ---------------------------------


_CHILD_WRITER = """
import sys, time
import pyarrow as pa
from engine import Table
from engine.write.write_client import UPSERT, WriteClient
t = Table.open(sys.argv[1])
c = WriteClient(t.storage, t.config, t.write_config)
timeline, inflight = c.begin()
if sys.argv[2] == "write":
    records, deletes = c.prepare(pa.table({"key": ["z"], "ts": [1], "part": ["p0"],
                                           "v": [9]}), timeline, dedupe=True)
    c.execute_local(c.plan(timeline, inflight, UPSERT, records, deletes))
print(inflight.requested_time, flush=True)
time.sleep(600)
"""


@contextlib.contextmanager
def _child_writer(path: str, *, write: bool) -> Iterator[str]:
    """A writer process that begins an instant (and writes its files), then waits; yields
    the instant; killed on exit."""
    with subprocess.Popen([sys.executable, "-c", _CHILD_WRITER, path,
                           "write" if write else "begin"], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE) as proc:
        try:
            assert proc.stdout is not None
            instant = proc.stdout.readline().strip()
            assert instant
            yield instant
        finally:
            proc.kill()
            proc.wait()


def _bucket_table(tmp_path: Path) -> Table:
    table = Table.create(str(tmp_path / "t"), name="own", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by=["part"],
                         options={"hoodie.index.type": "BUCKET",
                                  "hoodie.bucket.index.num.buckets": "2"})
    table.upsert(_batch(["k0"], 0))
    return table


def test_killed_writer_instant_rolled_back_at_once_by_next_writer(tmp_path: Path) -> None:
    table = _bucket_table(tmp_path)
    with _child_writer(table.path, write=True):
        pass  # killed once it wrote its files
    # default heartbeat expiry (2 minutes): only the proof that its owner ended rolls it
    # back now
    Table.open(table.path).upsert(_batch(["k1"], 1))
    pending = [e for e in Table.open(table.path).timeline() if e.state != "completed"]
    assert pending == []
    _check(table, {"k0": 0, "k1": 1})


def test_live_writer_of_another_process_not_rolled_back_before_expiry(
        tmp_path: Path) -> None:
    table = _bucket_table(tmp_path)
    with _child_writer(table.path, write=False) as alive:
        Table.open(table.path).upsert(_batch(["k1"], 1))
        pending = [e.instant_time for e in Table.open(table.path).timeline()
                   if e.state != "completed"]
        assert pending == [alive]


# -- rollback metadata names the action it reverted ---------------------------------------------


def test_revert_of_a_compaction_attempt_records_the_compaction_action(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="own", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by=["part"],
                         options={"hoodie.index.type": "BUCKET",
                                  "hoodie.bucket.index.num.buckets": "2", **FAST})
    table.upsert(_batch(["k0", "k1"], 1))
    table.upsert(_batch(["k0"], 2, ts=2))
    scheduled = Table.open(table.path, FAST).compact(schedule_only=True).scheduled
    assert scheduled

    def failing(fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        local_runner(fn, tasks)
        raise OSError("disk full")

    with pytest.raises(TidelakeError):
        Table.open(table.path, FAST).compact(instant=scheduled, runner=failing)
    timeline = Timeline.load(table.storage, table.config)
    rollbacks = [i for i in timeline.instants if i.action.value == "rollback"]
    assert rollbacks
    meta = read_avro_ocf(table.storage.read(
        f"{timeline.folder}/{rollbacks[-1].file_name(timeline.config.timeline_layout)}"))
    assert [(i["commitTime"], i["action"]) for i in meta["instantsRollback"]] == [
        (scheduled, "compaction")]
    _check(table, {"k0": 2, "k1": 1})


# -- item 8: a clustering never rewrites under the lock ------------------------------------------


def test_clustering_last_round_drops_touched_groups_instead_of_rewriting_under_lock(
        tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="own", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by=["part"],
                         options={"hoodie.index.type": "SIMPLE", **FAST})
    expected: dict[str, int] = {}
    for part in ("p0", "p1"):
        for i in range(3):  # 3 small file groups per partition
            keys = [f"{part}-{i}{j}" for j in range(3)]
            table.bulk_insert(pa.table({"key": keys, "ts": [1] * 3, "part": [part] * 3,
                                        "v": [i] * 3}))
            expected.update({k: i for k in keys})
    scheduled = Table.open(table.path, FAST).cluster(schedule_only=True).scheduled
    assert scheduled
    lock_file = table.storage.full(".hoodie/lock")
    rounds = {"n": 0}

    def busy_writer_runner(fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        assert not os.path.exists(lock_file), "a rewrite ran while the table lock was held"
        out = local_runner(fn, tasks)
        rounds["n"] += 1
        # a writer keeps updating a key of partition p0's groups during every round
        Table.open(table.path).upsert(pa.table({"key": ["p0-00"], "ts": [2], "part": ["p0"],
                                                "v": [100 + rounds["n"]]}))
        expected["p0-00"] = 100 + rounds["n"]
        return out

    run = Table.open(table.path, FAST).cluster(instant=scheduled, runner=busy_writer_runner)
    assert run.completed == (scheduled,)
    assert run.details["dropped_groups"] == 1
    groups = {(s.partition_path, s.file_id) for s in Table.open(table.path).file_slices()}
    assert len([g for g in groups if g[0] == "p0"]) == 3  # left as they were
    assert len([g for g in groups if g[0] == "p1"]) == 1  # clustered
    _check(table, expected)
    _stats_exist(table)


def test_archival_removes_files_no_instant_owns_before_passing_their_instant(
        tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="own", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by=["part"],
                         options={"hoodie.index.type": "SIMPLE", "hoodie.keep.min.commits": "2",
                                  "hoodie.keep.max.commits": "3",
                                  "hoodie.clean.automatic": "false"})
    table.upsert(_batch(["k0"], 0))
    # a file of an instant no timeline knows, inside the range it knows: archival must
    # not let the timeline's start pass it
    first = min(e.instant_time for e in table.timeline())
    stray_instant = str(int(first) + 1)
    src = list_table_files(table.storage).base_files[0]
    name = src.name.replace(src.instant_time, stray_instant).replace(
        src.file_id, "00000000-0000-0000-0000-000000000000-0")
    os.link(table.storage.full(src.path), table.storage.full(f"{src.partition_path}/{name}"))
    expected = {"k0": 0}
    for i in range(1, 6):
        table.upsert(_batch([f"k{i}"], i))
        expected[f"k{i}"] = i
    assert any(e.instant_time == first for e in table.timeline(include_archived=True)
               if e.instant_time not in {a.instant_time for a in table.timeline()})
    _check(table, expected)


def test_heartbeat_with_one_tolerable_miss_stays_alive_while_beating(tmp_path: Path) -> None:
    """Expiry equal to the interval (tolerable.misses=1): a beat that lands on time is no
    miss, though the gap between two beats always exceeds the interval a little."""
    beat = Heartbeat(Storage(str(tmp_path)), "20260101000000000", 0.5, expiry_seconds=0.5)
    beat.start()
    try:
        time.sleep(2.2)
        assert beat.alive
        beat.check()
    finally:
        beat.stop()
