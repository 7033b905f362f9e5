"""The throughput runs: the job ingests a pre-produced topic; records/s and checks."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    DATA_COLUMNS,
    fmt_rate,
    load_average,
    log,
    verify,
)

from ingest_parts.metering import CpuMeter, SinkTimer
from ingest_parts.workload import SCHEMA_DDL, TARGET_BUCKET, Stream


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
    state_memory: str = ""  # what Spark reports of its state stores' memory
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
               shuffle: int, state_shards: int = 32,
               table_options: Mapping[str, str] | None = None) -> Any:
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
        **{f"table.options.{k}": v for k, v in (table_options or {}).items()},
    })


def epoch_seconds(instant_time: str) -> float:
    from engine.timeline.instant import parse_instant_time

    return parse_instant_time(instant_time).timestamp()


def committed_offsets(table_path: str) -> tuple[dict[int, int], str | None]:
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


def _state_memory(query: Any) -> str:
    """What Spark says its state stores held after the last batch (empty without a stateful
    operator): memory used and RocksDB's own memory figures, summed over the operators."""
    for progress in reversed(query.recentProgress):
        operators = getattr(progress, "stateOperators", None) or []
        if not operators:
            continue
        used = sum(int(getattr(op, "memoryUsedBytes", 0) or 0) for op in operators)
        extra: dict[str, int] = defaultdict(int)
        for op in operators:
            for name, value in (getattr(op, "customMetrics", None) or {}).items():
                if "emory" in name:
                    extra[name] += int(value)
        rest = ", ".join(f"{name} {value / 2**20:.1f} MiB" for name, value in sorted(extra.items()))
        return f"state stores after the last batch: memoryUsed {used / 2**20:.1f} MiB" + (
            f"; {rest}" if rest else "")
    return ""


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
                offsets, completion = committed_offsets(table_path)
                if offsets == expected:
                    return completion
            if not active:
                return None
        if time.monotonic() > next_log:
            next_log += 60
            done = 0
            with contextlib.suppress(Exception):
                done = sum(committed_offsets(table_path)[0].values())
            log(f"  ... {done:,} of {total:,} records committed so far")
        # Coarse: the run's seconds come from the commit's completion time, not from this
        # loop, and each look is a py4j call (isActive) the meter counts as the job's CPU.
        time.sleep(0.5)
    return None


METADATA_MODES: dict[str, dict[str, str]] = {
    "default": {},
    "off": {"hoodie.metadata.enable": "false"},
    "files": {"hoodie.metadata.enable": "true"},
    "stats": {"hoodie.metadata.enable": "true",
              "hoodie.metadata.index.column.stats.enable": "true"},
}
"""``--metadata`` modes: the metadata table as the job keeps it by default, off, its
``files`` partition only, files and column statistics."""


def run_throughput(spark: Any, *, name: str, bootstrap: str, topic: str, folder: Path,
                   index: str, max_offsets: int, stream: Stream, expected: dict[int, int],
                   args: argparse.Namespace, check_keys: Sequence[int],
                   metadata: str = "default") -> RunResult:
    from jobs.ingest_job import start

    result = RunResult(name, index, max_offsets, stream.records, stream.distinct_keys,
                       load_before=load_average())
    config = job_config(bootstrap=bootstrap, topic=topic, folder=folder, index=index,
                        max_offsets=max_offsets, buckets=args.buckets,
                        log_format=args.log_format, available_now=True,
                        interval=args.trigger_interval, shuffle=args.shuffle_partitions,
                        state_shards=args.state_shards,
                        table_options=METADATA_MODES[metadata])
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
                result.seconds = epoch_seconds(completion) - started
                query.awaitTermination(60)
            elif exc is not None:
                result.error = f"the query failed: {str(exc)[:500]}"
            else:  # timed out: the rate so far, from the newest commit
                result.error = f"not every record was committed within {args.timeout:.0f} s"
                with contextlib.suppress(Exception):
                    offsets, last = committed_offsets(table_path)
                    if last is not None:
                        result.partial = sum(offsets.values())
                        result.seconds = epoch_seconds(last) - started
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {str(exc)[:500]}"
        finally:
            if query is not None:
                result.durations, result.batch_seconds = _progress_durations(query)
                result.state_memory = _state_memory(query)
                if query.isActive:
                    query.stop()
    result.batch_records = list(timer.batch_records)
    result.batches = len(result.batch_records)
    result.sink = dict(timer.seconds)
    result.sink_missing = timer.missing
    result.cpu = cpu.describe() + "; at the peak:\n" + cpu.describe_peak()
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
