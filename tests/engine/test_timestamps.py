"""Timestamp columns across commits (issue 34, defect 2): one stored form, either kind read.

A table whose first commit wrote a zone-less ``timestamp[us]`` and later commits
``timestamp[us, tz=UTC]`` could not be read (``ArrowTypeError: Unable to merge``). Every write
now stores a timestamp as a UTC instant (``timestamp-micros`` in the commit schema,
``isAdjustedToUTC=true`` in parquet, tz=UTC in log blocks: :mod:`engine.format.timestamps`), and
reads cast files of the other kind (tables written before) to the table's schema.

Expected values are epoch microseconds computed here (floored to the column's unit by integer
arithmetic), not by the engine; hudi-rs must read the same rows.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import engine.format.timestamps as timestamps
from engine import Table
from engine.format.log_format import BlockType, decode_parquet_data_block, iter_blocks
from engine.timeline.active import Timeline
from tests.helpers import hudi_rs_read

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
HOUR_US = 3_600_000_000
ZONE = "America/New_York"
"""The zone instants are given in (they are stored in UTC)."""


def _old_storage_type(t: pa.DataType) -> pa.DataType:
    """How ``normalize_input_schema`` stored a timestamp before the fix: its zone (or none)
    kept, ``ns`` as ``us`` — a zone-less first commit wrote ``timestamp[us]`` files."""
    return pa.timestamp("us", tz=t.tz) if t.unit == "ns" else t


def _micros(key: int, commit: int) -> int:
    """The value key ``key`` gets at commit ``commit``, in epoch microseconds: sub-millisecond
    digits, and key 0 before 1970 (flooring to milliseconds must go down, not toward zero)."""
    if key == 0:
        return -1_500 - commit * 1_000_003
    return 1_709_294_400_000_000 + key * HOUR_US + commit * 1_000_003 + 123_456


def _column(values_us: list[int | None], unit: str, zoned: bool) -> pa.Array:
    """Input column of ``unit``, zone-less or in :data:`ZONE` (same instants), from epoch
    micros; ``ns`` input carries 789 extra nanoseconds, ``ms``/``s`` input is floored."""
    scale = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}[unit]
    raw = [None if v is None else (v * 1000 + 789 if scale is None else v // scale)
           for v in values_us]
    arr = pa.array(raw, pa.int64()).cast(pa.timestamp(unit, tz="UTC" if zoned else None))
    return arr.cast(pa.timestamp(unit, tz=ZONE)) if zoned else arr


def _stored(value_us: int | None, unit: str) -> dt.datetime | None:
    """The instant a value reads back as from a column stored in ``unit`` (floored)."""
    if value_us is None:
        return None
    step = 1_000 if unit == "ms" else 1
    return EPOCH + dt.timedelta(microseconds=(value_us // step) * step)


def _batch(keys: list[int], commit: int, part: str, unit: str, zoned: bool,
           nulls: frozenset[int] = frozenset()) -> pa.Table:
    values = [None if k in nulls else _micros(k, commit) for k in keys]
    return pa.table({"id": pa.array(keys, pa.int64()), "seq": [commit] * len(keys),
                     "p": [part] * len(keys), "t": _column(values, unit, zoned)})


def _data_files(root: Path) -> Iterator[Path]:
    for folder, _dirs, files in os.walk(root):
        if ".hoodie" in Path(folder).relative_to(root).parts:
            continue
        for name in files:
            if name.endswith(".parquet") or ".log." in name:
                yield Path(folder) / name


def _assert_one_form(root: Path, table: Table, unit: str, *, all_files: bool = True) -> None:
    """The commit schema says ``timestamp-<unit>`` (an instant) for ``t``, and (``all_files``)
    every base file and log block stores ``t`` as ``timestamp[unit, tz=UTC]``."""
    avro = json.loads(Timeline.load(table.storage, table.config).latest_schema() or "{}")
    field = next(f for f in avro["fields"] if f["name"] == "t")
    logical = {"ms": "timestamp-millis", "us": "timestamp-micros"}[unit]
    assert next(b for b in field["type"] if b != "null")["logicalType"] == logical
    if not all_files:
        return
    want = pa.timestamp(unit, tz="UTC")
    for path in _data_files(root):
        if path.suffix == ".parquet":
            assert pq.read_schema(path).field("t").type == want, path
            column = pq.ParquetFile(path).schema.column(
                pq.read_schema(path).get_field_index("t"))
            assert json.loads(column.logical_type.to_json())["isAdjustedToUTC"], path
            continue
        for block in iter_blocks(path.read_bytes()):
            if block.block_type is BlockType.PARQUET_DATA:
                assert decode_parquet_data_block(block).schema.field("t").type == want, path
            if block.block_type in (BlockType.PARQUET_DATA, BlockType.AVRO_DATA):
                header = next(f for f in (block.schema or {})["fields"] if f["name"] == "t")
                assert next(b for b in header["type"]
                            if b != "null")["logicalType"] == logical


def _rows(data: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(zip(data.column("id").to_pylist(), data.column("t").to_pylist(), strict=True))


def _assert_reads(table: Table, expected: dict[int, dt.datetime | None]) -> None:
    want = sorted(expected.items())
    ours = table.read()
    assert ours.schema.field("t").type.tz == "UTC"
    assert _rows(ours) == want
    assert _rows(hudi_rs_read(table.path)) == want


def _create(root: Path, table_type: str, block_format: str = "parquet", **kw: Any) -> Table:
    options = {"hoodie.logfile.data.block.format": block_format,
               "hoodie.clean.automatic": "false", "hoodie.archive.automatic": "false",
               "hoodie.parquet.small.file.limit": "1"}
    return Table.create(str(root), name="t", record_key="id", table_type=table_type,
                        partition_by=kw.pop("partition_by", "p"), options=options, **kw)


UNIT_PAIRS = [("us", "us"), ("ms", "us"), ("ns", "ms"), ("s", "ns")]


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
@pytest.mark.parametrize("first_zoned", [False, True], ids=["naive-first", "aware-first"])
@pytest.mark.parametrize(("unit1", "unit2"), UNIT_PAIRS, ids=[f"{a}-{b}" for a, b in UNIT_PAIRS])
def test_timestamps_of_both_kinds_across_commits_read_as_utc_instants(
        tmp_path: Path, table_type: str, first_zoned: bool, unit1: str, unit2: str) -> None:
    table = _create(tmp_path / "t", table_type, precombine="seq")
    stored_unit = "ms" if unit1 in ("s", "ms") else "us"
    second = not first_zoned
    table.upsert(_batch([0, 1, 2, 3], 1, "a", unit1, first_zoned, nulls=frozenset({3})))
    table.upsert(_batch([4, 5], 2, "b", unit2, second))  # a new file group; "a" untouched
    table.upsert(_batch([1, 3], 3, "a", unit2, second))  # a log block / rewrite over commit 1
    table.upsert(_batch([5], 4, "b", unit1, first_zoned, nulls=frozenset({5})))
    table.delete(pa.table({"id": pa.array([2], pa.int64()), "p": ["a"]}))

    def value(key: int, commit: int) -> dt.datetime | None:
        unit = unit1 if commit in (1, 4) else unit2
        micros = _micros(key, commit)
        if unit == "s":
            micros = (micros // 1_000_000) * 1_000_000
        elif unit == "ms":
            micros = (micros // 1_000) * 1_000
        return _stored(micros, stored_unit)

    expected = {0: value(0, 1), 1: value(1, 3), 3: value(3, 3), 4: value(4, 2), 5: None}
    _assert_reads(table, expected)
    _assert_one_form(tmp_path / "t", table, stored_unit)
    if table_type == "MERGE_ON_READ":
        table.compact()
        _assert_reads(table, expected)
        _assert_one_form(tmp_path / "t", table, stored_unit)


@pytest.mark.parametrize("first_zoned", [False, True], ids=["zone-less", "new-york"])
@pytest.mark.parametrize("block_format", ["parquet", "avro"])
@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_table_with_zone_less_first_commit_reads_and_rewrites_as_instants(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table_type: str,
        block_format: str, first_zoned: bool) -> None:
    """A table written by the code before the fix: the first commit stored zone-less
    ``timestamp[us]`` files (or instants in the input's zone), the next ones UTC instants.
    Reads (and compaction, clustering) take the table's schema; the reader before the fix
    failed with ArrowTypeError."""
    root = tmp_path / "t"
    table = _create(root, table_type, block_format, precombine="seq")
    with monkeypatch.context() as patch:
        patch.setattr(timestamps, "storage_type", _old_storage_type)
        table.upsert(_batch([0, 1, 2], 1, "a", "us", first_zoned, nulls=frozenset({2})))
    old_files = [p for p in _data_files(root) if p.suffix == ".parquet"]
    assert [pq.read_schema(p).field("t").type for p in old_files] == [
        pa.timestamp("us", tz=ZONE if first_zoned else None)]
    table.upsert(_batch([3], 2, "b", "us", False))
    table.upsert(_batch([1], 3, "a", "us", True))
    expected = {0: _stored(_micros(0, 1), "us"), 1: _stored(_micros(1, 3), "us"), 2: None,
                3: _stored(_micros(3, 2), "us")}
    _assert_reads(table, expected)
    assert _rows(table.read(filters=[("p", "=", "a")])) == sorted(
        (k, v) for k, v in expected.items() if k != 3)
    if table_type == "MERGE_ON_READ":
        table.compact()
        _assert_reads(table, expected)
    table.upsert(_batch([4], 4, "a", "ns", False))
    expected[4] = _stored(_micros(4, 4), "us")
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # no read may depend on the local zone
    run = table.cluster()
    assert run.completed, run
    _assert_reads(table, expected)
    _assert_one_form(root, table, "us", all_files=False)
    for path in _data_files(root):  # the files the clustering wrote are instants
        if path.suffix == ".parquet" and run.completed[0] in path.name:
            assert pq.read_schema(path).field("t").type == pa.timestamp("us", tz="UTC")


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_zone_less_timestamp_as_ordering_field_orders_across_kinds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table_type: str) -> None:
    """Event-time ordering on a timestamp column: an older table's zone-less base file
    against instants in later commits and in deletes."""
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="t",
                         table_type=table_type,
                         options={"hoodie.clean.automatic": "false"})

    def rows(keys: list[int], hour: int, zoned: bool) -> pa.Table:
        values = [1_709_294_400_000_000 + hour * HOUR_US + k for k in keys]
        return pa.table({"id": pa.array(keys, pa.int64()), "v": [hour] * len(keys),
                         "t": _column(values, "us", zoned)})

    with monkeypatch.context() as patch:
        patch.setattr(timestamps, "storage_type", _old_storage_type)
        table.upsert(rows([1, 2, 3], 10, False))
    table.upsert(rows([1], 9, True))   # older: loses
    table.upsert(rows([2], 11, False))  # newer, zone-less input: wins
    # deletes carry ordering values: an older one loses, a newer one wins
    table.delete(pa.table({"id": pa.array([3], pa.int64()),
                           "t": _column([1_709_294_400_000_000 + 9 * HOUR_US], "us", False)}))
    table.delete(pa.table({"id": pa.array([1], pa.int64()),
                           "t": _column([1_709_294_400_000_000 + 12 * HOUR_US], "us", True)}))
    expected = {2: _stored(1_709_294_400_000_000 + 11 * HOUR_US + 2, "us"),
                3: _stored(1_709_294_400_000_000 + 10 * HOUR_US + 3, "us")}
    _assert_reads(table, expected)
    assert sorted(table.read().column("v").to_pylist()) == [10, 11]
    if table_type == "MERGE_ON_READ":
        table.compact()
        _assert_reads(table, expected)


def test_zone_less_timestamp_as_partition_field_keeps_each_key_in_one_partition(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A timestamp partition field (its epoch value names the partition): zone-less and
    zoned input of one instant land in the same partition, and partition filters prune."""
    table = _create(tmp_path / "t", "MERGE_ON_READ", partition_by="t", precombine="seq")
    instant = 1_709_294_400_000_000 + 123_456
    with monkeypatch.context() as patch:
        patch.setattr(timestamps, "storage_type", _old_storage_type)
        table.upsert(pa.table({"id": pa.array([1, 2], pa.int64()), "seq": [1, 1],
                               "t": _column([instant, instant + HOUR_US], "us", False)}))
    table.upsert(pa.table({"id": pa.array([1], pa.int64()), "seq": [2],
                           "t": _column([instant], "us", True)}))
    assert {s.partition_path for s in table.file_slices()} == {
        str(instant), str(instant + HOUR_US)}
    expected = {1: _stored(instant, "us"), 2: _stored(instant + HOUR_US, "us")}
    _assert_reads(table, expected)
    assert table.read().column("seq").to_pylist().count(2) == 1
    when = _stored(instant, "us")
    assert _rows(table.read(filters=[("t", "=", when)])) == [(1, when)]
    assert table.explain(filters=[("t", "=", when)])["slices_read"] == 1


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_filters_with_zone_less_or_zoned_datetimes_match_stored_instants(
        tmp_path: Path, table_type: str) -> None:
    """Zone-less input is stored as instants: a zone-less ``datetime`` in a filter means the
    same UTC wall-clock time (pyarrow refuses to compare the two kinds), a zoned one its
    instant; pruning by column stats and partitions follows the same values."""
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", table_type=table_type,
                         options={"hoodie.metadata.index.column.stats.enable": "true"})
    base = 1_709_294_400_000_000
    table.upsert(pa.table({"id": pa.array([1, 2, 3], pa.int64()),
                           "t": _column([base, base + HOUR_US, None], "us", False)}))
    table.upsert(pa.table({"id": pa.array([4], pa.int64()),
                           "t": _column([base + 2 * HOUR_US], "us", True)}))
    naive = [EPOCH.replace(tzinfo=None) + dt.timedelta(microseconds=base + h * HOUR_US)
             for h in range(3)]
    zoned = [(EPOCH + dt.timedelta(microseconds=base + h * HOUR_US)).astimezone(
        dt.timezone(dt.timedelta(hours=-5))) for h in range(3)]

    def ids(filters: Any) -> list[int]:
        return sorted(table.read(filters=filters).column("id").to_pylist())

    for values in (naive, zoned):
        assert ids([("t", "=", values[0])]) == [1]
        assert ids([("t", ">", values[0])]) == [2, 4]
        assert ids([("t", "in", [values[1], values[2]])]) == [2, 4]
        assert ids([[("t", "<=", values[0])], [("id", "=", 3)]]) == [1, 3]
