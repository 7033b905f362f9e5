"""The table view (:mod:`engine.layout.view`): one listing per snapshot, picklable for Spark."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from engine.layout import view as view_module
from engine.layout.view import TableView
from engine.write.placement import bucket_group


def _bucket_table(path: Path) -> Table:
    table = Table.create(str(path), name="viewed", record_key="id", precombine="ts",
                         partition_by=["p"], options={"hoodie.index.type": "BUCKET",
                                                      "hoodie.bucket.index.num.buckets": "2"})
    table.upsert(pa.table({"id": [f"k{i}" for i in range(8)], "ts": list(range(8)),
                           "p": ["a", "b"] * 4}))
    table.upsert(pa.table({"id": ["k0", "k1"], "ts": [10, 11], "p": ["a", "b"]}))
    return table


def test_view_lists_the_table_once_however_often_it_is_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = _bucket_table(tmp_path / "t")
    listings: list[str] = []
    real = view_module.list_table_files

    def counted(storage: object) -> object:
        listings.append("listed")
        return real(storage)  # type: ignore[arg-type]

    monkeypatch.setattr(view_module, "list_table_files", counted)
    view = TableView.load(table.storage, table.config)
    slices = view.latest_file_slices()
    assert view.partitions() == ["a", "b"]
    assert [s.file_id for s in view.latest_in_partition("a")] == [
        s.file_id for s in slices if s.partition_path == "a"]
    assert all(view.latest_slice(s.partition_path, s.file_id) is s for s in slices)
    assert dict(view.bucket_groups()) == {
        (s.partition_path, int(s.file_id[:8])): s.file_id for s in slices}
    assert len(view.all_file_slices()) >= len(slices)
    assert listings == ["listed"]


def test_view_pickled_keeps_slices_and_buckets_and_never_lists_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = _bucket_table(tmp_path / "t")
    view = TableView.load(table.storage, table.config)
    clone = pickle.loads(pickle.dumps(view))

    def refused(storage: object) -> object:
        raise AssertionError("a task listed the table")

    monkeypatch.setattr(view_module, "list_table_files", refused)
    assert clone.latest_file_slices() == view.latest_file_slices()
    assert clone.bucket_groups() == view.bucket_groups()
    assert clone.table_schema() == view.table_schema()
    for (partition, bucket), file_id in clone.bucket_groups().items():
        assert bucket_group(clone.bucket_groups(), "viewed", partition, bucket) == file_id
    slc = clone.latest_file_slices()[0]
    keys = clone.slice_reader().read_slice(slc, columns=["_hoodie_record_key"])
    assert keys.num_rows > 0


def test_view_leftover_temp_log_file_is_no_file_group_and_read_unchanged(tmp_path: Path) -> None:
    """A local write's temporary (``.tmp.<hex>.<final name>``, engine/storage/) left by a
    killed process, on a table that lists storage (no metadata table): for a log file, the
    temporary's name once matched the log file pattern with a file id ``tmp.<hex>.<id>``, so
    the view took it for a file group of its own."""
    table = Table.create(str(tmp_path / "t"), name="temps", record_key="id", precombine="ts",
                         partition_by=["p"], table_type="MERGE_ON_READ",
                         options={"hoodie.index.type": "BUCKET",
                                  "hoodie.bucket.index.num.buckets": "2",
                                  "hoodie.metadata.enable": "false"})
    table.upsert(pa.table({"id": ["k0", "k1"], "ts": [1, 2], "p": ["a", "a"]}))
    table.upsert(pa.table({"id": ["k0"], "ts": [3], "p": ["a"]}))
    before = table.read().sort_by("id")
    folder = tmp_path / "t" / "a"
    log = next(f for f in folder.iterdir() if ".log." in f.name)
    (folder / f".tmp.{'0' * 32}.{log.name}").write_bytes(log.read_bytes()[:40])
    view = TableView.load(table.storage, table.config)
    groups = {f.name[1:].split("_")[0] for f in folder.iterdir()
              if ".log." in f.name and not f.name.startswith(".tmp.")}
    assert {s.file_id for s in view.latest_file_slices()} == groups
    assert Table.open(str(tmp_path / "t")).read().sort_by("id").equals(before)
