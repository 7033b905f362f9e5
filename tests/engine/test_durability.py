"""What the storage contract promises about durability (``engine/storage/``).

A power loss cannot be run in a test; what can be checked is that the right things are
flushed, in the right order: every ``os.fsync`` is recorded with the path its descriptor
names (``/proc/self/fd``), and the calls are compared with what the contract says.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from engine import Table
from engine.storage import Storage
from engine.write.write_client import WriteClient
from engine.write.write_handle import execute
from engine.write.write_task import CREATE, WriteTask

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"),
                                reason="needs /proc/self/fd to name fsynced descriptors")


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Paths passed to ``os.fsync``, in call order (the real fsync still runs)."""
    calls: list[str] = []
    real = os.fsync

    def record(fd: int) -> None:
        calls.append(os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    yield calls


def _real(path: Path | str) -> str:
    return os.path.realpath(path)


def test_storage_write_new_fsyncs_the_folder_after_the_link(
        tmp_path: Path, fsynced: list[str]) -> None:
    storage = Storage(str(tmp_path))
    storage.makedirs(".hoodie/timeline")
    fsynced.clear()
    storage.write_new(".hoodie/timeline/001.commit", b"{}")
    folder = _real(tmp_path / ".hoodie" / "timeline")
    assert fsynced and fsynced[-1] == folder, "the new name must be flushed with its folder"
    assert any(".tmp." in p for p in fsynced[:-1]), "the content is flushed before the link"


def test_storage_write_replace_fsyncs_the_folder_after_the_rename(
        tmp_path: Path, fsynced: list[str]) -> None:
    storage = Storage(str(tmp_path))
    storage.write_replace(".hoodie/hoodie.properties", b"a=1\n")
    storage.write_replace(".hoodie/hoodie.properties", b"a=2\n")
    assert fsynced[-1] == _real(tmp_path / ".hoodie")
    assert (tmp_path / ".hoodie" / "hoodie.properties").read_bytes() == b"a=2\n"


def test_storage_new_folders_are_flushed_in_their_parents(
        tmp_path: Path, fsynced: list[str]) -> None:
    Storage(str(tmp_path)).write_new("a/b/f", b"x")
    # a is made durable in the base folder, b in a; then the file and b itself.
    assert fsynced.index(_real(tmp_path)) < fsynced.index(_real(tmp_path / "a"))
    assert fsynced[-1] == _real(tmp_path / "a" / "b")


def test_table_create_flushes_properties_and_timeline_folder_entries(
        tmp_path: Path, fsynced: list[str]) -> None:
    Table.create(str(tmp_path / "t"), name="t", record_key="id")
    hoodie = _real(tmp_path / "t" / ".hoodie")
    assert fsynced[-1] == hoodie, "hoodie.properties' name is flushed with its folder"
    assert _real(tmp_path / "t") in fsynced, ".hoodie itself is flushed in the base folder"


def _data_task(table: Table, sync: bool) -> tuple[str, str]:
    data = pa.table({"id": [f"k{i}" for i in range(50)], "ts": np.arange(50)})
    client = WriteClient(table.storage, table.config, table.write_config)
    _, instant = client.begin()
    ctx = client.write_context(instant, data.schema)
    records = data.append_column("_hoodie_record_key", data.column("id")) \
        .append_column("_hoodie_partition_path", pa.array(["p"] * 50))
    stat = execute(ctx, WriteTask(kind=CREATE, partition_path="p",
                                  file_id="00000000-0000-0000-0000-000000000000-0",
                                  records=records, deletes=None), sync=sync)
    return _real(table.storage.full(stat.path)), _real(table.storage.full("p"))


def test_write_task_with_sync_fsyncs_its_data_file_and_folder(
        tmp_path: Path, fsynced: list[str]) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts",
                         table_type="COPY_ON_WRITE")
    fsynced.clear()
    data_file, folder = _data_task(table, sync=True)
    assert folder in fsynced and fsynced[-1] == folder
    # The content was flushed under its temporary name, before the link.
    name = os.path.basename(data_file)
    assert any(os.path.basename(p).endswith(name) and ".tmp." in p for p in fsynced)


def test_write_task_without_sync_leaves_data_files_to_the_committer(
        tmp_path: Path, fsynced: list[str]) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts",
                         table_type="COPY_ON_WRITE")
    fsynced.clear()
    data_file, _ = _data_task(table, sync=False)
    name = os.path.basename(data_file)
    assert not any(os.path.basename(p).endswith(name) for p in fsynced)
