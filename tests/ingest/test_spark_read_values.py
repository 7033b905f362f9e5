"""``format("tidelake")``'s columns and filters on real Spark, the cases nobody tried:
time, date and decimal values in ``tidelake.read.filters`` (in a session whose time zone is
not UTC), nested and oddly named columns in ``tidelake.read.columns`` and ``.schema(...)``,
and incremental queries and streams of chosen columns (bytes counted at the S3 test
server). Rows are judged by hudi-rs's full read filtered by pyarrow with values the test
builds itself, or by the values the test wrote where hudi-rs cannot read the table."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import Table
from engine.schema import COMMIT_TIME, META_FIELDS
from engine.storage import Storage
from engine.storage.ranged import TAIL_GUESS
from ingest.spark_read import register
from tests.engine.object_store_checks import base_file_bytes
from tests.helpers import hudi_rs_read
from tests.ingest.helpers import all_rows
from tests.s3 import S3Location
from tests.spark_session import spark  # noqa: F401

pytestmark = [pytest.mark.spark]

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

UTC = dt.timezone.utc
CET = dt.timezone(dt.timedelta(hours=1))
D = decimal.Decimal
FILTERS = "tidelake.read.filters"
COLUMNS = "tidelake.read.columns"


@pytest.fixture(scope="module")
def tidelake(spark: SparkSession) -> Iterator[SparkSession]:  # noqa: F811
    """The shared session with the tidelake source registered."""
    register(spark)
    yield spark


def _load(spark: SparkSession, path: str, **options: str) -> DataFrame:  # noqa: F811
    reader = spark.read.format("tidelake")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(path)


def _times_table(path: Path) -> Table:
    """Merge-on-read, partitioned by a date, a timestamp column given in Oslo time (stored
    as UTC instants), a decimal column; column and partition stats; updates in log files."""
    table = Table.create(str(path), name="t", table_type="MERGE_ON_READ", record_key="id",
                         precombine="v", partition_by=["day"],
                         options={"hoodie.metadata.index.column.stats.enable": "true",
                                  "hoodie.metadata.index.partition.stats.enable": "true",
                                  "hoodie.parquet.small.file.limit": "1"})
    base = dt.datetime(2024, 3, 1, tzinfo=UTC)
    for v, ids in ((1, range(0, 12)), (1, range(12, 24)), (2, range(3, 20, 4))):
        at = [base + dt.timedelta(hours=5 * i + 100 * (v - 1)) for i in ids]
        table.upsert(pa.table({
            "id": [f"k{i:02d}" for i in ids], "v": [v] * len(ids),
            "day": pa.array([(base + dt.timedelta(hours=5 * i)).date() for i in ids]),
            "at": pa.array([a.astimezone(CET) for a in at],
                           pa.timestamp("us", tz="Europe/Oslo")),
            "dec": pa.array([D(i * v) / 8 for i in ids], pa.decimal128(12, 3))}))
    assert any(s.log_files for s in table.file_slices())
    return table


def _at(value: dt.datetime) -> pa.Scalar:
    return pa.scalar(value.astimezone(UTC), pa.timestamp("us", tz="UTC"))


def test_spark_read_time_date_decimal_filters_equal_hudi_rs_in_a_non_utc_session(
        tidelake: SparkSession, tmp_path: Path) -> None:
    """Times with offsets or ``Z``, ISO dates (on the partition column) and decimals finer
    than their column read the rows of hudi-rs's full read that pyarrow keeps, in a session
    whose time zone is Los Angeles; what Spark and hudi-rs would read differently — a
    zone-less time against instants, an epoch number — fails naming the option and the
    column. The refusals rest on Spark's own reading, checked here: a zone-less string is a
    time in the session zone, an offset against ``TIMESTAMP_NTZ`` is dropped, a number cast
    to a time is seconds."""
    table = _times_table(tmp_path / "t")
    judge = hudi_rs_read(table.path)
    cases = [
        ('[["at", ">=", "2024-03-03T10:00:00+01:00"], ["day", "<=", "2024-03-04"]]',
         (pc.field("at") >= _at(dt.datetime(2024, 3, 3, 10, tzinfo=CET)))
         & (pc.field("day") <= pa.scalar(dt.date(2024, 3, 4)))),
        ('[["at", "<", "2024-03-02T12:00:00Z"]]',
         pc.field("at") < _at(dt.datetime(2024, 3, 2, 12, tzinfo=UTC))),
        ('[["day", "in", ["2024-03-01", "2024-03-05"]]]',
         pc.field("day").isin(pa.array([dt.date(2024, 3, 1), dt.date(2024, 3, 5)]))),
        ('[["dec", ">", "1.0005"]]', pc.field("dec") > pa.scalar(D("1.0005"))),
        ('[["dec", "=", 1.25]]', pc.field("dec") == pa.scalar(D("1.25"))),
    ]
    zone = tidelake.conf.get("spark.sql.session.timeZone")
    tidelake.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        premise = tidelake.sql(
            "SELECT CAST('2024-03-01 10:00:00' AS TIMESTAMP) = "
            "CAST('2024-03-01T10:00:00Z' AS TIMESTAMP) AS same_instant, "
            "CAST(CAST('2024-03-01T10:00:00+05:00' AS TIMESTAMP_NTZ) AS STRING) AS local, "
            "CAST(1709287200 AS TIMESTAMP) = CAST('2024-03-01T10:00:00Z' AS TIMESTAMP) "
            "AS seconds").collect()[0]
        assert premise.same_instant is False and premise.local == "2024-03-01 10:00:00"
        assert premise.seconds is True
        for filters, expr in cases:
            df = _load(tidelake, table.path, **{FILTERS: filters})
            got = all_rows(df.toArrow())
            assert got == all_rows(judge.filter(expr)), filters
        for filters, column in (('[["at", ">=", "2024-03-03 10:00:00"]]', "'at'"),
                                ('[["at", ">", 1709287200]]', "'at'"),
                                ('[["day", "=", "2024-03-02T00:00:00Z"]]', "'day'")):
            with pytest.raises(Exception, match=rf"{FILTERS}.*{column}"):
                _load(tidelake, table.path, **{FILTERS: filters}).collect()
    finally:
        tidelake.conf.set("spark.sql.session.timeZone", zone)


NESTED = pa.schema([("id", pa.string()), ("ts", pa.int64()),
                    ("meta", pa.struct([("src", pa.string()), ("n", pa.int64())])),
                    ("tags", pa.list_(pa.string())), ("attrs", pa.map_(pa.string(), pa.int64())),
                    ("v", pa.float64())])


def _nested(ids: range, ts: int) -> pa.Table:
    return pa.Table.from_pylist([
        {"id": f"k{i}", "ts": ts, "meta": {"src": f"s{i % 3}", "n": i * ts},
         "tags": [f"t{i}"] * (i % 3), "attrs": [("a", i), ("b", ts)], "v": i * 1.5 + ts}
        for i in ids], schema=NESTED)


def test_spark_read_nested_and_odd_column_names(tidelake: SparkSession, tmp_path: Path
                                                ) -> None:
    """A struct, a list and a map column, chosen by ``tidelake.read.columns`` or a schema,
    read as hudi-rs reads them (merged slices too, in a batch, an incremental query and a
    stream); a struct's field (``meta.src``) or a struct of fewer fields is refused with
    what to do instead; a name differing in case is refused naming the table's (names with a
    dot or a space are refused on write: tests/engine/test_schema_evolution.py)."""
    table = Table.create(str(tmp_path / "t"), name="t", table_type="MERGE_ON_READ",
                         record_key="id", precombine="ts")
    table.upsert(_nested(range(10), 1))
    table.upsert(_nested(range(5, 15), 2))
    assert any(s.log_files for s in table.file_slices())
    judge = hudi_rs_read(table.path)
    names = ["meta", "tags", "attrs", "id"]
    expected = all_rows(judge.select(names))
    by_option = _load(tidelake, table.path, **{COLUMNS: ",".join(names)})
    assert all_rows(by_option.toArrow()) == expected
    given = ("meta STRUCT<src: STRING, n: BIGINT>, tags ARRAY<STRING>, "
             "attrs MAP<STRING, BIGINT>, id STRING")
    by_schema = tidelake.read.format("tidelake").schema(given).load(table.path)
    assert all_rows(by_schema.toArrow()) == expected
    assert sorted(r.src for r in by_schema.select("meta.src").collect()) == sorted(
        judge.column("meta").combine_chunks().field("src").to_pylist())
    start = [e.completion_time for e in table.timeline() if e.state == "completed"][1]
    incremental = _load(tidelake, table.path, **{
        COLUMNS: "id,meta", "hoodie.datasource.query.type": "incremental",
        "hoodie.datasource.read.begin.instanttime": start})
    assert all_rows(incremental.toArrow()) == all_rows(
        judge.filter(pc.field("ts") == 2).select(["id", "meta"]))

    for options, said in (({COLUMNS: "meta.src"}, r"'meta' is a struct.*select meta\.src"),
                          ({COLUMNS: "Meta"}, "case-sensitive: 'meta'")):
        with pytest.raises(Exception, match=said):
            _load(tidelake, table.path, **options).collect()
    with pytest.raises(Exception, match=r"struct<src:string,n:bigint> in the table, not "
                                        r"struct<src:string>.*read whole"):
        tidelake.read.format("tidelake").schema("meta STRUCT<src: STRING>").load(
            table.path).collect()



def test_spark_incremental_query_and_stream_of_chosen_columns_fetch_only_their_chunks(
        tidelake: SparkSession, s3: S3Location, tmp_path: Path) -> None:
    """An incremental query and a stream of ``tidelake.read.columns=v`` on S3 fetch, of
    each base file, its footer and the chunks of ``v`` and of what the read needs (the
    commit time; a merged slice's meta fields and ordering field), counted at the server,
    not the wide column the query does not ask for; rows equal hudi-rs's."""
    table = Table.create(s3.uri(), name="t", table_type="MERGE_ON_READ", record_key="key",
                         precombine="ts", partition_by="part",
                         storage_options=s3.storage_options)
    rows = 20_000

    def batch(ids: range, ts: int) -> pa.Table:
        return pa.table({"key": [f"k{i:06d}" for i in ids], "ts": [ts] * len(ids),
                         "part": [f"p{i % 2}" for i in ids],
                         "v": pa.array([i * 0.25 + ts for i in ids], pa.float64()),
                         "note": [f"a wide column nobody asks for {i:09d}" * 12 for i in ids]})

    first = table.bulk_insert(batch(range(rows), 1))
    table.upsert(pa.concat_tables([batch(range(300), 2), batch(range(rows, rows + 300), 2)]))
    assert any(s.log_files for s in table.file_slices())
    done = [e.completion_time for e in table.timeline() if e.state == "completed"]
    assert done[0] == next(e.completion_time for e in table.timeline() if e.instant_time == first)
    start = done[0]  # the first commit's: the read is of the second (the update)
    scan = table.scan_incremental(start, None, ["v"])
    merged = ["v", "ts", *META_FIELDS]
    needed, whole = base_file_bytes(Storage(s3.uri(), s3.storage_options), scan.slices,
                                    lambda s: merged if s.log_files else ["v", COMMIT_TIME])
    assert needed * 2 < whole
    judge = hudi_rs_read(s3.uri(), storage_options=s3.storage_options, start=start)
    expected = all_rows(judge.select(["v"]))
    assert len(expected) == 600
    store = s3.storage_options

    with s3.server.fetched(s3.bucket) as sent:
        got = _load(tidelake, s3.uri(), **store, **{
            COLUMNS: "v", "hoodie.datasource.query.type": "incremental",
            "hoodie.datasource.read.begin.instanttime": done[1]}).toArrow()
    fetched = sum(size for key, size in sent if key.endswith(".parquet"))
    assert fetched <= 2 * needed + len(scan.slices) * TAIL_GUESS, (fetched, needed, whole)
    assert all_rows(got) == all_rows(pa.table({"v": pa.array(
        [r["v"] for r in expected], pa.float64())}))

    batches: list[pa.Table] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        batches.append(df.toArrow())

    reader = tidelake.readStream.format("tidelake")
    for key, value in {**store, COLUMNS: "v",
                       "hoodie.datasource.streaming.startOffset": start}.items():
        reader = reader.option(key, value)
    with s3.server.fetched(s3.bucket) as sent:
        (reader.load(s3.uri()).writeStream.foreachBatch(collect)
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True)
         .start().awaitTermination(300))
    fetched = sum(size for key, size in sent if key.endswith(".parquet"))
    assert fetched <= 2 * needed + len(scan.slices) * TAIL_GUESS, (fetched, needed, whole)
    streamed = [b for b in batches if b.num_rows]
    assert streamed and all_rows(pa.concat_tables(streamed)) == all_rows(
        pa.table({"v": pa.array([r["v"] for r in expected], pa.float64())}))

