"""GLOBAL_STATE index at scale: bootstrap, tagging cost per batch as the state grows, state size.

    python bench/global_index.py              # tables of 1M and 10M keys, 6 batches of 50,000
    python bench/global_index.py --quick      # 100k and 1M keys, 4 batches of 10,000
    python bench/global_index.py --keys 1000000,10000000 --batches 6 --batch 50000

Per size N: a MERGE_ON_READ table with N keys (bucket layout, 4 partitions x 8 buckets) is
bulk-inserted with the engine. A streaming query (``HudiStreamingSink``, GLOBAL_STATE index,
default key shards, table services off so that only ingestion is timed) reads Kafka-shaped
parquet files, one per micro-batch, on ``local[2]``:

1. Bootstrap: a first run whose only batch is one record: its state is seeded from the table
   (every key's location and ordering value). Reported: that batch's seconds, the
   checkpoint's state bytes afterwards and per key.
2. Batches: a second run (same checkpoint) of ``--batches`` batches of ``--batch`` JSON
   records, half updates of random existing keys, half new keys. Reported per size: median
   batch seconds (Spark's ``addBatch``: tagging + write + commit), median state operator
   time (Spark's ``allUpdatesTimeMs`` + ``commitTimeMs``), records/s, and the checkpoint's
   state growth per batch.

Flatness: the medians at the largest N divided by those at the smallest (the issue's goal:
at most 1.2x from 1M to 10M keys). The table's rows are checked afterwards on sampled keys.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from common import REPO_ROOT, dir_size, fmt_bytes, fmt_rate, load_average, log, machine_info

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

DDL = "key STRING, ts BIGINT, part STRING, amount DOUBLE, note STRING"
PARTITIONS = 4
BUCKETS = 8


def key_of(i: int | np.ndarray) -> Any:
    return f"k{i:010d}" if isinstance(i, int) else np.char.add("k", np.char.zfill(
        i.astype(str), 10))


def build_table(path: str, keys: int, rng: np.random.Generator) -> float:
    """Bulk-insert ``keys`` rows; returns the seconds it took."""
    from engine import Table

    table = Table.create(path, name="bench_global", record_key="key", precombine="ts",
                         partition_by="part", table_type="MERGE_ON_READ",
                         options={"hoodie.index.type": "BUCKET",
                                  "hoodie.bucket.index.num.buckets": str(BUCKETS)})
    started = time.perf_counter()
    step = 2_000_000
    for start in range(0, keys, step):
        n = min(step, keys - start)
        ids = np.arange(start, start + n)
        data = pa.table({
            "key": pa.array(key_of(ids)),
            "ts": pa.array(np.full(n, 1, dtype=np.int64)),
            "part": pa.array(np.char.add("p", (ids % PARTITIONS).astype(str))),
            "amount": pa.array(rng.random(n)),
            "note": pa.array(np.char.add("n", (ids % 1000).astype(str))),
        })
        table.bulk_insert(data)
    return time.perf_counter() - started


class Source:
    """Kafka-shaped parquet files read as a stream, one file per micro-batch."""

    def __init__(self, folder: Path) -> None:
        self.dir = folder
        self.dir.mkdir(parents=True)
        self.offset = 0
        self.files = 0
        self.latest: dict[str, tuple[int, str, float]] = {}

    def add(self, ids: Sequence[int], ts: int) -> None:
        from ingest.kafka_schema import KAFKA_ROW_SCHEMA

        values, keys = [], []
        for j, i in enumerate(ids):
            key = key_of(int(i))
            amount = float(j % 997) / 7
            part = f"p{int(i) % PARTITIONS}"
            values.append(json.dumps({"key": key, "ts": ts, "part": part, "amount": amount,
                                      "note": "u"}).encode())
            keys.append(key.encode())
            self.latest[key] = (ts, part, amount)
        n = len(values)
        rows = pa.table({
            "key": keys, "value": values, "topic": ["bench"] * n, "partition": [0] * n,
            "offset": list(range(self.offset, self.offset + n)),
            "timestamp": [1_700_000_000_000_000 + self.offset + k for k in range(n)],
        }, schema=KAFKA_ROW_SCHEMA)
        self.offset += n
        path = self.dir / f"batch-{self.files:05d}.parquet"
        pq.write_table(rows, path)
        stamp = 1_700_000_000 + self.files  # the file source takes files oldest first
        os.utime(path, (stamp, stamp))
        self.files += 1

    def frame(self, spark: Any) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        from ingest.kafka_schema import KAFKA_ROW_SCHEMA

        return (spark.readStream.schema(from_arrow_schema(KAFKA_ROW_SCHEMA))
                .option("maxFilesPerTrigger", 1).parquet(str(self.dir)))


def run_query(spark: Any, source: Source, sink: Any, checkpoint: Path) -> list[dict[str, Any]]:
    """Run the stream until the files are consumed; the progress of every batch it ran."""
    from ingest.sink import start_ingest

    query = start_ingest(spark, source.frame(spark), sink, str(checkpoint),
                         trigger={"availableNow": True})
    try:
        query.awaitTermination(3600)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        return [p for p in query.recentProgress if p["numInputRows"] > 0]
    finally:
        query.stop()


def state_bytes(checkpoint: Path) -> int:
    folder = checkpoint / "state"
    return dir_size(str(folder)) if folder.exists() else 0


def operator_ms(progress: dict[str, Any]) -> float:
    ops = progress.get("stateOperators") or []
    return float(sum(op.get("allUpdatesTimeMs", 0) + op.get("commitTimeMs", 0) for op in ops))


def measure(spark: Any, keys: int, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    from ingest.decode import JsonDecoder
    from ingest.sink import HudiStreamingSink, SinkConfig

    rng = np.random.default_rng(args.seed)
    path = str(folder / "table")
    log(f"[{keys:,} keys] bulk-inserting the table")
    load_s = build_table(path, keys, rng)
    log(f"[{keys:,} keys] table written in {load_s:.1f} s")
    checkpoint = folder / "checkpoint"
    source = Source(folder / "source")

    def sink() -> Any:
        return HudiStreamingSink(SinkConfig(path, decoder=JsonDecoder(DDL), index="GLOBAL_STATE",
                                            state_shards=args.shards, services=False))

    source.add([0], ts=2)  # one update: the batch is the bootstrap
    started = time.perf_counter()
    boot = run_query(spark, source, sink(), checkpoint)
    boot_s = time.perf_counter() - started
    boot_batch_s = boot[0]["durationMs"]["addBatch"] / 1000 if boot else float("nan")
    boot_state = state_bytes(checkpoint)
    log(f"[{keys:,} keys] bootstrap batch {boot_batch_s:.1f} s (query {boot_s:.1f} s), "
        f"state {fmt_bytes(boot_state)}")

    next_new = keys
    half = args.batch // 2
    for b in range(args.batches):
        updates = rng.choice(keys, size=half, replace=False).tolist()
        new = list(range(next_new, next_new + args.batch - half))
        next_new += len(new)
        source.add(updates + new, ts=10 + b)
    progress = run_query(spark, source, sink(), checkpoint)
    grown = state_bytes(checkpoint) - boot_state
    batch_s = [p["durationMs"]["addBatch"] / 1000 for p in progress]
    op_ms = [operator_ms(p) for p in progress]
    steady = batch_s[1:] if len(batch_s) > 2 else batch_s  # the first warms the images
    steady_op = op_ms[1:] if len(op_ms) > 2 else op_ms
    problems = check(path, source, rng)
    result = {
        "keys": keys, "load_s": load_s, "boot_batch_s": boot_batch_s,
        "state_bytes": boot_state, "state_per_key": boot_state / max(keys, 1),
        "batches": len(progress), "batch_s": batch_s, "op_ms": op_ms,
        "median_batch_s": statistics.median(steady) if steady else float("nan"),
        "median_op_ms": statistics.median(steady_op) if steady_op else float("nan"),
        "growth_per_batch": grown / max(len(progress), 1),
        "final_keys": next_new, "problems": problems,
    }
    log(f"[{keys:,} keys] {len(progress)} batches: median {result['median_batch_s']:.2f} s, "
        f"operator {result['median_op_ms']:.0f} ms; state +{fmt_bytes(int(grown))}")
    return result


def check(path: str, source: Source, rng: np.random.Generator) -> list[str]:
    """Sampled keys written by the stream carry their last values; no key twice."""
    import pyarrow.compute as pc

    from engine import Table

    table = Table.open(path).read(columns=["key", "ts", "part", "amount"])
    problems = []
    keys = table.column("key")
    if pc.count_distinct(keys).as_py() != table.num_rows:
        problems.append("a key is stored twice")
    sample = rng.choice(list(source.latest), size=min(200, len(source.latest)), replace=False)
    found = table.filter(pc.is_in(keys, pa.array(sample))).to_pylist()
    by_key = {r["key"]: (r["ts"], r["part"], r["amount"]) for r in found}
    for key in sample:
        if by_key.get(key) != source.latest[key]:
            problems.append(f"{key}: table {by_key.get(key)}, expected {source.latest[key]}")
    return problems[:5]


def spark_session(shuffle: int, changelog: bool) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    warnings.filterwarnings("ignore", message=".*does not yet fully support pandas",
                            category=FutureWarning)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("bench-global-index")
             .config("spark.sql.shuffle.partitions", str(shuffle))
             .config("spark.ui.enabled", "false")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.driver.memory", "6g")
             .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
                     str(changelog).lower())
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", default=None,
                   help="comma-separated table sizes (default 1000000,10000000)")
    p.add_argument("--batches", type=int, default=None, help="batches per size (default 6)")
    p.add_argument("--batch", type=int, default=None, help="records per batch (default 50000)")
    p.add_argument("--shards", type=int, default=32, help="index.state_shards (default 32)")
    p.add_argument("--shuffle", type=int, default=4,
                   help="spark.sql.shuffle.partitions (state partitions; the job's default 4)")
    p.add_argument("--changelog", choices=("on", "off"), default="on",
                   help="RocksDB changelog checkpointing (Spark's "
                        "stateStore.rocksdb.changelogCheckpointing.enabled; on: the job's "
                        "default)")
    p.add_argument("--quick", action="store_true", help="100k and 1M keys, 4 x 10,000")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default=None, help="keep the tables in this new folder")
    args = p.parse_args(argv)
    defaults = ("100000,1000000", 4, 10_000) if args.quick else ("1000000,10000000", 6, 50_000)
    args.keys = args.keys or defaults[0]
    args.batches = args.batches or defaults[1]
    args.batch = args.batch or defaults[2]
    args.sizes = [int(k) for k in str(args.keys).split(",") if k.strip()]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="tidelake-global-"))
    out.mkdir(parents=True, exist_ok=True)
    print("Machine")
    for key, value in machine_info(str(out)).items():
        print(f"  {key:<14}{value}")
    print(f"\nGLOBAL_STATE index: tables of {', '.join(f'{k:,}' for k in args.sizes)} keys; "
          f"{args.batches} batches of {args.batch:,} records (half updates); "
          f"{args.shards} key shards, {args.shuffle} state partitions, local[2], RocksDB "
          f"changelog checkpointing {args.changelog}\n", flush=True)
    spark = spark_session(args.shuffle, args.changelog == "on")
    results = []
    try:
        for keys in args.sizes:
            results.append(measure(spark, keys, args, out / f"n{keys}"))
    finally:
        spark.stop()
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    print("\n| keys in the table | bootstrap batch | state bytes | bytes / key | "
          "median batch | records/s | median operator | state growth / batch |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['keys']:,} | {r['boot_batch_s']:.1f} s | {fmt_bytes(r['state_bytes'])} | "
              f"{r['state_per_key']:.1f} | {r['median_batch_s']:.2f} s | "
              f"{fmt_rate(args.batch / r['median_batch_s'])} | {r['median_op_ms']:.0f} ms | "
              f"{fmt_bytes(int(r['growth_per_batch']))} |")
    for r in results:
        print(f"  {r['keys']:,} keys: batches (s) {[round(s, 2) for s in r['batch_s']]}, "
              f"operator (ms) {[round(m) for m in r['op_ms']]}")
    if len(results) > 1:
        first, last = results[0], results[-1]
        print(f"\nFlatness {first['keys']:,} -> {last['keys']:,} keys: batch "
              f"{last['median_batch_s'] / first['median_batch_s']:.2f}x, operator "
              f"{last['median_op_ms'] / max(first['median_op_ms'], 1e-9):.2f}x (goal <= 1.2x)")
    failed = False
    for r in results:
        for problem in r["problems"]:
            print(f"CHECK FAILED ({r['keys']:,} keys): {problem}")
            failed = True
    print(f"load average at the end: {load_average()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
