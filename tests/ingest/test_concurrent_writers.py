"""Streaming writers beside other writers of the same table.

* The sink under optimistic concurrency (COPY_ON_WRITE + BUCKET): a real second writer
  commits to the batch's file groups while the batch is written; the sink replans and
  retries, bounded, and the table holds both writers' records.
* Non-blocking concurrency (MERGE_ON_READ + BUCKET, the ``tidelake ingest`` default): two
  ``tidelake ingest`` jobs on two topics and a backfill write one table at once; no commit is
  refused, and the table equals the oracle of all three (tidelake and hudi-rs).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import ingest.sink as sink_module
from engine import Table, WriteConflictError
from ingest.sink import HudiStreamingSink, SinkConfig
from tests.ingest.helpers import (
    Event,
    EventOracle,
    data_frame,
    decoder,
    hudi_rs_rows,
    kafka_rows,
    table_rows,
)
from tests.ingest.job_harness import (
    ChildJob,
    KeyedStream,
    committed_offsets,
    hudi_rs_trips,
    job_settings,
    pending_instants,
    read_rows,
    write_job,
)
from tests.kafka_broker import kafka_bootstrap  # noqa: F401
from tests.spark_session import spark  # noqa: F401

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]


@contextlib.contextmanager
def other_writer_commits_during(times: int, commit: Callable[[], None]) -> Iterator[list[int]]:
    """The first ``times`` times the sink's tasks have written a batch's files (before its
    commit), ``commit()`` runs: a real second writer commits to the table right then."""
    original = sink_module.write_rows
    calls = [0]

    def write_rows(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        calls[0] += 1
        if calls[0] <= times:
            commit()
        return result

    sink_module.write_rows = write_rows
    try:
        yield calls
    finally:
        sink_module.write_rows = original


@pytest.mark.spark
def test_sink_conflicting_commit_replanned_and_retried_nothing_lost(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path = str(tmp_path / "t")
    sink = HudiStreamingSink(SinkConfig(
        path, decoder=decoder(), record_key="id", precombine="ts",
        partition_by=["city"], table_type="COPY_ON_WRITE", num_buckets=1))
    oracle, offsets = EventOracle(), dict[int, int]()
    first = [Event("a", 10, "oslo", 1.0), Event("b", 10, "oslo", 2.0)]
    sink.process_batch(data_frame(spark, kafka_rows(first, "ev", offsets)), 0)
    oracle.apply(first)
    other = [Event("b", 50, "oslo", 9.0), Event("c", 50, "oslo", 9.5)]

    def backfill() -> None:  # another process's upsert into the same (only) bucket
        Table.open(path).upsert(pa.table({
            "id": [e.id for e in other], "ts": [e.ts for e in other],
            "city": [e.city for e in other], "fare": [e.fare for e in other]}))
        other[:] = [Event(e.id, e.ts + 1, e.city, e.fare + 1) for e in other]

    second = [Event("a", 20, "oslo", 3.0), Event("b", 20, "oslo", 4.0),
              Event("d", 20, "oslo", 5.0)]
    with other_writer_commits_during(2, backfill) as calls:
        sink.process_batch(data_frame(spark, kafka_rows(second, "ev", offsets)), 1)
    assert calls[0] == 3  # refused twice, written three times
    assert sink.totals.retries == 2
    oracle.apply([Event("b", 50, "oslo", 9.0), Event("c", 50, "oslo", 9.5),
                  Event("b", 51, "oslo", 10.0), Event("c", 51, "oslo", 10.5)])
    oracle.apply(second)
    assert table_rows(path) == oracle.rows
    assert hudi_rs_rows(path) == oracle.rows
    assert pending_instants(path) == []
    assert sum(e.action == "rollback" for e in Table.open(path).timeline()) == 2


@pytest.mark.spark
def test_sink_conflicts_beyond_retries_fail_and_leave_nothing(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path = str(tmp_path / "t")
    sink = HudiStreamingSink(SinkConfig(
        path, decoder=decoder(), record_key="id", precombine="ts",
        partition_by=["city"], table_type="COPY_ON_WRITE", num_buckets=1,
        conflict_retries=1))
    offsets: dict[int, int] = {}
    sink.process_batch(data_frame(spark, kafka_rows([Event("a", 10, "oslo", 1.0)], "ev",
                                                offsets)), 0)
    ts = [100]

    def backfill() -> None:
        ts[0] += 1
        Table.open(path).upsert(pa.table({"id": ["a"], "ts": [ts[0]], "city": ["oslo"],
                                          "fare": [7.0]}))

    with other_writer_commits_during(5, backfill), \
            pytest.raises(WriteConflictError, match="after 1 retries"):
        sink.process_batch(data_frame(spark, kafka_rows([Event("z", 20, "oslo", 3.0)], "ev",
                                                    offsets)), 1)
    assert table_rows(path) == {"a": ("oslo", 102, 7.0)}  # nothing of batch 1
    assert pending_instants(path) == []


@pytest.mark.spark
def test_sink_non_blocking_mor_bucket_concurrent_commit_no_retry(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path = str(tmp_path / "t")
    sink = HudiStreamingSink(SinkConfig(
        path, decoder=decoder(), record_key="id", precombine="ts",
        partition_by=["city"], table_type="MERGE_ON_READ", num_buckets=1))
    offsets: dict[int, int] = {}

    def backfill() -> None:
        Table.open(path).upsert(pa.table({"id": ["a", "b"], "ts": [15, 5],
                                          "city": ["oslo", "oslo"], "fare": [8.0, 8.5]}))

    sink.process_batch(data_frame(spark, kafka_rows([Event("z", 1, "oslo", 0.5)], "ev",
                                                offsets)), 0)
    events = [Event("a", 10, "oslo", 1.0), Event("b", 10, "oslo", 2.0)]
    with other_writer_commits_during(1, backfill) as calls:
        sink.process_batch(data_frame(spark, kafka_rows(events, "ev", offsets)), 1)
    assert calls[0] == 1 and sink.totals.retries == 0
    expected = {"a": ("oslo", 15, 8.0), "b": ("oslo", 10, 2.0), "z": ("oslo", 1, 0.5)}
    assert table_rows(path) == expected
    assert hudi_rs_rows(path) == expected


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.kafka
def test_two_ingest_jobs_and_a_backfill_one_mor_bucket_table_no_commit_refused(
        kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    """``tidelake ingest`` on two topics and a backfill, into one MERGE_ON_READ + BUCKET
    table at once (non-blocking concurrency): every job catches up without a refused
    commit, every backfill commit succeeds, and the table equals the union of the three
    oracles in tidelake and hudi-rs."""
    streams = [KeyedStream(kafka_bootstrap, f"nbcc-{i}-{time.time_ns()}", 3_000, seed=100 + i)
               for i in range(2)]
    table = tmp_path / "trips"
    jobs: list[ChildJob] = []
    stop = tmp_path / "stop"
    try:
        for i, stream in enumerate(streams):
            work = tmp_path / f"job{i}"
            work.mkdir()
            settings = job_settings(work, kafka_bootstrap, stream.topic, batch=500)
            settings.update({
                "table.path": str(table), "trigger.available_now": False,
                "trigger.processing_time": "500 milliseconds",
                "checkpoint.identifier": f"job{i}",
                "errors.table_path": str(work / "errors"),
            })
            jobs.append(ChildJob(write_job(work / "job.toml", settings), work, f"job{i}",
                                 stop=stop))
            stream.send(1_500)
        backfilled: dict[str, tuple[Any, ...]] = {}
        failures: list[BaseException] = []

        def backfill() -> None:
            try:
                while not Path(table, ".hoodie", "hoodie.properties").exists():
                    time.sleep(0.2)
                for n in range(12):
                    keys = [f"bf-{n}-{i}" for i in range(50)]
                    rows = {"trip_id": keys, "ts": [n] * 50,
                            "city": ["backfill"] * 50, "fare": [float(n)] * 50,
                            "rider": ["r"] * 50}
                    Table.open(str(table)).upsert(pa.table(rows))
                    for k in keys:
                        backfilled[k] = (k, n, "backfill", float(n), "r")
                    time.sleep(0.5)
            except BaseException as exc:  # reported by the test thread
                failures.append(exc)

        worker = threading.Thread(target=backfill)
        worker.start()
        for stream in streams:
            stream.send()
        worker.join(timeout=900)
        assert not failures, f"a backfill commit failed: {failures[0]!r}"
        for i, (job, stream) in enumerate(zip(jobs, streams, strict=True)):
            ends = stream.end_offsets()
            job.wait_for(lambda s=stream, e=ends, w=f"job{i}":
                         committed_offsets(table, s.topic, w) == e, 900,
                         f"{stream.topic} caught up")
        stop.touch()
        for job in jobs:
            assert job.wait() == 0, job.tail()
    finally:
        for job in jobs:
            job.kill()
    retried = [b for job in jobs for b in job.batches() if b.get("retries")]
    assert retried == [], "a streaming commit was refused under non-blocking concurrency"
    for job in jobs:
        assert "replanning" not in job.tail(10_000)
    expected = {**backfilled}
    for stream in streams:
        expected.update(stream.oracle())
    ours, duplicates = read_rows(table)
    assert duplicates == []
    assert ours == expected
    theirs, count = hudi_rs_trips(table)
    assert count == len(theirs) and theirs == expected
    assert pending_instants(table) == []

