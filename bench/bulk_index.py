"""Bulk insert with the record index against the same with BUCKET, taking turns.

    python bench/bulk_index.py                          # 1,000,000 rows, 2 turns
    python bench/bulk_index.py --turns 3 --code /tmp/before --code .   # two code trees

Each turn bulk-inserts ``bench/indexes.py``'s rows (``make_rows``: random keys, 4
partitions, MERGE_ON_READ) once per index (``--indexes``, default RECORD_INDEX then BUCKET,
the first one moving a place each turn) and once per code tree (``--code``: a checkout or a
``git archive`` of another commit; default this one), each bulk insert in a fresh Python
process (imports and memory of one never weigh on the next). Printed per bulk insert: CPU
seconds of its process (``time.process_time``: every thread) and wall seconds of the
``Table.bulk_insert`` call alone, the process's peak RSS; then per code tree the ratio of each
index to the last one (RECORD_INDEX / BUCKET) turn by turn, by CPU and by wall.

The issue's goal: RECORD_INDEX at most 2x BUCKET's time. On a loaded machine read the CPU
ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO_ROOT, log, machine_info, machine_line

_CHILD = """
import json, resource, shutil, sys, time
sys.path[:0] = [{code!r}, {bench!r}]
import numpy as np
from engine import Table  # the code tree's, before bench/indexes.py puts this checkout first
from indexes import index_options, make_rows
rows = make_rows(np.arange({rows}), 1, False, {partitions}, np.random.default_rng({seed}))
table = Table.create({path!r}, name="bench", table_type="MERGE_ON_READ", record_key="key",
                     precombine="ts", partition_by=["partition"],
                     options=index_options({index!r}, {rows}, {partitions}))
cpu, wall = time.process_time(), time.perf_counter()
table.bulk_insert(rows)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
shutil.rmtree({path!r}, ignore_errors=True)
import engine
print(json.dumps({{"cpu": cpu, "wall": wall, "rss_mb": peak, "engine": engine.__file__}}))
"""


def bulk_insert(code: Path, index: str, args: argparse.Namespace, work: Path) -> dict[str, float]:
    """CPU and wall seconds of one bulk insert with ``index``, the code of ``code``."""
    script = _CHILD.format(code=str(code), bench=str(REPO_ROOT / "bench"), rows=args.rows,
                           partitions=args.partitions, seed=args.seed, index=index,
                           path=str(work / f"{index}-{os.getpid()}"))
    env = {**os.environ, "PYTHONPATH": str(code)}
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         text=True, env=env, cwd=str(code))
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not str(result.pop("engine")).startswith(str(code)):
        raise RuntimeError(f"the child imported another engine than {code}'s")
    return {name: float(value) for name, value in result.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--indexes", default="RECORD_INDEX,BUCKET")
    parser.add_argument("--code", action="append", type=Path,
                        help="a code tree to run (repeatable; default: this checkout)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the tables")
    args = parser.parse_args(argv)
    codes = [c.resolve() for c in (args.code or [REPO_ROOT])]
    indexes = args.indexes.split(",")
    log(machine_line(machine_info()))
    with tempfile.TemporaryDirectory(dir=args.out) as tmp:
        work = Path(tmp)
        results: dict[tuple[str, str], list[dict[str, float]]] = {}
        for turn in range(args.turns):
            shift = turn % len(indexes)
            for index in indexes[shift:] + indexes[:shift]:
                for code in codes:
                    got = bulk_insert(code, index, args, work)
                    results.setdefault((str(code), index), []).append(got)
                    log(f"turn {turn + 1} {index:<13} {code}: {got['cpu']:.2f} CPU s, "
                        f"{got['wall']:.2f} s, peak RSS {got['rss_mb']:.0f} MB "
                        f"(load {os.getloadavg()[0]:.1f})")
    last = indexes[-1]
    for code in codes:
        for index in indexes[:-1]:
            mine, theirs = results[(str(code), index)], results[(str(code), last)]
            cpu = [f"{m['cpu'] / t['cpu']:.2f}x" for m, t in zip(mine, theirs, strict=True)]
            wall = [f"{m['wall'] / t['wall']:.2f}x" for m, t in zip(mine, theirs, strict=True)]
            log(f"{code}: {index} / {last} by turn: CPU {', '.join(cpu)}; wall "
                f"{', '.join(wall)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
