"""The streaming sink's RECORD_INDEX batch, its executor work run in one process without Spark:
how much of it the write tasks spend, with and without telling the engine the keys the
lookup located in each file group.

    python bench/indexes.py --sizes 1000000 --indexes RECORD_INDEX --batches 1 \\
        --range-rows 0 --out /tmp/ix --keep        # a bulk load: /tmp/ix/loaded-1000000
    python bench/sink_record_index.py /tmp/ix/loaded-1000000
    python bench/sink_record_index.py /tmp/ix/loaded-1000000 --runs 3 --batch 100000

The table is a MERGE_ON_READ bulk load of ``bench/indexes.py`` (key ``key``, ordering ``ts``,
partitions ``p0``..``p3``, the record index built). Each run hard-links it into a fresh copy
and writes one batch (``--batch`` rows: half updates of random existing keys, half new keys,
the same batch every run) through the functions the job's tasks run, in order: prepare
(:func:`ingest.prepare.prepare_batch`), the record-index lookup and tagging
(:func:`ingest.record_index.tag_rows`), the placement of inserts, one write task per file
group (:func:`ingest.spark_write.write_group`, the engine's
:meth:`~engine.write.group_writer.GroupWriter.write`), and the commit. Runs alternate (the
order flips every run) between

* ``located``: the tagged rows say which keys the lookup located in their group (what the job
  does), so a log append of upserts keeps the record_index without reading the slice;
* ``unknown``: the same rows without that column (what the job did before): every append
  merges its keys with its slice — the base file's key and ordering columns for those keys
  and the slice's logs — to find the keys new to the group.

Printed per run: CPU seconds (``time.process_time``) and wall seconds of the tagging, of the
write tasks together and of the commit, and the record_index entries the commit wrote (both
modes must write the same: the keys new to their group). Figures are of one process: on the
job each part is spread over the Spark tasks.

``--spark``: the same batch through the job itself instead
(:meth:`ingest.sink.HudiStreamingSink.process_batch` on a ``local[2]`` session, table
services off), ``--runs`` times, each on a fresh copy: the batch's seconds, its data
instant's and its commit's (:class:`ingest.sink.BatchResult`), and the CPU seconds of the
process tree (driver, JVM, Python workers; from ``/proc``). It runs whatever job the
checkout holds, so the code before a change is measured by running it on that checkout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from common import (
    REPO_ROOT,
    load_average,
    local_spark,
    log,
    machine_info,
    machine_line,
    text_table,
    tree_cpu,
)

if str(REPO_ROOT) not in sys.path:  # run from a checkout: make `engine` and `ingest` importable
    sys.path.insert(0, str(REPO_ROOT))

from indexes import batches, copy_table, make_rows


def kafka_rows(data: pa.Table) -> pa.Table:
    """One Kafka record per row: the key as Kafka key, the row as a JSON value."""
    n = data.num_rows
    values = [json.dumps(row).encode() for row in data.to_pylist()]
    return pa.table({
        "key": pa.array([k.encode() for k in data.column("key").to_pylist()], pa.binary()),
        "value": pa.array(values, pa.binary()),
        "topic": pa.array(["bench"] * n, pa.string()),
        "partition": pa.array(np.zeros(n, np.int32)),
        "offset": pa.array(np.arange(n, dtype=np.int64)),
        "timestamp": pa.array(np.full(n, 1_700_000_000_000_000, np.int64),
                              pa.timestamp("us", tz="UTC")),
    })


def run_batch(path: Path, kafka: pa.Table, schema: pa.Schema, located: bool) -> dict[str, float]:
    """One batch through the sink's task functions; CPU and wall seconds per part."""
    from engine.metadata import record_index as rli
    from engine.write.partitioner import InsertBucket
    from ingest.decode import JsonDecoder
    from ingest.prepare import prepare_batch
    from ingest.record_index import place_inserts, tag_rows
    from ingest.resolve import POLICY
    from ingest.rows import FILE_ID, LOCATED, OP, UPSERT, VERSIONS, group_rows
    from ingest.sink import RECORD_INDEX, HudiStreamingSink, SinkConfig
    from ingest.spark_write import WriteSpec, place_rows, start_instant, write_group

    sink = HudiStreamingSink(SinkConfig(
        str(path), decoder=JsonDecoder(schema), record_key="key", precombine="ts",
        partition_by=["partition"], table_type="MERGE_ON_READ", index=RECORD_INDEX))
    table = sink.table
    out: dict[str, float] = {}
    prepared = prepare_batch(kafka, sink.spec)
    plan = start_instant(table, sink.data_schema)
    cpu, wall = time.process_time(), time.perf_counter()
    tagged, _ = tag_rows(prepared, plan.write.record_index_task(), plan.view)
    inserts = tagged.filter(pc.and_(pc.equal(tagged.column(OP), UPSERT),
                                    pc.is_null(tagged.column(FILE_ID))))
    counts = {p: int(n) for p, n in zip(*pc.value_counts(inserts.column("_hoodie_partition_path"))
                                        .flatten(), strict=True)} if inserts.num_rows else {}
    buckets = plan.write.insert_buckets({str(p): n for p, n in counts.items()})
    plain = {p: [InsertBucket(b.partition_path, b.file_id, b.count, None) for b in found]
             for p, found in buckets.items()}
    placed = place_inserts(tagged, plain)
    if not located:
        placed = placed.drop_columns([LOCATED])
    out["tag_cpu"], out["tag_wall"] = time.process_time() - cpu, time.perf_counter() - wall

    write_task = plan.write.write_task(plan.data_schema, columns=VERSIONS,
                                 event_time=sink.spec.event_time, policy=POLICY)
    write_spec = WriteSpec(write_task, decided=True)
    cpu, wall = time.process_time(), time.perf_counter()
    rows = place_rows(placed, write_task.placement, plan.view)
    ordered, (parts, fids), sizes = group_rows(
        rows, [rows.column("_hoodie_partition_path"), rows.column(FILE_ID)])
    stats, first = [], 0
    for task, (part, fid, size) in enumerate(zip(parts, fids, sizes, strict=True)):
        stat = write_group(write_spec, plan.view, part, fid, ordered.slice(first, size),
                           (task, 0, 0))
        first += size
        if stat is not None:
            stats.append(stat)
    out["write_cpu"], out["write_wall"] = time.process_time() - cpu, time.perf_counter() - wall
    cpu, wall = time.process_time(), time.perf_counter()
    plan.finish(stats, [], {})
    out["commit_cpu"], out["commit_wall"] = time.process_time() - cpu, time.perf_counter() - wall
    out["groups"] = len(stats)
    upserted = sorted(r.key for s in stats if s.metadata is not None
                      for r in s.metadata.records(rli.RECORD_INDEX))
    deleted = sorted(k for s in stats if s.metadata is not None
                     for k in s.metadata.deletes.get(rli.RECORD_INDEX, ()))
    out["index_entries"] = len(upserted) + len(deleted)
    out["index_digest"] = hash((tuple(upserted), tuple(deleted)))
    out["updates"] = sum(s.num_update_writes for s in stats)
    return out


def run_spark(source: Path, work: Path, kafka: pa.Table, schema: pa.Schema,
              runs: int) -> None:
    """``runs`` batches through the job (one per fresh copy of ``source``)."""
    from ingest.decode import JsonDecoder
    from ingest.sink import RECORD_INDEX, HudiStreamingSink, SinkConfig

    spark = local_spark("sink-record-index")
    frame = spark.createDataFrame(kafka).cache()
    frame.count()
    rows = []
    try:
        for run in range(runs):
            path = work / f"spark-{run}"
            copy_table(source, path, keep_record_index=True, index_type="RECORD_INDEX")
            sink = HudiStreamingSink(SinkConfig(
                str(path), decoder=JsonDecoder(schema), record_key="key", precombine="ts",
                partition_by=["partition"], table_type="MERGE_ON_READ", index=RECORD_INDEX,
                services=False))
            cpu = tree_cpu()
            sink.process_batch(frame, 0)
            cpu = tree_cpu() - cpu
            result = sink.last_result
            assert result is not None and result.instant_time and not result.errors
            log(f"spark run {run}: batch {result.seconds:.2f} s, data instant "
                f"{result.write_seconds:.2f} s, commit {result.commit_seconds:.2f} s, "
                f"CPU {cpu:.2f} s")
            rows.append([str(run), f"{result.seconds:.2f}", f"{result.write_seconds:.2f}",
                         f"{result.commit_seconds:.2f}", f"{cpu:.2f}"])
            shutil.rmtree(path)
    finally:
        spark.stop()
    print(text_table(["run", "batch s", "data instant s", "commit s", "CPU s (all processes)"],
                     rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", help="a bulk load of bench/indexes.py (loaded-<size>)")
    parser.add_argument("--batch", type=int, default=100_000, help="rows per batch")
    parser.add_argument("--runs", type=int, default=2, help="runs of each mode, alternating")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--work", help="folder for the copies (default: a temporary one)")
    parser.add_argument("--spark", action="store_true",
                        help="through the job on a local[2] Spark session instead")
    args = parser.parse_args()
    source = Path(args.table)
    size = int(source.name.rsplit("-", 1)[-1])
    print(machine_line(machine_info(str(source))), "| load", load_average())
    rng = np.random.default_rng(args.seed)
    data = make_rows(batches(size, 1, args.batch, args.seed)[0], 2, False, 4, rng)
    kafka = kafka_rows(data)
    work = Path(args.work or tempfile.mkdtemp(prefix="sink-rli-"))
    if args.spark:
        try:
            run_spark(source, work, kafka, data.schema, args.runs)
        finally:
            if not args.work:
                shutil.rmtree(work, ignore_errors=True)
        return
    results: dict[str, list[dict[str, float]]] = {"unknown": [], "located": []}
    try:
        for run in range(args.runs):
            for mode in ("unknown", "located")[::1 if run % 2 == 0 else -1]:
                path = work / f"{mode}-{run}"
                copy_table(source, path, keep_record_index=True, index_type="RECORD_INDEX")
                figures = run_batch(path, kafka, data.schema, located=mode == "located")
                results[mode].append(figures)
                log(f"{mode} run {run}: " + ", ".join(
                    f"{k} {v:.2f}" for k, v in figures.items() if k != "index_digest"))
                shutil.rmtree(path)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    headers = ["mode", "tag CPU s", "write CPU s", "write wall s", "commit CPU s",
               "groups", "record_index entries", "updates"]
    rows = []
    for mode, runs in results.items():
        def med(key: str, runs: list[dict[str, float]] = runs) -> str:
            return f"{statistics.median(r[key] for r in runs):.2f}"
        rows.append([mode, med("tag_cpu"), med("write_cpu"), med("write_wall"),
                     med("commit_cpu"), f"{runs[0]['groups']:.0f}",
                     f"{runs[0]['index_entries']:.0f}", f"{runs[0]['updates']:.0f}"])
    digests = {r["index_digest"] for runs in results.values() for r in runs}
    print(f"{size:,} rows, a batch of {args.batch:,} (half updates), medians of {args.runs} "
          f"runs; record_index keys written alike in every run: {len(digests) == 1}")
    print(text_table(headers, rows))


if __name__ == "__main__":
    main()
