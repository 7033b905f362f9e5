"""What Spark's state API costs per key: the call patterns a state-store global index can use.

    python bench/state_api.py                 # 20,000 keys, every variant
    python bench/state_api.py --keys 5000 --variants map-per-shard

The GLOBAL_STATE index keeps record key → location in a ``transformWithState(InPandas)``
operator (``ingest/global_index.py``). Its cost is per key; this benchmark isolates it from
Kafka, decoding and the table write. A stream of two micro-batches — ``--keys`` new keys, then
an update of each — goes through one operator per variant; every key's state is read and
written once per batch. Variants (``--variants``, comma-separated):

* ``value-per-key`` / ``value-per-key-rows``: ``groupBy(key)``, one ``ValueState`` per key
  (the current operator), with the pandas API / the row API;
* ``map-per-shard`` / ``map-per-shard-rows``: ``groupBy(shard)`` with ``--shards`` shards
  (hash of the key), one ``MapState`` per shard, ``containsKey`` + ``getValue`` +
  ``updateValue`` per key: Python is entered once per shard, the state is still called per
  key;
* ``list-per-shard`` / ``list-per-shard-rows``: ``groupBy(shard)``, one ``ListState`` per
  shard, two bulk calls per shard and batch — read every stored entry (``get``), append the
  batch's entries (``appendList``): what bulk access costs (its reads grow with the state).

Printed per variant and batch: wall time of the micro-batch (Spark's ``triggerExecution``),
keys/s, and the time the tasks spent inside state calls (summed over tasks, per key).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from common import REPO_ROOT, fmt_rate, log, machine_info, text_table

VARIANTS = ("value-per-key", "value-per-key-rows", "map-per-shard", "map-per-shard-rows",
            "list-per-shard", "list-per-shard-rows")


def _processor(kind: str, timings: str) -> Any:
    """A stateful processor for one variant; it appends "calls seconds" per task to
    ``timings`` when the task closes it."""
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    value_schema = StructType([StructField("partition", StringType()),
                               StructField("file_id", StringType()),
                               StructField("ordering", LongType())])
    key_schema = StructType([StructField("key", StringType())])
    per_shard = kind.startswith("map-per-shard")
    listed = kind.startswith("list-per-shard")
    rows_api = kind.endswith("-rows")
    entry_schema = StructType([StructField("key", StringType()), *value_schema.fields])

    class Probe(StatefulProcessor):
        def init(self, handle: Any) -> None:
            if per_shard:
                self.state = handle.getMapState("loc", key_schema, value_schema)
            elif listed:
                self.state = handle.getListState("loc", entry_schema)
            else:
                self.state = handle.getValueState("loc", value_schema)
            self.calls, self.seconds = 0, 0.0

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any
                            ) -> Iterator[Any]:
            if rows_api:
                records = [(r[0], r[1]) for r in rows]
            else:
                records = [rec for frame in rows
                           for rec in frame[["key", "v"]].itertuples(index=False)]
            started = time.perf_counter()
            if listed:  # two bulk calls per shard: read every entry, append the batch's
                for _ in self.state.get():
                    pass
                self.state.appendList([(k, "p", f"f{v}", int(v)) for k, v in records])
                self.calls += 2
            elif per_shard:
                for k, v in records:
                    if self.state.containsKey((k,)):
                        self.state.getValue((k,))
                    self.state.updateValue((k,), ("p", f"f{v}", int(v)))
                    self.calls += 3
            else:
                for _, v in records:
                    self.state.get()
                    self.state.update(("p", f"f{v}", int(v)))
                    self.calls += 2
            self.seconds += time.perf_counter() - started
            count = len(records)
            if rows_api:
                from pyspark.sql import Row

                yield Row(n=count)
            else:
                import pandas

                yield pandas.DataFrame({"n": [count]})

        def close(self) -> None:
            if self.calls:
                with open(timings, "a") as out:
                    out.write(f"{self.calls} {self.seconds}\n")

    return Probe()


def run_variant(spark: Any, kind: str, source: str, work: Path, shards: int
                ) -> list[tuple[int, float, float, int]]:
    """(batch, seconds, seconds in state calls, keys) for each micro-batch."""
    from pyspark.sql import functions as F

    timings = work / f"{kind}.timings"
    frame = (spark.readStream.schema("key string, v long").option("maxFilesPerTrigger", 1)
             .parquet(source))
    if kind.startswith(("map", "list")):
        grouped = frame.withColumn("shard", F.abs(F.hash("key")) % shards).groupBy("shard")
    else:
        grouped = frame.groupBy("key")
    operator = grouped.transformWithState if kind.endswith("-rows") \
        else grouped.transformWithStateInPandas
    out = operator(_processor(kind, str(timings)), "n long", "Append", "None")
    batches: list[tuple[int, float, float, int]] = []

    def collect(df: Any, batch_id: int) -> None:
        before = _state_seconds(timings)
        started = time.perf_counter()
        keys = df.agg(F.sum("n")).collect()[0][0] or 0
        batches.append((batch_id, time.perf_counter() - started,
                        _state_seconds(timings) - before, int(keys)))

    query = (out.writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(work / f"{kind}.ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return batches


def _state_seconds(path: Path) -> float:
    if not path.exists():
        return 0.0
    return sum(float(line.split()[1]) for line in path.read_text().splitlines() if line)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--shards", type=int, default=64)
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {unknown[0]!r} (choose from {', '.join(VARIANTS)})")
    work = Path(tempfile.mkdtemp(prefix="tidelake-state-api-"))
    info = machine_info(str(work))
    print("Machine")
    for key, value in info.items():
        print(f"  {key.ljust(max(map(len, info)))}  {value}")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("tidelake-state-api")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.streaming.stateStore.providerClass",
                     "org.apache.spark.sql.execution.streaming.state."
                     "RocksDBStateStoreProvider")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    source = work / "source"
    source.mkdir()
    keys = [f"key-{i:09d}" for i in range(args.keys)]
    for n in range(2):  # batch 0 inserts every key, batch 1 updates every key
        pq.write_table(pa.table({"key": keys, "v": list(range(n, n + args.keys))}),
                       source / f"batch-{n}.parquet")
        os.utime(source / f"batch-{n}.parquet", (1_700_000_000 + n, 1_700_000_000 + n))
    print(f"\nWorkload: {args.keys:,} keys, batch 0 inserts them, batch 1 updates them; "
          f"{args.shards} shards for the map-per-shard variants; RocksDB state store, "
          "local[2], 2 shuffle partitions\n", flush=True)
    rows = []
    try:
        for kind in variants:
            log(f"[{kind}] running")
            for batch, seconds, in_state, n in run_variant(spark, kind, str(source), work,
                                                           args.shards):
                per_key = in_state / n * 1e6 if n else 0.0
                rows.append((kind, str(batch), f"{seconds:.2f}", fmt_rate(n / seconds),
                             f"{per_key:.0f} us"))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(text_table(("variant", "batch", "seconds", "keys/s", "in state calls per key"),
                     rows, (False, True, True, True, True)))
    return 0


if __name__ == "__main__":
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    sys.exit(main())
