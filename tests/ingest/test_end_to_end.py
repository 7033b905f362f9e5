"""The ingest job end to end: a Kafka-protocol broker, the streaming query, the Hudi table.

Each test produces sample trip events *keyed* (all versions of a key in one partition) to the
session's broker (``tests.kafka_broker``), runs the job of ``jobs.ingest_job`` on the shared
local Spark session with ``trigger.available_now`` (it stops once it has caught up), and judges
the table against an oracle built from exactly what was produced (``tests.ingest.job_harness``),
read back by tidelake and by hudi-rs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from engine import Table
from ingest.kafka_produce import create_topic, produce
from jobs.ingest_job import kafka_options, start, watch
from jobs.job_config import load
from tests.helpers import hudi_rs_read, rows_by_key
from tests.ingest.job_harness import (
    COLUMNS,
    KeyedStream,
    committed_offsets,
    hudi_rs_trips,
    job_settings,
    pending_instants,
    read_rows,
    streaming_commits,
    table_problems,
)
from tests.kafka_broker import kafka_bootstrap, unique_topic  # noqa: F401
from tests.s3 import S3Location
from tests.soak import rotate, rotation_note
from tests.spark_session import spark  # noqa: F401

pytestmark = [
    pytest.mark.slow, pytest.mark.spark, pytest.mark.kafka,
    # pyspark warns on the driver each time a pandas-based plan is built (pandas >= 3);
    # kafka-python imports protocol modules lazily with a deprecated importlib API.
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]


class Run(list[dict[str, Any]]):
    """A run's query progress reports, and the Kafka records its sink counted."""

    records: int = 0


def run_job(spark: Any, settings: dict[str, Any]) -> Run:  # noqa: F811
    """Run the job until it has read everything in the topic; its query's progress reports."""
    _, sink, query = start(load(None, settings), spark)
    job = watch(query, sink)
    run = Run(json.loads(p.json) for p in query.recentProgress)
    run.records = job.records
    assert job.records == sink.totals.records
    return run


def rows_read(progress: Run) -> int:
    """Kafka records the run's micro-batches read (counted by the sink's write tasks: with
    the BUCKET index, Spark's numInputRows counts packed rows)."""
    return progress.records


def first_start_offsets(progress: list[dict[str, Any]], topic: str) -> dict[int, int] | None:
    """Offsets the run's first micro-batch that read records started from (None if Spark's
    progress report leaves them out, as it does for a restarted query's first batch)."""
    start_offsets = next(p for p in progress if p["numInputRows"])["sources"][0]["startOffset"]
    if isinstance(start_offsets, str):
        start_offsets = json.loads(start_offsets)
    if not start_offsets:
        return None
    return {int(k): int(v) for k, v in start_offsets[topic].items()}


# Runtime: 50,000 records for MOR+bucket and COW+global, 10,000 for the two other combinations
# (the same code paths). The GLOBAL_STATE runs use the default 32 key shards and 2 (many keys
# per shard, folds of the shard state).
SAMPLE_SHAPE_PAIRS = (("mor-bucket-50k", "cow-global-50k"),
                      ("cow-bucket-10k", "mor-global-2-shards-10k"))
"""The sample-stream test runs one of these pairs per CI run (``tests/soak.py``'s
:func:`rotate`, by ``TIDELAKE_ROTATION_SEED``), both at the soak size. Each pair has both table
types and both indexes, a 50,000- and a 10,000-record shape in the first, 32 and 2 state shards
in the second; ``test_delete_semantics`` runs all four index and table-type pairs through the
sink in every run."""


@pytest.mark.parametrize(("table_type", "index", "count", "shards"), [
    pytest.param("MERGE_ON_READ", "BUCKET", 50_000, 32, id="mor-bucket-50k"),
    pytest.param("COPY_ON_WRITE", "GLOBAL_STATE", 50_000, 32, id="cow-global-50k"),
    pytest.param("COPY_ON_WRITE", "BUCKET", 10_000, 32, id="cow-bucket-10k"),
    pytest.param("MERGE_ON_READ", "GLOBAL_STATE", 10_000, 2, id="mor-global-2-shards-10k"),
])
def test_job_sample_stream_equals_oracle_in_table_hudi_rs_and_error_table(
        spark: Any, kafka_bootstrap: str, tmp_path: Path,  # noqa: F811
        table_type: str, index: str, count: int, shards: int,
        request: pytest.FixtureRequest) -> None:
    """30% updates, 5% deletes, 1% malformed: the table equals the oracle, hudi-rs reads the
    same, the error table holds exactly the malformed records with their reasons, and the
    table records the topic's end offsets."""
    shape = request.node.callspec.id
    if shape not in [s for pair in rotate("e2e-shapes", SAMPLE_SHAPE_PAIRS) for s in pair]:
        pytest.skip(f"rotated out of this CI run ({rotation_note()}; SAMPLE_SHAPE_PAIRS)")
    topic = unique_topic("e2e")
    stream = KeyedStream(kafka_bootstrap, topic, count, seed=count + len(index))
    stream.send()
    final = {k: tuple(v[c] for c in COLUMNS) for k, v in stream.events.expected.items()}
    assert stream.oracle() == final  # the offset-exact oracle agrees with the generator's
    assert stream.malformed() and len(final) < count * 0.75  # updates and deletes happened

    settings = job_settings(tmp_path, kafka_bootstrap, topic, table_type=table_type,
                            index=index)
    settings["index.state_shards"] = shards
    progress = run_job(spark, settings)

    assert rows_read(progress) == count
    problems = table_problems(tmp_path / "trips", tmp_path / "trips_errors", stream)
    assert not problems, "\n".join(problems)
    assert Table.open(str(tmp_path / "trips")).config.table_type.value == table_type
    assert committed_offsets(tmp_path / "trips", topic) == stream.end_offsets()
    commits = streaming_commits(tmp_path / "trips")
    assert len(commits) == len(set(commits)) == len([p for p in progress if p["numInputRows"]])
    assert not pending_instants(tmp_path / "trips")
    # GLOBAL_STATE tags in the query's state store; BUCKET keeps no state.
    assert (tmp_path / "checkpoint" / "state").is_dir() == (index == "GLOBAL_STATE")


# GLOBAL_STATE with fewer records: its state operator costs milliseconds per key, and a new
# query (lost checkpoint) first seeds its state from every key of the table.
@pytest.mark.parametrize(("index", "step"), [("BUCKET", 3_000), ("GLOBAL_STATE", 1_000)])
def test_job_restart_same_then_lost_checkpoint_reads_each_record_once(
        spark: Any, kafka_bootstrap: str, tmp_path: Path,  # noqa: F811
        index: str, step: int) -> None:
    """Restarted with its checkpoint, the job reads only what is new; restarted without it, it
    resumes from the offsets in the table's last commit. Each time the table equals the oracle
    and no record is read twice or skipped."""
    topic = unique_topic("restart")
    stream = KeyedStream(kafka_bootstrap, topic, 3 * step, seed=5)
    settings = job_settings(tmp_path, kafka_bootstrap, topic, index=index, batch=step * 2 // 3)
    table, errors = tmp_path / "trips", tmp_path / "trips_errors"

    stream.send(step)
    progress = run_job(spark, settings)
    assert rows_read(progress) == step
    assert not (problems := table_problems(table, errors, stream)), "\n".join(problems)
    queries = {q for q, _ in streaming_commits(table)}

    # Same checkpoint: the query goes on where it stopped.
    stream.send(step)
    before = committed_offsets(table, topic)
    progress = run_job(spark, settings)
    assert first_start_offsets(progress, topic) in (before, None)
    assert rows_read(progress) == step
    assert not (problems := table_problems(table, errors, stream)), "\n".join(problems)
    assert {q for q, _ in streaming_commits(table)} == queries  # the same query

    # Checkpoint lost: a new query starts from the offsets the table recorded.
    shutil.rmtree(tmp_path / "checkpoint")
    stream.send(step)
    starting = json.loads(kafka_options(load(None, settings))["startingOffsets"])
    assert starting == {topic: {str(p): o for p, o in committed_offsets(table, topic).items()}}
    progress = run_job(spark, settings)
    assert rows_read(progress) == step  # not the 3 * step a start from "earliest" would read
    assert not (problems := table_problems(table, errors, stream)), "\n".join(problems)
    commits = streaming_commits(table)
    assert len(commits) == len(set(commits))
    assert len({q for q, _ in commits}) == 2  # a second query, its batch ids from 0 again
    assert committed_offsets(table, topic) == stream.end_offsets()


def _trip(key: str, ts: int, city: str, fare: float) -> bytes:
    return json.dumps({"trip_id": key, "ts": ts, "city": city, "fare": fare,
                       "rider": "r"}).encode()


def _placement(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Key → [(partition path, city)] of every stored copy of the key."""
    table = Table.open(str(path))
    data = table.read(columns=["_hoodie_partition_path", "trip_id", "city"]).to_pylist()
    out: dict[str, list[tuple[str, str]]] = {}
    for r in data:
        out.setdefault(r["trip_id"], []).append((r["_hoodie_partition_path"], r["city"]))
    return out


def test_global_index_key_changing_partition_ends_in_exactly_one_partition(
        spark: Any, kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    """GLOBAL_STATE: a key whose city (partition value) changes — within a micro-batch, across
    micro-batches, and after the checkpoint (the state) is lost — is stored once, in its last
    city; a tombstone finds a moved key in its new partition."""
    topic = unique_topic("moves")
    create_topic(kafka_bootstrap, topic, 2)
    settings = job_settings(tmp_path, kafka_bootstrap, topic, index="GLOBAL_STATE")
    cities = ("oslo", "lisbon", "tallinn")
    keys = [f"m{i:02d}" for i in range(12)]
    latest: dict[str, str] = {}
    clock = [1_000]

    def send(moves: list[tuple[str, str]]) -> None:
        records: list[tuple[bytes | None, bytes | None, int | None]] = []
        for key, city in moves:
            clock[0] += 1
            records.append((key.encode(), _trip(key, clock[0], city, float(clock[0])),
                            int(key[1:]) % 2))
            latest[key] = city
        produce(kafka_bootstrap, topic, records)

    def check() -> None:
        placement = _placement(tmp_path / "trips")
        assert {k: [p for p, _ in v] for k, v in placement.items()} == {
            k: [c] for k, c in latest.items()}
        rows, duplicates = read_rows(tmp_path / "trips")
        assert not duplicates
        theirs, count = hudi_rs_trips(tmp_path / "trips")
        assert count == len(latest) and theirs == rows

    # Batch 1: every key inserted, four of them moved again within the same micro-batch.
    send([(k, cities[i % 3]) for i, k in enumerate(keys)]
         + [(k, cities[(i + 1) % 3]) for i, k in enumerate(keys[:4])])
    run_job(spark, settings)
    check()

    # Same query: moves across micro-batches.
    send([(k, cities[(i + 2) % 3]) for i, k in enumerate(keys[2:8])])
    run_job(spark, settings)
    check()

    # New query (checkpoint lost): the state is rebuilt from the table, moves still find the
    # old copy; a tombstone (key only) deletes a key where it lives now.
    shutil.rmtree(tmp_path / "checkpoint")
    send([(k, cities[i % 3]) for i, k in enumerate(keys[5:10])])
    produce(kafka_bootstrap, topic, [(b"m06", None, 0)])
    latest.pop("m06")
    run_job(spark, settings)
    check()


def test_job_to_s3_table_equals_oracle_in_table_hudi_rs_and_error_table(
        spark: Any, kafka_bootstrap: str, tmp_path: Path, s3: S3Location,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    """The job writing an s3:// table and error table (moto on loopback): the store's
    options, credentials included, in [table.storage] (they reach the write tasks inside
    the table's storage; the driver's environment would not), the checkpoint local."""
    topic = unique_topic("e2e-s3")
    stream = KeyedStream(kafka_bootstrap, topic, 3_000, seed=31)
    stream.send()
    options = s3.storage_options
    settings = job_settings(tmp_path, kafka_bootstrap, topic, batch=1_000)
    settings |= {"table.path": s3.uri("trips"), "errors.table_path": s3.uri("trips_errors"),
                 **{f"table.storage.{k}": v for k, v in options.items()}}
    progress = run_job(spark, settings)
    assert rows_read(progress) == 3_000
    data = Table.open(s3.uri("trips"), storage_options=options).read(columns=list(COLUMNS))
    ours = {r["trip_id"]: tuple(r[c] for c in COLUMNS) for r in data.to_pylist()}
    assert data.num_rows == len(ours) and ours == stream.oracle()
    theirs = hudi_rs_read(s3.uri("trips"), storage_options=options)
    assert rows_by_key(theirs, "trip_id", COLUMNS) == stream.oracle()
    errors = Table.open(s3.uri("trips_errors"), storage_options=options).read()
    assert sorted(errors.column("error_id").to_pylist()) == sorted(
        f"{topic}-{s.partition}-{s.offset}" for s in stream.malformed())
    assert list(tmp_path.iterdir()) == [tmp_path / "checkpoint"]  # nothing else local
    for body in s3.server.objects(s3.bucket).values():
        assert options["aws_secret_access_key"].encode() not in body
    assert options["aws_secret_access_key"] not in caplog.text
