"""The report: text and Markdown tables, notes, machine information."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from common import (
    fmt_rate,
    fmt_seconds,
    machine_info,
    machine_line,
    markdown_table,
    package_version,
    text_table,
)

from ingest_parts.latency import LatencyResult
from ingest_parts.metering import SINK_PHASES
from ingest_parts.producers import PRODUCER_SETTINGS, TICK_S, ProduceResult
from ingest_parts.profiling import StageRates, WorkerProfile
from ingest_parts.throughput import RunResult
from ingest_parts.workload import FULL_RECORDS, WARMUP_QUERY_BATCHES, WARMUP_QUERY_RECORDS, Stream

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
        if r.state_memory:
            out.append(f"{r.name}: {r.state_memory}")
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
    out += _measured("single-core stage rates", stages, _stage_notes)
    out += _measured("Python worker profile", worker, _worker_notes)
    return out


class _Measurement(Protocol):
    @property
    def error(self) -> str | None: ...


M = TypeVar("M", bound=_Measurement)


def _measured(label: str, result: M | None, notes: Callable[[M], list[str]]) -> list[str]:
    """The notes of a measurement that may not have run (None: no notes) or may have failed
    (one line, ``<label>: failed, <error>``)."""
    if result is None:
        return []
    if result.error:
        return [f"{label}: failed, {result.error}"]
    return notes(result)


def _stage_notes(stages: StageRates) -> list[str]:
    return [f"single-core stage rates on {stages.records:,} records of partition 0"
            f" (this process): Kafka read (kafka-python consumer → Arrow) "
            f"{fmt_rate(stages.read_rate)}/s, prepare (pyarrow JSON decode + keys "
            f"+ partition paths) {fmt_rate(stages.prepare_rate)}/s"]


def _worker_notes(worker: WorkerProfile) -> list[str]:
    total = worker.total
    shares = "; ".join(f"{k.strip()} {v:.1f} s ({_share(v, total)})"
                       for k, v in worker.stages.items())
    parts = "; ".join(f"{k} {v:.1f} s ({_share(v, total)})"
                      for k, v in worker.categories.items() if v >= 0.05)
    return [f"Python workers, profiled (an extra bucket run with Spark's perf "
            f"profilers on: {fmt_seconds(worker.seconds)} wall, {total:.1f} s "
            f"profiled in Python tasks; the profiler slows Python down): {shares}",
            f"Python workers, own time by kind of code: {parts}"]


def _latency_notes(lat: LatencyResult) -> list[str]:
    return [f"latency: {lat.sent:,} records sent in {lat.send_seconds:.1f} s "
            f"(target rate {lat.rate:,.0f}/s; {lat.behind_ticks} moments >100 ms "
            f"behind schedule) by one producer process (pre-encoded record batches every "
            f"{TICK_S * 1000:.0f} ms, acks=1); value ts = send time; "
            f"visible = completion time of the commit; records superseded "
            f"within a batch never become visible and are not counted",
            f"latency as seen by a poller listing the timeline every 100 ms: p50 "
            f"{fmt_seconds(lat.seen_p50)}, p99 {fmt_seconds(lat.seen_p99)}; "
            f"after the producer stopped, the job caught up in "
            f"{fmt_seconds(lat.drain_seconds)}",
            *([f"latency: {lat.triggers}"] if lat.triggers else []),
            *([f"latency: sink: {lat.stages}"] if lat.stages else []),
            *([f"latency: Spark stages: {lat.spark_stages}"] if lat.spark_stages else []),
            f"latency: {lat.cpu}"]


def run_notes(runs: Sequence[RunResult], produced: ProduceResult | None,
              startup: tuple[float | None, Mapping[str, float]], lat: LatencyResult | None,
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
        warmed = ", ".join(f"{index} {fmt_seconds(seconds)}"
                           for index, seconds in warmup_seconds.items()) or "none"
        out.append(f"not in the figures: Spark session start-up {session_seconds:.1f} s, then "
                   f"an untimed warm-up query per index ({WARMUP_QUERY_RECORDS:,} records in "
                   f"{WARMUP_QUERY_BATCHES} micro-batches each): {warmed}")
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
    out += _measured("latency", lat, _latency_notes)
    if lat is not None:
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
