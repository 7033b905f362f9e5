"""Table services inside the streaming job (``ingest/services.py``).

* The sink schedules compactions after micro-batches and its service thread executes them in
  Spark tasks, then cleans and archives; the table equals the oracle in tidelake and hudi-rs,
  and service commits carry the streaming checkpoint forward.
* A failing service is logged and retried at the next trigger; ingestion goes on.
* Back-pressure: with too many compactions pending, the next micro-batch waits.
* ``tidelake ingest`` with the defaults, 40 micro-batches of upserts into MERGE_ON_READ (100
  with ``TIDELAKE_SOAK=1``; 40 is past the default ``hoodie.keep.max.commits`` of 30):
  compaction, cleaning and archival ran inside the job, the table equals the
  oracle, and the offsets recorded in the table resume the job exactly.
* SIGKILL inside each service, and at random moments (three in the compaction/clean/archive
  test and one in each clustering test with ``TIDELAKE_SOAK=1``); each restart finishes what
  was interrupted. At the CI size one of the two compaction points per run
  (:data:`COMPACTION_POINTS`). The compaction/clean/archive lineage first kills the job
  before its query and while its executors decode (``job_child.INDEX_FREE_POINTS``: the
  crash test's points that no index reaches, killed here at the CI size rather than in a
  BUCKET lineage of their own). After every kill the table equals the oracle of the offsets
  it recorded.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import engine.services.compaction as compaction_module
from engine import Table
from engine.timeline.active import Timeline
from engine.write.write_client import WriteClient
from ingest.checkpoint import STREAMER_CHECKPOINT_KEY, starting_offsets_from_table
from ingest.sink import HudiStreamingSink, SinkConfig
from tests.ingest.helpers import (
    Event,
    EventOracle,
    ParquetStream,
    data_frame,
    decoder,
    hudi_rs_rows,
    kafka_rows,
    random_batches,
    run_stream,
    table_rows,
)
from tests.ingest.job_harness import (
    ChildJob,
    KeyedStream,
    committed_offsets,
    job_settings,
    pending_instants,
    streaming_commits,
    table_problems,
    write_job,
)
from tests.kafka_broker import kafka_bootstrap  # noqa: F401
from tests.soak import rotate, rotation_note, soak
from tests.spark_session import spark  # noqa: F401

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]

FAST_SERVICES = {
    "hoodie.compact.inline.max.delta.commits": "2",
    "hoodie.cleaner.commits.retained": "2",
    "hoodie.keep.min.commits": "4",
    "hoodie.keep.max.commits": "6",
}


def _keyed(events: list[Event]) -> list[Event]:
    """All versions of a key in one Kafka partition, as a keyed producer sends them."""
    return [Event(e.id, e.ts, e.city, e.fare, e.delete, kafka_partition=int(e.id[1:]) % 2)
            for e in events]


def _actions(path: str) -> list[tuple[str, str]]:
    """(action, state) of every instant on the active timeline."""
    return [(e.action, e.state) for e in Table.open(path).timeline()]


def _batches(seed: int) -> Iterator[list[Event]]:
    """Endless keyed micro-batches (a key keeps its partition: the BUCKET index is
    partition-level)."""
    clock = [0]
    for events in random_batches(random.Random(seed), 10_000, 30, moves=False,
                                 tombstones=False, clock=clock):
        yield _keyed(events)


def _run_batches(session: Any, sink: HudiStreamingSink, oracle: EventOracle,
                 offsets: dict[int, int], source: Iterator[list[Event]], count: int,
                 first_batch: int = 0) -> None:
    for n in range(count):
        events = next(source)
        sink.process_batch(data_frame(session, kafka_rows(events, "trips", offsets)),
                           first_batch + n)
        oracle.apply(events)


@pytest.mark.spark
def test_sink_runs_compaction_clean_and_archival_beside_batches(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path = str(tmp_path / "trips")
    sink = HudiStreamingSink(SinkConfig(
        path, decoder=decoder(), record_key="id", precombine="ts",
        partition_by=["city"], num_buckets=2, options=FAST_SERVICES))
    oracle, offsets = EventOracle(), dict[int, int]()
    _run_batches(spark, sink, oracle, offsets, _batches(11), 12)
    assert sink.services.drain(timeout=300), sink.services.state.describe()
    sink.services.stop()
    status = sink.services.state.services
    assert status["compaction"].done >= 2 and status["compaction"].failures == 0
    assert status["clean"].done >= 1 and status["archive"].done >= 1
    table = Table.open(path)
    timeline = Timeline.load(table.storage, table.config)
    # a completed compaction is a "commit" on a merge-on-read table (archived ones too)
    compactions = [e for e in table.timeline(include_archived=True) if e.action == "commit"]
    assert len(compactions) >= 2
    assert not pending_instants(path)
    assert (Path(path) / ".hoodie" / "timeline" / "history" / "_version_").is_file()
    assert len(timeline.completed_data_instants) <= 6
    assert table_rows(path) == oracle.rows
    assert hudi_rs_rows(path) == oracle.rows
    # The newest commit is a service's: it carries the checkpoint, and the job resumes there.
    newest = timeline.completed_data_instants[-1]
    assert STREAMER_CHECKPOINT_KEY in timeline.commit_metadata(newest).extra_metadata
    assert starting_offsets_from_table(path) == {"trips": offsets}


@pytest.mark.spark
def test_failing_compaction_is_logged_retried_and_never_stops_ingestion(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    path = str(tmp_path / "trips")
    sink = HudiStreamingSink(SinkConfig(
        path, decoder=decoder(), record_key="id", precombine="ts",
        partition_by=["city"], num_buckets=2,
        options={**FAST_SERVICES,
                 "tidelake.services.max.pending.compactions": "50"}))
    original = compaction_module.run_compaction
    calls = [0]

    def broken(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        raise OSError("disk full (injected)")

    monkeypatch.setattr(compaction_module, "run_compaction", broken)
    oracle, offsets = EventOracle(), dict[int, int]()
    source = _batches(12)
    _run_batches(spark, sink, oracle, offsets, source, 8)
    deadline = time.monotonic() + 120
    while sink.services.state.services["compaction"].failures < 3 and \
            time.monotonic() < deadline:
        sink.services.after_commit(spark)  # a trigger, as a micro-batch gives
        time.sleep(0.5)
    status = sink.services.state.services["compaction"]
    assert status.failures >= 3 and "disk full" in (status.last_error or "")
    assert "FAILED" in sink.services.state.describe()
    assert table_rows(path) == oracle.rows  # every batch committed meanwhile
    monkeypatch.setattr(compaction_module, "run_compaction", original)
    _run_batches(spark, sink, oracle, offsets, source, 2, first_batch=8)
    assert sink.services.drain(timeout=300), sink.services.state.describe()
    sink.services.stop()
    assert status.done >= 1 and status.failures_in_a_row == 0
    table = Table.open(path)
    assert not table.timeline() or not [e for e in table.timeline()
                                         if e.action == "compaction" and e.state != "completed"]
    assert table_rows(path) == oracle.rows
    assert hudi_rs_rows(path) == oracle.rows


@pytest.mark.spark
def test_too_many_pending_compactions_make_the_next_batch_wait(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    path = str(tmp_path / "trips")
    sink = HudiStreamingSink(SinkConfig(
        path, decoder=decoder(), record_key="id", precombine="ts",
                   partition_by=["city"], num_buckets=2,
                   options={**FAST_SERVICES,
                            "tidelake.services.max.pending.compactions": "1"}))
    original = compaction_module.run_compaction
    gate = threading.Event()

    def slow(*args: Any, **kwargs: Any) -> Any:
        gate.wait(timeout=60)
        return original(*args, **kwargs)

    monkeypatch.setattr(compaction_module, "run_compaction", slow)
    opener = threading.Timer(3.0, gate.set)
    opener.start()
    oracle, offsets = EventOracle(), dict[int, int]()
    started = time.monotonic()
    _run_batches(spark, sink, oracle, offsets, _batches(14), 3)
    opener.join()
    assert sink.services.state.waits >= 1
    assert time.monotonic() - started >= 3.0  # the batch after the plan waited for the gate
    assert sink.services.drain(timeout=300)
    sink.services.stop()
    assert table_rows(path) == oracle.rows


JOB_BATCHES = soak(40, 100)
"""Micro-batches of 100 records of the long default-services run."""
RANDOM_SERVICE_KILLS = soak(0, 3)
"""Kills at random moments after the named service points (repeats of one kind)."""
CLUSTERING_RANDOM_KILLS = soak(0, 1)
"""Random kills of the clustering and resize jobs (soak size only); each costs a job run and
20-40 s of waiting."""
COMPACTION_POINTS = ("compaction_task", "compaction_commit")
"""The compaction/clean/archive kill test kills one of these per CI run (``tests/soak.py``'s
:func:`rotate`, by ``TIDELAKE_ROTATION_SEED``), both at the soak size: each interrupts a
compaction the restarted job must complete from its plan (while its tasks write the base files,
or once all are written and it is not committed). The clustering kill tests reach the same two
stages of a replacecommit (tasks on the GLOBAL_STATE table, commit on the consistent-hashing
one) in every run."""
GLOBAL_STATE_CLUSTERING_POINTS = soak(["clustering_task"], ["clustering_task",
                                                            "clustering_commit"])
RESIZE_POINTS = soak(["clustering_commit"], ["clustering_task", "clustering_commit"])
"""The clustering points each clustering kill test reaches. A clustering and a resize run the
same code up to their commit: the executor tasks write the new groups, and a restart rolls
back the inflight replacecommit and executes its plan again. At the CI size each point is
killed once (2 job runs per test instead of 3): inside the tasks on the GLOBAL_STATE table
(what it proves of that index, following the keys the re-executed clustering moved, holds for
either point), before the commit on the consistent-hashing table (the resize's commit is
where its new ring is written). Both points for both tests at the soak size."""


@pytest.mark.slow
def test_ingest_job_many_micro_batches_with_default_services(
        kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    """``tidelake ingest`` with the defaults on MERGE_ON_READ: ``JOB_BATCHES`` micro-batches
    of upserts; compaction, cleaning and archival run inside the job; the table equals the
    oracle; the table's offsets are the topic's end."""
    stream = KeyedStream(kafka_bootstrap, f"svc-{time.time_ns()}", JOB_BATCHES * 100, seed=31)
    stream.send()
    work = tmp_path
    settings = job_settings(work, kafka_bootstrap, stream.topic, batch=100)
    job = ChildJob(write_job(work / "job.toml", settings), work, "services")
    try:
        assert job.wait(timeout=1800) == 0, job.tail()
    finally:
        job.kill()
    table = str(work / "trips")
    assert len(job.batches()) >= JOB_BATCHES
    problems = table_problems(table, work / "trips_errors", stream)
    assert not problems, problems
    actions = [(e.action, e.state) for e in Table.open(table).timeline(include_archived=True)]
    assert ("commit", "completed") in actions, actions  # compactions
    assert ("clean", "completed") in actions, actions
    assert (Path(table) / ".hoodie" / "timeline" / "history" / "_version_").is_file()
    active = [(e.action, e.state) for e in Table.open(table).timeline()]
    assert len([a for a in active if a[1] == "completed" and a[0] in (
        "commit", "deltacommit", "replacecommit")]) <= 30, active
    assert starting_offsets_from_table(table) == {stream.topic: stream.end_offsets()}


SERVICE_JOB_OPTIONS = {
    "table.options.hoodie.compact.inline.max.delta.commits": "2",
    "table.options.hoodie.cleaner.commits.retained": "2",
    "table.options.hoodie.keep.min.commits": "4",
    "table.options.hoodie.keep.max.commits": "6",
    # default heartbeats: the restart re-executes a killed job's compaction at once, since
    # the attempt's heartbeat names a process that provably ended
}


SERVICE_ACTIONS = ("compaction", "clean", "clustering", "replacecommit")


def _kill_at_each_point(bootstrap: str, work: Path, settings: dict[str, Any],
                        points: list[str], seed: int) -> set[str]:
    """Run the job once per point, SIGKILL it there ("random": at a random moment), then run
    it to the end of the topic. After each kill the table equals the oracle of the offsets
    it recorded; at the end each interrupted service completed, the table equals the oracle
    (tidelake and hudi-rs), no batch was committed twice and no write is left pending.
    Returns the points that interrupted a service."""
    rng = random.Random(int(time.time()) % 10_000)
    stream = KeyedStream(bootstrap, f"svc-crash-{time.time_ns()}", 6_000, seed=seed)
    settings = {**job_settings(work, bootstrap, stream.topic, batch=100),
                **SERVICE_JOB_OPTIONS, "trigger.available_now": False,
                "trigger.processing_time": "200 milliseconds", **settings}
    job_file = write_job(work / "job.toml", settings)
    # The last run catches up in batches of 1,000: what it proves (each interrupted service
    # completed, the table equals the oracle) does not need its backlog in batches of 100
    # (the compaction/clean/archive test's: ~2,200 records, 22 batches, ~80 s at load 5)
    final_file = write_job(work / "final.toml", {
        **settings, "source.max_offsets_per_trigger": 1_000})
    table, errors = work / "trips", work / "trips_errors"
    arm, stop = work / "arm", work / "stop"
    interrupted: list[tuple[str, str]] = []
    assert points, "at least one kill"
    jobs: list[ChildJob] = []
    try:
        for n, point in enumerate(points):
            stream.send(800)
            arm.write_text(point if point != "random" else "none")
            if jobs:
                jobs[-1].go()  # started ahead (below)
            else:
                jobs.append(ChildJob(job_file, work, f"run{n}", arm=arm))
            job = jobs[-1]
            if point == "random":
                time.sleep(rng.uniform(20, 40))
            else:
                assert job.wait_signal(timeout=600)["point"] == point
                created = (table / ".hoodie" / "hoodie.properties").exists()  # not before_query
                pending = [p for p in (pending_instants(table) if created else [])
                           if p.split()[1] in SERVICE_ACTIONS]
                interrupted += [(point, p.split()[0]) for p in pending]
            # The next run (the final one after the last kill) starts its JVM and session
            # while this one waits at its point, and goes on once the kill's checks are done.
            if n + 1 < len(points):
                jobs.append(ChildJob(job_file, work, f"run{n + 1}", arm=arm, ahead=True))
            else:
                jobs.append(ChildJob(final_file, work, "final", stop=stop, ahead=True))
            job.kill()
            upto = committed_offsets(table, stream.topic)
            problems = table_problems(table, errors, stream, upto)
            assert not problems, f"killed at {point} (run {n}), table at {upto}: {problems}"
        arm.write_text("none")
        final = jobs[-1]
        final.go()
        final.wait_for(lambda: starting_offsets_from_table(str(table)) == {
            stream.topic: stream.end_offsets()}, 900, "the final run caught up")
        table_obj = Table.open(str(table))
        # the restarted job finishes every interrupted service
        final.wait_for(lambda: not [p for p in pending_instants(table)
                                    if p.split()[0] in {t for _, t in interrupted}],
                       600, f"interrupted services {interrupted} completed")
        stop.touch()
        assert final.wait(timeout=600) == 0, final.tail()
    finally:
        for job in jobs:
            job.kill()  # a failed check leaves no job running
    problems = table_problems(table, errors, stream)
    assert not problems, problems
    done = {e.instant_time for e in table_obj.timeline(include_archived=True)
            if e.state == "completed"}
    assert {t for _, t in interrupted} <= done, interrupted
    for path in (table, errors):
        commits = streaming_commits(path)
        assert len(commits) == len(set(commits)), f"a batch committed twice in {path}"
    # a service planned by the last run may be pending (the next run executes it); a write not
    assert not [p for p in pending_instants(table) if p.split()[1] not in SERVICE_ACTIONS]
    assert not pending_instants(errors)
    return {p for p, _ in interrupted}


@pytest.mark.slow
def test_ingest_job_sigkilled_inside_each_service_restarts_to_oracle(
        kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    """SIGKILL of the job before its query and while its executors decode (the crash
    test's index-free points), while a compaction's tasks run, before its commit, while
    cleaning and while archiving (named points), and at random moments; each restart
    finishes what was interrupted, and the table ends equal to the oracle (tidelake and
    hudi-rs)."""
    from tests.ingest.job_child import INDEX_FREE_POINTS, SERVICE_POINTS

    compaction = rotate("service-kills-compaction", COMPACTION_POINTS)
    points = [p for p in SERVICE_POINTS if not p.startswith("clustering")
              and (p in compaction or p not in COMPACTION_POINTS)]
    stopped = _kill_at_each_point(kafka_bootstrap, tmp_path, {},
                                  [*INDEX_FREE_POINTS, *points,
                                   *["random"] * RANDOM_SERVICE_KILLS], seed=41)
    # each named point stopped a service with its instant pending
    assert {*compaction, "clean"} <= stopped, f"{stopped} ({rotation_note()}: points {points})"


@pytest.mark.slow
def test_global_state_job_sigkilled_inside_clustering_restarts_to_oracle(
        kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    """The GLOBAL_STATE index on a table without the bucket layout, clustered by the job:
    SIGKILL while the clustering's tasks run, and (soak size) before its commit and at a random
    moment; the restarted job re-executes the clustering from its plan, follows the keys it
    moved, and the table equals the oracle."""
    settings = {"index.type": "GLOBAL_STATE", "index.state_shards": 4,
                "table.options.hoodie.index.type": "SIMPLE",
                "table.options.hoodie.clustering.async.enabled": "true",
                "table.options.hoodie.clustering.async.max.commits": "2",
                "table.options.hoodie.clustering.plan.strategy.sort.columns": "fare"}
    stopped = _kill_at_each_point(kafka_bootstrap, tmp_path, settings,
                                  [*GLOBAL_STATE_CLUSTERING_POINTS,
                                   *["random"] * CLUSTERING_RANDOM_KILLS], seed=43)
    assert set(GLOBAL_STATE_CLUSTERING_POINTS) <= stopped
    assert [e for e in Table.open(str(tmp_path / "trips")).timeline(include_archived=True)
            if e.action == "replacecommit" and e.state == "completed"]


@pytest.mark.slow
def test_consistent_hashing_job_sigkilled_inside_a_resize_restarts_to_oracle(
        kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    """``index.bucket_engine = CONSISTENT_HASHING`` with ``[services] clustering``: the job
    resizes its rings beside its micro-batches. SIGKILL before a resize's commit, and (soak
    size) while its tasks run and at a random moment; the restarted job finishes the resize
    from its plan and the table equals the oracle."""
    settings = {"index.bucket_engine": "CONSISTENT_HASHING", "index.num_buckets": 1,
                "services.clustering": True, "services.clustering_commits": 2,
                # small files split: a base file of ~150 rows is ~5 KB now that its bloom
                # filter is sized to it
                "table.options.hoodie.parquet.max.file.size": "2000",
                "table.options.hoodie.bucket.index.max.num.buckets": "8"}
    stopped = _kill_at_each_point(kafka_bootstrap, tmp_path, settings,
                                  [*RESIZE_POINTS,
                                   *["random"] * CLUSTERING_RANDOM_KILLS], seed=44)
    assert set(RESIZE_POINTS) <= stopped
    assert _replacecommits(str(tmp_path / "trips"))


def _replacecommits(path: str) -> list[str]:
    return [e.instant_time for e in Table.open(path).timeline(include_archived=True)
            if e.action == "replacecommit" and e.state == "completed"]


@pytest.mark.spark
@pytest.mark.slow
def test_global_state_index_follows_keys_that_clustering_moved(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """GLOBAL_STATE on a table without the bucket layout, clustered by the job's service
    thread, offline between runs, and once between a batch's tagging and its commit: every
    update, delete and partition move reaches the file group its key lives in now — none is
    lost or stored twice — in tidelake and hudi-rs."""
    path = str(tmp_path / "t")
    Table.create(path, name="t", record_key="id", precombine="ts", partition_by="city",
                 table_type="MERGE_ON_READ")  # the SIMPLE index: clustering applies
    options = {**FAST_SERVICES, "hoodie.clustering.async.enabled": "true",
               "hoodie.clustering.async.max.commits": "2",
               "hoodie.clustering.plan.strategy.sort.columns": "fare"}
    sink = HudiStreamingSink(SinkConfig(
        path, decoder=decoder(), index="GLOBAL_STATE", options=options,
        state_shards=3))
    stream, oracle, clock = ParquetStream(tmp_path, "ev"), EventOracle(), [0]
    source = random_batches(random.Random(17), 1_000, 40, moves=True, tombstones=True,
                            clock=clock)

    def run(batches: int) -> None:
        for _ in range(batches):
            events = next(source)
            stream.add(events)
            oracle.apply(events)
        run_stream(spark, stream, sink, tmp_path / "ck")
        assert sink.services.drain(timeout=300), sink.services.state.describe()
        assert table_rows(path) == oracle.rows
        assert hudi_rs_rows(path) == oracle.rows

    run(6)  # the job's own clusterings, between and beside its micro-batches
    in_job = _replacecommits(path)
    assert in_job, sink.services.state.describe()
    Table.open(path).cluster()  # offline, while the query is stopped: its state is stale
    run(4)

    # A clustering commits after a batch was tagged, before its commit: the batch is
    # refused, and its retry tags again from the new layout.
    original = WriteClient.finish
    clustered: list[str] = []

    def cluster_first(client: Any, *args: Any, **kwargs: Any) -> Any:
        if not clustered:
            clustered.extend(Table.open(path).cluster().completed)
        return original(client, *args, **kwargs)

    retries = sink.totals.retries
    WriteClient.finish = cluster_first  # type: ignore[method-assign]
    try:
        run(2)
    finally:
        WriteClient.finish = original  # type: ignore[method-assign]
    assert clustered and sink.totals.retries > retries
    sink.services.stop()
    assert len(_replacecommits(path)) > len(in_job) + 1
