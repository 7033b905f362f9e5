"""The record index built and checked with the table's merge rule (issue 34, defect 1).

Building the ``record_index`` (a table gaining it, ``rebuild``) and ``metadata validate`` read
every live key of the latest slices. A merge-on-read slice is merged by the ordering field, so
the key read must carry it: without it a delete without an ordering value broke the merge
(``ArrowInvalid``) and an event-time delete was judged on nothing. Judged independently of
the engine: the decoded record_index must map every key to the group hudi-rs reads it from,
and the rows must equal the oracle's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from tests.engine.helpers import COLUMNS, SCHEMA, hudi_rs_locations, record_index_entries
from tests.helpers import Oracle, hudi_rs_read, sorted_rows

TABLE_TYPES = ["COPY_ON_WRITE", "MERGE_ON_READ"]


def _table(tmp_path: Path, table_type: str) -> Table:
    return Table.create(str(tmp_path / "t"), name="t", table_type=table_type, record_key="key",
                        precombine="ts", partition_by=["region"],
                        options={"hoodie.index.type": "RECORD_INDEX",
                                 "hoodie.compact.inline": "false"})


def _rows(keys: list[str], ts: int, region: str = "north") -> list[dict[str, Any]]:
    return [{"key": k, "ts": ts, "region": region, "amount": float(ts), "note": k}
            for k in keys]


def _upsert(table: Table, oracle: Oracle, rows: list[dict[str, Any]]) -> None:
    oracle.upsert(rows, table.upsert(pa.Table.from_pylist(rows, schema=SCHEMA)))


def _assert_index_right(table: Table, oracle: Oracle, where: str) -> None:
    """validate is clean, the decoded index equals hudi-rs's locations, both readers equal
    the oracle, and a key-filtered read of every key ever written equals the full read's."""
    result = table.validate_metadata()
    assert result.ok, (where, [str(d) for d in result.differences])
    assert result.keys_checked == len(oracle.rows), where
    assert record_index_entries(table) == hudi_rs_locations(table.path), where
    assert sorted_rows(table.read(), COLUMNS) == oracle.snapshot(), where
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == oracle.snapshot(), where
    for key in [f"k{i}" for i in range(8)]:
        got = sorted_rows(table.read(filters=[("key", "=", key)]), COLUMNS)
        assert got == [r for r in oracle.snapshot() if r["key"] == key], (where, key)


@pytest.mark.parametrize("table_type", TABLE_TYPES)
def test_record_index_delete_without_ordering_validate_rebuild_and_next_write_hold(
        tmp_path: Path, table_type: str) -> None:
    table, oracle = _table(tmp_path, table_type), Oracle()
    _upsert(table, oracle, _rows([f"k{i}" for i in range(6)], 10))
    # Table.delete without an ordering column: a natural-order delete block on MERGE_ON_READ
    table.delete(pa.table({"key": ["k1"], "region": ["north"]}))
    oracle.delete(["k1"])
    # a partition move: the old copy's delete (natural order) in north, the key in south
    _upsert(table, oracle, _rows(["k2"], 11, region="south"))
    _assert_index_right(table, oracle, "after the delete and the move")
    table.rebuild_metadata()
    _assert_index_right(table, oracle, "after rebuild")
    # the next RECORD_INDEX writes read the rebuilt index (and a new table's build)
    _upsert(table, oracle, _rows(["k3", "k7"], 12) + _rows(["k2"], 13, region="north"))
    table.delete(pa.table({"key": ["k4"], "region": ["north"]}))
    oracle.delete(["k4"])
    _assert_index_right(table, oracle, "writes after rebuild")


@pytest.mark.parametrize("table_type", TABLE_TYPES)
@pytest.mark.parametrize("delete_ts", [5, 10, 20], ids=["loses", "ties", "wins"])
def test_record_index_event_time_delete_judged_by_ordering_in_validate_and_rebuild(
        tmp_path: Path, table_type: str, delete_ts: int) -> None:
    table, oracle = _table(tmp_path, table_type), Oracle()
    _upsert(table, oracle, _rows([f"k{i}" for i in range(6)], 10))
    # k1 and k2 are updated in a log file on MERGE_ON_READ: the delete meets a log version
    # of them and the base version of the others
    _upsert(table, oracle, _rows(["k1", "k2"], 10))
    doomed = ["k0", "k1", "k3"]
    table.delete(pa.table({"key": doomed, "region": ["north"] * 3,
                           "ts": pa.array([delete_ts] * 3, pa.int64())}))
    oracle.delete(doomed, ordering=delete_ts)
    assert ("k0" in oracle.rows) is (delete_ts < 10)
    _assert_index_right(table, oracle, "after the ordered delete")
    table.rebuild_metadata()
    _assert_index_right(table, oracle, "after rebuild")
    # (newer than the delete: what an older version reads after a delete depends on whether
    # compaction folded the delete, docs/engine.md "Delete policies")
    _upsert(table, oracle, _rows(["k0", "k5"], 25))
    _assert_index_right(table, oracle, "a write after rebuild")
