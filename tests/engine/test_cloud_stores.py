"""Tables on GCS and Azure: the S3 suite's checks against a GCS XML-API server and Azurite,
both on loopback.

The GCS server (tests/gcs.py) enforces GCS's generation preconditions
(``x-goog-if-generation-match``) unless a test makes it ignore them; Azurite (tests/azure.py)
enforces Azure's ``If-None-Match: *`` and ``If-Match``. Every test has its own bucket
(container). Reads are judged by the oracle and by hudi-rs reading the same ``gs://`` /
``az://`` table with the same storage options.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from engine.errors import (
    ConditionalWriteUnsupportedError,
    LockTimeoutError,
    StorageError,
    TableNotFoundError,
)
from engine.storage import ObjectStorage, Storage
from engine.timeline.lock import LOCK_FILE, FileSystemLock
from tests.azure import ACCOUNT_KEY, AzureLocation, AzuriteServer
from tests.engine.object_store_checks import (
    SCHEMA,
    assert_exactly_one_create_wins,
    check_ranged_reads,
    check_read,
    region_rows,
)
from tests.engine.test_crash import CHILD, COLUMNS, CRASH_POINTS
from tests.gcs import PRIVATE_KEY, GCSLocation
from tests.helpers import Oracle, hudi_rs_read, row_tuples, rows_by_key

ROOT = Path(__file__).resolve().parents[2]
OPT_OUT = "tidelake.storage.allow.unsafe.single.writer"


Location = GCSLocation | AzureLocation


@pytest.fixture(scope="module")
def azurite() -> Iterator[AzuriteServer]:
    """Azurite for this module's tests (tests/azure.py)."""
    server = AzuriteServer.start()
    yield server
    server.stop()


@pytest.fixture(params=["gcs", "azure"])
def store(request: pytest.FixtureRequest) -> Location:
    """A new, empty bucket of the GCS server, or container of Azurite."""
    if request.param == "gcs":
        found: Location = request.getfixturevalue("gcs")
        return found
    azurite: AzuriteServer = request.getfixturevalue("azurite")
    return AzureLocation(azurite, azurite.new_container())


def _secret(store: Location) -> str:
    return PRIVATE_KEY if isinstance(store, GCSLocation) else ACCOUNT_KEY




def test_cloud_mor_table_create_upsert_delete_compact_read_matches_oracle_and_hudi_rs(
        store: Location) -> None:
    table = Table.create(store.uri(), name="trips", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by="region",
                         storage_options=store.storage_options)
    assert isinstance(table.storage, ObjectStorage)
    oracle = Oracle()
    batch = region_rows(range(40), 1)
    table.insert(pa.Table.from_pylist(batch, schema=SCHEMA))
    oracle.upsert(batch)
    check_read(table, oracle, store.storage_options)
    batch = region_rows(range(20, 60), 2)
    table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
    oracle.upsert(batch)
    victims = [f"k{i:03d}" for i in range(0, 60, 7)]
    table.delete(pa.table({"key": victims, "region": [("eu", "us")[int(k[1:]) % 2]
                                                      for k in victims]}))
    oracle.delete(victims)
    check_read(table, oracle, store.storage_options)
    again = Table.open(store.uri(), storage_options=store.storage_options)
    assert again.read().num_rows == len(oracle.rows)
    table.compact()
    check_read(table, oracle, store.storage_options)
    assert table.validate_metadata().ok
    objects = store.server.objects(store.bucket)
    assert any(k.startswith("t/.hoodie/metadata/") for k in objects)


def test_cloud_ranged_reads_match_whole_reads_and_replaced_file_is_an_error(
        store: Location) -> None:
    """GCS answers suffix ranges and If-Match on its ETag; Azure has no suffix ranges (a HEAD
    then the tail); both refuse a range of a replaced file."""
    check_ranged_reads(Storage(store.uri(), store.storage_options))


def test_cloud_write_new_two_writers_same_name_exactly_one_wins(store: Location) -> None:
    assert_exactly_one_create_wins(store.uri(), store.storage_options)


def test_cloud_two_table_writers_at_once_lose_no_commit(store: Location) -> None:
    # Two writers (own Table objects, own storages) upsert at the same time, each its own
    # partition, three commits each, under optimistic concurrency: every row of every commit
    # is there, for the engine and for hudi-rs.
    options = {"hoodie.write.concurrency.mode": "optimistic_concurrency_control"}
    base = Table.create(store.uri(), name="two", table_type="COPY_ON_WRITE", record_key="key",
                        precombine="ts", partition_by="region", options=options,
                        storage_options=store.storage_options)
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def write(region: str) -> None:
        try:
            table = Table.open(store.uri(), options, storage_options=store.storage_options)
            barrier.wait()
            for ts in (1, 2, 3):
                table.upsert(pa.Table.from_pylist(
                    [{"key": f"{region}{ts}{i}", "ts": ts, "region": region, "fare": 1.0}
                     for i in range(5)], schema=SCHEMA))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(r,)) for r in ("eu", "us")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    expected = {f"{r}{ts}{i}": (ts,) for r in ("eu", "us") for ts in (1, 2, 3)
                for i in range(5)}
    assert rows_by_key(base.read(), "key", ("ts",)) == expected
    assert rows_by_key(hudi_rs_read(base.path, storage_options=store.storage_options), "key",
                       ("ts",)) == expected
    completed = [e for e in base.timeline() if e.state == "completed"]
    assert len(completed) == 6


def test_cloud_lock_excludes_second_writer_and_renewal_keeps_own_file_only(
        store: Location) -> None:
    first = FileSystemLock(Storage(store.uri(), store.storage_options), 5.0, 60.0)
    second = FileSystemLock(Storage(store.uri(), store.storage_options), 0.3, 60.0)
    with first:
        with pytest.raises(LockTimeoutError):
            second.acquire()
        storage = first.storage
        held = storage.read(LOCK_FILE)
        assert storage.touch_if(LOCK_FILE, lambda content: content == held)
        assert not storage.touch_if(LOCK_FILE, lambda content: content != held)
    assert not first.storage.exists(LOCK_FILE)
    with second:
        assert second.storage.exists(LOCK_FILE)


def test_cloud_renewal_of_a_lock_replaced_since_read_refused_by_generation(
        store: Location) -> None:
    # touch_if reads the lock, then replaces it only if its generation is unchanged: a
    # successor's lock written in between is left alone.
    storage = Storage(store.uri(), store.storage_options)
    storage.write_new(LOCK_FILE, b"mine")
    other = Storage(store.uri(), store.storage_options)

    def successor_replaces(content: bytes) -> bool:
        other.write_replace(LOCK_FILE, b"successor")
        return content == b"mine"

    assert not storage.touch_if(LOCK_FILE, successor_replaces)
    assert storage.read(LOCK_FILE) == b"successor"


@pytest.mark.parametrize("point", ["before_complete"])
def test_sigkill_mid_commit_on_cloud_store_is_all_or_nothing(store: Location, point: str) -> None:
    # The child finds the store through the environment alone (GOOGLE_*), as a job would.
    path = store.uri()
    options = store.storage_options
    table = Table.create(path, name="crash", table_type="MERGE_ON_READ", record_key="key",
                         precombine="ts", partition_by=["part"],
                         options={"hoodie.parquet.max.file.size": "4000",
                                  "hoodie.parquet.small.file.limit": "1000"},
                         storage_options=options)
    keys = [f"k{i:03d}" for i in range(60)]
    table.upsert(pa.table({"key": keys, "ts": [1] * 60, "part": [k[-1] for k in keys],
                           "v": [-1] * 60}))
    before = row_tuples(table.read(), COLUMNS)
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               **{key.upper(): value for key, value in options.items()})
    proc = subprocess.run([sys.executable, "-c", CHILD, *CRASH_POINTS[point], path, "0"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert {e.state for e in table.timeline()} & {"requested", "inflight"}
    assert row_tuples(table.read(), COLUMNS) == before
    assert row_tuples(hudi_rs_read(path, storage_options=options), COLUMNS) == before
    reopened = Table.open(path, storage_options=options)
    reopened.upsert(pa.table({"key": ["z999"], "ts": [5], "part": ["9"], "v": [7]}))
    after = row_tuples(reopened.read(), COLUMNS)
    assert after == sorted([*before, ("z999", 7)])
    assert row_tuples(hudi_rs_read(path, storage_options=options), COLUMNS) == after
    timeline = reopened.timeline()
    assert all(e.state == "completed" for e in timeline)
    assert any(e.action == "rollback" for e in timeline)
    assert reopened.validate_metadata().ok


def test_cloud_secrets_never_in_table_files_logs_or_errors(
        store: Location, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="engine")
    table = Table.create(store.uri(), name="trips", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts",
                         storage_options=store.storage_options)
    table.upsert(pa.Table.from_pylist(region_rows(range(10), 1), schema=SCHEMA))
    table.upsert(pa.Table.from_pylist(region_rows(range(5, 15), 2), schema=SCHEMA))
    objects = store.server.objects(store.bucket)
    assert any(k.endswith("hoodie.properties") for k in objects)
    assert any(".deltacommit" in k for k in objects)
    for key, body in objects.items():
        assert _secret(store).encode() not in body, key
    assert _secret(store) not in repr(table.storage) + repr(table)
    missing = store.uri().replace(store.bucket, f"nosuch{store.bucket}")
    with pytest.raises((StorageError, TableNotFoundError)) as info:
        Table.open(missing, storage_options=store.storage_options)
    assert missing in str(info.value)
    assert _secret(store) not in str(info.value)
    with pytest.raises(StorageError) as info:  # a write refused by the store
        Table.create(missing, name="x", record_key="key", precombine="ts",
                     storage_options=store.storage_options)
    assert _secret(store) not in str(info.value)
    assert _secret(store) not in caplog.text


@pytest.mark.parametrize("ignored", ["all", "updates"])
def test_gcs_store_ignoring_generation_preconditions_refused_before_any_write(
        gcs: GCSLocation, ignored: str) -> None:
    # "all": creates and updates both ignore x-goog-if-generation-match; "updates": only a
    # replacement ignores it (a create-if-absent still answers 412).
    if ignored == "all":
        gcs.server.ignore_conditions = True
    else:
        gcs.server.ignore_update_conditions = True
    with pytest.raises(ConditionalWriteUnsupportedError) as caught:
        Table.create(gcs.uri(), name="t", record_key="key", precombine="ts",
                     storage_options=gcs.storage_options)
    message = str(caught.value)
    assert OPT_OUT in message and gcs.uri() in message
    assert gcs.server.objects(gcs.bucket) == {}  # the probe removed itself; nothing else
