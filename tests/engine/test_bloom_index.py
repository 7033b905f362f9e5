"""Bloom filters sized to their file, and the BLOOM / GLOBAL_BLOOM indexes.

The indexes must find exactly what SIMPLE / GLOBAL_SIMPLE find, for any input: checked step
by step on random write sequences (tagging both ways on the same snapshot), besides the
differential test's oracle and hudi-rs runs (``test_differential.py``). Pruning is checked
on counts of slices read, never on time.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import Table
from engine.format.base_file import read_footer_keys, write_base_file
from engine.format.bloom import BloomFilter, BloomSizing, bit_size
from engine.index import bloom, simple
from engine.layout.view import TableView
from tests.engine.helpers import COLUMNS, SCHEMA, random_batch
from tests.helpers import Oracle, hudi_rs_read, sorted_rows

META = ["_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key",
        "_hoodie_partition_path", "_hoodie_file_name"]
NAME = "f1-0_0-0-0_20240101000000000.parquet"


def _base_table(keys: list[str]) -> pa.Table:
    n = len(keys)
    return pa.table({
        "_hoodie_commit_time": ["20240101000000000"] * n,
        "_hoodie_commit_seqno": [f"s{i}" for i in range(n)],
        "_hoodie_record_key": keys,
        "_hoodie_partition_path": [""] * n,
        "_hoodie_file_name": [NAME] * n,
        "v": list(range(n)),
    })


def _keys(n: int, prefix: str = "key") -> list[str]:
    return [f"{prefix}-{i:07d}" for i in range(n)]


# --- filters sized to the file ------------------------------------------------------------

def test_base_file_bloom_small_file_sized_to_its_keys_no_false_negatives(
        tmp_path: Path) -> None:
    keys = _keys(1000)
    write_base_file(str(tmp_path / NAME), _base_table(keys))
    footer = read_footer_keys(str(tmp_path / NAME))
    assert footer.bloom is not None
    assert footer.bloom.num_entries == 1000 and footer.bloom.num_rows == 1
    assert footer.bloom.vector_size == bit_size(1000, 1e-9)
    assert footer.bloom.might_contain_many(keys).all()
    assert not footer.bloom.might_contain_many(_keys(1000, "other")).any()
    # ~5.4 KB of filter where Hudi's fixed sizing writes 323 KB (Base64: 431 KB)
    raw = pq.read_metadata(tmp_path / NAME).metadata[b"org.apache.hudi.bloomfilter"]
    assert len(raw) < len(BloomFilter.create().serialize()) // 50


def test_base_file_bloom_big_file_capped_rows_grow_as_java(tmp_path: Path) -> None:
    keys = _keys(300)
    sizing = BloomSizing(num_entries=100, fpp=1e-3, max_entries=250)
    write_base_file(str(tmp_path / NAME), _base_table(keys), bloom_sizing=sizing)
    footer = read_footer_keys(str(tmp_path / NAME))
    assert footer.bloom is not None
    assert footer.bloom.num_entries == 100 and footer.bloom.num_rows == 3
    java = BloomFilter.create(100, 1e-3, 250)  # Java's filter: always sized for num_entries
    java.add_many(keys)
    assert footer.bloom.serialize() == java.serialize()
    assert footer.bloom.might_contain_many(keys).all()


def test_bloom_sizing_extend_keeps_fitting_filter_rebuilds_outgrown_or_oversized() -> None:
    sizing = BloomSizing(num_entries=1000, fpp=1e-6, max_entries=3000)
    old = sizing.filter_for(pa.array(_keys(100)))  # one row of 100
    assert sizing.extend(old, pa.array([], pa.string()), 100) is old
    assert sizing.extend(old, pa.array(_keys(1, "new")), 101) is None  # row is full
    roomy = BloomFilter.create(150, 1e-6, 3000)
    roomy.add_many(_keys(100))
    extended = sizing.extend(roomy, pa.array(_keys(50, "new")), 150)
    assert extended is roomy and roomy.num_rows == 1
    assert roomy.might_contain_many(_keys(50, "new") + _keys(100)).all()
    legacy = BloomFilter.create()  # 60,000 entries per row on a file of 100 keys: shrink
    assert sizing.extend(legacy, pa.array(_keys(1, "new")), 101) is None
    capped = sizing.filter_for(pa.array(_keys(1000)))
    grown = sizing.extend(capped, pa.array(_keys(500, "new")), 1500)
    assert grown is capped and capped.num_rows == 2  # Java's growth, up to max_entries
    assert capped.might_contain_many(_keys(500, "new") + _keys(1000)).all()


def test_cow_rewrite_filter_grows_with_file_and_hudi_rs_reads(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts",
                         options={"hoodie.index.type": "BLOOM"})
    first = _keys(10)
    table.insert(pa.table({"key": first, "ts": [1] * 10}))
    more = _keys(500, "more")
    table.insert(pa.table({"key": more, "ts": [1] * 500}))  # into the same small group
    (slc,) = table.file_slices()
    assert slc.base_file is not None
    footer = read_footer_keys(table.storage.full(slc.base_file.path))
    assert footer.bloom is not None
    assert 510 <= footer.bloom.num_entries <= 1020
    assert footer.bloom.might_contain_many(first + more).all()
    assert sorted_rows(hudi_rs_read(table.path), ["key", "ts"]) == \
        sorted_rows(table.read(), ["key", "ts"])



def test_cow_merge_rebuilds_filter_with_room_then_extends_it(tmp_path: Path) -> None:
    """A merge that outgrows its file's filter builds it for 1.5x the file's keys; the next
    merges hash only their new keys into it (same row, counter moved on), never losing one."""
    table = Table.create(str(tmp_path / "t"), name="t", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts",
                         options={"hoodie.index.type": "SIMPLE"})
    first, second, third = _keys(1000), _keys(100, "b"), _keys(100, "c")

    def footer() -> BloomFilter:
        (slc,) = table.file_slices()
        assert slc.base_file is not None
        bloom_filter = read_footer_keys(table.storage.full(slc.base_file.path)).bloom
        assert bloom_filter is not None
        return bloom_filter

    table.insert(pa.table({"key": first, "ts": [1] * 1000}))
    assert footer().num_entries == 1000  # the first file: sized for its own keys
    # 100 updates (one with a lower ts: the old row stays) and 100 inserts: the row is full
    table.upsert(pa.table({"key": first[:100] + second, "ts": [0] + [2] * 199}))
    rebuilt = footer()
    assert (rebuilt.num_entries, rebuilt.current_nb_record, rebuilt.num_rows) == (1650, 1100, 1)
    table.upsert(pa.table({"key": third + first[500:550], "ts": [3] * 150}))
    extended = footer()
    assert (extended.num_entries, extended.current_nb_record, extended.num_rows) == (1650, 1200, 1)
    assert extended.might_contain_many(first + second + third).all()
    assert not extended.might_contain_many(_keys(1000, "absent")).any()
    assert sorted_rows(hudi_rs_read(table.path), ["key", "ts"]) == \
        sorted_rows(table.read(), ["key", "ts"])


# --- the index: same result as SIMPLE, fewer files read -------------------------------------

def _lookups(table: Table, keys: pa.Array, parts: pa.Array, global_index: bool, *,
             mdt: bool = False) -> tuple[pa.Table, pa.Table, bloom.BloomLookup]:
    """Tagging of (keys, parts) on the table's snapshot by the simple and bloom lookups
    (``mdt``: the bloom lookup takes filters from the metadata table)."""
    view = TableView.load(table.storage, table.config)
    reader, slices = view.slice_reader(), view.latest_file_slices()
    wanted = None if global_index else set(parts.to_pylist())
    by_simple = simple.key_locations(reader, slices, wanted)
    source = bloom.MetadataSource.of(table.storage, view.timeline) if mdt else None
    assert (source is not None) == mdt
    lookup = bloom.key_locations(reader, slices, wanted, keys, metadata=source)
    return (simple.tag(keys, parts, by_simple, global_index=global_index),
            simple.tag(keys, parts, lookup.locations, global_index=global_index), lookup)


def _assert_same_tags(by_bloom: pa.Table, by_simple: pa.Table) -> None:
    """Equal tags; a ``loc_ordering`` column only one side has (the bloom lookup read no
    slice, the simple one read some without a match) must be all null, as none was found."""
    common = [c for c in by_simple.column_names if c in by_bloom.column_names]
    assert by_bloom.select(common).equals(by_simple.select(common))
    for extra in {*by_simple.column_names, *by_bloom.column_names} - set(common):
        side = by_simple if extra in by_simple.column_names else by_bloom
        assert side.column(extra).null_count == side.num_rows


@pytest.mark.parametrize("mdt", [False, True], ids=["footers", "mdt"])
@pytest.mark.parametrize("index", ["BLOOM", "GLOBAL_BLOOM"])
@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_bloom_tagging_random_sequence_equals_simple_and_oracle(
        tmp_path: Path, table_type: str, index: str, mdt: bool) -> None:
    rng = random.Random(f"{table_type}{index}")
    through_mdt = ({"hoodie.metadata.index.bloom.filter.enable": "true",
                    "hoodie.bloom.index.use.metadata": "true"} if mdt else {})
    table = Table.create(str(tmp_path / "t"), name="t", table_type=table_type,
                         record_key="key", precombine="ts", partition_by=["region"],
                         options={"hoodie.index.type": index, **through_mdt,
                                  # several file groups per partition
                                  "hoodie.parquet.max.file.size": "12000",
                                  "hoodie.parquet.small.file.limit": "8000",
                                  "hoodie.copyonwrite.record.size.estimate": "400"})
    oracle = Oracle()
    counter = [0]
    pruned = groups = 0
    for step in range(10):
        batch = random_batch(rng, oracle, counter, rng.randint(1, 50))
        if not index.startswith("GLOBAL_"):
            for row in batch:  # only a global index moves a key to another partition
                if row["key"] in oracle.rows:
                    row["region"] = oracle.rows[row["key"]]["region"]
        keys = pa.array([r["key"] for r in batch] + ["absent-key"], pa.string())
        parts = pa.array([r["region"] for r in batch] + ["north"], pa.string())
        for global_index in (False, True):
            by_simple, by_bloom, lookup = _lookups(table, keys, parts, global_index,
                                                   mdt=mdt and step > 0)
            _assert_same_tags(by_bloom, by_simple)
            pruned += lookup.pruned_by_range + lookup.pruned_by_bloom
            groups += lookup.metadata_groups
        if oracle.rows and rng.random() < 0.25:
            victims = rng.sample(sorted(oracle.rows), k=min(len(oracle.rows), 5))
            table.delete(pa.table({"key": victims,
                                   "region": [oracle.rows[k]["region"] for k in victims]}))
            oracle.delete(victims)
        else:
            instant = table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
            oracle.upsert(batch, instant)
    assert sorted_rows(table.read(), COLUMNS) == oracle.snapshot()
    assert pruned > 0  # the sequence did exercise pruning
    assert (groups > 0) == mdt  # and, with the MDT, bloom_filters lookups


def _bulk_ranges(tmp_path: Path, table_type: str) -> Table:
    """Four base files of one partition, keys r<i>-<even number>: disjoint ranges."""
    table = Table.create(str(tmp_path / "t"), name="t", table_type=table_type,
                         record_key="key", precombine="ts",
                         options={"hoodie.index.type": "BLOOM"})
    for i in range(4):
        table.bulk_insert(pa.table({"key": [f"r{i}-{j:04d}" for j in range(0, 400, 2)],
                                    "ts": [1] * 200}))
    return table


def test_bloom_lookup_prunes_by_range_then_filter_reads_only_holders(tmp_path: Path) -> None:
    table = _bulk_ranges(tmp_path, "COPY_ON_WRITE")
    one = pa.array(["r2-0010", "r2-0100"])
    *_, lookup = _lookups(table, one, pa.array(["", ""]), False)
    assert (lookup.slices, lookup.pruned_by_range, lookup.pruned_by_bloom, lookup.read) == \
        (4, 3, 0, 1)
    assert sorted(lookup.locations.column("key").to_pylist()) == ["r2-0010", "r2-0100"]
    # inside file 1's range, but never written (odd numbers): the filter rules it out
    gap = pa.array(["r1-0011"])
    *_, lookup = _lookups(table, gap, pa.array([""]), False)
    assert (lookup.pruned_by_range, lookup.pruned_by_bloom, lookup.read) == (3, 1, 0)
    assert lookup.locations.num_rows == 0
    view = TableView.load(table.storage, table.config)
    unranged = bloom.key_locations(view.slice_reader(), view.latest_file_slices(), None, one,
                                   prune_by_ranges=False)
    assert (unranged.pruned_by_range, unranged.pruned_by_bloom, unranged.read) == (0, 3, 1)


def test_bloom_lookup_mor_slices_with_logs_read_whole(tmp_path: Path) -> None:
    table = _bulk_ranges(tmp_path, "MERGE_ON_READ")
    table.upsert(pa.table({"key": ["r0-0000", "r3-0002"], "ts": [2, 2]}))  # logs in 2 groups
    table.delete(pa.table({"key": ["r3-0002"]}))
    keys = pa.array(["r0-0000", "r1-0002", "r3-0002"])
    by_simple, by_bloom, lookup = _lookups(table, keys, pa.array([""] * 3), True)
    _assert_same_tags(by_bloom, by_simple)
    assert (lookup.slices, lookup.with_logs, lookup.read) == (4, 2, 1)
    found = dict(zip(by_bloom.column("row").to_pylist(),
                     by_bloom.column("loc_file_id").to_pylist(), strict=True))
    assert found[0] is not None and found[1] is not None and found[2] is None  # deleted


def test_bloom_lookup_range_in_java_string_order_finds_astral_keys(tmp_path: Path) -> None:
    # UTF-8 puts U+1F600 after U+FF61; Java's UTF-16 order puts it before (surrogates).
    astral, high = "x\U0001f600", "x\uff61"
    table = Table.create(str(tmp_path / "t"), name="t", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts",
                         options={"hoodie.index.type": "BLOOM"})
    table.bulk_insert(pa.table({"key": [astral, high], "ts": [1, 1]}))
    for key in (astral, high):
        *_, lookup = _lookups(table, pa.array([key]), pa.array([""]), False)
        assert lookup.locations.column("key").to_pylist() == [key]
    table.upsert(pa.table({"key": [astral], "ts": [5]}))
    assert sorted_rows(table.read(), ["key", "ts"]) == [{"key": high, "ts": 1},
                                                        {"key": astral, "ts": 5}]
