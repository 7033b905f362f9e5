"""The public Table API: argument checking, input validation, and basic round trips."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import (
    InvalidOptionError,
    InvalidRecordError,
    Table,
    TableExistsError,
    TableNotFoundError,
    UnsupportedStorageError,
)
from engine.errors import CorruptTableError
from tests.helpers import hudi_rs_read


def _table(tmp_path: Path, **kwargs: object) -> Table:
    args: dict[str, object] = {"name": "t", "record_key": "id", "precombine": "ts",
                               "partition_by": ["city"]}
    args.update(kwargs)
    return Table.create(str(tmp_path / "t"), **args)  # type: ignore[arg-type]


def _data(ids: list[str], ts: int = 1, city: str = "paris") -> pa.Table:
    return pa.table({"id": ids, "ts": [ts] * len(ids), "city": [city] * len(ids),
                     "fare": [float(i) for i in range(len(ids))]})


@pytest.mark.parametrize(("kwargs", "argument"), [
    ({"table_type": "MOR_ISH"}, "table_type"),
    ({"record_key": ""}, "record_key"),
    ({"record_key": []}, "record_key"),
    ({"name": "bad/name"}, "name"),
    ({"precombine": "a,b"}, "precombine"),
    ({"partition_by": ["city", "city"]}, "partition_by"),
])
def test_create_bad_argument_error_names_argument(tmp_path: Path, kwargs: dict[str, object],
                                                  argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        _table(tmp_path, **kwargs)


def test_create_unknown_option_error_names_option(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match=r"hoodie\.not\.a\.key"):
        _table(tmp_path, options={"hoodie.not.a.key": "1"})


def test_create_twice_raises_and_open_missing_raises(tmp_path: Path) -> None:
    _table(tmp_path)
    with pytest.raises(TableExistsError):
        _table(tmp_path)
    with pytest.raises(TableNotFoundError):
        Table.open(str(tmp_path / "nothing"))


def test_create_and_open_file_uri_write_the_local_folder(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "x y" / "t"
    table = Table.create(f"file://{tmp_path}/x%20y/t", name="t", record_key="id",
                         precombine="ts", partition_by=["city"])
    table.upsert(_data(["a", "b"]))
    assert (folder / ".hoodie" / "hoodie.properties").is_file()
    assert not (tmp_path / "file:").exists()
    assert table.path == str(folder)
    again = Table.open(f"file://localhost{folder}")
    assert sorted(again.read().column("id").to_pylist()) == ["a", "b"]


@pytest.mark.parametrize("location", ["hdfs://nn/orders", "http://host/t", "s3://",
                                      "file://otherhost/data/t"])
def test_create_or_open_unsupported_uri_refused_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsupportedStorageError, match=r"not supported|local path|names no") \
            as info:
        Table.create(location, name="t", record_key="id")
    assert location in str(info.value)
    with pytest.raises(UnsupportedStorageError, match=r"not supported|local path|names no"):
        Table.open(location)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", [
    pa.table({"id": ["a", None], "ts": [1, 2], "city": ["x", "y"], "fare": [1.0, 2.0]}),
    pa.table({"id": ["a", "b"], "ts": [1, None], "city": ["x", "y"], "fare": [1.0, 2.0]}),
    pa.table({"id": ["a", ""], "ts": [1, 2], "city": ["x", "y"], "fare": [1.0, 2.0]}),
    pa.table({"id": pa.array([None, None], pa.string()), "ts": [1, 2], "city": ["x", "y"],
              "fare": [1.0, 2.0]}),
    pa.table({"ts": [1], "city": ["x"], "fare": [1.0]}),
])
def test_upsert_missing_key_or_ordering_rejected_before_writing(tmp_path: Path,
                                                                bad: pa.Table) -> None:
    table = _table(tmp_path)
    table.upsert(_data(["seed"]))
    files_before = sorted(p.name for p in Path(table.path).rglob("*"))
    with pytest.raises(InvalidRecordError):
        table.upsert(bad)
    assert sorted(p.name for p in Path(table.path).rglob("*")) == files_before
    assert len(table.timeline()) == 1


def test_upsert_unknown_column_added_to_the_schema_older_rows_null(tmp_path: Path) -> None:
    """As Hudi evolves the schema on write (docs/engine.md, "Schema evolution")."""
    table = _table(tmp_path)
    table.upsert(_data(["a"]))
    table.upsert(_data(["b"]).append_column("surprise", pa.array([1])))
    rows = table.read().sort_by("id")
    assert rows.column("surprise").to_pylist() == [None, 1]


def test_read_bad_arguments_name_argument(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.upsert(_data(["a"]))
    with pytest.raises(ValueError, match="as_of"):
        table.read(as_of="yesterday")
    with pytest.raises(ValueError, match="columns"):
        table.read(columns=["nope"])
    with pytest.raises(ValueError, match="start"):
        table.read_incremental("x")


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_event_time_lower_ordering_never_replaces_higher(tmp_path: Path,
                                                         table_type: str) -> None:
    table = _table(tmp_path, table_type=table_type)
    table.upsert(_data(["a", "b"], ts=10))
    table.upsert(pa.table({"id": ["a", "b"], "ts": [5, 10], "city": ["paris"] * 2,
                           "fare": [99.0, 77.0]}))
    for result in (table.read(), hudi_rs_read(table.path)):
        fares = dict(zip(result.column("id").to_pylist(), result.column("fare").to_pylist(),
                         strict=True))
        assert fares == {"a": 0.0, "b": 77.0}  # a: lower ts loses; b: tie, later wins


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_commit_time_ordering_later_write_wins(tmp_path: Path, table_type: str) -> None:
    table = _table(tmp_path, table_type=table_type, precombine=None)
    table.upsert(pa.table({"id": ["a"], "city": ["x"], "fare": [1.0]}))
    table.upsert(pa.table({"id": ["a"], "city": ["x"], "fare": [2.0]}))
    for result in (table.read(), hudi_rs_read(table.path)):
        assert result.column("fare").to_pylist() == [2.0]


def test_in_batch_dedupe_keeps_greatest_ordering(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.upsert(pa.table({"id": ["a", "a", "a"], "ts": [3, 9, 9], "city": ["x"] * 3,
                           "fare": [1.0, 2.0, 3.0]}))
    assert table.read().column("fare").to_pylist() == [3.0]


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_complex_key_and_nonpartitioned_tables_read_by_hudi_rs(tmp_path: Path,
                                                              table_type: str) -> None:
    complex_t = Table.create(str(tmp_path / "c"), name="c", table_type=table_type,
                             record_key=["id", "city"], precombine="ts",
                             partition_by=["city", "day"],
                             options={"hoodie.datasource.write.hive_style_partitioning": "true"})
    complex_t.upsert(pa.table({"id": ["1", "1"], "city": ["a", "b"], "day": ["d1", "d2"],
                               "ts": [1, 1]}))
    complex_t.upsert(pa.table({"id": ["1"], "city": ["a"], "day": ["d1"], "ts": [2]}))
    keys = sorted(complex_t.read().column("_hoodie_record_key").to_pylist())
    assert keys == ["id:1,city:a", "id:1,city:b"]
    assert sorted(hudi_rs_read(complex_t.path).column("_hoodie_record_key").to_pylist()) == keys
    assert sorted(complex_t.read().column("_hoodie_partition_path").to_pylist()) == [
        "city=a/day=d1", "city=b/day=d2"]

    flat = Table.create(str(tmp_path / "n"), name="n", table_type=table_type,
                        record_key="id", precombine="ts")
    flat.upsert(pa.table({"id": ["x", "y"], "ts": [1, 2]}))
    flat.delete(pa.table({"id": ["x"]}))
    assert flat.read().column("id").to_pylist() == ["y"]
    assert hudi_rs_read(flat.path).column("id").to_pylist() == ["y"]


def test_read_filters_and_partition_pruning(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.upsert(pa.concat_tables([_data(["a", "b"], city="paris"),
                                   _data(["c"], city="rome")]))
    rome = table.read(filters=[("city", "=", "rome")])
    assert rome.column("id").to_pylist() == ["c"]
    cheap = table.read(columns=["id", "fare"], filters=pc.field("fare") < 1.0)
    assert cheap.column_names == ["id", "fare"]
    assert sorted(cheap.column("id").to_pylist()) == ["a", "c"]


def test_read_optimized_skips_logs(tmp_path: Path) -> None:
    table = _table(tmp_path, table_type="MERGE_ON_READ")
    table.upsert(_data(["a"], ts=1))
    table.upsert(pa.table({"id": ["a"], "ts": [2], "city": ["paris"], "fare": [5.0]}))
    assert table.read(read_optimized=True).column("fare").to_pylist() == [0.0]
    assert table.read().column("fare").to_pylist() == [5.0]
    assert hudi_rs_read(table.path, read_optimized=True).column("fare").to_pylist() == [0.0]


@pytest.mark.parametrize("hive_style", ["true", "false"])
def test_hostile_partition_values_written_inside_table_and_read_back(tmp_path: Path,
                                                                     hive_style: str) -> None:
    values = ["..", ".", "../../escape", "/abs", "a/b", "%2F", "C:\\x", "ünï😀", "", None,
              "=", "a\nb", "x" * 100]
    table = Table.create(str(tmp_path / "t"), name="h", table_type="MERGE_ON_READ",
                         record_key="id", precombine="ts", partition_by=["p"],
                         options={"hoodie.datasource.write.hive_style_partitioning": hive_style})
    ids = [f"id{i}" for i in range(len(values))]
    table.upsert(pa.table({"id": ids, "ts": [1] * len(ids), "p": values}))
    table.upsert(pa.table({"id": ids, "ts": [2] * len(ids), "p": values}))
    root = Path(table.path).resolve()
    for path in tmp_path.rglob("*"):
        assert path.resolve().is_relative_to(root), path
    assert not (tmp_path / "escape").exists()
    for result in (table.read(), hudi_rs_read(table.path)):
        got = dict(zip(result.column("id").to_pylist(), result.column("p").to_pylist(),
                       strict=True))
        assert got == dict(zip(ids, values, strict=True))
        assert set(result.column("ts").to_pylist()) == {2}
    with pytest.raises(InvalidRecordError, match="too long"):
        table.upsert(pa.table({"id": ["long"], "ts": [1], "p": ["y" * 300]}))


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
@pytest.mark.parametrize("index", ["BUCKET", "SIMPLE"])
def test_point_lookup_by_key_prunes_and_matches_full_read(tmp_path: Path, table_type: str,
                                                          index: str) -> None:
    table = _table(tmp_path, table_type=table_type,
                   options={"hoodie.index.type": index, "hoodie.bucket.index.num.buckets": "4",
                            "hoodie.parquet.max.file.size": "400000",
                            "hoodie.parquet.small.file.limit": "1"})
    ids = [f"k{i:04d}" for i in range(400)] + ["ünï😀", "\uffff"]
    table.upsert(pa.table({"id": ids, "ts": [1] * len(ids), "city": ["a", "b"] * (len(ids) // 2),
                           "fare": [float(i) for i in range(len(ids))]}))
    table.upsert(pa.table({"id": ["k0007", "k0300"], "ts": [2, 2], "city": ["b", "a"],
                           "fare": [-7.0, -300.0]}))
    table.delete(pa.table({"id": ["k0011"], "city": ["b"]}))
    full = {r["id"]: r["fare"] for r in table.read(columns=["id", "fare"]).to_pylist()}
    for wanted in (["k0007"], ["k0011"], ["k0300", "k0399", "nope"], ["ünï😀", "\uffff"]):
        got = table.read(columns=["id", "fare"], filters=[("id", "in", wanted)])
        assert {r["id"]: r["fare"] for r in got.to_pylist()} == {
            k: full[k] for k in wanted if k in full}
    one = table.read(filters=[("id", "=", "k0007"), ("fare", "<", 0)])
    assert one.column("fare").to_pylist() == [-7.0]
    either = table.read(filters=[[("id", "=", "k0001")], [("id", "=", "k0002")]])
    assert sorted(either.column("id").to_pylist()) == ["k0001", "k0002"]


def test_read_with_corrupt_recorded_schema_raises_naming_the_commit_file(
        tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id")
    table.upsert(pa.table({"id": ["a"], "v": [1]}), extra_metadata={"schema": "{broken"})
    commit = [e for e in table.timeline() if e.state == "completed"][-1]
    with pytest.raises(CorruptTableError, match=rf"timeline/{commit.instant_time}_\d+"
                       r"\.deltacommit: the table schema it records cannot be parsed"):
        table.read()
