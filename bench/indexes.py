"""Write-side indexes at scale: per-batch upsert time by index and table size, and the cost of
one commit on a table of many files with and without the metadata table.

    python bench/indexes.py                                  # 1M, 5M and 10M rows
    python bench/indexes.py --sizes 200000,1000000 --batches 2
    python bench/indexes.py --out /tmp/ix --keep --reuse-loads   # again, from the same loads
    python bench/indexes.py --commit-cost                    # 10,000 files, MDT on vs off

Upserts (default mode): for every size N (``--sizes``) and index (``--indexes``), a
MERGE_ON_READ table (``--table-type``) of N rows is bulk-inserted, then ``--batches`` batches
of ``--batch`` rows (half updates of random existing keys, half new keys) are upserted. Keys
are random (``k`` + 16 hex digits of a scrambled number) except for ``BLOOM-ordered``, whose
keys grow with time (``k`` + the zero-padded number; new keys above every existing one), the
case where BLOOM's key ranges prune. ``BLOOM-mdt`` is BLOOM reading its filters from the
metadata table's ``bloom_filters`` partition (``hoodie.bloom.index.use.metadata``).
Printed per (size, index): the bulk insert's time, each batch's seconds and rows/s, and the
median; then the ratios the issue asks about (RECORD_INDEX at the largest size over the
smallest, RECORD_INDEX against SIMPLE). An index type the engine does not accept is skipped
with a note.

Point lookups (default mode, with RECORD_INDEX among the indexes): on the largest RECORD_INDEX
table (MERGE_ON_READ: its slices have logs after the batches), ``Table.open`` +
``read(filters=[("key", "=", k)])`` for ``--lookups`` random existing keys, median, with the
record index and without it: the same files linked into a copy whose ``hoodie.properties``
does not declare ``record_index`` (the reader then prunes by footers, which rule nothing out
of a slice with logs). ``Table.explain`` gives the slices each reads.

Range pruning (default mode; ``--range-rows`` 0 skips it): a COPY_ON_WRITE table of
``--range-rows`` rows with column statistics, clustered with ``x`` (random, unique) as sort
column into about ``--range-files`` files; a filter ``x`` in a 1% range: ``Table.explain``'s
slices pruned by column_stats (goal >= 90%), and the read's time with the filter as DNF
(pruned) and as an expression (not pruned).

Commit cost (``--commit-cost``): a table of ``--files`` small base files (one row each, in
100 partitions), then ``--commits`` upserts of 10 rows into one partition, with
``hoodie.metadata.enable`` true and false: the median seconds of one commit and the storage
listing calls it made (``Storage.list_dir`` and ``Storage.walk_files``, counted).

Every figure is wall-clock: run on an otherwise idle machine. The machine is printed first.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from common import REPO_ROOT, key_strings, log, machine_info, text_table

if str(REPO_ROOT) not in sys.path:  # run from a checkout: make `engine` importable
    sys.path.insert(0, str(REPO_ROOT))

DEFAULT_SIZES = "1000000,5000000,10000000"
DEFAULT_INDEXES = "SIMPLE,BLOOM,BLOOM-ordered,RECORD_INDEX,BUCKET"
KNOWN_INDEXES = ("SIMPLE", "BLOOM", "BLOOM-ordered", "BLOOM-mdt", "RECORD_INDEX", "BUCKET")
ROWS_PER_BUCKET = 250_000
SCRAMBLE = np.uint64(0x9E3779B97F4A7C15)


# -- workload ----------------------------------------------------------------------------


def random_keys(numbers: np.ndarray) -> pa.Array:
    """``k`` + 16 hex digits of ``number * golden ratio (mod 2^64)``: unique, in random
    order with respect to the numbers."""
    mixed = numbers.astype(np.uint64) * SCRAMBLE  # wraps mod 2^64
    return pa.array(np.char.add("k", np.char.zfill(np.char.mod("%x", mixed), 16)))


def make_rows(numbers: np.ndarray, ts: int, ordered: bool, partitions: int,
              rng: np.random.Generator) -> pa.Table:
    n = len(numbers)
    keys = key_strings(numbers) if ordered else random_keys(numbers)
    part = np.char.add("p", (numbers % partitions).astype(str))
    return pa.table({
        "key": keys,
        "ts": pa.array(np.full(n, ts, np.int64)),
        "partition": pa.array(part),
        "i0": pa.array(rng.integers(0, 1 << 40, n)),
        "f0": pa.array(rng.random(n)),
        "s0": pa.array(np.char.add("payload-", rng.integers(0, 10**9, n).astype(str))),
    })


def batches(size: int, count: int, batch: int, seed: int) -> list[np.ndarray]:
    """Key numbers of each batch: half random existing keys (no repeats), half new ones."""
    rng = np.random.default_rng(seed)
    out = []
    total = size
    for _ in range(count):
        updates = rng.choice(total, size=batch // 2, replace=False)
        new = np.arange(total, total + batch - batch // 2)
        total += len(new)
        out.append(rng.permutation(np.concatenate([updates, new])))
    return out


# -- index variants ------------------------------------------------------------------------


def index_options(name: str, size: int, partitions: int) -> dict[str, str]:
    if name in ("BLOOM", "BLOOM-ordered"):
        return {"hoodie.index.type": "BLOOM"}
    if name == "BLOOM-mdt":
        return {"hoodie.index.type": "BLOOM",
                "hoodie.metadata.index.bloom.filter.enable": "true",
                "hoodie.bloom.index.use.metadata": "true"}
    if name == "RECORD_INDEX":
        return {"hoodie.index.type": "RECORD_INDEX",
                "hoodie.metadata.record.index.enable": "true"}
    if name == "BUCKET":
        buckets = max(2, math.ceil(size / partitions / ROWS_PER_BUCKET))
        return {"hoodie.index.type": "BUCKET", "hoodie.bucket.index.num.buckets": str(buckets)}
    return {"hoodie.index.type": name}


def refusal(options: dict[str, str]) -> str | None:
    """Why the engine refuses these writer options (None: it accepts them)."""
    from engine.config import WriteConfig
    from engine.errors import TidelakeError

    try:
        WriteConfig.from_options(options)
    except (TidelakeError, ValueError) as exc:
        return str(exc)
    return None


# -- upserts -------------------------------------------------------------------------------


@dataclass
class Run:
    index: str
    size: int
    load_seconds: float = 0.0
    batch_seconds: list[float] = field(default_factory=list)
    batch_cpu: list[float] = field(default_factory=list)
    index_lookup_seconds: list[float] = field(default_factory=list)
    upsert_peak_rss: int | None = None
    lookup_ms: float | None = None
    lookup_slices: int | None = None
    plain_lookup_ms: float | None = None
    plain_lookup_slices: int | None = None
    slices: int | None = None
    lookups: int = 0
    note: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.batch_seconds) if self.batch_seconds else None

    @property
    def median_cpu(self) -> float | None:
        return statistics.median(self.batch_cpu) if self.batch_cpu else None

    @property
    def warm_cpu(self) -> float | None:
        """Median CPU of the batches after the first (record_index key indexes kept by the
        process, as in a streaming job's steady state); None with one batch."""
        return statistics.median(self.batch_cpu[1:]) if len(self.batch_cpu) > 1 else None

    @property
    def warm(self) -> float | None:
        return statistics.median(self.batch_seconds[1:]) if len(self.batch_seconds) > 1 else None


def run_upserts(work: Path, index: str, size: int, args: argparse.Namespace,
                lookup: bool) -> Run:
    from engine import Table

    run = Run(index, size)
    options = {**index_options(index, size, args.partitions), **dict(args.option or [])}
    why = refusal(options)
    if why is not None:
        run.note = f"skipped: the engine does not accept {options['hoodie.index.type']} ({why})"
        return run
    ordered = index == "BLOOM-ordered"
    rng = np.random.default_rng(args.seed)
    path = work / f"{index}-{size}"
    shutil.rmtree(path, ignore_errors=True)  # a table an earlier --keep run left
    if index in SHARED_LOAD:
        template, run.load_seconds = shared_load(work, size, args)
        copy_table(template, path, keep_record_index=index == "RECORD_INDEX",
                   index_type=options["hoodie.index.type"])
        table = Table.open(str(path), options)
    else:
        table = Table.create(str(path), name="bench", table_type=args.table_type,
                             record_key="key", precombine="ts", partition_by=["partition"],
                             options=options)
        initial = make_rows(np.arange(size), 1, ordered, args.partitions, rng)
        started = time.perf_counter()
        table.bulk_insert(initial)
        run.load_seconds = time.perf_counter() - started
        del initial
    rng = np.random.default_rng(args.seed + 7)
    from engine.metadata.reader import drop_key_indexes

    drop_key_indexes()  # batch 1 starts cold, as a new process would
    _reset_peak_rss()
    for b, numbers in enumerate(batches(size, args.batches, args.batch, args.seed)):
        data = make_rows(numbers, 2 + b, ordered, args.partitions, rng)
        if index == "RECORD_INDEX":
            run.index_lookup_seconds.append(index_lookup_seconds(path, data))
        started, cpu = time.perf_counter(), time.process_time()
        table.upsert(data)
        run.batch_seconds.append(time.perf_counter() - started)
        run.batch_cpu.append(time.process_time() - cpu)
        log(f"  {index} {size:,}: batch {b + 1} {run.batch_seconds[-1]:.2f} s "
            f"({run.batch_cpu[-1]:.2f} CPU s)"
            + (f" (record_index lookup alone: {run.index_lookup_seconds[-1]:.2f} s)"
               if run.index_lookup_seconds else ""))
    run.upsert_peak_rss = _peak_rss()
    if run.upsert_peak_rss:
        log(f"  {index} {size:,}: peak RSS of the upserts {run.upsert_peak_rss / 2**30:.2f} GiB")
    if lookup:
        point_lookups(run, path, work / f"{index}-{size}-without-index", ordered, args)
    if not args.keep:
        shutil.rmtree(path, ignore_errors=True)
    return run


def _reset_peak_rss() -> None:
    """Restart the process's peak RSS count (Linux: ``clear_refs`` 5), so the peak read after
    the upserts is theirs, not the workload's or a bulk insert's."""
    with suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_rss() -> int | None:
    """Peak RSS bytes since :func:`_reset_peak_rss` (``VmHWM``), None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def index_lookup_seconds(path: Path, data: pa.Table) -> float:
    """Seconds to look the batch's keys up in the record_index, as the streaming job's
    executor tasks do (:func:`engine.metadata.record_index_lookup.lookup_in_groups`: each
    file group the keys hash to, over the group slices the driver lists), on a freshly
    opened table, cold: no key index kept or used (``cache_bytes`` 0), so the upsert after
    it finds the process's cache as it was."""
    from engine import Table
    from engine.metadata.record_index_lookup import group_slices, lookup_in_groups
    from engine.timeline.active import Timeline

    table = Table.open(str(path))
    timeline = Timeline.load(table.storage, table.config)
    started = time.perf_counter()
    pieces = group_slices(table.storage, timeline)
    keys = sorted(set(data.column("key").to_pylist()))
    found = lookup_in_groups(table.storage, timeline.config, pieces, data.column("key"),
                             cache_bytes=0).locations.num_rows
    seconds = time.perf_counter() - started
    if found != len(keys) // 2:  # the batch updates half its keys, inserts the others
        log(f"  record_index lookup found {found:,} of {len(keys):,} keys, expected "
            f"{len(keys) // 2:,}")
    return seconds


SHARED_LOAD = ("SIMPLE", "BLOOM", "BLOOM-mdt", "RECORD_INDEX")
"""Indexes whose tables hold the same files after the bulk insert (random keys, no bucket
layout): one bulk insert per size with the record index built, hard-linked for each (Hudi
files are never changed in place; ``hoodie.properties`` is replaced by a rename)."""

_LOADS: dict[int, tuple[Path, float]] = {}


def shared_load(work: Path, size: int, args: argparse.Namespace) -> tuple[Path, float]:
    """The bulk-inserted table of ``size`` rows the :data:`SHARED_LOAD` indexes start from,
    and the seconds its bulk insert took."""
    from engine import Table

    path = work / f"loaded-{size}"
    if size not in _LOADS and args.reuse_loads and (path / ".hoodie" / "metadata").is_dir():
        _LOADS[size] = (path, math.nan)
        log(f"  reusing the bulk-loaded table {path} (its load time is not measured)")
    if size not in _LOADS:
        if not args.keep:
            for old in [s for s in _LOADS if s != size]:  # one template on disk at a time
                shutil.rmtree(_LOADS.pop(old)[0], ignore_errors=True)
        table = Table.create(str(path), name="bench", table_type=args.table_type,
                             record_key="key", precombine="ts", partition_by=["partition"],
                             options={**index_options("RECORD_INDEX", size, args.partitions),
                                      **dict(args.option or [])})
        initial = make_rows(np.arange(size), 1, False, args.partitions,
                            np.random.default_rng(args.seed))
        started = time.perf_counter()
        table.bulk_insert(initial)
        _LOADS[size] = (path, time.perf_counter() - started)
        log(f"  bulk insert of {size:,} rows (shared by {', '.join(SHARED_LOAD)}): "
            f"{_LOADS[size][1]:.1f} s")
    return _LOADS[size]


def copy_table(source: Path, target: Path, *, keep_record_index: bool,
               index_type: str | None = None) -> None:
    """Hard-link ``source``'s files into ``target``; without ``keep_record_index`` the copy
    does not declare the record_index (its writers neither read nor update it). With
    ``index_type`` the copy records that ``hoodie.index.type`` (a table refuses writers of
    another key placement; the bench starts every index from the same files)."""
    from engine.layout.properties import dumps
    from engine.metadata.record_index import RECORD_INDEX
    from engine.metadata.table import (
        declared_partitions,
        read_data_properties,
        set_declared_partitions,
    )
    from engine.storage import Storage

    shutil.copytree(source, target, copy_function=_link)
    storage = Storage(str(target))
    if index_type is not None:
        props = read_data_properties(storage)
        props["hoodie.index.type"] = index_type
        storage.write_replace(".hoodie/hoodie.properties", dumps(
            props, last_key="hoodie.table.checksum").encode("latin-1"))
    if not keep_record_index:
        set_declared_partitions(storage, [p for p in declared_partitions(storage)
                                          if p != RECORD_INDEX])


def point_lookups(run: Run, path: Path, plain: Path, ordered: bool,
                  args: argparse.Namespace) -> None:
    """Median ``Table.open`` + key-equality read of ``--lookups`` random existing keys, with
    the record index (``path``) and without (``plain``: the same files, hard-linked, with
    ``record_index`` not declared)."""
    from engine import Table

    copy_table(path, plain, keep_record_index=False)
    keys = (key_strings if ordered else random_keys)(
        np.random.default_rng(args.seed + 1).choice(run.size, args.lookups, replace=False))
    run.lookups = args.lookups
    for where, attr in ((path, "lookup"), (plain, "plain_lookup")):
        times = []
        for key in keys.to_pylist():
            started = time.perf_counter()
            found = Table.open(str(where)).read(filters=[("key", "=", key)])
            times.append(time.perf_counter() - started)
            if found.num_rows != 1:
                run.note = f"lookup of {key} in {where.name} returned {found.num_rows} rows"
        report = Table.open(str(where)).explain([("key", "=", keys[0].as_py())])
        setattr(run, f"{attr}_ms", statistics.median(times) * 1000)
        setattr(run, f"{attr}_slices", report["slices_read"])
        run.slices = report["slices"]
        log(f"  lookups in {where.name}: median {statistics.median(times) * 1000:.0f} ms, "
            f"{report['slices_read']} of {report['slices']} slices read")
    shutil.rmtree(plain, ignore_errors=True)


def _link(source: str, target: str) -> None:
    import os

    os.link(source, target)


def report_upserts(runs: list[Run], args: argparse.Namespace) -> None:
    headers = ["index", "rows", "bulk insert s", *[f"batch {i + 1} s" for i in
                                                    range(args.batches)],
               "median s", "median rows/s", "median CPU s"]
    rows = []
    for r in runs:
        if r.note.startswith("skipped"):
            continue
        med = r.median
        rows.append([r.index, f"{r.size:,}", f"{r.load_seconds:.1f}",
                     *[f"{s:.2f}" for s in r.batch_seconds],
                     f"{med:.2f}" if med else "-",
                     f"{args.batch / med:,.0f}" if med else "-",
                     f"{r.median_cpu:.2f}" if r.median_cpu else "-"])
    print()
    print(f"Upserts of {args.batch:,} rows (50% updates), {args.table_type}, "
          f"{args.partitions} partitions:")
    print(text_table(headers, rows, [False] + [True] * (len(headers) - 1)))
    for note in sorted({r.note for r in runs if r.note}):
        print(f"note: {note}")
    by = {(r.index, r.size): r for r in runs if r.median is not None}
    sizes = sorted({r.size for r in runs})
    if len(sizes) > 1 and ("RECORD_INDEX", sizes[0]) in by and ("RECORD_INDEX", sizes[-1]) in by:
        ratio = ((by[("RECORD_INDEX", sizes[-1])].median or 0.0)
                 / (by[("RECORD_INDEX", sizes[0])].median or 1.0))
        cpu = ((by[("RECORD_INDEX", sizes[-1])].median_cpu or 0.0)
               / (by[("RECORD_INDEX", sizes[0])].median_cpu or 1.0))
        print(f"RECORD_INDEX per-batch cost at {sizes[-1]:,} / at {sizes[0]:,}, median of all "
              f"batches: {ratio:.2f}x wall, {cpu:.2f}x CPU")
        big, small = by[("RECORD_INDEX", sizes[-1])], by[("RECORD_INDEX", sizes[0])]
        print(f"  cold (batch 1: no record_index key index kept yet): "
              f"{big.batch_cpu[0]:.2f} / {small.batch_cpu[0]:.2f} CPU s = "
              f"{big.batch_cpu[0] / small.batch_cpu[0]:.2f}x, {big.batch_seconds[0]:.2f} / "
              f"{small.batch_seconds[0]:.2f} s = "
              f"{big.batch_seconds[0] / small.batch_seconds[0]:.2f}x wall")
        if big.warm_cpu and small.warm_cpu and big.warm and small.warm:
            print(f"  warm (median of batches 2..{args.batches}, the key indexes kept by the "
                  f"process; the goal's steady state): {big.warm_cpu:.2f} / "
                  f"{small.warm_cpu:.2f} CPU s = {big.warm_cpu / small.warm_cpu:.2f}x CPU, "
                  f"{big.warm:.2f} / {small.warm:.2f} s = {big.warm / small.warm:.2f}x wall "
                  f"(goal <= 1.5x)")
        for r in (small, big):
            if r.upsert_peak_rss:
                print(f"  peak RSS of the upserts at {r.size:,} (after its workload was "
                      f"generated): {r.upsert_peak_rss / 2**30:.2f} GiB")
    lookup = {r.size: statistics.median(r.index_lookup_seconds) for r in runs
              if r.index_lookup_seconds}
    for size, seconds in sorted(lookup.items()):
        print(f"record_index lookup of a batch's {args.batch:,} keys alone (what the streaming "
              f"job's tasks run), {size:,} rows: median {seconds:.2f} s")
    if len(lookup) > 1:
        first, last = min(lookup), max(lookup)
        print(f"record_index lookup per batch at {last:,} / at {first:,}: "
              f"{lookup[last] / lookup[first]:.2f}x (goal: flat)")
    for size in sizes:
        if ("RECORD_INDEX", size) in by and ("SIMPLE", size) in by:
            rli, simple = by[("RECORD_INDEX", size)].median, by[("SIMPLE", size)].median
            rli_cpu = by[("RECORD_INDEX", size)].median_cpu or 0.0
            simple_cpu = by[("SIMPLE", size)].median_cpu or 0.0
            print(f"{size:,} rows: RECORD_INDEX {args.batch / rli:,.0f} rows/s vs SIMPLE "
                  f"{args.batch / simple:,.0f} rows/s (goal: above SIMPLE); CPU s a batch "
                  f"{rli_cpu:.2f} vs {simple_cpu:.2f}")
    lookups = [r for r in runs if r.lookup_ms is not None]
    for r in lookups:
        print(f"point lookup, {args.table_type} table of {r.size:,} rows with logs "
              f"({r.slices} file slices), median of {r.lookups} random keys (Table.open + "
              f"read with key filter): with the record index {r.lookup_ms:.0f} ms "
              f"({r.lookup_slices} slice read), without {r.plain_lookup_ms:.0f} ms "
              f"({r.plain_lookup_slices} slices read); goal <= 50 ms via the record index")
    if not lookups:
        print("point lookup: not measured (needs RECORD_INDEX among --indexes)")


# -- range pruning by column statistics -------------------------------------------------------


def range_pruning(work: Path, args: argparse.Namespace) -> None:
    """A table clustered on ``x``, a 1% range filter on ``x``: slices pruned by column_stats
    (``Table.explain``) and the read's time pruned and not."""
    from engine import Table
    from engine.read.reader import to_expression

    n = args.range_rows
    rng = np.random.default_rng(args.seed + 2)
    path = work / "clustered"
    rows = make_rows(np.arange(n), 1, False, 1, rng).drop_columns(["partition"])
    rows = rows.append_column("x", pa.array(rng.permutation(n).astype(np.int64)))
    table = Table.create(str(path), name="bench", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts",
                         options={"hoodie.metadata.index.column.stats.enable": "true"})
    started = time.perf_counter()
    table.bulk_insert(rows)
    load = time.perf_counter() - started
    size = sum((path / s.base_file.path).stat().st_size
               for s in table.file_slices() if s.base_file is not None)
    target = max(size // max(args.range_files, 1), 1)
    table = Table.open(str(path), {
        "hoodie.metadata.index.column.stats.enable": "true",
        "hoodie.clustering.plan.strategy.sort.columns": "x",
        "hoodie.clustering.plan.strategy.target.file.max.bytes": str(target),
        "hoodie.clustering.plan.strategy.max.bytes.per.group": str(1 << 40),
        "hoodie.clustering.plan.strategy.small.file.limit": str(1 << 40),
        "hoodie.parquet.max.file.size": str(1 << 40)})
    started = time.perf_counter()
    table.cluster()
    cluster = time.perf_counter() - started
    low = n // 2
    filters = [("x", ">=", low), ("x", "<", low + n // 100)]
    report = Table.open(str(path)).explain(filters)
    timed = {}
    for name, f in (("pruned", filters), ("unpruned", to_expression(filters))):
        times = []
        for _ in range(3):
            started = time.perf_counter()
            got = Table.open(str(path)).read(filters=f)
            times.append(time.perf_counter() - started)
        timed[name] = statistics.median(times) * 1000
        if got.num_rows != n // 100:
            print(f"note: {name} range read returned {got.num_rows} rows, not {n // 100}")
    pruned = report["slices_pruned_by_column_stats"]
    print()
    print(f"Range pruning: COPY_ON_WRITE table of {n:,} rows (bulk insert {load:.1f} s), "
          f"clustered on x ({cluster:.1f} s) into {report['slices']} file slices; filter "
          f"{low:,} <= x < {low + n // 100:,} (1%): {pruned} of {report['slices']} slices "
          f"pruned by column_stats ({100 * pruned / max(report['slices'], 1):.1f}%, goal >= "
          f"90%), {report['slices_read']} read; read median of 3: {timed['pruned']:.0f} ms "
          f"pruned, {timed['unpruned']:.0f} ms as an expression (not pruned)")
    if not args.keep:
        shutil.rmtree(path, ignore_errors=True)


# -- commit cost ---------------------------------------------------------------------------


@contextmanager
def counted_listings() -> Iterator[dict[str, int]]:
    """Count, inside the block, calls of ``Storage.list_dir`` and ``Storage.walk_files`` and
    the entries they return (``entries``: files listed; on object storage each page of 1,000
    entries is one request)."""
    from engine.storage import LocalStorage as Storage

    counts = {"list_dir": 0, "walk_files": 0, "entries": 0}
    originals: dict[str, Callable[..., Any]] = {}
    for name in ("list_dir", "walk_files"):
        original = getattr(Storage, name)
        originals[name] = original

        def wrapper(self: Any, *a: Any, _n: str = name, _o: Any = original, **k: Any) -> Any:
            counts[_n] += 1
            result = _o(self, *a, **k)
            if _n == "list_dir":
                counts["entries"] += len(result)
                return result
            folders = list(result)
            counts["entries"] += sum(len(files) for _, files in folders)
            return iter(folders)

        setattr(Storage, name, wrapper)
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(Storage, name, original)


def commit_cost(work: Path, args: argparse.Namespace) -> None:
    from engine import Table

    partitions = 100
    source = work / "files"
    log(f"building a table of {args.files:,} base files ({partitions} partitions)")
    table = Table.create(str(source), name="bench", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by=["partition"],
                         options={"hoodie.metadata.enable": "false",
                                  "hoodie.parquet.max.file.size": "1024",
                                  "hoodie.copyonwrite.record.size.estimate": "1024"})
    rng = np.random.default_rng(args.seed)
    numbers = np.arange(args.files)
    started = time.perf_counter()
    table.bulk_insert(make_rows(numbers, 1, True, partitions, rng))
    build = time.perf_counter() - started
    files = sum(1 for s in table.file_slices() if s.base_file is not None)
    log(f"  {files:,} base files in {build:.1f} s")
    results = []
    for enabled in (True, False):
        path = work / f"mdt-{str(enabled).lower()}"
        shutil.copytree(source, path)
        opts = {"hoodie.metadata.enable": str(enabled).lower(),
                "hoodie.clean.automatic": "false", "hoodie.parquet.small.file.limit": "1"}
        # a first commit creates the metadata table (when on): not measured
        Table.open(str(path), opts).upsert(make_rows(np.arange(10), 2, True, partitions, rng))
        seconds, calls, entries = [], [], []
        for c in range(args.commits):
            rows = make_rows(np.arange(10) * partitions, 3 + c, True, partitions, rng)
            with counted_listings() as counts:
                started = time.perf_counter()
                Table.open(str(path), opts).upsert(rows)
                seconds.append(time.perf_counter() - started)
            calls.append(counts["list_dir"] + counts["walk_files"])
            entries.append(counts["entries"])
            log(f"  metadata {enabled}: commit {c + 1} {seconds[-1]:.2f} s, {calls[-1]} "
                f"listing calls ({counts})")
        results.append((enabled, statistics.median(seconds), statistics.median(calls),
                        statistics.median(entries)))
        if not args.keep:
            shutil.rmtree(path, ignore_errors=True)
    print()
    print(f"One commit (Table.open + upsert of 10 rows into one partition) on a table of "
          f"{files:,} base files in {partitions} partitions, median of {args.commits}:")
    print(text_table(["hoodie.metadata.enable", "seconds", "listing calls", "entries listed"],
                     [[str(e).lower(), f"{s:.3f}", f"{c:.0f}", f"{n:,.0f}"]
                      for e, s, c, n in results],
                     [False, True, True, True]))


# -- main ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES,
                        help=f"table sizes in rows, comma-separated (default {DEFAULT_SIZES})")
    parser.add_argument("--indexes", default=DEFAULT_INDEXES,
                        help=f"of {', '.join(KNOWN_INDEXES)} (default {DEFAULT_INDEXES})")
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--table-type", default="MERGE_ON_READ",
                        choices=["MERGE_ON_READ", "COPY_ON_WRITE"])
    parser.add_argument("--option", action="append", type=lambda s: tuple(s.split("=", 1)),
                        help="extra writer option key=value for every table (repeatable)")
    parser.add_argument("--commit-cost", action="store_true",
                        help="measure one commit on a table of --files files, MDT on vs off")
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--commits", type=int, default=3)
    parser.add_argument("--lookups", type=int, default=20,
                        help="random keys of the point-lookup figure (default 20)")
    parser.add_argument("--range-rows", type=int, default=1_000_000,
                        help="rows of the range-pruning table (0: skip it; default 1,000,000)")
    parser.add_argument("--range-files", type=int, default=100,
                        help="files the range-pruning table is clustered into (default 100)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", help="work folder (default: a temporary one, deleted)")
    parser.add_argument("--keep", action="store_true", help="keep the tables")
    parser.add_argument("--reuse-loads", action="store_true",
                        help="start SIMPLE, BLOOM and RECORD_INDEX from the bulk-loaded tables "
                             "(loaded-<size>) a run with the same --out, --keep, --seed, "
                             "--partitions and --table-type left (no bulk insert)")
    args = parser.parse_args(argv)

    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tidelake-indexes-"))
    work.mkdir(parents=True, exist_ok=True)
    info = machine_info(str(work))
    print("Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    print("Command: python bench/indexes.py " + " ".join(sys.argv[1:] if argv is None
                                                          else argv))
    try:
        if args.commit_cost:
            commit_cost(work, args)
            return 0
        sizes = [int(s) for s in args.sizes.split(",") if s]
        indexes = [i.strip() for i in args.indexes.split(",") if i.strip()]
        unknown = [i for i in indexes if i not in KNOWN_INDEXES]
        if unknown:
            parser.error(f"unknown index {unknown[0]!r} (known: {', '.join(KNOWN_INDEXES)})")
        runs = []
        for size in sizes:
            for index in indexes:
                log(f"{index}, {size:,} rows")
                run = run_upserts(work, index, size, args,
                                  lookup=index == "RECORD_INDEX" and size == max(sizes))
                if run.note.startswith("skipped"):
                    log(f"  {run.note}")
                runs.append(run)
        report_upserts(runs, args)
        if args.range_rows:
            log(f"range pruning, {args.range_rows:,} rows")
            range_pruning(work, args)
    finally:
        if not args.out and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
