"""Delete blocks and delete ordering rules, judged by hudi-rs and by hand-written expectations.

Each scenario writes a small merge-on-read table (bucket index, one bucket, so every write
lands in one file group: the first as its base file, the rest as log files) and checks that
our reader and hudi-rs 0.5.0 return the rows the scenario states. The expectations follow
Hudi 1.x's Java merger (``BufferedRecordMergerFactory.EventTimeRecordMerger``): a delete
carrying an ordering value competes like a version (ties go to the later write); a delete
without one (natural order) supersedes every earlier log version, any later version wins over
it, and the result then competes with the base file's row by ordering value.
"""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from engine.format.log_block import BlockType, iter_blocks
from engine.layout.file_group import list_table_files
from engine.storage import Storage
from tests.helpers import hudi_rs_read, row_tuples

COLUMNS = ("key", "ts", "v")


def _table(path: Path) -> Table:
    return Table.create(str(path), name="t", record_key="key", precombine="ts",
                        table_type="MERGE_ON_READ",
                        options={"hoodie.index.type": "BUCKET",
                                 "hoodie.bucket.index.num.buckets": "1",
                                 # the first write makes a base file (non-blocking writers
                                 # would start the group with a log file)
                                 "hoodie.write.concurrency.mode":
                                     "OPTIMISTIC_CONCURRENCY_CONTROL"})


def _apply(table: Table, steps: list[tuple[Any, ...]]) -> None:
    for step in steps:
        if step[0] == "up":
            table.upsert(pa.table({"key": [step[1]], "ts": pa.array([step[2]], pa.int64()),
                                   "v": [step[3]]}))
        else:  # ("del", key, ordering value or None)
            cols: dict[str, Any] = {"key": [step[1]]}
            if step[2] is not None:
                cols["ts"] = pa.array([step[2]], pa.int64())
            table.delete(pa.table(cols))


SCENARIOS = {
    # base a@100, then (logs) a natural delete and an older version: the final merge with the
    # base keeps a@100 (Java and hudi-rs; our reader returned a@50 before).
    "base_natural_delete_then_older": (
        [("up", "a", 100, "x"), ("del", "a", None), ("up", "a", 50, "y")], [("a", 100, "x")]),
    # the same writes all in log blocks: the natural delete resets, a@50 wins.
    "log_natural_delete_then_older": (
        [("up", "b", 1, "b"), ("up", "a", 100, "x"), ("del", "a", None), ("up", "a", 50, "y")],
        [("a", 50, "y"), ("b", 1, "b")]),
    "natural_delete_alone": ([("up", "a", 100, "x"), ("del", "a", None)], []),
    "ordered_delete_equal_wins": ([("up", "a", 100, "x"), ("del", "a", 100)], []),
    "ordered_delete_lower_loses": ([("up", "a", 100, "x"), ("del", "a", 90)], [("a", 100, "x")]),
    "ordered_delete_then_older_loses": (
        [("up", "a", 100, "x"), ("del", "a", 100), ("up", "a", 50, "y")], []),
    "ordered_delete_then_equal_reinserts": (
        [("up", "a", 100, "x"), ("del", "a", 100), ("up", "a", 100, "y")], [("a", 100, "y")]),
    "ordered_delete_then_newer_reinserts": (
        [("up", "a", 100, "x"), ("del", "a", 100), ("up", "a", 150, "y")], [("a", 150, "y")]),
    "log_ordered_delete_then_older_loses": (
        [("up", "b", 1, "b"), ("up", "a", 100, "x"), ("del", "a", 100), ("up", "a", 50, "y")],
        [("b", 1, "b")]),
    "reinsert_then_older_delete_loses": (
        [("up", "a", 100, "x"), ("del", "a", 100), ("up", "a", 120, "y"), ("del", "a", 110)],
        [("a", 120, "y")]),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_delete_ordering_scenario_reads_as_java_in_ours_and_hudi_rs(
        tmp_path: Path, name: str) -> None:
    steps, expected = SCENARIOS[name]
    table = _table(tmp_path / "t")
    _apply(table, steps)
    assert row_tuples(table.read(columns=["key", "ts", "v"]), COLUMNS) == expected
    assert row_tuples(hudi_rs_read(table.path), COLUMNS) == expected


ORDERING_TYPES = {
    "timestamp_us_utc": (pa.timestamp("us", tz="UTC"),
                         [dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
                          + dt.timedelta(seconds=i) for i in range(3)]),
    "timestamp_ms": (pa.timestamp("ms"),
                     [dt.datetime(2024, 1, 1) + dt.timedelta(seconds=i) for i in range(3)]),
    "date": (pa.date32(), [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(3)]),
    "decimal": (pa.decimal128(10, 2), [decimal.Decimal("1.25") + i for i in range(3)]),
    "int32": (pa.int32(), [1, 2, 3]),
    "double": (pa.float64(), [1.5, 2.5, 3.5]),
    "string": (pa.string(), ["a1", "a2", "a3"]),
}


@pytest.mark.parametrize("name", sorted(ORDERING_TYPES))
def test_mor_delete_with_ordering_type_commits_and_reads_same_in_hudi_rs(
        tmp_path: Path, name: str) -> None:
    """Timestamp, date and decimal ordering fields raised ValueError mid-commit before."""
    arrow_type, values = ORDERING_TYPES[name]
    table = _table(tmp_path / "t")
    table.upsert(pa.table({"key": ["a", "b", "c", "d"], "ts": pa.array([values[1]] * 4,
                                                                        arrow_type),
                           "v": [1, 2, 3, 4]}))
    # a: delete at the stored ordering value (wins); c: at a lower one (loses); b: natural.
    table.delete(pa.table({"key": ["a", "c", "b"],
                           "ts": pa.array([values[1], values[0], None], arrow_type)}))
    ours = sorted(r["key"] for r in table.read(columns=["key"]).to_pylist())
    theirs = hudi_rs_read(table.path)
    assert ours == ["c", "d"]
    assert sorted(theirs.column("key").to_pylist()) == ours
    assert not [i for i in Table.open(table.path).timeline() if i.state != "completed"]


def test_delete_block_natural_and_ordered_deletes_go_to_separate_blocks(tmp_path: Path) -> None:
    """One delete block carries one ordering type: hudi-rs refuses a block mixing
    ``IntWrapper(0)`` (natural order) with ``LongWrapper`` values."""
    table = _table(tmp_path / "t")
    table.upsert(pa.table({"key": ["a", "b", "c"], "ts": pa.array([5, 5, 5], pa.int64()),
                           "v": ["x", "y", "z"]}))
    table.delete(pa.table({"key": ["a", "b"], "ts": pa.array([7, None], pa.int64())}))
    storage = Storage(table.path)
    logs = list_table_files(storage).log_files
    blocks = [b for log in logs for b in iter_blocks(storage.read(log.path))]
    assert [b.block_type for b in blocks] == [BlockType.DELETE, BlockType.DELETE]
    assert row_tuples(hudi_rs_read(table.path), COLUMNS) == [("c", 5, "z")]
    assert row_tuples(table.read(columns=["key", "ts", "v"]), COLUMNS) == [("c", 5, "z")]
