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

Table lock hold times: every outermost hold of the table lock during each run is recorded
(``engine.timeline.lock.record_holds``) and attributed to the step that took it — a writer's
begin / finish (the data table's and the error table's), schedule / execute start / commit of
compaction and clustering, clean schedule / execute start / commit, archive — printed as a
table of holds, median and max hold, and the longest wait for the lock before it.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import shutil
import statistics
import sys
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import REPO_ROOT, dir_size, fmt_bytes, machine_info, machine_line

if str(REPO_ROOT) not in sys.path:  # run from a checkout: make `engine` importable
    sys.path.insert(0, str(REPO_ROOT))

if TYPE_CHECKING:
    from engine.timeline.lock import LockHold

SERVICES = ("compaction", "clustering", "clean", "archive", "savepoint", "rollback")
WRITER_STEPS = {"WriteClient.begin": "begin", "WriteClient.finish": "finish",
                "WriteClient.abort": "abort"}


@cache
def _lock_lines(module: str, qualname: str) -> tuple[int, ...]:
    """Lines of ``module.qualname`` that take a table lock (``with ....lock:``)."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        if part != "<locals>":
            obj = getattr(obj, part, None)
    if obj is None:
        return ()
    lines, first = inspect.getsourcelines(obj)
    return tuple(first + i for i, text in enumerate(lines)
                 if text.strip().startswith("with ") and ".lock" in text)


def _step(hold: LockHold, error_table: str) -> str:
    """The service or writer step that took the lock, from its callers."""
    suffix = " (error table)" if os.path.realpath(hold.table) == error_table else ""
    started = False  # inside engine.services.attempt: an executor taking its attempt
    for module, name, line, _first in hold.callers:
        if module == "engine.write.write_client" and name in WRITER_STEPS:
            return f"writer {WRITER_STEPS[name]}{suffix}"
        if module == "engine.services.attempt":
            started = True
            continue
        service = module.rsplit(".", 1)[-1] if module.startswith("engine.services.") else ""
        if service not in SERVICES:
            continue
        function = name.rsplit(".", 1)[-1]
        if started:
            return f"{service} execute start"
        if function.startswith("schedule") or function == "run_clean":
            return f"{service} schedule"
        if service in ("archive", "savepoint", "rollback"):
            return service
        sites = _lock_lines(module, name)
        return f"{service} {'commit' if not sites or line >= max(sites) else 'execute start'}"
    module, name, line, _ = hold.callers[0] if hold.callers else ("?", "?", 0, 0)
    return f"{module}.{name}:{line}{suffix}"


def _hold_table(holds: list[LockHold], error_table: str) -> list[tuple[str, int, float, float,
                                                                         float, int]]:
    """(step, holds, median hold, max hold, max wait, timed-out waits) per step."""
    by_step: dict[str, list[LockHold]] = {}
    for hold in holds:
        by_step.setdefault(_step(hold, error_table), []).append(hold)
    rows = []
    for step, found in sorted(by_step.items()):
        held = [h.held for h in found if not h.timed_out] or [0.0]
        rows.append((step, len(found), statistics.median(held), max(held),
                     max(h.waited for h in found), sum(h.timed_out for h in found)))
    return rows


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
    from engine.timeline.lock import record_holds
    from jobs.ingest_job import start, watch

    config = _config(bootstrap, topic, folder, batch, services)
    holds: list[LockHold] = []
    record_holds(holds.append)
    try:
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
    finally:
        record_holds(None)
    figures = _table_figures(folder / "trips")
    if figures["rows"] != expected_rows:
        raise SystemExit(f"the table holds {figures['rows']} rows, expected {expected_rows}")
    durations.sort()
    return {"batches": len(durations), "median": statistics.median(durations),
            "p90": durations[int(0.9 * (len(durations) - 1))], "max": durations[-1],
            "wall": wall, "services": described, "folder_bytes": dir_size(str(folder / "trips")),
            "holds": _hold_table(holds, os.path.realpath(folder / "errors")), **figures}


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
    for mode in ("off", "on"):
        print(f"\ntable lock holds, services {mode}:")
        print(f"  {'step':34}{'holds':>7}{'median hold':>13}{'max hold':>11}{'max wait':>11}"
              f"{'timeouts':>10}")
        for step, n, median, longest, waited, timeouts in results[mode]["holds"]:
            print(f"  {step:34}{n:>7,}{median * 1000:>10.1f} ms{longest * 1000:>8.1f} ms"
                  f"{waited * 1000:>8.1f} ms{timeouts:>10,}")
    ratio = results["on"]["median"] / results["off"]["median"]
    print(f"\nservices on: {results['on']['services']}")
    print(f"median micro-batch, on / off: {ratio:.2f}x (goal: at most 1.3x) -> "
          f"{'met' if ratio <= 1.3 else 'NOT met'}")
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
