"""Table services inside the streaming job: what they cost the micro-batches, what they save.

    python bench/streaming_services.py            # 100 micro-batches of 2,000 upserts, twice
    python bench/streaming_services.py --quick    # 30 micro-batches of 500

The same topic — sample trip events, 70% updates of earlier keys (``jobs/sample_events.py``),
keyed, produced before the job starts to the embedded Tansu broker — is ingested twice by the
streaming job (``jobs.ingest_job.start``, ``local[2]``, MERGE_ON_READ, BUCKET index with 2
buckets, ``trigger.available_now``, ``--batch`` records per micro-batch) into a fresh table:

* **off**: ``services.enabled = false`` (no compaction, cleaning or archival);
* **on**: the job's defaults (compaction scheduled every 5 deltacommits and executed by the
  service thread beside ingestion, cleaning with 10 commits retained, archival).

For each run: the micro-batch durations Spark reports (``durationMs.triggerExecution`` of
every batch: median, p90, max), the records/s of the whole run, what the services did, and
the final table: snapshot read rows/s, data files, bytes, active timeline instants. The goal
of the issue: median micro-batch duration with services on at most 1.3x that with them off.
Both tables are checked against the events' expected rows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO_ROOT, dir_size, fmt_bytes, machine_info, machine_line

if str(REPO_ROOT) not in sys.path:  # run from a checkout: make `engine` importable
    sys.path.insert(0, str(REPO_ROOT))


def _config(bootstrap: str, topic: str, folder: Path, batch: int, services: bool) -> Any:
    from jobs.job_config import load
    from jobs.sample_events import SCHEMA_DDL

    return load(None, {
        "source.bootstrap_servers": bootstrap,
        "source.topics": topic,
        "source.max_offsets_per_trigger": batch,
        "decode.schema": SCHEMA_DDL,
        "table.path": str(folder / "trips"),
        "table.name": "trips",
        "table.record_key": "trip_id",
        "table.precombine": "ts",
        "table.partition_by": "city",
        "index.num_buckets": 2,
        "trigger.available_now": True,
        "checkpoint.location": str(folder / "checkpoint"),
        "errors.table_path": str(folder / "errors"),
        "services.enabled": services,
        "spark.conf.spark.sql.shuffle.partitions": "2",
        "spark.conf.spark.sql.streaming.numRecentProgressUpdates": "1000",
    })


def _table_figures(path: Path) -> dict[str, Any]:
    from engine import Table
    from engine.layout.file_group import list_table_files

    table = Table.open(str(path))
    started = time.perf_counter()
    rows = table.read().num_rows
    seconds = time.perf_counter() - started
    files = list_table_files(table.storage)
    groups = {(f.partition_path, f.file_id) for f in table.file_slices()}
    return {"rows": rows, "read_rate": rows / seconds if seconds else 0.0,
            "data_files": len(files.base_files) + len(files.log_files),
            "groups": len(groups),
            "bytes": sum(f.size for f in files.base_files) + sum(f.size for f in files.log_files),
            "active_instants": len(table.timeline()),
            "completed_commits": sum(1 for e in table.timeline() if e.state == "completed"
                                     and e.action in ("commit", "deltacommit", "replacecommit"))}


def run(spark: Any, bootstrap: str, topic: str, folder: Path, batch: int, services: bool,
        expected_rows: int) -> dict[str, Any]:
    from jobs.ingest_job import start, watch

    config = _config(bootstrap, topic, folder, batch, services)
    started = time.perf_counter()
    _, sink, query = start(config, spark)
    watch(query, sink)
    wall = time.perf_counter() - started
    durations = [p["durationMs"]["triggerExecution"] / 1000.0 for p in query.recentProgress
                 if p.get("numInputRows")]
    if services:
        sink.services.drain(timeout=600)  # what was still pending, for the table figures
    described = sink.services.state.describe() if services else "off"
    sink.services.stop()
    figures = _table_figures(folder / "trips")
    if figures["rows"] != expected_rows:
        raise SystemExit(f"the table holds {figures['rows']} rows, expected {expected_rows}")
    durations.sort()
    return {"batches": len(durations), "median": statistics.median(durations),
            "p90": durations[int(0.9 * (len(durations) - 1))], "max": durations[-1],
            "wall": wall, "services": described, "folder_bytes": dir_size(str(folder / "trips")),
            **figures}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--batch", type=int, default=2_000, help="records per micro-batch")
    p.add_argument("--quick", action="store_true", help="30 micro-batches of 500 records")
    p.add_argument("--out", default=None, help="work folder (default: a temporary one)")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.batch = 30, 500
    out = Path(args.out or tempfile.mkdtemp(prefix="tidelake-bench-svc-"))
    info = machine_info(str(out))
    print("machine:", machine_line(info))
    for label, value in info.items():
        print(f"  {label}: {value}")

    from ingest.broker import EmbeddedBroker
    from jobs.ingest_job import build_spark
    from jobs.job_config import load
    from jobs.sample_events import SampleEvents, produce

    count = args.batches * args.batch
    events = SampleEvents(count, update_ratio=0.7, delete_ratio=0.0, malformed_ratio=0.0)
    results: dict[str, dict[str, Any]] = {}
    with EmbeddedBroker() as broker:
        topic = f"bench-services-{os.getpid()}"
        started = time.perf_counter()
        produce(broker.bootstrap_servers, topic, events, partitions=2)
        print(f"produced {count:,} events ({len(events.expected):,} keys) in "
              f"{time.perf_counter() - started:.1f} s")
        spark = build_spark(load(None, {
            "source.bootstrap_servers": broker.bootstrap_servers, "source.topics": topic,
            "table.path": str(out / "unused"), "table.record_key": "trip_id",
            "checkpoint.location": str(out / "unused-chk"), "decode.schema": "x STRING"}))
        try:
            for mode in ("off", "on"):
                folder = out / mode
                shutil.rmtree(folder, ignore_errors=True)
                print(f"services {mode}: ingesting {args.batches} micro-batches of "
                      f"{args.batch:,} records ...", flush=True)
                results[mode] = run(spark, broker.bootstrap_servers, topic, folder, args.batch,
                                    mode == "on", len(events.expected))
        finally:
            spark.stop()
    print()
    print(f"{'':24}{'services off':>16}{'services on':>16}")
    rows = [("micro-batches", "batches", "{:,}"), ("median batch (s)", "median", "{:.2f}"),
            ("p90 batch (s)", "p90", "{:.2f}"), ("max batch (s)", "max", "{:.2f}"),
            ("run wall time (s)", "wall", "{:.1f}"), ("final read (rows/s)", "read_rate",
                                                      "{:,.0f}"),
            ("data files", "data_files", "{:,}"), ("live file groups", "groups", "{:,}"),
            ("data bytes", "bytes", None), ("active instants", "active_instants", "{:,}")]
    for label, key, fmt in rows:
        cells = [fmt_bytes(results[m][key]) if fmt is None else fmt.format(results[m][key])
                 for m in ("off", "on")]
        print(f"{label:24}{cells[0]:>16}{cells[1]:>16}")
    ratio = results["on"]["median"] / results["off"]["median"]
    print(f"\nservices on: {results['on']['services']}")
    print(f"median micro-batch, on / off: {ratio:.2f}x (goal: at most 1.3x) -> "
          f"{'met' if ratio <= 1.3 else 'NOT met'}")
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
