"""The metadata table's ``bloom_filters`` partition and the BLOOM index reading it.

Entries are checked against the base files on storage and their Parquet footers (read with
pyarrow), keys and routing recomputed here from the doc's definitions (§4.2, §4.5, §4.8);
the lookup through the MDT against SIMPLE's tags, counting footers opened and MDT file
groups searched, never time (random write sequences through the MDT:
``test_bloom_index.py``'s equality test, ``mdt`` cases).
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from engine import Table
from engine.index import bloom, simple
from engine.layout.view import TableView
from engine.metadata.reader import latest_group_slices, read_slice, validity
from engine.metadata.records import BloomFilterInfo, ColumnStats, column_stats_record
from engine.metadata.table import MetadataTable, declared_partitions
from engine.metadata.writer import initialize_partition
from tests.engine.helpers import ref_string_hash

BLOOM_OPTIONS = {"hoodie.index.type": "BLOOM",
                 "hoodie.metadata.index.bloom.filter.enable": "true",
                 "hoodie.bloom.index.use.metadata": "true"}


def _ref_key(partition: str, name: str) -> str:
    seed = 0xFFFFFFFFDABADABA
    part = base64.b64encode(xxhash.xxh64((partition or ".").encode(), seed=seed).digest())
    return (part + base64.b64encode(hashlib.md5(name.encode()).digest())).decode()


def _base_files_on_storage(root: Path) -> dict[str, tuple[str, str]]:
    """MDT key -> (relative path, instant) of every base file in the table folder."""
    out = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".hoodie"]
        for name in names:
            if name.endswith(".parquet") and not name.startswith("."):
                rel = os.path.relpath(os.path.join(folder, name), root)
                partition = os.path.dirname(rel)
                out[_ref_key(partition, name)] = (rel, name.rsplit("_", 1)[1].split(".")[0])
    return out


def _partition(table: Table) -> dict[str, tuple[int, BloomFilterInfo]]:
    """The bloom_filters partition as a reader sees it: key -> (file group index, payload),
    checking every key sits in the group it routes to."""
    mdt = MetadataTable(table.storage, table.config)
    data_timeline = TableView.load(table.storage, table.config).timeline
    groups = latest_group_slices(mdt, mdt.timeline(), validity(data_timeline), "bloom_filters")
    assert [g.file_id for g in groups] == [f"bloom-filters-{i:04d}-0" for i in range(4)]
    out = {}
    for index, group in enumerate(groups):
        for key, record in read_slice(mdt.storage, group).items():
            assert abs(ref_string_hash(key)) % 4 == index
            assert record.type == 4 and isinstance(record.payload, BloomFilterInfo)
            out[key] = (index, record.payload)
    return out


def _assert_matches_storage(table: Table, root: Path) -> None:
    on_storage = _base_files_on_storage(root)
    entries = _partition(table)
    live = {k: p for k, (_, p) in entries.items() if not p.is_deleted}
    assert set(live) == set(on_storage)
    for key, payload in live.items():
        rel, instant = on_storage[key]
        footer = pq.read_metadata(root / rel).metadata
        assert payload.bloom_filter == footer[b"org.apache.hudi.bloomfilter"]
        assert payload.type == footer.get(b"hoodie_bloom_filter_type_code", b"SIMPLE").decode()
        assert payload.timestamp == instant
    for key, (_, payload) in entries.items():
        if payload.is_deleted:
            assert key not in on_storage
            assert (payload.type, payload.bloom_filter) == ("", b"")


def test_bloom_filters_partition_follows_writes_services_and_clean(tmp_path: Path) -> None:
    root = tmp_path / "t"
    table = Table.create(str(root), name="t", table_type="MERGE_ON_READ", record_key="key",
                         precombine="ts", partition_by=["region"],
                         options={**BLOOM_OPTIONS, "hoodie.cleaner.commits.retained": "1",
                                  "hoodie.parquet.max.file.size": "20000",
                                  "hoodie.parquet.small.file.limit": "1"})
    rows = [{"key": f"k{i:04d}", "ts": 1, "region": "ab"[i % 2]} for i in range(300)]
    table.bulk_insert(pa.Table.from_pylist(rows))
    assert "bloom_filters" in declared_partitions(table.storage)
    _assert_matches_storage(table, root)
    table.upsert(pa.Table.from_pylist([{**r, "ts": 2} for r in rows[:50]]))  # logs
    table.compact()  # new base files from compaction
    _assert_matches_storage(table, root)
    table.cluster()  # new base files from clustering, the old ones replaced
    table.upsert(pa.Table.from_pylist([{**r, "ts": 3} for r in rows[50:60]]))
    table.compact()
    table.clean()  # removed base files: entries marked deleted
    entries = _partition(table)
    assert any(p.is_deleted for _, p in entries.values())
    _assert_matches_storage(table, root)
    assert sorted(r["key"] for r in table.read(columns=["key"]).to_pylist()) == \
        [r["key"] for r in rows]


def test_bloom_filters_partition_built_for_an_existing_table_from_footers(
        tmp_path: Path) -> None:
    root = tmp_path / "t"
    table = Table.create(str(root), name="t", table_type="COPY_ON_WRITE", record_key="key",
                         precombine="ts", options={"hoodie.index.type": "BLOOM"})
    for i in range(3):
        table.bulk_insert(pa.table({"key": [f"r{i}-{j}" for j in range(50)], "ts": [1] * 50}))
    assert "bloom_filters" not in declared_partitions(table.storage)
    table = Table.open(str(root), options=BLOOM_OPTIONS)
    table.upsert(pa.table({"key": ["r0-1", "new"], "ts": [2, 2]}))
    assert "bloom_filters" in declared_partitions(table.storage)
    _assert_matches_storage(table, root)
    # a writer that does not mention the option keeps it; one that disables it drops it
    Table.open(str(root)).upsert(pa.table({"key": ["r1-1"], "ts": [3]}))
    assert "bloom_filters" in declared_partitions(table.storage)
    Table.open(str(root), options={"hoodie.metadata.index.bloom.filter.enable": "false"}
               ).upsert(pa.table({"key": ["r1-2"], "ts": [3]}))
    assert "bloom_filters" not in declared_partitions(table.storage)


def _bulk_ranges(tmp_path: Path) -> Table:
    """Four base files of one partition, keys r<i>-<even number>: disjoint ranges."""
    table = Table.create(str(tmp_path / "t"), name="t", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", options=BLOOM_OPTIONS)
    for i in range(4):
        table.bulk_insert(pa.table({"key": [f"r{i}-{j:04d}" for j in range(0, 400, 2)],
                                    "ts": [1] * 200}))
    return table


class _Counts:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import engine.metadata.reader as reader_module

        self.footers = 0
        self.lookups = 0
        real_footer, real_lookup = bloom.read_footer_keys, reader_module.lookup_slice

        def footer(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.footers += 1
            return real_footer(*args, **kwargs)

        def lookup(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.lookups += 1
            return real_lookup(*args, **kwargs)

        monkeypatch.setattr(bloom, "read_footer_keys", footer)
        monkeypatch.setattr(reader_module, "lookup_slice", lookup)


def _lookup(table: Table, keys: list[str], *, mdt: bool,
            prune_by_ranges: bool = True) -> tuple[bloom.BloomLookup, pa.Table]:
    view = TableView.load(table.storage, table.config)
    reader, slices = view.slice_reader(), view.latest_file_slices()
    source = bloom.MetadataSource.of(table.storage, view.timeline) if mdt else None
    found = bloom.key_locations(reader, slices, None, pa.array(keys), metadata=source,
                                prune_by_ranges=prune_by_ranges)
    expected = simple.key_locations(reader, slices, None)
    return found, expected.filter(pa.compute.is_in(expected.column("key"),
                                                   value_set=pa.array(keys)))


def _same(found: pa.Table, expected: pa.Table) -> None:
    def rows(t: pa.Table) -> list[tuple[str, str, str]]:
        return sorted(zip(*(t.column(c).to_pylist()
                            for c in ("key", "loc_partition", "loc_file_id")), strict=True))
    assert rows(found) == rows(expected)


def test_bloom_lookup_through_mdt_opens_no_footer_for_filters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = _bulk_ranges(tmp_path)
    keys = ["r2-0010", "r2-0100", "r1-0011", "zz"]
    counts = _Counts(monkeypatch)
    by_footers, expected = _lookup(table, keys, mdt=False, prune_by_ranges=False)
    assert (counts.footers, counts.lookups) == (4, 0)
    assert (by_footers.footers, by_footers.metadata_groups) == (4, 0)
    counts.footers = 0
    by_mdt, _ = _lookup(table, keys, mdt=True, prune_by_ranges=False)
    assert counts.footers == 0 and by_mdt.footers == 0
    assert counts.lookups == by_mdt.metadata_groups >= 1
    for found in (by_footers, by_mdt):
        _same(found.locations, expected)
        assert (found.pruned_by_bloom, found.read) == (3, 1)
    # ranges without column_stats come from the footers (min/max only)
    counts.footers = 0
    ranged, _ = _lookup(table, keys, mdt=True)
    assert counts.footers == 4 and (ranged.pruned_by_range, ranged.read) == (2, 1)
    _same(ranged.locations, expected)


def test_bloom_lookup_ranges_from_column_stats_open_no_footer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = _bulk_ranges(tmp_path)
    # column_stats of _hoodie_record_key, computed here from the files' key columns
    view = TableView.load(table.storage, table.config)
    records = []
    for slc in view.latest_file_slices():
        assert slc.base_file is not None
        keys = pq.read_table(table.storage.full(slc.base_file.path),
                             columns=["_hoodie_record_key"]).column(0).to_pylist()
        stats = ColumnStats(None, None, ("StringWrapper", min(keys)),
                            ("StringWrapper", max(keys)), len(keys), 0, 1, 1)
        records.append(column_stats_record(slc.partition_path, slc.base_file.name,
                                           "_hoodie_record_key", stats))
    initialize_partition(MetadataTable(table.storage, table.config), "column_stats", 2,
                         records)
    counts = _Counts(monkeypatch)
    keys = ["r2-0010", "r2-0100", "r1-0011", "zz"]
    found, expected = _lookup(table, keys, mdt=True)
    assert counts.footers == 0 and found.footers == 0
    assert (found.pruned_by_range, found.pruned_by_bloom, found.read) == (2, 1, 1)
    _same(found.locations, expected)
    # upserts through the client take the same path and keep the table right
    table.upsert(pa.table({"key": ["r3-0002", "r9"], "ts": [5, 5]}))
    got = {r["key"]: r["ts"] for r in table.read(columns=["key", "ts"]).to_pylist()}
    assert len(got) == 801 and got["r3-0002"] == 5 and got["r9"] == 5


def test_bloom_lookup_mdt_entry_missing_falls_back_to_footer(tmp_path: Path) -> None:
    table = _bulk_ranges(tmp_path)
    view = TableView.load(table.storage, table.config)
    source = bloom.MetadataSource.of(table.storage, view.timeline)
    assert source is not None
    # a file the partition does not describe (e.g. written before it was declared)
    from engine.metadata import lookups

    real = lookups.read_filters

    def partial(storage, timeline, files):  # type: ignore[no-untyped-def]
        found, groups = real(storage, timeline, files)
        return dict(list(found.items())[1:]), groups

    lookups.read_filters = partial  # type: ignore[assignment]
    try:
        found = bloom.key_locations(view.slice_reader(), view.latest_file_slices(), None,
                                    pa.array(["r0-0000", "r3-0398"]), metadata=source,
                                    prune_by_ranges=False)
    finally:
        lookups.read_filters = real  # type: ignore[assignment]
    assert found.footers == 1
    assert sorted(found.locations.column("key").to_pylist()) == ["r0-0000", "r3-0398"]
