"""Record keys as Hudi's Java key generators make them, and key-filtered reads that find them.

Expected texts are written out by hand from Java's ``String.valueOf`` of the Avro value
(``HoodieAvroUtils.getNestedFieldValAsString``, consistent logical timestamps off):
``Double.toString``, ``BigDecimal.toString``, ``LocalDate.toString``, and the epoch long of
``timestamp-millis`` / ``timestamp-micros``.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import InvalidRecordError, Table
from engine.errors import UnsupportedTableError
from engine.index.bucket import bucket_from_file_id
from engine.layout.keygen import field_strings
from engine.read.reader import TableReader, _partition_may_match
from engine.timeline.active import Timeline
from tests.engine.helpers import ref_bucket
from tests.helpers import hudi_rs_read, java_custom_keygen_table

UTC = dt.timezone.utc


@pytest.mark.parametrize(("values", "arrow_type", "expected"), [
    ([2.0, 1e7, 9999999.0, 1.5e-5, 0.001, 123.456, -0.5, 1e23],
     pa.float64(),
     ["2.0", "1.0E7", "9999999.0", "1.5E-5", "0.001", "123.456", "-0.5", "1.0E23"]),
    ([-0.0, float("nan"), float("inf"), float("-inf"), 5e-324],
     pa.float64(), ["-0.0", "NaN", "Infinity", "-Infinity", "4.9E-324"]),
    ([0.1, 1e10, 3.0], pa.float32(), ["0.1", "1.0E10", "3.0"]),
    ([-42, 0, 2**40], pa.int64(), ["-42", "0", "1099511627776"]),
    ([True, False], pa.bool_(), ["true", "false"]),
    ([Decimal("1.5"), Decimal("-0.25")], pa.decimal128(10, 2), ["1.50", "-0.25"]),
    ([Decimal("0.0000001"), Decimal(0)], pa.decimal128(10, 7), ["1E-7", "0E-7"]),
    ([dt.date(2024, 1, 5)], pa.date32(), ["2024-01-05"]),
    ([dt.datetime(2024, 1, 5, tzinfo=UTC)], pa.timestamp("us", tz="UTC"),
     ["1704412800000000"]),
    ([dt.datetime(2024, 1, 5, 0, 0, 1)], pa.timestamp("us"), ["1704412801000000"]),
    ([dt.datetime(2024, 1, 5, tzinfo=UTC)], pa.timestamp("ms", tz="UTC"), ["1704412800000"]),
    ([dt.datetime(2024, 1, 5, tzinfo=UTC)], pa.timestamp("s", tz="UTC"), ["1704412800000"]),
    ([dt.time(0, 0, 1)], pa.time64("us"), ["1000000"]),
    (["x", "ünï"], pa.string(), ["x", "ünï"]),
])
def test_field_strings_match_java_string_value_of(values: list[Any], arrow_type: pa.DataType,
                                                  expected: list[str]) -> None:
    assert field_strings(pa.array(values, arrow_type), "f").to_pylist() == expected


@pytest.mark.parametrize("arrow_type", [pa.binary(), pa.list_(pa.int64())])
def test_record_key_type_without_java_text_refused_naming_field(tmp_path: Path,
                                                                arrow_type: pa.DataType) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="k", precombine="ts")
    value = b"a" if pa.types.is_binary(arrow_type) else [1]
    with pytest.raises(InvalidRecordError, match="'k'"):
        table.upsert(pa.table({"k": pa.array([value], arrow_type), "ts": [1]}))
    assert table.timeline() == []


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
@pytest.mark.parametrize("index", ["SIMPLE", "BUCKET"])
def test_key_filter_complex_keygen_one_key_field_finds_record(tmp_path: Path,
                                                              table_type: str,
                                                              index: str) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", table_type=table_type,
                         record_key="id", precombine="ts", partition_by=["a", "b"],
                         options={"hoodie.index.type": index})
    table.upsert(pa.table({"id": ["x", "y"], "ts": [1, 1], "a": ["p", "p"], "b": ["q", "q"]}))
    assert sorted(hudi_rs_read(table.path).column("_hoodie_record_key").to_pylist()) == [
        "id:x", "id:y"]
    got = table.read(filters=[("id", "=", "x")])
    assert got.column("id").to_pylist() == ["x"]
    assert table.read(filters=[("id", "in", ["y", "z"])]).column("id").to_pylist() == ["y"]


def test_key_filter_two_key_fields_finds_record(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key=["id", "n"],
                         precombine="ts", partition_by="a")
    table.upsert(pa.table({"id": ["x", "x"], "n": [1, 2], "ts": [1, 1], "a": ["p", "p"]}))
    got = table.read(filters=[("id", "=", "x"), ("n", "=", 2)])
    assert got.column("_hoodie_record_key").to_pylist() == ["id:x,n:2"]


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_float_key_stored_as_java_double_and_found_by_filter(tmp_path: Path,
                                                             table_type: str) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", table_type=table_type,
                         record_key="id", precombine="ts",
                         options={"hoodie.index.type": "BUCKET",
                                  "hoodie.bucket.index.num.buckets": "8"})
    table.upsert(pa.table({"id": [2.0, 1e7, 0.5], "ts": [1, 1, 1]}))
    stored = sorted(hudi_rs_read(table.path).column("_hoodie_record_key").to_pylist())
    assert stored == ["0.5", "1.0E7", "2.0"]
    for value in (2.0, 2):
        assert table.read(filters=[("id", "=", value)]).column("id").to_pylist() == [2.0]
    (row,) = table.read(filters=[("id", "=", 1e7)]).to_pylist()
    assert bucket_from_file_id(row["_hoodie_file_name"].split("_")[0]) == ref_bucket(
        ["1.0E7"], 8)
    table.delete(pa.table({"id": [2]}))  # an int given for the double key: the stored 2.0
    assert sorted(table.read().column("id").to_pylist()) == [0.5, 1e7]


def test_timestamp_key_stored_as_epoch_micros_and_found_by_filter(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="at", precombine="ts")
    at = [dt.datetime(2024, 1, 5, tzinfo=UTC), dt.datetime(2024, 1, 6, tzinfo=UTC)]
    table.upsert(pa.table({"at": pa.array(at, pa.timestamp("us", tz="UTC")), "ts": [1, 2]}))
    stored = sorted(hudi_rs_read(table.path).column("_hoodie_record_key").to_pylist())
    assert stored == ["1704412800000000", "1704499200000000"]
    got = table.read(filters=[("at", "=", at[1])])
    assert got.column("ts").to_pylist() == [2]


def test_timestamp_partition_folder_is_epoch_micros_and_prunes_reads(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts",
                         partition_by="day")
    days = [dt.datetime(2024, 1, 5, tzinfo=UTC), dt.datetime(2024, 1, 6, tzinfo=UTC)]
    table.upsert(pa.table({"id": ["a", "b"], "ts": [1, 1],
                           "day": pa.array(days, pa.timestamp("us", tz="UTC"))}))
    assert sorted(p.name for p in Path(table.path).iterdir() if p.name != ".hoodie") == [
        "1704412800000000", "1704499200000000"]
    got = table.read(filters=[("day", "=", days[1])])
    assert got.column("id").to_pylist() == ["b"]
    schema = TableReader(table.storage, Timeline.load(table.storage, table.config)).table_schema()
    assert schema is not None
    wanted = [[("day", "=", days[1])]]
    assert not _partition_may_match("1704412800000000", table.config, schema, wanted)
    assert _partition_may_match("1704499200000000", table.config, schema, wanted)


def test_create_with_binary_key_or_partition_field_refused_naming_it(tmp_path: Path) -> None:
    schema = pa.schema([("k", pa.binary()), ("p", pa.string()), ("ts", pa.int64())])
    with pytest.raises(InvalidRecordError, match="'k'"):
        Table.create(str(tmp_path / "t"), name="t", record_key="k", schema=schema)
    schema = pa.schema([("k", pa.string()), ("p", pa.struct([("x", pa.int64())]))])
    with pytest.raises(InvalidRecordError, match="'p'"):
        Table.create(str(tmp_path / "t"), name="t", record_key="k", partition_by="p",
                     schema=schema)
    assert not (tmp_path / "t" / ".hoodie" / "hoodie.properties").exists()


@pytest.mark.parametrize(("key", "value"), [
    ("hoodie.table.keygenerator.class", "org.apache.hudi.keygen.TimestampBasedKeyGenerator"),
    ("hoodie.table.keygenerator.class",
     "org.apache.hudi.keygen.TimestampBasedAvroKeyGenerator"),
    ("hoodie.table.keygenerator.class", "org.apache.hudi.keygen.CustomKeyGenerator"),
    ("hoodie.table.keygenerator.class", "org.apache.hudi.keygen.CustomAvroKeyGenerator"),
    ("hoodie.table.keygenerator.type", "TIMESTAMP"),
    ("hoodie.table.keygenerator.type", "CUSTOM"),
])
def test_write_to_timestamp_or_custom_keygen_table_refused_naming_it(
        tmp_path: Path, key: str, value: str) -> None:
    """A table whose key generator names folders by something else than the fields' values
    (Hudi's timestamp-based one formats the time; a custom one may): tidelake's writer would
    put rows in folders named by the raw values, so it refuses the write up front, naming
    the key generator, and writes nothing; reading stays allowed (hudi-rs agrees)."""
    path = tmp_path / "t"
    table = Table.create(str(path), name="t", table_type="COPY_ON_WRITE", record_key="id",
                         precombine="v", partition_by=["p"])
    table.upsert(pa.table({"id": ["a"], "v": [1], "p": ["2024011510"]}))
    props = path / ".hoodie" / "hoodie.properties"
    kept = [line for line in props.read_text().splitlines()
            if not line.startswith("hoodie.table.keygenerator")]
    props.write_text("\n".join([*kept, f"{key}={value}"]) + "\n")
    timeline = sorted(p.name for p in (path / ".hoodie" / "timeline").iterdir())
    table = Table.open(str(path))
    with pytest.raises(UnsupportedTableError, match=rf"{key}={value}.*key generator"):
        table.upsert(pa.table({"id": ["b"], "v": [1], "p": ["2024011610"]}))
    assert sorted(p.name for p in (path / ".hoodie" / "timeline").iterdir()) == timeline
    assert Table.open(str(path)).read().column("id").to_pylist() == ["a"]
    assert hudi_rs_read(path).column("id").to_pylist() == ["a"]



def test_write_to_java_timestamp_keygen_sample_refused_and_read_kept(tmp_path: Path) -> None:
    """Hudi 1.1.1's own timestamp-based table (v9, a version tidelake writes): a write is
    refused naming the key generator, nothing lands on its timeline, and the table reads
    as hudi-rs reads it."""
    from tests.conftest import SAMPLES, extract_sample

    path = extract_sample(SAMPLES / "sample_table__cow__v9_timebasedkeygen_nonhivestyle.zip",
                          tmp_path, "v9_timebasedkeygen_nonhivestyle")
    table = Table.open(str(path))
    before = sorted(p.name for p in (path / ".hoodie" / "timeline").iterdir())
    rows = table.read()
    with pytest.raises(UnsupportedTableError,
                       match=r"hoodie\.table\.keygenerator\.type=TIMESTAMP.*key generator"):
        table.upsert(rows.slice(0, 1).drop_columns(
            [c for c in rows.column_names if c.startswith("_hoodie_")]))
    assert sorted(p.name for p in (path / ".hoodie" / "timeline").iterdir()) == before
    judge = hudi_rs_read(path)
    assert sorted(table.read().column("txn_id").to_pylist()) == sorted(
        judge.column("txn_id").to_pylist())


@pytest.mark.parametrize(("arg", "fields"), [("record_key", "meta.id"),
                                             ("record_key", ["k", "meta.id"]),
                                             ("partition_by", "meta.day")])
def test_create_with_nested_key_or_partition_field_refused_naming_the_option(
        tmp_path: Path, arg: str, fields: Any) -> None:
    """Hudi takes nested key fields (``meta.id``: the nested value); tidelake makes keys of
    top-level columns only and refuses such a table when it is defined, naming the
    argument and the field, before anything is on storage (the first write used to fail
    with a bare lookup error)."""
    given = {"record_key": "k", "partition_by": None, arg: fields}
    with pytest.raises(ValueError, match=rf"{arg}: 'meta\.\w+' names a nested field"):
        Table.create(str(tmp_path / "t"), name="t", precombine="ts", **given)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("key", ["hoodie.table.recordkey.fields",
                                 "hoodie.table.partition.fields"])
def test_write_to_table_with_nested_key_field_refused_naming_the_key(
        tmp_path: Path, key: str) -> None:
    """A table another writer keyed (or partitioned) by a nested field: writes are refused
    up front naming the ``hoodie.properties`` key; nothing is written."""
    path = tmp_path / "t"
    table = Table.create(str(path), name="t", table_type="COPY_ON_WRITE", record_key="id",
                         precombine="v", partition_by=["p"])
    table.upsert(pa.table({"id": ["a"], "v": [1], "p": ["x"]}))
    props = path / ".hoodie" / "hoodie.properties"
    kept = [line for line in props.read_text().splitlines() if not line.startswith(key)]
    props.write_text("\n".join([*kept, f"{key}=meta.f"]) + "\n")
    timeline = sorted(p.name for p in (path / ".hoodie" / "timeline").iterdir())
    with pytest.raises(UnsupportedTableError, match=rf"{key}=meta\.f.*nested"):
        Table.open(str(path)).upsert(pa.table({"id": ["b"], "v": [1], "p": ["x"]}))
    assert sorted(p.name for p in (path / ".hoodie" / "timeline").iterdir()) == timeline


@pytest.mark.parametrize(("partition_fields", "refused"), [
    ("day", True),
    ("region,day", False),
    ("region:SIMPLE,day:SIMPLE", True),
])
def test_write_to_slash_separated_date_partitioning_table_refused_where_java_slashes(
        tmp_path: Path, partition_fields: str, refused: bool) -> None:
    """Hudi 1.2's ``hoodie.datasource.write.slash.separated.date.partitioning=true`` (a table
    property): Java turns the dashes of a value into folders, ``2026-01-05`` →
    ``2026/01/05`` (``KeyGenUtils.getPartitionPath`` → ``slashSeparateDateValue``), for a
    table of one partition field and for every SIMPLE part of a custom key generator, not
    for the complex key generator's several fields (``getRecordPartitionPath`` guards on
    one field). tidelake's writer would write ``2026-01-05``, a second folder for the same
    key: such writes are refused naming the key, nothing written; the complex table is
    written as Java writes it."""
    path = tmp_path / "t"
    custom = ":" in partition_fields
    fields = [f.split(":")[0] for f in partition_fields.split(",")]
    key = "hoodie.datasource.write.slash.separated.date.partitioning"
    java_custom_keygen_table(path, record_key="id", partition_fields=partition_fields,
                             hive_style=False, url_encode=False)
    props = path / ".hoodie" / "hoodie.properties"
    text = props.read_text()
    if not custom:
        text = text.replace("hoodie.table.keygenerator.type=CUSTOM",
                            f"hoodie.table.keygenerator.type="
                            f"{'SIMPLE' if len(fields) == 1 else 'COMPLEX'}")
    props.write_text(text + f"{key}=TRUE\n")
    row = {"id": ["a"], "ts": [1], "region": ["eu"], "day": ["2026-01-05"]}
    batch = pa.table({k: v for k, v in row.items() if k in ("id", "ts", *fields)})
    table = Table.open(str(path))
    if not refused:
        table.upsert(batch)
        assert table.read().column("_hoodie_partition_path").to_pylist() == ["eu/2026-01-05"]
        return
    with pytest.raises(UnsupportedTableError, match=rf"{key}=TRUE"):
        table.upsert(batch)
    assert table.timeline() == []
    assert table.read().num_rows == 0
