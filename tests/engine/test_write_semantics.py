"""Write semantics Hudi defines: keys found in several places, in-batch combining per index
scope, the index type a table keeps, and ``_hoodie_is_deleted`` delete markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import InvalidOptionError, InvalidRecordError, Table
from tests.helpers import hudi_rs_read, row_tuples

COLUMNS = ("id", "ts", "city")

INDEX = "hoodie.index.type"


def _create(tmp_path: Path, table_type: str = "MERGE_ON_READ", index: str = "SIMPLE",
            **kwargs: Any) -> Table:
    return Table.create(str(tmp_path / "t"), name="t", table_type=table_type,
                        record_key="id", precombine="ts", partition_by=["city"],
                        options={INDEX: index, **kwargs.pop("options", {})}, **kwargs)


def _both(table: Table) -> list[list[tuple[Any, ...]]]:
    return [row_tuples(table.read(), COLUMNS), row_tuples(hudi_rs_read(table.path), COLUMNS)]


def _no_pending(table: Table) -> bool:
    return all(entry.state == "completed" for entry in table.timeline())


# -- b: a key found in more than one place ---------------------------------------------------

@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_upsert_key_stored_in_two_file_groups_updates_both_without_pending_instant(
        tmp_path: Path, table_type: str) -> None:
    table = _create(tmp_path, table_type)
    table.bulk_insert(pa.table({"id": ["k", "j"], "ts": [1, 1], "city": ["x", "x"]}))
    table.bulk_insert(pa.table({"id": ["k"], "ts": [2], "city": ["x"]}))
    assert len(table.file_slices()) == 2
    table.upsert(pa.table({"id": ["k"], "ts": [3], "city": ["x"]}))
    assert _no_pending(table)
    expected = [("j", 1, "x"), ("k", 3, "x"), ("k", 3, "x")]
    assert _both(table) == [expected, expected]


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_delete_by_key_alone_found_in_two_partitions_deletes_both(tmp_path: Path,
                                                                   table_type: str) -> None:
    table = _create(tmp_path, table_type)
    table.upsert(pa.table({"id": ["k", "j"], "ts": [1, 1], "city": ["x", "x"]}))
    table.upsert(pa.table({"id": ["k"], "ts": [1], "city": ["y"]}))  # SIMPLE: a second copy
    assert row_tuples(table.read(), COLUMNS) == [("j", 1, "x"), ("k", 1, "x"), ("k", 1, "y")]
    table.delete(pa.table({"id": ["k"]}))
    assert _no_pending(table)
    assert _both(table) == [[("j", 1, "x")], [("j", 1, "x")]]


# -- c: in-batch combining follows the index scope -------------------------------------------

@pytest.mark.parametrize("index", ["SIMPLE", "BUCKET"])
def test_upsert_one_key_in_two_partitions_non_global_index_keeps_both(tmp_path: Path,
                                                                      index: str) -> None:
    table = _create(tmp_path, index=index)
    table.upsert(pa.table({"id": ["k", "k", "k"], "ts": [1, 2, 1],
                           "city": ["x", "y", "x"]}))
    expected = [("k", 1, "x"), ("k", 2, "y")]
    assert _both(table) == [expected, expected]


def test_upsert_one_key_in_two_partitions_global_index_keeps_greatest(tmp_path: Path) -> None:
    table = _create(tmp_path, index="GLOBAL_SIMPLE")
    table.upsert(pa.table({"id": ["k", "k"], "ts": [2, 1], "city": ["x", "y"]}))
    assert _both(table) == [[("k", 2, "x")], [("k", 2, "x")]]


# -- d: the index type recorded by the table cannot change ----------------------------------

@pytest.mark.parametrize(("created", "opened"), [
    ("SIMPLE", "BUCKET"), ("BUCKET", "SIMPLE"), ("SIMPLE", "GLOBAL_SIMPLE"),
    ("GLOBAL_SIMPLE", "SIMPLE"), ("GLOBAL_SIMPLE", "BUCKET"), ("BLOOM", "GLOBAL_BLOOM"),
    ("GLOBAL_BLOOM", "SIMPLE"), ("SIMPLE", "GLOBAL_BLOOM"), ("BLOOM", "BUCKET"),
])
def test_open_with_other_index_type_refused_naming_option(tmp_path: Path, created: str,
                                                          opened: str) -> None:
    table = _create(tmp_path, index=created)
    table.upsert(pa.table({"id": ["k"], "ts": [1], "city": ["x"]}))
    with pytest.raises(InvalidOptionError, match=r"hoodie\.index\.type"):
        Table.open(table.path, options={INDEX: opened})
    same = Table.open(table.path, options={INDEX: created.lower()})
    same.upsert(pa.table({"id": ["k"], "ts": [2], "city": ["x"]}))
    assert _both(same) == [[("k", 2, "x")], [("k", 2, "x")]]


@pytest.mark.parametrize(("created", "opened"), [
    ("SIMPLE", "BLOOM"), ("BLOOM", "SIMPLE"), ("GLOBAL_SIMPLE", "GLOBAL_BLOOM"),
    ("GLOBAL_BLOOM", "GLOBAL_SIMPLE"),
])
def test_open_simple_as_bloom_and_back_same_keys_found(tmp_path: Path, created: str,
                                                       opened: str) -> None:
    table = _create(tmp_path, index=created)
    table.upsert(pa.table({"id": ["k"], "ts": [1], "city": ["x"]}))
    other = Table.open(table.path, options={INDEX: opened})
    other.upsert(pa.table({"id": ["k"], "ts": [2], "city": ["x"]}))
    assert _both(other) == [[("k", 2, "x")], [("k", 2, "x")]]


# -- e: _hoodie_is_deleted = true deletes ----------------------------------------------------

@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
@pytest.mark.parametrize("index", ["SIMPLE", "BUCKET"])
def test_upsert_delete_marker_true_deletes_record(tmp_path: Path, table_type: str,
                                                  index: str) -> None:
    table = _create(tmp_path, table_type, index)
    table.upsert(pa.table({"id": ["a", "b", "c"], "ts": [1, 1, 1], "city": ["x", "y", "x"]}))
    table.upsert(pa.table({"id": ["a", "b", "c"], "ts": [2, 2, 2], "city": ["x", "y", "x"],
                           "_hoodie_is_deleted": [True, False, None]}))
    expected = [("b", 2, "y"), ("c", 2, "x")]
    assert _both(table) == [expected, expected]
    assert "_hoodie_is_deleted" not in table.read().column_names


def test_delete_marker_with_lower_ordering_keeps_stored_record(tmp_path: Path) -> None:
    table = _create(tmp_path)
    table.upsert(pa.table({"id": ["a", "b"], "ts": [5, 5], "city": ["x", "x"]}))
    table.upsert(pa.table({"id": ["a", "b"], "ts": [4, 5], "city": ["x", "x"],
                           "_hoodie_is_deleted": [True, True]}))
    assert _both(table) == [[("a", 5, "x")], [("a", 5, "x")]]


def test_delete_marker_in_batch_combines_by_ordering(tmp_path: Path) -> None:
    table = _create(tmp_path)
    table.upsert(pa.table({"id": ["a", "b"], "ts": [1, 1], "city": ["x", "x"]}))
    # a: the marker (ts 3) beats the update (ts 2); b: the update (ts 3) beats the marker.
    table.upsert(pa.table({"id": ["a", "a", "b", "b"], "ts": [2, 3, 2, 3],
                           "city": ["x"] * 4,
                           "_hoodie_is_deleted": [False, True, True, False]}))
    assert _both(table) == [[("b", 3, "x")], [("b", 3, "x")]]


def test_insert_delete_marker_true_writes_no_record(tmp_path: Path) -> None:
    table = _create(tmp_path, "COPY_ON_WRITE")
    table.insert(pa.table({"id": ["a", "b"], "ts": [1, 1], "city": ["x", "x"],
                           "_hoodie_is_deleted": [False, True]}))
    assert _both(table) == [[("a", 1, "x")], [("a", 1, "x")]]


def test_delete_with_uncastable_values_refused_before_any_instant(tmp_path: Path) -> None:
    table = _create(tmp_path)
    table.upsert(pa.table({"id": ["k"], "ts": [1], "city": ["x"]}))
    with pytest.raises(InvalidRecordError, match="'ts'"):
        table.delete(pa.table({"id": ["k"], "ts": ["not a number"]}))
    with pytest.raises(InvalidRecordError, match="'city'"):
        table.delete(pa.table({"id": ["k"], "city": [b"\xff"]}))
    assert _no_pending(table) and len(table.timeline()) == 1
    assert _both(table) == [[("k", 1, "x")], [("k", 1, "x")]]
