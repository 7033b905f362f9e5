"""The metadata table's ``record_index`` partition and the RECORD_INDEX index.

Judged independently of the code under test: after every step of random write sequences
(with cleaning, compaction and clustering interleaved) the merged record_index, decoded from
the MDT files, must map every key to the partition and file group hudi-rs reads it from
(``_hoodie_record_key``, ``_hoodie_partition_path``, ``_hoodie_file_name``), and no other
key; tagging through it must equal GLOBAL_SIMPLE's on the same snapshot; the rows must equal
the oracle's. Lookups are checked on which MDT files they read, never on time.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from engine.errors import InvalidOptionError
from engine.index import record_index as record_index_lookup
from engine.index import simple
from engine.layout.file_group import list_table_files
from engine.layout.view import TableView
from engine.metadata import index_defs
from engine.metadata.reader import read_slice
from engine.metadata.record_index import (
    RECORD_INDEX,
    estimate_file_group_count,
    group_slices,
    lookup_locations,
)
from engine.metadata.records import RecordIndexInfo, instant_to_epoch_ms
from engine.metadata.table import MetadataTable, declared_partitions
from engine.storage import LocalStorage, Storage
from engine.timeline.active import Timeline
from tests.engine.helpers import (
    COLUMNS,
    SCHEMA,
    hudi_rs_locations,
    random_batch,
    ref_string_hash,
    writer_dies_at_the_data_commit,
)
from tests.helpers import Oracle, hudi_rs_read, sorted_rows

OPTIONS = {
    "hoodie.clean.automatic": "false",
    "hoodie.archive.automatic": "false",
    "hoodie.cleaner.commits.retained": "2",
    "hoodie.compact.inline.max.delta.commits": "2",
    # several file groups per partition, so keys move between groups
    "hoodie.parquet.max.file.size": "12000",
    "hoodie.parquet.small.file.limit": "8000",
    "hoodie.copyonwrite.record.size.estimate": "400",
    "hoodie.metadata.record.index.min.filegroup.count": "4",
}


def _index_entries(table: Table) -> dict[str, tuple[str, str, int]]:
    """key → (partition, file id, instant ms) of the merged record_index, decoded from
    every file group's latest slice."""
    timeline = Timeline.load(table.storage, table.config)
    mdt = MetadataTable(table.storage, table.config)
    out: dict[str, tuple[str, str, int]] = {}
    for piece in group_slices(table.storage, timeline):
        for key, record in read_slice(mdt.storage, piece).items():
            info = record.payload
            assert isinstance(info, RecordIndexInfo)
            assert key not in out
            out[key] = (info.partition_name or "", info.location_file_id,
                        info.instant_time or 0)
    return out


def _assert_index_matches_data(table: Table, where: str) -> None:
    entries = _index_entries(table)
    assert {k: v[:2] for k, v in entries.items()} == hudi_rs_locations(table.path), where


def _tags(table: Table, keys: pa.Array, parts: pa.Array) -> tuple[pa.Table, pa.Table]:
    """Tagging of (keys, parts) on the table's snapshot by GLOBAL_SIMPLE's lookup and by the
    record index's."""
    view = TableView.load(table.storage, table.config)
    reader, slices = view.slice_reader(), view.latest_file_slices()
    by_simple = simple.key_locations(reader, slices, None)
    by_index = record_index_lookup.locations(reader, slices, keys, partitions=parts)
    return (simple.tag(keys, parts, by_simple, global_index=True),
            simple.tag(keys, parts, by_index, global_index=True))


def test_record_index_file_group_count_follows_hudi_estimate() -> None:
    sizes = {"min_groups": 10, "max_groups": 10_000, "growth_factor": 2.0,
             "max_group_bytes": 1024 ** 3}
    # 1 GiB / 48 B = 22369621 keys per group; twice the keys are planned for
    assert estimate_file_group_count(0, **sizes) == 10
    assert estimate_file_group_count(22369621 * 5, **sizes) == 10
    assert estimate_file_group_count(22369621 * 6, **sizes) == 12
    assert estimate_file_group_count(22369621 * 6 - 100, **sizes) == 11
    # Java multiplies in float: 134217725 rounds to 2^27, so one key short still gives 12
    assert estimate_file_group_count(22369621 * 6 - 1, **sizes) == 12
    assert estimate_file_group_count(10 ** 12, **sizes) == 10_000
    fixed = dict(sizes, min_groups=3, max_groups=3)
    assert estimate_file_group_count(10 ** 12, **fixed) == 3


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_record_index_random_sequence_with_services_matches_data_and_global_simple(
        tmp_path: Path, table_type: str) -> None:
    rng = random.Random(f"rli-{table_type}")
    tables = {
        index: Table.create(str(tmp_path / index), name="t", table_type=table_type,
                            record_key="key", precombine="ts", partition_by=["region"],
                            options={**OPTIONS, "hoodie.index.type": index})
        for index in ("RECORD_INDEX", "GLOBAL_SIMPLE")}
    table = tables["RECORD_INDEX"]
    oracles = {index: Oracle() for index in tables}
    oracle, counter = oracles["RECORD_INDEX"], [0]
    done: dict[str, int] = {}
    for step in range(16):
        where = f"step {step}"
        roll = rng.random()
        if roll < 0.15 and oracle.rows:
            victims = rng.sample(sorted(oracle.rows), k=min(len(oracle.rows), 6))
            data = pa.table({"key": victims,
                             "region": [oracle.rows[k]["region"] for k in victims]})
            for index, t in tables.items():
                t.delete(data)
                oracles[index].delete(victims)
            done["delete"] = done.get("delete", 0) + 1
        elif roll < 0.7 or not oracle.rows:
            batch = random_batch(rng, oracle, counter, rng.randint(1, 40))
            keys = pa.array([r["key"] for r in batch] + ["absent"], pa.string())
            parts = pa.array([r["region"] for r in batch] + ["north"], pa.string())
            by_simple, by_index = _tags(table, keys, parts)
            located = ["row", "loc_partition", "loc_file_id"]
            assert by_index.select(located).equals(by_simple.select(located)), where
            # The stored ordering value comes along for the keys that move partition (and
            # may for a key of the batch that also moves elsewhere), as GLOBAL_SIMPLE reads it.
            moves = [r["loc_partition"] is not None
                     and r["loc_partition"] != parts[r["row"]].as_py()
                     for r in by_simple.to_pylist()]
            for simple_row, index_row, moved in zip(by_simple.to_pylist(), by_index.to_pylist(),
                                                    moves, strict=True):
                got = index_row.get("loc_ordering")
                assert got == simple_row.get("loc_ordering") or (got is None and not moved), where
            data = pa.Table.from_pylist(batch, schema=SCHEMA)
            done["moves"] = done.get("moves", 0) + sum(
                1 for r in batch if r["key"] in oracle.rows
                and oracle.rows[r["key"]]["region"] != r["region"])
            for index, t in tables.items():
                oracles[index].upsert(batch, t.upsert(data))
        elif roll < 0.8 and table_type == "MERGE_ON_READ":
            done["compact"] = done.get("compact", 0) + sum(
                len(t.compact().completed) for t in tables.values())
        elif roll < 0.9:
            done["cluster"] = done.get("cluster", 0) + sum(
                len(t.cluster().completed) for t in tables.values())
        else:
            for t in tables.values():
                t.clean()
        _assert_index_matches_data(table, where)
        for index, t in tables.items():
            assert sorted_rows(t.read(), COLUMNS) == oracles[index].snapshot(), where
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == oracle.snapshot()
    assert done.get("cluster", 0) > 0 and done.get("delete", 0) > 0, done
    assert done.get("moves", 0) > 0, done
    mdt = MetadataTable(table.storage, table.config)
    assert any(f.partition_path == RECORD_INDEX
               for f in list_table_files(mdt.storage).base_files), "MDT compacted"


@pytest.mark.parametrize("version", ["8", "9"])
def test_record_index_built_for_existing_table_points_at_base_instants(
        tmp_path: Path, version: str) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by=["region"],
                         options={"hoodie.index.type": "GLOBAL_SIMPLE",
                                  "hoodie.write.table.version": version})
    assert table.config.version == int(version)
    rng, oracle, counter = random.Random(3), Oracle(), [0]
    for _ in range(4):
        batch = random_batch(rng, oracle, counter, 30)
        oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA)))
    assert RECORD_INDEX not in declared_partitions(table.storage)
    enabled = Table.open(table.path, {"hoodie.metadata.record.index.enable": "true"})
    batch = random_batch(rng, oracle, counter, 10)
    oracle.upsert(batch, enabled.upsert(pa.Table.from_pylist(batch, schema=SCHEMA)))
    assert RECORD_INDEX in declared_partitions(table.storage)
    # its definition as Hudi 1.1 writes one on version 9 (1.0 writes none on version 8)
    assert (RECORD_INDEX in index_defs.read(table.storage)) == (version == "9")
    entries = _index_entries(enabled)
    assert {k: v[:2] for k, v in entries.items()} == hudi_rs_locations(enabled.path)
    assert len(group_slices(table.storage, Timeline.load(table.storage, table.config))) == 10
    # built entries carry their slice's base instant (Java readRecordKeysFromFileSlices)
    slices = {(s.partition_path, s.file_id): s.base_instant for s in enabled.file_slices()}
    built = {k: v for k, v in entries.items() if k not in {r["key"] for r in batch}}
    assert all(ms == instant_to_epoch_ms(slices[(p, f)]) for p, f, ms in built.values())
    # a writer that does not mention the option keeps it; one that disables it drops it
    Table.open(table.path).upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
    assert RECORD_INDEX in declared_partitions(table.storage)
    Table.open(table.path, {"hoodie.metadata.record.index.enable": "false"}).upsert(
        pa.Table.from_pylist(batch, schema=SCHEMA))
    assert RECORD_INDEX not in declared_partitions(table.storage)
    assert not MetadataTable(table.storage, table.config).storage.exists(RECORD_INDEX)
    assert RECORD_INDEX not in index_defs.read(table.storage)


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path read (whole or by ranges) or looked at (size: a kept reader is checked
    against the file's size and mtime) through Storage from now on."""
    seen: list[str] = []
    for name in ("read", "read_range", "size"):
        original = getattr(LocalStorage, name)

        def call(self: Storage, path: str, *args: Any, _original: Any = original,
                 **kwargs: Any) -> Any:
            seen.append(self.full(path))
            return _original(self, path, *args, **kwargs)

        monkeypatch.setattr(LocalStorage, name, call)
    return seen


def test_record_index_lookup_reads_only_the_groups_its_keys_hash_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts",
                         options={"hoodie.index.type": "RECORD_INDEX"})
    keys = [f"key-{i:04d}" for i in range(200)]
    table.insert(pa.table({"key": keys, "ts": [1] * 200}))
    timeline = Timeline.load(table.storage, table.config)
    wanted = ["key-0007", "key-0150", "never-written"]
    groups = {abs(ref_string_hash(k)) % 10 for k in wanted}  # doc §4.8, 10 groups
    seen = _reads(monkeypatch)
    lookup = lookup_locations(table.storage, timeline, pa.array(wanted))
    read_groups = {int(p.rsplit("/", 1)[-1].split("record-index-")[1][:4])
                   for p in seen if "/record_index/" in p}
    assert read_groups == groups and len(groups) < 10
    assert sorted(lookup.groups_read) == sorted(f"record-index-{g:04d}-0" for g in groups)
    assert sorted(lookup.locations.column("key").to_pylist()) == ["key-0007", "key-0150"]
    # an upsert through the index reads only the group its key hashes to; an update in
    # place writes nothing to the record_index, an insert writes its group's log only
    seen.clear()
    updated = table.upsert(pa.table({"key": ["key-0007"], "ts": [2]}))
    index_reads = {p.rsplit("/", 1)[-1] for p in seen if "/record_index/" in p}
    group = abs(ref_string_hash("key-0007")) % 10
    assert index_reads and all(f"record-index-{group:04d}-0" in p for p in index_reads)
    mdt = MetadataTable(table.storage, table.config).storage
    assert not [s.name for s in mdt.list_dir(RECORD_INDEX) if f"_{updated}." in s.name]
    inserted = table.upsert(pa.table({"key": ["key-new"], "ts": [1]}))
    logs = [s.name for s in mdt.list_dir(RECORD_INDEX) if f"_{inserted}." in s.name]
    new_group = abs(ref_string_hash("key-new")) % 10
    assert logs == [f".record-index-{new_group:04d}-0_{inserted}.log.1_0-0-0"]


def test_record_index_without_metadata_table_is_refused(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts",
                         options={"hoodie.index.type": "RECORD_INDEX"})
    with pytest.raises(InvalidOptionError, match=r"hoodie\.metadata\.enable"):
        Table.open(table.path, {"hoodie.metadata.enable": "false"}).upsert(
            pa.table({"key": ["a"], "ts": [1]}))


def test_record_index_shared_upserts_write_what_records_one_by_one_write(
        tmp_path: Path) -> None:
    """A write's record-index entries travel as key arrays with one shared record
    (``MetadataUpdate.add_shared``); the MDT deltacommit must write, group by group, the
    same log bytes as the same entries given one record each, and keep Hudi's rules: a key
    both upserted and deleted by one action keeps the upsert (a move), a deleted key goes,
    keys of two written files that hash to one group land in that group's one log."""
    from engine.metadata.reader import latest_group_slices, trust_all
    from engine.metadata.records import record_index_record
    from engine.metadata.update import MetadataUpdate
    from engine.metadata.writer import write_deltacommit
    from engine.timeline.instant import new_instant_time

    keys = [f"key-{i:03d}" for i in range(60)]
    tables = []
    for name in ("shared", "one-by-one"):
        table = Table.create(str(tmp_path / name), name="t", table_type="COPY_ON_WRITE",
                             record_key="key", precombine="ts",
                             options={"hoodie.index.type": "RECORD_INDEX"})
        table.insert(pa.table({"key": keys, "ts": [1] * 60}))
        tables.append(table)
    before = [_index_entries(table) for table in tables]
    # two written files; every key of file B hashes to the group of file A's first key
    group = abs(ref_string_hash("new-000")) % 10
    same_group = [k for k in (f"new-{i:03d}" for i in range(1, 400))
                  if abs(ref_string_hash(k)) % 10 == group][:5]
    moved, deleted, absent = "key-007", "key-011", "never-written"
    file_a = ["new-000", moved, "new-001", "new-002"]
    instant = new_instant_time(max(MetadataTable(t.storage, t.config).timeline()
                                   .latest_instant_time() for t in tables))
    record_a = record_index_record(file_a[0], "", "file-a", instant)
    record_b = record_index_record(same_group[0], "", "file-b", instant)
    shared = MetadataUpdate()
    shared.add_shared(RECORD_INDEX, pa.array(file_a), record_a)
    shared.add_shared(RECORD_INDEX, pa.array(same_group), record_b)
    shared.add_shared(RECORD_INDEX, pa.array([], pa.string()), record_b)  # nothing
    shared.delete(RECORD_INDEX, [moved, deleted, absent])
    one_by_one = MetadataUpdate()
    one_by_one.add(RECORD_INDEX, shared.records(RECORD_INDEX))
    one_by_one.delete(RECORD_INDEX, [moved, deleted, absent])
    assert len(shared.records(RECORD_INDEX)) == len(file_a) + len(same_group)
    logs = []
    for table, update, entries in zip(tables, (shared, one_by_one), before, strict=True):
        mdt = MetadataTable(table.storage, table.config)
        write_deltacommit(mdt, mdt.timeline(), instant, update)
        written = sorted(s.name for s in mdt.storage.list_dir(RECORD_INDEX)
                         if f"_{instant}." in s.name)
        logs.append({n: mdt.storage.read(f"{RECORD_INDEX}/{n}") for n in written})
        merged: dict[str, tuple[str, str]] = {}
        for piece in latest_group_slices(mdt, mdt.timeline(), trust_all, RECORD_INDEX):
            for key, record in read_slice(mdt.storage, piece).items():
                info = record.payload
                assert isinstance(info, RecordIndexInfo)
                merged[key] = (info.partition_name or "", info.location_file_id)
        expected = {k: v[:2] for k, v in entries.items() if k != deleted}
        expected |= {k: ("", "file-a") for k in file_a}
        expected |= {k: ("", "file-b") for k in same_group}
        assert merged == expected, table.path
    assert logs[0] == logs[1]
    assert f".record-index-{group:04d}-0_{instant}.log.1_0-0-0" in logs[0]


def test_record_index_kept_key_indexes_after_moves_deletes_rollback_and_mdt_compaction_equal_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lookups through the key indexes a process keeps (``cache_bytes``) equal the locations
    hudi-rs reads from the data files, after the table changed under a warm cache: keys moved
    to other partitions, deleted (the record_index's tombstones), a writer that died after
    its MDT deltacommit and was rolled back, and an MDT compaction; random keys, absent ones
    included."""
    from engine.metadata import reader as mdt_reader
    from engine.metadata import sync

    monkeypatch.setattr(sync, "MAX_DELTA_COMMITS", 4)
    options = {**OPTIONS, "hoodie.index.type": "RECORD_INDEX",
               "hoodie.metadata.record.index.min.filegroup.count": "2"}
    table = Table.create(str(tmp_path / "t"), name="t", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by=["region"],
                         options=options)
    rng = random.Random(8)
    regions = ["north", "south", "east"]
    rows = [{"key": f"k{n:05d}", "ts": 1, "region": rng.choice(regions), "amount": 1.0,
             "note": "first"} for n in range(600)]
    table.bulk_insert(pa.Table.from_pylist(rows, schema=SCHEMA))
    keys = [r["key"] for r in rows]
    budget = 1 << 26
    mdt_reader.drop_key_indexes()

    def check(where: str) -> None:
        wanted = sorted(rng.sample(keys, 400) + [f"absent-{i}" for i in range(50)])
        timeline = Timeline.load(table.storage, table.config)
        found = lookup_locations(table.storage, timeline, pa.array(wanted),
                                 cache_bytes=budget).locations
        got = dict(zip(found.column("key").to_pylist(),
                       zip(found.column("loc_partition").to_pylist(),
                           found.column("loc_file_id").to_pylist(), strict=True),
                       strict=True))
        truth = hudi_rs_locations(table.path)
        assert got == {k: truth[k] for k in wanted if k in truth}, where

    check("warm-up")
    assert mdt_reader.key_indexes_kept()[0] >= 2  # the hostile part: the cache holds them
    moved = rng.sample(keys, 60)
    table.upsert(pa.Table.from_pylist(
        [{"key": k, "ts": 2, "region": "west", "amount": 2.0, "note": "moved"} for k in moved]
        + [{"key": f"n{n:04d}", "ts": 2, "region": "north", "amount": 2.0, "note": "new"}
           for n in range(100)], schema=SCHEMA))
    keys += [f"n{n:04d}" for n in range(100)]
    check("after moves")
    table.delete(pa.Table.from_pylist([{"key": k} for k in rng.sample(keys, 80)]))
    check("after deletes")

    with writer_dies_at_the_data_commit():
        table.upsert(pa.Table.from_pylist(
            [{"key": k, "ts": 3, "region": "south", "amount": 3.0, "note": "lost"}
             for k in rng.sample(keys, 100)], schema=SCHEMA))
    check("after a writer died past its MDT deltacommit")
    table = Table.open(table.path, {**options, "hoodie.write.concurrency.mode": "SINGLE_WRITER"})
    assert len(table.rollback_failed_writes()) == 1
    check("after its rollback")
    for step in range(4):
        table.upsert(pa.Table.from_pylist(
            [{"key": k, "ts": 4 + step, "region": rng.choice(regions), "amount": 4.0,
              "note": "again"} for k in rng.sample(keys, 120)], schema=SCHEMA))
    timeline = Timeline.load(table.storage, table.config)
    assert any(p.base_path for p in group_slices(table.storage, timeline))  # MDT compacted
    check("after the MDT compaction")
