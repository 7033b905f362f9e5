"""Consistent-hashing bucket index: upsert speed next to the simple bucket index, and file
sizes under a skewed workload with resizes.

    python bench/consistent_hashing.py            # 8 batches of 40,000 rows, one partition 20x
    python bench/consistent_hashing.py --quick    # 4 batches of 10,000

Engine API (no Spark), MERGE_ON_READ, 4 partitions, 4 initial buckets each. Every batch
upserts new keys and updates of earlier ones; partition ``p0`` gets 20 times the rows of each
other partition (the skew). Two tables get the same batches:

* ``simple``: ``hoodie.index.type=BUCKET`` (fixed 4 buckets per partition);
* ``consistent``: ``hoodie.index.bucket.engine=CONSISTENT_HASHING`` with
  ``hoodie.bucket.index.max.num.buckets`` 64 and ``min.num.buckets`` 2; after every batch a
  compaction and a clustering (the resize: splits above ``split.threshold`` x
  ``hoodie.parquet.max.file.size``, merges below ``merge.threshold`` x it). Both tables
  are compacted after every batch, so their slices compare.

Reported: median upsert rows/s of each (the resize and compaction time of the consistent
table separately), and at the end, per partition, the buckets and the sizes of the latest
base files (min / median / max) against the bounds the options set.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from common import REPO_ROOT, fmt_bytes, fmt_rate, load_average, log, machine_info

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

PARTITIONS = ["p0", "p1", "p2", "p3"]
SKEW = 20


def batch_rows(rng: np.random.Generator, first: int, size: int, seen: int,
               step: int) -> tuple[pa.Table, int]:
    """``size`` rows: 3/4 new keys (p0 gets SKEW shares), 1/4 updates of earlier keys."""
    new = size * 3 // 4
    ids = np.arange(first, first + new)
    weights = np.array([SKEW, 1, 1, 1], dtype=float)
    parts = rng.choice(len(PARTITIONS), size=new, p=weights / weights.sum())
    if seen:
        old = rng.integers(0, seen, size=size - new)
        ids = np.concatenate([ids, old])
        parts = np.concatenate([parts, old_partitions(old, rng)])
    keys = np.char.add("k", np.char.zfill(ids.astype(str), 10))
    table = pa.table({
        "id": pa.array(keys), "ts": pa.array(np.full(len(ids), step, dtype=np.int64)),
        "p": pa.array(np.array(PARTITIONS)[parts]),
        "amount": pa.array(rng.random(len(ids))),
        "note": pa.array(np.char.add("note-", (ids % 977).astype(str)))})
    return table, first + new


_PARTITION_OF: dict[int, int] = {}


def old_partitions(ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.array([_PARTITION_OF[int(i)] for i in ids], dtype=np.int64)


def remember(table: pa.Table) -> None:
    for key, part in zip(table.column("id").to_pylist(), table.column("p").to_pylist(),
                         strict=True):
        _PARTITION_OF.setdefault(int(key[1:]), PARTITIONS.index(part))


def sizes_by_partition(path: str) -> dict[str, list[int]]:
    from engine import Table

    out: dict[str, list[int]] = {}
    for s in Table.open(path).file_slices():
        out.setdefault(s.partition_path, []).append(s.total_size())
    return out


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from engine import Table

    common = {"hoodie.index.type": "BUCKET", "hoodie.bucket.index.num.buckets": "4",
              "hoodie.parquet.max.file.size": str(args.max_file_size),
              "hoodie.compact.inline": "false"}
    consistent = {**common, "hoodie.index.bucket.engine": "CONSISTENT_HASHING",
                  "hoodie.bucket.index.max.num.buckets": "64",
                  "hoodie.bucket.index.min.num.buckets": "2"}
    paths = {"simple": str(out / "simple"), "consistent": str(out / "consistent")}
    for name, opts in (("simple", common), ("consistent", consistent)):
        Table.create(paths[name], name=name, record_key="id", precombine="ts",
                     partition_by="p", table_type="MERGE_ON_READ", options=opts)
    rng = np.random.default_rng(args.seed)
    rates: dict[str, list[float]] = {"simple": [], "consistent": []}
    service_s: list[float] = []
    first = 0
    for step in range(args.batches):
        data, first = batch_rows(rng, first, args.batch, first, step)
        remember(data)
        for name, opts in (("simple", common), ("consistent", consistent)):
            started = time.perf_counter()
            Table.open(paths[name], opts).upsert(data)
            rates[name].append(data.num_rows / (time.perf_counter() - started))
        Table.open(paths["simple"], common).compact()  # both compacted: comparable slices
        started = time.perf_counter()
        table = Table.open(paths["consistent"], consistent)
        table.compact()
        resize = table.cluster()
        service_s.append(time.perf_counter() - started)
        log(f"batch {step + 1}: simple {fmt_rate(rates['simple'][-1])} rows/s, consistent "
            f"{fmt_rate(rates['consistent'][-1])} rows/s; compaction + resize "
            f"{service_s[-1]:.2f} s ({'resized' if resize.completed else 'no resize'})")
    return {"rates": rates, "service_s": service_s, "paths": paths}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=None, help="batches (8; --quick 4)")
    p.add_argument("--batch", type=int, default=None, help="rows per batch (40,000; 10,000)")
    p.add_argument("--max-file-size", type=int, default=250_000,
                   help="hoodie.parquet.max.file.size in bytes (default 250,000: small, so "
                        "that a short run resizes)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--out", default=None, help="keep the tables in this new folder")
    args = p.parse_args(argv)
    args.batches = args.batches or (4 if args.quick else 8)
    args.batch = args.batch or (10_000 if args.quick else 40_000)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="tidelake-ch-"))
    out.mkdir(parents=True, exist_ok=True)
    print("Machine")
    for key, value in machine_info(str(out)).items():
        print(f"  {key:<14}{value}")
    print(f"\nMERGE_ON_READ, 4 partitions (p0 gets {SKEW}x the rows), 4 initial buckets; "
          f"{args.batches} batches of {args.batch:,} rows; max file size "
          f"{fmt_bytes(args.max_file_size)}\n", flush=True)
    try:
        result = run(args, out)
        sizes = {name: sizes_by_partition(path) for name, path in result["paths"].items()}
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    rates = result["rates"]
    simple, consistent = statistics.median(rates["simple"]), statistics.median(rates["consistent"])
    print(f"\nupsert rows/s (median): simple bucket {fmt_rate(simple)}, consistent hashing "
          f"{fmt_rate(consistent)} ({consistent / simple:.2f}x; goal within 10%); "
          f"compaction + resize per batch (consistent): median "
          f"{statistics.median(result['service_s']):.2f} s")
    split_at = 2.0 * args.max_file_size
    print(f"\nfile slices at the end (bounds: a slice above {fmt_bytes(int(split_at))} splits "
          f"at the next resize; max 64 buckets)")
    print("| table | partition | buckets | smallest | median | largest |")
    print("|---|---|---|---|---|---|")
    for name in ("simple", "consistent"):
        for part in sorted(sizes[name]):
            values = sorted(sizes[name][part])
            print(f"| {name} | {part} | {len(values)} | {fmt_bytes(values[0])} | "
                  f"{fmt_bytes(int(statistics.median(values)))} | {fmt_bytes(values[-1])} |")
    print(f"\nload average at the end: {load_average()}")
    largest = max(max(v) for v in sizes["consistent"].values())
    ok = largest <= split_at * 1.5
    print(f"consistent: largest slice {fmt_bytes(largest)} "
          f"({'within' if ok else 'ABOVE'} 1.5x the split size)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
