"""The Kafka → MOR path's parts alone, in CPU seconds per million records (issue 36).

    python bench/ingest_floor.py                 # 200,000 records, best of 3 per part

On the records of ``bench/ingest.py`` (same workload, same JSON), in this process: each part
of what the streaming job's Python workers do to a record, timed with ``time.process_time``
(every thread of this process; pyarrow's pools included), best of ``--repeat``. The parts that
are pyarrow's own work on the same data — its JSON reader, its Parquet writer, its IPC
streams — give the floor that no code of ours can go below with these libraries; the
whole-job figures (JVM, Kafka fetch, scheduling) come from ``bench/ingest.py``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from common import REPO_ROOT, load_average, log
from ingest_parts.throughput import job_config
from ingest_parts.workload import build_stream

if sys.path[0] != str(REPO_ROOT):
    sys.path.insert(0, str(REPO_ROOT))


def _best(repeat: int, run: Callable[[], Any]) -> float:
    """The least CPU seconds of ``repeat`` calls of ``run``."""
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best


def kafka_batches(records: int, seed: int, partitions: int) -> list[pa.RecordBatch]:
    """The bench's records as the source's rows, one batch per Kafka partition."""
    from ingest.kafka_schema import KAFKA_ROW_SCHEMA

    stream = build_stream(records, seed, partitions)
    out = []
    for p in range(partitions):
        rows = np.flatnonzero(stream.partitions == p)
        n = len(rows)
        out.append(pa.record_batch([
            pa.array([stream.keys[i] for i in rows], pa.binary()),
            pa.array([stream.values[i] for i in rows], pa.binary()),
            pa.array(["bench"] * n, pa.string()),
            pa.array(np.full(n, p, np.int32)),
            pa.array(np.arange(n, dtype=np.int64)),
            pa.array(np.full(n, 1_700_000_000_000_000, np.int64), pa.timestamp("us", tz="UTC")),
        ], schema=KAFKA_ROW_SCHEMA))
    return out


def write_and_commit(sink: Any, packs: Sequence[pa.Table], records: int,
                     commits: list[float]) -> None:
    """One micro-batch's write tasks on ``packs`` (the read tasks' output), in this process as
    ``bench/ingest.py``'s job runs them (4 tasks, file groups by their bucket), then its
    commit: :func:`ingest.spark_write.write_task_rows` and :meth:`InstantPlan.finish` (its CPU
    seconds appended to ``commits``)."""
    import pyarrow.compute as pc

    from ingest.resolve import POLICY
    from ingest.rows import BUCKET, VERSIONS
    from ingest.sink_table import materialize
    from ingest.spark_write import WriteResult, WriteSpec, start_instant, write_task_rows

    if not sink.table.exists:
        materialize(sink.table, sink.storage_options)
    plan = start_instant(sink.table, sink.data_schema)
    task = plan.write.write_task(plan.data_schema, columns=VERSIONS,
                                 event_time=sink.spec.event_time, policy=POLICY)
    spec = WriteSpec(task)
    whole = pa.concat_tables(packs)
    tasks = 4
    results = [write_task_rows(spec, plan.view, whole.filter(
        pc.equal(pc.bit_wise_and(whole.column(BUCKET), tasks - 1), t)), (t, 1, 0))
        for t in range(tasks)]
    written = WriteResult.merge(results)
    if written.records != records:
        raise RuntimeError(f"wrote {written.records} of {records} records")
    started = time.process_time()
    plan.finish(written.stats, written.tasks, {})
    commits.append(time.process_time() - started)


def spark_transfer(packs: Sequence[pa.Table], config: Any, folder: Path, repeat: int
                   ) -> list[tuple[str, float]]:
    """CPU seconds of Spark's own part of a micro-batch on ``packs`` (best of ``repeat``):
    each of 4 read tasks hands its packs to the JVM (a Python ``mapInArrow`` reading them from
    an IPC file), the JVM shuffles them by file group as the job does (repartition by
    partition, bucket, spread) and hands them to 4 ``mapInArrow`` tasks that only count their
    bytes: the job's two stages with nothing of ours in them. Metered by kind of process."""
    from jobs.ingest_job import build_spark

    spark = build_spark(config)
    out: list[tuple[str, float]] = []
    for name, tables in (("", packs), (" (packs lz4-compressed)", [compressed(t) for t in packs])):
        for kind, seconds in _transfer(spark, tables, folder, repeat).items():
            if seconds >= 0.005:
                out.append((f"Spark's transfer of the packs alone{name}: {kind}", seconds))
    spark.stop()
    return out


def compressed(packs: pa.Table) -> pa.Table:
    """``packs`` with each pack's Arrow IPC stream written again with lz4 buffers."""
    from ingest.rows import ROWS, unpack_blobs

    options = pa.ipc.IpcWriteOptions(compression="lz4")
    blobs = []
    for blob in packs.column(ROWS).to_pylist():
        rows = unpack_blobs([blob])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema, options=options) as writer:
            writer.write_table(rows)
        blobs.append(sink.getvalue().to_pybytes())
    return packs.set_column(packs.schema.get_field_index(ROWS), ROWS, pa.array(blobs, pa.binary()))


def _transfer(spark: Any, packs: Sequence[pa.Table], folder: Path, repeat: int
              ) -> dict[str, float]:
    from ingest_parts.metering import CpuMeter

    from ingest.ddl import spark_schema
    from ingest.spark_write import shuffle_keys

    files = []
    for i, t in enumerate(packs):
        path = folder / f"packs-{i}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, t.schema) as writer:
            writer.write_table(t)
        files.append(str(path))
    schema = packs[0].schema

    def read(batches: Any) -> Any:
        for batch in batches:
            for i in batch.column(0).to_pylist():
                with pa.memory_map(files[i]) as source:
                    yield from pa.ipc.open_file(source).read_all().to_batches()

    def consume(batches: Any) -> Any:
        total = sum(b.nbytes for b in batches)
        yield pa.record_batch([pa.array([total], pa.int64())], names=["bytes"])

    ids = spark.range(0, len(files), 1, len(files))
    frame = ids.mapInArrow(read, spark_schema(schema))
    shuffled = frame.repartition(4, *shuffle_keys(frame.columns))
    query = shuffled.mapInArrow(consume, "bytes BIGINT")
    query.collect()  # warm-up: workers started, classes loaded
    kinds: dict[str, float] = {}
    best = float("inf")
    for _ in range(max(repeat, 3)):
        with CpuMeter() as meter:
            query.collect()
        got = meter.by_kind()
        spent = sum(got.values())
        if spent < best:
            best, kinds = spent, got
    return kinds


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--partitions", type=int, default=4, help="Kafka partitions (4)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--spark", action="store_true",
                   help="also Spark's own part: the packs through repartition + mapInArrow in "
                        "a local[2] session, JVM and Python worker CPU metered")
    args = p.parse_args(argv)

    from engine.schema import PARTITION_PATH, RECORD_KEY
    from ingest.prepare import prepare_batch
    from ingest.rows import BUCKET, pack_rows, unpack_rows
    from jobs.ingest_job import build_decoder, build_sink

    batches = kafka_batches(args.records, args.seed, args.partitions)
    n = sum(b.num_rows for b in batches)
    tmp = tempfile.mkdtemp(prefix="tidelake-ingest-floor-")
    if True:
        config = job_config(bootstrap="127.0.0.1:9", topic="bench", folder=Path(tmp),
                            index="BUCKET", max_offsets=n, buckets=4, log_format="parquet",
                            available_now=True, interval="1 second", shuffle=4)
        sink = build_sink(config, build_decoder(config))
        spec = sink.spec
    log(f"{n:,} records of {sum(b.column(1).nbytes for b in batches) / n:.0f} JSON bytes each "
        f"in {len(batches)} Kafka partitions; load average {load_average()}")
    per_million = 1e6 / n
    figures: list[tuple[str, float]] = []

    def measure(label: str, run: Callable[[], Any]) -> None:
        seconds = _best(args.repeat, run) * per_million
        figures.append((label, seconds))
        log(f"  {label}: {seconds:.2f} CPU s per million records")

    joined = [b"\n".join(b.column(1).to_pylist()) for b in batches]
    schema = pa.schema([f.with_nullable(True) for f in spec.decoder.schema])

    def json_alone() -> None:
        for data in joined:
            pa_json.read_json(pa.BufferReader(data),
                              read_options=pa_json.ReadOptions(block_size=len(data) + 1,
                                                               use_threads=False),
                              parse_options=pa_json.ParseOptions(explicit_schema=schema))

    measure("pyarrow.json.read_json alone (one thread, explicit schema)", json_alone)
    prepared: list[pa.Table] = []

    def prepare() -> None:
        prepared[:] = [prepare_batch(b, spec) for b in batches]

    measure("prepare_batch (JSON decode + checks, keys, partition paths, buckets)", prepare)
    packs: list[pa.Table] = []

    def pack() -> None:
        packs[:] = [pack_rows(t) for t in prepared]

    measure("pack_rows (per file group, Arrow IPC streams)", pack)
    whole = pa.concat_tables(packs)
    measure("unpack_rows (every pack read back)", lambda: unpack_rows(whole))
    rows = pa.concat_tables(prepared)
    data_names = [*spec.decoder.schema.names, RECORD_KEY, PARTITION_PATH]
    groups = rows.group_by([PARTITION_PATH, BUCKET], use_threads=False).aggregate(
        [(PARTITION_PATH, "count")])
    keys = list(zip(groups.column(PARTITION_PATH).to_pylist(),
                    groups.column(BUCKET).to_pylist(), strict=True))
    import pyarrow.compute as pc

    parts = [rows.filter(pc.and_(pc.equal(rows.column(PARTITION_PATH), part),
                                 pc.equal(rows.column(BUCKET), bucket))).select(data_names)
             for part, bucket in keys]

    def parquet_alone() -> None:
        for part in parts:
            pq.write_table(part, pa.BufferOutputStream(), compression="snappy",
                           write_statistics=False)

    measure(f"pyarrow Parquet write alone ({len(parts)} file groups, snappy, every row)",
            parquet_alone)

    def ipc_alone() -> None:
        for t in prepared:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, t.schema) as writer:
                writer.write_table(t)
            pa.ipc.open_stream(sink.getvalue()).read_all()

    measure("Arrow IPC write + read of the prepared rows alone", ipc_alone)
    commits: list[float] = []
    measure("write tasks (unpack, count, place, resolve, log blocks, fsync) + commit, ours",
            lambda: write_and_commit(sink, packs, n, commits))
    log(f"  of which the commit (start instant excluded): {min(commits):.2f} CPU s a micro-batch"
        f" ({len(packs[0])} packs a read task, {sum(len(p) for p in packs)} in all)")
    if args.spark:
        for label, seconds in spark_transfer(packs, config, Path(tmp), args.repeat):
            figures.append((label, seconds * per_million))
            log(f"  {label}: {seconds * per_million:.2f} CPU s per million records")
    shutil.rmtree(tmp, ignore_errors=True)
    log("per million records, CPU s: " + "; ".join(f"{label} {s:.2f}" for label, s in figures))


if __name__ == "__main__":
    main()
