"""What Spark's stateful operator costs by itself: a pass-through ``transformWithStateInPandas``.

    python bench/state_noop.py                # 4 micro-batches of 7 MB in 32 packs each

The GLOBAL_STATE index puts ``groupBy(shard).transformWithStateInPandas`` between the prepare
step and the write (``ingest/global_index.py``); part of what it costs is Spark's: the shuffle
by shard, the operator's Arrow transfers to and from its Python workers, its state store
(RocksDB) commit per partition and batch, and, per query, the planning of a stateful query
(Spark starts a Python process on the driver to read the processor's state schema). This
benchmark measures that part alone: packs of bytes shaped like the index's input (``--shards``
rows a batch, ``--mb`` MB in all) go through an operator that yields them unchanged (no state
call, no tagging), against the same stream written without the operator. Each way runs a
warm-up query, then the measured one right after it (Spark stops Python workers idle for a
minute). Printed: CPU seconds by kind of process (``bench/ingest_parts/metering.py``), Spark's
query planning and ``addBatch`` per batch.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from common import REPO_ROOT, local_spark, log, machine_info
from ingest_parts.metering import CpuMeter

if str(REPO_ROOT) not in sys.path:  # the ingest package, not bench/ingest.py
    sys.path.insert(0, str(REPO_ROOT))

WAYS = ("no operator", "pass-through operator")


def _passthrough() -> Any:
    """A stateful processor that yields its input packs unchanged (pickled by value)."""
    from pyspark.sql.streaming import StatefulProcessor

    class Passthrough(StatefulProcessor):
        def init(self, handle: Any) -> None:
            pass

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any
                            ) -> Iterator[Any]:
            for frame in rows:
                yield frame.iloc[:, :3].set_axis(["shard", "spread", "rows"], axis=1)

        def close(self) -> None:
            pass

    return Passthrough()


def write_source(folder: Path, batches: int, shards: int, mb: float, seed: int) -> None:
    """``batches`` Parquet files of ``shards`` packs each, ``mb`` MB of bytes a file."""
    rng = np.random.default_rng(seed)
    size = int(mb * 2**20 / shards)
    folder.mkdir(parents=True)
    for b in range(batches):
        blobs = [rng.integers(0, 64, size, dtype=np.uint8).tobytes() for _ in range(shards)]
        pq.write_table(pa.table({"shard": pa.array(range(shards), pa.int32()),
                                 "spread": pa.array([b] * shards, pa.int64()),
                                 "rows": pa.array(blobs, pa.binary())}),
                       folder / f"part-{b:03d}.parquet", compression="none")


def run_way(spark: Any, way: str, source: Path, work: Path) -> dict[str, Any]:
    """One query of ``way`` over every file of ``source``: CPU by kind, wall, Spark's
    durations."""
    frame = (spark.readStream.schema("shard int, spread long, rows binary")
             .option("maxFilesPerTrigger", 1).parquet(str(source)))
    if way == "pass-through operator":
        frame = frame.groupBy("shard").transformWithStateInPandas(
            _passthrough(), "shard int, spread long, rows binary", "Append", "None")

    def write(df: Any, batch_id: int) -> None:
        df.write.format("noop").mode("overwrite").save()

    with CpuMeter() as cpu:
        query = (frame.writeStream.foreachBatch(write)
                 .option("checkpointLocation", str(work))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    return {"cpu": cpu.by_kind(), "wall": cpu.wall, "describe": cpu.describe(),
            "planning": [p["durationMs"].get("queryPlanning", 0) / 1000 for p in progress],
            "add": [p["durationMs"].get("addBatch", 0) / 1000 for p in progress]}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--shards", type=int, default=32)
    p.add_argument("--mb", type=float, default=7.0,
                   help="MB a micro-batch (the index's input: ~7 MB for 50,000 records)")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    for k, v in machine_info().items():
        print(f"  {k:12s}  {v}")
    from ingest.global_index import ensure_state_store

    work = Path(tempfile.mkdtemp(prefix="tidelake-state-noop-"))
    try:
        write_source(work / "source", args.batches, args.shards, args.mb, args.seed)
        spark = local_spark("state-noop")
        spark.conf.set("spark.sql.shuffle.partitions", "4")
        ensure_state_store(spark)
        try:
            for way in WAYS:
                run_way(spark, way, work / "source", work / f"warm-{way}")
                got = run_way(spark, way, work / "source", work / f"measured-{way}")
                ours = sum(v for k, v in got["cpu"].items() if "Kafka" not in k)
                log(f"{way}: {ours:.1f} CPU s, {got['wall']:.1f} s wall; queryPlanning "
                    + " ".join(f"{s:.2f}" for s in got["planning"]) + "; addBatch "
                    + " ".join(f"{s:.2f}" for s in got["add"]))
                log(f"  {got['describe']}")
                time.sleep(1)
        finally:
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
