"""Table services benchmark: how a MOR table degrades without services, and what they cost.

    python bench/services.py            # 200,000 rows + 60 x 20,000 updates, twice; clustering
    python bench/services.py --quick    # smoke run: 20,000 rows + 12 x 2,000

Three parts, one command (bench/README.md says what every figure means):

1. **Degradation.** A MERGE_ON_READ table (BUCKET index, 2 buckets per partition, 4
   partitions) loaded with ``--rows`` rows, then ``--batches`` upserts of ``--batch-size``
   random existing keys, run twice: services *off* (no compaction, cleaning or archival) and
   *on* (inline compaction every 5 deltacommits, automatic cleaning and archival at their
   defaults). Every ``--every`` batches: snapshot read rows/s, data files, data bytes, live
   file groups, active timeline instants. Then a *fresh* copy — the final rows bulk-inserted
   into a new table — as the yardstick for the goals (read >= 0.5x fresh, data files < 20 per
   live file group, bytes < 4x fresh, active timeline < 40 instants).
2. **Compaction.** ``Table.compact()`` of the services-off table after its last batch:
   rows/s, then its read rows/s.
3. **Clustering.** A COPY_ON_WRITE table with the SIMPLE index, bulk-inserted in 10 chunks
   (unsorted file groups); per layout strategy (linear, z-order, hilbert) a copy is clustered
   on ``i0,f0``: rows/s, and the fraction of base files that the parquet footers' min/max
   rule out for range filters on both columns and on each alone, computed here from the
   footers with pyarrow.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
from common import (
    DATA_COLUMNS,
    REPO_ROOT,
    Stopwatch,
    WorkloadSpec,
    dir_size,
    fmt_bytes,
    fmt_rate,
    generate_workload,
    load_average,
    log,
    machine_info,
    median,
    rate,
    sample_keys,
    text_table,
    verify,
)

if str(REPO_ROOT) not in sys.path:  # run from a checkout: make `engine` importable
    sys.path.insert(0, str(REPO_ROOT))

MOR_OPTIONS = {"hoodie.index.type": "BUCKET", "hoodie.bucket.index.num.buckets": "2"}
OFF = {"hoodie.clean.automatic": "false", "hoodie.archive.automatic": "false",
       "hoodie.compact.inline": "false"}
ON = {"hoodie.compact.inline": "true"}  # compaction every 5 deltacommits; clean, archive: defaults
STRATEGIES = ("linear", "z-order", "hilbert")
SORT_COLUMNS = ("i0", "f0")
# Range filters for pruning: i0 is uniform in [0, 1e9), f0 in [0, 1000).
FILTERS: dict[str, dict[str, tuple[float, float]]] = {
    "i0 and f0 in the middle 20%": {"i0": (400_000_000, 600_000_000), "f0": (400.0, 600.0)},
    "i0 alone": {"i0": (400_000_000, 600_000_000)},
    "f0 alone": {"f0": (400.0, 600.0)}}
GOALS = "read >= 0.5x fresh, data files < 20 per live file group, bytes < 4x fresh, " \
        "active timeline < 40 instants"


@dataclass
class Snapshot:
    """The table's state after a number of batches (or a fresh copy)."""

    label: str
    read_rate: float
    rows: int
    data_files: int
    data_bytes: int
    live_groups: int
    timeline: int
    folder_bytes: int


@dataclass
class DegradationRun:
    mode: str
    upsert_rates: list[float] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    bench_services: dict[str, int] = field(default_factory=dict)
    service_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    error: str | None = None


READS = 7
"""Timed snapshot reads per measurement; the fastest counts (one read swings by 30% on a
2-core machine: a first read after writing, a collection, another process)."""


def table_state(path: str, label: str) -> Snapshot:
    """Read the latest snapshot (timed, table opened afresh; the best of :data:`READS`) and
    count what is on storage."""
    from engine import Table
    from engine.layout.file_group import list_table_files

    rates = []
    for _ in range(READS):
        gc.collect()
        with Stopwatch() as sw:
            table = Table.open(path)
            result = table.read()
        rates.append(rate(result.num_rows, sw.seconds))
    files = list_table_files(table.storage)
    sizes = [f.size for f in files.base_files] + [f.size for f in files.log_files]
    return Snapshot(label, max(rates), result.num_rows, len(sizes),
                    sum(sizes), len(table.file_slices()), len(table.timeline()), dir_size(path))


def _drive_services(table: Any, run: DegradationRun) -> None:
    """Run what the write's own (inline/automatic) services left undone: a compaction that is
    still due, a clean, an archival. With the engine's automatic services in place these find
    nothing to do; counted only when they did something."""
    from engine.services.compaction import compaction_due
    from engine.timeline.active import Timeline

    with Stopwatch() as sw:
        timeline = Timeline.load(table.storage, table.config)
        calls = []
        if compaction_due(timeline, table.write_config):
            calls.append(("compaction", "compact"))
        calls += [("clean", "clean"), ("archive", "archive")]
        for name, method in calls:
            if getattr(table, method)().did_something:
                run.bench_services[name] = run.bench_services.get(name, 0) + 1
    run.service_seconds += sw.seconds


def degradation(mode: str, workload: Any, folder: str, every: int,
                check_keys: Sequence[int], on_options: dict[str, str]) -> DegradationRun:
    from engine import Table

    run = DegradationRun(mode)
    options = {**MOR_OPTIONS, **({**ON, **on_options} if mode == "on" else OFF)}
    try:
        table = Table.create(folder, name="bench", table_type="MERGE_ON_READ",
                             record_key="key", precombine="ts", partition_by=["partition"],
                             options=options)
        with Stopwatch() as sw:
            table.bulk_insert(workload.initial)
        log(f"[{mode}] initial load {workload.initial.num_rows:,} rows: {sw.seconds:.2f} s")
        for i, batch in enumerate(workload.batches, 1):
            with Stopwatch() as sw:
                table.upsert(batch)
            run.upsert_rates.append(rate(batch.num_rows, sw.seconds))
            if mode == "on":
                _drive_services(table, run)
            if i % every == 0 or i == len(workload.batches):
                snap = table_state(folder, f"after {i}")
                run.snapshots.append(snap)
                log(f"[{mode}] batch {i}: upsert {fmt_rate(run.upsert_rates[-1])} rows/s, "
                    f"read {fmt_rate(snap.read_rate)} rows/s, {snap.data_files} data files, "
                    f"{fmt_bytes(snap.data_bytes)}, {snap.timeline} active instants")
        final = Table.open(folder).read()
        run.problems.extend(verify(final, workload, check_keys))
    except Exception as exc:
        run.error = f"{type(exc).__name__}: {exc}"
        log(f"[{mode}] ERROR: {run.error}")
        traceback.print_exc(file=sys.stderr)
    return run


def fresh_copy(source: str, folder: str) -> Snapshot:
    """The source's latest rows bulk-inserted into a new table with the same layout."""
    from engine import Table

    rows = Table.open(source).read(columns=list(DATA_COLUMNS)).select(list(DATA_COLUMNS))
    table = Table.create(folder, name="fresh", table_type="MERGE_ON_READ", record_key="key",
                         precombine="ts", partition_by=["partition"],
                         options={**MOR_OPTIONS, **OFF})
    table.bulk_insert(rows)
    return table_state(folder, "fresh copy")


def compaction_figures(folder: str) -> tuple[float, float, Any]:
    """``Table.compact()`` of the (services-off) table at ``folder``: rows/s, read rows/s."""
    from engine import Table

    table = Table.open(folder)
    rows = table.read(columns=["key"]).num_rows
    with Stopwatch() as sw:
        result = table.compact()
    snap = table_state(folder, "compacted")
    return rate(rows, sw.seconds), snap.read_rate, result


# -- clustering ----------------------------------------------------------------------------


def pruned_fraction(path: str, ranges: dict[str, tuple[float, float]]) -> tuple[int, int]:
    """(files whose footer min/max rule the filter out, files) over the live base files."""
    from engine import Table

    files = [s.base_file for s in Table.open(path).file_slices() if s.base_file is not None]
    pruned = 0
    for base in files:
        meta = pq.ParquetFile(os.path.join(path, base.path)).metadata
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        for column, (low, high) in ranges.items():
            idx = names.index(column)
            stats = [meta.row_group(g).column(idx).statistics for g in range(meta.num_row_groups)]
            if not all(s is not None and s.has_min_max for s in stats):
                continue  # no statistics: the file must be read
            if max(s.max for s in stats) < low or min(s.min for s in stats) > high:
                pruned += 1
                break
    return pruned, len(files)


def clustering(rows: int, seed: int, folder: str) -> list[list[str]]:
    from engine import Table

    spec = WorkloadSpec(rows=rows, batches=0, batch_size=1, partitions=4, seed=seed)
    data = generate_workload(spec).initial
    source = os.path.join(folder, "unclustered")
    table = Table.create(source, name="clustered", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by=["partition"],
                         options={**OFF, "hoodie.index.type": "SIMPLE"})
    chunk = -(-rows // 10)
    for start in range(0, rows, chunk):
        table.bulk_insert(data.slice(start, chunk))
    base_bytes = sum(s.total_size() for s in table.file_slices())
    target = max(64 * 1024, base_bytes // 32)  # about 8 output files per partition
    out: list[list[str]] = []

    def pruning(path: str) -> list[str]:
        cells = []
        for ranges in FILTERS.values():
            pruned, total = pruned_fraction(path, ranges)
            cells.append(f"{pruned}/{total} ({pruned / total:.0%})" if total else "-")
        return cells

    out.append(["none (as written)", "-", "-", str(len(table.file_slices())), *pruning(source)])
    for strategy in STRATEGIES:
        copy = os.path.join(folder, strategy)
        shutil.copytree(source, copy)
        try:
            clustered = Table.open(copy, options={
                "hoodie.clustering.plan.strategy.sort.columns": ",".join(SORT_COLUMNS),
                "hoodie.layout.optimize.strategy": strategy,
                "hoodie.clustering.plan.strategy.target.file.max.bytes": str(target)})
            gc.collect()
            with Stopwatch() as sw:
                result = clustered.cluster()
            log(f"[clustering {strategy}] {sw.seconds:.2f} s, {result}")
            rows_now = clustered.read(columns=["key"]).num_rows
            check = "ok" if rows_now == rows else f"FAIL ({rows_now:,} rows)"
            out.append([strategy, fmt_rate(rate(rows, sw.seconds)), check,
                        str(len(clustered.file_slices())), *pruning(copy)])
        except Exception as exc:
            log(f"[clustering {strategy}] ERROR: {type(exc).__name__}: {exc}")
            traceback.print_exc(file=sys.stderr)
            out.append([strategy, "error", f"{type(exc).__name__}", "-",
                        *["-"] * len(FILTERS)])
    return out


# -- report --------------------------------------------------------------------------------


def snapshot_rows(runs: Sequence[DegradationRun], fresh: Snapshot | None) -> list[list[str]]:
    rows = []
    for run in runs:
        for s in run.snapshots:
            rows.append([run.mode, s.label, fmt_rate(s.read_rate), f"{s.rows:,}",
                         str(s.data_files), str(s.live_groups),
                         f"{s.data_files / max(s.live_groups, 1):.1f}", fmt_bytes(s.data_bytes),
                         str(s.timeline)])
    if fresh is not None:
        rows.append(["-", "fresh copy", fmt_rate(fresh.read_rate), f"{fresh.rows:,}",
                     str(fresh.data_files), str(fresh.live_groups),
                     f"{fresh.data_files / max(fresh.live_groups, 1):.1f}",
                     fmt_bytes(fresh.data_bytes), str(fresh.timeline)])
    return rows


def goal_lines(run: DegradationRun, fresh: Snapshot | None) -> list[str]:
    if not run.snapshots or fresh is None:
        return [f"services {run.mode}: no final figures"]
    s = run.snapshots[-1]
    checks = [
        ("read", s.read_rate / fresh.read_rate, s.read_rate >= 0.5 * fresh.read_rate,
         f"{s.read_rate / fresh.read_rate:.2f}x fresh (goal >= 0.5x)"),
        ("files", 0, s.data_files / max(s.live_groups, 1) < 20,
         f"{s.data_files / max(s.live_groups, 1):.1f} data files per live group (goal < 20)"),
        ("bytes", 0, s.data_bytes < 4 * fresh.data_bytes,
         f"{s.data_bytes / max(fresh.data_bytes, 1):.1f}x fresh bytes (goal < 4x)"),
        ("timeline", 0, s.timeline < 40, f"{s.timeline} active instants (goal < 40)"),
    ]
    text = "; ".join(f"{detail} {'pass' if ok else 'MISS'}" for _, _, ok, detail in checks)
    return [f"services {run.mode}, {s.label}: {text}"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=None, help="rows (200,000; --quick 20,000)")
    p.add_argument("--batches", type=int, default=None, help="upsert batches (60; --quick 12)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="random existing keys per batch (20,000; --quick 2,000)")
    p.add_argument("--every", type=int, default=None,
                   help="report the table every N batches (20; --quick 4)")
    p.add_argument("--cluster-rows", type=int, default=None,
                   help="rows of the clustering table (200,000; --quick 20,000; 0 skips it)")
    p.add_argument("--modes", default="off,on", help="degradation runs: off,on")
    p.add_argument("--on-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a writer option of the services-on run (repeatable), e.g. "
                   "hoodie.cleaner.commits.retained=5")
    p.add_argument("--quick", action="store_true", help="smoke run")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default=None, help="keep the tables in this new folder")
    args = p.parse_args(argv)
    small = {"rows": 20_000, "batches": 12, "batch_size": 2_000, "every": 4,
             "cluster_rows": 20_000}
    full = {"rows": 200_000, "batches": 60, "batch_size": 20_000, "every": 20,
            "cluster_rows": 200_000}
    for name, value in (small if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.mode_names = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.on_options = {}
    for item in args.on_set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--on-set: expected KEY=VALUE, got {item!r}")
        args.on_options[key.strip()] = value.strip()
    if not set(args.mode_names) <= {"off", "on"}:
        p.error("--modes: off, on or both")
    if args.batch_size > args.rows or args.every <= 0:
        p.error("--batch-size must not exceed --rows; --every must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    temp = args.out is None
    out = tempfile.mkdtemp(prefix="tidelake-services-") if temp else args.out
    if not temp:
        os.makedirs(out, exist_ok=False)
    info = machine_info(out)
    print("Machine")
    width = max(len(k) for k in info)
    for key, value in info.items():
        print(f"  {key.ljust(width)}  {value}")
    spec = WorkloadSpec(rows=args.rows, batches=args.batches, batch_size=args.batch_size,
                        update_fraction=1.0, partitions=4, seed=args.seed)
    print(f"\nWorkload: MERGE_ON_READ, BUCKET index (2 buckets per partition), "
          f"{spec.describe()}", flush=True)
    on = {**ON, **args.on_options}
    print(f"services off: {OFF}\nservices on: {on} (else defaults)\n", flush=True)
    failed = False
    try:
        workload = generate_workload(spec)
        check_keys = sample_keys(workload)
        runs = [degradation(mode, workload, os.path.join(out, f"services-{mode}"), args.every,
                            check_keys, args.on_options) for mode in args.mode_names]
        last = next((r for r in runs if r.error is None), None)
        fresh = fresh_copy(os.path.join(out, f"services-{last.mode}"),
                           os.path.join(out, "fresh")) if last else None
        off = next((r for r in runs if r.mode == "off" and r.error is None), None)
        compaction = None
        if off is not None:
            try:
                compaction = compaction_figures(os.path.join(out, "services-off"))
            except Exception as exc:
                log(f"[compaction] ERROR: {type(exc).__name__}: {exc}")
                traceback.print_exc(file=sys.stderr)
                failed = True
        cluster_rows = (clustering(args.cluster_rows, args.seed, os.path.join(out, "cluster"))
                        if args.cluster_rows > 0 else [])
    finally:
        if temp:
            shutil.rmtree(out, ignore_errors=True)

    print("Degradation (data files and bytes: every base and log file on storage; "
          "timeline: active instants)")
    print(text_table(("services", "when", "read rows/s", "rows", "data files", "live groups",
                      "files/group", "data bytes", "timeline"),
                     snapshot_rows(runs, fresh),
                     (False, False, True, True, True, True, True, True, True)))
    print(f"\nGoals after the last batch: {GOALS}")
    for run in runs:
        for line in goal_lines(run, fresh):
            print(f"  {line}")
        if run.upsert_rates:
            rates = run.upsert_rates
            print(f"  services {run.mode}: upsert rows/s median {fmt_rate(median(rates))}, "
                  f"first {fmt_rate(rates[0])}, last {fmt_rate(rates[-1])}")
        if run.mode == "on" and run.error is None:
            done = ", ".join(f"{k} {v}" for k, v in run.bench_services.items()) or "none"
            print(f"  services on: runs the bench made because the write had not (the "
                  f"engine's inline/automatic services cover the rest): {done}; "
                  f"{run.service_seconds:.1f} s in service calls made by the bench")
        if run.error:
            print(f"  services {run.mode}: ERROR {run.error}")
            failed = True
        for problem in run.problems:
            print(f"  services {run.mode}: CHECK FAILED {problem}")
            failed = True
    if compaction is not None:
        rows_rate, read_rate, result = compaction
        print(f"\nCompaction of the services-off table after its last batch: "
              f"{fmt_rate(rows_rate)} rows/s (rows in the table / Table.compact() time); "
              f"read afterwards {fmt_rate(read_rate)} rows/s; {result}")
    if cluster_rows:
        print(f"\nClustering: COPY_ON_WRITE, SIMPLE index, {args.cluster_rows:,} rows in 4 "
              f"partitions bulk-inserted in 10 chunks; sort columns {','.join(SORT_COLUMNS)}; "
              "pruned = base files whose footer min/max exclude the filter")
        print(text_table(("strategy", "rows/s", "check", "files", *FILTERS), cluster_rows,
                         (False, True, False, True, *[True] * len(FILTERS))))
        failed = failed or any(r[2] not in ("-", "ok") for r in cluster_rows)
    print(f"\nload average at the end: {load_average()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
