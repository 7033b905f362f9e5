"""``spark.read.format("tidelake")`` and ``spark.readStream.format("tidelake")`` on real Spark.

Random small tables (copy-on-write and merge-on-read, partitioned or not, with a compaction
or a clustering among the commits) are read through Spark with every query type; each read
must equal the engine's own read with the same arguments, row for row and column for column,
and its data the oracle's (tests/helpers.py). Streams: a foreachBatch query across commits
gets every commit once and in order, and a query restarted from its checkpoint (after a stop,
and after a batch that failed) continues without a duplicate or a gap.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql.datasource import DataSource, DataSourceReader, EqualTo

from engine import Table
from engine.errors import InvalidOptionError
from ingest.spark_read import register
from tests.engine.helpers import COLUMNS, SCHEMA, random_batch
from tests.helpers import Oracle, apply_change_feed, hudi_rs_read, sorted_rows
from tests.ingest.helpers import all_rows, build_read_table, same_partition
from tests.s3 import S3Server, authenticated
from tests.spark_session import spark  # noqa: F401

pytestmark = [pytest.mark.spark]

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

COMMIT_TIME = "_hoodie_commit_time"


@pytest.fixture(scope="module")
def tidelake(spark: SparkSession) -> Iterator[SparkSession]:  # noqa: F811
    """The shared session with the tidelake source registered."""
    register(spark)
    yield spark


def _spark_rows(df: DataFrame) -> list[dict[str, Any]]:
    return all_rows(df.toArrow())


def _load(spark: SparkSession, path: str, **options: str) -> DataFrame:  # noqa: F811
    reader = spark.read.format("tidelake")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(path)


SHAPES = [("MERGE_ON_READ", True), ("COPY_ON_WRITE", True), ("MERGE_ON_READ", False),
          ("COPY_ON_WRITE", False)]


@pytest.mark.parametrize(("table_type", "partitioned"), SHAPES)
def test_spark_read_every_query_type_equals_engine_read(
        tidelake: SparkSession, tmp_path: Path, table_type: str, partitioned: bool) -> None:
    table, oracle, instants = build_read_table(tmp_path / "t", table_type, partitioned,
                                     seed=len(table_type) * 7 + partitioned)
    path = table.path
    done = {e.instant_time: e.completion_time or "" for e in table.timeline()
            if e.state == "completed"}

    snapshot = _load(tidelake, path)
    assert snapshot.columns[:5] == ["_hoodie_commit_time", "_hoodie_commit_seqno",
                                    "_hoodie_record_key", "_hoodie_partition_path",
                                    "_hoodie_file_name"]
    got = snapshot.toArrow()
    assert all_rows(got) == all_rows(table.read())
    assert sorted_rows(got, COLUMNS) == oracle.snapshot()
    assert snapshot.rdd.getNumPartitions() == max(len(table.scan().slices), 1)

    optimized = _load(tidelake, path, **{"hoodie.datasource.query.type": "read_optimized"})
    assert _spark_rows(optimized) == all_rows(table.read(read_optimized=True))

    for instant in (instants[1], instants[4]):
        travel = _load(tidelake, path, **{"as.of.instant": instant}).toArrow()
        assert all_rows(travel) == all_rows(table.read(as_of=instant))
        assert sorted_rows(travel, COLUMNS) == oracle.snapshot(instant)

    # Hudi 1.x's range: completion times from begin to end, both included
    begin, end = done[instants[1]], done[instants[3]]
    incremental = _load(tidelake, path, **{
        "hoodie.datasource.query.type": "incremental",
        "hoodie.datasource.read.begin.instanttime": begin,
        "hoodie.datasource.read.end.instanttime": end}).toArrow()
    expected = table.scan_incremental(begin, end, start_inclusive=True).to_table()
    assert expected.num_rows and all_rows(incremental) == all_rows(expected)
    assert sorted_rows(incremental, COLUMNS) == [
        row for row in oracle.snapshot(instants[3]) if row[COMMIT_TIME] in instants[1:4]]
    open_ended = _load(tidelake, path, **{"hoodie.datasource.query.type": "incremental",
                                          "hoodie.datasource.read.begin.instanttime": begin})
    assert _spark_rows(open_ended) == all_rows(
        table.scan_incremental(begin, start_inclusive=True).to_table())


def test_spark_read_where_and_sql_on_one_frame_stay_exact(
        tidelake: SparkSession, tmp_path: Path) -> None:
    """Spark applies WHERE clauses to the rows read; a filtered query then an unfiltered one
    on the same DataFrame or view both see every row they should (Spark 4.3 would reuse a
    pushed-down plan for the second: the source pushes nothing down)."""
    table, oracle, _ = build_read_table(tmp_path / "t", "MERGE_ON_READ", True, seed=5)
    df = _load(tidelake, table.path)
    where = df.where("region = 'north' AND ts >= 20 AND amount IS NOT NULL")
    expected = table.read(filters=[("region", "=", "north"), ("ts", ">=", 20)])
    expected = expected.filter(pa.compute.is_valid(expected.column("amount")))
    assert _spark_rows(where) == all_rows(expected)
    assert df.count() == len(oracle.rows)

    keys = sorted(oracle.rows)[:3]
    by_key = df.where(df.key.isin(keys))
    assert _spark_rows(by_key) == all_rows(table.read(filters=[("key", "in", keys)]))

    df.createOrReplaceTempView("trips")
    counted = tidelake.sql("SELECT region, count(*) AS n FROM trips WHERE region <> 'north' "
                           "GROUP BY region").collect()
    held: dict[str, int] = {}
    for row in oracle.rows.values():
        if row["region"] != "north":
            held[row["region"]] = held.get(row["region"], 0) + 1
    assert {r.region: r.n for r in counted} == held
    assert tidelake.sql("SELECT count(*) AS n FROM trips").collect()[0].n == len(oracle.rows)

    # a DataFrame keeps the slices planned at its first action; a new load sees new commits
    batch = [{"key": "new", "ts": 1, "region": "north", "amount": 1.0, "note": None}]
    table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
    assert df.count() == len(oracle.rows)
    assert _load(tidelake, table.path).count() == len(oracle.rows) + 1


def test_spark_read_bad_options_raise_naming_the_option(
        tidelake: SparkSession, tmp_path: Path) -> None:
    table, _, _ = build_read_table(tmp_path / "t", "COPY_ON_WRITE", False, seed=3)
    for options, key in (({"hoodie.datasource.query.type": "snapshots"},
                          "hoodie.datasource.query.type"),
                         ({"hoodie.datasource.query.type": "incremental"},
                          "hoodie.datasource.read.begin.instanttime"),
                         ({"as.of.instant": "yesterday"}, "as.of.instant"),
                         ({"hoodie.datasource.read.strat.instanttime": "1"},
                          "hoodie.datasource.read.strat.instanttime")):
        with pytest.raises(Exception, match=key.replace(".", r"\.")):
            _load(tidelake, table.path, **options).collect()
    with pytest.raises(InvalidOptionError, match="unknown read option"):
        from engine.read.options import ReadOptions

        ReadOptions.from_options({"hoodie.datasource.read.strat.instanttime": "1"})


def _evolved_table(path: Path) -> tuple[Table, Oracle]:
    """build_read_table's merge-on-read table (slices with log files after its compaction),
    then an upsert that adds the column ``extra`` (older files lack it)."""
    table, oracle, _ = build_read_table(path, "MERGE_ON_READ", True, seed=11)
    batch = same_partition(random_batch(random.Random(4), oracle, [500], 12), oracle)
    rows = pa.Table.from_pylist(batch, schema=SCHEMA)
    rows = rows.append_column("extra", pa.array(range(rows.num_rows), pa.int64()))
    oracle.upsert(batch, table.upsert(rows))
    return table, oracle


def test_spark_read_columns_and_filters_equal_engine_read_and_hudi_rs(
        tidelake: SparkSession, tmp_path: Path) -> None:
    """``tidelake.read.columns`` / ``.schema(...)`` and ``tidelake.read.filters`` read what
    ``Table.read(columns, filters)`` reads, and hudi-rs's rows agree: meta and partition
    columns, a column added by schema evolution (null in older files), merged slices with
    log files projected, a filter on a column not read. The engine plans the pruned slices
    and each task reads only the columns asked (and what merging needs)."""
    from ingest.spark_read import TidelakeDataSource

    table, oracle = _evolved_table(tmp_path / "t")
    assert any(s.log_files for s in table.scan().slices)
    judge = hudi_rs_read(table.path)
    columns = ["amount", "_hoodie_record_key", "region", "extra"]
    terms = [("region", "in", ["north", "east"]), ("ts", ">=", 10)]
    filters = '[["region", "in", ["north", "east"]], ["ts", ">=", 10]]'
    expected = table.read(columns, terms)
    assert expected.num_rows and expected["extra"].null_count not in (0, expected.num_rows)
    wanted = judge.filter(pc.field("region").isin(["north", "east"]) & (pc.field("ts") >= 10))
    assert all_rows(wanted.select(columns)) == all_rows(expected)
    df = _load(tidelake, table.path, **{"tidelake.read.columns": ",".join(columns),
                                        "tidelake.read.filters": filters})
    assert df.columns == columns
    assert _spark_rows(df) == all_rows(expected)
    planned = table.scan(columns, terms).slices
    assert df.rdd.getNumPartitions() == len(planned) < len(table.scan().slices)

    # a schema given to the reader: its columns, in its order, the table's types
    given = "extra BIGINT, key STRING, _hoodie_commit_time STRING, amount DOUBLE"
    by_schema = tidelake.read.format("tidelake").schema(given).load(table.path)
    names = ["extra", "key", "_hoodie_commit_time", "amount"]
    assert _spark_rows(by_schema) == all_rows(table.read(names))
    assert all_rows(judge.select(names)) == all_rows(table.read(names))
    filtered = (tidelake.read.format("tidelake").schema("key STRING")
                .option("tidelake.read.filters", '[["amount", ">", 50.0]]').load(table.path))
    assert sorted(r.key for r in filtered.collect()) == sorted(
        k for k, row in oracle.rows.items() if row["amount"] is not None and row["amount"] > 50)

    # what the executors' tasks read: the columns asked, plus the merge's on log slices
    def tasks(**options: str) -> list[tuple[bool, set[str]]]:
        source = TidelakeDataSource({"path": table.path, "tidelake.read.columns": "amount",
                                     **options})
        return [(bool(p.slice.log_files), set(p.scan.slice_columns(p.slice) or ()))
                for p in source.reader(source.schema()).partitions()]

    merged = tasks()
    assert merged and all(logs and {"_hoodie_record_key", "ts", "amount"} <= read
                          for logs, read in merged)
    base_files = tasks(**{"hoodie.datasource.query.type": "read_optimized"})
    assert base_files and all(read == {"amount"} for _, read in base_files)


def test_spark_read_bad_columns_schema_or_filters_raise_naming_them(
        tidelake: SparkSession, tmp_path: Path) -> None:
    table, _, _ = build_read_table(tmp_path / "t", "COPY_ON_WRITE", True, seed=3)
    for options, named in (({"tidelake.read.columns": "key,nope"}, "tidelake.read.columns"),
                           ({"tidelake.read.filters": '[["nope", "=", 1]]'}, "'nope'"),
                           ({"tidelake.read.filters": "region = 'north'"},
                            "tidelake.read.filters"),
                           ({"tidelake.read.filters": '[["ts", "=", "ten"]]'}, "'ts' is int64")):
        with pytest.raises(Exception, match=named):
            _load(tidelake, table.path, **options).collect()
    for given, named in (("key STRING, nope INT", "no column 'nope'"),
                         ("KEY STRING", "case-sensitive"),
                         ("amount STRING", "'amount' is double in the table, not string")):
        with pytest.raises(Exception, match=named):
            tidelake.read.format("tidelake").schema(given).load(table.path).collect()
    with pytest.raises(Exception, match="the schema given names key"):
        (tidelake.read.format("tidelake").schema("key STRING")
         .option("tidelake.read.columns", "ts").load(table.path).collect())
    query = (tidelake.readStream.format("tidelake")
             .option("tidelake.read.filters", '[["key", "=", "a"]]')
             .load(table.path).writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    with pytest.raises(Exception, match=r"tidelake\.read\.filters.*batch reads only"):
        query.awaitTermination(120)


def test_spark_read_two_stores_each_with_its_own_credentials_never_shows_them(
        tidelake: SparkSession, s3_server: S3Server, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """One session reads two buckets, each with the object store options given to its
    read (`aws_*`, as Storage takes them) and no AWS_* environment: the server checks
    signatures and each user may read its own bucket only, so each read (driver planning
    and executor tasks) used its own credentials. No secret shows in a plan, the query
    execution, Spark's SQL status store (what the UI and event log show), the streams'
    checkpoints, the output or the logs of the driver, the executors and their Python
    workers."""
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    stores = []
    for seed in (1, 2):
        bucket = s3_server.new_bucket()
        uri = f"s3://{bucket}/trips"
        table = Table.create(uri, name="trips", table_type="MERGE_ON_READ", record_key="key",
                             precombine="ts", partition_by=["region"],
                             storage_options=s3_server.storage_options)
        rng, oracle = random.Random(seed), Oracle()
        for size in (12, 8):
            batch = same_partition(random_batch(rng, oracle, [seed * 1000], size), oracle)
            oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA)))
        stores.append((uri, s3_server.bucket_user(bucket), all_rows(table.read()), oracle))
    secrets = [opts["aws_secret_access_key"] for _, opts, _, _ in stores]
    assert secrets[0] != secrets[1]
    shown: list[str] = []
    # every record of tidelake's loggers, the rest from INFO (py4j's DEBUG records echo each
    # call made to the JVM, option values included: the caller's own, below any source)
    caplog.clear()
    caplog.set_level("INFO")
    for logger in ("engine", "ingest"):
        caplog.set_level("DEBUG", logger=logger)
    with authenticated():
        for uri, opts, expected, oracle in stores:
            df = _load(tidelake, uri, **opts)
            assert _spark_rows(df) == expected
            assert sorted_rows(df.toArrow(), COLUMNS) == oracle.snapshot()
            for mode in ("simple", "extended", "formatted", "cost"):
                df.explain(mode)
            shown.append(df._jdf.queryExecution().toString())
            sink = Batches()
            reader = tidelake.readStream.format("tidelake")
            for key, value in opts.items():
                reader = reader.option(key, value)
            query = (reader.load(uri).writeStream.foreachBatch(sink)
                     .option("checkpointLocation", str(tmp_path / uri.split("/")[2]))
                     .trigger(availableNow=True).start())
            query.awaitTermination()
            assert all_rows(pa.concat_tables([b for _, b in sink.got])) == expected
            shown += [str(query.lastProgress), str(query.status)]
        # the other store's user: refused by the server, the error shows no secret either
        crossed = {**stores[1][1], "aws_endpoint_url": stores[0][1]["aws_endpoint_url"]}
        with pytest.raises(Exception, match="PermissionDenied") as refused:
            _load(tidelake, stores[0][0], **crossed).collect()
        shown.append(str(refused.value))
    store = tidelake._jsparkSession.sharedState().statusStore()
    executions = store.executionsList().iterator()
    while executions.hasNext():
        execution = executions.next()
        shown += [execution.description(), execution.details(),
                  execution.physicalPlanDescription(), str(execution.modifiedConfigs())]
    out = capfd.readouterr()
    shown += [out.out, out.err, caplog.text]
    assert "BatchScan tidelake" in out.out  # explain() printed
    # the streams' checkpoints (offsets, commits, metadata, sources)
    shown += [f.read_text(errors="replace") for f in tmp_path.rglob("*") if f.is_file()]
    for text in shown:
        for secret in secrets:
            assert secret not in text


# -- streams ---------------------------------------------------------------------------------


class Batches:
    """A foreachBatch sink keeping each micro-batch's rows (it runs in this process, the
    driver); ``fail_first`` makes its first call raise, as a crash mid-batch."""

    def __init__(self, fail_first: bool = False) -> None:
        self.got: list[tuple[int, pa.Table]] = []
        self.fail_first = fail_first

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = df.toArrow()
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError(f"sink failed on batch {batch_id}")
        self.got.append((batch_id, rows))


def _stream(spark: SparkSession, path: str, checkpoint: Path, sink: Batches,  # noqa: F811
            *, available_now: bool) -> Any:
    writer = (spark.readStream.format("tidelake").load(path).writeStream
              .foreachBatch(sink).option("checkpointLocation", str(checkpoint)))
    if available_now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime="500 milliseconds").start()


def _commit(table: Table, oracle: Oracle, keys: list[str], ts: int) -> str:
    batch = [{"key": k, "ts": ts, "region": ("north", "south")[int(k[1:]) % 2],
              "amount": float(ts), "note": k} for k in keys]
    instant = table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
    oracle.upsert(batch, instant)
    return instant


def _expected(oracle: Oracle, commits: list[str]) -> list[dict[str, Any]]:
    """The oracle's rows after the last of ``commits`` whose version one of them wrote."""
    return [row for row in oracle.snapshot(commits[-1]) if row[COMMIT_TIME] in commits]


def test_spark_stream_delivers_every_commit_once_in_order_across_restarts(
        tidelake: SparkSession, tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="trips", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by=["region"])
    oracle, checkpoint = Oracle(), tmp_path / "checkpoint"
    first = Batches()
    steps: list[list[str]] = []  # the commits each micro-batch must cover, in order
    steps.append([_commit(table, oracle, [f"k{i}" for i in range(12)], 1)])
    query = _stream(tidelake, table.path, checkpoint, first, available_now=False)
    try:
        query.processAllAvailable()
        steps.append([_commit(table, oracle, ["k1", "k2", "k20", "k21"], 2)])
        query.processAllAvailable()
        assert table.compact().completed  # a batch of its own: it writes no new version
        query.processAllAvailable()
        steps.append([_commit(table, oracle, ["k2", "k3", "k30"], 3)])
        query.processAllAvailable()
    finally:
        query.stop()
    data = [rows for _, rows in first.got if rows.num_rows]
    assert [b for b, _ in first.got] == sorted(b for b, _ in first.got)
    assert len(data) == len(steps) and len(first.got) <= len(steps) + 1
    for rows, commits in zip(data, steps, strict=True):
        assert sorted_rows(rows, COLUMNS) == _expected(oracle, commits)

    # stopped: two commits land; the restarted query fails in its first batch, and the one
    # after replays that batch (same id, same rows) and ends there
    later = [_commit(table, oracle, ["k4", "k40"], 4), _commit(table, oracle, ["k4", "k41"], 5)]
    failing = Batches(fail_first=True)
    query = _stream(tidelake, table.path, checkpoint, failing, available_now=True)
    with pytest.raises(Exception, match="sink failed on batch"):
        query.awaitTermination()
    again = Batches()
    query = _stream(tidelake, table.path, checkpoint, again, available_now=True)
    query.awaitTermination()
    assert len(again.got) == 1
    batch_id, rows = again.got[0]
    assert batch_id == first.got[-1][0] + 1
    assert sorted_rows(rows, COLUMNS) == _expected(oracle, later)
    assert sorted(rows.column("key").to_pylist()) == ["k4", "k40", "k41"]

    # nothing new: a restart delivers nothing
    idle = Batches()
    _stream(tidelake, table.path, checkpoint, idle, available_now=True).awaitTermination()
    assert [rows.num_rows for _, rows in idle.got] in ([], [0])


def test_spark_stream_schema_change_fails_named_and_restart_delivers_new_columns(
        tidelake: SparkSession, tmp_path: Path) -> None:
    """A running stream whose table gains a column, then widens one (int -> long), fails
    at the commit that changed the schema, naming it, before reading a row of it; a query
    restarted from the checkpoint replays that batch in the new schema: every row of every
    commit arrives once, the new column's and the widened column's values included."""
    base = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("n", pa.int32())])
    table = Table.create(str(tmp_path / "t"), name="evolving", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts")
    checkpoint, sinks = tmp_path / "checkpoint", [Batches(), Batches(), Batches()]
    table.upsert(pa.table({"key": ["a", "b"], "ts": [1, 1], "n": [1, 2]}, schema=base))
    query = _stream(tidelake, table.path, checkpoint, sinks[0], available_now=False)
    try:
        query.processAllAvailable()
        added = table.upsert(pa.table({"key": ["b", "c"], "ts": [2, 2],
                                       "n": pa.array([3, 4], pa.int32()),
                                       "extra": ["x-b", "x-c"]}))
        with pytest.raises(Exception, match=rf"schema changed at instant {added}.*'extra'"):
            query.processAllAvailable()
    finally:
        query.stop()

    query = _stream(tidelake, table.path, checkpoint, sinks[1], available_now=False)
    try:
        query.processAllAvailable()
        wide = 2**40  # no int32 holds it: conformed to the old schema it would overflow
        widened = table.upsert(pa.table({
            "key": ["c", "d"], "ts": [3, 3], "n": pa.array([wide, wide + 1], pa.int64()),
            "extra": ["y-c", None]}))
        with pytest.raises(Exception, match=rf"schema changed at instant {widened}.*'n'"):
            query.processAllAvailable()
    finally:
        query.stop()
    _stream(tidelake, table.path, checkpoint, sinks[2], available_now=True).awaitTermination()

    def delivered(sink: Batches) -> list[list[tuple[Any, ...]]]:
        return [sorted((r["key"], r["n"], r.get("extra", "<none>"))
                       for r in rows.to_pylist()) for _, rows in sink.got if rows.num_rows]

    assert delivered(sinks[0]) == [[("a", 1, "<none>"), ("b", 2, "<none>")]]
    assert delivered(sinks[1]) == [[("b", 3, "x-b"), ("c", 4, "x-c")]]
    assert delivered(sinks[2]) == [[("c", wide, "y-c"), ("d", wide + 1, None)]]
    assert sinks[1].got[0][0] == sinks[0].got[-1][0] + 1  # the failed batch, replayed


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_spark_stream_change_feed_keeps_raw_to_cleaned_equal_across_deletes(
        tidelake: SparkSession, tmp_path: Path, table_type: str) -> None:
    """A raw -> cleaned chain over ``hoodie.datasource.query.incremental.format=cdc``: the
    cleaned table equals the raw one after every micro-batch although the raw table gets
    upserts, deletes without ordering values (one of a key then written again at a lower
    ordering value), ordered deletes (one losing) and a compaction or clustering; a batch CDC
    query returns the engine's feed for the same range."""
    raw = Table.create(str(tmp_path / "raw"), name="raw", table_type=table_type,
                       record_key="key", precombine="ts", partition_by=["region"])
    cleaned = Table.create(str(tmp_path / "clean"), name="clean", table_type="COPY_ON_WRITE",
                           record_key="key", precombine="ts", partition_by=["region"])
    oracle = Oracle()
    cdc = {"hoodie.datasource.query.incremental.format": "cdc"}

    def consume(df: DataFrame, batch_id: int) -> None:
        apply_change_feed(cleaned, df.toArrow(), SCHEMA)

    def natural_delete(keys: list[str]) -> str:
        return raw.delete(pa.table({"key": keys,
                                    "region": [("north", "south")[int(k[1:]) % 2] for k in keys]}))

    def equal() -> None:
        data = [c for c in COLUMNS if not c.startswith("_hoodie")]
        assert sorted_rows(cleaned.read(), data) == sorted_rows(raw.read(), data)

    _commit(raw, oracle, [f"k{i}" for i in range(10)], 5)
    reader = tidelake.readStream.format("tidelake").options(**cdc)
    query = (reader.load(raw.path).writeStream.foreachBatch(consume)
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="500 milliseconds").start())
    try:
        query.processAllAvailable()
        equal()
        _commit(raw, oracle, ["k1", "k2", "k10"], 7)
        natural_delete(["k3", "k4", "k99"])  # k99 never existed
        query.processAllAvailable()
        equal()
        begin = next(e.completion_time for e in raw.timeline() if e.state == "completed")
        assert (raw.compact() if table_type == "MERGE_ON_READ" else raw.cluster()).completed
        raw.delete(pa.table({"key": ["k5", "k6"], "region": ["south", "north"], "ts": [9, 1]}))
        natural_delete(["k1"])
        _commit(raw, oracle, ["k1", "k3"], 2)  # back, at a lower ordering value
        query.processAllAvailable()
        equal()
        assert not any(r["key"] in ("k4", "k5", "k99") for r in cleaned.read().to_pylist())
    finally:
        query.stop()
    batch = _load(tidelake, raw.path, **cdc, **{
        "hoodie.datasource.query.type": "incremental",
        "hoodie.datasource.read.begin.instanttime": begin}).toArrow()
    assert batch.to_pylist() == raw.read_changes(begin, start_inclusive=True).to_pylist()
    assert set(batch.column("op").to_pylist()) == {"i", "u", "d"}


def test_spark_stream_of_chosen_columns_reads_them_across_added_columns(
        tidelake: SparkSession, tmp_path: Path) -> None:
    """A stream given its columns (a schema, or ``tidelake.read.columns``) reads them and
    is not stopped by a column added that it did not ask for (it loses none of its values);
    a restarted query continues from its checkpoint."""
    table, _ = _evolved_table(tmp_path / "t")
    names = ["key", "amount", "extra"]
    given = (tidelake.readStream.format("tidelake").schema("key STRING, amount DOUBLE, "
                                                           "extra BIGINT"),
             tidelake.readStream.format("tidelake").option("tidelake.read.columns",
                                                           ",".join(names)))
    sinks = [Batches(), Batches()]

    def run(index: int) -> None:
        (given[index].load(table.path).writeStream.foreachBatch(sinks[index])
         .option("checkpointLocation", str(tmp_path / f"cp{index}"))
         .trigger(availableNow=True).start().awaitTermination(180))

    for index in (0, 1):
        run(index)
        assert all_rows(pa.concat_tables([b for _, b in sinks[index].got])) == all_rows(
            table.read(names))
    rng, oracle = random.Random(9), Oracle()
    batch = random_batch(rng, oracle, [900], 6, new_only=True)
    rows = pa.Table.from_pylist(batch, schema=SCHEMA)
    rows = rows.append_column("extra", pa.array(range(6), pa.int64()))
    instant = table.upsert(rows.append_column("later", pa.array(["x"] * 6)))
    for index in (0, 1):
        run(index)
        _, last = sinks[index].got[-1]
        expected = table.read(names, [("_hoodie_commit_time", "=", instant)])
        assert last.num_rows == 6 and all_rows(last) == all_rows(expected)


def test_spark_stream_start_offset_latest_skips_earlier_commits(
        tidelake: SparkSession, tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="trips", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by=["region"])
    oracle = Oracle()
    _commit(table, oracle, ["k1", "k2"], 1)
    sink = Batches()
    query = (tidelake.readStream.format("tidelake")
             .option("hoodie.datasource.streaming.startOffset", "latest").load(table.path)
             .writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="500 milliseconds").start())
    try:
        query.processAllAvailable()
        commit = _commit(table, oracle, ["k2", "k3"], 2)
        query.processAllAvailable()
    finally:
        query.stop()
    rows = [r for _, batch in sink.got for r in sorted_rows(batch, COLUMNS)]
    assert rows == _expected(oracle, [commit])
    with pytest.raises(Exception, match=r"as\.of\.instant"):
        tidelake.readStream.format("tidelake").option("as.of.instant", commit) \
            .load(table.path).writeStream.foreachBatch(sink) \
            .option("checkpointLocation", str(tmp_path / "cp2")).start().awaitTermination(30)


def test_spark_read_doc_examples_run_as_written(
        tidelake: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/spark-read.md's Python blocks, in order, in one namespace, print what it says."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "spark-read.md"
    text = doc.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(doc), "exec"), namespace)
    out = capsys.readouterr().out
    assert out.count("[('a', 1100), ('b', 2500)]") == 3  # the latest-state chain keeps 'a'
    for expected in ("[('a', 11.0), ('b', 20.0), ('c', -1.0)]",
                     "[Row(city='oslo', n=2), Row(city='rome', n=1)]", "[-1.0, 10.0, 20.0]",
                     "\n3\n", "['a']", "[('a', 1100), ('b', 2000)]",
                     "[('a', 1100), ('b', 2500)]", "[('b', 2500)]",
                     "('d', False, True)", "['fare', 'uuid'] 3"):
        assert expected in out, expected


class _PushdownProbe(DataSource):
    """A ten-row source that applies the ``x = v`` filters Spark pushes to it."""

    @classmethod
    def name(cls) -> str:
        return "tidelake-pushdown-probe"

    def schema(self) -> str:
        return "x INT"

    def reader(self, schema: Any) -> _ProbeReader:
        return _ProbeReader()


class _ProbeReader(DataSourceReader):
    def __init__(self) -> None:
        self.wanted: list[int] = []

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        for spark_filter in filters:
            if isinstance(spark_filter, EqualTo) and spark_filter.attribute == ("x",):
                self.wanted.append(spark_filter.value)
            else:
                yield spark_filter

    def read(self, partition: Any) -> Iterator[tuple[int]]:
        return iter([(x,) for x in range(10) if all(x == w for w in self.wanted)])


def test_spark_python_pushdown_reuses_a_filtered_plan_for_an_unfiltered_query(
        tidelake: SparkSession) -> None:
    """Why the tidelake source implements no ``pushFilters``: Spark 4.3 plans a DataFrame's
    Python source read once per pushdown and reuses the last plan for a query that pushes no
    filter, so the unfiltered count below sees the filtered rows. If this fails, Spark fixed
    it: filter pushdown (partition pruning, data skipping) can come to ingest/spark_read.py."""
    tidelake.dataSource.register(_PushdownProbe)
    key = "spark.sql.python.filterPushdown.enabled"
    before = tidelake.conf.get(key)
    tidelake.conf.set(key, "true")
    try:
        df = tidelake.read.format("tidelake-pushdown-probe").load()
        assert df.where("x = 3").count() == 1
        assert df.count() == 1  # ten rows: Spark reused the plan of the filtered query
        assert tidelake.read.format("tidelake-pushdown-probe").load().count() == 10
    finally:
        tidelake.conf.set(key, before or "false")
