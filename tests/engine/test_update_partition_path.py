"""``hoodie.{simple,bloom,record}.index.update.partition.path``: what a global index does with
an update whose partition value changed (Hudi's ``HoodieIndexConfig``;
``HoodieIndexUtils.tagGlobalLocationBackToRecords``).

``true``: the record moves — its old copy is deleted and it is inserted into its new
partition. ``false``: the record is updated where the table stores it — its
``_hoodie_partition_path`` stays the stored one, its columns are the incoming row's (the
partition column included, as Java writes it).

Judged after every step by the plain oracle (the rows) and a plain dict of where each key
lives (the partition: the first one it was written to under ``false``, its latest under
``true``), read by tidelake and by hudi-rs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import InvalidOptionError, Table
from engine.config import IndexType, WriteConfig
from engine.merge.policy import update_partition_path
from tests.helpers import Oracle, hudi_rs_read, sorted_rows

COLUMNS = ("id", "ts", "city", "fare")
KEY_OPTION = {"GLOBAL_SIMPLE": "hoodie.simple.index.update.partition.path",
              "GLOBAL_BLOOM": "hoodie.bloom.index.update.partition.path",
              "RECORD_INDEX": "hoodie.record.index.update.partition.path"}


class Placement:
    """key → the partition its live copy is stored in, by the rule written plainly."""

    def __init__(self, moves: bool) -> None:
        self.moves = moves
        self.where: dict[str, str] = {}
        self.ts: dict[str, int] = {}

    def upsert(self, rows: list[dict[str, Any]]) -> None:
        latest: dict[str, dict[str, Any]] = {}
        for row in rows:  # in-batch: the greatest ordering value (later on a tie)
            if row["id"] not in latest or row["ts"] >= latest[row["id"]]["ts"]:
                latest[row["id"]] = row
        for key, row in latest.items():
            if key in self.ts and row["ts"] < self.ts[key]:
                continue  # loses to the stored version: nothing is written
            self.ts[key] = row["ts"]
            if key not in self.where or self.moves:
                self.where[key] = row["city"]

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            self.where.pop(key, None)
            self.ts.pop(key, None)


def _create(tmp_path: Path, table_type: str, index: str, value: str | None) -> Table:
    options = {"hoodie.index.type": index, "hoodie.parquet.small.file.limit": "1"}
    if value is not None:
        options[KEY_OPTION[index]] = value
    return Table.create(str(tmp_path / "t"), name="t", table_type=table_type, record_key="id",
                        precombine="ts", partition_by=["city"], options=options)


def _check(table: Table, oracle: Oracle, placement: Placement, step: str) -> None:
    expected = sorted_rows(oracle.snapshot(), COLUMNS, key="id")
    ours, theirs = table.read(), hudi_rs_read(table.path)
    assert sorted_rows(ours, COLUMNS, key="id") == expected, step
    assert sorted_rows(theirs, COLUMNS, key="id") == expected, f"{step} (hudi-rs)"
    for read in (ours, theirs):
        where = dict(zip(read.column("_hoodie_record_key").to_pylist(),
                         read.column("_hoodie_partition_path").to_pylist(), strict=True))
        assert where == placement.where, step
        assert read.num_rows == len(placement.where), f"{step}: a key stored twice"
    # Reads by key (the record index, footers and column stats prune) find the same rows.
    for key in ("a", "b", "d"):
        by_key = table.read(filters=[("id", "=", key)])
        assert sorted_rows(by_key, COLUMNS, key="id") == \
            [r for r in expected if r["id"] == key], f"{step}: read of {key}"


def _rows(*rows: tuple[str, int, str, float]) -> list[dict[str, Any]]:
    return [dict(zip(COLUMNS, row, strict=True)) for row in rows]


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
@pytest.mark.parametrize("index", ["GLOBAL_SIMPLE", "GLOBAL_BLOOM", "RECORD_INDEX"])
@pytest.mark.parametrize("value", ["true", "false"])
def test_update_partition_path_each_value_each_global_index_equals_oracle_and_hudi_rs(
        tmp_path: Path, table_type: str, index: str, value: str) -> None:
    table = _create(tmp_path, table_type, index, value)
    oracle, placement = Oracle(key="id"), Placement(moves=value == "true")

    def upsert(rows: list[dict[str, Any]], step: str) -> None:
        table.upsert(pa.Table.from_pylist(rows))
        oracle.upsert(rows)
        placement.upsert(rows)
        _check(table, oracle, placement, step)

    upsert(_rows(("a", 1, "x", 1.0), ("b", 1, "x", 1.0), ("c", 1, "y", 1.0)), "insert")
    # a re-partitioned key, a key updated in its own partition, a new key
    upsert(_rows(("a", 2, "y", 2.0), ("c", 2, "y", 2.0), ("d", 1, "z", 1.0)), "a to y")
    # the same key re-partitioned again (under false: still updated where it is stored);
    # two versions of one key in the batch, in two partitions (global: one survives)
    upsert(_rows(("a", 3, "z", 3.0), ("b", 3, "y", 3.0), ("b", 2, "z", 2.5)), "a to z, b")
    # a late version in another partition loses to the stored one: nothing moves
    upsert(_rows(("b", 0, "x", 9.0), ("d", 2, "z", 2.0)), "late b")
    # a delete that names the key's new partition value: the key is found where it lives
    table.delete(pa.table({"id": ["a"], "city": ["z"]}))
    oracle.delete(["a"])
    placement.delete(["a"])
    _check(table, oracle, placement, "delete a")
    # a delete by key alone, then the key written again: a new key, in its own partition
    table.delete(pa.table({"id": ["b"]}))
    oracle.delete(["b"])
    placement.delete(["b"])
    upsert(_rows(("b", 5, "x", 5.0)), "b again")
    if table_type == "MERGE_ON_READ":
        table.compact()
        _check(table, oracle, placement, "compacted")


@pytest.mark.parametrize("index", ["GLOBAL_SIMPLE", "GLOBAL_BLOOM", "RECORD_INDEX"])
def test_update_partition_path_default_moves_the_key(tmp_path: Path, index: str) -> None:
    """tidelake's default is ``true`` for all three (Java's is ``false`` for RECORD_INDEX:
    docs/engine.md, "Differences from Hudi's Java writer, on purpose")."""
    table = _create(tmp_path, "MERGE_ON_READ", index, None)
    table.upsert(pa.Table.from_pylist(_rows(("a", 1, "x", 1.0))))
    table.upsert(pa.Table.from_pylist(_rows(("a", 2, "y", 2.0))))
    read = hudi_rs_read(table.path)
    assert read.column("_hoodie_partition_path").to_pylist() == ["y"]


def test_update_partition_path_option_follows_the_index_type() -> None:
    keep = {KEY_OPTION["RECORD_INDEX"]: "false", KEY_OPTION["GLOBAL_BLOOM"]: "false"}
    by_index = {index: update_partition_path(WriteConfig.from_options(
        {"hoodie.index.type": index.value, **keep})) for index in IndexType}
    assert by_index == {IndexType.GLOBAL_SIMPLE: True, IndexType.GLOBAL_BLOOM: False,
                        IndexType.RECORD_INDEX: False, IndexType.SIMPLE: True,
                        IndexType.BLOOM: True, IndexType.BUCKET: True}


@pytest.mark.parametrize("key", sorted(KEY_OPTION.values()))
def test_update_partition_path_bad_value_names_the_option(tmp_path: Path, key: str) -> None:
    with pytest.raises(InvalidOptionError, match=key.replace(".", r"\.")) as refused:
        Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts",
                     partition_by=["city"], options={key: "sometimes"})
    assert "expected true or false, got 'sometimes'" in str(refused.value)


def test_update_partition_path_false_row_is_missed_by_partition_filters(tmp_path: Path) -> None:
    """The cost of ``false`` that docs/engine.md states (why tidelake's RECORD_INDEX default
    stays ``true``): the row's partition column disagrees with its folder, so a filter on the
    partition column prunes it away under either value — ours and hudi-rs's reads alike."""
    from hudi import HudiReadOptions, HudiTableBuilder

    table = _create(tmp_path, "COPY_ON_WRITE", "RECORD_INDEX", "false")
    table.upsert(pa.Table.from_pylist(_rows(("a", 1, "x", 1.0))))
    table.upsert(pa.Table.from_pylist(_rows(("a", 2, "y", 2.0))))
    stored = table.read(columns=["id", "city", "_hoodie_partition_path"]).to_pylist()
    assert stored == [{"id": "a", "city": "y", "_hoodie_partition_path": "x"}]
    rs = HudiTableBuilder.from_base_uri(table.path).build()
    for city in ("x", "y"):
        assert table.read(filters=[("city", "=", city)]).num_rows == 0
        batches = rs.read(HudiReadOptions().with_filters([("city", "=", city)]))
        assert sum(b.num_rows for b in batches or []) == 0
