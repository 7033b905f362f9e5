"""Tables on an object store: the engine against a real S3-protocol server on loopback.

The server is moto's (tests/s3.py), which enforces conditional writes as S3 does; every
test has its own bucket. Reads are judged by the oracle and by hudi-rs reading the same
``s3://`` table with the same storage options.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from engine.errors import LockTimeoutError, StorageError, TableNotFoundError
from engine.format.base_file import read_base_file, read_footer_keys, write_base_file
from engine.storage import ObjectStorage, Storage
from engine.timeline.lock import LOCK_FILE, FileSystemLock
from tests.engine.object_store_checks import (
    SCHEMA,
    assert_exactly_one_create_wins,
    check_read,
    region_rows,
)
from tests.helpers import Oracle
from tests.s3 import ACCESS_KEY_ID, SECRET_ACCESS_KEY, S3Location

ROOT = Path(__file__).resolve().parents[2]





@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_s3_table_create_upsert_delete_read_matches_oracle_and_hudi_rs(
        s3: S3Location, table_type: str) -> None:
    table = Table.create(s3.uri(), name="trips", table_type=table_type, record_key="key",
                         precombine="ts", partition_by="region",
                         storage_options=s3.storage_options)
    assert isinstance(table.storage, ObjectStorage)
    oracle = Oracle()
    batch = region_rows(range(40), 1)
    table.insert(pa.Table.from_pylist(batch, schema=SCHEMA))
    oracle.upsert(batch)
    check_read(table, oracle, s3.storage_options)
    batch = region_rows(range(20, 60), 2)
    table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
    oracle.upsert(batch)
    victims = [f"k{i:03d}" for i in range(0, 60, 7)]
    table.delete(pa.table({"key": victims, "region": [("eu", "us")[int(k[1:]) % 2]
                                                      for k in victims]}))
    oracle.delete(victims)
    check_read(table, oracle, s3.storage_options)
    # A second process opens it by URI and options alone.
    again = Table.open(s3.uri(), storage_options=s3.storage_options)
    assert again.read().num_rows == len(oracle.rows)
    if table_type == "MERGE_ON_READ":
        table.compact()
        check_read(table, oracle, s3.storage_options)
    # The metadata table lives on S3 too and lists what storage holds.
    assert table.validate_metadata().ok


def test_s3_write_new_two_writers_same_name_exactly_one_wins(s3: S3Location) -> None:
    assert_exactly_one_create_wins(s3.uri(), s3.storage_options)


def test_s3_secrets_never_in_table_files_logs_or_errors(
        s3: S3Location, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="engine")
    table = Table.create(s3.uri(), name="trips", table_type="MERGE_ON_READ", record_key="key",
                         precombine="ts", storage_options=s3.storage_options)
    table.upsert(pa.Table.from_pylist(region_rows(range(10), 1), schema=SCHEMA))
    table.upsert(pa.Table.from_pylist(region_rows(range(5, 15), 2), schema=SCHEMA))
    objects = s3.server.objects(s3.bucket)
    assert any(k.endswith("hoodie.properties") for k in objects)
    assert any(".deltacommit" in k for k in objects)
    for key, body in objects.items():
        for secret in (SECRET_ACCESS_KEY, ACCESS_KEY_ID):
            assert secret.encode() not in body, key
    assert SECRET_ACCESS_KEY not in repr(table.storage) + repr(table)
    missing = f"s3://no-such-bucket-{s3.bucket}/t"
    with pytest.raises((StorageError, TableNotFoundError)) as info:
        Table.open(missing, storage_options=s3.storage_options)
    assert missing in str(info.value)
    for secret in (SECRET_ACCESS_KEY, ACCESS_KEY_ID):
        assert secret not in str(info.value)
        assert secret not in caplog.text


def test_s3_storage_listing_and_delete_tree_match_written_keys(s3: S3Location) -> None:
    storage = Storage(s3.uri("base"), s3.storage_options)
    storage.write_new("a/x.parquet", b"1")
    storage.write_new("a/b/y.log", b"22")
    storage.write_replace("z", b"333")
    assert sorted((f.name, f.size) for f in storage.list_dir("a")) == [("x.parquet", 1)]
    assert storage.list_subdirs("a") == ["b"]
    assert [(d, sorted(f.name for f in fs)) for d, fs in storage.walk_files()] == [
        ("", ["z"]), ("a", ["x.parquet"]), ("a/b", ["y.log"])]
    assert storage.delete("z") and not storage.exists("z")
    storage.delete("z")  # already gone: no error
    assert storage.delete_tree("a") and storage.list_dir("a") == []
    assert storage.full("a/b") == s3.uri("base") + "/a/b"
    assert storage.relative(s3.uri("base") + "/a/b") == "a/b"
    with pytest.raises(ValueError, match="escapes"):
        storage.full("../other")


CHILD_READ = textwrap.dedent("""
    import json, pickle, sys
    storage = pickle.loads(bytes.fromhex(sys.stdin.read()))
    child = storage.child("a")
    print(json.dumps([type(storage).__module__, type(storage).__qualname__, storage.base_path,
                      storage.read("a/x").decode(), type(child).__qualname__, child.base_path,
                      child.read("x").decode()]))
""")


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_storage_of_each_kind_unpickled_in_a_fresh_process_reads_the_same_files(
        request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> None:
    """A pickled Storage is what a Spark task gets: a process that imported nothing of the
    engine before unpickling it gets the same kind on the same location, and reads there."""
    if kind == "s3":
        s3: S3Location = request.getfixturevalue("s3")
        storage = Storage(s3.uri("t"), s3.storage_options)
    else:
        storage = Storage(str(tmp_path / "t"))
    storage.write_new("a/x", f"written by the driver to {kind}".encode())
    child = storage.child("a")
    shipped = subprocess.run([sys.executable, "-c", CHILD_READ],
                             input=pickle.dumps(storage).hex(),
                             env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True,
                             capture_output=True, text=True, timeout=60)
    assert json.loads(shipped.stdout) == [
        type(storage).__module__, type(storage).__qualname__, storage.base_path,
        storage.read("a/x").decode(), type(child).__qualname__, child.base_path,
        child.read("x").decode()]


def test_s3_lock_excludes_second_writer_and_renewal_keeps_own_file_only(
        s3: S3Location) -> None:
    first = FileSystemLock(Storage(s3.uri(), s3.storage_options), 5.0, 60.0)
    second = FileSystemLock(Storage(s3.uri(), s3.storage_options), 0.3, 60.0)
    with first:
        with pytest.raises(LockTimeoutError):
            second.acquire()
        first.verify()
        storage = first.storage
        held = storage.read(LOCK_FILE)
        assert storage.touch_if(LOCK_FILE, lambda content: content == held)
        assert not storage.touch_if(LOCK_FILE, lambda content: content != held)
    assert not first.storage.exists(LOCK_FILE)
    with second:  # free again
        assert second.storage.exists(LOCK_FILE)
    with pytest.raises(FileNotFoundError):
        first.storage.touch_if(LOCK_FILE, lambda content: True)


def test_s3_base_file_footer_by_ranges_equals_footer_of_whole_file(s3: S3Location) -> None:
    storage = Storage(s3.uri(), s3.storage_options)
    name = "f1-0_0-0-0_20260101000000000.parquet"
    keys = [f"k{i:05d}" for i in range(5000)]
    rows = pa.table({
        "_hoodie_commit_time": ["20260101000000000"] * len(keys),
        "_hoodie_commit_seqno": [f"s{i}" for i in range(len(keys))],
        "_hoodie_record_key": keys, "_hoodie_partition_path": [""] * len(keys),
        "_hoodie_file_name": [name] * len(keys), "v": list(range(len(keys)))})
    result = write_base_file(f"p/{name}", rows, storage=storage)
    assert result.file_size == storage.size(f"p/{name}")
    with pytest.raises(FileExistsError):
        write_base_file(f"p/{name}", rows, storage=storage)
    with storage.open_input(f"p/{name}", whole=False) as ranged:
        footer = read_footer_keys(ranged)
    whole = read_footer_keys(pa.BufferReader(storage.read(f"p/{name}")))
    assert (footer.min_key, footer.max_key) == ("k00000", "k04999") == \
        (whole.min_key, whole.max_key)
    assert footer.bloom is not None and whole.bloom is not None
    assert footer.bloom.serialize() == whole.bloom.serialize()
    with storage.open_input(f"p/{name}") as source:
        assert read_base_file(source, columns=["v"]).column(0).to_pylist() == \
            list(range(len(keys)))


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_s3_upsert_with_metadata_table_lists_timelines_only_counted_at_server(
        s3: S3Location, table_type: str) -> None:
    """With the metadata table a commit lists no data partition; it lists the timeline at
    its start (before and under the lock) and at its commit point, and the MDT's timeline
    once in each locked step; no task looks for partition metadata that the view shows."""
    table = Table.create(s3.uri(), name="trips", table_type=table_type, record_key="key",
                         precombine="ts", partition_by="region",
                         options={"hoodie.metadata.enable": "true",
                                  "hoodie.index.type": "BUCKET",
                                  "hoodie.bucket.index.num.buckets": "2"},
                         storage_options=s3.storage_options)
    oracle = Oracle()
    for keys, ts in ((range(40), 1), (range(20, 60), 2)):
        batch = region_rows(keys, ts)
        table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
        oracle.upsert(batch)
    batch = region_rows(range(30, 70), 3)
    with s3.server.requests(s3.bucket) as seen:
        table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
    oracle.upsert(batch)
    listed = [prefix for method, prefix in seen if method == "LIST"]
    assert listed.count("t/.hoodie/timeline/") == 3
    assert listed.count("t/.hoodie/metadata/.hoodie/timeline/") == 2
    data = [p for p in listed if not p.startswith("t/.hoodie/")]
    assert data == []
    assert not [key for method, key in seen
                if method == "HEAD" and key.endswith(".hoodie_partition_metadata")]
    check_read(table, oracle, s3.storage_options)
    assert table.validate_metadata().ok
