"""Replaying the error table (``tidelake errors replay``, :mod:`ingest.replay`).

The end-to-end test runs the job (real broker, the shared local Spark session,
``trigger.available_now``) with a schema that wrongly declares ``rider`` NOT NULL, so the
records without a rider go to the error table; the schema is then fixed in the job file and
the CLI replays the error table. The table must then equal the oracle of everything produced
(a dict applying each record by its ``ts``), for our reader and hudi-rs, and a second replay
must commit nothing, and the job then goes on (slow: ~90 s at load 8-13 on 2 cores, the two
job runs). The other tests need no Spark: the job's routing of a micro-batch is
played by its prepare step on Kafka-shaped rows in the sink's order (the data instant
begins, the error table commits, the data instant completes: ``replay_harness.route``).
"""

from __future__ import annotations

import os
import signal
import zlib
from pathlib import Path
from typing import Any

import pytest

import ingest.replay as replay_module
from engine import Table
from engine.errors import InvalidOptionError
from engine.timeline.active import Timeline
from ingest.kafka_produce import create_topic, produce
from ingest.replay import REPLAY_ID_KEY, is_replayed, replay_errors
from jobs.cli import main
from jobs.ingest_job import build_decoder, build_sink, start, watch
from jobs.job_config import load
from tests.helpers import hudi_rs_read, rows_by_key
from tests.ingest.job_harness import write_job
from tests.ingest.replay_harness import (
    COLUMNS,
    FIXED,
    WRONG,
    commits,
    events,
    fixed_oracle,
    fixed_sink,
    key,
    route,
    settings,
    table_rows,
    value,
)
from tests.kafka_broker import kafka_bootstrap, unique_topic  # noqa: F401
from tests.s3 import S3Location
from tests.spark_session import spark  # noqa: F401

# --- end to end: the job, a fixed schema, the CLI -------------------------------------------


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
@pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning")
def test_replay_after_schema_fix_table_equals_oracle_and_second_replay_commits_nothing(
        spark: Any, kafka_bootstrap: str, tmp_path: Path,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    """The job with rider NOT NULL routes riderless records to the error table; replayed
    with the schema fixed, the table equals the oracle of every record (our reader and
    hudi-rs), replayed rows are marked, records that still fail keep their new reason, and a
    second replay writes no commit to either table; the job then goes on from its
    checkpoint."""
    topic = unique_topic("replay")
    create_topic(kafka_bootstrap, topic, 2)
    sent = events(seed=3, count=400)
    produce(kafka_bootstrap, topic, [(key(r, i), value(r), zlib.crc32(key(r, i)) % 2)
                                     for i, r in enumerate(sent)])
    wrong = settings(tmp_path, WRONG, bootstrap=kafka_bootstrap, topic=topic)
    _, sink, query = start(load(None, wrong), spark)
    watch(query, sink)
    table, errors = tmp_path / "trips", tmp_path / "trips_errors"

    riderless = [r for r in sent if isinstance(r, dict) and "rider" not in r]
    malformed = [r for r in sent if isinstance(r, bytes)]
    routed = Table.open(str(errors)).read().to_pylist()
    assert len(routed) == len(riderless) + len(malformed)
    assert table_rows(table) != fixed_oracle(sent)  # the wrong schema lost records

    job = write_job(tmp_path / "job.toml", settings(tmp_path, FIXED, bootstrap=kafka_bootstrap,
                                                    topic=topic))
    before = commits(table), commits(errors)
    assert main(["errors", "replay", str(job), "--dry-run"]) == 0
    assert (commits(table), commits(errors)) == before  # a dry run writes nothing
    assert main(["errors", "replay", str(job)]) == 0
    out = capsys.readouterr().out
    fare_text = [r for r in riderless if r.get("fare") == "n/a"]
    replayable = len(riderless) - len(fare_text)
    assert f"replayed {replayable} record(s)" in out

    want = fixed_oracle(sent)
    assert table_rows(table) == want
    assert rows_by_key(hudi_rs_read(table), "trip_id", COLUMNS) == want
    marked = Table.open(str(errors)).read().to_pylist()
    assert len(marked) == len(routed)
    assert sum(is_replayed(r["reason"]) for r in marked) == replayable
    reasons = [r["reason"] for r in marked if not is_replayed(r["reason"])]
    assert sorted(reasons) == sorted(
        ["cannot decode the value: field 'fare': expected DOUBLE, got 'n/a'"] * len(fare_text)
        + [r for r in reasons if r.startswith("cannot decode the value: invalid JSON")])
    assert sum(r.startswith("cannot decode the value: invalid JSON") for r in reasons) \
        == len(malformed)

    after = commits(table), commits(errors)
    assert len(after[0]) == len(before[0]) + 1 and len(after[1]) == len(before[1]) + 1
    assert main(["errors", "replay", str(job)]) == 0
    assert f"already replayed before: {replayable} record(s)" in capsys.readouterr().out
    assert (commits(table), commits(errors)) == after  # nothing new: no commit
    assert table_rows(table) == want

    # The job goes on from its checkpoint with the fixed schema, beside the replay's commit.
    more = events(seed=4, count=60, first=400)
    produce(kafka_bootstrap, topic, [(key(r, i), value(r), zlib.crc32(key(r, i)) % 2)
                                     for i, r in enumerate(more, start=400)])
    _, sink, query = start(load(None, settings(tmp_path, FIXED, bootstrap=kafka_bootstrap,
                                               topic=topic)), spark)
    assert watch(query, sink).records == len(more)
    assert table_rows(table) == fixed_oracle(sent + more)


# --- without Spark: the job's routing played by its prepare step ---------------------------
# (tests/ingest/replay_harness.py: route, in the sink's order)


class Killed(BaseException):
    """Stands for the replay process dying (nothing of the replay catches it)."""


def die(*args: Any) -> str:
    """A replay's marking step that never returns: the process died first."""
    raise Killed


def test_replay_killed_between_data_commit_and_marking_rerun_writes_nothing_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that dies after its data commit, before the error table marks its rows:
    the rerun marks them from the data commit's record list and writes no second commit;
    the table equals the oracle and no key is stored twice."""
    sent = events(seed=8, count=120)
    route(tmp_path, WRONG, sent, 0)
    table = tmp_path / "trips"
    before = commits(table)

    monkeypatch.setattr(replay_module, "_mark", die)
    with pytest.raises(Killed):
        replay_errors(fixed_sink(tmp_path))
    monkeypatch.undo()
    assert len(commits(table)) == len(before) + 1  # the data commit is there
    assert not any(is_replayed(r["reason"])
                   for r in Table.open(str(tmp_path / "trips_errors")).read().to_pylist())

    result = replay_errors(fixed_sink(tmp_path))
    riderless = [r for r in sent if isinstance(r, dict) and "rider" not in r
                 and r.get("fare") != "n/a"]
    assert (result.recovered, result.replayed, result.instant_time) == (len(riderless), 0, None)
    assert len(commits(table)) == len(before) + 1  # no second data commit
    assert table_rows(table) == fixed_oracle(sent)
    again = replay_errors(fixed_sink(tmp_path))
    assert (again.recovered, again.replayed, again.already_replayed) == (0, 0, len(riderless))


KILL_IN_MARKING = """
import os, signal, sys
import ingest.replay as replay
from engine.write.write_client import WriteClient
from jobs.ingest_job import build_decoder, build_sink
from jobs.job_config import load

def killed(errors, updates, replay_id):  # the error table's instant starts, then SIGKILL
    WriteClient(errors.storage, errors.config, errors.write_config).begin()
    os.kill(os.getpid(), signal.SIGKILL)

replay._mark = killed
config = load(sys.argv[1])
replay.replay_errors(build_sink(config, build_decoder(config)))
"""


def test_replay_recovers_marking_after_its_data_commit_was_archived(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay killed before its marking, and the job's later commits archive its data
    commit: the rerun finds its record list in the timeline's history and writes nothing
    again."""
    keep = {"hoodie.keep.min.commits": "2", "hoodie.keep.max.commits": "3",
            "hoodie.cleaner.commits.retained": "1"}
    cow = {"table_type": "COPY_ON_WRITE"}  # a MERGE_ON_READ table keeps uncompacted ones
    sent = events(seed=9, count=40)
    route(tmp_path, WRONG, sent, 0, **cow)
    monkeypatch.setattr(replay_module, "_mark", die)
    with pytest.raises(Killed):
        replay_errors(fixed_sink(tmp_path, **cow))
    monkeypatch.undo()
    replay_commit = commits(tmp_path / "trips")[-1]
    more: list[dict[str, Any] | bytes] = []
    for n in range(5):
        batch = events(seed=10 + n, count=8, first=100 + 10 * n)
        batch = [r for r in batch if isinstance(r, dict) and "rider" in r]
        route(tmp_path, WRONG, batch, 40 + 10 * n, table_options=keep, **cow)
        more += batch
    data = Table.open(str(tmp_path / "trips"), keep)
    data.archive()
    archived = Timeline.load(data.storage, data.config).archived()
    assert replay_commit in {row.requested_time for row in archived}
    result = replay_errors(fixed_sink(tmp_path, **cow))
    assert result.recovered and (result.replayed, result.instant_time) == (0, None)
    assert table_rows(tmp_path / "trips") == fixed_oracle(sent + more)


def test_replay_sigkilled_inside_marking_commit_rerun_rolls_back_and_marks_once(
        tmp_path: Path) -> None:
    """A replay process SIGKILLed while its error-table instant is inflight (after its data
    commit): the rerun rolls that instant back (its writer provably ended), marks the rows
    from the data commit's record list, writes no second data commit."""
    import subprocess
    import sys

    sent = events(seed=5, count=60)
    route(tmp_path, WRONG, sent, 0)
    table, errors = tmp_path / "trips", tmp_path / "trips_errors"
    before = commits(table)
    job = write_job(tmp_path / "job.toml", settings(tmp_path, FIXED))
    repo = Path(__file__).resolve().parents[2]
    child = subprocess.run([sys.executable, "-c", KILL_IN_MARKING, str(job)], cwd=repo,
                           env={**os.environ, "PYTHONPATH": str(repo)}, timeout=300)
    assert child.returncode == -signal.SIGKILL
    assert len(commits(table)) == len(before) + 1
    assert [e.state for e in Table.open(str(errors)).timeline()][-1] != "completed"

    result = replay_errors(fixed_sink(tmp_path))
    assert (result.recovered, result.replayed, result.instant_time) == (
        sum(isinstance(r, dict) and "rider" not in r and r.get("fare") != "n/a"
            for r in sent), 0, None)
    assert len(commits(table)) == len(before) + 1
    assert all(e.state == "completed" for e in Table.open(str(errors)).timeline())
    assert table_rows(table) == fixed_oracle(sent)


def test_replay_commit_time_table_record_older_than_stored_version_changes_nothing(
        tmp_path: Path) -> None:
    """Without an ordering field the later write wins: a replayed record whose key got a
    version in a later micro-batch is late and leaves it; one whose key has none is
    written."""
    options = {"precombine": None}
    route(tmp_path, WRONG, [{"trip_id": "a", "ts": 1, "city": "oslo", "fare": 1.0},
                            {"trip_id": "b", "ts": 1, "city": "oslo", "fare": 1.0},
                            {"trip_id": "c", "ts": 1, "rider": "r", "city": "oslo",
                             "fare": 1.0}], 0, **options)
    route(tmp_path, WRONG, [{"trip_id": "a", "ts": 2, "rider": "r", "city": "oslo",
                             "fare": 2.0}], 3, **options)
    result = replay_errors(fixed_sink(tmp_path, **options))
    assert (result.replayed, result.late) == (2, 1)
    assert table_rows(tmp_path / "trips") == {
        "a": ("a", 2, "r", "oslo", 2.0), "b": ("b", 1, None, "oslo", 1.0),
        "c": ("c", 1, "r", "oslo", 1.0)}
    data = Table.open(str(tmp_path / "trips"))
    timeline = Timeline.load(data.storage, data.config)
    last = timeline.commit_metadata(timeline.completed_data_instants[-1]).extra_metadata
    assert last[REPLAY_ID_KEY] == result.replay_id  # the replay's commit, with its id


def test_replay_late_record_judged_by_its_batch_not_by_its_error_row_updates(
        tmp_path: Path) -> None:
    """Commit-time ordering: a record that still failed a first replay (its error row
    rewritten with the new reason after its key got a later version) is judged by when its
    micro-batch committed when a second fix lets it decode: late, it leaves the later
    version."""
    options: dict[str, Any] = {"precombine": None}
    two = WRONG.replace("fare DOUBLE", "fare DOUBLE NOT NULL")
    route(tmp_path, two, [{"trip_id": "a", "ts": 1, "city": "oslo"},
                          {"trip_id": "c", "ts": 1, "rider": "r", "city": "oslo", "fare": 1.0}],
          0, **options)
    route(tmp_path, two, [{"trip_id": "a", "ts": 2, "rider": "r", "city": "oslo", "fare": 2.0}],
          2, **options)
    config = load(None, settings(tmp_path, two.replace("rider STRING NOT NULL", "rider STRING"),
                                 **options))
    first = replay_errors(build_sink(config, build_decoder(config)))
    assert (first.replayed, first.reasons) == (
        0, {"cannot decode the value: field 'fare': missing or null": 1})
    second = replay_errors(fixed_sink(tmp_path, **options))
    assert (second.replayed, second.late) == (1, 1)
    assert table_rows(tmp_path / "trips")["a"] == ("a", 2, "r", "oslo", 2.0)


def test_replay_tombstone_deletes_live_key_and_late_one_leaves_later_version(
        tmp_path: Path) -> None:
    """Tombstones whose string keys a json key format could not read: replayed with the key
    format fixed, one deletes its key (live at ts 1: deleted at that ordering value); the
    other is late — its key got a version in a later micro-batch — and changes nothing."""
    json_keys = {"key_format": "json"}
    route(tmp_path, FIXED, [{"trip_id": "a", "ts": 1, "rider": "r", "city": "oslo", "fare": 1.0},
                            {"trip_id": "b", "ts": 1, "rider": "r", "city": "lima", "fare": 1.0}],
          0, **json_keys)
    route(tmp_path, FIXED, [{"trip_id": "a", "tombstone": 1}, {"trip_id": "b", "tombstone": 1}],
          2, **json_keys)
    route(tmp_path, FIXED, [{"trip_id": "b", "ts": 5, "rider": "r", "city": "lima",
                             "fare": 5.0}], 4, **json_keys)
    errors = Table.open(str(tmp_path / "trips_errors")).read().to_pylist()
    assert [r["reason"].split(":")[0] for r in errors] == ["tombstone key does not decode"] * 2
    result = replay_errors(fixed_sink(tmp_path))
    assert (result.replayed, result.late, result.still_failing) == (2, 1, 0)
    assert table_rows(tmp_path / "trips") == {"b": ("b", 5, "r", "lima", 5.0)}
    assert rows_by_key(hudi_rs_read(tmp_path / "trips"), "trip_id", COLUMNS) == {
        "b": ("b", 5, "r", "lima", 5.0)}


def test_replay_record_index_key_moving_partition_is_stored_once(tmp_path: Path) -> None:
    """RECORD_INDEX: a replayed version of a key in another partition (city) moves the key:
    stored once, in its new partition, for our reader and hudi-rs; an older replayed version
    of another key loses to the stored one."""
    rli = {"index": "RECORD_INDEX"}
    route(tmp_path, WRONG, [{"trip_id": "a", "ts": 1, "rider": "r", "city": "oslo", "fare": 1.0},
                            {"trip_id": "b", "ts": 2, "city": "lima", "fare": 2.0},
                            {"trip_id": "b", "ts": 3, "rider": "r", "city": "lima", "fare": 3.0},
                            {"trip_id": "a", "ts": 4, "city": "lima", "fare": 4.0}], 0, **rli)
    result = replay_errors(fixed_sink(tmp_path, **rli))
    assert (result.replayed, result.late) == (2, 0)
    want = {"a": ("a", 4, None, "lima", 4.0), "b": ("b", 3, "r", "lima", 3.0)}
    assert table_rows(tmp_path / "trips") == want
    assert rows_by_key(hudi_rs_read(tmp_path / "trips"), "trip_id", COLUMNS, once=True) == want


def test_replay_on_object_store_table_equals_oracle_and_no_secret_stored(
        tmp_path: Path, s3: S3Location) -> None:
    """Table and error table on an S3-protocol server (the job's [table.storage] options):
    the replay writes and marks there, the table equals the oracle for our reader and
    hudi-rs, and the secret key is in no object of either table."""
    sent = events(seed=12, count=40)
    route(tmp_path, WRONG, sent, 0, store=s3)
    result = replay_errors(fixed_sink(tmp_path, store=s3))
    assert result.instant_time and result.error_instant_time
    want = fixed_oracle(sent)
    data = Table.open(s3.uri("trips"), storage_options=s3.storage_options)
    assert rows_by_key(data.read(columns=list(COLUMNS)), "trip_id", COLUMNS, once=True) == want
    assert rows_by_key(hudi_rs_read(s3.uri("trips"), storage_options=s3.storage_options),
                       "trip_id", COLUMNS) == want
    secret = s3.storage_options["aws_secret_access_key"].encode()
    stored = s3.server.objects(s3.bucket)
    assert any(".hoodie/timeline/" in name for name in stored)
    assert not [name for name, body in stored.items() if secret in body]


def test_replay_consistent_hashing_table_equals_oracle(tmp_path: Path) -> None:
    """A consistent-hashing BUCKET table: replayed keys go to their ring's buckets; the
    table equals the oracle for our reader and hudi-rs."""
    rings = {"bucket_engine": "CONSISTENT_HASHING"}
    sent = [r for r in events(seed=13, count=60) if not isinstance(r, bytes)]
    route(tmp_path, WRONG, sent, 0, **rings)
    result = replay_errors(fixed_sink(tmp_path, **rings))
    assert result.instant_time
    assert table_rows(tmp_path / "trips") == fixed_oracle(sent)
    assert rows_by_key(hudi_rs_read(tmp_path / "trips"), "trip_id", COLUMNS) == fixed_oracle(sent)


def test_replay_global_state_index_refused_naming_index_type(tmp_path: Path) -> None:
    """The GLOBAL_STATE index keeps keys in the job's state: a replay is refused."""
    route(tmp_path, WRONG, [{"trip_id": "a", "ts": 1, "city": "oslo", "fare": 1.0}], 0)
    with pytest.raises(InvalidOptionError, match=r"index\.type"):
        replay_errors(fixed_sink(tmp_path, index="GLOBAL_STATE"))


def test_replay_cli_without_error_table_creates_nothing_and_global_state_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``tidelake errors replay`` of a job whose error table does not exist says so and
    creates nothing; on a GLOBAL_STATE job it fails with one line naming index.type."""
    job = write_job(tmp_path / "job.toml", settings(tmp_path, FIXED))
    assert main(["errors", "replay", str(job)]) == 0
    assert "no error table at" in capsys.readouterr().out
    assert not (tmp_path / "trips_errors").exists() and not (tmp_path / "trips").exists()
    route(tmp_path, WRONG, [{"trip_id": "a", "ts": 1, "city": "oslo", "fare": 1.0}], 0)
    state = write_job(tmp_path / "state.toml", settings(tmp_path, FIXED, index="GLOBAL_STATE"))
    assert main(["errors", "replay", str(state)]) == 2
    assert "option 'index.type'" in capsys.readouterr().err
