"""``ingest.spark_query.read_table`` / ``register_table`` on real Spark: queries pruned by the
engine, base files read by Spark's Parquet scan.

Every read equals the engine's read with the same columns, filters and read options, row for
row and column for column (and, unfiltered, hudi-rs's), whichever path each slice takes; the
files Spark's Parquet scan reads are base files of slices the engine's plan kept, never one its
pruning skipped. Hostile cases: a write left pending and then rolled back over base files,
deletes in logs, files of an older schema (an added column, a widened type), timestamps with
and without a zone, decimals, dates, NaN and null under filters, an empty table, a table on
an object store.
"""

from __future__ import annotations

import datetime as dt
import decimal
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import Table
from engine.timeline.active import Timeline
from engine.write.group_writer import UPSERT
from ingest.ddl import spark_schema
from ingest.spark_query import read_table, register_table, spark_condition
from tests.conftest import SAMPLES
from tests.engine.helpers import COLUMNS, SCHEMA
from tests.helpers import hudi_rs_read, sorted_rows
from tests.ingest.helpers import all_rows, build_read_table
from tests.s3 import S3Server
from tests.spark_session import spark  # noqa: F401

pytestmark = [pytest.mark.spark]

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

QUERIES: list[tuple[list[str] | None, Any]] = [
    (None, None),
    (None, [("region", "=", "north")]),  # the partition column
    (None, [("amount", ">", 30.0), ("note", "not in", ["x"])]),  # nullable: nulls kept by not in
    (["key", "amount", "_hoodie_commit_time"], [[("region", "in", ["south", ".."])],
                                                 [("ts", "<", 10)]]),
    (["amount", "key"], [("note", "!=", "")]),
]
"""(columns, filters) of the snapshot queries: projections and filters of each kind."""


def _engine_rows(table: Table, columns: list[str] | None, filters: Any,
                 **read: Any) -> list[dict[str, Any]]:
    return all_rows(table.read(columns, filters, **read))


def _native_files(frame: DataFrame) -> set[str]:
    """The files Spark's Parquet scans of ``frame`` read (absolute local paths)."""
    return {unquote(f.removeprefix("file://")) for f in frame.inputFiles()}


def _kept_base_files(table: Table, columns: list[str] | None, filters: Any,
                     **read: Any) -> set[str]:
    return {table.storage.full(s.base_file.path)
            for s in table.scan(columns, filters, **read).slices if s.base_file is not None}


@pytest.mark.parametrize(("table_type", "partitioned"), [
    ("MERGE_ON_READ", True), ("COPY_ON_WRITE", True), ("MERGE_ON_READ", False)])
def test_read_table_every_query_shape_equals_engine_read_and_hudi_rs(
        spark: SparkSession, tmp_path: Path, table_type: str, partitioned: bool) -> None:  # noqa: F811
    table, oracle, instants = build_read_table(tmp_path / "t", table_type, partitioned,
                                               seed=len(table_type) + 3 * partitioned)
    path = table.path
    native_used = set()
    for columns, filters in QUERIES:
        if not partitioned and filters and "region" in str(filters):
            continue
        frame = read_table(spark, path, columns=columns, filters=filters)
        assert frame.columns == list(table.scan(columns, filters).output_schema().names)
        assert all_rows(frame.toArrow()) == _engine_rows(table, columns, filters), \
            (columns, filters)
        files = _native_files(frame)
        assert files <= _kept_base_files(table, columns, filters)
        native_used |= files
    slow = read_table(spark, path, filters=QUERIES[2][1], native=False)
    assert not _native_files(slow)
    assert all_rows(slow.toArrow()) == _engine_rows(table, None, QUERIES[2][1])
    if table_type == "COPY_ON_WRITE":  # base files alone: read by Spark's Parquet scan
        assert native_used  # (the MOR tables' last upsert left logs in every group)

    snapshot = read_table(spark, path).toArrow()
    assert sorted_rows(snapshot, COLUMNS) == sorted_rows(hudi_rs_read(path), COLUMNS)
    assert sorted_rows(snapshot, COLUMNS) == oracle.snapshot()

    optimized = read_table(spark, path, options={
        "hoodie.datasource.query.type": "read_optimized"})
    assert all_rows(optimized.toArrow()) == all_rows(table.read(read_optimized=True))
    assert _native_files(optimized)  # every base file is read as stored
    assert sorted_rows(optimized.toArrow(), COLUMNS) == sorted_rows(
        hudi_rs_read(path, read_optimized=True), COLUMNS)

    for instant in (instants[1], instants[4]):
        travel = read_table(spark, path, filters=[("ts", ">=", 10)],
                            options={"as.of.instant": instant})
        assert all_rows(travel.toArrow()) == _engine_rows(table, None, [("ts", ">=", 10)],
                                                          as_of=instant)
        assert _native_files(travel) <= _kept_base_files(table, None, [("ts", ">=", 10)],
                                                         as_of=instant)
        whole = read_table(spark, path, options={"as.of.instant": instant}).toArrow()
        assert sorted_rows(whole, COLUMNS) == oracle.snapshot(instant)
        assert sorted_rows(whole, COLUMNS) == sorted_rows(hudi_rs_read(path, as_of=instant),
                                                          COLUMNS)

    done = {e.instant_time: e.completion_time or "" for e in table.timeline()
            if e.state == "completed"}
    begin = done[instants[1]]
    incremental = read_table(spark, path, columns=["key", "amount", "_hoodie_commit_time"],
                             options={"hoodie.datasource.query.type": "incremental",
                                      "hoodie.datasource.read.begin.instanttime": begin})
    expected = table.scan_incremental(begin, None, ["key", "amount", "_hoodie_commit_time"],
                                      start_inclusive=True).to_table()
    assert expected.num_rows and all_rows(incremental.toArrow()) == all_rows(expected)
    assert not _native_files(incremental)  # a commit range: read by the engine


def test_read_table_filter_reads_only_the_partitions_the_engine_keeps(
        spark: SparkSession, tmp_path: Path) -> None:  # noqa: F811
    """A compacted partitioned table: a filter on the partition column reads that
    partition's base files only, through Spark's Parquet scan; SQL on a view registered with
    the filter returns the engine's rows; one without it, Spark's WHERE on every file."""
    table = Table.create(str(tmp_path / "t"), name="trips", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by=["region"],
                         options={"hoodie.metadata.index.column.stats.enable": "true"})
    rows = pa.Table.from_pylist(
        [{"key": f"k{i}", "ts": i, "region": ("north", "south", "east")[i % 3],
          "amount": float(i) if i % 7 else None, "note": str(i % 5)} for i in range(90)],
        schema=SCHEMA)
    table.upsert(rows)
    table.upsert(rows.slice(0, 30).set_column(1, "ts", pa.array([100] * 30, pa.int64())))
    table.delete(pa.table({"key": ["k3", "k4"], "region": ["north", "south"]}))
    assert table.compact().completed
    filters = [("region", "=", "north")]
    frame = read_table(spark, table.path, columns=["key", "amount"], filters=filters)
    north = {table.storage.full(s.base_file.path) for s in table.scan().slices
             if s.partition_path == "north" and s.base_file is not None}
    assert north and _native_files(frame) == north
    assert all_rows(frame.toArrow()) == _engine_rows(table, ["key", "amount"], filters)
    assert "FileScan parquet" in frame._jdf.queryExecution().executedPlan().toString()

    register_table(spark, "north_trips", table.path, filters=filters)
    got = spark.sql("SELECT key, amount FROM north_trips WHERE amount IS NOT NULL").toArrow()
    expected = table.read(["key", "amount"], filters)
    assert all_rows(got) == all_rows(expected.filter(pc.is_valid(expected["amount"])))
    register_table(spark, "trips", table.path)
    total = spark.sql("SELECT region, count(*) AS n FROM trips WHERE region <> 'north' "
                      "GROUP BY region").collect()
    counts = pc.value_counts(table.read(filters=[("region", "!=", "north")])["region"])
    assert {r.region: r.n for r in total} == {
        str(c["values"]): c["counts"] for c in counts.to_pylist()}
    assert spark.sql("SELECT count(*) AS n FROM trips").collect()[0].n == len(table.read())


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_read_table_pending_and_rolled_back_writes_stay_invisible(
        spark: SparkSession, tmp_path: Path, table_type: str) -> None:  # noqa: F811
    """A write that wrote its files over compacted (or COW) file groups and never reached its
    commit point, then that write rolled back: neither shows, through either path."""
    table = Table.create(str(tmp_path / "t"), name="trips", table_type=table_type,
                         record_key="key", precombine="ts", partition_by=["region"])
    rows = pa.Table.from_pylist(
        [{"key": f"k{i}", "ts": 1, "region": ("north", "south")[i % 2], "amount": float(i),
          "note": None} for i in range(40)], schema=SCHEMA)
    table.upsert(rows)
    if table_type == "MERGE_ON_READ":
        table.upsert(rows.slice(0, 10))
        assert table.compact().completed
    before = all_rows(table.read())

    client = table.write_client()
    seen = Timeline.load(table.storage, table.config)
    update = rows.slice(0, 20).set_column(1, "ts", pa.array([9] * 20, pa.int64()))
    records, deletes = client.prepare(update, seen, dedupe=True)
    timeline, inflight = client.begin(seen=seen)
    plan = client.plan(timeline, inflight, UPSERT, records, deletes, None)
    assert client.execute_local(plan)  # files written, no commit
    try:
        assert {e.state for e in table.timeline()} >= {"inflight"}
        for native in (True, False):
            frame = read_table(spark, table.path, native=native)
            assert all_rows(frame.toArrow()) == before
        assert _native_files(read_table(spark, table.path))
    finally:
        client.abort(inflight)
    assert any(e.action == "rollback" for e in table.timeline())
    frame = read_table(spark, table.path, filters=[("region", "=", "south")])
    assert all_rows(frame.toArrow()) == all_rows(table.read(filters=[("region", "=", "south")]))
    assert all_rows(read_table(spark, table.path).toArrow()) == before


def test_read_table_files_of_an_older_schema_read_as_the_engine_reads_them(
        spark: SparkSession, tmp_path: Path) -> None:  # noqa: F811
    """A column added: the files written before it are read by Spark's Parquet scan, null
    in it. A type widened (int -> long): the files holding the narrow type are read by the
    engine, which casts them; the others by Spark."""
    table = Table.create(str(tmp_path / "t"), name="evolving", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by=["part"])
    table.upsert(pa.table({"key": ["a", "b"], "ts": [1, 1], "part": ["p1", "p1"],
                           "n": pa.array([1, 2], pa.int32())}))
    table.upsert(pa.table({"key": ["c", "d"], "ts": [1, 1], "part": ["p2", "p2"],
                           "n": pa.array([3, None], pa.int32()), "extra": ["x", None]}))
    frame = read_table(spark, table.path, filters=[("extra", "=", "x")])
    assert all_rows(frame.toArrow()) == all_rows(table.read(filters=[("extra", "=", "x")]))
    whole = read_table(spark, table.path)
    assert all_rows(whole.toArrow()) == all_rows(table.read())
    assert {Path(f).parent.name for f in _native_files(whole)} == {"p1", "p2"}

    table.upsert(pa.table({"key": ["e"], "ts": [1], "part": ["p3"],
                           "n": pa.array([2**40], pa.int64()), "extra": ["y"]}))
    for filters in (None, [("n", ">", 2)], [("extra", "not in", ["y"])]):
        frame = read_table(spark, table.path, filters=filters)
        assert dict(zip(frame.columns, [f.dataType.simpleString()
                                        for f in frame.schema.fields], strict=True))["n"] \
            == "bigint"
        assert all_rows(frame.toArrow()) == all_rows(table.read(filters=filters)), filters
    native = {Path(f).parent.name for f in _native_files(read_table(spark, table.path))}
    assert native == {"p3"}  # the int32 files are cast by the engine
    assert sorted_rows(read_table(spark, table.path).toArrow(), ["key", "n", "extra"]) == \
        sorted_rows(hudi_rs_read(table.path), ["key", "n", "extra"])


TYPED = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("part", pa.string()),
                   ("at", pa.timestamp("us", tz="UTC")), ("wall", pa.timestamp("us")),
                   ("price", pa.decimal128(12, 3)), ("day", pa.date32()),
                   ("score", pa.float64())])


def _typed_rows(keys: range, ts: int) -> pa.Table:
    base = dt.datetime(2024, 3, 1, 12, 0, 0)
    return pa.Table.from_pylist([{
        "key": f"k{i}", "ts": ts, "part": ("a", "b")[i % 2],
        "at": (base + dt.timedelta(hours=i)).replace(tzinfo=dt.timezone.utc),
        "wall": base + dt.timedelta(hours=i, microseconds=i),
        "price": decimal.Decimal(f"{i}.{i % 1000:03d}") if i % 5 else None,
        "day": dt.date(2024, 3, 1 + i % 28),
        "score": (float("nan") if i % 4 == 0 else None if i % 4 == 1 else i / 3.0),
    } for i in keys], schema=TYPED)


def test_read_table_timestamps_decimals_dates_nan_and_nulls_match_the_engine(
        spark: SparkSession, tmp_path: Path) -> None:  # noqa: F811
    """Timestamps given with and without a zone (tidelake stores both as UTC instants:
    engine/format/timestamps.py), filter values with and without one, decimals, dates, NaN
    and nulls, through Spark's Parquet scan (partition ``a``: base files alone) and the
    engine (partition ``b``: logs over them), unfiltered and under each kind of filter,
    equal the engine's read."""
    table = Table.create(str(tmp_path / "t"), name="typed", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by=["part"])
    table.upsert(_typed_rows(range(40), 1))
    table.upsert(_typed_rows(range(1, 40, 2), 2))  # partition b only
    utc = dt.timezone.utc
    cases: list[Any] = [
        None,
        [("at", ">=", dt.datetime(2024, 3, 2, 0, 0))],  # zone-less: UTC wall-clock time
        [("at", "<", dt.datetime(2024, 3, 2, 3, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))))],
        [("wall", ">", dt.datetime(2024, 3, 1, 20, 0, 0, 8))],
        [("wall", "<=", dt.datetime(2024, 3, 1, 23, 0, tzinfo=utc))],
        [("price", ">", decimal.Decimal("10.5"))],
        [("price", "not in", [decimal.Decimal("3.003")])],
        # values the column cannot hold: more digits after the point, beyond its precision,
        # past Spark's 38 digits (the engine compares them exactly: reader.decimal_term)
        [("price", ">", decimal.Decimal("10.0105"))],
        [("price", "<=", decimal.Decimal("13.0130000000000000000000000000000000000001"))],
        [("price", "=", decimal.Decimal("3.0030000000000000000000000000000000000001"))],
        [("price", "!=", decimal.Decimal("3.0035"))],
        [("price", "in", [decimal.Decimal("3.003"), decimal.Decimal("7.0071")])],
        [("price", "<", decimal.Decimal("1E+40"))],
        [("price", ">=", decimal.Decimal("-1E+40"))],
        [("day", "=", dt.date(2024, 3, 5))],
        [("score", ">", 2.0)],  # NaN never greater (pyarrow); Spark alone would keep it
        [("score", "<=", 5)],
        [("score", "!=", 1.0)],
        [[("score", "=", 3.0)], [("day", "in", [dt.date(2024, 3, 9)])]],
    ]
    for filters in cases:
        frame = read_table(spark, table.path, filters=filters)
        expected = table.read(filters=filters)
        assert all_rows(frame.toArrow()) == all_rows(expected), filters
    native = _native_files(read_table(spark, table.path))
    assert native and all(Path(f).parent.name == "a" for f in native)
    types = {f.name: f.dataType.simpleString() for f in read_table(spark, table.path).schema}
    assert (types["at"], types["wall"], types["price"], types["day"]) == (
        "timestamp", "timestamp", "decimal(12,3)", "date")


def test_spark_condition_declines_what_it_cannot_say_exactly(
        spark: SparkSession, tmp_path: Path) -> None:  # noqa: F811
    """A filter with no exact Spark form (an Arrow expression, a float against an integer
    column, NaN, an unknown column) reads every slice through the engine — still the
    engine's rows, or its error."""
    table, _, _ = build_read_table(tmp_path / "t", "COPY_ON_WRITE", True, seed=11)
    schema = spark_schema(SCHEMA)
    for filters in ([("ts", ">=", 2.5)], [("amount", ">", float("nan"))],
                    [("nope", "=", 1)], pc.field("ts") > 3, [("ts", "between", 3)]):
        assert spark_condition(filters, schema) is None, filters
    assert spark_condition(None, schema) is True
    for filters in ([("ts", ">=", 2.5)], pc.field("ts") > 3):
        frame = read_table(spark, table.path, filters=filters)
        assert not _native_files(frame)
        assert all_rows(frame.toArrow()) == all_rows(table.read(filters=filters))


def test_read_table_empty_table_and_object_store(
        spark: SparkSession, tmp_path: Path, s3_server: S3Server) -> None:  # noqa: F811
    """A table without commits: the meta fields, no rows. A table on S3 (no Hadoop file
    system for it in Spark): every slice read by the engine with the read's store options,
    pruned as on disk."""
    empty = Table.create(str(tmp_path / "empty"), name="empty", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts")
    frame = read_table(spark, empty.path)
    assert frame.columns[:5] == ["_hoodie_commit_time", "_hoodie_commit_seqno",
                                 "_hoodie_record_key", "_hoodie_partition_path",
                                 "_hoodie_file_name"]
    assert frame.count() == 0

    uri = f"s3://{s3_server.new_bucket()}/trips"
    table = Table.create(uri, name="trips", table_type="COPY_ON_WRITE", record_key="key",
                         precombine="ts", partition_by=["region"],
                         storage_options=s3_server.storage_options)
    rows = pa.Table.from_pylist(
        [{"key": f"k{i}", "ts": i, "region": ("north", "south")[i % 2], "amount": float(i),
          "note": None} for i in range(20)], schema=SCHEMA)
    table.upsert(rows)
    filters = [("region", "=", "south"), ("amount", ">", 5.0)]
    frame = read_table(spark, uri, filters=filters, options=s3_server.storage_options)
    assert not _native_files(frame)
    assert all_rows(frame.toArrow()) == all_rows(table.read(filters=filters))


def test_read_table_java_written_samples_equal_engine_read(
        spark: SparkSession, tmp_path: Path) -> None:  # noqa: F811
    """Every sample table Hudi's Spark writer made (tests/fixtures/hudi-samples: v6 and v8,
    COW and MOR, nested structs, arrays, maps, decimals, dates, timestamps, no meta fields,
    an overwrite, a rollback) reads through ``read_table`` as ``Table.read`` reads it, and
    every copy-on-write base file goes to Spark's Parquet scan (Java's list element names
    and nullability are not a difference)."""
    samples = sorted(SAMPLES.glob("*.zip")) if SAMPLES.is_dir() else []
    if not samples:
        pytest.skip("no sample tables (tests/fixtures/hudi-samples)")
    for sample in samples:
        dest = tmp_path / sample.stem
        with zipfile.ZipFile(sample) as archive:
            archive.extractall(dest)
        path = next(p.parent.parent for p in dest.rglob(".hoodie/hoodie.properties")
                    if "metadata" not in p.parts)
        table = Table.open(str(path))
        frame = read_table(spark, str(path))
        assert all_rows(frame.toArrow()) == all_rows(table.read()), sample.name
        slices = table.scan().slices
        if "__cow__" in sample.name:
            assert len(_native_files(frame)) == len(slices), sample.name
