"""Key-equality reads through the record index: a snapshot read whose filter pins record keys
reads only the file groups the ``record_index`` locates them in.

Checked against the oracle and the same read with the filter given as an expression (never
pruned by keys), on random tables with moves, deletes, compaction and clustering; the slices
read are counted (``Table.explain`` and the reader's own calls) against the groups hudi-rs
finds the keys in.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from engine.read.reader import to_expression
from engine.read.slice_reader import SliceReader
from tests.engine.helpers import COLUMNS, SCHEMA, hudi_rs_locations, random_batch
from tests.helpers import Oracle, sorted_rows

OPTIONS = {
    "hoodie.index.type": "RECORD_INDEX",
    "hoodie.clean.automatic": "false",
    "hoodie.archive.automatic": "false",
    # several file groups per partition, so a key's group is one of many
    "hoodie.parquet.max.file.size": "12000",
    "hoodie.parquet.small.file.limit": "8000",
    "hoodie.copyonwrite.record.size.estimate": "400",
    "hoodie.metadata.record.index.min.filegroup.count": "4",
}


def _oracle_rows(oracle: Oracle, keys: set[str]) -> list[dict[str, Any]]:
    return [r for r in oracle.snapshot() if r["key"] in keys]


def _slices_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """File ids of every slice SliceReader.read_slice reads from now on."""
    seen: list[str] = []
    original = SliceReader.read_slice

    def read_slice(self: SliceReader, slc: Any, **kwargs: Any) -> pa.Table:
        seen.append(slc.file_id)
        return original(self, slc, **kwargs)

    monkeypatch.setattr(SliceReader, "read_slice", read_slice)
    return seen


def _key_filters(rng: random.Random, oracle: Oracle, gone: list[str]
                 ) -> list[tuple[list[Any], set[str]]]:
    """Filters pinning keys (live, deleted, never written), each with the keys it pins."""
    live = sorted(oracle.rows)
    pick = rng.sample(live, min(3, len(live)))
    absent = [rng.choice(gone)] if gone else ["never-written"]
    out: list[tuple[list[Any], set[str]]] = []
    if pick:
        out.append(([("key", "=", pick[0])], {pick[0]}))
        out.append(([("_hoodie_record_key", "=", pick[-1])], {pick[-1]}))
        out.append(([[("key", "=", pick[0])], [("_hoodie_record_key", "in", pick[1:])]],
                    set(pick)))
        # a key term and a term on another column: the index prunes, the read filters
        region = oracle.rows[pick[0]]["region"]
        out.append(([("key", "in", pick), ("region", "=", region)], set(pick)))
    out.append(([("key", "in", [*pick, *absent])], {*pick, *absent}))
    out.append(([("key", "=", absent[0])], {absent[0]}))
    return out


@pytest.mark.parametrize(("table_type", "seed"),
                         [("COPY_ON_WRITE", 1), ("MERGE_ON_READ", 2), ("MERGE_ON_READ", 3)])
def test_key_filter_read_random_tables_pruned_equals_unpruned_and_oracle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table_type: str, seed: int) -> None:
    rng = random.Random(f"keyread-{table_type}-{seed}")
    options = dict(OPTIONS)
    if seed == 3:
        options["hoodie.logfile.data.block.format"] = "avro"
    table = Table.create(str(tmp_path / "t"), name="t", table_type=table_type,
                         record_key="key", precombine="ts", partition_by=["region"],
                         options=options)
    oracle, counter, gone = Oracle(), [0], []
    done = {"moves": 0, "pruned": 0, "logs": 0}
    seen = _slices_read(monkeypatch)
    for step in range(8):
        roll = rng.random()
        if step > 2 and roll < 0.2:
            victims = rng.sample(sorted(oracle.rows), k=min(len(oracle.rows), 5))
            table.delete(pa.table({"key": victims,
                                   "region": [oracle.rows[k]["region"] for k in victims]}))
            oracle.delete(victims)
            gone += victims
        elif step > 2 and roll < 0.3 and table_type == "MERGE_ON_READ":
            table.compact()
        elif step > 2 and roll < 0.4:
            table.cluster()
        else:
            batch = random_batch(rng, oracle, counter, rng.randint(10, 60))
            done["moves"] += sum(1 for r in batch if r["key"] in oracle.rows
                                 and oracle.rows[r["key"]]["region"] != r["region"])
            oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA)))
        where = f"step {step}"
        groups = hudi_rs_locations(table.path)
        done["logs"] += sum(1 for s in table.file_slices() if s.log_files)
        for filters, keys in _key_filters(rng, oracle, gone):
            seen.clear()
            pruned = table.read(filters=filters)
            read = len(seen)
            unpruned = table.read(filters=to_expression(filters))
            assert sorted_rows(pruned, COLUMNS) == sorted_rows(unpruned, COLUMNS), where
            expected = sorted_rows(unpruned, COLUMNS)
            wanted = _oracle_rows(oracle, keys)
            region = next((t[2] for t in filters if isinstance(t, tuple) and t[0] == "region"),
                          None)
            if region is not None:  # its partition alone is read: pruned by partition value
                keys = {k for k in keys if k in oracle.rows
                        and oracle.rows[k]["region"] == region}
                wanted = [r for r in wanted if r["region"] == region]
            assert expected == wanted, (where, filters)
            holding = {groups[k] for k in keys if k in groups}
            report = table.explain(filters)
            assert report["slices_read"] == read == len(holding), (where, filters)
            assert report["slices_pruned_by_record_index"] == report["slices"] - read
            done["pruned"] += report["slices_pruned_by_record_index"]
    assert done["moves"] > 0 and done["pruned"] > 0, done
    if table_type == "MERGE_ON_READ":
        assert done["logs"] > 0, done


def test_key_filter_read_time_travel_and_read_optimized_are_not_pruned_by_index(
        tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by=["region"],
                         options=OPTIONS)
    first = table.upsert(pa.table({"key": ["a", "b"], "ts": [1, 1], "region": ["x", "y"]}))
    table.upsert(pa.table({"key": ["a"], "ts": [2], "region": ["y"]}))  # a moves to y
    assert table.read(filters=[("key", "=", "a")]).column("region").to_pylist() == ["y"]
    assert table.explain([("key", "=", "a")])["slices_pruned_by_record_index"] == 1
    # as of the first commit, a lived in x: the index (latest) would point at y
    old = table.read(filters=[("key", "=", "a")], as_of=first)
    assert old.column("region").to_pylist() == ["x"]
    assert table.explain([("key", "=", "a")], as_of=first)["slices_pruned_by_record_index"] == 0
    # read-optimized: x's base file still shows a's first version, as an unpruned read does
    ro = table.read(filters=[("key", "=", "a")], read_optimized=True)
    ro_all = table.read(filters=to_expression([("key", "=", "a")]), read_optimized=True)
    assert sorted_rows(ro, ["key", "region"]) == sorted_rows(ro_all, ["key", "region"])
    assert ro.column("region").to_pylist() == ["x"]


def test_key_filter_read_complex_key_uses_keygen_and_needs_every_field(
        tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", table_type="MERGE_ON_READ",
                         record_key="id,name", precombine="ts",
                         options={**OPTIONS, "hoodie.index.type": "SIMPLE",
                                  "hoodie.metadata.record.index.enable": "true"})
    n = 300
    data = pa.table({"id": list(range(n)), "name": [f"n{i % 7}" for i in range(n)],
                     "ts": [1] * n})
    table.upsert(data)
    table.upsert(data.slice(0, 40).set_column(2, "ts", pa.array([2] * 40)))
    filters = [("id", "=", 12.0), ("name", "=", "n5")]  # 12.0 casts to the int column
    got = table.read(filters=filters)
    assert got.column("_hoodie_record_key").to_pylist() == ["id:12,name:n5"]
    assert got.column("ts").to_pylist() == [2]
    report = table.explain(filters)
    assert report["slices"] > 1 and report["slices_read"] == 1
    assert table.read(filters=[("_hoodie_record_key", "=", "id:12,name:n5")]).num_rows == 1
    # one key field alone does not pin a key: nothing pruned by the index
    partial = [("id", "=", 12)]
    assert table.explain(partial)["slices_pruned_by_record_index"] == 0
    assert table.read(filters=partial).num_rows == 1


def test_key_filter_read_partitioned_non_global_table_is_not_pruned_by_index(
        tmp_path: Path) -> None:
    # a non-global index keeps a key once per partition; the record_index holds one location
    table = Table.create(str(tmp_path / "t"), name="t", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by=["region"],
                         options={**OPTIONS, "hoodie.index.type": "SIMPLE",
                                  "hoodie.metadata.record.index.enable": "true"})
    table.upsert(pa.table({"key": ["a", "b"], "ts": [1, 1], "region": ["x", "y"]}))
    table.upsert(pa.table({"key": ["a"], "ts": [2], "region": ["y"]}))  # a second copy
    report = table.explain([("key", "=", "a")])
    assert report["slices_pruned_by_record_index"] == 0
    assert sorted(table.read(filters=[("key", "=", "a")]).column("region").to_pylist()) == \
        ["x", "y"]
