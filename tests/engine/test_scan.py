"""Planned reads (``Table.scan``, ``Table.scan_incremental``): slices read apart, after a
pickle round trip (as Spark tasks read them), give the engine's read; an incremental plan
leaves out the slices no commit of its range wrote; the read options parse as Hudi names
them."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from engine.errors import InvalidOptionError
from engine.read.options import QueryType, ReadOptions
from tests.helpers import COMMIT_TIME, Oracle, sorted_rows

COLUMNS = ["key", "ts", "region", "v", COMMIT_TIME]
SCHEMA = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("region", pa.string()),
                    ("v", pa.int64())])


def _rows(keys: list[str], ts: int, region: str) -> list[dict[str, object]]:
    return [{"key": k, "ts": ts, "region": region, "v": ts * 10 + i}
            for i, k in enumerate(keys)]


def _table(path: Path, table_type: str) -> tuple[Table, Oracle, list[str]]:
    table = Table.create(str(path), name="s", table_type=table_type, record_key="key",
                         precombine="ts", partition_by=["region"])
    oracle, instants = Oracle(), []
    for ts, region, keys in ((1, "a", ["k1", "k2", "k3"]), (1, "b", ["k4", "k5"]),
                             (2, "c", ["k6"]), (3, "a", ["k1", "k7"])):
        batch = _rows(keys, ts, region)
        instant = table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
        oracle.upsert(batch, instant)
        instants.append(instant)
    return table, oracle, instants


def _concat(parts: list[pa.Table]) -> pa.Table:
    parts = [p for p in parts if p.num_rows]
    return pa.concat_tables(parts, promote_options="permissive")


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_scan_slices_read_apart_after_pickling_equal_table_read(
        tmp_path: Path, table_type: str) -> None:
    table, oracle, instants = _table(tmp_path / "t", table_type)
    for kwargs in ({}, {"as_of": instants[1]}, {"read_optimized": True},
                   {"filters": [("region", "=", "a")]}):
        scan = table.scan(**kwargs)  # type: ignore[arg-type]
        shipped = pickle.loads(pickle.dumps(scan.slice_scan))
        parts = [pickle.loads(pickle.dumps(s)) for s in scan.slices]
        got = _concat([shipped.read(s) for s in parts])
        assert sorted_rows(got, COLUMNS) == sorted_rows(table.read(**kwargs), COLUMNS)  # type: ignore[arg-type]
    assert sorted_rows(table.scan().to_table(), COLUMNS) == oracle.snapshot()
    assert sorted_rows(table.scan(as_of=instants[1]).to_table(), COLUMNS) == \
        oracle.snapshot(instants[1])


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_scan_incremental_reads_only_slices_written_in_range(
        tmp_path: Path, table_type: str) -> None:
    table, oracle, instants = _table(tmp_path / "t", table_type)
    done = {e.instant_time: e.completion_time for e in table.timeline()
            if e.state == "completed"}
    # after the 2nd commit: the 3rd wrote region c, the 4th region a; region b is not read
    scan = table.scan_incremental(done[instants[1]])
    assert sorted({s.partition_path for s in scan.slices}) == ["a", "c"]
    got = scan.to_table()
    assert sorted(got.column("key").to_pylist()) == ["k1", "k6", "k7"]
    assert sorted_rows(got, COLUMNS) == sorted_rows(
        table.read_incremental(done[instants[1]]), COLUMNS)
    assert [r[COMMIT_TIME] for r in sorted_rows(got, COLUMNS)] == \
        [oracle.commit_time[k] for k in ("k1", "k6", "k7")]
    # inclusive (Hudi 1.x's begin instant time): the commit completed at start counts too
    inclusive = table.scan_incremental(done[instants[2]], start_inclusive=True)
    assert sorted({s.partition_path for s in inclusive.slices}) == ["a", "c"]
    assert sorted(inclusive.to_table().column("key").to_pylist()) == ["k1", "k6", "k7"]
    assert sorted(table.scan_incremental(done[instants[2]]).to_table()
                  .column("key").to_pylist()) == ["k1", "k7"]
    # after the last commit: nothing to read; from the start: every record of the view
    assert table.scan_incremental(done[instants[3]]).slices == []
    everything = table.scan_incremental(None, done[instants[2]]).to_table()
    assert sorted_rows(everything, COLUMNS) == oracle.snapshot(instants[2])


def test_read_options_parse_hudi_names_and_refuse_bad_combinations() -> None:
    parsed = ReadOptions.from_options({"HOODIE.DATASOURCE.QUERY.TYPE": "Incremental",
                                       "hoodie.datasource.read.begin.instanttime":
                                           "20250101000000000", "path": "/x"})
    assert parsed.query_type is QueryType.INCREMENTAL
    assert parsed.begin_instant == "20250101000000000" and parsed.end_instant is None
    assert ReadOptions.from_options({}).query_type is QueryType.SNAPSHOT
    for options, key in (
            ({"hoodie.datasource.query.type": "incremental"},
             "hoodie.datasource.read.begin.instanttime"),
            ({"hoodie.datasource.query.type": "read_optimized",
              "as.of.instant": "20250101000000000"}, "as.of.instant"),
            ({"hoodie.datasource.read.end.instanttime": "20250101000000000"},
             "hoodie.datasource.read.end.instanttime"),
            ({"as.of.instant": "tomorrow"}, "as.of.instant"),
            ({"hoodie.datasource.streaming.startOffset": "soon"},
             "hoodie.datasource.streaming.startOffset"),
            ({"hoodie.datasource.query.typ": "snapshot"}, "hoodie.datasource.query.typ")):
        with pytest.raises(InvalidOptionError) as caught:
            ReadOptions.from_options(options)
        assert caught.value.key == key


def test_read_options_columns_and_filters_plan_as_table_read(tmp_path: Path) -> None:
    """``tidelake.read.columns`` and ``tidelake.read.filters`` (JSON) plan the read
    ``Table.read(columns, filters)`` does: the same slices kept, the same rows."""
    table, _, _ = _table(tmp_path / "t", "MERGE_ON_READ")
    options = ReadOptions.from_options({
        "tidelake.read.columns": " v , key",
        "TIDELAKE.READ.FILTERS": '[["region", "IN", ["a", "c"]], ["ts", ">=", 1]]'})
    assert options.columns == ("v", "key")
    scan = table.plan_read(options)
    expected = table.scan(["v", "key"], [("region", "in", ["a", "c"]), ("ts", ">=", 1)])
    assert len(scan.slices) < len(table.scan().slices)  # region b pruned
    assert [s.file_id for s in scan.slices] == [s.file_id for s in expected.slices]
    got = scan.to_table()
    assert got.column_names == ["v", "key"]
    assert got.sort_by("key").to_pylist() == expected.to_table().sort_by("key").to_pylist()
    either = ReadOptions.from_options(
        {"tidelake.read.filters": '[[["key", "=", "k4"]], [["v", "<", 12]]]'})
    assert sorted(table.plan_read(either).to_table()["key"].to_pylist()) == ["k2", "k4", "k5"]


def test_read_options_columns_and_filters_refuse_bad_values_naming_the_option(
        tmp_path: Path) -> None:
    from engine.read.options import typed_filters

    for raw in ("", " , ", "key,,v", "key,key"):
        with pytest.raises(InvalidOptionError) as caught:
            ReadOptions.from_options({"tidelake.read.columns": raw})
        assert caught.value.key == "tidelake.read.columns"
    for raw in ("region = a", "[]", '{"region": "a"}', '[["region", "like", "a"]]',
                '[["region", "="]]', '[["region", "in", []]]', '[["region", "=", null]]',
                '[["region", "in", ["a", null]]]', '[[1, "=", "a"]]'):
        with pytest.raises(InvalidOptionError) as caught:
            ReadOptions.from_options({"tidelake.read.filters": raw})
        assert caught.value.key == "tidelake.read.filters", raw
    for key in ("tidelake.read.columns", "tidelake.read.filters"):
        value = "key" if key.endswith("columns") else '[["key", "=", "k1"]]'
        with pytest.raises(InvalidOptionError, match="change feed") as caught:
            ReadOptions.from_options({
                key: value, "hoodie.datasource.query.type": "incremental",
                "hoodie.datasource.read.begin.instanttime": "20250101000000000",
                "hoodie.datasource.query.incremental.format": "cdc"})
        assert caught.value.key == key
    table, _, _ = _table(tmp_path / "t", "COPY_ON_WRITE")
    for options, named in (({"tidelake.read.columns": "key,nope"}, "'nope'"),
                           ({"tidelake.read.filters": '[["nope", "=", 1]]'}, "'nope'"),
                           ({"tidelake.read.filters": '[["ts", "=", "one"]]'}, "'ts' is int64"),
                           ({"tidelake.read.filters": '[["region", ">", 2]]'}, "'region'")):
        with pytest.raises(InvalidOptionError, match=named) as caught:
            table.plan_read(ReadOptions.from_options(options))
        assert caught.value.key in options
    # JSON values in their columns' kinds: ISO dates and times, decimals, bytes
    schema = pa.schema([("d", pa.date32()), ("t", pa.timestamp("us", "UTC")),
                        ("m", pa.decimal128(10, 2)), ("b", pa.binary()), ("f", pa.float64())])
    typed = typed_filters([[("d", ">=", "2024-05-01"), ("t", "<", "2024-05-01T10:00:00Z"),
                            ("m", "in", ("1.25", 3)), ("b", "=", "x"), ("f", ">", 1)]], schema)
    import datetime as dt
    import decimal
    assert typed == [[("d", ">=", dt.date(2024, 5, 1)),
                      ("t", "<", dt.datetime(2024, 5, 1, 10, tzinfo=dt.timezone.utc)),
                      ("m", "in", [decimal.Decimal("1.25"), decimal.Decimal(3)]),
                      ("b", "=", b"x"), ("f", ">", 1)]]
    for term in (("d", "=", 20240501), ("t", "=", "noon"), ("m", "=", "x"), ("f", "=", True)):
        with pytest.raises(InvalidOptionError, match=f"'{term[0]}'"):
            typed_filters([[term]], schema)
