"""column_stats / partition_stats MDT partitions and data skipping on read."""

from __future__ import annotations

import random
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import Table
from engine.metadata.codec import read_base_file as read_hfile
from engine.metadata.file_stats import base_file_stats, columns_to_index, log_file_stats
from engine.metadata.records import ColumnStats
from engine.read.reader import to_expression
from engine.storage import Storage
from tests.engine.helpers import COLUMNS, PARTITIONS, SCHEMA, random_batch
from tests.helpers import Oracle, sorted_rows

TRIPS = "quickstart_trips_table__mor__avro__v8_trips_8i3u1d.zip"
ON = {"hoodie.metadata.index.column.stats.enable": "true"}


def _sample(tmp_path: Path) -> Path:
    zipped = Path("/work/shared/hudi-samples") / TRIPS
    if not zipped.exists():
        pytest.skip("trips sample not available")
    with zipfile.ZipFile(zipped) as z:
        z.extractall(tmp_path)
    return next(p for p in tmp_path.iterdir() if p.is_dir())


def _sample_records(root: Path) -> dict[str, ColumnStats]:
    """Spark's column_stats records of the sample, by (file name, column), from its
    compacted base HFiles."""
    out = {}
    for hfile in (root / ".hoodie/metadata/column_stats").glob("*.hfile"):
        for record in read_hfile(hfile.read_bytes()):
            p = record.payload
            assert isinstance(p, ColumnStats)
            out[f"{p.file_name}|{p.column_name}"] = p
    return out


def test_column_stats_of_spark_sample_files_equal_spark_records(tmp_path: Path) -> None:
    root = _sample(tmp_path)
    spark = _sample_records(root)
    columns = columns_to_index(pa.schema([("ts", pa.int64()), ("uuid", pa.string()),
                                          ("rider", pa.string()), ("driver", pa.string()),
                                          ("fare", pa.float64()), ("city", pa.string())]))
    assert columns == ("_hoodie_commit_time", "_hoodie_partition_path", "_hoodie_record_key",
                       "ts", "uuid", "rider", "driver", "fare", "city")  # index.json's list
    storage = Storage(str(root))
    checked = 0
    for name in {k.split("|")[0] for k in spark}:
        matches = [p for p in root.glob(f"*/{name}")]
        assert len(matches) == 1
        rel = str(matches[0].relative_to(root))
        if name.endswith(".parquet"):
            ours = base_file_stats(str(matches[0]), columns)
        else:
            ours = log_file_stats(storage, rel, columns, None)
        for column in columns:
            theirs = spark[f"{name}|{column}"]
            assert ours[column] == ColumnStats(None, column, *_fields(theirs)), (name, column)
            checked += 1
    assert checked >= 9 * 8


def _fields(s: ColumnStats) -> tuple[Any, ...]:
    return (s.min_value, s.max_value, s.value_count, s.null_count, s.total_size,
            s.total_uncompressed_size)


# -- differential: pruned read == unpruned read == oracle -------------------------------------

def _filters(rng: random.Random) -> list[Any]:
    def term() -> tuple[str, str, Any]:
        kind = rng.choice(["ts", "amount", "note", "region", "key"])
        if kind == "ts":
            return ("ts", rng.choice(["<", "<=", ">", ">=", "=", "!="]), rng.randint(-2, 52))
        if kind == "amount":
            return ("amount", rng.choice(["<", ">", ">="]), rng.random() * 100)
        if kind == "note":
            op = rng.choice(["=", "in", "not in", "!="])
            values = rng.sample(["", "x", "ünï", "zz", "a,b:c"], 2)
            return ("note", op, values if "in" in op else values[0])
        if kind == "region":
            if rng.random() < .5:
                return ("region", "=", rng.choice(PARTITIONS))
            return ("region", "in", PARTITIONS[:2])
        return ("key", rng.choice(["<", ">"]), f"k{rng.randint(0, 200):05d}")
    conj = [term() for _ in range(rng.randint(1, 2))]
    if rng.random() < 0.3:
        return [conj, [term()]]
    return conj


def _oracle_filtered(oracle: Oracle, filters: list[Any]) -> list[dict[str, Any]]:
    rows = oracle.snapshot()
    if not rows:
        return []
    table = pa.Table.from_pylist(rows)
    return sorted_rows(table.filter(to_expression(filters)), COLUMNS)


@pytest.mark.parametrize(("table_type", "seed", "version"), [
    ("COPY_ON_WRITE", 1, "8"), ("MERGE_ON_READ", 2, "8"), ("MERGE_ON_READ", 3, "9")])
def test_data_skipping_random_tables_pruned_equals_unpruned_and_oracle(
        tmp_path: Path, table_type: str, seed: int, version: str) -> None:
    rng = random.Random(seed)
    table = Table.create(str(tmp_path / "t"), name="cs", table_type=table_type,
                         record_key="key", precombine="ts", partition_by=["region"],
                         options={**ON, "hoodie.compact.inline": "true",
                                  "hoodie.compact.inline.max.delta.commits": "3",
                                  "hoodie.write.table.version": version})
    assert table.config.version == int(version)
    oracle, counter = Oracle(), [0]
    pruned_any = 0
    for step in range(7):
        batch = random_batch(rng, oracle, counter, rng.randint(5, 25))
        for row in batch:
            if row["key"] in oracle.rows:
                row["region"] = oracle.rows[row["key"]]["region"]
        oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA)))
        if step == 4 and oracle.rows:
            victims = rng.sample(sorted(oracle.rows), min(4, len(oracle.rows)))
            table.delete(pa.table({"key": victims,
                                   "region": [oracle.rows[k]["region"] for k in victims]}))
            oracle.delete(victims)
        for _ in range(4):
            filters = _filters(rng)
            pruned = sorted_rows(table.read(filters=filters), COLUMNS)
            unpruned = sorted_rows(table.read(filters=to_expression(filters)), COLUMNS)
            assert pruned == unpruned == _oracle_filtered(oracle, filters), filters
            report = table.explain(filters)
            pruned_any += (report["slices_pruned_by_column_stats"]
                           + report["partitions_pruned_by_partition_stats"])
    assert pruned_any > 0  # the filters did exercise skipping


# -- a table clustered on a column -------------------------------------------------------------

def test_data_skipping_clustered_column_range_filter_prunes_most_files(tmp_path: Path) -> None:
    rng = random.Random(5)
    n = 4000
    xs = list(range(n))
    rng.shuffle(xs)
    table = Table.create(str(tmp_path / "t"), name="cl", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts",
                         options={**ON,
                                  "hoodie.clustering.plan.strategy.sort.columns": "x",
                                  "hoodie.clustering.plan.strategy.target.file.max.bytes":
                                      "3000",
                                  "hoodie.clustering.plan.strategy.max.bytes.per.group":
                                      str(1 << 30),
                                  "hoodie.parquet.max.file.size": str(1 << 30)})
    schema = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("x", pa.int64())])
    rows = [{"key": f"k{i:05d}", "ts": 1, "x": x} for i, x in enumerate(xs)]
    table.bulk_insert(pa.Table.from_pylist(rows, schema=schema))
    table.cluster()
    filters = [("x", ">=", 1000), ("x", "<", 1100)]
    report = table.explain(filters)
    assert report["slices"] >= 20
    assert report["slices_pruned_by_column_stats"] >= 0.9 * report["slices"]
    assert report["slices_read"] == report["slices"] - report["slices_pruned_by_column_stats"]
    got = table.read(filters=filters)
    assert sorted(got.column("x").to_pylist()) == list(range(1000, 1100))
    assert pc.count(got.column("key")).as_py() == 100
    shutil.rmtree(tmp_path / "t")
