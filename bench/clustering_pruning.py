"""Clustering speed per layout strategy, and how many files a 2-column range filter prunes.

The table: ``--rows`` rows (default 200,000) written by ``--files`` bulk inserts (default 20
small file groups, one partition), columns ``key``, ``ts``, ``x``, ``y`` (uniform; see
``--domain``) and a 20-character payload. For each strategy (linear, z-order,
hilbert over ``x,y``) a copy of the table is clustered into ``--outputs`` file groups
(default 16); the run's rate is rows rewritten per second (read, merge, sort, write).

Pruning: for ``--boxes`` random boxes (default 200) covering ``--box`` of each column's range
(default 10%, so 1% of the rows), the fraction of live base files whose Parquet footer
min/max of ``x`` or ``y`` excludes the box, as a reader using footer statistics would skip
them. The helpers :func:`file_ranges` and :func:`pruned_fraction` use pyarrow only.

    .venv/bin/python bench/clustering_pruning.py [--rows 200000] [--outputs 16]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

Range = tuple[float, float]


def file_ranges(paths: Sequence[str], columns: Sequence[str]) -> list[dict[str, Range]]:
    """Per file, (min, max) of each column from the Parquet footer (over its row groups)."""
    out = []
    for path in paths:
        meta = pq.ParquetFile(path).metadata
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        ranges: dict[str, Range] = {}
        for column in columns:
            index = names.index(column)
            lows, highs = [], []
            for rg in range(meta.num_row_groups):
                stats = meta.row_group(rg).column(index).statistics
                if stats is None or not stats.has_min_max:
                    lows.append(-np.inf)
                    highs.append(np.inf)
                else:
                    lows.append(stats.min)
                    highs.append(stats.max)
            ranges[column] = (min(lows), max(highs))
        out.append(ranges)
    return out


def pruned_fraction(ranges: Sequence[dict[str, Range]], box: dict[str, Range]) -> float:
    """Fraction of files whose min/max excludes the box on at least one column."""
    if not ranges:
        return 0.0
    pruned = 0
    for file in ranges:
        if any(file[c][1] < lo or file[c][0] > hi for c, (lo, hi) in box.items()):
            pruned += 1
    return pruned / len(ranges)


DOMAINS = {
    # narrow: what a real table often holds; only the low bits of the 64-bit keys vary
    "narrow": {"x": (0.0, 1_000_000.0), "y": (0.0, 1.0)},
    # full: both columns span the whole int32 range, the case the direct curves are made for
    "full": {"x": (-2.0**31, 2.0**31 - 1), "y": (-2.0**31, 2.0**31 - 1)},
}


def _columns(domain: str, rng: np.random.Generator, n: int) -> dict[str, pa.Array]:
    if domain == "narrow":
        return {"x": pa.array(rng.integers(0, 1_000_000, n)), "y": pa.array(rng.random(n))}
    low, high = -2**31, 2**31
    return {"x": pa.array(rng.integers(low, high, n).astype(np.int32)),
            "y": pa.array(rng.integers(low, high, n).astype(np.int32))}


def _boxes(domain: str, count: int, width: float, seed: int) -> list[dict[str, Range]]:
    rng = np.random.default_rng(seed)
    boxes = []
    for _ in range(count):
        box = {}
        for column, (low, high) in DOMAINS[domain].items():
            start = low + rng.uniform(0, 1 - width) * (high - low)
            box[column] = (start, start + width * (high - low))
        boxes.append(box)
    return boxes


def _live_files(table: object) -> list[str]:
    slices = table.file_slices()  # type: ignore[attr-defined]
    return [table.storage.full(s.base_file.path)  # type: ignore[attr-defined]
            for s in slices if s.base_file is not None]


def main(argv: Sequence[str] | None = None) -> None:
    from engine import Table  # the helpers above stay engine-free

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--outputs", type=int, default=16)
    parser.add_argument("--boxes", type=int, default=200)
    parser.add_argument("--box", type=float, default=0.10)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--domain", choices=sorted(DOMAINS), default="narrow",
                        help="narrow: x int64 in [0, 1e6), y float64 in [0, 1); "
                             "full: x, y int32 over the whole range")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    work = Path(tempfile.mkdtemp(prefix="tidelake-clustering-"))
    try:
        source = work / "source"
        table = Table.create(str(source), name="bench", table_type="COPY_ON_WRITE",
                             record_key="key", precombine="ts")
        per_file = args.rows // args.files
        for f in range(args.files):
            n = per_file
            keys = np.char.add("k", np.arange(f * n, (f + 1) * n).astype(str))
            table.bulk_insert(pa.table({
                "key": pa.array(keys), "ts": pa.array(np.full(n, 1, np.int64)),
                **_columns(args.domain, rng, n),
                "payload": pa.array(np.char.add("p", rng.integers(0, 10**18, n).astype(str)))}))
        total = sum(Path(p).stat().st_size for p in _live_files(table))
        boxes = _boxes(args.domain, args.boxes, args.box, args.seed)
        before = file_ranges(_live_files(table), ["x", "y"])
        print(f"{args.rows} rows ({args.domain} x, y) in {len(before)} files, "
              f"{total / 1e6:.1f} MB; boxes of "
              f"{args.box:.0%} x {args.box:.0%}")

        def pruning(ranges: list[dict[str, Range]]) -> str:
            both = np.mean([pruned_fraction(ranges, b) for b in boxes])
            x_only = np.mean([pruned_fraction(ranges, {"x": b["x"]}) for b in boxes])
            y_only = np.mean([pruned_fraction(ranges, {"y": b["y"]}) for b in boxes])
            return (f"files pruned: x&y box {both:.1%}, x range alone {x_only:.1%}, "
                    f"y range alone {y_only:.1%}")

        print(f"{'before':>8}: {pruning(before)}")
        for strategy in ("linear", "z-order", "hilbert"):
            copy = work / strategy
            shutil.copytree(source, copy)
            target = max(1, total // args.outputs + 1)
            opened = Table.open(str(copy), {
                "hoodie.clustering.plan.strategy.sort.columns": "x,y",
                "hoodie.layout.optimize.strategy": strategy,
                "hoodie.clustering.plan.strategy.target.file.max.bytes": str(target)})
            started = time.perf_counter()
            run = opened.cluster()
            seconds = time.perf_counter() - started
            after = file_ranges(_live_files(opened), ["x", "y"])
            print(f"{strategy:>8}: {run.details['rows'] / seconds:,.0f} rows/s "
                  f"({seconds:.2f} s), {len(after)} files; {pruning(after)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
