"""A selective Spark query through tidelake against Spark's own Parquet reader.

``.venv/bin/python bench/spark_read.py`` builds a merge-on-read table of ``--rows`` rows
(default 400,000; bench/common.py's workload: ``key``, ``ts``, ``partition`` (10 dates),
``i0``-``i3``, ``f0``-``f3``, ``s0``, ``s1``) by an insert and ``--batches`` upserts (log files),
compacts it, and times, in one Spark session (``local[2]``), the query

    SELECT sum(i0) FROM <table> WHERE partition = '2024-01-04'

six ways, ``--repeat`` times each, taking turns:

- ``native parquet``: ``spark.read.parquet(<every base file of the table>)`` — Spark's own
  reader over the same files (what the goal is measured against);
- ``read_table`` (filters): :func:`ingest.spark_query.read_table` with the partition filter
  given to the engine (``filters=[("partition", "=", ...)]``): planned by the engine, the
  kept base files read by Spark's Parquet scan;
- ``read_table`` (Spark WHERE): ``read_table`` without filters, the ``WHERE`` in Spark (what
  a temp view from ``register_table`` gets): every base file, pruned by Spark's row-group
  statistics;
- ``read_table`` (engine-read slices): ``read_table(..., native=False)`` with the filter:
  the engine's pruning, every slice read by the engine in Python workers;
- ``format("tidelake")``: the data source, the ``WHERE`` in Spark (every slice, every column);
- ``format("tidelake")`` (read options): the data source with ``tidelake.read.columns`` and
  ``tidelake.read.filters``: the engine's pruning, the kept slices' ``i0`` read by the
  engine in Python workers.

Printed: the machine and its load, the table's shape, per way the median wall seconds (the
planning of ``read_table`` included), the CPU seconds of all processes (driver, JVM,
Python workers) over its runs, the files it read, and its time over native Parquet's. Every
way's sum is checked against ``Table.read`` with the same filter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.compute as pc
from common import (
    REPO_ROOT,
    WorkloadSpec,
    generate_workload,
    load_average,
    local_spark,
    log,
    machine_info,
    partition_values,
    text_table,
    tree_cpu,
)

if str(REPO_ROOT) not in sys.path:  # run from a checkout: make `engine` and `ingest` importable
    sys.path.insert(0, str(REPO_ROOT))

from engine import Table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def build(path: str, rows: int, batches: int) -> Table:
    """The compacted merge-on-read table: an insert, ``batches`` upserts, a compaction."""
    spec = WorkloadSpec(rows=rows, batches=batches, batch_size=max(rows // 10, 1))
    work = generate_workload(spec)
    table = Table.create(path, name="bench", table_type="MERGE_ON_READ", record_key="key",
                         precombine="ts", partition_by=["partition"],
                         options={"hoodie.metadata.index.column.stats.enable": "true"})
    table.insert(work.initial)
    for batch in work.batches:
        table.upsert(batch)
    run = table.compact()
    assert run.completed, "no compaction ran"
    slices = table.scan().slices
    assert all(not s.log_files for s in slices), "a slice kept log files after compaction"
    return table


def session() -> SparkSession:
    return local_spark("tidelake-spark-read")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--batches", type=int, default=2,
                        help="upserts of rows/10 each before the compaction")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--work", help="folder for the table (default: a temporary one)")
    args = parser.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="tidelake-spark-read-")
    info = machine_info(work)
    for label, value in info.items():
        print(f"{label:>14}: {value}")
    path = str(Path(work) / "table")
    started = time.perf_counter()
    table = build(path, args.rows, args.batches)
    wanted = partition_values(10)[3]
    filters = [("partition", "=", wanted)]
    expected = pc.sum(table.read(columns=["i0"], filters=filters).column("i0")).as_py()
    slices = table.scan().slices
    kept = table.scan(["i0"], filters).slices
    files = [table.storage.full(s.base_file.path) for s in slices if s.base_file]
    print(f"\nTable: {args.rows:,} rows, {args.batches} upserts of {args.rows // 10:,}, "
          f"compacted: {len(slices)} slices, each a base file alone "
          f"({sum(Path(f).stat().st_size for f in files) / 2**20:.1f} MiB); the filter "
          f"keeps {len(kept)} (built in {time.perf_counter() - started:.0f} s)")
    print(f"Query: SELECT sum(i0) WHERE partition = '{wanted}'; {args.repeat} runs each, "
          "taking turns; local[2]\n", flush=True)

    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from ingest.spark_query import read_table
    from ingest.spark_read import register

    spark = session()
    register(spark)
    where = F.col("partition") == wanted

    def total(frame: DataFrame) -> int:
        return int(frame.agg(F.sum("i0").alias("n")).collect()[0]["n"])

    ways: dict[str, Callable[[], int]] = {
        "native parquet": lambda: total(spark.read.parquet(*files).where(where)),
        "read_table (filters)": lambda: total(read_table(spark, path, filters=filters)),
        "read_table (Spark WHERE)": lambda: total(read_table(spark, path).where(where)),
        "read_table (engine-read slices)": lambda: total(
            read_table(spark, path, filters=filters, native=False)),
        'format("tidelake")': lambda: total(
            spark.read.format("tidelake").load(path).where(where)),
        'format("tidelake") (read options)': lambda: total(
            spark.read.format("tidelake").option("tidelake.read.columns", "i0")
            .option("tidelake.read.filters", json.dumps(filters)).load(path)),
    }
    files_read = {"native parquet": len(files), "read_table (filters)": len(kept),
                  "read_table (Spark WHERE)": len(slices),
                  "read_table (engine-read slices)": len(kept),
                  'format("tidelake")': len(slices),
                  'format("tidelake") (read options)': len(kept)}
    walls: dict[str, list[float]] = {name: [] for name in ways}
    cpus: dict[str, float] = dict.fromkeys(ways, 0.0)
    for name, way in ways.items():  # a warm-up run each: JVM classes, Python workers
        assert way() == expected, f"{name}: wrong sum"
    for run in range(args.repeat):
        for name, way in ways.items():
            cpu, wall = tree_cpu(), time.perf_counter()
            got = way()
            walls[name].append(time.perf_counter() - wall)
            cpus[name] += tree_cpu() - cpu
            assert got == expected, f"{name}: {got} != {expected}"
        log(f"run {run + 1}/{args.repeat} done (load {load_average()})")
    base = statistics.median(walls["native parquet"])
    rows = []
    for name in ways:
        med = statistics.median(walls[name])
        rows.append([name, f"{med:.3f}", f"{min(walls[name]):.3f}",
                     f"{cpus[name] / args.repeat:.2f}", str(files_read[name]),
                     f"{med / base:.2f}x"])
    print(text_table(["way", "median s", "best s", "CPU s per run (all processes)",
                      "files read", "vs native"], rows))
    print(f"\nload average after: {load_average()}")
    spark.stop()


if __name__ == "__main__":
    main()
