"""The latency phase: a steady producer, a processing-time trigger, produce → visible."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    fmt_seconds,
    log,
)

from ingest_parts.metering import SINK_PHASES, CpuMeter, SinkTimer
from ingest_parts.producers import send_warmup, steady_producer
from ingest_parts.throughput import committed_offsets, epoch_seconds, job_config, wait_committed
from ingest_parts.workload import WARMUP_QUERY_BATCHES, WARMUP_QUERY_RECORDS, WARMUP_RECORDS


class TimelinePoller:
    """Lists the table's timeline every ``interval`` s and measures each new commit as it
    completes: the first time it is seen, and the ``ts`` of the records it made visible
    (``read_incremental`` from the previous commit), read at once, while the commit's files
    are still there. (Reading every commit after the run fails: with the table's default
    services the cleaner keeps 10 commits, and a job committing every second removes the
    oldest files within the minute.) Commits completed by ``after`` are not measured."""

    def __init__(self, table_path: str, after: str, interval: float = 0.1) -> None:
        self.table_path = table_path
        self.after = after
        self.interval = interval
        self.seen: dict[str, float] = {}  # completion time → wall time first seen
        self.stamps: dict[str, np.ndarray] = {}  # completion time → ts (s) of its records
        self.unread: dict[str, str] = {}  # completion time → why its read failed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-poller", daemon=True)

    def _run(self) -> None:
        from engine.table import Table

        table = None
        previous = self.after
        while not self._stop.wait(self.interval):
            try:
                table = table or Table.open(self.table_path)
                entries = table.timeline()
            except Exception:
                continue
            stamp = time.time()
            done = sorted(e.completion_time for e in entries
                          if e.state == "completed" and e.completion_time
                          and e.completion_time > previous)
            for completion in done:
                self.seen.setdefault(completion, stamp)
                try:
                    rows = table.read_incremental(previous, completion, columns=["ts"])
                    self.stamps[completion] = rows.column("ts").to_numpy().astype(
                        np.float64) / 1000
                except Exception as exc:  # counted and reported, never silently dropped
                    self.unread[completion] = f"{type(exc).__name__}: {str(exc)[:200]}"
                previous = completion

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
    triggers: str = ""
    stages: str = ""
    """Where a micro-batch's time went: the sink's driver-side steps, mean per batch."""
    spark_stages: str = ""
    """The Spark stages of the phase (the write jobs' insides), by kind."""

    @property
    def achieved(self) -> float | None:
        return self.sent / self.send_seconds if self.send_seconds else None



def warm_up(spark: Any, *, bootstrap: str, folder: Path, args: argparse.Namespace,
            index: str = "BUCKET") -> float:
    """One untimed query of ``index`` (:data:`WARMUP_QUERY_RECORDS` records in
    :data:`WARMUP_QUERY_BATCHES` micro-batches): Python workers, JIT, codegen. The
    GLOBAL_STATE index runs code the bucket index never does (the state operator, its Python
    workers and state server, RocksDB): its runs are warmed up by a query of their own."""
    from ingest.kafka_produce import create_topic
    from jobs.ingest_job import start

    topic = f"bench-warmup-{os.getpid()}-{int(time.time())}"
    create_topic(bootstrap, topic, args.partitions)
    counts = send_warmup(bootstrap, topic, args.partitions, WARMUP_QUERY_RECORDS)
    config = job_config(bootstrap=bootstrap, topic=topic, folder=folder, index=index,
                        max_offsets=WARMUP_QUERY_RECORDS // WARMUP_QUERY_BATCHES,
                        buckets=args.buckets,
                        log_format=args.log_format, available_now=True,
                        interval=args.trigger_interval, shuffle=args.shuffle_partitions,
                        state_shards=args.state_shards)
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
    from ingest.kafka_produce import create_topic
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
    producer = ctx.Process(target=steady_producer, name="bench-producer-steady", args=(
        bootstrap, topic, args.partitions, args.rate, args.latency_seconds, args.seed + 11,
        ready, results))
    query = None
    # The sink's steps are wrapped before the query starts (foreachBatch keeps the method it
    # was given); the warm-up's share is taken off below.
    timer = SinkTimer().__enter__()
    try:
        _, sink, query = start(config, spark)
        warm = send_warmup(bootstrap, topic, args.partitions)
        if wait_committed(query, sink, table_path, warm, args.timeout) is None:
            raise RuntimeError("the warm-up records were not committed")
        warm_completion = committed_offsets(table_path)[1]
        assert warm_completion is not None
        warm_batches = {getattr(p, "batchId", None) for p in query.recentProgress}
        warm_sink = (dict(timer.seconds), dict(timer.calls))
        phase_started_ms = int(time.time() * 1000)
        producer.start()
        if not ready.wait(120):
            raise RuntimeError("the producer process did not start")
        with TimelinePoller(table_path, warm_completion) as poller, CpuMeter() as cpu:
            producer.join(args.latency_seconds * 3 + 120)
            if producer.exitcode != 0:
                raise RuntimeError(f"the producer process failed (exit {producer.exitcode})")
            report = results.get(timeout=10)
            drain_started = time.monotonic()
            expected = {p: warm.get(p, 0) + n for p, n in report["per_partition"].items()}
            last = wait_committed(query, sink, table_path, expected, args.timeout)
            result.drain_seconds = time.monotonic() - drain_started
            if last is not None:
                time.sleep(3 * poller.interval)  # the poller reads the last commit too
        result.cpu = cpu.describe()
        result.triggers = _trigger_summary(query, warm_batches)
        result.stages = _sink_stages(timer, *warm_sink)
        result.spark_stages = _spark_stages(spark, phase_started_ms)
        result.sent, result.send_seconds = report["sent"], report["seconds"]
        result.behind_ticks = report["behind_ticks"]
        if last is None:
            exc = query.exception()
            raise RuntimeError(f"the query failed: {exc}" if exc is not None else
                               f"not every record was committed within {args.timeout:.0f} s")
        query.stop()
        _latencies(poller, result)
        rows = Table.open(table_path).read(columns=["key"]).num_rows
        want = report["distinct"] + WARMUP_RECORDS
        if rows != want:
            result.problems.append(f"row count {rows:,} != distinct keys {want:,}")
        result.check = "ok" if not result.problems else "FAIL"
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {str(exc)[:500]}"
        result.check = "error"
    finally:
        timer.__exit__(None, None, None)
        if query is not None and query.isActive:
            query.stop()
        if producer.is_alive():
            producer.terminate()
            producer.join(10)
    log(f"latency: p50 {fmt_seconds(result.p50)}, p99 {fmt_seconds(result.p99)}, "
        f"check {result.check}" + (f" ({result.error})" if result.error else ""))
    return result


def _trigger_summary(query: Any, before: set[Any]) -> str:
    """Spark's durations of the phase's micro-batches with data (batches not in ``before``):
    planning (``latestOffset``: the source's end look-up), the batch (``addBatch``), the whole
    trigger, and the time between trigger starts."""
    seen, plan, add, whole, starts = set(before), [], [], [], []
    others: dict[str, list[float]] = {}
    for p in query.recentProgress:
        batch = getattr(p, "batchId", None)
        if batch in seen or not int(getattr(p, "numInputRows", 0) or 0):
            continue
        seen.add(batch)
        durations = getattr(p, "durationMs", None) or {}
        plan.append(float(durations.get("latestOffset", 0)) / 1000)
        add.append(float(durations.get("addBatch", 0)) / 1000)
        whole.append(float(durations.get("triggerExecution", 0)) / 1000)
        for key, value in durations.items():
            if key not in ("latestOffset", "addBatch", "triggerExecution"):
                others.setdefault(key, []).append(float(value) / 1000)
        starts.append(datetime.fromisoformat(str(p.timestamp).replace("Z", "+00:00"))
                      .timestamp())
    if not plan:
        return ""
    gaps = np.diff(sorted(starts)) if len(starts) > 1 else np.array([np.nan])

    def spread(values: Any) -> str:
        return f"median {np.median(values):.2f} s, max {np.max(values):.2f} s"

    return (f"{len(plan)} micro-batches with data: planning (Spark's durationMs.latestOffset) "
            f"{spread(plan)}; addBatch {spread(add)}; whole trigger {spread(whole)}; "
            f"between trigger starts {spread(gaps)}; the trigger's other steps (median s): "
            + ", ".join(f"{k} {np.median(v):.2f}" for k, v in sorted(others.items())))


def _spark_stages(spark: Any, since_ms: int) -> str:
    """Spark's stages submitted since ``since_ms`` (epoch ms), from the application's status
    store (kept with the UI off), grouped by call site and side of the shuffle: how many,
    median wall seconds from submission to completion, median task seconds summed over the
    stage's tasks, and CPU seconds in all."""
    try:
        jvm = spark.sparkContext._jvm
        store = spark.sparkContext._jsc.sc().statusStore()
        stages = store.stageList(None, False, False,
                                 spark.sparkContext._gateway.new_array(jvm.double, 0),
                                 jvm.java.util.ArrayList())
    except Exception as exc:  # an instrument: say why it saw nothing
        return f"status store not readable ({type(exc).__name__})"
    groups: dict[str, list[tuple[float, float, float]]] = {}
    for i in range(stages.size()):
        stage = stages.apply(i)
        submitted, completed = stage.submissionTime(), stage.completionTime()
        if not submitted.isDefined() or not completed.isDefined():
            continue
        start = submitted.get().getTime()
        if start < since_ms:
            continue
        side = ("shuffle map" if stage.shuffleWriteBytes() > 0 else "") + \
            ("+" if stage.shuffleWriteBytes() > 0 and stage.shuffleReadBytes() > 0 else "") + \
            ("shuffle reduce" if stage.shuffleReadBytes() > 0 else "")
        site = str(stage.name()).split(" at ")[-1].rsplit("/", 1)[-1]
        label = f"{str(stage.name()).split(' at ')[0]} at {site}" + (f" ({side})" if side else "")
        groups.setdefault(label, []).append(
            ((completed.get().getTime() - start) / 1000, stage.executorRunTime() / 1000,
             stage.executorCpuTime() / 1e9))
    ordered = sorted(groups.items(), key=lambda kv: -sum(w for w, _, _ in kv[1]))
    return "; ".join(
        f"{label}: {len(rows)} stages, median {np.median([w for w, _, _ in rows]):.2f} s wall, "
        f"tasks {np.median([t for _, t, _ in rows]):.2f} s, CPU {sum(c for *_, c in rows):.1f} s"
        for label, rows in ordered)


def _sink_stages(timer: SinkTimer, before: dict[str, float], calls_before: dict[str, int]
                 ) -> str:
    """The sink's driver-side steps after ``before`` (the warm-up's), mean seconds per
    micro-batch (the write jobs hold the Spark stages: Kafka read + prepare, shuffle, write
    handles)."""
    whole_label = SINK_PHASES[-1][2]
    batches = timer.calls.get(whole_label, 0) - calls_before.get(whole_label, 0)
    if batches <= 0:
        return ""

    def mean(label: str) -> float:
        return (timer.seconds.get(label, 0.0) - before.get(label, 0.0)) / batches

    parts = [f"{label} {mean(label):.2f}" for *_, label in SINK_PHASES if label != whole_label]
    return (f"{batches} foreachBatch calls, mean s per call: whole {mean(whole_label):.2f} = "
            + "; ".join(parts) + " + the rest (timeline load, error table, offsets)")


def _latencies(poller: TimelinePoller, result: LatencyResult) -> None:
    """Latency of every record visible in each commit the poller measured."""
    commits = sorted(poller.stamps)
    result.commits = len(commits) + len(poller.unread)
    if poller.unread:
        first = min(poller.unread)
        result.problems.append(f"{len(poller.unread)} commit(s) not readable when seen, e.g. "
                               f"{first}: {poller.unread[first]}")
    lat = [epoch_seconds(c) - poller.stamps[c] for c in commits]
    seen_lat = [poller.seen[c] - poller.stamps[c] for c in commits]
    if not lat:
        result.problems.append("no commit after the warm-up")
        return
    values = np.concatenate(lat)
    result.visible = int(values.size)
    result.p50, result.p99 = (float(x) for x in np.percentile(values, [50, 99]))
    result.maximum = float(values.max())
    seen_values = np.concatenate(seen_lat)
    result.seen_p50, result.seen_p99 = (float(x) for x in np.percentile(seen_values, [50, 99]))
    if values.min() < -0.002:
        result.problems.append(f"a record is visible {-values.min():.3f} s before it was sent")
