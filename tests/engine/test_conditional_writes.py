"""Stores that ignore conditional writes, lost responses and failed lock releases.

Every store here is real: moto's S3 server (tests/s3.py), reached directly (an honest store
that enforces ``If-None-Match: *`` and ``If-Match``) or through the loopback proxy of
tests/s3_proxy.py, which strips those headers (a store that accepts and ignores them, as older
MinIO, Ceph RGW and some appliances do), loses the answer to a request moto acted on, or
refuses a request. The engine meets each through its real client.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from engine.errors import (
    ConditionalWriteUnsupportedError,
    InvalidOptionError,
    StorageError,
    UnsupportedStorageError,
)
from engine.storage import PROBE_FOLDER, Storage
from engine.timeline.lock import LOCK_FILE, FileSystemLock
from tests.helpers import Oracle, hudi_rs_read, sorted_rows
from tests.s3 import S3Location
from tests.s3_proxy import S3Proxy

ROOT = Path(__file__).resolve().parents[2]
OPT_OUT = "tidelake.storage.allow.unsafe.single.writer"
SCHEMA = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("v", pa.int64())])


@pytest.fixture
def proxy(s3: S3Location) -> Iterator[S3Proxy]:
    """A proxy in front of the session's moto server (honest until a test says otherwise)."""
    found = S3Proxy(s3.server.endpoint)
    yield found
    found.stop()


def _through(s3: S3Location, proxy: S3Proxy) -> dict[str, str]:
    return dict(s3.storage_options, aws_endpoint_url=proxy.endpoint)


def _rows(keys: list[str], ts: int) -> pa.Table:
    return pa.Table.from_pylist([{"key": k, "ts": ts, "v": ts} for k in keys], schema=SCHEMA)


def _probes(seen: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(m, k) for m, k in seen if f"/{PROBE_FOLDER}/" in f"/{k}"]


# -- the probe -----------------------------------------------------------------------------


def test_store_ignoring_if_none_match_refused_before_any_write_naming_the_opt_out(
        s3: S3Location, proxy: S3Proxy) -> None:
    proxy.ignore_conditions = True
    with pytest.raises(UnsupportedStorageError) as caught:
        Table.create(s3.uri(), name="t", record_key="key", precombine="ts",
                     storage_options=_through(s3, proxy))
    assert isinstance(caught.value, ConditionalWriteUnsupportedError)
    message = str(caught.value)
    assert OPT_OUT in message and "If-None-Match" in message and s3.uri() in message
    assert s3.server.objects(s3.bucket) == {}  # the probe removed itself; nothing else written


def test_probe_passes_on_honest_store_once_per_process_and_bucket(
        s3: S3Location, proxy: S3Proxy) -> None:
    options = _through(s3, proxy)
    with proxy.counting() as seen:
        table = Table.create(s3.uri("a"), name="a", record_key="key", precombine="ts",
                             storage_options=options)
        table.upsert(_rows(["k1", "k2"], 1))
        other = Table.create(s3.uri("b"), name="b", record_key="key", precombine="ts",
                             storage_options=options)
        other.upsert(_rows(["k3"], 1))
        Table.open(s3.uri("a"), storage_options=options).upsert(_rows(["k1"], 2))
    probes = _probes(seen)
    # one probe: create, create again (refused), a conditional update (refused), remove
    assert [m for m, _ in probes] == ["PUT", "PUT", "PUT", "DELETE"], probes
    assert len({k for _, k in probes}) == 1
    assert probes[0][1].startswith("a/")  # below the first table written, before its first file
    first_write = next(i for i, (m, _) in enumerate(seen) if m == "PUT")
    assert seen[first_write] == probes[0]
    assert not [k for k in s3.server.objects(s3.bucket) if f"/{PROBE_FOLDER}/" in k]
    assert sorted(r["key"] for r in table.read().to_pylist()) == ["k1", "k2"]


def test_local_table_writes_without_probe(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="key", precombine="ts")
    table.upsert(_rows(["k1"], 1))
    assert not (tmp_path / "t" / PROBE_FOLDER).exists() or \
        not list((tmp_path / "t" / PROBE_FOLDER).iterdir())


def test_opt_out_writes_on_ignoring_store_with_one_warning(
        s3: S3Location, proxy: S3Proxy, caplog: pytest.LogCaptureFixture) -> None:
    proxy.ignore_conditions = True
    options = _through(s3, proxy)
    caplog.set_level(logging.WARNING, logger="engine")
    table = Table.create(s3.uri(), name="t", record_key="key", precombine="ts",
                         options={OPT_OUT: "true"}, storage_options=options)
    oracle = Oracle()
    for ts, keys in enumerate((["k1", "k2"], ["k2", "k3"], ["k4"]), start=1):
        table.upsert(_rows(keys, ts))
        oracle.upsert(_rows(keys, ts).to_pylist())
    again = Table.open(s3.uri(), {OPT_OUT: "true"}, storage_options=options)
    again.upsert(_rows(["k5"], 9))
    oracle.upsert(_rows(["k5"], 9).to_pylist())
    expected = sorted_rows(oracle.rows.values(), ["key", "ts", "v"])
    assert sorted_rows(table.read(), ["key", "ts", "v"]) == expected
    assert sorted_rows(hudi_rs_read(table.path, storage_options=options),
                       ["key", "ts", "v"]) == expected
    warnings = [r for r in caplog.records if OPT_OUT in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "single writer" in warnings[0].getMessage()
    # Without the opt-out the same process still refuses the store.
    with pytest.raises(ConditionalWriteUnsupportedError):
        Table.open(s3.uri(), storage_options=options).upsert(_rows(["k6"], 10))


def test_opt_out_among_storage_options_writes_and_is_not_passed_to_the_store(
        s3: S3Location, proxy: S3Proxy) -> None:
    # The command line and job files pass storage options only (as delta-rs's switch).
    proxy.ignore_conditions = True
    storage = Storage(s3.uri(), {**_through(s3, proxy), OPT_OUT: "true"})
    storage.write_new("x", b"1")
    assert storage.read("x") == b"1"
    assert OPT_OUT not in repr(storage.child("y").__reduce__())
    with pytest.raises(InvalidOptionError) as caught:
        Storage(s3.uri(), {**_through(s3, proxy), OPT_OUT: "maybe"})
    assert caught.value.key == OPT_OUT


WRITER = textwrap.dedent("""
    import sys
    import pyarrow as pa
    from engine import Table
    path, endpoint, name = sys.argv[1:4]
    table = Table.open(path, storage_options={"aws_endpoint_url": endpoint})
    for i in range(8):
        key = f"{name}{i}"
        table.upsert(pa.table({"key": [key], "ts": [1], "v": [i]}))
        print("committed", key, flush=True)
""")


def test_two_writer_processes_behind_ignoring_store_refused_before_any_instant(
        s3: S3Location, proxy: S3Proxy) -> None:
    table = Table.create(s3.uri(), name="t", record_key="key", precombine="ts",
                         storage_options=s3.storage_options)  # honest endpoint
    table.upsert(_rows(["k0"], 1))
    before = s3.server.objects(s3.bucket)
    proxy.ignore_conditions = True
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               **{k.upper(): v for k, v in s3.storage_options.items()})
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, s3.uri(), proxy.endpoint, n],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for n in ("a", "b")]
    outputs = [w.communicate(timeout=120) for w in writers]
    for writer, (out, err) in zip(writers, outputs, strict=True):
        assert writer.returncode != 0, out
        assert "committed" not in out
        assert "ConditionalWriteUnsupportedError" in err and OPT_OUT in err, err[-2000:]
    assert s3.server.objects(s3.bucket) == before  # no instant, no heartbeat, no lock, no probe
    assert [r["key"] for r in table.read().to_pylist()] == ["k0"]


# -- a conditional create whose answer was lost --------------------------------------------


def test_create_answered_exists_after_its_own_lost_success_is_a_success(
        s3: S3Location, proxy: S3Proxy) -> None:
    storage = Storage(s3.uri(), _through(s3, proxy))
    name = ".hoodie/timeline/20260101000000000.commit"
    storage.write_new(".hoodie/warm", b"")  # the probe is done: only the trap is left below
    proxy.lose_response("PUT", name)
    with proxy.counting() as seen:
        storage.write_new(name, b"ours")  # created, answer lost, retried: 412 for our own file
    assert seen.count(("PUT", f"t/{name}")) == 2  # the client did retry and was told 412
    assert storage.read(name) == b"ours"
    with pytest.raises(FileExistsError):  # a real conflict is still one
        Storage(s3.uri(), _through(s3, proxy)).write_new(name, b"ours")


def test_lock_whose_create_answer_was_lost_is_held_not_waited_for(
        s3: S3Location, proxy: S3Proxy) -> None:
    storage = Storage(s3.uri(), _through(s3, proxy))
    proxy.lose_response("PUT", LOCK_FILE)
    lock = FileSystemLock(storage, wait_seconds=3.0, expire_seconds=60.0)
    with lock:  # before: waited for its own lock, then LockTimeoutError
        lock.verify()
    assert not storage.exists(LOCK_FILE)


def test_create_failing_after_its_own_lost_success_is_a_success(
        s3: S3Location, proxy: S3Proxy) -> None:
    storage = Storage(s3.uri(), _through(s3, proxy))
    name = ".hoodie/timeline/20260101000000001.commit"
    storage.write_new(".hoodie/warm", b"")
    proxy.lose_response("PUT", name)  # created, answer lost ...
    proxy.refuse("PUT", name, after=1)  # ... and the client's retry fails outright
    storage.write_new(name, b"ours")  # before: StorageError although the file is ours
    assert storage.read(name) == b"ours"
    proxy.refuse("PUT", "never-written")
    with pytest.raises(StorageError):  # a failure that created nothing stays a failure
        storage.write_new("never-written", b"x")
    assert not storage.exists("never-written")


def test_lock_whose_create_failed_after_landing_is_held_not_left_behind(
        s3: S3Location, proxy: S3Proxy) -> None:
    proxy.lose_response("PUT", LOCK_FILE)
    proxy.refuse("PUT", LOCK_FILE, after=1)
    lock = FileSystemLock(Storage(s3.uri(), _through(s3, proxy)), 3.0, 60.0)
    with lock:  # before: StorageError, and .hoodie/lock left held by this live process
        lock.verify()
    with FileSystemLock(Storage(s3.uri(), s3.storage_options), 0.5, 60.0):
        pass


# -- a failed lock release -----------------------------------------------------------------


def test_lock_release_refused_once_is_retried_and_frees_the_lock(
        s3: S3Location, proxy: S3Proxy) -> None:
    holder = FileSystemLock(Storage(s3.uri(), _through(s3, proxy)), 5.0, 60.0)
    holder.acquire()
    proxy.refuse("DELETE", LOCK_FILE)
    holder.release()  # before: StorageError (403), the lock file left held for a minute
    assert ("DELETE", f"t/{LOCK_FILE}") in proxy.seen
    assert not holder.storage.exists(LOCK_FILE)
    with FileSystemLock(Storage(s3.uri(), s3.storage_options), 0.5, 60.0):
        pass


def test_lock_release_that_keeps_failing_gives_up_and_the_lock_expires(
        s3: S3Location, proxy: S3Proxy, caplog: pytest.LogCaptureFixture) -> None:
    holder = FileSystemLock(Storage(s3.uri(), _through(s3, proxy)), 5.0, 2.0)
    holder.acquire()
    proxy.refuse("DELETE", LOCK_FILE, times=1000)
    caplog.set_level(logging.ERROR, logger="engine")
    holder.release()  # bounded: gives up without raising (the write it guarded is done)
    refused = [r for r in proxy.seen if r == ("DELETE", f"t/{LOCK_FILE}")]
    assert 1 < len(refused) <= 5
    assert any("could not release the table lock" in r.getMessage() for r in caplog.records)
    assert holder.storage.exists(LOCK_FILE)
    # Not renewed any more: another writer breaks it once it expired.
    with FileSystemLock(Storage(s3.uri(), s3.storage_options), 20.0, 2.0) as taker:
        taker.verify()


def test_lock_that_never_expires_refused_on_object_store(s3: S3Location) -> None:
    # Before: accepted, so a holder that crashed on another machine (or failed to release)
    # kept the lock from every writer for good.
    Table.create(s3.uri(), name="t", record_key="key", precombine="ts",
                 storage_options=s3.storage_options)
    table = Table.open(s3.uri(), {"hoodie.write.lock.filesystem.expire": "0"},
                       storage_options=s3.storage_options)
    with pytest.raises(InvalidOptionError) as caught:
        table.upsert(_rows(["k1"], 1))
    assert caught.value.key == "hoodie.write.lock.filesystem.expire"
    assert "object store" in str(caught.value)
    assert table.timeline() == []


CHILD_WRITE = textwrap.dedent("""
    import pickle, sys
    storage = pickle.loads(bytes.fromhex(sys.stdin.read()))
    storage.write_new("p/file-from-task", b"task")
""")


def test_probe_verdict_travels_with_pickled_storage_to_a_task_process(
        s3: S3Location, proxy: S3Proxy) -> None:
    import pickle

    storage = Storage(s3.uri(), _through(s3, proxy))
    storage.write_new("p/file-from-driver", b"driver")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with proxy.counting() as seen:
        subprocess.run([sys.executable, "-c", CHILD_WRITE], input=pickle.dumps(storage).hex(),
                       env=env, check=True, text=True, timeout=60)
    assert _probes(seen) == []
    assert ("PUT", "t/p/file-from-task") in seen
    assert s3.server.objects(s3.bucket)["t/p/file-from-task"] == b"task"
