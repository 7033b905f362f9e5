"""Upsert benchmark: tidelake (COW, MOR-Avro, MOR-Parquet) against deltalake, lance and Paimon.

    python bench/upsert.py                 # full run: 1M rows + 10 x 100k, every engine
    python bench/upsert.py --quick         # smoke run: 100k rows + 3 x 10k
    python bench/upsert.py --engines mor-parquet,deltalake --markdown out.md

Each engine gets the same generated workload: an initial load, then batches of upserts
(half updates of random existing keys, half new keys). Printed per engine: initial load
rows/s, upsert rows/s (median, first and last batch), full-read rows/s of the final table,
point-lookup time, final row count, size on disk, a correctness check, and for tidelake the
targets with pass/miss. See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import functools
import gc
import io
import os
import pstats
import resource
import shlex
import shutil
import sys
import tempfile
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from common import (
    REPO_ROOT,
    Stopwatch,
    Workload,
    WorkloadSpec,
    dir_size,
    fmt_bytes,
    fmt_rate,
    fmt_seconds,
    generate_workload,
    key_string,
    load_average,
    log,
    machine_info,
    machine_line,
    markdown_table,
    median,
    package_version,
    rate,
    sample_keys,
    text_table,
    verify,
)

if str(REPO_ROOT) not in sys.path:  # run from a checkout: make `engine` importable
    sys.path.insert(0, str(REPO_ROOT))

T = TypeVar("T")

ALL_ENGINES = ("cow", "mor-avro", "mor-parquet", "deltalake", "lance", "paimon")
LOOKUPS = 5

# Targets from the issue, for a 2-core machine, on the full workload.
UPSERT_TARGETS = {"mor-parquet": 600_000.0, "mor-avro": 150_000.0, "cow": 150_000.0}
READ_TARGET_MOR = 1_500_000.0


# -- engines ---------------------------------------------------------------------------


class Engine(ABC):
    """One table format under test, writing to its own folder."""

    name: str
    description: str
    is_tidelake = False

    def __init__(self) -> None:
        self.path = ""

    def unavailable(self) -> str | None:
        """Why this engine cannot run here, or ``None`` when it can."""
        return None

    @abstractmethod
    def create(self, path: str) -> None: ...

    @abstractmethod
    def load(self, data: pa.Table) -> None: ...

    @abstractmethod
    def upsert(self, batch: pa.Table) -> None: ...

    @abstractmethod
    def read_full(self) -> pa.Table:
        """Open the table afresh and read every row and column of its latest snapshot."""

    @abstractmethod
    def lookup(self, key: str) -> pa.Table:
        """Open the table afresh and read the rows whose ``key`` equals ``key``."""

    def compact(self) -> bool:
        """Compact the table (tidelake MERGE_ON_READ); False if the engine has no such step."""
        return False

    @property
    def upsert_target(self) -> float | None:
        return None

    @property
    def read_target(self) -> float | None:
        return None


class TidelakeEngine(Engine):
    is_tidelake = True

    def __init__(self, name: str, table_type: str, log_format: str | None, buckets: int,
                 initial_load: str) -> None:
        super().__init__()
        self.name = name
        self.table_type = table_type
        self.log_format = log_format
        self.buckets = buckets
        self.initial_load = initial_load
        fmt = f", {log_format} log blocks" if log_format else ""
        self.description = (f"tidelake {table_type}{fmt}, BUCKET index ({buckets} buckets "
                            f"per partition), initial load by {initial_load}")
        self.table: Any = None

    def unavailable(self) -> str | None:
        try:
            from engine import Table  # noqa: F401
        except Exception as exc:
            return f"tidelake's engine does not import: {type(exc).__name__}: {exc}"
        return None

    def create(self, path: str) -> None:
        from engine import Table

        self.path = path
        # Nothing cleaned or archived, like the peers (no vacuum): sizes count every version.
        options = {"hoodie.index.type": "BUCKET",
                   "hoodie.bucket.index.num.buckets": str(self.buckets),
                   "hoodie.clean.automatic": "false", "hoodie.archive.automatic": "false"}
        if self.log_format is not None:
            options["hoodie.logfile.data.block.format"] = self.log_format
        self.table = Table.create(path, name="bench", table_type=self.table_type,
                                  record_key="key", precombine="ts",
                                  partition_by=["partition"], options=options)

    def load(self, data: pa.Table) -> None:
        getattr(self.table, self.initial_load)(data)

    def upsert(self, batch: pa.Table) -> None:
        self.table.upsert(batch)

    def read_full(self) -> pa.Table:
        from engine import Table

        result: pa.Table = Table.open(self.path).read()
        return result

    def lookup(self, key: str) -> pa.Table:
        from engine import Table

        result: pa.Table = Table.open(self.path).read(filters=[("key", "=", key)])
        return result

    def compact(self) -> bool:
        """``Table.compact()`` at the defaults; False when there is nothing to compact
        (COPY_ON_WRITE)."""
        from engine import Table

        if self.table_type != "MERGE_ON_READ":
            return False
        Table.open(self.path).compact()
        return True

    @property
    def upsert_target(self) -> float | None:
        return UPSERT_TARGETS.get(self.name)

    @property
    def read_target(self) -> float | None:
        return READ_TARGET_MOR if self.table_type == "MERGE_ON_READ" else None


class DeltaEngine(Engine):
    name = "deltalake"

    def __init__(self) -> None:
        super().__init__()
        self.table: Any = None
        version = _version("deltalake")
        self.description = (f"deltalake {version}: write_deltalake, partitioned by "
                            "`partition`; MERGE on key and partition (when matched update "
                            "all, when not matched insert all); lookups filter on "
                            "cast(key as string)")

    def unavailable(self) -> str | None:
        return _missing("deltalake")

    def create(self, path: str) -> None:
        self.path = path

    def load(self, data: pa.Table) -> None:
        from deltalake import DeltaTable, write_deltalake

        write_deltalake(self.path, data, partition_by=["partition"])
        self.table = DeltaTable(self.path)

    def upsert(self, batch: pa.Table) -> None:
        (self.table.merge(batch, predicate="t.key = s.key AND t.partition = s.partition",
                          source_alias="s", target_alias="t")
         .when_matched_update_all()
         .when_not_matched_insert_all()
         .execute())

    def read_full(self) -> pa.Table:
        from deltalake import DeltaTable

        result: pa.Table = DeltaTable(self.path).to_pyarrow_table()
        return result

    def lookup(self, key: str) -> pa.Table:
        from deltalake import DeltaTable

        # Files written by MERGE store `key` as string_view; with pyarrow 26 the plain filter
        # [("key", "=", key)] then fails ("no kernel matching (string, string_view)"), so the
        # column is cast first. Every file is read either way: keys are spread over all
        # partitions and every file's key range.
        expr = pc.field("key").cast(pa.string()) == key
        result: pa.Table = DeltaTable(self.path).to_pyarrow_table(filters=expr)
        return result


class LanceEngine(Engine):
    name = "lance"

    def __init__(self) -> None:
        super().__init__()
        self.dataset: Any = None
        version = _version("lance", "pylance")
        self.description = (f"lance {version}: write_dataset, then merge_insert on key "
                            "(when matched update all, when not matched insert all); "
                            "no scalar index")

    def unavailable(self) -> str | None:
        return _missing("lance", "pylance")

    def create(self, path: str) -> None:
        self.path = path

    def load(self, data: pa.Table) -> None:
        import lance

        self.dataset = lance.write_dataset(data, self.path)

    def upsert(self, batch: pa.Table) -> None:
        (self.dataset.merge_insert("key")
         .when_matched_update_all()
         .when_not_matched_insert_all()
         .execute(batch))

    def read_full(self) -> pa.Table:
        import lance

        result: pa.Table = lance.dataset(self.path).to_table()
        return result

    def lookup(self, key: str) -> pa.Table:
        import lance

        result: pa.Table = lance.dataset(self.path).to_table(filter=f"key = '{key}'")
        return result


class PaimonEngine(Engine):
    """Apache Paimon's Python writer with its Rust bindings (pypaimon + pypaimon-rust): a
    primary-key table (``partition``, ``key``; Paimon requires the partition in the key),
    fixed buckets (``--buckets`` per partition, as tidelake's BUCKET index), ``ts`` as the
    sequence field (tidelake's precombine), Parquet files, native write, commit and read."""

    name = "paimon"

    def __init__(self, buckets: int) -> None:
        super().__init__()
        self.buckets = buckets
        self.table: Any = None
        version = _version("pypaimon")
        rust = _version("pypaimon_rust", "pypaimon-rust")
        self.description = (f"pypaimon {version} + pypaimon-rust {rust}: primary key "
                            f"(partition, key), {buckets} fixed buckets, sequence.field ts, "
                            "parquet, native write/commit/read; one batch write + commit "
                            "per batch")

    def unavailable(self) -> str | None:
        return _missing("pypaimon") or _missing("pypaimon_rust", "pypaimon-rust")

    def create(self, path: str) -> None:
        self.path = path

    def _options(self) -> dict[str, str]:
        return {"bucket": str(self.buckets), "file.format": "parquet",
                "sequence.field": "ts", "write.native.enabled": "true",
                "commit.native.enabled": "true", "read.native.enabled": "true"}

    def _open(self) -> Any:
        from pypaimon import CatalogFactory

        catalog = CatalogFactory.create({"warehouse": self.path})
        return catalog.get_table("bench.t")

    def load(self, data: pa.Table) -> None:
        from pypaimon import CatalogFactory, Schema

        catalog = CatalogFactory.create({"warehouse": self.path})
        catalog.create_database("bench", True)
        schema = Schema.from_pyarrow_schema(data.schema, partition_keys=["partition"],
                                            primary_keys=["partition", "key"],
                                            options=self._options())
        catalog.create_table("bench.t", schema, False)
        self.table = catalog.get_table("bench.t")
        self.upsert(data)

    def upsert(self, batch: pa.Table) -> None:
        builder = self.table.new_batch_write_builder()
        write = builder.new_write()
        commit = builder.new_commit()
        try:
            write.write_arrow(batch)
            commit.commit(write.prepare_commit())
        finally:
            write.close()
            commit.close()

    def _read(self, predicate: Callable[[Any], Any] | None = None) -> pa.Table:
        table = self._open()
        builder = table.new_read_builder()
        if predicate is not None:
            builder = builder.with_filter(predicate(builder.new_predicate_builder()))
        splits = builder.new_scan().plan().splits()
        result: pa.Table = builder.new_read().to_arrow(splits)
        return result

    def read_full(self) -> pa.Table:
        return self._read()

    def lookup(self, key: str) -> pa.Table:
        return self._read(lambda p: p.equal("key", key)).filter(pc.field("key") == key)


def _version(module: str, dist: str | None = None) -> str:
    return package_version(module, dist) or "?"


def _missing(module: str, dist: str | None = None) -> str | None:
    try:
        __import__(module)
    except ImportError as exc:
        return (f"{module} is not installed ({exc}); install it with "
                f"`pip install {dist or module}` or `pip install -e '.[bench]'`")
    return None


def make_engine(name: str, buckets: int, initial_load: str) -> Engine:
    if name == "cow":
        return TidelakeEngine(name, "COPY_ON_WRITE", None, buckets, initial_load)
    if name == "mor-avro":
        return TidelakeEngine(name, "MERGE_ON_READ", "avro", buckets, initial_load)
    if name == "mor-parquet":
        return TidelakeEngine(name, "MERGE_ON_READ", "parquet", buckets, initial_load)
    if name == "deltalake":
        return DeltaEngine()
    if name == "lance":
        return LanceEngine()
    if name == "paimon":
        return PaimonEngine(buckets)
    raise ValueError(f"unknown engine {name!r}; expected some of {', '.join(ALL_ENGINES)}")


# -- running ---------------------------------------------------------------------------


@dataclass
class Result:
    engine: str
    description: str
    is_tidelake: bool
    upsert_target: float | None = None
    read_target: float | None = None
    skipped: str | None = None
    error: str | None = None
    load_rate: float | None = None
    load_seconds: float | None = None
    batch_rates: list[float] = field(default_factory=list)
    batch_cpu: list[float] = field(default_factory=list)
    """CPU seconds of the whole process (every thread) during each batch's upsert."""
    read_rate: float | None = None
    read_seconds: float | None = None
    lookup_seconds: float | None = None
    compact_seconds: float | None = None
    compacted_read_rate: float | None = None
    rows: int | None = None
    size: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def upsert_median(self) -> float | None:
        return median(self.batch_rates) if self.batch_rates else None

    @property
    def correct(self) -> bool:
        return self.error is None and self.skipped is None and not self.problems

    def misses(self) -> list[str]:
        out: list[str] = []
        med = self.upsert_median
        if self.upsert_target is not None and (med is None or med < self.upsert_target):
            out.append("upsert")
        if self.read_target is not None and (self.read_rate is None
                                             or self.read_rate < self.read_target):
            out.append("read")
        return out

    def target_text(self) -> str:
        parts = []
        if self.upsert_target is not None:
            parts.append(f"upsert >= {fmt_rate(self.upsert_target)}")
        if self.read_target is not None:
            parts.append(f"read >= {fmt_rate(self.read_target)}")
        return ", ".join(parts) if parts else "-"

    def verdict(self) -> str:
        if not self.is_tidelake or self.skipped is not None:
            return "-"
        if self.error is not None:
            return "error"
        missed = self.misses()
        if self.problems:
            missed.insert(0, "check failed")
        return f"MISS ({', '.join(missed)})" if missed else "pass"


class Profiler:
    """cProfile one phase of the tidelake engines: every call of that phase (all the
    batches, say) and every thread it starts (the engine's write pool) add to one profile
    per engine, printed sorted by cumulative time. Cumulative times of the threads add up,
    so they can exceed the wall time; the calling thread shows its waits on the pool as
    ``acquire``."""

    def __init__(self, phase: str | None, top: int, out_dir: str | None) -> None:
        self.phase = phase
        self.top = top
        self.out_dir = out_dir
        self.profiles: dict[str, list[cProfile.Profile]] = {}

    def run(self, phase: str, engine: Engine, fn: Callable[[], T]) -> T:
        if phase != self.phase or not engine.is_tidelake:
            return fn()
        profiles = self.profiles.setdefault(engine.name, [])

        def start_thread_profile(frame: FrameType, event: str, arg: object) -> None:
            # Runs once in each new thread: hand over to a cProfile of its own.
            sys.setprofile(None)
            thread_profile = cProfile.Profile()
            profiles.append(thread_profile)
            thread_profile.enable()

        main = cProfile.Profile()
        profiles.append(main)
        threading.setprofile(start_thread_profile)
        main.enable()
        try:
            return fn()
        finally:
            main.disable()
            threading.setprofile(None)

    def report(self, engine: Engine) -> None:
        profiles = self.profiles.pop(engine.name, None)
        if not profiles:
            return
        buf = io.StringIO()
        stats = pstats.Stats(profiles[0], stream=buf)
        for extra in profiles[1:]:
            stats.add(extra)
        stats.sort_stats("cumulative").print_stats(self.top)
        log(f"--- profile of {engine.name} {self.phase}: all calls, {len(profiles)} "
            "thread profiles (sorted by cumulative time) ---")
        log(buf.getvalue())
        if self.out_dir:
            target = os.path.join(self.out_dir, f"{engine.name}-{self.phase}.prof")
            stats.dump_stats(target)
            log(f"profile written to {target}")


@dataclass
class Run:
    """One engine's way through the phases of a run: its result so far and whether it is
    still going (an engine that failed skips its later phases)."""

    engine: Engine
    folder: str
    result: Result
    alive: bool = True

    def fail(self, exc: BaseException) -> None:
        self.result.error = f"{type(exc).__name__}: {exc}"
        self.alive = False
        log(f"[{self.engine.name}] ERROR: {self.result.error}")
        traceback.print_exc(file=sys.stderr)


def start_engine(engine: Engine, workload: Workload, folder: str, profiler: Profiler) -> Run:
    """Create the engine's table and load the initial rows."""
    res = Result(engine.name, engine.description, engine.is_tidelake,
                 engine.upsert_target, engine.read_target)
    run = Run(engine, folder, res)
    reason = engine.unavailable()
    if reason is not None:
        res.skipped = reason
        run.alive = False
        log(f"[{engine.name}] skipped: {reason}")
        return run
    try:
        log(f"[{engine.name}] {engine.description}")
        engine.create(folder)
        with Stopwatch() as sw:
            profiler.run("load", engine, functools.partial(engine.load, workload.initial))
        res.load_seconds = sw.seconds
        res.load_rate = rate(workload.initial.num_rows, sw.seconds)
        log(f"[{engine.name}] initial load {workload.initial.num_rows:,} rows: "
            f"{sw.seconds:.2f} s ({fmt_rate(res.load_rate)} rows/s)")
    except Exception as exc:
        run.fail(exc)
    return run


def upsert_batch(run: Run, number: int, batch: pa.Table, batches: int,
                 profiler: Profiler) -> None:
    """Upsert one batch: its wall time and the process's CPU time (every thread) meanwhile."""
    if not run.alive:
        return
    engine, res = run.engine, run.result
    try:
        cpu = time.process_time()
        with Stopwatch() as sw:
            profiler.run("upsert", engine, functools.partial(engine.upsert, batch))
        res.batch_cpu.append(time.process_time() - cpu)
        res.batch_rates.append(rate(batch.num_rows, sw.seconds))
        log(f"[{engine.name}] upsert batch {number}/{batches}: {sw.seconds:.2f} s, "
            f"{res.batch_cpu[-1]:.2f} s CPU ({fmt_rate(res.batch_rates[-1])} rows/s)")
    except Exception as exc:
        run.fail(exc)


def finish_engine(run: Run, workload: Workload, lookup_keys: Sequence[str],
                  check_keys: Sequence[int], profiler: Profiler) -> None:
    """Read the final table, check it, look keys up, measure its size, compact (MOR)."""
    engine, res = run.engine, run.result
    if run.alive:
        try:
            gc.collect()
            with Stopwatch() as sw:
                table = profiler.run("read", engine, engine.read_full)
            res.read_seconds = sw.seconds
            res.rows = table.num_rows
            res.read_rate = rate(table.num_rows, sw.seconds)
            log(f"[{engine.name}] full read {table.num_rows:,} rows: {sw.seconds:.2f} s "
                f"({fmt_rate(res.read_rate)} rows/s)")
            res.problems.extend(verify(table, workload, check_keys))
            del table
            gc.collect()
            times: list[float] = []
            for key in lookup_keys:
                with Stopwatch() as sw:
                    hit = profiler.run("lookup", engine, functools.partial(engine.lookup, key))
                times.append(sw.seconds)
                if hit.num_rows != 1 or hit.column("key")[0].as_py() != key:
                    res.problems.append(f"lookup of {key} returned {hit.num_rows} rows")
            res.lookup_seconds = median(times)
            log(f"[{engine.name}] point lookup: median {fmt_seconds(res.lookup_seconds)} of "
                f"{len(times)} ({', '.join(fmt_seconds(t) for t in times)})")
            res.size = dir_size(run.folder)
            compact_and_read(engine, workload, check_keys, res)
            for problem in res.problems:
                log(f"[{engine.name}] CHECK FAILED: {problem}")
        except Exception as exc:
            run.fail(exc)
    profiler.report(engine)


def run_engines(engines: Sequence[Engine], workload: Workload, out: str,
                lookup_keys: Sequence[str], check_keys: Sequence[int], profiler: Profiler,
                *, sequential: bool = False) -> list[Result]:
    """Every engine through load, upserts and reads. By default the engines take turns:
    each loads, then each batch is upserted by every engine before the next batch (the
    first engine of a round moves one place each round), so a change of the machine's load
    falls on all of them alike and the per-batch ratios compare like with like; the reads
    follow. ``sequential``: one engine after another, each through every phase."""
    spec = workload.spec
    runs: list[Run] = []

    def upserts(group: Sequence[Run]) -> None:
        for i, batch in enumerate(workload.batches):
            shift = i % len(group)
            for run in [*group[shift:], *group[:shift]]:
                upsert_batch(run, i + 1, batch, spec.batches, profiler)

    if sequential:
        for e in engines:
            run = start_engine(e, workload, os.path.join(out, e.name), profiler)
            upserts([run])
            finish_engine(run, workload, lookup_keys, check_keys, profiler)
            runs.append(run)
            gc.collect()
        return [r.result for r in runs]
    runs = [start_engine(e, workload, os.path.join(out, e.name), profiler) for e in engines]
    upserts(runs)
    for run in runs:
        finish_engine(run, workload, lookup_keys, check_keys, profiler)
        gc.collect()
    return [r.result for r in runs]


def compact_and_read(engine: Engine, workload: Workload, check_keys: Sequence[int],
                     res: Result) -> None:
    """MERGE_ON_READ: compact at the defaults (``Table.compact()``), then read again: the
    snapshot read rate once every log is merged into base files."""
    with Stopwatch() as sw:
        compacted = engine.compact()
    if not compacted:
        return
    res.compact_seconds = sw.seconds
    log(f"[{engine.name}] Table.compact(): {sw.seconds:.2f} s")
    gc.collect()
    with Stopwatch() as sw:
        table = engine.read_full()
    res.compacted_read_rate = rate(table.num_rows, sw.seconds)
    log(f"[{engine.name}] full read after the compaction {table.num_rows:,} rows: "
        f"{sw.seconds:.2f} s ({fmt_rate(res.compacted_read_rate)} rows/s)")
    res.problems.extend(f"after the compaction: {p}" for p in verify(table, workload, check_keys))


# -- report ----------------------------------------------------------------------------

HEADERS = ("engine", "initial load rows/s", "upsert rows/s median", "first batch",
           "last batch", "full read rows/s", "read after compaction", "point lookup", "rows",
           "size", "check", "target", "pass/miss")
RIGHT = (False, True, True, True, True, True, True, True, True, True, False, False, False)


def table_rows(results: Sequence[Result]) -> list[list[str]]:
    rows: list[list[str]] = []
    for r in results:
        if r.skipped is not None:
            rows.append([r.engine, *["-"] * 9, "skipped", r.target_text(), "-"])
            continue
        check = "error" if r.error else ("ok" if not r.problems else "FAIL")
        rows.append([
            r.engine,
            fmt_rate(r.load_rate),
            fmt_rate(r.upsert_median),
            fmt_rate(r.batch_rates[0]) if r.batch_rates else "-",
            fmt_rate(r.batch_rates[-1]) if r.batch_rates else "-",
            fmt_rate(r.read_rate),
            fmt_rate(r.compacted_read_rate),
            fmt_seconds(r.lookup_seconds),
            f"{r.rows:,}" if r.rows is not None else "-",
            fmt_bytes(r.size),
            check,
            r.target_text(),
            r.verdict(),
        ])
    return rows


def notes(results: Sequence[Result], spec: WorkloadSpec, full_size: bool,
          end_load: str) -> list[str]:
    out: list[str] = []
    for r in results:
        if r.skipped is not None:
            out.append(f"{r.engine}: skipped, {r.skipped}")
        elif r.error is not None:
            out.append(f"{r.engine}: failed, {r.error}")
        else:
            out.append(f"{r.engine}: {r.description}")
            if r.batch_rates:
                out.append(f"{r.engine}: upsert rows/s per batch: "
                           + " ".join(fmt_rate(x) for x in r.batch_rates)
                           + "; CPU s per batch (whole process, every thread): "
                           + " ".join(f"{x:.2f}" for x in r.batch_cpu))
            if r.compact_seconds is not None:
                out.append(f"{r.engine}: Table.compact() at the defaults took "
                           f"{fmt_seconds(r.compact_seconds)}; read after compaction = the full "
                           "read again afterwards (size is measured before it)")
            out.extend(f"{r.engine}: check failed: {p}" for p in r.problems)
    out.extend(pair_notes(results))
    out.append(f"expected final rows: {spec.expected_rows:,}; check = row count, no duplicate "
               "keys, sampled keys carry their latest values, lookups find one row")
    out.append(f"load average at the end of the run: {end_load} on "
               f"{os.cpu_count()} logical cores (at the start: see the machine block); "
               "other processes running meanwhile lower every figure")
    if not full_size:
        out.append("not the full workload (1,000,000 + 10 x 100,000): the targets apply to "
                   "the full workload on a 2-core machine, pass/miss here is only indicative")
    return out


def pair_ratios(ours: Result, peer: Result) -> tuple[list[float], list[float]] | None:
    """Per batch, tidelake's upsert rate over the peer's (wall), and the peer's CPU seconds
    over tidelake's; None unless both upserted every batch."""
    if not ours.batch_rates or len(ours.batch_rates) != len(peer.batch_rates):
        return None
    wall = [a / b for a, b in zip(ours.batch_rates, peer.batch_rates, strict=True)]
    cpu = [b / a if a > 0 else float("nan")
           for a, b in zip(ours.batch_cpu, peer.batch_cpu, strict=True)]
    return wall, cpu


def pair_notes(results: Sequence[Result]) -> list[str]:
    """One line per (tidelake engine, peer): the ratios batch by batch and their median.
    Under the default turn-taking the two ran each batch back to back, so the machine's
    load weighs on both alike; the median of these ratios is the figure to quote."""
    out: list[str] = []
    for ours in (r for r in results if r.is_tidelake):
        for peer in (r for r in results if not r.is_tidelake):
            found = pair_ratios(ours, peer)
            if found is None:
                continue
            wall, cpu = found
            out.append(f"{ours.engine} / {peer.engine}: upsert rate ratio per batch "
                       + " ".join(f"{x:.2f}x" for x in wall)
                       + f", median {median(wall):.2f}x; CPU ratio ({peer.engine} CPU s / "
                       f"{ours.engine} CPU s) median {median(cpu):.2f}x")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB on Linux
    out.append(f"peak RSS of the whole process (data generation and every engine): "
               f"{peak:.2f} GiB")
    return out


def render_header(info: dict[str, str], spec: WorkloadSpec) -> str:
    lines = ["Machine"]
    width = max(len(k) for k in info)
    lines.extend(f"  {k.ljust(width)}  {v}" for k, v in info.items())
    lines.append("")
    lines.append(f"Workload: {spec.describe()}")
    return "\n".join(lines)


def render_results(spec: WorkloadSpec, results: Sequence[Result], full_size: bool,
                   end_load: str) -> str:
    lines = [text_table(HEADERS, table_rows(results), RIGHT)]
    lines.append("")
    lines.extend(f"  {n}" for n in notes(results, spec, full_size, end_load))
    return "\n".join(lines)


def render_markdown(info: dict[str, str], spec: WorkloadSpec, results: Sequence[Result],
                    full_size: bool, end_load: str, command: str) -> str:
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## Upsert benchmark",
        "",
        f"`{command}`, run {when} on {machine_line(info)}.",
        "",
        f"Workload: {spec.describe()}.",
        "",
        markdown_table(HEADERS, table_rows(results), RIGHT),
        "",
    ]
    lines.extend(f"- {n}" for n in notes(results, spec, full_size, end_load))
    lines.extend(["", "<details><summary>Machine</summary>", ""])
    lines.extend(f"- {k}: {v}" for k, v in info.items())
    lines.extend(["", "</details>", ""])
    return "\n".join(lines)


# -- CLI -------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Upsert benchmark: tidelake COW / MOR-Avro / MOR-Parquet against "
                    "deltalake and lance, on the same workload in one run.")
    p.add_argument("--rows", type=int, default=None,
                   help="rows in the initial load (default 1,000,000; --quick 100,000)")
    p.add_argument("--batches", type=int, default=None,
                   help="upsert batches (default 10; --quick 3)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="rows per batch, half updates, half new keys "
                        "(default 100,000; --quick 10,000)")
    p.add_argument("--engines", default=",".join(ALL_ENGINES),
                   help=f"comma-separated, in run order (default {','.join(ALL_ENGINES)})")
    p.add_argument("--out", default=None,
                   help="folder for the tables, kept afterwards (default: a temporary folder, "
                        "deleted after the run)")
    p.add_argument("--markdown", default=None, metavar="FILE",
                   help="also write the results as a Markdown section to FILE")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 100,000 rows + 3 batches of 10,000")
    p.add_argument("--seed", type=int, default=42, help="workload seed (default 42)")
    p.add_argument("--buckets", type=int, default=4,
                   help="tidelake bucket index: buckets per partition (default 4)")
    p.add_argument("--initial-load", choices=("bulk_insert", "insert"), default="bulk_insert",
                   help="tidelake operation for the initial load (default bulk_insert)")
    p.add_argument("--sequential", action="store_true",
                   help="one engine after another through every phase, instead of taking "
                        "turns batch by batch (the default)")
    p.add_argument("--profile", choices=("load", "upsert", "read", "lookup"), default=None,
                   help="cProfile this phase of the tidelake engines and print the top "
                        "functions by cumulative time to stderr")
    p.add_argument("--profile-top", type=int, default=30, help="functions to print (30)")
    p.add_argument("--profile-dir", default=None,
                   help="also dump the .prof files here (for snakeviz / pstats)")
    args = p.parse_args(argv)
    if args.quick:
        defaults = {"rows": 100_000, "batches": 3, "batch_size": 10_000}
    else:
        defaults = {"rows": 1_000_000, "batches": 10, "batch_size": 100_000}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    names = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in names if e not in ALL_ENGINES]
    if unknown or not names:
        p.error(f"--engines: unknown {', '.join(unknown) or '(none given)'}; "
                f"choose from {', '.join(ALL_ENGINES)}")
    if len(set(names)) != len(names):
        p.error("--engines: an engine is named twice")
    args.engine_names = names
    if args.rows <= 0 or args.batches < 0 or args.batch_size <= 1:
        p.error("--rows and --batch-size must be positive (batch size at least 2)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    spec = WorkloadSpec(rows=args.rows, batches=args.batches, batch_size=args.batch_size,
                        seed=args.seed)
    full_size = (spec.rows, spec.batches, spec.batch_size) == (1_000_000, 10, 100_000)
    engines = [make_engine(n, args.buckets, args.initial_load) for n in args.engine_names]

    temp = args.out is None
    out = tempfile.mkdtemp(prefix="tidelake-bench-") if temp else os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    for e in engines:
        folder = os.path.join(out, e.name)
        if os.path.exists(folder) and os.listdir(folder):
            print(f"{folder} exists and is not empty: remove it or choose another --out",
                  file=sys.stderr)
            return 2

    info = machine_info(out)
    print(render_header(info, spec), flush=True)

    try:
        with Stopwatch() as sw:
            workload = generate_workload(spec)
        log(f"generated the workload in {sw.seconds:.2f} s")
        check_keys = sample_keys(workload)
        rng = np.random.default_rng(spec.seed + 1)
        lookup_keys = [key_string(int(k)) for k in
                       rng.choice(check_keys, min(LOOKUPS, len(check_keys)), replace=False)]
        profiler = Profiler(args.profile, args.profile_top, args.profile_dir)
        if args.profile_dir:
            os.makedirs(args.profile_dir, exist_ok=True)
        results = run_engines(engines, workload, out, lookup_keys, check_keys, profiler,
                              sequential=args.sequential)
    finally:
        if temp:
            shutil.rmtree(out, ignore_errors=True)

    print()
    end_load = load_average()
    print(render_results(spec, results, full_size, end_load), flush=True)
    if args.markdown:
        command = "python bench/upsert.py " + " ".join(
            shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
        Path(args.markdown).write_text(
            render_markdown(info, spec, results, full_size, end_load, command.strip()))
        log(f"Markdown written to {args.markdown}")
    failed = [r for r in results if r.error is not None or r.problems]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
