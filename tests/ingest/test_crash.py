"""The ingest job killed with SIGKILL at chosen and at random moments, then restarted.

The job runs as a child process (``tests.ingest.job_child``: ``jobs.ingest_job.start`` and
``watch`` with a processing-time trigger) against the session's broker, which stays in this
test process (Tansu keeps its data in memory). A kill takes the whole job down at once: the
driver's Python, its JVM and Spark's Python workers (``ChildJob.kill``).

One run goes through every crash point of ``job_child.CRASH_POINTS``, in the order a batch
reaches them, then through random moments:

* ``before_query``: the job is up (session, table, sink) but its query is not started;
* ``decode``: executor tasks are reading the batch from Kafka and decoding it;
* ``before_error_commit``: the data files and the error rows are written, the error table's
  instant and the data instant are inflight;
* ``after_error_commit``: the error table committed the batch, the data instant is inflight
  with its files written;
* ``before_commit``: executors wrote the data files, the data instant is inflight (between the
  executor writes and the commit);
* ``after_commit``: the commit is published, Spark has not recorded the batch's end (its
  restart replays the batch, which the sink must skip);
* random: a kill at a random moment of a micro-batch: between Spark logging its offsets and
  as long after as the job's micro-batches have taken so far.

Sizes (``tests/soak.py``): with ``TIDELAKE_SOAK=1`` each index is killed at every point and at
four random moments. At the CI size every point is still killed once, by the index whose state
it interrupts, or by one index where what the kill leaves is the same for all
(:data:`CI_POINTS`: GLOBAL_STATE while tagging, around the error table's commit and after the
commit; RECORD_INDEX before the commit), and the two points of GLOBAL_STATE around the error
table's commit, which leave an uncommitted data instant after the state stores' commit, one
per CI run (:data:`ROTATING`, by ``TIDELAKE_ROTATION_SEED``): 4 + 2 job runs; before the query
and while decoding,
:data:`~tests.ingest.job_child.INDEX_FREE_POINTS`, in the BUCKET table's service-kill lineage
of ``test_streaming_services``, so BUCKET runs here at the soak size only); random moments at
the soak size only: each kill costs a restart of the job (a JVM, ~30 s).

The parent arms a point by writing its name to a file the child checks there; the child writes
a signal file on reaching it and waits, and the parent kills it. Right after each kill the table
must equal the oracle of the offsets it recorded (all or nothing of the batch in flight); the
restarted job, once it has caught up, must equal the oracle of everything sent — read by
tidelake and by hudi-rs, with no key twice, the error table holding exactly the malformed
records, and no micro-batch committed twice.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.ingest.job_child import CRASH_POINTS, GLOBAL_STATE_POINTS, INDEX_FREE_POINTS
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
from tests.kafka_broker import kafka_bootstrap, unique_topic  # noqa: F401
from tests.soak import SOAK, rotate, rotation_note, soak

pytestmark = [
    pytest.mark.slow, pytest.mark.spark, pytest.mark.kafka,
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]

SLICE = 1_000  # records sent before each kill: one micro-batch (it reads at most 1,000)
ALL_POINTS = {"BUCKET": (*CRASH_POINTS,), "GLOBAL_STATE": (*CRASH_POINTS, *GLOBAL_STATE_POINTS),
              "RECORD_INDEX": (*CRASH_POINTS,)}
CI_POINTS = {
    # Each point once at the CI size, killed by the index whose state it interrupts; where
    # what a kill leaves does not depend on the index, by one index only (every point for
    # every index at the soak size). The job before its query and the executors decoding
    # (nothing of the index runs yet: INDEX_FREE_POINTS) are killed in the service-kill
    # lineage of test_streaming_services, a BUCKET table of the same shape, before its
    # service points: one job lineage (and its last run) fewer. BUCKET: soak size only.
    "BUCKET": (),
    # GLOBAL_STATE: the state operator's tasks, and the points between the state stores'
    # commit of the batch and the table's: around the error table's commit, and after the
    # data commit (the replayed batch runs its state operator again). Its ``before_commit``
    # leaves what ``after_error_commit`` leaves (the error table committed, the data instant
    # inflight with its files written: nothing is written between the two; a batch without
    # a malformed record, 1% of the sample's, never reaches ``after_error_commit``, and the
    # armed job stops at the next batch that has one), and BUCKET's
    # ``before_commit`` and ``after_commit`` the same as GLOBAL_STATE's on the same bucket
    # layout: soak size only.
    "GLOBAL_STATE": ("tagging", "before_error_commit", "after_error_commit", "after_commit"),
    # RECORD_INDEX keeps its index in the metadata table, committed with the data: killed
    # between the executors' writes and the commit (the restart re-tags from the index).
    "RECORD_INDEX": ("before_commit",),
}
ROTATING = {"GLOBAL_STATE": ("before_error_commit", "after_error_commit")}
"""Points of :data:`CI_POINTS` killed one per CI run (``tests/soak.py``'s :func:`rotate`): both
kill the job between the state stores' commit of the batch and the table's, with the data
instant inflight and its files written; before the error table's commit (its instant inflight
too) or after it (the error table holds the batch). Every CI run kills one of them, successive
runs both; the soak size kills both in every run."""
assert {*INDEX_FREE_POINTS, *(p for points in CI_POINTS.values() for p in points)} == set(
    ALL_POINTS["GLOBAL_STATE"]), "every crash point must be killed at the CI size"
assert all(set(pool) <= set(CI_POINTS[index]) and len(pool) > 1
           for index, pool in ROTATING.items()), "a rotation is among a test's CI points"


def ci_points(index: str) -> tuple[str, ...]:
    """The points ``index`` is killed at in this run: every one of :data:`ALL_POINTS` at the
    soak size; at the CI size :data:`CI_POINTS` with one of each :data:`ROTATING` pool."""
    if SOAK:
        return ALL_POINTS[index]
    pool = ROTATING.get(index, ())
    kept = set(rotate(f"crash-{index}", pool))
    return tuple(p for p in CI_POINTS[index] if p not in pool or p in kept)
# repeats of one kind
# (a random moment is one of the named points or between them: soak size only)
RANDOM_KILLS = {"BUCKET": soak(0, 4), "GLOBAL_STATE": soak(0, 4), "RECORD_INDEX": soak(0, 4)}
CATCH_UP_S = 900.0  # generous: other Spark jobs may share the machine


def wait_caught_up(job: ChildJob, table: Path, stream: KeyedStream) -> None:
    """Wait until the table records the end offsets of everything sent."""
    ends = stream.end_offsets()
    job.wait_for(lambda: committed_offsets(table, stream.topic) == ends, CATCH_UP_S,
                 f"the job catching up to {ends}")


def batches_logged(work: Path) -> int:
    """Micro-batches whose offsets Spark logged in the job's checkpoint (started batches)."""
    offsets = work / "checkpoint" / "offsets"
    return sum(1 for f in offsets.iterdir() if f.name.isdigit()) if offsets.is_dir() else 0


@pytest.mark.parametrize("index", ["BUCKET", "GLOBAL_STATE", "RECORD_INDEX"])
def test_job_sigkilled_at_every_point_and_random_moments_restarts_to_oracle(
        kafka_bootstrap: str, tmp_path: Path, index: str) -> None:  # noqa: F811
    """SIGKILL at each crash point of a micro-batch and at random moments, restart with the
    same checkpoint: after every kill the table holds exactly the batches it committed, and
    after every restart it equals the oracle (tidelake and hudi-rs), with the error table
    holding exactly the malformed records and no batch committed twice. With the GLOBAL_STATE
    index also during tagging (and its later points fall between the state stores' commit
    of the batch and the table's commit)."""
    seed = int(os.environ.get("TIDELAKE_CRASH_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    topic = unique_topic("crash")
    named = [p for p in ALL_POINTS[index] if p in ci_points(index)]
    points = [*named, *["random"] * RANDOM_KILLS[index]]
    if not points:
        assert not SOAK
        pytest.skip(f"soak size only (TIDELAKE_SOAK=1): {index}'s points at the CI size are "
                    "killed in test_streaming_services' service-kill lineage")
    stream = KeyedStream(kafka_bootstrap, topic, SLICE * (len(points) + 1), seed=seed)
    settings = job_settings(tmp_path, kafka_bootstrap, topic, batch=1_000, index=index)
    # Heartbeats keep their default expiry (2 minutes): the restarted job rolls back what
    # its killed predecessor left pending, in the table and the error table, because the
    # heartbeat names a process that provably ended - not because it expired.
    settings.update({"trigger.available_now": False,
                     "trigger.processing_time": "500 milliseconds"})
    job_file = write_job(tmp_path / "job.toml", settings)
    table, errors = tmp_path / "trips", tmp_path / "trips_errors"
    where = f"(TIDELAKE_CRASH_SEED={seed} {rotation_note()}: points {named})"

    jobs: list[ChildJob] = []
    try:
        run_through(points, rng, stream, job_file, tmp_path, jobs, where)
    finally:
        for job in jobs:
            job.kill()  # a failed check leaves no job running
    problems = table_problems(table, errors, stream)
    assert not problems, f"final {where}:\n" + "\n".join(problems)
    for path in (table, errors):
        commits = streaming_commits(path)
        assert len(commits) == len(set(commits)), f"a batch committed twice in {path} {where}"
        assert not pending_instants(path), f"{path} {where}"
    assert committed_offsets(table, topic) == stream.end_offsets()


def run_through(points: list[str], rng: random.Random, stream: KeyedStream, job_file: Path,
                work: Path, jobs: list[ChildJob], where: str) -> None:
    """Kill the job at each of ``points`` and restart it; the last restart ends cleanly."""
    table, errors = work / "trips", work / "trips_errors"
    arm, stop = work / "arm", work / "stop"
    for run, point in enumerate(points):
        if jobs:  # the restart after the previous kill: it catches up, then check
            wait_caught_up(jobs[-1], table, stream)
            problems = table_problems(table, errors, stream)
            assert not problems, f"restart {run}, caught up {where}:\n" + "\n".join(problems)
        if point != "random":
            arm.write_text(point)
        logged = batches_logged(work)
        stream.send(SLICE)
        if not jobs:  # "before_query" is armed before the job starts
            jobs.append(ChildJob(job_file, work, f"run{run}", arm=arm, stop=stop))
        job = jobs[-1]
        if point == "random":
            longest = max((b["seconds"] for j in jobs for b in j.batches()), default=5.0)
            job.wait_for(lambda n=logged: batches_logged(work) > n, CATCH_UP_S, "a new batch")
            time.sleep(rng.uniform(0.0, longest))
        else:
            reached = job.wait_signal(CATCH_UP_S)
            assert reached["point"] == point
        # The restart starts its JVM and session while this job waits at its point, and
        # goes on (the table, the sink, the query) once the kill's checks are done.
        jobs.append(ChildJob(job_file, work, f"run{run + 1}", arm=arm, stop=stop, ahead=True))
        arm.unlink(missing_ok=True)
        job.kill()
        upto = committed_offsets(table, stream.topic)
        problems = table_problems(table, errors, stream, upto)
        assert not problems, (f"killed at {point} (run {run}), table at {upto} {where}:\n"
                              + "\n".join(problems))
        jobs[-1].go()
    stream.send()
    wait_caught_up(jobs[-1], table, stream)
    stop.touch()
    assert jobs[-1].wait() == 0, jobs[-1].tail()
