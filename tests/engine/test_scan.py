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
